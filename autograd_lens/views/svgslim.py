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
# captured: re.split keeps the numbers.  Possessive (Python 3.11+): a run of digits with no point after it fails at
# once instead of being tried again one digit shorter at each length (the same matches: a shorter run is followed
# by a digit, never by the point): mlp-50's 90 KB of coordinates split in 1.48 instead of 1.76 ms (thread time)
_NUMBER = re.compile(r"(-?+\d++\.\d++)")
_ANY_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GEOMETRY = re.compile(r'( (?:d|points|x|y)=")([^"]*)(")')
_NEGATIVE_ZERO = re.compile(r"(?<=\0)-0(?=\0)")
_ROUNDED_BOX = re.compile(r'<path fill="([^"]+)" stroke="black" d="M([^"]+)"/>')
_BOX_CHARACTERS = str.maketrans("", "", "0123456789.-, C\n")  # deleted: what the rounded boxes' paths hold
# what Graphviz repeats on every edge and node, said once in the drawing's own style sheet (scoped to
# its class: inlined in a page, the sheet reaches every SVG there); ids outrank it, so step CSS still wins
# (black strokes are inherited from the drawing's group instead: a sheet would outrank a hook's colour)
_SHEET = ("<style>svg.al-g .edge>path{fill:none;stroke:#4b5563}svg.al-g .edge>polygon{fill:#4b5563;stroke:#4b5563}"
          "svg.al-g text{stroke:none}svg.al-g polyline{fill:none}svg.al-g .edge>text{font-size:10px}</style>")
_REPEATED = ((' fill="none" stroke="#4b5563"', ""), (' fill="#4b5563" stroke="#4b5563"', ""), (' stroke="black"', ""),
             ('<polyline fill="none"', "<polyline"), (' font-size="10.00"', ""))


_GRAPH = '<g id="graph0" class="graph"'
_ROUNDED: dict[str, str] = {}  # a drawing repeats its coordinates (ranks, columns): each is rounded once
_ASCII_NUMBER = re.compile(r"(-?+[0-9]++\.[0-9]++)")  # _NUMBER where every digit is ASCII (faster)


def _rounded(svg: str) -> str:
    """Coordinates (``d``, ``points``, ``x``, ``y``) to a tenth of a point (Graphviz writes hundredths: nothing
    visible is lost), and each polygon without the repeated first point at its end (it closes itself).  Each
    distinct number is rounded once: one with a single decimal stays as it is, one whose second (last) decimal is
    below 5 is cut, the others are read and written as floats (no call per number: splitting, joining, lookups)."""
    parts = _GEOMETRY.split(svg)  # text, ' d="', value, '"', text, ..., text
    if len(parts) == 1:
        return svg
    values = "\0".join(parts[2::4])  # no value holds a NUL
    plain = values.isascii()
    pieces = (_ASCII_NUMBER if plain else _NUMBER).split(values)  # every other piece a number
    numbers = pieces[1::2]
    if len(_ROUNDED) > 200_000:
        _ROUNDED.clear()
    same, cut, read = [], [], []
    for number in set(numbers).difference(_ROUNDED):
        if len(number) > 15 or not plain:  # past what a float holds exactly, or digits of another script: read
            read.append(number)
        elif number[-2] == ".":
            (read if number[-1] == "0" else same).append(number)  # "x.0" (Graphviz writes none) becomes "x"
        elif number[-3] == "." and number[-1] < "5":
            cut.append(number)  # what "{:.1f}" makes of it, with 2 decimals and 5 below the rounding boundary
        else:
            read.append(number)
    _ROUNDED.update(zip(same, same))
    if read or cut:
        texts = "\0" + "\0".join([*map("{:.1f}".format, map(float, read)), *(number[:-1] for number in cut)]) + "\0"
        _ROUNDED.update(zip(read + cut, _NEGATIVE_ZERO.sub("0", texts.replace(".0\0", "\0")).split("\0")[1:-1]))
    pieces[1::2] = map(_ROUNDED.__getitem__, numbers)
    parts[2::4] = "".join(pieces).split("\0")
    for index in range(1, len(parts), 4):  # ' points="A B ... A"' -> ' points="A B ..."' (space-separated, 3 or more)
        if parts[index] == ' points="':
            points = parts[index + 1]
            listed = points.split()
            if len(listed) > 2 and listed[0] == listed[-1] and listed == points.split(" "):
                parts[index + 1] = points[:-len(listed[-1]) - 1]
    return "".join(parts)


