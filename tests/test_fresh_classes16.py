"""Fresh eyes on custom ``torch.autograd.Function``s with hooks, as practitioners write them (helper ``fresh18``,
2026-11-28): ``ctx.save_for_backward`` of inputs and outputs, ``ctx.mark_dirty`` (an in-place op),
``ctx.mark_non_differentiable`` (an argmax-like second output), ``ctx.set_materialize_grads(False)`` (backward
receives None and returns None), ``@once_differentiable``, the ``setup_context`` style with non-tensor arguments, a
backward that calls another Function or ``torch.autograd.grad`` (nested), a straight-through sign, a Function used
twice in one graph, and tensor hooks on its inputs and outputs with node pre-hooks and post-hooks on its ``grad_fn``
that change gradients.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py), then through :func:`check` of tests/test_fresh_classes10.py (the cards, the drawing
and the notes against torch); each also counts the calls of its Functions' forward and backward (``run.calls``: the
lens must not change them).  One behaviour was wrong and is fixed: an in-place Function on a *view* runs inside torch's
C++ CopySlices node, which the lens ran again for "without hooks", calling the user's backward a second time
(:func:`test_an_in_place_function_on_a_view_is_not_run_again`; capture/calls.py, observe.py, unhooked.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.autograd.function import once_differentiable
import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import DoubleExp  # noqa: E402  (the differential harness)
from test_fresh_classes10 import check, name  # noqa: E402  (cards, drawing)

CALLS = [None]  # the running program's call counter (run.calls)


def count(what: str) -> None:
    CALLS[0][what] += 1


# --- the Functions --------------------------------------------------------------------------------------------------

class ScaledExp(torch.autograd.Function):
    """exp(x) * w: saves an input and its output."""
    @staticmethod
    def forward(ctx, x, w):
        count("ScaledExp.forward")
        out = x.exp() * w
        ctx.save_for_backward(w, out)
        return out

    @staticmethod
    def backward(ctx, g):
        count("ScaledExp.backward")
        w, out = ctx.saved_tensors
        return g * out, g * out / w


class DoubleInPlace(torch.autograd.Function):
    """x.mul_(2) in place, marked dirty."""
    @staticmethod
    def forward(ctx, x):
        count("DoubleInPlace.forward")
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        count("DoubleInPlace.backward")
        return g * 2


class MaxWithIndex(torch.autograd.Function):
    """Row maxima and their indices (non-differentiable)."""
    @staticmethod
    def forward(ctx, x):
        count("MaxWithIndex.forward")
        values, index = x.max(dim=1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return values, index

    @staticmethod
    def backward(ctx, g, g_index):
        count("MaxWithIndex.backward")
        (index,) = ctx.saved_tensors
        out = g.new_zeros(ctx.shape)
        out.scatter_(1, index.unsqueeze(1), g.unsqueeze(1))
        return out


class SplitScale(torch.autograd.Function):
    """(x * a, x * b) with set_materialize_grads(False): backward gets None for an unused output; None for b."""
    @staticmethod
    def forward(ctx, x, a, b, scale: float):
        count("SplitScale.forward")
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return x * a * scale, x * b

    @staticmethod
    def backward(ctx, ga, gb):
        count("SplitScale.backward")
        a, b = ctx.saved_tensors
        gx = None
        if ga is not None:
            gx = ga * a * ctx.scale
        if gb is not None:
            gx = gb * b if gx is None else gx + gb * b
        return gx, None, None, None


class Cube(torch.autograd.Function):
    """x ** 3 with @once_differentiable."""
    @staticmethod
    def forward(ctx, x):
        count("Cube.forward")
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        count("Cube.backward")
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class Affine(torch.autograd.Function):
    """The setup_context style: (x @ w + bias * shift, x.sum(1)) with a float and a bool argument."""
    @staticmethod
    def forward(x, w, bias, shift: float, relu: bool):
        count("Affine.forward")
        y = x @ w + bias * shift
        return (y.clamp(min=0) if relu else y), x.sum(1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, bias, shift, relu = inputs
        ctx.save_for_backward(x, w, output[0])
        ctx.shift, ctx.relu = shift, relu

    @staticmethod
    def backward(ctx, gy, gs):
        count("Affine.backward")
        x, w, y = ctx.saved_tensors
        if ctx.relu:
            gy = gy * (y > 0)
        gx = gy @ w.t() + gs.unsqueeze(1).expand_as(x)
        return gx, x.t() @ gy, gy.sum(0) * ctx.shift, None, None


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        count("Square.forward")
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        count("Square.backward")
        (x,) = ctx.saved_tensors
        return Twice.apply(x) * g  # another Function inside backward


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        count("Twice.forward")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        count("Twice.backward")
        return g * 2


class TanhByGrad(torch.autograd.Function):
    """tanh whose backward recomputes the forward under grad mode and calls torch.autograd.grad (nested)."""
    @staticmethod
    def forward(ctx, x):
        count("TanhByGrad.forward")
        ctx.save_for_backward(x)
        return x.tanh()

    @staticmethod
    def backward(ctx, g):
        count("TanhByGrad.backward")
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (gx,) = torch.autograd.grad(x.tanh(), x, g)
        return gx


class SignSTE(torch.autograd.Function):
    """sign forward, identity backward clipped to |x| <= 1 (the straight-through estimator of BinaryConnect)."""
    @staticmethod
    def forward(ctx, x):
        count("SignSTE.forward")
        ctx.save_for_backward(x)
        return x.sign()

    @staticmethod
    def backward(ctx, g):
        count("SignSTE.backward")
        (x,) = ctx.saved_tensors
        return g * (x.abs() <= 1)


# --- the programs ---------------------------------------------------------------------------------------------------

def saved_io(kind: str):
    """ScaledExp with a tensor hook on its output and on its input x, and a node pre-hook (``pre``) or post-hook
    (``post``) on its grad_fn that changes a gradient; two passes (retain_graph), .grad accumulating."""
    def program(run):
        CALLS[0] = run.calls
        x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
        w = torch.tensor([1.5, 2.0, -0.5], requires_grad=True)
        name(run, x=x, w=w)
        h = x * 1.0
        out = ScaledExp.apply(h, w)
        if run.hooked:
            out.register_hook(run.H("out", lambda g: g * 3))
            h.register_hook(run.H("h", lambda g: None if g is None else g + 1))  # None: "both"
            if kind == "pre":
                out.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] - 0.5,)))
            elif kind == "post":
                out.grad_fn.register_hook(run.H("post", lambda gi, go: (gi[0], gi[1] * 0.25)))
            else:  # both, and an observing post-hook
                out.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * 2,)))
                out.grad_fn.register_hook(run.H("post", lambda gi, go: (None, gi[1].neg())))
                out.grad_fn.register_hook(run.H("look", lambda gi, go: None))
        loss = (out * torch.tensor([1.0, 2.0, 3.0])).sum()
        for _ in range(2):
            run.backward(loss, retain_graph=True)
            run.record({k: v.grad for k, v in (("x", x), ("w", w)) if v.grad is not None})
        return out.detach()
    return program


def dirty(kind: str):
    """DoubleInPlace (mark_dirty) on a clone of a leaf, hooks on the clone before the op and on the result after; or
    on a row or a column of the clone (``row``, ``column``: a view, so torch's CopySlices node wraps its node)."""
    def program(run):
        CALLS[0] = run.calls
        x = torch.tensor([[1.0, -2.0], [3.0, 0.5]], requires_grad=True)
        name(run, x=x)
        y = x.clone()
        if run.hooked and kind == "before":
            y.register_hook(run.H("before", lambda g: g * 10))  # sees the gradient of the old version
        z = DoubleInPlace.apply({"row": y[0], "column": y[:, 1:]}.get(kind, y))
        if run.hooked:
            z.register_hook(run.H("after", lambda g: g + 1))
            if kind in ("row", "column"):
                y.register_hook(run.H("y", lambda g: g * 3))
            else:
                z.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * -1,)))
        run.backward((y * y).sum())
        run.record({"x": x.grad})
        return y.detach()
    return program


