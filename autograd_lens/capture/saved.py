"""What a backward function saved for its backward pass, read without running user code: the names of its saved
values, the numbers an op was called with (drawn as constants), the ``saves self=y`` summary, and where a tensor's
numbers live (to name a saved tensor after the user's tensor over the same memory)."""

from __future__ import annotations

import re
from typing import Any

import torch

from ..format import format_listed, format_value
from ..model import GraphOptions, python_dispatch
from .names import Names
from .snapshot import kind_of

# Saved values that describe layout rather than maths: never drawn.
_STRUCTURAL = re.compile(
    r"(size|stride|dim|sym|storage_offset|split|chunk|index|start|end|step|length|reduction|"
    r"padding|dilation|groups|shape|options|dtype|layout|device|memory_format|indices|ignore)",
)
_saved_names_cache: dict[type, tuple[str, ...]] = {}


def saved_names(fn: Any) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of a backward function (cached per node type)."""
    kind = type(fn)
    names = _saved_names_cache.get(kind)
    if names is None:
        names = tuple(sorted(name for name in dir(fn) if name.startswith("_saved_")))
        _saved_names_cache[kind] = names
    return names


def _is_constant_name(attribute: str) -> bool:
    constant = _constant_names.get(attribute)
    if constant is None:
        constant = not _STRUCTURAL.search(attribute[len("_saved_"):])
        if len(_constant_names) < 4096:  # one entry per saved attribute's name seen
            _constant_names[attribute] = constant
    return constant


_constant_names: dict[str, bool] = {}


# A saved tensor that a saved-tensor hook packed (``saved_tensors_hooks``, checkpointing):
# reading it would run the user's unpack hook (or recompute a checkpointed forward).
PACKED = "packed by a saved-tensor hook"


def packed_by_hook(raw: Any) -> bool:
    """True when a ``_raw_saved_*`` value (a ``SavedTensor`` or a sequence of them) was packed by a hook."""
    if isinstance(raw, (tuple, list)):
        return any(packed_by_hook(item) for item in raw)
    return getattr(raw, "unpack_hook", None) is not None


def saved_value(fn: Any, attribute: str) -> Any:
    """``fn._saved_<name>`` without running any user code: tensors are read through ``_raw_saved_<name>``
    and only when no saved-tensor hook packed them (``PACKED`` otherwise; ``None`` once freed)."""
    raw_name = _raw_name(type(fn), attribute)
    if raw_name is not None:
        raw = getattr(fn, raw_name)
        if type(raw) is _SavedTensor:  # one saved tensor (the usual case: packed_by_hook's, without the call)
            return raw.data if raw.unpack_hook is None else PACKED
        if packed_by_hook(raw):
            return PACKED
        if isinstance(raw, (tuple, list)):
            return tuple(item.data for item in raw)
        return raw.data
    return getattr(fn, attribute)  # sizes, scalars, flags: plain values, nothing to unpack


def _raw_name(kind: type, attribute: str) -> str | None:
    """``_raw_saved_<name>`` when node type ``kind`` has it (a saved tensor, read without unpacking it), else None:
    looked up once per type (``hasattr`` on a type without it raises and catches an AttributeError)."""
    raw_names = _raw_names.get(kind)
    raw_name = _UNSEEN if raw_names is None else raw_names.get(attribute, _UNSEEN)
    if raw_name is _UNSEEN:
        raw_name = "_raw" + attribute
        if not hasattr(kind, raw_name):
            raw_name = None
        if raw_names is None and len(_raw_names) < 4096:  # one entry per node type seen, as saved_names
            raw_names = _raw_names[kind] = {}
        if raw_names is not None:
            raw_names[attribute] = raw_name
    return raw_name


_raw_names: dict[type, dict[str, str | None]] = {}
_SavedTensor = torch._C._autograd.SavedTensor
_UNSEEN = object()


def saved_tensors_packed(fn: Any) -> bool:
    """True when any tensor ``fn`` saved was packed by a saved-tensor hook (so running ``fn`` would unpack it)."""
    for attribute in saved_names(fn):
        raw_name = _raw_name(type(fn), attribute)
        if raw_name is not None and packed_by_hook(getattr(fn, raw_name)):
            return True
    return False


def _saved_values(fn: Any, names: Any = None) -> list[tuple[str, Any]]:
    """(name, value) of each saved value of ``fn`` that can be read (``names``: those attributes only)."""
    values = []
    for attribute in saved_names(fn) if names is None else names:
        try:
            value = saved_value(fn, attribute)
        except Exception:  # freed by an earlier backward(), or not readable
            continue
        if value is not None:
            values.append((attribute[len("_saved_"):], value))
    return values


def _drawn_saved_values(fn: Any) -> list[tuple[str, Any]]:
    """What the walk draws of ``_saved_values(fn)``: the same list without the values it never shows (an attribute
    whose name is structural and that is no saved tensor: no summary, no constant), left unread.
    tests/test_perf_walk.py compares the drawings made with each."""
    kind = type(fn)
    wanted = _drawn_names.get(kind)
    if wanted is None:  # (name, attribute) of each value drawn
        wanted = tuple((attribute[len("_saved_"):], attribute)
                       for attribute in saved_names(fn)
                       if _is_constant_name(attribute) or _raw_name(kind, attribute) is not None)
        if len(_drawn_names) < 4096:  # one entry per node type seen, as saved_names
            _drawn_names[kind] = wanted
    values = []
    for name, attribute in wanted:  # as _saved_values(fn, those attributes)
        try:
            value = saved_value(fn, attribute)
        except Exception:  # freed by an earlier backward(), or not readable
            continue
        if value is not None:
            values.append((name, value))
    return values


_drawn_names: dict[type, tuple[tuple[str, str], ...]] = {}


def _number(number: Any) -> str:
    from ..format import format_number

    return format_number(number)


def _saved_summary(fn: Any, names: Names, storage_names: dict, options: GraphOptions,
                   values: list[tuple[str, Any]] | None = None, later: bool = False) -> str | SavedText:
    """``saves self=y`` style text: which tensors this backward function keeps (``values``: its
    ``_saved_values``, when already read).  With ``later``, a :class:`SavedText` when a saved tensor's numbers are
    in it: they are read now and written when the graph is made (``SavedText.text``)."""
    parts: list = []
    for name, value in _saved_values(fn) if values is None else values:
        if value is PACKED:
            parts.append(f"{name} {PACKED}")
            continue
        if not isinstance(value, torch.Tensor) or value.dim() == 0 and not value.requires_grad \
                and not name.startswith("result"):  # (a number the op was called with: drawn as a constant)
            continue
        known = names.tensor_name(value) or _stored_name(storage_names, value)
        if known is not None:
            parts.append(f"{name}={known}")
        elif value.numel() <= options.max_elements:
            listed = _listed(value) if later else None
            # format_value detaches
            parts.append(f"{name}={format_value(value, 24)}" if listed is None else (name, listed))
        else:
            parts.append(f"{name}=[{'x'.join(map(str, value.shape))}]")
    if not parts:
        return ""
    if later and any(type(part) is tuple for part in parts):
        return SavedText(parts)
    return "saves " + ", ".join(parts)


class SavedText:
    """The ``saves mat1=[[...]]`` text of a backward function, its saved tensors' numbers read when the walk ran
    (before the pass: ``tolist()``, a copy) and written when the graph is made, after the pass (formatting costs
    several times the read).  ``parts``: text, or (name, the numbers) of a tensor ``format_value`` would write."""

    __slots__ = ("parts",)

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def text(self) -> str:
        return "saves " + ", ".join(part if type(part) is str else f"{part[0]}={format_listed(part[1], 24)}"
                                    for part in self.parts)


def _listed(value: torch.Tensor) -> list | None:
    """``value.tolist()`` when ``format_value(value)`` writes those numbers (a plain dense CPU tensor of 1 to 64
    numbers, one dimension or more), else None (written now)."""
    if value.dim() == 0 or value.numel() > 64 or kind_of(value) != "dense":
        return None
    try:
        return value.tolist()
    except Exception:  # no readable numbers: format_value says what it is
        return None


def _storage_key(tensor: torch.Tensor) -> tuple | None:
    """Where a tensor's numbers live: saved tensors are new objects over the same memory."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
        return (pointer, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype) if pointer else None
    except Exception:  # sparse, nested (no sizes), meta, subclasses: no storage to share
        return None


