"""Kernel-side cost of the live stepper on a ~250-node graph: building it once, and a step set from Python.

    python benchmarks/bench_stepper.py

The drawing is laid out once per pass; stepping happens in the browser (benchmarks/bench_browser.py
measures it there). Setting ``stepper.step`` from Python only updates a synced trait (target: at most 20 ms).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.views.stepper import Stepper


def measure() -> dict:
    """Milliseconds: the notebook display of a ~250-node pass (first drawing, wasm renderer already
    compiled), the live stepper built once, and a step set from Python (median and worst)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(50) for layer in (nn.Linear(8, 8), nn.Tanh())])
    x = torch.randn(4, 8)
    model[10].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    backward_pass = lens.passes[0]
    from autograd_lens.views.render import render_svg

    render_svg("digraph { a -> b }")  # the renderer compiled (or loaded from its cache) before timing
    start = time.perf_counter()
    lens._repr_mimebundle_()
    displayed = time.perf_counter() - start
    start = time.perf_counter()
    stepper = Stepper(lens.passes)
    laid_out = time.perf_counter() - start
    steps = len(stepper.view.steps)
    times = []
    for _ in range(3):
        stepper.step = 0
        for k in range(1, steps):
            start = time.perf_counter()
            stepper.step = k
            times.append(time.perf_counter() - start)
    return {"nodes": len(backward_pass.graph.nodes), "steps": steps, "display": displayed * 1e3,
            "stepper": laid_out * 1e3, "step": statistics.median(times) * 1e3, "worst": max(times) * 1e3}


def main() -> float:
    found = measure()
    print(f"graph: {found['nodes']} nodes, {found['steps']} steps")
    print(f"first display of the pass (drawing laid out once): {found['display']:.1f} ms")
    print(f"live stepper + its one layout: {found['stepper']:.1f} ms (once per pass)")
    print(f"one step set from Python: median {found['step']:.2f} ms, worst {found['worst']:.2f} ms (target <= 20 ms)")
    return found["step"]


if __name__ == "__main__":
    sys.exit(0 if main() <= 20 else 1)
