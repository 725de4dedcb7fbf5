"""Legibility of the stepper, the static page and the --why view in a real browser (Chromium): what a student
sees at step 0, hook cards' before → after tiles, trying a prediction again, the stepper's width in JupyterLab.

Skipped like test_browser when Debian's ``chromium`` or ``playwright`` is missing."""

from __future__ import annotations

import pytest
import torch

import autograd_lens as al
from test_browser import browser, lab, dark_lab, open_live_notebook, open_page, open_static_page  # noqa: F401

pytestmark = [pytest.mark.browser]


def mlp_lens():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 1))
    with al.Lens(names={"model": model}) as lens:
        model(torch.randn(3, 4)).pow(2).mean().backward()
    return lens


VIEW = """(root) => {
    const port = root.querySelector('.al-viewport').getBoundingClientRect();
    const svg = root.querySelector('.al-canvas svg').getBoundingClientRect();
    return {port: [port.left, port.right, port.top, port.bottom], svg: [svg.left, svg.right, svg.top, svg.bottom],
            scale: parseFloat(root.getAttribute('data-scale'))};
}"""


def view_of(page):
    return page.locator(".al-stepper").first.evaluate(VIEW)


def inside(page, node_id):
    return page.locator(".al-stepper").first.evaluate("""(root, id) => {
        const port = root.querySelector('.al-viewport').getBoundingClientRect();
        const b = root.querySelector('.al-canvas #' + id).getBoundingClientRect();
        return b.left >= port.left && b.right <= port.right && b.top >= port.top && b.bottom <= port.bottom;
    }""", node_id)


def test_step_0_shows_the_root_and_the_first_node_to_run_with_the_drawing_filling_the_view(browser, tmp_path):
    """A drawing wider than the view: at step 0 the root and the node that runs first are in view, and the drawing
    fills the view (before: the root was centred, half of the view empty beside it); "first" after stepping away
    brings them back (follow), and following a node never leaves an empty band either."""
    from autograd_lens.views.passview import PassView

    lens = mlp_lens()
    path = tmp_path / "mlp.html"
    lens.to_html(str(path))
    view = PassView(lens.passes[0])
    root_id = view.data(False)["roots"][0]
    first_id = view.steps[1].node
    page, errors = open_page(browser, path, width=900, height=800)

    def fills():
        v = view_of(page)
        port, svg = v["port"], v["svg"]
        assert svg[1] - svg[0] > port[1] - port[0]  # the drawing is wider than the view at a readable zoom
        return svg[0] <= port[0] + 1 and svg[1] >= port[1] - 1, v

    ok, seen = fills()
    assert ok, seen
    assert inside(page, root_id) and inside(page, first_id)
    for _ in range(len(view.steps) - 1):
        page.click("button[data-go=next]")
        ok, seen = fills()
        assert ok, (page.get_attribute(".al-stepper", "data-step"), seen)
    page.click("button[data-go=first]")
    assert inside(page, root_id) and inside(page, first_id)
    assert errors == []
    page.close()


def hook_on_16_entries_lens():
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    with al.Lens(names={"w": w}) as lens:
        h = torch.randn(4, 4) @ w
        h.register_hook(lambda g: g * 0.5)
        torch.tanh(h).sum().backward()
    return lens


TILES = """(root) => {
    const card = root.querySelector('.al-card').getBoundingClientRect();
    return Array.from(root.querySelectorAll('.al-changes td')).map((td) => {
        const b = td.getBoundingClientRect();
        return {text: td.textContent, height: b.height, line: parseFloat(getComputedStyle(td).lineHeight) ||
                1.2 * parseFloat(getComputedStyle(td).fontSize), inCard: b.left >= card.left && b.right <= card.right};
    });
}"""


@pytest.mark.parametrize("width", [1300, 700])
def test_a_hooks_before_after_tiles_stay_on_one_line_inside_the_card(browser, tmp_path, width):
    """The hook changed 16 entries: each "before → after" tile keeps its arrow and both numbers on one line and the
    tiles wrap as whole tiles inside the card (before: one table row whose cells broke after the arrow)."""
    path = tmp_path / "hook.html"
    hook_on_16_entries_lens().to_html(str(path))
    page, errors = open_page(browser, path, width=width)
    stepper = page.locator(".al-stepper").first
    for _ in range(10):
        if stepper.locator(".al-changes").count():
            break
        page.click("button[data-go=next]")
    tiles = stepper.evaluate(TILES)
    assert len(tiles) == 16 and all("→" in t["text"] for t in tiles)
    for tile in tiles:
        assert tile["height"] < 1.6 * tile["line"] + 6, tile  # one line (+ padding and border)
        assert tile["inCard"], tile
    assert errors == []
    page.close()


