"""What a step card calls the inputs of an op: the drawn node each input slot is, and a name a reader can tell
apart from the others (``mul(a, b)`` and ``mul(b, a)``; ``mul₁`` and ``mul₂``)."""

from __future__ import annotations

from typing import Any

from ..model import Graph, NodeRun

NO_GRAD = "(no grad needed)"
_ORDINALS = ("1st", "2nd", "3rd")
_SUBSCRIPTS = "₀₁₂₃₄₅₆₇₈₉"
_SHORT = 40  # longest "op(inputs)" name a card uses


def ordinal(slot: int) -> str:
    return _ORDINALS[slot] if slot < len(_ORDINALS) else f"{slot + 1}th"


def input_keys(event: NodeRun, graph: Graph) -> list[Any]:
    """What each input slot is: the drawn node its gradient goes to, so that one tensor used twice (``y * y``) is
    told from two tensors that share a name (two unnamed ``mul`` results); a slot whose arrow is not drawn is
    its own input."""
    keys: list[Any] = []
    for slot, target in enumerate(event.targets):
        edge_id = event.edges[slot] if slot < len(event.edges) else None
        keys.append(_one_leaf(graph, graph.edge(edge_id).src) if edge_id else ("slot", slot))
    return keys


def _one_leaf(graph: Graph, node_id: str) -> str:
    """A leaf used many times is drawn once per use ("use 2 of 5"): each of those boxes is the same tensor, known
    by its first box (``x * x`` sends both gradients to x, not to two different tensors)."""
    node = graph.node(node_id)
    if node.kind in ("leaf", "output") and node.op.endswith("AccumulateGrad") and node.detail.startswith("use "):
        return next((n.id for n in graph.nodes_labelled(node.label) if n.kind == node.kind
                     and n.op == node.op and n.detail.startswith("use ")), node_id)
    return node_id


def output_name(event: NodeRun, graph: Graph) -> str:
    """The name of what the op computed: its tensor's name, or the op itself (``addmm``); an op drawn as a call
    (``t()``, the user has a tensor ``t``) by what flows into it (``t(layer.weight)``)."""
    name = next((graph.node(graph.edge(edge_id).dst).label for edge_id in event.in_edges if edge_id), None)
    if name is None:
        name = graph.node(event.node).label if event.node else "out"
    if name.endswith("()") and event.node and name == graph.node(event.node).label:
        called = _called_with(graph, event.node, name[:-2])
        return called if called and len(called) <= _SHORT else name
    return name


def card_targets(event: NodeRun, graph: Graph, keys: list[Any] | None = None) -> list[str]:
    """What a card calls each input of the op: its label, told apart when two different inputs share one
    (``a * b + b * a`` sends to ``mul(a, b)`` and ``mul(b, a)``; when even that does not tell them apart,
    ``mul₁`` and ``mul₂`` in the order of the op's inputs: :func:`numbered_note` says so on the card).
    ``keys``: the node's :func:`input_keys`, when the caller has them already."""
    keys = input_keys(event, graph) if keys is None else keys
    names = list(event.targets)
    out = output_name(event, graph)
    for slot, name in enumerate(names):
        # an unnamed input called like the op itself or its result (``addmm = bias + addmm @ t``), or torch's ``t`` of
        # a weight: named by what flows into it (``addmm(…)``, ``t(layer.weight)``)
        made_by = _through_boundaries(graph, keys[slot])
        if (name in (out, event.label, "t") or name.endswith("()")) and name == graph_label(graph, made_by):
            called = _called_with(graph, made_by, name[:-2] if name.endswith("()") else name)
            names[slot] = called if called and len(called) <= _SHORT else (f"earlier {name}" if name == out else name)
    for label in {name for name in names if name != NO_GRAD}:
        slots = [slot for slot, name in enumerate(names) if name == label]
        distinct = list(dict.fromkeys(keys[slot] for slot in slots))
        if len(distinct) < 2:
            continue  # one tensor (maybe used twice): its name says which
        called = {key: _called_with(graph, key, label) for key in distinct}
        if None in called.values() or len(set(called.values())) < len(distinct):
            called = {key: label + _subscript(number + 1) for number, key in enumerate(distinct)}
        for slot in slots:
            names[slot] = called[keys[slot]]
    return names


def numbered_note(event: NodeRun, targets: list[str]) -> str:
    """The card's line saying what ``mul₁``, ``mul₂`` are ("" when :func:`card_targets` numbered nothing)."""
    numbered: dict[str, list[str]] = {}
    for original, name in zip(event.targets, targets):
        if name != original and name[len(original):] and set(name[len(original):]) <= set(_SUBSCRIPTS):
            numbered.setdefault(original, [])
            if name not in numbered[original]:
                numbered[original].append(name)
    return " ".join(f"{', '.join(names[:-1])} and {names[-1]} are {len(names)} different unnamed {label} results: this op's inputs "
                    "in order (the highlighted arrows show which is which)." for label, names in numbered.items())


def _subscript(number: int) -> str:
    return "".join(_SUBSCRIPTS[int(digit)] for digit in str(number))


def graph_label(graph: Graph, key: Any) -> str | None:
    """The drawn label of an input's node (None for an input whose arrow is not drawn)."""
    return None if isinstance(key, tuple) else graph.node(key).label


def _through_boundaries(graph: Graph, key: Any) -> Any:
    """The node that made an input, past module hook boundaries (which pass their input through)."""
    seen = 0
    while not isinstance(key, tuple) and graph.node(key).op == "BackwardHookFunctionBackward" and seen < 8:
        sources = [edge.src for edge in graph.edges_into(key) if edge.kind == "data"]
        if len(sources) != 1:
            break
        key, seen = sources[0], seen + 1
    return key


def _called_with(graph: Graph, key: Any, label: str) -> str | None:
    """``mul(a, b)``: a drawn op named by the labels of what flows into it (None when it is not drawn)."""
    if isinstance(key, tuple):
        return None
    sources = [graph.node(_through_boundaries(graph, edge.src)).label for edge in graph.edges_into(key)
               if edge.kind == "data"]
    constants = [graph.node(edge.src).label for edge in graph.edges_into(key)
                 if edge.kind == "saved" and graph.node(edge.src).kind == "constant"]
    return f"{label}({', '.join(sources + constants)})" if sources or constants else None
