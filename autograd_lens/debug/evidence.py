"""What the graph shows, just before a pass runs, about named tensors it will not reach.

:func:`collect` runs while torch's graph and the caller's tensors are alive and
keeps only plain data (:class:`Evidence`): which named tensors requiring grad
(and which frozen parameters) are off the graph, and each clue found about why:
the graph saved the very tensor while it did not require grad, or a tensor
sharing its memory, or a tensor holding its exact values; and, with a forward
record (``Lens(why=True)``), the cuts made from it that this graph uses.
Nothing here runs user code: saved tensors packed by a saved-tensor hook are not
unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..model import python_dispatch

SAVED_SCAN_LIMIT = 2000  # backward functions whose saved tensors are looked at
COPY_LIMIT = 4096  # elements compared when looking for a copy of a tensor's values
CUT_SCAN_LIMIT = 2000  # most recent cuts looked at


@dataclass(frozen=True)
class Clue:
    """One thing found about why a tensor is off the graph."""

    code: str  # "requires_grad_false", "detached", "no_grad", "inference_mode", "non_differentiable", "incomplete",
    # "lost" (a cut from it whose value the forward record could not follow)
    text: str
    at: tuple[tuple[int, str], ...] = ()  # (sequence_nr, backward function) of the graph's functions where the cut
    # value entered (the forward record) or that saved the tensor: where the drawing can mark the cut


@dataclass(frozen=True)
class Candidate:
    """A named tensor that requires grad (or a frozen parameter), as the pass found it."""

    name: str
    leaf: bool
    requires_grad: bool
    reachable: bool  # on the graph this pass differentiates (its gradient can reach it)
    node: tuple[int, str] | None = None  # (sequence_nr, backward function) that made it, for a non-leaf
    output_nr: int = 0
    clues: tuple[Clue, ...] = ()


@dataclass(frozen=True)
class Evidence:
    candidates: tuple[Candidate, ...] = ()
    forward: bool = False  # forward ops were recorded (Lens(why=True))
    forward_note: str = ""  # why the forward record is incomplete
    saved_note: str = ""  # why saved tensors were not (all) looked at
    paths: dict[str, Any] = field(default_factory=dict)  # leaf name -> PathSet (with a forward record only)
    paths_note: str = ""
    forward_nonfinite: Any = None  # the block's first forward call returning NaN or inf from finite inputs


def collect(shape: Any, names: Any, recorder: Any = None, paths_note: str = "") -> Evidence:
    """Evidence for one pass; ``shape`` is the pass's ``Structure``, ``names`` its ``Names``."""
    leaf_ids = shape.by_variable()  # id(leaf tensor) -> its node
    consumers = shape.consumers
    roots = {(id(fn), nr) for fn, nr in shape.root_edges}
    missing: list[tuple[str, torch.Tensor]] = []
    candidates: list[Candidate] = []
    tensors = names.tensors
    for tensor in names.tensor_objects:
        requires_grad = tensor.requires_grad
        if not requires_grad and not isinstance(tensor, torch.nn.Parameter):  # neither requiring grad nor frozen
            continue
        fn = tensor.grad_fn
        if fn is None:
            reachable = id(tensor) in leaf_ids
        else:
            key = (id(fn), tensor.output_nr)
            reachable = key in consumers or key in roots
        if reachable:
            candidate = _new(Candidate)  # Candidate(name, ...) without a frozen dataclass's setattr per field
            candidate.__dict__.update(_CANDIDATE_DEFAULTS, name=tensors[id(tensor)], leaf=fn is None,
                                      requires_grad=requires_grad,  # False: a parameter frozen after the forward
                                      reachable=True, node=None if fn is None else _key(fn), output_nr=tensor.output_nr)
            candidates.append(candidate)
        else:
            missing.append((tensors[id(tensor)], tensor))
    nonfinite = recorder.nonfinite if recorder is not None else None
    if not missing:
        return Evidence(tuple(candidates), forward=recorder is not None, forward_nonfinite=nonfinite,
                        paths_note=paths_note)
    saved, saved_note = [], ""
    if any(tensor.requires_grad for _, tensor in missing):  # a frozen parameter's clue needs no saved tensor
        saved, saved_note = _saved_tensors(shape)
    graph_keys = {_key(fn) for fn in shape.nodes}
    cuts = list(reversed(recorder.cuts[-CUT_SCAN_LIMIT:])) if recorder is not None else []
    lost = _lost(cuts, graph_keys)
    for name, tensor in missing:
        clues = _clues(name, tensor, saved, cuts, graph_keys, lost) + _view_of_used(name, tensor, consumers, roots)
        node = None if tensor.grad_fn is None else _key(tensor.grad_fn)
        candidates.append(Candidate(name, tensor.grad_fn is None, tensor.requires_grad, False, node,
                                    tensor.output_nr, tuple(clues)))
    forward_note = ""
    if recorder is not None and recorder.failed:
        forward_note = f"the forward record is incomplete ({recorder.failed})"
    elif recorder is not None and (recorder.forgot or len(recorder.cuts) > CUT_SCAN_LIMIT):
        forward_note = "the forward record is too long to look at in full (its oldest cuts were not looked at)"
    return Evidence(tuple(candidates), forward=recorder is not None, forward_note=forward_note,
                    saved_note=saved_note, forward_nonfinite=nonfinite, paths_note=paths_note)


