"""One backward pass, laid out once, ready to step through.

The drawing is rendered a single time per pass, with every arrow already
carrying the label of the gradient it will carry and every leaf's final
``.grad`` (so nothing moves between steps).  What a step shows is then only
a small CSS block: which labels are visible, which node is current, which
are done, and which of a leaf's two ``grad`` texts (before / after) shows.
Both the live widget (Python) and the static page (``stepper.js``) produce
that same CSS from the same steps.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property

from ..format import format_value
from ..model import BackwardPass
from .dot import to_dot
from .marks import edge_colours, marks_data, marks_for
from .render import render_svg
from .pagecss import BASE_CSS, base_css  # noqa: F401 (moved there: the graph's page needs no steps)
from .svgslim import slim_svg, svg_uri_text  # noqa: F401 (svg_uri_text: imported from here by other views)
from .steps import (Frame, Step, card_html, frame, grads_table_html, hook_totals, question_html, question_rule,
                    steps_for)

CURRENT_COLOR = "#2563eb"
DONE_COLOR = "#16a34a"


def pass_title(backward_pass: BackwardPass) -> str:
    what = "backward()" if backward_pass.kind == "backward" else "autograd.grad()"
    roots = ", ".join(backward_pass.roots)
    return f"pass {backward_pass.index + 1}: {what} of {roots}"


@dataclass
class PassView:
    backward_pass: BackwardPass
    totals: dict | None = None  # hook call counts over the whole recording (see steps.hook_totals)
    marks: bool = True  # the debugging marks (off in predict mode: "⚠ inf starts here" or a path's share would tell)

    @cached_property
    def steps(self) -> list[Step]:
        return steps_for(self.backward_pass, self.totals)

    @cached_property
    def cards(self) -> list[str]:
        return [card_html(step, len(self.steps)) for step in self.steps]

    @cached_property
    def table(self) -> str:
        return grads_table_html(self.backward_pass)

    @cached_property
    def final(self) -> Frame:
        return frame(self.steps, len(self.steps) - 1)

    @cached_property
    def grad_variants(self) -> dict[str, list[str]]:
        """Every text a leaf's grad field takes during the pass, in order (what .grad held at each step)."""
        variants: dict[str, list[str]] = {}
        for step in self.steps:
            for node, text in step.grads:
                if text not in variants.setdefault(node, []):
                    variants[node].append(text)
        return variants

    @cached_property
    def dot(self) -> str:
        """Laid out with every label at its final text (a grad field at its longest), so steps never move
        anything."""
        graph = self.backward_pass.graph
        widest = {node: max(texts, key=len) for node, texts in self.grad_variants.items()}
        return to_dot(graph, edge_labels=self.final.edge_labels, grad_texts=widest, groups=self.backward_pass.groups,
                      marks=marks_for(self.backward_pass) if self.marks else None)

    @cached_property
    def svg(self) -> str:
        return edge_colours(slim_svg(prepare_svg(render_svg(self.dot), self.backward_pass, self.final, self.grad_variants)))

    @cached_property
    def key(self) -> str:
        """A short id from the content: the same pass gives the same id on every run."""
        digest = hashlib.sha1()
        digest.update(self.dot.encode())
        digest.update(json.dumps([(s.title, s.lines) for s in self.steps]).encode())
        return digest.hexdigest()[:10]

    @cached_property
    def picture(self) -> str:
        """The drawing as a data URI: an <img> shows the finished pass with scripts off; the stepper
        decodes it and inlines the SVG.  Percent-encoded only where a URI or an HTML attribute needs it
        (base64 would add a third)."""
        return "data:image/svg+xml," + svg_uri_text(self.svg)

    def data(self, predict: bool = False, picture: bool = True) -> dict:
        """What the front-end module needs: the steps (order encoded once), the cards, the table, the
        drawing (``picture=False``: it is stored elsewhere); with ``predict``, each question (card,
        autograd's answer and how the card prints it)."""
        data = {
            "title": pass_title(self.backward_pass),
            "svg": self.picture if picture else None,
            "steps": [
                {"node": s.node, "edges": [e for e, _ in s.edges], "grads": [[g, grad_class(t)] for g, t in s.grads],
                 "done": list(s.done)}
                for s in self.steps
            ],
            "cards": self.cards,
            "table": self.table,
            # the arrows (data-flow direction) and the roots: search, upstream/downstream highlight, root in view
            "links": [[edge.src, edge.dst, edge.id] for edge in self.backward_pass.graph.edges],
            "roots": [node.id for node in self.backward_pass.graph.nodes if node.kind == "output"],
        }
        if self.backward_pass.sources:  # shown on hover over a node
            data["sources"] = {node: source.describe() for node, source in self.backward_pass.sources.items()}
        if self.marks:
            data.update(marks_data(self.backward_pass))  # the debugging marks' tooltips, the paths to each leaf
        if self.backward_pass.groups:  # module calls: clusters the stepper can collapse
            data["groups"] = group_data(self.backward_pass)
        if predict:
            total = len(self.steps)
            # per question: its card, each part's [answer, as printed, label], and the rule the feedback explains
            data["questions"] = [
                [question_html(s, total), [[list(part.answer), part.answer_text, part.label] for part in s.question.parts],
                 question_rule(s.question)] if s.question else None
                for s in self.steps
            ]
        return data


# Past this many boxes, module groups start collapsed, except those around the current step.
COLLAPSE_OVER = 60


