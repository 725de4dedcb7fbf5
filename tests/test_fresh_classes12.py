"""Fresh eyes on higher-order and functional autograd with hooks (helper ``fresh13``, 2026-11-28): WGAN-GP's gradient
penalty (``autograd.grad(..., create_graph=True)`` of a critic with a full module backward hook, then backward through
the graph of the gradient, where the module's hook fires again), MAML's inner loop (fast weights ``w - lr * grad``,
hooks on the fast weights and the meta-parameters), Hessian-vector products (``autograd.grad`` twice, a
differentiable ``grad_outputs``), ``backward(create_graph=True)`` then a penalty on ``.grad``, a hook in a
create_graph pass whose result has a graph of its own, double backward through a custom autograd.Function and through
a non-reentrant checkpoint, ``autograd.grad`` with respect to a ``GradientEdge``, complex tensors (Wirtinger
gradients, ``view_as_real``), and ``retain_graph`` with several ``backward()`` calls on one graph then on a sum of
losses sharing it.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py, imported), then through :func:`statements` and the drawing checks of
tests/test_fresh_classes10.py: every hook call, node gradient, ``.grad``, value without hooks (or "unknown", with why),
what ``autograd.grad`` returned, card and drawn grad field must be torch's.  Found false and fixed (debug/paths.py):
``Lens(why=True)`` on complex tensors printed a ``UserWarning`` into the user's program, and gave complex one-element
graphs no paths.  Found false and fixed in capture/calls.py (by the integrator): the warning torch shows on the first
``backward(create_graph=True)`` made the next pass say its leaves' values without hooks were unknown "because hooks
changed gradients" in a program with no hook at all."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import equal, problems_of, run  # noqa: E402  (the differential harness)
from test_fresh_classes10 import drawing_problems, drawn_grads, name, statements  # noqa: E402  (cards, drawing)

from autograd_lens.format import format_value  # noqa: E402
from autograd_lens.views.passview import views_for  # noqa: E402


def check_mixed(program, drawing: bool = True) -> tuple:
    """:func:`test_fresh_classes10.check` for programs that mix ``torch.autograd.grad`` passes (each recorded as
    ``{"grad0": ..., "grad1": ...}``: what it returned, in the order of its inputs) with ``backward()`` passes (recorded
    by leaf name): what each grad pass returned and would return without hooks (or unknown, with why) is torch's; each
    backward pass's cards, drawn grad fields and .grad are torch's.  ``drawing=False``: the drawing's value texts are
    not parsed (complex numbers); the grad fields are still compared as texts."""
    assert problems_of(program) == []
    problems, lens, plain = statements(program)
    unhooked = run(program, "nohook")
    grads = {index for index, per in enumerate(plain.per) if per and all(key.startswith("grad") for key in per)}
    assert problems == ([] if len(grads) < len(plain.per) else ["no .grad card was compared"])
    assert len(lens.passes) == len(plain.per) == len(unhooked.per)
    if drawing:
        drawn = [line for line in drawing_problems(lens, plain, False) if int(line.split(":")[0][5:]) - 1 not in grads]
        assert drawn in ([], ["no leaf box was compared"])
    for index, (p, per, without) in enumerate(zip(lens.passes, plain.per, unhooked.per)):
        if index in grads:
            assert p.kind == "grad" and len(p.inputs) == len(per), (index, p.inputs)
            for input_name, key in zip(p.inputs, sorted(per)):
                assert equal(p.input_grads[input_name], per[key]), (index, input_name)
                shown = p.grads_without_hooks[input_name]
                stepped = any("changed since pass" in note for note in p.notes)  # (as problems_of: not compared)
                assert stepped or (shown is None and p.unknown.get(input_name)) or equal(shown, without[key]), \
                    (index, input_name)
            continue
        assert p.kind == "backward"
        drawn = drawn_grads(lens, index)
        shown = {key: drawn[key] for key in per if key in drawn}
        assert shown == {key: format_value(per[key], 48) for key in shown}, index
        assert len(shown) == sum(value is not None for value in per.values()), (index, sorted(drawn), sorted(per))
    return lens, plain


def returned(run, values) -> None:
    """What a torch.autograd.grad pass returned, in the order of its inputs (see :func:`check_mixed`)."""
    run.record({f"grad{number}": value for number, value in enumerate(values)})


# --- 1. WGAN-GP: the gradient penalty through a critic with hooks ----------------------------------------------------

def wgan_gp(kind: str):
    """The critic's gradient with respect to interpolated inputs (autograd.grad, create_graph=True), its norm's
    distance from 1 as a penalty beside the Wasserstein loss, one backward through both, two critic steps.  A full
    backward hook on the first Linear (it fires in the grad pass, then in the backward pass once per critic call: twice
    with no input gradient, once through the graph of the gradient) and a hook on the interpolates; ``modify``: the
    interpolates' hook doubles what it gets (the penalty is then built from a doubled gradient) and a hook halves the
    last weight's gradient."""
    def program(run):
        torch.manual_seed(0)
        critic = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        name(run, critic=critic)
        opt = torch.optim.SGD(critic.parameters(), lr=0.1)
        if run.hooked:
            critic[0].register_full_backward_hook(run.H("first", lambda m, gi, go: None, lambda a: a[1]))
            if kind == "modify":
                critic[2].weight.register_hook(run.H("halve", lambda g: g * 0.5))
        for _ in range(2):
            real, fake, alpha = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 1)
            xhat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            name(run, xhat=xhat)
            if run.hooked:
                xhat.register_hook(run.H("interpolates", (lambda g: g * 2) if kind == "modify" else (lambda g: None)))
            opt.zero_grad()
            (g,) = run.grad(critic(xhat).sum(), [xhat], create_graph=True)
            returned(run, [g])
            penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
            run.backward(critic(fake).mean() - critic(real).mean() + 10 * penalty)
            run.record(dict({f"critic.{n}": p.grad for n, p in critic.named_parameters()}, xhat=xhat.grad))
            opt.step()
        return [p.detach().clone() for p in critic.parameters()]
    return program


