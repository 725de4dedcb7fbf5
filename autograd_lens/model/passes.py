"""What happened in one backward pass, as plain records: node runs, hook calls, .grad writes, notes, errors."""

from __future__ import annotations

from functools import cached_property
from dataclasses import dataclass, field
from typing import Any, Union

from .graph import Graph, ModuleGroup, SourceLine
from .values import Value, Values, _provided

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
    invocation: int | None  # None: not known (``may_be`` says which hooks it is one of)
    grad_in: Values
    grad_out: Values
    modified: bool
    returned_none: bool = True
    node: str | None = None  # graph node id the hook is attached to, when drawn
    step: int = -1  # position in the pass's events
    forward_call: int | None = None  # for module hooks: which forward call (1-based) this belongs to, among
    forward_calls: int | None = None  # the forward calls of its module whose hooks this pass reached
    context: Values = None  # e.g. grad_output for module full hooks
    error: str | None = None  # the exception the hook raised, if any
    edited_in_place: bool = False  # it changed the tensor it received (whatever it returned)
    unseen: str | None = None  # a hook written in C, which no Python frame shows: how its values are known, or not
    registration: int = 0  # which registered hook this is (1, 2, … in order of first call in the Lens): calls
    # with the same number are calls of one hook; ``invocation`` counts them
    may_be: tuple[int, ...] = ()  # when its call number is not known: the registrations counted before, on the
    # tensor when it had no name, that this hook is one of (one of them was removed since; their code is the same)
    grad_cleared: bool = False  # a post-accumulate hook set .grad to None (``optimizer.zero_grad()`` inside it)
    value_before: Values = None  # a post-accumulate hook changed its leaf itself (an optimizer step inside it):
    value_after: Values = None  # the leaf's value before and after the hook (both None when it did not)

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
    # outputs whose None (grad_in) a custom Function's backward got as zeros (torch's ctx.set_materialize_grads)
    zeros: tuple[int, ...] = ()


@dataclass(frozen=True)
class GradWritten:
    """``AccumulateGrad`` wrote a leaf's ``.grad``."""

    step: int
    node: str | None
    name: str
    grad: Value  # .grad right after the write (before post-accumulate hooks)
    received: Value  # the gradient this pass contributed
    by: str = "AccumulateGrad"  # or "retain_grad": a non-leaf's .grad, kept because retain_grad() was called; or
    # "inputs": a non-leaf given to backward(inputs=...) (torch calls retain_grad() on it)


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
    is what ``.grad`` would hold had no hook run since the ``Lens`` started (hooks
    registered before it included; for ``autograd.grad``: what it would have returned, per input);
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
    groups_note: str = ""  # why module groups are not known when asked for, or what they may have changed
    debug: Any = field(default=None, compare=False, repr=False)  # evidence for .unreached (autograd_lens.debug)
    kept_bytes: int = field(default=0, compare=False, repr=False)  # of copied values, counted in the Lens's budget
    # drawn leaf label -> what two passes share only when their leaf is the same tensor object (annotate.LeafTensor)
    leaf_ids: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # modules whose backward hooks ran inside a nested backward (reentrant checkpointing): not steps, but they fired
    nested_module_hooks: tuple[str, ...] = field(default=(), compare=False, repr=False)

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

    @cached_property  # events never change: read once (a Lens of many passes reads each pass's often)
    def hook_calls(self) -> tuple[HookCall, ...]:
        return tuple(event for event in self.events if isinstance(event, HookCall))

    @cached_property
    def node_runs(self) -> tuple[NodeRun, ...]:
        return tuple(event for event in self.events if isinstance(event, NodeRun))
