"""Values as the records keep them: tensors small enough to clone, a summary of larger ones, and the registry
through which views/ and debug/ hand their functions to the records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from ..numbers import format_number, format_shape

if TYPE_CHECKING:
    import torch


# What shows or explains these records lives in views/ and debug/, which import this module; they hand their
# functions in here as they load (importing autograd_lens loads both), so this module imports neither.
_PROVIDED: dict[str, Any] = {}


def provide(**functions: Any) -> None:
    """Called by ``autograd_lens.views`` and ``autograd_lens.debug`` as they load."""
    _PROVIDED.update(functions)


def _provided(name: str) -> Any:
    function = _PROVIDED.get(name)
    if function is None:  # only when importing autograd_lens stopped early (see compat.py)
        raise RuntimeError(f"autograd_lens is not loaded ({name} is missing): `import autograd_lens` first")
    return function


@dataclass(frozen=True)
class TensorSummary:
    """What is kept of a tensor too large to clone: enough for a one-line label.

    >>> TensorSummary(shape=(32, 64), dtype="float32", min=-1.0, max=2.0, norm=3.5, head=(0.1, 0.2)).text()
    '[32x64 float32] min -1.0 max 2.0 norm 3.5'
    """

    shape: tuple[int, ...]
    dtype: str
    min: float | None = None
    max: float | None = None
    norm: float | None = None
    head: tuple[float, ...] = ()
    kind: str = "dense"  # or what the tensor is when its numbers cannot be read: "sparse_coo", "meta", …
    # mean |value| (gradient-flow plots), kept for a leaf's .grad only: not part of what makes two summaries equal
    mean_abs: float | None = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def text(self) -> str:
        parts = [f"[{format_shape(self.shape)} {self.dtype}" + ("" if self.kind == "dense" else f" {self.kind}") + "]"]
        if self.min is not None:
            parts.append(f"min {format_number(self.min)} max {format_number(self.max)}")
        if self.norm is not None:
            parts.append(f"norm {format_number(self.norm)}")
        return " ".join(parts)


def values_equal(first: Any, second: Any) -> bool:
    """Exact equality of two recorded values (NaN equals NaN), tuples element-wise; never raises.

    >>> import torch
    >>> values_equal(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    True
    """
    if first is second:  # what every branch below finds for one object (NaN included): the usual case at a pass's end
        return True
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
    try:
        if first.shape != second.shape or first.dtype != second.dtype:
            return False
        import torch

        if python_dispatch(first) or python_dispatch(second):
            # a subclass with a __torch_dispatch__ (a wrapper such as TwoTensor): the lens computes with Python
            # dispatch off (its ops must not reach the user's code), where a wrapper has no storage to read
            # (torch.equal on it crashes the process): not known to be equal
            return False

        if torch.equal(first, second):
            return True
        if first.is_floating_point() or first.is_complex():
            # not equal: equal NaN for NaN only where ``first`` has a NaN (two reductions, not six ops, when none)
            return bool(first.isnan().any()) and bool(((first == second) | (first.isnan() & second.isnan())).all())
        return False
    except Exception:  # values that cannot be compared (e.g. on the meta device) are not known to be equal
        return False


def python_dispatch(value: Any) -> bool:
    """A tensor whose ops go through Python dispatch (a subclass with a ``__torch_dispatch__``): with dispatch off,
    as the lens computes, a wrapper subclass (torch's TwoTensor, DTensor) has no storage to read and an op on it
    crashes the process; with dispatch on, the op runs the user's code. The lens does not compute on one."""
    import torch

    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        return False
    return isinstance(value, torch.Tensor) and torch._C._dispatch_keys(value).has(torch._C.DispatchKey.Python)


# A recorded value: a small tensor clone, a summary of a large one, or None
# (no gradient flowed, e.g. the unused output of ``split``).
Value = Union["torch.Tensor", TensorSummary, None]
# Node and module hooks receive and return tuples of values.
Values = Union[Value, tuple[Value, ...]]
