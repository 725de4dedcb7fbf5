"""What the forward record (:mod:`.forward`) gives back to torch as torch would have had it: the warnings a call
made inside the recorder's ``TorchFunctionMode`` (warned again from the caller's line, also when the call raised),
and anomaly mode's forward tracebacks without the recorder's frame."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch


def _flat(value: Any):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flat(item)
    else:
        yield value


def drop_own_frame(result: Any, own_file: str) -> None:
    """Anomaly mode keeps the forward traceback of each node it creates (``metadata["traceback_"]``, printed in its
    "Error detected in ..." warning): the nodes this call made hold this mode's frame, which torch's own traceback
    does not have; taken out (each node made here is reached from the result through nodes that hold it)."""
    own = f'  File "{own_file}", '
    stack = [out.grad_fn for out in _flat(result) if isinstance(out, torch.Tensor) and out.grad_fn is not None]
    seen: set = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        trace = node.metadata.get("traceback_")
        if not isinstance(trace, list) or not any(line.startswith(own) for line in trace):
            continue
        trace[:] = [line for line in trace if not line.startswith(own)]
        stack.extend(next_node for next_node, _ in node.next_functions)


def warn_again(caught: list, frame: Any, own_file: str) -> None:
    """Warn each caught warning again, under the user's filters, from where it would have come without the mode."""
    here = os.path.abspath(own_file)
    for item in caught:
        filename, lineno = item.filename, item.lineno
        if os.path.abspath(filename) == here:
            filename, lineno = frame.f_code.co_filename, frame.f_lineno
        registry = frame.f_globals.setdefault("__warningregistry__", {}) \
            if filename == frame.f_code.co_filename else None
        warnings.warn_explicit(item.message, item.category, filename, lineno, registry=registry)