def argmax_like(run):
    """MaxWithIndex: the values get a hook, the indices are used to gather from another leaf."""
    CALLS[0] = run.calls
    x = torch.tensor([[1.0, 5.0, 2.0], [4.0, -1.0, 3.0]], requires_grad=True)
    table = torch.tensor([10.0, 20.0, 30.0], requires_grad=True)
    name(run, x=x, table=table)
    values, index = MaxWithIndex.apply(x)
    if run.hooked:
        values.register_hook(run.H("values", lambda g: g * 2))
        values.grad_fn.register_hook(run.H("post", lambda gi, go: (gi[0] + 0.5,)))
    run.backward((values * table[index]).sum())
    run.record({"x": x.grad, "table": table.grad})
    return values.detach(), index


def unmaterialized(kind: str):
    """SplitScale: only one output used (``first``/``second``) or both; backward gets None and returns None."""
    def program(run):
        CALLS[0] = run.calls
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        a = torch.tensor([3.0, -1.0], requires_grad=True)
        b = torch.tensor([0.5, 4.0], requires_grad=True)
        name(run, x=x, a=a, b=b)
        p, q = SplitScale.apply(x, a, b, 0.5)
        if run.hooked:
            p.register_hook(run.H("p", lambda g: None if g is None else g * 4))  # None: the output is unused
            q.register_hook(run.H("q", lambda g: None if g is None else g - 1))
            p.grad_fn.register_prehook(run.H("pre", lambda go: go))
        roots = {"first": p.sum(), "second": (q * q).sum(), "both": (p * q).sum()}[kind]
        run.backward(roots)
        run.record({k: v.grad for k, v in (("x", x), ("a", a), ("b", b)) if v.grad is not None})
        return p.detach(), q.detach()
    return program


