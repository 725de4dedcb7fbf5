"""The steps of a pass made with work per node that does not grow with the pass (#24 perf), and the same cards:

* ``_Pass.of`` reads the hooks after each node in place: every event is looked at a bounded number of times (a
  slice of the events after each node copied the rest of the pass: quadratic in its length);
* a node's step works out what its card calls the op's inputs (``input_keys``, ``card_targets``) once, and the
  chain rule reuses them;
* the chain rule's factor (sent ÷ received) is checked on the numbers read once, with no torch op per check, and
  says what the torch checks said;
* likewise ``debug.first_nonfinite`` (worked out at the first steps of a pass) on each recorded gradient of a few
  numbers.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import autograd_lens as al
from autograd_lens.debug import nonfinite
from autograd_lens.views import chain, operands, steps as steps_module
from autograd_lens.views.context import _Pass
from autograd_lens.views.steps import steps_for


def _chain_pass(nodes: int, hooks: int = 0):
    x = torch.tensor(1.5, requires_grad=True)
    h = x
    for index in range(nodes):
        h = h * 1.25
        if index < hooks:
            h.register_hook(lambda g: g * 2)
    with al.Lens() as lens:
        h.backward()
    return lens.passes[0], x


class _Counted(tuple):
    """A tuple of events that counts the events handed out by indexing (one per item, a slice all of its items)."""

    read = 0

    def __getitem__(self, key):
        found = super().__getitem__(key)
        type(self).read += len(found) if isinstance(key, slice) else 1
        return found


@pytest.mark.parametrize("hooks", [0, 5])
def test_the_pass_context_reads_each_event_a_bounded_number_of_times(hooks):
    backward_pass, _ = _chain_pass(300, hooks)
    counted = dataclasses.replace(backward_pass, events=_Counted(backward_pass.events))
    _Counted.read = 0
    context = _Pass.of(counted)
    assert _Counted.read <= 2 * len(backward_pass.events), _Counted.read  # a slice per node: ~45,000
    reference = _Pass.of(backward_pass)
    assert context.after_node == reference.after_node and context.first_change == reference.first_change
    assert {node: [step for step, _ in found] for node, found in context.arrivals.items()} == \
        {node: [step for step, _ in found] for node, found in reference.arrivals.items()}


def test_hooks_after_a_node_are_found_in_place():
    """The hooks that ran on a node right after it (a node post-hook) are still the node's: its card says
    what it computed before them."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: tuple(None if g is None else g * 10 for g in grad_inputs))
    with al.Lens() as lens:
        y.sum().backward()
    backward_pass = lens.passes[0]
    context = _Pass.of(backward_pass)
    mul = next(event for event in backward_pass.node_runs if event.name == "MulBackward0")
    assert [call.kind for call in context.after_node[mul.step]] == ["node"]
    assert torch.equal(x.grad, torch.tensor([30.0, 30.0]))
    card = next(step for step in steps_for(backward_pass) if step.node == mul.node and step.kind == "node")
    assert any("[3.0, 3.0] became [30.0, 30.0]" in line for line in card.lines), card.lines


def test_a_node_step_names_the_inputs_once(monkeypatch):
    backward_pass, x = _chain_pass(40)
    before = [(step.lines, step.edges, step.question) for step in steps_for(backward_pass)]
    calls = {"input_keys": 0, "card_targets": 0}

    def counting(name, original):
        def counted(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)
        return counted

    for name in calls:
        original = getattr(operands, name)
        for module in (operands, chain, steps_module):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, counting(name, original))
    made = steps_for(backward_pass)
    node_steps = sum(step.kind == "node" for step in made)
    assert node_steps == 40
    assert calls == {"input_keys": node_steps, "card_targets": node_steps}  # were 5 and 3 per node
    assert [(step.lines, step.edges, step.question) for step in made] == before
    assert torch.equal(x.grad, torch.tensor(1.25 ** 40))


