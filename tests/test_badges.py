"""Hook badges on the drawing of a pass agree with the hooks torch ran: a hook on a tensor with no name, one on a
backward function (``grad_fn.register_hook`` / ``register_prehook``) and one added during the pass are badged on the
box the steps point at; a named tensor's hook is badged once; the drawing and the cards use one name for a hook."""

from __future__ import annotations

import torch

import autograd_lens as al
from autograd_lens.views.passview import PassView


def _badges(p, node_id):
    return p.graph.node(node_id).hooks


def test_a_hook_on_a_tensor_with_no_name_is_badged_on_the_function_that_made_it():
    ran = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        t = x * 2
        t.register_hook(lambda g: ran.append(g.clone()))
        loss = (t * t).sum()
        del t
        loss.backward()
    assert len(ran) == 1 and torch.equal(ran[0], torch.tensor([4.0, 8.0]))
    p = lens.passes[0]
    (call,) = p.hook_calls
    node = p.graph.node(call.node)
    assert node.kind == "function" and node.op == "MulBackward0"
    assert node.hooks == ("[hook on its output] <lambda>",)
    assert "[hook on its output] &lt;lambda&gt;" in PassView(p).svg or "[hook on its output] <lambda>" in PassView(p).dot


def test_node_hooks_are_badged_in_the_order_torch_calls_them():
    order = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 2

        def after(grad_inputs, grad_outputs):
            order.append("after")

        def before(grad_outputs):
            order.append("before")

        y.grad_fn.register_hook(after)
        y.grad_fn.register_prehook(before)
        (y * y).sum().backward()
    assert order == ["before", "after"]
    p = lens.passes[0]
    nodes = {call.node for call in p.hook_calls}
    assert len(nodes) == 1
    assert _badges(p, nodes.pop()) == ("[node pre-hook] before", "[node hook] after")


def test_a_named_tensor_hook_is_badged_once_with_the_name_its_calls_have():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(torch.neg)
        y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([-3.0, -3.0]))
    p = lens.passes[0]
    (call,) = p.hook_calls
    assert call.hook == "torch.neg"
    assert p.graph.node(call.node).hooks == ("[hook] torch.neg",)


def test_a_hook_added_during_the_pass_is_badged_where_it_ran():
    seen = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        a = x * 2
        b = a * 3

        def late(g):
            seen.append("late")

        def adder(g):
            a.register_hook(late)

        b.register_hook(adder)
        b.sum().backward()
    assert seen == ["late"]
    p = lens.passes[0]
    late_call = [c for c in p.hook_calls if c.hook == "late"]
    assert len(late_call) == 1
    assert "[hook] late" in p.graph.node(late_call[0].node).hooks
    assert p.graph.find("a").hooks == ("[hook] late",)  # not there when the pass started: from its call


def test_no_badge_without_a_hook():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        ((x * 2) * x).sum().backward()
    assert all(node.hooks == () for node in lens.passes[0].graph.nodes)
