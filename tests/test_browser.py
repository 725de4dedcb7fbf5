"""Real-browser tests: the static stepper page in Chromium, and the live stepper in JupyterLab.

Skipped when Debian's ``chromium`` or the ``playwright`` package is missing.  Screenshots go to
``artifacts/`` (kept by CI as evidence of what a student sees).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

import autograd_lens as al
from autograd_lens.views.passview import PassView, frame_css
from autograd_lens.views.steps import frame

CHROMIUM = shutil.which("chromium")
playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed"),
]
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "artifacts")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]

CELL = """x = torch.tensor(2.0, requires_grad=True)
y = x ** 2
y.register_hook(lambda g: g * 0.5)
z = y * 3
w = y * 2
out = z + w
out.backward()"""


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield chromium
        chromium.close()


def shot(page, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, name), full_page=True)


def two_branch_lens():
    with al.Lens() as lens:
        exec(CELL, {"torch": torch})
    return lens


def current_node(style_text):
    match = re.search(r"#(n\d+) > polygon[^{]*\{stroke: #2563eb", style_text)
    return match.group(1) if match else None


def open_page(browser, where, ready=".al-stepper[data-step='0']", width=1300, height=900, color_scheme=None,
              offline=False, init_script=None, scripts=True):
    """A new page at ``where`` (a file's path or a URL) once ``ready`` (a selector; None: do not wait) is there:
    (page, the list its uncaught errors are added to).  ``offline``: only file: URLs load; ``scripts=False``: in a
    context of its own with JavaScript off (close it with ``page.context.close()``)."""
    options = {"viewport": {"width": width, "height": height}}
    if color_scheme:
        options["color_scheme"] = color_scheme
    page = browser.new_page(**options) if scripts else browser.new_context(java_script_enabled=False, **options).new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if offline:
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    if init_script:
        page.add_init_script(init_script)
    page.goto(where.as_uri() if hasattr(where, "as_uri") else str(where))
    if ready:
        page.wait_for_selector(ready)
    return page, errors


def open_static_page(browser, tmp_path, predict=False):
    """The two-branch example as a standalone page, opened at its first step: (view, page, page errors)."""
    lens = two_branch_lens()
    path = tmp_path / "trace.html"
    lens.to_html(str(path), predict=predict)
    page, errors = open_page(browser, path)
    return PassView(lens.passes[0]), page, errors


def test_static_page_steps_with_no_kernel(browser, tmp_path):
    view, page, errors = open_static_page(browser, tmp_path)
    assert page.inner_text(".al-pos") == "step 0 of 6"
    # the script and Python agree on what every step shows
    scope = "#" + page.get_attribute(".al-stepper", "id")
    for k in range(len(view.steps)):
        assert page.evaluate(f"document.querySelector('.al-stepper').alFrameCss(0, {k})") == frame_css(
            scope, frame(view.steps, k)
        )
    seen = []
    for _ in range(4):
        page.click("button[data-go=next]")
        seen.append(current_node(page.evaluate("document.querySelector('style.al-frame').textContent")))
    assert len(set(seen)) == 4  # a different node highlighted at every step
    card = page.inner_text(".al-cardbox")
    assert "hook <lambda> on y" in card and "received 5.0 → returned 2.5" in card
    shot(page, "static-step-4.png")
    page.click("button[data-go=last]")
    card = page.inner_text(".al-cardbox")
    assert "x.grad written: 10.0" in card and "Without the hooks it would be 20.0." in card
    shown = page.evaluate(
        "['.al-after', '.al-before'].map(c => getComputedStyle(document.querySelector("
        "'#' + document.querySelector('.al-stepper').id + ' ' + c)).display)"
    )
    assert shown[0] != "none" and shown[1] == "none"  # x shows its new .grad, not the old one
    shot(page, "static-last.png")
    assert errors == []
    page.close()


def test_a_large_pass_is_stored_compressed_and_still_steps_offline(browser, tmp_path):
    """A 252-node pass: its drawing and steps are stored compressed (no inline picture); the page's script
    unpacks them, the current node is followed and drawn at 10 px or more, hooks' colours survive slimming."""
    from autograd_lens.views.static_html import stepper_fragment
    from autograd_lens.views.passview import views_for

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(50) for m in (torch.nn.Linear(8, 8), torch.nn.Tanh())])
    x = torch.randn(4, 8)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    views = views_for(lens.passes)
    fragment = stepper_fragment(views)
    assert "al-nopicture" in fragment and "<img class" not in fragment and 'data-encoding="deflate-raw-base64"' in fragment
    path = tmp_path / "large.html"
    path.write_text(f"<!DOCTYPE html><html><body>{fragment}</body></html>", encoding="utf-8")
    page, errors = open_page(browser, path, offline=True)
    assert page.locator(".al-canvas svg g.node").count() == len(lens.passes[0].graph.nodes)
    for k in range(1, 6):
        page.click("button[data-go=next]")
        assert page.get_attribute(".al-stepper", "data-step") == str(k)
        where = current_in_view(page, ".al-stepper")
        assert where["inside"] and where["textPx"] >= 10, where
    assert current_node(page.evaluate("document.querySelector('style.al-frame').textContent")) == views[0].steps[5].node
    shot(page, "static-large-step-5.png")
    assert errors == []
    page.close()
    # a browser that cannot decompress keeps the no-script view, without an error
    old, errors = open_page(browser, path, ".al-nopicture", init_script="delete window.DecompressionStream")
    assert old.locator(".al-stepper").count() == 0 and errors == []
    old.close()


