"""Hooks no Python frame shows: functions written in C (``grads.append``, ``torch.neg``, ``print``), and
``functools.partial`` hooks on tensors or nodes the lens cannot name.

A profile function sees Python calls only. A hook written in C still runs, may change the gradient, and
must neither vanish from the steps nor make "without hooks" wrong. Torch is the oracle throughout: the
same code run plain (with and without the hooks), and Python hooks of the test's own that record what
they were given.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings
import weakref

import torch
from test_trust import (  # a graph node holding a marker: alive exactly as long as the graph
    Marked,
    Marker,
)

import autograd_lens as al
from autograd_lens.model import GradWritten, HookCall, NodeRun
from autograd_lens.views.steps import steps_for


def program(hooked: bool, grads: list):
    """``x → y = 3x → z = 2y → sum``, with ``grads.append`` on y and ``torch.neg`` on z when ``hooked``."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    z = y * 2
    if hooked:
        y.register_hook(grads.append)
        z.register_hook(torch.neg)
    z.sum().backward()
    return x, y, z


def test_hooks_written_in_c_are_steps_with_the_values_around_them():
    plain_grads: list = []
    plain_x, _, _ = program(True, plain_grads)
    unhooked_x, _, _ = program(False, [])
    grads: list = []
    with al.Lens() as lens:
        x, _, _ = program(True, grads)
    assert torch.equal(x.grad, plain_x.grad) and torch.equal(x.grad, torch.tensor([-6.0, -6.0]))
    assert len(grads) == len(plain_grads) == 1 and torch.equal(grads[0], plain_grads[0])
    calls = lens.hook_calls
    assert [(call.hook, call.target) for call in calls] == [("torch.neg", "z"), ("list.append", "y")]
    neg, append = calls
    assert torch.equal(neg.grad_in, torch.ones(2)) and torch.equal(neg.grad_out, -torch.ones(2))
    assert neg.modified and not neg.returned_none and "written in C" in neg.unseen
    assert torch.equal(append.grad_in, grads[0]) and torch.equal(append.grad_out, grads[0]) and not append.modified
    # without hooks: what the same code gives with no hook registered (was -6: the C hook went unnoticed)
    backward_pass = lens.passes[0]
    assert torch.equal(backward_pass.grads_without_hooks["x"], unhooked_x.grad)
    assert any("written in C" in note for note in backward_pass.notes)
    # each hook call comes right before the node it precedes
    kinds = [(type(event).__name__, getattr(event, "name", None) or getattr(event, "hook", None))
             for event in backward_pass.events]
    assert kinds == [("NodeRun", "SumBackward0"), ("HookCall", "torch.neg"), ("NodeRun", "MulBackward0"),
                     ("HookCall", "list.append"), ("NodeRun", "MulBackward0"), ("GradWritten", "x")]
    texts = {step.title: " ".join(step.lines) for step in steps_for(backward_pass)}
    neg_text = next(text for title, text in texts.items() if "torch.neg" in title)
    assert "received 1.0" in neg_text.replace("[1.0, 1.0]", "1.0") and "gradient modified" in neg_text
    assert "written in C" in neg_text


def test_a_c_hook_between_python_hooks_on_one_tensor_keeps_its_place_and_gets_its_neighbours_values():
    order: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(lambda g: order.append("first") or g * 2)
        y.register_hook(torch.neg)
        y.register_hook(lambda g: order.append("third") or g + 1)
        y.grad_fn.register_prehook(lambda grads: None)
        y.sum().backward()
    assert order == ["first", "third"]
    calls = lens.hook_calls
    assert [(call.hook, call.kind) for call in calls] == [("<lambda>", "tensor"), ("torch.neg", "tensor"),
                                                          ("<lambda>", "tensor"), ("<lambda>", "node_pre")]
    # torch.neg received what the first hook returned and passed on what the third received
    assert torch.equal(calls[0].grad_out, torch.full((2,), 2.0)) and torch.equal(calls[2].grad_in, torch.full((2,), -2.0))
    assert torch.equal(calls[1].grad_in, calls[0].grad_out) and torch.equal(calls[1].grad_out, calls[2].grad_in)
    assert calls[1].modified and "value before it" in calls[1].unseen
    assert torch.equal(x.grad, torch.full((2,), -3.0))
    step = next(step for step in steps_for(lens.passes[0]) if "torch.neg" in step.title)
    assert "[2.0, 2.0]" in " ".join(step.lines) and "[-2.0, -2.0]" in " ".join(step.lines)


