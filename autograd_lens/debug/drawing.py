"""The paths to one leaf on the pass's drawing, for ``%%lens --why NAME`` / ``lens.why(NAME)``.

The pass is drawn as the stepper draws it (cuts and the NaN origin marked), with each arrow a shown path runs
along in purple, labelled with the numbers of those paths (the rows of the paths table), thicker for larger
paths.  The same ids and the same bytes on every run.
"""

from __future__ import annotations

import html
import re
from typing import Any

WIDTHS = ("3.5", "3", "2.5", "2")  # the largest path's arrows thickest


def paths_pass(passes: list, name: str) -> tuple[Any, Any]:
    """(the last pass with known paths to ``name``, its PathSet), or (None, None)."""
    for backward_pass in reversed(passes):
        if backward_pass.inputs and name not in backward_pass.inputs:  # no gradient computed for it there
            continue
        found = getattr(getattr(backward_pass, "debug", None), "paths", None) or {}
        path_set = found.get(name)
        if path_set is not None and path_set.known and path_set.paths:
            return backward_pass, path_set
    return None, None


def paths_dot(backward_pass: Any, path_set: Any) -> tuple[str, dict[str, str]] | None:
    """(DOT text of the pass with the paths to one leaf highlighted, tooltips by element id), or None when no
    path can be placed on the drawing."""
    from ..views.dot import to_dot
    from ..views.gradsize import grad_norm
    from ..views.marks import PATH_COLOR, marks_for, path_edges

    graph = backward_pass.graph
    placed = [(number, path, path_edges(graph, path)) for number, path in enumerate(path_set.paths, 1)]
    placed = [(number, path, edges) for number, path, edges in placed if edges]
    if not placed:
        return None
    sizes = sorted(((-(grad_norm(path.contribution) or 0.0), number) for number, path, _ in placed))
    rank = {number: index for index, (_, number) in enumerate(sizes)}
    numbers: dict[str, list[int]] = {}
    width: dict[str, int] = {}
    for number, path, edges in placed:
        for edge in edges:
            numbers.setdefault(edge, []).append(number)
            width[edge] = min(width.get(edge, len(WIDTHS) - 1), rank[number])
    marks = marks_for(backward_pass)
    labels = {}
    for edge, used in numbers.items():
        marks.edges[edge] = {"color": PATH_COLOR, "penwidth": WIDTHS[min(width[edge], len(WIDTHS) - 1)],
                             "fontcolor": PATH_COLOR, "arrowsize": "0.7"}
        labels[edge] = ("path " if len(used) == 1 else "paths ") + ", ".join(str(number) for number in used)
        marks.titles[edge] = "\n".join(path.text() for number, path, _ in placed if number in used)
    from ..views.passview import PassView

    after = PassView(backward_pass).final.grads  # each leaf's .grad as the pass left it
    return to_dot(graph, edge_labels=labels, grad_texts=after, groups=backward_pass.groups, marks=marks), marks.titles


def paths_drawing(passes: list, name: str) -> str:
    """HTML: the drawing of the paths to ``name`` (empty when there is none to draw; never raises)."""
    try:
        backward_pass, path_set = paths_pass(passes, name)
        if backward_pass is None:
            return ""
        made = paths_dot(backward_pass, path_set)
        if made is None:
            return "<p>The paths run through boxes the drawing does not show one by one; they are not drawn.</p>"
        dot, titles = made
        from ..views.marks import edge_colours
        from ..views.passview import slim_svg
        from ..views.render import render_svg
        from ..views.static_html import why_script

        svg = with_titles(edge_colours(slim_svg(render_svg(dot))), titles)
    except Exception as problem:  # a display never raises
        return f"<p>The paths could not be drawn ({html.escape(type(problem).__name__)}).</p>"
    return (f"<p><b>The paths on the drawing</b> (pass {backward_pass.index + 1}; arrows labelled with the "
            "numbers of the paths above, thicker for larger paths)</p>"
            f'<div class="al-why-drawing" style="overflow:auto; max-height:640px; background:#ffffff; '
            f'border-radius:4px">{svg}</div>{why_script()}')


def with_titles(svg: str, titles: dict[str, str]) -> str:
    """Each marked element of the SVG with its tooltip (a ``<title>``, which a browser shows on hover)."""
    def add(match: re.Match) -> str:
        text = titles.get(match.group(1))
        return match.group(0) if text is None else f"{match.group(0)}<title>{html.escape(text, quote=False)}</title>"

    return re.sub(r'<g id="([^"]+)" class="(?:node|edge)">', add, svg)