def expected_collapsed(backward_pass, step_index):
    """The groups the stepper shows collapsed at a step, by the rule it promises (auto mode, past 60 boxes): a
    group stays open when it holds the current node or has an arrow to or from it, when one of the step's
    arrows touches it, or when it holds most of the drawing; a closed group inside a closed one is not listed."""
    from autograd_lens.views.passview import group_data

    data = group_data(backward_pass)
    step = PassView(backward_pass).steps[step_index]
    edges = {e for e, _ in step.edges}
    shut = []
    for group in data["list"]:
        near = set(group["edges"]) | set(group["border"])
        open_ = (step.node is not None and (step.node in group["nodes"] or step.node in group["beside"])) \
            or 2 * len(group["nodes"]) > data["total"] or bool(edges & near)
        shut.append(not open_)
    hidden = []
    for index, group in enumerate(data["list"]):
        parent = group["parent"]
        hidden.append(hidden[parent] or shut[parent] if parent is not None else False)
    return [g["id"] for i, g in enumerate(data["list"]) if shut[i] and not hidden[i]]


def test_module_groups_collapse_around_the_current_step(browser, tmp_path):
    """50 × (Linear + Tanh) recorded with modules=True: past 60 boxes the module calls start collapsed, except
    the one holding the current node (and the model, which holds most of the drawing); a click on a group opens
    it; the select opens or closes all of them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(50) for m in (torch.nn.Linear(8, 8), torch.nn.Tanh())])
    x = torch.randn(4, 8)
    with al.Lens(names={"model": model, "x": x}, modules=True) as lens:
        model(x).sum().backward()
    backward_pass = lens.passes[0]
    groups = {g.id: g for g in backward_pass.groups}
    assert len(groups) == 101, backward_pass.groups_note
    path = tmp_path / "groups.html"
    lens.to_html(str(path))
    page, errors = open_page(browser, path)
    collapsed = lambda: page.get_attribute(".al-stepper", "data-collapsed").split()  # noqa: E731
    shown = lambda node: page.evaluate(f"getComputedStyle(document.querySelector('.al-canvas #{node}')).display")  # noqa: E731
    assert collapsed() == [f"m{i}" for i in range(2, 102)]  # before the first step: every layer closed
    steps = PassView(backward_pass).steps
    for k in range(1, 8):
        page.click("button[data-go=next]")
        assert collapsed() == expected_collapsed(backward_pass, k), k
        group = backward_pass.group_of(steps[k].node)  # None for `sum` and the parameters, made outside
        assert group is None or group.id not in collapsed()
        assert shown(steps[k].node) != "none"
        where = current_in_view(page, ".al-stepper")
        assert where["inside"] and where["textPx"] >= 10, where
        assert 94 <= len(collapsed()) <= 100  # the drawing stays mostly folded
        # every folded group's name on screen is drawn at 10 px or more (smaller ones are hidden)
        heights = page.evaluate("""Array.from(document.querySelectorAll('.al-canvas text.al-group-name'))
            .filter(t => t.getClientRects().length).map(t => t.getBoundingClientRect().height)""")
        assert heights and min(heights) >= 10, heights
    # a closed layer hides its boxes and arrows, and shows its name instead
    closed = groups["m2"]
    assert "m2" in collapsed() and all(shown(n) == "none" for n in closed.nodes)
    assert page.evaluate("getComputedStyle(document.querySelector('.al-canvas #m2 .al-group-name')).display") != "none"
    shot(page, "static-groups-step-7.png")
    # a click on it opens it (and keeps it open while stepping)
    page.click("button[data-go=fit]")
    page.locator(".al-canvas #m2 > path").click(force=True)  # its folded block
    assert "m2" not in collapsed() and all(shown(n) != "none" for n in closed.nodes)
    page.click("button[data-go=next]")
    assert "m2" not in collapsed()
    page.select_option("select.al-groups", "open")
    assert collapsed() == []
    page.select_option("select.al-groups", "closed")
    assert collapsed() == ["m1"]
    page.select_option("select.al-groups", "auto")
    assert collapsed() == expected_collapsed(backward_pass, 8)
    shot(page, "static-groups-auto.png")
    assert errors == []
    page.close()


def test_slimmed_drawing_has_every_shape_where_graphviz_drew_it(browser):
    """The stored SVG (rounded boxes as short paths, tenths of a point, colours in a sheet, polygons not
    closed twice) against Graphviz's own: every node and edge has the same box on screen, and the same
    stroke and fill colours (a hooked node keeps its hook colour)."""
    from autograd_lens.views.render import render_svg

    x = torch.tensor([1.0, -2.0], requires_grad=True)
    w = torch.nn.Parameter(torch.tensor([[0.5, 1.5], [2.0, -1.0]]))
    names = {"x": x, "w": w}
    with al.Lens(names=names) as lens:
        h = names["h"] = torch.tanh(w @ x)
        h.register_hook(lambda g: g * 2)
        (h * 3 + h.exp()).sum().backward()
    view = PassView(lens.passes[0])
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.set_content(f"<div id=raw>{render_svg(view.dot)}</div><div id=slim>{view.svg}</div>")
    measure = """where => Array.from(document.querySelectorAll(where + ' g.node, ' + where + ' g.edge')).map(g => {
        const box = g.getBBox();
        const shape = g.querySelector('path, polygon, ellipse');
        const style = getComputedStyle(shape);
        return [g.id || g.querySelector('title').textContent, [box.x, box.y, box.width, box.height].map(v => Math.round(v)),
                style.stroke, style.fill];
    })"""
    raw, slim = page.evaluate(measure, "#raw"), page.evaluate(measure, "#slim")
    assert len(raw) == len(slim) > 10
    for before, after in zip(raw, slim):
        assert after[1:] == before[1:] or all(abs(a - b) <= 1 for a, b in zip(after[1], before[1])) \
            and after[2:] == before[2:], (before, after)
    from autograd_lens.views.dot import HOOK_COLOR

    hooked = [node.id for node in lens.passes[0].graph.nodes if node.hooks]
    red, green, blue = (int(HOOK_COLOR[i:i + 2], 16) for i in (1, 3, 5))
    assert hooked and all(dict((e[0], e[2]) for e in slim)[n] == f"rgb({red}, {green}, {blue})" for n in hooked)
    page.close()


def test_static_page_predict_mode_asks_checks_and_then_reveals(browser, tmp_path):
    view, page, errors = open_static_page(browser, tmp_path, predict=True)
    assert not page.is_visible(".al-tablebox")  # hidden until the last step: it holds the answers
    page.click("button[data-go=next]")
    card = page.inner_text(".al-cardbox")
    assert "predict" in card and "What does z receive?" in card
    style = page.evaluate("document.querySelector('style.al-frame').textContent")
    assert current_node(style) == view.steps[1].node and "visibility: visible" not in style  # no arrow label yet
    page.fill("input.al-answer", "2")
    page.press("input.al-answer", "Enter")
    card = page.inner_text(".al-cardbox")  # a wrong answer: try again, autograd's value not given away yet
    assert card.startswith("Not quite (try 1). Try again") and "computed 1" not in card and "What does z receive?" in card
    assert "visibility: visible" not in page.evaluate("document.querySelector('style.al-frame').textContent")
    assert page.input_value("input.al-answer") == "2"
    page.fill("input.al-answer", "1")
    page.press("input.al-answer", "Enter")
    card = page.inner_text(".al-cardbox")
    assert card.startswith("Right: autograd computed 1.0. (try 2)") and "Chain rule: out = z + w." in card
    assert "visibility: visible" in page.evaluate("document.querySelector('style.al-frame').textContent")
    page.click("button[data-go=next]")  # the next question: y's share from one of the products
    question = view.steps[2].question
    page.fill("input.al-answer", question.answer_text)
    page.click("button[data-go=check]")
    assert page.inner_text(".al-feedback") == f"Right: autograd computed {question.answer_text}."
    page.click("button[data-go=prev]")  # an answered step stays answered
    assert page.inner_text(".al-feedback").startswith("Right: autograd computed 1.0. (try 2)")
    shot(page, "static-predict.png")
    page.click("button[data-go=last]")
    assert not page.is_visible(".al-tablebox")  # the last step's own question is still open
    page.click("button[data-go=reveal]")
    assert page.is_visible(".al-tablebox")
    # the slider steps once per key press
    page.click("button[data-go=first]")
    page.focus("input.al-slider")
    before = int(page.get_attribute(".al-stepper", "data-step"))
    page.keyboard.press("ArrowRight")
    assert int(page.get_attribute(".al-stepper", "data-step")) == before + 1
    assert errors == []
    page.close()


def test_static_page_without_javascript_shows_the_finished_pass(browser, tmp_path):
    path = tmp_path / "trace.html"
    two_branch_lens().to_html(str(path))
    page, _ = open_page(browser, path, ".al-cardbox", scripts=False)
    assert "x.grad written: 10" in page.inner_text(".al-cardbox")
    page.context.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from start_lab(tmp_path_factory)


@pytest.fixture(scope="module")
def dark_lab(tmp_path_factory):
    yield from start_lab(tmp_path_factory, theme="JupyterLab Dark")


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    pytest.importorskip("notebook")
    yield from start_lab(tmp_path_factory, app="notebook")


def stop_server(server):
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


def wait_until_serving(url, what):
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{what} did not start")


def medium_lens(layers=5):
    """layers x (Linear + Tanh): 5 give 27 boxes drawn 9,000 px wide, stored as a picture (a medium pass)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(8, 8), torch.nn.Tanh())])
    with al.Lens(names={"model": model}) as lens:
        model(torch.randn(4, 8)).sum().backward()
    return lens


