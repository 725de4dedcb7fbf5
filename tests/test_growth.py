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
