"""A large graph from ``graph()`` / ``%lens_graph`` as HTML one can navigate: zoom, pan, fit, find a node by name,
select it to see what is upstream and downstream, the root in view.  It runs the stepper's own module (one step,
no step controls).  Where scripts do not run (an untrusted notebook, GitHub, nbconvert without JS) the output is
the drawing as a picture — folded, so a readable overview — and the boxes as a table.

A folded box ("layers.0-11 (x12)") opens on a click (or Enter / Space): its first block is drawn in full and the
others stay folded ("layers.1-11 (x11)", which opens the next one; a box of two blocks opens both, see
``fold.opened_run``).  Graphviz lays out in the kernel, not in the page, so the drawings with folds opened are laid
out here, in advance, and stored in the page (compressed), which then works offline and without a kernel.  Each
drawing is a *state*, the set of runs drawn in full; from the folded one, breadth first, at most ``VARIANT_LAYOUTS``
states holding at most ``VARIANT_BOXES`` boxes in all (their layout comes before the first picture: one block
rather than twelve keeps it within torchviz's time).  A box whose state is not stored says so when clicked, with the
``expand=`` call that draws it.  Clicking the outline of an opened block (or Enter / Space on it) folds it again,
with the blocks of its run opened after it.
"""

from __future__ import annotations

import hashlib
import html

from ..model import Graph
from .fold import (VARIANT_BOXES, VARIANT_LAYOUTS, Folded, Run, State, expanded, fold_label, fold_states,  # noqa: F401
                   opened_run)
from .fold import _NUMBERED
from .pagecss import base_css
from .render import render_svg
from .static_html import _data_script_of, _json_for_html, classic_script, picture_html
from .svgslim import slim_svg, svg_uri_text


def _short(path: str) -> str:
    """``model.layers.0`` -> ``layers.0``: the path without the model's own name (what ``expand`` matches)."""
    return path.partition(".")[2] or path


def _nested(run: Run, other: Run) -> bool:
    return other == run or all(any(path.startswith(outer + ".") for outer in run) for path in other)


def _folded_again(run: Run, state: State) -> State:
    """The state after folding ``run`` again: without it, the blocks opened after it from the same folded box (the
    opened blocks that follow it without a gap: ``layers.4`` after ``layers.3``; ``layer1.1``-``layer1.2`` after
    ``layer1.0``), and what they hold."""
    gone = [run]
    first = _NUMBERED.match(run[0])
    if len(run) == 1 and first:
        numbered = {}  # the opened blocks of the same container, by number
        for other in state:
            for path in other:
                match = _NUMBERED.match(path)
                if match and match.group(1) == first.group(1):
                    numbered[int(match.group(2))] = other
        number = int(first.group(2)) + 1
        while number in numbered:
            gone.append(numbered[number])
            number += 1
    return tuple(r for r in state if not any(_nested(g, r) for g in gone))


def _how(paths: Run, state: State) -> str:
    """The call that draws the first block of ``paths`` in full (with the opened blocks that hold it)."""
    holders = sorted((p for run in state for p in run if paths[0].startswith(p + ".")), key=len)
    names = [_short(p) for p in holders] + [_short(paths[0])]
    call = f'"{names[0]}"' if len(names) == 1 else "[" + ", ".join(f'"{n}"' for n in names) + "]"
    return (f"autograd_lens.graph(..., expand={call}) or %lens_graph ... "
            + " ".join(f"--expand {n}" for n in names) + " draws that block in full; expand=\"all\" (--expand all) "
            "every block")


def _state_data(index: int, states: list[tuple[State, Folded]], svg: str | None) -> dict:
    """One drawing: its picture (the first is the page's <img>), arrows, roots, what clicks open and close."""
    state, folded = states[index]
    where = {key: number for number, (key, _) in enumerate(states)}
    drawn = folded.graph
    opening, notes, labels = {}, {}, {}
    for box in folded.folds:
        run = opened_run(box.paths)
        target = where.get(tuple(sorted(set(state) | {run})), -1)
        first = next((g.id for g in states[target][1].groups if g.path == box.paths[0]), box.id) if target >= 0 else box.id
        one = len(run) < len(box.paths)  # its first block opens, the others stay folded
        opening[box.id] = [target, first, f"{_short(run[0])} of {box.label}" if one else box.label]
        labels[box.id] = f"{box.label}: {len(box.paths)} blocks of the same structure folded into one box"
        click = (f"Click it (or Enter) to draw {_short(run[0])} in full (the others stay folded). " if one else
                 "Click it (or Enter) to draw them in full. ")
        notes[box.id] = (f"{labels[box.id]}. " + (click if target >= 0 else
                         f"This page stores at most {VARIANT_LAYOUTS} drawings with folds opened "
                         f"({VARIANT_BOXES:,} boxes in all), and not this one. ") + "To draw one in full: "
                         + _how(box.paths, state))
    closing = {}
    for run in state:
        target = where.get(_folded_again(run, state), -1)
        box = next((f for f in states[target][1].folds if run[0] in f.paths), None) if target >= 0 else None
        name = box.label if box else fold_label(run, "") if len(run) > 1 else _short(run[0])
        for group in folded.groups:
            if group.path in run:
                closing[group.id] = [target, box.id if box else "", name]
                labels[group.id] = (f"{group.path}, one of {name} drawn in full: fold them again" if box else
                                    f"{group.path} drawn in full: fold it again")
    return {"svg": svg, "links": [[edge.src, edge.dst, edge.id] for edge in drawn.edges],
            "roots": [node.id for node in drawn.nodes if node.kind == "output"], "notes": notes,
            "open": opening, "close": closing, "labels": labels}


