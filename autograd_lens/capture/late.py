"""Hooks registered during the pass.

Node post-hooks registered while their node runs (an unpack hook or a custom ``Function.backward`` calling
``torch._C._current_autograd_node().register_hook``): what they receive must not depend on the lens's observer.

The engine decides before it runs a node whether to keep the node's inputs for its post-hooks; a node with none
has its inputs handed to the function and gone, so a post-hook registered during the run receives ``()`` as
inputs.  The lens's own post-hook on every node makes the engine keep them.  Such a late hook, on a node that had
no hook of the user's when it started, is wrapped for the rest of the pass so that it receives what it would
without the lens, and is put back as it was when the pass ends.  Its call is recorded as the user's hook's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .hooks import function_name, runs_python

_current_node = torch._C._current_autograd_node
try:  # every grad_fn.register_hook / register_prehook goes through it (torch 2.x); elsewhere: nothing is wrapped
    from torch.autograd.function import _HookMixin

    REGISTER_CODE = _HookMixin._register_hook.__code__
except (ImportError, AttributeError):
    REGISTER_CODE = None


def _as_without_lens(hook: Callable) -> Callable:
    def late_post_hook(grad_inputs: Any, grad_outputs: Any) -> Any:
        return hook(grad_inputs, ())  # the node's inputs, not kept for hooks it had none of when it started
    return late_post_hook


LATE_CODE = _as_without_lens(print).__code__


def registered(observer: Any, arg: Any) -> None:
    """``_register_hook`` returned ``arg`` (the hook dict, the handle) during the pass, outside any user hook: if it
    is a post-hook of the node running now, which started with no hook of the user's, wrap it."""
    if not (isinstance(arg, tuple) and len(arg) == 2):
        return
    hooks, handle = arg
    node = _current_node()
    posts = _post_dicts(observer)
    key = posts.get(id(hooks))
    if key is None:
        return  # a pre-hook dict, or a node this pass does not run
    if node is None or id(node) != key:  # registered on a node yet to run: the engine will keep its inputs
        observer.late_before.add(key)
        return
    if key in observer.late_before or observer.node_hooks.get(key, ((), ()))[1]:
        return  # the node had a post-hook of the user's when it started: its inputs were kept in any case
    hook = hooks.get(handle.id)
    if hook is None:
        return
    wrapper = _as_without_lens(hook)
    hooks[handle.id] = wrapper
    observer.late_wrapped.append((hooks, handle.id, wrapper, hook))


def restore(observer: Any) -> None:
    """Put each wrapped hook back (unless the user removed or replaced it meanwhile)."""
    for hooks, key, wrapper, hook in observer.late_wrapped:
        if hooks.get(key) is wrapper:
            hooks[key] = hook
    observer.late_wrapped = []


def _post_dicts(observer: Any) -> dict[int, int]:
    """id(post-hook dict) -> id(node), for every node the lens observes (its own post-hook's dict), once per pass."""
    if observer.post_dicts is None:
        observer.post_dicts = {}
        for fn, hooks in zip(observer.shape.nodes, observer.post_hooks):
            if hooks is not None:
                observer.post_dicts[id(hooks)] = id(fn)
    return observer.post_dicts


def dict_is_new(frame: Any) -> bool:
    """``Tensor.register_hook`` starts (``frame``) on a tensor with no hook dict yet: this call makes one."""
    try:
        with torch._C.DisableTorchFunction():  # (a subclass's __torch_function__ is not called)
            tensor = frame.f_locals.get("self")
            return isinstance(tensor, torch.Tensor) and getattr(tensor, "_backward_hooks", None) is None
    except Exception:
        return False


def _variable(node: Any) -> Any:
    """The leaf of an AccumulateGrad node (None for any other node)."""
    try:
        return node.variable if node.name() == "torch::autograd::AccumulateGrad" else None
    except Exception:
        return None


def tensor_registered(observer: Any, tensor: Any, handle: Any, new_dict: bool = False) -> None:
    """``Tensor.register_hook`` returned ``handle`` during the pass. A hook written in C on a tensor that the running
    node made during the pass (a reentrant checkpoint's recompute: a forward hook registering a gradient hook)
    runs, if at all, in the backward that node runs next (reentrant checkpointing), where no Python frame shows it:
    if that node runs one, the pass says so and values without hooks past it are unknown. Any other is known from
    now on (``add_registered``), except one whose hook dict this call made on a tensor that the running node made
    (a hook on ``a`` of ``a, b = x.split(...)`` registering one on ``b``; for a leaf, its AccumulateGrad: a node
    pre-hook there registering a hook on the leaf): torch attaches the new dict to the node
    while the node runs its tensor hooks, and runs it from the next pass on (a dict it had runs the new hook when
    that dict's turn comes after the running one: add_registered's order); and one registered on a tensor of the
    running node after its tensor hooks ran (from a node pre- or post-hook, its backward): from the next pass on."""
    hooks = getattr(tensor, "_backward_hooks", None) if isinstance(tensor, torch.Tensor) else None
    hook = hooks.get(getattr(handle, "id", None)) if hooks else None
    node, made_by = _current_node(), getattr(tensor, "grad_fn", None)
    if node is not None and (made_by is node or made_by is None and _variable(node) is tensor) and (
            new_dict or getattr(observer.current, "kind", None) not in ("tensor", "multi_grad")):
        return  # known at the next pass, as a hook registered before it (registrations.py remembers its dict)
    if hook is not None and node is not None and made_by is not None and not runs_python(hook) \
            and made_by._sequence_nr() >= observer.first_new and all(fn is not made_by for fn in observer.shape.nodes):
        observer.nested_c.setdefault(id(node), []).append(function_name(hook))
        return  # said only if that node runs a backward (ending.seal); a recompute for unpacking discards its graph
    observer.add_registered(tensor, handle)
