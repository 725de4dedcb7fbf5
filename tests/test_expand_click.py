"""Folded boxes open on a click (and on Enter / Space) and fold again: the drawings stored for it hold exactly the
right boxes (compared with the unfolded drawing of the same graph), and a real browser (Chromium) opens and folds
them in the static page and in JupyterLab."""

from __future__ import annotations

import html
import json
import re
import urllib.parse
import urllib.request

import pytest
import torch

import autograd_lens as al
from autograd_lens.views import graphview
from autograd_lens.views.fold import plan
from autograd_lens.views.graphview import expanded, fold_data, fold_states
from autograd_lens.views.render import render_svg
from test_fold import resnet_loss, transformer_loss

_NODE = re.compile(r"""<g id=["']([nf]\d+)["'] class=["']node["'][^>]*>(.*?)</g>""", re.S)
_TEXT = re.compile(r"<text[^>]*>([^<]*)</text>")


def boxes(svg: str) -> dict[str, tuple[str, ...]]:
    """Each drawn box's id and its texts."""
    return {node: tuple(html.unescape(text) for text in _TEXT.findall(body)) for node, body in _NODE.findall(svg)}


def decoded(uri: str) -> str:
    return urllib.parse.unquote(uri.split(",", 1)[1])


def stored(graph):
    """(state, folded, svg) for every drawing the page stores; the first is the page's own picture."""
    states = fold_states(graph)
    data = fold_data(graph, states)
    svgs = [render_svg(graph.to_dot())] + [decoded(s["svg"]) for s in data["states"][1:]]
    return states, data, svgs


def same_boxes(svg: str, folded, unfolded: dict) -> None:
    """Each box of a stored drawing is drawn as in the unfolded drawing, or inside a fold still closed (whose
    boxes are the state's folds, with their labels)."""
    drawn = boxes(svg)
    hidden = set().union(*(set(f.nodes) for f in folded.folds))
    assert {k: v for k, v in drawn.items() if k.startswith("n")} == {k: v for k, v in unfolded.items() if k not in hidden}
    assert sorted(v[0] for k, v in drawn.items() if k.startswith("f")) == sorted(f.label for f in folded.folds)


def test_a_click_draws_the_first_transformer_layer_in_full_and_the_next_click_the_next():
    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    states, data, svgs = stored(graph)
    layer = [(f"model.layers.{i}",) for i in range(2)]
    assert [state for state, _ in states] == [(), tuple(layer[:1]), tuple(layer)]
    assert [[f.label for f in folded.folds] for _, folded in states] == [
        ["layers.0-11 (x12)"], ["layers.1-11 (x11)"], ["layers.2-11 (x10)"]]
    assert [len(folded.graph.nodes) for _, folded in states] == [16, 69, 122]
    unfolded = boxes(render_svg(_all(graph).to_dot()))
    for (state, folded), svg in zip(states, svgs):
        same_boxes(svg, folded, unfolded)  # every drawn box as in the unfolded drawing, with the same texts
    # the first click draws exactly what the x12 box held and the x11 box does not: layers.0's boxes
    twelve, eleven = states[0][1].folds[0], states[1][1].folds[0]
    opened = {k for k in boxes(svgs[1]) if k.startswith("n")} - set(boxes(svgs[0]))
    assert opened == set(twelve.nodes) - set(eleven.nodes) and len(opened) > 35
    # what a click does: f1 opens the next state, centred on its first block's outline; an outline folds back
    outline = [{g.path: g.id for g in folded.groups} for _, folded in states]
    first, second, third = data["states"]
    assert first["open"] == {"f1": [1, outline[1]["model.layers.0"], "layers.0 of layers.0-11 (x12)"]}
    assert second["open"] == {"f1": [2, outline[2]["model.layers.1"], "layers.1 of layers.1-11 (x11)"]}
    assert second["close"] == {outline[1]["model.layers.0"]: [0, "f1", "layers.0-11 (x12)"]}
    assert second["labels"][outline[1]["model.layers.0"]] == ("model.layers.0, one of layers.0-11 (x12) drawn in full: "
                                                              "fold them again")
    # folding layers.0 again folds the blocks opened after it too; folding layers.1 goes back one click
    assert third["close"] == {outline[2]["model.layers.0"]: [0, "f1", "layers.0-11 (x12)"],
                              outline[2]["model.layers.1"]: [1, "f1", "layers.1-11 (x11)"]}
    # the third click is past the budget (175 boxes more): the page says so, with the call that draws it
    assert third["open"]["f1"][0] == -1
    assert "(300 boxes in all), and not this one" in third["notes"]["f1"] and 'expand="layers.2"' in third["notes"]["f1"]
    assert first["notes"]["f1"].startswith("layers.0-11 (x12): 12 blocks of the same structure folded into one box. "
                                           "Click it (or Enter) to draw layers.0 in full (the others stay folded).")
    # the arrows the page follows (upstream/downstream) are the drawn ones
    assert {tuple(link[:2]) for link in second["links"]} == {(e.src, e.dst) for e in states[1][1].graph.edges}


