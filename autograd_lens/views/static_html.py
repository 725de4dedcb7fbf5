"""The self-contained HTML stepper: the stepper module inline, the passes as JSON, a picture for no-script.

No network, no CDN, no kernel: it steps in nbconvert HTML, Jupyter Book, a saved notebook, or any browser,
with the same ES module (``stepper.js``) the live widget runs.  With scripts off (an untrusted notebook, a
sanitising viewer) it shows the finished pass as an image, the last step's card and the with/without
table.  The bytes depend only on the recorded passes (ids come from a content hash), so nbval can
compare them.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import zlib
from importlib import resources
from typing import TYPE_CHECKING

from .svgslim import svg_uri_text

if TYPE_CHECKING:  # the steps' modules load with the stepper, not with a graph's navigator
    from .passview import PassView

_MODULE: str | None = None
# The stepper's module is kept in parts a reader can hold; page and widget get them joined, in this order, as one.
MODULE_PARTS = ("stepper_base.js", "stepper_view.js", "stepper_find.js", "stepper_groups.js", "stepper.js")


def module_source() -> str:
    """The stepper's ES module (also the anywidget ``_esm``): its parts joined."""
    global _MODULE
    if _MODULE is None:
        views = resources.files("autograd_lens.views")
        _MODULE = "\n".join(views.joinpath(part).read_text(encoding="utf-8") for part in MODULE_PARTS)
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
        "function start(text) {\n"
        "  var data = JSON.parse(text);\n"
        "  var picture = host.querySelector(\"img.al-picture\");\n"
        "  if (picture && data.passes.length) { data.passes[0].svg = picture.getAttribute(\"src\"); }\n"
        "  var values = {data: JSON.stringify(data), step: 0, pass_index: 0, answers: {}};\n"
        "  var model = {get: function (name) { return values[name]; }, set: function (name, value) { values[name] = value; },\n"
        "    save_changes: function () {}, on: function () {}, off: function () {}};\n"
        "  render({model: model, el: host});\n"
        "}\n"
        "var holder = host.querySelector(\"script.al-data\");\n"
        "if (holder.getAttribute(\"data-encoding\") === \"deflate-raw-base64\") {\n"
        "  if (typeof DecompressionStream !== \"function\") { return; }\n"
        "  // a large pass: its steps and cards are stored compressed (the picture, last card and table stay as\n"
        "  // they are until then, and stay if this browser cannot decompress)\n"
        "  var bytes = Uint8Array.from(atob(holder.textContent), function (c) { return c.charCodeAt(0); });\n"
        "  new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream(\"deflate-raw\"))).text()\n"
        "    .then(start, function () {});\n"
        "} else { start(holder.textContent); }\n"
        "})(document.currentScript && document.currentScript.parentNode);\n"
    )


# Data of a pass larger than this is stored compressed (raw deflate, base64): the 250-node pass's 150 KB of
# steps and cards become 25 KB.  Smaller ones stay readable (and searchable) JSON.
COMPRESS_ABOVE = 32_000


