"""Keyboard and navigation in a real browser: the static page, JupyterLab and Notebook 7 (Chromium + Playwright).

Uses the servers and helpers of test_browser.py; skipped where it is (no chromium, no playwright)."""

from __future__ import annotations

import os

import pytest

from test_browser import (ARTIFACTS, browser, lab, notebook7, open_live_notebook, open_page, open_static_page,  # noqa: F401
                          shot, playwright)

pytestmark = [pytest.mark.browser]


def step_of(page, where=".al-stepper"):
    return int(page.locator(where).first.get_attribute("data-step"))


def press_and_read(page, stepper_selector, keys):
    seen = []
    for key in keys:
        page.keyboard.press(key)
        seen.append(step_of(page, stepper_selector))
    return seen


def test_keys_step_in_the_static_page(browser, tmp_path):
    view, page, errors = open_static_page(browser, tmp_path)
    page.click("button[data-go=next]")
    assert step_of(page) == 1
    assert press_and_read(page, ".al-stepper", ["ArrowRight", "j", "ArrowLeft", "k", "End", "Home"]) == \
        [2, 3, 2, 1, len(view.steps) - 1, 0]
    labels = page.evaluate("Array.from(document.querySelectorAll('.al-controls button, .al-controls select, "
                           ".al-controls input')).map(b => b.getAttribute('aria-label') || (b.labels && b.labels[0] "
                           "&& b.labels[0].textContent) || '')")
    assert labels and all(label.strip() for label in labels), labels
    assert errors == []
    page.close()


def test_keys_step_in_notebook_7(browser, notebook7):
    page, next_button = open_live_notebook(browser, notebook7)
    next_button.click()
    where = ".jp-OutputArea .al-stepper"
    assert step_of(page, where) == 1
    cells_before = page.evaluate("document.querySelector('.jp-Notebook .jp-Cell.jp-mod-active') ? "
                                 "Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).indexOf("
                                 "document.querySelector('.jp-Notebook .jp-Cell.jp-mod-active')) : -1")
    assert press_and_read(page, where, ["ArrowRight", "ArrowRight", "ArrowLeft", "j", "k"]) == [2, 3, 2, 3, 2]
    cells_after = page.evaluate("Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).indexOf("
                                "document.querySelector('.jp-Notebook .jp-Cell.jp-mod-active'))")
    assert cells_after == cells_before  # j and k stepped the stepper, not Jupyter's cell selection
    shot(page, "notebook7-keys.png")
    page.close()


def test_keys_step_in_jupyterlab(browser, lab):
    page, next_button = open_live_notebook(browser, lab)
    next_button.click()
    where = ".jp-OutputArea .al-stepper"
    assert press_and_read(page, where, ["ArrowRight", "j", "k", "ArrowLeft"]) == [2, 3, 2, 1]
    page.close()


def mlp_page(browser, tmp_path, layers=50, modules=False, name="mlp.html", color_scheme="light"):
    """A pass through layers x (Linear + Tanh) as a static page: (lens, page, errors)."""
    import torch

    import autograd_lens as al

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(8, 8), torch.nn.Tanh())])
    x = torch.randn(4, 8)
    with al.Lens(names={"model": model, "x": x}, modules=modules, max_nodes=2000) as lens:
        loss = model(x).sum()
        loss.backward()
    path = tmp_path / name
    lens.to_html(str(path))
    page, errors = open_page(browser, path, color_scheme=color_scheme)
    return lens, page, errors


