"""Hooks on every layer (issue #24's hook rows), counted, never timed: the copies the lens makes again after a hook
ran are replaced by exact comparisons where that is exact, and everything recorded is what the copies recorded.

- ``finalgrad.final_grad``: a Python hook call forgets the copy cache (a hook may edit a gradient through ``.data``,
  unseen by the version counter), so each leaf's ``.grad`` was copied again at the end of the pass and compared with
  the copy taken at its write.  Now the live ``.grad`` is compared bit for bit (``bits.same_bits``) with that copy,
  which stands for it when every bit, the dtype, the shape and the strides are the same.
- ``calls._end``: a tensor hook that returned None had what it received copied again after it ran (it may have
  edited it in place); now, when that tensor holds exactly the bits of the copy taken as it was called, that copy is
  what it passed on too (one object: ``grad_in is grad_out``).
- ``calls._end``, a hook that returned another tensor: whether it changed the gradient was ``values_equal``'s answer,
  which, for values that differ, looks for a NaN with ``isnan().any()`` (a mask as large as the gradient); now
  ``bits.values_differ`` asks a sum first (not NaN: no NaN element), and whether it also edited what it received is
  first a bitwise comparison.
- ``shared.shared_leaves`` (asked once a pass when a hook ran): the memory span of every leaf's ``.grad`` was read
  to find two that overlap; now only of those whose ``.grad`` shares its storage with another leaf's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import bits, finalgrad
from autograd_lens.capture import calls as calls_module
from autograd_lens.capture import shared as shared_module
from autograd_lens.capture import nodes as nodes_module
from autograd_lens.capture.snapshot import snapshot


def _bits(value: torch.Tensor) -> torch.Tensor:
    return value.contiguous().view(torch.int32) if value.dtype == torch.float32 else value


def _same(first, second) -> bool:
    return first.dtype == second.dtype and first.shape == second.shape and torch.equal(_bits(first), _bits(second))


def _self_check():
    with al.Lens():  # the once-per-process self-check traces a pass of its own: before counting
        torch.ones(1, requires_grad=True).sum().backward()


def _hooked_mlp(hook, depth: int = 3):
    torch.manual_seed(0)
    net = nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(4, 4), nn.Tanh())])
    x = torch.randn(5, 4)

    def run():
        h = x
        for layer in net:
            h = layer(h)
            if isinstance(layer, nn.Tanh):
                h.register_hook(hook)
        h.pow(2).sum().backward()
    return {"net": net, "x": x}, run


def _text(lens) -> str:
    return "\n".join(repr((p.node_runs, p.hook_calls, p.events, p.grads, p.grads_without_hooks, p.notes))
                     for p in lens.passes)


def _traced(make, hook, monkeypatch, exact: bool):
    """The passes' text and each leaf's shown .grad; ``exact`` False: no bitwise comparison (every .grad copied
    again at the end, as before)."""
    with monkeypatch.context() as patch:
        if not exact:
            patch.setattr(finalgrad, "same_bits", lambda *args: False)
        names, run = make(hook)
        with al.Lens(names=names) as lens:
            run()
    return _text(lens), lens.passes[0].grads, names


@pytest.mark.parametrize("hook", [lambda g: None, lambda g: g * 0.5], ids=["none", "halving"])
def test_no_leaf_grad_is_copied_again_at_the_end_when_it_is_as_written(hook, monkeypatch):
    _self_check()
    final_copies = []
    copy = nodes_module.snapshot

    def counting(value, limit, magnitudes=False):
        if magnitudes:  # final_grad's, through NodeRecorder.copied
            final_copies.append(value)
        return copy(value, limit, magnitudes)

    monkeypatch.setattr(nodes_module, "snapshot", counting)
    names, run = _hooked_mlp(hook)
    with al.Lens(names=names) as lens:
        run()
    assert final_copies == []  # before: 4 of the 6 leaves (those written before the last hook call) copied again
    for name, parameter in names["net"].named_parameters():
        assert _same(lens.passes[0].grads[f"net.{name}"], parameter.grad)


def _editing(edit):
    """A hook on an early layer's output that edits, through ``.data`` (no version change), the .grad of the last
    layer's weight, written before it runs."""
    def make(hook):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
        with torch.no_grad():  # h[:, 0] = tanh(0) = 0: the last weight's .grad[:, 0] is written as 0.0
            net[0].weight[0] = 0.0
            net[0].bias[0] = 0.0
        x = torch.randn(4, 3)

        def run():
            h = net[1](net[0](x))

            def editing(g):
                edit(net[2].weight.grad.data)
                return hook(g)
            h.register_hook(editing)
            net[2](h).pow(2).sum().backward()
        return {"net": net, "x": x}, run
    return make


