"""The hook calls of one pass, seen by a profile function: which user hook the engine (or torch's Python wrapper)
calls, with what, and what it returns; backward runs nested inside the pass, noted apart."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch

from ..model import values_equal
from .hooks import (ENGINE_CODE, Wrapper, code_of, engine_call_args, frame_code, function_name, may_edit_in_place,
                    module_hook_kind, multi_grad_received, runs_in, shown_name, standard_library, user_function,
                    weak_container_callback, wrapper_family, wrapper_module, wrapper_state, run_by_collector,
                    DISTRIBUTED_DIR, wrapped_user_functions, not_a_gradient_hook)
from .late import LATE_CODE, REGISTER_CODE, dict_is_new, registered as late_registered, tensor_registered
from .livecheck import live_change, marks, post_accumulate_marks, summarised
from .nested import NestedCalls, grads_written
from .nodes import NodeRecorder
from .order import UNSEEN
from .records import HookRecord, KnownHook, NodeRecord, after_post_accumulate, leaf_before, snapshot_all
from .snapshot import fast_snapshot, held_bytes, hidden_from_user as _hidden_from_modes, plain_small, snapshot
from .finalgrad import budget_limit, counted
from .saved import saved_names
from .torchhooks import torchs_own
from .shared import edited_spans
from .bits import same_bits, values_differ
from .ledger import graph_of as _graph_of, replaces as _replaces

_current_node = torch._C._current_autograd_node
TENSOR_REGISTER_CODE = getattr(torch.Tensor.register_hook, "__code__", None)  # Python in torch 2.x
# the engine calling a custom autograd.Function's backward (torch/autograd/function.py), with what the node received
APPLY_CODE = getattr(torch.autograd.function.BackwardCFunction.apply, "__code__", None)
# ... or with them in one list (a Function with boxed_grads_call = True, whose backward may free them one by one)
APPLY_BOXED_CODE = getattr(getattr(torch.autograd.function.BackwardCFunction, "apply_boxed", None), "__code__", None)
_RAW_NAMES: dict[type, tuple[str, ...]] = {}  # node type -> the names of its saved values' raw forms (_raw_saved_*)
NODE_CODE, WRITE_CODE = NodeRecorder._on_node.__code__, NodeRecorder._before_write.__code__  # the lens's node hooks

class HookCalls(NestedCalls):
    """Part of :class:`~autograd_lens.capture.observe.PassObserver`: the profile function and the hook calls it sees."""

    # a hook gave back other tensors of the same values (g.detach(), g.detach_(), a copy under no_grad): with a graph
    # (create_graph=True) what the pass builds may differ all the same (Ledger.note_made); graph_in: the call's grad_fns
    replaced, graph_in = False, None

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        try:
            code = frame.f_code
            if code is NODE_CODE or code is WRITE_CODE:  # the lens's own node hook: at every node, answered first
                if event == "return":  # no branch below acts on the return of a frame of the lens's own
                    return  # (and on its call, what the general way below decides, in its order:)
                if event == "call" and not self.nested_frames and self.current is None and self.in_engine \
                        and frame.f_back is self.engine_frame:
                    sys.setprofile(None)  # unwatched from its first line (it switches this back on)
                    self.paused = True
                    return
            if event == "call":
                if self.nested_frames:
                    self._nested_profile(frame)
                    return
                if frame.f_code is TENSOR_REGISTER_CODE and self.in_engine:  # a tensor hook registered mid-pass
                    self.tensor_registering, self.tensor_dict_new = frame, dict_is_new(frame)
                    return
                if frame.f_code is ENGINE_CODE and self.in_engine:  # a backward() run inside the pass
                    self._nested_start(frame)
                    return
                if self.current is not None or not self.in_engine:
                    if self.engine_frame is None and frame.f_code is ENGINE_CODE:
                        self.engine_frame = frame
                    return  # inside a user hook (its own calls are not hooks), or outside the C++ engine
                parent = frame.f_back
                if parent is self.engine_frame:
                    code = frame.f_code
                    self.plain = self.plain and (code is NODE_CODE or code is WRITE_CODE)  # see unseen_by_modes
                    if code in self._own_codes:
                        if code is LATE_CODE:  # a late post-hook's wrapper (late.py): the user's hook is inside
                            self.late_frame = frame
                            self.copies.clear()
                        else:  # the lens's own node hook: unwatched from its first line (it switches this back on)
                            sys.setprofile(None)
                            self.paused = True
                        return
                    # The engine runs Python (a hook, a custom Function's backward): it may edit a gradient
                    # where the version counter does not see it (``.data``, numpy), so no earlier copy is reused
                    # after it starts (a hook's own call first reads what it got: nothing has run yet).
                    if torchs_own(self, code, frame):  # (not dynamo's closure calling a hook it traced: that is the hook)
                        if code is APPLY_CODE or code is APPLY_BOXED_CODE:
                            self._python_backward(frame, boxed=code is APPLY_BOXED_CODE)
                        self.copies.clear()
                        self.wrapper = Wrapper(frame, wrapper_family(code))
                        if self.wrapper.family == "ignore" and code.co_filename.startswith(DISTRIBUTED_DIR):
                            self._foreign(function_name(None, code))  # torch's own DDP comm hooks: fp16_compress_hook
                        if self.wrapper.family in ("module_full", "module_pre"):
                            self._boundary(self.wrapper)
                    elif code not in self.unpack_codes and not self._is_unpack_hook(code):
                        try:
                            self._begin(frame, None)
                        finally:
                            self.copies.clear()
                    else:
                        self.copies.clear()
                elif self.wrapper is not None and parent is self.wrapper.frame:
                    if self.wrapper.family != "ignore" and user_function(frame, self.wrapper) is not None:
                        self._begin(frame, self.wrapper)
                elif parent is not None and parent is self.late_frame:
                    self._begin(frame, None)  # as if the engine called it
                elif frame.f_code is REGISTER_CODE:  # a node hook registered while a node runs (late.py)
                    self.registering = frame
            elif self.nested_frames and event != "return":
                if frame is self.nested_frames[-1] and getattr(arg, "__name__", None) == "run_backward":
                    self.nested_running = event == "c_call"  # like in_engine, for the nested engine
                elif event == "c_call" and self.nested_wrapper is not None and frame is self.nested_wrapper.frame \
                        and self.nested_wrapper.family != "ignore" \
                        and any(function is arg for function in wrapped_user_functions(self.nested_wrapper)):
                    self._nested_wrapped(arg)  # torch's wrapper calls a hook written in C
            elif event == "return" and self.nested_frames:
                if frame is self.nested_frames[-1]:
                    self.nested_frames.pop()
                    self.nested_running = bool(self.nested_frames)
                    if not self.nested_frames:
                        grads_written(self)
                elif self.nested_wrapper is not None and frame is self.nested_wrapper.frame:
                    self.nested_wrapper = None
            elif event == "return":
                current = self.current
                if current is not None and frame is current.frame:
                    self._end(current, arg)
                elif self.wrapper is not None and frame is self.wrapper.frame:
                    self.wrapper = None
                elif frame is self.registering:
                    self.registering = None
                    late_registered(self, arg)
                elif frame is self.tensor_registering:
                    self.tensor_registering = None
                    tensor_registered(self, frame.f_locals.get("self"), arg, self.tensor_dict_new)
                elif frame is self.late_frame:
                    self.late_frame = None
            elif event == "c_call" and self.wrapper is not None and frame is self.wrapper.frame:
                if self.current is None and self.in_engine and self.wrapper.family != "ignore" \
                        and any(function is arg for function in wrapped_user_functions(self.wrapper)):
                    self._begin_unseen(self.wrapper, arg)  # torch's wrapper calls a hook written in C
            elif frame is self.engine_frame and getattr(arg, "__name__", None) == "run_backward":
                self.in_engine = event == "c_call"  # c_call starts the engine; c_return / c_exception end it
        except Exception as problem:  # never let the profile function raise into the user's code
            self._failed("a hook call", problem)

    def _is_unpack_hook(self, code: Any) -> bool:
        """A saved-tensor unpack hook called while the current node unpacks what it saved."""
        node = _current_node()
        if node is None:
            return False
        kind = type(node)
        raw_names = _RAW_NAMES.get(kind)
        if raw_names is None:  # its saved values' raw forms, read without unpacking
            raw_names = _RAW_NAMES[kind] = tuple(name for name in map("_raw".__add__, saved_names(node))
                                                 if hasattr(kind, name))
        for raw_name in raw_names:
            raw = getattr(node, raw_name)
            for item in raw if isinstance(raw, (tuple, list)) else (raw,):
                hook = getattr(item, "unpack_hook", None)
                if hook is not None and code_of(hook) is code:
                    self.unpack_codes.add(code)
                    return True
        return False

    def _begin(self, frame: FrameType, wrapper: Wrapper | None) -> None:
        if self.broken:
            return
        with _hidden_from_modes():
            self.ensure_names()
            function = user_function(frame, wrapper)
            candidates = self._candidates(frame, function)
            if function is None and len({id(h.function) for h in candidates}) == 1:
                function = candidates[0].function
            args = engine_call_args(frame, function)
            module = None
            context = None
            if wrapper is None and not candidates and (not_a_gradient_hook(args) or frame_code(frame).co_name
                                                       == "__torch_dispatch__"):  # a subclass's, called by a node
                if weak_container_callback(frame_code(frame)):
                    pass  # a weak dictionary dropping a key whose object was freed (checkpointing's): no gradient
                elif run_by_collector(frame_code(frame)):  # Python's garbage collector, not torch, called it here
                    self.unhooked.activate(edited_in_place=True)
                else:
                    self._foreign(function_name(function, frame_code(frame)), frame_code(frame))
                return
            if wrapper is None:
                first = args[0] if args else None
                second = args[1] if len(args) > 1 else None
                if isinstance(first, tuple) and isinstance(second, tuple):
                    kind, received, context = "node", first, second
                elif isinstance(first, tuple):
                    kind, received = "node_pre", first
                elif isinstance(first, torch.Tensor) and id(first) in self.leaf_ids and first.grad_fn is None:
                    kind, received = "post_accumulate_grad", first
                else:
                    kind, received = "tensor", first
            elif wrapper.family == "multi_grad":
                kind, received = "multi_grad", multi_grad_received(wrapper, args)
            else:
                module = wrapper_module(wrapper)
                kind = module_hook_kind(wrapper, function, module)
                if kind.endswith("module_full_pre"):
                    received = args[1] if len(args) > 1 else ()
                else:
                    received, context = (args[1], args[2]) if len(args) > 2 else ((), ())
            limit = budget_limit(self)  # past the memory budget: summaries, as of node values (nodes._keep)
            node = _current_node()
            key = None
            if function is None and kind in ("node", "node_pre") and node is not None:
                function, key = self._node_hook_function(node, kind == "node_pre", frame_code(frame))
            if kind in ("post_accumulate_grad", "node") and node is not None and id(node) in self.shape.leaves \
                    and id(node) not in self.written:
                # user code is about to run after AccumulateGrad wrote .grad: keep the value it wrote
                self.written[id(node)] = counted(self, snapshot(node.variable.grad, limit))
            hit = None  # (the copy reused, not new: not counted again)
            if kind == "post_accumulate_grad":
                grad_in = snapshot(received.grad, limit)
            elif kind == "tensor" and wrapper is None and isinstance(received, torch.Tensor) and limit >= 0:
                grad_in = self.copied(received)  # the copy of what a node sent, when this is it, unchanged
                hit = self.copies.get(id(received))
            else:
                grad_in = snapshot_all(received, limit)
            counted(self, () if hit is not None and hit[2] is grad_in else grad_in)  # new copies: counted
            self.current = HookRecord(
                code=frame_code(frame),
                function=function,
                kind=kind,
                received=received,
                grad_in=grad_in,
                frame=frame,
                candidates=candidates,
                module=module,
                context=snapshot_all(context, limit) if context is not None else None,
                current_fn=node,
                state=wrapper_state(wrapper) if wrapper is not None else None,
                slot=wrapper.frame.f_locals.get("idx") if wrapper is not None and wrapper.family == "multi_grad" else None,
                present=_present(candidates) if kind not in ("node", "node_pre") else
                self.node_hook_ids(node, kind == "node_pre") if node is not None and id(node) in self.c_nodes else None,
                key=key, shown=shown_name(frame) if function is None and not candidates else None,
                marks_in=(post_accumulate_marks(received) if kind == "post_accumulate_grad" else marks(received))
                if summarised(grad_in) else None,
                leaf_before=leaf_before(received, limit) if kind == "post_accumulate_grad" else None,
            )
            self.graph_in = _graph_of(received) if torch.is_grad_enabled() and kind != "post_accumulate_grad" else None

    def _python_backward(self, frame: FrameType, boxed: bool) -> None:
        """A custom Function's backward is about to run: what its node received, copied now (it may edit its arguments
        in place, ``g.mul_(3)``, unseen by its post-hook); run inside a C++ node (CopySlices), that node is marked."""
        node, grads, current = frame.f_locals.get("self"), frame.f_locals.get("args"), _current_node()
        if current is not None and current is not node:  # a Function in place on a view: never run again (unhooked)
            return self.python_inside.add(id(current))
        if getattr(getattr(node, "_forward_cls", None), "__module__", "").startswith("torch."):
            return  # torch's own (a module's hook boundary, reentrant checkpointing): its hooks run inside, as steps
        if boxed and isinstance(grads, tuple) and len(grads) == 1 and isinstance(grads[0], list):
            grads = tuple(grads[0])
        if node is not None and isinstance(grads, tuple):
            with _hidden_from_modes():
                self.python_received[id(node)] = (tuple(map(id, grads)), self._keep(grads))

    def _node_hook_function(self, node: Any, pre: bool, code: Any) -> tuple[Any, Any]:
        """Which of ``node``'s own (pre-)hooks runs ``code``: (function, its key in the hook dict), or (None, None).
        torch calls them in the order of their dict, once each: the k-th call with this code at this node is the
        k-th entry with it there, while the dict holds the entries with this code it held when the pass began (a
        hook removing or adding one mid-pass leaves it not known).  So two closures of one factory (or one function
        registered twice) on one node are two hooks across passes too: after one is removed, the other's calls are
        not counted as the removed one's."""
        dicts = self.hook_dicts.get(id(node))
        hooks = dicts[0 if pre else 1] if dicts is not None else None
        start = self.node_hooks.get(id(node))
        if not hooks or start is None:
            return None, None
        try:
            found = [(key, hook) for key, hook in tuple(hooks.items()) if code_of(hook) is code]
        except Exception:  # noqa: BLE001 - changed while read: not known
            return None, None
        at_start = [hook for hook in start[0 if pre else 1] if code_of(hook) is code]
        index = (id(node), pre, code)
        calls = self.node_hook_calls[index] = self.node_hook_calls.get(index, 0) + 1
        if len(found) != len(at_start) or any(a is not b for (_, a), b in zip(found, at_start)) or calls > len(found):
            return None, None
        key, function = found[calls - 1]
        return function, key

    def _boundary(self, wrapper: Wrapper) -> None:
        """torch's wrapper of a module's backward hooks runs at the module's hook boundary even when no hook of
        that side is there (the output side of a module with only a full backward hook): it says whose it is, and
        which side (the pre-hook wrapper runs where the module's outputs' gradients arrive, the other at its inputs)."""
        node, module = _current_node(), wrapper_module(wrapper)
        if node is not None and module is not None:
            self.boundaries.setdefault(id(node), (module, "outputs" if wrapper.family == "module_pre" else "inputs"))

    def _foreign(self, name: str, code: Any = None) -> None:
        """Code torch's C++ called in the pass, no gradient hook (a DDP comm hook): may write .grad, unless stdlib's."""
        if name not in self.foreign_calls:
            self.foreign_calls.append(name)
        theirs = code is None or not standard_library(code)  # not the standard library (the warnings torch shows)
        self.foreign_writes = self.foreign_writes or theirs
        if theirs:
            self.unhooked.activate(edited_in_place=True)

    def _begin_unseen(self, wrapper: Wrapper, function: Any) -> None:
        """A module or multi-grad hook written in C, called by torch's Python wrapper: the call is seen (a
        ``c_call`` event) but not its arguments or result, and it may have changed a gradient."""
        if self.broken:
            return
        module = wrapper_module(wrapper)
        kind = "multi_grad" if wrapper.family == "multi_grad" else module_hook_kind(wrapper, function, module)
        self.pending.append(HookRecord(
            code=None, function=function, kind=kind, received=None, grad_in=None, frame=None, module=module,
            current_fn=_current_node(), candidates=[known for known in self.unseen_multi if known.function is function],
            unseen=f"{UNSEEN}, so what it received and returned is not known", state=wrapper_state(wrapper),
        ))
        # "without hooks" is checked against every node; only an in-place function can edit what it got
        self.unhooked.activate(edited_in_place=True, seen=not may_edit_in_place(function))

    def _candidates(self, frame: FrameType, function: Any) -> list[KnownHook]:
        """Hooks found on named tensors that could be the one running in ``frame``: closures made by one ``def``
        share a code object; their cells tell them apart (objects of one class their ``self``, partials their bound
        arguments: ``hooks.runs_in``)."""
        found = []
        for known in self.known_hooks.get(frame_code(frame), ()):
            if function is not None:
                if known.function is function:
                    found.append(known)
                continue
            if runs_in(known.function, frame):
                found.append(known)
        return found

    def _end(self, call: HookRecord, returned: Any) -> None:
        self.current = None  # what it returned copied as what it got was (summaries past the memory budget)
        limit = self.store_limit if held_bytes(call.grad_in) else budget_limit(self)
        with _hidden_from_modes():
            call.returned_none = returned is None
            if call.kind == "post_accumulate_grad":
                after_post_accumulate(call, limit)
            elif call.kind == "multi_grad":  # its return value is ignored; edits in place of what it got count
                call.grad_out = snapshot_all(call.received, limit)
            elif returned is None:  # edits in place count; none made: the copy of what it got holds exactly this
                unedited = call.kind == "tensor" and same_bits(call.received, call.grad_in, limit)
                call.grad_out = call.grad_in if unedited else _copy_out(call.received, limit)
            else:
                call.grad_out = _copy_out(returned, limit)
            call.modified = values_differ(call.grad_in, call.grad_out)
            if call.marks_in is not None:  # kept as a summary, whose numbers cannot be compared: the live tensors
                call.modified, edited = live_change(call, returned)
            elif call.kind in ("post_accumulate_grad", "multi_grad") or returned is None:
                edited = call.modified
            elif isinstance(call.grad_in, torch.Tensor) and plain_small(call.received, limit):
                # returned a new value: did it also edit what it received?  Compared as it is now, as its copy
                # (snapshot's exact one: same values, shape, dtype) would be compared
                edited = not (same_bits(call.received, call.grad_in, limit)
                              or values_equal(call.grad_in, call.received))
            else:
                edited = not values_equal(call.grad_in, snapshot_all(call.received, limit))
        counted(self, (call.context, () if call.grad_out is call.grad_in else call.grad_out))
        call.edited_in_place = edited
        self.edited_in_place = self.edited_in_place or edited
        if edited:
            self.edits.append((edited_spans(call.received), call.grad_in))
        if call.kind == "tensor":  # what the next function receives, copied after the hook: kept for reuse
            self.keep_copy(call.received if returned is None else returned, call.grad_out)
        elif call.kind == "node" and call.modified:
            self._passed_on(call)
        if call.modified or edited:
            self.unhooked.activate(edited, seen=True)
        elif returned is not None and call.kind not in ("post_accumulate_grad", "multi_grad"):
            self.replaced = self.replaced or _replaces(returned, call.received)
        if self.graph_in is not None and not self.replaced:
            self.replaced = any(a is not b for a, b in zip(self.graph_in, _graph_of(call.received)))
        self.graph_in = None
        call.frame = None  # don't keep the hook's locals alive
        call.received = None
        self.pending.append(call)

    def _passed_on(self, call: HookRecord) -> None:
        """A node's post-hook that runs after the lens's own (registered during the pass) changed what the node
        passes on: the node's record says what its users get, as it does when the user's post-hooks run first."""
        position = self.ran.get(id(call.current_fn)) if call.current_fn is not None else None
        if position is not None and isinstance(self.records[position], NodeRecord) \
                and self.records[position].fn is call.current_fn:
            record = self.records[position]
            # what it sent without the hook: what the record said, unless a hook upstream already made it differ
            self.unhooked.out.setdefault(id(record.fn), record.sent)
            record.sent = call.grad_out


def _copy_out(value: Any, limit: int) -> Any:
    """``snapshot_all`` of what a hook got or returned (a plain small tensor: ``fast_snapshot``, the same copy)."""
    return fast_snapshot(value, limit) if isinstance(value, torch.Tensor) else snapshot_all(value, limit)


def _present(candidates: list[KnownHook]) -> frozenset | None:
    """The hooks still in the dict of the tensor a hook call belongs to as it starts: one written in C before it
    there ran only if nothing removed it before."""
    holders = {id(known.holder): known.holder for known in candidates if known.holder is not None}
    return frozenset(next(iter(holders.values())).keys()) if len(holders) == 1 else None
