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

import warnings

import pytest
import torch
import torch.nn as nn

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


FOLLOWED = [(unused, "w", "not_on_path", "not on the graph"), (branch_not_taken, "w", "not_on_path", "not on the graph"),
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
