"""Every formula a card writes, checked against torch: for each op the cards explain, the gradient is computed
with ``torch.autograd.functional.vjp``; the card's numbers must equal it, and its formula, evaluated with the
operands' values, must give it too.  An op without a hand-written formula must say so."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest
import torch

import autograd_lens as al
from autograd_lens.views.chain import chain_rule
from autograd_lens.views.steps import steps_for

D = torch.float64


def t(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


# name, function, inputs, the backward function whose card is checked
OPS = [
    ("mul", lambda a, b: a * b, ([1.5, -2.0], [3.0, 0.5]), "MulBackward0"),
    ("mul by a number", lambda a: a * 3, ([1.5, -2.0],), "MulBackward0"),
    ("mul by itself", lambda a: a * a, ([1.5, -2.0],), "MulBackward0"),
    ("mul broadcast", lambda a, b: a * b, ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [0.5, -1.0, 2.0]), "MulBackward0"),
    ("add", lambda a, b: a + b, ([1.0, 2.0], [3.0, 4.0]), "AddBackward0"),
    ("add alpha", lambda a, b: torch.add(a, b, alpha=2.5), ([1.0, 2.0], [3.0, 4.0]), "AddBackward0"),
    ("add broadcast", lambda a, b: a + b, ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [1.0, 2.0, 3.0]), "AddBackward0"),
    ("sub", lambda a, b: a - b, ([1.0, 2.0], [3.0, 4.0]), "SubBackward0"),
    ("sub alpha", lambda a, b: torch.sub(a, b, alpha=3), ([1.0, 2.0], [3.0, 4.0]), "SubBackward0"),
    ("rsub alpha", lambda a, b: torch.rsub(a, b, alpha=3), ([1.0, 2.0], [3.0, 4.0]), "RsubBackward0"),
    ("number minus", lambda a: 2 - a, ([1.0, 2.0],), "RsubBackward1"),
    ("rsub number alpha", lambda a: torch.rsub(a, 2, alpha=3), ([1.0, 2.0],), "RsubBackward1"),
    ("div", lambda a, b: a / b, ([1.0, -2.0], [4.0, 0.5]), "DivBackward0"),
    ("div by a number", lambda a: a / 4, ([1.0, -2.0],), "DivBackward0"),
    ("pow tensor ** number", lambda a: a ** 3, ([1.5, -2.0],), "PowBackward0"),
    ("pow tensor ** 0.5", lambda a: a ** 0.5, ([1.5, 4.0],), "PowBackward0"),
    ("pow number ** tensor", lambda a: 2 ** a, ([3.0, -1.0],), "PowBackward2"),
    ("pow no-grad tensor ** tensor", lambda a: torch.tensor(3.0, dtype=D) ** a, ([2.0, 0.5],), "PowBackward1"),
    ("pow tensor ** tensor", lambda a, b: a ** b, ([1.5, 2.0], [3.0, 0.5]), "PowBackward1"),
    # one-element results are saved as numbers beside the exponent: the card must not take them for it
    ("pow number ** one number", lambda a: 2 ** a, (3.0,), "PowBackward2"),
    ("pow no-grad tensor ** one number", lambda a: torch.tensor(3.0, dtype=D) ** a, (2.0,), "PowBackward1"),
    ("pow one number ** one number", lambda a, b: a ** b, (2.0, 3.0), "PowBackward1"),
    ("exp of one number", torch.exp, (0.5,), "ExpBackward0"),
    ("exp", torch.exp, ([0.5, -1.0],), "ExpBackward0"),
    ("log", torch.log, ([0.5, 3.0],), "LogBackward0"),
    ("sqrt", torch.sqrt, ([0.25, 9.0],), "SqrtBackward0"),
    ("sin", torch.sin, ([0.5, -1.0],), "SinBackward0"),
    ("cos", torch.cos, ([0.5, -1.0],), "CosBackward0"),
    ("tanh", torch.tanh, ([0.5, -1.0],), "TanhBackward0"),
    ("sigmoid", torch.sigmoid, ([0.5, -1.0],), "SigmoidBackward0"),
    ("relu", torch.relu, ([0.5, -1.0, 0.0, 2.0],), "ReluBackward0"),
    ("neg", torch.neg, ([0.5, -1.0],), "NegBackward0"),
    ("sum", lambda a: a.sum(), ([[1.0, 2.0], [3.0, 4.0]],), "SumBackward0"),
    ("sum over a dim", lambda a: a.sum(dim=1), ([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]],), "SumBackward1"),
    ("mean", lambda a: a.mean(), ([[1.0, 2.0], [3.0, 4.0]],), "MeanBackward0"),
    ("mean over a dim", lambda a: a.mean(dim=0), ([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]],), "MeanBackward1"),
    ("mm", lambda a, b: a @ b, ([[1.0, 2.0], [3.0, 4.0]], [[0.5, -1.0, 2.0], [2.0, 0.0, 1.0]]), "MmBackward0"),
    ("mv", lambda a, b: a @ b, ([[1.0, 2.0], [3.0, 4.0]], [0.5, -1.0]), "MvBackward0"),
    ("dot", lambda a, b: a @ b, ([1.0, 2.0], [0.5, -1.0]), "DotBackward0"),
    ("bmm", torch.bmm, ([[[1.0, 2.0], [3.0, 4.0]]], [[[0.5], [-1.0]]]), "BmmBackward0"),
    ("addmm alpha beta", lambda a, b, c: torch.addmm(a, b, c, beta=2, alpha=3),
     ([[1.0, -1.0]], [[2.0], [1.0]], [[3.0, 0.5]]), "AddmmBackward0"),
    ("addmv", lambda a, b, c: torch.addmv(a, b, c, beta=0.5), ([1.0, -1.0], [[2.0, 1.0], [0.0, 1.0]], [3.0, 0.5]),
     "AddmvBackward0"),
    ("expand", lambda a: a.expand(2, 3), ([[1.0, 2.0, 3.0]],), "ExpandBackward0"),
    ("view", lambda a: a.view(6), ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],), "ViewBackward0"),
    ("reshape", lambda a: a.reshape(3, 2), ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],), "ViewBackward0"),
    ("unsqueeze", lambda a: a.unsqueeze(0), ([1.0, 2.0],), "UnsqueezeBackward0"),
    ("squeeze", lambda a: a.squeeze(0), ([[1.0, 2.0]],), "SqueezeBackward1"),
    ("t", lambda a: a.t(), ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],), "TBackward0"),
    ("transpose", lambda a: a.transpose(0, 1), ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],), "TransposeBackward0"),
    ("permute", lambda a: a.permute(1, 0), ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],), "PermuteBackward0"),
    ("clone", lambda a: a.clone(), ([1.0, 2.0],), "CloneBackward0"),
]
NAMES = "abc"
OP = {op[0]: op[1:] for op in OPS}
PRODUCTS = ("MmBackward0", "MvBackward0", "BmmBackward0", "AddmmBackward0", "AddmvBackward0")
OTHERS = ("Sum", "Mean", "Expand", "View", "Unsqueeze", "Squeeze", "TBackward", "Transpose", "Permute", "Clone")


def family(backward_name: str) -> str:
    """How the card explains the op: a local derivative per element, a matrix product, or where numbers go."""
    if backward_name in PRODUCTS:
        return "product"
    return "other" if backward_name.startswith(OTHERS) else "elementwise"

# ops whose rule no card writes: the card must say it has none
UNEXPLAINED = [
    ("cumsum", lambda a: a.cumsum(0), ([1.0, 2.0, 3.0],), "CumsumBackward0"),
    ("reciprocal", torch.reciprocal, ([1.0, 2.0],), "ReciprocalBackward0"),
    ("abs", torch.abs, ([1.0, -2.0],), "AbsBackward0"),
]


def card(fn, values, backward_name, seed=0):
    """Run ``fn`` under a lens with a random upstream gradient: (card lines, inputs, g, output)."""
    inputs = [t(v) for v in values]
    names = dict(zip(NAMES, inputs))
    with al.Lens(names=names) as lens:
        out = fn(*inputs)
        names["out"] = out
        g = torch.randn(out.shape, dtype=D, generator=torch.Generator().manual_seed(seed)) + 0.25
        out.backward(g)
    (step,) = [s for s in steps_for(lens.passes[0]) if s.kind == "node" and f"({backward_name})" in s.title]
    return list(step.lines), inputs, g, out


def parse_value(text: str) -> torch.Tensor:
    return torch.tensor(ast.literal_eval(text.strip().rstrip(".")), dtype=D)


def received_value(lines: list[str], name: str) -> torch.Tensor:
    """The number the card says ``name`` receives: at the end of the last line that says so."""
    line = [line for line in lines if f"{name} receives " in line][-1]
    after = line[line.rindex(f"{name} receives ") + len(f"{name} receives "):]
    cut = max(after.rfind(" = "), after.rfind(": "))
    return parse_value(after[cut + 3 if after[cut:cut + 3] == " = " else cut + 2:] if cut >= 0 else after)


def reduce_to(value: torch.Tensor, shape) -> torch.Tensor:
    extra = value.dim() - len(shape)
    dims = tuple(range(extra)) + tuple(extra + i for i, size in enumerate(shape) if size == 1 and value.shape[extra + i] != 1)
    return (value.sum(dim=dims, keepdim=True) if dims else value).reshape(shape)


FUNCTIONS = {
    "ln": lambda v: torch.log(torch.as_tensor(v, dtype=D)), "exp": lambda v: torch.exp(torch.as_tensor(v, dtype=D)),
    "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sqrt": lambda v: torch.sqrt(torch.as_tensor(v, dtype=D)),
    "sig": torch.sigmoid, "outer": torch.outer,
}


def evaluate(formula: str, values: dict) -> torch.Tensor:
    """A card's formula as Python: ``3·a^(3-1)``, ``out·ln(2)``, ``1 where a > 0, else 0``, ``g @ bᵀ``, ``g ⊗ b``."""
    formula = re.sub(r" \(the outer product[^)]*\)", "", formula)
    relu = re.fullmatch(r"1 where (.+) > 0, else 0", formula)
    if relu:
        formula = f"(({relu.group(1)}) > 0).to(torch.float64)"
    outer = re.fullmatch(r"(.*?)g ⊗ (\w+)", formula)
    if outer:
        formula = f"{outer.group(1)}outer(g, {outer.group(2)})"
    batched = formula.endswith(", batch by batch")
    formula = formula.replace(", batch by batch", "").replace("ᵀ", ".mT" if batched else ".T")
    formula = formula.replace("²", "**2").replace("^", "**").replace("·", "*").replace("σ(", "sig(")
    return torch.as_tensor(eval(formula, {"torch": torch, **FUNCTIONS}, dict(values)), dtype=D)  # noqa: S307


