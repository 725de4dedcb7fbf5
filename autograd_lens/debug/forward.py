"""Where autograd stopped tracking a value, seen as the forward ops run (``Lens(why=True)``).

A :class:`ForwardRecorder` is a ``TorchFunctionMode`` active for the length of a
Lens block.  It looks at every torch call and remembers *cuts*: a call that took
a tensor requiring grad and returned something that does not (``.detach()``,
``.data``, ``.item()``, ``.tolist()``, ``.numpy()``, any op under ``no_grad`` or
``inference_mode``, an op with an integer or bool result).  The values after a
cut are followed through further calls (a ``.tolist()`` list given to
``torch.tensor``, a float from ``.item()`` multiplied in), and when one of them
is used by a call whose result requires grad, the cut is known to enter that
result's graph.  The recorder only reads: it calls each function exactly as it
was called and returns its result unchanged.
"""

from __future__ import annotations

import cmath
import dataclasses
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..capture.snapshot import hidden_from_user
from .passthrough import drop_own_frame, readable_all, recorded, warn_again

# Calls that return a plain Python value (or a NumPy array) holding a tensor's numbers.
VALUE_CALLS = {"item": ".item()", "tolist": ".tolist()", "numpy": ".numpy()", "__float__": "float()",
               "__int__": "int()", "__index__": "int()", "__array__": "NumPy"}
DETACHING = {"detach": ".detach()", "detach_": ".detach_()", "data": ".data"}
# Calls that return memory as it was (it may hold NaN, from a tensor freed before): they make no NaN or inf
UNINITIALIZED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
TABLE_LIMIT = 20000  # values followed at most; the oldest are forgotten first
CUT_LIMIT = 2000  # cuts kept at most (each holds the functions behind it); the oldest are forgotten first
UPSTREAM_LIMIT = 400  # backward functions walked from a cut to find what it was computed from
CHAIN_LIMIT = 6
_LENS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


_compiling = torch.compiler.is_compiling  # (dynamo reads it as True while it traces)


@dataclass
class Cut:
    """One place where a value lost its autograd history."""

    cause: str  # "detached", "no_grad", "inference_mode", "non_differentiable"
    how: str  # ".detach()", "argmax", "mul under no_grad", …
    sources: tuple[Any, ...]  # weakrefs to the tensors requiring grad that the cutting call took
    leaves: dict[int, Any] = field(default_factory=dict)  # id(leaf) -> weakref: leaves it was computed from
    nodes: set[tuple[int, str]] = field(default_factory=set)  # (sequence_nr, name) of the functions behind it
    complete: bool = True  # the walk behind the source stayed within UPSTREAM_LIMIT
    chain: tuple[str, ...] = ()  # calls the cut value went through before it entered a graph
    entries: set[tuple[int, str]] = field(default_factory=set)  # (sequence_nr, name) of results that used it
    parents: tuple["Cut", ...] = ()  # cuts whose values the cutting call also took (w[0] under no_grad, then * 2)

    def enter(self, key: tuple[int, str]) -> None:
        """A value of this cut entered the graph at ``key``: so did those of the cuts it came from."""
        stack, seen = [self], set()
        while stack:
            cut = stack.pop()
            if id(cut) not in seen:
                seen.add(id(cut))
                cut.entries.add(key)
                stack.extend(cut.parents)

    def computed_from(self, tensor: torch.Tensor) -> bool:
        """True when ``tensor`` is the source of this cut or was used to compute it."""
        if self.took(tensor):
            return True
        if tensor.grad_fn is None:
            ref = self.leaves.get(id(tensor))
            return ref is not None and ref() is tensor
        return node_key(tensor.grad_fn) in self.nodes

    def took(self, tensor: torch.Tensor) -> bool:
        """True when the cutting call took ``tensor`` itself."""
        return any(ref() is tensor for ref in self.sources)

    def text(self) -> str:
        after = "".join(f" → {step}" for step in self.chain)
        return f"{self.how}{after}"


@dataclass(frozen=True)
class ForwardNonFinite:
    """The first forward call of the block that returned NaN or inf from finite inputs."""

    op: str  # e.g. "log"
    inputs: str  # a summary of its tensor inputs
    output: str  # a summary of what it returned
    node: tuple[int, str] | None = None  # (sequence_nr, backward function) of its result, when it requires grad
    given_before: str = ""  # an earlier call of the block that returned NaN or inf it was given (from outside)

    def text(self) -> str:
        return f"forward: {self.op} returned {self.output} from {self.inputs}"