def _all(graph):
    """The same graph drawn with every block in full (its module outlines kept)."""
    return expanded(graph, (("all",),))


def test_each_resnet_fold_opens_alone_and_together():
    model, loss = resnet_loss()
    graph = al.graph(loss, names={"model": model})
    states, data, svgs = stored(graph)
    labels = [[f.label for f in folded.folds] for _, folded in states]
    # a box of three opens its first block (the other two stay folded); a box of two opens both
    assert labels == [["layer1.0-2 (x3)", "layer2.1-2 (x2)"], ["layer1.1-2 (x2)", "layer2.1-2 (x2)"],
                      ["layer1.0-2 (x3)"], ["layer2.1-2 (x2)"]]
    assert [state for state, _ in states][1:3] == [(("model.layer1.0",),), (("model.layer2.1", "model.layer2.2"),)]
    unfolded = boxes(render_svg(_all(graph).to_dot()))
    first = plan(graph).folds
    for (state, folded), svg in zip(states, svgs):
        same_boxes(svg, folded, unfolded)
    # layer2 opened: all its boxes; layer1: those of layer1.0
    assert set(first[1].nodes) & set(boxes(svgs[2])) == set(first[1].nodes)
    assert set(first[0].nodes) & set(boxes(svgs[1])) == set(first[0].nodes) - set(states[1][1].folds[0].nodes)
    # layer1.0 then layer1.1-2 opened: folding layer1.0 again folds all three, either of the last two only them
    both = data["states"][3]
    assert sorted(both["close"].values()) == [[0, "f1", "layer1.0-2 (x3)"]] + [[1, "f1", "layer1.1-2 (x2)"]] * 2
    assert data["states"][2]["close"] == {g.id: [0, "f2", "layer2.1-2 (x2)"] for g in states[2][1].groups
                                          if g.path in ("model.layer2.1", "model.layer2.2")}


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.subs = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for sub in self.subs:
            x = torch.tanh(sub(x))
        return x


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Inner() for _ in range(4)])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_a_fold_inside_an_opened_block_opens_too_and_its_hint_draws_it():
    torch.manual_seed(0)
    model = Outer()
    loss = model(torch.randn(2, 8)).sum()
    graph = al.graph(loss, names={"model": model})
    states, data, svgs = stored(graph)
    assert [f.label for f in states[0][1].folds] == ["layers.0-3 (x4)"]
    assert [f.label for f in states[1][1].folds] == ["layers.0.subs.0-2 (x3)", "layers.1-3 (x3)"]
    # opened layers.0's own run: from state 1, f1 opens a state where layers.0.subs.0 is drawn in full
    target = data["states"][1]["open"]["f1"][0]
    drawn = {text[0] for text in boxes(svgs[target]).values()}
    assert "model.layers.0.subs.0.weight [8x8]" in drawn and "layers.0.subs.1-2 (x2)" in drawn
    assert not any(label.startswith(("model.layers.0.subs.1", "model.layers.1.subs.")) for label in drawn)
    # folding layers.0-3 again from there goes back to the first drawing (the inner run closes with it)
    outline = next(g.id for g in states[target][1].groups if g.path == "model.layers.0")
    assert data["states"][target]["close"][outline][0] == 0
    # the hint for a box whose drawing is not stored: the expand= it names draws that block in full
    stored_at = {state: number for number, (state, _) in enumerate(states)}
    beyond = next(d for d in data["states"] if any(move[0] == -1 and "layers.1.subs.0 of" in move[2]
                                                   for move in d["open"].values()))
    box = next(b for b, move in beyond["open"].items() if "layers.1.subs.0 of" in move[2])
    note = beyond["notes"][box]
    names = json.loads(re.search(r"expand=(\[[^\]]*\])", note).group(1))
    assert names == ["layers.1", "layers.1.subs.0"] and "--expand layers.1 --expand layers.1.subs.0" in note
    assert (("model.layers.0",), ("model.layers.1",), ("model.layers.1.subs.0",)) in stored_at  # stored elsewhere
    hinted = al.graph(loss, names={"model": model}, expand=names)
    hinted_boxes = {text[0] for text in boxes(render_svg(hinted.to_dot())).values()}
    assert "model.layers.1.subs.0.weight [8x8]" in hinted_boxes
    assert "model.layers.1.subs.1.weight [8x8]" not in hinted_boxes  # its siblings stay folded


