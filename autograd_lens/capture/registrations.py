"""Hooks written in C registered on a tensor while a ``Lens`` is on, remembered where torch keeps them.

``t.register_hook(print)`` puts the hook in ``t._backward_hooks``, a dict torch attaches to the tensor's backward
function. A hook in C runs without a Python frame, so the lens knows it only by reading that dict before the pass;
but the dict is reachable only through the tensor, and a tensor made in a ``forward`` and then rebound
(``h = torch.tanh(h)``) has no Python reference left when the pass starts, while its node keeps the dict and the hook
runs. So while a ``Lens`` is on, ``Tensor.register_hook`` (torch's own Python) is called through a wrapper that
returns what it returns and raises what it raises, and then, for a hook in C on a tensor with a backward function,
keeps a weak reference to the dict, under the node's place (as ``HookCounter.dicts`` keeps those of tensors named in
an earlier pass): ``counting.earlier_hooks`` reads them at the next pass, on the tensor's drawn label."""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

from ..compat import RUN_ALONE, skipped_by_dynamo  # noqa: F401  (tracer.py adds to RUN_ALONE)
from .counting import _sequence_nr
from .hooks import remember_name, runs_python

_PRUNE_AT = 4096  # remembered dicts before the dead ones are dropped
_INSTALLED: list = []  # (original, wrapper) while a Lens watches registrations


def install(dicts: dict, thread: int) -> None:
    """Watch ``Tensor.register_hook`` on ``thread``, writing into ``dicts`` (a ``HookCounter.dicts``), and remember
    the Python hooks shown by another name than their code's (``hooks.remember_name``)."""
    skipped_by_dynamo()
    original = torch.Tensor.register_hook
    attached = _Attached()  # id(hook dict) -> (its weak reference, its key in dicts), when seen created

    @functools.wraps(original)
    def register_hook(self: Any, hook: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
        with torch._C.DisableTorchFunction():  # the lens's reads reach no mode or subclass of the user's
            created = isinstance(self, torch.Tensor) and getattr(self, "_backward_hooks", None) is None
        handle = original(self, hook)
        try:
            if threading.get_ident() == thread:
                with torch._C.DisableTorchFunction():
                    _remember(self, created, not runs_python(hook), attached, dicts)
                remember_name(hook)
        except Exception:  # a help for what is shown later, never a reason to fail the user's call
            pass
        return handle

    _not_compiled(register_hook.__code__)
    torch.Tensor.register_hook = register_hook
    _INSTALLED.append((original, register_hook))


def _not_compiled(code: Any) -> None:
    """torch.compile runs the wrapper as plain Python, never as a frame of its own to compile (as its
    ``skip_code`` does, without importing torch._dynamo): else it tries, and warns about what it cannot trace
    there (``_thread.get_ident``) where a program without the lens gets no warning."""
    try:
        frames = torch._C._dynamo.eval_frame
        frames.set_code_exec_strategy(code, frames._FrameExecStrategy(frames._FrameAction.SKIP,
                                                                      frames._FrameAction.DEFAULT))
    except Exception:  # another torch: without it
        pass


class _Attached(dict):
    limit = _PRUNE_AT


def uninstall() -> None:
    """``Tensor.register_hook`` as it was, unless something else replaced the wrapper since (then left alone)."""
    if _INSTALLED:
        original, wrapper = _INSTALLED.pop()
        if torch.Tensor.__dict__.get("register_hook") is wrapper:
            torch.Tensor.register_hook = original


def _remember(tensor: torch.Tensor, created: bool, in_c: bool, attached: _Attached, dicts: dict) -> None:
    """The place of ``tensor``'s hook dict: the node it was attached to when it was made (this call made it), or
    the place remembered when an earlier call made it; a dict made before the Lens watched is left out (an in-place
    op since may have given the tensor another node than the one holding its dict). Kept for the pass when the
    hook is written in C (a Python hook is found as it runs)."""
    hooks = tensor._backward_hooks
    if created:
        grad_fn = tensor.grad_fn
        if grad_fn is None:
            return  # a leaf: its hooks are read through its AccumulateGrad node's variable
        if len(attached) >= attached.limit:  # (a dict lives as long as its node: most are gone by the next pass)
            for dead in [key for key, (ref, _) in attached.items() if ref() is None]:
                del attached[dead]
            attached.limit = max(_PRUNE_AT, 2 * len(attached))  # (never a scan per registration)
        attached[id(hooks)] = (weakref.ref(hooks), ("node", id(grad_fn), _sequence_nr(grad_fn), tensor.output_nr))
    if not in_c:
        return
    ref, key = attached.get(id(hooks), (None, None))
    if ref is not None and ref() is hooks:
        dicts[key] = ref

