"""The autograd graph as plain data: nodes, edges, module groups and the options it was drawn with."""

from __future__ import annotations

import dataclasses
from functools import cached_property
from dataclasses import dataclass, field
from typing import Any

from .values import _PROVIDED, Value, _provided

NODE_KINDS = ("leaf", "tensor", "output", "function", "saved", "constant", "hidden")


@dataclass(frozen=True)
class Node:
    """One box of the drawing.

    ``kind`` is one of ``NODE_KINDS``: tensors (``leaf``, ``tensor`` for a named
    intermediate, ``output``), backward functions (``function``), values a
    backward function saved (``saved``, ``constant``) and the note that says how
    much of a large graph was left out (``hidden``).
    """

    id: str
    kind: str
    label: str
    op: str = ""  # backward function name, e.g. "MulBackward0" (function nodes)
    shape: tuple[int, ...] | None = None
    value: Value = None
    grad: Value = None
    hooks: tuple[str, ...] = ()  # human-readable badges: "tensor hook <lambda>", "retain_grad"
    detail: str = ""  # e.g. "exponent" for a saved constant, "2 uses" for a split leaf
    sequence_nr: int | None = None
    reduced: tuple[int, ...] | None = None  # dims a sum/mean over ``dim=`` reduced (function nodes)

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("leaf", "tensor", "output")


@dataclass(frozen=True)
class SourceLine:
    """The cell line that made a backward node."""

    line: int  # 1-based, as the notebook numbers the cell's lines
    text: str  # that line, stripped ("…" when the statement goes on)

    def describe(self) -> str:
        return f"cell line {self.line}: {self.text}"


@dataclass(frozen=True)
class ModuleGroup:
    """The nodes made inside one call of an ``nn.Module`` (recorded with ``%%lens --modules``)."""

    id: str  # "m1", "m2", … in the order the calls started
    path: str | None  # "model.0" as the notebook names it; None when no name reaches the module
    kind: str  # the module's class, e.g. "Linear"
    call: int = 1  # which call of this module (a module used twice makes two groups)
    calls: int = 1  # how many calls of it were recorded
    parent: int | None = None  # index of the enclosing group
    nodes: tuple[str, ...] = ()  # node ids inside this group and not inside a group within it

    def describe(self) -> str:
        """``model.0 · Linear``, ``block · Block (call 2 of 2)``, ``Linear (no name)``."""
        text = f"{self.path} · {self.kind}" if self.path else f"{self.kind} (no name)"
        return text + (f" (call {self.call} of {self.calls})" if self.calls > 1 else "")


@dataclass(frozen=True)
class Edge:
    """An arrow in forward (data-flow) direction: ``src`` is used to compute ``dst``.

    In the backward pass a gradient travels the other way, from ``dst`` to
    ``src``.  ``kind`` is ``"data"`` or ``"saved"`` (a dashed link from a saved
    value to the backward function that keeps it).
    """

    id: str
    src: str
    dst: str
    kind: str = "data"
    label: str = ""


