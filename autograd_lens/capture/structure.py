"""The shape of a graph, read cheaply before a backward pass: the edges at its roots, every reachable backward
function (breadth first, without recursion), who uses what, and the edge that receives a tensor's gradient; and what
torch knows of a node's outputs (shapes, the dims a reduction reduced), which the walk draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch.autograd.graph import GradientEdge

from .names import Names


def root_edges(roots: Sequence[Any]) -> list[tuple[Any, int]]:
    """``(node, output_nr)`` where the gradient of each root enters the graph."""
    edges = []
    for index, root in enumerate(roots):
        if isinstance(root, GradientEdge):
            edges.append((root.node, root.output_nr))
            continue
        if not isinstance(root, torch.Tensor):
            raise TypeError(
                f"root {index} is a {type(root).__name__}, not a tensor: pass the tensor whose graph you "
                "want to see, e.g. graph(loss)"
            )
        if not root.requires_grad:
            raise ValueError(
                f"root {index} (shape {tuple(root.shape)}) does not require grad, so it has no autograd graph. "
                "Create the inputs with requires_grad=True (e.g. torch.tensor(2.0, requires_grad=True))."
            )
        edge = torch.autograd.graph.get_gradient_edge(root)
        edges.append((edge.node, edge.output_nr))
    return edges


def gradient_edge(tensor: torch.Tensor, leaves: dict | None = None) -> tuple[Any, int] | None:
    """The (node, output) that receives ``tensor``'s gradient; None when torch cannot say: for a leaf,
    ``get_gradient_edge`` makes a view, which sparse, mkldnn and nested layouts refuse, so a leaf is first looked
    for among ``leaves`` (the graph's ``AccumulateGrad`` nodes) by identity."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn, tensor.output_nr
    for fn in (leaves or {}).values():
        if fn.variable is tensor:
            return fn, 0
    try:
        edge = torch.autograd.graph.get_gradient_edge(tensor)
    except Exception:
        return None
    return edge.node, edge.output_nr


@dataclass
class Structure:
    """The shape of a graph, read cheaply before a backward pass: which nodes, who uses what.

    Holds torch's node objects: keep it only while the graph is being observed.
    """

    nodes: list[Any]  # every reachable backward function, breadth first from the roots
    root_edges: list[tuple[Any, int]]
    leaves: dict[int, Any]  # id(AccumulateGrad) -> AccumulateGrad, in walk order
    _consumers: dict[tuple[int, int], list[tuple[Any, int]]] | None = None
    root_labels: list[str] = field(default_factory=list)  # filled by label()
    leaf_labels: dict[int, str] = field(default_factory=dict)  # id(AccumulateGrad) -> label, by label()
    depth: int = 0  # breadth-first levels from the roots
    # each node's ``next_functions``, as ``nodes`` (torch builds the tuple anew at every read; a node's edges never
    # change once it is made): read with :meth:`next_of` or :meth:`edges`
    nexts: list[tuple] = field(default_factory=list)
    # id(AccumulateGrad) -> its leaf tensor, and id(leaf tensor) -> its AccumulateGrad (the graph's last, should two be
    # one tensor's): each leaf's ``variable`` read once, by label() or when first asked (variables(), by_variable())
    _variables: dict[int, Any] | None = None
    _by_variable: dict[int, Any] | None = None
    _node_ids: set[int] | None = None

    def variables(self) -> dict[int, Any]:
        """``id(AccumulateGrad)`` -> its leaf tensor, in the order of ``leaves``."""
        if self._variables is None:
            self._read_variables()
        return self._variables  # type: ignore[return-value]

    def by_variable(self) -> dict[int, Any]:
        """``id(leaf tensor)`` -> its ``AccumulateGrad`` (what ``{id(fn.variable): fn for fn in leaves.values()}``
        makes)."""
        if self._by_variable is None:
            self._read_variables()
        return self._by_variable  # type: ignore[return-value]

    def _read_variables(self) -> None:
        variables, by_variable = {}, {}
        for key, fn in self.leaves.items():
            variables[key] = tensor = fn.variable
            by_variable[id(tensor)] = fn
        self._variables, self._by_variable = variables, by_variable

    def node_ids(self) -> set[int]:
        """``id()`` of every node (made once)."""
        if self._node_ids is None:
            self._node_ids = set(map(id, self.nodes))
        return self._node_ids

    def edges(self) -> list[tuple]:
        """``next_functions`` of every node, in the order of ``nodes``."""
        if len(self.nexts) != len(self.nodes):
            self.nexts = [fn.next_functions for fn in self.nodes]
        return self.nexts

    def next_of(self) -> dict[int, tuple]:
        """``id(node)`` → its ``next_functions``, for the nodes of this graph."""
        return dict(zip(map(id, self.nodes), self.edges()))

    @property
    def consumers(self) -> dict[tuple[int, int], list[tuple[Any, int]]]:
        """``(id(node), output)`` → its users as ``(user, input slot)``, in walk order."""
        if self._consumers is None:
            consumers: dict[tuple[int, int], list[tuple[Any, int]]] = {}
            for fn, following in zip(self.nodes, self.edges()):
                slot = 0
                for next_fn, output_nr in following:
                    if next_fn is not None:
                        key = (id(next_fn), output_nr)
                        users = consumers.get(key)
                        if users is None:
                            consumers[key] = [(fn, slot)]
                        else:
                            users.append((fn, slot))
                    slot += 1
            self._consumers = consumers
        return self._consumers

    def label(self, names: Names, root_names: Sequence[str | None] | None = None) -> None:
        """Name the roots and leaves (unnamed leaves: ``leaf``, ``leaf_2``… in walk order)."""
        root_label: dict[tuple[int, int], str] = {}
        self.root_labels = []
        for index, (fn, output_nr) in enumerate(self.root_edges):
            if root_names and index < len(root_names) and root_names[index]:
                label = root_names[index]
            else:
                label = names.outputs.get((id(fn), output_nr)) or ("output" if index == 0 else f"output_{index}")
            self.root_labels.append(root_label.setdefault((id(fn), output_nr), label))
        unnamed = 0
        named_leaves, tensors, leaf_labels = names.leaves, names.tensors, self.leaf_labels
        variables, by_variable = {}, {}  # (read here once: see variables())
        for key, fn in self.leaves.items():
            variables[key] = tensor = fn.variable
            by_variable[variable := id(tensor)] = fn
            # (a parameter frozen after the forward no longer requires grad: tensors)
            label = named_leaves.get(variable) or tensors.get(variable) or root_label.get((key, 0))
            if label is None:
                unnamed += 1
                label = "leaf" if unnamed == 1 else f"leaf_{unnamed}"
            leaf_labels[key] = label
        self._variables, self._by_variable = variables, by_variable


def structure(roots: Sequence[Any], users: bool = False) -> Structure:
    """Reachable nodes and who uses what (no names, no values, no model): cheap, before a pass.  ``users``: make
    :attr:`Structure.consumers` in the same walk (what the tracer reads of every pass), not when first read."""
    starts = root_edges(roots)
    if users:
        return _walked([fn for fn, _ in starts], starts)
    nexts: list[tuple] = []
    reachable, depth = _reachable_with_depth([fn for fn, _ in starts], nexts)
    leaves = {id(fn): fn for fn in reachable if type(fn).__name__ == "AccumulateGrad"}
    return Structure(reachable, starts, leaves, depth=depth, nexts=nexts)


def pass_structure(roots: Sequence[Any]) -> Structure:
    """``structure(roots, users=True)``: what the tracer reads of every pass's graph before it runs."""
    return structure(roots, users=True)


def _walked(starts: list[Any], edges: list[tuple[Any, int]]) -> Structure:
    """:func:`structure`'s Structure with its ``consumers`` made in the same breadth-first walk (the order of
    :func:`_reachable_with_depth`, and of :attr:`Structure.consumers`: node by node, slot by slot); the leaves are
    found among the nodes with no inputs (an ``AccumulateGrad`` has none).  tests/test_perf_build.py compares the
    two."""
    order: list[Any] = []
    nexts: list[tuple] = []
    leaves: dict[int, Any] = {}
    consumers: dict[tuple[int, int], list[tuple[Any, int]]] = {}
    seen: set[int] = set()
    add, keep, record = seen.add, nexts.append, order.append
    level = [node for node in starts if node is not None]
    depth = 0
    while level:
        depth += 1
        following: list[Any] = []
        wait = following.append
        for fn in level:
            key = id(fn)
            if key in seen:
                continue
            add(key)
            record(fn)
            inputs = fn.next_functions
            keep(inputs)
            if not inputs:
                if type(fn).__name__ == "AccumulateGrad":
                    leaves[key] = fn
                continue
            slot = 0
            for next_fn, output_nr in inputs:
                if next_fn is not None:
                    next_key = id(next_fn)
                    users = consumers.get((next_key, output_nr))
                    if users is None:
                        consumers[(next_key, output_nr)] = [(fn, slot)]
                    else:
                        users.append((fn, slot))
                    if next_key not in seen:
                        wait(next_fn)
                slot += 1
        level = following
    return Structure(order, edges, leaves, consumers, depth=depth, nexts=nexts)


def _reachable(starts: list[Any]) -> list[Any]:
    """Every backward function reachable from ``starts``, breadth first, each once."""
    return _reachable_with_depth(starts)[0]


def _reachable_with_depth(starts: list[Any], nexts: list[tuple] | None = None) -> tuple[list[Any], int]:
    """Like :func:`_reachable`, and the number of breadth-first levels (how deep the graph is); ``nexts``, when
    given, receives each node's ``next_functions`` in the same order."""
    order: list[Any] = []
    keep = nexts.append if nexts is not None else None
    seen: set[int] = set()
    level = [node for node in starts if node is not None]
    depth = 0
    while level:
        depth += 1
        following = []
        for fn in level:
            key = id(fn)
            if key in seen:
                continue
            seen.add(key)
            order.append(fn)
            edges = fn.next_functions
            if keep is not None:
                keep(edges)
            for next_fn, _ in edges:
                if next_fn is not None and id(next_fn) not in seen:
                    following.append(next_fn)
        level = following
    return order, depth


def _leaf_uses(nexts: list[tuple], leaf_labels: dict[int, str]) -> dict[int, int]:
    """``id(AccumulateGrad)`` → how many inputs of these functions (their ``next_functions``) it is."""
    uses: dict[int, int] = {}
    for following in nexts:
        for next_fn, _ in following:
            if next_fn is not None:
                key = id(next_fn)
                if key in leaf_labels:
                    uses[key] = uses.get(key, 0) + 1
    return uses


def _uses_of(consumers: dict, leaf_labels: dict[int, str]) -> dict[int, int]:
    """:func:`structure._leaf_uses` of every node, from the users ``Structure.consumers`` holds (a leaf has one
    output): the same counts."""
    uses = {}
    for key in leaf_labels:
        users = consumers.get((key, 0))
        if users:
            uses[key] = len(users)
    return uses


def _within_budget(reachable: list[Any], shape: Structure, max_nodes: int, nexts: list[tuple] | None = None) -> int:
    """How many of the first backward functions (walk order) are drawn: those whose boxes, counting one box per use
    of a leaf (a leaf may be drawn once per use), stay within ``max_nodes``."""
    kept = 0
    boxes = 0
    leaves = shape.leaf_labels or shape.leaves
    for fn, following in zip(reachable, nexts if nexts is not None else shape.edges()):
        cost = 1 if id(fn) not in leaves else 0  # a leaf's boxes are counted at its uses
        for next_fn, _ in following:
            if next_fn is not None and id(next_fn) in leaves:
                cost += 1
        if kept and boxes + cost > max_nodes:
            break
        kept += 1
        boxes += cost
    return kept


# ----------------------------------------------------------------------------- what torch knows of a node


def _metadata(fn: Any) -> tuple:
    """What torch knows of each output of ``fn`` (shape, dtype), read once: each read builds it anew."""
    try:
        return tuple(fn._input_metadata or ())
    except (AttributeError, RuntimeError, TypeError):
        return ()


def _output_shape(metadata: tuple, output_nr: int) -> tuple[int, ...] | None:
    try:
        return tuple(metadata[output_nr].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


def _reduced_dims(fn: Any) -> tuple[int, ...] | None:
    """The dims a ``sum(dim=...)`` / ``mean(dim=...)`` reduced, non-negative (plain ints only: nothing is unpacked)."""
    try:
        dims = getattr(fn, "_saved_dim", None)
        sizes = getattr(fn, "_saved_self_sym_sizes", None)
    except Exception:  # a node type whose attributes cannot be read
        return None
    if dims is None or sizes is None:
        return None
    try:
        rank = len(sizes)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if not dims:  # dim=[] reduces everything
            return tuple(range(rank))
        signed = (int(d) - 2**64 if int(d) >= 2**63 else int(d) for d in dims)  # torch shows dim=-1 as 2**64 - 1
        return tuple(sorted({d % rank if rank else 0 for d in signed}))
    except (TypeError, ValueError):
        return None


def _may_reduce(kind: type) -> bool:
    """Whether :func:`structure._reduced_dims` can find dims on a node of type ``kind``: not on a type of torch's C++
    nodes (no instance attributes) that has no ``_saved_dim``.  Looked up once per type."""
    plain = kind.__getattribute__ is object.__getattribute__ and not hasattr(kind, "__getattr__") \
        and "__dict__" not in dir(kind)
    reduces = not plain or hasattr(kind, "_saved_dim")
    if len(_REDUCING) < 4096:  # one entry per backward function type seen
        _REDUCING[kind] = reduces
    return reduces


_REDUCING: dict[type, bool] = {}
