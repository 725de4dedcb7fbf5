"""What one backward pass is recorded as while it runs: plain records, filled in by the observer
(``observe.py``, ``calls.py``, ``nodes.py``, ``ending.py``) and turned into the pass's model by ``build.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import FrameType
from typing import Any
import weakref

import torch

from ..model import Value, values_equal
from .snapshot import copy_exactly, held_bytes, snapshot

BEFORE_NODE = ("tensor", "node_pre", "multi_grad")  # hook kinds that run before their node's backward
_Tensor = torch.Tensor
_has_torch_function = torch._C._has_torch_function_unary
_strided = torch.strided


@dataclass
class NodeRecord:
    """A backward function ran: what reached it (after hooks) and what it sent, as copies."""

    fn: Any
    received: tuple[Value, ...]
    sent: tuple[Value, ...]
    zeros: tuple[int, ...] = ()  # outputs a custom Function's backward got as zeros where the engine passed None


@dataclass
class GradRecord:
    """``AccumulateGrad`` wrote a leaf's ``.grad``."""

    fn: Any
    received: Value  # what this pass added
    grad: Value  # .grad right after the write, before any post-accumulate hook


@dataclass
class HookRecord:
    """One user hook call while it is being recorded."""

    code: Any
    function: Any
    kind: str
    received: Any  # the live object the hook got (dropped when the call ends)
    grad_in: Any
    frame: FrameType | None  # while the hook runs
    candidates: list = field(default_factory=list)
    module: Any = None
    target: str | None = None
    node_fn: Any = None
    output_nr: int | None = None
    grad_out: Any = None
    returned_none: bool = True
    modified: bool = False
    error: str | None = None
    context: Any = None
    wrapper_seq: int | None = None
    current_fn: Any = None  # the node the engine was running the hook for (torch._C._current_autograd_node)
    edited_in_place: bool = False
    unseen: str | None = None  # a hook the profile function cannot see run (C code): how its values are known
    position: int | None = None  # its place among the hooks on its tensor, when known
    state: Any = None  # the per-registration state of torch's wrapper (multi-grad hooks): hooks.wrapper_state
    slot: int | None = None  # a multi-grad hook (mode="all"): which watched tensor's hook called it
    present: frozenset | None = None  # the keys of its tensor's hook dict when it started (hooks removed meanwhile)
    key: Any = None  # its registration's key in its hook dict (the handle's id), when known: tensor and node hooks
    marks_in: Any = None  # received kept as a summary: its tensors' ids and versions as the call started (livecheck)
    shown: str | None = None  # its name, when only its code is known and its name is not the code's (registrations)
    unplaced: str | None = None  # a hook on an unnamed output of a node of several: why which one is not known
    # post-accumulate hooks: the leaf's value and version as the call started; after it, the value when the hook
    # changed it (an optimizer step fused into backward), and whether it set .grad to None
    leaf_before: Any = None
    leaf_after: Any = None
    grad_none: bool = False


@dataclass
class KnownHook:
    """A hook found on a named tensor before the pass: where it is attached."""

    function: Any
    kind: str  # "tensor" / "post_accumulate_grad" / "multi_grad"
    target: str
    grad_fn: Any  # the node whose execution it precedes (AccumulateGrad for leaves)
    output_nr: int
    position: int = 0  # its place among the hooks of its kind on that tensor (registration order)
    count: int = 1  # how many hooks of its kind that tensor has
    rank: int | None = None  # when that tensor's hook dict was attached to the node (its first handle's id)
    holder: Any = None  # the tensor's hook dict it is in (read during the pass only: a hook may be removed)
    key: Any = None  # its key there (its handle's id)


def snapshot_all(values: Any, limit: int) -> Any:
    """Copies (or summaries) of a tensor or a tuple of them; anything else becomes None."""
    if isinstance(values, (tuple, list)):
        return tuple(snapshot_all(item, limit) for item in values)
    return snapshot(values, limit) if isinstance(values, torch.Tensor) else None


def copy_tuple(observer: Any, values: tuple) -> tuple[tuple, int]:
    """``observer._copy(values)`` for the tuple a node received or sent, while the profile function watches, and the
    bytes it holds (``held_bytes``): one loop, no call per tensor, for the hook that runs at every node."""
    copies, limit = observer.copies, observer.store_limit
    kept_items: list = []
    size = 0
    for item in values:
        if item is None:
            kept_items.append(None)
            continue
        if not isinstance(item, torch.Tensor):
            kept = observer._copy(item) if isinstance(item, (tuple, list)) else None
            size += held_bytes(kept)
            kept_items.append(kept)
            continue
        try:
            version = item._version
        except Exception:  # tensors without a version counter: copy each time
            kept = snapshot(item, limit)
        else:
            hit = copies.get(id(item))  # the copy kept of this object at this version (see NodeRecorder._copy)
            if hit is not None and hit[0]() is item and hit[1] == version:
                kept = hit[2]
            else:
                # snapshot.fast_snapshot, inline: a plain dense CPU tensor within the limit, in a graph that records
                # nothing (what autograd hands over at almost every node), is cloned; anything else is snapshot()'s
                if type(item) is _Tensor and item.is_cpu and item.layout == _strided and not item.requires_grad \
                        and not item.is_nested and not item.is_quantized and not item._is_zerotensor() \
                        and (numel := item.numel()) <= limit:
                    kept = item.clone() if item.is_contiguous() else copy_exactly(item)
                    try:
                        copies[id(item)] = (weakref.ref(item), version, kept)
                    except TypeError:
                        pass
                    size += numel * item.element_size()  # (a copy of the same dtype and elements: held_bytes(kept))
                    kept_items.append(kept)
                    continue
                else:
                    kept = snapshot(item, limit)
                try:
                    copies[id(item)] = (weakref.ref(item), version, kept)
                except TypeError:
                    pass
        if isinstance(kept, torch.Tensor):
            try:
                size += kept.numel() * kept.element_size()
            except Exception:
                pass
        kept_items.append(kept)
    return tuple(kept_items), size