def test_the_page_says_when_a_drawing_is_not_stored(monkeypatch):
    model, loss = resnet_loss()
    graph = al.graph(loss, names={"model": model})
    monkeypatch.setattr(graphview, "VARIANT_LAYOUTS", 1)
    states = fold_states(graph, layouts=1)
    data = fold_data(graph, states)
    assert len(states) == 2
    opening = data["states"][0]["open"]
    assert opening["f1"][0] == 1 and opening["f2"][0] == -1
    note = data["states"][0]["notes"]["f2"]
    assert "This page stores at most 1 drawings" in note and 'expand="layer2.1"' in note


def test_a_layout_that_fails_leaves_the_folded_page(monkeypatch):
    model, loss = resnet_loss()
    graph = al.graph(loss, names={"model": model})
    svg = render_svg(graph.to_dot())

    def broken(source, *args, **kwargs):
        raise RuntimeError("layout failed")

    monkeypatch.setattr(graphview, "render_svg", broken)
    page = graphview.graph_html(graph, svg, "g", lambda drawn: "<table></table>")
    assert "data:image/svg+xml," in page and "layer1.0-2 (x3)" in urllib.parse.unquote(page)
    states = fold_states(graph)
    data = fold_data(graph, states)
    assert len(states) == 1 and data["states"][0]["open"] == {"f1": [-1, "f1", "layer1.0 of layer1.0-2 (x3)"],
                                                              "f2": [-1, "f2", "layer2.1-2 (x2)"]}


def test_the_page_is_deterministic_and_bounded():
    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    page = graph._repr_mimebundle_()["text/html"]
    assert page == al.graph(loss, names={"model": model})._repr_mimebundle_()["text/html"]
    assert len(page) < 200_000  # the two opened drawings (69 and 122 boxes) are stored compressed
    states = fold_states(graph, boxes=60)  # the opened drawing (69 boxes) would pass the budget: not stored
    assert len(states) == 1 and fold_data(graph, states)["states"][0]["open"]["f1"][0] == -1


# ----------------------------------------------------------------------------- in a real browser

browser_only = pytest.mark.browser


def _page(browser, html_text, tmp_path):
    path = tmp_path / "graph.html"
    path.write_text(f"<!DOCTYPE html><html><body>{html_text}</body></html>", encoding="utf-8")
    from test_browser import open_page

    return open_page(browser, path, ".al-stepper[data-fold-state='0']")


def drawn_texts(where):
    return where.evaluate("(root) => Array.from(root.querySelectorAll('.al-canvas g.node')).map("
                          "g => [g.id, Array.from(g.querySelectorAll('text')).map(t => t.textContent)])")


