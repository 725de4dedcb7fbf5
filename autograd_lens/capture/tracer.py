"""``Lens``: record every backward pass run inside a ``with`` block, hooks included.

How it observes, without changing anything (``shared/HOOK_FACTS.md`` has the
measurements behind each choice):

* For the length of the block, torch's single entry to the engine,
  ``torch.autograd._engine_run_backward`` (used by ``Tensor.backward``,
  ``torch.autograd.backward`` and ``torch.autograd.grad``), is wrapped; the
  original is put back when the block ends, whatever happens.
* For each pass, a post-hook (returning ``None``) goes on every node of the
  graph, plus a pre-hook on the ``AccumulateGrad`` of each leaf that already
  has a ``.grad``; all are removed in ``finally``.  They see what each node
  received and sent.
* A profile function, installed only while the engine runs, sees each user
  hook being called (tensor, node, module, post-accumulate, multi-grad hooks,
  also ones registered long before) with its arguments and return value.
* Gradients are kept by reference while nothing can change them, and cloned
  the moment user code is about to run (a hook may edit a gradient in place).
* "Without hooks" values are computed only where a hook changed something: the
  affected nodes are called directly (``grad_fn(*grads)``, which runs no hook)
  on the unhooked gradients, while their saved tensors are still alive.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from ..model import (
    BackwardPass,
    GradWritten,
    GraphOptions,
    HookCall,
    NodeRun,
    PassError,
    Value,
)
from .hooks import (
    ENGINE_CODE,
    TORCH_DIR,
    Wrapper,
    code_of,
    function_name,
    module_hook_kind,
    multi_grad_user_fn,
    positional_args,
    user_function,
    wrapper_family,
    wrapper_module,
)
from .names import Names, caller_namespace, names_from, user_frame
from .snapshot import snapshot, values_equal
from .walk import Structure, Walk, leaf_state, structure, walk

_current_node = torch._C._current_autograd_node

# Graphs up to this many nodes are modelled before the pass (saved tensors included);
# larger ones after it, so tracing a big model adds little to its backward().
EAGER_MODEL_LIMIT = 100

_ACTIVE: list["Lens"] = []
MAX_UNBUILT = 4  # passes whose model waits to be built (until read, or the block ends)
_BEFORE_NODE = ("tensor", "node_pre", "multi_grad")


@dataclass
class _Call:
    """A user hook call while it is being recorded."""

    code: Any
    function: Any
    kind: str
    received: Any  # the live object the hook got (tensor, tuple, or the leaf itself)
    grad_in: Any
    frame: FrameType  # while the hook runs; then only its code is kept (frame_code)
    frame_code: Any = None
    candidates: list = field(default_factory=list)  # _Hooked entries this call may be
    module: Any = None
    target: str | None = None
    node_fn: Any = None
    output_nr: int | None = None
    grad_out: Any = None
    raw_out: Any = None
    returned_none: bool = True
    modified: bool = False
    error: str | None = None
    context: Any = None
    wrapper_seq: int | None = None


@dataclass
class _Hooked:
    """A hook found on a known tensor before the pass: where it is attached."""

    function: Any
    kind: str  # "tensor" / "post_accumulate_grad" / "multi_grad"
    target: str
    grad_fn: Any  # the node whose execution it precedes (AccumulateGrad for leaves)
    output_nr: int


def _clone_all(values: Any) -> Any:
    """Copies of the tensors in ``values`` (anything else, e.g. a summary, as it is)."""
    if isinstance(values, torch.Tensor):
        return values.detach().clone()
    if isinstance(values, (tuple, list)):
        return tuple(_clone_all(item) for item in values)
    return values


def _same(first: Any, second: Any) -> bool:
    """Bit-equal tensors (or both None)."""
    if first is None or second is None:
        return first is None and second is None
    return first.shape == second.shape and first.dtype == second.dtype and bool(torch.equal(first, second))


def _add(first: torch.Tensor | None, second: torch.Tensor | None) -> torch.Tensor | None:
    if first is None:
        return second
    if second is None:
        return first
    return first + second


class _PassRecorder:
    """Everything about one traced ``backward()`` call; turned into a ``BackwardPass`` at the end."""

    def __init__(self, lens: "Lens", t_outputs: Any, args: tuple, kwargs: dict) -> None:
        self.lens = lens
        self.index = len(lens._passes) + len(lens._unbuilt)
        self.roots = tuple(t_outputs) if isinstance(t_outputs, (tuple, list)) else (t_outputs,)
        self.kind = "backward" if kwargs.get("accumulate_grad", True) else "grad"
        self.grad_tensors = tuple(args[0]) if args and args[0] is not None else ()
        inputs = args[3] if len(args) > 3 else kwargs.get("inputs", ())
        self.inputs = tuple(inputs or ())
        self.raw: list[tuple] = []
        self.pending: list[_Call] = []
        self.frozen = 0  # raw records before this index hold copies, after it references
        self.counted = 0  # raw records before this index are in bytes_held
        self.handles: list[Any] = []
        self.current: _Call | None = None
        self.engine_frame: FrameType | None = None
        self.wrapper: Wrapper | None = None
        self.previous_profile: Any = None
        self.modified_any = False
        self.cf_out: dict[int, tuple] = {}
        self.ran: dict[int, int] = {}  # id(fn) -> position of its record in raw
        self.leaf_cf: dict[int, Any] = {}
        self.leaf_old: dict[int, torch.Tensor | None] = {}
        self.bytes_held = 0
        self.cf_lost = False
        self.own_codes = {self._observe.__code__, self._observe_leaf.__code__}
        self.walk: Walk | None = None
        self.shape: Structure | None = None
        self.leaf_state: dict | None = None
        self.leaf_grads: dict[str, Value] | None = None
        self.written: dict[int, Value] = {}  # id(AccumulateGrad) -> copy of .grad when written
        self.uncopied: list[int] = []  # raw positions of .grad writes whose value is not kept yet
        self.ordinals: dict[tuple, int] = {}  # (hook key, node) -> calls seen in this pass
        self.names: Names | None = None
        self.hooked: dict[Any, list[_Hooked]] = {}
        self.leaf_ids: set[int] = set()
        self.fresh_leaves: set[int] = set()  # id(AccumulateGrad) of leaves whose .grad was None

    # ------------------------------------------------------------------ set-up / tear-down
    def start(self, caller: FrameType | None) -> None:
        lens = self.lens
        # A shallow copy: names are looked up later, as the variables were during this pass.
        self.namespace = dict(lens.names) if lens.names is not None else caller_namespace(user_frame(caller))
        self.shape = structure(self.roots)
        if len(self.shape.nodes) <= EAGER_MODEL_LIMIT:
            # small graphs: read saved tensors and values now, they are gone after the pass
            self._ensure_names()
            self.walk = walk(self.shape, self.names, lens.options)
        else:
            # large graphs: keep what the pass will change (leaf values), build the model later
            self.leaf_state = leaf_state(self.shape, lens.options.replace(show_saved=False))
        self.input_nodes = set()
        for tensor in self.inputs:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                self.input_nodes.add(id(torch.autograd.graph.get_gradient_edge(tensor).node))
        observe = self._observe
        self.handles = [fn.register_hook(observe) for fn in self.shape.nodes]
        for fn in self.shape.leaves.values():
            variable = fn.variable
            self.leaf_ids.add(id(variable))
            if variable.grad is not None:
                # .grad will be added to: keep the old value for the "without hooks" sum
                self.handles.append(fn.register_prehook(self._observe_leaf))
            else:
                self.fresh_leaves.add(id(fn))
        self.previous_profile = sys.getprofile()
        self.profile_function = self._profile  # one bound method, re-installed after each observer
        sys.setprofile(self.profile_function)

    def stop(self) -> None:
        sys.setprofile(self.previous_profile)
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _ensure_names(self) -> None:
        """Look up names (and the hooks on named tensors) once, when first needed."""
        if self.names is not None:
            return
        self.names = names_from(self.namespace)
        root_names = [self.names.tensor_name(root) if isinstance(root, torch.Tensor) else None for root in self.roots]
        self.shape.label(self.names, root_names)
        self._index_hooks()

    def _index_hooks(self) -> None:
        """Map each hook function found on a known tensor to the tensor it is attached to."""
        names = self.names
        shape = self.shape
        leaf_nodes = {id(fn.variable): fn for fn in shape.leaves.values()}
        labelled: list[tuple[str, torch.Tensor]] = [(names.tensors[id(t)], t) for t in names.tensor_objects]
        labelled += [(shape.leaf_labels[id(fn)], fn.variable) for fn in leaf_nodes.values()]
        labelled += [(f"input {i}", t) for i, t in enumerate(self.inputs) if isinstance(t, torch.Tensor)]
        seen: set[int] = set()
        for label, tensor in labelled:
            hooks = tensor._backward_hooks
            after = getattr(tensor, "_post_accumulate_grad_hooks", None)
            if not hooks and not after or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if tensor.grad_fn is not None:
                grad_fn, output_nr = tensor.grad_fn, tensor.output_nr
            elif id(tensor) in leaf_nodes:
                grad_fn, output_nr = leaf_nodes[id(tensor)], 0
            elif tensor.requires_grad:
                grad_fn, output_nr = torch.autograd.graph.get_gradient_edge(tensor).node, 0
            else:
                continue
            for hook in (hooks or {}).values():
                user = multi_grad_user_fn(hook)
                kind = "multi_grad" if user is not None else "tensor"
                function = user if user is not None else hook
                self._remember(_Hooked(function, kind, label, grad_fn, output_nr))
            for hook in (after or {}).values():
                self._remember(_Hooked(hook, "post_accumulate_grad", label, grad_fn, output_nr))

    def _remember(self, hooked: _Hooked) -> None:
        code = code_of(hooked.function)
        if code is not None:
            self.hooked.setdefault(code, []).append(hooked)

    # ------------------------------------------------------------------ the profile function
    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if self.current is not None:
                return  # inside a user hook: its own calls are not hooks
            parent = frame.f_back
            code = frame.f_code
            if parent is None:
                return
            if parent is self.engine_frame:
                if code in self.own_codes:
                    return
                if code.co_filename.startswith(TORCH_DIR) or code.co_filename.startswith(sys.prefix + "/lib"):
                    self.wrapper = Wrapper(frame, wrapper_family(code))
                    return
                self._begin(frame, None)
            elif self.wrapper is not None and parent is self.wrapper.frame:
                if self.wrapper.family != "ignore" and user_function(frame, self.wrapper) is not None:
                    self._begin(frame, self.wrapper)
            elif self.engine_frame is None and code is ENGINE_CODE:
                self.engine_frame = frame
        elif event == "return":
            current = self.current
            if current is not None and frame is current.frame:
                self._end(current, arg)
            elif self.wrapper is not None and frame is self.wrapper.frame:
                self.wrapper = None

    def _begin(self, frame: FrameType, wrapper: Wrapper | None) -> None:
        self._freeze()
        self._ensure_names()
        args = positional_args(frame)
        function = user_function(frame, wrapper)
        module = None
        context = None
        if wrapper is None:
            last = args[-1] if args else None
            if len(args) >= 2 and isinstance(args[-1], tuple) and isinstance(args[-2], tuple):
                kind, received, context = "node", args[-2], args[-1]
            elif isinstance(last, tuple):
                kind, received = "node_pre", last
            elif isinstance(last, torch.Tensor) and id(last) in self.leaf_ids:
                kind, received = "post_accumulate_grad", last
            else:
                kind, received = "tensor", last
        elif wrapper.family == "multi_grad":
            kind, received = "multi_grad", tuple(args[-1]) if args else ()
        else:
            module = wrapper_module(wrapper)
            kind = module_hook_kind(wrapper, function, module)
            if kind.endswith("module_full_pre"):
                received = args[-1] if args else ()
            else:
                received, context = (args[-2], args[-1]) if len(args) >= 2 else ((), ())
        candidates = self._candidates(frame, function)
        if function is None and len({id(h.function) for h in candidates}) == 1:
            function = candidates[0].function
        limit = self.lens.store_limit
        if kind == "post_accumulate_grad":
            grad_in = snapshot(received.grad, limit)
        else:
            grad_in = _snapshot_copies(received, limit)
        self.current = _Call(
            code=frame.f_code,
            function=function,
            kind=kind,
            received=received,
            grad_in=grad_in,
            frame=frame,
            candidates=candidates,
            module=module,
            context=_snapshot_copies(context, limit) if context is not None else None,
        )

    def _candidates(self, frame: FrameType, function: Any) -> list[_Hooked]:
        """Hooks found on known tensors that could be the one running in ``frame``.

        Closures made by one ``def`` share a code object; their cells tell them apart.
        """
        found = []
        for hooked in self.hooked.get(frame.f_code, ()):
            if function is not None:
                if hooked.function is function:
                    found.append(hooked)
                continue
            cells = getattr(hooked.function, "__closure__", None) or ()
            names = getattr(getattr(hooked.function, "__code__", None), "co_freevars", ())
            try:
                if all(frame.f_locals.get(name) is cell.cell_contents for name, cell in zip(names, cells)):
                    found.append(hooked)
            except ValueError:  # an empty cell
                continue
        return found

    def _end(self, call: _Call, returned: Any) -> None:
        self.current = None
        limit = self.lens.store_limit
        call.returned_none = returned is None
        if call.kind == "post_accumulate_grad":
            call.grad_out = snapshot(call.received.grad, limit)
        elif call.kind == "multi_grad":
            call.grad_out = None
        elif returned is None:
            call.grad_out = _snapshot_copies(call.received, limit)  # edits in place count
            call.raw_out = _clone_all(call.received)
        else:
            call.grad_out = _snapshot_copies(returned, limit)
            call.raw_out = _clone_all(returned)
        if call.kind != "multi_grad":
            call.modified = not values_equal(call.grad_in, call.grad_out)
        if call.modified:
            self.modified_any = True
        call.frame_code = call.frame.f_code
        call.frame = None  # type: ignore[assignment]  # don't keep the hook's locals alive
        call.received = None
        self.pending.append(call)

    # ------------------------------------------------------------------ node observers
    def _observe_leaf(self, grad_outputs: tuple) -> None:
        """Pre-hook on ``AccumulateGrad`` of a leaf that already has a ``.grad``: keep the old value
        when a hook changed something, for the "without hooks" sum.  Returns None."""
        if self.modified_any:
            grad = _current_node().variable.grad
            self.leaf_old[id(_current_node())] = grad.detach().clone() if grad is not None else None

    def _observe(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        """Post-hook on every node: what reached it and what it sent.  Returns None."""
        sys.setprofile(None)
        try:
            fn = _current_node()
            if self.pending or self.modified_any:
                self._record_node(fn, grad_inputs, grad_outputs)
            else:  # the common case, kept short: nothing but this node happened
                raw = self.raw
                self.ran[id(fn)] = len(raw)
                if id(fn) in self.shape.leaves:
                    # the copy of .grad is decided later (before any user code, or at the end)
                    self.uncopied.append(len(raw))
                    raw.append(("grad", fn, grad_outputs[0] if grad_outputs else None, None))
                else:
                    raw.append(("node", fn, grad_inputs, grad_outputs))
                if len(raw) - self.counted >= 64:
                    self._count_bytes()
        finally:
            sys.setprofile(self.profile_function)

    def _record_node(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple) -> None:
        pending, self.pending = self.pending, []
        for call in pending:
            self._place(call, fn, grad_outputs)
        for call in pending:
            if call.kind in _BEFORE_NODE:
                self.raw.append(("call", call))
        position = len(self.raw)
        is_leaf = id(fn) in self.shape.leaves
        if is_leaf:
            self.raw.append(("grad", fn, grad_outputs[0] if grad_outputs else None, None))
            self._copy_written(position)
        else:
            self.raw.append(("node", fn, grad_inputs, grad_outputs))
        for call in pending:
            if call.kind not in _BEFORE_NODE:
                self.raw.append(("call", call))
        self.ran[id(fn)] = position
        self._count_bytes()
        if self.modified_any and not self.cf_lost:
            self._counterfactual(fn, grad_inputs, grad_outputs, pending, is_leaf)

    def _place(self, call: _Call, fn: Any, grad_outputs: tuple) -> None:
        """Decide what a hook call is attached to (tensor name, node, output index)."""
        if call.kind in ("tensor", "post_accumulate_grad", "multi_grad"):
            candidates = [h for h in call.candidates if h.kind == call.kind]
            here = [h for h in candidates if h.grad_fn is fn]
            if call.kind == "multi_grad":
                targets = sorted({h.target for h in candidates}, key=[h.target for h in candidates].index)
                call.target = ", ".join(targets) if targets else "several tensors"
                call.node_fn = fn
                return
            if not here and fn is not None:
                # Only an input of autograd.grad fires its hooks without its node running next.
                here = [h for h in candidates if id(h.grad_fn) in self.input_nodes and self._all_consumers_ran(h.grad_fn)]
            same_target = len({(h.target, id(h.grad_fn)) for h in candidates}) == 1
            chosen = here[0] if here else (candidates[0] if candidates and same_target and fn is None else None)
            if chosen is not None:
                call.target, call.node_fn, call.output_nr = chosen.target, chosen.grad_fn, chosen.output_nr
                return
            if fn is None:  # fired after the last node ran and matches no known tensor
                call.target = "an unnamed tensor"
                return
            call.node_fn = fn
            call.output_nr = _output_of(call, grad_outputs)
            return  # target: the output's label, known once the model is built
        call.node_fn = fn
        if call.module is not None:
            call.target = self.names.module_name(call.module) or type(call.module).__name__
            call.wrapper_seq = fn._sequence_nr()
        # node hooks: the target is the node's label, known once the model is built

    def _all_consumers_ran(self, node: Any) -> bool:
        """True when the engine could now reach ``node`` (it is used, and every user of it ran)."""
        found = False
        for (node_id, _), consumers in self.shape.consumers.items():
            if node_id == id(node):
                found = True
                if not all(id(consumer) in self.ran for consumer, _ in consumers):
                    return False
        return found

    def _copy_written(self, position: int) -> None:
        """Keep the value ``.grad`` got at the write of record ``position``: a reference when it
        was None before and is a copy of what arrived (that tensor is then the lens's alone),
        otherwise a copy (later passes and hooks change ``.grad`` in place)."""
        kind, fn, received, _ = self.raw[position]
        current = fn.variable.grad
        if (
            id(fn) in self.fresh_leaves
            and received is not None
            and current is not None
            and current.layout == torch.strided
            and received.layout == torch.strided
            and current.data_ptr() != received.data_ptr()
        ):
            if received.grad_fn is None and received.numel() <= self.lens.store_limit:
                grad = received
            else:
                grad = _snapshot_values(received, self.lens.store_limit)
        else:
            grad = _snapshot_copies(current, self.lens.store_limit)
        self.written[id(fn)] = grad
        self.raw[position] = (kind, fn, received, grad)

    def _freeze(self) -> None:
        """User code is about to run: clone every gradient still held by reference."""
        for position in self.uncopied:
            self._copy_written(position)
        self.uncopied.clear()
        raw = self.raw
        for position in range(self.frozen, len(raw)):
            entry = raw[position]
            if entry[0] in ("node", "grad"):
                raw[position] = (entry[0], entry[1], _clone_all(entry[2]), entry[3] if entry[0] == "grad" else _clone_all(entry[3]))
        self.frozen = len(raw)

    def _count_bytes(self) -> None:
        """Add up what the newest records hold; over the memory budget, keep summaries instead."""
        raw = self.raw
        for position in range(self.counted, len(raw)):
            entry = raw[position]
            if entry[0] == "node":
                for grad in entry[2]:
                    if isinstance(grad, torch.Tensor):
                        self.bytes_held += grad.nbytes
        self.counted = len(raw)
        if self.bytes_held <= self.lens.memory_budget:
            return
        limit = self.lens.options.max_elements  # only what a label prints stays a tensor
        for position, entry in enumerate(raw):
            if entry[0] == "node":
                raw[position] = ("node", entry[1], _snapshot_values(entry[2], limit), _snapshot_values(entry[3], limit))
        self.bytes_held = 0
        self.cf_lost = True  # summaries cannot be fed back through a node

    # ------------------------------------------------------------------ counterfactual
    def _counterfactual(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple, calls: list[_Call], is_leaf: bool) -> None:
        """What ``fn`` would have sent with no hook anywhere, where that differs from what it sent.

        Runs once some hook changed a gradient in this pass.  ``fn`` diverges when a hook on it
        changed something, or when the unhooked sum of what reached it differs from what it got
        (a hook upstream, or one that edited a shared gradient in place); then it is called
        directly on the unhooked gradients.
        """
        diverged = any(call.node_fn is fn and call.modified for call in calls)
        cf_in = list(grad_outputs)
        for output_nr, received in enumerate(grad_outputs):
            consumers = self.shape.consumers.get((id(fn), output_nr), [])
            unhooked = self._unhooked_input(fn, output_nr, consumers)
            if unhooked is _UNKNOWN or not _same(unhooked, received):
                cf_in[output_nr] = unhooked
                diverged = True
        if not diverged:
            return
        if is_leaf:
            self.leaf_cf[id(fn)] = cf_in[0]
            return
        if any(value is _UNKNOWN for value in cf_in):
            self.cf_out[id(fn)] = _UNKNOWN
            return
        self.cf_out[id(fn)] = _call_node(fn, cf_in)

    def _unhooked_input(self, fn: Any, output_nr: int, consumers: list[tuple[Any, int]]) -> torch.Tensor | None:
        """What output ``output_nr`` of ``fn`` would have received with no hook anywhere."""
        arrivals = []
        for consumer, slot in consumers:
            ran = self.ran.get(id(consumer))
            if ran is None:
                continue
            if id(consumer) in self.cf_out:
                outputs = self.cf_out[id(consumer)]
                if outputs is _UNKNOWN:
                    return _UNKNOWN
                value = outputs[slot]
            else:
                value = self.raw[ran][2][slot]
            arrivals.append((ran, value))
        arrivals.sort(key=lambda item: item[0])
        total = None
        for index, (root_fn, root_nr) in enumerate(self.shape.root_edges):
            if root_fn is fn and root_nr == output_nr:
                seed = self.grad_tensors[index] if index < len(self.grad_tensors) else None
                total = _add(total, seed)
        for _, value in arrivals:
            total = _add(total, value if isinstance(value, torch.Tensor) else None)
        return total

    # ------------------------------------------------------------------ results
    def fail(self, error: BaseException) -> None:
        self.error = error
        frames = set()
        traceback = error.__traceback__
        while traceback is not None:
            frames.add(traceback.tb_frame.f_code)
            traceback = traceback.tb_next
        if self.current is not None:  # a hook raised: the profiler saw its call but no normal return
            call = self.current
            self.current = None
            call.error = f"{type(error).__name__}: {error}"
            call.frame_code = call.frame.f_code
            call.frame = None  # type: ignore[assignment]
            call.received = None
            self.pending.append(call)
        # Usually the profiler already saw the raising hook "return" (with None): it is the
        # last call recorded, and its frame is in the traceback.
        last = self.pending[-1] if self.pending else None
        if last is not None and last.error is None and last.returned_none and last.frame_code in frames:
            last.error = f"{type(error).__name__}: {error}"
            last.grad_out = None
            last.modified = False

    def seal(self, error: BaseException | None, result: Any = None) -> None:
        """End of the pass: copy everything that later code could change (cheap; no model yet)."""
        limit = self.lens.store_limit
        for call in self.pending:  # calls after the last node ran (e.g. an autograd.grad input's hook)
            if call.target is None and call.node_fn is None:
                self._place(call, None, ())
            self.raw.append(("call", call))
        self.pending = []
        self.error = error
        for position in self.uncopied:
            self._copy_written(position)
        self.uncopied.clear()
        self.leaf_grads, self.without = self._leaf_results(limit)
        self.input_grads = {}
        if self.kind == "grad" and isinstance(result, (tuple, list)):
            hooks_ran = any(entry[0] == "call" for entry in self.raw)
            for index, value in enumerate(result[: len(self.inputs)]):
                self.input_grads[index] = snapshot(value, limit) if isinstance(value, torch.Tensor) else None
                if not hooks_ran:
                    self.without[index] = self.input_grads[index]
        self.cf_out.clear()
        self.leaf_cf.clear()
        self.leaf_old.clear()
        self.ran.clear()

    def build(self) -> BackwardPass:
        """The model of this pass (built after the pass: labels, edges, events)."""
        limit = self.lens.store_limit
        self._ensure_names()
        if self.walk is None:
            options = self.lens.options.replace(show_saved=False)
            self.walk = walk(self.shape, self.names, options, leaf_state=self.leaf_state)
        walk_ = self.walk
        events: list[Any] = []
        for entry in self.raw:
            step = len(events)
            if entry[0] == "node":
                events.append(self._node_event(step, entry[1], entry[2], entry[3], limit))
            elif entry[0] == "grad":
                fn = entry[1]
                events.append(
                    GradWritten(
                        step=step,
                        node=walk_.function_ids.get(id(fn)),
                        name=self.shape.leaf_labels.get(id(fn), "leaf"),
                        grad=entry[3],
                        received=_snapshot_values(entry[2], limit),
                    )
                )
            else:
                events.append(self._hook_event(step, entry[1]))
        pass_error = None
        if self.error is not None:
            error = self.error
            pass_error = PassError(step=len(events), type=type(error).__name__, message=str(error))
            events.append(pass_error)
        self._number_module_calls(events)
        built = BackwardPass(
            index=self.index,
            kind=self.kind,
            graph=walk_.graph,
            events=tuple(events),
            leaf_grads=self._by_name(self.leaf_grads),
            grads_without_hooks=self._by_name(self.without),
            error=pass_error,
            roots=tuple(self.shape.root_labels),
            inputs=tuple(self._input_name(index, tensor) for index, tensor in enumerate(self.inputs)),
            input_grads=self._by_name(self.input_grads),
        )
        # Let go of torch's graph: nodes, saved tensors, hook functions.
        self.raw = []
        self.error = None
        self.walk = self.shape = self.hooked = self.names = self.namespace = None  # type: ignore[assignment]
        self.roots = self.inputs = self.grad_tensors = ()
        return built

    def _node_event(self, step: int, fn: Any, grad_inputs: Any, grad_outputs: Any, limit: int) -> NodeRun:
        walk_ = self.walk
        targets = []
        for next_fn, output_nr in fn.next_functions:
            targets.append(walk_.output_label(next_fn, output_nr) if next_fn is not None else "(no grad needed)")
        return NodeRun(
            step=step,
            node=walk_.function_ids.get(id(fn)),
            name=fn.name(),
            label=walk_.labels.get(id(fn), fn.name()),
            grad_in=_snapshot_values(tuple(grad_outputs), limit),
            grad_out=_snapshot_values(tuple(grad_inputs), limit),
            edges=tuple(walk_.input_edges.get((id(fn), slot)) for slot in range(len(grad_inputs))),
            in_edges=tuple(walk_.output_edges.get((id(fn), k)) for k in range(len(grad_outputs))),
            targets=tuple(targets),
        )

    def _hook_event(self, step: int, call: _Call) -> HookCall:
        lens = self.lens
        if call.target is None and call.node_fn is not None:
            if call.kind in ("tensor", "post_accumulate_grad"):
                call.target = self.walk.output_label(call.node_fn, call.output_nr or 0)
            else:
                call.target = self.walk.labels.get(id(call.node_fn), call.node_fn.name())
        function = call.function if call.function is not None else call.code
        key = (call.kind, call.target, function)
        # The same function registered twice on one tensor is two hooks: within a pass, the
        # n-th call of it at one node is its n-th registration.
        position = (key, id(call.node_fn))
        ordinal = self.ordinals.get(position, 0)
        self.ordinals[position] = ordinal + 1
        lens_key = key + (ordinal,)
        lens._invocations[lens_key] = lens._invocations.get(lens_key, 0) + 1
        return HookCall(
            hook=function_name(call.function, call.frame_code),
            kind=call.kind,
            target=call.target or "?",
            pass_index=self.index,
            invocation=lens._invocations[lens_key],
            grad_in=call.grad_in,
            grad_out=call.grad_out,
            modified=call.modified,
            returned_none=call.returned_none,
            node=self._node_id_for(call),
            step=step,
            context=call.context,
            error=call.error,
            forward_call=call.wrapper_seq,
        )

    def _node_id_for(self, call: _Call) -> str | None:
        walk_ = self.walk
        if call.node_fn is None:
            return None
        if call.kind in ("tensor", "multi_grad") and call.output_nr is not None:
            tensor_id = walk_.tensor_ids.get((id(call.node_fn), call.output_nr))
            if tensor_id is not None:
                return tensor_id
        return walk_.function_ids.get(id(call.node_fn))

    def _number_module_calls(self, events: list[Any]) -> None:
        """Module hooks get no call index from torch: pair them with forward calls by node order."""
        sequences: dict[tuple[str, bool], list[int]] = {}
        for event in events:
            if isinstance(event, HookCall) and event.forward_call is not None:
                phase = event.kind.endswith("pre")
                sequences.setdefault((event.target, phase), [])
                if event.forward_call not in sequences[(event.target, phase)]:
                    sequences[(event.target, phase)].append(event.forward_call)
        for index, event in enumerate(events):
            if isinstance(event, HookCall) and event.forward_call is not None:
                order = sorted(sequences[(event.target, event.kind.endswith("pre"))])
                events[index] = dataclasses.replace(event, forward_call=order.index(event.forward_call) + 1)

    def _by_name(self, values: dict) -> dict[str, Value]:
        """Results are kept by leaf node (backward) or input position (grad); shown by name."""
        if self.kind == "grad":
            return {self._input_name(index, self.inputs[index]): value for index, value in values.items()}
        return {self.shape.leaf_labels[key]: value for key, value in values.items()}

    def _leaf_results(self, limit: int) -> tuple[dict[int, Value], dict[int, Value]]:
        """``.grad`` of each leaf after the pass, and what it would be without hooks, by leaf node."""
        shape = self.shape
        leaf_grads: dict[int, Value] = {}
        without: dict[int, Value] = {}
        hooks_ran = any(entry[0] == "call" for entry in self.raw)
        if self.kind == "grad":
            for index, tensor in enumerate(self.inputs):
                without[index] = self._without_for_input(tensor, limit) if hooks_ran else None
            return leaf_grads, without
        touched_after_write = {
            id(entry[1].node_fn) for entry in self.raw if entry[0] == "call" and entry[1].kind == "post_accumulate_grad"
        }
        for name, fn in shape.leaves.items():
            if id(fn) in self.written and id(fn) not in touched_after_write:
                leaf_grads[name] = self.written[id(fn)]  # the copy taken when .grad was written
            else:
                grad = fn.variable.grad
                leaf_grads[name] = snapshot(grad, limit) if grad is not None else None
            if not hooks_ran or id(fn) not in self.leaf_cf:
                # No hook changed anything on the way to this leaf: unhooked equals real.
                lost = self.cf_lost and self.modified_any
                without[name] = None if lost else leaf_grads[name]
                continue
            if self.leaf_cf[id(fn)] is _UNKNOWN:
                without[name] = None
                continue
            old = self.leaf_old.get(id(fn))
            value = _add(old, self.leaf_cf[id(fn)])
            without[name] = snapshot(value, limit) if value is not None else None
        return leaf_grads, without

    def _without_for_input(self, tensor: Any, limit: int) -> Value:
        if not isinstance(tensor, torch.Tensor):
            return None
        if tensor.grad_fn is not None:
            fn, output_nr = tensor.grad_fn, tensor.output_nr
        else:
            fn, output_nr = torch.autograd.graph.get_gradient_edge(tensor).node, 0
        if self.cf_lost and self.modified_any:
            return None
        consumers = self.shape.consumers.get((id(fn), output_nr), [])
        value = self._unhooked_input(fn, output_nr, consumers)
        return snapshot(value, limit) if isinstance(value, torch.Tensor) else None

    def _input_name(self, index: int, tensor: Any) -> str:
        if isinstance(tensor, torch.Tensor):
            name = self.names.tensor_name(tensor)
            if name is not None:
                return name
            if tensor.grad_fn is None and tensor.requires_grad:
                fn = torch.autograd.graph.get_gradient_edge(tensor).node
                if id(fn) in self.shape.leaf_labels:
                    return self.shape.leaf_labels[id(fn)]
        return f"input {index}"


def _batched(args: tuple) -> bool:
    """Gradients batched by vmap (``autograd.grad(..., is_grads_batched=True)``) cannot be recorded."""
    grads = args[0] if args else None
    functorch = torch._C._functorch
    for grad in grads or ():
        if isinstance(grad, torch.Tensor) and (functorch.is_legacy_batchedtensor(grad) or functorch.is_batchedtensor(grad)):
            return True
    return torch._C._are_functorch_transforms_active()


_UNKNOWN: Any = object()  # an unhooked value that cannot be computed without running user code


def _call_node(fn: Any, grads: list) -> Any:
    """Run one backward function directly (no hook fires) on the given gradients.

    A custom ``autograd.Function`` written by the user is not re-run: its
    ``backward`` is user code and may have side effects (a print would show
    twice).  Torch's own Python functions (e.g. the node module hooks add) are.
    """
    forward_cls = getattr(fn, "_forward_cls", None)
    with torch.no_grad():
        try:
            if forward_cls is not None:
                if not forward_cls.__module__.startswith("torch."):
                    return _UNKNOWN
                outputs = fn.apply(*grads)
            else:
                outputs = fn(*grads)
        except Exception:  # a node that cannot be called directly: nothing is known past it
            return _UNKNOWN
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _snapshot_copies(values: Any, limit: int) -> Any:
    """Clones (or summaries) of values that user code may still change in place."""
    if isinstance(values, (tuple, list)):
        return tuple(_snapshot_copies(item, limit) for item in values)
    return snapshot(values, limit) if isinstance(values, torch.Tensor) else None


def _snapshot_values(values: Any, limit: int) -> Any:
    """Values held only by the lens (nothing else can change them): detached, not copied."""
    if isinstance(values, (tuple, list)):
        return tuple(_snapshot_values(item, limit) for item in values)
    if isinstance(values, torch.Tensor):
        if values.numel() <= limit and not values.requires_grad and values.layout == torch.strided:
            return values.detach()
        return snapshot(values, limit)
    return values  # None, or a summary already


def _output_of(call: _Call, grad_outputs: tuple) -> int:
    """Which output of a multi-output node an unnamed tensor hook belonged to: the one whose
    gradient equals what the hook passed on."""
    produced = call.raw_out
    for index, value in enumerate(grad_outputs):
        if value is not None and produced is not None and value.shape == getattr(produced, "shape", None):
            if values_equal(value, produced):
                return index
    return 0


class Lens:
    """Record every backward pass run inside a ``with`` block.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x ** 2
    ...     _ = y.register_hook(lambda g: g * 0.5)
    ...     (y * 3 + y * 2).backward()
    >>> call = lens.hook_calls[0]
    >>> call.target, float(call.grad_in), float(call.grad_out), float(x.grad)
    ('y', 5.0, 2.5, 10.0)
    >>> float(lens.passes[0].grads_without_hooks["x"])
    20.0

    ``names`` is the namespace used for labels (default: the namespace of the
    code that calls ``backward()``).  Gradients with more than ``store_limit``
    elements are kept as summaries; ``memory_budget`` bytes bounds what one pass
    holds by reference.
    """

    def __init__(
        self,
        names: Mapping[str, Any] | None = None,
        *,
        store_limit: int = 4096,
        max_elements: int = 16,
        max_nodes: int = 300,
        memory_budget: int = 256 * 2**20,
    ) -> None:
        self.names = names
        self.store_limit = store_limit
        self.memory_budget = memory_budget
        self.options = GraphOptions(max_elements=max_elements, max_nodes=max_nodes)
        self._passes: list[BackwardPass] = []
        self._unbuilt: list[_PassRecorder] = []
        self._invocations: dict[tuple, int] = {}
        self._original: Any = None
        self._thread: int | None = None
        self._recording = False

    @property
    def passes(self) -> list[BackwardPass]:
        """One :class:`BackwardPass` per backward call recorded, in call order."""
        self._build_pending()
        return self._passes

    def _build_pending(self, keep: int = 0) -> None:
        while len(self._unbuilt) > keep:
            recorder = self._unbuilt.pop(0)
            try:
                self._passes.append(recorder.build())
            except Exception as problem:  # never break the student's code over a drawing
                warnings.warn(f"autograd_lens could not record backward pass {recorder.index + 1} ({problem!r}).", stacklevel=2)

    @property
    def hook_calls(self) -> list[HookCall]:
        """Every hook call of every pass, in firing order."""
        return [call for backward_pass in self.passes for call in backward_pass.hook_calls]

    def __enter__(self) -> "Lens":
        if _ACTIVE:
            raise RuntimeError(
                "a Lens is already recording; nested Lens blocks are not supported. "
                "End the outer `with Lens()` (or %%lens cell) first."
            )
        self._original = torch.autograd._engine_run_backward
        self._thread = threading.get_ident()
        lens = self

        def traced_run_backward(t_outputs, *args, **kwargs):
            __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
            return lens._run(t_outputs, args, kwargs)

        torch.autograd._engine_run_backward = traced_run_backward
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        torch.autograd._engine_run_backward = self._original
        _ACTIVE.remove(self)
        self._build_pending()

    def _run(self, t_outputs: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True  # noqa: F841
        original = self._original
        if self._recording or threading.get_ident() != self._thread or _batched(args):
            # nested backward (inside a hook), another thread, or vmap'ed grads (is_grads_batched):
            # not traced, never changed
            return original(t_outputs, *args, **kwargs)
        # Unbuilt passes keep their graphs alive: build all but the newest few.
        self._build_pending(keep=MAX_UNBUILT)
        recorder = _PassRecorder(self, t_outputs, args, kwargs)
        try:
            recorder.start(sys._getframe(1))
        except Exception as problem:  # the student's backward must run even if the lens cannot follow
            recorder.stop()
            warnings.warn(f"autograd_lens could not trace this backward pass ({problem!r}); it ran untraced.", stacklevel=2)
            return original(t_outputs, *args, **kwargs)
        self._recording = True
        error: BaseException | None = None
        result: Any = None
        try:
            result = original(t_outputs, *args, **kwargs)
            return result
        except BaseException as raised:
            error = raised
            recorder.fail(raised)
            raise
        finally:
            recorder.stop()
            self._recording = False
            try:
                recorder.seal(error, result)
                self._unbuilt.append(recorder)
            except Exception as problem:
                warnings.warn(f"autograd_lens could not record this backward pass ({problem!r}).", stacklevel=2)

    # ------------------------------------------------------------------ showing
    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..views.trace_display import lens_bundle

        return lens_bundle(self)

    def __repr__(self) -> str:
        from ..views.trace_display import lens_text

        return lens_text(self)

    def show(self) -> None:
        """Display the recorded passes (in Jupyter)."""
        from IPython.display import display

        display(self)

    def plot(self, pass_index: int = -1):
        """Gradients with vs without hooks, and hook call counts (a matplotlib figure)."""
        from ..views.plots import plot

        return plot(self, pass_index)

    def to_html(self, path: str | None = None) -> str:
        """A standalone HTML page of the recorded passes; written to ``path`` when given."""
        from ..views.static_html import lens_page

        page = lens_page(self)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page
