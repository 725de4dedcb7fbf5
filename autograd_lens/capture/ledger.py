"""What a Lens reads from all of its passes before it records the next one, each pass read once (so a pass costs
the same after a thousand passes as after one): the first pass whose hooks changed gradients (for the note that
parameters moved since), and the bytes the passes' kept values hold (the memory budget is the Lens's).

``lens.passes`` is the Lens's own list: when it was changed from outside (cleared, say) it is read again from its
start."""

from __future__ import annotations

from typing import Any

import torch

from .annotate import leaves_may_move

_sequence_nr = torch._C._autograd._get_sequence_nr  # the number the next backward function made on this thread gets


def made_by(ranges: list, fn: Any) -> str | None:
    """Why what ``fn`` sends without hooks is not known, when a pass of ``Ledger.made_by_hooked`` made it."""
    try:
        number = fn._sequence_nr()
    except Exception:
        return None
    made = next((made for first, end, made in ranges if first <= number < end), None)
    return None if made is None else (f"{fn.name()} was made by pass {made} (create_graph=True) while hooks changed "
                                      "gradients: it computes with what they made, and without them it would differ")


class Ledger:
    def __init__(self) -> None:
        self._moving: tuple = (0, None, None)  # passes read, the last one, (index, pass, flags) of the first found
        self._bytes: tuple = (0, None, 0)  # passes read, the last one, the bytes their kept values hold
        # (first, end, pass number): sequence numbers of the backward functions a pass made (create_graph=True) while
        # its hooks changed gradients; a later pass through them computes with what the hooks made
        self.made_by_hooked: list[tuple[int, int, int]] = []

    def note_made(self, observer: Any, first: int, number: int) -> None:
        """After pass ``number``: the functions it made, numbered from ``first`` on, when hooks changed gradients."""
        try:
            made = _sequence_nr()
            if made > first and observer.unhooked.active:
                self.made_by_hooked.append((first, made, number))
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
