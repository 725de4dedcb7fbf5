"""The debugging lenses against plain PyTorch: why a gradient stopped, where NaN started, which paths it took.

Each unreached reason is produced by a program with exactly that cause, run once
plain (torch leaves the tensor without a gradient, or with zeros) and once under
a Lens.  The NaN origin is compared with the node ``detect_anomaly`` names (NaN)
or with a node observer (inf, which anomaly mode does not check).  Paths are
summed and compared with ``.grad`` on seeded random graphs.
"""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.debug import NonFinite, PathSet, Reason
from autograd_lens.debug.why import Why
from conftest import anomaly_blames


def run(program, why=True):
    """(plain namespace, lens namespace, lens): the program run plain and under a Lens."""
    torch.manual_seed(0)
    plain: dict = {}
    program(plain)
    torch.manual_seed(0)
    traced: dict = {}
    with al.Lens(names=traced, why=why) as lens:
        program(traced)
    return plain, traced, lens


def leaves(ns, *names, size=3):
    for name in names:
        ns[name] = torch.randn(size, requires_grad=True)
    return [ns[name] for name in names]


# ----------------------------------------------------------------------------- one program per reason

def detach(ns):
    x, w = leaves(ns, "x", "w")
    (x * w.detach()).sum().backward()


def data(ns):
    x, w = leaves(ns, "x", "w")
    (x * w.data).sum().backward()


def item(ns):
    x, = leaves(ns, "x")
    w, = leaves(ns, "w", size=1)
    (x * w.item()).sum().backward()


def tolist(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.tensor(w.tolist())).sum().backward()


def numpy_copy(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.tensor(w.detach().numpy())).sum().backward()


def numpy_view(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.from_numpy(w.detach().numpy())).sum().backward()


def no_grad(ns):
    x, w = leaves(ns, "x", "w")
    with torch.no_grad():
        h = w * 2
    (x + h).sum().backward()


def inference_mode(ns):
    x, w = leaves(ns, "x", "w")
    with torch.inference_mode():
        h = w * 2
    (x + h).sum().backward()


def frozen(ns):
    ns["model"] = model = nn.Linear(3, 1)
    model.weight.requires_grad_(False)
    model(torch.randn(2, 3)).sum().backward()


def set_too_late(ns):
    x, = leaves(ns, "x")
    ns["w"] = w = torch.randn(3)
    y = x * w
    w.requires_grad_()
    y.sum().backward()


def comparison(ns):
    x, w = leaves(ns, "x", "w")
    (x * (w > 0).float()).sum().backward()


def argmax(ns):
    x, w = leaves(ns, "x", "w")
    (x * w.argmax()).sum().backward()


def integer_cast(ns):
    x, w = leaves(ns, "x", "w")
    (x * (w * 10).long()).sum().backward()


def unused(ns):
    x, w = leaves(ns, "x", "w")
    (x * 2).sum().backward()


def inputs_excluded(ns):
    x, w = leaves(ns, "x", "w")
    (x * w).sum().backward(inputs=[x])


def hook_zeros(ns):
    x, w = leaves(ns, "x", "w")
    h = x * w
    h.register_hook(lambda grad: torch.zeros_like(grad))
    (h * 2).sum().backward()


CASES = [
    (detach, "w", "detached", ".detach()"),
    (data, "w", "detached", ".data"),
    (item, "w", "detached", ".item()"),
    (tolist, "w", "detached", ".tolist() → tensor"),
    (numpy_copy, "w", "detached", ".detach() → .numpy()"),
    (numpy_view, "w", "detached", "shares w's memory"),  # torch.from_numpy is not a torch function call
    (no_grad, "w", "no_grad", "mul under no_grad"),
    (inference_mode, "w", "inference_mode", "mul under inference_mode"),
    (frozen, "model.weight", "requires_grad_false", "frozen parameter"),
    (set_too_late, "w", "requires_grad_false", "set to True after the forward ran"),
    (comparison, "w", "non_differentiable", "gt (its result is bool"),
    (argmax, "w", "non_differentiable", "argmax (its result is int64"),
    (integer_cast, "w", "non_differentiable", "long (its result is int64, which has no gradient)"),
    (unused, "w", "not_on_path", "not on the graph"),
    (inputs_excluded, "w", "excluded", "backward(inputs=[x])"),
    (hook_zeros, "w", "hook_zeros", "tensor hook <lambda> on"),
]


