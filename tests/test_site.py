"""The course website (``python docs/build_site.py``): built from the notebooks' stored outputs, every stepper
on every notebook page steps in Chromium with the network cut off, and docs/instructors.md is current.

The build needs the ``site`` extra (Sphinx, MyST-NB, Furo; also in ``test``); without it those tests skip.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("build_site", ROOT / "docs" / "build_site.py")
build_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_site)
NOTEBOOKS = build_site.course_notebooks()
PAGES = NOTEBOOKS + build_site.solution_notebooks()  # notebooks/solutions/ too
CHROMIUM = shutil.which("chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]


def stored_html(path: Path) -> list[str]:
    """The stored text/html outputs of a notebook that hold a stepper."""
    found = []
    for cell in build_site.load(path)["cells"]:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            html = html if isinstance(html, str) else "".join(html)
            if build_site.STEPPER in html:
                found.append(html)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("sphinx", "myst_nb", "furo"):
        pytest.importorskip(module, reason='the site extra is not installed: pip install -e ".[site]"')
    folder = tmp_path_factory.mktemp("site")
    build_site.build(folder / "html", sources=folder / "src")
    return folder / "html"


def built(site: Path, path: Path) -> Path:
    """The copy of a notebook the site was built from (a notebook edited meanwhile does not matter)."""
    return site.parent / "src" / "notebooks" / path.relative_to(build_site.NOTEBOOKS)


def page_of(site: Path, path: Path) -> Path:
    return (site / "notebooks" / path.relative_to(build_site.NOTEBOOKS)).with_suffix(".html")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield chromium
        chromium.close()


def test_every_notebook_is_a_page_with_its_stored_steppers_and_their_scripts(site):
    assert (site / "index.html").is_file() and (site / "docs" / "instructors.html").is_file()
    assert (site / "notebooks" / "README.html").is_file()
    index = (site / "index.html").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f'href="notebooks/{path.stem}.html"' in index, path.name
    if build_site.solution_notebooks():  # a page of their own, listing each
        solutions = (site / "notebooks" / "solutions" / "index.html").read_text(encoding="utf-8")
        assert all(f'href="{path.stem}.html"' in solutions for path in build_site.solution_notebooks())
    for path in PAGES:
        page = page_of(site, path).read_text(encoding="utf-8")
        stored = build_site.stats(built(site, path))["steppers"]
        assert page.count(build_site.STEPPER) == stored, path.name
        # each stored stepper's own scripts (its data and its code) are on the page, byte for byte
        scripts = [script for html in stored_html(built(site, path))
                   for script in re.findall(r"<script.*?</script>", html, re.S)]
        assert len(scripts) >= 2 * stored
        assert all(script in page for script in scripts), path.name
    assert sum(build_site.stats(built(site, path))["steppers"] for path in NOTEBOOKS) >= len(NOTEBOOKS)


def test_no_page_loads_anything_from_the_network(site):
    """Scripts, styles, fonts and pictures all come from the site itself (a CDN would leave pages blank offline)."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= len(PAGES) + 3
    for page in pages:
        html = page.read_text(encoding="utf-8")
        remote = re.findall(r'<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]*)"', html)
        assert not remote, (page.name, remote)


@pytest.mark.browser
@pytest.mark.parametrize("path", PAGES, ids=lambda path: str(path.relative_to(build_site.NOTEBOOKS).with_suffix("")))
def test_every_stepper_on_the_page_steps_offline(site, browser, path):
    """Open the built page with every non-file request aborted: each stepper starts at step 0, and its own next
    button moves it (and only it) to step 1 with a new card; no console error, no request leaves the page."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors, requests = [], []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))

    def route(request_route):
        if request_route.request.url.startswith("file:"):
            request_route.continue_()
        else:
            requests.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.goto(page_of(site, path).as_uri())
    page.wait_for_load_state("load")
    expected = build_site.stats(built(site, path))["steppers"]
    steppers = page.locator(".al-static .al-stepper")
    assert steppers.count() == expected
    totals = []
    for k in range(expected):
        stepper = steppers.nth(k)
        stepper.locator(".al-pos").wait_for()
        match = re.fullmatch(r"step 0 of (\d+)", stepper.locator(".al-pos").inner_text())
        assert match and stepper.get_attribute("data-step") == "0", (k, stepper.locator(".al-pos").inner_text())
        totals.append(int(match.group(1)))
    for k in range(expected):
        stepper = steppers.nth(k)
        card = stepper.locator(".al-cardbox").inner_text()
        stepper.locator("button[data-go=next]").click()
        assert stepper.get_attribute("data-step") == "1", k
        assert stepper.locator(".al-pos").inner_text() == f"step 1 of {totals[k]}"
        assert stepper.locator(".al-cardbox").inner_text() != card, k
        # the others did not move: steppers before it are at 1 (clicked), after it still at 0
        steps = [steppers.nth(j).get_attribute("data-step") for j in range(expected)]
        assert steps == ["1"] * (k + 1) + ["0"] * (expected - k - 1)
    if expected:  # the first stepper, through to its last step, and no further
        stepper, total = steppers.nth(0), totals[0]
        for k in range(2, total + 1):
            card = stepper.locator(".al-cardbox").inner_text()
            stepper.locator("button[data-go=next]").click()
            assert stepper.get_attribute("data-step") == str(k)
            assert stepper.locator(".al-pos").inner_text() == f"step {k} of {total}"
            assert stepper.locator(".al-cardbox").inner_text() != card, k
        stepper.locator("button[data-go=next]").click()
        assert stepper.get_attribute("data-step") == str(total)
    assert errors == [] and requests == []
    page.close()


def instructors_rows(page: str) -> dict[str, tuple[int, int, str]]:
    """docs/instructors.md's generated table: notebook file -> (minutes, steppers, claims)."""
    block = page[page.index(build_site.TABLE_START):page.index(build_site.TABLE_END)]
    rows = re.findall(r"^\| \[.*?\]\(\.\./notebooks/(\S+?\.ipynb)\) \| (\d+) min \| (\d+) \| (.*?) \|$", block, re.M)
    return {name: (int(minutes), int(steppers), claims) for name, minutes, steppers, claims in rows}


@pytest.mark.skipif(not build_site.CLAIMS.exists(), reason="../shared/CLAIMS.md is not beside the checkout")
def test_instructors_page_lists_every_notebook_and_the_claims_it_settles():
    """Every notebook has a row with its steppers and claims (its time may be off by one 5-minute step), and the
    list of claims by notebook is current. Refresh both with python docs/build_site.py --instructors."""
    page = build_site.INSTRUCTORS.read_text(encoding="utf-8")
    rows = instructors_rows(page)
    assert sorted(rows) == [path.name for path in NOTEBOOKS], "run python docs/build_site.py --instructors"
    for path in NOTEBOOKS:
        stats = build_site.stats(path)
        minutes, steppers, claims = rows[path.name]
        assert (steppers, claims) == (stats["steppers"], ", ".join(map(str, stats["claims"])) or "—"), path.name
        assert abs(minutes - stats["minutes"]) <= 5, f"{path.name}: run python docs/build_site.py --instructors"
    assert build_site.claims_by_notebook() in page, "run python docs/build_site.py --instructors"
    settled = {n for path in NOTEBOOKS for n in build_site.stats(path)["claims"]}
    assert settled and all(f"- **{number}** *" in page for number in settled)
    claims = build_site.claims_table()
    assert claims[13][1].startswith("F")
    assert "- **13** *misconception* — `x = torch.randn(2,2,requires_grad=True) * 10`" in page