def check_open_and_fold(stepper, graph, click, press):
    """Click the folded box: layers.0's boxes appear with their texts, the other layers folded as layers.1-11 (x11);
    click layers.0's outline: folded again.  Then with the keyboard (focus, Enter twice: layers.0 and layers.1 in
    full; Space on layers.0's outline folds both)."""
    states = fold_states(graph)
    unfolded = {k: list(v) for k, v in boxes(render_svg(_all(graph).to_dot())).items()}
    folded = {k: list(v) for k, v in boxes(render_svg(graph.to_dot())).items()}
    opened = {k: list(v) for k, v in boxes(render_svg(expanded(graph, states[1][0]).to_dot())).items()}
    assert dict(drawn_texts(stepper)) == folded
    box = stepper.locator(".al-canvas #f1")
    assert box.get_attribute("role") == "button" and box.get_attribute("tabindex") == "0"
    assert box.get_attribute("aria-expanded") == "false"
    assert box.get_attribute("aria-label").startswith("layers.0-11 (x12): 12 blocks")
    stepper.locator("button[data-go=fit]").click()  # the whole folded drawing in view
    click(box)
    assert stepper.get_attribute("data-fold-state") == "1"
    assert stepper.locator(".al-cardbox").inner_text() == ("Opened layers.0 of layers.0-11 (x12). Click an opened "
                                                           "block's outline or name (or Enter / Space on it) to fold "
                                                           "it again.")
    drawn = dict(drawn_texts(stepper))
    assert drawn == opened and drawn["f1"][0] == "layers.1-11 (x11)"
    assert {k: v for k, v in drawn.items() if k.startswith("n")} == {k: v for k, v in unfolded.items() if k in drawn}
    outline_of = {g.path: g.id for g in states[1][1].groups}
    outline = stepper.locator(f".al-canvas #{outline_of['model.layers.0']}")  # opened: its name is in view
    assert outline.get_attribute("aria-expanded") == "true"
    assert "fold them again" in outline.get_attribute("aria-label")
    click(outline.locator(":scope > text").first)  # the outline's name
    assert stepper.get_attribute("data-fold-state") == "0"
    assert stepper.locator(".al-cardbox").inner_text() == "Folded layers.0-11 (x12) again."
    assert dict(drawn_texts(stepper)) == folded
    # keyboard: the box takes focus, Enter opens layers.0 (its outline has focus); Enter on layers.1-11 (x11) opens
    # layers.1; Space on layers.0's outline folds both
    stepper.locator(".al-canvas #f1").focus()
    press("Enter")
    assert stepper.get_attribute("data-fold-state") == "1"
    focused = stepper.evaluate("(root) => root.ownerDocument.activeElement.id")
    assert focused == outline_of["model.layers.0"]
    stepper.locator(".al-canvas #f1").focus()
    press("Enter")
    assert stepper.get_attribute("data-fold-state") == "2"
    second = {g.path: g.id for g in states[2][1].groups}
    assert stepper.evaluate("(root) => root.ownerDocument.activeElement.id") == second["model.layers.1"]
    assert dict(drawn_texts(stepper))["f1"][0] == "layers.2-11 (x10)"
    stepper.locator(f".al-canvas #{second['model.layers.0']}").focus()
    press(" ")
    assert stepper.get_attribute("data-fold-state") == "0"
    assert stepper.evaluate("(root) => root.ownerDocument.activeElement.id") == "f1"


@browser_only
def test_a_folded_box_opens_and_folds_in_the_static_page(browser, tmp_path):
    from test_browser import shot

    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    page, errors = _page(browser, graph._repr_mimebundle_()["text/html"], tmp_path)
    stepper = page.locator(".al-stepper")
    check_open_and_fold(stepper, graph, lambda target: target.click(), page.keyboard.press)
    # opened, a block's node can still be found and selected (upstream / downstream follow the opened arrows)
    page.locator(".al-canvas #f1").press("Enter")
    shot(page, "graph-fold-opened.png")
    page.fill("input.al-search", "layers.0.attn")
    assert int(stepper.get_attribute("data-found")) >= 1
    assert errors == []
    page.close()


@browser_only
def test_at_fit_the_overview_hides_small_labels_but_not_the_folded_boxes(browser, tmp_path):
    """Fitted to a small viewport, text under 10 px is hidden (an overview); the folded box's name stays, so the
    box to click can be found."""
    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    from test_browser import open_page

    path = tmp_path / "graph.html"
    path.write_text(f"<!DOCTYPE html><html><body>{graph._repr_mimebundle_()['text/html']}</body></html>",
                    encoding="utf-8")
    page, errors = open_page(browser, path, ".al-stepper[data-fold-state='0']", width=700, height=500)
    stepper = page.locator(".al-stepper")
    stepper.locator("button[data-go=fit]").click()
    assert "al-overview" in stepper.get_attribute("class")
    shown = stepper.evaluate("(root) => Array.from(root.querySelectorAll('.al-canvas g.node text'))"
                             ".filter(t => getComputedStyle(t).display !== 'none').map(t => t.textContent)")
    assert "layers.0-11 (x12)" in shown, shown  # every other node's text is hidden: only the folded box's shows
    folded = stepper.evaluate("(root) => Array.from(root.querySelectorAll('.al-canvas g.node.al-foldable text'))"
                              ".map(t => t.textContent)")
    assert sorted(shown) == sorted(folded), (shown, folded)
    assert errors == []
    page.close()


