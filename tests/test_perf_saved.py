"""The saved values a node's box shows, read through per-type caches (``saved._raw_name``, ``_is_constant_name``),
are those read the general way: ``hasattr(type(fn), "_raw" + attribute)`` and the regular expression at every
call.  Compared on graphs of many node types, read twice (the second read hits the caches)."""

from __future__ import annotations

import torch

from autograd_lens.capture import saved
from autograd_lens.capture.structure import structure


def _general(fn, attribute):
    """``saved.saved_value`` as it was before the caches."""
    raw_name = "_raw" + attribute
    if hasattr(type(fn), raw_name):
        raw = getattr(fn, raw_name)
        if saved.packed_by_hook(raw):
            return saved.PACKED
        if isinstance(raw, (tuple, list)):
            return tuple(item.data for item in raw)
        return raw.data
    return getattr(fn, attribute)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def _graphs():
    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    x = torch.randn(2, 3)
    h = torch.addmm(b, x, w).tanh() * 3
    h = torch.cat([h, h.sigmoid()], dim=1).sum(dim=1, keepdim=True).pow(2)
    h = _Square.apply(h).mean() + torch.stack(list(w.unbind(0))).norm()
    yield h
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):  # packed: never unpacked
        yield (w.exp() * b[:3, None]).sum()
    yield torch.nn.functional.softmax(w, dim=-1).clamp(min=0.1).max()


def _read(fn, attribute):
    try:
        return ("value", saved.saved_value(fn, attribute))
    except Exception as problem:
        return ("error", type(problem))


def _read_general(fn, attribute):
    try:
        return ("value", _general(fn, attribute))
    except Exception as problem:
        return ("error", type(problem))


def _same(one, other):
    if one[0] != other[0]:
        return False
    a, b = one[1], other[1]
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(("value", x), ("value", y)) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) \
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return a is b or a == b


def test_cached_reads_are_the_general_reads():
    checked = set()
    packed = 0
    for root in _graphs():
        for _ in range(2):  # the second read of each type goes through the caches
            for fn in structure((root,)).nodes:
                for attribute in saved.saved_names(fn):
                    mine, general = _read(fn, attribute), _read_general(fn, attribute)
                    assert _same(mine, general), (fn.name(), attribute, mine, general)
                    checked.add((fn.name(), attribute))
                    packed += mine[1] is saved.PACKED
                    raw = "_raw" + attribute
                    assert saved._raw_name(type(fn), attribute) == (raw if hasattr(type(fn), raw) else None)
                    assert saved.saved_tensors_packed(fn) == any(
                        hasattr(type(fn), "_raw" + name) and saved.packed_by_hook(getattr(fn, "_raw" + name))
                        for name in saved.saved_names(fn))
    assert len(checked) > 20, checked  # tensors, tuples of tensors, sizes, scalars, dims
    assert packed >= 2  # the saved-tensor hook's tensors are said packed, not read


def test_constant_names_are_the_regular_expressions():
    for attribute in ["_saved_other", "_saved_alpha", "_saved_dim", "_saved_self_sym_sizes", "_saved_exponent",
                      "_saved_min", "_saved_keepdim", "_saved_beta", "_saved_indices", "_saved_result"]:
        for _ in range(2):
            assert saved._is_constant_name(attribute) == (not saved._STRUCTURAL.search(attribute[len("_saved_"):]))
