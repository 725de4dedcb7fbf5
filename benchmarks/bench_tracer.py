"""Overhead of tracing a backward pass: plain vs inside a Lens, alternated in one process.

    python benchmarks/bench_tracer.py

Model: 50 x (Linear(64, 64) + Tanh), batch 32 (about 251 autograd nodes), no
user hooks.  Prints the median time of each and their ratio (target: at most 2.0).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn

import autograd_lens as al


def build(depth: int = 50, width: int = 64, batch: int = 32):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers)
    x = torch.randn(batch, width)
    return model, x


def one_pass(model, x, lens=None):
    """Seconds spent in ``loss.backward()``; traced, that includes building the pass's model, which
    the lens does at the end of each pass so that it keeps nothing of torch's graph afterwards."""
    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    if lens is None:
        start = time.perf_counter()
        loss.backward()
        return time.perf_counter() - start
    with lens:
        start = time.perf_counter()
        loss.backward()
        return time.perf_counter() - start


def floor_pass(model, x):
    """The least any per-node observer can cost: a hook on every node that runs no Python at all
    (a C-level callable), plus an idle profile function, registered and removed around backward()."""
    import functools

    from autograd_lens.capture.walk import _reachable

    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    start = time.perf_counter()
    seen: dict = {}
    handles = [node.register_prehook(functools.partial(seen.__setitem__, id(node))) for node in _reachable([loss.grad_fn])]
    sys.setprofile(lambda frame, event, arg: None)
    try:
        loss.backward()
    finally:
        sys.setprofile(None)
        for handle in handles:
            handle.remove()
    return time.perf_counter() - start


def profiler_pass(model, x):
    """torch.profiler around backward(): the anchor a practitioner would otherwise reach for."""
    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        loss.backward()
    return time.perf_counter() - start


def measure(rounds: int = 60, batch: int = 32) -> dict:
    """Medians (seconds) of plain, floor (no-op hooks), torch.profiler and traced backward(), alternated."""
    torch.set_num_threads(1)
    model, x = build(batch=batch)
    names = {"model": model, "x": x}
    for _ in range(5):  # warm-up: allocator, first walk
        one_pass(model, x)
        one_pass(model, x, al.Lens(names=names))
        profiler_pass(model, x)
    plain, traced, floor, profiled = [], [], [], []
    for _ in range(rounds):
        plain.append(one_pass(model, x))
        floor.append(floor_pass(model, x))
        profiled.append(profiler_pass(model, x))
        lens = al.Lens(names=names)
        traced.append(one_pass(model, x, lens))
    return {
        "nodes": len(lens.passes[0].graph.nodes),
        "ran": len(lens.passes[0].node_runs),
        "plain": statistics.median(plain),
        "floor": statistics.median(floor),
        "profiler": statistics.median(profiled),
        "traced": statistics.median(traced),
    }


def main(rounds: int = 60, batch: int = 32) -> float:
    found = measure(rounds, batch)
    ratio = found["traced"] / found["plain"]
    print(f"graph: {found['nodes']} drawn nodes; {found['ran']} backward functions ran")
    print(f"plain backward   median {found['plain'] * 1e3:7.2f} ms")
    print(f"traced backward  median {found['traced'] * 1e3:7.2f} ms")
    print(f"ratio traced/plain: {ratio:.2f}  (target <= 2.0)")
    print(f"reference, hooks that record nothing: ratio {found['floor'] / found['plain']:.2f}")
    print(f"reference, torch.profiler: ratio {found['profiler'] / found['plain']:.2f}")
    return ratio


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32, the issue's setting)")
    parser.add_argument("--rounds", type=int, default=60)
    options = parser.parse_args()
    sys.exit(0 if main(options.rounds, options.batch) <= 2.0 else 1)
