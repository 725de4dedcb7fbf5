"""Hook badges for what the walk before a pass could not see: a hook that ran on a backward function's boxless
output (a tensor with no name, ``(x * 2).register_hook(f)`` or a hook inside a module's ``forward``), on an output
box drawn without its tensor (``split[1]``), or registered on the backward function itself
(``grad_fn.register_hook`` / ``register_prehook``).  The pass's calls say where each one ran, so the drawing of
that pass shows it on the box the steps point at; the walk's own badges (named tensors, leaves) stay as they are."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..model import BackwardPass, HookCall

BADGE_KINDS = {"tensor": "[hook]", "node": "[node hook]", "node_pre": "[node pre-hook]"}


def _text(call: HookCall, function_box: bool) -> str:
    if call.kind == "tensor" and function_box:
        return f"[hook on its output] {call.hook}"
    return f"{BADGE_KINDS[call.kind]} {call.hook}"


def with_ran_hooks(built: BackwardPass) -> BackwardPass:
    """``built`` with a badge on each drawn box where a hook of the kinds above ran in this pass and no badge of
    the walk's names it (one per registered hook, in the order of their first calls)."""
    graph = built.graph
    wanted: dict[str, list[str]] = {}  # node id -> badge texts, one per registration
    seen: set[tuple[str, int, str]] = set()
    for call in built.hook_calls:
        if call.kind not in BADGE_KINDS or call.node is None:
            continue
        try:
            node = graph.node(call.node)
        except KeyError:  # a box folded away or left out: nothing to put it on
            continue
        if node.kind not in ("function", "tensor", "output", "leaf"):
            continue
        text = _text(call, node.kind == "function")
        key = (call.node, call.registration, text)
        if key in seen:
            continue
        seen.add(key)
        wanted.setdefault(call.node, []).append(text)
    changed: dict[str, Any] = {}
    for node_id, texts in wanted.items():
        node = graph.node(node_id)
        have = list(node.hooks)
        extra = []
        for text in texts:  # the walk's badges count: a named tensor's hook is shown once
            if text in have:
                have.remove(text)
            else:
                extra.append(text)
        if extra:
            changed[node_id] = dataclasses.replace(node, hooks=node.hooks + tuple(extra))
    if not changed:
        return built
    nodes = tuple(changed.get(node.id, node) for node in graph.nodes)
    return dataclasses.replace(built, graph=dataclasses.replace(graph, nodes=nodes))
