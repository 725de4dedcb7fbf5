"""One Lens kept over a long training loop: does a pass get slower, or the Lens hold more, the more passes it saw?

    python benchmarks/bench_long.py [--passes 2000] [--quick]

Each case runs a loop of SGD steps on a small MLP (5 -> 32 -> 32 -> 1, batch 16) twice in one process, one after
the other: plain, then inside one ``Lens`` (a ``with`` around the whole loop, as around an epoch).  Per-step CPU time
of this thread (``time.thread_time``: torch runs on the calling thread here) is the median over an early window
(steps 20-119) and a late one (the last 100 steps); late ÷ early near 1 means a step costs the same after many.
The plain loop's own late ÷ early is the noise reference of the same run.  Held bytes: a third loop, inside a Lens
with tracemalloc on (it slows allocations, so that loop is not timed): what Python holds after the early window and
at the end, per step, with the bytes of values the passes keep (``kept_bytes``, which stop at ``memory_budget``).

Cases: a modifying tensor hook on the output (``hook``), the same with ``modules=True`` (``modules``), and a gradient
penalty (``autograd.grad(create_graph=True)`` then ``backward()``: two passes a step) with that hook (``penalty``).
The passes are read (``lens.passes``) every 100 steps, as a user looking at the last pass would.  Also printed: the
full (generation 2) collections of Python's collector during the timed loop and their CPU time: each goes through
everything the Lens holds (its records grow with the passes), and they come rarer as it grows.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc

import torch
from torch import nn

import autograd_lens as al

CASES = ("hook", "modules", "penalty")


def loop(case: str, steps: int, traced: bool, memory: bool = False) -> dict:
    """Per-step times (s) of ``steps`` training steps, plain or inside one Lens; with ``memory``, the bytes held
    (tracemalloc on for the loop)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lens = al.Lens(names={"model": model, "x": x, "y": y}, modules=case == "modules") if traced else None
    times, held, full = [], {}, []

    def collected(phase: str, info: dict) -> None:  # full collections: their CPU time
        if info["generation"] == 2:
            full.append(time.thread_time() if phase == "start" else time.thread_time() - full.pop())

    def step() -> None:
        optimizer.zero_grad()
        out = model(x)
        out.register_hook(lambda g: g * 0.5)
        loss = ((out - y) ** 2).mean()
        if case == "penalty":
            (g,) = torch.autograd.grad(loss, model[0].weight, create_graph=True)
            loss = loss + g.pow(2).sum()
        loss.backward()
        optimizer.step()

    gc.collect()
    if memory:
        tracemalloc.start()
    start_bytes = tracemalloc.get_traced_memory()[0]
    if lens is not None:
        lens.__enter__()
    gc.callbacks.append(collected)
    try:
        for index in range(steps):
            begin = time.thread_time()
            step()
            times.append(time.thread_time() - begin)
            if lens is not None and index % 100 == 99:
                lens.passes
            if memory and index in (119, steps - 1):
                gc.collect()
                held[index] = tracemalloc.get_traced_memory()[0] - start_bytes
    finally:
        gc.callbacks.remove(collected)
        if lens is not None:
            lens.__exit__(None, None, None)
        if memory:
            tracemalloc.stop()
    kept = sum(p.kept_bytes for p in lens.passes) if lens is not None else 0
    return {"early": statistics.median(times[20:120]), "late": statistics.median(times[-100:]),
            "full": (len(full), sum(full)), "held_early": held.get(119, 0), "held_end": held.get(steps - 1, 0), "kept": kept}


def measure(steps: int = 2000, cases: tuple = CASES) -> dict:
    """case -> {"plain": loop(...), "lens": loop(...), "held": loop(..., memory=True)}, one after the other in this
    process."""
    torch.set_num_threads(1)
    return {case: {"plain": loop(case, steps, False), "lens": loop(case, steps, True),
                   "held": loop(case, steps, True, memory=True)} for case in cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=2000, help="training steps per loop (default 2000)")
    parser.add_argument("--quick", action="store_true", help="500 steps (a smoke run)")
    options = parser.parse_args()
    steps = 500 if options.quick else max(options.passes, 300)
    late_steps = steps - 120
    print(f"{steps} steps per loop; per-step CPU time, medians of steps 20-119 (early) and the last 100 (late)")
    for case, found in measure(steps).items():
        plain, lens, held = found["plain"], found["lens"], found["held"]
        print(f"{case:8s} lens: early {lens['early'] * 1e3:6.2f} ms, late {lens['late'] * 1e3:6.2f} ms, "
              f"late/early ×{lens['late'] / lens['early']:.2f} (plain loop ×{plain['late'] / plain['early']:.2f}, "
              f"lens/plain early ×{lens['early'] / plain['early']:.1f}, late ×{lens['late'] / plain['late']:.1f}); "
              f"full collections {lens['full'][0]}, {lens['full'][1] * 1e3:.0f} ms (plain loop {plain['full'][0]})")
        grown = (held["held_end"] - held["held_early"]) / late_steps
        print(f"{'':8s} held: {held['held_early'] / 120 / 1e3:6.1f} KB/step over the first 120 steps, "
              f"{grown / 1e3:6.1f} KB/step after (late/early ×{grown / (held['held_early'] / 120):.2f}); "
              f"{held['held_end'] / 1e6:.1f} MB at the end, values kept {held['kept'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