def long_names_lens():
    """--why on long names: the paths menu's longest option is a long path (what made a JupyterLab output scroll)."""
    first_layer_weights = torch.tensor([0.5, -1.0], requires_grad=True)
    first_layer_bias_vector = torch.tensor([0.5, 2.0], requires_grad=True)
    inputs_of_the_batch = torch.tensor([1.0, 3.0])
    names = {"first_layer_weights": first_layer_weights, "first_layer_bias_vector": first_layer_bias_vector,
             "inputs_of_the_batch": inputs_of_the_batch}
    with al.Lens(names=names, why=True) as lens:
        activations_after_the_logarithm = torch.log(inputs_of_the_batch * first_layer_bias_vector) * first_layer_weights
        activations_after_the_logarithm.sum().backward()
    return lens


WIDER = """(root) => {
    const right = root.getBoundingClientRect().right;
    return Array.from(root.querySelectorAll('*')).filter((e) => !e.closest('.al-canvas'))
        .filter((e) => e.getBoundingClientRect().right > right + 0.5)
        .map((e) => e.tagName + '.' + e.className + ': ' + Math.round(e.getBoundingClientRect().right - right) + ' px');
}"""


@pytest.mark.parametrize("width", [1300, 420])
def test_nothing_of_the_stepper_is_wider_than_its_output(browser, tmp_path, width):
    """The paths menu (and the pass menu) as wide as their longest option made the stepper wider than a JupyterLab
    output of 568 px (a horizontal scrollbar): every control, card and table now stays inside the stepper's box,
    and the page does not scroll sideways."""
    path = tmp_path / "long.html"
    long_names_lens().to_html(str(path))
    page, errors = open_page(browser, path, width=width)
    stepper = page.locator(".al-stepper").first
    assert stepper.locator("select.al-paths").is_visible()
    assert stepper.evaluate(WIDER) == []
    page.click("button[data-go=last]")
    assert stepper.evaluate(WIDER) == []
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert errors == []
    page.close()


LONG_CELL = """%%lens --why first_layer_bias_vector
first_layer_weights = torch.tensor([0.5, -1.0], requires_grad=True)
first_layer_bias_vector = torch.tensor([0.5, 2.0], requires_grad=True)
inputs_of_the_batch = torch.tensor([1.0, 3.0])
activations_after_the_logarithm = torch.log(inputs_of_the_batch * first_layer_bias_vector) * first_layer_weights
activations_after_the_logarithm.tanh().exp().sum().backward()"""


def put_notebook(url, name, cells):
    """Store a notebook of ``cells`` next to the lab fixture's notebooks; the URL that opens it in its own workspace."""
    import json
    import urllib.request

    base, token = url.split("/lab/")[0], url.split("token=")[1]
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": c}
                          for c in cells],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    request = urllib.request.Request(f"{base}/api/contents/{name}?token={token}", method="PUT",
                                     data=json.dumps({"type": "notebook", "content": notebook}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()
    return f"{base}/lab/workspaces/{name.split('.')[0]}/tree/{name}?token={token}"


SCROLLS = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output')).filter((o) => o.querySelector('.al-stepper'))
    .map((o) => [o.scrollWidth, o.clientWidth, o.querySelector('.al-stepper').getBoundingClientRect().right
                 - (o.getBoundingClientRect().left + o.clientWidth)])"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_stepper_fits_a_jupyterlab_output(browser, request, theme):
    """Measured in JupyterLab (light and dark) with the window at 1,400 and 1,000 px (outputs 968 and 568 px wide):
    the %%lens --why stepper of long names is no wider than its output (no horizontal scrollbar, no cut edge)."""
    url = request.getfixturevalue("lab" if theme == "light" else "dark_lab")
    page, _ = open_live_notebook(browser, put_notebook(url, f"long-{theme}.ipynb", ["%load_ext autograd_lens\nimport torch",
                                                                                     LONG_CELL]))
    for width in (1400, 1000):
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(300)
        measured = page.evaluate(SCROLLS)
        assert measured and all(scroll <= client and over <= 0.5 for scroll, client, over in measured), (width, measured)
    page.close()


def test_why_names_what_the_local_derivatives_are_never_a_blank_column():
    """Paths of tensors have no single-number local derivatives: the --why table drops the column and says why
    (before: a column of blank cells); paths of one-element tensors still list them, and what they multiply to is
    what torch computed."""
    from autograd_lens.debug.why import Why

    w = torch.tensor([0.5, -1.0], requires_grad=True)
    b = torch.tensor([0.5, 2.0], requires_grad=True)
    with al.Lens(names={"w": w, "b": b}, why=True) as lens:
        (torch.log(b * 2) * w).sum().backward()
    shown = Why(lens, "b")._repr_html_()
    paths = shown[shown.index("Which paths it took"):]
    paths = paths[:paths.index("</table>")]
    assert "local derivatives are listed as numbers only for paths of one-element tensors" in paths
    assert "<th>local derivatives</th>" not in paths and "<td></td><td>[" not in paths
    assert "[1.0, -0.5]" in paths and torch.equal(b.grad, torch.tensor([1.0, -0.5]))

    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"x": x}, why=True) as lens:
        (x * 3 + x * x).backward()
    shown = Why(lens, "x")._repr_html_()
    assert "<th>local derivatives</th>" in shown and "<td>1.0 × 3.0</td><td>3.0</td>" in shown
    assert x.grad.item() == 3.0 + 2.0 + 2.0 and "<td>7.0</td>" in shown