@dataclass(frozen=True)
class Graph:
    """The autograd graph behind one or more tensors, as plain data.

    Returned by :func:`autograd_lens.graph`; it displays itself in Jupyter.

    >>> import torch, autograd_lens
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> g = autograd_lens.graph(x * 3, names={"x": x})
    >>> [node.label for node in g.nodes if node.is_tensor]
    ['output', 'x']
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    hidden_nodes: int = 0  # backward functions left out because of the node limit
    options: "GraphOptions" = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    # (module path, class name) of the modules named in the namespace: their parameters' names group the drawing
    modules: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    def node(self, node_id: str) -> Node:
        return self._index["nodes"][node_id]

    def edges_into(self, node_id: str) -> tuple[Edge, ...]:
        """The edges ending at ``node_id``, in drawing order."""
        return self._index["into"].get(node_id, ())

    def edges_from(self, node_id: str) -> tuple[Edge, ...]:
        """The edges starting at ``node_id``, in drawing order."""
        return self._index["from"].get(node_id, ())

    def edge(self, edge_id: str) -> Edge:
        return self._index["edges"][edge_id]

    def nodes_labelled(self, label: str) -> tuple[Node, ...]:
        return self._index["labels"].get(label, ())

    @cached_property
    def _index(self) -> dict[str, dict]:
        """Lookups by id, endpoint and label, built once: every view reads the graph in linear time."""
        into: dict[str, list[Edge]] = {}
        out: dict[str, list[Edge]] = {}
        labels: dict[str, list[Node]] = {}
        for edge in self.edges:
            into.setdefault(edge.dst, []).append(edge)
            out.setdefault(edge.src, []).append(edge)
        for node in self.nodes:
            labels.setdefault(node.label, []).append(node)
        return {
            "nodes": {node.id: node for node in self.nodes},
            "edges": {edge.id: edge for edge in self.edges},
            "into": {key: tuple(value) for key, value in into.items()},
            "from": {key: tuple(value) for key, value in out.items()},
            "labels": {key: tuple(value) for key, value in labels.items()},
        }

    def find(self, label: str) -> Node:
        """The first node whose label is ``label`` (a variable name, ``"mul"`` …)."""
        for node in self.nodes:
            if node.label == label:
                return node
        raise KeyError(f"no node labelled {label!r}; labels: {sorted({n.label for n in self.nodes})}")

    def to_dot(self, **options: Any) -> str:
        """The DOT source of this graph (deterministic text)."""
        return _provided("to_dot")(self, **options)

    def render(self, path: str | None = None, format: str | None = None, renderer: str | None = None) -> bytes:
        """Lay out and render the graph; write it to ``path`` when given.

        The format is ``format``, else the path's suffix (``g.png``), else SVG. SVG comes from the in-process
        WebAssembly Graphviz (or the ``dot`` binary); PNG and PDF need the ``dot`` binary.
        """
        return _provided("render_graph")(self, path=path, format=format, renderer=renderer)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = _PROVIDED.get("graph_bundle")  # a display method never raises
        return bundle(self) if bundle is not None else {"text/plain": repr(self)}

    def __repr__(self) -> str:
        text = _PROVIDED.get("graph_text")
        return text(self) if text is not None else f"<Graph: {len(self.nodes)} nodes, {len(self.edges)} edges>"


@dataclass(frozen=True)
class GraphOptions:
    """How a graph is captured and drawn; every option has a keyword in ``graph()``."""

    max_elements: int = 16  # tensors up to this size show their values
    max_nodes: int = 300  # backward functions drawn before the rest is cut
    direction: str = "forward"  # "forward" (data flow) or "backward" (gradient flow)
    legend: bool = False
    show_saved: bool = True
    split_leaf_uses: int = 4  # a leaf used by more ops than this is drawn once per use
    fold: bool = True  # past ~60 boxes: module groups outlined, runs of identical blocks drawn as one box
    expand: tuple[str, ...] = ()  # blocks drawn in full even so ("layers.3"), or ("all",)

    def __post_init__(self) -> None:
        if self.direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward', not {self.direction!r}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, not {self.max_nodes}")
        if self.max_elements < 0:
            raise ValueError(f"max_elements must be 0 or more, not {self.max_elements}")

    def replace(self, **changes: Any) -> "GraphOptions":
        return dataclasses.replace(self, **changes)


def attach_to_groups(graph: Graph, made: dict) -> None:
    """What belongs with a function goes where it went in ``made`` (node id -> group): its named outputs, and
    the saved values and constants only it keeps."""
    for node in graph.nodes:
        if node.kind in ("tensor", "output"):
            sources = [made[e.src] for e in graph.edges_into(node.id) if e.src in made]
            if sources:
                made[node.id] = sources[0]
        elif node.kind in ("saved", "constant"):
            keepers = {made[e.dst] for e in graph.edges_from(node.id) if e.dst in made}
            if len(keepers) == 1:
                made[node.id] = keepers.pop()