@pytest.mark.parametrize("kind", ["observe", "modify"])
def test_wgan_gradient_penalty_against_torch(kind):
    with warnings.catch_warnings():  # (torch warns that the full hook fires for the critic's calls on real and fake)
        warnings.simplefilter("ignore")
        lens, plain = check_mixed(wgan_gp(kind))
    for step in range(2):
        grad_pass, backward_pass = lens.passes[2 * step:2 * step + 2]
        assert [(c.hook, c.invocation) for c in grad_pass.hook_calls] == [("first", 4 * step + 1),
                                                                          ("interpolates", 1)]
        calls = [(c.hook, c.invocation) for c in backward_pass.hook_calls]
        expected = [("first", 4 * step + 2), ("first", 4 * step + 3)] + ([("halve", step + 1)] if kind == "modify"
                                                                          else []) + [("first", 4 * step + 4),
                                                                                      ("interpolates", 2)]
        assert calls == expected
        firsts = [c for c in backward_pass.hook_calls if c.hook == "first"]
        # real's call, fake's, then the interpolates' through the graph of the gradient: no input gradient for real
        # and fake (their inputs need none), each paired with its forward call
        assert [c.forward_call for c in firsts] == [3, 2, 1] and [c.grad_in[0] is None for c in firsts] == \
            [True, True, False]
        assert torch.equal(firsts[2].grad_in[0], plain.per[2 * step + 1]["xhat"]) == (kind == "observe")
        if kind == "modify":  # the graph of the gradient was built from what the hook returned: said, not guessed
            assert set(backward_pass.unknown) == {"critic.0.weight", "critic.0.bias", "critic.2.weight", "xhat"}
            assert all(f"was made by pass {2 * step + 1} (create_graph=True) while hooks changed" in reason
                       for reason in backward_pass.unknown.values())
        else:
            assert not backward_pass.unknown


