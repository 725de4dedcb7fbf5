"""What the lens does at each node while backward runs (issue #24), counted, never timed: its cheaper paths record what
the general ones record.

- ``nodes._record_node`` copies what a usual node received and sent in one loop (``records.copy_tuple``), without
  ``_keep``, and skips ``_unexplained`` where each gradient that arrived is the copy of what its one user sent; a node
  with a hook written in C goes the general way, which the tests force on every node to compare.
- ``calls.HookCalls._profile`` answers the call and return of the lens's own node hooks first, without the general
  path (whose ``code in self._own_codes`` hashes a code object at every node).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import calls as calls_module
from autograd_lens.capture.nodes import NodeRecorder
from autograd_lens.capture.observe import PassObserver
from autograd_lens.capture.records import snapshot_all as _snapshot_all


def _mlp(grads_before: bool = False):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    if grads_before:
        for parameter in net.parameters():
            parameter.grad = torch.ones_like(parameter)
    return {"net": net, "x": x}, lambda: net(x).pow(2).sum().backward()


def _branches():
    torch.manual_seed(1)
    a = torch.randn(6, requires_grad=True)
    w = torch.randn(3, 2, requires_grad=True)
    b = torch.randn(2, requires_grad=True)

    def run():
        left, right = a.split(3)  # a multi-output node; one output unused below: a None gradient
        h = (left.unsqueeze(1) * w).t() + b.unsqueeze(1)  # transposed and broadcast gradients
        z = h.exp().sum() + (right[:2] * 2).sum() + a.sum() * 0.5  # a used three times
        z.backward()
    return {"a": a, "w": w, "b": b}, run


def _large():
    torch.manual_seed(2)
    w = torch.randn(80, 80, requires_grad=True)  # past store_limit=1000 below: summaries
    v = torch.randn(3, requires_grad=True)
    return {"w": w, "v": v}, lambda: ((w @ w).tanh().sum() + (v * v).sum()).backward()


def _double():
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)

    def run():
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)  # gradients that require grad
        g.sum().backward()
    return {"x": x}, run


PROGRAMS = {"mlp": (_mlp, {}), "mlp_grads_before": (lambda: _mlp(True), {}), "branches": (_branches, {}),
            "large": (_large, {"store_limit": 1000}), "budget": (_mlp, {"memory_budget": 200}),
            "double": (_double, {})}


def _text(lens) -> str:
    return "\n".join(repr((p.node_runs, p.hook_calls, p.events, p.grads, p.grads_without_hooks, p.notes))
                     for p in lens.passes)


def _record(case: str, monkeypatch, everywhere: bool) -> tuple[str, int]:
    """The text of the passes of ``case``, and how many tuples ``_keep`` copied; ``everywhere``: every node taken for
    one with a hook written in C (the general way, as before the cheaper paths)."""
    make, options = PROGRAMS[case]
    with monkeypatch.context() as patch:
        if everywhere:
            start = PassObserver.start

            def start_everywhere(self):
                start(self)
                self.c_nodes.update(id(fn) for fn in self.shape.nodes)

            patch.setattr(PassObserver, "start", start_everywhere)
        kept_tuples = []
        keep = NodeRecorder._keep

        def counting(self, value):
            if type(value) is tuple:
                kept_tuples.append(len(value))
            return keep(self, value)

        patch.setattr(NodeRecorder, "_keep", counting)
        names, run = make()
        with al.Lens(names=names, **options) as lens:
            run()
    return _text(lens), len(kept_tuples)


@pytest.mark.parametrize("case", PROGRAMS)
def test_usual_nodes_record_what_the_general_way_records(case, monkeypatch):
    with al.Lens():  # the once-per-process self-check traces a pass of its own: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    fast, fast_tuples = _record(case, monkeypatch, everywhere=False)
    general, general_tuples = _record(case, monkeypatch, everywhere=True)
    assert fast == general
    assert "tensor(" in fast  # values are in the text compared
    # the usual nodes took the inline copies (past the memory budget, _keep's summaries)
    assert general_tuples > fast_tuples and (fast_tuples == 0) == (case != "budget")
    if case == "budget":
        assert "memory_budget" in fast and "TensorSummary" in fast  # crossed mid-pass: later values summarised
    if case == "large":
        assert "TensorSummary" in fast


def test_each_gradient_a_node_sent_is_copied_once():
    """What a node received is the very copy of what its one user sent: one copy per gradient sent."""
    names, run = _mlp()
    with al.Lens(names=names) as lens:
        run()
    runs = lens.passes[0].node_runs
    sent = [value for run in runs for value in run.grad_out if isinstance(value, torch.Tensor)]
    received = [value for run in runs for value in run.grad_in if isinstance(value, torch.Tensor)]
    assert len(runs) == 7 and len(sent) == 10 and len(received) == 7
    assert len({id(value) for value in sent}) == len(sent)  # each a copy of its own
    assert {id(value) for value in received[1:]} <= {id(value) for value in sent}  # (the first: the loss's seed)
    net = names["net"]
    assert torch.equal(lens.passes[0].grads["net.0.weight"], net[0].weight.grad)


class _CountingCodes(frozenset):
    """``_own_codes`` that counts how often the profile function's general path looks a code up in it."""

    lookups = 0

    def __contains__(self, code):
        _CountingCodes.lookups += 1
        return frozenset.__contains__(self, code)


