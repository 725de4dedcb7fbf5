"""What the lens keeps of each leaf across the passes of one ``Lens`` (``history``): its ``.grad`` after the last
pass, the value without hooks, and a mark to tell whether code touched ``.grad`` since."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..model import TensorSummary, values_equal
from .snapshot import plain_or_none, summarize
from .unhooked import LeafHistory, Unknown


@dataclass
class LeafState(LeafHistory):
    """:class:`LeafHistory` and what the pass's end learns about the leaf: its ``.grad`` may share memory with
    another gradient (in this run, or in a run without hooks), and whether any hook ran in this ``Lens`` yet."""

    shared: bool = False
    hooked: bool = False
    mark: Any = None  # (weakref to the .grad tensor or None, its version) after the pass: was it touched since?

    def __post_init__(self) -> None:
        variable = self.ref()
        self.mark = _mark(getattr(variable, "grad", None) if variable is not None else None)

    @classmethod
    def of(cls, variable: Any, grad: Any, without: Any, shared: bool, hooked: bool) -> "LeafState":
        """``LeafState(weakref.ref(variable), grad, without, shared, hooked)`` for a live ``variable``, without the
        dataclass's ``__init__`` (one per leaf at every pass's end); tests/test_rows.py compares the two."""
        state = _new(cls)
        state.__dict__.update(ref=weakref.ref(variable), grad=grad, without=without, shared=shared, hooked=hooked,
                              mark=_mark(variable.grad))
        return state


def _mark(grad: Any) -> Any:
    """(weakref to ``.grad`` or None, its version) to tell later whether it was touched; None: cannot be told."""
    try:
        return (None, None) if grad is None else (weakref.ref(grad), grad._version)
    except (TypeError, RuntimeError):  # no weak reference or no version (some subclasses): not known
        return None


_new = object.__new__


def touched(entry: Any) -> bool | None:
    """Whether a leaf's ``.grad`` was replaced or written in place since the end of its last pass (read as the next
    pass starts): ``clip_grad_norm_`` writes every ``.grad`` even when it leaves the values as they were.  None: not
    known."""
    mark = getattr(entry, "mark", None)
    variable = entry.ref() if entry is not None else None
    if mark is None or variable is None:
        return None
    try:
        grad = variable.grad
        if mark[0] is None:
            return grad is not None
        return grad is None or grad is not mark[0]() or grad._version != mark[1]
    except Exception:  # a tensor subclass without a version: not known
        return None


def watch(observer: Any, fn: Any, variable: Any) -> None:
    """The lens's pre-hook on a leaf's ``AccumulateGrad`` (it reads ``.grad`` before the write), and the mark of that
    ``.grad`` as the pass starts."""
    observer.handles.append(fn.register_prehook(observer._before_write))
    observer.watched.add(id(fn))
    observer.start_marks[id(fn)] = _mark(variable.grad)


def read_before_write(observer: Any, fn: Any, old: Any, incoming: Any) -> None:
    """What the pre-hook keeps: ``.grad`` before the write (``old``) and what is about to be added; and whether
    ``.grad`` is another tensor, or was written, since the pass started: a hook of this pass changed it (nothing
    else runs during a pass), so what it would hold without hooks is not what it holds now."""
    key = id(fn)
    if not observer.plain and changed_since(observer.start_marks.get(key), old):  # (plain: no user Python ran yet)
        observer.changed_before_write.add(key)
    observer.plain = observer.plain and plain_or_none(old) and plain_or_none(incoming)  # kept, compared later
    observer.old_grads[key], observer.incoming[key] = observer._keep(old), observer._keep(incoming)


def changed_since(mark: Any, grad: Any) -> bool:
    """``grad`` is not the ``.grad`` that ``mark`` (see :func:`_mark`) was taken of, or was written since."""
    if mark is None:  # not known: no mark could be taken
        return False
    ref, version = mark
    if ref is None or grad is None:
        return (ref is None) != (grad is None)
    try:
        return grad is not ref() or grad._version != version
    except Exception:  # no version: not known
        return False


def pass_marks(history: dict) -> dict:
    """id(leaf) -> the mark (see :func:`_mark`) of each known leaf's ``.grad`` as a pass starts."""
    marks = {}
    for key, entry in history.items():
        variable = entry.ref()
        if variable is not None:
            marks[key] = _mark(variable.grad)
    return marks


CHANGED_OFF_GRAPH = (".grad was replaced or written during a pass that did not reach this leaf (by a hook, "
                     "or through memory it shares with another gradient): what it would hold without hooks is not "
                     "known")


