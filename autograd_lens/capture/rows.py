"""A graph's boxes and arrows as plain rows (issue #24), made into a :class:`~autograd_lens.model.Graph` when first
read: the walk at the end of a large pass (inside ``backward()``) only reads torch's graph into rows, and the
pass's model makes the ``Node``s and ``Edge``s after it (``draft.complete``).  A row holds no torch object: the
same values the ``Node`` will hold, in its field order."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any

from ..model import Edge, Graph, GraphOptions, Node, TensorSummary
from .snapshot import dtype_name

NODE_FIELDS = tuple(item.name for item in dataclass_fields(Node))
_NODE_DEFAULTS = {item.name: item.default for item in dataclass_fields(Node)}
EDGE_FIELDS = tuple(item.name for item in dataclass_fields(Edge))
_new = object.__new__
_LABEL = NODE_FIELDS.index("label")
_HOOKS = NODE_FIELDS.index("hooks")
_KIND = NODE_FIELDS.index("kind")
_SEQUENCE_NR = NODE_FIELDS.index("sequence_nr")
_VALUE = NODE_FIELDS.index("value")
_SUMMARY_DEFAULTS = {item.name: item.default for item in dataclass_fields(TensorSummary)}


class GraphRows:
    """Numbers nodes and edges in the order they are added, as rows (a ``Node``'s field values in field order; an
    ``Edge``'s), and makes the :class:`Graph` once, when first asked (:meth:`graph`).  A row's value may be a
    ``(shape, torch.dtype)`` pair: the value is then that shape-and-dtype ``TensorSummary``, made with the Graph (a
    Node's value is never a tuple)."""

    def __init__(self, options: GraphOptions) -> None:
        self.options = options
        self.nodes: list[tuple] = []
        self.edges: list[tuple] = []
        self.hidden = 0
        self.relabelled: dict[str, str] = {}  # node id -> label, for the rows not yet made into nodes
        self._graph: Graph | None = None

    def node(self, **fields: Any) -> str:
        node_id = f"n{len(self.nodes)}"
        values = {**_NODE_DEFAULTS, **fields, "id": node_id}
        self.nodes.append(tuple([values[name] for name in NODE_FIELDS]))
        return node_id

    def edge(self, src: str, dst: str, kind: str = "data", label: str = "") -> str:
        edge_id = f"e{len(self.edges)}"
        self.edges.append((edge_id, src, dst, kind, label))
        return edge_id

    def graph(self) -> Graph:
        """The Graph of these rows (made once): each Node and Edge as its dataclass would make it."""
        if self._graph is None:
            relabelled = self.relabelled
            nodes = []
            append = nodes.append
            for row in self.nodes:
                if relabelled and row[0] in relabelled:
                    row = row[:_LABEL] + (relabelled[row[0]],) + row[_LABEL + 1:]
                if type(row[_VALUE]) is tuple:
                    row = row[:_VALUE] + (_summary(*row[_VALUE]),) + row[_VALUE + 1:]
                box = _new(Node)  # Node(*row) without a frozen dataclass's setattr per field, its fields in order
                box.__dict__.update(zip(NODE_FIELDS, row))
                append(box)
            edges = []
            for row in self.edges:
                arrow = _new(Edge)
                arrow.__dict__.update(zip(EDGE_FIELDS, row))
                edges.append(arrow)
            self._graph = Graph(nodes=tuple(nodes), edges=tuple(edges), hidden_nodes=self.hidden, options=self.options)
            self.nodes = self.edges = []  # type: ignore[assignment]  # the graph holds them now
            self.relabelled = {}
        return self._graph

    def set_graph(self, graph: Graph) -> None:
        self._graph = graph
        self.nodes = self.edges = []  # type: ignore[assignment]
        self.relabelled = {}

    @property
    def made(self) -> bool:
        return self._graph is not None

    def count(self) -> int:
        """How many boxes the graph has."""
        return len(self._graph.nodes) if self._graph is not None else len(self.nodes)

    def relabel(self, labels: dict[str, str]) -> None:
        """Rename boxes (node id -> label)."""
        if self._graph is not None:
            graph = self._graph
            nodes = tuple(_with_label(node, labels[node.id]) if node.id in labels else node for node in graph.nodes)
            self._graph = _with_nodes(graph, nodes)
        else:
            self.relabelled.update(labels)

    def with_badge(self, badge: str) -> set[str]:
        """Ids of the boxes that carry ``badge``."""
        if self._graph is not None:
            return {node.id for node in self._graph.nodes if badge in node.hooks}
        return {row[0] for row in self.nodes if badge in row[_HOOKS]}

    def label(self, node_id: str) -> str:
        if self._graph is not None:
            return self._graph.node(node_id).label
        if node_id in self.relabelled:
            return self.relabelled[node_id]
        return self.nodes[int(node_id[1:])][_LABEL]

    def functions(self) -> list[tuple[str, int | None]]:
        """(node id, sequence number) of every backward function box, in drawing order."""
        if self._graph is not None:
            return [(node.id, node.sequence_nr) for node in self._graph.nodes if node.kind == "function"]
        return [(row[0], row[_SEQUENCE_NR]) for row in self.nodes if row[_KIND] == "function"]


def _arrows(kept: list, nexts: list, leaf_labels: dict, function_ids: dict, sources: dict, edges: list,
            edge_rows: dict, leaf_copies: dict, use_counter: dict, tensor_ids: dict) -> None:
    """The walk's arrows (each input of each drawn function, every input drawn), as its general loop draws them: an
    input with a box of its own in ``sources`` (a leaf drawn once, a function with no tensor box) the usual way,
    without the look-ups of the general one; tests/test_perf_build.py compares the two."""
    first = len(edges)
    edge_names = _names_up_to(first + sum(map(len, nexts)) + 8, _EDGE_NAMES, "e")
    count = first
    append = edges.append
    source_of = sources.get
    for fn, following in zip(kept, nexts):
        fn_key = id(fn)
        if not following:
            if fn_key not in leaf_labels:
                edge_rows[fn_key] = ()
            continue
        dst = function_ids[fn_key]
        row: list[str | None] = []  # the arrow of each input slot, None where none is drawn
        for next_fn, output_nr in following:
            if next_fn is None:
                row.append(None)
                continue
            key = id(next_fn)
            src = source_of(key)
            if src is None:  # the general way: a leaf drawn once per use, an output with a tensor box
                copies = leaf_copies.get(key)
                if copies is not None:
                    index = use_counter.get(key, 0)
                    use_counter[key] = index + 1
                    src = copies[min(index, len(copies) - 1)]
                else:
                    src = tensor_ids.get((key, output_nr)) or function_ids[key]
            edge_id = edge_names[count]
            count += 1
            append((edge_id, src, dst, "data", ""))
            row.append(edge_id)
        edge_rows[fn_key] = tuple(row)


def _names_up_to(count: int, names: list[str], prefix: str) -> list[str]:
    """``names`` (``prefix`` + 0, 1, ...: the ids of boxes or arrows, made once for every walk) with at least
    ``count`` of them."""
    if len(names) < count:
        names.extend([f"{prefix}{index}" for index in range(len(names), count)])
    return names


_NODE_NAMES: list[str] = []
_EDGE_NAMES: list[str] = []


def without_saved(options: GraphOptions) -> GraphOptions:
    """``options.replace(show_saved=False)`` (what graphs drawn after their pass use), made once per options."""
    try:
        found = _WITHOUT_SAVED.get(options)
    except TypeError:  # options that cannot be hashed
        return options.replace(show_saved=False)
    if found is None:
        found = options.replace(show_saved=False)
        if len(_WITHOUT_SAVED) < 64:
            _WITHOUT_SAVED[options] = found
    return found


_WITHOUT_SAVED: dict[GraphOptions, GraphOptions] = {}


def _summary(shape: tuple, dtype: Any) -> TensorSummary:
    """TensorSummary(shape, dtype name) without a frozen dataclass's setattr per field."""
    summary = _new(TensorSummary)
    summary.__dict__.update(_SUMMARY_DEFAULTS, shape=shape, dtype=dtype_name(dtype))
    return summary


def _with_label(node: Node, label: str) -> Node:
    import dataclasses

    return dataclasses.replace(node, label=label)


def _with_nodes(graph: Graph, nodes: tuple) -> Graph:
    import dataclasses

    return dataclasses.replace(graph, nodes=nodes)
