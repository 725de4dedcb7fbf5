"""Hooks of the user's whose code lies in torch's own files.

The profile function takes Python that the engine calls from torch's files for torch's own (a wrapper around a
user's hook, a custom Function's backward, checkpointing's unpack hooks, logging).  A user may register torch's code
as a hook too: a function decorated with ``@torch.no_grad()`` (what runs is torch's ``decorate_context``), with
``@torch.compiler.disable``, ``functools.partial(torch.nn.utils.clip_grad_value_, clip_value=...)`` as a
post-accumulate hook, an ``nn.Module`` instance, ``F.relu``, an aten overload.  Torch registers its own hooks as
closures and bound methods (module hooks' wrappers, multi-grad hooks, DDP / FSDP, module trackers, logging); those
stay torch's."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from .hooks import DISTRIBUTED_DIR, TORCH_DIR, code_of, function_name, torch_wrapper, wrapper_family

_OPS = tuple(kind for kind in (getattr(torch._ops, "OpOverload", None), getattr(torch._ops, "OpOverloadPacket", None))
             if isinstance(kind, type))


def users_torch_hook(function: Any) -> bool:
    """``function`` (a registered hook whose code is in torch's files) is the user's: a ``functools.wraps`` wrapper
    of the user's own function (torch's context-manager decorators, ``torch.compiler.disable``), an ``nn.Module``,
    an aten operator, or one of torch's public functions (defined at module level, not a method: ``F.relu``,
    ``clip_grad_value_``), bare or in a ``functools.partial``.  False for torch's wrappers around user hooks, its
    distributed hooks, and its closures and bound methods."""
    code = code_of(function)
    if code is None or wrapper_family(code) != "ignore" or code.co_filename.startswith(DISTRIBUTED_DIR):
        return False
    inner = function
    while isinstance(inner, functools.partial):
        inner = inner.func
    if isinstance(inner, torch.nn.Module) or (_OPS and isinstance(inner, _OPS)):
        return True
    for _ in range(16):  # a functools.wraps chain, to the function wrapped first
        wrapped = getattr(inner, "__wrapped__", None)
        if wrapped is None:
            break
        inner = wrapped
    if not inspect.isfunction(inner):
        return False
    if not inner.__code__.co_filename.startswith(TORCH_DIR):
        return True  # the user's function, inside torch's wrapper
    return "." not in inner.__qualname__ and not inner.__code__.co_filename.startswith(DISTRIBUTED_DIR)


# torch's decorators whose wrapper calls the user's function from a closure cell: (qualname, the cell's name)
_DECORATORS = {"context_decorator.<locals>.decorate_context": "func", "_no_grad.<locals>._no_grad_wrapper": "func",
               "DisableContext.__call__.<locals>._fn": "fn"}
_CALLABLES = {"Module._wrapped_call_impl", "OpOverload.__call__"}  # an nn.Module or aten operator called as a hook


def users_torch_code(observer: Any, code: Any, frame: Any) -> bool:
    """Torch's code that the engine calls in ``frame`` (the profile function sees it), run as a hook of the user's: a
    hook found on a tensor of this pass, or on a node, is ``code``'s and the user's (``users_torch_hook``); on a
    tensor with no name, the frame of one of torch's decorators running the user's function, of an ``nn.Module``
    or aten operator called, or of a function torch defines at module level.  Not a custom Function's backward (``BackwardCFunction.apply``) nor any of torch's
    wrappers."""
    if code.co_qualname.startswith("BackwardCFunction.") or wrapper_family(code) != "ignore":
        return False
    observer.ensure_names()  # (the hooks found on named tensors)
    functions = [known.function for known in observer.known_hooks.get(code, ())]
    functions += [hook for pre, post in observer.node_hooks.values() for hook in pre + post if code_of(hook) is code]
    if functions:
        return any(users_torch_hook(function) for function in functions)
    return users_torch_frame(code, frame)


def users_torch_frame(code: Any, frame: Any) -> bool:
    """``frame``, which the engine called and which runs torch's ``code``, runs a hook of the user's, as the frame
    alone tells: one of torch's decorators running the user's function, an ``nn.Module`` or aten operator called, a
    function torch defines at module level (a backward nested in the pass: its hooks are not listed beforehand)."""
    if code.co_qualname.startswith("BackwardCFunction.") or wrapper_family(code) != "ignore":
        return False
    cell = _DECORATORS.get(code.co_qualname)
    if cell is not None:
        inner = frame.f_locals.get(cell)
        return inspect.isfunction(inner) and users_torch_hook(inner)
    if code.co_qualname in _CALLABLES:
        owner = frame.f_locals.get("self")
        return isinstance(owner, torch.nn.Module) or (bool(_OPS) and isinstance(owner, _OPS))
    # one of torch's functions defined at module level (F.relu): torch registers closures and methods
    return "." not in code.co_qualname and "<" not in code.co_qualname and code.co_name != "__del__" \
        and not code.co_filename.startswith(DISTRIBUTED_DIR)


def torchs_own(observer: Any, code: Any, frame: Any) -> bool:
    """``hooks.torch_wrapper``: the engine calls torch's own Python, not a hook, unless the user registered it."""
    return torch_wrapper(code) and not users_torch_code(observer, code, frame)


def torch_hook_name(code: Any, frame: Any) -> str | None:
    """The name a user's hook run by torch's ``code`` in ``frame`` goes by (the decorated function's, the module's
    class, the operator's), or None when the frame does not tell."""
    cell = _DECORATORS.get(code.co_qualname)
    inner = frame.f_locals.get(cell) if cell is not None else None
    if inspect.isfunction(inner):
        return function_name(inner)
    owner = frame.f_locals.get("self") if code.co_qualname in _CALLABLES else None
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    return function_name(owner) if owner is not None else None