# --- 2. MAML: fast weights from a create_graph inner step, hooks on them and on the meta-parameters ----------------

def maml(kind: str):
    """Two tasks per meta-step, ``steps`` inner steps each (autograd.grad, create_graph=True), the query losses summed
    and backpropagated to the meta-parameters through every inner step; a hook on the meta-weight (``clamp``: it
    clamps its gradient) and on each fast weight (``scale``: halving its gradient), two meta-steps."""
    def program(run):
        torch.manual_seed(0)
        w, b = torch.randn(3, 1, requires_grad=True), torch.zeros(1, requires_grad=True)
        name(run, w=w, b=b)
        meta = torch.optim.SGD([w, b], lr=0.1)
        if run.hooked:
            w.register_hook(run.H("meta_w", (lambda g: g.clamp(-0.5, 0.5)) if kind == "clamp" else (lambda g: None)))
        for _ in range(2):
            meta.zero_grad()
            total = 0
            for task in range(2):
                support, target = torch.randn(5, 3), torch.randn(5, 1)
                query, answer = torch.randn(5, 3), torch.randn(5, 1)
                fast_w, fast_b = w, b
                for inner in range(2 if kind == "two_steps" else 1):
                    gw, gb = run.grad(F.mse_loss(support @ fast_w + fast_b, target), [fast_w, fast_b],
                                      create_graph=True)
                    returned(run, [gw, gb])
                    fast_w, fast_b = fast_w - 0.4 * gw, fast_b - 0.4 * gb
                    if run.hooked:
                        fast_w.register_hook(run.H(f"fast{task}{inner}", (lambda g: g * 0.5) if kind == "scale"
                                                   else (lambda g: None)))
                total = total + F.mse_loss(query @ fast_w + fast_b, answer)
            run.backward(total)
            run.record({"w": w.grad, "b": b.grad})
            meta.step()
        return [w.detach().clone(), b.detach().clone()]
    return program


@pytest.mark.parametrize("kind", ["clamp", "two_steps", "scale"])
def test_maml_against_torch(kind):
    lens, plain = check_mixed(maml(kind))
    steps = 2 if kind == "two_steps" else 1
    per_meta = 2 * steps + 1
    assert [p.kind for p in lens.passes] == (["grad"] * 2 * steps + ["backward"]) * 2
    for meta_step in range(2):
        outer = lens.passes[per_meta * (meta_step + 1) - 1]
        expected = [("fast11", 1), ("fast10", 2), ("fast01", 1), ("fast00", 2)] if steps == 2 else \
            [("fast10", 1), ("fast00", 1)]
        assert [(c.hook, c.invocation) for c in outer.hook_calls] == expected + [("meta_w", 3 * meta_step + 3)]
        # the inner passes: the meta-weight's hook fires in the first inner step of each task only (then the fast
        # weight is the input), the fast weight's hook in the second
        inner = lens.passes[per_meta * meta_step:per_meta * (meta_step + 1) - 1]
        assert [[c.hook for c in p.hook_calls] for p in inner] == ([["meta_w"], ["fast00"], ["meta_w"], ["fast10"]]
                                                                  if steps == 2 else [["meta_w"], ["meta_w"]])
        # the inner passes' graphs were built from the clamped gradient: without hooks unknown, and said why; the
        # fast weights' hooks change the outer pass only, which the lens replays without them
        assert set(outer.unknown) == ({"w", "b"} if kind == "clamp" else set())
        assert all("(create_graph=True) while hooks changed" in reason for reason in outer.unknown.values())
    clamped = [c for c in lens.hook_calls if c.hook == "meta_w"]
    if kind == "clamp":
        assert any(c.modified for c in clamped) and all(float(c.grad_out.abs().max()) <= 0.5 for c in clamped)


