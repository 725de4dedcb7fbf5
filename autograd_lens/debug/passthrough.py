"""What the forward record (:mod:`.forward`) gives back to torch as torch would have had it: the warnings a call
made inside the recorder's ``TorchFunctionMode`` (warned again from the caller's line, also when the call raised),
and anomaly mode's forward tracebacks without the recorder's frame; which calls it may read."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch

_HANDLE = torch.overrides.handle_torch_function.__code__


def _flat(value: Any):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flat(item)
    else:
        yield value


def readable_all(values: Any) -> bool:
    """No tensor among ``values`` (nested) is a subclass with a ``__torch_dispatch__`` of its own: reading one runs
    the user's code, or, with dispatch off, crashes (a wrapper holds no numbers of its own).  As the record reads
    them: each value, and the items of a short list or tuple (a long one, ``torch.tensor(numbers)``, is not read)."""
    for value in values:
        for item in value if isinstance(value, (list, tuple)) and len(value) <= 64 else (value,):
            if isinstance(item, torch.Tensor) and type(item) is not torch.Tensor \
                    and getattr(type(item), "__torch_dispatch__", None) is not _PLAIN_DISPATCH:
                return False
    return True


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def drop_own_frame(result: Any, own_file: str) -> None:
    """Anomaly mode keeps the forward traceback of each node it creates (``metadata["traceback_"]``, printed in its
    "Error detected in ..." warning): the nodes this call made hold this mode's frame, which torch's own traceback
    does not have; taken out (each node made here is reached from the result through nodes that hold it)."""
    own = f'  File "{own_file}", '
    stack = [out.grad_fn for out in _flat(result) if isinstance(out, torch.Tensor) and out.grad_fn is not None]
    seen: set = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        trace = node.metadata.get("traceback_")
        if not isinstance(trace, list) or not any(line.startswith(own) for line in trace):
            continue
        trace[:] = [line for line in trace if not line.startswith(own)]
        stack.extend(next_node for next_node, _ in node.next_functions)


class recorded:
    """``warnings.catch_warnings(record=True)`` with every warning shown, without its cost to the user's filters:
    entering and leaving it marks the filters changed, which empties each module's registry of warnings already
    shown, so a warning the "default" or "once" action shows once (a UserWarning, by default) was shown again at
    every call.  Here the filters are swapped without that mark (the registries stay as they were).
    ``recorded("ignore")``: the lens's own work, every warning ignored, none recorded."""

    def __init__(self, action: str = "always") -> None:
        self.action = action

    def __enter__(self) -> list:
        self.log: list = []
        module = warnings
        self.saved = module.filters, module._showwarnmsg_impl, module.showwarning
        module.filters = [(self.action, None, Warning, None, 0)]
        module._showwarnmsg_impl, module.showwarning = self.log.append, module._showwarning_orig
        return self.log

    def __exit__(self, *exc: Any) -> None:
        warnings.filters, warnings._showwarnmsg_impl, warnings.showwarning = self.saved


def warn_again(caught: list, frame: Any, own_file: str, raised: bool = False) -> None:
    """Warn each caught warning again, under the user's filters, from where it would have come without the mode.
    ``raised``: the call raised.  A warning of torch's C++ code that the user's filters make an error is then not
    raised in place of the call's error: torch prints it, as ``PyErr_Print`` does (its ``PyWarningHandler``)."""
    here = os.path.abspath(own_file)
    frame = _user_frame(frame)
    for item in caught:
        filename, lineno = item.filename, item.lineno
        if os.path.abspath(filename) == here:
            filename, lineno = frame.f_code.co_filename, frame.f_lineno
        # warnings.warn's registry and module name: of the module the warning is said to come from (the filters
        # match its name: "default::DeprecationWarning:__main__"; its registry keeps what was shown once)
        space = frame.f_globals if filename == frame.f_code.co_filename else _globals_of(filename)
        registry = space.setdefault("__warningregistry__", {}) if space is not None else None
        try:
            warnings.warn_explicit(item.message, item.category, filename, lineno, registry=registry,
                                   module=space.get("__name__", "<string>") if space is not None else None)
        except Exception as error:  # a filter's "error"
            if not (raised and _from_cpp(item.message)):
                raise
            error.__context__ = None  # (torch had fetched its error away before warning)
            _printed(error.with_traceback(None))


def _globals_of(filename: str) -> dict | None:
    """The namespace of the loaded module whose file is ``filename`` (None: not one)."""
    for module in tuple(sys.modules.values()):
        if getattr(module, "__file__", None) == filename:
            return vars(module)
    return None


def _user_frame(frame: Any) -> Any:
    """The frame of the user's call.  A function of torch written in Python reaches the mode through
    ``handle_torch_function``, which it calls itself: the user's frame is the one above that function's (where a
    warning it gives with its ``stacklevel`` points, without the mode).  A function in C++ calls the mode directly."""
    if frame.f_code is _HANDLE and frame.f_back is not None and frame.f_back.f_back is not None:
        return frame.f_back.f_back
    return frame


def _from_cpp(message: Any) -> bool:
    """A warning torch's C++ code gave (``TORCH_WARN``: its text says where in torch's sources)."""
    return "(Triggered internally at " in str(message)


def _printed(error: BaseException) -> None:
    """What ``PyErr_Print`` does with a warning made an error while another error is raised: kept as the last
    error (``sys.last_value``...), shown by ``sys.excepthook`` (the traceback-less text torch's users see)."""
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, None
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    sys.excepthook(type(error), error, None)
