"""Graph → DOT text, built with the ``graphviz`` package (the DOT language layer only).

Labels are Graphviz *record* labels (``{ y | data 4 | grad 5 }``), which both
the WebAssembly build and the ``dot`` binary understand (the WebAssembly
build has no HTML-like labels).  Every piece of user text goes through
:func:`record_text` or :func:`plain_text`, so a name such as ``grads['a|b']``
or a hook called ``<lambda>`` cannot break the drawing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import graphviz

from ..format import format_block, format_shape
from ..model import Graph, ModuleGroup, Node
from .dotwriter import _Digraph, _cluster_attributes, _NoHtml, _quote, _quote_short, _quote_text  # noqa: F401
from .dotwriter import _Digraph as _Writer  # the writer (tests put the library's Digraph in _Digraph's place)

COLORS = {
    "leaf": "#dbeafe",
    "tensor": "#ffffff",
    "output": "#dcfce7",
    "function": "#f3f4f6",
    "saved": "#fef9c3",
    "constant": "#fef9c3",
    "hidden": "#fee2e2",
}
HOOK_COLOR = "#d97706"
# One family Graphviz knows the widths of: given a list ("Helvetica,Arial,sans-serif") it lays out with Times's
# narrower widths, and browsers, drawing Helvetica or Arial, then overflow every box and overlap arrow labels.
FONT = "Helvetica"
_RECORD_SPECIALS = set('{}|<>"\\')


_RECORD_TABLE = {ord(c): "\\" + c for c in _RECORD_SPECIALS}
_RECORD_TABLE.update({ord("\n"): "\\n", ord("\r"): " ", ord("\t"): " "})
_RECORD_TABLE.update({code: None for code in range(32) if code not in _RECORD_TABLE})
_PLAIN_TABLE = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n"}
_PLAIN_TABLE.update({code: " " for code in range(32) if code not in _PLAIN_TABLE})


def record_text(text: str) -> str:
    """Escape text for one field of a record label.

    >>> record_text("grads['a|b']"), record_text("<lambda>")
    ("grads['a\\\\|b']", '\\\\<lambda\\\\>')
    """
    escaped = text.translate(_RECORD_TABLE)
    # Graphviz reads leading/trailing blanks of a field as layout: keep them visible.
    return escaped.strip() or "\\ "


def plain_text(text: str) -> graphviz.nohtml:
    """Escape text for an ordinary (non-record) label: one line per ``\\n``."""
    return _NoHtml(text.translate(_PLAIN_TABLE))  # graphviz.nohtml(...), without the call


def tensor_fields(node: Node, grad_text: str | None = None) -> list[str]:
    """The lines of a tensor's box: name (and shape), data, grad, hook badges."""
    title = node.label
    if node.shape:
        title += f" [{format_shape(node.shape)}]"
    if node.detail:
        title += f" ({node.detail})"
    fields = [title]
    if node.value is not None:
        fields.append(_labelled("data", format_block(node.value, 48)))
    grad = grad_text if grad_text is not None else (format_block(node.grad, 48) if node.grad is not None else "None")
    fields.append(_labelled("grad", grad))
    fields.extend(node.hooks)
    return fields


def _labelled(name: str, text: str) -> str:
    """``data 2`` on one line; a matrix starts on the next line, one row per line."""
    return f"{name}\n{text}" if "\n" in text else f"{name} {text}"


def function_lines(node: Node) -> list[str]:
    lines = [node.label, node.op] if node.op and node.op.lower() != node.label else [node.label]
    if node.detail:
        lines.append(node.detail)
    lines.extend(node.hooks)
    return lines