# Each field of a Candidate with its default, in field order: tests/test_perf_evidence.py checks that what collect
# makes equals what the dataclass makes.
_CANDIDATE_DEFAULTS = {item.name: item.default for item in fields(Candidate)}
_new = object.__new__


def _key(fn: Any) -> tuple[int, str]:
    return (fn._sequence_nr(), fn.name())


def _label(name: str) -> str:
    from ..capture.walk import op_label

    return op_label(name)


def _saved_tensors(shape: Any) -> tuple[list[tuple[str, torch.Tensor, tuple[int, str]]], str]:
    """(op, tensor, the function's key) for every tensor the graph's functions saved, not unpacking any a hook
    packed."""
    from ..capture.saved import packed_by_hook, saved_names

    found: list[tuple[str, torch.Tensor, tuple[int, str]]] = []
    packed = 0
    for fn in shape.nodes[:SAVED_SCAN_LIMIT]:
        if isinstance(fn, torch.autograd.function.BackwardCFunction):
            continue  # a custom Function's ctx.saved_tensors: unpacking it is fine, but it is user data
        for attribute in saved_names(fn):
            raw_name = "_raw" + attribute
            try:
                if hasattr(type(fn), raw_name):
                    if packed_by_hook(getattr(fn, raw_name)):
                        packed += 1
                        continue
                value = getattr(fn, attribute)
            except Exception:  # freed by an earlier backward, or unreadable
                continue
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, torch.Tensor):
                    found.append((_label(fn.name()), item, _key(fn)))
    notes = []
    if len(shape.nodes) > SAVED_SCAN_LIMIT:
        notes.append(f"only the first {SAVED_SCAN_LIMIT} of {len(shape.nodes)} backward functions were looked at")
    if packed:
        notes.append(f"{packed} saved tensors packed by a saved-tensor hook were not looked at")
    return found, "; ".join(notes)


def _lost(cuts: list, graph_keys: set) -> dict[Any, list]:
    """The cuts that did not enter this graph, by what they were computed from (id of a leaf or a source, key of a
    function): looked up per tensor instead of asking every cut."""
    found: dict[Any, list] = {}
    for cut in cuts:
        if cut.entries & graph_keys:
            continue
        for key in {*cut.leaves, *(id(ref()) for ref in cut.sources), *cut.nodes}:
            found.setdefault(key, []).append(cut)
    return found


def _view_of_used(name: str, tensor: torch.Tensor, consumers: dict, roots: set) -> list[Clue]:
    """[a clue] when ``tensor`` is a view whose base this pass differentiates, after a write in place through a view
    (the base's node is torch's CopySlices): the graph's values came partly through that write, yet the graph uses
    the base, not the view, so the view gets no gradient (``retain_grad`` included)."""
    try:
        base = tensor._base if tensor._is_view() else None
        fn = None if base is None else base.grad_fn
        used = fn is not None and fn.name() == "torch::autograd::CopySlices" and (
            (id(fn), base.output_nr) in consumers or (id(fn), base.output_nr) in roots)
    except Exception:  # noqa: BLE001  (a tensor without views or metadata: no clue)
        return []
    return [Clue("view_of_used", f"{name} is a view of a tensor this pass differentiates, which was written in "
                                 "place through a view (torch's CopySlices): the graph uses that base tensor, not "
                                 f"{name}, and only a tensor the graph uses gets a gradient (retain_grad "
                                 "included)")] if used else []


