"""One backward function run again on what it would have received with no hook (``unhooked.Unhooked``'s work).

``fn(*grads)`` runs the backward function and no hook; each result is then reduced to the shape its receiver expects,
as the engine does after every node (``validate_outputs``: broadcast dimensions summed, dtype converted).  Only
torch's C++ backward functions are run again, and only when none of their saved tensors was packed by a saved-tensor
hook (unpacking would run that hook, or recompute a checkpointed forward) or is a tensor subclass computing through
Python dispatch.  Anything else gives an ``Unknown`` with the reason: never a guess.

Each node runs again once per pass, so what can be known of a node's *type* (is it C++, which saved tensors does it
have) is found once per type; its saved tensors are read once, for both questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .snapshot import hidden_from_user
from ..model import python_dispatch
from .saved import saved_names

_hidden_from_modes = hidden_from_user  # the lens's tensor ops never reach a user's dispatch mode or profile
_PYTHON_NODE = torch.autograd.function.BackwardCFunction
_IDENTITY_NODES = ("BackwardHookFunctionBackward",)  # torch's module-hook boundary: backward returns its input
_Tensor = torch.Tensor


@dataclass(frozen=True)
class Unknown:
    """A value the lens cannot know without running user code again, and why."""

    reason: str


# what a node type is, found once per type: run it again (C++), pass its input on (a module-hook boundary), or not
_RUN, _IDENTITY, _PYTHON, _FOREIGN = range(4)
_KINDS: dict[type, int] = {}
_RAW_NAMES: dict[type, tuple[str, ...]] = {}  # node type -> its ``_raw_saved_*`` attributes (saved tensors)
_SAVED_OK, _PACKED, _DISPATCHING = range(3)


def _kind_of(kind: type) -> int:
    if issubclass(kind, _PYTHON_NODE):
        return _IDENTITY if kind.__name__ in _IDENTITY_NODES else _PYTHON
    return _FOREIGN if kind.__module__ != "builtins" else _RUN


def run_node(fn: Any, grads: list[Any]) -> tuple[Any, ...] | Unknown:
    """What ``fn`` sends for ``grads`` with no hook, reduced to what each receiver expects; or Unknown."""
    with torch.no_grad(), _hidden_from_modes():
        return run_again(fn, grads)


def run_again(fn: Any, grads: list[Any], nexts: tuple | None = None, metadata: dict | None = None,
              sent: tuple | None = None) -> tuple[Any, ...] | Unknown:
    """``run_node`` for a caller that has grad mode off and the lens's work hidden already (``Unhooked.on_node``);
    ``nexts``: ``fn.next_functions`` read already, ``metadata``: what ``reduce_outputs`` read of ``_input_metadata``
    already (added to as read); ``sent``: what ``fn`` really sent in this pass (see ``reduce_outputs``)."""
    kind_type = type(fn)
    kind = _KINDS.get(kind_type)
    if kind is None:
        kind = _KINDS[kind_type] = _kind_of(kind_type)
    if kind == _RUN:
        raw_names = _RAW_NAMES.get(kind_type)
        if raw_names is None:
            raw_names = _raw_names(fn)
        saved = _saved_state(fn, raw_names) if raw_names else _SAVED_OK
        if saved == _PACKED:
            return Unknown(f"{fn.name()}'s saved tensors were packed by a saved-tensor hook (e.g. checkpointing); "
                           "unpacking them again would run that hook")
        if saved == _DISPATCHING:
            return Unknown(f"{fn.name()} saved a tensor subclass with a __torch_dispatch__ of its own (a wrapper such "
                           "as TwoTensor or DTensor): its numbers are not read, so it is not run again")
        try:
            outputs = fn(*grads)
        except Exception as problem:
            return Unknown(f"{fn.name()} could not be run again ({type(problem).__name__}: {problem})")
    elif kind == _IDENTITY:
        outputs = tuple(grads)
    elif kind == _PYTHON:
        return Unknown(f"{fn.name()}'s backward is Python code (a custom autograd.Function or torch's own, "
                       "e.g. reentrant checkpointing); running it again could change your program")
    else:
        return Unknown(f"{fn.name()} is not one of torch's C++ backward functions, so it is not run again")
    if type(outputs) is not tuple:
        outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    try:
        return reduce_outputs(fn, outputs, nexts, metadata, sent)
    except Exception as problem:
        return Unknown(f"the result of {fn.name()} could not be reduced to its inputs' shapes ({problem})")


def _raw_names(fn: Any) -> tuple[str, ...]:
    kind = type(fn)
    names = _RAW_NAMES[kind] = tuple("_raw" + name for name in saved_names(fn) if hasattr(kind, "_raw" + name))
    return names


def packed(fn: Any) -> bool:
    """``saved.saved_tensors_packed``, with the names of a node type's saved tensors found once per type."""
    raw_names = _RAW_NAMES.get(type(fn))
    if raw_names is None:
        raw_names = _raw_names(fn)
    return _saved_state(fn, raw_names) == _PACKED


