"""The README's picture of the debugging marks, taken in a real browser from the static page of a pass with a
detached weight and a NaN: the page's last card names the cut tensor, the drawing holds both marks.

The screenshot goes to ``artifacts/`` on every run; it replaces ``docs/pictures/debug-marks.png`` only when
``AL_UPDATE_PICTURES=1`` is set (so a test run leaves the checkout clean):
``AL_UPDATE_PICTURES=1 python -m pytest tests/test_debug_picture.py``."""

from __future__ import annotations

import os

import pytest
import torch

from test_browser import ARTIFACTS, browser, open_page, playwright  # noqa: F401

pytestmark = [pytest.mark.browser]

PICTURES = os.path.join(os.path.dirname(ARTIFACTS), "docs", "pictures")


def picture_dir() -> str:
    """Where a test's picture for the docs goes: docs/pictures/ when AL_UPDATE_PICTURES=1, else artifacts/."""
    return PICTURES if os.environ.get("AL_UPDATE_PICTURES") == "1" else ARTIFACTS


def broken_step():
    import autograd_lens as al

    w = torch.tensor([0.5, -1.0], requires_grad=True)
    b = torch.tensor([0.0, 2.0], requires_grad=True)
    x = torch.tensor([1.0, 0.0])
    with al.Lens(names={"w": w, "b": b, "x": x}, why=True) as lens:
        scale = w.detach() * 2  # the bug: w's gradient stops here
        h = torch.log(x * b) * scale  # log(0) at the second element: NaN in backward
        loss = h.sum()
        loss.backward()
    return lens, w, b


def test_the_debug_marks_are_on_the_static_page_and_pictured(browser, tmp_path):
    lens, w, b = broken_step()
    assert w.grad is None and torch.isnan(b.grad).any()  # the truth the marks must tell
    path = tmp_path / "broken.html"
    lens.to_html(str(path))
    page, errors = open_page(browser, path, width=1000, height=1000)
    page.click("button[data-go=next]")
    page.keyboard.press("End")
    card = page.inner_text(".al-stepper")
    assert "After the pass: no gradient reached w" in card
    texts = page.evaluate("Array.from(document.querySelectorAll('svg g.node text')).map(t => t.textContent)")
    assert "✂ w" in texts, texts
    assert any("inf starts here" in text for text in texts), texts  # log(0): inf first, NaN later
    assert errors == []
    page.click("button:has-text('fit')")
    where = picture_dir()
    os.makedirs(where, exist_ok=True)
    page.locator(".al-stepper").first.screenshot(path=os.path.join(where, "debug-marks.png"))
    page.close()


def test_pictures_go_to_the_docs_only_when_asked(monkeypatch):
    monkeypatch.delenv("AL_UPDATE_PICTURES", raising=False)
    assert picture_dir() == ARTIFACTS
    monkeypatch.setenv("AL_UPDATE_PICTURES", "0")
    assert picture_dir() == ARTIFACTS
    monkeypatch.setenv("AL_UPDATE_PICTURES", "1")
    assert picture_dir() == PICTURES
