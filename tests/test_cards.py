"""Each rule of the step cards, its numbers compared with what autograd computes."""

import dataclasses
import re

import pytest
import torch

import autograd_lens as al
from autograd_lens.format import format_value
from autograd_lens.views.steps import steps_for


def node_lines(lens, backward_name, pass_index=0):
    (step,) = [s for s in steps_for(lens.passes[pass_index]) if s.kind == "node" and f"({backward_name})" in s.title]
    return list(step.lines)


def test_broadcasting_names_the_summed_dimension_and_gives_autograds_value():
    b = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = torch.ones(2, 3, requires_grad=True)
    with al.Lens() as lens:
        s = w + b
        (s * torch.tensor([[1.0], [2.0]])).sum().backward()
    lines = node_lines(lens, "AddBackward0")
    assert f"∂s/∂b = 1; b was broadcast from [3] to [2, 3], so the engine sums its gradient over dim 0: " \
           f"b receives {format_value(b.grad)}." in lines
    assert b.grad.tolist() == [3.0, 3.0, 3.0]


def test_a_stretched_size_one_dimension_is_named_too():
    c = torch.ones(2, 1, requires_grad=True)
    with al.Lens() as lens:
        s = c * torch.arange(6.0).reshape(2, 3)
        s.sum().backward()
    text = "\n".join(node_lines(lens, "MulBackward0"))
    assert "c was broadcast from [2, 1] to [2, 3], so the engine sums its gradient over dim 1" in text
    assert f"c receives {format_value(c.grad)}." in text and c.grad.tolist() == [[3.0], [12.0]]


def test_sum_and_mean_over_a_dim_say_which_dim_and_n():
    t = torch.arange(6.0).reshape(2, 3).requires_grad_()
    with al.Lens() as lens:
        r = t.sum(dim=1)
        m = r.mean()
        n = t.mean(dim=-1)
        (m + (n * torch.tensor([1.0, 4.0])).sum()).backward()
    assert "Chain rule: r = t.sum(dim=1)." in node_lines(lens, "SumBackward1")
    assert any("t receives g copied along dim 1" in line for line in node_lines(lens, "SumBackward1"))
    mean_all = "\n".join(node_lines(lens, "MeanBackward0"))
    assert "1/n with n = 2, the number of elements of r; r receives g ÷ 2 copied to every element: [0.5, 0.5]." in mean_all
    mean_dim = "\n".join(node_lines(lens, "MeanBackward1"))
    assert "Chain rule: n = t.mean(dim=1)." in mean_dim  # dim=-1 shown as the dim it is
    expected = torch.tensor([1.0, 4.0]).unsqueeze(1).expand(2, 3) / 3
    assert f"1/n with n = 3, the size of dim 1; t receives g ÷ 3 copied along dim 1: {format_value(expected)}." in mean_dim
    assert torch.allclose(t.grad, expected + 0.5)


def test_matrix_products_are_vector_jacobian_products_with_autograds_values():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = torch.tensor([[0.5, -1.0], [2.0, 0.0]], requires_grad=True)
    g = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    with al.Lens() as lens:
        c = a @ b
        c.backward(g)
    lines = node_lines(lens, "MmBackward0")
    assert lines[2] == "Chain rule: c = a @ b."
    assert "vector–Jacobian product" in lines[3] and "g is the gradient of c" in lines[3]
    assert lines[4] == f"a receives g @ bᵀ = {format_value(g @ b.detach().T)}."
    assert lines[5] == f"b receives aᵀ @ g = {format_value(a.detach().T @ g)}."
    assert torch.equal(a.grad, g @ b.detach().T) and torch.equal(b.grad, a.detach().T @ g)
    assert not any("upstream" in line or "∂c/∂a =" in line for line in lines)


def test_linear_bias_receives_g_summed_over_the_batch():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    inputs = torch.randn(4, 3)
    with al.Lens() as lens:
        layer(inputs).pow(2).sum().backward()
    text = "\n".join(node_lines(lens, "AddmmBackward0"))
    assert f"layer.bias receives g summed over dim 0 (each row of the batch adds its part) = {format_value(layer.bias.grad)}." in text


