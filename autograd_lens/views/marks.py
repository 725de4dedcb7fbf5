"""The debugging answers marked on a pass's drawing (issue 23): where a gradient stopped, where NaN or inf
started, and which paths a leaf's gradient took.

* A **cut**: for a named tensor that got no gradient, where the record places the break (``Reason.at``).  A
  tensor off the graph is drawn as a dashed red box (``✂ w``) with a dashed red arrow into each function that
  used its cut copy (the ``.detach()``, ``no_grad`` or ``argmax`` result); a leaf left out by
  ``backward(inputs=...)`` and a node whose hook returned zeros get a dashed red outline and a ``✂`` line.  A
  tensor the record does not place (not on any path, a frozen parameter, unknown) gets no mark.
* The **NaN/inf origin** (``first_nonfinite``, and the first forward call that made one): a thick fuchsia
  outline, a pale fill and the line "NaN starts here".
* **Paths** to a leaf (``lens.paths_to``): the arrows each path runs along, for the stepper's path highlight
  and the ``%%lens --why`` drawing.

Marks carry their full reason as a tooltip (``titles``: element id -> text) that the stepper shows on hover.
Colours are readable on the drawing's white background in light and dark notebook themes alike (the drawing
keeps a white canvas in both), and the dashes and outline widths say it without colour too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..model import BackwardPass, Graph

CUT_COLOR = "#dc2626"
CUT_TEXT = "#991b1b"
NAN_COLOR = "#c026d3"
NAN_FILL = "#fae8ff"
PATH_COLOR = "#7c3aed"
SHORT = {
    "detached": "detached",
    "no_grad": "computed under no_grad",
    "inference_mode": "computed under inference_mode",
    "requires_grad_false": "requires_grad was False",
    "non_differentiable": "a non-differentiable op",
    "excluded": "excluded by inputs=",
    "hook_zeros": "a hook returned zeros",
}


@dataclass(frozen=True)
class NodeMark:
    lines: tuple[str, ...]  # added to the box's text
    attributes: dict  # DOT attributes that win over the box's own (colour, width, fill)
    dashed: bool = False


@dataclass
class Marks:
    nodes: dict[str, NodeMark] = field(default_factory=dict)
    edges: dict[str, dict] = field(default_factory=dict)  # edge id -> DOT attributes
    extra_nodes: list[tuple[str, dict]] = field(default_factory=list)  # (id, DOT attributes with "label")
    extra_edges: list[tuple[str, str, dict]] = field(default_factory=list)  # (src, dst, DOT attributes with "id")
    titles: dict[str, str] = field(default_factory=dict)  # SVG element id -> tooltip

    def __bool__(self) -> bool:
        return bool(self.nodes or self.edges or self.extra_nodes)


def marks_for(backward_pass: BackwardPass) -> Marks:
    """The cuts and the NaN/inf origin of one pass (never raises: a failure marks nothing)."""
    marks = Marks()
    try:
        _cuts(backward_pass, marks)
    except Exception:
        marks = Marks()
    try:
        _nonfinite(backward_pass, marks)
    except Exception:
        pass
    return marks


def _cuts(backward_pass: BackwardPass, marks: Marks) -> None:
    graph = backward_pass.graph
    ids = {node.id for node in graph.nodes}
    on_node: dict[str, list[Any]] = {}  # a drawn node marked for several tensors: one mark naming them all
    for reason in backward_pass.unreached.values():
        at = tuple(getattr(reason, "at", ()) or ())
        if not at or reason.code not in SHORT or any(node_id not in ids for node_id in at):
            continue
        if reason.code in ("excluded", "hook_zeros"):
            for node_id in at:
                on_node.setdefault(node_id, []).append(reason)
            continue
        ghost = f"cut{len(marks.extra_nodes) + 1}"
        marks.extra_nodes.append((ghost, {
            "label": f"✂ {reason.name}\nno gradient:\n{SHORT[reason.code]}", "shape": "box",
            "style": "dashed,filled", "fillcolor": "#ffffff", "color": CUT_COLOR, "fontcolor": CUT_TEXT,
            "penwidth": "2"}))
        marks.titles[ghost] = str(reason)
        for number, node_id in enumerate(at, 1):
            edge_id = f"{ghost}e{number}"
            marks.extra_edges.append((ghost, node_id, {"id": edge_id, "style": "dashed", "color": CUT_COLOR,
                                                       "penwidth": "2", "arrowhead": "tee"}))
            marks.titles[edge_id] = str(reason)
    for node_id in sorted(on_node, key=_order(graph)):
        reasons = on_node[node_id]
        codes = sorted({reason.code for reason in reasons})
        names = ", ".join(reason.name for reason in reasons)
        lines = tuple(f"✂ {SHORT[code]}" + (f" ({names})" if code == "hook_zeros" else "") for code in codes)
        marks.nodes[node_id] = NodeMark(lines, {"color": CUT_COLOR, "penwidth": "2.5"}, dashed=True)
        marks.titles[node_id] = "\n".join(str(reason) for reason in reasons)
        if "excluded" in codes:  # its arrows carry nothing to it in this pass
            for edge in graph.edges_from(node_id):
                if edge.kind == "data":
                    marks.edges[edge.id] = {"color": CUT_COLOR, "style": "dashed", "penwidth": "2"}
                    marks.titles[edge.id] = marks.titles[node_id]


def _order(graph: Graph):
    position = {node.id: index for index, node in enumerate(graph.nodes)}
    return lambda node_id: position.get(node_id, len(position))


def nonfinite_word(outputs: str) -> str:
    """"NaN", "inf" or "NaN/inf", from a summary of the non-finite values."""
    text = outputs.lower()
    return "NaN" if "nan" in text else "inf" if "inf" in text else "NaN/inf"


def _nonfinite(backward_pass: BackwardPass, marks: Marks) -> None:
    graph = backward_pass.graph
    ids = {node.id for node in graph.nodes}
    origin = backward_pass.first_nonfinite
    if origin is not None and origin.kind in ("node", "hook", "seed"):
        node_id = origin.node
        if origin.kind == "seed":  # the gradient given to backward(): its root, when there is exactly one
            roots = [node.id for node in graph.nodes if node.kind == "output"]
            node_id = roots[0] if len(roots) == 1 else None
        if node_id in ids:
            word = nonfinite_word(origin.outputs)
            line = f"{word} starts here" if not origin.note else f"{word} first seen here"
            if origin.kind == "hook":
                line += f" (hook {origin.name})"
            elif origin.kind == "seed":
                line += " (gradient=)"
            _nan_mark(marks, node_id, line, origin.text())
    found = getattr(getattr(backward_pass, "debug", None), "forward_nonfinite", None)
    if found is not None and found.node is not None:
        nodes = [node.id for node in graph.nodes
                 if node.kind == "function" and (node.sequence_nr, node.op) == tuple(found.node)]
        if len(nodes) == 1:
            _nan_mark(marks, nodes[0], f"forward {nonfinite_word(found.output)} starts here", found.text())


def _nan_mark(marks: Marks, node_id: str, line: str, title: str) -> None:
    old = marks.nodes.get(node_id)
    lines = (old.lines if old else ()) + (f"⚠ {line}",)
    marks.nodes[node_id] = NodeMark(lines, {"color": NAN_COLOR, "penwidth": "4", "fillcolor": NAN_FILL},
                                    dashed=old.dashed if old else False)
    marks.titles[node_id] = "\n".join(filter(None, (marks.titles.get(node_id), title)))


# ----------------------------------------------------------------------------- paths

def path_edges(graph: Graph, path: Any) -> tuple[str, ...] | None:
    """The arrows ``path`` (a :class:`~autograd_lens.debug.Path`) runs along, from the root to the leaf, or None
    where the drawing does not show every one of them exactly once (a node left out, two boxes alike)."""
    hops = getattr(path, "hops", ())
    if not hops or getattr(path, "rest", 0):
        return None
    functions: dict[tuple, list[str]] = {}
    for node in graph.nodes:
        if node.kind == "function":
            functions.setdefault((node.sequence_nr, node.op), []).append(node.id)

    def node_of(key: tuple) -> str | None:
        found = functions.get(tuple(key[:2]), [])
        return found[0] if len(found) == 1 else None

    (root_key, _), steps = hops[0], hops[1:]
    root = node_of(root_key)
    if root is None:
        return None
    edges: list[str] = []
    outputs = [edge for edge in graph.edges_from(root) if graph.node(edge.dst).kind == "output"]
    if len(outputs) == 1:
        edges.append(outputs[0].id)
    for user_key, used, use in steps:
        user = node_of(user_key)
        if user is None:
            return None
        incoming = [edge for edge in graph.edges_into(user) if edge.kind == "data"]
        if isinstance(used, str):  # a leaf, by its label (a leaf drawn once per use: each copy has it)
            candidates = [edge for edge in incoming if graph.node(edge.src).kind in ("leaf", "output")
                          and graph.node(edge.src).label == used]
        else:
            source = node_of(used)
            if source is None:
                return None
            made = {source} | {edge.dst for edge in graph.edges_from(source) if graph.node(edge.dst).is_tensor}
            candidates = [edge for edge in incoming if edge.src in made]
            if len({edge.src for edge in candidates}) > 1:  # two outputs of one function used here: not told apart
                return None
        if use >= len(candidates):
            return None
        edges.append(candidates[use].id)
        if not isinstance(used, str) and candidates[use].src != source:  # through the box of the tensor it made
            edges.extend(edge.id for edge in graph.edges_into(candidates[use].src) if edge.src == source)
    return tuple(edges)


def paths_data(backward_pass: BackwardPass) -> list[dict]:
    """For the stepper's path highlight: each leaf with known paths, each shown path's text and arrows (a path
    the drawing cannot place is listed without arrows), and, when the pass's hooks changed what the leaf received,
    the line that says so (``hooks``: the paths add up to its gradient without hooks)."""
    try:
        found = getattr(getattr(backward_pass, "debug", None), "paths", None) or {}
        if found:
            from ..debug import with_hooks  # (only for a pass recorded with why=True: the debug package is loaded)
        result = []
        for name in sorted(found):
            path_set = found[name]
            if not getattr(path_set, "known", False) or not path_set.paths:
                continue
            if backward_pass.inputs and name not in backward_pass.inputs:  # left out by backward(inputs=...)
                continue
            path_set = with_hooks(path_set, backward_pass, name)  # says so when hooks changed what it received
            entry = {"name": name, "count": path_set.count,
                     "paths": [{"text": path.text(), "edges": list(path_edges(backward_pass.graph, path) or ()),
                                "rest": path.rest} for path in path_set.paths]}
            if path_set.hooks:  # the paths are the chain rule without hooks: what the hooks made of it
                entry["hooks"] = path_set.hooks
            result.append(entry)
        return result
    except Exception:
        return []


def marks_data(backward_pass: BackwardPass) -> dict:
    """What the stepper adds for the marks: ``marktitles`` (tooltips) and ``paths`` (see :func:`paths_data`);
    nothing for a pass without either, so its data stays as it was."""
    data: dict = {}
    titles = marks_for(backward_pass).titles
    if titles:
        data["marktitles"] = dict(sorted(titles.items()))
    paths = paths_data(backward_pass)
    if paths:
        data["paths"] = paths
    return data


_EDGE_GROUP = re.compile(r'(<g id="[^"]+" class="edge">)(.*?)(</g>)', re.S)
_PAINT = re.compile(r'<(path|polygon)((?: [a-z-]+="[^"]*")*?) (fill|stroke)="([^"]*)"(?: (fill|stroke)="([^"]*)")?')


def edge_colours(svg: str) -> str:
    """An arrow's own colour (a mark's) as a style, which the drawing's sheet (``.edge>path{stroke:…}``, for the
    arrows that keep Graphviz's default) cannot outrank; every other arrow is left byte for byte as it was."""
    def paint(match: re.Match) -> str:
        styles = [f"{match.group(3)}:{match.group(4)}"] + ([f"{match.group(5)}:{match.group(6)}"] if match.group(5) else [])
        return f'<{match.group(1)}{match.group(2)} style="{";".join(styles)}"'

    def group(match: re.Match) -> str:
        body = match.group(2)
        if ' stroke="' not in body and ' fill="' not in body:
            return match.group(0)
        return match.group(1) + _PAINT.sub(paint, body) + match.group(3)

    return _EDGE_GROUP.sub(group, svg)
