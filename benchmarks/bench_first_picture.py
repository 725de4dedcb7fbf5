"""First picture of a new model in a fresh Jupyter kernel, beside torchviz:  python benchmarks/bench_first_picture.py

Each measurement starts a new IPython kernel (``jupyter_client``, the kernel a notebook starts), imports torch, builds
the model and runs it forward, imports the tool, then the clock runs from the loss to the notebook's display bundle
(``get_ipython().display_formatter.format``, what a cell ending in the drawing computes before sending it).
* lens: ``autograd_lens.graph(loss)``: an SVG, or past ~60 boxes the navigator (folded drawing, the drawings with
  folds opened laid out in advance, the table).
* torchviz: ``make_dot(loss, params=dict(model.named_parameters()))``, whose display pipes the DOT through Graphviz's
  ``dot`` (``pip install torchviz``, or ``pip install --target DIR torchviz==0.0.3`` and ``DIR`` on ``PYTHONPATH``,
  which the kernels inherit). Without torchviz, the same walk and ``graphviz.Digraph`` written out here
  (``torchviz-like``: its node attributes, its ``resize_graph`` size, ``dot`` through ``pipe``).

The import of each tool is timed apart (``import autograd_lens``; ``from torchviz import make_dot``). Runs alternate
and the medians are printed, with their ratio, and the median number of cyclic collections that start in the timed
part (``collections``: the lens's / torchviz's, counted with ``gc.callbacks``). The lens's bytecode is compiled
first, as an install has it (this matters where PYTHONDONTWRITEBYTECODE is set).

``--baseline DIR`` also times the package in DIR (an earlier commit's ``autograd_lens/``, unpacked with ``git archive``)
in the same rounds, so that a change is measured side by side under the same load.  ``--lens DIR`` times the package
in DIR instead of the installed one: on 2026-11-26 the same code ran slower from a directory put first on
``sys.path`` than installed (mlp-50: 0.239 s vs 0.149 s, medians of 9; 0.302 s vs 0.241 s, medians of 5), so
compare two unpacked copies.  ``--model`` picks one model.

``--bare`` runs each in a plain ``python -c`` instead of a kernel. There the timed code also pays a full garbage
collection over torch's heap (0.1-0.2 s): right after ``import torch`` in a bare interpreter that collection is due
within the next ~9,000 objects kept, and importing wasmtime (the in-process Graphviz) alone keeps 12,000. A kernel
has made its own full collections before the user's cells run, and had ~45,000 to go after this model in the
measurements of 2026-11-26, so the kernel figures are the ones the issue asks about.

Three orders of cells (``--order``, repeatable; all three by default, ``--bare`` only the first):
* ``one cell``: the model, then one cell that imports the tool and draws (the import timed apart);
* ``run all``: as the README and the course do, cell 1 loads the tool (``import torch`` and ``%load_ext
  autograd_lens``; torchviz: ``from torchviz import make_dot``, its time is the "+import" figure), cell 2 builds the
  model and the loss, cell 3 is timed; the three sent at once, as "Run All" does (the next cell starts as soon as the
  last ends; since a5274f2 the lens's warm-up runs inside ``%load_ext``, before it returns, so this order now
  differs from the next only by the pause);
* ``reader``: the same with a 1 s pause before cell 3 (someone reading between cells).
For the lens in the last two, the table also counts the runs where a warm-up thread was still running when cell 3
began (always 0 since a5274f2: no thread).
"""

from __future__ import annotations

import argparse
import json
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

# display(x) in a kernel: the formatter's bundle; in a bare Python: the object's own _repr_mimebundle_; and the
# cyclic collections that start in the timed part, counted (gc.callbacks)
FORMAT = """
def _count_collections(phase, info):
    if phase == "start":
        _collected.append(info["generation"])
def _bundle(obj):
    try:
        shell = get_ipython()
    except NameError:
        return obj._repr_mimebundle_()
    return shell.display_formatter.format(obj)[0]
"""

