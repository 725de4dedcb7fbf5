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