def changed_off_graph(observer: Any, history: dict, seen: set) -> None:
    """Leaves of earlier passes that this pass does not reach (``seen``: their ids) whose ``.grad`` was replaced or
    written while it ran: user code of this pass did it (a hook; nothing else runs during a pass), so the lens's
    history of them no longer says what they would hold without hooks."""
    if observer.plain:  # no user Python ran in this pass
        return
    marks = getattr(observer, "pass_marks", {})
    for key, entry in list(history.items()):
        variable = entry.ref()
        if key in seen or variable is None or key not in marks or not changed_since(marks[key], variable.grad):
            continue
        # (.grad as its last pass left it stays: a hook's change is not "the previous pass's gradient")
        history[key] = LeafState.of(variable, entry.grad, Unknown(CHANGED_OFF_GRAPH), getattr(entry, "shared", False),
                                    True)


# passes a Lens leaves alone (entry.UNTRACED) that may write .grad: their hooks are not seen
_GRAD_WRITERS = ("thread", "compiled", "freed")
UNRECORDED_WRITE = ("a backward pass the lens did not record ({what}) ran since, and may have written this .grad, "
                    "with hooks the lens did not see: what it would hold without hooks is not known")


def unrecorded_passes(observer: Any) -> tuple:
    """(the observer's Lens's count of passes left alone, by kind; how many of them may have written ``.grad``), read
    at a pass's end and kept on each leaf's :class:`LeafState` (``unrecorded``)."""
    counts = getattr(observer, "untraced", None)
    if not isinstance(counts, dict):
        return (None, 0)
    return (counts, sum(counts.get(kind, 0) for kind in _GRAD_WRITERS))


def unrecorded_write(entry: Any, now: tuple, touched_since: bool | None) -> Unknown | None:
    """Why a leaf's ``.grad`` as this pass found it is not known without hooks, when a pass the Lens left alone (another
    thread's backward) ran since the leaf's last recorded pass and ``.grad`` was written since (or may have been)."""
    counts, total = now
    if not total or touched_since is False:
        return None
    before = getattr(entry, "unrecorded", None)
    if before is not None and before[0] is counts and before[1] == total:
        return None
    from .entry import UNTRACED

    kinds = [UNTRACED[kind] for kind in _GRAD_WRITERS if counts.get(kind)]
    return Unknown(UNRECORDED_WRITE.format(what=" or ".join(kinds)))


CHANGED_BY_HOOK = ("a hook changed {names} itself during this pass (not a gradient: the value, e.g. through .data), "
                   "and backward functions that ran after that computed with the new value; without hooks they would "
                   "have used the old one: not known")


def changed_by_hooks(observer: Any, walk: Any, value_index: int) -> Unknown | None:
    """Why this pass's values without hooks are not known, when a hook changed a leaf's value in place during the pass
    (``x.data.mul_(10)``: no version counter sees it) — found for the leaves small enough that the walk kept their
    values before the pass, and for larger ones when their summaries differ (a drawing of up to 200 functions keeps
    min, max, norm and first entries: a change that keeps all four is not seen); a post-accumulate hook stepping its
    own leaf (after the leaf's users ran) is not one."""
    from .entry import freed_leaf
    from .records import HookRecord  # (the records import this module's neighbours)

    records = observer.records
    if not any(isinstance(record, HookRecord) for record in records):
        return None  # no hook ran: nothing of the user's could change a value during the pass
    stepped = {id(record.current_fn) for record in records if isinstance(record, HookRecord)
               and record.kind == "post_accumulate_grad" and record.leaf_after is not None}
    before = {row[0]: row[value_index] for row in walk.rows.nodes}
    names = []
    with torch._C.DisableTorchFunction():
        for key, fn in observer.shape.leaves.items():
            value = before.get(walk.function_ids.get(key))
            if key in stepped or not (isinstance(value, torch.Tensor) or _compared(value)) or freed_leaf((fn,)):
                continue  # (a leaf FSDP2 freed at the pass's end: reading it would read freed memory)
            try:
                now = fn.variable.detach()
                if isinstance(value, TensorSummary):  # a large leaf: its summary (min, max, norm, first entries)
                    now = summarize(now)
                    if _compared(now) and now.shape == value.shape and now != value:
                        names.append(observer.shape.leaf_labels.get(key, "a leaf"))
                elif now.shape == value.shape and not values_equal(value, now):
                    names.append(observer.shape.leaf_labels.get(key, "a leaf"))
            except Exception:  # noqa: BLE001  (a value that cannot be compared: not one the lens says changed)
                continue
    return Unknown(CHANGED_BY_HOOK.format(names=", ".join(names))) if names else None


def _compared(summary: Any) -> bool:
    """A summary two of which tell values apart when they differ: dense, with its statistics, none of them NaN (a
    NaN never equals itself: two summaries of one tensor holding NaN would differ)."""
    return isinstance(summary, TensorSummary) and summary.kind == "dense" and summary.norm is not None \
        and all(item == item for item in (summary.min, summary.max, summary.norm, *summary.head))