@pytest.mark.parametrize("name, fn, values, backward_name", OPS, ids=[op[0] for op in OPS])
def test_every_formula_on_a_card_gives_the_gradient_vjp_gives(name, fn, values, backward_name):
    lines, inputs, g, out = card(fn, values, backward_name)
    _, expected = torch.autograd.functional.vjp(fn, tuple(i.detach() for i in inputs), g)
    expected = expected if isinstance(expected, tuple) else (expected,)
    text = "\n".join(lines)
    assert "no hand-written formula" not in text and "formula is not shown" not in text, text
    assert any(line.startswith("Chain rule: ") for line in lines), text
    env = {"g": g, "out": out.detach(), **{n: i.detach() for n, i in zip(NAMES, inputs)}}
    for input_name, want in zip(NAMES, expected):
        # the number on the card
        got = received_value(lines, input_name)
        assert torch.allclose(got, want, rtol=1e-3, atol=1e-4), (input_name, got, want, text)
        if family(backward_name) == "elementwise":
            # the local derivative, evaluated with the operands, times g (summed where broadcast)
            slot_lines = [line for line in lines if f"∂out/∂{input_name} = " in line]
            assert slot_lines, text
            for line in slot_lines:
                local = line.split(f"∂out/∂{input_name} = ", 1)[1].split("; ", 1)[0]
                for form in local.split(" = "):  # exp(a) = out: every form of it must hold
                    value = evaluate(form, env)
                    total = reduce_to(g * value, inputs[NAMES.index(input_name)].shape)
                    parts = len(slot_lines)
                    assert torch.allclose(total * parts, want, rtol=1e-3, atol=1e-4), (form, total, want, text)
        elif family(backward_name) == "product":
            line = [line for line in lines if line.startswith(f"{input_name} receives ")][-1]
            formula = line[len(f"{input_name} receives "):].rsplit(" = ", 1)[0]
            summed = re.match(r"(.*) summed over dims? [\d, ]+ \(each row of the batch adds its part\)$", formula)
            value = evaluate(summed.group(1) if summed else formula, env)
            assert torch.allclose(reduce_to(value, want.shape), want, rtol=1e-3, atol=1e-4), (formula, text)


