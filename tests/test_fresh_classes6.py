"""Fresh eyes (6) on the debugging answers: each class of programs is run plain and under a Lens, and what the lens
says (why a named tensor got no gradient, where NaN or inf started, which paths a gradient took) is compared with
what torch did.

* a value cut from autograd that the forward record loses (``w.item() * 2``, NumPy arithmetic, a list
  comprehension over ``.tolist()``, ``int(w.argmax())`` as an index) may still reach the graph: the lens said
  "nothing this pass differentiates was computed from it", false there; now "unknown", naming the cut;
* the causes the record does follow, and "not on the graph" where nothing was cut from the tensor;
* zeros from a hook are zeros (not "no gradient"), a module hook passing None is no gradient;
* the first non-finite step against node post-hooks in a plain run;
* the sum over paths against ``.grad`` (equal up to float rounding: the engine adds at shared nodes).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al

from test_debug import leaves, run as run_both


def run(program, why=True):
    """(plain namespace, lens namespace, lens), torch's warnings (torch.tensor of a tensor, float of one) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_both(program, why)


# ----------------------------------------------------------------------------- cuts the record loses

def item_arith(ns):
    x, = leaves(ns, "x")
    w, = leaves(ns, "w", size=1)
    (x * (w.item() * 2)).sum().backward()


def numpy_arith(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.tensor(w.detach().numpy() * 2)).sum().backward()


def tolist_comprehension(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.tensor([v * 2 for v in w.tolist()])).sum().backward()


def argmax_index(ns):
    x, w = leaves(ns, "x", "w")
    (x[w.argmax().item()] * 2).backward()


def argmax_of_computed_index(ns):
    x, w = leaves(ns, "x", "w")
    (x[int(w.abs().argmax())] * 2).backward()


def condition(ns):
    x, w = leaves(ns, "x", "w")
    (x * 3 if bool((w > 0).any()) else x * 2).sum().backward()


LOST = [(item_arith, ".item()"), (numpy_arith, ".detach() → .numpy()"), (tolist_comprehension, ".tolist()"),
        (argmax_index, "argmax"), (argmax_of_computed_index, "a tensor computed from it went through argmax"),
        (condition, "gt")]


@pytest.mark.parametrize("program, words", LOST, ids=[case[0].__name__ for case in LOST])
def test_a_cut_whose_value_the_record_loses_is_unknown_not_unused(program, words):
    """Before the fix: not_on_path, 'nothing this pass differentiates was computed from it ... no copy of it cut
    from autograd ... is used by the graph' (false for all but the condition, where w decided the branch)."""
    plain, traced, lens = run(program)
    assert plain["w"].grad is None and traced["w"].grad is None
    assert torch.equal(plain["x"].grad, traced["x"].grad)
    reason = lens.passes[0].unreached["w"]
    assert reason.code == "unknown", reason.text
    assert words in reason.text and "is not known" in reason.text, reason.text
    assert "nothing this pass differentiates" not in reason.text
    assert "x" not in lens.passes[0].unreached


# ----------------------------------------------------------------------------- causes the record follows

def unused(ns):
    x, w = leaves(ns, "x", "w")
    (x * 2).sum().backward()


def branch_not_taken(ns):
    x, w = leaves(ns, "x", "w")
    use_w = False
    (x * w if use_w else x * 2).sum().backward()


def float_cast(ns):
    x, = leaves(ns, "x")
    w, = leaves(ns, "w", size=1)
    (x * float(w)).sum().backward()


def rebuilt(ns):
    x, w = leaves(ns, "x", "w")
    (x * torch.tensor(w)).sum().backward()


def clone_under_no_grad(ns):
    x, w = leaves(ns, "x", "w")
    with torch.no_grad():
        c = w.clone()
    (x * c).sum().backward()


def set_grad_enabled(ns):
    x, w = leaves(ns, "x", "w")
    torch.set_grad_enabled(False)
    try:
        c = w * 3
    finally:
        torch.set_grad_enabled(True)
    (x * c).sum().backward()


def copy_into_buffer_under_no_grad(ns):
    x, w = leaves(ns, "x", "w")
    buffer = torch.zeros(3)
    with torch.no_grad():
        buffer.copy_(w)
    (x * buffer).sum().backward()