def test_two_c_hooks_side_by_side_say_the_value_between_them_is_unknown():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(torch.neg)
        y.register_hook(torch.neg)
        y.sum().backward()
    first, second = lens.hook_calls
    assert (first.hook, second.hook) == ("torch.neg", "torch.neg") and first.registration != second.registration
    assert first.grad_in is None and second.grad_in is None and "not known" in first.unseen
    assert torch.equal(x.grad, torch.full((2,), 3.0))
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], torch.full((2,), 3.0))


def test_a_c_hook_is_shown_before_the_nodes_pre_hooks_with_what_they_received():
    seen: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        z = y * 2
        z.register_hook(torch.neg)
        z.grad_fn.register_prehook(lambda grads: seen.append(grads[0].clone()))
        z.sum().backward()
    events = [event for event in lens.passes[0].events if isinstance(event, HookCall)]
    assert [(event.hook, event.kind) for event in events] == [("torch.neg", "tensor"), ("<lambda>", "node_pre")]
    assert torch.equal(events[0].grad_out, seen[0]) and torch.equal(seen[0], -torch.ones(2))


def test_a_c_post_accumulate_hook_is_a_step_after_the_write_with_unknown_values():
    leaves: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        x.register_post_accumulate_grad_hook(leaves.append)
        (x * 3).sum().backward()
    assert leaves == [x]
    events = lens.passes[0].events
    kinds = [type(event).__name__ for event in events]
    assert kinds[-2:] == ["GradWritten", "HookCall"]
    assert events[-1].kind == "post_accumulate_grad" and events[-1].hook == "list.append"
    assert "not known" in events[-1].unseen
    assert torch.equal(x.grad, torch.full((2,), 3.0))


def test_partial_hooks_on_unnamed_tensors_and_nodes_get_their_kind_and_values():
    """``functools.partial`` puts its bound arguments first; the lens cannot see the partial object."""
    truth: dict = {}

    def record(tag, *grads):
        truth[tag] = tuple(None if g is None else (tuple(v.clone() if v is not None else None for v in g)
                                                  if isinstance(g, tuple) else g.clone()) for g in grads)

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:  # y and z have no name here
        y = x * 3
        z = y.sin()
        y.register_hook(functools.partial(record, "tensor"))
        z.grad_fn.register_prehook(functools.partial(record, "node_pre"))
        z.grad_fn.register_hook(functools.partial(record, "node"))
        z.sum().backward()
    calls = {call.kind: call for call in lens.hook_calls}
    assert sorted(calls) == ["node", "node_pre", "tensor"]
    assert torch.equal(calls["tensor"].grad_in, truth["tensor"][0])
    assert len(calls["node_pre"].grad_in) == 1 and torch.equal(calls["node_pre"].grad_in[0], truth["node_pre"][0][0])
    # a node post-hook receives (grad_inputs, grad_outputs): the lens shows what the node sent
    assert torch.equal(calls["node"].grad_in[0], truth["node"][0][0])
    assert torch.equal(calls["node"].context[0], truth["node"][1][0])
    runs = [event for event in lens.passes[0].events if isinstance(event, NodeRun)]
    assert len(runs) == 3 and isinstance(lens.passes[0].events[-1], GradWritten)


def test_module_and_multi_grad_hooks_written_in_c_are_steps_and_without_hooks_stays_right():
    """Torch's Python wrappers call these: the call is seen, its values are not; "without hooks" is then checked
    at every node against a run with no hook."""
    seen: list = []
    layer = torch.nn.Linear(2, 1)
    layer.load_state_dict({"weight": torch.tensor([[1.0, -2.0]]), "bias": torch.tensor([0.5])})
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    plain = torch.autograd.grad(layer(x).sum(), x)[0]
    with al.Lens(names={"layer": layer, "x": x}) as lens:
        store: dict = {}
        layer.register_full_backward_pre_hook(store.setdefault)  # returns grad_output itself: a builtin that changes nothing
        handle = torch.autograd.graph.register_multi_grad_hook((x,), seen.append)
        layer(x).sum().backward()
    handle.remove()
    kinds = [(call.hook, call.kind, call.target) for call in lens.hook_calls]
    assert kinds == [("dict.setdefault", "module_full_pre", "layer"), ("list.append", "multi_grad", "x")]
    assert list(store) == [layer] and len(seen) == 1
    assert all("not known" in call.unseen for call in lens.hook_calls)
    assert torch.equal(x.grad, plain)
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], plain)
    texts = [" ".join(step.lines) for step in steps_for(lens.passes[0]) if step.kind == "hook"]
    assert len(texts) == 2 and all("It ran, but it is written in C" in text for text in texts)