def once(run):
    """Cube with @once_differentiable, used twice in one graph (two nodes), a hook on each output and on the input."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, -0.5, 2.0], requires_grad=True)
    name(run, x=x)
    c1 = Cube.apply(x)
    c2 = Cube.apply(x * 2)
    if run.hooked:
        c1.register_hook(run.H("c1", lambda g: g * 0.5))
        c2.register_hook(run.H("c2", lambda g: g + 2))
        x.register_hook(run.H("x", lambda g: g.clamp(-5, 5)))
        c2.grad_fn.register_hook(run.H("post", lambda gi, go: (gi[0] * 3,)))
    run.backward((c1 + c2 * c1).sum())
    run.record({"x": x.grad})
    return c1.detach(), c2.detach()


def new_style(kind: str):
    """Affine (setup_context, a float and a bool argument, two outputs) in a tiny model, three SGD steps."""
    def program(run):
        CALLS[0] = run.calls
        torch.manual_seed(0)
        w = nn.Parameter(torch.randn(3, 2))
        bias = nn.Parameter(torch.randn(2))
        x = torch.randn(4, 3, requires_grad=True)
        name(run, w=w, bias=bias, x=x)
        opt = torch.optim.SGD([w, bias], lr=0.1)
        if run.hooked:
            w.register_hook(run.H("w", lambda g: g * 0.5))
        for _ in range(3):
            opt.zero_grad()
            x.grad = None
            y, s = Affine.apply(x, w, bias, 2.0, kind == "relu")
            if run.hooked:
                y.register_hook(run.H("y", lambda g: g.flip(0)))
                y.grad_fn.register_prehook(run.H("pre", lambda go: (go[0], go[1] * 0.1)))
            run.backward(y.pow(2).sum() + s.sum())
            run.record({"w": w.grad, "bias": bias.grad, "x": x.grad})
            opt.step()
        return w.detach().clone(), bias.detach().clone()
    return program


def nested(kind: str):
    """Square whose backward calls Twice.apply, or TanhByGrad whose backward calls torch.autograd.grad; hooks
    around."""
    def program(run):
        CALLS[0] = run.calls
        x = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
        name(run, x=x)
        h = x * 1.5
        y = (Square if kind == "function" else TanhByGrad).apply(h)
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g * 2))
            h.register_hook(run.H("h", lambda g: g - 0.25))
            y.grad_fn.register_hook(run.H("post", lambda gi, go: (gi[0] * 1.5,)))
        run.backward((y * torch.tensor([1.0, 2.0, 3.0])).sum())
        run.record({"x": x.grad})
        return y.detach()
    return program


def ste(run):
    """SignSTE on weights (BinaryConnect): a tiny linear model trained two steps, a hook on the binarized weight."""
    CALLS[0] = run.calls
    torch.manual_seed(1)
    lin = nn.Linear(3, 2)
    x = torch.randn(5, 3)
    name(run, lin=lin)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        wb = SignSTE.apply(lin.weight)
        if run.hooked:
            wb.register_hook(run.H("wb", lambda g: g * 2))
        run.backward(torch.nn.functional.linear(x, wb, lin.bias).pow(2).mean())
        run.record({f"lin.{n}": p.grad for n, p in lin.named_parameters()})
        opt.step()
    return [p.detach().clone() for p in lin.parameters()]


# --- more of the same: dtype cast, in-place edit in backward, needs_input_grad, unused outputs ---------------------

class Cast(torch.autograd.Function):
    """x * 3 computed in float64 (as mixed-precision ops do, setup_context style) whose backward returns float64:
    the engine casts it to the input's float32."""
    @staticmethod
    def forward(x):
        count("Cast.forward")
        return (x.double() * 3).float()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, g):
        count("Cast.backward")
        return g.double() * 3  # float64 for a float32 input (ctx.dtype): the engine casts it


