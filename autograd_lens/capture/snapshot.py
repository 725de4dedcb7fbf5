"""Turn live tensors into recorded values: a clone when small, a summary when large."""

from __future__ import annotations

import torch

from ..model import TensorSummary, Value

# Tensors with at most this many elements are cloned; larger ones are summarised.
DEFAULT_STORE_LIMIT = 4096


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def summarize(tensor: torch.Tensor) -> TensorSummary:
    """Shape, dtype, min/max/norm and the first entries of a tensor, without keeping it."""
    shape = tuple(tensor.shape)
    dtype = dtype_name(tensor.dtype)
    if tensor.numel() == 0 or tensor.is_complex() or tensor.layout != torch.strided or tensor.device.type == "meta":
        return TensorSummary(shape=shape, dtype=dtype)
    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        as_float = flat if flat.is_floating_point() else flat.double()
        low, high = torch.aminmax(as_float)
        norm = torch.linalg.vector_norm(as_float)
        head = tuple(float(item) for item in flat[:4].tolist())
    return TensorSummary(shape=shape, dtype=dtype, min=float(low), max=float(high), norm=float(norm), head=head)


def snapshot(tensor: torch.Tensor | None, store_limit: int = DEFAULT_STORE_LIMIT) -> Value:
    """A detached clone of a small tensor, a :class:`TensorSummary` of a large one.

    >>> snapshot(torch.tensor([1.0, 2.0]))
    tensor([1., 2.])
    >>> snapshot(torch.zeros(3, 3), store_limit=4).shape
    (3, 3)
    """
    if tensor is None:
        return None
    if not isinstance(tensor, torch.Tensor):
        return None
    if tensor.numel() > store_limit or tensor.layout != torch.strided:
        return summarize(tensor)
    return tensor.detach().clone()


def values_equal(first, second) -> bool:
    """Exact equality of two recorded values (NaN equals NaN), tuples element-wise."""
    if isinstance(first, (tuple, list)) or isinstance(second, (tuple, list)):
        if not (isinstance(first, (tuple, list)) and isinstance(second, (tuple, list))):
            return False
        return len(first) == len(second) and all(values_equal(a, b) for a, b in zip(first, second))
    if first is None or second is None:
        return first is None and second is None
    if isinstance(first, TensorSummary) or isinstance(second, TensorSummary):
        return first == second
    if first is second:
        return True
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    if first.is_floating_point() or first.is_complex():
        return bool(torch.equal(first, second) or ((first == second) | (first.isnan() & second.isnan())).all())
    return bool(torch.equal(first, second))