LENS = """
import time, threading
warming = any(thread.name == "autograd-lens-warm-up" for thread in threading.enumerate())
started = time.perf_counter()
import autograd_lens as al
import gc
_collected = []
gc.callbacks.append(_count_collections)
imported = time.perf_counter()
bundle = _bundle(al.graph(loss, names={"model": model}))
elapsed = time.perf_counter() - imported
gc.callbacks.remove(_count_collections)
assert "image/svg+xml" in bundle or "data:image/svg+xml," in bundle["text/html"], bundle  # SVG, or the navigator
print(elapsed, globals().get("_load_time", imported - started), "lens", int(warming), len(_collected))
"""

# cell 1 of the notebook orders: each tool loaded as a reader's first cell does (its time is the "+import" figure)
LOAD = {
    "lens": """
import time
import torch
_started = time.perf_counter()
%load_ext autograd_lens
_load_time = time.perf_counter() - _started
""",
    "torchviz": """
import time
import torch
_started = time.perf_counter()
try:
    from torchviz import make_dot
except ImportError:
    import graphviz
_load_time = time.perf_counter() - _started
""",
}
ORDERS = ("one cell", "run all", "reader")
PAUSE = 1.0  # seconds before cell 3 in the "reader" order

TORCHVIZ = """
import time
started = time.perf_counter()
try:
    from torchviz import make_dot
    tool = "torchviz"
except ImportError:
    import graphviz
    tool = "torchviz-like"
import gc
_collected = []
gc.callbacks.append(_count_collections)
imported = time.perf_counter()
if tool == "torchviz":
    dot = make_dot(loss, params=dict(model.named_parameters()))
else:  # torchviz 0.0.3's make_dot(loss, params) without its recursion, and its resize_graph
    names = {id(p): n for n, p in model.named_parameters()}
    dot = graphviz.Digraph(node_attr=dict(style="filled", shape="box", align="left", fontsize="10", ranksep="0.1",
                                          height="0.2", fontname="monospace"), graph_attr=dict(size="12,12"))
    seen, stack = set(), [loss.grad_fn]
    dot.node(str(id(loss)), "\\n " + str(tuple(loss.size())), fillcolor="darkolivegreen1")
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            var = fn.variable
            dot.node(str(id(var)), names.get(id(var), "") + "\\n " + str(tuple(var.size())), fillcolor="lightblue")
            dot.edge(str(id(var)), str(id(fn)))
        dot.node(str(id(fn)), type(fn).__name__)
        for next_fn, _ in reversed(fn.next_functions):
            if next_fn is not None:
                dot.edge(str(id(next_fn)), str(id(fn)))
                stack.append(next_fn)
    dot.edge(str(id(loss.grad_fn)), str(id(loss)))
    size = max(12, len(dot.body) * 0.15)
    dot.graph_attr.update(size=f"{size},{size}")
bundle = _bundle(dot)
elapsed = time.perf_counter() - imported
gc.callbacks.remove(_count_collections)
assert "<svg" in bundle["image/svg+xml"]
print(elapsed, globals().get("_load_time", imported - started), tool, 0, len(_collected))
"""


def _in_kernel(groups: list[list[str]], pause: float = 0.0) -> str:
    """Run ``groups`` of cells in a new kernel: the cells of a group sent at once (as "Run All" queues them), each
    group after the last has ended and ``pause`` seconds; what they printed."""
    import time

    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    printed: list[str] = []
    try:
        for number, cells in enumerate(groups):
            if number and pause:
                time.sleep(pause)
            ids = [client.execute(cell) for cell in cells]
            while True:  # the group's output, until the kernel is idle after its last cell
                message = client.get_iopub_msg(timeout=300)
                kind, parent = message["msg_type"], message["parent_header"].get("msg_id")
                if parent not in ids:
                    continue
                if kind == "stream":
                    printed.append(message["content"]["text"])
                elif kind == "error":
                    raise RuntimeError(message["content"]["ename"] + ": " + message["content"]["evalue"])
                elif kind == "status" and message["content"]["execution_state"] == "idle" and parent == ids[-1]:
                    break
            for _ in ids:
                reply = client.get_shell_msg(timeout=300)
                if reply["content"]["status"] != "ok":
                    raise RuntimeError(json.dumps(reply["content"])[:2000])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return "".join(printed)