def budget_note(budget: int, earlier: int) -> str:
    """The note of a pass that reached the memory budget (``earlier``: bytes this Lens's earlier passes hold)."""
    held = (f" ({earlier:,} of them held by this Lens's earlier passes: lens.passes.clear() lets them go)"
            if earlier else "")
    return f"values not kept past {budget} bytes (memory_budget){held}: later gradients are shown as summaries"


def adopted(grad: torch.Tensor, arrived: torch.Tensor, version: int) -> bool:
    """``.grad`` (``grad``) is what AccumulateGrad made of the gradient that arrived (``arrived``, at ``version``)
    without a copy: a detached view of the same memory, with the same storage, offset, sizes and strides
    (``Tensor.is_set_to``: one call for what data_ptr, device, shape and stride took four), dtype and version, both
    plain strided tensors with elements.  Raises for a tensor with no storage (callers: the general way then)."""
    return grad.layout == _strided and arrived.layout == _strided and grad._version == version \
        and grad.dtype == arrived.dtype and grad.is_set_to(arrived) and grad.numel() > 0


def usual_leaf(observer: Any, fn: Any, key: int, grad_inputs: tuple, grad_outputs: tuple) -> bool:
    """A leaf's ``AccumulateGrad`` recorded in one call, as ``nodes._record_node``'s general way records it (its
    ``_written``, ``GradRecord``, ``check_write`` and the first steps of ``_unexplained``), when that way would take no
    other turn: autograd adopted the one gradient that arrived (``.grad`` is a view of its memory, at its version),
    that gradient is the very tensor the leaf's one user sent, already copied, and no C++ code may have rewritten
    ``.grad`` since (``check_write``: torch.distributed not initialised).  The caller has checked the rest (no hook call
    pending, no hook in C here, ``.grad`` None before the pass (no pre-hook of the lens's read it), within the memory
    budget, the profile function watching).  Returns False, having recorded and changed nothing, otherwise."""
    if len(grad_outputs) != 1:
        return False
    arrived, variable = grad_outputs[0], fn.variable
    if type(variable) is not _Tensor and _has_torch_function(variable):  # a subclass's .grad would call its
        return False  # __torch_function__ (nn.Parameter's is disabled): the general way reads it hidden
    grad = variable.grad
    if type(arrived) is not _Tensor or type(grad) is not _Tensor:
        return False
    try:  # _written's test that autograd adopted what arrived, and the copy kept of it (same object, same version)
        version = arrived._version
        hit = observer.copies.get(id(arrived))
        if hit is None or hit[0]() is not arrived or hit[1] != version:
            return False
        if not adopted(grad, arrived, version):
            return False
        grad_ref = weakref.ref(grad)
    except Exception:  # no storage to compare, no weak reference: the general way
        return False
    kept = hit[2]
    users = observer.shape.consumers.get((key, 0))
    if not users or len(users) != 1:  # _unexplained's first step: the copy of what its one user sent, as is
        return False
    user, slot = users[0]
    position = observer.ran.get(id(user))
    if position is None:
        return False
    records = observer.records
    sent = records[position].sent
    if not (isinstance(sent, tuple) and slot < len(sent) and sent[slot] is kept):
        return False
    observer.copies[id(grad)] = (grad_ref, version, kept)  # .grad read again after the pass: this copy
    observer.written[key] = kept
    observer.ran[key] = len(records)
    records.append(GradRecord(fn, kept, kept))
    if observer.unhooked.active:
        observer.plain = False  # (as unseen_by_modes says of the pass from here)
        observer.unhooked.on_node(fn, grad_inputs, grad_outputs, [], True)
    return True



def leaf_before(leaf: torch.Tensor, limit: int) -> tuple[Value, int | None]:
    """What a post-accumulate hook's leaf holds as the hook starts: a copy (a summary past ``limit``), its version."""
    try:
        return snapshot(leaf, limit), leaf._version
    except Exception:  # no version counter
        return snapshot(leaf, limit), None


def after_post_accumulate(call: HookRecord, limit: int) -> None:
    """A post-accumulate hook returned: what ``.grad`` holds now (``grad_none``: the hook set it to None, as
    ``optimizer.zero_grad()`` inside it does), and the leaf's own value when the hook changed it (an optimizer step
    fused into backward): ``leaf_before`` / ``leaf_after``, both None when it did not, or it is not known."""
    leaf = call.received
    call.grad_out = snapshot(leaf.grad, limit)
    call.grad_none = leaf.grad is None
    before, version = call.leaf_before if call.leaf_before is not None else (None, None)
    after = snapshot(leaf, limit)
    both_copies = isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
    try:  # summaries: changed when torch counted a write, or their numbers differ
        changed = not values_equal(before, after) if both_copies else \
            before is not None and (leaf._version != version or not values_equal(before, after))
    except Exception:
        changed = False
    call.leaf_before, call.leaf_after = (before, after) if changed else (None, None)
