"""The chain rule at work, in words and numbers, for the ops a course meets first.

For one backward function that ran, :func:`chain_rule` writes the forward
expression (``z = y * 3``), the local derivative for each input, and — when
the tensors are small — the actual multiplication: ``y receives 1 × 3 = 3``.
The local factor is the one the engine really used (sent ÷ received), so the
numbers always agree with what autograd did.  Other ops say which backward
function ran and where its gradients went.
"""

from __future__ import annotations

from typing import Any

from ..format import format_value
from ..model import Graph, NodeRun

# backward function name (without the trailing digit) -> (expression, local derivative per input)
RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "AddBackward": ("{out} = {a} + {b}", ("1", "1")),
    "SubBackward": ("{out} = {a} - {b}", ("1", "-1")),
    "RsubBackward": ("{out} = {b} - {a}", ("-1", "1")),
    "MulBackward": ("{out} = {a} * {b}", ("{b}", "{a}")),
    "DivBackward": ("{out} = {a} / {b}", ("1/{b}", "-{a}/{b}²")),
    "PowBackward": ("{out} = {a} ** {b}", ("{b}·{a}^({b}-1)", "{out}·ln({a})")),
    "ExpBackward": ("{out} = exp({a})", ("exp({a}) = {out}",)),
    "LogBackward": ("{out} = log({a})", ("1/{a}",)),
    "SinBackward": ("{out} = sin({a})", ("cos({a})",)),
    "CosBackward": ("{out} = cos({a})", ("-sin({a})",)),
    "TanhBackward": ("{out} = tanh({a})", ("1 - tanh({a})² = 1 - {out}²",)),
    "SigmoidBackward": ("{out} = sigmoid({a})", ("σ({a})·(1 - σ({a}))",)),
    "ReluBackward": ("{out} = relu({a})", ("1 where {a} > 0, else 0",)),
    "NegBackward": ("{out} = -{a}", ("-1",)),
    "SumBackward": ("{out} = {a}.sum()", ("1 for every element",)),
    "MeanBackward": ("{out} = {a}.mean()", ("1/n for every element (n = number of elements)",)),
    "MmBackward": ("{out} = {a} @ {b}", ("upstream @ {b}ᵀ", "{a}ᵀ @ upstream")),
    "MvBackward": ("{out} = {a} @ {b}", ("upstream ⊗ {b}", "{a}ᵀ @ upstream")),
    "DotBackward": ("{out} = {a} · {b}", ("{b}", "{a}")),
    "AddmmBackward": ("{out} = {a} + {b} @ {c}", ("1 (summed over the batch)", "upstream @ {c}ᵀ", "{b}ᵀ @ upstream")),
    "AddmvBackward": ("{out} = {a} + {b} @ {c}", ("1", "upstream ⊗ {c}", "{b}ᵀ @ upstream")),
}
# ops whose gradient is the upstream gradient times a local factor, element by element
ELEMENTWISE = {"AddBackward", "SubBackward", "RsubBackward", "MulBackward", "DivBackward", "PowBackward",
               "ExpBackward", "LogBackward", "SinBackward", "CosBackward", "TanhBackward", "SigmoidBackward",
               "ReluBackward", "NegBackward"}
_NO_GRAD = "(no grad needed)"


def rule_name(backward_name: str) -> str:
    return backward_name.rstrip("0123456789")


def operands(event: NodeRun, graph: Graph) -> list[str]:
    """Names of the op's inputs in order; a Python number the op was called with fills the slot
    that needs no gradient (``y * 3`` → ``["y", "3"]``)."""
    constants = []
    if event.node:
        by_id = {node.id: node for node in graph.nodes}
        constants = [by_id[edge.src].label for edge in graph.edges if edge.dst == event.node and edge.kind == "saved"]
    names = []
    for target in event.targets:
        if target == _NO_GRAD:
            names.append(constants.pop(0) if constants else "(no-grad tensor)")  # an operand that needs no gradient
        else:
            names.append(target)
    names.extend(constants)  # e.g. pow's exponent: not an input of the backward function
    return names


def output_name(event: NodeRun, graph: Graph) -> str:
    """The name of what the op computed: its tensor's name, or the op itself (``addmm``)."""
    ids = {edge for edge in event.in_edges if edge}
    for edge in graph.edges:
        if edge.id in ids:
            return graph.node(edge.dst).label
    return graph.node(event.node).label if event.node else "out"


def _ratio(sent: Any, received: Any, limit: int) -> Any:
    """The local factor the engine applied, sent ÷ received, when it is well defined."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(sent, torch.Tensor) or not isinstance(received, torch.Tensor):
        return None
    if sent.shape != received.shape or sent.numel() > limit or bool((received == 0).any()):
        return None
    return sent / received


def chain_rule(event: NodeRun, graph: Graph, limit: int = 16) -> list[str]:
    """Plain-text lines explaining the local step of this backward function."""
    name = rule_name(event.name)
    rule = RULES.get(name)
    if rule is None:
        return []
    names = operands(event, graph)
    keys = dict(zip("abc", names))
    keys["out"] = output_name(event, graph)
    for letter in "abc":
        keys.setdefault(letter, "a number")  # a Python number the backward function did not keep
    expression, locals_ = rule
    lines = [f"Chain rule: {expression.format(**keys)}."]
    received = event.grad_in[0] if event.grad_in else None
    for slot, target in enumerate(event.targets):
        if target == _NO_GRAD or slot >= len(event.grad_out) or slot >= len(locals_):
            continue
        sent = event.grad_out[slot]
        local = locals_[slot].format(**keys)
        wrt = names[slot] if slot < len(names) else target
        factor = _ratio(sent, received, limit) if name in ELEMENTWISE else None
        if factor is not None:
            lines.append(
                f"∂{keys['out']}/∂{wrt} = {local}; {target} receives "
                f"{format_value(received)} × {format_value(factor)} = {format_value(sent)}."
            )
        else:
            lines.append(f"∂{keys['out']}/∂{wrt} = {local}; {target} receives {format_value(sent)}.")
    return lines