def test_a_c_hook_keeps_no_graph_alive_after_its_pass():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    grads: list = []
    graphs = []
    with al.Lens() as lens:
        for _ in range(3):
            marker = Marker()
            graphs.append(weakref.ref(marker))
            out = Marked.apply(model(torch.randn(16, 4)), marker)
            out.register_hook(grads.append)  # named (out): a step, seen through the gradients around it
            del marker
            out.pow(2).mean().backward()
            del out
            gc.collect()
            assert all(graph() is None for graph in graphs)
    assert [call.hook for call in lens.hook_calls] == ["list.append"] * 3 and len(grads) == 3
    assert all(torch.equal(call.grad_in, grad) for call, grad in zip(lens.hook_calls, grads))


# ----------------------------------------------------------------------------- a hook in C beside an edit in place
# (a campaign with forward hooks registering torch.neg on layer outputs: 8 of 400 programs missed its call)


def _hook_calls_plain_and_traced(build):
    """Run ``build(order)`` plainly and in a Lens; each Python stand-in appends to ``order``."""
    runs = []
    for traced in (False, True):
        order = []
        root, leaves = build(order)
        with al.Lens() if traced else contextlib.nullcontext() as lens:
            root.backward()
        runs.append(([leaf.grad.clone() for leaf in leaves], order, lens))
    (plain_grads, _, _), (grads, _, lens) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads))
    return lens.passes[0]


def _layer_with_neg_inside(x):
    """A layer whose inner (unnamed) output carries torch.neg, registered by a forward hook as code does."""
    inner, outer = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    inner.register_forward_hook(lambda module, args, out: out.register_hook(torch.neg) and None)
    return outer(torch.tanh(inner(x)))


def test_a_c_hook_on_an_unnamed_tensor_is_found_after_another_hook_edited_a_gradient_in_place():
    def build(order):
        torch.manual_seed(0)
        x = torch.randn(2, 3, requires_grad=True)
        y = _layer_with_neg_inside(x)
        y.register_hook(lambda g: [order.append("halve"), g.mul_(0.5)] and None)  # in place, on another tensor
        return y.pow(2).sum(), [x]

    backward_pass = _hook_calls_plain_and_traced(build)
    assert [(c.hook, c.kind) for c in backward_pass.hook_calls] == [("<lambda>", "tensor"), ("<C hook>", "tensor")]
    assert backward_pass.hook_calls[1].modified


def test_a_c_hook_that_only_looks_does_not_hide_one_that_changes_a_gradient():
    def build(order):
        torch.manual_seed(0)
        x = torch.randn(2, 3, requires_grad=True)
        y = _layer_with_neg_inside(x)
        y.grad_fn.register_prehook(order.append)  # in C, and cannot edit: list.append
        return y.pow(2).sum(), [x]

    backward_pass = _hook_calls_plain_and_traced(build)
    assert [(c.hook, c.kind) for c in backward_pass.hook_calls] == [("list.append", "node_pre"), ("<C hook>", "tensor")]


def test_an_edit_in_place_reaching_a_sibling_through_shared_memory_invents_no_hook():
    """``x1.sum() + t.sum()``: both sums' backward hand on views of one scalar; a hook doubling t's gradient in
    place doubles what reached x1 too, and no hook ran at x1."""
    def build(order):
        torch.manual_seed(0)
        x0, x1 = torch.randn((), requires_grad=True), torch.randn((), requires_grad=True)
        t = x0.tanh()
        t.register_hook(lambda g: [order.append("double"), g.mul_(2.0)] and None)
        return x1.sum() + x1.tanh().sum() + t.sum(), [x0, x1]

    backward_pass = _hook_calls_plain_and_traced(build)
    assert [c.hook for c in backward_pass.hook_calls] == ["<lambda>"]


def test_which_hooks_written_in_c_could_edit_in_place():
    from autograd_lens.capture.hooks import may_edit_in_place

    assert not any(map(may_edit_in_place, [print, [].append, torch.neg, functools.partial(torch.mul, other=2)]))
    assert all(map(may_edit_in_place, [torch.Tensor.mul_, torch.relu_, functools.partial(torch.Tensor.mul_, other=2),
                                       functools.partial(torch.neg, out=torch.empty(1)), object()]))