def test_the_cards_write_alpha_beta_and_the_base_of_a_power():
    assert "Chain rule: out = a + 2.5·b." in card(*OP["add alpha"])[0]
    assert "Chain rule: out = a - 3·b." in card(*OP["sub alpha"])[0]
    assert "Chain rule: out = b - 3·a." in card(*OP["rsub alpha"])[0]
    assert "Chain rule: out = a number - 3·a." in card(*OP["rsub number alpha"])[0]
    two = "\n".join(card(lambda a: 2 ** a, ([3.0, -1.0],), "PowBackward2")[0])
    assert "Chain rule: out = 2 ** a." in two and "∂out/∂a = out·ln(2)" in two and "8.0" not in two.split("\n")[2]
    three = "\n".join(card(lambda a: torch.tensor(3.0, dtype=D) ** a, ([2.0],), "PowBackward1")[0])
    assert "Chain rule: out = 3.0 ** a." in three and "∂out/∂a = out·ln(3.0)" in three
    assert "Chain rule: out = 2·a + 3·b @ c." in card(*OP["addmm alpha beta"])[0]


def test_a_tensor_used_twice_by_one_op_gets_the_sum_of_both_parts():
    lines, inputs, g, _ = card(lambda a: a * a, ([1.5, -2.0],), "MulBackward0")
    (a,) = inputs
    total = 2 * a.detach() * g
    assert lines[-1] == f"a is used 2 times by this op: the engine adds the parts, a receives " \
                        f"{al.format_value(a.detach() * g)} + {al.format_value(a.detach() * g)} = {al.format_value(total)}."
    assert torch.allclose(a.grad, total)


