"""What a Lens reads from all of its passes before it records the next one, each pass read once (so a pass costs
the same after a thousand passes as after one): the first pass whose hooks changed gradients (for the note that
parameters moved since), and the bytes the passes' kept values hold (the memory budget is the Lens's).

``lens.passes`` is the Lens's own list: when it was changed from outside (cleared, say) it is read again from its
start."""

from __future__ import annotations

import bisect
import weakref
from typing import Any

import torch

from .annotate import _leaf_tensor, leaf_ids, leaves_may_move
from .records import HookRecord

_sequence_nr = torch._C._autograd._get_sequence_nr  # the number the next backward function made on this thread gets


def made_by(ranges: list, fn: Any) -> str | None:
    """Why what ``fn`` sends without hooks is not known, when a pass of ``Ledger.made_by_hooked`` made it."""
    try:
        number = fn._sequence_nr()
    except Exception:
        return None
    # ``ranges`` is sorted and its ranges do not overlap (one thread's numbers only grow): one look, not one per pass
    at = bisect.bisect_right(ranges, (number, float("inf"))) - 1
    made = ranges[at][2] if at >= 0 and ranges[at][0] <= number < ranges[at][1] else None
    return None if made is None else (f"{fn.name()} was made by pass {made} (create_graph=True) while hooks changed or "
                                      "replaced gradients: it computes with what they made, and without them it may "
                                      "differ")


class Ledger:
    def __init__(self) -> None:
        self._moving: tuple = (0, None, None)  # passes read, the last one, (index, pass, flags) of the first found
        self._bytes: tuple = (0, None, 0)  # passes read, the last one, the bytes their kept values hold
        # (first, end, pass number): sequence numbers of the backward functions a pass made (create_graph=True) while
        # its hooks changed gradients; a later pass through them computes with what the hooks made
        self.made_by_hooked: list[tuple[int, int, int]] = []
        # (pass, flags, where, names) from the %%lens cells before this one: their first pass whose hooks changed
        # gradients, and the names of its leaves that are still the same tensors (see inherit)
        self.inherited: tuple | None = None
        self.leaves: dict = {}  # LeafTensor -> (weak reference, label): the leaves of its passes (annotate.leaf_ids)

    def at_end(self, observer: Any) -> dict:
        """What the pass's model gets of what the Lens reads as a pass ends: :func:`.annotate.leaf_ids`, with the
        leaves of the passes before it whose hooks may have changed gradients (this pass's are kept when it ran a
        hook, or one in C, stopped at an error, or made a note: what ``leaves_may_move`` reads, and more), and the
        modules whose backward hooks ran inside a nested backward (``nested_module_hooks``)."""
        register = observer.unhooked.active or observer.error is not None or bool(observer.notes) \
            or bool(observer.unseen_hooks) or any(isinstance(record, HookRecord) for record in observer.records)
        found = leaf_ids(observer.shape, self.leaves, register)
        nested = observer.__dict__.get("nested_targets")
        return {**found, "nested_module_hooks": tuple(sorted(nested))} if nested else found

    def seed(self, refs: dict) -> None:
        """Take over the leaves of an earlier %%lens cell's pass (``inheritable``'s weak references by label)."""
        for label, ref in refs.items():
            tensor = ref()
            if tensor is not None:
                self.leaves.setdefault(_leaf_tensor(tensor), (ref, label))

    def note_made(self, observer: Any, first: int, number: int) -> None:
        """After pass ``number``: the functions it made, numbered from ``first`` on, when hooks changed gradients or
        replaced one with another tensor of the same values (``HookCalls.replaced``: a detached one builds no graph)."""
        try:
            made = _sequence_nr()
            if made > first and (observer.unhooked.active or observer.replaced):
                bisect.insort(self.made_by_hooked, (first, made, number))  # (sorted: see made_by)
        except Exception:  # never into the user's backward(): the later passes then say nothing of it
            pass

    def first_moving(self, passes: list) -> tuple | None:
        """The first pass whose hooks changed gradients (or may have, or stopped it), with leaves_may_move's flags."""
        checked, last, found = self._moving
        if _changed(passes, checked, last) or (found is not None and passes[found[0]] is not found[1]):
            checked, found = 0, None
        if found is None:
            for index in range(checked, len(passes)):
                flags = leaves_may_move(passes[index])
                if flags is not None:
                    found = (index, passes[index], flags)
                    break
        self._moving = (len(passes), passes[-1] if passes else None, found)
        if self.inherited is not None:  # earlier than any of this Lens's own
            return self.inherited
        return None if found is None else (found[1], found[2])

    def kept_bytes(self, passes: list) -> int:
        """Bytes the kept values of ``passes`` hold (``BackwardPass.kept_bytes``)."""
        checked, last, total = self._bytes
        if _changed(passes, checked, last):
            checked, total = 0, 0
        for backward_pass in passes[checked:]:
            total += backward_pass.kept_bytes
        self._bytes = (len(passes), passes[-1] if passes else None, total)
        return total


def _changed(passes: list, checked: int, last: Any) -> bool:
    """Whether ``passes`` is no longer the list read up to ``checked`` (ending with ``last``) plus new passes."""
    return checked > len(passes) or (checked > 0 and passes[checked - 1] is not last)


def inheritable(earlier: Any, namespace: dict) -> tuple | None:
    """What a %%lens cell takes over from the cell before (``earlier``, its Lens), read before it runs: the first
    pass whose hooks changed gradients there (or in a cell before it) and weak references to its leaves."""
    found = earlier._ledger.first_moving(earlier.passes)
    if found is None:
        return None
    refs = {}
    for node in found[0].graph.nodes:
        value = _resolve(namespace, node.label) if node.kind == "leaf" else None
        if isinstance(value, torch.Tensor):
            refs[node.label] = weakref.ref(value)
    return (found[0], found[1], " of an earlier %%lens cell", refs) if refs else None


def inherit(ledger: Ledger, pending: tuple | None, namespace: dict) -> None:
    """After the cell ran: its leaves still named as then and still the same tensors may have moved since."""
    if pending is None:
        return
    earlier, flags, where, refs = pending
    same = frozenset(name for name, ref in refs.items() if ref() is not None and _resolve(namespace, name) is ref())
    if same:
        ledger.inherited = (earlier, flags, where, same)


def _resolve(namespace: dict, label: str) -> Any:
    """The object a drawn leaf's label names in ``namespace`` ("w", "model.0.weight"); None when it names none."""
    first, *rest = label.split(".")
    value = namespace.get(first)
    for part in rest:
        value = getattr(value, part, None)
    return value


def replaces(returned: Any, received: Any) -> bool:
    """Whether a hook's return value holds a tensor other than the one it received in that place."""
    if isinstance(returned, (tuple, list)) and isinstance(received, (tuple, list)) and len(returned) == len(received):
        return any(new is not None and new is not old for new, old in zip(returned, received))
    return returned is not received


def graph_of(value: Any) -> tuple:
    """The backward functions of the tensors in ``value`` (a tensor, or a tuple or list of them), read without
    calling a subclass's ``__torch_function__``."""
    with torch._C.DisableTorchFunctionSubclass():
        return tuple(getattr(item, "grad_fn", None) for item in (value if isinstance(value, (tuple, list)) else (value,)))
