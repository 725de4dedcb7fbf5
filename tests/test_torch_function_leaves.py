"""Leaves that are tensor subclasses with a ``__torch_function__`` (opacus's ExpandedWeight, logging and wrapper
tensors): reading such a leaf's ``.grad`` calls user code, so the lens must never read it where the program does not.
Each program runs plainly and under a Lens, and the subclass's calls are compared: they must be the same list."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autograd_lens


class Logged(torch.Tensor):
    """A subclass that logs every torch function called on it, as user code would."""

    log: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Logged.log.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


class Unwrapping(torch.Tensor):
    """A subclass whose ops return plain tensors (as torch's ExpandedWeight, which opacus puts in the graph as the
    leaf): the gradients reaching it are plain, so the lens's short way for leaves is tried on it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Logged.log.append(getattr(func, "__name__", str(func)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


KIND = {"class": Logged}


def _leaf(*shape: int) -> torch.Tensor:
    with torch.no_grad():
        value = torch.randn(*shape).as_subclass(KIND["class"])
    return value.requires_grad_()


def _program(variant: str) -> tuple:
    torch.manual_seed(0)
    w = _leaf(4, 3)
    b = torch.randn(4, requires_grad=True)  # a plain leaf beside it
    x = torch.randn(2, 3)
    if variant == "hook_on_leaf":
        w.register_hook(lambda g: g * 2)
    h = torch.nn.functional.linear(x, w, b)
    if variant == "halving_upstream":
        h.register_hook(lambda g: g / 2)
    if variant == "none_hook_upstream":
        h.register_hook(lambda g: None)
    loss = h.tanh().sum()
    loss.backward()
    if variant == "two_passes":
        torch.nn.functional.linear(x, w, b).sum().backward()
    return w.grad.as_subclass(torch.Tensor).clone(), b.grad.clone()


VARIANTS = ["plain", "hook_on_leaf", "halving_upstream", "none_hook_upstream", "two_passes"]


@pytest.mark.parametrize("kind", [Logged, Unwrapping])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_torch_function_leaf_sees_no_call_of_the_lens(variant, kind, monkeypatch):
    monkeypatch.setitem(KIND, "class", kind)
    Logged.log = []
    plain = _program(variant)
    plain_log = list(Logged.log)
    Logged.log = []
    with autograd_lens.Lens() as lens:
        traced = _program(variant)
    assert Logged.log == plain_log  # the subclass's user code ran exactly as without the lens
    assert all(torch.equal(a, b) for a, b in zip(plain, traced))
    assert lens.passes and lens.passes[-1].error is None
    # what the lens says .grad is, is what torch left there
    shown = lens.passes[-1].leaf_grads
    assert torch.equal(torch.as_tensor(shown["b"]), traced[1])


@pytest.mark.parametrize("kind", [Logged, Unwrapping])
def test_a_module_whose_parameters_are_a_torch_function_subclass(kind):
    def run() -> torch.Tensor:
        torch.manual_seed(1)
        layer = nn.Linear(3, 2)
        weight = layer.weight.detach().as_subclass(kind).requires_grad_()
        del layer.weight  # the subclass as the module's weight (nn.Parameter would wrap it)
        layer.weight = weight
        layer(torch.randn(5, 3)).pow(2).sum().backward()
        return layer.weight.grad.as_subclass(torch.Tensor).clone()

    Logged.log = []
    plain, plain_log = run(), list(Logged.log)
    Logged.log = []
    with autograd_lens.Lens():
        traced = run()
    assert Logged.log == plain_log and torch.equal(plain, traced)