def test_why_names_the_root_gradient_among_the_factors_when_it_is_not_one():
    """backward(gradient=2.) makes 2.0 the first factor of every path: the column said "local derivatives" of it
    (before 2026-11-28 noon); it now says "root gradient × local derivatives", and only then."""
    from autograd_lens.debug.why import Why

    headers = {}
    for seed in (None, 2.0):
        x = torch.tensor(2.0, requires_grad=True)
        with al.Lens(names={"x": x}, why=True) as lens:
            (x * 3 + x * x).backward(None if seed is None else torch.tensor(seed))
        shown = Why(lens, "x")._repr_html_()
        headers[seed] = shown
        assert x.grad.item() == (seed or 1.0) * 7.0 and f"<td>{x.grad.item()}</td>" in shown
    assert "<th>local derivatives</th>" in headers[None] and "root gradient" not in headers[None]
    assert "<th>root gradient × local derivatives</th>" in headers[2.0]
    assert "<td>2.0 × 1.0 × 3.0</td><td>6.0</td>" in headers[2.0]


def _why_paths(lens, name):
    """The rows of the --why paths table: [cell, ...] per row, the header left out."""
    import re

    from autograd_lens.debug.why import Why

    shown = Why(lens, name)._repr_html_()
    table = shown[shown.index("Which paths it took"):]
    table = table[:table.index("</table>")]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]


def test_why_sum_row_says_how_the_paths_add_up():
    """The "sum over N paths" row's local-derivatives cell is never blank: with every path of one-element tensors
    it writes out the contributions it adds (and they add up to torch's .grad); the row of paths summed together
    says their factors are not listed; a path of tensors among them: no product, the contributions added."""
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"x": x}, why=True) as lens:
        (x * 3 + x * x).backward()
    rows = _why_paths(lens, "x")
    assert rows[-1] == ["", "sum over 3 paths", "add the contributions: 3.0 + 2.0 + 2.0", "7.0"]
    assert x.grad.item() == 7.0

    w = torch.tensor(1.5, requires_grad=True)
    with al.Lens(names={"w": w}, why=True) as lens:
        y = w
        for _ in range(5):
            y = y * 2 + y * 3
        y.backward()
    rows = _why_paths(lens, "w")
    assert rows[-2][1:3] == ["the other 24 paths", "not listed: their contributions summed in one row"]
    added = rows[-1][2].removeprefix("add the contributions: ").split(" + ")
    assert rows[-1][1] == "sum over 32 paths" and len(added) == 9 and added == [row[3] for row in rows[:-1]]
    assert sum(float(value) for value in added) == w.grad.item() == 5.0 ** 5
    assert all(cell for row in rows for cell in row[1:])  # no blank cell but the sum row's number

    z = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"z": z}, why=True) as lens:
        (z * 3 + (z.expand(3) * 2).sum()).backward()
    rows = _why_paths(lens, "z")
    assert [row[2] for row in rows] == ["1.0 × 3.0", "tensors: not single numbers",
                                        "no product: the contributions above, added"]
    assert rows[-1][3] == "9.0" and z.grad.item() == 9.0


def two_passes(zero_grad):
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"w": w}) as lens:
        for _ in range(2):
            if zero_grad:
                w.grad = None
            (w * torch.tensor([3.0, 4.0])).sum().backward()
    return lens, w


def test_this_pass_columns_only_when_grad_holds_more_than_this_pass():
    """With zero_grad between passes, .grad is the pass's own gradient: the table of pass 2 has no "added by this
    pass" / "this pass without hooks" columns repeating the first two; accumulating, it has them (6 = 3 + 3)."""
    from autograd_lens.views.steps import grads_table_html

    lens, w = two_passes(zero_grad=True)
    assert w.grad.tolist() == [3.0, 4.0]
    table = grads_table_html(lens.passes[1])
    assert "added by this pass" not in table and "[3.0, 4.0]" in table
    lens, w = two_passes(zero_grad=False)
    assert w.grad.tolist() == [6.0, 8.0]
    table = grads_table_html(lens.passes[1])
    assert "added by this pass" in table and "[6.0, 8.0]" in table and "[3.0, 4.0]" in table


