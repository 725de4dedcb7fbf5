"""Graphviz's SVG made small enough to inline in a page, and the text of its ``data:`` URI.

``slim_svg`` is on the path of every first picture (after the layout, before the display bundle), so it does its
work in a few passes over the whole text, each in C (``str`` methods and compiled patterns), and calls Python per
item only where an item needs it (a text whose spaces matter, a rounded box, a distinct number).
"""

from __future__ import annotations

import re

_FONT = ' font-family="Helvetica,Arial,sans-serif"'
# comments and the <title> of every node and edge, each with the line break after it (one pass for both)
_HIDDEN = re.compile(r"<!--.*?-->\n?|<title>[^<]*</title>\n?", re.S)
_TEXT = re.compile(r'<text xml:space="preserve"([^>]*)>([^<]*)</text>')
_NUMBER = re.compile(r"(-?\d+\.\d+)")  # captured: re.split keeps the numbers
_ANY_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GEOMETRY = re.compile(r'( (?:d|points|x|y)=")([^"]*)(")')
_NEGATIVE_ZERO = re.compile(r"(?<=\0)-0(?=\0)")
_ROUNDED_BOX = re.compile(r'<path fill="([^"]+)" stroke="black" d="M([^"]+)"/>')
# what Graphviz repeats on every edge and node, said once in the drawing's own style sheet (scoped to
# its class: inlined in a page, the sheet reaches every SVG there); ids outrank it, so step CSS still wins
# (black strokes are inherited from the drawing's group instead: a sheet would outrank a hook's colour)
_SHEET = ("<style>svg.al-g .edge>path{fill:none;stroke:#4b5563}svg.al-g .edge>polygon{fill:#4b5563;stroke:#4b5563}"
          "svg.al-g text{stroke:none}svg.al-g polyline{fill:none}svg.al-g .edge>text{font-size:10px}</style>")
_REPEATED = ((' fill="none" stroke="#4b5563"', ""), (' fill="#4b5563" stroke="#4b5563"', ""), (' stroke="black"', ""),
             ('<polyline fill="none"', "<polyline"), (' font-size="10.00"', ""))
_CLOSED = re.compile(r' points="(\S+)((?: \S+)+) \1"')  # a polygon closes itself: no need to repeat its first point


_ROUNDED: dict[str, str] = {}  # a drawing repeats its coordinates (ranks, columns): each is rounded once


def _rounded(svg: str) -> str:
    """Coordinates (``d``, ``points``, ``x``, ``y``) to a tenth of a point (Graphviz writes hundredths: nothing
    visible is lost); each distinct number is rounded once, the rest is splitting and joining (no call per number)."""
    parts = _GEOMETRY.split(svg)  # text, ' d="', value, '"', text, ..., text
    if len(parts) == 1:
        return svg
    pieces = _NUMBER.split("\0".join(parts[2::4]))  # every other piece a number (no value holds a NUL)
    numbers = pieces[1::2]
    if len(_ROUNDED) > 200_000:
        _ROUNDED.clear()
    new = list(set(numbers).difference(_ROUNDED))
    if new:
        texts = "\0" + "\0".join(map("{:.1f}".format, map(float, new))) + "\0"
        _ROUNDED.update(zip(new, _NEGATIVE_ZERO.sub("0", texts.replace(".0\0", "\0")).split("\0")[1:-1]))
    pieces[1::2] = map(_ROUNDED.__getitem__, numbers)
    parts[2::4] = "".join(pieces).split("\0")
    return "".join(parts)


def _boxes(svg: str) -> str:
    """Every rounded box (Graphviz draws it as 8 Bézier corners and sides) as the same box in a short path.  The
    boxes share their coordinates (columns, ranks): each distinct number is read once, and each box's list of
    numbers, in its order, is looked up (a loop in C) instead of read again."""
    floats: dict[str, float] = {}

    def box(match: re.Match) -> str:
        texts = _ANY_NUMBER.findall(match.group(2))
        if len(texts) < 31:  # fewer than 16 points
            return match.group(0)
        new = set(texts).difference(floats)
        if new:
            floats.update(zip(new, map(float, new)))
        numbers = list(map(floats.__getitem__, texts))
        return _short_box(match.group(1), numbers[0::2], numbers[1::2])

    return _ROUNDED_BOX.sub(box, svg)


def _short_box(fill: str, xs: list[float], ys: list[float]) -> str:
    left, right, top, bottom = min(xs), max(xs), min(ys), max(ys)
    radius = min(abs(xs[3] - xs[6]), (right - left) / 2, (bottom - top) / 2)
    r = f"{radius:g}"
    corner = f"a{r},{r} 0 0 1"
    width, height = f"{right - left - 2 * radius:.1f}", f"{bottom - top - 2 * radius:.1f}"
    d = (f"M{left + radius:.1f},{top:.1f}h{width}{corner} {r},{r}v{height}{corner} -{r},{r}"
         f"h-{width}{corner} -{r},-{r}v-{height}{corner} {r},-{r}z")
    return f'<path fill="{fill}" d="{d}"/>'


def _text(match: re.Match) -> str:
    attributes, content = match.groups()
    attributes = attributes.replace(' text-anchor="middle"', "").replace(' font-size="11.00"', "")
    if "  " in content or content != content.strip():
        return f'<text xml:space="preserve"{attributes}>{content}</text>'
    return f"<text{attributes}>{content}</text>"


def _closed(match: re.Match) -> str:
    return f' points="{match.group(1)}{match.group(2)}"'


def slim_svg(svg: str) -> str:
    """Graphviz's SVG without what repeats or shows nothing: comments, the ``<title>`` of every node and
    edge (their ids, "n3->n4"), ``&#45;`` for a minus sign, and the font, size and anchor named on every
    text (set once on the drawing, which the texts inherit); ``xml:space`` stays only where spaces need it;
    coordinates to a tenth of a point, rounded boxes as short paths, the colours every edge repeats once."""
    svg = _HIDDEN.sub("", svg).replace("&#45;", "-")
    svg = _TEXT.sub(_text, svg)
    svg = _boxes(svg)
    svg = _rounded(svg)
    for repeated, short in _REPEATED:
        svg = svg.replace(repeated, short)
    svg = _CLOSED.sub(_closed, svg).replace(">\n<", "><")
    defaults = ' text-anchor="middle" font-size="11"'
    svg = svg.replace(_FONT, "").replace(' font-family="Helvetica"', "")  # the drawing says it once, as a list
    svg = svg.replace("<svg ", '<svg class="al-g"' + _FONT + defaults + " ", 1)
    svg = svg.replace('<g id="graph0" class="graph"', '<g id="graph0" class="graph" stroke="black"', 1)
    start = svg.find("<svg")
    end = svg.find(">", start) if start >= 0 else -1
    return svg if end < 0 else svg[:end + 1] + _SHEET + svg[end + 1:]


def svg_uri_text(svg: str) -> str:
    """The SVG as the text of a ``data:image/svg+xml,`` URI, to go in a double-quoted HTML attribute (with
    ``&`` escaped there) or in JSON.  Graphviz writes attribute values in double quotes and escapes quotes
    in text, so single quotes can replace them; ``%``, ``#`` and line breaks are percent-encoded."""
    return svg.replace("%", "%25").replace("#", "%23").replace('"', "'").replace("\n", "%0A")
