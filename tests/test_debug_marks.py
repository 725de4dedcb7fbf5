"""The debugging answers on the drawing (issue 23): cut marks, the NaN origin, the paths to a leaf.

Each program has one known cause, and the place the mark must go is read from torch itself while the program
runs (the ``grad_fn`` of the tensor that used the cut value, the op anomaly mode names); the DOT text and the
rendered SVG must hold the mark there and nowhere else, and a pass without a problem must hold none.  The path
arrows are compared with every root-to-leaf route of the drawn graph, found here independently.
"""

from __future__ import annotations

import re
import shutil
import warnings

import pytest
import torch

import autograd_lens as al
from autograd_lens.debug.drawing import paths_dot
from autograd_lens.debug.why import Why
from autograd_lens.views.dot import to_dot
from autograd_lens.views.marks import CUT_COLOR, NAN_COLOR, PATH_COLOR, edge_colours, marks_for, path_edges
from autograd_lens.views.passview import PassView


def traced(program, why=True):
    """Run ``program(ns, truth)`` under a Lens: (its one pass, ns, truth)."""
    torch.manual_seed(0)
    ns: dict = {}
    truth: dict = {}
    with al.Lens(names=ns, why=why) as lens:
        program(ns, truth)
    (backward_pass,) = lens.passes
    return backward_pass, ns, truth


def key(tensor):
    return (tensor.grad_fn._sequence_nr(), tensor.grad_fn.name())


def node_of(backward_pass, fn_key):
    (found,) = [n.id for n in backward_pass.graph.nodes if (n.sequence_nr, n.op) == fn_key]
    return found


def leaves(ns, *names):
    for name in names:
        ns[name] = torch.randn(3, requires_grad=True)
    return [ns[name] for name in names]


def statements(dot, text):
    """The DOT lines (node and edge statements) that contain ``text``."""
    return [line.strip() for line in dot.splitlines() if text in line]


def svg_groups(svg, text):
    """Ids of the SVG's node and edge groups whose content contains ``text``."""
    return [m.group(1) for m in re.finditer(r'<g id="([^"]+)" class="(?:node|edge)">(.*?)</g>', svg, re.S)
            if text in m.group(2)]


# ----------------------------------------------------------------------------- programs with one known cause

def detach(ns, truth):
    x, w = leaves(ns, "x", "w")
    y = x * w.detach()
    truth["at"] = key(y)
    (y * x).sum().backward()  # a second mul, which did not take the cut value


def no_grad(ns, truth):
    x, w = leaves(ns, "x", "w")
    with torch.no_grad():
        h = w * 2
    y = x + h
    truth["at"] = key(y)
    y.sum().backward()


def argmax(ns, truth):
    x, w = leaves(ns, "x", "w")
    y = x * w.argmax()
    truth["at"] = key(y)
    y.sum().backward()


@pytest.mark.parametrize("program, code", [(detach, "detached"), (no_grad, "no_grad"), (argmax, "non_differentiable")])
def test_a_cut_is_drawn_into_the_function_that_used_the_cut_value(program, code):
    backward_pass, ns, truth = traced(program)
    assert ns["w"].grad is None and ns["x"].grad is not None  # plain torch: w got nothing
    reason = backward_pass.unreached["w"]
    assert reason.code == code
    target = node_of(backward_pass, truth["at"])
    assert reason.at == (target,)
    view = PassView(backward_pass)
    dot = view.dot
    # one box for the cut-off tensor, one dashed red arrow from it into the function that used the cut value
    assert statements(dot, "✂") == [statements(dot, "cut1 [")[0]]
    assert "✂ w" in statements(dot, "cut1 [")[0]
    (arrow,) = statements(dot, "cut1 ->")
    assert arrow.startswith(f"cut1 -> {target} [") and CUT_COLOR in arrow and "style=dashed" in arrow
    assert len(statements(dot, CUT_COLOR)) == 2 and NAN_COLOR not in dot
    svg = view.svg
    assert svg_groups(svg, "✂") == ["cut1"]
    assert svg_groups(svg, CUT_COLOR) == ["cut1", "cut1e1"]
    assert f'<path style="fill:none;stroke:{CUT_COLOR}"' in svg  # the arrow's own colour outranks the drawing's sheet
    data = view.data()
    assert set(data["marktitles"]) == {"cut1", "cut1e1"} and str(reason) == data["marktitles"]["cut1"]