def test_the_stepper_module_is_kept_in_parts_a_reader_can_hold_and_served_as_one():
    """stepper.js was 903 lines: its parts stay under 400 lines each, and the page and the widget still get one
    module (the parts joined in order, each defined once, exports and render in it)."""
    import re
    from importlib import resources

    from autograd_lens.views.static_html import MODULE_PARTS, classic_script, module_source
    from autograd_lens.views.stepper import Stepper

    views = resources.files("autograd_lens.views")
    texts = [views.joinpath(part).read_text(encoding="utf-8") for part in MODULE_PARTS]
    assert all(len(text.splitlines()) < 400 for text in texts), [len(t.splitlines()) for t in texts]
    source = module_source()
    assert source == "\n".join(texts) and Stepper._esm.default_value == source
    defined = re.findall(r"^(?:export )?function (\w+)", source, re.M)
    assert len(defined) == len(set(defined))
    assert {"render", "frameCss", "viewParts", "findParts", "groupParts"} <= set(defined)
    assert source.count("export default { render };") == 1 and source.rstrip().endswith("export default { render };")
    assert "export " not in classic_script()


def test_predict_a_hook_wrong_in_one_part_then_right_on_the_second_try(browser, tmp_path):
    """A hook's question has two parts: a wrong second part says which part is off (not autograd's values) and keeps
    both answers for another try; right on the second try, the card says what autograd computed, with '(try 2)'."""
    _, page, errors = open_static_page(browser, tmp_path, predict=True)
    for _ in range(4):
        page.click("button[data-go=next]")
    boxes = page.locator("input.al-answer")
    assert boxes.count() == 2 and "hook" in page.inner_text(".al-cardbox")
    boxes.nth(0).fill("5")
    boxes.nth(1).fill("5")  # the hook halves it: 2.5 flows on
    page.click("button[data-go=check]")
    said = page.inner_text(".al-feedback")
    assert said == ("What it receives: right; what flows on after it: not quite (try 1). Try again, or press show me "
                    "to see what autograd computed.")
    assert [boxes.nth(0).input_value(), boxes.nth(1).input_value()] == ["5", "5"]
    boxes.nth(1).fill("2.5")
    page.click("button[data-go=check]")
    said = page.inner_text(".al-feedback")
    assert said == ("what it receives: Right: autograd computed 5.0. what flows on after it: Right: autograd computed "
                    "2.5. (try 2)")
    assert errors == []
    page.close()


OUTLINE_GAP = """(root) => {
    // in the drawing's own units: the room between the selection's outline (its inner half) and each text of the node
    const id = root.getAttribute('data-selected');
    const g = root.querySelector('.al-canvas #' + id);
    const shape = Array.from(g.children).find((c) => ['polygon', 'path', 'ellipse'].includes(c.tagName));
    const width = parseFloat(getComputedStyle(shape).strokeWidth);
    const b = shape.getBBox();
    return [width, Math.min(...Array.from(g.querySelectorAll('text')).filter((t) => t.textContent.trim() &&
        getComputedStyle(t).display !== 'none').map((t) => { const tb = t.getBBox();
        return Math.min(tb.x - b.x, b.x + b.width - tb.x - tb.width, tb.y - b.y, b.y + b.height - tb.y - tb.height); })) - width / 2];
}"""


def test_the_selection_outline_leaves_every_label_clear(browser, tmp_path):
    """Item 4 of the legibility list, measured: the 4-unit selection outline (2 inside the box) stays clear of every
    text of the selected box, for functions, leaves with data and grad, a hooked tensor and a 4x4 matrix."""
    path = tmp_path / "hook.html"
    hook_on_16_entries_lens().to_html(str(path))
    page, errors = open_page(browser, path, width=1300)
    page.click("button[data-go=last]")
    stepper = page.locator(".al-stepper").first
    ids = stepper.evaluate("(root) => Array.from(root.querySelectorAll('.al-canvas g.node')).map((g) => g.id)")
    assert len(ids) == 5  # sum, tanh, mm, the hooked h with its data, w [4x4] with data and grad
    for node_id in ids:
        page.fill(".al-search", "")
        page.click("button[data-go=fit]")
        box = stepper.locator(f".al-canvas #{node_id}").bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        assert stepper.get_attribute("data-selected") == node_id
        width, gap = stepper.evaluate(OUTLINE_GAP)
        assert width == 4 and gap > 0.5, (node_id, width, gap)
    assert errors == []
    page.close()
