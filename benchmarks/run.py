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

    import bench_browser
    import bench_graph
    import bench_memory
    import bench_stepper
    import bench_tracer
    import torch

    rows: list[tuple[str, str, str, bool | None]] = []  # measure, this run, target, met (None: no target)

    def ratio_row(measure: str, ratio: float, target: float, extra: str = "") -> None:
        rows.append((measure, f"×{ratio:.2f}{extra}", f"≤ ×{target}", ratio <= target))

    # targets of issue #24 (batch 32: the MLP traced <= x4.0; traced + model built <= x6.0; hooks on every layer <= x4.0)
    for batch, target in ((32, 4.0), (256, 4.0)):
        found = bench_tracer.measure(rounds, batch)
        plain = found["plain"]
        ratio_row(f"traced / plain backward(), {found['nodes']} drawn nodes, batch {batch} (model built inside backward)",
                  found["traced"] / plain, target,
                  f" (plain {plain * 1e3:.2f} ms; floors: Python hooks recording nothing + idle profile function "
                  f"×{found['floor'] / plain:.2f}, hooks only copying what each node sends ×{found['copy_floor'] / plain:.2f}; "
                  f"torch.profiler ×{found['profiler'] / plain:.2f})")
        if batch == 32:
            ratio_row("trace + building the pass model, same graph", found["traced"] / plain, 6.0,
                      " (the model is built inside backward(): the row above)")
    for (label, times), target in zip(bench_tracer.measure_hooked(rounds).items(), (4.0, 4.0)):
        ratio_row(f"traced / plain, a tensor hook that {label} on every Tanh output (batch 32)",
                  times["traced"] / times["plain"], target)
    teaching = bench_tracer.measure_teaching(rounds * 5)
    added = (teaching["traced"] - teaching["plain"]) * 1e3
    rows.append((f"added by the lens to a teaching graph's backward() ({teaching['nodes']} boxes)",
                 f"{added:.2f} ms (plain {teaching['plain'] * 1e3:.2f} ms)", "≤ 0.5 ms", added <= 0.5))
    chain = bench_tracer.measure_chain(rounds=3 if options.quick else 5)
    building = chain["build"] + chain["steps"]
    split = (f"{building:.3f} s ({chain['build']:.3f} + {chain['steps']:.3f}; traced backward {chain['traced']:.2f} s, "
             f"plain {chain['plain']:.3f} s)")
    rows.append((f"building the pass model + its steps, {chain['nodes']:,}-node chain", split, "≤ 0.3 s", building <= 0.3))
    for layers, results in bench_graph.measure(sizes).items():
        base = results["al.graph"]
        others = ", ".join(f"{name} {bench_graph.cell(results[name], base)}" for name in bench_graph.TOOLS[1:])
        rows.append((f"DOT of {layers} × (Linear+Tanh): al.graph", f"{bench_graph.cell(base, base)}; {others}",
                     "≤ torchviz", None))
        like = []  # like for like: both with saved tensors, both without
        met = []
        for ours, theirs in (("al.graph", "torchviz(show_saved=True)"), ("al.graph(show_saved=False)", "torchviz.make_dot")):
            if isinstance(results.get(ours), float) and isinstance(results.get(theirs), float):
                like.append(f"{ours} / {theirs} ×{results[ours] / results[theirs]:.2f}")
                met.append(results[ours] <= results[theirs])
        if like:
            rows.append((f"DOT of {layers} layers, like for like", "; ".join(like), "≤ ×1.0", all(met)))
    stepper = bench_stepper.measure()
    rows.append((f"first display of a {stepper['nodes']}-node pass in the notebook (one layout)",
                 f"{stepper['display']:.0f} ms", "", None))
    rows.append(("a step set from Python (live stepper)", f"{stepper['step']:.2f} ms (worst {stepper['worst']:.2f})",
                 "≤ 20 ms", stepper["worst"] <= 20))
    browser = bench_browser.measure()
    if browser is None:
        rows.append(("stepping in the browser", "chromium not found", "≤ 16 ms", None))
    else:
        rows.append((f"click to a styled, laid-out step, {browser['nodes']} drawn nodes", f"{browser['work']:.1f} ms",
                     "≤ 16 ms", browser["work"] <= 16))
        rows.append(("stored per cell (text/html), same pass", f"{browser['stored'] / 1e3:.0f} KB", "≤ 200 KB",
                     browser["stored"] <= 200e3))
    for case, extra in bench_memory.measure().items():
        share = extra / bench_memory.GRADIENT_MB
        rows.append((f"extra peak memory of a traced pass, 100 MB gradients, {'a modifying hook' if case else 'no hook'}",
                     f"{extra:.0f} MB ({share:.0%})", "≤ 10%", share <= 0.10))
    with tempfile.TemporaryDirectory() as empty:
        cold = first_drawing(os.path.join(empty, "cache"))
        warm = first_drawing(os.path.join(empty, "cache"))
    rows.append(("first drawing in a fresh Python (compiled wasm cached / not yet)", f"{warm:.2f} s / {cold:.2f} s",
                 "≤ 0.3 s", warm <= 0.3))
    print(f"autograd_lens benchmarks — Python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.platform()}")
    print()
    print("| measure | this run | target | met |")
    print("|---|---|---|---|")
    for measure, value, target, met in rows:
        print(f"| {measure} | {value} | {target} | {'' if met is None else 'yes' if met else '**no**'} |")
    missed = [measure for measure, _, _, met in rows if met is False]
    print()
    print(f"{len(missed)} target(s) not met" if missed else "every target met")


if __name__ == "__main__":
    main()
