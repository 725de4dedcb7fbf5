"""Property: on random graphs with random hooks, the Lens changes nothing and leaves nothing behind, and
what it records each hook received is what the hook received."""

from __future__ import annotations

import functools

import torch
from conftest import live_recorders
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autograd_lens as al
from autograd_lens.model import NodeRun

UNARY = ["exp", "tanh", "sin", "square", "scale", "neg"]
BINARY = ["add", "mul", "sub"]
TENSOR_HOOKS = ["none", "double", "plus_one", "clamp", "inplace_half", "data_triple"]
CALLABLES = ["function", "partial", "method", "object"]  # how the hook is handed to register_hook
NODE_HOOKS = ["pre_double", "post_plus"]


@st.composite
def programs(draw):
    leaves = draw(st.integers(1, 3))
    size = draw(st.sampled_from([1, 3]))
    values = [draw(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=size, max_size=size)) for _ in range(leaves)]
    ops = []
    count = leaves
    for _ in range(draw(st.integers(1, 7))):
        if draw(st.booleans()):
            ops.append(("unary", draw(st.sampled_from(UNARY)), draw(st.integers(0, count - 1))))
        else:
            ops.append(("binary", draw(st.sampled_from(BINARY)), draw(st.integers(0, count - 1)), draw(st.integers(0, count - 1))))
        count += 1
    hooks = []
    for _ in range(draw(st.integers(0, 4))):
        target = draw(st.integers(0, count - 1))
        if target >= leaves and draw(st.booleans()):
            hooks.append(("node", draw(st.sampled_from(NODE_HOOKS)), target))
        else:
            hooks.append(("tensor", draw(st.sampled_from(TENSOR_HOOKS)), target, draw(st.sampled_from(CALLABLES))))
    if draw(st.booleans()):
        hooks.append(("post_accumulate", "read", draw(st.integers(0, leaves - 1))))
    mode = draw(st.sampled_from(["backward", "twice", "grad"]))
    loss = draw(st.sampled_from(["all", "last"]))  # the sum of every result, or of the last one only
    return values, ops, hooks, mode, loss


class _Hooks:
    """Hooks as bound methods and as callable objects (their ``self`` is not what autograd passes)."""

    def __init__(self, kind, seen):
        self.function = tensor_hook(kind, seen)

    def method(self, g):
        return self.function(g)

    def __call__(self, g):
        return self.function(g)


def _as(how, hook):
    if how == "partial":  # a bound first argument comes before the gradient
        return functools.partial(lambda tag, g: hook(g), "bound")
    return hook


def tensor_hook(kind, seen, how="function"):
    if how in ("method", "object"):
        holder = _Hooks(kind, seen)
        return holder.method if how == "method" else holder
    if how == "partial":
        return _as(how, tensor_hook(kind, seen))

    def hook(g):
        seen.append(None if g is None else g.detach().clone())
        if kind == "double":
            return g * 2
        if kind == "plus_one":
            return g + 1
        if kind == "clamp":
            return g.clamp(-0.5, 0.5)
        if kind == "inplace_half" and g is not None and 0 not in g.stride():
            g.mul_(0.5)  # expanded gradients (from sum) cannot be written in place
        if kind == "data_triple" and g is not None and 0 not in g.stride():
            g.data.mul_(3)  # through .data: autograd's version counter does not see this edit
        return None

    return hook


