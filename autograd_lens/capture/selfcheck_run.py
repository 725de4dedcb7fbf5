"""The self-check a Lens runs once per process: trace a 3-node graph with one hook and compare with what torch
did.  If hook calls are not recorded right on the running torch, Lenses record nodes only and say so."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..compat import other_profiler
from .snapshot import hidden_from_user as _hidden_from_modes

_SELF_CHECK: dict[str, Any] = {}  # "result": None (fine) or the reason recording is off, once per process


def _self_check(lens_class: Any) -> None:
    """Once per process: trace a 3-node graph with one hook and compare with what torch did.
    If recording hooks is not right on the running torch, Lenses record nodes only and say so."""
    if "result" in _SELF_CHECK or other_profiler() is not None:
        return
    _SELF_CHECK["result"] = None  # also stops the check from checking itself
    try:
        # whatever the caller's context (no_grad, a default device, dispatch modes): a plain CPU graph
        with _hidden_from_modes(), torch.enable_grad(), torch.inference_mode(False), torch.device("cpu"):
            right = _record_is_right(lens_class)
        if not right:
            _SELF_CHECK["result"] = f"the self-check on torch {torch.__version__} did not record hooks right"
    except Exception:  # the check itself could not run here (not a wrong record): try again next time
        del _SELF_CHECK["result"]
        return
    if _SELF_CHECK["result"]:
        warnings.warn(f"autograd_lens: {_SELF_CHECK['result']}; backward functions are recorded, hook calls are not",
                      RuntimeWarning, stacklevel=3)


def _record_is_right(Lens: Any) -> bool:
    """``x = 2; y = x * x`` with a hook halving y's gradient, ``(y * 3).backward()``: the record must say so."""
    seen: list[float] = []
    x = torch.tensor(2.0, requires_grad=True, dtype=torch.float32, device="cpu")
    with Lens(names={"x": x}) as lens:
        y = x * x
        y.register_hook(lambda g: seen.append(float(g)) or g * 0.5)
        (y * 3).backward()
    calls = lens.hook_calls
    backward_pass = lens.passes[0]
    return (
        seen == [3.0]
        and len(calls) == 1
        and float(calls[0].grad_in) == 3.0
        and float(calls[0].grad_out) == 1.5
        and float(x.grad) == 6.0
        and float(backward_pass.grads_without_hooks["x"]) == 12.0
        and [type(event).__name__ for event in backward_pass.events] == ["NodeRun", "HookCall", "NodeRun", "GradWritten"]
    )
