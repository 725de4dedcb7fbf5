"""Whether a hook changed a gradient, decided on the live tensors when what the records keep of one side is a
summary without its numbers (a sparse gradient, one over ``store_limit``): two summaries can be equal while the
values differ (``g * 2`` of a sparse gradient, a permutation of a large one), and "gradient unchanged" would then be
false.  Read while the hook's call ends, with the tensors alive; nothing is kept."""

from __future__ import annotations

from typing import Any

import torch

from ..model import TensorSummary, values_equal


def summarised(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(summarised(item) for item in value)
    return isinstance(value, TensorSummary)


UNKNOWN = "?"


def marks(value: Any) -> Any:
    """What tells an in-place edit of ``value`` (a tensor or a tuple of them) later: each tensor's identity and
    version counter (``UNKNOWN`` where a tensor has none; None for anything that is no tensor)."""
    if isinstance(value, (tuple, list)):
        return tuple(marks(item) for item in value)
    if isinstance(value, torch.Tensor):
        try:
            return (id(value), value._version)
        except Exception:  # a subclass without a version: an edit cannot be told
            return UNKNOWN
    return None


def edited(value: Any, before: Any) -> bool:
    """Whether a tensor of ``value`` was written in place since ``before`` (its :func:`marks`); not known counts as
    written, so that nothing computed from it is shown as known."""
    now = marks(value)
    unknown = UNKNOWN in now if isinstance(now, tuple) and not _is_mark(now) else now == UNKNOWN
    return unknown or now != before


def _is_mark(value: tuple) -> bool:
    return len(value) == 2 and all(isinstance(item, int) for item in value)


def live_change(call: Any, returned: Any) -> tuple[bool, bool]:
    """(modified, edited in place) of a hook call whose received value was kept as a summary (``call.marks_in``
    read as it started)."""
    if call.kind == "post_accumulate_grad":  # it got the leaf: was its .grad replaced or written?
        changed = post_accumulate_marks(call.received) != call.marks_in
        return changed, changed
    was_edited = edited(call.received, call.marks_in)
    if call.kind == "multi_grad" or returned is None:
        return was_edited, was_edited
    return was_edited or not same_values(call.received, returned), was_edited


def same_values(first: Any, second: Any) -> bool:
    """Exact equality of two live values (tuples element-wise); sparse tensors by their coalesced indices and
    values; never raises (not known is not equal)."""
    if isinstance(first, (tuple, list)) or isinstance(second, (tuple, list)):
        if not (isinstance(first, (tuple, list)) and isinstance(second, (tuple, list))) or len(first) != len(second):
            return False
        return all(same_values(a, b) for a, b in zip(first, second))
    if first is second:
        return True
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and (first.is_sparse or second.is_sparse):
        try:
            if not (first.is_sparse and second.is_sparse) or first.shape != second.shape or first.dtype != second.dtype:
                return False
            with torch.no_grad():
                a, b = first.coalesce(), second.coalesce()
                return torch.equal(a.indices(), b.indices()) and values_equal(a.values(), b.values())
        except Exception:
            return False
    return values_equal(first, second)


def post_accumulate_marks(leaf: Any) -> Any:
    """A post-accumulate hook receives the leaf: what tells whether its ``.grad`` was replaced or edited."""
    grad = getattr(leaf, "grad", None)
    return None if grad is None else marks(grad)