def to_dot(
    graph: Graph,
    *,
    direction: str | None = None,
    legend: bool | None = None,
    edge_labels: Mapping[str, str] | None = None,
    grad_texts: Mapping[str, str] | None = None,
    groups: Sequence[ModuleGroup] = (),
    marks=None,
) -> str:
    """DOT source for ``graph``.

    ``edge_labels`` (edge id → text) and ``grad_texts`` (node id → text for its
    grad field) let the backward-pass views put gradients on the drawing; ``groups`` (module calls) are
    drawn as nested clusters around the nodes they made; ``marks`` (a :class:`~autograd_lens.views.marks.Marks`)
    adds the debugging marks: cuts, the NaN origin, path arrows.
    """
    sizes = None
    if not groups:  # a graph from graph(): past ~60 boxes, its modules outlined and repeated blocks folded
        from .fold import plan

        drawn = plan(graph)
        if drawn.groups or drawn.folds:  # with gradient sizes: outlines of parameters, norms of modules
            if any(node.kind == "leaf" and node.grad is not None for node in graph.nodes):
                from .gradsize import sizes_for

                sizes = sizes_for(graph, drawn)
                graph, groups = sizes.graph, drawn.groups
            else:  # no gradient known (before backward): no outline, no norm, no legend, as sizes_for would say
                graph, groups = drawn.graph, drawn.groups
    options = graph.options
    direction = direction or (options.direction if options else "forward")
    legend = options.legend if legend is None and options else bool(legend)
    edge_labels = edge_labels or {}
    grad_texts = grad_texts or {}
    outlines = sizes.outlines if sizes else {}

    dot = _Digraph(name="autograd")
    across = orientation(graph) == "across"
    rankdir = ("LR" if direction == "forward" else "RL") if across else ("TB" if direction == "forward" else "BT")
    dot.attr(rankdir=rankdir, nodesep="0.25", ranksep="0.35")
    dot.attr("node", fontname=FONT, fontsize="11")
    dot.attr("edge", fontname=FONT, fontsize="10", color="#4b5563")
    for node in graph.nodes:
        outline, mark = outlines.get(node.id), marks.nodes.get(node.id) if marks else None
        line = _usual_node(node, grad_texts.get(node.id), across) if outline is None and mark is None and not node.hooks \
            and type(dot) is _Writer else None
        if line is None:
            _add_node(dot, node, grad_texts.get(node.id), across, outline, mark)
        else:
            dot.body.append(line)
    usual = type(dot) is _Writer and direction != "backward" and not marks  # the usual lines written at once
    for edge in graph.edges:
        label = edge_labels.get(edge.id, edge.label if edge.kind != "saved" else "")
        if usual and edge.kind not in ("saved", "hidden"):  # what dot.edge writes for these attributes
            named = f"label={_quote_text(label.translate(_PLAIN_TABLE))} " if label else ""
            dot.body.append(f"\t{_quote_short(edge.src)} -> {_quote_short(edge.dst)} [{named}id={_quote_short(edge.id)}]\n")
            continue
        attributes = {"id": edge.id}
        if label:
            attributes["label"] = plain_text(label)
        if edge.kind in ("saved", "hidden"):
            attributes.update(style="dashed", arrowhead="none" if edge.kind == "hidden" else "normal")
        if direction == "backward":
            attributes["dir"] = "back"
        if marks and edge.id in marks.edges:
            attributes.update(marks.edges[edge.id])
        dot.edge(edge.src, edge.dst, **attributes)
    if marks:  # a tensor cut off the graph: its own box, and a dashed arrow into each function that used its copy
        drawn = {node.id for node in graph.nodes}  # a function folded into a repeated block's box: no arrow, no box
        arrows = [(src, dst, attributes) for src, dst, attributes in marks.extra_edges if dst in drawn]
        for node_id, attributes in marks.extra_nodes:
            if any(src == node_id for src, _, _ in arrows):
                extra = dict(attributes, id=node_id)
                dot.node(node_id, plain_text(extra.pop("label")), **extra)
        for src, dst, attributes in arrows:
            dot.edge(src, dst, **dict(attributes, dir="back") if direction == "backward" else attributes)
    if groups:
        _add_groups(dot, groups, sizes.labels if sizes else None)
    if sizes and sizes.bins:
        _add_size_legend(dot, sizes.bins)
    if legend:
        _add_legend(dot)
    return dot.source