def medium_notebook(layers=5):
    """A notebook whose one cell holds the %%lens output of ``medium_lens(layers)``, as a kernel stored it."""
    from autograd_lens.views.trace_display import lens_bundle

    output = {"output_type": "display_data", "metadata": {}, "data": lens_bundle(medium_lens(layers))}
    return {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "%%lens\n...",
                       "outputs": [output]}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def start_lab(tmp_path_factory, theme=None, app="jupyterlab"):
    pytest.importorskip("jupyterlab")
    root = tmp_path_factory.mktemp("lab")
    # a course notebook as committed: never opened here, so JupyterLab does not trust it
    shutil.copy(os.path.join(os.path.dirname(ARTIFACTS), "notebooks", "02_tensor_hooks.ipynb"), root / "course.ipynb")
    notebook = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": "%load_ext autograd_lens\nimport torch"},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "%%lens\n" + CELL},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (root / "stepper.ipynb").write_text(json.dumps(notebook))
    notebook["cells"][1]["source"] = "%%lens --predict\n" + CELL
    (root / "predict.ipynb").write_text(json.dumps(notebook))
    notebook["cells"][1]["source"] = ("%%lens --modules\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(*[m for _ in "
                                      "range(20) for m in (torch.nn.Linear(4, 4), torch.nn.Tanh())])\n"
                                      "model(torch.randn(2, 4)).sum().backward()")
    (root / "modules.ipynb").write_text(json.dumps(notebook))
    # the widget: Python reads the student's step and sets it (the last cell is run again by the test)
    notebook["cells"][1]["source"] = "%%lens --no-show\n" + CELL
    notebook["cells"] += [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "stepper = _lens.stepper()\nstepper"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "print('python sees step', stepper.step)\nstepper.step = 4"},
    ]
    (root / "widget.ipynb").write_text(json.dumps(notebook))
    # a medium pass's output stored in a notebook never opened here (untrusted: scripts off, HTML sanitised)
    (root / "medium.ipynb").write_text(json.dumps(medium_notebook()))
    settings = tmp_path_factory.mktemp("settings")
    if theme:
        themes = settings / "us" / "@jupyterlab" / "apputils-extension"
        themes.mkdir(parents=True)
        (themes / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))
    config = settings / "cfg"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    port, token = free_port(), "autograd-lens-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(settings / "rt"),
               JUPYTER_DATA_DIR=str(settings / "data"))
    # a student's notebook, run and saved in an earlier session: trusted (signed), its kernel long gone
    # (its own content: a signature is a hash of the content, and course.ipynb must stay untrusted)
    saved = json.loads((root / "course.ipynb").read_text())
    saved["metadata"]["saved_by_a_student"] = True
    (root / "saved.ipynb").write_text(json.dumps(saved))
    subprocess.run([sys.executable, "-m", "jupyter", "trust", str(root / "saved.ipynb")], env=env, check=True,
                   capture_output=True)
    lab_options = [
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.workspaces_dir={settings / 'ws'}", f"--LabApp.user_settings_dir={settings / 'us'}",
    ] if app == "jupyterlab" else []
    server = subprocess.Popen(
        [sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", *lab_options, "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{base}/api/status?token={token}", "JupyterLab")
        page = "lab/tree" if app == "jupyterlab" else "notebooks"
        yield f"{base}/{page}/stepper.ipynb?token={token}"
    finally:
        stop_server(server)


# Dialogs JupyterLab may show on a loaded machine that say nothing of the notebook: dismissed ("Select Kernel": its
# preferred kernel accepted), and the run tried again.  Any other dialog (a kernel that died, an error) fails the test
# with its text.
BENIGN_DIALOGS = ("Server Connection Error", "Select Kernel")


def _dialog_text(page):
    """The text of the dialog JupyterLab shows, else None."""
    dialog = page.locator(".jp-Dialog")
    try:
        return dialog.first.inner_text(timeout=1_000) if dialog.count() and dialog.first.is_visible() else None
    except playwright.Error:  # closed meanwhile
        return None


def run_all(page):
    page.wait_for_selector(".jp-Notebook")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status=idle]", timeout=120_000)
    dismissed = []
    for _ in range(5):
        text = _dialog_text(page)
        if text is not None:
            if not any(benign in text for benign in BENIGN_DIALOGS):
                pytest.fail(f"JupyterLab shows a dialog: {text!r}")
            dismissed.append(text)
            accept = page.locator(".jp-Dialog .jp-mod-accept")
            if "Select Kernel" in text and accept.count():  # the notebook's own kernel (Escape leaves it with none)
                try:
                    accept.first.click(timeout=5_000)
                except playwright.Error:
                    page.keyboard.press("Escape")
            else:
                page.keyboard.press("Escape")
            time.sleep(1)
            continue
        try:
            page.click(".jp-Cell .jp-InputArea-editor >> visible=true", timeout=15_000)
        except playwright.TimeoutError:  # a dialog came up in front of the editor: read above
            continue
        page.click("text=Run")
        item = page.locator("li.lm-Menu-item[data-command='runmenu:run-all']")
        item.wait_for()
        if "lm-mod-disabled" in (item.get_attribute("class") or ""):
            page.keyboard.press("Escape")
            time.sleep(1)
            continue
        item.click()
        try:
            page.wait_for_selector(".jp-InputPrompt:has-text('[2]')", timeout=90_000)
            return
        except playwright.TimeoutError:
            continue
    pytest.fail(f"could not run the notebook in JupyterLab (dialogs dismissed: {dismissed})")


def frame_style(page):
    return page.evaluate(
        "Array.from(document.querySelectorAll('.jp-OutputArea style.al-frame')).map(s => s.textContent).join('\\n')"
    )


def current_in_view(page, where=".jp-OutputArea .al-stepper"):
    """The current node is inside the graph's viewport, and its label is drawn at 10 px or more."""
    return node_in_view(page.locator(where).first)


def node_in_view(stepper):
    """As current_in_view, for a stepper found by a locator (which also reaches into shadow roots)."""
    return stepper.evaluate("""(root) => {
        const style = root.querySelector('style.al-frame').textContent;
        const match = style.match(/#(n\\d+) > polygon[^{]*\\{stroke: #2563eb/);
        if (!match) { return null; }
        const node = root.querySelector('.al-canvas #' + match[1]);
        const box = node.getBoundingClientRect(), port = root.querySelector('.al-viewport').getBoundingClientRect();
        const text = node.querySelector('text');
        const px = text ? text.getBoundingClientRect().height : 0;
        return {inside: box.left >= port.left && box.right <= port.right && box.top >= port.top && box.bottom <= port.bottom,
                textPx: px};
    }""")


def open_live_notebook(browser, url):
    """Open a notebook in JupyterLab or Notebook 7, run all its cells, wait for the stepper: (page, its ">" button)."""
    page, _ = open_page(browser, url, None, width=1400, height=1000)
    run_all(page)
    next_button = page.locator(".jp-OutputArea button[data-go=next]")
    next_button.wait_for(timeout=60_000)
    return page, next_button


def test_live_stepper_in_jupyterlab(browser, lab):
    page, next_button = open_live_notebook(browser, lab)
    card = page.locator(".jp-OutputArea .al-cardbox")
    assert "Before backward()" in card.inner_text()
    # hovering a backward function shows the cell line that made it (the %%lens line is line 1)
    titles = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea .al-canvas g.node > title'))"
                           ".map(t => t.textContent)")
    assert "cell line 7: out = z + w" in titles and "cell line 3: y = x ** 2" in titles, titles
    highlighted = []
    cards = []
    for _ in range(4):
        started = time.perf_counter()
        next_button.click()
        cards.append(card.inner_text())
        highlighted.append(current_node(frame_style(page)))
        assert time.perf_counter() - started < 5
        where = current_in_view(page)
        assert where["inside"] and where["textPx"] >= 10, where
    assert len(set(highlighted)) == 4 and None not in highlighted
    assert "add → out (AddBackward0) runs" in cards[0] and "Made by cell line 7: out = z + w" in cards[0]
    assert "hook <lambda> on y" in cards[3] and "received 5.0 → returned 2.5" in cards[3]
    shot(page, "jupyterlab-step-4.png")
    page.locator(".jp-OutputArea button[data-go=last]").click()
    assert "x.grad written: 10" in card.inner_text()
    assert "Without the hooks it would be 20.0." in card.inner_text()
    # the step trait is synced: the kernel sees where the student is
    page.locator(".jp-OutputArea button[data-go=zoom-in]").click()
    page.locator(".jp-OutputArea button[data-go=fit]").click()
    shot(page, "jupyterlab-last.png")
    page.close()


