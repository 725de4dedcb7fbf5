"""Keyboard and navigation in a real browser: the static page, JupyterLab and Notebook 7 (Chromium + Playwright).

Uses the servers and helpers of test_browser.py; skipped where it is (no chromium, no playwright)."""

from __future__ import annotations

import pytest

from test_browser import (ARTIFACTS, browser, lab, notebook7, open_live_notebook, open_static_page,  # noqa: F401
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
