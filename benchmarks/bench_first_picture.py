"""First picture of a new model, in a fresh Python, beside what torchviz does:  python benchmarks/bench_first_picture.py

Each measurement is a fresh interpreter (a new kernel): torch imported, the model built and run forward, then the
clock runs from the loss to the SVG text.
* lens: ``autograd_lens.graph(loss)`` and its notebook display (``_repr_mimebundle_``: folded past ~60 boxes).
* torchviz-like: torchviz is not installed here, so its ``make_dot`` is done the same way (a walk of
  ``grad_fn.next_functions`` naming parameters, a ``graphviz.Digraph``, ``pipe(format="svg")`` through ``dot``),
  which is what a first ``make_dot(loss)`` costs in a notebook.

Runs alternate (lens, torchviz-like, lens, …) and the median of each is printed, with their ratio. The lens's
bytecode is compiled first, as an install has it. What is left of the gap (issue 22, measured 2026-11-26): the first
in-process Graphviz layout instantiates its WebAssembly module (~0.06 s), and the objects made on the way trigger a
full garbage collection over torch's heap (0.1-0.23 s) that torchviz's smaller allocation does not reach yet.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

MODELS = {
    "transformer-12": """
import torch
from torch import nn
class Block(nn.Module):
    def __init__(s, d):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.attn, s.proj, s.fc, s.out = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(s, x):
        q, k, v = s.attn(s.ln1(x)).chunk(3, -1)
        x = x + s.proj(torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ v)
        return x + s.out(torch.relu(s.fc(s.ln2(x))))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb, s.layers, s.head = nn.Embedding(50, 32), nn.ModuleList([Block(32) for _ in range(12)]), nn.Linear(32, 50)
    def forward(s, i):
        x = s.emb(i)
        for layer in s.layers:
            x = layer(x)
        return s.head(x)
torch.manual_seed(0)
model = Model()
loss = model(torch.randint(0, 50, (2, 16))).logsumexp(-1).mean()
""",
    "mlp-50": """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(16, 16), nn.Tanh())])
loss = model(torch.randn(4, 16)).sum()
""",
}

LENS = """
import time
import autograd_lens as al
start = time.perf_counter()
bundle = al.graph(loss, names={"model": model})._repr_mimebundle_()
elapsed = time.perf_counter() - start
assert "image/svg+xml" in bundle or "data:image/svg+xml," in bundle["text/html"], bundle  # SVG, or the navigator
print(elapsed)
"""

TORCHVIZ_LIKE = """
import time
import graphviz
start = time.perf_counter()
names = {id(p): n for n, p in model.named_parameters()}
dot = graphviz.Digraph(format="svg", node_attr=dict(style="filled", shape="box", align="left", fontsize="10",
                                                    ranksep="0.1", height="0.2", fontname="monospace"),
                       graph_attr=dict(size="12,12"))
seen, stack = set(), [loss.grad_fn]
dot.node(str(id(loss)), "loss\\n" + str(tuple(loss.size())), fillcolor="darkolivegreen1")
dot.edge(str(id(loss.grad_fn)), str(id(loss)))
while stack:  # torchviz walks recursively; an explicit stack does the same work without its recursion limit
    fn = stack.pop()
    if fn in seen:
        continue
    seen.add(fn)
    if hasattr(fn, "variable"):
        var = fn.variable
        dot.node(str(id(var)), (names.get(id(var), "") + "\\n" + str(tuple(var.size()))), fillcolor="lightblue")
        dot.edge(str(id(var)), str(id(fn)))
    dot.node(str(id(fn)), type(fn).__name__)
    for next_fn, _ in fn.next_functions:
        if next_fn is not None:
            dot.edge(str(id(next_fn)), str(id(fn)))
            stack.append(next_fn)
svg = dot.pipe(format="svg")
elapsed = time.perf_counter() - start
assert svg.startswith(b"<?xml") or b"<svg" in svg
print(elapsed)
"""


def once(model: str, tool: str) -> float:
    code = MODELS[model] + (LENS if tool == "lens" else TORCHVIZ_LIKE)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def compiled() -> None:
    """A user's install has the lens's bytecode (pip compiles a wheel's modules; an editable install writes
    ``__pycache__`` on first import), as graphviz's already has: compile it once, so that no run counts compiling
    the lens's sources (this matters where PYTHONDONTWRITEBYTECODE is set, as on the CI machines)."""
    import compileall
    import os

    import autograd_lens

    compileall.compile_dir(os.path.dirname(autograd_lens.__file__), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    compiled()
    print(f"{'model':<16}{'lens (s)':>10}{'torchviz-like (s)':>20}{'ratio':>8}")
    for model in MODELS:
        lens, viz = [], []
        for _ in range(options.rounds):
            lens.append(once(model, "lens"))
            viz.append(once(model, "viz"))
        a, b = statistics.median(lens), statistics.median(viz)
        print(f"{model:<16}{a:>10.3f}{b:>20.3f}{a / b:>8.2f}")


if __name__ == "__main__":
    main()