def node_key(fn: Any) -> tuple[int, str]:
    return (fn._sequence_nr(), fn.name())


class _Held:
    """A strong reference with a weakref's interface (floats and lists cannot be weakly referenced)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


def _reference(value: Any) -> Any:
    try:
        return weakref.ref(value)
    except TypeError:
        return _Held(value)


def _trackable(value: Any) -> bool:
    """Values whose identity tells them apart (small ints and bools are shared objects in Python)."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return not -5 <= value <= 256
    return isinstance(value, (float, complex, list, tuple, torch.Tensor)) or type(value).__module__ == "numpy"


class ForwardRecorder(TorchFunctionMode):
    """Remembers the cuts made while it is active; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[int, tuple[Any, Cut]] = {}  # id(value) -> (reference, the cut it descends from)
        self.cuts: list[Cut] = []
        self.failed: str | None = None
        self.forgot = 0  # cuts and followed values dropped past TABLE_LIMIT
        self.nonfinite: ForwardNonFinite | None = None
        self.given_before = ""  # the first call that returned NaN or inf it was given, before any origin

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # dynamo tracing a compiled region (it compiles as without the lens, unrecorded), or the lens's own work
        if _compiling() or sys._getframe(1).f_code.co_filename.startswith(_LENS_DIR):
            return func(*args, **kwargs)
        grad_enabled = torch.is_grad_enabled()
        inference = torch.is_inference_mode_enabled()
        # Inside a TorchFunctionMode torch drops some of its warnings (float(x) of a tensor requiring grad, x.T)
        # and places others at this frame: they are caught here and given back from the caller's line.
        # the record's own reads: no subclass's __torch_function__, no mode or profiler sees them; a tensor subclass
        # with a __torch_dispatch__ of its own (a wrapper) is not read at all: nothing is said of its numbers
        readable = readable_all(args) and readable_all(kwargs.values())
        with hidden_from_user() if readable else torch._C.DisableTorchFunction():
            changed = _changed_finite(func, args, kwargs) if self.nonfinite is None and readable else ()
        caught: list = []
        raised = True
        try:
            with recorded() as caught:
                result = func(*args, **kwargs)
            raised = False
        finally:  # also when the call raises: anomaly mode warns "Error detected in ..." before its error
            if caught:
                warn_again(caught, sys._getframe(1), __file__, raised)
        try:
            readable = readable and readable_all((result,))
            with hidden_from_user() if readable else torch._C.DisableTorchFunction():
                self._after(func, args, kwargs, result, grad_enabled, inference, changed if readable else False)
        except Exception as problem:  # never let the recorder change what the user's call returns
            self.failed = self.failed or f"{type(problem).__name__}: {problem}"
        return result

    def _after(self, func: Any, args: tuple, kwargs: dict, result: Any, grad_enabled: bool, inference: bool,
               changed: Any) -> None:
        """What the record keeps of a call that returned (``changed`` False: its tensors are not read)."""
        if torch.is_anomaly_enabled():
            drop_own_frame(result, __file__)
        if self.nonfinite is None and changed is not False:
            with torch.no_grad():  # no graph for the lens's own ops: a saved-tensor hook (checkpoint) must not see them
                self._check_finite(func, args, kwargs, result, changed)
        self._note(func, args, kwargs, result, grad_enabled, inference)

    # ------------------------------------------------------------------ bookkeeping
    def _check_finite(self, func: Any, args: tuple, kwargs: dict, result: Any, changed: tuple = ()) -> None:
        """``changed``: the tensors the call wrote in place (``log_``, ``x[i] = v``, ``out=``) that were finite
        before it; the others the call wrote were not, and it is not an origin."""
        if _func_name(func) in UNINITIALIZED:  # (nn.Linear's torch.empty, then nn.init over it)
            return
        outputs = [out for out in _flat((result,)) if _floating(out)]
        outputs += [value for value in changed or () if not any(value is out for out in outputs)]
        if not outputs or all(bool(out.isfinite().all()) for out in outputs):
            return
        given = list(_flat(args)) + list(_flat(kwargs.values()))
        inputs = [value for value in given if _floating(value) and not any(value is out for out in changed or ())]
        if changed is None or not all(bool(value.isfinite().all()) for value in inputs) or not _numbers_finite(given):
            # NaN or inf given to it (a tensor, or a number: torch.tensor([inf]), x[0] = nan): not an origin
            self.given_before = self.given_before or (_func_name(func) or "a call").replace("__get__", ".")
            return
        from ..capture.snapshot import snapshot
        from .nonfinite import describe

        bad = next(out for out in outputs if not bool(out.isfinite().all()))
        node = node_key(bad.grad_fn) if bad.grad_fn is not None else None
        name = (_func_name(func) or "a call").replace("__get__", ".")
        if any(value is bad for value in changed):
            name += " (writing over finite values)"
        self.nonfinite = ForwardNonFinite(name, describe(tuple(snapshot(value, 16) for value in inputs)),
                                          describe(snapshot(bad, 16)), node, self.given_before)

    def _note(self, func: Any, args: tuple, kwargs: dict, result: Any, grad_enabled: bool, inference: bool) -> None:
        name = _func_name(func)
        if name is None:
            return
        inputs = list(_flat(args)) + list(_flat(kwargs.values()))
        tracking = [value for value in inputs if isinstance(value, torch.Tensor) and value.requires_grad]
        carried = [self._cut_of(value) for value in inputs]
        carried = [cut for cut in carried if cut is not None]
        if not tracking and not carried:
            return
        outputs = list(_flat((result,)))
        differentiated = [out for out in outputs if isinstance(out, torch.Tensor) and out.grad_fn is not None]
        written = _written(name, args, kwargs)  # h[0] = v returns None, h.add_(v) returns h: both write into h
        differentiated += [out for out in written if out.grad_fn is not None and all(out is not d for d in differentiated)]
        for out in differentiated:  # a cut value entered a graph: remember where
            for cut in carried:
                cut.enter(node_key(out.grad_fn))
        if (not grad_enabled or inference) and written:  # h.add_(w) under no_grad: w's values enter h's graph
            into = [out for out in written if out.grad_fn is not None]
            others = [value for value in tracking if all(value is not out for out in written)]
            cut = self._cut(name, others, into, grad_enabled, inference) if into and others else None
            for out in into if cut is not None else ():
                cut.enter(node_key(out.grad_fn))
        # what is off the graph (torch.max(w, dim=0) returns values on it and indices off it; w[:2] under no_grad is
        # a new leaf that requires grad: its gradient goes to it, not to w)
        inputs_ids = {id(value) for value in inputs}
        values = [out for out in outputs if _trackable(out) and not _on_graph(out, inputs_ids)]
        if not values or name.startswith("__get__") and name != "__get__data":
            return
        if differentiated and not tracking:
            return  # the cut values went into a graph; what else came out carries no cut
        if tracking:
            cut = self._cut(name, tracking, values, grad_enabled, inference)
            if cut is None:
                return
            cut.parents = tuple(carried)
        else:  # a cut of its own, whose chain is this value's (a sibling's calls are not on it)
            distinct = list({id(cut): cut for cut in carried}.values())  # a + b of two cut values: it carries both
            cut, label = distinct[0], name.replace("__get__", ".")
            chain = cut.chain + ((VALUE_CALLS.get(label, label),) if len(cut.chain) < CHAIN_LIMIT else ())
            if chain != cut.chain or len(distinct) > 1:
                cut = self._keep(dataclasses.replace(cut, chain=chain, entries=set(), parents=tuple(distinct)))
        for value in values:
            self._remember(value, cut)
            if isinstance(value, list):
                for item in value[:64]:
                    if _trackable(item):
                        self._remember(item, cut)

    def _cut(self, name: str, sources: list, outputs: list, grad_enabled: bool, inference: bool) -> Cut | None:
        label = name.replace("__get__", "")
        tensor_out = next((out for out in outputs if isinstance(out, torch.Tensor)), None)
        if label in DETACHING:
            cause, how = "detached", DETACHING[label]
        elif label == "requires_grad_":
            cause, how = "requires_grad_false", "requires_grad_(False)"
        elif label in VALUE_CALLS:
            cause, how = "detached", VALUE_CALLS[label]
        elif tensor_out is None:
            return None  # sizes, names, flags: not the tensor's numbers
        elif inference:
            cause, how = "inference_mode", f"{label} under inference_mode"
        elif not grad_enabled:
            cause, how = "no_grad", f"{label} under no_grad"
        elif not (tensor_out.is_floating_point() or tensor_out.is_complex()):
            kind = str(tensor_out.dtype).replace("torch.", "")
            cause, how = "non_differentiable", f"{label} (its result is {kind}, which has no gradient)"
        else:
            cause, how = "non_differentiable", f"{label} (autograd does not differentiate it)"
        cut = Cut(cause=cause, how=how, sources=tuple(weakref.ref(source) for source in sources))
        _upstream(sources, cut)  # e.g. linear(x, weight, bias) under no_grad cuts both parameters
        return self._keep(cut)

    def _keep(self, cut: Cut) -> Cut:
        self.cuts.append(cut)
        if len(self.cuts) > CUT_LIMIT:
            del self.cuts[0]
            self.forgot += 1
        return cut

    def _remember(self, value: Any, cut: Cut) -> None:
        self.table[id(value)] = (_reference(value), cut)
        if len(self.table) > TABLE_LIMIT:
            del self.table[next(iter(self.table))]
            self.forgot += 1

    def _cut_of(self, value: Any) -> Cut | None:
        entry = self.table.get(id(value))
        if entry is None:
            return None
        if entry[0]() is not value:  # that object is gone and its id reused
            del self.table[id(value)]
            return None
        return entry[1]


IN_PLACE = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
            "__imatmul__"}


def _written(name: str, args: tuple, kwargs: dict) -> list:
    """The tensors an in-place call (``add_``, ``h[i] = v``, ``+=``) or an ``out=`` call writes into."""
    written = [args[0]] if args and ((name.endswith("_") and not name.endswith("__")) or name in IN_PLACE) else []
    written += list(_flat((kwargs.get("out"),)))
    return [value for value in written if isinstance(value, torch.Tensor)]


def _changed_finite(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The floating tensors a call will write in place (its first argument for ``log_``, ``__setitem__``, ``+=``;
    ``out=``), read before it runs: () when it writes none, None when one already holds NaN or inf (or cannot be
    read)."""
    try:
        written = [value for value in _written(getattr(func, "__name__", "") or "", args, kwargs) if _floating(value)]
        if not written:
            return ()
        with torch.no_grad():
            return tuple(written) if all(bool(value.isfinite().all()) for value in written) else None
    except Exception:
        return None


