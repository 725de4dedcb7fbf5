"""Module groups of a graph drawn by ``graph()``, which sees no forward call: found from the parameters' names.

A module holds the backward functions made between the first and the last use of its own parameters (autograd
numbers nodes in the order the forward made them); what it does before its first or after its last parameter (a
residual add at the end of a block) is drawn just outside it.  A module whose parameters are used across a
sibling's span (a weight tied to another layer) is not drawn as a group.  ``Lens(modules=True)`` records the real
calls instead (``BackwardPass.groups``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from ..model import Graph, ModuleGroup
from ..model.graph import attach_to_groups


def groups_from_parameters(graph: Graph, modules: Mapping[str, str]) -> tuple[ModuleGroup, ...]:
    """Module groups of ``graph`` from its parameters' names (``modules``: module path → class name)."""
    spans = _parameter_spans(graph, modules)
    paths = sorted(spans, key=lambda p: (spans[p][0], -spans[p][1], p.count(".")))
    parent: dict[str, str | None] = {}
    for path in paths:  # the nearest enclosing path that has a span: parents come first in this order
        owner = path.rpartition(".")[0]
        while owner and owner not in spans:
            owner = owner.rpartition(".")[0]
        parent[path] = owner or None
    paths = _without_crossing(paths, spans, parent)
    made = _assign(graph, paths, spans, parent)
    used = set(made.values())
    for path in list(used):
        while parent.get(path):
            path = parent[path]
            used.add(path)
    order = [p for p in paths if p in used]
    index = {path: i for i, path in enumerate(order)}
    members: dict[str, list[str]] = {path: [] for path in order}
    for node in graph.nodes:
        if node.id in made:
            members[made[node.id]].append(node.id)
    return tuple(
        ModuleGroup(id=f"m{i + 1}", path=path, kind=modules.get(path, "Module"),
                    parent=index[parent[path]] if parent.get(path) else None, nodes=tuple(members[path]))
        for i, path in enumerate(order)
    )


def _parameter_spans(graph: Graph, modules: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """Module path → (first, last) number of the backward functions that use its parameters or its children's."""
    spans: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.kind != "leaf":
            continue
        owner = node.label.rpartition(".")[0]
        if owner not in modules:
            continue
        numbers = [graph.node(e.dst).sequence_nr for e in graph.edges_from(node.id)]
        numbers = [n for n in numbers if n is not None]
        if not numbers:
            continue
        low, high = min(numbers), max(numbers)
        path = owner
        while path:
            if path in modules:
                old = spans.get(path, (low, high))
                spans[path] = (min(old[0], low), max(old[1], high))
            path = path.rpartition(".")[0]
    return spans


def _without_crossing(paths: list[str], spans: dict, parent: dict) -> list[str]:
    """Drop modules whose span crosses a sibling's (the wider one: a tied weight used at both ends)."""
    dropped: set[str] = set()
    changed = True
    while changed:
        changed = False
        live = [p for p in paths if p not in dropped]
        by_parent: dict[str | None, list[str]] = {}
        for path in live:
            by_parent.setdefault(parent[path], []).append(path)
        for siblings in by_parent.values():
            for first, second in zip(siblings, siblings[1:]):
                if spans[second][0] <= spans[first][1]:
                    wider = max((first, second), key=lambda p: (spans[p][1] - spans[p][0], p))
                    dropped.add(wider)
                    for path in live:  # its children now belong to its parent
                        if parent[path] == wider:
                            parent[path] = parent[wider]
                    changed = True
                    break
            if changed:
                break
    return [p for p in paths if p not in dropped]


def _assign(graph: Graph, paths: list[str], spans: dict, parent: dict) -> dict[str, str]:
    """Node id → the innermost module path whose span holds it (functions by number; a named tensor with the
    function that made it, a saved value with the one function that keeps it; leaves stay outside)."""
    depth = {path: 0 for path in paths}
    for path in paths:
        if parent.get(path):
            depth[path] = depth[parent[path]] + 1
    # A sweep over the functions by number: the paths whose span has begun and not yet ended hold it (the same
    # holders, and the same choice among them, as testing every path for every function, in linear-ish time).
    functions = sorted((node.sequence_nr, node.id) for node in graph.nodes
                       if node.kind == "function" and node.sequence_nr is not None)
    starts = sorted(range(len(paths)), key=lambda i: spans[paths[i]][0])
    active: set[int] = set()
    ends: list[tuple[int, int]] = []
    found: dict[str, str] = {}
    begun = 0
    for number, node_id in functions:
        while begun < len(starts) and spans[paths[starts[begun]]][0] <= number:
            index = starts[begun]
            active.add(index)
            heapq.heappush(ends, (spans[paths[index]][1], index))
            begun += 1
        while ends and ends[0][0] < number:
            active.discard(heapq.heappop(ends)[1])
        if active:  # innermost first; among equals the first in ``paths``, as max() over them in order would pick
            best = max(active, key=lambda i: (depth[paths[i]], spans[paths[i]][0], -i))
            found[node_id] = paths[best]
    made = {node.id: found[node.id] for node in graph.nodes if node.id in found}
    attach_to_groups(graph, made)
    return made