def _saved_state(fn: Any, raw_names: tuple[str, ...]) -> int:
    """``_PACKED`` when a saved-tensor hook packed one of ``fn``'s saved tensors (reading it would run that hook);
    else ``_DISPATCHING`` when one is a tensor whose ops go through Python dispatch (``python_dispatch``: the lens runs
    nodes with dispatch off, where a wrapper subclass has no storage: running the node crashes the process); else
    ``_SAVED_OK``.  Each saved tensor is read once; a packed one's numbers never (``.data`` would unpack it)."""
    dispatching = False
    for raw_name in raw_names:
        raw = getattr(fn, raw_name)  # (freed: raises, as running the node would)
        items = raw if isinstance(raw, (tuple, list)) else (raw,)
        for item in items:
            if getattr(item, "unpack_hook", None) is not None:
                return _PACKED
        if dispatching:
            continue
        for item in items:
            try:
                value = item.data
            except Exception:
                continue
            if value is not None and type(value) is not _Tensor and python_dispatch(value):
                dispatching = True
    return _DISPATCHING if dispatching else _SAVED_OK


def reduce_outputs(fn: Any, outputs: tuple[Any, ...], nexts: tuple | None = None, known: dict | None = None,
                   sent: tuple | None = None) -> tuple[Any, ...]:
    """The engine's ``validate_outputs``: sum broadcast dimensions away and convert the dtype (called with grad
    mode off and the lens's work hidden, by ``run_node``).  torch builds ``next_functions`` and ``_input_metadata``
    anew at each read (a node's never change): ``nexts`` when read already, and ``known`` ((id(node), input) ->
    (shape, dtype) of that input's metadata), added to as read.

    ``sent``: the gradients ``fn`` really sent in this pass, as its post-hooks see them.  The engine made each one
    the shape and dtype of its receiver's metadata (``validate_outputs`` runs before any post-hook), and torch refuses a
    Python post-hook's result of another size or type (``hook ... has changed the size of value``): a plain tensor
    there has the receiver's shape and dtype, read without building ``_input_metadata``.  (A post-hook may return
    None in its place: then the metadata is read.)"""
    reduced = []
    count = len(outputs)
    slot = 0
    if known is None:
        known = {}
    if sent is None:
        sent = ()
    sent_count = len(sent)
    for next_fn, output_nr in (fn.next_functions if nexts is None else nexts):
        value = outputs[slot] if slot < count else None
        real = sent[slot] if slot < sent_count else None
        slot += 1
        if next_fn is None or not isinstance(value, _Tensor):
            reduced.append(None)
            continue
        if type(real) is _Tensor and not real.is_nested:
            shape, dtype = real.shape, real.dtype
        else:
            key = (id(next_fn), output_nr)
            expected = known.get(key)
            if expected is None:
                metadata = next_fn._input_metadata[output_nr]
                expected = known[key] = (metadata.shape, metadata.dtype)  # (a torch.Size is a tuple)
            shape, dtype = expected
        if value.shape != shape:
            value = value.sum_to_size(shape)
        if value.dtype != dtype:
            value = value.to(dtype)
        reduced.append(value)
    return tuple(reduced)
