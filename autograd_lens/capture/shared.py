"""Which leaves' ``.grad`` may share memory with another gradient (#19): autograd adopts the gradient that reaches
a leaf without a copy when nothing else holds it, and that gradient can be a view of the seed (``x.sum()`` of a 0-dim
leaf, ``x.view(6)`` under ``gradient=``) or of a buffer another leaf views too.  Adding to one ``.grad`` then changes
the other, and a hook (returning a new tensor, or keeping the one it got) decides whether the adoption happens, so a
run without hooks may share memory where this one does not: those values without hooks are unknown."""

from __future__ import annotations

from typing import Any

import torch

SHARED = ("its .grad shares memory, or may (in this run or in one without hooks), with another leaf's .grad or with "
          "the gradient passed to backward(): autograd adopts the gradient that reaches a leaf without a copy, and "
          "that gradient can be a view of one other leaves or the seed view too, so adding to one changes the other; "
          "a hook decides whether that happens (one that returns a new tensor, or keeps the one it got), so what it "
          "would hold without hooks is not known")


# Backward functions that may send an input the gradient they received, or a view of it (a view op's backward, a
# sum's expand, add's pass-through, stack's and cat's slices), so that a leaf may adopt memory another gradient
# shares; the others make a gradient of their own (arithmetic on what they received).  A Python backward may do
# anything.
_MAY_VIEW = frozenset(("View", "ReshapeAlias", "UnsafeView", "Expand", "Sum", "T", "Transpose", "Permute", "Squeeze",
                       "Unsqueeze", "Alias", "Clone", "Add", "Sub", "ToCopy", "Stack", "Cat", "ViewAsReal",
                       "ViewAsComplex", "Lift", "Detach", "Conj", "Unbind", "Split", "SplitWithSizes", "Narrow",
                       "AsStrided", "Diagonal", "Select", "Slice", "Unfold", "Movedim"))


_PASS_ON = frozenset(("Add", "Sub", "Clone", "Alias", "ToCopy", "Lift", "Detach", "Conj"))  # the same tensor, no view


def _may_view(fn: Any) -> bool:
    return type(fn).__module__ != "builtins" or fn.name().split("Backward")[0] in _MAY_VIEW


def span_of(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, end byte) of the memory a dense tensor spans, or None."""
    try:
        if tensor.layout != torch.strided or tensor.numel() == 0:
            return None
        size = tensor.element_size()
        start = tensor.storage_offset() * size
        extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if n > 0)
        return tensor.untyped_storage().data_ptr(), start, start + extent * size
    except Exception:  # sparse, nested, meta: no memory to share
        return None


def edited_spans(value: Any) -> list[tuple[int, int, int]]:
    """The memory of each tensor in ``value`` (a tensor, or a tuple or list of them) a hook edited in place."""
    tensors = value if isinstance(value, (tuple, list)) else (value,)
    return [span for span in (span_of(t) for t in tensors if isinstance(t, torch.Tensor)) if span is not None]


def shared_leaves(observer: Any, adopted: set[int]) -> set[int]:
    """Leaves (``id(AccumulateGrad)``) whose ``.grad`` may share memory with another gradient, in this run or in
    one without hooks (a hook that returns a new tensor, or keeps the one it got, decides whether autograd adopts
    it): those whose ``.grad`` overlaps another leaf's now, and those of ``adopted`` (their ``.grad`` was None) that
    may hold a view of a buffer another of them, or the caller's gradient= tensor, holds too (``_source``)."""
    storages: dict[int, list] = {}  # storage address -> the leaves whose .grad is in it (one each, usually)
    for key, fn in observer.shape.leaves.items():
        grad = fn.variable.grad
        if isinstance(grad, torch.Tensor):
            try:
                storages.setdefault(grad.untyped_storage().data_ptr(), []).append((key, grad))
            except Exception:  # noqa: BLE001 - sparse, nested, meta: no memory to share (span_of: None)
                pass
    by_storage: dict[int, list] = {}  # compared within one storage only (all pairs: quadratic in the leaves)
    for group in storages.values():
        if len(group) > 1:  # the spans of .grads that share a storage (span_of's address is that storage's)
            for key, grad in group:
                span = span_of(grad)
                if span is not None:
                    by_storage.setdefault(span[0], []).append((key, span[1], span[2]))
    found = {key for group in by_storage.values() if len(group) > 1 for key, start, end in group
             for other, start2, end2 in group if other != key and start < end2 and start2 < end}
    if not adopted:
        return found
    consumers = observer.shape.consumers
    arrivals: dict[int, int] = {}  # how many gradients reach each function (two or more: summed in a buffer of its own)
    outputs: dict[int, list] = {}  # function -> the users of each of its outputs
    for (fn_id, _), users in consumers.items():
        arrivals[fn_id] = arrivals.get(fn_id, 0) + len(users)
        if users:
            outputs.setdefault(fn_id, []).append(users)
    # root function -> whether the caller passed a gradient= tensor it may pass again (a 0-dim one only when it is the
    # caller's own: backward() without gradient= makes a new one each time)
    seeded = {}
    for (fn, _), seed in zip(observer.shape.root_edges, observer.seed_objects):
        arrivals[id(fn)] = arrivals.get(id(fn), 0) + 1
        seeded[id(fn)] = isinstance(seed, torch.Tensor) and (seed.dim() > 0 or id(seed) in observer.own_seeds)
    groups: dict[int, list[tuple[int, bool]]] = {}
    for key in adopted:
        source, viewed = _source(observer.shape.leaves[key], outputs, arrivals)
        groups.setdefault(source, []).append((key, viewed))
    shared = set()
    for source, members in groups.items():
        # leaves that got the very same tensor (no view made on the way): at most one of them adopts it
        holders = sum(1 for _, viewed in members if viewed) + any(not viewed for _, viewed in members)
        if holders + (1 if seeded.get(source) and arrivals.get(source) == 1 else 0) > 1:
            shared.update(key for key, _ in members)
    return found | shared