def test_module_groups_in_jupyterlab(browser, lab):
    """%%lens --modules on 20 × (Linear + Tanh) (102 boxes) in JupyterLab: 41 outlines, the layers collapsed
    except the current one; a click on a collapsed layer's name opens it."""
    page, next_button = open_live_notebook(browser, lab.replace("/lab/tree/stepper.ipynb", "/lab/workspaces/modules/tree/modules.ipynb"))
    stepper = page.locator(".jp-OutputArea .al-stepper")
    assert page.locator(".jp-OutputArea g.cluster").count() == 41
    assert len(stepper.get_attribute("data-collapsed").split()) == 40  # before the first step: every layer
    # the same cell, run here: what the stepper must show at each step
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(20) for m in (torch.nn.Linear(4, 4), torch.nn.Tanh())])
    with al.Lens(names={"model": model}, modules=True) as here:
        model(torch.randn(2, 4)).sum().backward()
    for k in range(1, 7):
        next_button.click()
        where = current_in_view(page)
        assert where["inside"] and where["textPx"] >= 10, where
        assert stepper.get_attribute("data-collapsed").split() == expected_collapsed(here.passes[0], k), k
    assert "m2" in stepper.get_attribute("data-collapsed").split()
    page.locator(".jp-OutputArea button[data-go=fit]").click()
    page.locator(".jp-OutputArea .al-canvas #m2 > path").click(force=True)  # its folded block
    assert "m2" not in stepper.get_attribute("data-collapsed").split()
    shot(page, "jupyterlab-module-groups.png")
    page.close()


