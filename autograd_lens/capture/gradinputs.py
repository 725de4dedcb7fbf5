"""What ``torch.autograd.grad`` returns for each of its inputs, as the pass model shows it: the engine's result, made
into zeros where ``materialize_grads=True`` asks torch to (after the engine returns), and each input's value without
hooks, an input given as a ``GradientEdge`` too."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from .structure import gradient_edge
from .unhooked import Unknown

_GRAD_CODE = getattr(torch.autograd.grad, "__code__", None)


def materializes() -> bool:
    """The pass being finished runs for ``torch.autograd.grad(..., materialize_grads=True)``: the nearest call of
    torch's ``grad`` on the stack (it waits for the engine, which waits for the end of the pass; a ``grad`` inside a
    hook of the pass has returned)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _GRAD_CODE:
            return bool(frame.f_locals.get("materialize_grads"))
        frame = frame.f_back
    return False


def returned(result: Any, index: int, inputs: tuple, materialize: bool) -> Any:
    """What ``grad`` returns for input ``index``: the engine's result; zeros shaped as the input where it is None
    and ``materialize_grads`` was set (torch's ``torch.zeros_like(input)``)."""
    value = result[index] if isinstance(result, (tuple, list)) and index < len(result) else None
    if value is None and materialize and index < len(inputs) and isinstance(inputs[index], torch.Tensor):
        with torch.no_grad():
            return torch.zeros_like(inputs[index])
    return value


def unhooked_input(observer: Any, given: Any, materialize: bool) -> Any:
    """Input ``given``'s gradient without hooks: what reaches the node that takes its gradient (a ``GradientEdge``
    names it), without the hooks; zeros where nothing reaches it and ``materialize_grads`` was set."""
    if isinstance(given, GradientEdge):
        value = observer.unhooked.input_of(given.node, given.output_nr)
    elif not isinstance(given, torch.Tensor):
        return Unknown(f"an input of autograd.grad that is neither a tensor nor a GradientEdge ({type(given).__name__})")
    else:
        edge = gradient_edge(given, observer.shape.leaves)
        if edge is None:
            return Unknown("torch cannot say which node takes this tensor's gradient (its layout has no views)")
        value = observer.unhooked.input_of(*edge)
    if value is None and materialize and isinstance(given, torch.Tensor):
        with torch.no_grad():
            return torch.zeros_like(given)
    return value