def _clues(name: str, tensor: torch.Tensor, saved: list, cuts: list, graph_keys: set,
           lost_cuts: dict | None = None) -> list[Clue]:
    clues: list[Clue] = []
    if isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad:
        clues.append(Clue("requires_grad_false", f"{name} has requires_grad=False (a frozen parameter): autograd "
                                                 "does not track it"))
    used = [cut for cut in cuts if cut.entries & graph_keys]
    # the longest chain of calls this graph uses (a cut's values that entered it went through their own calls)
    found = max((cut for cut in used if cut.computed_from(tensor)), key=lambda cut: len(cut.chain), default=None)
    if found is not None:
        clues.append(Clue(found.cause, _cut_text(name, tensor, found), tuple(sorted(found.entries & graph_keys))))
    elif any(not cut.complete for cut in used):
        clues.append(Clue("incomplete", "a cut this graph uses was computed from more functions than were looked "
                                        f"at; whether {name} is among them is not known"))
    else:  # a cut from it whose value the record lost (Python or NumPy arithmetic, a small int): maybe used after all
        keys = (id(tensor),) if tensor.grad_fn is None else (id(tensor), _key(tensor.grad_fn))
        candidates = [cut for key in keys for cut in (lost_cuts or {}).get(key, ())]
        lost = next((cut for cut in candidates if cut.computed_from(tensor)), None)
        if lost is not None:
            clues.append(Clue("lost", f"it is not on the graph, but {_cut_text(name, tensor, lost, False)}: the "
                                      "forward record follows such a value through torch calls only, so whether it "
                                      "reached this graph by other steps (Python or NumPy arithmetic, an index, a "
                                      "condition) is not known"))
    storage = _storage(tensor)
    for op, value, key in saved:
        if value is tensor:
            if not tensor.requires_grad:
                continue  # the frozen-parameter clue says it
            clues.append(Clue("requires_grad_false", f"{op} used {name} while it had requires_grad=False (it was "
                                                     "set to True after the forward ran)", (key,)))
            break
        if storage is None or _storage(value) != storage or value.grad_fn is not None:
            continue
        if not value.requires_grad:
            clues.append(Clue("detached", f"{op} saved a tensor that shares {name}'s memory but not its autograd "
                                          "history (made by .detach(), .data, a NumPy view, or a view "
                                          "taken under no_grad)", (key,)))
            break
        clues.append(Clue("detached", f"{op} saved a separate leaf that shares {name}'s memory (a view taken under "
                                      "no_grad, or .detach().requires_grad_()): the gradient goes to that leaf, "
                                      f"not to {name}", (key,)))
        break
    else:
        copy = next(((op, key) for op, value, key in saved if _same_values(value, tensor)), None)
        if copy is not None:
            op, key = copy
            clues.append(Clue("detached", f"{op} saved a tensor holding exactly {name}'s values (not whole "
                                          "numbers or simple fractions) without its autograd history: a copy made "
                                          "by .item(), .tolist(), NumPy or torch.tensor(...)", (key,)))
    return clues


def _cut_text(name: str, tensor: torch.Tensor, cut: Any, used: bool = True) -> str:
    where = name if cut.took(tensor) else "a tensor computed from it"
    return f"{where} went through {cut.text()}" + (", and this graph uses the result" if used else "")


def _storage(tensor: torch.Tensor) -> int | None:
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except Exception:  # sparse, nested, meta, subclasses
        return None
    return pointer or None


def _same_values(value: torch.Tensor, tensor: torch.Tensor) -> bool:
    """``value`` holds exactly ``tensor``'s numbers, and they are not all multiples of 1/1024 (whole numbers, 0.5,
    1.5: a number written in the code could give them); compared in float64 so a float32 copied through ``.item()``
    still matches."""
    try:
        if value.requires_grad or value.numel() != tensor.numel() or tensor.numel() > COPY_LIMIT \
                or python_dispatch(value) or python_dispatch(tensor):  # (not read: see python_dispatch)
            return False
        if not (tensor.is_floating_point() and (value.is_floating_point())):
            return False
        if value.dim() and tuple(value.shape) != tuple(tensor.shape):
            return False
        with torch.no_grad():
            return _equal_values(value, tensor)
    except Exception:
        return False


def _equal_values(value: torch.Tensor, tensor: torch.Tensor) -> bool:
    mine = tensor.detach().reshape(-1).double()
    theirs = value.detach().reshape(-1).double()
    if bool((mine * 1024 == (mine * 1024).round()).all()):  # whole numbers or simple fractions (0.5, 1.5, 0.125):
        return False  # a number written in the code gives them as easily as a copy does
    return bool(torch.equal(mine, theirs))