def _storage_names(names: Names) -> dict[int, list]:
    """The named tensors by where their first number lives (``data_ptr()``): [tensor, name] pairs in the order of
    ``names``, for :func:`_stored_name` (one call per tensor here; the storage key only for a saved tensor that
    starts where a named one does)."""
    found: dict[int, list] = {}
    for kept in names.tensor_objects:
        try:
            pointer = kept.data_ptr()
        except Exception:  # sparse, nested, subclasses: no storage to share (as _storage_key)
            continue
        if pointer:
            found.setdefault(pointer, []).append((kept, names.tensors[id(kept)]))
    return found


def _stored_name(found: dict[int, list], tensor: torch.Tensor) -> str | None:
    """The name of the first named tensor with ``tensor``'s storage key (``_storage_key``: memory, offset, shape,
    strides, dtype), from ``_storage_names``; tensors with another ``data_ptr()`` cannot have it."""
    if not found:
        return None
    try:
        pointer = tensor.data_ptr()
    except Exception:
        return None
    kept = found.get(pointer)
    if kept is None:
        return None
    key = _storage_key(tensor)
    if key is None:
        return None
    for other, name in kept:
        if _storage_key(other) == key:
            return name
    return None


def _add_constants(build: Any, saved: list[tuple[str, Any]], node_id: str) -> None:
    """Draw the numbers an op was called with (the 3 in ``y * 3``; ``saved``: its ``_saved_values``) as small
    input nodes."""
    for name, value in saved:
        if not _is_constant_name("_saved_" + name) or name.startswith("result"):
            continue  # (an op's own output, exp's or tanh's: listed in its "saves ..." line, not drawn as an input)
        if isinstance(value, torch.Tensor):
            if value.dim() != 0 or value.requires_grad or python_dispatch(value):  # (not read: python_dispatch)
                continue
            number: Any = value.item()
        elif isinstance(value, (bool, int, float)):
            number = value
        else:
            continue
        if name in ("alpha", "beta") and number == 1:
            continue  # the implicit factor of add/addmm: noise in a drawing
        const_id = build.node(kind="constant", label=_number(number), detail=name)
        build.edge(const_id, node_id, kind="saved", label=name)
