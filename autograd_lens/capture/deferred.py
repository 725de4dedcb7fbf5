"""A Lens's passes are modelled when first read, not inside ``backward()`` (issue #24).

At the end of each pass the Lens keeps a :class:`~.draft.PassDraft` (plain records: no graph, no user tensor,
namespace or hook; see ``build.read_pass``).  Whatever reads the passes (``passes``, ``hook_calls``, ``notes``,
``recording_notes``, the views through them) first makes the models of the drafts waiting, in pass order and each
once (:func:`.draft.complete`); what the next pass needs of the earlier ones (the bytes their values hold) is counted
as each draft is kept, so recording never waits for a model.  A draft whose model cannot be made becomes the note
"could not record backward pass N" and the Lens's one warning, pointed at the user's line that read the passes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ..model import BackwardPass, HookCall, Note
from ..notes import note
from .entry import UNTRACED
from .draft import PassDraft, complete
from .snapshot import hidden_from_user

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
DEFER = True  # False: each pass's model is made at the end of the pass (tests compare the two)


class DeferredPasses:
    """Mixed into ``Lens``: its passes, kept as drafts until first read."""

    _ledger: Any
    _notes: list[Note]
    _untraced: dict[str, int]

    def _init_passes(self) -> None:
        self._built: list[BackwardPass] = []  # the passes modelled so far (what ``passes`` returns)
        self._pending: list[PassDraft] = []  # drafts of later passes, in pass order
        self._pending_bytes = 0  # what their kept values hold
        self._making = threading.RLock()  # one thread makes models at a time; a pass's end waits for it
        self._recording_notes: list[str] = []

    @property
    def passes(self) -> list[BackwardPass]:
        """One :class:`BackwardPass` per backward call recorded, in call order."""
        self._complete_pending()
        return self._built

    @property
    def _passes(self) -> list[BackwardPass]:
        self._complete_pending()
        return self._built

    @property
    def notes(self) -> list[Note]:
        """Classic mistakes noticed in this block, each with the course notebook about it."""
        left_alone = [note("untraced_pass", what=UNTRACED[kind], times=_times(count))
                      for kind, count in list(self._untraced.items())]
        return [n for backward_pass in self.passes for n in backward_pass.mistakes] + self._notes + left_alone

    @property
    def hook_calls(self) -> list[HookCall]:
        """Every hook call of every pass, in firing order."""
        return [call for backward_pass in self.passes for call in backward_pass.hook_calls]

    @property
    def recording_notes(self) -> list[str]:
        """Passes the lens could not record, and why."""
        self._complete_pending()
        return self._recording_notes

    def _count(self) -> int:
        """How many passes are recorded (modelled or not yet); makes no model."""
        return len(self._built) + len(self._pending)

    def _earlier_bytes(self) -> int:
        """Bytes the kept values of the recorded passes hold; makes no model."""
        return self._ledger.kept_bytes(self._built) + self._pending_bytes

    def _keep(self, draft: PassDraft) -> None:
        self._pending.append(draft)
        self._pending_bytes += draft.extra.get("kept_bytes", 0)
        if not DEFER:
            self._complete_pending()

    def _complete_pending(self) -> None:
        if not self._pending:
            return
        with self._making:
            while self._pending:
                draft = self._pending.pop(0)
                self._pending_bytes -= draft.extra.get("kept_bytes", 0)
                index = len(self._built)
                try:
                    with hidden_from_user():  # the lens's tensor work never reaches a user's dispatch mode
                        made = complete(draft, self._ledger.first_moving(self._built), index)
                except Exception as problem:  # never raised to the user: a note and the Lens's one warning
                    self._say(f"could not record backward pass {index + 1} ({type(problem).__name__}: {problem})",
                              stacklevel=user_level())
                    continue
                self._built.append(made)

    _say: Any  # Lens._say(text, stacklevel)


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


def user_level() -> int:
    """The ``stacklevel`` that points a warning raised by ``Lens._say``, called by this function's caller, at the
    first frame outside this package: the user's line that read the passes."""
    frame = sys._getframe(1)  # the caller of _say: stacklevel 2
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