def test_search_select_upstream_downstream_and_root_in_the_static_page(browser, tmp_path):
    lens, page, errors = mlp_page(browser, tmp_path)
    graph = lens.passes[0].graph
    root = next(node.id for node in graph.nodes if node.kind == "output")
    in_view = """id => { const box = document.querySelector('.al-canvas #' + id).getBoundingClientRect();
        const port = document.querySelector('.al-viewport').getBoundingClientRect();
        return box.left >= port.left && box.right <= port.right && box.top >= port.top && box.bottom <= port.bottom; }"""
    assert page.evaluate(in_view, root)  # the root (the loss) is in view from the start
    # search by a module path: the parameter's box is found, selected and brought into view
    page.fill("input.al-search", "model.60.weight")
    assert page.get_attribute(".al-stepper", "data-found") == "1"
    page.press("input.al-search", "Enter")
    target = next(node for node in graph.nodes if node.label == "model.60.weight")
    assert page.get_attribute(".al-stepper", "data-selected") == target.id
    assert page.evaluate(in_view, target.id)
    # upstream and downstream, counted in Python along the same arrows
    def reach(start, forward):
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for edge in (graph.edges_from(node) if forward else graph.edges_into(node)):
                other = edge.dst if forward else edge.src
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen
    assert int(page.get_attribute(".al-stepper", "data-downstream")) == len(reach(target.id, True)) > 10
    assert int(page.get_attribute(".al-stepper", "data-upstream")) == len(reach(target.id, False)) == 0
    opacity = "id => getComputedStyle(document.querySelector('.al-canvas #' + id)).opacity"
    unrelated = next(n.id for n in graph.nodes if n.id not in reach(target.id, True) and n.id != target.id)
    assert page.evaluate(opacity, root) == "1" and page.evaluate(opacity, unrelated) == "0.2"
    # by op name: every box showing it
    page.fill("input.al-search", "TanhBackward0")
    assert page.get_attribute(".al-stepper", "data-found") == str(sum(n.op == "TanhBackward0" for n in graph.nodes))
    page.press("input.al-search", "Escape")
    assert page.get_attribute(".al-stepper", "data-selected") == ""
    # the root button brings the root back
    page.click("button[data-go=fit]")
    page.click("button[data-go=zoom-in]")
    for _ in range(6):
        page.click("button[data-go=zoom-in]")
    page.click("button[data-go=root]")
    assert page.evaluate(in_view, root)
    # a click on a box selects it
    page.click("button[data-go=fit]")
    page.locator(f".al-canvas #{root} > polygon").click(force=True)
    assert page.get_attribute(".al-stepper", "data-selected") == root
    assert int(page.get_attribute(".al-stepper", "data-upstream")) == len(reach(root, False))
    assert errors == []
    page.close()


MEASURE_LABELS = """() => {
    // every text drawn (visible), as a box on screen; a node's texts must sit inside its shape
    const visible = t => { const s = getComputedStyle(t); return s.display !== 'none' && s.visibility === 'visible'
                                                                   && t.getClientRects().length && t.textContent.trim(); };
    const texts = Array.from(document.querySelectorAll('.al-canvas svg text')).filter(visible);
    const boxes = texts.map(t => { const r = t.getBoundingClientRect();
        return {l: r.left, r: r.right, t: r.top, b: r.bottom, text: t.textContent,
                owner: (t.closest('g.node, g.edge, g.cluster') || {}).id || ''}; });
    const overlaps = [];
    const sorted = boxes.slice().sort((a, b) => a.l - b.l);
    for (let i = 0; i < sorted.length; i++) {
        for (let j = i + 1; j < sorted.length && sorted[j].l < sorted[i].r - 0.5; j++) {
            const a = sorted[i], b = sorted[j];
            if (Math.min(a.b, b.b) - Math.max(a.t, b.t) > 0.5 && Math.min(a.r, b.r) - Math.max(a.l, b.l) > 0.5) {
                overlaps.push([a.owner + ':' + a.text, b.owner + ':' + b.text]);
            }
        }
    }
    const cut = [];
    texts.forEach((t, i) => {
        const node = t.closest('g.node');
        if (!node) { return; }
        const shape = node.querySelector('polygon, path, ellipse');
        const s = shape.getBoundingClientRect(), b = boxes[i];
        if (b.l < s.left - 1 || b.r > s.right + 1 || b.t < s.top - 1 || b.b > s.bottom + 1) {
            cut.push(node.id + ':' + b.text);
        }
    });
    return {count: texts.length, overlaps: overlaps.slice(0, 10), overlapCount: overlaps.length, cut: cut.slice(0, 10),
            cutCount: cut.length};
}"""


@pytest.mark.parametrize("layers", [50, 200])  # 252 and 1,002 boxes
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_no_label_overlaps_another_and_no_number_is_cut(browser, tmp_path, layers, theme):
    lens, page, errors = mlp_page(browser, tmp_path, layers=layers, color_scheme=theme)
    assert len(lens.passes[0].graph.nodes) in (252, 1002)
    page.click("button[data-go=last]")  # every arrow shows the gradient it carried
    page.evaluate("document.querySelector('.al-stepper').classList.remove('al-overview')")  # texts at any zoom
    for _ in range(3):
        page.click("button[data-go=zoom-in]")
    result = page.evaluate(MEASURE_LABELS)
    assert result["count"] > 2 * len(lens.passes[0].graph.nodes)
    assert result["overlapCount"] == 0, result
    assert result["cutCount"] == 0, result
    assert errors == []
    page.close()


