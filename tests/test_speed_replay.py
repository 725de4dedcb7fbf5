"""The short ways of the values without hooks (issue #24, the halving-hook row), counted, never timed; and what each
short way gives is what the general way gives, and what plain torch gives in a run without the hooks.

- ``Unhooked._input_of``: an output with one user and no root seed is that user's value as is (the general way,
  ``Unhooked._summed``, sorts the arrivals and adds them up from None); only other outputs are summed.
- ``replay.reduce_outputs``: the shape and dtype each result is reduced to are those of what the node really sent
  (the engine's ``validate_outputs`` made it so before any post-hook, and torch refuses a Python post-hook's result
  of another size or type); ``_input_metadata`` is read only where that is not a plain tensor.
- ``replay.run_again``: a node type's kind is found once per type, and each saved tensor read once for both
  questions (packed by a saved-tensor hook? a Python-dispatch subclass?).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import replay, unhooked
from autograd_lens.model import TensorSummary, values_equal
from test_speed_unhooked import _program, _warm_up


def _mlp(hooked: bool, depth: int = 4):
    """Linear + Tanh layers, batch 5 (the bias's gradient is summed over the batch: sum_to_size), a halving hook
    on every Tanh output when ``hooked``.  Returns (the names for the lens, each parameter's .grad by name)."""
    torch.manual_seed(0)
    net = nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(4, 4), nn.Tanh())])
    x = torch.randn(5, 4)
    h = x
    for layer in net:
        h = layer(h)
        if hooked and isinstance(layer, nn.Tanh):
            h.register_hook(lambda g: g * 0.5)
    h.pow(2).sum().backward()
    return {"net": net, "x": x}, {f"net.{name}": p.grad for name, p in net.named_parameters()}


def _traced(make):
    with al.Lens() as lens:
        grads = make()
    return lens, grads


def _same(first, second) -> bool:
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.dtype == second.dtype \
            and first.shape == second.shape and values_equal(first, second)
    if isinstance(first, tuple) and isinstance(second, tuple):
        return len(first) == len(second) and all(map(_same, first, second))
    return first == second


def _without_hooks_are_plain_torchs(lens, expected) -> None:
    backward_pass = lens.passes[0]
    assert backward_pass.unknown == {}
    for name, grad in expected.items():
        shown = backward_pass.grads_without_hooks[name]
        assert shown.dtype == grad.dtype and torch.equal(shown, grad), name


def test_an_output_with_one_user_is_not_summed(monkeypatch):
    _warm_up()
    summed, asked = [], []
    summing, asking = unhooked.Unhooked._summed, unhooked.Unhooked._input_of

    def counting_sums(self, fn, output_nr, users, hooked):
        summed.append((fn.name(), len(users)))
        return summing(self, fn, output_nr, users, hooked)

    def counting_asks(self, fn, output_nr, hooked):
        asked.append(fn.name())
        return asking(self, fn, output_nr, hooked)

    monkeypatch.setattr(unhooked.Unhooked, "_summed", counting_sums)
    monkeypatch.setattr(unhooked.Unhooked, "_input_of", counting_asks)
    _, expected = _mlp(hooked=False)
    lens, _ = _traced(lambda: _mlp(hooked=True))
    _without_hooks_are_plain_torchs(lens, expected)
    assert len(asked) >= 4 * 5  # every node below the last layer's hook (Tanh, Addmm, T, two leaves per layer)
    assert summed == [("SumBackward0", 0)]  # the root, with its seed; before: every one (sorted, added up from None)
    # a tensor used twice (two users) and a root with gradient=: summed there, and only there
    summed.clear()
    x = torch.randn(3, requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        y = x * 2
        y.register_hook(lambda g: g * 0.5)
        z = y.sin() + y.cos()
        z.backward(torch.ones(3))
    assert set(summed) == {("AddBackward0", 0), ("MulBackward0", 2)}, summed
    plain = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        plain.copy_(x)
    y = plain * 2
    (y.sin() + y.cos()).backward(torch.ones(3))
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], plain.grad)


@pytest.mark.parametrize("store_limit", [4096, 8])
def test_the_short_way_to_an_input_gives_what_the_sum_gives(monkeypatch, store_limit):
    """Every input asked for (by the replay, by the steps' "before the hooks", by autograd.grad's results) is
    compared with the general way's; with a small ``store_limit`` the users' values are summaries (unknown)."""
    _warm_up()
    asking, seen = unhooked.Unhooked._input_of, []

    def checked(self, fn, output_nr, hooked):
        got = asking(self, fn, output_nr, hooked)
        users = self.observer.shape.consumers.get((id(fn), output_nr), ())
        general = self._summed(fn, output_nr, users, hooked)
        if not self.observer.python_edits or hooked:
            assert _same(got, general), (fn.name(), output_nr, hooked)
        seen.append((fn.name(), type(got).__name__))
        return got

    monkeypatch.setattr(unhooked.Unhooked, "_input_of", checked)
    with al.Lens(store_limit=store_limit):
        _mlp(hooked=True)
    with al.Lens(store_limit=store_limit):
        _program(hooked=True, custom=False)
    with al.Lens(store_limit=store_limit):
        _program(hooked=True)  # a custom Function: unknown past it
    kinds = {kind for _, kind in seen}
    assert "Tensor" in kinds and "Unknown" in kinds
    assert store_limit > 8 or any(name == "TanhBackward0" and kind == "Unknown" for name, kind in seen)


