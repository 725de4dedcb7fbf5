"""Recognise user hooks as the engine calls them.

The backward tracer installs a profile function for the length of one
``backward()`` call.  It sees every Python callable the engine invokes, as a
``call`` event whose caller is torch's ``_engine_run_backward`` frame: user
tensor hooks, node pre/post hooks and post-accumulate hooks directly, module
and multi-grad hooks one frame deeper, inside torch's own wrappers.  This
module decides, from the frame alone, which kind of hook is running, which
function it is, and what it received.  It changes nothing.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
import sys
import weakref
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import torch
import torch.nn.modules.module as module_hooks

from .hooknames import function_name, is_compiled_hook, traced_hook_name  # noqa: F401  (also imported from here)

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
DISTRIBUTED_DIR = TORCH_DIR + "distributed" + os.sep  # torch's DDP communication hooks among its code
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep  # Python's standard library (its site-packages apart)


def standard_library(code: CodeType) -> bool:
    """Code of Python's standard library (``random.Random.getstate``, which torch.compile calls from C during a pass),
    not of a package installed beside it: it writes no ``.grad``."""
    name = code.co_filename
    return name.startswith(_STDLIB_DIR) and "site-packages" not in name and "dist-packages" not in name


ENGINE_CODE: CodeType = torch.autograd.graph._engine_run_backward.__code__

# Torch's wrappers around user hooks, by the tail of their qualified name, with
# the local variable that holds the user's function at call time.
_MODULE_FULL = ("BackwardHook._set_user_hook.<locals>.hook", "hook")
_MODULE_PRE = ("BackwardHook.setup_output_hook.<locals>.fn.<locals>.hook", "user_pre_hook")
_LEGACY = ("_WrappedHook.__call__", None)
_MULTI_ALL = ("register_multi_grad_hook.<locals>.get_inner_hook.<locals>.inner_hook", "fn")
_MULTI_ANY = ("register_multi_grad_hook.<locals>.wrapped_fn", "fn")
_FUNCTION_APPLY = ("BackwardCFunction.apply",)


@dataclass
class Wrapper:
    """A torch frame between the engine and a user function."""

    frame: FrameType
    family: str  # "module_full", "module_pre", "legacy", "multi_grad", "ignore"


def wrapper_family(code: CodeType) -> str:
    qualname = code.co_qualname
    if qualname == _MODULE_FULL[0]:
        return "module_full"
    if qualname == _MODULE_PRE[0]:
        return "module_pre"
    if qualname == _LEGACY[0]:
        return "legacy"
    if qualname in (_MULTI_ALL[0], _MULTI_ANY[0]):
        return "multi_grad"
    return "ignore"  # custom Function.backward, logging, anything else internal


def torch_wrapper(code: CodeType) -> bool:
    """The engine (or a nested one) calls torch's own Python, not a hook: a wrapper around a user's hook (found one
    frame deeper, or as a ``c_call`` for one written in C), a custom Function's backward, logging.  Not dynamo's
    closure calling a hook it traced (torch 2.15, ``hooknames.COMPILED_HOOK``): the user's function never runs
    there, the graph traced from it does, and that closure's frame is the hook's call (what it receives and returns
    is the gradient the hook got and gave), shown by the user's function's name (``function_name``)."""
    return code.co_filename.startswith(TORCH_DIR) and not is_compiled_hook(code)


_WEAKREF_FILES = (os.sep + "weakref.py", os.sep + "_weakrefset.py")


def weak_container_callback(code: CodeType) -> bool:
    """A weak dictionary's or set's callback (``remove``) dropping an entry whose object was freed: Python runs it
    whenever that object is freed, also while the engine frees what a node saved (then the engine's frame is its
    caller). No gradient hook."""
    return code.co_filename.endswith(_WEAKREF_FILES)


def run_by_collector(code: CodeType) -> bool:
    """A ``gc.callbacks`` function or a ``__del__``: Python runs them whenever it frees memory, also in the middle
    of a backward pass (the engine's frame is then their caller), with nothing of torch behind them."""
    return code.co_name == "__del__" or any(getattr(callback, "__code__", None) is code for callback in gc.callbacks)


def traced_name(frame: FrameType) -> str | None:
    """The user's name of the hook dynamo's closure calls in ``frame`` (``torch_wrapper``), else None."""
    if not is_compiled_hook(frame.f_code):
        return None
    return traced_hook_name(frame.f_locals.get("hook_body"))


def engine_call_args(frame: FrameType, function: Any) -> list[Any]:
    """The arguments a hook was called with, first to last, without what the caller did not pass:
    the ``self`` of a bound method or callable object and the arguments a ``functools.partial``
    bound come off the front.  Parameters with defaults (``lambda g, i=i: ...``) stay at the end,
    so the received values are always read from the front."""
    code = frame.f_code
    local = frame.f_locals
    names = code.co_varnames[: code.co_argcount]
    args = [local.get(name) for name in names]
    if code.co_flags & 0x04:  # CO_VARARGS
        args.extend(local.get(code.co_varnames[code.co_argcount + code.co_kwonlyargcount], ()) or ())
    skip = 0
    target = function
    if isinstance(target, functools.partial):
        skip += len(target.args)
        target = target.func
    if target is not None:
        if inspect.ismethod(target) or not (inspect.isfunction(target) or inspect.isbuiltin(target)):
            skip += 1  # a bound method or an object with __call__: its self
    else:  # not known (a hook on an unnamed tensor, or on a node): skip what autograd never passes
        while skip < len(args) and not _from_autograd(args[skip]):
            skip += 1  # a method's self, what a functools.partial bound
        if skip == len(args):
            skip = 0
    return args[skip:]


def _from_autograd(value: Any) -> bool:
    """Could autograd have passed ``value`` to a hook: a gradient (tensor or None) or a tuple of them."""
    if value is None or isinstance(value, torch.Tensor):
        return True
    return isinstance(value, tuple) and all(item is None or isinstance(item, torch.Tensor) for item in value)


def multi_grad_received(wrapper: "Wrapper", args: list[Any]) -> Any:
    """What a multi-grad hook received: all gradients (``mode="all"``), or the first one (``"any"``)."""
    first = args[0] if args else None
    if wrapper.frame.f_code.co_qualname == _MULTI_ANY[0]:
        return first
    return tuple(first) if isinstance(first, (tuple, list)) else first


def frame_code(frame: FrameType) -> Any:
    """The code ``frame`` runs, as the user wrote it: ``torch.compile`` runs a function it compiled when called (a
    hook called by a backward() inside compiled code) as a new code object, which dynamo maps back to the original
    (``torch._dynamo.utils.orig_code_map``; a program that never compiles never imports it)."""
    code = frame.f_code
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        try:
            return dynamo.orig_code_map.get(code, code)
        except Exception:  # another torch: as it runs
            pass
    return code


def user_function(frame: FrameType, wrapper: Wrapper | None) -> Any:
    """The user's function a torch wrapper is calling in ``frame``, or ``None``.

    ``None`` also when the wrapper is calling something else (a warning
    printer, a helper): only the user's hook counts as a hook call.
    """
    if wrapper is None:
        return None
    local = wrapper.frame.f_locals
    if wrapper.family == "module_pre":  # its full-hook loop (no input requires grad) binds user_hook after the
        # pre-hook loop: then the full hook is the one called, whatever user_pre_hook (stale) holds
        candidates = [local.get("user_hook") if "user_hook" in local else local.get("user_pre_hook")]
    elif wrapper.family == "module_full":
        candidates = [local.get("hook")]
    elif wrapper.family == "legacy":
        candidates = [getattr(local.get("self"), "hook", None)]
    elif wrapper.family == "multi_grad":
        candidates = [local.get("fn")]
    else:
        candidates = []
    for candidate in candidates:
        if candidate is not None and code_of(candidate) is frame_code(frame):
            return candidate
    return None


def wrapper_state(wrapper: Wrapper) -> Any:
    """The per-registration state of torch's multi-grad wrapper: one registration of ``register_multi_grad_hook``
    watches several tensors and is called once per pass.  Its lock's id with a weak reference to it (an id alone
    would name a new registration made at a freed one's address as the old one), else the id of its closure's
    dict."""
    if wrapper.family != "multi_grad":
        return None
    local = wrapper.frame.f_locals
    lock = local.get("lock")
    if lock is not None:
        try:
            return id(lock), weakref.ref(lock)
        except TypeError:
            pass
    state = local.get("count", local.get("ran_hook"))
    return None if state is None else id(state)


def wrapper_module(wrapper: Wrapper) -> Any:
    holder = wrapper.frame.f_locals.get("self")
    if wrapper.family in ("module_full", "module_pre"):
        return getattr(holder, "module", None)
    if wrapper.family == "legacy" and getattr(holder, "with_module", False):
        return holder.module()
    return None


def module_hook_kind(wrapper: Wrapper, function: Any, module: Any) -> str:
    """``module_full`` / ``global_module_full`` / ``module_full_pre`` / … for a wrapped call."""
    if wrapper.family == "module_full":
        is_global = function in module_hooks._global_backward_hooks.values()
        base = "module_full"
    elif wrapper.family == "module_pre":
        if "user_hook" not in wrapper.frame.f_locals:  # (see user_function)
            is_global = function in module_hooks._global_backward_pre_hooks.values()
            base = "module_full_pre"
        else:  # the "no input requires grad" branch calls full hooks from the pre-hook wrapper
            is_global = function in module_hooks._global_backward_hooks.values()
            base = "module_full"
    else:
        is_global = function in module_hooks._global_backward_hooks.values() and (
            module is None or function not in module._backward_hooks.values()
        )
        base = "module_legacy"
    return ("global_" + base) if is_global else base


def runs_python(function: Any) -> bool:
    """Whether calling ``function`` runs a Python frame the profile function sees (a ``def``, a lambda, a bound
    method, an object with a Python ``__call__``), as opposed to C code (``list.append``, ``torch.neg``, ``print``,
    a ``functools.partial`` of one): those run unseen."""
    while isinstance(function, functools.partial):
        function = function.func
    if inspect.isfunction(function) or inspect.ismethod(function):
        return True
    if inspect.isbuiltin(function) or inspect.ismethoddescriptor(function) or isinstance(function, type):
        return False
    call = getattr(type(function), "__call__", None)
    return inspect.isfunction(call)


def may_edit_in_place(function: Any) -> bool:
    """Whether a hook written in C could edit in place the gradient it gets: an in-place method or function
    (``Tensor.mul_``, ``torch.relu_``), a partial given ``out=``, or C code of unknown kind. ``print``, a list's
    ``append`` and the out-of-place ``torch`` functions (``torch.neg``) cannot."""
    while isinstance(function, functools.partial):
        if "out" in (function.keywords or {}):
            return True
        function = function.func
    name = getattr(function, "__name__", None)
    if not isinstance(name, str):
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    return not (inspect.isbuiltin(function) or inspect.ismethoddescriptor(function))


def code_of(function: Any) -> CodeType | None:
    """The code object the profiler will see when ``function`` is called (None: C code, no frame).  A
    ``functools.wraps`` wrapper runs its own code, so ``__wrapped__`` is not followed."""
    while isinstance(function, functools.partial):
        function = function.func
    if inspect.ismethod(function):
        function = function.__func__
    if inspect.isfunction(function):
        return function.__code__
    if inspect.isbuiltin(function) or inspect.ismethoddescriptor(function) or isinstance(function, type):
        return None
    call = getattr(type(function), "__call__", None)
    return call.__code__ if inspect.isfunction(call) else None


def multi_grad_user_fn(hook: Any) -> Any:
    """The user function behind the inner hook ``register_multi_grad_hook`` put on a tensor."""
    code = getattr(hook, "__code__", None)
    if code is None or not code.co_qualname.startswith("register_multi_grad_hook.<locals>"):
        return None
    closure = dict(zip(hook.__code__.co_freevars, hook.__closure__ or ()))
    cell = closure.get("fn")
    try:
        return cell.cell_contents if cell is not None else getattr(hook, "__wrapped__", None)
    except ValueError:
        return None


def multi_grad_slot(hook: Any) -> int | None:
    """Which of the tensors given to ``register_multi_grad_hook`` the inner hook ``hook`` watches (mode="all": its
    closure's ``idx``, the order of the gradients the function receives); None where that cannot be read."""
    try:
        closure = dict(zip(hook.__code__.co_freevars, hook.__closure__ or ()))
        return closure["idx"].cell_contents
    except Exception:
        return None


def runs_in(function: Any, frame: FrameType) -> bool:
    """Whether ``frame`` (running ``function``'s code) runs this very object: what a closure's cells hold, a bound
    method's or callable object's ``self``, the arguments a ``functools.partial`` bound are the frame's own.  Two
    hooks with one code (closures of one factory, objects of one class) are told apart this way."""
    local = frame.f_locals
    code = frame.f_code
    try:
        if isinstance(function, functools.partial):
            names = code.co_varnames[: code.co_argcount]
            return len(function.args) <= len(names) and all(local.get(name) is value
                                                            for name, value in zip(names, function.args)) \
                and runs_in(function.func, frame)  # (partials of two closures of one factory: their cells)
        if inspect.ismethod(function) or not (inspect.isfunction(function) or inspect.isbuiltin(function)):
            owner = function.__self__ if inspect.ismethod(function) else function
            return code.co_argcount > 0 and local.get(code.co_varnames[0]) is owner
        cells = getattr(function, "__closure__", None) or ()
        names = getattr(getattr(function, "__code__", None), "co_freevars", ())
        return all(local.get(name) is cell.cell_contents for name, cell in zip(names, cells))
    except ValueError:  # an empty cell
        return False



# code -> weak references to the Python hooks registered while a Lens watched (registrations.py) whose name is not
# their code's: a ``functools.wraps`` wrapper runs ``inner`` and is called ``double`` (by torch too)
_RENAMED: dict[CodeType, list] = {}
_PRUNE_AT = 4096


def remember_name(hook: Any) -> None:
    """Remember ``hook`` when it is shown by another name than its code's: a hook on a tensor with no name is found
    only as its code runs (its hook dict cannot be read), and would be shown as ``inner`` where a named tensor's is
    shown as ``double``."""
    code = code_of(hook)
    if code is None or is_compiled_hook(code) or function_name(hook) == function_name(None, code):
        return  # (dynamo's closure calling a hook it traced: named from its frame, traced_name)
    try:
        ref = weakref.ref(hook)
    except TypeError:  # allows no weak reference: not kept (shown by its code's name)
        return
    hooks = _RENAMED.setdefault(code, [])
    if len(hooks) >= _PRUNE_AT:
        hooks[:] = [kept for kept in hooks if kept() is not None]
    hooks.append(ref)


def shown_name(frame: FrameType) -> str | None:
    """The name of the remembered hook (``remember_name``) running in ``frame``, when the remembered hooks of its
    code that it may be share one; else None.  For dynamo's closure calling a hook it traced, the user's function's
    name (``traced_name``)."""
    traced = traced_name(frame)
    if traced is not None:
        return traced
    refs = _RENAMED.get(frame.f_code)
    if not refs:
        return None
    names = {function_name(hook) for hook in (ref() for ref in refs) if hook is not None and runs_in(hook, frame)}
    return names.pop() if len(names) == 1 else None


def wrapped_user_functions(wrapper: Wrapper) -> tuple:
    """The user functions torch's wrapper may be calling now (its loop variables or closure)."""
    local = wrapper.frame.f_locals
    if wrapper.family == "module_full":
        return (local.get("hook"),)
    if wrapper.family == "module_pre":
        return local.get("user_pre_hook"), local.get("user_hook")
    if wrapper.family == "multi_grad":
        return (local.get("fn"),)
    if wrapper.family == "legacy":
        return (getattr(local.get("self"), "hook", None),)
    return ()


def not_a_gradient_hook(args: list[Any]) -> bool:
    """Arguments no gradient hook is called with: a tensor hook gets a tensor, a node hook a tuple (then another),
    a post-accumulate hook the leaf; a DDP communication hook gets (state, bucket), an engine callback nothing."""
    if not args:
        return True
    first = args[0]
    if isinstance(first, (torch.Tensor, tuple)):
        return False
    return first is not None or len(args) > 1
