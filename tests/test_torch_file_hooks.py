"""Hooks of the user's whose code is torch's, on tensors with no name (found as they run, not from a tensor's hook
dict): a function under ``@torch.no_grad()`` / ``@torch.compiler.disable``, an ``nn.Module``, an aten operator,
``F.relu``.  Each call is shown as the Python hook it is (name, kind, what it got and gave: compared with a plain run
of an equivalent logging lambda), not as a hook "written in C", and the gradients are torch's
(capture/torchhooks.py; named tensors: tests/test_fresh_classes.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import autograd_lens as al


def _decorated(decorator):
    @decorator
    def halve(g):
        return g * 0.5
    return halve


MAKERS = {
    "no_grad": (lambda: _decorated(torch.no_grad()), "halve", lambda g: g * 0.5),
    "compiler_disable": (lambda: _decorated(torch.compiler.disable), "halve", lambda g: g * 0.5),
    "module": (lambda: torch.nn.Hardtanh(-0.05, 0.05), "Hardtanh", lambda g: g.clamp(-0.05, 0.05)),
    "aten": (lambda: torch.ops.aten.neg.default, "aten::neg", lambda g: -g),
    "relu": (lambda: F.relu, "relu", lambda g: g.clamp(min=0)),
}


def _program(make, x):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)

    def inner(x):
        h = lin(x) - 0.2  # no name in the caller's namespace
        h.register_hook(make())
        return h

    (inner(x).sin() * 3).sum().backward()
    return lin.weight.grad.clone(), lin.bias.grad.clone()


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_torch_file_hook_on_an_unnamed_tensor_is_shown_as_the_python_hook_it_is(kind):
    make, name, equivalent = MAKERS[kind]
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    plain = _program(make, x)
    logged: list = []
    _program(lambda: lambda g: logged.append((g.clone(), equivalent(g))) or logged[-1][1], x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with al.Lens() as lens:
            traced = _program(make, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, traced))
    (call,) = lens.passes[0].hook_calls
    assert (call.hook, call.kind, call.unseen) == (name, "tensor", None)
    assert torch.equal(call.grad_in, logged[0][0]) and torch.equal(call.grad_out, logged[0][1])
    assert call.modified == (not torch.equal(logged[0][0], logged[0][1]))


def _nested(make):
    """A hook of the outer pass runs autograd.grad on a graph with a hook made by ``make``."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    v = torch.tensor([3.0, 4.0], requires_grad=True)

    def outer(g):
        with torch.enable_grad():
            a = v * 2
            a.register_hook(make())
            (gv,) = torch.autograd.grad((a * a).sum(), v)
        return g * gv

    y = w * 3
    y.register_hook(outer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with al.Lens() as lens:
            y.sum().backward()
    return w.grad, lens.passes[0]


@pytest.mark.parametrize("kind", ["no_grad", "compiler_disable", "module"])
def test_a_torch_file_hook_in_a_nested_backward_is_said_as_a_plain_hook_is(kind):
    """Hooks inside a backward nested in the pass are not recorded as steps: the note names them and the values
    without hooks that depend on them are unknown. A hook whose code is torch's is one too (it was passed over as
    torch's own, and the value without hooks shown as known)."""
    make, name, equivalent = MAKERS[kind]
    plain_grad, plain = _nested(lambda: equivalent)
    grad, p = _nested(make)
    assert torch.equal(grad, plain_grad)
    assert p.grads_without_hooks["w"] is None and p.unknown["w"] == plain.unknown["w"]
    assert [note.replace("<lambda>", name) for note in plain.notes] == list(p.notes)
