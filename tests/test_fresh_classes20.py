"""One Lens kept over a long training loop: a pass costs the same after hundreds of passes as after a few, and what
the Lens holds grows by the same amount each pass (the documented history: records, not values, past the budget).

Counted in bytecodes of the lens's own code (``test_growth.lines_run``) and in bytes (tracemalloc), never timed;
``benchmarks/bench_long.py`` times the same loops.  Each test also checks the values against plain torch.

Found here (both failed on main): with ``modules=True`` every pass scanned every module call of the block so far
(``modules.groups_for`` built its end-number index from all of them: +96 bytecodes per earlier pass for a 5-module
MLP); with ``create_graph=True`` and a hook that changed gradients in each pass, every backward function of a pass
was looked up in a list holding one range per earlier such pass (``ledger.made_by``: +700 bytecodes per earlier
pass).
"""

from __future__ import annotations

import gc
import tracemalloc

import torch
from torch import nn

import autograd_lens as al
from test_growth import lines_run  # noqa: E402  (bytecodes of the lens's code run by a call)

EARLY, LATE = (3, 4, 5), (147, 148, 149)  # passes counted; the loop runs 150


def _mlp(hooked: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    if hooked:  # a module hook: its boundaries are grouped by where module calls ended (modules._output_boundary)
        model[2].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))
    return model, torch.randn(5, 3), torch.randn(5, 1)


def _loop(passes: int, lens: al.Lens | None, create_graph: bool, hooked: bool) -> tuple[dict, list, nn.Module]:
    """``passes`` SGD steps (each: forward, a hook halving the output's gradient, backward, step); with
    ``create_graph``, the loss adds the squared norm of the first weight's gradient (a gradient penalty: the first
    backward is ``autograd.grad(create_graph=True)``, so each step is two passes).  Returns the lens's bytecodes per
    counted step, the gradients after each step, and the model."""
    model, x, y = _mlp(hooked)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counted, grads = {}, []
    if lens is not None:  # (else the namespace of step() is read: its ``grads`` grows, up to the 64 items named)
        lens.names = {"model": model, "x": x, "y": y}

    def step() -> None:
        optimizer.zero_grad()
        out = model(x)
        out.register_hook(lambda g: g * 0.5)
        loss = ((out - y) ** 2).mean()
        if create_graph:
            (g,) = torch.autograd.grad(loss, model[0].weight, create_graph=True)
            loss = loss + g.pow(2).sum()
        loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()

    for index in range(passes):
        if lens is not None and index in EARLY + LATE:
            counted[index] = lines_run(step, opcodes=True)
        else:
            step()
    return counted, grads, model


def _same_grads(traced: list, plain: list) -> None:
    assert len(traced) == len(plain)
    for index, (seen, expected) in enumerate(zip(traced, plain)):
        for name, grad in expected.items():
            assert torch.equal(seen[name], grad), (index, name)  # the lens changed no gradient


def test_module_groups_cost_the_same_late_in_a_long_loop():
    """modules=True over 150 passes: pass 147 runs as many bytecodes of the lens as pass 3 (on main +14,000: every
    module call of the block was scanned each pass), and each pass's groups are the same modules, numbered by call."""
    for hooked in (False, True):
        plain = _loop(150, None, False, hooked)[1]
        lens = al.Lens(modules=True)
        with lens:
            counted, grads, model = _loop(150, lens, False, hooked)
        _same_grads(grads, plain)
        early, late = max(counted[i] for i in EARLY), max(counted[i] for i in LATE)
        assert late <= early * 1.01, (hooked, counted)  # (main: 73,983 at pass 5, 88,000 at 149)
        assert len(lens.passes) == 150
        first, last = lens.passes[3], lens.passes[149]
        assert [(g.kind, g.parent, len(g.nodes)) for g in first.groups] == \
            [(g.kind, g.parent, len(g.nodes)) for g in last.groups], (first.groups, last.groups)
        linears = [g for g in last.groups if g.kind == "Linear"]
        assert len(linears) == 3 and all(g.call == g.calls == 150 for g in linears), linears
        # ("of n": the calls recorded when the pass ended)
        assert [(g.call, g.calls) for g in first.groups if g.kind == "Linear"] == [(4, 4)] * 3
        if hooked:  # the module hook halved what model.2 sent: the with/without table says so
            calls = [call for call in last.hook_calls if call.kind.startswith("module")]
            assert len(calls) == 1 and calls[0].modified
            assert calls[0].invocation == 150, calls[0]


def test_a_gradient_penalty_loop_costs_the_same_late():
    """create_graph=True with a hook changing gradients in each pass, 150 steps (300 passes): the 147th step runs as
    many bytecodes of the lens as the 3rd (main: +700 per earlier pass), and the functions made by an earlier
    hooked pass are still named, with what they make without hooks unknown."""
    plain = _loop(150, None, True, False)[1]
    lens = al.Lens()
    with lens:
        counted, grads, model = _loop(150, lens, True, False)
    _same_grads(grads, plain)
    early, late = max(counted[i] for i in EARLY), max(counted[i] for i in LATE)
    assert late <= early * 1.01, counted  # (main: 130,000 at step 5, 230,000 at 149)
    assert len(lens.passes) == 300 and len(lens._ledger.made_by_hooked) == 150
    for step in (3, 149):
        second = lens.passes[2 * step + 1]  # the backward() of the step: through what autograd.grad made
        said = [reason for reason in second.unknown.values() if "(create_graph=True)" in reason]
        assert said and all(f"was made by pass {2 * step + 1} (create_graph=True)" in reason for reason in said), \
            second.unknown
        assert second.grads_without_hooks["model.0.weight"] is None
        assert torch.equal(second.leaf_grads["model.0.weight"], plain[step]["0.weight"])


def _held_per_pass(passes: int, budget: int) -> tuple[list[int], al.Lens]:
    """Bytes (tracemalloc) the Lens holds after each ``passes // 4`` passes of a training loop with a modifying hook
    and module groups; its kept values' bytes stop at ``budget``."""
    model, x, y = _mlp(True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    held = []
    tracemalloc.start()
    try:
        with al.Lens(names={"model": model, "x": x}, memory_budget=budget, modules=True) as lens:
            for index in range(passes):
                optimizer.zero_grad()
                out = model(x)
                out.register_hook(lambda g: g * 0.5)
                ((out - y) ** 2).mean().backward()
                optimizer.step()
                if index % (passes // 4) == passes // 4 - 1:
                    lens.passes  # the drafts made into models, as a reader of the passes would
                    gc.collect()
                    held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    return held, lens


def test_what_a_long_loop_holds_grows_by_the_same_bytes_each_pass():
    """Past the budget each pass adds the same bytes (its records) however many passes came before, and the
    values kept stop at the budget: 4 windows of 60 passes each add within 10% of the first window."""
    held, lens = _held_per_pass(240, 20_000)
    windows = [later - earlier for earlier, later in zip(held, held[1:])]
    assert all(abs(window - windows[0]) <= 0.1 * windows[0] for window in windows), windows
    assert sum(p.kept_bytes for p in lens.passes) <= 20_000 + lens.passes[0].kept_bytes
    assert all(p.kept_bytes == 0 for p in lens.passes[60:])
    per_pass = windows[-1] / 60
    # a ~25-box pass's records (boxes, events, summaries, module groups): 62 KB measured; guarantees.md says 0.17 MB
    # for a 52-box MLP
    assert per_pass < 100_000, per_pass
    counter = lens._invocations  # each pass's hook is a new registration on a new tensor: one count each
    assert len(counter.counts) == 240 + 1 and len(lens._ledger.made_by_hooked) == 0
