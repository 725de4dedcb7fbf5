"""A large graph from ``graph()`` / ``%lens_graph`` as HTML one can navigate: zoom, pan, fit, find a node by name,
select it to see what is upstream and downstream, the root in view.  It runs the stepper's own module (one step,
no step controls).  Where scripts do not run (an untrusted notebook, GitHub, nbconvert without JS) the output is
the drawing as a picture — folded, so a readable overview — and the boxes as a table.
"""

from __future__ import annotations

import hashlib
import html

from ..model import Graph
from .fold import plan
from .passview import base_css, slim_svg, svg_uri_text
from .static_html import _data_script, classic_script


def _short(path: str) -> str:
    """``model.layers.0`` -> ``layers.0`` (what ``expand`` matches)."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 else path


def graph_html(graph: Graph, svg: str, text: str, table_of) -> str:
    """The navigator for ``graph`` drawn as ``svg`` (its SVG from ``to_dot``), titled ``text``, with
    ``table_of(drawn graph)`` as its table: deterministic bytes."""
    folded = plan(graph)
    drawn = folded.graph
    slim = slim_svg(svg)
    key = "al-g-" + hashlib.sha1(slim.encode("utf-8")).hexdigest()[:10]
    table = table_of(drawn)
    data = {
        "key": key,
        "predict": False,
        "css": base_css("{scope}"),
        "passes": [{
            "title": text,
            "svg": None,  # the <img> below holds it
            "steps": [{"node": None, "edges": [], "grads": [], "done": []}],
            "cards": [""],
            "table": f"<details><summary>the boxes as a table</summary>{table}</details>",
            "links": [[edge.src, edge.dst, edge.id] for edge in drawn.edges],
            "roots": [node.id for node in drawn.nodes if node.kind == "output"],
            # shown when a folded box is selected: how to draw one of its blocks in full
            "notes": {fold.id: f"{fold.label}: {len(fold.paths)} blocks of the same structure drawn as one box. "
                      f"To draw one in full: autograd_lens.graph(..., expand=\"{_short(fold.paths[0])}\") or "
                      f"%lens_graph ... --expand {_short(fold.paths[0])}" for fold in folded.folds},
        }],
    }
    alt = html.escape(text, quote=True)
    picture = (f'<img class="al-picture" alt="{alt}" '
               f'src="data:image/svg+xml,{svg_uri_text(slim).replace("&", "&amp;")}">')
    return (f'<div class="autograd-lens al-static al-graph" id="{key}">{picture}'
            f'<details><summary>the boxes as a table</summary>{table}</details>'
            f"{_data_script(data)}<script>{classic_script()}</script></div>")