def own_seeds(engine_caller: Any, seeds: tuple) -> frozenset[int]:
    """ids of the gradients passed to the engine that are the caller's own tensors (``backward(gradient=g)``,
    ``grad(grad_outputs=g)``), not ones torch made for a call without them; read from the frame of torch's function
    that called the engine.  Where that frame does not say, every tensor counts as the caller's (the cautious side:
    a later value without hooks becomes unknown, never wrong)."""
    tensors = {id(seed) for seed in seeds if isinstance(seed, torch.Tensor)}
    try:
        local = engine_caller.f_locals
        given = local["grad_tensors"] if "grad_tensors" in local else local["grad_outputs"]
    except Exception:
        return frozenset(tensors)
    if given is None:
        return frozenset()
    given = (given,) if isinstance(given, torch.Tensor) else tuple(given)
    return frozenset(id(item) for item in given if isinstance(item, torch.Tensor)) & tensors


def _source(fn: Any, outputs: dict[int, list], arrivals: dict[int, int]) -> tuple[int, bool]:
    """Walk up from ``fn`` (a leaf's AccumulateGrad) while the one gradient reaching it may be what the function
    above received, or a view of it or of part of it (``_may_view``, one output, no more elements): the function whose received
    gradient the leaf may end up holding, and whether a new view was made on the way."""
    viewed = False
    current = fn
    while arrivals.get(id(current)) == 1:
        edges = outputs.get(id(current), ())
        if len(edges) != 1 or len(edges[0]) != 1:
            break  # a root (the seed reaches it), or gradients of several outputs
        user = edges[0][0][0]
        try:
            if not _may_view(user):  # (asked first: reading the metadata makes objects)
                break
            metadata = user._input_metadata
            # as many elements, or fewer (a slice, a row of stack's or unbind's): a view of part of that buffer;
            # more would be an expanded view, which autograd copies before a leaf holds it
            if len(metadata) != 1 \
                    or _numel(metadata[0].shape) < _numel(current._input_metadata[0].shape):
                break
        except Exception:  # no metadata to compare: the gradient may be anything
            break
        viewed = viewed or user.name().split("Backward")[0] not in _PASS_ON
        current = user
    return id(current), viewed


def _numel(shape: Any) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def shared_write(observer: Any, history: dict) -> bool:
    """A leaf whose ``.grad`` shares memory with another gradient (after an earlier pass) was added to in this
    pass: with no hook, that write could have changed the gradient passed to backward() (reused) on its way to the
    other leaves."""
    for key, fn in observer.shape.leaves.items():
        entry = history.get(id(fn.variable))
        if getattr(entry, "shared", False) and entry.ref() is fn.variable and key in observer.ran \
                and observer.old_grads.get(key) is not None:
            return True
    return False
