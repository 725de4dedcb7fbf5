"""Property: "without hooks" is right or unknown.

On random graphs with broadcasting, views, in-place ops, reductions, ``split``/``cat``, several
passes and random modifying hooks, every "without hooks" value the lens reports equals, bit for
bit, what a separate run of the same code gives with the hooks not registered; and the hooked
run itself is unchanged by the lens.  These graphs hold only torch's C++ backward functions, so
no value may be unknown.  ``AUTOGRAD_LENS_EXAMPLES`` sets the number of graphs (default 1000).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import autograd_lens as al

EXAMPLES = int(os.environ.get("AUTOGRAD_LENS_EXAMPLES", "1000"))
ALIASING = ("the gradient passed to backward() changed in place", ".grad was changed by code the lens did not see",
            "its .grad shares memory",
            # a hook edited the gradient= tensor in place, and a .grad that is a view of it changed with it before
            # the pass added to it (413e15f: a .grad changed during the pass)
            ".grad was replaced or written during this pass")
PYTHON_BACKWARD = "TripleBackward's backward is Python code"
SHAPES = [(3,), (2, 3), (1, 3), (2, 1), ()]
UNARY = ["tanh", "sin", "square", "scale", "neg", "relu", "exp_small", "clamp", "softmax", "pow3", "custom"]
BINARY = ["add", "mul", "sub", "div", "where", "matmul"]
SHAPED = [
    "sum_rows",
    "mean_cols",
    "expand_view",
    "unsqueeze_view",
    "inplace_mul",
    "inplace_add",
    "split_cat",
    "slice_view",
]
TENSOR_HOOKS = ["double", "plus_one", "clamp", "inplace_half", "read", "c_neg", "c_append"]
NODE_HOOKS = ["pre_double", "post_plus"]
LEAF_HOOKS = ["post_accumulate_half", "post_accumulate_read"]


@st.composite
def programs(draw):
    leaves = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(SHAPES)) for _ in range(leaves)]
    seeds = [draw(st.integers(0, 10_000)) for _ in range(leaves)]
    ops = []
    count = leaves
    for _ in range(draw(st.integers(1, 8))):
        family = draw(st.sampled_from(["unary", "binary", "shaped"]))
        if family == "unary":
            ops.append(("unary", draw(st.sampled_from(UNARY)), draw(st.integers(0, count - 1))))
        elif family == "binary":
            ops.append(
                (
                    "binary",
                    draw(st.sampled_from(BINARY)),
                    draw(st.integers(0, count - 1)),
                    draw(st.integers(0, count - 1)),
                )
            )
        else:
            ops.append(
                (
                    "shaped",
                    draw(st.sampled_from(SHAPED)),
                    draw(st.integers(0, count - 1)),
                    draw(st.integers(0, count - 1)),
                )
            )
        count += 1
    hooks = []
    for _ in range(draw(st.integers(1, 4))):
        target = draw(st.integers(0, count - 1))
        kind = draw(st.sampled_from(["tensor", "node", "leaf"]))
        if kind == "node" and target >= leaves:
            hooks.append(("node", draw(st.sampled_from(NODE_HOOKS)), target))
        elif kind == "leaf":
            hooks.append(("leaf", draw(st.sampled_from(LEAF_HOOKS)), draw(st.integers(0, leaves - 1))))
        else:
            hooks.append(("tensor", draw(st.sampled_from(TENSOR_HOOKS)), target))
    mode = draw(st.sampled_from(["backward", "backward", "grad", "vector"]))
    passes = draw(st.integers(1, 3)) if mode != "grad" else 1
    return shapes, seeds, ops, hooks, mode, passes


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


def _tensor_hook(kind):
    def hook(g):
        if g is None:
            return None
        if kind == "double":
            return g * 2
        if kind == "plus_one":
            return g + 1
        if kind == "clamp":
            return g.clamp(-0.5, 0.5)
        if kind == "inplace_half" and 0 not in g.stride():
            g.mul_(0.5)  # expanded gradients (from sum) cannot be written in place
        return None

    return hook


def _apply(op, tensors):
    kind, name = op[0], op[1]
    a = tensors[op[2]]
    if kind == "unary":
        return {
            "tanh": lambda: a.tanh(),
            "sin": lambda: a.sin(),
            "square": lambda: a * a,
            "scale": lambda: a * 3,
            "neg": lambda: -a,
            "relu": lambda: a.relu(),
            "exp_small": lambda: (a * 0.1).exp(),
            "clamp": lambda: a.clamp(-0.3, 0.3),  # zero gradient outside
            "softmax": lambda: a.softmax(dim=-1) if a.dim() else a * 1,
            "pow3": lambda: a.pow(3),
            "custom": lambda: Triple.apply(a),  # a Python backward: values past it must be unknown, never wrong
        }[name]()
    b = tensors[op[3]]
    if kind == "binary":
        return {
            "add": lambda: a + b,
            "mul": lambda: a * b,
            "sub": lambda: a - b,
            "div": lambda: a / (b * b + 1),
            "where": lambda: torch.where(a > 0, a, b * 2),
            "matmul": lambda: (a.expand(2, 3) @ b.expand(2, 3).transpose(0, 1)).sum(-1, keepdim=True),  # (2, 1)
        }[name]()
    full = a.expand(2, 3) if a.dim() <= 2 else a
    if name == "sum_rows":
        return full.sum(dim=-1, keepdim=True)  # (2, 1)
    if name == "mean_cols":
        return full.mean(dim=0, keepdim=True)  # (1, 3)
    if name == "expand_view":
        return a.expand(2, 3)
    if name == "unsqueeze_view":
        return a.unsqueeze(0).squeeze(0)
    if name == "slice_view":
        return full[:, 1:].sum(dim=-1, keepdim=True)  # a view, then (2, 1)
    if name == "inplace_mul":
        copy = a * 1
        return copy.mul_(1.5)
    if name == "inplace_add":
        copy = (a + b) * 1
        return copy.add_(b)
    if name == "split_cat":
        first, second = full.split([1, 2], dim=-1)
        return torch.cat([second, first], dim=-1)
    raise AssertionError(name)


def run(program, with_hooks, names):
    """The program, plain; returns the gradients after each pass (.grad, or what grad() returned)."""
    shapes, seeds, ops, hooks, mode, passes = program
    leaves = []
    for index, (shape, seed) in enumerate(zip(shapes, seeds)):
        generator = torch.Generator().manual_seed(seed)
        leaves.append(torch.randn(shape, generator=generator).requires_grad_())
        names[f"l{index}"] = leaves[-1]
    tensors = list(leaves)
    for op in ops:
        tensors.append(_apply(op, tensors))
    for index, tensor in enumerate(tensors[len(leaves):]):
        names[f"t{index}"] = tensor  # hooks written in C are known on named tensors only
    if with_hooks:
        for kind, name, target in hooks:
            tensor = tensors[target]
            if kind == "tensor" and name == "c_neg":
                tensor.register_hook(torch.neg)  # hooks written in C: no Python frame shows their calls
            elif kind == "tensor" and name == "c_append":
                tensor.register_hook([].append)
            elif kind == "tensor":
                tensor.register_hook(_tensor_hook(name))
            elif kind == "leaf":
                if name == "post_accumulate_half":
                    leaves[target].register_post_accumulate_grad_hook(
                        lambda p: None if p.grad.mul_(0.5) is None else None
                    )
                else:
                    leaves[target].register_post_accumulate_grad_hook(lambda p: None)
            elif tensor.grad_fn is not None:
                if name == "pre_double":
                    tensor.grad_fn.register_prehook(lambda go: tuple(None if g is None else g * 2 for g in go))
                else:
                    tensor.grad_fn.register_hook(lambda gi, go: tuple(None if g is None else g + 1 for g in gi))
    parts = [t.sum() for t in tensors[len(leaves) :]] or [tensors[0].sum()]
    out = sum(parts[1:], parts[0])
    results = []
    if mode == "grad":
        grads = torch.autograd.grad(out, leaves, allow_unused=True)
        return [[None if g is None else g.clone() for g in grads]]
    root = torch.stack(parts) if mode == "vector" else out
    seed = torch.linspace(0.5, 1.5, len(parts)) if mode == "vector" else None
    for index in range(passes):
        root.backward(seed, retain_graph=index < passes - 1)
        results.append([None if leaf.grad is None else leaf.grad.clone() for leaf in leaves])
    return results


def equal(first, second):
    if first is None or second is None:
        return first is None and second is None
    return (
        first.shape == second.shape
        and first.dtype == second.dtype
        and (torch.equal(first, second) or bool(((first == second) | (first.isnan() & second.isnan())).all()))
    )


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(programs())
# found by CI's random draws: one hook function on an autograd.grad input and on another tensor, with a hook in C
# on that input (its calls were put back in the wrong place, and the node records' positions went stale)
@example(program=([(3,)], [0], [("unary", "tanh", 0), ("unary", "tanh", 0)],
                  [("tensor", "double", 0), ("tensor", "double", 2), ("tensor", "c_neg", 0)], "grad", 1))
@example(program=([(3,)], [0], [("unary", "tanh", 0)],
                  [("tensor", "inplace_half", 0), ("tensor", "inplace_half", 1), ("tensor", "c_neg", 0)], "grad", 1))
# a 0-dim leaf gets a row of stack's under a reused gradient=: without the hook autograd adopts that row (a view of
# the caller's tensor) and later passes add into it; "without hooks" showed 1.5 where torch has 2.0 (unknown now)
@example(program=([(3,), (3,), ()], [0, 0, 0],
                  [("shaped", "unsqueeze_view", 2, 0), ("unary", "tanh", 0), ("unary", "tanh", 0), ("unary", "tanh", 0)],
                  [("tensor", "double", 2)], "vector", 3))
def test_every_known_value_without_hooks_equals_a_run_without_the_hooks(program):
    plain_hooked = run(program, with_hooks=True, names={})
    unhooked = run(program, with_hooks=False, names={})
    names: dict = {}
    with al.Lens(names=names) as lens:
        traced = run(program, with_hooks=True, names=names)
    # the lens changed nothing
    for before, after in zip(plain_hooked, traced):
        assert all(equal(a, b) for a, b in zip(before, after))
    assert len(lens.passes) == len(unhooked)
    for backward_pass, expected in zip(lens.passes, unhooked):
        assert all(note.startswith("a hook written in C") for note in backward_pass.notes), backward_pass.notes
        # Unknown only behind the custom Function, or after torch's own aliasing of the caller's gradient=
        # tensor (a stolen .grad can be a view of it, so later passes change it in place)
        uses_custom = any(op[1] == "custom" for op in program[2])
        for reason in backward_pass.unknown.values():
            reason = reason.removeprefix("not known since an earlier pass: ")  # carried over from a pass before
            assert reason.startswith(ALIASING) or uses_custom and reason.startswith(PYTHON_BACKWARD), reason
        for index, value in enumerate(expected):
            name = f"l{index}"
            got = backward_pass.grads_without_hooks.get(name)
            if backward_pass.kind == "backward" and name not in backward_pass.leaf_grads:
                continue  # a leaf that this graph does not reach
            if name in backward_pass.unknown:
                assert got is None
                continue
            assert equal(got, value), (name, got, value)


SEED_ALIASING = {
    # the root's gradient reaches a hook as a view of the caller's gradient= tensor; the hook halves it in place
    "a hook edits the seed": (
        [(3,), ()],
        [0, 0],
        [("unary", "tanh", 0), ("unary", "tanh", 1), ("unary", "tanh", 0)],
        [("tensor", "inplace_half", 3), ("tensor", "double", 0), ("tensor", "double", 0)],
        "vector",
        2,
    ),
    # l1.grad is a stolen view of the seed, so the next pass's AccumulateGrad adds into the seed itself
    "AccumulateGrad edits the seed": (
        [(), ()],
        [0, 0],
        [("binary", "add", 0, 1)],
        [("tensor", "double", 0)],
        "vector",
        3,
    ),
    "both": ([(), ()], [0, 0], [("binary", "add", 0, 1)], [("tensor", "inplace_half", 0)], "vector", 3),
}


@pytest.mark.parametrize("case", sorted(SEED_ALIASING))
def test_a_gradient_tensor_changed_in_place_across_passes_is_right_or_unknown(case):
    """Found by the property test: torch can alias the caller's ``gradient=`` tensor (the root's gradient is a
    view of it; a stolen ``.grad`` can be that view), so passes change it in place.  After a pass in which hooks
    also changed gradients, the lens cannot know how it would have changed without them: unknown, with why."""
    test_every_known_value_without_hooks_equals_a_run_without_the_hooks.hypothesis.inner_test(SEED_ALIASING[case])


def test_a_reduction_over_an_expanded_gradient_adds_in_the_engines_order():
    """Found by the property test: the record's copies must keep the engine's strides (here an expanded,
    stride-0 gradient), or summing it again adds in another order and the last bits differ."""
    program = (
        [(), (3,), (3,)],
        [0, 0, 0],
        [
            ("unary", "tanh", 0),
            ("unary", "tanh", 0),
            ("shaped", "sum_rows", 0, 0),
            ("unary", "tanh", 0),
            ("unary", "tanh", 0),
            ("unary", "tanh", 0),
        ],
        [("tensor", "double", 5)],
        "vector",
        1,
    )
    test_every_known_value_without_hooks_equals_a_run_without_the_hooks.hypothesis.inner_test(program)


def test_a_hook_on_an_input_of_grad_and_an_identical_one_on_an_unnamed_tensor():
    """Found by the property test: two hooks from one factory (same code, same closure values), one on an
    input of autograd.grad (it fires as soon as its users ran) and one on an unnamed tensor; each call belongs
    to the node the engine runs it for."""
    program = (
        [(3,), (3,), (3,)],
        [0, 0, 0],
        [("unary", "tanh", 0), ("unary", "tanh", 0), ("unary", "tanh", 0), ("unary", "tanh", 0), ("unary", "tanh", 1)],
        [("tensor", "double", 1), ("tensor", "double", 3)],
        "grad",
        1,
    )
    test_every_known_value_without_hooks_equals_a_run_without_the_hooks.hypothesis.inner_test(program)
