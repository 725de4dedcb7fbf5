"""Keep the module-group hooks (``--modules``) out of ``torch.compile``'s sight.

Dynamo traces the global forward hooks of ``nn.Module`` into what it compiles: while any exist it takes the
module's hooked call path and guards on each module's hook dicts, and where the code has graph breaks (or module
backward hooks) it can compile other graphs than without them, so hooks fire in another order within a pass
(seen on a GPT with a graph break per block: the 56 parameter hooks ran in another order). The lens's two hooks
record nothing inside compiled code anyway (nodes made there are not grouped), so while dynamo compiles, the
hooks are taken out of torch's dicts and put back where they were when it ends, through dynamo's own
compile-start and compile-end callbacks. Compiled code then is what it is without ``--modules``.

Dynamo is imported by the first ``torch.compile``, and importing it costs about two seconds, so the lens does not
import it: it registers the callbacks when it finds ``torch._dynamo`` loaded, at the block's start, at each
module call and at each statement of a ``%%lens`` cell. A compile that starts before that (``torch.compile(f)(x)``
in one statement, in a process that had not loaded dynamo) sees the hooks; the pass then says so.
"""

from __future__ import annotations

import sys
from typing import Any


class HiddenWhileCompiling:
    """Takes the hooks of ``handles`` (``RemovableHandle``\\ s of global hooks) out of their dicts while dynamo
    compiles, in the thread that compiles."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles
        self.handler: Any = None  # dynamo's callback handler, once the callbacks are registered
        self.held: list[tuple[dict, list, dict]] = []  # per dict: (the dict, its keys in order, our entries)
        self._frames_before = _frames_compiled()
        self._frames_at_watch: int | None = None  # frames dynamo had compiled when the callbacks were registered

    def watch(self) -> None:
        """Register the callbacks if dynamo is loaded (cheap when it is not, or when they already are)."""
        if self.handler is not None:
            return
        callback = sys.modules.get("torch._dynamo.callback")
        if callback is None:
            return
        try:
            self.handler = callback.callback_handler
            self.handler.register_start_callback(self._hide)
            self.handler.register_end_callback(self._show)
        except Exception:  # noqa: BLE001 - another torch: the hooks stay as they are (the guide says what that does)
            self.handler = None
            return
        self._frames_at_watch = _frames_compiled()

    @property
    def seen(self) -> str:
        """Why code compiled in the block may have seen the hooks (empty: none did)."""
        upto = self._frames_at_watch if self._frames_at_watch is not None else _frames_compiled()
        if upto <= self._frames_before:
            return ""
        return ("torch.compile compiled code in this block before the lens could hide its module-group hooks from it "
                "(dynamo was first loaded inside the block), so that code may have been compiled otherwise than "
                "without --modules, and hooks in it may fire in another order; compiling once before the block, or "
                "importing torch._dynamo before it, avoids this")

    def close(self) -> None:
        self._show(None)
        if self.handler is not None:
            for remove, callback in ((self.handler.remove_start_callback, self._hide),
                                     (self.handler.remove_end_callback, self._show)):
                try:
                    remove(callback)
                except Exception:  # noqa: BLE001, S110 - already gone (the user cleared dynamo's callbacks)
                    pass
            self.handler = None

    def _hide(self, args: Any) -> None:
        try:
            for handle in self.handles:
                for hooks in _dicts_of(handle):
                    if handle.id in hooks:
                        self.held.append((hooks, list(hooks), {handle.id: hooks.pop(handle.id)}))
        except Exception:  # noqa: BLE001, S110 - a callback of the lens never raises into torch.compile
            pass

    def _show(self, args: Any) -> None:
        """Put each hook back where it was among the others (hooks added meanwhile go after them)."""
        try:
            while self.held:
                hooks, order, ours = self.held.pop()
                now = dict(hooks)
                hooks.clear()
                for key in order:
                    if key in ours:
                        hooks[key] = ours[key]
                    elif key in now:
                        hooks[key] = now.pop(key)
                hooks.update(now)
        except Exception:  # noqa: BLE001, S110 - a callback of the lens never raises into torch.compile
            pass


def _dicts_of(handle: Any) -> list[dict]:
    found = [handle.hooks_dict_ref()] + [ref() for ref in getattr(handle, "extra_dict_ref", ())]
    return [hooks for hooks in found if isinstance(hooks, dict)]


def _frames_compiled() -> int:
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["frames"]["total"]) if utils is not None else 0
    except Exception:  # noqa: BLE001 - another torch: no count, no note
        return 0