# --- 3. Hessian-vector products: autograd.grad twice, a differentiable grad_outputs -------------------------------

def hvp(kind: str):
    """The gradient with create_graph=True, then its product with v by autograd.grad twice (``(g * v).sum()`` with
    retain_graph, and ``grad_outputs=v``), hooks on an intermediate (``modify``: tripling its gradient, in the first
    pass only: the later passes run through the graph it helped build) and on x; ``v_leaf``: v requires grad too and
    a backward through the product reaches it, where its hook doubles its gradient."""
    def program(run):
        torch.manual_seed(1)
        x = torch.randn(4, requires_grad=True)
        v = torch.randn(4, requires_grad=kind == "v_leaf")
        name(run, x=x, **({"v": v} if kind == "v_leaf" else {}))
        y = x.sin() * x
        if run.hooked:
            y.register_hook(run.H("y", (lambda g: g * 3) if kind == "modify" else (lambda g: None), target="mul"))
            x.register_hook(run.H("x", lambda g: None))
            if kind == "v_leaf":
                v.register_hook(run.H("v", lambda g: g * 2))
        (g,) = run.grad(y.sum(), [x], create_graph=True)
        returned(run, [g])
        if kind == "v_leaf":
            (hv,) = run.grad(g, [x], grad_outputs=v, create_graph=True)
            returned(run, [hv])
            run.backward(hv.pow(2).sum())
            run.record({"x": x.grad, "v": v.grad})
            return hv.detach()
        (first,) = run.grad((g * v).sum(), [x], retain_graph=True)
        returned(run, [first])
        (second,) = run.grad(g, [x], grad_outputs=v)
        returned(run, [second])
        return first, second
    return program


@pytest.mark.parametrize("kind", ["observe", "modify", "v_leaf"])
def test_hessian_vector_products_against_torch(kind):
    lens, plain = check_mixed(hvp(kind))
    assert [[(c.hook, c.invocation) for c in p.hook_calls] for p in lens.passes] == \
        ([[("y", 1), ("x", 1)], [("x", 2)], [("v", 1), ("x", 3)]] if kind == "v_leaf" else
         [[("y", 1), ("x", 1)], [("x", 2)], [("x", 3)]])
    if kind != "v_leaf":
        first, second = plain.out
        assert torch.allclose(first, second)
        assert all(bool(p.unknown) == (kind == "modify") for p in lens.passes[1:])


# --- 4. backward(create_graph=True), then a penalty on .grad; a hook whose result has a graph ---------------------

def gradient_norm_penalty(kind: str):
    """Gradient-norm regularization written with .grad: backward(create_graph=True), then the squared norm of every
    parameter's .grad backpropagated to the parameters (inputs=...), two optimizer steps; a full hook on the last
    Linear, a hook on the first weight (``modify``: doubling) and a post-accumulate hook on its bias (``post``)."""
    def program(run):
        torch.manual_seed(7)
        model = nn.Sequential(nn.Linear(3, 3), nn.Softplus(), nn.Linear(3, 1))
        name(run, model=model)
        x, y = torch.randn(6, 3), torch.randn(6, 1)
        if run.hooked:
            model[0].weight.register_hook(run.H("w0", (lambda g: g * 2) if kind == "modify" else (lambda g: None)))
            model[2].register_full_backward_hook(run.H("last", lambda m, gi, go: None, lambda a: a[1]))
            if kind == "post":
                model[0].bias.register_post_accumulate_grad_hook(run.H("post", lambda p: None, lambda a: a[0].grad))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(2):
            opt.zero_grad()
            run.backward(F.mse_loss(model(x), y), create_graph=True)
            run.record({f"model.{n}": p.grad for n, p in model.named_parameters()})
            run.backward(sum(p.grad.pow(2).sum() for p in model.parameters()), inputs=list(model.parameters()))
            run.record({f"model.{n}": p.grad for n, p in model.named_parameters()})
            for p in model.parameters():
                p.grad = p.grad.detach()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    return program


