"""The self-contained HTML stepper: the stepper module inline, the passes as JSON, a picture for no-script.

No network, no CDN, no kernel: it steps in nbconvert HTML, Jupyter Book, a saved notebook, or any browser,
with the same ES module (``stepper.js``) the live widget runs.  With scripts off (an untrusted notebook, a
sanitising viewer) it shows the finished pass as an image, the last step's card and the with/without
table.  The bytes depend only on the recorded passes (ids come from a content hash), so nbval can
compare them.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from .passview import PassView, stepper_data, views_for
from .trace_display import pass_title

_MODULE: str | None = None


def module_source() -> str:
    """The stepper's ES module (also the anywidget ``_esm``)."""
    global _MODULE
    if _MODULE is None:
        _MODULE = resources.files("autograd_lens.views").joinpath("stepper.js").read_text(encoding="utf-8")
    return _MODULE


def classic_script() -> str:
    """The module as a classic script that renders the stepper it sits in (inline module scripts are not
    run by every notebook front-end; classic ones are)."""
    body = module_source().replace("export function ", "function ").replace("export default { render };", "")
    return (
        "(function (host) {\n\"use strict\";\n"
        "if (!host || host.getAttribute(\"data-ready\")) { return; }\n"
        "host.setAttribute(\"data-ready\", \"1\");\n"
        f"{body}\n"
        "var data = JSON.parse(host.querySelector(\"script.al-data\").textContent);\n"
        "var picture = host.querySelector(\"img.al-picture\");\n"
        "if (picture && data.passes.length) { data.passes[0].svg = picture.getAttribute(\"src\"); }\n"
        "var values = {data: JSON.stringify(data), step: 0, pass_index: 0, answers: {}};\n"
        "var model = {get: function (name) { return values[name]; }, set: function (name, value) { values[name] = value; },\n"
        "  save_changes: function () {}, on: function () {}, off: function () {}};\n"
        "render({model: model, el: host});\n"
        "})(document.currentScript && document.currentScript.parentNode);\n"
    )


def _json_for_html(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def fragment_key(views: list[PassView], predict: bool = False) -> str:
    return ("al-p-" if predict else "al-") + "-".join(view.key for view in views)[:32]


def stepper_fragment(views: list[PassView], predict: bool = False) -> str:
    """An HTML fragment (for a notebook output) stepping through the given passes.  With ``predict``,
    each step that reveals a gradient first asks the student for it."""
    if not views:
        return "<p>No backward pass was recorded.</p>"
    key = fragment_key(views, predict)
    first = views[0]
    data = stepper_data(views, key, predict, first_picture=False)  # the first picture is the <img>
    title = html.escape(pass_title(first.backward_pass))
    return (
        f'<div class="autograd-lens al-static" id="{key}">'
        f'<img class="al-picture" alt="the backward pass drawn: {title}" src="{first.picture.replace("&", "&amp;")}">'
        f'<div class="al-cardbox">{first.cards[-1]}</div>'
        f'<div class="al-tablebox">{first.table}</div>'
        f'<script type="application/json" class="al-data">{_json_for_html(data)}</script>'
        f"<script>{classic_script()}</script>"
        "</div>"
    )


def page(body: str, title: str = "autograd_lens") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}\n</body></html>\n"
    )


def lens_page(lens, predict: bool = False) -> str:
    """A standalone page for everything a Lens recorded."""
    views = views_for(lens.passes)
    return page(stepper_fragment(views, predict=predict), title="autograd_lens: backward pass")
