"""Node post-hooks registered during the pass, compared with plain PyTorch.

A hook registered on a backward function while the pass runs (from a tensor hook, a node pre-hook, a saved-tensor
unpack hook, a custom ``Function.backward``, another node's post-hook) runs after the lens's own observer on that
node.  Each program runs plain, under a Lens, and with no hook at all; what the late hook receives (both tuples:
the engine keeps a node's inputs for its post-hooks only when it had one when it started, PyTorch's
``test_node_post_hook_registered_during_unpack_hook``), the gradients, and every statement of the lens about it
(its calls, what each node passed on, values without hooks, no hook invented) are compared with the truth.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import autograd_lens as al

WHERE = ("tensor_hook", "node_pre", "unpack", "function", "other_post")
DOES = ("observe", "scale", "inplace")
SHAPES = ("chain", "multi_output")


class Twice(torch.autograd.Function):
    """y = 2x, whose backward may register a post-hook on its own node."""

    register = None

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if Twice.register is not None:
            Twice.register(torch._C._current_autograd_node())
        return g * 2


def leaves():
    return torch.tensor([1.0, -2.0, 3.0], requires_grad=True), torch.tensor([0.5, 1.5, -1.0], requires_grad=True)


def program(x, w, where: str, does: str, shape: str, hooks: bool, log: list, passes: int = 1):
    """Build a graph from leaves ``x``, ``w`` and run ``passes`` backward passes; a late post-hook (when ``hooks``)
    is registered the way ``where`` says, on the node of ``h``, and ``does`` what it says.  Returns the leaves'
    grads after each pass."""

    def late(outputs, inputs):
        log.append(("late", tuple(o.clone() if o is not None else None for o in outputs), len(inputs),
                    tuple(i is None for i in inputs)))
        if does == "scale":
            result = tuple(o * 0.5 if o is not None else None for o in outputs)
        elif does == "inplace":
            for o in outputs:
                if o is not None:
                    o.mul_(3.0)
            result = None
        else:
            result = None
        log.append(("late out", tuple((o if result is None else r).clone() for o, r in
                                      zip(outputs, result or outputs) if o is not None)))
        return result

    registered = []

    def register(node):
        if hooks and not registered:
            registered.append(node.register_hook(late))

    Twice.register = register if where == "function" else None
    context = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: (register(_node()), t)[1]) \
        if where == "unpack" else _nothing()
    with context:
        a = x * w
        if where == "function":
            h = Twice.apply(a)
        elif shape == "multi_output":
            h = torch.stack(a.exp().unbind(0)) if where != "unpack" else torch.stack((a.exp() * w).unbind(0))
        else:
            h = a.exp() * w if where == "unpack" else a.exp()
        out = (h * h).sum()
    target = h.grad_fn
    if where == "tensor_hook":
        h.register_hook(lambda g: register(target) or None)  # runs before target: the engine will keep its inputs
    elif where == "node_pre":
        target.register_prehook(lambda g: register(target) or None)
    elif where == "other_post":
        out.grad_fn.register_hook(lambda o, i: register(target) or None)
    grads = []
    for index in range(passes):
        log.append(("pass", index))
        out.backward(retain_graph=index + 1 < passes)
        grads.append((x.grad.clone(), w.grad.clone()))
    Twice.register = None
    return grads


def _node():
    return torch._C._current_autograd_node()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


CASES = [case for case in itertools.product(WHERE, DOES, SHAPES, (1, 2))
         if not (case[0] == "function" and case[2] == "multi_output")]


def _equal(a, b):
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("where,does,shape,passes", CASES)
def test_a_late_node_post_hook_sees_and_is_shown_as_without_the_lens(where, does, shape, passes):
    plain_log: list = []
    plain = program(*leaves(), where, does, shape, True, plain_log, passes)
    lens_log: list = []
    x, w = leaves()
    with al.Lens(names={"x": x, "w": w}) as lens:
        traced = program(x, w, where, does, shape, True, lens_log, passes)
    # 1. the program sees the same: the hook's arguments (the inputs tuple included), the gradients
    assert _equal(lens_log, plain_log)
    assert _equal(traced, plain)
    late_calls = [entry for entry in plain_log if entry[0] == "late"]
    assert late_calls, "the program must call its late hook"
    if where in ("unpack", "function"):  # registered while the node ran: its inputs were not kept
        first = [entry for entry in plain_log if entry[0] in ("late", "pass")]
        assert first[1][0] == "late" and first[1][2] == 0
    # 2. what the lens says about it
    bare: list = []
    unhooked = program(*leaves(), where, does, shape, False, bare, passes)
    passes_seen = lens.passes
    assert len(passes_seen) == passes
    shown = [call for p in passes_seen for call in p.hook_calls if call.kind == "node" and call.hook == "late"]
    assert len(shown) == len(late_calls)
    for p in passes_seen:
        assert not any(call.unseen for call in p.hook_calls), [c.hook for c in p.hook_calls]
        if where not in ("unpack", "function"):
            assert p.unknown == {}
        else:  # unknown, and why: the node's saved tensors or its Python backward would have to run again
            assert all(("saved-tensor hook" in why or "Python code" in why) for why in p.unknown.values()), p.unknown
    received = [entry[1] for entry in plain_log if entry[0] == "late"]
    passed = [entry[1] for entry in plain_log if entry[0] == "late out"]
    for call, got, gave in zip(shown, received, passed):
        assert _equal(tuple(v for v in call.grad_in if v is not None), tuple(v for v in got if v is not None))
        assert _equal(tuple(v for v in call.grad_out if v is not None), gave)
        assert call.modified == (does != "observe")
    for index, p in enumerate(passes_seen):
        x_plain, w_plain = plain[index]
        assert torch.equal(p.leaf_grads["x"], x_plain) and torch.equal(p.leaf_grads["w"], w_plain)
        # without hooks: what the same program gives with no hook registered, pass by pass (the grads of a pass
        # without hooks are what it adds to what .grad held without hooks)
        for name, bare_value in zip(("x", "w"), unhooked[index]):
            if name not in p.unknown:
                assert torch.equal(p.grads_without_hooks[name], bare_value), (name, p.grads_without_hooks, bare_value)


def test_the_late_hook_is_put_back_after_the_pass():
    """The wrapper is the lens's for one pass only: the node's hook dict holds the user's function again."""
    log: list = []
    seen = {}

    def grab(node):
        seen["node"] = node

    Twice.register = None
    x = torch.tensor([1.0, 2.0], requires_grad=True)

    def register(node):
        def late(outputs, inputs):
            return None
        seen["hook"] = late
        seen["handle"] = node.register_hook(late)

    Twice.register = register
    with al.Lens(names={}):
        y = Twice.apply(x * 1.0)
        node = y.grad_fn
        y.sum().backward(retain_graph=True)
    Twice.register = None
    assert seen["handle"].hooks_dict_ref()[seen["handle"].id] is seen["hook"]
    assert log == []
    del node