def run(program, with_hooks=True, oracle=None):
    """Run the program; ``oracle``, a list, gets (node name, what it received, what it sent) from a
    post-hook registered after the program's own hooks on every node, in the order the nodes ran."""
    values, ops, hooks, mode, loss = program
    seen = []
    tensors = [torch.tensor(v, requires_grad=True) for v in values]
    leaves = list(tensors)
    for op in ops:
        if op[0] == "unary":
            a = tensors[op[2]]
            result = {
                "exp": lambda: a.exp(), "tanh": lambda: a.tanh(), "sin": lambda: a.sin(),
                "square": lambda: a * a, "scale": lambda: a * 3, "neg": lambda: -a,
            }[op[1]]()
        else:
            a, b = tensors[op[2]], tensors[op[3]]
            result = {"add": lambda: a + b, "mul": lambda: a * b, "sub": lambda: a - b}[op[1]]()
        tensors.append(result)
    if with_hooks:
        for kind, name, target, *how in hooks:
            tensor = tensors[target]
            if kind == "tensor":
                tensor.register_hook(tensor_hook(name, seen, *how))
            elif kind == "post_accumulate":
                tensor.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
            elif tensor.grad_fn is not None:
                if name == "pre_double":
                    tensor.grad_fn.register_prehook(lambda go: tuple(None if g is None else g * 2 for g in go))
                else:
                    tensor.grad_fn.register_hook(lambda gi, go: tuple(None if g is None else g + 1 for g in gi))
    out = sum(t.sum() for t in tensors[len(leaves):]) if len(tensors) > len(leaves) else tensors[0].sum()
    if loss == "last":  # each result then mostly reaches the loss through one consumer (no sums of gradients)
        out = (tensors[-1] * torch.linspace(1, 2, tensors[-1].numel()).reshape(tensors[-1].shape)).sum()
    if oracle is not None:
        for node in _nodes(out.grad_fn):
            node.register_hook(lambda sent, received, node=node: oracle.append(
                (node.name(), tuple(map(_clone, received)), tuple(map(_clone, sent)))))
    if mode == "grad":
        grads = torch.autograd.grad(out, leaves, allow_unused=True)
        return {"grads": [None if g is None else g.clone() for g in grads], "seen": seen}
    out.backward(retain_graph=mode == "twice")
    if mode == "twice":
        out.backward()
    return {"grads": [None if leaf.grad is None else leaf.grad.clone() for leaf in leaves], "seen": seen}


def _clone(value):
    return None if value is None else value.detach().clone()


def _nodes(root):
    found, stack = {}, [root]
    while stack:
        node = stack.pop()
        if node is not None and id(node) not in found:
            found[id(node)] = node
            stack.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())


def same(first, second):
    if first is None or second is None:
        return first is None and second is None
    return first.shape == second.shape and torch.equal(first.nan_to_num(), second.nan_to_num())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_lens_changes_no_gradient_and_leaks_nothing(program):
    original = torch.autograd._engine_run_backward
    plain = run(program)
    with al.Lens(names={}) as lens:
        traced = run(program)
    assert torch.autograd._engine_run_backward is original
    assert len(plain["grads"]) == len(traced["grads"])
    for a, b in zip(plain["grads"], traced["grads"]):
        assert same(a, b)
    assert len(plain["seen"]) == len(traced["seen"])
    for a, b in zip(plain["seen"], traced["seen"]):
        assert same(a, b)
    # what each user tensor hook received is what the lens says it received
    recorded = [c for c in lens.hook_calls if c.kind in ("tensor", "post_accumulate_grad")]
    assert len(recorded) == len(plain["seen"])
    for call, truth in zip(recorded, traced["seen"]):
        assert same(call.grad_in, truth)
    assert live_recorders() == []

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_every_node_run_shows_what_the_node_received_and_sent(program):
    """Torch as the oracle: a post-hook of the test's own on every node sees what the node received (after
    hooks and pre-hooks) and sent (after post-hooks); the lens's steps must show exactly that, node by node,
    also when a hook edits a gradient through ``.data`` (which autograd's version counter does not see)."""
    truth = []
    with al.Lens(names={}) as lens:
        run(program, oracle=truth)
    runs = [(e.name, e.grad_in, e.grad_out) for p in lens.passes for e in p.events if isinstance(e, NodeRun)]
    expected = [entry for entry in truth if entry[0] != "torch::autograd::AccumulateGrad"]
    assert [name for name, _, _ in runs] == [name for name, _, _ in expected]
    for (name, received, sent), (_, true_received, true_sent) in zip(runs, expected):
        assert len(received) == len(true_received) and len(sent) == len(true_sent), name
        assert all(same(a, b) for a, b in zip(received, true_received)), (name, received, true_received)
        assert all(same(a, b) for a, b in zip(sent, true_sent)), (name, sent, true_sent)


# "Without hooks" values are checked bit for bit, on richer graphs, in test_unhooked_property.py.