def _hooked(monkeypatch, general: bool) -> tuple[str, int, int]:
    """A pass with Python hooks of every kind around the lens's own node hooks (a tensor hook, a node pre- and
    post-hook, a post-accumulate hook, a leaf with a .grad, a backward run inside a hook); ``general``: the profile
    function takes the lens's own hooks the general way."""
    with monkeypatch.context() as patch:
        if general:
            patch.setattr(calls_module, "NODE_CODE", None)
            patch.setattr(calls_module, "WRITE_CODE", None)
        patch.setattr(PassObserver, "_own_codes", _CountingCodes(PassObserver._own_codes))
        _CountingCodes.lookups = 0
        torch.manual_seed(0)
        w = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(4, requires_grad=True)
        w.grad = torch.ones(3, 4)
        b.register_post_accumulate_grad_hook(lambda leaf: None)
        h = torch.tanh(torch.randn(2, 3) @ w + b)

        def nested(g):
            side = torch.ones(1, requires_grad=True)
            with torch.enable_grad():  # (grad mode is off inside hooks)
                (side * 2).sum().backward()  # a backward inside a hook: not this pass
            return g * 0.5

        h.register_hook(nested)
        z = h * h
        z.grad_fn.register_prehook(lambda grads: (grads[0] * 3,))
        z.grad_fn.register_hook(lambda sent, got: None)
        with al.Lens(names={"w": w, "b": b, "h": h, "z": z}) as lens:
            z.sum().backward()
    return _text(lens), _CountingCodes.lookups, len(lens.passes[0].node_runs)


def test_the_profile_function_answers_the_lens_own_hooks_first(monkeypatch):
    with al.Lens():  # the self-check: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    fast, fast_lookups, runs = _hooked(monkeypatch, general=False)
    general, general_lookups, _ = _hooked(monkeypatch, general=True)
    assert fast == general
    assert "'nested'" in fast and "tensor([[" in fast
    assert runs == 5 and fast_lookups == 4  # the calls of the four user hooks, the nested backward's none
    # the general way also looked up the lens's own post-hook at each node (and at w's and b's AccumulateGrad), and
    # its pre-hook on those two (w has a .grad, b a post-accumulate hook)
    assert general_lookups == fast_lookups + runs + 2 + 2


