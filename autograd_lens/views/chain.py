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

# backward function name (without the trailing digit) -> (expression, local derivative per input).
# Every card calls the gradient the node received "g" (the gradient of its output, arriving from the
# output side); what it sends goes toward the inputs.
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
    "SumBackward": ("{out} = {a}.sum({dims})", ("1",)),
    "MeanBackward": ("{out} = {a}.mean({dims})", ("1/n",)),
    "DotBackward": ("{out} = {a} · {b}", ("{b}", "{a}")),
    # matrix products: what each input receives is a vector–Jacobian product, g times the local
    # derivative, computed without ever building the Jacobian
    "MmBackward": ("{out} = {a} @ {b}", ("g @ {b}ᵀ", "{a}ᵀ @ g")),
    "MvBackward": ("{out} = {a} @ {b}", ("g ⊗ {b} (the outer product g·{b}ᵀ)", "{a}ᵀ @ g")),
    "AddmmBackward": ("{out} = {a} + {b} @ {c}", ("g", "g @ {c}ᵀ", "{b}ᵀ @ g")),
    "AddmvBackward": ("{out} = {a} + {b} @ {c}", ("g", "g ⊗ {c} (the outer product g·{c}ᵀ)", "{b}ᵀ @ g")),
}
# ops whose gradient is g times a local factor, element by element
ELEMENTWISE = {"AddBackward", "SubBackward", "RsubBackward", "MulBackward", "DivBackward", "PowBackward",
               "ExpBackward", "LogBackward", "SinBackward", "CosBackward", "TanhBackward", "SigmoidBackward",
               "ReluBackward", "NegBackward"}
PRODUCTS = {"MmBackward", "MvBackward", "AddmmBackward", "AddmvBackward"}
REDUCTIONS = {"SumBackward", "MeanBackward"}
_NO_GRAD = "(no grad needed)"


def rule_name(backward_name: str) -> str:
    return backward_name.rstrip("0123456789")


def operands(event: NodeRun, graph: Graph) -> list[str]:
    """Names of the op's inputs in order; a Python number the op was called with fills the slot
    that needs no gradient (``y * 3`` → ``["y", "3"]``)."""
    constants = []
    if event.node:
        constants = [graph.node(edge.src).label for edge in graph.edges_into(event.node) if edge.kind == "saved"]
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
    for edge_id in event.in_edges:
        if edge_id:
            return graph.node(graph.edge(edge_id).dst).label
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


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def _dims_text(dims: tuple[int, ...]) -> str:
    return ("dim " if len(dims) == 1 else "dims ") + ", ".join(map(str, dims))


def broadcast_dims(small: tuple[int, ...], big: tuple[int, ...]) -> tuple[int, ...]:
    """The dims of ``big`` that broadcasting ``small`` to ``big`` added or stretched from size 1:
    the ones the engine sums a gradient over to bring it back to ``small``."""
    extra = len(big) - len(small)
    if extra < 0:
        return ()
    stretched = tuple(extra + i for i, size in enumerate(small) if size == 1 and big[extra + i] != 1)
    return tuple(range(extra)) + stretched


def _reduction_line(name: str, keys: dict, target: str, wrt: str, sent: Any, received: Any, reduced) -> str:
    out = keys["out"]
    size_in, size_out = _numel(sent), _numel(received)
    along = f" along {_dims_text(reduced)}" if reduced else " to every element"
    if name == "SumBackward":
        return (f"∂{out}/∂{wrt} = 1 for every element; {target} receives g copied{along} "
                f"(each element gets the gradient of the sum it is part of): {format_value(sent)}.")
    count = size_in // size_out if size_in is not None and size_out else None
    if count is None:
        return f"∂{out}/∂{wrt} = 1/n for every element; {target} receives {format_value(sent)}."
    where = f"the size of {_dims_text(reduced)}" if reduced else f"the number of elements of {wrt}"
    return (f"∂{out}/∂{wrt} = 1/n with n = {count}, {where}; {target} receives g ÷ {count} copied{along}: "
            f"{format_value(sent)}.")


def _numel(value: Any) -> int | None:
    shape = _shape(value)
    if shape is None:
        return None
    count = 1
    for size in shape:
        count *= size
    return count


def chain_rule(event: NodeRun, graph: Graph, limit: int = 16) -> list[str]:
    """Plain-text lines explaining the local step of this backward function.  ``g`` is the gradient
    the node received (that of its output); every line says what one input receives."""
    name = rule_name(event.name)
    rule = RULES.get(name)
    if rule is None:
        return []
    names = operands(event, graph)
    keys = dict(zip("abc", names))
    keys["out"] = output_name(event, graph)
    for letter in "abc":
        keys.setdefault(letter, "a number")  # a Python number the backward function did not keep
    reduced = graph.node(event.node).reduced if event.node and name in REDUCTIONS else None
    keys["dims"] = ("dim=" + ", ".join(map(str, reduced)) if len(reduced) == 1 else f"dim={reduced}") if reduced else ""
    expression, locals_ = rule
    lines = [f"Chain rule: {expression.format(**keys)}."]
    received = event.grad_in[0] if event.grad_in else None
    if name in PRODUCTS:
        lines.append(f"g is the gradient of {keys['out']}; each input receives a vector–Jacobian product "
                     "(autograd never builds the Jacobian itself):")
    for slot, target in enumerate(event.targets):
        if target == _NO_GRAD or slot >= len(event.grad_out) or slot >= len(locals_):
            continue
        sent = event.grad_out[slot]
        local = locals_[slot].format(**keys)
        wrt = names[slot] if slot < len(names) else target
        if name in REDUCTIONS:
            lines.append(_reduction_line(name, keys, target, wrt, sent, received, reduced))
            continue
        summed = _summed(sent, received)
        if name in PRODUCTS:
            if summed and local == "g":
                local = f"g summed over {_dims_text(summed)} (each row of the batch adds its part)"
            lines.append(f"{target} receives {local} = {format_value(sent)}.")
            continue
        factor = _ratio(sent, received, limit) if name in ELEMENTWISE else None
        if summed:
            lines.append(
                f"∂{keys['out']}/∂{wrt} = {local}; {wrt} was broadcast from {list(_shape(sent))} to "
                f"{list(_shape(received))}, so the engine sums its gradient over {_dims_text(summed)}: "
                f"{target} receives {format_value(sent)}."
            )
        elif factor is not None:
            lines.append(
                f"∂{keys['out']}/∂{wrt} = {local}; {target} receives "
                f"g × {_factor(local)} = {format_value(received)} × {format_value(factor)} = {format_value(sent)}."
            )
        else:
            lines.append(f"∂{keys['out']}/∂{wrt} = {local}; {target} receives g × {_factor(local)} = {format_value(sent)}.")
    return lines


def _factor(local: str) -> str:
    """The local derivative as a factor of a product: its shortest form (``1 - tanh(a)² = 1 - t²`` →
    ``1 - t²``), in brackets when it is more than one term."""
    short = local.split(" = ")[-1]
    return f"({short})" if " " in short and not short.startswith("(") else short


def _summed(sent: Any, received: Any) -> tuple[int, ...]:
    """Dims the engine summed over because the input was broadcast (empty when shapes match)."""
    small, big = _shape(sent), _shape(received)
    if small is None or big is None or small == big:
        return ()
    return broadcast_dims(small, big)
