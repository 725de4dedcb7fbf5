"""The optimizer step fused into backward (PyTorch's "optimizer step in backward" recipe): a post-accumulate hook
per parameter that runs ``optimizer.step()`` and ``optimizer.zero_grad()``.  The hook card said "What .grad holds
after it is not known (not recorded)" and the drawing ended with "not known", where torch's ``.grad`` is None, and
nothing said the parameter itself changed.  Each card and frame is checked against torch's own values."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.model import HookCall
from autograd_lens.format import format_value
from autograd_lens.views.steps import frame, steps_for


def model_and_data(width: int = 4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1)), torch.randn(5, 3)


def fused(model, zero=True, step=True, through_data=False):
    """One SGD per parameter, stepped inside its post-accumulate hook."""
    optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

    def hook(p):
        if step and through_data:
            p.data.add_(p.grad, alpha=-0.1)  # no version bump: only the values show it
        elif step:
            optimizers[p].step()
        if zero:
            optimizers[p].zero_grad()

    return [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]


def cards_by_target(lens):
    p = lens.passes[0]
    steps = steps_for(p)
    cards = {}
    for i, event in enumerate(p.events):
        if isinstance(event, HookCall) and event.kind == "post_accumulate_grad":
            cards[event.target] = (steps[i + 1], event)
    return p, steps, cards


@pytest.mark.parametrize("through_data", [False, True])
def test_a_fused_optimizer_step_is_shown_as_torch_ran_it(through_data):
    model, x = model_and_data()
    plain, _ = model_and_data()
    for m in (model, plain):
        fused(m, through_data=through_data)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    plain(x).pow(2).mean().backward()
    lens = al.Lens(names={"model": model, "x": x})
    with lens:
        model(x).pow(2).mean().backward()
    # the lens changed nothing: same parameters and .grad as the plain run
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q) and p.grad is None and q.grad is None, name
    p, steps, cards = cards_by_target(lens)
    assert sorted(cards) == sorted(f"model.{name}" for name, _ in model.named_parameters())
    last = frame(steps, len(steps) - 1)
    for name, param in model.named_parameters():
        step, event = cards[f"model.{name}"]
        assert event.grad_cleared
        assert f"It set model.{name}.grad to None (as optimizer.zero_grad() does): .grad is None now." in step.lines
        assert torch.equal(event.value_before, before[name]) and torch.equal(event.value_after, param.detach())
        changed = [line for line in step.lines if line.startswith(f"It changed model.{name} itself")]
        assert changed == [f"It changed model.{name} itself, in place: {format_value(before[name])} → "
                           f"{format_value(param.detach())} (an optimizer step inside the hook). The drawing shows "
                           "the value the forward pass used."]
        assert not any("not known" in line for line in step.lines)
        assert last.grads[event.node] == "None"  # torch: .grad is None after the pass
        assert p.graph.node(event.node).value is not None and torch.equal(p.graph.node(event.node).value, before[name])


def test_a_hook_that_only_clears_grad_or_only_looks_says_no_more_than_that():
    model, x = model_and_data()
    fused(model, zero=True, step=False)
    lens = al.Lens(names={"model": model, "x": x})
    with lens:
        model(x).pow(2).mean().backward()
    _, _, cards = cards_by_target(lens)
    for target, (step, event) in cards.items():
        assert event.grad_cleared and event.value_after is None
        assert any(line.startswith(f"It set {target}.grad to None") for line in step.lines)
        assert not any(line.startswith("It changed") for line in step.lines)

    model, x = model_and_data()
    seen = []
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.clone()))
    lens = al.Lens(names={"model": model, "x": x})
    with lens:
        model(x).pow(2).mean().backward()
    p, steps, cards = cards_by_target(lens)
    last = frame(steps, len(steps) - 1)
    assert len(seen) == len(cards) == 4
    for target, (step, event) in cards.items():
        assert not event.grad_cleared and event.value_after is None and not event.modified
        assert not any("to None" in line or line.startswith("It changed") or "not known" in line for line in step.lines)
        param = dict(model.named_parameters())[target.removeprefix("model.")]
        assert last.grads[event.node] == format_value(param.grad, 48)


def test_a_large_parameter_stepped_in_its_hook_is_said_to_change_as_a_summary():
    """Past store_limit the lens keeps summaries: the step is still seen (torch counted the write)."""
    model, x = model_and_data(width=64)
    fused(model)
    weight = model[0].weight
    lens = al.Lens(names={"model": model, "x": x}, store_limit=16)
    with lens:
        model(x).pow(2).mean().backward()
    _, _, cards = cards_by_target(lens)
    step, event = cards["model.0.weight"]
    assert event.value_before is not None and event.value_after is not None
    assert tuple(event.value_after.shape) == tuple(weight.shape)
    assert any(line.startswith("It changed model.0.weight itself") for line in step.lines)


@pytest.mark.parametrize("zero_between", [False, True])
def test_without_hooks_after_a_hook_cleared_grad_is_unknown_as_code_between_passes_is_unseen(zero_between):
    """Found by model_programs (seed 41560, a post-accumulate hook stepping its leaf and clearing .grad, then
    clip_grad_norm_ between passes): pass 2 showed .grad "without hooks" as pass 1's gradient plus pass 2's. With
    hooks, .grad is None between the passes whatever code runs there; without them it holds a gradient, which
    ``optimizer.zero_grad()`` or ``clip_grad_norm_`` would change. Both programs below look the same to the lens
    and their runs without hooks differ, so the only true statement is "unknown"."""
    from autograd_lens.capture.unhooked import CLEARED

    model, x = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fused(model)
    lens = al.Lens(names={"model": model, "x": x})
    with lens:
        model(x).pow(2).mean().backward()
        seen = [p.grad for p in model.parameters()]
        if zero_between:
            optimizer.zero_grad()
        model(x).pow(2).mean().backward()
    assert seen == [None] * 4  # what the code between the passes sees with the hooks, whether it zeroes or not
    this, other = _without_hooks(zero_between), _without_hooks(not zero_between)
    second = lens.passes[1]
    for name in this:
        assert second.grads_without_hooks[name] is None and second.unknown[name] == CLEARED
        assert not torch.equal(this[name], other[name])  # without hooks the two programs differ here


def _without_hooks(zero_between):
    """.grad after the two passes of the program run with no hook."""
    model, x = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).pow(2).mean().backward()
    if zero_between:
        optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    return {f"model.{name}": p.grad for name, p in model.named_parameters()}