class _Ops(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_the_factor_is_checked_with_no_torch_op_per_check():
    backward_pass, _ = _chain_pass(30)
    # worked out once per pass (autograd_lens.debug), read by the last steps
    assert backward_pass.first_nonfinite is None and backward_pass.unreached == {}
    with _Ops() as ops:
        made = steps_for(backward_pass)
    assert sum(step.kind == "node" for step in made) == 30
    assert not {"isfinite", "eq", "__eq__", "any", "all"} & set(ops.names), sorted(set(ops.names))
    mul = next(step for step in made if step.kind == "node")
    assert any("receives g × 1.25 = " in line for line in mul.lines), mul.lines


def _torch_ratio(sent, received, limit):
    """The checks as torch ops (what chain._ratio did before it read the numbers once)."""
    if not chain._tensor(sent) or not chain._tensor(received):
        return None
    if sent.shape != received.shape or sent.numel() > limit or bool((received == 0).any()) \
            or not bool(received.isfinite().all()):
        return None
    return sent / received


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("received", [[2.0], [0.0], [-0.0], [1e-30], [math.inf], [-math.inf], [math.nan],
                                      [1.0, 0.0], [3.0, -2.0], [1.0, math.nan], [], 4.0, 0.0, math.nan])
def test_the_factor_check_says_what_the_torch_checks_said(received, dtype):
    received = torch.tensor(received, dtype=dtype)
    sent = torch.full_like(received, 3.0)
    found, expected = chain._ratio(sent, received, 16), _torch_ratio(sent, received, 16)
    assert (found is None) == (expected is None)
    if expected is not None:
        assert found.dtype == expected.dtype and torch.equal(found, expected)
    big = torch.ones(17, dtype=dtype)
    assert chain._ratio(big, big, 16) is None and chain._ratio(sent, received.to(torch.int64), 16) is None


def test_the_first_nonfinite_step_reads_small_gradients_with_no_torch_op():
    """``debug.first_nonfinite`` (worked out at the first steps of a pass: the last step marks it) checks each
    recorded gradient of a few numbers on the numbers read once, not with isfinite().all() per value."""
    backward_pass, _ = _chain_pass(30)
    with _Ops() as ops:
        assert backward_pass.first_nonfinite is None
    assert "isfinite" not in ops.names and "all" not in ops.names, sorted(set(ops.names))
    x = torch.tensor([1.0, 0.0], requires_grad=True)
    with al.Lens() as lens:
        (x.log() * 2).sum().backward()
    with _Ops() as ops:
        found = lens.passes[0].first_nonfinite
    assert found.name == "LogBackward0" and "isfinite" not in ops.names
    assert torch.isinf(x.grad).tolist() == [False, True]


def _torch_state(value):
    if not (value.is_floating_point() or value.is_complex()):
        return nonfinite.FINITE
    return nonfinite.FINITE if bool(value.isfinite().all()) else nonfinite.NONFINITE


_VALUES = [[], 2.0, math.nan, math.inf, -math.inf, -0.0, [1.0, 2.0], [1.0, math.nan], [[1.0, 2.0], [3.0, -math.inf]],
           [[[1.0], [2.0]], [[3.0], [4.0]]], [[[1.0], [2.0]], [[math.nan], [4.0]]], [[], []], [1.0] * 17,
           [1.0] * 16 + [math.inf], 1e38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
                                   torch.int64])
@pytest.mark.parametrize("numbers", _VALUES, ids=range(len(_VALUES)))
def test_a_value_read_as_floats_is_as_finite_as_torch_says(numbers, dtype):
    if dtype == torch.int64 and any(isinstance(n, float) and not math.isfinite(n) for n in
                                     torch.tensor(numbers, dtype=torch.float64).reshape(-1).tolist()):
        return  # no such integer tensor
    value = torch.tensor(numbers, dtype=torch.float64).to(dtype)  # 1e38 is inf in float16
    assert nonfinite.state(value) == _torch_state(value)
    assert nonfinite.state((None, value)) == _torch_state(value)
    assert nonfinite.state(value.requires_grad_(value.is_floating_point() or value.is_complex())) == _torch_state(value)