def test_course_notebook_steps_in_nbconvert_html(browser, tmp_path):
    """The committed notebook, exported by nbconvert with no kernel and no CDN, still steps."""
    notebook = os.path.join(os.path.dirname(ARTIFACTS), "notebooks", "02_tensor_hooks.ipynb")
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", notebook, "--output-dir", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    page, _ = open_page(browser, tmp_path / "02_tensor_hooks.html", None, offline=True)
    stepper = page.locator(".al-stepper").first
    stepper.locator(".al-pos").wait_for()
    assert stepper.locator(".al-pos").inner_text() == "step 0 of 6"
    for _ in range(4):
        stepper.locator("button[data-go=next]").click()
    assert "received 5.0 → returned 2.5" in stepper.locator(".al-cardbox").inner_text()
    shot(page, "nbconvert-step-4.png")
    page.close()


def test_live_stepper_predict_mode_in_jupyterlab(browser, lab):
    # in its own workspace (JupyterLab restores the last one, with the other notebook in front)
    page, next_button = open_live_notebook(browser, lab.replace("/lab/tree/stepper.ipynb",
                                                                "/lab/workspaces/predict/tree/predict.ipynb"))
    assert not page.locator(".jp-OutputArea .al-tablebox").is_visible()  # it holds the answers
    next_button.click()
    card = page.locator(".jp-OutputArea .al-cardbox")
    assert "What does z receive?" in card.inner_text()
    page.locator(".jp-OutputArea input.al-answer").fill("1")
    page.locator(".jp-OutputArea button[data-go=check]").click()
    assert page.locator(".jp-OutputArea .al-feedback").inner_text() == "Right: autograd computed 1.0."
    assert "Chain rule: out = z + w." in card.inner_text()
    shot(page, "jupyterlab-predict.png")
    page.close()


