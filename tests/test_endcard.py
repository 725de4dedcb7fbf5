"""The debugging answers on the cards: the step where the first NaN started says so (the node anomaly mode
blames), and a last card lists the named tensors that got no gradient (those whose .grad plain torch leaves
None), with the reason the graph shows."""

import pytest
import torch

import autograd_lens as al
from autograd_lens.views.steps import steps_for
from conftest import anomaly_blames


def log_of_zero():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return (torch.log(x) * 0 + x * 2).sum()


def sqrt_of_zero_late():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    return (torch.sqrt(x * 3) * 0 + x).sum()


@pytest.mark.parametrize("program", [log_of_zero, sqrt_of_zero_late])
def test_the_card_of_the_step_anomaly_mode_blames_says_nan_starts_there_and_no_other_does(program):
    blamed = anomaly_blames(program)
    assert blamed is not None
    with al.Lens(names={}) as lens:
        program().backward()
    marked = [step for step in steps_for(lens.passes[0]) if any("starts here" in line for line in step.lines)]
    assert [step.title for step in marked] == [s.title for s in steps_for(lens.passes[0])
                                               if s.kind == "node" and f"({blamed})" in s.title][:1]
    assert any(line.startswith("⚠ NaN starts here") for line in marked[0].lines)


def test_a_finite_pass_has_no_nan_line_and_no_end_card():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        (x * x).sum().backward()
    steps = steps_for(lens.passes[0])
    assert not any("starts here" in line for step in steps for line in step.lines)
    assert steps[-1].kind != "end" and x.grad is not None


@pytest.mark.parametrize("cut, reason", [
    (lambda v: v.detach(), "detached"),
    (lambda v: v.data, "detached"),
])
def test_the_end_card_lists_exactly_the_tensors_plain_torch_leaves_without_grad(cut, reason):
    w = torch.tensor(2.0, requires_grad=True)
    v = torch.tensor(3.0, requires_grad=True)
    frozen = torch.tensor(1.0)  # requires no grad: never listed
    with al.Lens(names={"w": w, "v": v, "frozen": frozen}, why=True) as lens:
        (w * 3 + cut(v) * 2 + frozen).backward()
    assert w.grad is not None and v.grad is None  # the truth: plain torch leaves v.grad None
    end = steps_for(lens.passes[0])[-1]
    assert end.kind == "end" and end.title == "After the pass: no gradient reached v"
    assert end.lines[0].startswith(f"v: {reason}")
    assert end.node is not None and "✂" in end.lines[-1]  # the cut is placed: the card highlights it


def test_a_tensor_this_pass_did_not_use_is_not_on_the_card_though_unreached_lists_it():
    w = torch.tensor(2.0, requires_grad=True)
    unused = torch.tensor(3.0, requires_grad=True)  # e.g. from an earlier cell
    with al.Lens(names={"w": w, "unused": unused}) as lens:
        (w * 3).backward()
    assert unused.grad is None and "unused" in lens.passes[0].unreached
    assert steps_for(lens.passes[0])[-1].kind != "end"