GROUP_COLOR = "#8b5cf6"
FOLD_FILL = "#ede9fe"


def _add_groups(dot: _Digraph, groups: Sequence[ModuleGroup], labels: Mapping[str, str] | None = None) -> None:
    """Each module call as a cluster (``subgraph cluster_m3``, SVG id ``m3``) holding its nodes, nested as
    the calls were."""
    children: dict[int | None, list[int]] = {}
    for index, group in enumerate(groups):
        children.setdefault(group.parent, []).append(index)

    def emit(index: int, indent: str) -> None:
        group = groups[index]
        dot.body.append(f"{indent}subgraph cluster_{group.id} {{\n")
        dot.body.append(f"{indent}\t{_cluster_attributes(plain_text((labels or {}).get(group.id) or group.describe()), {'id': group.id, 'style': 'rounded,dashed', 'color': GROUP_COLOR, 'fontcolor': '#5b21b6', 'fontname': FONT, 'fontsize': '10', 'labeljust': 'l', 'margin': '10'})}\n")
        for node_id in group.nodes:
            dot.body.append(f"{indent}\t{_quote_short(node_id)}\n")
        for child in children.get(index, ()):
            emit(child, indent + "\t")
        dot.body.append(f"{indent}}}\n")

    for index in children.get(None, ()):
        emit(index, "\t")


# A graph at most this many ranks deep is drawn across the page (the arrows run left to right); a deeper
# one that is also much deeper than it is wide is drawn down the page, so that it is read by scrolling
# the notebook instead of being squeezed into a strip of unreadable text.
ACROSS_MAX_DEPTH = 16


def orientation(graph: Graph) -> str:
    """"across" or "down", from the graph's depth (longest chain of arrows) and width (most nodes at one depth)."""
    # depth counted back from the outputs, as Graphviz ranks them: a parameter sits next to its layer
    waiting = {node.id: 0 for node in graph.nodes}
    for edge in graph.edges:
        if edge.src in waiting and edge.dst in waiting:
            waiting[edge.src] += 1
    depth = {node_id: 0 for node_id, count in waiting.items() if count == 0}
    ready = list(depth)
    while ready:  # Kahn's order: a node's depth is final once every arrow out of it has been seen
        node_id = ready.pop()
        for edge in graph.edges_into(node_id):
            if edge.src in waiting:
                depth[edge.src] = max(depth.get(edge.src, 0), depth[node_id] + 1)
                waiting[edge.src] -= 1
                if waiting[edge.src] == 0:
                    ready.append(edge.src)
    levels = max(depth.values(), default=0) + 1
    width = max(Counter(depth.values()).values(), default=1)
    return "down" if levels > ACROSS_MAX_DEPTH and levels > 3 * width else "across"


def _usual_node(node: Node, grad_text: str | None, across: bool) -> str | None:
    """The line ``_add_node`` writes for a tensor or a backward function with no outline, hook or mark, written at
    once (the attributes in the order ``_Digraph`` sorts them); None for any other box."""
    name = _quote_short(node.id)
    if node.is_tensor:
        label = "|".join(record_text(f) for f in tensor_fields(node, grad_text))
        return (f"\t{name} [label={_quote_text(label if across else '{' + label + '}')} fillcolor="
                f"{_quote_short(COLORS[node.kind])} id={name}{' penwidth=1.5' if node.kind == 'output' else ''} "
                "shape=record style=filled]\n")
    if node.kind == "function":
        label = "\n".join(function_lines(node)).translate(_PLAIN_TABLE)
        return (f"\t{name} [label={_quote_text(label)} fillcolor={_quote_short(COLORS['function'])} id={name} shape=box "
                'style="rounded,filled"]\n')
    return None


