"""Everything from trace to steps grows linearly with the graph: counted in executed lines of the lens's
own code (not timed), for a chain of n and of 4n backward functions."""

from __future__ import annotations

import os
import sys

import torch

import autograd_lens as al
from autograd_lens.views.passview import PassView

PACKAGE = os.path.dirname(al.__file__)


def chain(length: int):
    x = torch.tensor([0.5, -0.5], requires_grad=True)
    y = x
    for step in range(length):
        y = (y * 1.01).tanh() if step % 2 else y + 0.1
    return x, y.sum()


def lines_run(work, opcodes: bool = False) -> int:
    """Lines of autograd_lens executed by ``work()``; with ``opcodes``, its bytecodes (a loop inside one line, such
    as a comprehension, then counts every turn: executed lines do not)."""
    count = 0
    counted = "opcode" if opcodes else "line"

    def tracer(frame, event, arg):
        nonlocal count
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        frame.f_trace_opcodes = opcodes
        if event == counted:
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(previous)
    return count


def trace_and_steps(length: int) -> tuple[int, int]:
    x, loss = chain(length)
    holder = {}

    def trace():
        with al.Lens(names={"x": x}, max_nodes=100_000) as lens:
            loss.backward()
        holder["lens"] = lens

    traced = lines_run(trace)
    view = PassView(holder["lens"].passes[0])
    stepped = lines_run(lambda: (view.steps, view.cards, view.final, view.data(predict=True), view.table))
    return traced, stepped


def test_trace_and_steps_grow_linearly():
    small, large = trace_and_steps(200), trace_and_steps(800)  # below the 1,000-step limit
    for what, a, b in zip(("trace + model", "steps + cards"), small, large):
        # linear: ×4 (plus a constant); quadratic would be ×16
        assert b <= 4.6 * a, f"{what}: {a:,} lines for 200 nodes, {b:,} for 800 (×{b / a:.1f})"


def grouped(length: int) -> tuple[int, int]:
    """A layer called ``length`` times (one module group per call), recorded with modules=True."""
    layer = torch.nn.Linear(2, 2)
    x = torch.tensor([[0.5, -0.5]], requires_grad=True)
    holder = {}

    def trace():
        with al.Lens(names={"x": x, "layer": layer}, max_nodes=100_000, modules=True) as lens:
            h = x
            for _ in range(length):
                h = layer(h)
            h.sum().backward()
        holder["lens"] = lens

    traced = lines_run(trace)
    view = PassView(holder["lens"].passes[0])
    assert len(holder["lens"].passes[0].groups) == length
    stepped = lines_run(lambda: (view.steps, view.cards, view.data()))
    return traced, stepped


def test_module_groups_grow_linearly():
    small, large = grouped(60), grouped(240)
    for what, a, b in zip(("trace + groups", "steps + group data"), small, large):
        assert b <= 4.6 * a, f"{what}: {a:,} lines for 60 calls, {b:,} for 240 (×{b / a:.1f})"


def graph_with_groups(layers: int) -> int:
    """Bytecodes run to draw ``graph()`` of a Sequential of ``layers`` x (Linear + Tanh): module groups found from the
    parameters' names, repeated blocks folded (views/groups.py, views/fold.py)."""
    torch.manual_seed(0)
    parts = []
    for _ in range(layers):
        parts += [torch.nn.Linear(4, 4), torch.nn.Tanh()]
    model = torch.nn.Sequential(*parts)
    loss = model(torch.randn(2, 4)).sum()
    return lines_run(lambda: al.graph(loss, names={"model": model}, max_nodes=10 * layers + 10).to_dot(),
                     opcodes=True)


def test_drawing_a_long_model_with_its_groups_grows_linearly():
    small, large = graph_with_groups(50), graph_with_groups(200)
    # linear is 4 (3.9 measured); every module path tested for every function (views/groups._assign) and every
    # group scanned for each group's children (views/fold._signatures) made it 5.4 here, and worse the longer the model
    assert large / small < 4.6, (small, large)


def training_steps(lens: al.Lens, steps: int, hook_pass: bool, reenter: bool) -> list[int]:
    """Lines of the lens run by each of ``steps`` training steps (forward, backward, SGD step) recorded by one
    ``lens``; with ``hook_pass``, the first step's backward has a hook that halves a gradient (so each later pass
    carries the note that the parameters moved since it); with ``reenter``, each step in its own ``with lens:``
    (a loop that enters the Lens per step), else all of them in one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.randn(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lens.names = {"model": model, "x": x}
    counts = []

    def step(index: int) -> None:
        optimizer.zero_grad()
        out = model(x)
        handle = out.register_hook(lambda g: g * 0.5) if hook_pass and index == 0 else None
        out.sum().backward()
        if handle is not None:
            handle.remove()
        optimizer.step()

    for index in range(steps):
        if reenter:
            counts.append(lines_run(lambda: [lens.__enter__(), step(index), lens.__exit__(None, None, None)]))
        else:
            counts.append(lines_run(lambda: step(index)))
    return counts


def test_a_pass_costs_the_same_after_many_passes():
    """A training loop inside one Lens: the 30th to 40th passes run no more lines of the lens than the 3rd to 14th (before, each pass
    re-read every earlier pass's events: moved_leaves, and the module-hook check at each exit)."""
    for hook_pass in (False, True):
        for reenter in (False, True):
            lens = al.Lens()
            if reenter:
                counts = training_steps(lens, 40, hook_pass, reenter)
            else:
                with lens:
                    counts = training_steps(lens, 40, hook_pass, reenter)
            # the same, but for a few lines that come back now and then (every ~10 passes), at any pass count
            assert max(counts[28:40]) <= max(counts[2:14]), (hook_pass, reenter, counts)
            if hook_pass:  # the note the scan exists for is still made, naming the first pass
                assert any("changed since pass 1, whose hooks changed gradients" in note
                           for note in lens.passes[-1].notes), lens.passes[-1].notes
            else:
                assert not any("changed since pass" in note for note in lens.passes[-1].notes)


def test_the_first_moving_pass_is_found_again_after_passes_are_cleared():
    """``lens.passes`` is the Lens's own list: after the user clears it, no note names a pass that is gone."""
    lens = al.Lens()
    with lens:
        training_steps(lens, 3, True, False)
        assert any("changed since pass 1" in note for note in lens.passes[-1].notes)
        lens.passes.clear()
        training_steps(lens, 2, False, False)
    assert [p.index for p in lens.passes] == [0, 1]
    assert not any("changed since pass" in note for p in lens.passes for note in p.notes), [p.notes for p in lens.passes]