def where_mask(ns):
    x, w = leaves(ns, "x", "w")
    torch.where(w > 0, x, x * 2).sum().backward()


def boolean_index(ns):
    x, w = leaves(ns, "x", "w")
    x[w > 0].sum().backward()


def named_nonleaf_detached(ns):
    x, w = leaves(ns, "x", "w")
    ns["h"] = h = w * 2
    (x * h.detach()).sum().backward()


def detach_then_requires_grad(ns):
    x, w = leaves(ns, "x", "w")
    ns["v"] = v = w.detach().requires_grad_()
    (x * v).sum().backward()


def written_into_the_graph_under_no_grad(method):
    def program(ns):
        x, w = leaves(ns, "x", "w")
        h = x * 1
        with torch.no_grad():
            getattr(h, method)(w)  # h.add_(w), h.copy_(w)
        h.sum().backward()

    program.__name__ = f"{method}_into_the_graph_under_no_grad"
    return program


def setitem_of_a_view_taken_under_no_grad(ns):  # w[0] under no_grad is a view requiring grad, then * 2, then h[0] =
    x, w = leaves(ns, "x", "w")
    h = x * 1
    with torch.no_grad():
        h[0] = w[0] * 2
    h.sum().backward()


def setitem_of_a_detached_value(ns):
    x, w = leaves(ns, "x", "w")
    h = x * 1
    h[0] = w.detach()[0]
    h.sum().backward()


# before 6ece11a the four above were 'not_on_path: nothing this pass differentiates was computed from it'; before
# the fix after it, 'unknown' (the record lost where the value went: written in place, or through a view's cut)
FOLLOWED = [(written_into_the_graph_under_no_grad("add_"), "w", "no_grad", "w went through add_ under no_grad, and this graph"),
            (written_into_the_graph_under_no_grad("copy_"), "w", "no_grad", "w went through copy_ under no_grad, and this graph"),
            (setitem_of_a_view_taken_under_no_grad, "w", "no_grad", "__getitem__ under no_grad, and this graph"),
            (setitem_of_a_detached_value, "w", "detached", ".detach() → __getitem__, and this graph uses"),
            (unused, "w", "not_on_path", "not on the graph"),
            (branch_not_taken, "w", "not_on_path", "not on the graph"),
            (float_cast, "w", "detached", "float()"), (rebuilt, "w", "non_differentiable", "tensor"),
            (clone_under_no_grad, "w", "no_grad", "clone under no_grad"),
            (set_grad_enabled, "w", "no_grad", "mul under no_grad"),
            (copy_into_buffer_under_no_grad, "w", "no_grad", "copy_ under no_grad"),
            (where_mask, "w", "non_differentiable", "gt (its result is bool"),
            (boolean_index, "w", "non_differentiable", "gt (its result is bool"),
            (named_nonleaf_detached, "w", "detached", "a tensor computed from it went through .detach()"),
            (named_nonleaf_detached, "h", "detached", "h went through .detach()"),
            (detach_then_requires_grad, "w", "detached", "w went through .detach()")]


@pytest.mark.parametrize("program, name, code, words", FOLLOWED,
                         ids=[f"{case[0].__name__}-{case[1]}" for case in FOLLOWED])
def test_a_cut_the_record_follows_is_named(program, name, code, words):
    plain, traced, lens = run(program)
    assert plain["w"].grad is None and traced["w"].grad is None
    assert torch.equal(plain["x"].grad, traced["x"].grad)
    reason = lens.passes[0].unreached[name]
    assert (reason.code, reason.name) == (code, name), reason.text
    assert words in reason.text, reason.text
    assert "x" not in lens.passes[0].unreached
    assert ("v" not in lens.passes[0].unreached) and (plain.get("v") is None or plain["v"].grad is not None)


# ----------------------------------------------------------------------------- zeros are not "no gradient"

def hook_zeroes_the_leaf(ns):
    x, w = leaves(ns, "x", "w")
    w.register_hook(lambda grad: grad * 0)
    (x * w).sum().backward()


