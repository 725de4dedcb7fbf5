"""The chain rule at work, in words and numbers, for the ops a course meets first.

For one backward function that ran, :func:`chain_rule` writes the forward
expression (``z = y * 3``), the local derivative for each input, and — when
the tensors are small — the actual multiplication: ``y receives 1 × 3 = 3``.
The numbers are the engine's own (the factor is sent ÷ received); where the
formula can be checked against them (a constant factor, a reshape, a sum) and
does not match, no formula is shown.  Ops without a hand-written rule say so.

Each rule names the backward function's inputs by torch's own argument names
(``self``, ``other``, ``exponent`` …), in the order of its ``next_functions``;
an input that needs no gradient takes the number the backward function saved
under that name (``y * 3`` → ``other`` = 3), and ``alpha=``/``beta=`` factors
come from the saved values of the same names.
"""

from __future__ import annotations

import math
from typing import Any

from ..format import format_value
from ..model import Graph, NodeRun
from .operands import NO_GRAD as _NO_GRAD, card_targets, input_keys, ordinal as _ordinal, output_name
from .rules import RULES, Rule


def constants_of(event: NodeRun, graph: Graph) -> dict[str, str]:
    """The numbers this backward function saved (drawn as small input nodes): saved name → text."""
    if not event.node:
        return {}
    found = {}
    for edge in graph.edges_into(event.node):
        if edge.kind == "saved":
            source = graph.node(edge.src)
            if source.kind == "constant":
                found[source.detail or edge.label] = source.label
    return found