def contrast(page, selector):
    """WCAG contrast ratio of an element's text colour against its background."""
    return page.evaluate("""selector => {
        const element = document.querySelector(selector);
        const rgb = text => text.match(/[\\d.]+/g).slice(0, 3).map(Number);
        const luminance = ([r, g, b]) => {
            const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
            return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
        };
        let node = element, background = 'rgba(0, 0, 0, 0)';
        while (node && (background === 'rgba(0, 0, 0, 0)' || background === 'transparent')) {
            background = getComputedStyle(node).backgroundColor; node = node.parentElement;
        }
        const a = luminance(rgb(getComputedStyle(element).color)), b = luminance(rgb(background));
        return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    }""", selector)


def panel_fills_frame(viewport):
    """The drawing's panel and its frame (the viewport, a locator) on screen: the viewport's own background is white
    and so are the pixels just inside its four corners, past the drawing; a white drawing smaller than a dark
    viewport (a white box inside a dark frame) fails.  Returns the corners' darkest channel values."""
    import io

    from PIL import Image

    assert viewport.evaluate("v => getComputedStyle(v).backgroundColor") == "rgb(255, 255, 255)"
    image = Image.open(io.BytesIO(viewport.screenshot())).convert("RGB")
    width, height = image.size
    inset = 8  # past the 1 px border and its 6 px rounded corners
    return [min(min(image.getpixel((x + dx, y + dy))) for dx in range(-1, 2) for dy in range(-1, 2))
            for x in (inset, width - 1 - inset) for y in (inset, height - 1 - inset)]


