"""The Python doors: ``graph()`` here, ``Lens`` in :mod:`autograd_lens.capture.tracer`."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .capture.entry import _pause_collector, _resume_collector
from .capture.names import caller_namespace, names_from, user_frame
from .capture.walk import walk
from .model import Graph, GraphOptions
from .views.drawn import remembered


def graph(
    *roots: torch.Tensor,
    names: Mapping[str, Any] | None = None,
    max_elements: int = 16,
    max_nodes: int = 300,
    direction: str = "forward",
    legend: bool = False,
    show_saved: bool = True,
    split_leaf_uses: int = 4,
    fold: bool = True,
    expand: str | Sequence[str] = (),
) -> Graph:
    """The autograd graph behind ``roots``, labelled with your variable names.

    ``names`` is the namespace used for labels (default: the caller's globals
    and locals).  Tensors with at most ``max_elements`` entries show their
    values; at most ``max_nodes`` backward functions are drawn.  Past about 60 boxes the drawing outlines the
    named modules (found from their parameters' names) and draws each run of identical blocks as one box,
    "layers.0-11 (x12)"; ``expand="layers.3"`` (or a list) draws those blocks in full, ``fold=False`` nothing folded.

    >>> import torch, autograd_lens
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> y = x ** 2
    >>> g = autograd_lens.graph(y)
    >>> g.find("x").value
    tensor(2.)
    >>> "PowBackward0" in g.to_dot()
    True
    """
    if not roots:
        raise TypeError("graph() needs at least one tensor, e.g. graph(loss)")
    numbers = {"max_elements": (max_elements, 0), "max_nodes": (max_nodes, 1), "split_leaf_uses": (split_leaf_uses, 0)}
    if not (names is None or isinstance(names, Mapping)) \
            or not all(type(value) is int and value >= lowest for value, lowest in numbers.values()):
        from .capture.tracer import _check_options  # the tracer's messages (the tracer is not loaded otherwise)

        _check_options(names, **numbers)
    options = GraphOptions(
        max_elements=max_elements,
        max_nodes=max_nodes,
        direction=direction,
        legend=legend,
        show_saved=show_saved,
        split_leaf_uses=split_leaf_uses,
        fold=bool(fold),
        expand=(expand,) if isinstance(expand, str) else tuple(expand),
    )
    if names is None:
        names = caller_namespace(user_frame(sys._getframe(1)))
    found = names_from(names)
    modules = tuple((found.modules[id(m)], type(m).__name__) for m in found.module_objects)
    if not (fold and modules):
        collecting = _pause_collector()  # the walk keeps most of what it makes (as folded_walk's): no collection in it
        try:
            return remembered(walk(roots, found, options).graph, found)
        finally:
            _resume_collector(collecting)
    from .views.fold import folded_walk

    drawn = folded_walk(lambda limit: walk(roots, found, options.replace(max_nodes=limit)).graph, modules, options)
    return remembered(_with_grad_norms(drawn, found), found)


def _with_grad_norms(drawn: Graph, found: Any) -> Graph:
    """Parameters' ``.grad`` kept as summaries get their norm (one reduction each), which the drawing shows as
    the size of the gradient (``views.gradsize``).  Nothing else is read or changed.  A graph with no such summary
    (a first picture after the forward pass: no ``.grad`` yet) is returned as it is, before any lookup is built."""
    from .model import TensorSummary

    if not any(node.kind == "leaf" and isinstance(node.grad, TensorSummary) for node in drawn.nodes):
        return drawn
    import dataclasses

    by_name = {found.tensors[id(t)]: t for t in found.tensor_objects}
    nodes, changed = [], False
    for node in drawn.nodes:
        summary = node.grad
        if node.kind == "leaf" and isinstance(summary, TensorSummary) and summary.norm is None \
                and summary.kind == "dense":
            grad = getattr(by_name.get(node.label), "grad", None)
            if grad is not None and tuple(grad.shape) == tuple(summary.shape) and grad.layout == torch.strided:
                with torch.no_grad():
                    norm = float(grad.detach().double().norm())
                node, changed = dataclasses.replace(node, grad=dataclasses.replace(summary, norm=norm)), True
        nodes.append(node)
    return dataclasses.replace(drawn, nodes=tuple(nodes)) if changed else drawn