EDITS = {
    "doubled": lambda data: data.mul_(2),
    "minus zero": lambda data: data.__setitem__((0, 0), -0.0),  # equal values, other bits
    "nan": lambda data: data.__setitem__((1, 1), float("nan")),
    "unchanged": lambda data: None,
}


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("hook", [lambda g: None, lambda g: g * 0.5], ids=["none", "halving"])
def test_an_edit_through_data_after_the_write_is_shown_as_torch_has_it(edit, hook, monkeypatch):
    _self_check()
    fast, grads, names = _traced(_editing(EDITS[edit]), hook, monkeypatch, exact=True)
    copied, _, _ = _traced(_editing(EDITS[edit]), hook, monkeypatch, exact=False)
    assert fast == copied
    weight = names["net"][2].weight.grad
    assert _same(grads["net.2.weight"], weight)
    if edit == "minus zero":
        assert torch.signbit(grads["net.2.weight"][0, 0]) and not torch.signbit(grads["net.2.weight"][1, 0])
        assert grads["net.2.weight"][1, 0] == 0


def test_same_bits_is_exact():
    a = torch.randn(3, 4)
    assert bits.same_bits(a, a.clone(), 100)
    zero = torch.zeros(3)
    assert not bits.same_bits(zero, -zero, 100)  # equal values, other bits
    nan = torch.tensor([float("nan"), 1.0])
    assert bits.same_bits(nan, nan.clone(), 100)
    other_nan = nan.clone()
    other_nan.view(torch.int32)[0] += 1  # another NaN payload
    assert not bits.same_bits(nan, other_nan, 100)
    assert not bits.same_bits(a, a.double(), 100)  # another dtype
    assert not bits.same_bits(a.t(), a.t().contiguous(), 100)  # other strides: a new copy would keep these
    assert bits.same_bits(a.t(), snapshot(a.t()), 100)
    expanded = torch.tensor(3.0).expand(2, 3)
    assert bits.same_bits(expanded, snapshot(expanded), 100)
    assert not bits.same_bits(a, a.clone(), 5)  # past the limit: a summary, not a copy
    assert not bits.same_bits(a.requires_grad_(), a.detach().clone(), 100)
    complex_ = torch.randn(3, dtype=torch.complex64)
    assert not bits.same_bits(complex_.conj(), complex_.conj().clone(), 100)  # the copy holds resolved values
    assert bits.same_bits(complex_, complex_.clone(), 100)
    assert not bits.same_bits(a.detach(), torch.nn.Parameter(a.detach().clone()), 100)


def _one_hook(hook, zero: bool = False):
    torch.manual_seed(3)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 4)
    if zero:
        x[:, :] = 0.0  # h = tanh(0): the hook receives 2 * h * 1 = exactly 0.0 everywhere

    def run():
        h = (x @ w).tanh()
        h.register_hook(hook)
        (h * h).sum().backward()
    return {"w": w, "x": x}, run


def _hook_calls(hook, monkeypatch, exact: bool, zero: bool = False):
    copies = []
    copy_out = calls_module._copy_out
    with monkeypatch.context() as patch:
        patch.setattr(calls_module, "_copy_out", lambda *args: copies.append(args) or copy_out(*args))
        if not exact:
            patch.setattr(calls_module, "same_bits", lambda *args: False)
        names, run = _one_hook(hook, zero)
        with al.Lens(names=names) as lens:
            run()
    plain_names, plain_run = _one_hook(hook, zero)
    plain_run()
    assert _same(lens.passes[0].grads["w"], plain_names["w"].grad)
    return lens, len(copies)


def _minus_zero(g):
    g.data[0, 0] = -0.0  # equal values, other bits (no version change)