def fold_data(graph: Graph, states: list[tuple[State, Folded]], laid: list | None = None) -> dict | None:
    """What the page needs to open and close folds: every stored state's drawing and transitions.  A layout that
    fails ends the list there (``states`` is cut to what is stored).  ``laid``: the SVG of each state after the
    first (or what its layout raised), laid out already (``display`` starts them early), as a list or as the
    function that waits for each (``render.start_svgs``: each is slimmed while the next is laid out); else laid out
    here."""
    if len(states) == 1 and not states[0][1].folds:
        return None
    svgs: list[str | None] = [None]  # the first drawing is the page's own picture
    for number, (state, _) in enumerate(states[1:]):
        try:
            svg = (render_svg(expanded(graph, state).to_dot()) if laid is None else
                   laid(number) if callable(laid) else laid[number])
            if isinstance(svg, BaseException):
                raise svg
            svgs.append("data:image/svg+xml," + svg_uri_text(slim_svg(svg)))
        except Exception:  # a layout that fails or runs out of time: the page keeps the drawings made so far
            break
    states[len(svgs):] = []
    return {"states": [_state_data(index, states, svg) for index, svg in enumerate(svgs)]}


def page_made(graph: Graph, text: str, table_of, states: list | None = None) -> dict:
    """What :func:`graph_html` writes that needs no drawing: ``display`` makes it while Graphviz lays the drawing out.
    Without folds that is all of the page's data but its key (a hash of the slimmed drawing): its JSON is written
    here, and the key put in front of it after the layout."""
    states = fold_states(graph) if states is None else states
    table = table_of(states[0][1].graph)
    made = {"states": states, "table": table, "script": classic_script()}
    if len(states) == 1 and not states[0][1].folds:  # (fold_data: None)
        made["json"] = _json_for_html(_page_data(text, table, _state_data(0, states, None), None))
    return made


def _page_data(text: str, table: str, first: dict, folds: dict | None) -> dict:
    """The page's data after its key."""
    data = {
        "predict": False,
        "css": base_css("{scope}"),
        "passes": [{
            "title": text,
            "svg": None,  # the <img> below holds it
            "steps": [{"node": None, "edges": [], "grads": [], "done": []}],
            "cards": [""],
            "table": f"<details><summary>the boxes as a table</summary>{table}</details>",
            "links": first["links"],
            "roots": first["roots"],
            # shown when a folded box is selected: what it holds, how to open it
            "notes": first["notes"],
        }],
    }
    if folds:
        data["passes"][0]["folds"] = folds
    return data


def graph_html(graph: Graph, svg: str, text: str, table_of, states: list | None = None, laid=None,
               made: dict | None = None) -> str:
    """The navigator for ``graph`` drawn as ``svg`` (its SVG from ``to_dot``), titled ``text``, with
    ``table_of(drawn graph)`` as its table: deterministic bytes.  ``states`` (``fold_states(graph)``) and ``laid``
    (the function that waits for their layouts, from ``render.start_svgs``) when the caller started them early;
    ``made``: :func:`page_made`'s, when the caller made it during the layout."""
    made = page_made(graph, text, table_of, states) if made is None else made
    states, table = made["states"], made["table"]
    slim = slim_svg(svg)
    key = "al-g-" + hashlib.sha1(slim.encode("utf-8")).hexdigest()[:10]
    if "json" in made:  # {"key": key, ...the rest}, as json.dumps writes that dict
        data = _data_script_of('{"key":' + _json_for_html(key) + "," + made["json"][1:])
    else:
        folds = fold_data(graph, states, laid)
        first = folds["states"][0] if folds else _state_data(0, states, None)
        data = _data_script_of(_json_for_html({"key": key, **_page_data(text, table, first, folds)}))
    alt = html.escape(text, quote=True)
    picture = picture_html(f"data:image/svg+xml,{svg_uri_text(slim)}", alt, slim)
    return (f'<div class="autograd-lens al-static al-graph" id="{key}">{picture}'
            f'<details><summary>the boxes as a table</summary>{table}</details>'
            f"{data}<script>{made['script']}</script></div>")