def _add_node(dot: _Digraph, node: Node, grad_text: str | None, across: bool = True, size=None, mark=None) -> None:
    attributes = {"id": node.id, "style": "filled", "fillcolor": COLORS.get(node.kind, "#ffffff")}
    added = list(mark.lines) if mark is not None else []
    if node.is_tensor:
        fields = tensor_fields(node, grad_text) + added
        # fields stacked top to bottom (a record's fields run across the rank direction: braces turn them)
        label = "|".join(record_text(f) for f in fields)
        attributes.update(shape="record", label=graphviz.nohtml(label if across else "{" + label + "}"))
        if node.kind == "output":
            attributes["penwidth"] = "1.5"
    elif node.kind == "function":
        attributes.update(shape="box", style="rounded,filled", label=plain_text("\n".join(function_lines(node) + added)))
    elif node.kind == "folded":
        attributes.update(shape="box3d", fillcolor=FOLD_FILL, color=GROUP_COLOR, penwidth="2", fontcolor="#4c1d95", margin="0.2,0.1",
                          label=plain_text(f"{node.label}\n{node.detail}"), fontsize="12")
    elif node.kind == "constant":
        attributes.update(shape="ellipse", style="dashed,filled", label=plain_text(node.label), fontsize="10")
    else:
        attributes.update(shape="note", label=plain_text(f"{node.label}\n{node.detail}".strip()))
    if size is not None:  # the size of its .grad (see views.gradsize); a hook's outline wins
        attributes.update(color=size.color, penwidth=size.width)
        if size.high == 0:  # all zeros: dashed
            attributes["style"] += ",dashed"
    if node.hooks:
        attributes.update(color=HOOK_COLOR, penwidth="2.5")
    if mark is not None:  # a debugging mark (views.marks) wins over the hook's and the size's outline
        attributes.update(mark.attributes)
        if mark.dashed:
            attributes["style"] += ",dashed"
    dot.node(node.id, **attributes)


def _add_size_legend(dot: _Digraph, bins) -> None:
    """The outlines' meaning: one sample box per size step, smallest first."""
    dot.body.append("\tsubgraph cluster_grad_sizes {\n")
    dot.body.append(f"\t\t{_cluster_attributes(plain_text('outline: size of .grad'), {'id': 'grad_sizes', 'style': 'dashed', 'color': '#9ca3af', 'fontname': FONT, 'fontsize': '10'})}\n")
    for index, size_bin in enumerate(bins):
        attributes = {"id": f"grad_size{index + 1}", "shape": "box", "fillcolor": COLORS["leaf"],
                      "style": "filled,dashed" if size_bin.high == 0 else "filled",
                      "color": size_bin.color, "penwidth": size_bin.width, "fontsize": "10"}
        dot.body.append(f"\t\tgrad_size{index + 1} [{_cluster_attributes(plain_text(size_bin.text), attributes)}]\n")
    for index in range(1, len(bins)):
        dot.body.append(f"\t\tgrad_size{index} -> grad_size{index + 1} [style=invis]\n")
    dot.body.append("\t}\n")


def _add_legend(dot: _Digraph) -> None:
    with dot.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontname=FONT, fontsize="10", style="dashed", color="#9ca3af")
        samples = [
            ("legend_leaf", "record", COLORS["leaf"], "{leaf tensor|data|grad}"),
            ("legend_tensor", "record", COLORS["tensor"], "{named intermediate|data|grad}"),
            ("legend_output", "record", COLORS["output"], "{output|data|grad}"),
            ("legend_function", "box", COLORS["function"], "backward function"),
            ("legend_constant", "ellipse", COLORS["constant"], "constant"),
        ]
        for name, shape, color, label in samples:
            style = "rounded,filled" if shape == "box" else "filled"
            legend.node(name, label=graphviz.nohtml(label), shape=shape, style=style, fillcolor=color)
        legend.node(
            "legend_hook", label="[hook] has a hook", shape="box", style="filled", fillcolor="#ffffff",
            color=HOOK_COLOR, penwidth="2.5",
        )
        order = [name for name, *_ in samples] + ["legend_hook"]
        for first, second in zip(order, order[1:]):
            legend.edge(first, second, style="invis")