@pytest.mark.parametrize("program, name, code, words", CASES, ids=[case[0].__name__ for case in CASES])
def test_each_reason_from_a_program_with_exactly_that_cause(program, name, code, words):
    plain, traced, lens = run(program)
    tensor = plain["model"].weight if name == "model.weight" else plain[name]
    if code == "hook_zeros":
        assert torch.equal(tensor.grad, torch.zeros_like(tensor))  # plain torch: zeros, not None
    else:
        assert tensor.grad is None  # plain torch: no gradient at all
    for key in ("x", "model"):  # the lens changed no gradient
        if key == "x" and "x" in plain:
            assert torch.equal(plain["x"].grad, traced["x"].grad)
    (backward_pass,) = lens.passes
    reason = backward_pass.unreached[name]
    assert isinstance(reason, Reason)
    assert (reason.code, reason.name) == (code, name), reason.text
    assert words in reason.text, reason.text
    assert "x" not in backward_pass.unreached or code == "hook_zeros"


@pytest.mark.parametrize("program, words", [(detach, "shares w's memory"), (data, "shares w's memory"),
                                            (numpy_view, "shares w's memory"), (item, "exactly w's values"),
                                            (tolist, "exactly w's values"), (set_too_late, "set to True after")])
def test_without_the_forward_record_the_saved_values_still_tell(program, words):
    _, _, lens = run(program, why=False)
    reason = lens.passes[0].unreached["w"]
    assert words in reason.text, reason.text
    assert reason.code == ("requires_grad_false" if program is set_too_late else "detached")


@pytest.mark.parametrize("program", [no_grad, argmax, comparison, unused])
def test_without_the_forward_record_an_undecidable_cause_is_unknown(program):
    _, _, lens = run(program, why=False)
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "unknown"
    assert "Lens(why=True)" in reason.text


def test_autograd_grad_inputs_excluded_and_a_clean_pass_has_nothing_unreached():
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    with al.Lens(names={"x": x, "w": w}) as lens:
        (gx,) = torch.autograd.grad((x * w).sum(), [x])
        (x * w).sum().backward()
    assert torch.equal(gx, w.detach())
    first, second = lens.passes
    assert first.unreached["w"].code == "excluded" and "autograd.grad" in first.unreached["w"].text
    assert "x" not in first.unreached
    assert dict(second.unreached) == {}


def test_cut_through_a_named_intermediate_blames_both():
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    with al.Lens(names={}, why=True) as lens:
        h = x * w
        loss = (h.detach() * x).sum()
        lens.names = {"x": x, "w": w, "h": h}
        loss.backward()
    unreached = lens.passes[0].unreached
    assert x.grad is not None and w.grad is None
    assert unreached["h"].code == "detached" and unreached["h"].text.startswith("h went through .detach()")
    assert unreached["w"].code == "detached" and "a tensor computed from it" in unreached["w"].text
    assert "x" not in unreached


def test_the_forward_record_changes_nothing_and_leaves_no_mode_behind():
    def program(ns):
        x, w = leaves(ns, "x", "w")
        with torch.no_grad():
            scale = w.abs().max().item()
        (x * scale).pow(2).sum().backward()
        ns["scale"] = scale
    plain, traced, lens = run(program)
    assert plain["scale"] == traced["scale"]
    assert torch.equal(plain["x"].grad, traced["x"].grad)
    assert not torch.overrides._get_current_function_mode_stack()
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "no_grad" and "abs under no_grad → max → .item()" in reason.text


def test_unreached_never_raises():
    import dataclasses

    _, _, lens = run(detach)
    broken = dataclasses.replace(lens.passes[0], debug=object())
    assert dict(broken.unreached) == {} and broken.unreached.note.startswith("unknown:")
    assert dataclasses.replace(lens.passes[0], events=None).first_nonfinite.kind == "unknown"


# ----------------------------------------------------------------------------- where NaN or inf started

def log_of_zero():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return (torch.log(x) * 0).sum() + x.sum()


def sqrt_at_zero():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    return (torch.sqrt(x) * 2).sum()


def zero_over_zero():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return (x / x).sum()


def exp_overflow():
    x = torch.tensor([100.0, 1.0], requires_grad=True)
    return (torch.exp(x) * 0).sum() + x.sum()


def late_nan():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    a = torch.tanh(x) * 3
    b = torch.sqrt(a - a.detach()[0])  # sqrt at 0 for the first element
    return (b * x).sum() + (a * 2).sum()