def test_live_stepper_in_jupyterlab_dark_theme(browser, dark_lab):
    page, next_button = open_live_notebook(browser, dark_lab)
    assert page.evaluate("document.body.dataset.jpThemeLight") == "false"  # really the dark theme
    for _ in range(4):
        next_button.click()
    assert "received 5.0 → returned 2.5" in page.locator(".jp-OutputArea .al-cardbox").inner_text()
    for selector in (".jp-OutputArea .al-card", ".jp-OutputArea .al-title", ".jp-OutputArea table.al-grads td",
                     ".jp-OutputArea .al-changed", ".jp-OutputArea .al-controls button", ".jp-OutputArea .al-pos"):
        assert contrast(page, selector) >= 4.5, selector
    where = current_in_view(page)
    assert where["inside"] and where["textPx"] >= 10, where
    # the drawing's white panel fills its frame (no white box inside a dark frame), around a drawing smaller than it
    viewport = page.locator(".jp-OutputArea .al-viewport").first
    for _ in range(3):
        page.locator(".jp-OutputArea button[data-go=zoom-out]").click()
    drawing = page.locator(".jp-OutputArea .al-canvas svg").first.bounding_box()
    assert drawing["width"] < viewport.bounding_box()["width"] - 40
    assert min(panel_fills_frame(viewport)) >= 240
    shot(page, "jupyterlab-dark-step-4.png")
    page.close()


def test_the_widget_step_is_read_and_set_from_python(browser, lab):
    """lens.stepper() is the anywidget: the kernel set step 4 when the last cell ran; the student steps
    back; running that cell again prints the step the browser is on."""
    page, _ = open_live_notebook(browser, lab.replace("/lab/tree/stepper.ipynb", "/lab/workspaces/widget/tree/widget.ipynb"))
    position = page.locator(".jp-OutputArea .al-pos")
    position.filter(has_text="step 4 of").wait_for(timeout=30_000)
    page.locator(".jp-OutputArea button[data-go=prev]").click()
    assert position.inner_text().startswith("step 3 of")
    last = page.locator(".jp-Cell").nth(3)
    assert "python sees step 0" in last.locator(".jp-OutputArea").inner_text()
    last.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    last.locator(".jp-OutputArea", has_text="python sees step 3").wait_for(timeout=30_000)
    position.filter(has_text="step 4 of").wait_for(timeout=30_000)  # and the cell set it to 4 again
    shot(page, "jupyterlab-widget.png")
    page.close()


def test_saved_notebook_reopened_without_its_kernel_still_steps(browser, lab):
    """A trusted notebook whose kernel is gone: its %%lens outputs are HTML steppers (no widget model is
    needed), so they step; nothing says "model not found"."""
    page, _ = open_page(browser, lab.replace("/lab/tree/stepper.ipynb", "/lab/workspaces/saved/tree/saved.ipynb"),
                        ".jp-Notebook", width=1400, height=1000)
    next_button = page.locator(".jp-OutputArea button[data-go=next]").first
    next_button.wait_for(timeout=60_000)  # the inline script ran: the notebook is trusted
    stepper = next_button.locator("xpath=ancestor::div[contains(@class, 'al-stepper')][1]")
    card = stepper.locator(".al-cardbox")
    assert "Before backward()" in card.inner_text()
    next_button.click()
    assert "runs" in card.inner_text() and stepper.get_attribute("data-step") == "1"
    assert "model not found" not in page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
    shot(page, "jupyterlab-reopened.png")
    page.close()