@pytest.mark.parametrize("name, fn, values, backward_name", UNEXPLAINED, ids=[op[0] for op in UNEXPLAINED])
def test_an_op_without_a_written_formula_says_so_instead_of_guessing(name, fn, values, backward_name):
    lines, *_ = card(fn, values, backward_name)
    assert lines[-1] == (f"This card has no hand-written formula for {backward_name}: what it sends is what its "
                         "backward computed (torch's derivative formula, or the backward of your autograd.Function).")
    assert not any(line.startswith("Chain rule") or "∂" in line for line in lines)


def test_a_formula_the_numbers_contradict_is_not_shown():
    """If what the node sent is not what its formula gives (an add whose alpha the drawing lost, or numbers
    that do not fit), the card says so rather than print a formula beside numbers it does not explain."""
    a, b = t([1.0, 2.0]), t([3.0, 4.0])
    with al.Lens(names={"a": a, "b": b}) as lens:
        out = torch.add(a, b, alpha=2)
        out.sum().backward()
    graph = lens.passes[0].graph
    (run,) = [e for e in lens.passes[0].node_runs if e.name == "AddBackward0"]
    assert "∂add/∂b = 2; b receives g × 2 = [1.0, 1.0] × [2.0, 2.0] = [2.0, 2.0]." in chain_rule(run, graph)
    no_alpha = dataclasses.replace(graph, nodes=tuple(n for n in graph.nodes if n.kind != "constant"),
                                   edges=tuple(e for e in graph.edges if e.kind != "saved"))
    lines = chain_rule(run, no_alpha)
    assert lines[1] == "∂add/∂a = 1; a receives g × 1 = [1.0, 1.0] × [1.0, 1.0] = [1.0, 1.0]."
    assert lines[2] == "b receives [2.0, 2.0]: not the number this card's formula for a + b gives, so the formula is not shown."
    wrong = dataclasses.replace(run, grad_out=(run.grad_out[0] * 5, run.grad_out[1]))
    assert chain_rule(wrong, graph)[1].startswith("a receives [5.0, 5.0]: not the number")
    assert torch.equal(b.grad, torch.full((2,), 2.0, dtype=D))