def _numbers_finite(values: Any, depth: int = 0) -> bool:
    """No Python float or complex among ``values`` (and short lists in them) is NaN or inf."""
    for value in values:
        if isinstance(value, (float, complex)) and not cmath.isfinite(value):
            return False
        if isinstance(value, (list, tuple)) and len(value) <= 64 and depth < 3 \
                and not _numbers_finite(value, depth + 1):
            return False
    return True


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()) \
        and value.layout == torch.strided and value.device.type != "meta"


def _on_graph(value: Any, inputs_ids: set[int]) -> bool:
    """A result autograd tracks back to the call's inputs: made by a backward function, or an input requiring grad
    itself (an in-place call on a leaf); a tuple or list holding one."""
    if isinstance(value, torch.Tensor):
        return value.grad_fn is not None or (value.requires_grad and id(value) in inputs_ids)
    if isinstance(value, (tuple, list)) and len(value) <= 64:
        return any(_on_graph(item, inputs_ids) for item in value if isinstance(item, torch.Tensor))
    return False


def _func_name(func: Any) -> str | None:
    name = getattr(func, "__name__", None)
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        return "__get__" + str(getattr(owner, "__name__", ""))
    return name


def _flat(values: Any):
    """Each value, and the items of a short list or tuple (``torch.cat([a, b])``, ``torch.tensor([s, t])``)."""
    for value in values:
        yield value
        if isinstance(value, (list, tuple)) and len(value) <= 64:
            yield from value


def _upstream(sources: list, cut: Cut) -> None:
    """The leaves and functions ``sources`` were computed from (at most UPSTREAM_LIMIT functions)."""
    stack = []
    for source in sources:
        if source.grad_fn is None:
            cut.leaves[id(source)] = weakref.ref(source)
        else:
            stack.append(source.grad_fn)
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if len(seen) > UPSTREAM_LIMIT:
            cut.complete = False
            return
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            cut.leaves[id(variable)] = weakref.ref(variable)
            continue
        cut.nodes.add(node_key(fn))
        stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