def test_hooks_on_one_tensor_are_numbered_by_registration_order_and_credit_only_their_own_change():
    p = torch.tensor(3.0, requires_grad=True)

    def halve(g):
        return g / 2

    with al.Lens() as lens:
        h = p * p
        h.register_hook(halve)
        h.register_hook(halve)
        h.register_hook(lambda g: g + 1)
        h.backward()
    hooks = [s for s in steps_for(lens.passes[0]) if s.kind == "hook"]
    assert [s.title for s in hooks] == [
        "hook 1 of 3 on h: halve (tensor hook, call 1 of 1 in this recording)",
        "hook 2 of 3 on h: halve (tensor hook, call 1 of 1 in this recording)",
        "hook 3 of 3 on h: <lambda> (tensor hook, call 1 of 1 in this recording)",
    ]
    assert "0.5 flows on toward the inputs where 1.0 would have" in hooks[0].note
    assert "0.25 flows on toward the inputs where 0.5 would have" in hooks[1].note
    assert "1.25 flows on toward the inputs where 0.25 would have" in hooks[2].note
    assert not any("ends with" in s.note for s in hooks)  # three hooks changed it: none gets the whole credit
    assert p.grad.item() == 1.25 * 6


def test_the_only_modifying_hook_is_credited_with_the_leaf_change():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x ** 2
        y.register_hook(lambda g: g * 2)
        (3 * y).backward()
    (hook,) = [s for s in steps_for(lens.passes[0]) if s.kind == "hook"]
    assert "so it is why x ends with 24.0 instead of 12.0." in hook.note and x.grad.item() == 24.0


def test_an_in_place_hook_is_not_said_to_return_a_replacement():
    x = torch.tensor(1.0, requires_grad=True)
    with al.Lens() as lens:
        q = x * 5
        q.register_hook(lambda g: g.mul_(2))
        q.backward()
    (hook,) = [s for s in steps_for(lens.passes[0]) if s.kind == "hook"]
    assert "changed the gradient tensor in place" in hook.note and "What it returned" not in hook.note
    assert x.grad.item() == 10.0


def test_a_retain_grad_write_is_a_step_with_the_value_torch_keeps():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.retain_grad()
        y.register_hook(lambda g: g * 2)
        z = y * y
        z.backward(retain_graph=True)
        z.backward()
    for backward_pass, expected in zip(lens.passes, (24.0, 48.0)):
        titles = [s.title for s in steps_for(backward_pass)]
        write = titles.index(f"y.grad written: {expected}")
        assert titles[write - 1].startswith("hook <lambda> on y")  # after the tensor hook
        assert titles[write + 1] == "mul → y (MulBackward0) runs"  # before the node runs
    step = [s for s in steps_for(lens.passes[1]) if s.title == "y.grad written: 48.0"][0]
    assert "adds the gradient 24.0 that reached y, after its tensor hooks, to y.grad, which held 24.0" in step.lines[0]
    assert y.grad.item() == 48.0


def test_the_autograd_grad_start_card_says_which_grads_it_writes_as_torch_does():
    """torch.autograd.grad writes no leaf's .grad, but it does write a retain_grad() tensor's on the path (torch
    2.13): the start card says both, and its names are the tensors whose .grad changed in the plain run."""
    def program():
        x = torch.tensor(1.0, requires_grad=True)
        w = torch.tensor(2.0, requires_grad=True)
        y = x * w
        y.retain_grad()
        v = y * 3
        (gx,) = torch.autograd.grad(v + w, [x])
        return x, w, y, gx

    px, pw, py, pgx = program()
    with al.Lens() as lens:
        x, w, y, gx = program()
    assert px.grad is None and pw.grad is None and py.grad.item() == 3.0  # plain torch: y's .grad only
    assert (x.grad, w.grad, y.grad.item(), gx.item()) == (None, None, 3.0, pgx.item())
    start = steps_for(lens.passes[0])[0]
    said = [line for line in start.lines if line.startswith("autograd.grad returns")]
    assert said == ["autograd.grad returns gradients for x and writes no leaf's .grad; it writes the .grad of y "
                    "(retain_grad() was called)."]
    with al.Lens() as plain_lens:
        a = torch.tensor(1.0, requires_grad=True)
        torch.autograd.grad(a * 2, [a])
    assert [line for line in steps_for(plain_lens.passes[0])[0].lines if line.startswith("autograd.grad returns")] \
        == ["autograd.grad returns gradients for a and writes no leaf's .grad."]