def test_a_node_hook_that_changes_what_a_node_sends_is_not_folded_into_its_formula():
    x = t(2.0)
    names = {"x": x}
    with al.Lens(names=names) as lens:
        y = names["y"] = x * 3
        y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0] * 10, None))
        y.backward()
    (step,) = [s for s in steps_for(lens.passes[0]) if s.kind == "node"]
    plain = torch.autograd.functional.vjp(lambda v: v * 3, x.detach(), torch.tensor(1.0, dtype=D))[1]
    assert f"∂y/∂x = 3; x receives g × 3 = 1.0 × 3.0 = {al.format_value(plain)}." in step.lines
    assert f"Then hooks on this node changed what it sends: x ← 3.0 became {al.format_value(x.grad)} (see the hook steps)." \
           in step.lines and x.grad.item() == 30.0
    assert step.question.answer == (plain.item(),)


def test_a_module_hook_boundary_says_what_its_hooks_changed():
    layer = torch.nn.Linear(1, 1).double()
    torch.nn.init.constant_(layer.weight, 1.0)
    torch.nn.init.constant_(layer.bias, 0.0)
    layer.register_full_backward_pre_hook(lambda module, grad_output: (grad_output[0] * 10,))
    x = torch.ones(1, 1, dtype=D, requires_grad=True)
    with al.Lens(names={"layer": layer, "x": x}) as lens:
        (layer(x) * 10).sum().backward()
    steps = steps_for(lens.passes[0])
    (boundary,) = [s for s in steps if s.title == "layer output hook boundary (BackwardHookFunctionBackward) runs"]
    text = " ".join(boundary.lines)
    assert "pass through it unchanged" not in text
    assert "it received [[10.0]] and sends [[100.0]]" in text and x.grad.item() == 100.0


def test_hooks_are_numbered_among_distinct_hooks_even_when_one_fires_twice_on_a_target():
    """Two hooks on a module called twice: when the calls cannot be paired with forward calls, each hook is still
    '1 of 2' or '2 of 2', never '3 of 4'."""
    layer = torch.nn.Linear(1, 1)
    first = layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    second = layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.ones(1, 1, requires_grad=True)
    with al.Lens(names={"layer": layer, "x": x}) as lens:
        layer(layer(x)).sum().backward()
    first.remove(), second.remove()
    backward_pass = lens.passes[0]
    unpaired = dataclasses.replace(backward_pass, events=tuple(
        dataclasses.replace(e, forward_call=None, node=None) if type(e).__name__ == "HookCall" else e
        for e in backward_pass.events))
    titles = [s.title.split(" (")[0] for s in steps_for(unpaired) if s.kind == "hook"]
    assert titles == ["hook 1 of 2 on layer: <lambda>", "hook 2 of 2 on layer: <lambda>"] * 2


def test_two_inputs_that_share_a_name_are_told_apart_and_not_added_together():
    """``(x * 2) * (x * 3)``: both inputs of the last mul are unnamed mul results; they are two tensors, not one
    used twice, so the card calls them by what made them, adds nothing up, and a question says which it means."""
    x = t(2.0)
    with al.Lens(names={"x": x}) as lens:
        ((x * 2) * (x * 3)).backward()
    plain = x.detach().requires_grad_()
    doubled, tripled = plain * 2, plain * 3
    doubled.retain_grad(), tripled.retain_grad()
    (doubled * tripled).backward()
    top = [s for s in steps_for(lens.passes[0]) if s.kind == "node"][0]
    assert top.lines[-2:] == ("∂output/∂mul(x, 2) = mul(x, 3); mul(x, 2) receives g × (mul(x, 3)) = 1.0 × 6.0 = 6.0.",
                              "∂output/∂mul(x, 3) = mul(x, 2); mul(x, 3) receives g × (mul(x, 2)) = 1.0 × 4.0 = 4.0.")
    assert doubled.grad.item() == 6.0 and tripled.grad.item() == 4.0
    assert top.question.prompt.endswith("What does mul(x, 2) receive?") and top.question.answer == (6.0,)
    assert x.grad.item() == 24.0 == plain.grad.item()


