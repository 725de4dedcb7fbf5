""""call i of n": which hook calls are calls of the same registered hook, over the passes of one Lens."""

from __future__ import annotations

import weakref
from typing import Any

from .records import HookRecord


def _function_key(call: HookRecord) -> tuple:
    """Which function ran: its code when a frame showed it (the object may not be known: a hook on a tensor
    with no name), else the object (a hook written in C)."""
    if call.code is not None:
        return ("code", call.code)
    return ("object", id(call.function))


class HookCounter:
    """Counts the calls of each *registered* hook over the passes of one Lens.

    A registration is a function attached to one thing: a tensor (a leaf by its tensor, any other by the node
    that made it and the output), a node, a module, or one ``register_multi_grad_hook`` call; a global module
    hook is one registration.  Two closures made by one factory are two hooks, as is one function registered
    on two tensors; hooks with one code on one tensor are told apart by their order there.  Only ids are kept,
    each guarded by a weak reference where the object allows one (the function, when known, and the tensor or
    module), so nothing lives longer, and a new hook or tensor at a freed address is counted afresh."""

    def __init__(self) -> None:
        self.counts: dict[tuple, list] = {}  # key -> [calls, registration number, function guard, holder guard]

    def count(self, call: HookRecord, ordinal: int) -> tuple[int, int]:
        """This call's number among the calls of its registration, and that registration's number."""
        key, holder = self._key(call, ordinal)
        function = call.function
        entry = self.counts.get(key)
        if entry is not None and (not _same(entry[3], holder) or function is not None and not _same(entry[2], function)):
            entry = None  # the thing it was attached to, or the function, is another one now
        if entry is None:
            entry = self.counts[key] = [0, len(self.counts) + 1, None, _guard(holder)]
        if function is not None and entry[2] is None:
            entry[2] = _guard(function)
        entry[0] += 1
        return entry[0], entry[1]

    @staticmethod
    def _key(call: HookRecord, ordinal: int) -> tuple[tuple, Any]:
        fn = call.node_fn
        holder = None
        if call.kind.startswith("global_"):
            where: tuple = ()
        elif call.kind == "multi_grad":
            where = ("multi", call.state if call.state is not None else call.target)
        elif call.module is not None:
            where, holder = ("module", id(call.module)), call.module
        elif fn is not None and hasattr(fn, "variable"):  # a leaf: its hooks live on the tensor, whatever node
            where, holder = ("leaf", id(fn.variable)), fn.variable
        elif fn is not None:  # a node lives as long as its graph: its number tells a new one at the same address
            where = ("node", id(fn), _sequence_nr(fn), call.output_nr if call.kind == "tensor" else None)
        else:
            where = ("target", call.target)
        if call.kind == "multi_grad" and call.state is not None:
            ordinal = 0  # its wrapper's state names the registration, wherever it fires
        elif call.key is not None and call.kind != "multi_grad":
            ordinal = ("key", call.key)  # its handle's id names the registration: hooks removed before it do not count
        function = id(call.function) if call.function is not None else None  # guarded in count()
        return (call.kind, _function_key(call), where, function, ordinal), holder


def _sequence_nr(fn: Any) -> int | None:
    try:
        return fn._sequence_nr()
    except Exception:
        return None


def _guard(obj: Any) -> Any:
    """A weak reference to ``obj`` (None for None); ``obj`` itself is never kept: an object that allows no weak
    reference is guarded by nothing."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _same(guard: Any, obj: Any) -> bool:
    return guard is None or obj is None or guard() is obj
