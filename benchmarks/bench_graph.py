"""Building the DOT of a graph: al.graph vs torchviz.make_dot vs torchview.draw_graph, side by side.

    pip install torchviz torchview
    python benchmarks/bench_graph.py

Model: N x (Linear(16, 16) + Tanh), N = 10, 100, 1,000, 5,000. Each tool builds the Graphviz source of the
same model's graph (no layout, no rendering); the median of a few alternating runs is printed, with the
ratio to al.graph. al.graph draws each function's saved tensors by default (``show_saved=False`` leaves them
out); torchviz leaves them out by default (``show_attrs=True, show_saved=True`` draws them): both pairings are
timed, so the like-for-like ratios can be read. torchviz recurses once per node, so deep graphs end in RecursionError: reported as such.
torchview runs the model's forward itself (it records modules, not autograd), so it is timed with it.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn

import autograd_lens as al


def model_and_loss(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[part for _ in range(layers) for part in (nn.Linear(16, 16), nn.Tanh())])
    x = torch.randn(4, 16)
    return model, x, model(x).sum()


def timed(work, rounds: int) -> float | str:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        try:
            work()
        except RecursionError:
            return "RecursionError"
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(sizes=(10, 100, 1000, 5000)) -> dict[int, dict[str, float | str]]:
    """layers -> tool -> median seconds (or "RecursionError", or "not installed")."""
    tools = {"al.graph": None}
    try:
        from torchviz import make_dot
        tools["torchviz.make_dot"] = make_dot
    except ImportError:
        pass
    try:
        from torchview import draw_graph
        tools["torchview.draw_graph"] = draw_graph
    except ImportError:
        pass
    rows = {}
    for layers in sizes:
        model, x, loss = model_and_loss(layers)
        rounds = 5 if layers <= 1000 else 2
        results: dict[str, float | str] = {name: "not installed" for name in TOOLS}
        results["al.graph"] = timed(lambda: al.graph(loss, names={"model": model}, max_nodes=10 * layers + 10).to_dot(), rounds)
        results["al.graph(show_saved=False)"] = timed(
            lambda: al.graph(loss, names={"model": model}, max_nodes=10 * layers + 10, show_saved=False).to_dot(), rounds)
        if "torchviz.make_dot" in tools:
            params = dict(model.named_parameters())
            results["torchviz.make_dot"] = timed(lambda: tools["torchviz.make_dot"](loss, params=params).source, rounds)
            # the same kind of content as al.graph's default: each backward function's saved tensors and attributes
            results["torchviz(show_saved=True)"] = timed(
                lambda: tools["torchviz.make_dot"](loss, params=params, show_attrs=True, show_saved=True).source, rounds)
        if "torchview.draw_graph" in tools:
            results["torchview.draw_graph"] = timed(
                lambda: tools["torchview.draw_graph"](model, input_data=x, depth=1, expand_nested=False).visual_graph.source,
                rounds)
        rows[layers] = results
    return rows


TOOLS = ("al.graph", "torchviz.make_dot", "torchview.draw_graph", "al.graph(show_saved=False)", "torchviz(show_saved=True)")


def cell(value, base) -> str:
    if isinstance(value, str):
        return value
    return f"{value * 1e3:.1f} ms" + (f" (×{value / base:.2f})" if value is not base else "")


def main(sizes=(10, 100, 1000, 5000)) -> None:
    rows = measure(sizes)
    print(f"{'layers':>7} " + "".join(f"{name:>28}" for name in TOOLS))
    for layers, results in rows.items():
        base = results["al.graph"]
        print(f"{layers:>7} " + "".join(f"{cell(results[name], base):>28}" for name in TOOLS))


if __name__ == "__main__":
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    main()
