"""What a backward run inside the pass (reentrant checkpointing, a ``backward()`` in a hook) writes to ``.grad``.

Its nodes are not steps of this pass, and the parameters of a reentrantly checkpointed layer are not in the outer
graph at all: the nested backward writes their ``.grad``. The lens reads, when a nested backward starts, each
named leaf's ``.grad`` (which tensor, its version) outside this graph, and when it ends, which of them it wrote;
the pass says so in a note.
"""

from __future__ import annotations

import weakref
from types import FrameType
from typing import Any

import torch

from .torchhooks import torch_hook_name, users_torch_frame
from .hooks import ENGINE_CODE, Wrapper, engine_call_args, function_name, module_hook_kind, run_by_collector, \
    shown_name, torch_wrapper, user_function, weak_container_callback, wrapper_family, wrapper_module

_current_node = torch._C._current_autograd_node


def remember_grads(observer: Any) -> None:
    """As a nested backward starts: the ``.grad`` of each named leaf this graph does not reach."""
    if observer.nested_grads is not None:
        return  # inside another nested backward: its end counts both
    observer.nested_grads = {}
    names = observer.ensure_names()
    in_graph = {id(fn.variable) for fn in observer.shape.leaves.values()}
    with torch._C.DisableTorchFunction():  # (reading a subclass tensor calls no __torch_function__ of the user's)
        for tensor in names.tensor_objects:
            if tensor.grad_fn is None and tensor.requires_grad and id(tensor) not in in_graph:
                grad = tensor.grad  # by weak reference: the old .grad lives no longer than without the lens
                observer.nested_grads[id(tensor)] = (names.tensors[id(tensor)], tensor,
                                                     weakref.ref(grad) if grad is not None else None,
                                                     grad._version if grad is not None else None)


def grads_written(observer: Any) -> None:
    """As the outermost nested backward ends: the leaves whose ``.grad`` it wrote (another tensor, or the same one
    changed) join ``observer.nested_written``."""
    for name, tensor, grad_ref, version in (observer.nested_grads or {}).values():
        with torch._C.DisableTorchFunction():
            now = tensor.grad
        grad = grad_ref() if grad_ref is not None else None  # None once freed: then .grad is another tensor
        if (now is not grad or (isinstance(now, torch.Tensor) and now._version != version)) \
                and name not in observer.nested_written:
            observer.nested_written.append(name)
    observer.nested_grads = None


def _collector_call(frame: FrameType) -> bool:
    """A ``gc.callbacks`` function or a ``__del__`` that Python ran as the nested engine made or freed an object
    (the engine's frame is then its caller): called with none of what autograd passes a hook (a tensor, a tuple)."""
    return run_by_collector(frame.f_code) and not any(
        isinstance(arg, (torch.Tensor, tuple)) for arg in engine_call_args(frame, None))


class NestedCalls:
    """Part of :class:`~autograd_lens.capture.calls.HookCalls`: what the profile function sees of a backward run
    inside the pass (its hooks, by name, in a note)."""

    def _nested_start(self, frame: FrameType) -> None:
        """A backward run inside this pass (reentrant checkpointing, a ``backward()`` in a hook): its hooks are
        not steps of this pass; they are listed in a note, and values without hooks past the node that ran it
        are unknown."""
        self.nested_frames.append(frame)
        node = _current_node()
        if node is not None:
            self.nested_nodes.setdefault(id(node), node.name())
        remember_grads(self)
        # hooks written in C on named tensors this graph does not reach (a checkpointed layer's parameters) run
        # there without a frame: whether they ran is not seen
        # (said in a note; they change no gradient this graph carries, so values without hooks stay known)
        in_graph = {id(fn) for fn in self.shape.nodes}
        maybe = self.__dict__.setdefault("nested_maybe", [])
        for known in self.unseen_hooks:
            text = f"{known.target}: hook {function_name(known.function)}"
            if id(known.grad_fn) not in in_graph and text not in maybe:
                maybe.append(text)
        # it may write the .grad of leaves this pass has yet to reach: read theirs just before the write
        for key, leaf in self.shape.leaves.items():
            if key not in self.ran and key not in self.watched:
                self.handles.append(leaf.register_prehook(self._before_write))
                self.watched.add(key)

    def _nested_profile(self, frame: FrameType) -> None:
        """A call inside a nested backward: note the user hooks its engine calls (directly or through torch's
        wrappers), by name and target."""
        parent = frame.f_back
        code = frame.f_code
        if code is ENGINE_CODE:
            self.nested_frames.append(frame)
            return
        if parent is None:
            return
        if not self.nested_running:
            return  # the nested engine's Python wrapper (logging), before or after its C++ run
        if parent.f_code is ENGINE_CODE and parent is self.nested_frames[-1]:
            if torch_wrapper(code) and not users_torch_frame(code, frame):  # (a hook of the user's in torch's code)
                self.nested_wrapper = Wrapper(frame, wrapper_family(code))
            elif _collector_call(frame):  # Python's garbage collector, not the engine, called it (as calls._begin)
                self.unhooked.activate(edited_in_place=True)
            elif code not in self._own_codes and code not in self.unpack_codes and not weak_container_callback(code) \
                    and not self._is_unpack_hook(code):
                self._nested_hook(self._nested_name(frame))
        elif self.nested_wrapper is not None and parent is self.nested_wrapper.frame \
                and self.nested_wrapper.family != "ignore":
            function = user_function(frame, self.nested_wrapper)
            if function is not None:
                self._nested_wrapped(function)

    def _nested_name(self, frame: FrameType) -> str:
        """The name a hook running in ``frame`` is shown by in this pass's steps: that of the hook object (a
        ``functools.wraps`` wrapper's, a renamed closure's), when the known or remembered hooks it may be share one;
        else its code's."""
        code = frame.f_code
        names = {function_name(known.function) for known in self._candidates(frame, None)}
        return (names.pop() if len(names) == 1 else None) or shown_name(frame) or torch_hook_name(code, frame) \
            or function_name(None, code)

    def _nested_wrapped(self, function: Any) -> None:
        """A hook torch's wrapper called in a nested backward (a module hook, a multi-grad hook), by name."""
        module = wrapper_module(self.nested_wrapper)
        kind = "multi-grad" if self.nested_wrapper.family == "multi_grad" else \
            module_hook_kind(self.nested_wrapper, function, module).replace("_", " ")
        target = self.ensure_names().module_name(module) if module is not None else None
        where = f"{target or type(module).__name__}: " if module is not None else ""
        if target is not None:  # (Ledger.at_end hands them to the pass: unfired_module_hook_notes)
            self.__dict__.setdefault("nested_targets", set()).add(target)
        self._nested_hook(f"{where}{kind} hook {function_name(function)}")

    def _nested_hook(self, text: str) -> None:
        if text not in self.nested_hooks:
            self.nested_hooks.append(text)