@pytest.mark.parametrize("hook, copied, zero", [
    (lambda g: None, 0, False),
    (lambda g: (g.data.mul_(1), None)[1], 0, False),  # wrote the same bits
    (lambda g: (g.data.mul_(2), None)[1], 1, False),  # edited through .data: no version change
    (lambda g: (g.mul_(2), None)[1], 1, False),
    (_minus_zero, 1, True),
    (lambda g: g * 0.5, 1, False),  # returned a new tensor: copied
], ids=["none", "same bits", "data", "in place", "minus zero", "halving"])
def test_a_tensor_hook_returning_none_passes_on_its_received_copy_when_the_bits_are_the_same(hook, copied, zero,
                                                                                             monkeypatch):
    _self_check()
    lens, copies = _hook_calls(hook, monkeypatch, exact=True, zero=zero)
    general, general_copies = _hook_calls(hook, monkeypatch, exact=False, zero=zero)
    assert copies == copied and general_copies == 1  # before: a copy for every call
    assert _text(lens) == _text(general)
    (call,) = lens.passes[0].hook_calls
    (before,) = general.passes[0].hook_calls
    assert (call.grad_out is call.grad_in) == (copied == 0)
    assert _same(call.grad_out, before.grad_out) and _same(call.grad_in, before.grad_in)
    assert (call.modified, call.edited_in_place, call.returned_none) == \
        (before.modified, before.edited_in_place, before.returned_none)
    if zero:  # what it passed on holds -0.0 where it received 0.0 (values_equal: equal, so not "modified")
        assert torch.signbit(call.grad_out[0, 0]) and not torch.signbit(call.grad_in[0, 0])


def test_shared_leaves_reads_spans_only_of_grads_sharing_a_storage(monkeypatch):
    _self_check()
    spans = []
    span_of = shared_module.span_of
    monkeypatch.setattr(shared_module, "span_of", lambda tensor: spans.append(tensor) or span_of(tensor))
    names, run = _hooked_mlp(lambda g: None)
    with al.Lens(names=names) as lens:
        run()
    assert spans == []  # before: one per leaf (6)
    assert all(isinstance(value, torch.Tensor) for value in lens.passes[0].grads_without_hooks.values())
    # two leaves' .grads in one storage (set before the pass, added to in it): both read, and both unknown unhooked
    torch.manual_seed(0)
    buffer = torch.zeros(10)
    a, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    a.grad, b.grad = buffer[:4], buffer[2:6]  # overlapping
    c = torch.randn(4, requires_grad=True)
    c.grad = buffer[6:]  # the same storage, apart from both
    h = a * b * c
    h.register_hook(lambda g: g * 2)
    with al.Lens(names={"a": a, "b": b, "c": c}) as lens:
        h.sum().backward()
    assert len(spans) == 3
    history = lens._history
    assert [getattr(history.get(id(t)), "shared", None) for t in (a, b, c)] == [True, True, False]


def _values():
    torch.manual_seed(5)
    a = torch.randn(4, 3)
    nan = torch.tensor([float("nan"), 1.0])
    infs = torch.tensor([float("inf"), -float("inf"), 1.0])  # sum NaN with no NaN element
    zero = torch.zeros(3)
    half = torch.randn(4, dtype=torch.float16) * 60000  # sums to inf
    complex_ = torch.randn(3, dtype=torch.complex64)
    return [(a, a * 0.5), (a, a.clone()), (a, a.double()), (a, a[:2]), (a, a.t()), (a.t(), a.t().clone()),
            (nan, nan.clone()), (nan, torch.tensor([float("nan"), 2.0])), (torch.tensor([1.0, 2.0]), nan),
            (infs, infs.clone()), (infs, infs * 2), (infs, torch.tensor([float("inf"), -float("inf"), 2.0])),
            (zero, -zero), (zero, zero + 1), (torch.arange(3), torch.arange(3) + 1), (torch.arange(3), torch.arange(3)),
            (complex_, complex_ * 2), (complex_, complex_.clone()), (half, half * 0.5), (half, half.clone()),
            (None, None), (a, None), ((a, a), (a, a.clone())), ((a,), (a * 2,))]


def test_values_differ_is_not_values_equal():
    from autograd_lens.model import values_equal
    for first, second in _values():
        assert bits.values_differ(first, second) is (not values_equal(first, second)), (first, second)


def test_a_changing_hook_is_compared_without_values_equal(monkeypatch):
    _self_check()
    asked = []
    values_equal = calls_module.values_equal
    monkeypatch.setattr(calls_module, "values_equal", lambda *args: asked.append(args) or values_equal(*args))
    names, run = _one_hook(lambda g: g * 0.5)
    with al.Lens(names=names) as lens:
        run()
    assert asked == []  # before: two (changed? edited what it received?), the first with a NaN mask
    (call,) = lens.passes[0].hook_calls
    assert call.modified and not call.edited_in_place
    assert torch.equal(call.grad_out, call.grad_in * 0.5)