def hook_zeroes_a_named_product(ns):
    x, w = leaves(ns, "x", "w")
    ns["h"] = h = x * w
    h.register_hook(lambda grad: torch.zeros_like(grad))
    (h * 2).sum().backward()


def dead_relu(ns):  # zeros from the chain rule itself: nothing to say
    x, w = leaves(ns, "x", "w")
    (x * torch.relu(w - 100)).sum().backward()


def rounded(ns):  # round's derivative is zero: a gradient of zeros, not none
    x, w = leaves(ns, "x", "w")
    (x * w.round()).sum().backward()


@pytest.mark.parametrize("program, zeroed", [(hook_zeroes_the_leaf, {"w"}), (hook_zeroes_a_named_product, {"x", "w"}),
                                             (dead_relu, set()), (rounded, set())],
                         ids=["leaf_hook", "product_hook", "dead_relu", "round"])
def test_zeros_from_a_hook_are_zeros(program, zeroed):
    plain, traced, lens = run(program)
    unreached = lens.passes[0].unreached
    for name in ("x", "w"):
        assert plain[name].grad is not None and torch.equal(plain[name].grad, traced[name].grad)
        if name in zeroed:
            assert not plain[name].grad.any()
            assert unreached[name].code == "hook_zeros", unreached[name].text
            assert "received a non-zero gradient and passed on zeros" in unreached[name].text
        else:
            assert name not in unreached
    assert "h" not in unreached


@pytest.mark.parametrize("kind", ["pre", "full"])
def test_a_module_hook_passing_none(kind):
    def program(ns):
        ns["m"] = m = nn.Linear(3, 3)
        if kind == "pre":
            m.register_full_backward_pre_hook(lambda module, grad_output: (None,))
        else:
            m.register_full_backward_hook(lambda module, grad_input, grad_output: (None,))
        x, = leaves(ns, "x")
        m(x).sum().backward()

    plain, traced, lens = run(program)
    unreached = lens.passes[0].unreached
    none = {"m.weight", "m.bias"} if kind == "pre" else {"x"}
    grads = {"m.weight": plain["m"].weight.grad, "m.bias": plain["m"].bias.grad, "x": plain["x"].grad}
    for name, grad in grads.items():
        if name in none:
            assert grad is None
            assert unreached[name].code == "hook_none", unreached[name].text
        else:
            assert grad is not None and name not in unreached


# ----------------------------------------------------------------------------- where NaN or inf started

class ZeroOverZero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0 / (x * 0)


def _sqrt_at_zero(seen):
    x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    return (torch.sqrt(x) * 0).sum()


def _log_of_zero(seen):
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return torch.where(x > 0, torch.log(x), torch.zeros(2)).sum()


def _custom_zero_over_zero(seen):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    return (ZeroOverZero.apply(x) * 3).sum()


def _hook_returns_inf(seen):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3

    def to_inf(grad):
        seen.append("hook")
        return grad * float("inf")

    h.register_hook(to_inf)
    return (h * 2).sum()


def _pow_half_at_zero(seen):
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return (x ** 0.5).sum()


def _divide_by_zero(seen):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = torch.tensor([0.0, 1.0], requires_grad=True)
    return (x / y).sum()


def _norm_at_zero(seen):  # torch's subgradient: finite
    return torch.zeros(3, requires_grad=True).norm()


def first_nonfinite_by_torch(make):
    """The first backward function (in the engine's order) given finite gradients that passed on NaN or inf, seen
    by node post-hooks in a plain run; "hook" when a tensor hook made it first; None when all are finite."""
    seen: list = []
    loss = make(seen)
    functions, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in functions:
            continue
        functions.add(fn)

        def post(grad_inputs, grad_outputs, fn=fn):
            finite = [all(g is None or bool(g.isfinite().all()) for g in grads)
                      for grads in (grad_outputs, grad_inputs)]
            seen.append((fn.name(), *finite))

        fn.register_hook(post)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    loss.backward()
    for event in seen:
        if event == "hook":
            return "hook"
        if event[1] and not event[2]:
            return event[0]
    return None


@pytest.mark.parametrize("make", [_sqrt_at_zero, _log_of_zero, _custom_zero_over_zero, _hook_returns_inf,
                                  _pow_half_at_zero, _divide_by_zero, _norm_at_zero],
                         ids=lambda make: make.__name__.strip("_"))