def test_no_input_metadata_is_read_where_the_node_sent_a_tensor(monkeypatch):
    _warm_up()
    caches = []
    running = unhooked.run_again

    def keeping(fn, grads, nexts=None, metadata=None, sent=None):
        caches.append(metadata)
        return running(fn, grads, nexts, metadata, sent)

    monkeypatch.setattr(unhooked, "run_again", keeping)
    _, expected = _mlp(hooked=False)
    lens, _ = _traced(lambda: _mlp(hooked=True))
    _without_hooks_are_plain_torchs(lens, expected)
    assert len(caches) >= 4 * 3 and all(cache is caches[0] for cache in caches)
    assert caches[0] == {}  # before: one (shape, dtype) read for each of the 4 * 5 edges run again


def test_a_post_hook_that_sends_none_makes_the_metadata_read_there(monkeypatch):
    """A node post-hook may replace what its node sent with None (torch allows it; another size or type it
    refuses): where the real pass then sent None, the shape and dtype come from the receiver's metadata, and the
    values without hooks are plain torch's."""
    _warm_up()
    reads = []
    running = unhooked.run_again

    def keeping(fn, grads, nexts=None, metadata=None, sent=None):
        before = len(metadata)
        got = running(fn, grads, nexts, metadata, sent)
        reads.append((fn.name(), len(metadata) - before))
        return got

    def program(hooked: bool):
        torch.manual_seed(0)
        w = torch.randn(4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(3, 1, requires_grad=True)
        b2 = torch.randn(2, requires_grad=True)
        h = (b + torch.randn(3, 4)) * 2  # b's gradient: summed to (3, 1)
        cast = h.double()
        m = b2 * 3
        if hooked:
            cast.grad_fn.register_hook(lambda sent, received: (None,))  # ToCopyBackward0 sends None on
            m.register_hook(lambda g: g * 0.5)
        ((cast * w).sum() + m.sum()).backward()
        return {"w": w.grad, "b": b.grad, "b2": b2.grad}

    expected = program(hooked=False)
    monkeypatch.setattr(unhooked, "run_again", keeping)
    with al.Lens() as lens:
        got = program(hooked=True)
    assert got["b"] is None  # the post-hook stopped b's gradient
    backward_pass = lens.passes[0]
    assert backward_pass.unknown == {}
    for name, grad in expected.items():
        shown = backward_pass.grads_without_hooks[name]
        assert shown.dtype == grad.dtype and torch.equal(shown, grad), name
    # where the real pass sent None (the post-hook's node, and the nodes below it): read; b2 * 3's node sent a tensor
    assert sorted(reads) == [("AddBackward0", 1), ("MulBackward0", 0), ("MulBackward0", 1), ("ToCopyBackward0", 1)]


def test_reduced_with_what_was_sent_equals_reduced_with_the_metadata(monkeypatch):
    """Broadcasting (sum_to_size), a dtype change, a module hook boundary, a split: each node's results reduced
    with the shapes of what it sent are those reduced with ``_input_metadata``, read afresh."""
    _warm_up()
    reducing, compared = replay.reduce_outputs, []

    def checked(fn, outputs, nexts=None, known=None, sent=None):
        got = reducing(fn, outputs, nexts, known, sent)
        assert _same(got, reducing(fn, outputs)), fn.name()
        compared.append(fn.name())
        return got

    monkeypatch.setattr(replay, "reduce_outputs", checked)
    with al.Lens() as lens:
        _program(hooked=True, custom=False)
    assert {"AddBackward0", "ToCopyBackward0", "SplitBackward0", "BackwardHookFunctionBackward"} <= set(compared)
    assert lens.passes[0].unknown == {}


def test_kinds_and_saved_tensors_are_asked_as_before():
    """``run_again``'s per-type answer, and ``packed``'s single read of the saved tensors, for the node types of
    the programs above, one packed by a saved-tensor hook."""
    _warm_up()
    from autograd_lens.capture.saved import saved_tensors_packed

    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        packed_tanh = torch.tanh(x)
    nodes = [packed_tanh.grad_fn, torch.tanh(x).grad_fn, (x @ x.t()).grad_fn, x.t().grad_fn, x.sum().grad_fn]
    assert [replay.packed(fn) for fn in nodes] == [saved_tensors_packed(fn) for fn in nodes] == \
        [True, False, False, False, False]
    kinds = [replay._kind_of(type(fn)) for fn in nodes]
    assert kinds == [replay._RUN] * 5
    boundary = nn.Linear(2, 2)
    boundary.register_full_backward_hook(lambda module, gi, go: None)
    node = boundary(torch.randn(1, 2, requires_grad=True)).grad_fn
    assert replay._kind_of(type(node)) == replay._IDENTITY and node.name() == "BackwardHookFunctionBackward"
    assert isinstance(replay.run_node(packed_tanh.grad_fn, [torch.ones(3, 4)]), replay.Unknown)
    assert not isinstance(replay.run_node(nodes[1], [torch.ones(3, 4)]), (replay.Unknown, TensorSummary))
