"""A very large pass: tracing and displaying a 50,000-node graph (target: at most 10 s in all).

    python benchmarks/bench_large.py [--nodes 50000]

The graph is ``h = h + x`` repeated: one leaf used by every node.  The display is the
notebook's (the stepper's MIME bundle), which collapses past the step limit and draws at most
``max_nodes`` boxes.

It runs in a thread with a large stack: torch 2.13 keeps a Python object for every backward
function any Python code has looked at, and freeing a chain of ~45,000 or more of them recurses
on the C stack (pytorch issue 109948) — the default 8 MB main-thread stack overflows.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch

import autograd_lens as al


def main(nodes: int) -> float:
    x = torch.tensor(1.0, requires_grad=True)
    h = x
    for _ in range(nodes):
        h = h + x
    start = time.perf_counter()
    with al.Lens() as lens:
        h.backward()
    traced = time.perf_counter() - start
    start = time.perf_counter()
    bundle = lens._repr_mimebundle_()
    shown = time.perf_counter() - start
    size = len(bundle.get("text/html", ""))
    print(f"{nodes:,} nodes: trace {traced:.2f} s, display {shown:.2f} s, total {traced + shown:.2f} s "
          f"(target <= 10 s); {len(lens.passes[0].events):,} events; page {size / 1e3:.0f} KB")
    return traced + shown


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50_000)
    options = parser.parse_args()
    result: list[float] = []
    threading.stack_size(512 * 2**20)
    worker = threading.Thread(target=lambda: result.append(main(options.nodes)))
    worker.start()
    worker.join()
    sys.exit(0 if result and result[0] <= 10 else 1)