def operands(event: NodeRun, graph: Graph, targets: list[str] | None = None,
             constants: dict[str, str] | None = None) -> list[str]:
    """Names of the op's inputs in order; an input that needs no gradient is the number the backward
    function saved for it (``y * 3`` → ``["y", "3"]``), or says what it is.  ``targets`` (:func:`card_targets`)
    and ``constants`` (:func:`constants_of`): when the caller has them already."""
    rule = RULES.get(event.name)
    constants = constants_of(event, graph) if constants is None else constants
    names = []
    for slot, target in enumerate(card_targets(event, graph) if targets is None else targets):
        if target != _NO_GRAD:
            names.append(target)
            continue
        arg = rule.args[slot] if rule and slot < len(rule.args) else None
        names.append(constants.get(arg, "(no-grad tensor)") if arg else "(no-grad tensor)")
    return names


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def _tensor(value: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_complex() \
        and value.dtype.is_floating_point


def _complex(value: Any) -> bool:
    is_complex = getattr(value, "is_complex", None)
    return bool(is_complex()) if callable(is_complex) else False


def _ratio(sent: Any, received: Any, limit: int) -> Any:
    """The local factor the engine applied, sent ÷ received, when it is well defined: every received number finite
    and not 0 (inf ÷ inf, or anything ÷ 0, says nothing of the factor)."""
    if not _tensor(sent) or not _tensor(received):
        return None
    if sent.shape != received.shape or sent.numel() > limit:
        return None
    # at most ``limit`` numbers: read once as Python floats (cheaper than a torch op per check)
    if not all(number != 0 and math.isfinite(number) for number in received.detach().reshape(-1).tolist()):
        return None
    return sent / received


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


def _reduce_to(value: Any, shape: tuple[int, ...]) -> Any:
    """``value`` summed over the dims that broadcasting ``shape`` to ``value.shape`` added or stretched."""
    dims = broadcast_dims(shape, tuple(value.shape))
    if dims:
        value = value.sum(dim=dims, keepdim=True)
    return value.reshape(shape)


def _close(first: Any, second: Any) -> bool:
    import torch

    try:
        return first.shape == second.shape and bool(torch.allclose(first.double(), second.double(), rtol=2e-3,
                                                                   atol=1e-6, equal_nan=True))
    except Exception:  # noqa: BLE001 - values that cannot be compared are not known to agree
        return False


def _number(text: str) -> float | None:
    """A local derivative that is a plain number (``3``, ``-1``, ``1/4``, ``0.5``), else None."""
    text = text.strip()
    try:
        if text.startswith("1/"):
            return 1.0 / float(text[2:])
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def _factor_keys(constants: dict[str, str], saved_known: bool) -> dict[str, str]:
    """``alpha``/``beta`` as they enter the formulas: ``3·`` before a term, or nothing when it is 1."""
    keys = {}
    for name in ("alpha", "beta"):
        value = constants.get(name, "1" if saved_known else None)
        symbol = {"alpha": "α", "beta": "β"}[name]
        if value is None:  # not drawn: the graph was captured without saved values
            keys[name], keys[name + "_"], keys["neg_" + name] = symbol, f"{symbol}·", f"-{symbol}"
            continue
        keys[name] = value
        keys[name + "_"] = "" if value == "1" else f"{value}·"
        keys["neg_" + name] = value[1:] if value.startswith("-") else f"-{value}"
    return keys


def _keys(event: NodeRun, graph: Graph, rule: Rule, names: list[str], constants: dict[str, str]) -> dict[str, str]:
    keys = {arg: "a number" for arg in ("self", "other", "exponent", "tensor", "mat", "mat1", "mat2", "vec")}
    keys.update({arg: value for arg, value in constants.items()})  # numbers the op was called with
    keys.update({arg: names[slot] for slot, arg in enumerate(rule.args) if slot < len(names)})
    saved_known = graph.options.show_saved if graph.options is not None else True
    keys.update(_factor_keys(constants, saved_known))
    keys["out"] = output_name(event, graph)
    reduced = graph.node(event.node).reduced if event.node and rule.family == "reduction" else None
    keys["dims"] = ("dim=" + ", ".join(map(str, reduced)) if len(reduced) == 1 else f"dim={reduced}") if reduced else ""
    received = event.grad_in[0] if event.grad_in else None
    sent = next((value for value in event.grad_out if value is not None), None)
    keys["out_shape"] = _shape_text(received)
    keys["in_shape"] = _shape_text(sent)
    return keys


def _shape_text(value: Any) -> str:
    shape = _shape(value)
    return str(list(shape)) if shape is not None else "its input's shape"


def chain_rule(event: NodeRun, graph: Graph, limit: int = 16, computed: tuple | None | bool = True,
               inputs: list[Any] | None = None, targets: list[str] | None = None) -> list[str]:
    """Plain-text lines explaining the local step of this backward function.  ``g`` is the gradient
    the node received (that of its output); every line says what one input receives.

    ``computed``: what the backward function itself produced per input, when hooks on the node changed it
    afterwards (``True``: nothing changed it, it is ``event.grad_out``; ``None``: not known).  ``inputs``
    (:func:`input_keys`) and ``targets`` (:func:`card_targets` of those): when the caller has them already."""
    rule = RULES.get(event.name)
    if rule is None:
        return [f"This card has no hand-written formula for {event.name}: what it sends is what its backward "
                "computed (torch's derivative formula, or the backward of your autograd.Function)."]
    values = event.grad_out if computed is True else computed
    if rule.family in ("elementwise", "product") \
            and any(_complex(value) for value in (*event.grad_in, *event.grad_out, *(values or ()))):
        return [f"This card has no hand-written formula for {event.name} on complex tensors: torch's gradients "
                "there follow its convention for complex numbers (for an op that is holomorphic in an input, g × "
                "conj(the derivative)), which this card's real-valued formulas do not show; what it sends is what "
                "its backward computed."]
    inputs = input_keys(event, graph) if inputs is None else inputs
    targets = card_targets(event, graph, inputs) if targets is None else targets
    constants = constants_of(event, graph)
    names = operands(event, graph, targets, constants)
    keys = _keys(event, graph, rule, names, constants)
    reduced = graph.node(event.node).reduced if event.node and rule.family == "reduction" else None
    lines = [f"Chain rule: {rule.expression.format(**keys)}."]
    received = event.grad_in[0] if event.grad_in else None
    if rule.family == "product":
        lines.append(f"g is the gradient of {keys['out']}; each input receives a vector–Jacobian product "
                     "(autograd never builds the Jacobian itself):")
    parts: dict[Any, list[Any]] = {}
    for slot, target in enumerate(targets):
        if target == _NO_GRAD or slot >= len(rule.local) or slot >= len(event.grad_out):
            continue
        sent = values[slot] if values is not None and slot < len(values) else None
        line = _slot_line(rule, keys, slot, target, names[slot], sent, received, limit, reduced)
        if inputs.count(inputs[slot]) > 1:
            line = f"Through its {_ordinal(len(parts.get(inputs[slot], ())))} use: {line}"
        lines.append(line)
        parts.setdefault(inputs[slot], []).append(sent)
    for key, sents in parts.items():
        if len(sents) > 1:
            lines.append(_sum_line(targets[inputs.index(key)], sents))
    if values is None:
        lines.append("Hooks on this node then changed what it sends, and what it computed before them is not "
                     "known: the numbers are on the hook steps.")
    elif computed is not True:
        changed = [f"{target} ← {format_value(before)} became {format_value(after)}"
                   for target, before, after in zip(targets, values, event.grad_out)
                   if target != _NO_GRAD and not _same(before, after)]
        if changed:
            lines.append("Then hooks on this node changed what it sends: " + ", ".join(changed) + " (see the hook "
                         "steps).")
    return lines


def _same(first: Any, second: Any) -> bool:
    from ..model import values_equal

    return values_equal(first, second)


def _sum_line(target: str, sents: list[Any]) -> str:
    """A tensor used by several inputs of one op (``y * y``): its parts add."""
    text = f"{target} is used {len(sents)} times by this op: the engine adds the parts"
    if all(_tensor(s) for s in sents) and len({_shape(s) for s in sents}) == 1:
        total = sents[0]
        for value in sents[1:]:
            total = total + value
        return f"{text}, {target} receives {' + '.join(format_value(s) for s in sents)} = {format_value(total)}."
    return text + "."


def _unverified(target: str, sent: Any, name: str) -> str:
    return (f"{target} receives {format_value(sent)}: not the number this card's formula for {name} gives, so the "
            "formula is not shown.")


def _slot_line(rule: Rule, keys: dict, slot: int, target: str, wrt: str, sent: Any, received: Any, limit: int,
               reduced: tuple[int, ...] | None) -> str:
    """One input's line: its local derivative (or what it receives) and the numbers, when known and checked."""
    local = rule.local[slot].format(**keys)
    what = rule.expression.split(" = ", 1)[-1].format(**keys)
    checkable = _tensor(sent) and _tensor(received)
    if rule.family == "reduction":
        return _reduction_line(rule, keys, target, wrt, sent, received, reduced)
    if rule.family in ("shape", "identity"):
        if checkable and not _moved_back(rule, sent, received):
            return _unverified(target, sent, what)
        return f"{target} receives {local}: {format_value(sent)}." if sent is not None else f"{target} receives {local}."
    # a constant factor (add's 1 or alpha, y * 3's 3, addmm's beta on its bias) is checked against the numbers
    constant = _number(keys["beta"]) if rule.local[slot].startswith("{beta_}") else _number(local)
    if constant is not None and checkable and not _close(_reduce_to(received * constant, tuple(sent.shape)), sent):
        return _unverified(target, sent, what)
    summed = _summed(sent, received)
    if rule.family == "product":
        if summed and local.endswith("g"):
            local = f"{local} summed over {_dims_text(summed)} (each row of the batch adds its part)"
        return f"{target} receives {local} = {format_value(sent)}." if sent is not None else f"{target} receives {local}."
    head = f"∂{keys['out']}/∂{wrt} = {local}"
    if sent is None:
        return head + "."
    if summed:
        return (f"{head}; {wrt} was broadcast from {list(_shape(sent))} to {list(_shape(received))}, so the engine "
                f"sums its gradient over {_dims_text(summed)}: {target} receives {format_value(sent)}.")
    factor = _ratio(sent, received, limit)
    if factor is not None:
        return (f"{head}; {target} receives g × {_factor(local)} = {format_value(received)} × {format_value(factor)} "
                f"= {format_value(sent)}.")
    return f"{head}; {target} receives g × {_factor(local)} = {format_value(sent)}."


def _moved_back(rule: Rule, sent: Any, received: Any) -> bool:
    """True when ``sent`` is ``received`` moved back as the rule says (the numbers of a reshape, a sum over
    expanded dims, a transpose); unknown arrangements (transpose, permute of any dims) pass on equal sums."""
    try:
        if rule.family == "identity":
            return _close(sent, received)
        if rule.local[0].startswith("g summed"):  # expand
            return _close(_reduce_to(received, tuple(sent.shape)), sent)
        if rule.local[0].startswith("g reshaped"):
            return sent.numel() == received.numel() and _close(received.reshape(sent.shape), sent)
        if rule.local[0].startswith("gᵀ"):
            return _close(received.t() if received.dim() == 2 else received, sent)
        return sent.numel() == received.numel() and _close(sent.sum(), received.sum())
    except Exception:  # noqa: BLE001 - shapes that do not fit: the rule does not hold
        return False


def _reduction_line(rule: Rule, keys: dict, target: str, wrt: str, sent: Any, received: Any,
                    reduced: tuple[int, ...] | None) -> str:
    out = keys["out"]
    size_in, size_out = _numel(sent), _numel(received)
    along = f" along {_dims_text(reduced)}" if reduced else " to every element"
    count = size_in // size_out if size_in is not None and size_out else None
    mean = rule.local[0] == "1/n"
    if sent is None:  # what it computed is not known (hooks on the node changed it): the rule alone
        return f"∂{out}/∂{wrt} = {rule.local[0]} for every element."
    if _tensor(sent) and _tensor(received) and count:
        expected = _expand_back(received / count if mean else received, tuple(sent.shape), reduced)
        if expected is None or not _close(expected, sent):
            return _unverified(target, sent, rule.expression.split(" = ")[-1].format(**keys))
    if not mean:
        return (f"∂{out}/∂{wrt} = 1 for every element; {target} receives g copied{along} "
                f"(each element gets the gradient of the sum it is part of): {format_value(sent)}.")
    if count is None:
        return f"∂{out}/∂{wrt} = 1/n for every element; {target} receives {format_value(sent)}."
    where = f"the size of {_dims_text(reduced)}" if reduced else f"the number of elements of {wrt}"
    return (f"∂{out}/∂{wrt} = 1/n with n = {count}, {where}; {target} receives g ÷ {count} copied{along}: "
            f"{format_value(sent)}.")


def _expand_back(value: Any, shape: tuple[int, ...], reduced: tuple[int, ...] | None) -> Any:
    """A reduction's gradient copied back over the reduced dims (kept or not), or None if it does not fit."""
    try:
        if reduced and value.dim() < len(shape):
            for dim in sorted(d % len(shape) for d in reduced):
                value = value.unsqueeze(dim)
        return value.expand(shape)
    except Exception:  # noqa: BLE001
        return None


def _numel(value: Any) -> int | None:
    shape = _shape(value)
    if shape is None:
        return None
    count = 1
    for size in shape:
        count *= size
    return count


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
