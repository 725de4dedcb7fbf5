"""Where scripts cannot run (an untrusted notebook, GitHub, nbconvert without JS) a large pass's stored output is a
readable overview (its runs of identical blocks folded into one box each, as SVG) plus the last card and the
gradients table, not nothing and not the full drawing shrunk (issue 22).  The stepper's script, where it runs,
still draws the full pass."""

from __future__ import annotations

import re
import urllib.parse

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.format import format_value
from autograd_lens.views.passview import views_for
from autograd_lens.views.static_html import OVERVIEW_BOXES, PICTURE_INLINE_LIMIT, stepper_fragment

OVERVIEW = re.compile(r'<img class="al-folded-picture" alt="([^"]*)" src="data:image/svg\+xml,([^"]*)"')


def blocks_lens(blocks: int, modules: bool):
    """A pass through ``blocks`` blocks of Linear then Tanh (5 boxes each: ~250 nodes at 50, ~1,000 at 200)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(blocks)])
    x = torch.randn(3, 4)
    with al.Lens(names={"model": model, "x": x}, max_nodes=5000, modules=modules) as lens:
        model(x).sum().backward()
    return model, lens


def functions_made(block: nn.Module) -> int:
    """The backward functions one call of ``block`` makes, counted on torch's own graph."""
    start = torch.randn(3, 4, requires_grad=True)
    seen, stack = set(), [block(start).grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen or type(fn).__name__ == "AccumulateGrad":
            continue
        seen.add(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return len(seen)


def overview_of(fragment: str) -> tuple[str, str]:
    """(the overview's alt text, its SVG text) from a stored output."""
    found = OVERVIEW.search(fragment)
    assert found, "no overview picture"
    return found.group(1), urllib.parse.unquote(found.group(2).replace("&amp;", "&"))


@pytest.mark.parametrize("modules", [False, True], ids=["parameter names", "module calls"])
@pytest.mark.parametrize("blocks, nodes", [(50, 252), (200, 1002)])
def test_a_large_pass_stores_a_folded_overview_and_the_table(blocks, nodes, modules):
    model, lens = blocks_lens(blocks, modules)
    graph = lens.passes[0].graph
    assert len(graph.nodes) == nodes
    views = views_for(lens.passes)
    assert len(views[0].svg) > PICTURE_INLINE_LIMIT  # too large to stand in the output as the full drawing
    fragment = stepper_fragment(views)
    alt, svg = overview_of(fragment)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    # the folded run names every block of the model, and what each block holds
    assert f"model.0-{blocks - 1} (x{blocks})" in texts, texts
    per_block = functions_made(model[1])
    if modules:  # the recorded calls: the class, and every backward function a block made
        assert f"Sequential · {per_block} backward functions each" in texts, texts
    else:  # from parameters' names: the class is not known, and the tanh after a block's last parameter lies
        # between blocks in the box (after the last block outside it): the box says what it holds in all
        assert f"Module · {blocks * per_block - 1} backward functions in all" in texts, texts
    # an overview, not the full drawing shrunk: few boxes, small
    boxes = len(re.findall(r"class=['\"]node['\"]", svg))
    assert 3 <= boxes <= min(OVERVIEW_BOXES, 12), boxes
    assert len(svg) < 8_000 and svg.count("AddmmBackward0") <= 1
    assert "model.7.0.weight" not in svg  # a block's own boxes are inside the fold, not drawn
    assert alt.startswith("an overview of the backward pass, repeated blocks folded")
    assert "Here, an overview: each run of identical blocks drawn as one box." in fragment
    # the table: every parameter's .grad as torch computed it, and the last step's card
    table = fragment[fragment.index('<div class="al-tablebox">'):]
    for name, parameter in model.named_parameters():
        assert f"model.{name}" in table
    assert format_value(model[blocks - 1][0].bias.grad) in table
    assert '<div class="al-cardbox">' in fragment
    # the stepper's script takes the full drawing from the data, never the overview
    assert '<img class="al-picture"' not in fragment and 'data-encoding="deflate-raw-base64"' in fragment


def test_a_large_pass_that_does_not_fold_says_where_its_drawing_is():
    """Linear and Tanh as siblings (no repeated block): no overview picture, the words say where the drawing is."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(4, 4), nn.Tanh())])
    x = torch.randn(3, 4)
    with al.Lens(names={"model": model, "x": x}, max_nodes=5000) as lens:
        model(x).sum().backward()
    fragment = stepper_fragment(views_for(lens.passes))
    assert OVERVIEW.search(fragment) is None and "<img class=" not in fragment
    assert "is stored compressed and drawn by the stepper's script" in fragment
    assert "Here, an overview" not in fragment


def test_an_overview_that_cannot_be_laid_out_leaves_the_words(monkeypatch):
    from autograd_lens.views import render

    _, lens = blocks_lens(50, False)
    views = views_for(lens.passes)
    _ = views[0].svg  # the pass's own drawing, laid out before the renderer breaks

    def broken(*args, **kwargs):
        raise render.RenderError("layout failed")

    monkeypatch.setattr(render, "render_svg", broken)
    fragment = stepper_fragment(views)
    assert OVERVIEW.search(fragment) is None and "Here, an overview" not in fragment
    assert "is stored compressed and drawn by the stepper's script" in fragment and '<div class="al-tablebox">' in fragment


def test_the_overview_is_deterministic():
    _, lens = blocks_lens(50, False)
    assert stepper_fragment(views_for(lens.passes)) == stepper_fragment(views_for(lens.passes))


# ----------------------------------------------------------------------------- in a real browser


@pytest.mark.browser
def test_scripts_off_show_the_overview_and_scripts_on_the_full_pass(browser, tmp_path):
    from test_browser import open_page

    _, lens = blocks_lens(50, False)
    path = tmp_path / "large.html"
    path.write_text(f"<!DOCTYPE html><html><body>{stepper_fragment(views_for(lens.passes))}</body></html>",
                    encoding="utf-8")
    page, errors = open_page(browser, path, "img.al-folded-picture", scripts=False)
    shown = page.evaluate("(() => { const i = document.querySelector('img.al-folded-picture');"
                          " return [i.complete, i.naturalWidth, i.getBoundingClientRect().width]; })()")
    assert shown[0] and shown[1] > 100 and shown[2] >= shown[1] * 0.99, shown  # loaded, at its own size or more
    assert page.locator(".al-tablebox tr").count() == 101  # the header and 100 parameters
    page.context.close()
    page, errors = open_page(browser, path, offline=True)
    assert page.locator(".al-canvas svg g.node").count() == len(lens.passes[0].graph.nodes)
    assert page.locator("img.al-folded-picture").count() == 0 and errors == []
    page.close()