def test_the_first_nonfinite_step_is_the_one_torch_runs_first(make):
    truth = first_nonfinite_by_torch(make)
    with al.Lens(why=True) as lens:
        make([]).backward()
    origin = lens.passes[0].first_nonfinite
    if truth is None:
        assert origin is None
    elif truth == "hook":
        assert (origin.kind, origin.name) == ("hook", "to_inf")
    else:
        assert (origin.kind, origin.name, origin.note) == ("node", truth, "")


def test_a_grad_that_held_inf_before_the_pass_is_not_called_finite():
    """Before the fix: first_nonfinite None and lens.why says 'every recorded gradient is finite' while the pass left
    w.grad = [inf, 2.5]."""
    w = torch.tensor([0.0, 1.0], requires_grad=True)
    torch.sqrt(w).sum().backward()  # before the Lens: w.grad = [inf, 0.5]
    with al.Lens(names={"w": w}, why=True) as lens:
        (w * 2).sum().backward()
    assert not bool(w.grad.isfinite().all())
    origin = lens.passes[0].first_nonfinite
    assert origin is not None and (origin.kind, origin.label, origin.node) == ("earlier", "w", None)
    assert "held NaN or inf before this pass" in origin.note
    assert "every recorded gradient" not in repr(lens.why("w"))
    w.grad = None
    with al.Lens(names={"w": w}, why=True) as lens:  # zeroed: finite again, and said so
        (w * 2).sum().backward()
    assert lens.passes[0].first_nonfinite is None and bool(w.grad.isfinite().all())


# ----------------------------------------------------------------------------- paths against .grad

def _shared(ns):
    ns["x"] = x = torch.tensor(0.3, requires_grad=True)
    ns["w"] = w = torch.tensor(1.7, requires_grad=True)
    h = x * w
    return h * h + h.sin() + h * x


def _broadcast(ns):
    ns["x"] = x = torch.randn(3, 1, requires_grad=True)
    ns["w"] = w = torch.randn(4, requires_grad=True)
    h = x * w
    return (h.exp() + (h * w).mean(0).sum() * h).sum()


def _deep(ns):
    ns["x"] = x = torch.tensor(0.3, requires_grad=True)
    h = x
    for _ in range(5):
        h = h * 1.1 + h.sin()
    return h


def _hooked(ns):
    ns["x"] = x = torch.tensor(0.3, requires_grad=True)
    ns["w"] = w = torch.tensor(1.7, requires_grad=True)
    h = x * w
    h.register_hook(lambda grad: grad * 3)
    return h * x + w * h


def _mixed_dtypes(ns):
    ns["x"] = x = torch.tensor([0.3, 0.2], requires_grad=True)
    h = x.half() * 3
    return (h * h).sum().float() + (x.double() * 2).sum().float()


@pytest.mark.parametrize("make", [_shared, _broadcast, _deep, _hooked, _mixed_dtypes], ids=lambda m: m.__name__[1:])
def test_the_paths_add_up_to_the_gradient_without_hooks(make):
    torch.manual_seed(0)
    plain: dict = {}
    make(plain).backward()
    torch.manual_seed(0)
    traced: dict = {}
    with al.Lens(names=traced, why=True) as lens:
        make(traced).backward()
    hooked = make is _hooked
    for name in plain:
        assert torch.equal(plain[name].grad, traced[name].grad)
        path_set = lens.paths_to(name)
        assert path_set.known, path_set.unknown
        truth = plain[name].grad
        if hooked:  # the chain rule without the hook, computed by torch
            x, w = (torch.tensor(0.3, requires_grad=True), torch.tensor(1.7, requires_grad=True))
            h = x * w
            truth = torch.autograd.grad(h * x + w * h, {"x": x, "w": w}[name])[0]
            assert "hooks changed it" in path_set.hooks and path_set.hooks.count(str(round(float(plain[name].grad), 2)))
        else:
            assert path_set.hooks == ""
        # the sum over paths is added in another order than the engine adds: equal up to float rounding
        assert torch.allclose(path_set.total, truth, rtol=1e-5, atol=1e-6)
        assert sum(path.rest or 1 for path in path_set.paths) == path_set.count
        for path in path_set.paths:
            if path.factors:  # one-element tensors: the contribution is the product of the local derivatives
                product = 1.0
                for factor in path.factors:
                    product *= factor
                assert product == pytest.approx(float(path.contribution), rel=1e-4)