def hooked_gradient(kind: str):
    """A hook in a create_graph pass returning ``g * s`` (s a leaf: the gradient's graph now goes through s), then a
    backward of the gradient's squared norm (``hook_g``: with a hook on the gradient itself, halving)."""
    def program(run):
        torch.manual_seed(8)
        x, s = torch.randn(4, requires_grad=True), torch.full((2,), 1.5, requires_grad=True)
        name(run, x=x, s=s)
        y = x.exp()
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g * s[0], target="exp"))
        (g,) = run.grad((y * y).sum(), [x], create_graph=True)
        returned(run, [g])
        if run.hooked and kind == "hook_g":
            g.register_hook(run.H("g", lambda gg: gg * 0.5))
        run.backward(g.pow(2).sum())
        run.record({"x": x.grad, "s": s.grad})
        return g.detach()
    return program


class Cube(torch.autograd.Function):
    """x³ with a backward written in differentiable ops: a create_graph pass runs it with grad mode on."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x ** 2


def custom_twice(kind: str):
    """Double backward through a custom autograd.Function (its Python backward builds the gradient's graph), a hook on
    its output (``modify``: doubling, in the grad pass)."""
    def program(run):
        x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
        name(run, x=x)
        y = Cube.apply(x * 2)
        if run.hooked:
            y.register_hook(run.H("y", (lambda g: g * 2) if kind == "modify" else (lambda g: None)))
        (g,) = run.grad(y.sum(), [x], create_graph=True)
        returned(run, [g])
        run.backward(g.pow(2).sum())
        run.record({"x": x.grad})
        return g.detach()
    return program


def checkpointed_twice(run):
    """A non-reentrant checkpointed block, its input gradient with create_graph=True (the block is recomputed), then
    a backward through that gradient (recomputed again); a hook doubling the block's weight gradient, one on x."""
    torch.manual_seed(14)
    inner, outer = nn.Linear(3, 4), nn.Linear(4, 1)
    x = torch.randn(5, 3, requires_grad=True)
    name(run, inner=inner, outer=outer, x=x)
    if run.hooked:
        inner.weight.register_hook(run.H("w1", lambda g: g * 2))
        x.register_hook(run.H("x", lambda g: None))
    h = checkpoint(lambda v: torch.tanh(inner(v)), x, use_reentrant=False)
    (gx,) = run.grad(outer(h).sum(), [x], create_graph=True)
    returned(run, [gx])
    run.backward(gx.pow(2).sum())
    run.record(dict({f"{m}.{n}": p.grad for m, module in (("inner", inner), ("outer", outer))
                     for n, p in module.named_parameters()}, x=x.grad))
    return gx.detach()


def through_an_edge(run):
    """autograd.grad with respect to a GradientEdge (the sin's output edge) with create_graph=True, a hook doubling
    that tensor's gradient, then a backward through the result (the hook fires again)."""
    torch.manual_seed(20)
    x = torch.randn(3, requires_grad=True)
    name(run, x=x)
    h = x.sin()
    if run.hooked:
        h.register_hook(run.H("h", lambda g: g * 2, target="sin"))
    (gh,) = run.grad((h * h.exp()).sum(), [torch.autograd.graph.get_gradient_edge(h)], create_graph=True)
    returned(run, [gh])
    run.backward(gh.sum())
    run.record({"x": x.grad})
    return gh.detach()


def module_hooks_twice(run):
    """A full backward pre-hook doubling the Sigmoid's grad_output and a full hook on it, in a grad pass with
    create_graph=True (the input gradient's graph is built from the doubled gradient) and in the backward through it
    (beside the output's own mean), where both fire once more."""
    torch.manual_seed(12)
    net = nn.Sequential(nn.Linear(2, 3), nn.Sigmoid(), nn.Linear(3, 1))
    x = torch.randn(4, 2, requires_grad=True)
    name(run, net=net, x=x)
    if run.hooked:
        net[1].register_full_backward_pre_hook(run.H("pre", lambda m, go: (go[0] * 2,), lambda a: a[1]))
        net[1].register_full_backward_hook(run.H("full", lambda m, gi, go: None, lambda a: a[1]))
    out = net(x)
    (gx,) = run.grad(out.sum(), [x], create_graph=True)
    returned(run, [gx])
    run.backward(gx.pow(2).sum() + out.mean())
    run.record(dict({f"net.{n}": p.grad for n, p in net.named_parameters()}, x=x.grad))
    return gx.detach()


@pytest.mark.parametrize("program", [gradient_norm_penalty("modify"), gradient_norm_penalty("post"),
                                     hooked_gradient("plain"), hooked_gradient("hook_g"), custom_twice("observe"),
                                     custom_twice("modify"), checkpointed_twice, through_an_edge, module_hooks_twice],
                         ids=["penalty_modify", "penalty_post", "hooked_gradient", "hooked_gradient_hook_g",
                              "custom_function", "custom_function_modify", "checkpointed", "gradient_edge",
                              "module_pre_hook"])
def test_gradients_of_gradients_against_torch(program):
    with warnings.catch_warnings():  # (backward(create_graph=True) warns of a reference cycle)
        warnings.simplefilter("ignore")
        lens, plain = check_mixed(program)
    if program.__qualname__.startswith("hooked_gradient"):
        second = lens.passes[1]
        assert set(second.unknown) == {"x", "s"}  # s's gradient exists only because of the hook
        assert plain.per[1]["s"] is not None and run(program, "nohook").per[1]["s"] is None
        y_calls = [c for c in lens.hook_calls if c.hook == "y"]
        assert [c.invocation for c in y_calls] == [1, 2] and all(c.modified for c in y_calls)
    elif program.__qualname__.startswith("custom_twice"):
        grad_pass, second = lens.passes
        assert [c.hook for c in grad_pass.hook_calls] == ["y"] and not second.hook_calls
        assert bool(second.unknown) == grad_pass.hook_calls[0].modified  # the graph of g went through the hook's
    elif program is through_an_edge:  # the edge's own tensor hook fires in both passes; x is left out of the first
        assert [[(c.hook, c.invocation) for c in p.hook_calls] for p in lens.passes] == [[("h", 1)], [("h", 2)]]
        assert {name: r.code for name, r in lens.passes[0].unreached.items()} == {"x": "excluded"}
        assert set(lens.passes[1].unknown) == {"x"}
    elif program is module_hooks_twice:  # pre then full, in each pass; the second pass's graph came from the pre-hook
        assert [[(c.hook, c.invocation) for c in p.hook_calls] for p in lens.passes] == \
            [[("pre", 1), ("full", 1)], [("pre", 2), ("full", 2)]]
        for p in lens.passes:  # the full hook's grad_output is what the pre-hook returned, twice what it received
            pre, full = p.hook_calls
            assert torch.equal(full.context[0], pre.grad_out[0]) and torch.equal(pre.grad_out[0], pre.grad_in[0] * 2)
        assert set(lens.passes[1].unknown) == {"net.0.weight", "net.0.bias", "net.2.weight", "x"}
    elif program is checkpointed_twice:  # w1 fires in the second pass only (the first differentiates x alone)
        assert [[c.hook for c in p.hook_calls] for p in lens.passes] == [["x"], ["x", "w1"]]
        assert {name: reason.code for name, reason in lens.passes[1].unreached.items()} == {"outer.bias": "not_on_path"}


# --- 5. complex tensors ---------------------------------------------------------------------------------------------

def complex_program(kind: str):
    """Complex leaves z, w: ``p = z * conj(w)``, a loss of |p|² and Re(p) (``view_as_real``: of p's real view), a hook
    on p (``modify``: times 1j) and on z; torch's gradients are the conjugate Wirtinger ones."""
    def program(run):
        torch.manual_seed(3)
        z = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
        w = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
        name(run, z=z, w=w)
        p = z * w.conj()
        if run.hooked:
            p.register_hook(run.H("p", (lambda g: g * 1j) if kind == "modify" else (lambda g: None), target="mul"))
            z.register_hook(run.H("z", lambda g: None))
        if kind == "view_as_real":
            out = torch.view_as_real(p).pow(2).sum()
        else:
            out = (p.abs() ** 2).sum() + p.real.sum()
        run.backward(out)
        run.record({"z": z.grad, "w": w.grad})
        return z.grad, w.grad
    return program


@pytest.mark.parametrize("kind", ["observe", "modify", "view_as_real"])
def test_complex_gradients_against_torch(kind):
    lens, plain = check_mixed(complex_program(kind), drawing=False)
    (p,) = lens.passes
    calls = p.hook_calls
    assert [c.hook for c in calls] == ["p", "z"] and calls[0].modified == (kind == "modify")
    assert calls[0].grad_in.is_complex() and calls[1].grad_in.is_complex()


def complex_paths(warn_filter: str):
    """Paths to complex leaves under ``Lens(why=True)``; a one-element graph whose path goes through conj and abs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(warn_filter)
        torch.manual_seed(0)
        z = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
        w = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
        a = torch.tensor(1 + 2j, requires_grad=True)
        b = torch.tensor(0.5 - 1j, requires_grad=True)
        with al.Lens(names={"z": z, "w": w, "a": a, "b": b}, why=True) as lens:
            ((z.conj() * w + z * 3).abs() ** 2).sum().backward()
            ((a.conj() * b).abs() + (a * b).abs() * 2).backward()
    return lens, [str(w.message) for w in caught], {"z": z.grad, "w": w.grad, "a": a.grad, "b": b.grad}


def test_paths_to_complex_leaves_warn_nothing_and_add_up_to_torch():
    """Was false: ``Lens(why=True)`` ordered each leaf's paths by ``value.double().norm()``, which on a complex tensor
    shows the user a ``UserWarning: Casting complex values to real discards the imaginary part`` (the lens changed the
    program's warnings) and orders by the real parts only; and a one-element complex graph had no paths ("unknown:
    value cannot be converted to type double"): its local derivatives were read with float(), where conj's vector-
    Jacobian product is no product by a number anyway.  Fixed in debug/paths.py: ordered by |value|, and factors
    only along real one-element graphs (a complex path's contribution is the chain of backward calls, as for any
    tensor)."""
    lens, caught, grads = complex_paths("always")
    assert caught == []
    for index, names in ((0, ("z", "w")), (1, ("a", "b"))):
        for leaf in names:
            paths = lens.paths_to(leaf, index)
            assert paths.known, paths.unknown
            assert torch.allclose(paths.total, grads[leaf]), (leaf, paths.total, grads[leaf])
            uses = {"z": 2, "w": 1, "a": 2, "b": 2}[leaf]  # (z: in conj(z) * w and in z * 3)
            assert paths.count == len(paths.paths) == uses and all(not path.factors for path in paths.paths)
            assert torch.allclose(sum(path.contribution for path in paths.paths), grads[leaf])


# --- 6. retain_graph: several backward() calls on one graph, then a sum of losses sharing it ------------------------

def retained(kind: str):
    """Three backward() calls of one loss with retain_graph (.grad accumulates), then of the sum of two losses sharing
    the subgraph, then autograd.backward of both as a list (which frees it); hooks: on the shared tanh (``modify``:
    adding 1), a full hook on the Linear registered after its forward (it never fires), a post-accumulate hook on its
    weight, and a hook removed after the second pass."""
    def program(run):
        torch.manual_seed(2)
        lin = nn.Linear(3, 2)
        x = torch.randn(4, 3, requires_grad=True)
        name(run, lin=lin, x=x)
        h = torch.tanh(lin(x))
        handle = None
        if run.hooked:
            h.register_hook(run.H("h", (lambda g: g + 1) if kind == "modify" else (lambda g: None), target="tanh"))
            lin.register_full_backward_hook(run.H("lin", lambda m, gi, go: None, lambda a: a[1]))
            lin.weight.register_post_accumulate_grad_hook(run.H("post", lambda p: None, lambda a: a[0].grad))
            handle = x.register_hook(run.H("x_once", lambda g: g * 0.5))
        first, second = h.pow(2).sum(), h.abs().mean()
        for number in range(3):
            run.backward(first, retain_graph=True)
            run.record({"lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad, "x": x.grad})
            if number == 1 and handle is not None:
                handle.remove()
        run.backward(first + second, retain_graph=True)
        run.record({"lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad, "x": x.grad})
        run.backward([first, second])
        run.record({"lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad, "x": x.grad})
        return [value.clone() for value in (lin.weight.grad, lin.bias.grad, x.grad)]
    return program


@pytest.mark.parametrize("kind", ["observe", "modify"])
def test_retained_graph_passes_against_torch(kind):
    lens, plain = check_mixed(retained(kind))
    assert len(lens.passes) == 5
    for index, p in enumerate(lens.passes):
        calls = [(c.hook, c.invocation) for c in p.hook_calls]
        once = [("x_once", index + 1)] if index < 2 else []
        assert calls == [("h", index + 1)] + once + [("post", index + 1)], calls
        before = views_for(lens.passes)[index].steps[0].lines
        assert any("x: tensor hook x_once" in line for line in before) == (index < 2)  # removed after pass 2
        # the full hook was registered after the forward: torch put no boundary around that call, it never fires
        assert [line for line in before if line.startswith("(lin: ")] == [
            "(lin: module backward hooks that do not fire in this pass: torch made no hook boundary for it in this "
            "graph (it puts them around a forward call made after the hooks were registered, on the tensors or tuple "
            "of tensors it returns).)"]


# --- 7. the warning backward(create_graph=True) shows is no hook ----------------------------------------------------

def create_graph_twice():
    x = torch.tensor([1.0, 2.0, -1.5], requires_grad=True)
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once a process (TORCH_WARN_ONCE): shown as the first time
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with al.Lens(names={"x": x}) as lens:
                (x ** 3).sum().backward(create_graph=True)
                first = x.grad
                x.grad = None
                first.sum().backward()
    finally:
        torch.set_warn_always(always)
    return lens, x.grad, first.detach(), [str(w.message)[:40] for w in caught]


def test_the_warning_of_a_create_graph_backward_is_not_a_hook():
    """False: ``loss.backward(create_graph=True)`` makes torch warn of a reference cycle (shown once a session, or each
    time under "always"); a second backward through the gradient's graph then said of x "Without the hooks: unknown,
    because PowBackward0 was made by pass 1 (create_graph=True) while hooks changed or replaced gradients" in a program
    with no hook at all (x.grad is the same without hooks: there are none).  Fixed in capture/calls.py (_foreign:
    the standard library's code activates no replay); pass 1's note says only that the standard library ran."""
    lens, grad, first, caught = create_graph_twice()
    assert caught == ["Using backward() with create_graph=True "]  # torch's, shown to the user as without the lens
    assert torch.equal(first, torch.tensor([3.0, 12.0, 6.75])) and torch.equal(grad, torch.tensor([6.0, 12.0, -9.0]))
    second = lens.passes[1]
    assert second.unknown == {} and torch.equal(second.grads_without_hooks["x"], grad)
    [said] = [n for n in lens.passes[0].notes if "called by torch's C++ side" in n]
    assert said.startswith("Python's standard library ran during this pass, called by torch's C++ side (torch "
                           "showing a warning, say: ") and said.endswith("it is not a step"), said