def _boxes(svg: str) -> str:
    """Every rounded box (Graphviz draws it as 8 Bézier corners and sides) as the same box in a short path.  The
    numbers of all the boxes are cut apart at once, with ``str`` methods (where each is a plain number, as Graphviz
    writes them; else found by a pattern), and each distinct one is read once."""
    parts = _ROUNDED_BOX.split(svg)  # text, fill, path after its "M", text, ...
    if len(parts) == 1:
        return svg
    fills, paths = parts[1::3], parts[2::3]
    rows, floats = _box_numbers(paths)
    tails: dict[tuple[float, float, float], str] = {}  # boxes of one size differ only in where they start
    for index, (fill, path, texts) in enumerate(zip(fills, paths, rows)):
        if len(texts) < 31:  # fewer than 16 points
            parts[3 * index + 1] = f'<path fill="{fill}" stroke="black" d="M{path}"/>'
            continue
        numbers = list(map(floats.__getitem__, texts))
        xs, ys = numbers[0::2], numbers[1::2]
        left, top = min(xs), min(ys)
        across, down = max(xs) - left, max(ys) - top
        radius = min(abs(xs[3] - xs[6]), across / 2, down / 2)
        tail = tails.get((across, down, radius))
        if tail is None:
            tail = tails[(across, down, radius)] = _box_tail(across, down, radius)
        parts[3 * index + 1] = f'<path fill="{fill}" d="M{left + radius:.1f},{top:.1f}{tail}"/>'
    parts[2::3] = [""] * len(paths)
    return "".join(parts)


def _box_numbers(paths: list[str]) -> tuple[list[list[str]], dict[str, float]]:
    """The numbers of each path, as ``_ANY_NUMBER.findall`` gives them, and each distinct one read.  Where the paths
    hold only digits, points, minus signs and the separators Graphviz writes (", ", "C"), they are cut apart with
    ``str`` methods, and each run checked to be one number."""
    joined = "\n".join(paths)
    if joined.isascii() and joined.count("\n") == len(paths) - 1 and not joined.translate(_BOX_CHARACTERS):
        rows = [row.split() for row in joined.replace("C", " ").replace(",", " ").split("\n")]
        distinct = set().union(*rows)
        listed = "\n" + "\n".join(distinct) + "\n"
        if "\n." not in listed and "-." not in listed and ".\n" not in listed:  # no ".5", "-.5", "5." (float reads them)
            try:
                return rows, dict(zip(distinct, map(float, distinct)))
            except ValueError:  # "1-2", "1.2.3", "-": not one number each
                pass
    rows = [_ANY_NUMBER.findall(path) for path in paths]
    distinct = set().union(*rows)
    return rows, dict(zip(distinct, map(float, distinct)))


def _short_box(fill: str, xs: list[float], ys: list[float]) -> str:
    left, right, top, bottom = min(xs), max(xs), min(ys), max(ys)
    radius = min(abs(xs[3] - xs[6]), (right - left) / 2, (bottom - top) / 2)
    return f'<path fill="{fill}" d="M{left + radius:.1f},{top:.1f}{_box_tail(right - left, bottom - top, radius)}"/>'


def _box_tail(across: float, down: float, radius: float) -> str:
    """A short box's path after its start: the same for every box of this size (``_boxes`` writes it once)."""
    r = f"{radius:g}"
    corner = f"a{r},{r} 0 0 1"
    width, height = f"{across - 2 * radius:.1f}", f"{down - 2 * radius:.1f}"
    return (f"h{width}{corner} {r},{r}v{height}{corner} -{r},{r}"
            f"h-{width}{corner} -{r},-{r}v-{height}{corner} {r},-{r}z")


def _text(match: re.Match) -> str:
    attributes, content = match.groups()
    attributes = attributes.replace(' text-anchor="middle"', "").replace(' font-size="11.00"', "")
    if "  " in content or content != content.strip():
        return f'<text xml:space="preserve"{attributes}>{content}</text>'
    return f"<text{attributes}>{content}</text>"


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
    svg = svg.replace(">\n<", "><")
    defaults = ' text-anchor="middle" font-size="11"'
    svg = svg.replace(_FONT, "").replace(' font-family="Helvetica"', "")  # the drawing says it once, as a list
    opening = '<svg class="al-g"' + _FONT + defaults + " "
    if svg.startswith("<svg "):  # as Graphviz writes it: the three changes below in one copy of the text
        end, graph = svg.find(">"), svg.find(_GRAPH)
        if 0 < end < graph:
            return "".join((opening, svg[5:end + 1], _SHEET, svg[end + 1:graph], _GRAPH, ' stroke="black"',
                            svg[graph + len(_GRAPH):]))
    svg = svg.replace("<svg ", opening, 1)
    svg = svg.replace(_GRAPH, _GRAPH + ' stroke="black"', 1)
    start = svg.find("<svg")
    end = svg.find(">", start) if start >= 0 else -1
    return svg if end < 0 else svg[:end + 1] + _SHEET + svg[end + 1:]


def svg_uri_text(svg: str) -> str:
    """The SVG as the text of a ``data:image/svg+xml,`` URI, to go in a double-quoted HTML attribute (with
    ``&`` escaped there) or in JSON.  Graphviz writes attribute values in double quotes and escapes quotes
    in text, so single quotes can replace them; ``%``, ``#`` and line breaks are percent-encoded."""
    return svg.replace("%", "%25").replace("#", "%23").replace('"', "'").replace("\n", "%0A")