PICTURES = os.path.join(os.path.dirname(ARTIFACTS), "docs", "pictures")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_folded_transformer_is_readable_and_pictured(browser, theme):
    """The 12-layer transformer of test_fold as graph() shows it: one box for the layers, every label inside its
    box and none over another; the screenshot goes to artifacts/, to docs/pictures/ with AL_UPDATE_PICTURES=1 (light
    and dark page)."""
    from test_fold import transformer_loss

    import autograd_lens as al

    model, loss = transformer_loss()
    svg = al.graph(loss, names={"model": model}).render().decode("utf-8")
    background = "#ffffff" if theme == "light" else "#111111"
    page = browser.new_page(viewport={"width": 1400, "height": 500}, color_scheme=theme)
    page.set_content(f"<body style='margin:0;background:{background}'><div class='al-canvas' "
                     f"style='display:inline-block;padding:12px'>{svg}</div></body>")
    texts = page.evaluate("Array.from(document.querySelectorAll('svg g.node text')).map(t => t.textContent)")
    assert "layers.0-11 (x12)" in texts and "Block · 442 backward functions in all" in texts
    result = page.evaluate(MEASURE_LABELS)
    assert result["count"] > 20 and result["overlapCount"] == 0 and result["cutCount"] == 0, result
    where = PICTURES if os.environ.get("AL_UPDATE_PICTURES") == "1" else ARTIFACTS  # docs/ only when asked
    os.makedirs(where, exist_ok=True)
    page.locator(".al-canvas").screenshot(path=os.path.join(where, f"folded-transformer-{theme}.png"))
    page.close()


def test_a_large_graph_from_graph_navigates_and_reads_without_scripts(browser, tmp_path):
    """graph() of the 12-layer transformer shows as HTML running the stepper's module: find the folded layers,
    select them (upstream: the embedding and its inputs; downstream: up to the root), no step controls.  With
    scripts off: the folded drawing as a picture and the boxes as a table."""
    from test_fold import transformer_loss

    import autograd_lens as al
    from autograd_lens.views.fold import plan

    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    bundle = graph._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"} and bundle == graph._repr_mimebundle_()  # deterministic
    path = tmp_path / "graph.html"
    path.write_text(f"<!DOCTYPE html><html><body>{bundle['text/html']}</body></html>", encoding="utf-8")
    page, errors = open_page(browser, path, ".al-stepper")
    assert not page.is_visible("button[data-go=next]") and page.is_visible("button[data-go=fit]")
    drawn = plan(graph).graph
    page.fill("input.al-search", "layers.0-11")
    assert page.get_attribute(".al-stepper", "data-found") == "1"
    page.press("input.al-search", "Enter")
    assert page.get_attribute(".al-stepper", "data-selected") == "f1"
    assert 'expand="layers.0"' in page.inner_text(".al-cardbox") and "--expand layers.0" in page.inner_text(".al-cardbox")
    upstream = {e.src for e in drawn.edges_into("f1")}
    todo = list(upstream)
    while todo:
        for edge in drawn.edges_into(todo.pop()):
            if edge.src not in upstream:
                upstream.add(edge.src)
                todo.append(edge.src)
    assert int(page.get_attribute(".al-stepper", "data-upstream")) == len(upstream) >= 3
    assert errors == []
    page.close()
    quiet, _ = open_page(browser, path, "img.al-picture", scripts=False)
    assert quiet.evaluate("document.querySelector('img.al-picture').naturalWidth") > 300
    quiet.click("summary")
    assert "layers.0-11 (x12)" in quiet.inner_text("table.autograd-lens-table")
    quiet.context.close()


