"""Why a named tensor got no gradient in a pass (``BackwardPass.unreached``).

Built on access from the pass's record and the :class:`~.evidence.Evidence`
collected just before it ran.  Each answer is a :class:`Reason` whose ``code``
is one of ``REASONS``; where the record does not settle the cause the code is
``"unknown"`` and the text says what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model import BackwardPass, GradWritten, NodeRun

REASONS = {
    "detached": "detached (.detach(), .data, .item(), .tolist(), NumPy)",
    "no_grad": "computed under no_grad",
    "inference_mode": "computed under inference_mode",
    "requires_grad_false": "requires_grad was False",
    "non_differentiable": "a non-differentiable op (comparison, argmax, integer cast)",
    "not_on_path": "not on any path to the root",
    "excluded": "excluded by backward(inputs=...)",
    "hook_zeros": "a hook returned zeros",
    "hook_none": "a hook passed on no gradient (None)",
    "unknown": "unknown",
}
PRIORITY = ("requires_grad_false", "inference_mode", "no_grad", "non_differentiable", "detached")


@dataclass(frozen=True)
class Reason:
    """Why ``name`` got no gradient: ``code`` (a key of ``REASONS``) and the evidence in words."""

    name: str
    code: str
    text: str
    # graph node ids where the drawing marks the break: the functions a cut value entered (or that saved the
    # tensor), an excluded leaf, the node whose hook returned zeros; empty where the record does not place it
    at: tuple[str, ...] = field(default=(), compare=False)

    @property
    def title(self) -> str:
        return REASONS.get(self.code, self.code)

    def __str__(self) -> str:
        return f"{self.name}: {self.title}: {self.text}"


def unreached(backward_pass: BackwardPass) -> dict[str, Reason]:
    """``{name: Reason}`` for each named tensor requiring grad (and each frozen parameter) that got no
    gradient in this pass, or whose gradient a hook replaced by zeros."""
    evidence = getattr(backward_pass, "debug", None)
    if evidence is None:
        return {}
    reasons: dict[str, Reason] = {}
    received = _received(backward_pass)
    for candidate in evidence.candidates:
        if candidate.reachable:
            reason = _on_graph(backward_pass, candidate, received)
        else:
            reason = _off_graph(candidate, evidence, backward_pass)
        if reason is not None:
            reasons[candidate.name] = reason
    return reasons


def _received(backward_pass: BackwardPass) -> dict[str, Any]:
    """Leaf label -> the gradient this pass sent it (for backward: written to .grad; for grad: returned)."""
    if backward_pass.kind == "grad":
        return {name: value for name, value in backward_pass.input_grads.items() if value is not None}
    return {event.name: event.received for event in backward_pass.events  # AccumulateGrad given None wrote nothing
            if isinstance(event, GradWritten) and event.by == "AccumulateGrad" and event.received is not None}


def _on_graph(backward_pass: BackwardPass, candidate: Any, received: dict[str, Any]) -> Reason | None:
    name = candidate.name
    if candidate.leaf:
        got = name in received
    else:
        got = _nonleaf_got(backward_pass, candidate)
    inputs = backward_pass.inputs
    if got:
        if candidate.leaf:
            return _zeroed_by_hook(backward_pass, name, received[name])
        return None
    if inputs and name not in inputs:
        at = tuple(node.id for node in backward_pass.graph.nodes if node.label == name and node.kind == "leaf") \
            if candidate.leaf else ()
        if backward_pass.kind == "grad":
            return Reason(name, "excluded", f"not among autograd.grad's inputs ({', '.join(inputs)}): "
                                            "autograd.grad computes gradients for its inputs only", at)
        return Reason(name, "excluded", f"backward(inputs=[{', '.join(inputs)}]) computes gradients for those "
                                        f"only; {name} is on the graph but not among them", at)
    if candidate.leaf and not candidate.requires_grad:  # frozen after the forward: the graph still reaches it
        at = tuple(node.id for node in backward_pass.graph.nodes if node.label == name and node.kind == "leaf")
        return Reason(name, "requires_grad_false", f"{name} no longer required grad when the pass ran (set after the "
                                                   "forward): its AccumulateGrad drops what arrives", at)
    if backward_pass.error is not None:
        sender = _sent(backward_pass, name, True) if candidate.leaf else ""
        if sender:  # the error came after (a hook on the leaf, autograd.grad's check of its other inputs)
            end = "autograd.grad returned it" if backward_pass.kind == "grad" else "it was written to .grad"
            return Reason(name, "unknown", f"{sender} sent it a gradient, but the pass stopped with "
                                           f"{backward_pass.error.type} before {end}")
        return Reason(name, "unknown", f"the pass stopped with {backward_pass.error.type} before a gradient "
                                       "reached it")
    if not candidate.leaf and got is None:
        return Reason(name, "unknown", "it is on the graph, but the function that made it was not drawn, so "
                                       "whether a gradient reached it is not known")
    dropped = _dropped_by_hook(backward_pass, name) if candidate.leaf else None
    if dropped is not None:
        return dropped
    sender = _sent(backward_pass, name, False) if candidate.leaf else None
    if sender:
        return Reason(name, "unknown", f"it is on the graph, but {sender} sent it no gradient (None)")
    return Reason(name, "unknown", "it is on the graph, but the record shows no gradient reaching it")


def _nonleaf_got(backward_pass: BackwardPass, candidate: Any) -> bool | None:
    """Did the function that made this non-leaf receive a gradient for its output? None: not drawn."""
    sequence_nr, op = candidate.node
    nodes = [node.id for node in backward_pass.graph.nodes
             if node.kind == "function" and node.sequence_nr == sequence_nr and node.op == op]
    if not nodes:
        return None
    for event in backward_pass.events:
        if isinstance(event, NodeRun) and event.node in nodes:
            grads = event.grad_in
            value = grads[candidate.output_nr] if candidate.output_nr < len(grads) else None
            if value is not None:
                return True
    return False


def _sent(backward_pass: BackwardPass, name: str, some: bool) -> str:
    """The first function that sent the leaf ``name`` a gradient (``some``), or None in its place."""
    for event in backward_pass.events:
        if isinstance(event, NodeRun):
            for target, value in zip(event.targets, event.grad_out):
                if target == name and (value is not None) is some:
                    return event.label
    return ""


def _zeroed_by_hook(backward_pass: BackwardPass, name: str, value: Any) -> Reason | None:
    """A leaf that received only zeros where a hook on its way turned a non-zero gradient into zeros, and that would
    not have received only zeros without the hooks (a dead ReLU after the hook zeroes it anyway: not the hook's
    doing)."""
    if not _all_zero(value):
        return None
    without = (backward_pass.grads_without_hooks if backward_pass.kind == "grad"
               else backward_pass.added_without_hooks).get(name)
    if without is not None and _all_zero(without):
        return None
    upstream = _upstream_nodes(backward_pass, name)
    for call in backward_pass.hook_calls:
        if call.error is None and call.node in upstream and _all_zero(call.grad_out) \
                and not _all_zero(call.grad_in) and _readable(call.grad_in):
            got = "a gradient holding NaN or inf" if _nonfinite(call.grad_in) else "a non-zero gradient"
            return Reason(name, "hook_zeros", f"the {call.kind_label} hook {call.hook} on {call.target} received "
                                              f"{got} and passed on zeros; this leaf received only zeros",
                          (call.node,) if call.node else ())
    return None


def _dropped_by_hook(backward_pass: BackwardPass, name: str) -> Reason | None:
    """A hook on the leaf's way that received a gradient and passed on None in its place (a module pre-hook or a
    node hook returning a tuple with None)."""
    upstream = _upstream_nodes(backward_pass, name)
    for call in backward_pass.hook_calls:
        received, passed = call.grad_in, call.grad_out
        if call.error is None and call.node in upstream and isinstance(received, tuple) \
                and isinstance(passed, tuple) and len(received) == len(passed) \
                and any(before is not None and after is None for before, after in zip(received, passed)):
            return Reason(name, "hook_none", f"the {call.kind_label} hook {call.hook} on {call.target} received a "
                                             "gradient and passed on None in its place; no gradient reached this "
                                             "leaf")  # not placed: the drawing has no mark for it
    return None


def _upstream_nodes(backward_pass: BackwardPass, name: str) -> set[str]:
    """Graph nodes a gradient passes through on its way to the leaf ``name`` (the leaf included)."""
    graph = backward_pass.graph
    start = [node.id for node in graph.nodes if node.label == name and node.kind in ("leaf", "output")]
    seen: set[str] = set()
    stack = list(start)
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        stack.extend(edge.dst for edge in graph.edges_from(node_id) if edge.kind == "data")
    return seen


def _readable(value: Any) -> bool:
    from .nonfinite import UNREADABLE, state

    return state(value) != UNREADABLE


def _nonfinite(value: Any) -> bool:
    from .nonfinite import NONFINITE, state

    return state(value) == NONFINITE


def _all_zero(value: Any) -> bool:
    from ..model import TensorSummary

    if isinstance(value, (tuple, list)):
        items = [item for item in value if item is not None]
        return bool(items) and all(_all_zero(item) for item in items)
    if value is None:
        return False
    if isinstance(value, TensorSummary):
        return value.norm == 0.0 if value.norm is not None else False
    try:
        return bool((value == 0).all())
    except Exception:
        return False


def _off_graph(candidate: Any, evidence: Any, backward_pass: BackwardPass) -> Reason:
    name = candidate.name
    clues = {clue.code: clue for clue in reversed(candidate.clues)}  # the first clue of each kind wins
    for code in PRIORITY:
        if code in clues:
            return Reason(name, code, clues[code].text, _placed(backward_pass, getattr(clues[code], "at", ())))
    for code in ("incomplete", "lost"):
        if code in clues:
            return Reason(name, "unknown", clues[code].text)
    if "view_of_used" in clues:
        return Reason(name, "not_on_path", clues["view_of_used"].text)
    if evidence.forward and not evidence.forward_note:
        return Reason(name, "not_on_path", "nothing this pass differentiates was computed from it: it is not on "
                                           "the graph, and no copy of it cut from autograd (recorded since the "
                                           "block began) is used by the graph")
    if evidence.forward:
        return Reason(name, "unknown", f"it is not on the graph, and {evidence.forward_note}")
    return Reason(name, "unknown", "it is not on the graph of this pass: either it was not used, or a copy of "
                                   "it cut from autograd was (no saved value shows one). Forward ops were not "
                                   "recorded; Lens(why=True) or %%lens --why tells the two apart where the copy "
                                   "is made and used by torch calls")


def _placed(backward_pass: BackwardPass, keys: Any) -> tuple[str, ...]:
    """The drawn function nodes of ``keys`` ((sequence_nr, backward function)): each key drawn exactly once, or
    nothing (a key the drawing shows twice, or not at all, is not placed)."""
    found: list[str] = []
    for key in keys:
        nodes = [node.id for node in backward_pass.graph.nodes
                 if node.kind == "function" and (node.sequence_nr, node.op) == tuple(key)]
        if len(nodes) != 1:
            return ()
        found.append(nodes[0])
    return tuple(found)