def test_untrusted_course_notebook_shows_a_picture_not_text_soup(browser, lab):
    page, _ = open_page(browser, lab.replace("/lab/tree/stepper.ipynb", "/lab/workspaces/untrusted/tree/course.ipynb"),
                        ".jp-Notebook", width=1400, height=1000)
    picture = page.locator(".jp-OutputArea img").first
    picture.wait_for(timeout=60_000)
    assert page.evaluate("img => img.naturalWidth", picture.element_handle()) > 100  # the data URI survived
    output = picture.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')][1]").inner_text()
    assert "x.grad written: 10.0" in output and "grad if no hook had run" in output
    assert "PowBackward0" not in output  # the drawing's labels are in the picture, not spilled as text
    assert "Stepping through it needs the stepper's script, which runs once the notebook is trusted" in output
    picture.scroll_into_view_if_needed()
    shot(page, "jupyterlab-untrusted.png")
    page.close()


def test_untrusted_notebook_shows_a_medium_pass_readable_not_shrunk(browser, lab):
    """JupyterLab's sanitiser keeps the picture's size: a 9,000 px wide drawing is not shrunk to the output's width
    (text of 1.5 px) but shown at the width where its smallest text is 10 px, scrolling in its box."""
    from autograd_lens.views.static_html import readable_width

    page, _ = open_page(browser, lab.replace("/lab/tree/stepper.ipynb", "/lab/workspaces/medium/tree/medium.ipynb"),
                        ".jp-OutputArea img.al-picture", width=1400, height=1000)
    picture = page.locator(".jp-OutputArea img.al-picture")
    assert picture.evaluate("img => img.naturalWidth") > 300
    output = page.locator(".jp-OutputArea-output").first.bounding_box()
    shown = picture.bounding_box()
    svg = PassView(medium_lens().passes[0]).svg
    assert abs(shown["width"] - readable_width(svg)) <= 1 and shown["width"] > 2 * output["width"], (shown, output)
    box = page.locator(".jp-OutputArea .al-picturebox")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
    assert box.bounding_box()["width"] <= output["width"] + 1  # the box scrolls; the page does not widen
    assert "grad written" in page.locator(".jp-OutputArea .al-cardbox").inner_text()
    page.close()


MARIMO_APP = '''
import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo
    import torch

    import autograd_lens as al

    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        y = x ** 2
        y.register_hook(lambda g: g * 0.5)
        (y * 3 + y * 2).backward()
    stepper = mo.ui.anywidget(lens.stepper())
    stepper
    return mo, stepper


@app.cell
def _(mo, stepper):
    mo.md(f"python sees step {stepper.value['step']}")
    return
'''


def test_live_stepper_in_marimo(browser, tmp_path):
    pytest.importorskip("marimo")
    (tmp_path / "app.py").write_text(MARIMO_APP)
    port = free_port()
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_STATE_HOME=str(tmp_path / "state"))
    server = subprocess.Popen(
        [sys.executable, "-m", "marimo", "run", str(tmp_path / "app.py"), "--headless", "--host", "127.0.0.1",
         "--port", str(port), "--no-token", "--no-sandbox"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", "marimo")
        page, errors = open_page(browser, f"http://127.0.0.1:{port}", None)
        next_button = page.locator("button[data-go=next]")  # inside marimo's shadow root: locators reach it
        next_button.wait_for(timeout=90_000)
        for _ in range(4):
            next_button.click()
        assert "received 5.0 → returned 2.5" in page.locator(".al-cardbox").inner_text()
        where = node_in_view(page.locator(".al-stepper"))
        assert where["inside"] and where["textPx"] >= 10, where
        # the step trait reached Python, which re-ran the cell that reads it
        page.wait_for_function("() => document.body.innerText.includes('python sees step 4')", timeout=30_000)
        shot(page, "marimo-step-4.png")
        # the keys step here too (issue 22): focus is in the stepper after the click, in marimo's shadow root
        stepper = page.locator(".al-stepper").first
        seen = []
        for key in ["ArrowRight", "k", "j", "ArrowLeft", "Home"]:
            page.keyboard.press(key)
            seen.append(int(stepper.get_attribute("data-step")))
        assert seen == [5, 4, 5, 4, 0], seen
        page.wait_for_function("() => document.body.innerText.includes('python sees step 0')", timeout=30_000)
        assert errors == []
        page.close()
    finally:
        stop_server(server)


def test_live_stepper_in_notebook_7(browser, notebook7):
    page, next_button = open_live_notebook(browser, notebook7)
    for _ in range(4):
        next_button.click()
    assert "received 5.0 → returned 2.5" in page.locator(".jp-OutputArea .al-cardbox").inner_text()
    where = current_in_view(page)
    assert where["inside"] and where["textPx"] >= 10, where
    shot(page, "notebook7-step-4.png")
    page.close()