def _output_hooked_twice(first, second, *more):
    """A layer whose (unnamed) output gets gradient hooks from forward hooks, in this order."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)
    for hook in (first, second, *more):
        layer.register_forward_hook(lambda module, args, out, hook=hook: out.register_hook(hook) and None)
    x = torch.randn(2, 3, requires_grad=True)
    return layer(x).tanh().pow(2).sum(), [x, layer.weight]


def test_a_c_hook_after_a_python_hook_on_one_unnamed_tensor_is_a_step_after_it():
    halve = lambda g: g * 0.5  # noqa: E731
    backward_pass = _hook_calls_plain_and_traced(lambda order: _output_hooked_twice(halve, torch.neg))
    calls = backward_pass.hook_calls
    assert [(c.hook, c.kind) for c in calls] == [("<lambda>", "tensor"), ("<C hook>", "tensor")]
    assert torch.equal(calls[1].grad_in, calls[0].grad_out) and torch.equal(calls[1].grad_out, -calls[0].grad_out)


def test_a_c_hook_before_a_python_hook_on_one_unnamed_tensor_is_a_step_before_it():
    halve = lambda g: g * 0.5  # noqa: E731
    backward_pass = _hook_calls_plain_and_traced(lambda order: _output_hooked_twice(torch.neg, halve))
    calls = backward_pass.hook_calls
    assert [(c.hook, c.kind) for c in calls] == [("<C hook>", "tensor"), ("<lambda>", "tensor")]
    assert torch.equal(calls[0].grad_out, calls[1].grad_in) and torch.equal(calls[0].grad_in, -calls[1].grad_in)


def test_a_c_hook_between_two_python_hooks_on_one_unnamed_tensor_is_a_step_between_them():
    halve, double = (lambda g: g * 0.5), (lambda g: g * 2.0)
    backward_pass = _hook_calls_plain_and_traced(lambda order: _output_hooked_twice(halve, torch.neg, double))
    calls = backward_pass.hook_calls
    assert [(c.hook, c.kind) for c in calls] == [("<lambda>", "tensor"), ("<C hook>", "tensor"), ("<lambda>", "tensor")]
    assert torch.equal(calls[1].grad_in, calls[0].grad_out) and torch.equal(calls[1].grad_out, calls[2].grad_in)


def test_a_hook_in_c_registered_again_in_a_non_reentrant_recompute_is_no_nested_backward():
    """use_reentrant=False recomputes to unpack saved tensors (no backward of its own): the forward hook registers
    torch.neg on the recomputed output too, whose graph is dropped. The pass shows the real call and no note of a
    nested backward. (A weak dictionary of checkpointing dropping a key was also called 'Python code that is not a
    gradient hook' and hid the C hook.)"""
    from torch.utils.checkpoint import checkpoint

    def build(order):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 3)
        layer.register_forward_hook(lambda module, args, out: out.requires_grad and out.register_hook(torch.neg) and None)
        x = torch.randn(2, 3, requires_grad=True)
        return checkpoint(lambda t: layer(t).tanh(), x, use_reentrant=False).pow(2).sum(), [x, layer.weight]

    backward_pass = _hook_calls_plain_and_traced(build)
    assert [(c.hook, c.kind) for c in backward_pass.hook_calls] == [("<C hook>", "tensor")]
    assert backward_pass.notes == ()


def test_checkpointing_s_weak_dictionaries_are_no_foreign_code():
    """A TransformerEncoderLayer under use_reentrant=False, an autograd.grad pass then backward(): checkpointing's
    WeakKeyDictionary drops keys while the second pass runs (its ``remove`` callback). It was noted as 'Python code
    that is not a gradient hook ran during this pass', which also stopped a hook in C from being found."""
    from torch.utils.checkpoint import checkpoint

    def run(traced):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        layer.linear1.register_forward_hook(lambda m, args, out: out.requires_grad and out.register_hook(torch.neg) and None)
        x = torch.randn(2, 4, 8, requires_grad=True)
        with al.Lens(names={"layer": layer, "x": x}) if traced else contextlib.nullcontext() as lens:
            loss = checkpoint(layer, x, use_reentrant=False).pow(2).sum()
            torch.autograd.grad(loss, [layer.linear2.bias], retain_graph=True)
            loss.backward()
        return x.grad, lens

    plain, (grad, lens) = run(False)[0], run(True)
    assert torch.equal(plain, grad)
    second = lens.passes[1]
    assert not any("not a gradient hook" in note for note in second.notes), second.notes
    # registered while the Lens was on: known by name (capture/registrations.py); "<C hook>", found by what it did,
    # before that
    assert [(c.hook, c.kind) for c in second.hook_calls] == [("torch.neg", "tensor")]