def test_the_zero_recipe_hook_does_not_freeze_what_lies_upstream():
    """Its docstring said 'freeze what lies upstream' (fails before): upstream gets zeros, and weight decay or momentum
    still move a parameter whose gradient is zeros."""
    from autograd_lens.recipes import zero

    assert "freeze" not in zero.__doc__ and "not None" in zero.__doc__
    moved = {}
    for options in ({}, {"weight_decay": 0.1}, {"momentum": 0.9}):
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **options)
        handles = al.Recipe().add("weight", "tensor", "zero").apply(model)
        for step in range(2):
            optimizer.zero_grad()
            if step == 0 and options.get("momentum"):
                handles.remove()  # one real step first: momentum remembers it
            elif step == 1 and options.get("momentum"):
                handles = al.Recipe().add("weight", "tensor", "zero").apply(model)
            before = model.weight.detach().clone()
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
        assert model.weight.grad is not None and not model.weight.grad.any()
        moved[str(options)] = not torch.equal(before, model.weight.detach())
    assert moved == {"{}": False, "{'weight_decay': 0.1}": True, "{'momentum': 0.9}": True}


# ----------------------------------------------------------------------------- the forward's first NaN or inf

class FirstMade(torch.overrides.TorchFunctionMode):
    """Ground truth: the first torch call whose tensors and numbers were all finite before it ran (copies taken
    before the call, so a call that writes in place is judged on what it was given) and that left a floating tensor
    it returned or wrote holding NaN or inf."""

    def __init__(self):
        super().__init__()
        self.found = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        given = [*args, *kwargs.values()]
        given += [item for value in given if isinstance(value, (list, tuple)) for item in value]
        tensors = [value for value in given if isinstance(value, torch.Tensor) and value.is_floating_point()]
        with torch.no_grad():
            finite = all(bool(t.isfinite().all()) for t in tensors) and all(
                math.isfinite(value) for value in given if isinstance(value, float))
        result = func(*args, **kwargs)
        if self.found is None and finite:
            written = [value for value in [result, *tensors] if isinstance(value, torch.Tensor)]
            with torch.no_grad():
                if any(t.is_floating_point() and not bool(t.isfinite().all()) for t in written):
                    self.found = func.__name__
        return result


def _log_in_place_then_exp():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    h = x * 1
    h.log_()
    z = torch.tensor([100.0, 1.0], requires_grad=True).exp()
    return (h * 0).sum() + z.sum()


def _divide_in_place():
    x = torch.tensor([1.0, 1.0], requires_grad=True)
    h = x * 1
    h /= torch.tensor([0.0, 1.0])
    return h.sum()


def _log_into_out():
    out = torch.zeros(2)
    torch.log(torch.tensor([0.0, 1.0]), out=out)
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    return (w * out.nan_to_num()).sum() + (w * 1e30).exp().sum()


def _inf_written_by_the_user_then_overflow():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1
    h[0] = float("inf")
    return (h * 0).nan_to_num().sum() + (x * 100).exp().sum()


def _inf_literal_then_log():
    c = torch.tensor([float("inf"), 1.0])
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    return (x * c.nan_to_num()).sum() + torch.log(x).sum()


@pytest.mark.parametrize("make", [_log_in_place_then_exp, _divide_in_place, _log_into_out,
                                  _inf_written_by_the_user_then_overflow, _inf_literal_then_log],
                         ids=lambda make: make.__name__.strip("_"))
