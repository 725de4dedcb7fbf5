"""Tensor hooks written in C, registered during the pass on a tensor that has no name, compared with plain PyTorch.

A hook in C (``list.append``, ``torch.neg``) runs with no Python frame, so the lens knows of it only from the hook
dict it sits in.  One registered during the pass by a user's Python hook (or a node pre-hook) on a tensor whose
variable was rebound, or that never had one (it sits in a list), was missing from the calls: "1 hook call shown,
2 ran" (programs.py seed 6100175, float64).  Each program here runs plain, under a Lens and with no hook at all;
the calls the lens shows, what each received and passed on, the gradients and the values without hooks are
compared with the truth.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import autograd_lens as al

TARGETS = ("nonleaf", "named_leaf", "unnamed_leaf")
HOOKS = ("append", "neg")
FROM = ("tensor_hook", "node_pre")


def program(target: str, hook_kind: str, source: str, register: bool, seen: list) -> tuple:
    """y = tanh(x * w + b), out = sum(y) + sum(y ** 2); the hook in C goes on tanh's output (its name rebound
    before the pass), on the leaf x (named) or on the leaf b (never named); returns the gradients, what the hook in
    C received, and the calls of the Python hook that registers it."""
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.5, 0.25, -0.75], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64, requires_grad=True)  # a leaf with no name
    y = (x * w + b).tanh()
    y2 = y ** 2
    out = y.sum() + y2.sum()
    held = [{"nonleaf": y, "named_leaf": x, "unnamed_leaf": b}[target]]  # the tensor the hook goes on
    received: list = []
    c_hook = received.append if hook_kind == "append" else torch.neg

    def register_it():
        if register:
            held[0].register_hook(c_hook)
        seen.append("python")

    if source == "tensor_hook":
        y2.register_hook(lambda g: register_it())
    else:  # a pre-hook of y2's backward function (PowBackward0)
        y2.grad_fn.register_prehook(lambda grad_outputs: register_it())
    y = y * 1.0  # the name y now belongs to another tensor
    names = {"x": x, "w": w, "y": y, "y2": y2, "out": out}
    return out, names, (x, w, b), received


def run(target, hook_kind, source, register, lens=None):
    seen: list = []
    out, names, leaves, received = program(target, hook_kind, source, register, seen)
    if lens is None:
        out.backward()
    else:
        with al.Lens(names=names) as lens_now:
            out.backward()
        lens.append(lens_now)
    return [leaf.grad.clone() for leaf in leaves], [g.clone() for g in received], seen


@pytest.mark.parametrize("target,hook_kind,source", list(itertools.product(TARGETS, HOOKS, FROM)))
def test_a_c_hook_registered_mid_pass_on_a_tensor_with_no_name_is_shown_as_it_ran(target, hook_kind, source):
    plain = run(target, hook_kind, source, True)
    held: list = []
    traced = run(target, hook_kind, source, True, held)
    bare = run(target, hook_kind, source, False)
    lens = held[0]
    # observing changed nothing
    assert all(torch.equal(a, b) for a, b in zip(traced[0], plain[0]))
    assert len(traced[1]) == len(plain[1]) and all(torch.equal(a, b) for a, b in zip(traced[1], plain[1]))
    assert traced[2] == plain[2] == ["python"]
    # the calls: the Python hook once, the hook in C once, on the tensor's drawn label
    (p,) = lens.passes
    c_calls = [call for call in p.hook_calls if call.hook in ("list.append", "torch.neg")]
    assert len(c_calls) == 1, [(c.hook, c.kind, c.target) for c in p.hook_calls]
    (call,) = c_calls
    assert call.hook == ("list.append" if hook_kind == "append" else "torch.neg")
    assert call.kind == "tensor" and call.unseen and call.invocation == 1
    assert call.target == {"nonleaf": "tanh", "named_leaf": "x", "unnamed_leaf": "leaf"}[target]  # a leaf with no name is drawn "leaf"
    assert len(p.hook_calls) == 2
    # what it received and passed on
    if hook_kind == "append":
        (got,) = plain[1]
        assert torch.equal(call.grad_in, got) and torch.equal(call.grad_out, got) and not call.modified
    else:
        assert call.modified and torch.equal(call.grad_out, -call.grad_in)
    assert torch.equal(p.leaf_grads["x"], plain[0][0]) and torch.equal(p.leaf_grads["w"], plain[0][1])
    # without hooks: the program with no hook registered, where the lens says it is known
    for name, value in (("x", bare[0][0]), ("w", bare[0][1])):
        if name not in p.unknown:
            assert torch.allclose(p.grads_without_hooks[name], value, rtol=0, atol=1e-12), (name, p.grads_without_hooks)
    if hook_kind == "neg":  # it changed what flows on: the truth differs from the hooked run
        assert not all(torch.equal(a, b) for a, b in zip(plain[0], bare[0]))
