"""Plain records of an autograd graph and of the backward passes run through it.

Everything here is a frozen dataclass: no ``grad_fn``, no module, no hook handle.
The only torch objects kept are small tensor clones (gradient values a student
reads); large values are kept as a :class:`TensorSummary`.  Views read these
records and never touch torch's graph, so a picture can be redrawn after the
graph itself has been freed by ``backward()``.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from .numbers import format_number, format_shape

if TYPE_CHECKING:
    import torch


# What shows or explains these records lives in views/ and debug/, which import this module; they hand their
# functions in here as they load (importing autograd_lens loads both), so this module imports neither.
_PROVIDED: dict[str, Any] = {}


def provide(**functions: Any) -> None:
    """Called by ``autograd_lens.views`` and ``autograd_lens.debug`` as they load."""
    _PROVIDED.update(functions)


def _provided(name: str) -> Any:
    function = _PROVIDED.get(name)
    if function is None:  # only when importing autograd_lens stopped early (see compat.py)
        raise RuntimeError(f"autograd_lens is not loaded ({name} is missing): `import autograd_lens` first")
    return function


@dataclass(frozen=True)
class TensorSummary:
    """What is kept of a tensor too large to clone: enough for a one-line label.

    >>> TensorSummary(shape=(32, 64), dtype="float32", min=-1.0, max=2.0, norm=3.5, head=(0.1, 0.2)).text()
    '[32x64 float32] min -1.0 max 2.0 norm 3.5'
    """

    shape: tuple[int, ...]
    dtype: str
    min: float | None = None
    max: float | None = None
    norm: float | None = None
    head: tuple[float, ...] = ()
    kind: str = "dense"  # or what the tensor is when its numbers cannot be read: "sparse_coo", "meta", …
    mean_abs: float | None = None  # mean |value| (gradient-flow plots)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def text(self) -> str:
        parts = [f"[{format_shape(self.shape)} {self.dtype}" + ("" if self.kind == "dense" else f" {self.kind}") + "]"]
        if self.min is not None:
            parts.append(f"min {format_number(self.min)} max {format_number(self.max)}")
        if self.norm is not None:
            parts.append(f"norm {format_number(self.norm)}")
        return " ".join(parts)


def values_equal(first: Any, second: Any) -> bool:
    """Exact equality of two recorded values (NaN equals NaN), tuples element-wise; never raises.

    >>> import torch
    >>> values_equal(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    True
    """
    if isinstance(first, (tuple, list)) or isinstance(second, (tuple, list)):
        if not (isinstance(first, (tuple, list)) and isinstance(second, (tuple, list))):
            return False
        return len(first) == len(second) and all(values_equal(a, b) for a, b in zip(first, second))
    if first is None or second is None:
        return first is None and second is None
    if isinstance(first, TensorSummary) or isinstance(second, TensorSummary):
        return first == second
    if first is second:
        return True
    try:
        if first.shape != second.shape or first.dtype != second.dtype:
            return False
        import torch

        if torch.equal(first, second):
            return True
        if first.is_floating_point() or first.is_complex():
            return bool(((first == second) | (first.isnan() & second.isnan())).all())
        return False
    except Exception:  # values that cannot be compared (e.g. on the meta device) are not known to be equal
        return False


# A recorded value: a small tensor clone, a summary of a large one, or None
# (no gradient flowed, e.g. the unused output of ``split``).
Value = Union["torch.Tensor", TensorSummary, None]
# Node and module hooks receive and return tuples of values.
Values = Union[Value, tuple[Value, ...]]


# ----------------------------------------------------------------------------- graph

NODE_KINDS = ("leaf", "tensor", "output", "function", "saved", "constant", "hidden")


@dataclass(frozen=True)
class Node:
    """One box of the drawing.

    ``kind`` is one of ``NODE_KINDS``: tensors (``leaf``, ``tensor`` for a named
    intermediate, ``output``), backward functions (``function``), values a
    backward function saved (``saved``, ``constant``) and the note that says how
    much of a large graph was left out (``hidden``).
    """

    id: str
    kind: str
    label: str
    op: str = ""  # backward function name, e.g. "MulBackward0" (function nodes)
    shape: tuple[int, ...] | None = None
    value: Value = None
    grad: Value = None
    hooks: tuple[str, ...] = ()  # human-readable badges: "tensor hook <lambda>", "retain_grad"
    detail: str = ""  # e.g. "exponent" for a saved constant, "2 uses" for a split leaf
    sequence_nr: int | None = None
    reduced: tuple[int, ...] | None = None  # dims a sum/mean over ``dim=`` reduced (function nodes)

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("leaf", "tensor", "output")


@dataclass(frozen=True)
class SourceLine:
    """The cell line that made a backward node."""

    line: int  # 1-based, as the notebook numbers the cell's lines
    text: str  # that line, stripped ("…" when the statement goes on)

    def describe(self) -> str:
        return f"cell line {self.line}: {self.text}"


@dataclass(frozen=True)
class ModuleGroup:
    """The nodes made inside one call of an ``nn.Module`` (recorded with ``%%lens --modules``)."""

    id: str  # "m1", "m2", … in the order the calls started
    path: str | None  # "model.0" as the notebook names it; None when no name reaches the module
    kind: str  # the module's class, e.g. "Linear"
    call: int = 1  # which call of this module (a module used twice makes two groups)
    calls: int = 1  # how many calls of it were recorded
    parent: int | None = None  # index of the enclosing group
    nodes: tuple[str, ...] = ()  # node ids inside this group and not inside a group within it

    def describe(self) -> str:
        """``model.0 · Linear``, ``block · Block (call 2 of 2)``, ``Linear (no name)``."""
        text = f"{self.path} · {self.kind}" if self.path else f"{self.kind} (no name)"
        return text + (f" (call {self.call} of {self.calls})" if self.calls > 1 else "")


@dataclass(frozen=True)
class Edge:
    """An arrow in forward (data-flow) direction: ``src`` is used to compute ``dst``.

    In the backward pass a gradient travels the other way, from ``dst`` to
    ``src``.  ``kind`` is ``"data"`` or ``"saved"`` (a dashed link from a saved
    value to the backward function that keeps it).
    """

    id: str
    src: str
    dst: str
    kind: str = "data"
    label: str = ""


@dataclass(frozen=True)
class Graph:
    """The autograd graph behind one or more tensors, as plain data.

    Returned by :func:`autograd_lens.graph`; it displays itself in Jupyter.

    >>> import torch, autograd_lens
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> g = autograd_lens.graph(x * 3, names={"x": x})
    >>> [node.label for node in g.nodes if node.is_tensor]
    ['output', 'x']
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    hidden_nodes: int = 0  # backward functions left out because of the node limit
    options: "GraphOptions" = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    # (module path, class name) of the modules named in the namespace: their parameters' names group the drawing
    modules: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    def node(self, node_id: str) -> Node:
        return self._index["nodes"][node_id]

    def edges_into(self, node_id: str) -> tuple[Edge, ...]:
        """The edges ending at ``node_id``, in drawing order."""
        return self._index["into"].get(node_id, ())

    def edges_from(self, node_id: str) -> tuple[Edge, ...]:
        """The edges starting at ``node_id``, in drawing order."""
        return self._index["from"].get(node_id, ())

    def edge(self, edge_id: str) -> Edge:
        return self._index["edges"][edge_id]

    def nodes_labelled(self, label: str) -> tuple[Node, ...]:
        return self._index["labels"].get(label, ())

    @cached_property
    def _index(self) -> dict[str, dict]:
        """Lookups by id, endpoint and label, built once: every view reads the graph in linear time."""
        into: dict[str, list[Edge]] = {}
        out: dict[str, list[Edge]] = {}
        labels: dict[str, list[Node]] = {}
        for edge in self.edges:
            into.setdefault(edge.dst, []).append(edge)
            out.setdefault(edge.src, []).append(edge)
        for node in self.nodes:
            labels.setdefault(node.label, []).append(node)
        return {
            "nodes": {node.id: node for node in self.nodes},
            "edges": {edge.id: edge for edge in self.edges},
            "into": {key: tuple(value) for key, value in into.items()},
            "from": {key: tuple(value) for key, value in out.items()},
            "labels": {key: tuple(value) for key, value in labels.items()},
        }

    def find(self, label: str) -> Node:
        """The first node whose label is ``label`` (a variable name, ``"mul"`` …)."""
        for node in self.nodes:
            if node.label == label:
                return node
        raise KeyError(f"no node labelled {label!r}; labels: {sorted({n.label for n in self.nodes})}")

    def to_dot(self, **options: Any) -> str:
        """The DOT source of this graph (deterministic text)."""
        return _provided("to_dot")(self, **options)

    def render(self, path: str | None = None, format: str | None = None, renderer: str | None = None) -> bytes:
        """Lay out and render the graph; write it to ``path`` when given.

        The format is ``format``, else the path's suffix (``g.png``), else SVG. SVG comes from the in-process
        WebAssembly Graphviz (or the ``dot`` binary); PNG and PDF need the ``dot`` binary.
        """
        return _provided("render_graph")(self, path=path, format=format, renderer=renderer)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = _PROVIDED.get("graph_bundle")  # a display method never raises
        return bundle(self) if bundle is not None else {"text/plain": repr(self)}

    def __repr__(self) -> str:
        text = _PROVIDED.get("graph_text")
        return text(self) if text is not None else f"<Graph: {len(self.nodes)} nodes, {len(self.edges)} edges>"


@dataclass(frozen=True)
class GraphOptions:
    """How a graph is captured and drawn; every option has a keyword in ``graph()``."""

    max_elements: int = 16  # tensors up to this size show their values
    max_nodes: int = 300  # backward functions drawn before the rest is cut
    direction: str = "forward"  # "forward" (data flow) or "backward" (gradient flow)
    legend: bool = False
    show_saved: bool = True
    split_leaf_uses: int = 4  # a leaf used by more ops than this is drawn once per use
    fold: bool = True  # past ~60 boxes: module groups outlined, runs of identical blocks drawn as one box
    expand: tuple[str, ...] = ()  # blocks drawn in full even so ("layers.3"), or ("all",)

    def __post_init__(self) -> None:
        if self.direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward', not {self.direction!r}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, not {self.max_nodes}")
        if self.max_elements < 0:
            raise ValueError(f"max_elements must be 0 or more, not {self.max_elements}")

    def replace(self, **changes: Any) -> "GraphOptions":
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------- backward pass

HOOK_KINDS = (
    "tensor",
    "post_accumulate_grad",
    "node_pre",
    "node",
    "module_full_pre",
    "module_full",
    "module_legacy",
    "global_module_full_pre",
    "global_module_full",
    "global_module_legacy",
    "multi_grad",
)


@dataclass(frozen=True)
class HookCall:
    """One firing of one user hook, with what it received and what it passed on.

    ``grad_in`` is what the hook received (a tuple for node and module hooks);
    ``grad_out`` is what flowed on after it: the value it returned, or the value
    it received (possibly edited in place) when it returned ``None``.
    ``invocation`` counts the calls of this registered hook since the ``Lens``
    started, over all passes; ``registration`` tells registered hooks apart (two
    closures from one factory, or one function on two tensors, are two hooks).
    """

    hook: str
    kind: str
    target: str
    pass_index: int
    invocation: int
    grad_in: Values
    grad_out: Values
    modified: bool
    returned_none: bool = True
    node: str | None = None  # graph node id the hook is attached to, when drawn
    step: int = -1  # position in the pass's events
    forward_call: int | None = None  # for module hooks: which forward call (1-based) this belongs to
    context: Values = None  # e.g. grad_output for module full hooks
    error: str | None = None  # the exception the hook raised, if any
    edited_in_place: bool = False  # it changed the tensor it received (whatever it returned)
    unseen: str | None = None  # a hook written in C, which no Python frame shows: how its values are known, or not
    registration: int = 0  # which registered hook this is (1, 2, … in order of first call in the Lens): calls
    # with the same number are calls of one hook; ``invocation`` counts them

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")


@dataclass(frozen=True)
class InventoryEntry:
    """A hook attached before a pass started (see ``BackwardPass.inventory``)."""

    kind: str  # as HookCall.kind, or "retain_grad"
    target: str
    hook: str
    position: int  # registration order among the hooks of this kind on this target (1-based)
    of: int

    def text(self) -> str:
        if self.kind == "retain_grad":
            return f"{self.target}: retain_grad() keeps its gradient in .grad"
        if self.kind == "module_unknown":
            return (f"{self.target}: has module backward hooks; whether this pass goes through it cannot be told "
                    "before it runs (it has no parameters)")
        order = f" ({self.position} of {self.of})" if self.of > 1 else ""
        return f"{self.target}: {self.kind.replace('_', ' ')} hook {self.hook}{order}"


@dataclass(frozen=True)
class NodeRun:
    """The engine ran one backward function: what reached it and what it sent on."""

    step: int
    node: str | None  # graph node id (None when the node was not drawn)
    name: str  # e.g. "MulBackward0"
    label: str  # what the drawing calls it, e.g. "mul"
    grad_in: tuple[Value, ...]  # per output, after tensor hooks and pre-hooks
    grad_out: tuple[Value, ...]  # per input, after post-hooks
    edges: tuple[str | None, ...]  # graph edge carrying each grad_out (None: not drawn / not needed)
    targets: tuple[str, ...]  # label of what receives each grad_out
    in_edges: tuple[str | None, ...] = ()  # edge from this function to the tensor of each output


@dataclass(frozen=True)
class GradWritten:
    """``AccumulateGrad`` wrote a leaf's ``.grad``."""

    step: int
    node: str | None
    name: str
    grad: Value  # .grad right after the write (before post-accumulate hooks)
    received: Value  # the gradient this pass contributed
    by: str = "AccumulateGrad"  # or "retain_grad": a non-leaf's .grad, kept because retain_grad() was called


@dataclass(frozen=True)
class PassError:
    """The pass stopped with an exception; events before it are kept."""

    step: int
    type: str
    message: str


@dataclass(frozen=True)
class Note:
    """A classic autograd mistake the lens noticed, in plain words, and the course notebook about it."""

    code: str  # e.g. "nonleaf_grad"
    message: str
    notebook: str | None = None  # e.g. "notebooks/03_multiple_invocations.ipynb"
    pass_index: int | None = None  # the pass it arose in (None: outside any pass)
    step: int | None = None  # the event it arose at (the stepper shows it on that step)

    def text(self) -> str:
        where = f" (see {self.notebook})" if self.notebook else ""
        return f"{self.message}{where}"


Event = Union[NodeRun, HookCall, GradWritten, PassError]


@dataclass(frozen=True)
class BackwardPass:
    """One call of ``backward()`` / ``torch.autograd.backward`` / ``torch.autograd.grad``.

    ``leaf_grads`` is each leaf's ``.grad`` after the pass.  ``grads_without_hooks``
    is what ``.grad`` would hold had no hook been registered since the ``Lens``
    started (for ``autograd.grad``: what it would have returned, per input);
    ``added`` and ``added_without_hooks`` are this pass's own contribution to
    ``.grad``, with and without hooks.  A value is ``None`` where it cannot be
    known without running user code again, and ``unknown[name]`` says why.
    ``notes`` say where the recording itself is incomplete.
    """

    index: int
    kind: str  # "backward" or "grad"
    graph: Graph
    events: tuple[Event, ...]
    leaf_grads: dict[str, Value]
    grads_without_hooks: dict[str, Value]
    error: PassError | None = None
    roots: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    input_grads: dict[str, Value] = field(default_factory=dict)  # what autograd.grad returned
    added: dict[str, Value] = field(default_factory=dict)
    added_without_hooks: dict[str, Value] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)  # name -> why its value without hooks is unknown
    notes: tuple[str, ...] = ()  # where the recording is incomplete, and why
    mistakes: tuple["Note", ...] = ()  # classic mistakes seen in this pass (see autograd_lens.notes)
    inventory: tuple[InventoryEntry, ...] = ()  # the hooks attached when the pass started
    sources: dict[str, SourceLine] = field(default_factory=dict)  # function node id -> the cell line that made it
    sources_note: str = ""  # why lines are not known (empty when they are, or when nothing was asked)
    groups: tuple[ModuleGroup, ...] = ()  # module calls that made nodes of this pass (``--modules``)
    groups_note: str = ""  # why module groups are not known, when they were asked for
    debug: Any = field(default=None, compare=False, repr=False)  # evidence for .unreached (autograd_lens.debug)

    @cached_property
    def unreached(self) -> dict:
        """``{name: Reason}``: each named tensor requiring grad that got no gradient in this pass, and why."""
        return _provided("unreached")(self)

    @cached_property
    def first_nonfinite(self):
        """Where NaN or inf started in this pass (a :class:`~autograd_lens.debug.NonFinite`), or None."""
        return _provided("first_nonfinite")(self)

    def group_of(self, node_id: str) -> ModuleGroup | None:
        """The innermost module call that made (or owns) ``node_id``, if known."""
        return self._group_index.get(node_id)

    @cached_property
    def _group_index(self) -> dict[str, ModuleGroup]:
        return {node_id: group for group in self.groups for node_id in group.nodes}

    @property
    def grads(self) -> dict[str, Value]:
        """The gradients this pass produced: ``.grad`` of leaves, or what ``autograd.grad`` returned."""
        return self.leaf_grads if self.kind == "backward" else self.input_grads

    @property
    def hook_calls(self) -> tuple[HookCall, ...]:
        return tuple(event for event in self.events if isinstance(event, HookCall))

    @property
    def node_runs(self) -> tuple[NodeRun, ...]:
        return tuple(event for event in self.events if isinstance(event, NodeRun))