def cast(run):
    """Cast with a tensor hook on its output and an observing node post-hook."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    name(run, x=x)
    y = Cast.apply(x * 1)
    if run.hooked:
        y.register_hook(run.H("y", lambda g: g * 2))
        y.grad_fn.register_hook(run.H("post", lambda gi, go: None))
    run.backward((y * y).sum())
    run.record({"x": x.grad})
    return y.detach()


class EditInPlace(Twice):
    """Twice whose backward doubles the gradient it received in place and returns it."""
    @staticmethod
    def backward(ctx, g):
        count("EditInPlace.backward")
        g.mul_(2)  # edits what it received in place
        return g


def edit(run):
    """EditInPlace beside another use of its input, hooks on its output and input."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    name(run, x=x)
    h = x * 1
    a = EditInPlace.apply(h)
    b = h * 5
    if run.hooked:
        a.register_hook(run.H("a", lambda g: g + 1))
        h.register_hook(run.H("h", lambda g: g * 3))
    run.backward((a * torch.tensor([1.0, 2.0]) + b).sum())
    run.record({"x": x.grad})
    return a.detach()


class WithInfo(torch.autograd.Function):
    """(x * w * k, k + 1): a non-tensor output; backward reads ctx.needs_input_grad."""
    @staticmethod
    def forward(ctx, x, w, k: int):
        count("WithInfo.forward")
        ctx.save_for_backward(x, w)
        ctx.k = k
        return x * w * k, k + 1

    @staticmethod
    def backward(ctx, g, _):
        count("WithInfo.backward")
        x, w = ctx.saved_tensors
        return (g * w * ctx.k if ctx.needs_input_grad[0] else None,
                g * x * ctx.k if ctx.needs_input_grad[1] else None, None)


def info(run):
    """WithInfo on an input that needs no gradient; a hook using the int output, a node pre-hook."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, 2.0])
    w = torch.tensor([0.5, -1.0], requires_grad=True)  # x needs no gradient: needs_input_grad
    name(run, w=w)
    y, k = WithInfo.apply(x, w, 3)
    if run.hooked:
        y.register_hook(run.H("y", lambda g: g * k))
        y.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] + 1, go[1])))
    run.backward(y.sum())
    run.record({"w": w.grad})
    return y.detach()


def unused_materialized(run):
    """Functions with an unused output (materialized as zeros for backward, None for the hooks before it)."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    name(run, x=x)
    p, q = MaxWithIndex.apply(torch.stack([x, x * 2]))
    a, b = DoubleExp.apply(x)
    if run.hooked:
        b.register_hook(run.H("b", lambda g: g))
        a.register_hook(run.H("a", lambda g: g * 2))
        a.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * 2, go[1])))
    run.backward(a.sum() + p.sum())
    run.record({"x": x.grad})
    return a.detach()


def twice_pre(run):
    """ScaledExp used twice (chained, sharing w): a node pre-hook on each node, a hook on w."""
    CALLS[0] = run.calls
    x = torch.tensor([1.0, -0.5, 2.0], requires_grad=True)
    w = torch.tensor([2.0, 1.0, 0.5], requires_grad=True)
    name(run, x=x, w=w)
    a = ScaledExp.apply(x, w)
    b = ScaledExp.apply(a * 0.1, w)
    if run.hooked:
        for t, n in ((a, "a"), (b, "b")):
            t.grad_fn.register_prehook(run.H("pre" + n, lambda go: (go[0] * 2,)))
        w.register_hook(run.H("w", lambda g: g - 1))
    run.backward((a + b).sum())
    run.record({"x": x.grad, "w": w.grad})
    return b.detach()