def test_a_factor_is_shown_only_when_sent_over_received_is_it():
    """The shown factor is sent ÷ received; where g holds inf or 0 that says nothing of the factor (inf ÷ inf is
    nan), so the card shows what was sent without a factor. Every 'g × f = A × B = C' line that remains holds
    A × B = C, and the factor B is the true local derivative (here the other operand, read from plain torch)."""
    import math

    w = t([0.5, -1.0])
    b = t([0.0, 2.0])
    xx = torch.tensor([1.0, 0.0])
    with al.Lens(names={"w": w, "b": b, "xx": xx}) as lens:
        (torch.log(xx * b) * (w.detach() * 2)).sum().backward()
    lines = [line for step in steps_for(lens.passes[0]) for line in step.lines if "receives g ×" in line]
    b_line = [line for line in lines if line.startswith("∂mul/∂b")]
    assert b_line == ["∂mul/∂b = (no-grad tensor); b receives g × (no-grad tensor) = [inf, nan]."]
    assert [math.isinf(b.grad[0]), math.isnan(b.grad[1])] == [True, True]
    for line in lines:
        shown = re.search(r"= (\[[^\]]*\]|\S+) × (\[[^\]]*\]|\S+) = (\[[^\]]*\]|[^.\s]+)", line)
        if shown:
            a, f, c = (torch.tensor(eval(text.replace("inf", "float('inf')").replace("nan", "float('nan')")))
                       for text in shown.groups())
            assert torch.allclose(a * f, c, equal_nan=True), line


COMPLEX_OPS = [op for op in OPS if op[0] not in ("relu", "pow no-grad tensor ** tensor", "pow no-grad tensor ** one number")]


@pytest.mark.parametrize("name, fn, values, backward_name", COMPLEX_OPS, ids=[op[0] for op in COMPLEX_OPS])
def test_on_complex_tensors_a_card_writes_no_real_valued_formula(name, fn, values, backward_name):
    """torch's gradients of complex tensors are conjugate Wirtinger derivatives (``mul``: g × conj(other)), not
    the real formulas of the cards: a card there must not write them; what it sends must be what vjp gives."""
    inputs = [torch.tensor(v, dtype=torch.complex128) * (1 + 0.5j) for v in values]
    inputs = [i.requires_grad_() for i in inputs]
    names = dict(zip(NAMES, inputs))
    with al.Lens(names=names) as lens:
        out = fn(*inputs)
        g = torch.ones(out.shape, dtype=out.dtype) * (0.75 - 0.25j)
        out.backward(g)
    (step,) = [s for s in steps_for(lens.passes[0]) if s.kind == "node" and f"({backward_name})" in s.title]
    text = "\n".join(step.lines)
    _, expected = torch.autograd.functional.vjp(fn, tuple(i.detach() for i in inputs), g)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for name_, want in zip(NAMES, expected):
        assert torch.allclose(names[name_].grad, want)
    if family(backward_name) in ("elementwise", "product"):
        assert step.lines[-1] == (
            f"This card has no hand-written formula for {backward_name} on complex tensors: torch's gradients "
            "there follow its convention for complex numbers (for an op that is holomorphic in an input, g × "
            "conj(the derivative)), which this card's real-valued formulas do not show; what it sends is what "
            "its backward computed."), text
        assert not any(line.startswith("Chain rule") or "∂" in line for line in step.lines), text
    else:  # moving numbers around (or adding them up) is the same for complex numbers
        assert any(line.startswith("Chain rule") for line in step.lines), text
    if step.question is not None:
        assert "∂" not in step.question.rule and " × conj " not in step.question.rule, step.question
