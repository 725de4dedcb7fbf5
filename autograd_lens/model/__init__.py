"""Plain records of an autograd graph and of the backward passes run through it.

Everything here is a frozen dataclass: no ``grad_fn``, no module, no hook handle.
The only torch objects kept are small tensor clones (gradient values a student
reads); large values are kept as a :class:`TensorSummary`.  Views read these
records and never touch torch's graph, so a picture can be redrawn after the
graph itself has been freed by ``backward()``.
"""

from __future__ import annotations

from .graph import NODE_KINDS, Edge, Graph, GraphOptions, ModuleGroup, Node, SourceLine
from .passes import (
    HOOK_KINDS, BackwardPass, Event, GradWritten, HookCall, InventoryEntry, Note, NodeRun, PassError,
)
from .values import TensorSummary, Value, Values, provide, python_dispatch, values_equal

__all__ = [
    "NODE_KINDS", "Edge", "Graph", "GraphOptions", "ModuleGroup", "Node", "SourceLine",
    "HOOK_KINDS", "BackwardPass", "Event", "GradWritten", "HookCall", "InventoryEntry", "Note", "NodeRun", "PassError",
    "TensorSummary", "Value", "Values", "provide", "python_dispatch", "values_equal",
]
