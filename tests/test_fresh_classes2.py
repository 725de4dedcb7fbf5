"""Fresh eyes on classes of programs the generators do not make (helper ``fresh2``, 2026-11-28 night): custom
autograd.Functions in their rarer forms, module hooks (legacy, prepend, forward hooks that hook the output, dict and
namedtuple outputs, nested and reused modules, hooks removing hooks), training patterns (manual loss scaling and
clipping in hooks, weight tying, ``backward(inputs=...)``, ``torch.autograd.backward`` over several tensors) and hooks
returning odd things.

Each class runs plainly and under a ``Lens`` (and, where the lens says something about "without hooks", with the hooks
not registered), and what the lens shows is compared with what torch did.  Classes where the lens said something
false have a test that failed before its fix (said in each section); the others are kept as differential tests."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (tests/programs.py: the differential oracle)
from test_fresh_eyes5 import lensed  # noqa: E402  (program(*args) under a Lens: (lens, what it returned))


def same(a, b) -> bool:
    return programs.equal(a, b)


# --- 1. a hook whose return torch refuses: nothing flows on after it ------------------------------------------------
# Was false: a hook of any kind returning what the engine rejects right after it returns (a float, a list, a tensor of
# another dtype or shape, a tensor where a node hook must return a tuple, a tuple of the wrong length) got the card
# "What it returned replaces what it received: X flows on toward the inputs where Y would have", the line
# "received Y → returned None — gradient modified" for a float, and the predict question "what flows on after it:
# X" (the shape-changed tensor). Torch raised at once (backward() raised torch's own error, unchanged): nothing
# flowed on. Fixed in views/hook_cards.py: a call followed at once by the engine's refusal of a hook's return says
# so (with torch's message), asks no question about what flowed on, and credits nothing.

BAD_RETURNS = {"float": lambda g: 1.0, "list": lambda g: [g], "double": lambda g: _each(g, torch.Tensor.double),
               "shorter": lambda g: _each(g, lambda t: t[..., :2]), "two": lambda g: (g, g) if isinstance(g, tuple)
               else (g,), "bare_tensor": lambda g: g[0] if isinstance(g, tuple) else g}


def _each(value, f):
    return tuple(None if v is None else f(v) for v in value) if isinstance(value, tuple) else f(value)


def _refused_program(kind, returns):
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    lin = torch.nn.Linear(3, 3)
    y = x * 2
    if kind == "tensor":
        y.register_hook(returns)
    elif kind == "node_pre":
        y.grad_fn.register_prehook(returns)
    elif kind == "node":
        y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: returns(grad_inputs))
    elif kind == "module_full":
        lin.register_full_backward_hook(lambda module, grad_input, grad_output: returns(grad_input))
    else:
        lin.register_full_backward_pre_hook(lambda module, grad_output: returns(grad_output))
    try:
        lin(y).sum().backward()
    except (TypeError, RuntimeError) as error:
        return type(error).__name__, str(error), x.grad
    return None, None, x.grad


REFUSED_CASES = [(kind, returns) for kind in ("tensor", "node_pre", "node", "module_full", "module_full_pre")
                 for returns in BAD_RETURNS
                 if not (kind == "tensor" and returns in ("two", "bare_tensor"))]


@pytest.mark.parametrize("kind,returns", REFUSED_CASES)
def test_a_hook_whose_return_torch_refuses_passes_nothing_on(kind, returns):
    from autograd_lens.views.steps import hook_totals, steps_for

    plain = _refused_program(kind, BAD_RETURNS[returns])
    assert plain[0] is not None, "torch accepted it: the case tests nothing"
    lens, traced = lensed(_refused_program, kind, BAD_RETURNS[returns])
    assert traced[:2] == plain[:2] and same(traced[2], plain[2])  # torch's own error, unchanged
    (p,) = lens.passes
    (call,) = p.hook_calls
    assert call.kind == kind and p.error is not None and (p.error.type, p.error.message) == plain[:2]
    (step,) = [s for s in steps_for(p, hook_totals(lens.passes)) if s.kind == "hook"]
    said = " ".join(step.lines) + " " + (step.note or "")
    assert "flows on" not in said and "returned None" not in said and "replaces" not in said, said
    assert "refused" in said and plain[1] in said, said
    assert step.question is None


# --- 2. module hooks registered with prepend=True -----------------------------------------------------------------------
# Was false: the start card listed the hooks of m in the order they fire (pre2 before pre1, second before first) under
# "on one target they fire in registration order", and the rule of the second hook's card said "Hooks on one target
# run in registration order": with prepend=True a hook registered later fires first. Fixed in views/context.py and
# views/hook_cards.py: the start card claims the order listed (which is the firing order); the rule says prepend=True
# goes first.


def _prepended(log):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)

    def first(module, grad_input, grad_output):
        log.append(("first", grad_input[0].clone()))
        return (grad_input[0] * 2,)

    def second(module, grad_input, grad_output):
        log.append(("second", grad_input[0].clone()))

    def pre1(module, grad_output):
        log.append(("pre1", grad_output[0].clone()))

    def pre2(module, grad_output):
        log.append(("pre2", grad_output[0].clone()))
        return (grad_output[0] * 3,)

    m.register_full_backward_hook(first)
    m.register_full_backward_hook(second, prepend=True)
    m.register_full_backward_pre_hook(pre1)
    m.register_full_backward_pre_hook(pre2, prepend=True)
    (m(x) ** 2).sum().backward()
    return x.grad, m.weight.grad


def test_prepended_module_hooks_are_not_said_to_fire_in_registration_order():
    from autograd_lens.views.steps import hook_totals, steps_for

    plain_log, lens_log = [], []
    plain = _prepended(plain_log)
    lens, traced = lensed(_prepended, lens_log)
    assert same(plain, traced) and same(plain_log, lens_log)
    (p,) = lens.passes
    assert [c.hook for c in p.hook_calls] == [name for name, _ in plain_log] == ["pre2", "pre1", "second", "first"]
    assert same([c.grad_in[0] for c in p.hook_calls], [g for _, g in plain_log])
    assert [entry.hook for entry in p.inventory] == ["pre2", "pre1", "second", "first"]  # listed as they fire
    steps = steps_for(p, hook_totals(lens.passes))
    said = " ".join(steps[0].lines)
    assert "registration order" not in said and "in the order listed" in said, said
    rules = [q.rule for s in steps if s.kind == "hook" and s.question for q in (s.question, *s.question.more)]
    assert rules and all("prepend=True" in rule for rule in rules if "registration order" in rule), rules