SCRIPT = """import torch

x = torch.tensor(2.0, requires_grad=True)
y = x ** 2
y.register_hook(lambda g: g * 0.5)
(y * 3 + y * 2).backward()
"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_static_page_follows_the_system_colour_scheme(browser, tmp_path, scheme):
    """``python -m autograd_lens script.py -o trace.html`` in a browser set to light or dark: the page, its controls,
    cards and table take that scheme with readable text (contrast 4.5 or more); the drawing keeps its white panel,
    which fills its frame."""
    from test_browser import contrast, panel_fills_frame

    from autograd_lens.__main__ import main

    (tmp_path / "script.py").write_text(SCRIPT)
    assert main([str(tmp_path / "script.py"), "-o", str(tmp_path / "trace.html")]) == 0
    page, errors = open_page(browser, tmp_path / "trace.html", color_scheme=scheme)
    for _ in range(7):  # to the hook's card (it has the note and the table of changes)
        page.click("button[data-go=next]")
        if "hook <lambda> on y" in page.inner_text(".al-cardbox"):
            break
    assert "hook <lambda> on y" in page.inner_text(".al-cardbox")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == ("rgb(255, 255, 255)" if scheme == "light" else "rgb(17, 17, 17)")
    card = page.evaluate("getComputedStyle(document.querySelector('.al-card')).backgroundColor")
    assert (card == "rgb(249, 250, 251)") == (scheme == "light")  # the card turns dark with the page
    for selector in (".al-card", ".al-title", ".al-step", ".al-controls button", ".al-pos", "input.al-search",
                     "table.al-grads td", ".al-changed"):
        assert contrast(page, selector) >= 4.5, (scheme, selector)
    page.click("button[data-go=last]")
    assert contrast(page, "table.al-grads tr.al-differs td") >= 4.5
    viewport = page.locator(".al-viewport")
    for _ in range(3):
        page.click("button[data-go=zoom-out]")
    # zoomed out below 10 px text: an overview, no text drawn (a leaf's .grad text included)
    assert "al-overview" in page.get_attribute(".al-stepper", "class")
    assert page.evaluate("Array.from(document.querySelectorAll('.al-canvas text')).filter(t => "
                         "getComputedStyle(t).display !== 'none' && getComputedStyle(t).visibility === 'visible')"
                         ".map(t => t.textContent)") == []
    assert page.locator(".al-canvas svg").bounding_box()["width"] < viewport.bounding_box()["width"] - 40
    assert min(panel_fills_frame(viewport)) >= 240
    shot(page, f"static-page-{scheme}.png")
    assert errors == []
    page.close()


SMALLEST_TEXT = """([svg, width]) => {
    // the drawing at `width` CSS px (as the picture shows it): the smallest drawn text's font size on screen, in px
    document.body.innerHTML = svg;
    const drawing = document.querySelector('svg');
    drawing.style.width = width + 'px';
    drawing.style.height = 'auto';
    const sizes = Array.from(drawing.querySelectorAll('text')).filter(t => t.textContent.trim())
        .map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
    return [Math.min(...sizes), sizes.length];
}"""


@pytest.mark.parametrize("layers", [5, 10])  # 27 boxes drawn 9,000 px wide; 52 boxes drawn 1,400 px wide
def test_with_scripts_off_a_medium_pass_is_a_readable_picture_not_a_shrunken_one(browser, tmp_path, layers):
    """A notebook holding a %%lens output of a medium pass (its drawing stored as a picture), exported by nbconvert
    and opened with JavaScript off: the picture is shown at a size where its smallest text is 10 px or more (it
    scrolls in its box), and the last card and the table are there."""
    import json
    import subprocess
    import sys
    import urllib.parse

    from test_browser import medium_notebook

    notebook = medium_notebook(layers)
    assert '<img class="al-picture"' in notebook["cells"][0]["outputs"][0]["data"]["text/html"]  # stored as a picture
    (tmp_path / "medium.ipynb").write_text(json.dumps(notebook))
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(tmp_path / "medium.ipynb")],
                   check=True, capture_output=True, timeout=300)
    page, _ = open_page(browser, tmp_path / "medium.html", "img.al-picture", width=1100, scripts=False)
    picture = page.locator("img.al-picture")
    shown = picture.bounding_box()
    assert picture.evaluate("img => img.naturalWidth") > 300
    assert shown["width"] > 0 and shown["height"] > 0
    svg = urllib.parse.unquote(picture.get_attribute("src").partition(",")[2])
    assert "model.0.weight.grad written" in page.inner_text(".al-cardbox")  # the last step's card
    assert "model.0.weight" in page.inner_text(".al-tablebox")
    page.context.close()
    measure, _ = open_page(browser, "about:blank", None)
    smallest, count = measure.evaluate(SMALLEST_TEXT, [svg, shown["width"]])
    assert count > 2 * 5 * layers and smallest >= 9.9, (smallest, shown)
    measure.close()