def once(model: str, tool: str, bare: bool, lens_from: str | None = None,
         order: str = "one cell") -> tuple[float, float, str, int, int]:
    """(seconds from the loss to the display bundle, seconds of the tool's import or its load cell, the tool's name,
    1 if the lens's warm-up was still running when the timed cell began); ``lens_from``: the directory holding
    another copy of the package to import instead (``--baseline``)"""
    first = f"import sys\nsys.path.insert(0, {lens_from!r})\n" if lens_from else ""
    picture = FORMAT + (LENS if tool == "lens" else TORCHVIZ)
    if bare:
        cells = [MODELS[model], first + picture]
        out = subprocess.run([sys.executable, "-c", "\n".join(cells)], capture_output=True, text=True, check=True).stdout
    elif order == "one cell":
        out = _in_kernel([[MODELS[model]], [first + picture]])  # the model, then the picture
    else:
        cells = [first + LOAD[tool], MODELS[model], picture]
        out = _in_kernel([cells] if order == "run all" else [cells[:2], cells[2:]], PAUSE if order == "reader" else 0)
    elapsed, imported, name, warming, collections = out.strip().splitlines()[-1].split()
    return float(elapsed), float(imported), name, int(warming), int(collections)


def compiled() -> None:
    """A user's install has the lens's bytecode (pip compiles a wheel's modules; an editable install writes
    ``__pycache__`` on first import), as graphviz's already has: compile it once, so that no run counts compiling
    the lens's sources (this matters where PYTHONDONTWRITEBYTECODE is set, as on the CI machines)."""
    import compileall
    import os

    import autograd_lens

    compileall.compile_dir(os.path.dirname(autograd_lens.__file__), quiet=1)


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bare", action="store_true", help="a plain `python -c` per run instead of a kernel")
    parser.add_argument("--baseline", metavar="DIR", help="also time the autograd_lens package in DIR (say, an "
                        "earlier commit: git archive COMMIT autograd_lens | tar -x -C DIR), in the same rounds")
    parser.add_argument("--model", action="append", choices=list(MODELS), help="only this model (repeatable)")
    parser.add_argument("--order", action="append", choices=ORDERS, help="only this order of cells (repeatable)")
    parser.add_argument("--lens", metavar="DIR", help="time the autograd_lens package in DIR (as --baseline) instead "
                        "of the installed one")
    options = parser.parse_args()
    compiled()
    for directory in (options.baseline, options.lens):
        if directory:
            import compileall

            compileall.compile_dir(directory, quiet=1)
    orders = ["one cell"] if options.bare else (options.order or list(ORDERS))
    where = "python -c" if options.bare else "a fresh kernel"
    print(f"in {where}; medians of {options.rounds}; seconds from the loss to the display bundle (the tool's import "
          f"or load cell apart); load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':<16}{'order':<10}{'lens':>16}{'other':>28}{'ratio':>8}{'with imports':>14}{'warming':>9}"
          f"{'collections':>13}")
    for model in options.model or MODELS:
        runs: dict[tuple[str, str], list] = {}
        for _ in range(options.rounds):  # the tools and orders alternate within each round
            for order in orders:
                for tool, lens_from in (("lens", options.lens), ("torchviz", None), ("baseline", options.baseline)):
                    if tool == "baseline" and not lens_from:
                        continue
                    kind = "torchviz" if tool == "torchviz" else "lens"
                    runs.setdefault((order, tool), []).append(once(model, kind, options.bare, lens_from, order))
        for order in orders:
            other = runs[(order, "torchviz")]
            b, b_import = (statistics.median(run[i] for run in other) for i in (0, 1))
            for tool in ("lens", "baseline"):
                if (order, tool) not in runs:
                    continue
                mine = runs[(order, tool)]
                a, a_import = (statistics.median(run[i] for run in mine) for i in (0, 1))
                label = model if tool == "lens" else "  baseline"
                warming = f"{sum(run[3] for run in mine)}/{len(mine)}" if order != "one cell" else ""
                print(f"{label:<16}{order:<10}{a:>7.3f} (+{a_import:.3f}){other[0][2]:>16} {b:.3f} (+{b_import:.3f})"
                      f"{a / b:>8.2f}{(a + a_import) / (b + b_import):>14.2f}{warming:>9}"
                      f"{statistics.median(run[4] for run in mine):>7g} / {statistics.median(run[4] for run in other):g}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
