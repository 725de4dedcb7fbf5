"""``memory_budget`` across a training loop inside one Lens (docs/guarantees.md, "Bounded memory"): past the budget
every value a pass keeps is a summary (shape, dtype, min, max, norm, first entries), each leaf's final ``.grad`` and
each hook call's values included, so the bytes held stop growing with the passes; what the lens says of those passes
stays torch's, or says it is not known: a ``.grad`` written after the recording last saw it (by a later hook, as
DistributedDataParallel's all-reduce does) is found by comparing summaries, or said unknown where summaries cannot
be compared (NaN).  Each statement is checked against plain PyTorch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.model import GradWritten, TensorSummary
from autograd_lens.views.steps import steps_for


def _held(lens) -> int:
    """Bytes of the distinct tensor storages the passes' gradient values hold (summaries hold none)."""
    seen: set[int] = set()
    total = 0

    def walk(value):
        nonlocal total
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    for p in lens.passes:
        for field in ("leaf_grads", "grads_without_hooks", "added", "added_without_hooks"):
            walk(getattr(p, field))
        for run in p.node_runs:
            walk((run.grad_in, run.grad_out))
        for call in p.hook_calls:
            walk((call.grad_in, call.grad_out, call.context))
        for event in p.events:
            if isinstance(event, GradWritten):
                walk((event.grad, event.received))
    return total


def _agrees(summary, tensor) -> bool:
    """A summary the lens kept says what torch's tensor holds: shape, dtype, min, max, norm, first entries."""
    flat = tensor.detach().reshape(-1).double()
    same = lambda x, y: x == y or x != x and y != y  # noqa: E731  (NaN is NaN)
    return isinstance(summary, TensorSummary) and summary.shape == tuple(tensor.shape) \
        and same(summary.min, flat.min().item()) and same(summary.max, flat.max().item()) \
        and (math.isclose(summary.norm, flat.norm().item(), rel_tol=1e-5) or same(summary.norm, flat.norm().item())) \
        and all(map(same, summary.head, tensor.detach().reshape(-1)[:4].tolist())) and len(summary.head) == min(4, flat.numel())


