"""Gradient size on the drawing: each parameter's box outlined by the size of its ``.grad`` (a legend says the
ranges), and each module's gradient norm on its outline, so the eye finds where gradients vanish or explode.

Sizes are norms (``sqrt`` of the sum of squares) of what ``.grad`` held when the graph was drawn; a module's norm
is over all the parameters under it.  A gradient kept only as a summary without a norm is left out (unknown).

>>> import torch
>>> grad_norm(torch.tensor([3.0, 4.0]))
5.0
>>> [b.text for b in size_bins([1e-6, 1e-3, 1.0])]
['grad norm 1e-06 to 3.162e-05', 'grad norm 3.162e-05 to 0.001', 'grad norm 0.001 to 0.03162', 'grad norm 0.03162 to 1.0']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from ..model import Graph, ModuleGroup, TensorSummary
from ..numbers import format_number
from .frozen import Frozen

# small → large: light to dark, thin to thick (readable in print and for colour-blind readers: width says it too)
SIZE_COLORS = ("#93c5fd", "#3b82f6", "#c2410c", "#7f1d1d")
SIZE_WIDTHS = ("1", "2", "3.5", "5")


class SizeBin(Frozen):
    """One step of the gradient sizes (a frozen dataclass's behaviour: ``views.frozen``)."""

    low: float
    high: float
    color: str
    width: str
    FIELDS = ("low", "high", "color", "width")

    @property
    def text(self) -> str:
        if self.high == 0:
            return "grad norm 0 (all zeros)"
        return f"grad norm {format_number(self.low)} to {format_number(self.high)}"


# a .grad of zeros (a dead ReLU's layer): its own step, not the smallest non-zero one; grey, dashed (dot.py)
ZERO_BIN = SizeBin(0.0, 0.0, "#9ca3af", "1")


def grad_norm(value) -> float | None:
    """The norm of a recorded gradient, or None when not known."""
    if value is None:
        return None
    if isinstance(value, TensorSummary):
        return value.norm
    try:
        return float(value.detach().abs().double().norm())
    except Exception:  # a value whose numbers cannot be read (meta, sparse): unknown
        return None


def size_bins(norms: Sequence[float]) -> list[SizeBin]:
    """Four equal steps on a log scale between the smallest and the largest non-zero norm."""
    positive = [n for n in norms if n and math.isfinite(n) and n > 0]
    if not positive:
        return []
    low, high = math.log10(min(positive)), math.log10(max(positive))
    if high - low < 1e-9:
        high = low + 1.0
    edges = [low + (high - low) * i / len(SIZE_COLORS) for i in range(len(SIZE_COLORS) + 1)]
    return [SizeBin(float(f"{10 ** edges[i]:.4g}"), float(f"{10 ** edges[i + 1]:.4g}"), color, width)
            for i, (color, width) in enumerate(zip(SIZE_COLORS, SIZE_WIDTHS))]


def leaf_sizes(graph: Graph) -> dict[str, float]:
    """Leaf node id → the norm of its .grad (leaves whose .grad is known)."""
    sizes = {}
    for node in graph.nodes:
        if node.kind == "leaf":
            norm = grad_norm(node.grad)
            if norm is not None and math.isfinite(norm):
                sizes[node.id] = norm
    return sizes


def bin_of(norm: float, bins: Sequence[SizeBin]) -> SizeBin | None:
    if not bins:
        return None
    if norm <= 0:
        return bins[0]
    for size_bin in bins:
        if norm <= size_bin.high * (1 + 1e-9):
            return size_bin
    return bins[-1]


def module_norms(graph: Graph, paths: Sequence[str]) -> dict[str, float]:
    """Module path → the norm of the gradients of every parameter under it (drawn leaves named ``path.…``);
    each parameter counted once, however many copies of its box are drawn."""
    squares: dict[str, float] = {}
    unknown: set[str] = set()  # a module with one parameter whose gradient's norm is not known: not known
    seen: set[str] = set()
    wanted = set(paths)
    for node in graph.nodes:
        if node.kind != "leaf" or node.label in seen:
            continue
        seen.add(node.label)
        norm = grad_norm(node.grad)
        path = node.label.rpartition(".")[0]
        while path:
            if path in wanted:
                if norm is None or not math.isfinite(norm):
                    unknown.add(path)
                else:
                    squares[path] = squares.get(path, 0.0) + norm * norm
            path = path.rpartition(".")[0]
    return {path: math.sqrt(total) for path, total in squares.items() if path not in unknown}


def group_label(group: ModuleGroup, norms: dict[str, float]) -> str:
    """``model.layers.3 · Block · grad norm 0.012`` (without the last part when not known)."""
    norm = norms.get(group.path or "")
    return group.describe() + (f" · grad norm {format_number(norm)}" if norm is not None else "")


def blocks_text(paths: Sequence[str], norms: dict[str, float]) -> str:
    """For a folded run: its blocks' gradient norms, first to last (where a gradient vanishes shows here)."""
    known = [norms.get(path) for path in paths]
    if any(n is None for n in known) or not known:
        return ""
    if len(known) <= 4:
        return "grad norm per block: " + ", ".join(format_number(n) for n in known)
    return (f"grad norm per block: {format_number(known[0])}, {format_number(known[1])} … "
            f"{format_number(known[-1])} (min {format_number(min(known))}, max {format_number(max(known))})")


class Sizes(Frozen):
    """What the drawing adds for gradient sizes: group labels, leaf outlines and the legend's bins."""

    graph: Graph  # the drawn graph, each folded box's text with its blocks' norms
    labels: dict[str, str]  # group id -> label
    outlines: dict[str, SizeBin]  # leaf node id -> its size bin
    bins: list[SizeBin]
    FIELDS = ("graph", "labels", "outlines", "bins")


def sizes_for(original: Graph, drawn) -> Sizes:
    """Gradient sizes for a folded drawing (``drawn``: a :class:`~autograd_lens.views.fold.Folded`) of ``original``."""
    import dataclasses

    paths = [g.path for g in drawn.groups if g.path] + [p for f in drawn.folds for p in f.paths]
    norms = module_norms(original, paths)
    labels = {g.id: group_label(g, norms) for g in drawn.groups}
    texts = {f.id: blocks_text(f.paths, norms) for f in drawn.folds}
    graph = drawn.graph
    if any(texts.values()):
        nodes = tuple(dataclasses.replace(n, detail=f"{n.detail}\n{texts[n.id]}") if texts.get(n.id) else n
                      for n in graph.nodes)
        graph = Graph(nodes, graph.edges, graph.hidden_nodes, graph.options)
    sizes = leaf_sizes(graph)
    bins = size_bins(list(sizes.values()))
    outlines = {node_id: bin_of(norm, bins) for node_id, norm in sizes.items() if norm > 0} if bins else {}
    if any(norm == 0 for norm in sizes.values()):
        outlines.update({node_id: ZERO_BIN for node_id, norm in sizes.items() if norm == 0})
        bins = [ZERO_BIN, *bins]
    return Sizes(graph, labels, outlines, bins)
