"""Every benchmark in one run, as one table:  python benchmarks/run.py  [--quick]

Each figure is measured side by side in this run (ratios of alternating runs, medians). Rows whose tool is
missing (torchviz/torchview: `pip install -e ".[bench]"`; Chromium: Debian's `chromium`) say so.
The first-drawing row runs a fresh Python twice: with Graphviz's compiled wasm cached, and with an empty cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FIRST_DRAWING = """
import time
from autograd_lens.views.render import render_svg
start = time.perf_counter()
render_svg("digraph { a -> b }")
print(time.perf_counter() - start)
"""


def first_drawing(cache: str) -> float:
    env = dict(os.environ, AUTOGRAD_LENS_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", FIRST_DRAWING], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sizes (a smoke run)")
    options = parser.parse_args()
    rounds = 10 if options.quick else 40
    sizes = (10, 100) if options.quick else (10, 100, 1000, 5000)

    import torch

    import bench_browser
    import bench_graph
    import bench_memory
    import bench_tracer

    rows: list[tuple[str, str, str]] = []
    for batch, target in ((32, 2.0), (256, 1.4)):
        found = bench_tracer.measure(rounds, batch)
        plain = found["plain"]
        rows.append((f"traced / plain backward(), {found['nodes']} drawn nodes, batch {batch}",
                     f"×{found['traced'] / plain:.2f} (no-op hooks ×{found['floor'] / plain:.2f}, "
                     f"torch.profiler ×{found['profiler'] / plain:.2f}; plain {plain * 1e3:.2f} ms)", f"≤ ×{target}"))
    for layers, results in bench_graph.measure(sizes).items():
        base = results["al.graph"]
        others = ", ".join(f"{name} {bench_graph.cell(results[name], base)}" for name in bench_graph.TOOLS[1:])
        rows.append((f"DOT of {layers} × (Linear+Tanh): al.graph", f"{bench_graph.cell(base, base)}; {others}",
                     "≤ torchviz"))
        like = []  # like for like: both with saved tensors, both without
        for ours, theirs in (("al.graph", "torchviz(show_saved=True)"), ("al.graph(show_saved=False)", "torchviz.make_dot")):
            if isinstance(results.get(ours), float) and isinstance(results.get(theirs), float):
                like.append(f"{ours} / {theirs} ×{results[ours] / results[theirs]:.2f}")
        if like:
            rows.append((f"DOT of {layers} layers, like for like", "; ".join(like), "≤ ×1.0"))
    browser = bench_browser.measure()
    if browser is None:
        rows.append(("stepping in the browser", "chromium not found", "≤ 16 ms"))
    else:
        rows.append((f"click to a styled, laid-out step, {browser['nodes']} drawn nodes", f"{browser['work']:.1f} ms",
                     "≤ 16 ms"))
        rows.append(("stored per cell (text/html), same pass", f"{browser['stored'] / 1e3:.0f} KB", "≤ 200 KB"))
    for case, extra in bench_memory.measure().items():
        rows.append((f"extra peak memory of a traced pass, 100 MB gradients, {'a modifying hook' if case else 'no hook'}",
                     f"{extra:.0f} MB ({extra / bench_memory.GRADIENT_MB:.0%})", "≤ 10%"))
    with tempfile.TemporaryDirectory() as empty:
        cold = first_drawing(os.path.join(empty, "cache"))
        warm = first_drawing(os.path.join(empty, "cache"))
    rows.append(("first drawing in a fresh Python (compiled wasm cached / not yet)", f"{warm:.2f} s / {cold:.2f} s",
                 "≤ 0.3 s"))
    print(f"autograd_lens benchmarks — Python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.platform()}")
    print()
    print("| measure | this run | target |")
    print("|---|---|---|")
    for measure, value, target in rows:
        print(f"| {measure} | {value} | {target} |")


if __name__ == "__main__":
    main()
