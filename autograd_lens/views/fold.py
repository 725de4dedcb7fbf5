"""Repeated blocks drawn once: twelve identical transformer layers become one box, "layers.0-11 (x12)".

Two steps, both reading only the model (never torch):

* :func:`~autograd_lens.views.groups.groups_from_parameters` finds the ``nn.Module`` groups of a graph drawn by
  ``graph()`` from its parameters' names; ``Lens(modules=True)`` records the real calls (``BackwardPass.groups``).
* :func:`fold` replaces each run of sibling groups with the same structure (same module class, the same
  backward functions joined by the same arrows, recursively) by one box, with what lies between them in the
  run and the parameters only they use.  ``expand`` keeps named blocks drawn in full.

>>> from autograd_lens.model import Graph, Node, Edge, ModuleGroup
>>> nodes = tuple(Node(f"n{i}", "function", "mul", op="MulBackward0", sequence_nr=i) for i in range(3))
>>> edges = (Edge("e0", "n0", "n1"), Edge("e1", "n1", "n2"))
>>> groups = tuple(ModuleGroup(f"m{i}", f"layers.{i}", "Block", nodes=(f"n{i}",)) for i in range(3))
>>> folded = fold(Graph(nodes, edges), groups)
>>> [(f.label, f.nodes) for f in folded.folds]
[('layers.0-2 (x3)', ('n0', 'n1', 'n2'))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..capture.entry import _pause_collector, _resume_collector
from ..model import Edge, Graph, ModuleGroup, Node
from .frozen import Frozen
from .groups import groups_from_parameters

FOLD_OVER = 60  # a graph with more boxes than this is drawn folded, with its module groups, by default


class Fold(Frozen):
    """One box standing for a run of identical blocks (a frozen dataclass's behaviour: ``views.frozen``)."""

    id: str  # "f1", "f2", … in drawing order
    label: str  # "layers.0-11 (x12)"
    kind: str  # the blocks' module class, e.g. "Block"
    paths: tuple[str, ...]  # each block's module path
    nodes: tuple[str, ...]  # the node ids the box stands for
    functions: int  # backward functions per block
    hooks: int  # hook badges on the boxes folded away (0 unless given)
    in_all: int  # backward functions the box stands for (0: not counted, functions × blocks)
    FIELDS = ("id", "label", "kind", "paths", "nodes", "functions", "hooks", "in_all")
    DEFAULTS = {"hooks": 0, "in_all": 0}

    def detail(self) -> str:  # blocks found from parameters' names leave the ops after their last parameter between
        each = not self.in_all or self.in_all == self.functions * len(self.paths)  # them: "each" would undercount
        text = f"{self.kind} · " + (f"{self.functions} backward functions each" if each else
                                    f"{self.in_all} backward functions in all")
        return text + (f"\n{self.hooks} hook{'s' if self.hooks != 1 else ''} inside" if self.hooks else "")


class Folded(Frozen):
    """A graph with its runs of blocks folded: the graph to draw, its remaining groups, the folds."""

    graph: Graph
    groups: tuple[ModuleGroup, ...]
    folds: tuple[Fold, ...]
    FIELDS = ("graph", "groups", "folds")


# ----------------------------------------------------------------------------- folding

def fold(graph: Graph, groups: Sequence[ModuleGroup], expand: Iterable[str] = (), _known=None) -> Folded:
    """Fold each run of two or more sibling groups of the same structure into one box.

    ``expand`` names blocks to keep drawn in full (a path or its end: ``"layers.3"``); ``"all"`` folds nothing.
    ``_known``: the groups' ``(_inside, _signatures)`` already found (the same for every ``expand``: see ``plan``).
    """
    expand = tuple(expand)
    if not groups or "all" in expand:
        return Folded(graph, tuple(groups), ())
    inside, signature = _known or (None, None)
    if inside is None:
        inside = _inside(groups)
        signature = _signatures(graph, groups, inside)
    children: dict[int | None, list[int]] = {}
    for index, group in enumerate(groups):
        children.setdefault(group.parent, []).append(index)
    runs: list[tuple[int | None, list[int]]] = []
    pending: list[int | None] = [None]
    while pending:
        parent = pending.pop(0)
        siblings = children.get(parent, [])
        folded: set[int] = set()
        for run in _runs(siblings, signature, groups):
            for segment in _split(run, groups, expand):
                runs.append((parent, segment))
                folded.update(segment)
        pending.extend(i for i in siblings if i not in folded)
    return _apply(graph, groups, inside, sorted(runs, key=lambda r: r[1][0]))


def _inside(groups: Sequence[ModuleGroup]) -> list[set[str]]:
    inside = [set(group.nodes) for group in groups]
    for index in range(len(groups) - 1, -1, -1):  # children come after their parent
        parent = groups[index].parent
        if parent is not None:
            inside[parent] |= inside[index]
    return inside


def _signatures(graph: Graph, groups: Sequence[ModuleGroup], inside: list[set[str]]) -> list[tuple]:
    """Each group's structure: class, its own boxes, its arrows (by the ops at their ends), its children's."""
    def shape(node_id: str) -> tuple[str, str]:
        node = graph.node(node_id)
        return node.kind, node.op

    signature: list[tuple] = [()] * len(groups)
    children: dict[int, list[int]] = {}  # in order: the same kids, in the same order, as a scan of every later group
    for number, member in enumerate(groups):
        if member.parent is not None:
            children.setdefault(member.parent, []).append(number)
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        arrows = _counted((shape(e.src), shape(e.dst), e.kind) for n in inside[index] for e in graph.edges_from(n)
                          if e.dst in inside[index])
        kids = tuple(signature[i] for i in children.get(index, ()) if i > index)
        signature[index] = (group.kind, _counted(map(shape, group.nodes)), arrows, kids)
    return signature


def _counted(items) -> tuple:
    """``tuple(sorted(Counter(items).items()))``, counted here: a group holds a few items, and making a Counter
    cost more than counting them (two per group on the path of a first picture)."""
    counts: dict = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return tuple(sorted(counts.items()))


def _next_in_line(first: str | None, second: str | None) -> bool:
    """``layers.3`` then ``layers.4`` (a ModuleList's or Sequential's blocks), or one module called again."""
    if first is None or second is None or first == second:
        return first == second
    a, b = _NUMBERED.match(first), _NUMBERED.match(second)
    return bool(a and b and a.group(1) == b.group(1) and int(b.group(2)) == int(a.group(2)) + 1)


def _runs(siblings: list[int], signature: list[tuple], groups: Sequence[ModuleGroup]) -> list[list[int]]:
    runs, current = [], []
    for index in siblings:
        if current and signature[index] == signature[current[-1]] \
                and _next_in_line(groups[current[-1]].path, groups[index].path):
            current.append(index)
            continue
        if len(current) > 1:
            runs.append(current)
        current = [index]
    if len(current) > 1:
        runs.append(current)
    return [run for run in runs if any(kind == "function" for (kind, _), _ in signature[run[0]][1])
            or signature[run[0]][3]]


def _split(run: list[int], groups: Sequence[ModuleGroup], expand: tuple[str, ...]) -> list[list[int]]:
    """The run without the blocks asked to be expanded: the parts of two or more blocks."""
    def wanted(group: ModuleGroup) -> bool:
        path = group.path or ""
        return any(path == name or path.endswith("." + name) for name in expand)

    parts, current = [], []
    for index in run:
        if wanted(groups[index]):
            parts.append(current)
            current = []
        else:
            current.append(index)
    parts.append(current)
    return [part for part in parts if len(part) > 1]


_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def fold_label(paths: Sequence[str | None], kind: str) -> str:
    """``layers.0-11 (x12)``: the blocks' container (its last name, and the numbered block holding it: each
    opened layer's own run reads ``layers.3.subs.0-2 (x3)``), their numbers, the count.

    >>> fold_label(["model.layers.0", "model.layers.1", "model.layers.2"], "Block")
    'layers.0-2 (x3)'
    >>> fold_label(["model.layers.3.subs.0", "model.layers.3.subs.1"], "Sub")
    'layers.3.subs.0-1 (x2)'
    """
    count = len(paths)
    if any(p is None for p in paths):
        return f"{kind} (x{count})"
    if len(set(paths)) == 1:
        return f"{paths[0].rpartition('.')[2]} (x{count} calls)"
    first, last = _NUMBERED.match(paths[0]), _NUMBERED.match(paths[-1])
    parts = first.group(1).split(".")
    container = ".".join(parts[-3:]) if len(parts) >= 3 and parts[-2].isdigit() else parts[-1]
    return f"{container}.{first.group(2)}-{last.group(2)} (x{count})"


def _apply(graph: Graph, groups: Sequence[ModuleGroup], inside: list[set[str]],
           runs: list[tuple[int | None, list[int]]]) -> Folded:
    owner: dict[str, str] = {}  # node id -> fold id
    folds: list[Fold] = []
    direct_of: dict[int | None, set[str]] = {None: {n.id for n in graph.nodes} - set().union(*inside)}
    for index, group in enumerate(groups):
        direct_of[index] = set(group.nodes)
    for number, (parent, run) in enumerate(runs, start=1):
        fold_id = f"f{number}"
        members = set().union(*(inside[i] for i in run))
        numbers = [graph.node(n).sequence_nr for n in members if graph.node(n).sequence_nr is not None]
        low, high = (min(numbers), max(numbers)) if numbers else (0, -1)
        between = {n for n in direct_of[parent] if graph.node(n).kind == "function"
                   and graph.node(n).sequence_nr is not None and low <= graph.node(n).sequence_nr <= high}
        members |= between | _attached(graph, members | between)
        members = {n for n in members if graph.node(n).kind not in ("output", "hidden")}
        for node_id in members:
            owner[node_id] = fold_id
        first = groups[run[0]]
        functions = sum(1 for n in inside[run[0]] if graph.node(n).kind == "function")
        hooks = sum(len(graph.node(n).hooks) for n in members)
        label = fold_label([groups[i].path for i in run], first.kind)
        order = [n.id for n in graph.nodes if n.id in members]
        in_all = sum(graph.node(n).kind == "function" for n in members)
        folds.append(Fold(fold_id, label, first.kind, tuple(groups[i].path or "" for i in run), tuple(order),
                          functions, hooks, in_all))
    # leaves (parameters) used only inside one fold go into it
    for node in graph.nodes:
        if node.kind == "leaf" and node.id not in owner:
            ends = {owner.get(e.dst) for e in graph.edges_from(node.id)}
            if len(ends) == 1 and None not in ends:
                owner[node.id] = ends.pop()
    by_id = {f.id: f for f in folds}
    folds = [Fold(f.id, f.label, f.kind, f.paths, tuple(n.id for n in graph.nodes if owner.get(n.id) == f.id),
                  f.functions, f.hooks, f.in_all) for f in folds]
    return Folded(_folded_graph(graph, owner, {f.id: f for f in folds}), _kept_groups(groups, runs, owner),
                  tuple(folds)) if by_id else Folded(graph, tuple(groups), ())


def _attached(graph: Graph, functions: set[str]) -> set[str]:
    """Named tensors made by these functions, and saved values kept only by them."""
    extra = set()
    for node in graph.nodes:
        if node.kind in ("tensor", "output") and any(e.src in functions for e in graph.edges_into(node.id)):
            extra.add(node.id)
        elif node.kind in ("saved", "constant"):
            keepers = {e.dst for e in graph.edges_from(node.id)}
            if keepers and keepers <= functions:
                extra.add(node.id)
    return extra


def _folded_graph(graph: Graph, owner: dict[str, str], folds: dict[str, Fold]) -> Graph:
    nodes: list[Node] = []
    placed: set[str] = set()
    for node in graph.nodes:
        fold_id = owner.get(node.id)
        if fold_id is None:
            nodes.append(node)
        elif fold_id not in placed:
            placed.add(fold_id)
            box = folds[fold_id]
            nodes.append(Node(fold_id, "folded", box.label, detail=box.detail()))
    edges: list[Edge] = []
    seen: set[tuple[str, str, str]] = set()
    for edge in graph.edges:
        src, dst = owner.get(edge.src, edge.src), owner.get(edge.dst, edge.dst)
        if src == dst or (src, dst, edge.kind) in seen:
            continue
        seen.add((src, dst, edge.kind))
        merged = src != edge.src or dst != edge.dst
        edges.append(Edge(edge.id, src, dst, edge.kind, "") if merged else edge)  # kept: no copy (fewer objects)
    return Graph(tuple(nodes), tuple(edges), graph.hidden_nodes, graph.options)


def _kept_groups(groups: Sequence[ModuleGroup], runs: list[tuple[int | None, list[int]]],
                 owner: dict[str, str]) -> tuple[ModuleGroup, ...]:
    """The groups still drawn, renumbered; each fold's box sits in the group that held its run."""
    gone: set[int] = {index for _, run in runs for index in run}
    changed = True
    while changed:  # everything inside a folded group is gone too
        changed = False
        for index, group in enumerate(groups):
            if index not in gone and group.parent in gone:
                gone.add(index)
                changed = True
    renumber = {index: number for number, index in enumerate(i for i in range(len(groups)) if i not in gone)}
    boxes: dict[int | None, list[str]] = {}
    for number, (parent, _) in enumerate(runs, start=1):
        boxes.setdefault(parent, []).append(f"f{number}")
    kept = []
    for index, group in enumerate(groups):
        if index in gone:
            continue
        nodes = tuple(n for n in group.nodes if n not in owner) + tuple(boxes.get(index, ()))
        kept.append(ModuleGroup(group.id, group.path, group.kind, group.call, group.calls,
                                renumber[group.parent] if group.parent is not None else None, nodes))
    return tuple(kept)


# ----------------------------------------------------------------------------- what graph() and to_dot use

WALK_FURTHER = 10  # folding on: the walk may go this many times past max_nodes; what is drawn stays within it


def plan(graph: Graph) -> Folded:
    """What to draw for a graph made by ``graph()``: past ``FOLD_OVER`` boxes, with its named modules, the
    module groups and the folds (unless ``fold=False``); otherwise the graph as it is."""
    options = graph.options
    if not (options and options.fold and graph.modules and len(graph.nodes) > FOLD_OVER):
        return Folded(graph, (), ())
    known = graph.__dict__.get("_folded")  # graph(), to_dot and the navigator each plan the graph they draw
    if known is None:
        # the groups and their structure do not depend on expand: found once for a graph and its expanded copies
        base = graph.__dict__.get("_base", graph)
        structure = base.__dict__.get("_structure")
        if structure is None:
            groups = groups_from_parameters(base, dict(base.modules))
            inside = _inside(groups)
            structure = base.__dict__["_structure"] = (groups, inside, _signatures(base, groups, inside))
        known = fold(graph, structure[0], options.expand, structure[1:])
        graph.__dict__["_folded"] = known  # kept with the graph (frozen: it cannot go stale), like its _index
    return known


def folded_walk(walk_to, modules: tuple[tuple[str, str], ...], options) -> Graph:
    """``walk_to(limit)`` walks the graph drawing at most ``limit`` backward functions.  A graph that folds to
    within ``options.max_nodes`` functions is walked whole (up to ``WALK_FURTHER`` times the limit); one that does
    not is walked as without folding, and what is drawn of it is folded.  No cyclic collection runs meanwhile
    (``capture.entry._pause_collector``: the walk keeps most of what it makes; the collector left as found)."""
    import dataclasses

    def functions(graph: Graph) -> int:
        return sum(1 for node in graph.nodes if node.kind == "function")

    collecting = _pause_collector()
    try:
        whole = dataclasses.replace(walk_to(options.max_nodes * WALK_FURTHER), modules=modules, options=options)
        if functions(whole) <= options.max_nodes:
            return whole
        if not whole.hidden_nodes and functions(plan(whole).graph) <= options.max_nodes:
            return whole
        return dataclasses.replace(walk_to(options.max_nodes), modules=modules, options=options)
    finally:
        _resume_collector(collecting)


# ----------------------------------------------------------------------------- drawings with folds opened

VARIANT_LAYOUTS = 8  # drawings with folds opened, laid out in advance, per graph
VARIANT_BOXES = 300  # boxes in all those drawings: each costs layout time before the first picture, and page size


Run = tuple[str, ...]  # the module paths of blocks drawn in full together (one block, or a short run)
State = tuple[Run, ...]  # the runs drawn in full, sorted


def opened_run(paths: Run) -> Run:
    """What a click on a folded box of these blocks draws in full: its first block alone when the box holds three
    or more (the rest stay folded, "layers.1-11 (x11)", and a click on that opens the next), else all of them (two
    blocks; one module called many times, whose calls a path cannot tell apart).  One block shows the run's
    structure at a ninth of the layout time of twelve."""
    return paths[:1] if len(paths) > 2 and len(set(paths)) == len(paths) else paths


def expanded(graph: Graph, state: State) -> Graph:
    """``graph`` with the blocks of these runs drawn in full (added to its own ``expand``); the same object each
    time (kept with the graph), so that its plan is made once (``fold.plan``)."""
    made = graph.__dict__.setdefault("_expanded", {})
    if state not in made:
        extra = tuple(path for run in state for path in run)
        made[state] = replace(graph, options=graph.options.replace(expand=graph.options.expand + extra))
        base = made[state].__dict__["_base"] = graph.__dict__.get("_base", graph)  # same nodes, edges, modules
        made[state].__dict__["_index"] = base._index  # so the same lookups (fewer objects kept: see fold_states)
    return made[state]


def fold_states(graph: Graph, layouts: int | None = None, boxes: int | None = None) -> list[tuple[State, Folded]]:
    """The folded drawing's state (first) and the states reached by opening folds, breadth first, within the
    budget (default ``VARIANT_LAYOUTS`` and ``VARIANT_BOXES``; no layout here: ``boxes`` counts what each draws)."""
    layouts = VARIANT_LAYOUTS if layouts is None else layouts
    boxes = VARIANT_BOXES if boxes is None else boxes
    states = [((), plan(graph))]
    known = {()}
    used = 0
    at = 0
    while at < len(states):
        state, folded = states[at]
        at += 1
        for box in folded.folds:
            child = tuple(sorted(set(state) | {opened_run(box.paths)}))
            if child in known or len(states) > layouts:
                continue
            drawn = plan(expanded(graph, child))
            if used + len(drawn.graph.nodes) > boxes:
                continue
            known.add(child)
            used += len(drawn.graph.nodes)
            states.append((child, drawn))
    return states