def test_an_unnamed_tensors_hook_on_a_one_output_function_is_placed_without_comparing(monkeypatch):
    """placing._output_of: a hook on an unnamed tensor belongs to the output whose gradient equals what it passed on;
    a function with one output has only that one to compare, so nothing is copied or compared there."""
    from autograd_lens.capture import placing

    with al.Lens():  # the self-check: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    compared = []
    equal = placing.values_equal

    def counting(first, second):
        compared.append(1)
        return equal(first, second)

    monkeypatch.setattr(placing, "values_equal", counting)
    def run(x):
        h = x.tanh()
        h.register_hook(lambda g: g * 2)  # unnamed, on the one output of TanhBackward0
        a, b = h.split(2)
        b.register_hook(lambda g: g + 1)  # unnamed, on output 1 of SplitBackward0
        (a * 3 + b).sum().backward()

    plain = torch.tensor([0.1, 0.2, 0.3, 0.4], requires_grad=True)
    run(plain)
    x = torch.tensor([0.1, 0.2, 0.3, 0.4], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        run(x)
    split, tanh = lens.passes[0].hook_calls
    assert (split.target, tanh.target) == ("split[1]", "tanh")
    assert torch.equal(split.grad_out, torch.tensor([2.0, 2.0]))
    assert torch.equal(tanh.grad_in, torch.tensor([3.0, 3.0, 2.0, 2.0]))
    assert torch.equal(x.grad, plain.grad) and torch.equal(lens.passes[0].grads["x"], plain.grad)
    assert len(compared) == 0  # split[1]: found by the very copy it received (no value compared); none at tanh's


def _counting_leaf_steps(monkeypatch) -> list:
    """Calls of the general way's steps for a leaf (``_written``, ``check_write``), as they happen."""
    from autograd_lens.capture.ending import PassEnd

    steps = []
    written, check = NodeRecorder._written, PassEnd.check_write

    def counting_written(self, grad, grad_outputs):
        steps.append("_written")
        return written(self, grad, grad_outputs)

    def counting_check(self, fn, incoming, record, fresh):
        steps.append("check_write")
        return check(self, fn, incoming, record, fresh)

    monkeypatch.setattr(NodeRecorder, "_written", counting_written)
    monkeypatch.setattr(PassEnd, "check_write", counting_check)
    return steps


def test_a_usual_leaf_is_recorded_in_one_call(monkeypatch):
    """records.usual_leaf: a leaf whose .grad autograd made from the one gradient its one user sent (adopted, no copy)
    is recorded without the general way's _written and check_write; what is recorded is what the general way records
    (test_usual_nodes_record_what_the_general_way_records forces the general way on every node, leaves included)."""
    with al.Lens():  # the self-check: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    steps = _counting_leaf_steps(monkeypatch)
    names, run = _mlp()
    with al.Lens(names=names) as lens:
        run()
    net = names["net"]
    assert steps == []  # before records.usual_leaf: 4 x (_written, check_write)
    assert len(lens.passes[0].node_runs) == 7
    for name, parameter in net.named_parameters():
        assert torch.equal(lens.passes[0].grads[f"net.{name}"], parameter.grad)
        assert torch.equal(lens.passes[0].grads_without_hooks[f"net.{name}"], parameter.grad)


def test_leaves_the_usual_way_cannot_take_go_the_general_way(monkeypatch):
    """A .grad there before the pass (the lens's pre-hook read it), or a leaf used three times (its gradients summed
    before the write): the general way, as before."""
    with al.Lens():  # the self-check: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    steps = _counting_leaf_steps(monkeypatch)
    names, run = _mlp(grads_before=True)
    with al.Lens(names=names):
        run()
    assert steps.count("_written") == 4
    steps.clear()
    names, run = _branches()
    with al.Lens(names=names) as lens:
        run()
    assert steps.count("_written") == 1  # a (three users, summed); w and b the usual way
    assert torch.equal(lens.passes[0].grads["a"], names["a"].grad)


@pytest.mark.parametrize("hook, edits, modified", [
    (lambda g: g * 0.5, False, True),
    (lambda g: None, False, False),
    (lambda g: g.mul_(2) * 0.25, True, True),  # edits what it received, and returns another tensor
    (lambda g: g.mul_(2) * 0.5, True, False),  # ... whose values are those it received
    (lambda g: g.mul_(2), True, True),  # returns the very tensor it edited
    (lambda g: g.clone().mul_(2), False, True),  # edits its own copy
])
def test_a_tensor_hooks_return_is_copied_once_and_compared_as_its_copy_would_be(hook, edits, modified, monkeypatch):
    """calls._end: what a tensor hook returned (or, returning None, what it received) is copied by fast_snapshot
    (no snapshot_all), and whether a hook that returned a new tensor also edited the one it received is read from
    that tensor itself (plain, within the limit), not from a second copy of it.  Values as plain torch has them."""
    def program(lens=None):
        torch.manual_seed(3)
        w = torch.randn(4, 3, requires_grad=True)
        x = torch.randn(2, 4)
        h = (x @ w).tanh()
        h.register_hook(hook)
        if lens is None:
            (h * h).sum().backward()
        else:
            with lens:
                (h * h).sum().backward()
        return w
    plain = program()
    with al.Lens():  # the self-check: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    copies = []
    monkeypatch.setattr(calls_module, "snapshot_all", lambda *args: copies.append(args) or _snapshot_all(*args))
    lens = al.Lens()
    traced = program(lens)
    assert torch.equal(traced.grad, plain.grad)
    (call,) = lens.passes[0].hook_calls
    assert copies == []  # before: one for what it returned (or received), one more for the received, for a new tensor
    assert call.edited_in_place is edits
    assert call.modified is modified
    assert torch.equal(lens.passes[0].grads["w"], plain.grad)