def hessian_vector(run):
    """ScaledExp's backward is differentiable: autograd.grad with create_graph=True (a hook and a node pre-hook on its
    output), then a backward of the gradient, which runs ScaledExpBackward again (through its saved output)."""
    CALLS[0] = run.calls
    x = torch.tensor([0.3, -1.0, 2.0], requires_grad=True)
    name(run, x=x)
    y = ScaledExp.apply(x * 1, torch.tensor([1.0, 2.0, 3.0]))
    if run.hooked:
        y.register_hook(run.H("y", lambda g: g * 2))
        y.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] + 1,)))
    (g,) = run.grad(y.sum(), [x], create_graph=True)
    run.record({})
    run.backward((g * torch.tensor([1.0, 0.0, 2.0])).sum())
    run.record({"x": x.grad})
    return g.detach()


# --- the tests ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pre", "post", "both"])
def test_saved_inputs_and_outputs_with_node_hooks_against_torch(kind):
    lens, plain = check(saved_io(kind), {"x": "hook_none"} if kind == "both" else None, static=True)
    assert plain.calls == {"ScaledExp.forward": 1, "ScaledExp.backward": 2}


@pytest.mark.parametrize("kind", ["before", "after"])
def test_mark_dirty_against_torch(kind):
    check(dirty(kind), static=True)


def test_mark_non_differentiable_against_torch():
    check(argmax_like, static=True)


@pytest.mark.parametrize("kind", ["first", "second", "both"])
def test_materialize_grads_false_against_torch(kind):
    lens, plain = check(unmaterialized(kind), {"a": "unknown", "b": "unknown"}, static=True)  # backward: None
    for p in lens.passes:
        assert "splitscale sent it no gradient (None)" in p.unreached["a"].text


def test_once_differentiable_used_twice_against_torch():
    check(once, static=True)


@pytest.mark.parametrize("kind", ["linear", "relu"])
def test_setup_context_style_against_torch(kind):
    check(new_style(kind))


@pytest.mark.parametrize("kind", ["function", "autograd_grad"])
def test_nested_backward_against_torch(kind):
    check(nested(kind), static=True)


def test_straight_through_sign_against_torch():
    check(ste)


# --- was false: the lens ran a custom Function's backward again -----------------------------------------------------
# An in-place custom Function (mark_dirty) applied to a *view* puts its node inside torch's C++ CopySlices node; a
# hook below it changed a gradient, so the lens ran CopySlices again for "without hooks" (a C++ node, thought safe):
# that ran the user's backward a second time (DoubleInPlace.backward called twice under the lens, once plainly).

@pytest.mark.parametrize("kind", ["row", "column"])
def test_an_in_place_function_on_a_view_is_not_run_again(kind):
    lens, plain = check(dirty(kind), static=True)
    assert plain.calls == {"DoubleInPlace.forward": 1, "DoubleInPlace.backward": 1}
    (p,) = lens.passes
    assert p.grads_without_hooks["x"] is None and "Python" in p.unknown["x"]


def test_an_in_place_function_on_a_view_is_not_run_again_under_another_profiler():
    """With cProfile on, the lens cannot see which backward runs inside CopySlices: it runs no node again (a guard:
    passes on main's code too, where "without hooks" is unknown for every pass whose hook calls were not seen)."""
    import collections
    import cProfile

    import autograd_lens as al

    class Plain:
        hooked, calls = True, collections.Counter()

        @staticmethod
        def H(name, function, received=None, target=None):
            return function

        def backward(self, roots, **kwargs):
            torch.autograd.backward(roots, **kwargs)

        def record(self, grads):
            self.grads = {key: value.clone() for key, value in grads.items()}

    truth = Plain()
    truth.calls = collections.Counter()
    dirty("row")(truth)
    profiler, run = cProfile.Profile(), Plain()
    profiler.enable()
    try:
        with al.Lens() as lens:
            dirty("row")(run)
    finally:
        profiler.disable()
    assert run.calls == {"DoubleInPlace.forward": 1, "DoubleInPlace.backward": 1}
    assert torch.equal(run.grads["x"], truth.grads["x"]) and truth.calls == run.calls
    (p,) = lens.passes
    assert list(p.grads_without_hooks.values()) == [None] and "could not see" in next(iter(p.unknown.values()))