def _json_for_html(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def _data_script(data: object) -> str:
    return _data_script_of(_json_for_html(data))


def _data_script_of(text: str) -> str:
    """The data's script from its JSON text (``_json_for_html``)."""
    if len(text) <= COMPRESS_ABOVE:
        return f'<script type="application/json" class="al-data">{text}</script>'
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # deterministic: same bytes on every run (nbval)
    packed = base64.b64encode(packer.compress(text.encode("utf-8")) + packer.flush()).decode("ascii")
    return f'<script type="application/octet-stream" class="al-data" data-encoding="deflate-raw-base64">{packed}</script>'


def fragment_key(views: list[PassView], predict: bool = False) -> str:
    return ("al-p-" if predict else "al-") + "-".join(view.key for view in views)[:32]


# A drawing up to this size also stands in the output as a picture (what shows where scripts do not run);
# a larger one (≈ 150 nodes and more) is stored only inside the compressed data, so a 250-node pass stays
# near 60 KB and a 1,000-node one near 250 KB, and the no-script view says where to see the drawing.
PICTURE_INLINE_LIMIT = 100_000


MIN_TEXT_PX = 10  # the smallest text of a picture shown with scripts off, in CSS px (stepper.js: MIN_TEXT_PX)
PICTURE_HEIGHT = 720  # px: a taller picture scrolls in its box


# readable_width's patterns, compiled with the module (a first picture loads it while Graphviz lays out; compiled at
# the first call they were about 0.7 ms after the layout)
_SVG_HEAD = re.compile(r"<svg\b[^>]*>")
_SVG_WIDTH = re.compile(r"""\bwidth=["']([\d.]+)(pt|px)?["']""")
_SVG_VIEWBOX = re.compile(r"""\bviewBox=["'][-\d.]+[ ,]+[-\d.]+[ ,]+([\d.]+)""")
_SVG_SCALE = re.compile(r"""class=["']graph["'][^>]*transform=["']scale\(([\d.]+)""")
_SVG_FONT_SIZE = re.compile(r"""font-size(?:=["']|:\s*)([\d.]+)""")


def readable_width(svg: str) -> int | None:
    """The width in CSS px at which the drawing's smallest text is ``MIN_TEXT_PX`` (None when the SVG does not say
    its size): from its width (Graphviz writes points), its viewBox, the layout's own scale and its font sizes."""
    head = _SVG_HEAD.search(svg)
    if not head:
        return None
    size = _SVG_WIDTH.search(head.group(0))
    box = _SVG_VIEWBOX.search(head.group(0))
    if not size:
        return None
    width = float(size.group(1)) * (4 / 3 if size.group(2) == "pt" else 1)
    unit = width / float(box.group(1)) if box and float(box.group(1)) > 0 else 1.0  # px per user unit
    scale = _SVG_SCALE.search(svg)
    unit *= float(scale.group(1)) if scale else 1.0
    fonts = [float(f) for f in _SVG_FONT_SIZE.findall(svg) if float(f) > 0]
    if not fonts or width <= 0:
        return None
    return math.ceil(width * MIN_TEXT_PX / (min(fonts) * unit))


def picture_html(uri: str, alt: str, svg: str, kind: str = "al-picture") -> str:
    """The drawing as a picture for where scripts do not run: never shrunk below the width at which its text reads
    (10 px or more; a notebook's style sheet shrinks a wide picture to the output's width), scrolling in its box
    when larger than that.  ``uri`` is the data URI, ``svg`` its text, ``alt`` escaped already; ``kind`` the
    picture's class (``al-picture``: the stepper's script takes it as the pass's drawing)."""
    least = readable_width(svg)
    style = f' style="min-width:{least}px"' if least else ""
    return (f'<div class="al-picturebox" style="overflow:auto;max-height:{PICTURE_HEIGHT}px">'
            f'<img class="{kind}" alt="{alt}" src="{uri.replace("&", "&amp;")}"{style}></div>')


OVERVIEW_BOXES = 150  # a large pass's no-script overview draws at most this many boxes


def overview_svg(backward_pass) -> str | None:
    """A pass too large to stand in the output as a picture, drawn as an overview for where scripts do not run:
    each run of identical module blocks folded into one box ("model.0-49 (x50)"), from the module calls the pass
    recorded (``--modules``) or else from its parameters' names (their class then unknown: "Module").  None when
    nothing folds, when the folded drawing still has more than ``OVERVIEW_BOXES`` boxes, or when it cannot be
    laid out."""
    from .dot import to_dot
    from .fold import fold
    from .groups import groups_from_parameters
    from .render import render_svg
    from .svgslim import slim_svg

    graph = backward_pass.graph
    try:
        groups = backward_pass.groups
        if not groups:
            modules: dict[str, str] = {}
            for node in graph.nodes:
                path = node.label.rpartition(".")[0] if node.kind == "leaf" else ""
                while path:
                    modules.setdefault(path, "Module")
                    path = path.rpartition(".")[0]
            groups = groups_from_parameters(graph, modules) if modules else ()
        folded = fold(graph, groups)
        if not folded.folds or len(folded.graph.nodes) > OVERVIEW_BOXES:
            return None
        return slim_svg(render_svg(to_dot(folded.graph, groups=folded.groups)))
    except Exception:  # no overview (no layout, say): the words below still say where the drawing is
        return None


def stepper_fragment(views: list[PassView], predict: bool = False) -> str:
    """An HTML fragment (for a notebook output) stepping through the given passes.  With ``predict``,
    each step that reveals a gradient first asks the student for it."""
    from .passview import pass_title, stepper_data

    if not views:
        return "<p>No backward pass was recorded.</p>"
    key = fragment_key(views, predict)
    first = views[0]
    inline = len(first.svg) <= PICTURE_INLINE_LIMIT
    data = stepper_data(views, key, predict, first_picture=not inline)  # an inline picture is the <img>
    title = html.escape(pass_title(first.backward_pass))
    if inline:
        picture = picture_html(first.picture, f"the backward pass drawn: {title}", first.svg)
    else:
        functions = sum(1 for node in first.backward_pass.graph.nodes if node.kind == "function")
        overview = overview_svg(first.backward_pass)
        picture = (f'<p class="al-nopicture">The drawing of {title} ({functions:,} backward functions) is stored '
                   "compressed and drawn by the stepper's script, which runs once the notebook is trusted (the "
                   "command Trust Notebook), in nbconvert HTML and in <code>lens.to_html()</code> pages. "
                   + ("Here, an overview: each run of identical blocks drawn as one box. " if overview else "")
                   + "Its last step and the gradients:</p>")
        if overview:
            alt = f"an overview of the backward pass, repeated blocks folded: {title}"
            picture = picture_html(f"data:image/svg+xml,{svg_uri_text(overview)}", alt, overview,
                                   "al-folded-picture") + picture
    if inline:  # the picture is the finished pass: say how to step through it
        picture += ('<p class="al-nopicture">The finished pass, its last step and the gradients. Stepping through it '
                    "needs the stepper's script, which runs once the notebook is trusted (the command Trust Notebook), "
                    "in nbconvert HTML and in <code>lens.to_html()</code> pages.</p>")
    finished = f'{picture}<div class="al-cardbox">{first.cards[-1]}</div><div class="al-tablebox">{first.table}</div>'
    if predict:  # with scripts off nothing can be asked: the finished pass (every answer) waits behind a click
        finished = ('<p class="al-nopredict">Predict mode asks for each gradient before showing it; it needs the '
                    "stepper's script, which runs once the notebook is trusted (the command Trust Notebook), in "
                    "nbconvert HTML and in <code>lens.to_html()</code> pages.</p>"
                    f"<details><summary>Show the finished pass (it holds the answers)</summary>{finished}</details>")
    return (
        f'<div class="autograd-lens al-static" id="{key}">{finished}'
        f"{_data_script(data)}"
        f"<script>{classic_script()}</script>"
        "</div>"
    )


# The standalone page follows the system's light or dark setting.  The stepper's style sheet reads JupyterLab's
# theme variables (with light fallbacks); in dark the page sets them as JupyterLab's dark theme does, so the
# controls, cards and tables turn dark while the drawing keeps its white panel (its colours are made for white).
PAGE_CSS = """\
:root {color-scheme: light dark}
body {margin: 16px; background: #ffffff; color: #111827; font-family: Helvetica, Arial, sans-serif}
@media (prefers-color-scheme: dark) {
  :root {--jp-layout-color0: #111111; --jp-layout-color1: #1f2937; --jp-layout-color2: #374151;
    --jp-ui-font-color1: #f3f4f6; --jp-ui-font-color2: #d1d5db; --jp-border-color1: #9ca3af;
    --jp-border-color2: #4b5563; --jp-warn-color0: #fbbf24}
  body {background: #111111; color: #f3f4f6}
  a {color: #93c5fd}
}
"""


# The --why drawing of a leaf's paths (debug/drawing.py) with the paths table above it: a click on a path's number
# in the table (or on an arrow's label "path 2" / "paths 1, 2") shows that path alone and scrolls it into view.
# With scripts off the numbers stay plain text and the drawing scrolls by hand.
WHY_SCRIPT = """\
(function (script) {
"use strict";
var drawing = script && script.previousElementSibling;
if (!drawing || !drawing.classList || !drawing.classList.contains("al-why-drawing") || drawing.getAttribute("data-ready")) { return; }
drawing.setAttribute("data-ready", "1");
var arrows = {};  // path number -> the arrows it runs along, read from their labels
Array.prototype.forEach.call(drawing.querySelectorAll("g.edge"), function (g) {
  var label = Array.prototype.map.call(g.querySelectorAll("text"), function (t) { return t.textContent; }).join(" ");
  var found = /^paths? ([0-9, ]+)$/.exec(label.trim());
  if (!found) { return; }
  found[1].split(",").forEach(function (n) { n = n.trim(); (arrows[n] = arrows[n] || []).push(g); });
});
var table = drawing.previousElementSibling;
while (table && table.tagName !== "TABLE") { table = table.previousElementSibling; }
var buttons = [];
function choose(number) {
  var same = drawing.getAttribute("data-path") === number;
  number = same ? "" : number;
  drawing.setAttribute("data-path", number);
  var chosen = arrows[number] || [];
  Array.prototype.forEach.call(drawing.querySelectorAll("g.edge"), function (g) {
    g.style.opacity = number && chosen.indexOf(g) < 0 ? "0.25" : "";
  });
  buttons.forEach(function (b) { b.setAttribute("aria-pressed", b.textContent === number ? "true" : "false"); });
  if (!chosen.length) { return; }
  drawing.scrollIntoView({block: "nearest"});
  var port = drawing.getBoundingClientRect();
  var boxes = chosen.map(function (g) { return g.getBoundingClientRect(); });
  var left = Math.min.apply(null, boxes.map(function (b) { return b.left; }));
  var right = Math.max.apply(null, boxes.map(function (b) { return b.right; }));
  var top = Math.min.apply(null, boxes.map(function (b) { return b.top; }));
  var bottom = Math.max.apply(null, boxes.map(function (b) { return b.bottom; }));
  // all of it in view when it fits; else its start, the root's end (where the chain rule starts)
  if (left < port.left || right > port.right) {
    drawing.scrollLeft += right - left <= port.width ? (left + right - port.left - port.right) / 2 : left - port.left - 8;
  }
  if (top < port.top || bottom > port.bottom) {
    drawing.scrollTop += bottom - top <= port.height ? (top + bottom - port.top - port.bottom) / 2 : top - port.top - 8;
  }
}
if (table) {
  Array.prototype.forEach.call(table.querySelectorAll("tr"), function (row) {
    var cell = row.cells[0];
    var number = cell && cell.tagName === "TD" ? cell.textContent.trim() : "";
    if (!arrows[number]) { return; }
    var button = document.createElement("button");
    button.type = "button";
    button.textContent = number;
    button.className = "al-why-path";
    button.setAttribute("aria-pressed", "false");
    button.setAttribute("aria-label", "show path " + number + " alone on the drawing below (again: all paths)");
    button.addEventListener("click", function () { choose(number); });
    cell.textContent = "";
    cell.appendChild(button);
    buttons.push(button);
  });
}
Object.keys(arrows).forEach(function (number) {
  arrows[number].forEach(function (g) {
    g.style.cursor = "pointer";
    g.addEventListener("click", function () {
      var label = Array.prototype.map.call(g.querySelectorAll("text"), function (t) { return t.textContent; }).join(" ");
      var numbers = label.replace(/^paths? /, "").split(",").map(function (n) { return n.trim(); });
      var current = drawing.getAttribute("data-path");
      var at = numbers.indexOf(current);  // each click: the next of its paths, then all of them again
      choose(at === numbers.length - 1 ? current : numbers[at + 1]);
    });
  });
});
})(document.currentScript);
"""


def why_script() -> str:
    """The script that goes right after an ``al-why-drawing`` (see ``WHY_SCRIPT``)."""
    return f"<script>{WHY_SCRIPT}</script>"


def page(body: str, title: str = "autograd_lens") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="color-scheme" content="light dark">'
        f"<title>{html.escape(title)}</title><style>\n{PAGE_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def lens_page(lens, predict: bool = False) -> str:
    """A standalone page for everything a Lens recorded."""
    from .passview import views_for

    views = views_for(lens.passes, predict)
    return page(stepper_fragment(views, predict=predict), title="autograd_lens: backward pass")