def observed_origin(program):
    """The first node, in the order the engine ran them, to send a non-finite gradient from finite ones."""
    root = program()
    order = []
    stack, seen = [root.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        fn.register_hook(lambda inputs, outputs, fn=fn: order.append((fn.name(), inputs, outputs)))
        stack.extend(n for n, _ in fn.next_functions)

    def finite(values):
        return all(v is None or bool(v.isfinite().all()) for v in values)
    root.backward()
    return next((name for name, sent, received in order if finite(received) and not finite(sent)), None)


@pytest.mark.parametrize("program, expected", [(log_of_zero, "LogBackward0"), (sqrt_at_zero, "SqrtBackward0"),
                                               (zero_over_zero, "DivBackward0"), (exp_overflow, "ExpBackward0"),
                                               (late_nan, "SqrtBackward0")])
def test_first_nonfinite_matches_anomaly_mode_and_a_node_observer(program, expected):
    truth = observed_origin(program)
    anomaly = anomaly_blames(program)
    with al.Lens(names={}) as lens:
        program().backward()
    origin = lens.passes[0].first_nonfinite
    assert isinstance(origin, NonFinite) and origin.kind == "node"
    assert origin.name == truth == expected
    if anomaly is not None:  # anomaly mode checks NaN, not inf (sqrt at 0 gives inf)
        assert origin.name == anomaly
    assert "nan" in origin.outputs or "inf" in origin.outputs
    assert origin.note == ""


def test_a_finite_pass_has_no_origin_and_a_hook_can_be_one():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        (x * 3).sum().backward()
        y = x * 2
        y.register_hook(lambda grad: grad * float("nan"))
        y.sum().backward()
    assert lens.passes[0].first_nonfinite is None
    origin = lens.passes[1].first_nonfinite
    assert origin.kind == "hook" and origin.label == "tensor hook on mul" and origin.outputs == "[nan, nan]"
    assert origin.inputs == "[1.0, 1.0]" and origin.name == "<lambda>"
    assert bool(x.grad.isnan().all())


def test_the_source_line_is_given_in_a_lens_cell(shell):
    shell.run_cell("import torch\nx = torch.tensor([0.0, 1.0], requires_grad=True)")
    shell.run_cell("%%lens --no-show\ny = torch.log(x)\nloss = (y * 0).sum() + x.sum()\nloss.backward()")
    origin = shell.user_ns["_lens"].passes[0].first_nonfinite
    assert origin.name == "LogBackward0" and origin.source.line == 2 and "torch.log(x)" in origin.source.text


# ----------------------------------------------------------------------------- which paths it took

def random_graph(seed, shape=()):
    """A random DAG over three leaves: each new value combines two earlier ones (reuse makes many paths)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    names = ["a", "b", "c"]
    leaves_ = {name: (torch.rand(shape) + 0.5).requires_grad_() for name in names}
    values = list(leaves_.values())
    unary = [torch.sin, torch.tanh, lambda t: t * 1.5, torch.exp, lambda t: t.pow(2)]
    for _ in range(rng.randint(3, 7)):
        first, second = rng.choice(values), rng.choice(values)
        op = rng.choice(["add", "mul", "sub", "unary"])
        if op == "add":
            new = first + second
        elif op == "mul":
            new = first * second * 0.5
        elif op == "sub":
            new = first - second
        else:
            new = rng.choice(unary)(first)
        values.append(torch.tanh(new))  # keeps values small
    return leaves_, sum(values[3:]).sum()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("shape", [(), (2, 3)], ids=["scalar", "tensor"])
def test_paths_add_up_to_the_gradient_on_random_graphs(seed, shape):
    with al.Lens(names={}, why=True) as lens:
        named, root = random_graph(seed, shape)
        lens.names = named
        root.backward()
    for name, leaf in named.items():
        path_set = lens.paths_to(name)
        if leaf.grad is None:
            assert not path_set.known
            continue
        assert path_set.known, path_set.unknown
        total = sum(path.contribution for path in path_set.paths)
        assert torch.allclose(total, leaf.grad, rtol=1e-5, atol=1e-6)
        assert torch.allclose(path_set.total, leaf.grad, rtol=1e-5, atol=1e-6)
        for path in path_set.paths:
            assert path.nodes[-1] == name or path.rest
            if shape == () and not path.rest:  # scalars: the product of the local derivatives
                assert len(path.factors) == len(path.nodes) - 1
                assert math.isclose(math.prod(path.factors), float(path.contribution), rel_tol=1e-5, abs_tol=1e-7)


def test_scalar_paths_are_the_chain_rule():
    x = torch.tensor(2.0, requires_grad=True)
    w = torch.tensor(3.0, requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        h = x * w
        (h * x + torch.sin(h)).backward()
    path_set = lens.paths_to("x")
    assert path_set.count == 3
    by_route = {path.nodes: path for path in path_set.paths}
    direct = by_route[("add", "mul", "x")]
    assert direct.factors == (1.0, 6.0) and float(direct.contribution) == 6.0
    through_sin = by_route[("add", "sin", "mul", "x")]
    assert through_sin.factors[1] == pytest.approx(math.cos(6.0)) and through_sin.factors[2] == 3.0
    assert float(path_set.total) == pytest.approx(float(x.grad))


def test_too_many_paths_keep_the_largest_and_one_rest_entry():
    x = torch.tensor(1.1, requires_grad=True)
    with al.Lens(names={"x": x}, why=True) as lens:
        h = x
        for index in range(6):  # each layer doubles the paths: 2**6
            h = torch.tanh(h) * (1 + index / 10) + h * 0.5
        h.backward()
    path_set = lens.paths_to("x")
    assert path_set.count == 64 and len(path_set.paths) == 9
    rest = path_set.paths[-1]
    assert rest.nodes == ("rest",) and rest.rest == 56
    shown = [abs(float(path.contribution)) for path in path_set.paths[:-1]]
    assert min(shown) >= abs(float(rest.contribution)) / 56  # the shown ones are the largest
    assert float(sum(path.contribution for path in path_set.paths)) == pytest.approx(float(x.grad), rel=1e-5)


def test_paths_unknown_without_the_record_and_through_user_code():
    x = torch.tensor(2.0, requires_grad=True)

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value):
            return value * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    with al.Lens(names={"x": x}) as lens:
        (x * 3).backward()
    assert "Lens(why=True)" in lens.paths_to("x").unknown
    with al.Lens(names={"x": x}, why=True) as lens:
        Double.apply(x).backward()
    assert "custom autograd.Function" in lens.paths_to("x").unknown
    assert isinstance(lens.paths_to("nobody"), PathSet) and not lens.paths_to("nobody").known


# ----------------------------------------------------------------------------- %%lens --why

def test_why_shows_the_three_answers_as_plain_deterministic_html(shell):
    cell = ("%%lens --no-show --why w\nx = torch.tensor([1.0, 2.0], requires_grad=True)\n"
            "w = torch.tensor([0.5, 3.0], requires_grad=True)\nloss = (x * w.detach()).sum()\nloss.backward()\n"
            "v = torch.tensor(0.0, requires_grad=True)\n(torch.log(v) * v).backward()")
    shell.run_cell("import torch")
    shell.run_cell(cell)
    lens = shell.user_ns["_lens"]
    page = Why(lens, "w")._repr_html_()
    assert page == Why(lens, "w")._repr_html_()
    # pass 2: log(0) = -inf in the forward; mul's backward sends it on (v's gradient is log(v)), anomaly-free
    assert "<table>" in page and "went through .detach()" in page and "MulBackward0 [mul]" in page
    assert "<td>2</td><td>MulBackward0 [mul]</td>" in page and "<td>1</td>" not in page.split("NaN")[1]
    assert "0x" not in page
    text = repr(Why(lens, "x"))
    assert "which paths it took:\n  loss (sum) ← mul ← x: [0.5, 3.0]\n  sum over 1 path: [0.5, 3.0]" in text
    assert "pass 2: not on any path to the root" in text and "pass 1:" not in text.split("where NaN")[0]
    # a row that only says something spans its table (it sat under the "reason" or "first step" header)
    shell.run_cell("%%lens --no-show --why a\na = torch.ones(2, requires_grad=True)\n(a * 3).sum().backward()")
    page = Why(shell.user_ns["_lens"], "a")._repr_html_()
    assert '<tr><td colspan="3">no pass left it without a gradient</td></tr>' in page
    assert '<tr><td colspan="5">every recorded gradient is finite</td></tr>' in page


def test_why_magic_displays(shell, capsys):
    shell.run_cell("import torch")
    result = shell.run_cell("%%lens --why x\nx = torch.tensor(2.0, requires_grad=True)\n(x * x).backward()")
    assert result.success
    shown = capsys.readouterr()
    path_set = shell.user_ns["_lens"].paths_to("x")
    assert path_set.count == 2 and [path.factors for path in path_set.paths] == [(2.0,), (2.0,)]
    assert [path.nodes for path in path_set.paths] == [("mul [input 1]", "x"), ("mul [input 2]", "x")]
    assert "why x\nwhere the gradient stopped:\n  no pass left it without a gradient" in shown.out
    assert "  mul [input 1] ← x: 2.0 = 2.0\n" in shown.out and "sum over 2 paths: 4.0" in shown.out
    assert float(path_set.total) == 4.0 == float(shell.user_ns["x"].grad)


def test_a_call_that_cuts_several_tensors_cuts_each_of_them():
    torch.manual_seed(0)
    encoder, head = nn.Linear(4, 3), nn.Linear(3, 1)
    x = torch.randn(5, 4)
    with al.Lens(names={"encoder": encoder, "head": head}, why=True) as lens:
        with torch.no_grad():
            features = encoder(x)
        head(features).sum().backward()
    assert encoder.weight.grad is None and encoder.bias.grad is None and head.weight.grad is not None
    unreached = lens.passes[0].unreached
    assert sorted(unreached) == ["encoder.bias", "encoder.weight"]
    for name in unreached:
        assert unreached[name].code == "no_grad"
        assert unreached[name].text == f"{name} went through linear under no_grad, and this graph uses the result"


def test_a_cut_too_deep_to_walk_makes_the_answer_unknown(monkeypatch):
    from autograd_lens.debug import forward

    monkeypatch.setattr(forward, "UPSTREAM_LIMIT", 3)
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        deep = w
        for _ in range(5):
            deep = deep * 1.5
        (x * deep.detach()).sum().backward()
    reason = lens.passes[0].unreached["w"]
    assert w.grad is None
    assert reason.code == "unknown" and "whether w is among them is not known" in reason.text


def test_a_nonfinite_gradient_given_to_backward_is_its_own_origin():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        (x * 2).backward(torch.tensor([float("nan"), 1.0]))
    origin = lens.passes[0].first_nonfinite
    assert bool(x.grad.isnan()[0])
    assert (origin.kind, origin.name, origin.inputs) == ("seed", "gradient=", "([nan, 1.0])")


def test_the_forward_record_keeps_torchs_warnings_as_they_were():
    """Inside a TorchFunctionMode torch's warnings point at the mode's own line: the recorder gives them back
    from the user's line, same message and category (torch.tensor(t) warns every time, not once)."""
    def program():
        w = torch.randn(1, requires_grad=True)
        torch.tensor(w)
        torch.tensor(w * 2)

    seen = []
    for why in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with al.Lens(names={}, why=why):
                program()
        seen.append([(str(c.message), c.category, c.filename, c.lineno) for c in caught])
    assert len(seen[0]) == 2 and seen[0] == seen[1]
    assert seen[0][0][2] == __file__ and seen[0][0][3] != seen[0][1][3]


def test_indices_of_max_are_a_cut_even_though_its_values_are_differentiable():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = torch.tensor([[0.5, 2.0], [3.0, -1.0]], requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        values, indices = torch.max(w, dim=0)
        (x * indices.sum()).sum().backward()
    assert w.grad is None
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "non_differentiable" and "max (its result is int64" in reason.text


def test_paths_through_broadcasting_are_summed_down_as_the_engine_does():
    torch.manual_seed(3)
    x = torch.randn(3, requires_grad=True)
    b = torch.randn(1, requires_grad=True)
    with al.Lens(names={"x": x, "b": b}, why=True) as lens:
        h = torch.tanh(x * torch.randn(4, 3) + b)  # x broadcast over rows, b over everything
        (h * x + h.exp()).sum().backward()
    for name, leaf in (("x", x), ("b", b)):
        path_set = lens.paths_to(name)
        assert path_set.total.shape == leaf.shape
        assert torch.allclose(path_set.total, leaf.grad, rtol=1e-5, atol=1e-6)
    assert lens.paths_to("x").count == 3 and lens.paths_to("b").count == 2


def test_a_forward_record_that_forgot_cuts_does_not_claim_not_on_path(monkeypatch):
    from autograd_lens.debug import forward

    monkeypatch.setattr(forward, "CUT_LIMIT", 2)
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        for _ in range(3):
            (x * 2).sum().item()  # a cut each time (logging a loss)
        (x * 3).sum().backward()
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "unknown" and "too long to look at in full" in reason.text


def test_the_forward_record_names_the_first_forward_call_that_made_nan_or_inf(shell):
    from autograd_lens.debug import forward_nonfinite

    shell.run_cell("import torch\nv = torch.tensor([0.0, 2.0], requires_grad=True)")
    shell.run_cell("%%lens --no-show --why v\nsafe = v + 1\nlogs = torch.log(v)\n(logs * 0 + safe).sum().backward()")
    lens = shell.user_ns["_lens"]
    found, source = forward_nonfinite(lens.passes[0])
    assert torch.isinf(torch.log(torch.tensor(0.0)))  # plain torch: log(0) = -inf
    assert (found.op, found.inputs, found.output) == ("log", "([0.0, 2.0])", "[-inf, 0.6931]")
    assert source.text.startswith("logs = torch.log(v)")
    assert "forward: log (the block's first NaN or inf)" in repr(lens.why("v"))
    with al.Lens(names={}) as plain_lens:
        (torch.log(torch.zeros(1, requires_grad=True)) * 0).sum().backward()
    assert forward_nonfinite(plain_lens.passes[0]) == (None, None)  # not recorded without why=True


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_forward_record_leaves_checkpointing_alone(reentrant):
    """The recorder's own checks run with no graph: a checkpoint's saved-tensor hooks count the same tensors
    in the forward and in its recomputation (they did not: 3 against 1, a CheckpointError)."""
    def program(ns):
        x, = leaves(ns, "x")
        out = torch.utils.checkpoint.checkpoint(lambda a: (a * 2).sin(), x, use_reentrant=reentrant)
        out.sum().backward()
    plain, traced, lens = run(program)
    assert torch.equal(plain["x"].grad, traced["x"].grad)
    assert len(lens.passes) == 1


def test_generated_programs_under_why_agree_with_torch_and_their_paths_add_up(monkeypatch):
    """tests/programs.py programs (hooks of every kind, views, checkpoint, custom Functions, several passes) under
    Lens(why=True): every recorded hook call and .grad as the truth has them, and where a leaf's gradient without
    hooks is known, its paths add up to it.  Seeds 1250-1289 include non-reentrant checkpoints."""
    import programs

    original = al.Lens
    monkeypatch.setattr(al, "Lens", lambda names=None, **options: original(names=names, why=True, **options))
    checked = 0
    for seed in range(1250, 1290):
        program, problems = programs.check(seed)
        assert not problems, programs.report(program, problems)
        traced = programs.run(program, "lens")
        for index, backward_pass in enumerate(traced.lens.passes if traced.lens else ()):
            assert backward_pass.unreached.note == "" or not backward_pass.unreached.note.startswith("unknown")
            for name in program.leaves:
                want = backward_pass.added_without_hooks.get(name)
                path_set = traced.lens.paths_to(name, index)
                if backward_pass.kind == "backward" and path_set.known and isinstance(want, torch.Tensor):
                    assert torch.allclose(path_set.total.double(), want.double(), rtol=1e-4, atol=1e-5), (seed, name)
                    checked += 1
    assert checked > 40


def test_a_view_taken_under_no_grad_is_named_as_a_possibility_and_told_apart_with_the_record():
    def program(ns):
        x, w = leaves(ns, "x", "w")
        with torch.no_grad():
            part = w[:2]
        (x[:2] * part).sum().backward()
    plain, _, lens = run(program, why=False)
    assert plain["w"].grad is None
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "detached" and "a separate leaf that shares w's memory" in reason.text
    assert plain["x"].grad is not None  # plain torch: the product's gradient went to part, a leaf of its own
    _, _, lens = run(program, why=True)
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "no_grad" and reason.text == "w went through __getitem__ under no_grad, and this graph uses the result"


def test_detach_then_requires_grad_is_a_cut_with_the_record():
    def program(ns):
        x, w = leaves(ns, "x", "w")
        copy = w.detach().requires_grad_()
        (x * copy).sum().backward()
    plain, _, lens = run(program)
    assert plain["w"].grad is None
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "detached" and reason.text == "w went through .detach(), and this graph uses the result"
