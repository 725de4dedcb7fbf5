"""Each leaf's ``.grad`` as the pass left it (``final_grad``), and the last value of it the recording saw
(``last_seen``): what :func:`.ending.late_change` compares."""

from __future__ import annotations

from typing import Any

import torch

from ..model import Value
from .bits import same_bits
from .records import HookRecord
from .snapshot import held_bytes, snapshot


def final_grad(observer: Any, variable: torch.Tensor) -> Value:
    """``.grad`` as the pass left it.  A view's memory (a DDP bucket, the seed it was adopted from) can be written
    by C++ code that does not count versions: it is copied again; otherwise the copy taken as it was written is
    reused when it is the same tensor, unchanged.  A new copy counts against the memory budget; past it, a summary
    (min, max, norm, first entries: what :func:`.ending.late_change` compares then)."""
    grad = variable.grad
    if isinstance(grad, torch.Tensor):
        if grad._is_view():
            return counted(observer, snapshot(grad, budget_limit(observer), magnitudes=True))
        try:
            earlier = observer._earlier_copy(grad, grad._version)
        except Exception:  # noqa: BLE001 - no version counter
            earlier = None
        if isinstance(earlier, torch.Tensor):  # the same tensor, unchanged, no Python run since its copy
            return earlier
        if earlier is None:  # (a hook ran since the write, which forgot the copies) the last copy the recording saw,
            seen = _last_copy(observer, variable)  # when it holds exactly what a new copy would: late_change
            if seen is not None and same_bits(grad, seen, observer.store_limit):  # then finds it the same object
                return seen
    if observer.over_budget:  # (copied would reuse no copy: there is none of this tensor at this version)
        return snapshot(grad, -1, magnitudes=True)
    return counted(observer, observer.copied(grad, magnitudes=True))  # a large one's mean |value|: the
    # gradient-flow plot's


def budget_limit(observer: Any) -> int:
    """The ``store_limit`` of what is copied now: -1 (summaries only) past the memory budget."""
    return -1 if observer.over_budget else observer.store_limit


def counted(observer: Any, kept: Any) -> Any:
    """``kept``, new copies (a tensor, a tuple of them; summaries hold no bytes), counted against the memory budget
    (``nodes._held``: past it, later values are kept as summaries)."""
    if observer.memory_budget is not None:
        observer._held(held_bytes(kept))
    return kept


def _last_copy(observer: Any, variable: torch.Tensor) -> Any:
    """``last_seen``'s value for the leaf ``variable`` when its AccumulateGrad ran in this pass, else None."""
    keys = vars(observer).get("leaf_keys")
    if keys is None:  # once per pass: id(leaf) -> id(its AccumulateGrad)
        keys = observer.leaf_keys = {id(fn.variable): key for key, fn in observer.shape.leaves.items()}
    key = keys.get(id(variable))
    position = observer.ran.get(key) if key is not None else None
    if position is None or observer.shape.leaves[key].variable is not variable:
        return None
    return last_seen(observer, observer.shape.leaves[key], position)


def last_seen(observer: Any, fn: Any, position: int) -> Value:
    """The last value of leaf ``fn``'s ``.grad`` the recording saw: as written, or as its last post-accumulate hook
    left it."""
    after = vars(observer).get("after_write")
    if after is None:  # once per pass: id(AccumulateGrad) -> .grad as its last post-accumulate hook left it
        after = observer.after_write = {}
        for record in observer.records:
            node = record.current_fn or record.node_fn if isinstance(record, HookRecord) else None
            if node is not None and record.kind == "post_accumulate_grad" and (
                    isinstance(record.grad_out, torch.Tensor)  # a hook in C: .grad as its neighbours show it
                    or record.unseen is None and record.error is None):  # a Python hook's return: .grad read then
                after[id(node)] = record.grad_out  # None: the hook left .grad None (optimizer in backward)
    return after[id(fn)] if id(fn) in after else observer.records[position].grad