def _grad_with_multi_hook_on_an_input(lens=None, seen=None):
    """autograd.grad over two Linear layers; a multi-grad hook editing l2.weight's gradient in place (an input of
    autograd.grad: its node does not run) and ``torch.neg`` on a0, made by the node that runs next.  ``seen``: a
    Python hook registered before ``torch.neg`` appends what reached a0's hooks (the truth, from torch)."""
    torch.manual_seed(5)
    l1, l2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)
    x = torch.randn(4, 6)
    torch.autograd.graph.register_multi_grad_hook((l2.weight,), lambda grads: grads[0].mul_(0.5), mode="any")
    a0 = l1(x)
    loss = l2(a0).pow(2).mean()
    if seen is not None:
        a0.register_hook(lambda g: seen.append(g.clone()))
    a0.register_hook(torch.neg)
    with lens if lens is not None else contextlib.nullcontext():
        return torch.autograd.grad(loss, [l1.weight, l2.weight])


def test_a_multi_grad_hook_on_an_input_of_grad_is_no_neighbour_of_a_hook_in_c_on_the_next_node():
    """The multi-grad hook's call is placed at the node that ran next (a0's): it was taken for the hook before
    ``torch.neg`` on a0, whose card then said it received l2.weight's gradient, a [1, 8] tensor (model_programs
    seed 932522)."""
    truth: list = []
    plain = _grad_with_multi_hook_on_an_input(seen=truth)
    lens = al.Lens()
    traced = _grad_with_multi_hook_on_an_input(lens)
    assert all(torch.equal(a, b) for a, b in zip(plain, traced))
    calls = {call.hook: call for call in lens.hook_calls}
    multi, neg = calls["<lambda>"], calls["torch.neg"]
    assert multi.kind == "multi_grad" and multi.target == "l2.weight" and tuple(multi.grad_in.shape) == (1, 8)
    assert neg.kind == "tensor" and neg.target == "a0" and "written in C" in neg.unseen
    # what reached torch.neg is a0's gradient, [4, 8]; the lens may not know it, never shows another tensor
    assert tuple(truth[0].shape) == (4, 8)
    assert neg.grad_in is None or torch.equal(neg.grad_in, truth[0])
    assert neg.grad_in is not None or "not known" in neg.unseen


def test_a_hook_in_c_before_a_module_backward_hook_that_raises_is_a_step():
    """A module's full backward hook runs as a post-hook of its boundary node (torch's wrapper): when it raises, the
    node's pre-hooks have run, a ``list.append`` written in C among them; it was missing from the steps
    (model_programs seed 933167). Torch is the oracle: what the list holds, and the error as plain code raises it."""

    def run(lens=None):
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(11, 4), torch.nn.Linear(4, 1)

        def module_hook(module, grad_input, grad_output):
            raise ValueError("h1")

        emb.register_full_backward_hook(module_hook)
        out = emb(torch.randint(0, 11, (2, 3)))
        appended: list = []
        out.grad_fn.register_prehook(appended.append)
        loss = head(out).sum()
        with lens if lens is not None else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's: the hook fires for outputs, no input needs a gradient
            try:
                loss.backward()
            except ValueError as error:
                return appended, str(error)
        return appended, None

    plain_appended, plain_error = run()
    lens = al.Lens()
    appended, error = run(lens)
    assert plain_error == error == "h1" and len(plain_appended) == len(appended) == 1
    assert torch.equal(plain_appended[0][0], appended[0][0])
    calls = lens.hook_calls
    assert [(call.hook, call.kind) for call in calls] == [("list.append", "node_pre"), ("module_hook", "module_full")]
    append, raised = calls
    assert "written in C" in append.unseen and raised.error == "ValueError: h1"
    assert "stopped with an error in module_hook, which ran after this node's backward" in append.unseen
    assert append.grad_in is None or torch.equal(append.grad_in[0], appended[0][0])