def test_the_forward_origin_is_the_first_call_to_make_nan_from_finite_values(make):
    """Before the fix: log_ was passed over for the later exp (the in-place call was judged on the -inf it wrote),
    h[0] = inf and torch.tensor([inf]) were called origins 'from ()' though they were given inf."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FirstMade() as truth:
            make().backward()
        with al.Lens(why=True) as lens:
            make().backward()
    from autograd_lens.debug import forward_nonfinite

    found, _ = forward_nonfinite(lens.passes[0])
    assert truth.found is not None and found is not None
    assert found.op.split(" ")[0].rstrip("_") == truth.found.rstrip("_"), (found, truth.found)


def test_nan_given_from_outside_earlier_means_the_origin_is_not_the_blocks_first_nan():
    """Before the fix: 'forward: log (the block's first NaN or inf)' though mul had returned NaN before it (from data
    holding NaN, made before the block)."""
    data = torch.tensor([float("nan"), 1.0])
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with FirstMade() as truth:
        (w * data).nan_to_num().sum() + torch.log(x).sum()
    assert truth.found == "log"
    with al.Lens(names={"w": w, "x": x}, why=True) as lens:
        returned = w * data
        ((returned).nan_to_num().sum() + torch.log(x).sum()).backward()
    assert torch.isnan(returned).any()
    text = repr(lens.why("x"))
    assert "forward: log (the block's first call to make NaN or inf from finite values; mul returned NaN or inf " \
           "earlier, from NaN or inf it was given)" in text, text
    assert "the block's first NaN or inf" not in text


def test_the_gradient_given_to_the_root_is_among_the_factors():
    """Before the fix: 'sin ← mul ← x: 0.8727 × 1.7 = 2.967' for backward(gradient=2.) (0.8727 × 1.7 is 1.484),
    and 'x: 1.0 = 3.0' for x.backward(3.)."""
    x = torch.tensor(0.3, requires_grad=True)
    w = torch.tensor(1.7, requires_grad=True)
    a, b = torch.tensor(0.5, requires_grad=True), torch.tensor(-1.5, requires_grad=True)
    runs = [lambda: (x * w).sin().backward(torch.tensor(2.0)), lambda: x.backward(torch.tensor(3.0)),
            lambda: torch.autograd.backward([x * a, (x * b).exp()], [torch.tensor(-0.5), torch.tensor(4.0)]),
            lambda: (x * w).backward()]
    for run_pass in runs:
        x.grad = None
        run_pass()
        truth = x.grad.clone()
        x.grad = None
        with al.Lens(names={"x": x, "w": w, "a": a, "b": b}, why=True) as lens:
            run_pass()
        assert torch.equal(x.grad, truth)
        path_set = lens.paths_to("x")
        assert torch.allclose(path_set.total, truth)
        for path in path_set.paths:
            product = math.prod(path.factors)
            assert product == pytest.approx(float(path.contribution), rel=1e-4), path.text()


@pytest.mark.parametrize("hooked_input", [False, True])
def test_paths_go_through_the_wrappers_of_full_module_hooks(hooked_input):
    """Before 2026-11-28 noon: any model with a full module backward hook (register_full_backward_hook / _pre_hook)
    had every path 'unknown: BackwardHookFunctionBackward could not be run alone (TypeError)'; the node is torch's
    identity wrapper, now followed as one (its backward returns its arguments). The sums over paths are the gradients
    of a run with no hook, and the hook that doubles the first Linear's input gradient is said to have changed x."""
    def model_and_input():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        return model, torch.randn(2, 3, requires_grad=hooked_input)

    plain, x0 = model_and_input()
    plain(x0).sum().backward()
    model, x = model_and_input()
    model[0].register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,) if gi[0] is not None else None)
    model[2].register_full_backward_pre_hook(lambda m, go: None)
    named = {"x": x, "w0": model[0].weight, "b0": model[0].bias, "w2": model[2].weight}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no input requiring grad: torch warns that the full hook fires anyway)
        with al.Lens(names=named, why=True) as lens:
            model(x).sum().backward()
    truth = {"x": x0.grad, "w0": plain[0].weight.grad, "b0": plain[0].bias.grad, "w2": plain[2].weight.grad}
    for name, without in truth.items():
        if without is None:
            continue
        path_set = lens.paths_to(name)
        assert path_set.known, (name, path_set.unknown)
        assert torch.allclose(path_set.total, without, rtol=1e-6, atol=1e-7), name
        assert ("hooks changed it" in path_set.hooks) == (name == "x"), (name, path_set.hooks)
    if hooked_input:
        assert torch.equal(x.grad, x0.grad * 2)