def test_without_the_forward_record_a_detach_is_placed_by_the_saved_value_and_an_argmax_is_not():
    backward_pass, _, truth = traced(detach, why=False)
    assert backward_pass.unreached["w"].at == (node_of(backward_pass, truth["at"]),)
    assert statements(PassView(backward_pass).dot, "cut1 ->")[0].startswith(f"cut1 -> {node_of(backward_pass, truth['at'])} ")
    backward_pass, _, _ = traced(argmax, why=False)  # unknown cause: the lens cannot place it, so no mark
    assert backward_pass.unreached["w"].code == "unknown"
    assert not marks_for(backward_pass) and "✂" not in PassView(backward_pass).dot


def test_a_cut_into_a_box_the_drawing_does_not_show_draws_nothing():
    """A function folded into a repeated block's box (or cut by max_nodes) has no box of its own: its cut gets no
    arrow to a box Graphviz would make up, and no cut-off tensor box either."""
    backward_pass, _, _ = traced(detach)
    marks = marks_for(backward_pass)
    ((src, _, attributes),) = marks.extra_edges
    marks.extra_edges = [(src, "n999", attributes)]
    dot = to_dot(backward_pass.graph, marks=marks)
    assert "cut1" not in dot and "n999" not in dot


def hook_zeros(ns, truth):
    x, w = leaves(ns, "x", "w")
    ns["h"] = h = x * w
    h.register_hook(lambda grad: torch.zeros_like(grad))
    (h * 2).sum().backward()


def test_a_hook_returning_zeros_is_marked_on_the_box_of_its_tensor():
    backward_pass, ns, _ = traced(hook_zeros)
    assert torch.equal(ns["w"].grad, torch.zeros(3)) and torch.equal(ns["x"].grad, torch.zeros(3))
    (h_box,) = [n.id for n in backward_pass.graph.nodes if n.label == "h" and n.kind == "tensor"]
    view = PassView(backward_pass)
    (line,) = statements(view.dot, "✂")
    assert line.startswith(f"{h_box} [") and "a hook returned zeros (x, w)" in line and "dashed" in line
    assert svg_groups(view.svg, "✂") == [h_box]


def test_a_leaf_left_out_by_backward_inputs_has_its_box_and_arrows_marked():
    def program(ns, truth):
        x, w = leaves(ns, "x", "w")
        (x * w).sum().backward(inputs=[x])
    backward_pass, ns, _ = traced(program)
    assert ns["w"].grad is None
    (w_box,) = [n.id for n in backward_pass.graph.nodes if n.label == "w"]
    arrows = [e.id for e in backward_pass.graph.edges if e.src == w_box]
    dot = PassView(backward_pass).dot
    assert [line.split(" ")[0] for line in statements(dot, "✂")] == [w_box]
    assert sorted(re.search(r"id=(\w+)", line).group(1) for line in statements(dot, CUT_COLOR) if "->" in line) == arrows
    # no gradient was computed for w in this pass: no path to it is offered or drawn over the cut
    from autograd_lens.debug import safe_paths_to

    assert not safe_paths_to([backward_pass], "w").known and not safe_paths_to([backward_pass], "w", 0).known
    assert "not among the inputs of pass 1" in safe_paths_to([backward_pass], "w", 0).unknown
    assert [entry["name"] for entry in PassView(backward_pass).data()["paths"]] == ["x"]