NOTEBOOK_SOURCE = """%load_ext autograd_lens
import sys
sys.path.insert(0, {tests!r})
from test_fold import transformer_loss
model, loss = transformer_loss()"""


@browser_only
@pytest.mark.parametrize("app", ["jupyterlab", "notebook"])
def test_a_folded_box_opens_and_folds_in_jupyterlab_and_notebook_7(browser, tmp_path_factory, app):
    import os

    from test_browser import open_page, run_all, start_lab

    pytest.importorskip(app)
    server = start_lab(tmp_path_factory, app=app)
    url = next(server)
    where = "lab/tree" if app == "jupyterlab" else "notebooks"
    try:
        base, query = url.split(f"/{where}/")
        token = query.split("token=")[1]
        cells = [NOTEBOOK_SOURCE.format(tests=os.path.dirname(os.path.abspath(__file__))), "%lens_graph loss"]
        notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                               "source": source} for source in cells],
                    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                    "nbformat": 4, "nbformat_minor": 5}
        request = urllib.request.Request(f"{base}/api/contents/expand.ipynb?token={token}", method="PUT",
                                         data=json.dumps({"type": "notebook", "content": notebook}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).read()
        page, _ = open_page(browser, f"{base}/{where}/expand.ipynb?token={token}", None, width=1400, height=1000)
        run_all(page)
        stepper = page.locator(".jp-OutputArea .al-stepper")
        stepper.wait_for(timeout=60_000)
        page.wait_for_selector(".jp-OutputArea .al-stepper[data-fold-state='0']")
        model, loss = transformer_loss()
        graph = al.graph(loss, names={"model": model, "loss": loss})  # as the notebook names them
        check_open_and_fold(stepper, graph, lambda target: target.click(), page.keyboard.press)
        # Enter opened the box and did not put the notebook's cell into edit mode
        assert page.locator(".jp-Notebook.jp-mod-editMode").count() == 0
        page.close()
    finally:
        server.close()


@browser_only
def test_a_module_group_opens_and_closes_from_the_keyboard_in_a_lens_page(browser, tmp_path):
    """lens.to_html of a pass recorded with module groups (past 60 boxes they start closed): a closed group is a
    focusable button; Enter opens it (its boxes drawn), Space closes it; the step highlights still find their
    nodes after it."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(20) for m in (torch.nn.Linear(4, 4), torch.nn.Tanh())])
    with al.Lens(modules=True) as lens:
        model(torch.randn(2, 4)).sum().backward()
    path = tmp_path / "trace.html"
    lens.to_html(str(path))
    from test_browser import open_page

    page, errors = open_page(browser, path)
    stepper = page.locator(".al-stepper")
    closed = stepper.get_attribute("data-collapsed").split()
    groups = {g.id: g for g in lens.passes[0].groups}
    shut = next(i for i in closed if groups[i].path == "model.10")
    cluster = page.locator(f".al-canvas #{shut}")
    assert cluster.get_attribute("role") == "button" and cluster.get_attribute("aria-expanded") == "false"
    assert cluster.get_attribute("aria-label").startswith("model.10 · Linear")
    inside = groups[shut].nodes[0]
    assert not page.locator(f".al-canvas #{inside}").is_visible()
    cluster.focus()
    page.keyboard.press("Enter")
    assert shut not in stepper.get_attribute("data-collapsed").split()
    assert cluster.get_attribute("aria-expanded") == "true"
    assert page.locator(f".al-canvas #{inside}").is_visible()
    assert stepper.get_attribute("data-step") == "0"  # Enter opened the group and did not step
    page.keyboard.press(" ")
    assert shut in stepper.get_attribute("data-collapsed").split()
    # stepping on: each step's node is in the drawing and shown (its group opened around it)
    seen = []
    for _ in range(5):
        page.click("button[data-go=next]")
        style = page.evaluate("document.querySelector('style.al-frame').textContent")
        current = re.search(r"#(n\d+) > (?:polygon|path|ellipse)[^{]*\{stroke: #2563eb", style)
        assert current, style
        seen.append(current.group(1))
        assert page.locator(f".al-canvas #{current.group(1)}").is_visible()
    assert len(set(seen)) == 5
    assert errors == []
    page.close()