def test_a_second_inputs_pass_is_said_to_write_because_of_inputs():
    """backward(inputs=[y]) writes a non-leaf y's .grad whether or not y retains it already (torch calls retain_grad()
    on it in the first such pass). Was false: the second pass's card said "without retain_grad() its .grad would stay
    None", though inputs= alone writes it. A later pass without inputs= writes it because y now retains its grad."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        z = (y * y).sum()
        z.backward(inputs=[y], retain_graph=True)
        z.backward(inputs=[y], retain_graph=True)
        z.backward()
    assert y.grad.tolist() == [18.0, 36.0] and x.grad.tolist() == [18.0, 36.0]  # (x: the third pass only)
    cards = [[s for s in steps_for(p) if s.kind == "grad" and s.title.startswith("y.grad")] for p in lens.passes]
    assert [[c.title for c in pass_cards] for pass_cards in cards] == [
        ["y.grad written: [6.0, 12.0]"], ["y.grad written: [12.0, 24.0]"], ["y.grad written: [18.0, 36.0]"]]
    assert [c[0].lines[1] for c in cards] == [
        "y is not a leaf: for inputs= torch called y.retain_grad(), so later passes add to y.grad too.",
        "y is not a leaf: for inputs= torch called y.retain_grad(), so later passes add to y.grad too.",
        "y is not a leaf: without retain_grad() its .grad would stay None."]
    assert cards[1][0].lines[0].startswith("backward(inputs=[…]) adds the gradient [6.0, 12.0] that reached y")


def test_reductions_and_products_card_numbers_match_autograd_on_random_shapes():
    torch.manual_seed(1)
    for rows, cols in ((1, 1), (2, 5), (4, 3)):
        w = torch.randn(rows, cols, requires_grad=True)
        v = torch.randn(cols, requires_grad=True)
        with al.Lens() as lens:
            out = (w @ v).mean()
            out.backward()
        mv = "\n".join(node_lines(lens, "MvBackward0"))
        sent = re.search(r"v receives wᵀ @ g = (.+)\.$", mv, re.M)
        assert sent is not None and sent.group(1) == format_value(v.grad)


def test_a_module_hook_boundary_is_named_by_its_module_and_no_operand_is_called_module_hook():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
    model[1].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    inputs = torch.ones(1, 2)
    with al.Lens(names={"model": model, "inputs": inputs}) as lens:
        model(inputs).sum().backward()
    steps = steps_for(lens.passes[0])
    text = "\n".join(line for step in steps for line in (step.title, *step.lines))
    assert "module hook ←" not in text and "(module hook)" not in text and "module hook @" not in text
    assert "Chain rule: tanh = tanh(addmm)." in text  # the boundary passes addmm's output through unchanged
    for side in ("output", "input"):
        boundary = [s for s in steps if s.title == f"model.1 {side} hook boundary (BackwardHookFunctionBackward) runs"]
        assert len(boundary) == 1 and "pass through" in boundary[0].lines[-1] and "unchanged" in boundary[0].lines[-1]
        assert f"model.1 {side} hook boundary" in [node.label for node in lens.passes[0].graph.nodes]
    # the factor of tanh's rule is bracketed, and the numbers are autograd's
    tanh = [s for s in steps if s.title.startswith("tanh")][0]
    assert any("g × (1 - tanh²) =" in line for line in tanh.lines)


def test_long_values_are_cut_exactly_where_the_whole_text_would_be():
    """format_value stops formatting once the text is too long: the result is the start of the whole text."""
    import random

    from autograd_lens.format import format_number, format_value

    def whole(values):
        if isinstance(values, list):
            return "[" + ", ".join(whole(item) for item in values) + "]"
        return format_number(values)

    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(1500):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
        tensor = torch.randn(*shape, generator=generator) * 10 ** rng.randint(-6, 6)
        if rng.random() < 0.3:
            tensor = tensor.round().to(torch.int64)
        for max_chars in (10, 20, 48, 60, 200):
            text = whole(tensor.tolist())
            expected = text[: max_chars - 1] if len(text) > max_chars else text
            if len(text) > max_chars:  # never a part of a number before the "…" (tests/test_fresh_classes9.py)
                expected = (expected if text[max_chars - 1] in ",]" else expected.rstrip("0123456789.e+-")) + "…"
            assert format_value(tensor, max_chars) == expected


def test_a_tensor_used_twice_by_one_op_is_not_counted_as_two_ops():
    x = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        y = x + 1
        y.register_hook(lambda g: g)
        (y * y).backward()
    (hook,) = [s for s in steps_for(lens.passes[0]) if s.kind == "hook"]
    assert "y is used 2 times by 1 op, yet its hook fired once" in hook.note
    assert "(here 4.0 + 4.0 = 8.0)" in hook.note and x.grad.item() == 8.0 == 2 * (3.0 + 1)


def test_only_one_hook_is_credited_with_this_passs_own_contribution_over_several_passes():
    """Pass 2 of a doubling hook: x.grad holds pass 1's doubled value too, so the hook of pass 2 explains only
    what pass 2 adds (12 instead of 6), never 'x ends with 24 instead of 12'."""
    def program(hooked):
        x = torch.tensor(3.0, requires_grad=True)
        y = x * x
        if hooked:
            y.register_hook(lambda g: g * 2)
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        return x, first

    plain, plain_first = program(False)
    with al.Lens() as lens:
        x, first = program(True)
    notes = [s.note for s in steps_for(lens.passes[1]) if s.kind == "hook"]
    added = x.grad - first
    assert notes and f"so it is why this pass adds {al.format_value(added)} to x.grad instead of " \
                     f"{al.format_value(plain.grad - plain_first)}." in notes[0]
    assert "ends with" not in notes[0] and (added.item(), (plain.grad - plain_first).item()) == (12.0, 6.0)


def test_no_hook_is_the_only_cause_in_a_recording_with_a_gap():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x ** 2
        y.register_hook(lambda g: g * 2)
        (3 * y).backward()
    gap = dataclasses.replace(lens.passes[0], notes=("a hook in a nested backward ran unseen",))
    (hook,) = [s for s in steps_for(gap) if s.kind == "hook"]
    assert "only hook" not in hook.note and "What it returned replaces what it received" in hook.note
    assert x.grad.item() == 24.0


def _boundary_labels(lens, pass_index=0):
    """sequence number of each drawn hook boundary -> its label."""
    return {node.sequence_nr: node.label for node in lens.passes[pass_index].graph.nodes
            if node.op == "BackwardHookFunctionBackward"}


def test_both_hook_boundaries_of_a_module_are_named_with_their_side_whichever_hooks_it_has():
    """The output side is the grad_fn of the module's output; the input side is what its input passed through.
    Named so whether a hook ran there or not (torch's wrapper runs at both sides), with or without --modules."""
    for hooks in ("full", "pre", "both"):
        for modules in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
            if hooks in ("full", "both"):
                model[1].register_full_backward_hook(lambda module, grad_input, grad_output: None)
            if hooks in ("pre", "both"):
                model[1].register_full_backward_pre_hook(lambda module, grad_output: None)
            inputs = torch.ones(1, 2)
            with al.Lens(names={"model": model, "inputs": inputs}, modules=modules) as lens:
                hidden = model[0](inputs)
                squashed = model[1](hidden)
                model[2](squashed).sum().backward()
            output_side = squashed.grad_fn
            assert output_side.name() == "BackwardHookFunctionBackward"
            (tanh, _), = output_side.next_functions
            (input_side, _), = tanh.next_functions
            assert input_side.name() == "BackwardHookFunctionBackward"
            labels = _boundary_labels(lens)
            assert labels == {output_side._sequence_nr(): "model.1 output hook boundary",
                              input_side._sequence_nr(): "model.1 input hook boundary"}, (hooks, modules)
            titles = [s.title for s in steps_for(lens.passes[0]) if "boundary" in s.title]
            assert titles == ["model.1 output hook boundary (BackwardHookFunctionBackward) runs",
                              "model.1 input hook boundary (BackwardHookFunctionBackward) runs"]


def test_a_hook_boundary_card_says_which_side_runs_which_hooks():
    model = torch.nn.Linear(2, 2)
    model.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    inputs = torch.ones(1, 2, requires_grad=True)
    with al.Lens(names={"model": model, "inputs": inputs}) as lens:
        model(inputs).sum().backward()
    cards = {s.title.split(" (")[0]: "\n".join(s.lines) for s in steps_for(lens.passes[0]) if "boundary" in s.title}
    assert set(cards) == {"model output hook boundary", "model input hook boundary"}
    assert "backward pre-hooks, if any, run here" in cards["model output hook boundary"]
    assert "full backward hooks, if any, run here" in cards["model input hook boundary"]


def test_a_module_with_no_name_is_named_by_its_class_on_its_boundaries():
    layer = torch.nn.Tanh()
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.tensor([0.5], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        [layer][0](x).sum().backward()
    assert sorted(_boundary_labels(lens).values()) == ["Tanh input hook boundary", "Tanh output hook boundary"]


def test_two_unnamed_results_of_one_op_are_told_apart_on_the_card_of_the_op_that_uses_them():
    """``a * b + b * a``: the add card says which mul receives what; when the two are written alike
    (``a * b + a * b``) they are numbered and the card says so. Its values are autograd's."""
    a = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        ((a * b) / (b * a * 2)).backward()
    # what each product received, from plain torch
    plain_a, plain_b = a.detach().requires_grad_(), b.detach().requires_grad_()
    products = [plain_a * plain_b, plain_b * plain_a * 2]
    for product in products:
        product.retain_grad()
    (products[0] / products[1]).backward()
    lines = node_lines(lens, "DivBackward0")
    assert f"It sends mul(a, b) ← {format_value(products[0].grad)}, mul(mul, 2) ← " \
           f"{format_value(products[1].grad)}." in lines
    assert "Chain rule: output = mul(a, b) / mul(mul, 2)." in lines
    assert products[0].grad.item() == pytest.approx(1 / 12) and products[1].grad.item() == pytest.approx(-6 / 144)

    with al.Lens() as lens:
        (a * b + a * b).backward()
    steps = steps_for(lens.passes[0])
    (add,) = [s for s in steps if "(AddBackward0)" in s.title]
    assert "It sends mul₁ ← 1.0, mul₂ ← 1.0." in add.lines
    assert any(line.startswith("mul₁ and mul₂ are 2 different unnamed mul results") for line in add.lines)
    assert add.question is not None and add.question.prompt.endswith("What does mul₁ receive?")
    assert add.question.answer == (1.0,)


def test_one_tensor_used_twice_keeps_its_name():
    y = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        (y * y).backward()
    lines = node_lines(lens, "MulBackward0")
    assert "It sends y ← 3.0, y ← 3.0." in lines and y.grad.item() == 6.0


def test_torchs_t_of_a_weight_and_an_input_named_like_the_result_are_explained_on_the_card():
    """``addmm = bias + addmm @ t`` is named ``addmm = lin.1.bias + addmm(lin.0.bias, t) @ t(lin.1.weight)``;
    past a module's hook boundaries the inner addmm is named by what went into it. The values are autograd's."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with al.Lens(names={"lin": lin}) as lens:
        lin(torch.ones(1, 2)).sum().backward()
    (last,) = [s for s in steps_for(lens.passes[0]) if "(AddmmBackward0)" in s.title][:1]
    assert "Chain rule: addmm = lin.1.bias + addmm(lin.0.bias, t) @ t(lin.1.weight)." in last.lines
    assert f"t(lin.1.weight) ← {format_value(lin[1].weight.grad.T)}" in last.lines[1]

    layer = torch.nn.Linear(1, 1)
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    with al.Lens(names={"layer": layer}) as lens:
        layer(layer(torch.ones(1, 1, requires_grad=True))).sum().backward()
    outer = [s for s in steps_for(lens.passes[0]) if "(AddmmBackward0)" in s.title][0]
    assert "Chain rule: addmm = layer.bias + addmm(layer.bias, leaf, t) @ t(layer.weight)." in outer.lines


def test_an_input_called_like_the_op_itself_is_named_by_what_went_into_it():
    """``mul = mul * 5`` (a module's x * 2, then * 5): the card and the predict question name the inner one
    ``mul(x, 2)``, looking past the module's hook boundary; its value is autograd's."""

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    layer = Double()
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.tensor(1.0, requires_grad=True)
    with al.Lens(names={"layer": layer, "x": x}) as lens:
        (layer(x) * 5).backward()
    (outer,) = [s for s in steps_for(lens.passes[0]) if s.title == "mul (MulBackward0) runs"][:1]
    assert "It sends mul(x, 2) ← 5.0." in outer.lines
    assert outer.question.prompt == "mul received g = 1.0. What does mul(x, 2) receive?"
    assert outer.question.answer == (5.0,) and x.grad.item() == 10.0



def test_the_start_card_lists_a_parameterless_hooked_module_only_when_this_graph_goes_through_it():
    """Before a pass, a module without parameters cannot be placed; after it, torch's hook boundaries say whether
    the graph goes through it. Truth: which hooks fire in plain torch."""
    fired = []
    used, unused = torch.nn.Tanh(), torch.nn.ReLU()
    used.register_full_backward_hook(lambda module, grad_input, grad_output: fired.append("used"))
    unused.register_full_backward_hook(lambda module, grad_input, grad_output: fired.append("unused"))
    x = torch.tensor([0.5], requires_grad=True)
    with al.Lens(names={"used": used, "unused": unused, "x": x}) as lens:
        used(x).sum().backward()
    assert fired == ["used"]
    start = steps_for(lens.passes[0])[0].lines
    assert "• used: module backward hooks (this graph goes through its hook boundaries)" in start
    assert not any(line.startswith("• unused") for line in start)
    assert ("(1 module with backward hooks and no parameters is not on this graph: torch made no hook boundary for "
            "it here.)") in start


@pytest.mark.parametrize("target_name", ["t", "target"])
def test_an_op_named_like_a_tensor_of_the_user_is_drawn_and_carded_as_a_call(target_name):
    """A regression target called ``t`` next to torch's ``t`` (the transpose of a Linear weight): the drawing and the
    cards must not say ``t = model.2.weight.t()`` as if the user's ``t`` were that transpose."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x, target = torch.randn(5, 3), torch.randn(5, 1)
    with al.Lens(names={"model": model, "x": x, target_name: target}) as lens:
        ((model(x) - target) ** 2).mean().backward()
    (backward_pass,) = lens.passes
    labels = [node.label for node in backward_pass.graph.nodes if node.op == "TBackward0"]
    lines = [line for step in steps_for(backward_pass) for line in step.lines]
    assert labels == (["t()", "t()"] if target_name == "t" else ["t", "t"])
    assert "Chain rule: addmm = model.2.bias + relu @ t(model.2.weight)." in lines
    if target_name == "t":
        assert "Chain rule: t(model.2.weight) = model.2.weight.t()." in lines
        assert not any(line.startswith("Chain rule: t = ") for line in lines)
    else:  # no clash: the op keeps its short name
        assert "Chain rule: t = model.2.weight.t()." in lines


@pytest.mark.parametrize("uses", [2, 5, 9])
def test_a_leaf_drawn_once_per_use_is_one_tensor_on_a_card(uses):
    """A leaf used many times is drawn as one box per use; ``x * x`` still sends both gradients to the one tensor
    x. The card once called the two boxes "x₁ and x₂ ... 2 different unnamed x results" and asked what x₁
    receives (half of it; found by the differential suite's check of node answers against next_functions)."""
    x = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64, requires_grad=True)
    with al.Lens() as lens:
        out = x.sum() + sum((x * x).sum() for _ in range(uses - 1))
        out.backward()
    p = lens.passes[0]
    split = sum(1 for node in p.graph.nodes if node.label == "x" and node.kind == "leaf") > 1
    cards = [s for s in steps_for(p) if s.kind == "node" and s.title.startswith("mul")]
    assert len(cards) == uses - 1
    expected = tuple((2 * x).tolist())  # what x receives from one x * x, whose output got g = 1: g * x + g * x
    for card in cards:
        text = " ".join(card.lines)
        assert "different" not in text and "x₁" not in text, text
        assert "x is used 2 times by this op" in text, text
        assert card.question is not None and "What does x receive" in card.question.prompt
        assert card.question.answer == expected, (card.question.answer, expected)
    if uses > 2:
        assert split  # the large cases do draw one box per use (the case this guards)