@pytest.mark.parametrize("program", [cast, edit, info, unused_materialized, twice_pre, hessian_vector],
                         ids=lambda p: p.__name__)
def test_more_custom_functions_against_torch(program):
    lens, plain = check(program, static=True)
    forward, backward, times = {"cast": ("Cast", "Cast", 1), "edit": ("Twice", "EditInPlace", 1),
                                "info": ("WithInfo", "WithInfo", 1), "twice_pre": ("ScaledExp", "ScaledExp", 2),
                                "unused_materialized": ("MaxWithIndex", "MaxWithIndex", 1),
                                "hessian_vector": ("ScaledExp", "ScaledExp", 1)}[program.__name__]
    twice = program is hessian_vector  # (its backward runs in both passes)
    assert plain.calls == {f"{forward}.forward": times, f"{backward}.backward": times * (1 + twice)}


# --- a custom Function's card: what its backward was called with ----------------------------------------------------

def test_a_function_card_says_its_backward_got_zeros_in_place_of_none():
    from autograd_lens.model import NodeRun
    from autograd_lens.views.passview import views_for
    from test_fresh_classes10 import named

    lens = named(unused_materialized)
    (p,) = lens.passes
    (view,) = views_for(lens.passes)
    cards = [" ".join(step.lines) for number, step in enumerate(view.steps) if 0 < number <= len(p.events)
             and isinstance(p.events[number - 1], NodeRun) and p.events[number - 1].name == "DoubleExpBackward"]
    assert cards and "It received [4.0, 4.0], None." in cards[0]  # the engine's view: true, and kept
    assert "zeros" in cards[0]  # what DoubleExp.backward(ctx, ga, gb) got: gb = tensor([0., 0.])
    assert "called with zeros where it received None (output 2 of 2)" in cards[0]


class TwoOut(torch.autograd.Function):
    """Two outputs; its backward logs what it was called with (GOT), materializing or not as asked."""

    @staticmethod
    def forward(ctx, x, materialize):
        ctx.set_materialize_grads(materialize)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        GOT.append(tuple(None if g is None else g.clone() for g in (ga, gb)))
        total = sum(g * k for g, k in zip((ga, gb), (2, 3)) if g is not None)
        return (total if isinstance(total, torch.Tensor) else None), None


GOT: list = []


@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("used", ["a", "b", "ab"])
def test_the_zeros_line_is_what_the_backward_was_called_with(materialize, used):
    """The card says the backward got zeros exactly where torch called it with a tensor in place of the engine's
    None, checked against what the backward itself logged, plainly and under the lens (same calls, same values)."""
    from autograd_lens.model import NodeRun
    from autograd_lens.views.passview import views_for

    def program():
        x = torch.tensor([1.0, -2.0], requires_grad=True)
        a, b = TwoOut.apply(x, materialize)
        sum(t.sum() for t, n in ((a, "a"), (b, "b")) if n in used).backward()
        return x.grad

    GOT.clear()
    plain_grad, plain_got = program(), list(GOT)
    GOT.clear()
    with al.Lens() as lens:
        lens_grad = program()
    assert torch.equal(plain_grad, lens_grad) and len(GOT) == len(plain_got) == 1
    assert all((g is None) == (h is None) and (g is None or torch.equal(g, h)) for g, h in zip(GOT[0], plain_got[0]))
    (p,) = lens.passes
    (view,) = views_for(lens.passes)
    (run,) = [e for e in p.events if isinstance(e, NodeRun) and e.name == "TwoOutBackward"]
    zeros = tuple(slot for slot, (engine, got) in enumerate(zip(run.grad_in, plain_got[0]))
                  if engine is None and got is not None)
    assert run.zeros == zeros and bool(zeros) == (materialize and used != "ab")
    card = " ".join(view.steps[p.events.index(run) + 1].lines)
    assert ("called with zeros" in card) == bool(zeros)
    if zeros:
        assert f"(output {zeros[0] + 1} of 2)" in card