def test_tensors_the_lens_cannot_place_get_no_mark():
    def unused(ns, truth):
        x, w = leaves(ns, "x", "w")
        (x * 2).sum().backward()

    def frozen(ns, truth):
        ns["model"] = model = torch.nn.Linear(3, 1)
        model.weight.requires_grad_(False)
        model(torch.randn(2, 3)).sum().backward()
    for program, name, code in ((unused, "w", "not_on_path"), (frozen, "model.weight", "requires_grad_false")):
        backward_pass, _, _ = traced(program)
        assert backward_pass.unreached[name].code == code and backward_pass.unreached[name].at == ()
        assert not marks_for(backward_pass) and "✂" not in PassView(backward_pass).dot


# ----------------------------------------------------------------------------- the NaN origin

def log_of_zero(truth):
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    logged = torch.log(x)
    truth["at"] = key(logged)
    return (logged * 0).sum() + x.sum()


def log_late(truth):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    a = torch.tanh(x) * 3
    b = torch.log(a - a.detach()[0])  # log at 0 for the first element, after three other ops
    truth["at"] = key(b)
    return (b * 0).sum() + (a * 2).sum()


def anomaly_name(program):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autograd.detect_anomaly():
                program({}).backward()
        except RuntimeError as error:
            return re.search(r"Function '(\w+)' returned nan", str(error)).group(1)
    return None


@pytest.mark.parametrize("program", [log_of_zero, log_late])
def test_the_nan_origin_is_marked_on_the_node_anomaly_mode_names(program):
    truth: dict = {}
    with al.Lens(names={}) as lens:
        program(truth).backward()
    (backward_pass,) = lens.passes
    expected = anomaly_name(program)
    target = node_of(backward_pass, truth["at"])
    assert backward_pass.graph.node(target).op == truth["at"][1] == expected
    view = PassView(backward_pass)
    starts = [line for line in statements(view.dot, "starts here")]
    assert len(starts) == 1 and starts[0].startswith(f"{target} [") and "⚠ NaN starts here" in starts[0]
    assert NAN_COLOR in starts[0] and len(statements(view.dot, NAN_COLOR)) == 1 and "✂" not in view.dot
    assert svg_groups(view.svg, "NaN starts here") == [target]
    assert "first non-finite gradient: backward function " + expected in view.data()["marktitles"][target]


def test_the_forward_call_that_made_the_nan_is_marked_with_the_forward_record():
    v = torch.tensor([0.0, 1.0], requires_grad=True)
    with al.Lens(names={"v": v}, why=True) as lens:
        logged = torch.log(v)
        (logged * 0).sum().backward()
    (line,) = statements(PassView(lens.passes[0]).dot, "starts here")
    assert line.startswith(node_of(lens.passes[0], key(logged)) + " [")
    assert "⚠ NaN starts here" in line and "⚠ forward inf starts here" in line  # log(0) = -inf, its gradient NaN


def test_a_pass_without_a_problem_has_no_mark():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        (x * w).sin().sum().backward()
    (backward_pass,) = lens.passes
    assert dict(backward_pass.unreached) == {} and backward_pass.first_nonfinite is None
    view = PassView(backward_pass)
    assert not marks_for(backward_pass)
    for mark in ("✂", "⚠", "starts here", CUT_COLOR, NAN_COLOR, "cut1"):
        assert mark not in view.dot and mark not in view.svg
    assert "marktitles" not in view.data()
    assert view.dot == to_dot(backward_pass.graph, edge_labels=view.final.edge_labels,
                              grad_texts={n: max(t, key=len) for n, t in view.grad_variants.items()})
    assert edge_colours(view.svg) == view.svg


def test_marks_never_raise():
    import dataclasses

    backward_pass, _, _ = traced(detach)
    assert not marks_for(dataclasses.replace(backward_pass, debug=object(), events=None))
    assert "cut1" not in PassView(dataclasses.replace(backward_pass, debug=object())).dot


# ----------------------------------------------------------------------------- paths