def group_data(backward_pass: BackwardPass) -> dict:
    """Module groups for the stepper: for each, its label, parent, every node and arrow inside it (nested
    groups included), the arrows across its border and the nodes at their other ends, and whether groups start
    collapsed."""
    groups = backward_pass.groups
    inside: list[set[str]] = [set(group.nodes) for group in groups]
    for index in range(len(groups) - 1, -1, -1):  # a group starts after its parent: children come later
        parent = groups[index].parent
        if parent is not None:
            inside[parent] |= inside[index]
    edges: list[list[str]] = [[] for _ in groups]
    border: list[list[str]] = [[] for _ in groups]
    beside: list[set[str]] = [set() for _ in groups]  # nodes outside a group with an arrow to or from it
    enclosing = {}
    for index, group in enumerate(groups):
        for node_id in group.nodes:
            enclosing[node_id] = index
    for edge in backward_pass.graph.edges:
        # an arrow inside a group (both ends in it), or across its border (one end in it)
        seen = set()
        for end, other in ((edge.src, edge.dst), (edge.dst, edge.src)):
            index = enclosing.get(end)
            while index is not None and index not in seen:
                seen.add(index)
                if other in inside[index]:
                    edges[index].append(edge.id)
                else:
                    border[index].append(edge.id)
                    beside[index].add(other)
                index = groups[index].parent
    order = {node.id: number for number, node in enumerate(backward_pass.graph.nodes)}
    return {
        "collapse": len(backward_pass.graph.nodes) > COLLAPSE_OVER,
        "total": len(backward_pass.graph.nodes),
        "list": [
            {"id": group.id, "label": group.describe(), "parent": group.parent,
             "nodes": sorted(inside[index], key=order.__getitem__), "edges": edges[index], "border": border[index],
             "beside": sorted(beside[index], key=order.__getitem__)}
            for index, group in enumerate(groups)
        ],
    }


# a node's group up to its "grad …" text, never running into the next group
_GRAD_TEXT = re.compile(r'(<g id="(n\d+)" class="node">(?:(?!</g>).)*?)(<text([^>]*)>grad ([^<]*)</text>)', re.S)


def views_for(passes: list[BackwardPass], predict: bool = False) -> list[PassView]:
    """One view per pass, hook calls counted over all of them; for predict mode without the debugging marks."""
    totals = hook_totals(passes)
    return [PassView(p, totals, marks=not predict) for p in passes]


def grad_class(text: str) -> str:
    """The CSS class of one text of a grad field (the same text, the same class, in Python and in the page)."""
    return "al-v" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]


def prepare_svg(svg: str, backward_pass: BackwardPass, final: Frame, variants: dict[str, list[str]] | None = None) -> str:
    """Give each updated leaf one grad text per value its .grad takes during the pass, and the one before
    it, for CSS to choose from.  Without CSS (a picture) only the last one shows."""
    graph = backward_pass.graph
    before = {node.id: format_value(node.grad, 48) if node.grad is not None else "None" for node in graph.nodes}
    variants = variants or {node: [text] for node, text in final.grads.items()}

    def swap(match: re.Match) -> str:
        node_id = match.group(2)
        if node_id not in final.grads:
            return match.group(0)
        attributes = match.group(4)
        last = final.grads[node_id]
        texts = [f'<text class="al-after {grad_class(last)}"{attributes}>grad {_xml(last)}</text>']
        texts += [f'<text class="al-after {grad_class(text)}" visibility="hidden"{attributes}>grad {_xml(text)}</text>'
                  for text in variants.get(node_id, ()) if text != last]
        texts.append(f'<text class="al-before" visibility="hidden"{attributes}>grad {_xml(before.get(node_id, "None"))}</text>')
        return match.group(1) + "".join(texts)

    return _GRAD_TEXT.sub(swap, svg)


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def frame_css(scope: str, shown: Frame) -> str:
    """The CSS that makes the drawing show one step (mirrored by ``frameCss`` in stepper.js)."""
    rules = []
    if shown.edge_labels:
        rules.append(", ".join(f"{scope} #{edge} text" for edge in sorted(shown.edge_labels)) + " {visibility: visible}")
        rules.append(
            ", ".join(f"{scope} #{edge} path" for edge in sorted(shown.edge_labels))
            + f" {{stroke: {DONE_COLOR}; stroke-width: 2px}}"
        )
    if shown.grads:  # each leaf's grad field shows the text of this step
        rules.append(", ".join(f"{scope} #{node} .{grad_class(shown.grads[node])}" for node in sorted(shown.grads))
                     + " {display: inline}")
        rules.append(", ".join(f"{scope} #{node} .al-before" for node in sorted(shown.grads)) + " {display: none}")
    if shown.done:
        shapes = ", ".join(f"{scope} #{node} > {shape}" for node in sorted(shown.done) for shape in ("polygon", "path", "ellipse"))
        rules.append(f"{shapes} {{stroke: {DONE_COLOR}; stroke-width: 2.5px}}")
    if shown.current:
        shapes = ", ".join(f"{scope} #{shown.current} > {shape}" for shape in ("polygon", "path", "ellipse"))
        rules.append(f"{shapes} {{stroke: {CURRENT_COLOR}; stroke-width: 5px; stroke-dasharray: 8 3}}")
    return "\n".join(rules)




def stepper_data(views: list[PassView], key: str, predict: bool = False, first_picture: bool = True) -> dict:
    """Everything the stepper module needs for these passes."""
    return {
        "key": key,
        "predict": predict,
        "css": base_css("{scope}"),
        "passes": [view.data(predict, picture=first_picture or i > 0) for i, view in enumerate(views)],
    }