def _training(passes: int, budget: int | None, seen: dict):
    """A small MLP trained by SGD, with a tensor hook (doubles), a module full backward hook (halves what it passes
    on), a post-accumulate hook (scales .grad in place): ``seen`` gets, per pass, what each hook got and gave and each
    parameter's .grad as torch left it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 40), nn.Tanh(), nn.Linear(40, 3))
    x, target = torch.randn(8, 6), torch.randn(8, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    seen.update(tensor=[], module=[], post=[], grads=[])

    def doubling(g):
        seen["tensor"].append((g.clone(), g * 2))
        return g * 2

    def halving(module, grad_input, grad_output):
        seen["module"].append((grad_input[0].clone(), grad_input[0] * 0.5, grad_output[0].clone()))
        return (grad_input[0] * 0.5,)

    def scaling(p):
        before = p.grad.clone()
        p.grad.mul_(0.25)
        seen["post"].append((before, p.grad.clone()))

    net[2].register_full_backward_hook(halving)
    net[0].weight.register_post_accumulate_grad_hook(scaling)

    def loop():
        for _ in range(passes):
            opt.zero_grad()
            h = net[0](x)
            h.register_hook(doubling)
            (net[2](net[1](h)) - target).pow(2).mean().backward()
            seen["grads"].append({name: p.grad.clone() for name, p in net.named_parameters()})
            opt.step()

    if budget is None:
        loop()
        return None
    with al.Lens(names={"net": net, "x": x}, memory_budget=budget) as lens:
        loop()
    return lens


def test_bytes_held_stop_growing_past_the_budget_and_the_summaries_are_torchs():
    budget = 20_000  # about two passes of copies
    held, lenses = [], []
    for passes in (6, 12):
        seen: dict = {}
        lens = _training(passes, budget, seen)
        held.append(_held(lens))
        lenses.append((lens, seen))
    assert held[1] == held[0], held  # before: each pass past the budget still copied .grad and hook values
    lens, seen = lenses[1]
    plain: dict = {}
    _training(12, None, plain)
    late = [index for index, p in enumerate(lens.passes) if index > 0 and p.kept_bytes == 0]
    assert late and late == list(range(late[0], 12)) and late[0] <= 4, [p.kept_bytes for p in lens.passes]
    assert sum(p.kept_bytes for p in lens.passes) <= budget + lens.passes[0].kept_bytes
    for index in late:
        p = lens.passes[index]
        assert any("memory_budget" in note and "summaries" in note for note in p.notes), p.notes
        for name, grad in seen["grads"][index].items():
            assert torch.equal(grad, plain["grads"][index][name])  # the lens changed nothing
            assert _agrees(p.leaf_grads[f"net.{name}"], grad), (index, name, p.leaf_grads[f"net.{name}"])
            without = p.grads_without_hooks[f"net.{name}"]
            assert without is None or _agrees(without, grad) and name.startswith("2.")  # unknown, or hooks-free
        calls = {call.kind: call for call in p.hook_calls}
        tensor_in, tensor_out = seen["tensor"][index]
        assert _agrees(calls["tensor"].grad_in, tensor_in) and _agrees(calls["tensor"].grad_out, tensor_out)
        assert calls["tensor"].modified
        module_in, module_out, module_context = seen["module"][index]
        module = next(call for call in p.hook_calls if call.kind.startswith("module"))
        assert _agrees(module.grad_in[0], module_in) and _agrees(module.grad_out[0], module_out) and module.modified
        assert _agrees(module.context[0], module_context)
        post_before, post_after = seen["post"][index]
        assert _agrees(calls["post_accumulate_grad"].grad_in, post_before)
        assert _agrees(calls["post_accumulate_grad"].grad_out, post_after) and calls["post_accumulate_grad"].modified


def test_hook_cards_past_the_budget_show_summaries_that_are_torchs():
    seen: dict = {}
    lens = _training(6, 20_000, seen)
    p = lens.passes[-1]
    assert p.kept_bytes == 0
    tensor_in, tensor_out = seen["tensor"][-1]
    cards = [step for step in steps_for(p) if step.kind == "hook"]
    assert len(cards) == 3
    text = " ".join(" ".join(step.lines) + " " + (step.note or "") for step in cards)
    # the summary of what it received and returned, as torch's values have it; no list of numbers
    for value in (tensor_in, tensor_out):
        assert f"[8x40 float32] min {_number(value.min())} max {_number(value.max())}" in text, text
    assert "[" + _number(tensor_in.reshape(-1)[0]) + "," not in text
    assert "gradient modified" in text
    # before: each leaf's final .grad a copy, what was drawn at its write a summary: "changed after it" (false)
    assert not any("at the end of the pass, not the" in " ".join(step.lines) + (step.note or "") for step in steps_for(p))


def _number(value) -> str:
    from autograd_lens.format import format_number
    return format_number(float(value))


def _late_writer(nan: bool, seen: list):
    """Each pass a new leaf a (so nothing earlier makes its value without hooks unknown): a's AccumulateGrad runs
    first; then a tensor hook on b's branch adds 1 to a.grad[5] (after the lens recorded a's write), returning None:
    without the hook, a.grad would be as written (``scale``: d(sum(a * scale))/da)."""
    torch.manual_seed(1)
    b = torch.randn(8, requires_grad=True)
    scale = torch.ones(8)
    if nan:
        scale[0] = float("nan")

    def run():
        a = torch.randn(8, requires_grad=True)
        if nan:  # (a .grad there as the pass starts: the lens reads it and what arrives before the write)
            a.grad = torch.zeros(8)

        def writes_a(g):
            seen.append(a.grad is not None)  # torch ran a's AccumulateGrad before this hook
            if a.grad is not None:
                a.grad[5] += 1.0
            return None

        b.grad = None
        yb = b * 3
        yb.register_hook(writes_a)
        first = yb.sum()
        ya = a * scale
        (first + ya.sum()).backward()
        return a.grad.clone(), b.grad.clone()

    return scale, run


@pytest.mark.parametrize("nan", [False, True], ids=["summaries_differ", "nan_cannot_compare"])
def test_a_late_grad_write_past_the_budget_is_found_or_said_unknown(nan):
    order: list = []
    scale, run = _late_writer(nan, order)
    with al.Lens(memory_budget=200) as lens:
        results = [run() for _ in range(4)]
    assert all(order) and len(order) == 4  # the hook wrote a.grad after it was written, in every pass
    assert not torch.equal(results[-1][0].nan_to_num(), scale.nan_to_num())  # not what it would be without hooks
    past = [p for p in lens.passes if p.kept_bytes == 0]
    assert len(past) >= 2
    for p, (grad_a, grad_b) in zip(lens.passes, results):
        leaf_a = p.leaf_grads["a"]
        assert _agrees(leaf_a, grad_a) if isinstance(leaf_a, TensorSummary) else \
            torch.allclose(leaf_a, grad_a, equal_nan=True)
        # before: past the budget, a.grad without hooks was shown as known: the value with the hook's write
        assert p.grads_without_hooks["a"] is None, (p.grads_without_hooks["a"], p.kept_bytes)
        reason = p.unknown["a"]
        assert ("summary" in reason and "not known" in reason) if nan and p.kept_bytes == 0 else \
            "changed after the last write" in reason and "writes_a" in reason, reason
        without_b = p.grads_without_hooks["b"]  # no hook changed b's: without hooks the same (torch's 3s)
        assert torch.equal(without_b, grad_b) if isinstance(without_b, torch.Tensor) else _agrees(without_b, grad_b)


def test_a_hook_that_only_reads_grad_past_the_budget_changes_nothing_said():
    """No late write: the summaries agree, and a.grad without hooks is torch's (nothing unknown made up)."""
    torch.manual_seed(2)
    a = torch.randn(8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    reads = []

    def reading(g):
        reads.append(a.grad.clone() if a.grad is not None else None)

    with al.Lens(names={"a": a, "b": b}, memory_budget=200) as lens:
        for _ in range(4):
            a.grad = None
            b.grad = None
            yb = b * 3
            yb.register_hook(reading)
            first = yb.sum()
            (first + (a * 2).sum()).backward()
    assert all(read is not None for read in reads)
    past = [p for p in lens.passes if p.kept_bytes == 0]
    assert len(past) >= 2
    for p in lens.passes:
        without = p.grads_without_hooks["a"]
        assert without is not None, p.unknown
        assert torch.equal(without, a.grad) if isinstance(without, torch.Tensor) else _agrees(without, a.grad)


def test_below_the_budget_nothing_changes():
    """A budget never reached gives the same passes as the default one, copies everywhere; its accounting counts
    the final .grad and hook values too (before: neither, so the budget was reached later than the bytes held)."""
    texts = []
    for budget in (256 * 2**20, 10**9):
        seen: dict = {}
        lens = _training(3, budget, seen)
        p = lens.passes[-1]
        assert all(isinstance(v, torch.Tensor) for v in p.leaf_grads.values())
        assert all(isinstance(call.grad_in[0] if isinstance(call.grad_in, tuple) else call.grad_in, torch.Tensor)
                   for call in p.hook_calls)
        texts.append(repr([(q.node_runs, q.hook_calls, q.leaf_grads, q.grads_without_hooks, q.notes)
                           for q in lens.passes]))
        held = _held(lens)
        counted = sum(q.kept_bytes for q in lens.passes)
        assert counted >= held, (counted, held)
    assert texts[0] == texts[1]
