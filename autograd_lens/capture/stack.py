"""Warnings raised inside a traced backward point where they would without the lens.

A lens puts two Python frames of its own (``traced_run_backward`` and ``Lens._run``) between torch's
``backward()`` and its engine.  A warning raised during the pass with a ``stacklevel`` that reaches past them
(torch's module hooks warn with ``stacklevel=5``, aimed at the user's ``backward()`` line) would name another
file and line, and Python's once-per-location filter would then show fewer of them.  While a lens is recording,
``warnings.warn`` is this module's :func:`_warn`: it counts the frames ``stacklevel`` would pass, skipping the
lens's own, and asks the original for the same target.  With no lens frame on the way it changes nothing.
"""

from __future__ import annotations

import sys
import threading
import warnings
from types import CodeType
from typing import Any

_LENS_CODES: set[CodeType] = set()  # frames of these functions are skipped when a stacklevel is counted
_lock = threading.Lock()
_installed: list[Any] = []  # [the warnings.warn it replaced] while installed
_users = [0]  # how many Lens blocks are using it


def lens_frame(code: CodeType) -> None:
    """Frames running ``code`` are the lens's own: a ``stacklevel`` passes over them as if they were not there."""
    _LENS_CODES.add(code)


def _warn(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any) -> Any:
    original = _installed[0] if _installed else warnings.warn
    extra = 0
    try:
        frame = sys._getframe(1)  # the frame that called warn: stacklevel 1
        steps = stacklevel - 1
        while steps > 0 and frame is not None:
            frame = frame.f_back
            if frame is not None and frame.f_code in _LENS_CODES:
                extra += 1
            else:
                steps -= 1
    except Exception:  # never let the lens's counting change whether a warning is raised
        extra = 0
    return original(message, category, stacklevel + 1 + extra, source, **kwargs)


def install() -> None:
    """Used while a lens records (nested uses are counted); :func:`uninstall` undoes it."""
    with _lock:
        _users[0] += 1
        if _users[0] == 1:
            _installed[:] = [warnings.warn]
            warnings.warn = _warn


def uninstall() -> None:
    with _lock:
        _users[0] -= 1
        if _users[0] == 0:
            if warnings.warn is _warn:  # the user may have replaced it meanwhile: theirs stays
                warnings.warn = _installed[0]
            _installed.clear()