def routes(graph, name):
    """Every route of arrows from the output to a leaf labelled ``name``, found on the drawn graph."""
    found = []
    (output,) = [n.id for n in graph.nodes if n.kind == "output"]

    def walk(node_id, chain):
        node = graph.node(node_id)
        if node.kind == "leaf" and node.label == name:
            found.append(tuple(chain))
            return
        for edge in graph.edges_into(node_id):
            if edge.kind == "data":
                walk(edge.src, chain + [edge.id])
    walk(output, [])
    return sorted(found)


def test_path_arrows_are_the_routes_of_the_drawn_graph_and_their_contributions_add_up():
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    w = torch.tensor([1.5, 0.3, -0.7], requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        h = x * w
        lens.names["h"] = h
        (h * x.detach() + h.sin() * w).sum().backward()
    (backward_pass,) = lens.passes
    graph = backward_pass.graph
    for name, leaf in (("w", w), ("x", x)):
        path_set = lens.paths_to(name)
        drawn = sorted(path_edges(graph, path) for path in path_set.paths)
        assert drawn == routes(graph, name) and len(drawn) == path_set.count
        total = sum(path.contribution for path in path_set.paths)
        assert torch.allclose(total, leaf.grad)
    data = PassView(backward_pass).data()
    assert [entry["name"] for entry in data["paths"]] == ["w", "x"]
    assert data["paths"][0]["paths"][0]["edges"] == list(path_edges(graph, lens.paths_to("w").paths[0]))


def test_x_times_x_has_two_paths_along_two_different_arrows():
    x = torch.tensor(3.0, requires_grad=True)
    with al.Lens(names={"x": x}, why=True) as lens:
        (x * x).backward()
    path_set = lens.paths_to("x")
    first, second = (path_edges(lens.passes[0].graph, path) for path in path_set.paths)
    assert first[:-1] == second[:-1] and first[-1] != second[-1]
    assert sorted([first, second]) == routes(lens.passes[0].graph, "x")
    assert float(path_set.total) == float(x.grad) == 6.0


def test_why_draws_the_paths_numbered_as_its_table_deterministically():
    x = torch.tensor([0.5, -1.0], requires_grad=True)
    w = torch.tensor([1.5, 0.3], requires_grad=True)
    with al.Lens(names={"x": x, "w": w}, why=True) as lens:
        (x * w + (x * w).exp()).sum().backward()
    page = Why(lens, "w")._repr_html_()
    assert page == Why(lens, "w")._repr_html_()
    assert "<th>path</th>" in page and "<td>1</td>" in page and "<td>2</td>" in page
    dot, titles = paths_dot(lens.passes[0], lens.paths_to("w"))
    path_lines = statements(dot, PATH_COLOR)
    on_paths = {edge for path in lens.paths_to("w").paths for edge in path_edges(lens.passes[0].graph, path)}
    assert {re.search(r"id=(\w+)", line).group(1) for line in path_lines} == on_paths
    assert set(titles) == on_paths
    if shutil.which("dot") or _wasm():
        assert "The paths on the drawing" in page and page.count(f'<path style="fill:none;stroke:{PATH_COLOR}"') == len(on_paths)
    assert "0x" not in page


def _wasm():
    from autograd_lens.views.render import wasm_available

    return wasm_available()


# ----------------------------------------------------------------------------- in a browser

CELL = """x = torch.tensor([0.5, -1.0], requires_grad=True)
w = torch.tensor([1.5, 0.3], requires_grad=True)
v = torch.tensor([2.0, 1.0], requires_grad=True)
(x * w + (x * w).exp() + x * v.detach()).sum().backward()"""
PURPLE, RED = "rgb(124, 58, 237)", "rgb(220, 38, 38)"  # PATH_COLOR, CUT_COLOR as computed styles


def marks_lens():
    with al.Lens(names={}, why=True) as lens:
        lens.names = namespace = {"torch": torch}
        exec(CELL, namespace)
    return lens


@pytest.fixture(scope="module")
def chromium():
    playwright = pytest.importorskip("playwright.sync_api")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("Debian's chromium is not installed")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def check_marks_and_paths(stepper, lens):
    """In one stepper (a locator): the cut arrow red, its tooltip, and the path highlight on and off."""
    backward_pass = lens.passes[0]
    stroke = "(root, id) => getComputedStyle(root.querySelector('#' + id + ' > path')).stroke"
    assert stepper.evaluate(stroke, "cut1e1") == RED  # the mark's colour, not the drawing sheet's grey
    assert "v: detached" in stepper.evaluate("root => root.querySelector('#cut1 > title').textContent")
    entries = PassView(backward_pass).data()["paths"]
    leaf = [entry["name"] for entry in entries].index("w")
    first = lens.paths_to("w").paths[0]
    expected = set(path_edges(backward_pass.graph, first))
    others = [edge.id for edge in backward_pass.graph.edges if edge.id not in expected]
    assert stepper.locator("select.al-paths option").count() == 1 + sum(1 + len(e["paths"]) for e in entries)
    stepper.locator("select.al-paths").select_option(f"{leaf}.0")
    assert {edge for edge in expected if stepper.evaluate(stroke, edge) == PURPLE} == expected
    assert not [edge for edge in others if stepper.evaluate(stroke, edge) == PURPLE]
    assert first.text() in stepper.locator(".al-pathnote").inner_text()
    stepper.locator("select.al-paths").select_option("")
    assert not [edge for edge in expected if stepper.evaluate(stroke, edge) == PURPLE]
    return expected


def test_the_static_page_shows_cut_colours_tooltips_and_the_path_highlight(chromium, tmp_path):
    lens = marks_lens()
    path = tmp_path / "marks.html"
    lens.to_html(str(path))
    from test_browser import open_page

    page, errors = open_page(chromium, path)
    check_marks_and_paths(page.locator(".al-stepper"), lens)
    assert errors == []
    page.close()


HOOKED_CELL = """x = torch.tensor(1.0, requires_grad=True)
y = x * 2
z = y * 3
z.register_hook(lambda g: g * 2)
(z + y * 5).backward()"""


def test_the_path_note_says_when_hooks_changed_the_gradient(chromium, tmp_path):
    """The paths add up to x's gradient without hooks (6 + 10 = 16); torch gave 22: the note says so too."""
    with al.Lens(names={}, why=True) as lens:
        lens.names = namespace = {"torch": torch}
        exec(HOOKED_CELL, namespace)
    assert float(namespace["x"].grad) == 22.0
    (entry,) = [entry for entry in PassView(lens.passes[0]).data()["paths"] if entry["name"] == "x"]
    path = tmp_path / "hooked.html"
    lens.to_html(str(path))
    from test_browser import open_page

    page, errors = open_page(chromium, path)
    stepper = page.locator(".al-stepper")
    leaf = [e["name"] for e in PassView(lens.passes[0]).data()["paths"]].index("x")
    stepper.locator("select.al-paths").select_option(str(leaf))
    note = stepper.locator(".al-pathnote").inner_text()
    assert "= 6.0" in note and "= 10.0" in note
    assert entry["hooks"] in note and "22.0" in note and "without hooks" in note, note
    stepper.locator("select.al-paths").select_option(f"{leaf}.1")  # one path: the same line under it
    assert entry["hooks"] in stepper.locator(".al-pathnote").inner_text()
    assert "without hooks" in stepper.locator("select.al-paths optgroup").nth(leaf).get_attribute("label")
    assert errors == []
    page.close()


class _WithWhyNotebook:
    """A tmp_path_factory whose JupyterLab folder also holds why.ipynb (a %%lens --why cell)."""

    def __init__(self, factory):
        self.factory = factory

    def mktemp(self, name, **options):
        import json

        folder = self.factory.mktemp(name, **options)
        if name == "lab":
            cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}
                     for source in ("%load_ext autograd_lens\nimport torch", "%%lens --why w\n" + CELL)]
            (folder / "why.ipynb").write_text(json.dumps({
                "cells": cells, "nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
        return folder


def test_the_live_widget_in_jupyterlab_dark_theme_marks_and_highlights_paths(chromium, tmp_path_factory):
    browser_tests = pytest.importorskip("test_browser")
    lab = browser_tests.start_lab(_WithWhyNotebook(tmp_path_factory), theme="JupyterLab Dark")
    url = next(lab)
    try:
        page, _ = browser_tests.open_page(chromium, url.replace("/lab/tree/stepper.ipynb",
                                                                "/lab/workspaces/why/tree/why.ipynb"),
                                          None, width=1400, height=1000)
        browser_tests.run_all(page)
        stepper = page.locator(".jp-OutputArea .al-stepper").first
        stepper.locator("button[data-go=next]").wait_for(timeout=60_000)
        assert page.evaluate("document.body.dataset.jpThemeLight") == "false"
        check_marks_and_paths(stepper, marks_lens())
        stepper.locator("select.al-paths").select_option("0")
        assert browser_tests.contrast(page, ".jp-OutputArea .al-pathnote") >= 4.5
        # the --why drawing: on its own white canvas, the arrows of the paths to w in purple
        drawing = page.locator(".jp-OutputArea .al-why-drawing")
        assert drawing.evaluate("d => getComputedStyle(d).backgroundColor") == "rgb(255, 255, 255)"
        assert drawing.locator("svg g.edge > path[style*='#7c3aed']").count() >= 2
        # its numbered paths are buttons there too (the notebook is trusted: its script ran)
        page.locator(".jp-OutputArea button.al-why-path").first.click()
        assert drawing.get_attribute("data-path") == "1"
        browser_tests.shot(page, "jupyterlab-dark-debug-marks.png")
        page.close()
    finally:
        lab.close()


def _leaves(count=24):
    a = torch.tensor(1.5, requires_grad=True)
    ws = [torch.tensor(float(i % 3) + 0.5, requires_grad=True) for i in range(count)]
    return a, ws, {"a": a, **{f"w{i}": w for i, w in enumerate(ws)}}


def wide_lens():
    """24 terms stacked and summed; a used in the first and the last: its two paths far apart on the drawing."""
    a, ws, names = _leaves()
    with al.Lens(names=names, why=True) as lens:
        terms = [(a * ws[0]).exp()] + [(w * 2).tanh() for w in ws[1:-1]] + [(a * ws[-1]).sin()]
        torch.stack(terms).sum().backward()
    return lens, a


def chain_lens():
    """A chain of 24 adds and a used once, next to the loss: a short path at the far end of a tall drawing."""
    a, ws, names = _leaves()
    with al.Lens(names=names, why=True) as lens:
        total = (ws[0] * 2).tanh()
        for w in ws[1:]:
            total = total + (w * 2).tanh()
        (total + (a * 3).sin()).backward()
    return lens, a


IN_VIEW = """(root, [port, ids]) => {
    const box = root.querySelector(port).getBoundingClientRect();
    return ids.map(id => { const g = root.querySelector('#' + id);
        if (!g || !g.getClientRects().length) { return false; }
        const b = g.getBoundingClientRect();
        return b.left >= box.left && b.right <= box.right && b.top >= box.top && b.bottom <= box.bottom; }); }"""


def test_choosing_a_path_in_the_stepper_brings_it_into_view(chromium, tmp_path):
    """The paths menu of the static page: a chosen path outside the view is moved (and zoomed out) into it, every
    one of its arrows; choosing one already in view keeps the view."""
    from test_browser import open_page

    lens, a = wide_lens()
    assert lens.paths_to("a").count == 2 and torch.allclose(lens.paths_to("a").total, a.grad)
    path = tmp_path / "wide.html"
    lens.to_html(str(path))
    page, errors = open_page(chromium, path)
    stepper = page.locator(".al-stepper")
    entries = PassView(lens.passes[0]).data()["paths"]
    leaf = [entry["name"] for entry in entries].index("a")
    chosen = [set(path_edges(lens.passes[0].graph, p)) for p in lens.paths_to("a").paths]
    moved = 0
    for number, edges in enumerate(chosen):
        page.click("button[data-go=root]")
        before = stepper.evaluate(IN_VIEW, [".al-viewport", sorted(edges)])
        view = stepper.evaluate("root => root.querySelector('.al-canvas').style.transform")
        stepper.locator("select.al-paths").select_option(f"{leaf}.{number}")
        assert all(stepper.evaluate(IN_VIEW, [".al-viewport", sorted(edges)])), number
        if all(before):
            assert stepper.evaluate("root => root.querySelector('.al-canvas').style.transform") == view
        moved += not all(before)
        stepper.locator("select.al-paths").select_option("")
    assert moved  # at least one path started out of view
    stepper.locator("select.al-paths").select_option(str(leaf))  # all its paths
    assert all(stepper.evaluate(IN_VIEW, [".al-viewport", sorted(set.union(*chosen))]))
    assert errors == []
    page.close()


def test_choosing_a_numbered_path_of_the_why_drawing_scrolls_it_into_view(chromium, tmp_path):
    """%%lens --why a: each path number in the paths table is a button; a click shows that path alone (the other
    arrows faded) and scrolls the drawing so that its arrows are in view; a second click shows all again."""
    from test_browser import open_page

    lens, a = chain_lens()
    paths = lens.paths_to("a")
    assert paths.count == 1 and torch.allclose(paths.total, a.grad)
    edges = sorted(path_edges(lens.passes[0].graph, paths.paths[0]))
    page_path = tmp_path / "why.html"
    page_path.write_text(f"<!DOCTYPE html><html><body>{Why(lens, 'a')._repr_html_()}</body></html>", encoding="utf-8")
    page, errors = open_page(chromium, page_path, ".al-why-drawing[data-ready]", height=700)
    drawing = page.locator(".al-why-drawing")
    assert not any(drawing.evaluate(IN_VIEW.replace("root.querySelector(port)", "root"), ["", edges]))
    button = page.locator("button.al-why-path")
    assert button.all_inner_texts() == ["1"]
    button.click()
    assert drawing.get_attribute("data-path") == "1" and button.get_attribute("aria-pressed") == "true"
    assert all(drawing.evaluate(IN_VIEW.replace("root.querySelector(port)", "root"), ["", edges]))
    faded = drawing.evaluate("d => Array.from(d.querySelectorAll('g.edge')).filter(g => g.style.opacity === '0.25')"
                             ".map(g => g.id)")
    assert faded and not set(faded) & set(edges)
    button.click()
    assert drawing.get_attribute("data-path") == "" and drawing.locator("g.edge[style*='opacity: 0.25']").count() == 0
    assert errors == []
    page.close()


def test_a_chosen_path_through_closed_module_groups_opens_them(chromium, tmp_path):
    """20 x (Linear + Tanh) with module groups (past 60 boxes they start closed): the path to model.10.weight runs
    through closed layers; choosing it opens them and brings every arrow into view."""
    from test_browser import open_page

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(20) for m in (torch.nn.Linear(2, 2), torch.nn.Tanh())])
    with al.Lens(names={"model": model}, modules=True, why=True) as lens:
        model(torch.randn(1, 2)).sum().backward()
    path = tmp_path / "groups.html"
    lens.to_html(str(path))
    page, errors = open_page(chromium, path)
    stepper = page.locator(".al-stepper")
    entries = [entry["name"] for entry in PassView(lens.passes[0]).data()["paths"]]
    edges = sorted(path_edges(lens.passes[0].graph, lens.paths_to("model.10.weight").paths[0]))
    closed = len(stepper.get_attribute("data-collapsed").split())
    assert not all(stepper.evaluate(IN_VIEW, [".al-viewport", edges]))
    stepper.locator("select.al-paths").select_option(f"{entries.index('model.10.weight')}.0")
    assert all(stepper.evaluate(IN_VIEW, [".al-viewport", edges]))
    assert len(stepper.get_attribute("data-collapsed").split()) < closed
    assert errors == []
    page.close()
