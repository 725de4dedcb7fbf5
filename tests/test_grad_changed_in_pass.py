"""A hook that changes another leaf's ``.grad`` during the pass, compared with plain PyTorch and a run without it.

``x.grad`` holds a value from an earlier pass; in this pass a tensor hook on ``y`` sets ``x.grad`` to None, zeroes
it, assigns another tensor or scales it in place.  When ``x`` is reached after the hook, AccumulateGrad adds to what
the hook left; when it is not reached (``backward(inputs=[w])``), ``.grad`` stays as the hook left it.  Either way the value without hooks is
what the run without the hook gives, which the lens does not see: it must say so (unknown) or give that value, never
the hooked one as "the same as without hooks" (helper-48's section 12, for the reached leaf).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import autograd_lens as al

HOW = ("set-None", "zero_", "assign", "mul_")
REACHED = (True, False)


def program(how: str, reached: bool, hooked: bool, lens: list | None = None) -> dict:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0], requires_grad=True)
    (x * 2).sum().backward()  # x.grad = [2, 2], before the pass

    def change(g):
        if how == "set-None":
            x.grad = None
        elif how == "zero_":
            x.grad.zero_()
        elif how == "assign":
            x.grad = torch.full((2,), 7.0)
        else:
            x.grad.mul_(10)

    y = x * w
    if hooked:
        y.register_hook(change)
    out = (y * y).sum()
    inputs = None if reached else [w]  # x on the graph, not reached: backward(inputs=[w])
    if lens is None:
        out.backward(inputs=inputs)
    else:
        with al.Lens(names={"x": x, "w": w, "y": y}) as recording:
            out.backward(inputs=inputs)
        lens.append(recording)
    return {"x": x.grad, "w": w.grad}


@pytest.mark.parametrize("how,reached", list(itertools.product(HOW, REACHED)))
def test_the_value_without_hooks_of_a_grad_a_hook_changed_during_the_pass(how, reached):
    plain = program(how, reached, hooked=True)
    bare = program(how, reached, hooked=False)
    held: list = []
    traced = program(how, reached, hooked=True, lens=held)
    for name in ("x", "w"):  # observing changed nothing
        assert (traced[name] is None) == (plain[name] is None)
        if plain[name] is not None:
            assert torch.equal(traced[name], plain[name])
    (p,) = held[0].passes
    if plain["x"] is not None and bare["x"] is not None:
        assert not torch.equal(plain["x"], bare["x"])  # the hook did change x.grad
    shown = p.grads_without_hooks.get("x")
    if "x" in p.unknown:
        assert "hook" in p.unknown["x"]
    else:  # known: then it must be the truth
        assert shown is not None and bare["x"] is not None and torch.equal(shown, bare["x"]), (shown, bare["x"])
    assert torch.equal(p.grads_without_hooks["w"], bare["w"])  # w's own gradient: no hook changed it
