"""Turn live tensors into recorded values: a clone when small, a summary when large.

Every function here works on any tensor autograd can hand over — sparse, nested,
mkldnn, meta, quantized, complex, torch's storage-less ZeroTensor, tensor
subclasses — and never raises: what cannot be read is kept as shape and dtype.
None of them keeps a reference to the tensor it was given.
"""

from __future__ import annotations

import threading
from dataclasses import fields as dataclass_fields
from typing import Any

import torch

from ..model import TensorSummary, Value, values_equal  # noqa: F401  (values_equal: re-exported)

# Tensors with at most this many elements are cloned; larger ones are summarised.
DEFAULT_STORE_LIMIT = 4096
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


_DTYPE_NAMES: dict = {}  # torch.dtype -> its name (a few dozen dtypes exist)


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    try:
        return tuple(int(size) for size in tensor.shape)
    except Exception:  # nested tensors with ragged sizes, symbolic shapes
        return ()


def kind_of(tensor: torch.Tensor) -> str:
    """``"dense"`` for an ordinary tensor whose numbers can be read, otherwise what it is."""
    if type(tensor) not in _PLAIN_TYPES:
        return type(tensor).__name__
    if tensor.layout == torch.strided and tensor.is_cpu and not tensor.is_nested \
            and not tensor.is_quantized and not tensor._is_zerotensor():
        return "dense"  # the common case, answered first
    if tensor.is_nested:
        return "nested"
    if tensor.layout != torch.strided:
        return str(tensor.layout).replace("torch.", "").lstrip("_")
    if tensor.device.type == "meta":
        return "meta"
    if tensor.is_quantized:
        return "quantized"
    if tensor._is_zerotensor():
        return "zero"
    return "dense"


_new = object.__new__  # tests/test_trust.py checks that a summary made here equals the dataclass's own


def _bare(tensor: torch.Tensor, kind: str) -> TensorSummary:
    return TensorSummary(shape=_shape(tensor), dtype=dtype_name(tensor.dtype), kind=kind)


def summarize(tensor: torch.Tensor, magnitudes: bool = False) -> TensorSummary:
    """Shape, dtype, min/max/norm and the first entries of a tensor, without keeping it; with ``magnitudes`` also
    the mean |value| (the gradient-flow plot's, asked for a leaf's ``.grad``: it allocates a tensor as large)."""
    try:
        kind = kind_of(tensor)
        if kind != "dense" or tensor.numel() == 0:
            return _bare(tensor, "dense" if kind == "dense" else kind)
        # detached: nothing below records a graph (no ``torch.no_grad()`` block, which costs more than the sums)
        flat = (tensor.detach() if tensor.requires_grad else tensor).reshape(-1)
        if flat.is_complex():
            return TensorSummary(shape=_shape(tensor), dtype=dtype_name(tensor.dtype),
                                 norm=torch.linalg.vector_norm(flat).item())
        as_float = flat if flat.is_floating_point() else flat.double()
        low, high = torch.aminmax(as_float)
        head = flat[:4].tolist()
        summary = _new(TensorSummary)  # TensorSummary(...) without a frozen dataclass's setattr per field
        summary.__dict__.update(shape=_shape(tensor), dtype=dtype_name(tensor.dtype), min=float(low.item()),
                                max=float(high.item()), norm=_norm(as_float),
                                head=tuple(head if as_float is flat else (float(item) for item in head)), kind="dense",
                                mean_abs=as_float.abs().mean().item() if magnitudes else None)
        return summary
    except Exception:
        return TensorSummary(shape=_shape(tensor), dtype=dtype_name(tensor.dtype), kind="unreadable")


def _norm(values: torch.Tensor) -> float:
    """The 2-norm; of float16/bfloat16 values summed in float32 (in their own dtype the sum of squares overflows to
    inf, or rounds, where the norm itself is finite: 5000 entries of 1000.0 in float16 have norm 70711)."""
    if values.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.vector_norm(values, dtype=torch.float32).item()
    return torch.linalg.vector_norm(values).item()


def snapshot(tensor: torch.Tensor | None, store_limit: int = DEFAULT_STORE_LIMIT, magnitudes: bool = False) -> Value:
    """A detached clone of a small tensor, a :class:`TensorSummary` of a large or unusual one (``magnitudes``: see
    :func:`summarize`).

    >>> snapshot(torch.tensor([1.0, 2.0]))
    tensor([1., 2.])
    >>> snapshot(torch.zeros(3, 3), store_limit=4).shape
    (3, 3)
    """
    if not isinstance(tensor, torch.Tensor):
        return None
    try:
        kind = kind_of(tensor)
        if kind == "dense" and tensor.numel() <= store_limit:
            return copy_exactly(tensor.detach())  # detached: the copy records no graph
        if kind == "zero" and tensor.numel() <= store_limit:  # torch's ZeroTensor has no storage: all zeros
            return torch.zeros(_shape(tensor), dtype=tensor.dtype)
        return summarize(tensor, magnitudes)
    except Exception:
        return TensorSummary(shape=_shape(tensor), dtype=dtype_name(tensor.dtype), kind="unreadable")


def fast_snapshot(tensor: torch.Tensor, store_limit: int = DEFAULT_STORE_LIMIT) -> Value:
    """:func:`snapshot`, answered without its checks for the common case (a plain dense CPU tensor, within the
    limit, in a graph that records nothing): what autograd hands over at almost every node."""
    if plain_small(tensor, store_limit):
        return tensor.clone() if tensor.is_contiguous() else copy_exactly(tensor)
    return snapshot(tensor, store_limit)


def plain_small(tensor: Any, store_limit: int) -> bool:
    """A plain dense CPU tensor within the limit, in a graph that records nothing: one :func:`snapshot` copies
    exactly (same values, shape, strides and dtype), the case :func:`fast_snapshot` answers without its checks."""
    return type(tensor) is torch.Tensor and tensor.is_cpu and tensor.layout == torch.strided \
        and not tensor.requires_grad and not tensor.is_nested and not tensor.is_quantized \
        and not tensor._is_zerotensor() and tensor.numel() <= store_limit


def copy_exactly(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes *and strides*.  Autograd hands over expanded (stride 0) and transposed
    gradients; a reduction over a differently laid out copy adds in another order, and the last bits of a
    value computed from it would differ from the engine's.  Only the memory the tensor spans is copied.

    >>> g = torch.tensor(3.0).expand(2, 3)
    >>> copy = copy_exactly(g)
    >>> copy.stride(), copy.untyped_storage().nbytes(), torch.equal(copy, g)
    ((0, 0), 4, True)
    """
    if tensor.is_contiguous():
        return tensor.clone()
    strides = tensor.stride()
    if 0 not in strides:  # a transposed or permuted gradient: clone keeps the strides of a dense one
        copy = tensor.clone()
        if copy.stride() == strides:
            return copy
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0)
    if tensor.numel() == 0:
        return tensor.clone()
    base = tensor.as_strided((span,), (1,)).clone()
    return base.as_strided(tuple(tensor.shape), tuple(tensor.stride()))


def held_bytes(value: object) -> int:
    """Bytes a recorded value holds (summaries hold none)."""
    if isinstance(value, torch.Tensor):
        try:
            return value.numel() * value.element_size()
        except Exception:
            return 0
    if isinstance(value, tuple):
        return sum(held_bytes(item) for item in value)
    return 0


class hidden_from_user:
    """The lens's own tensor work, invisible to the user's tools: no ``TorchDispatchMode`` of theirs sees it, no
    ``__torch_function__`` of theirs runs for it (a tensor subclass's, a ``TorchFunctionMode``'s: reading a named
    subclass tensor's ``grad_fn`` would call it), and no profiler (``torch.profiler``, ``torch.autograd.profiler``)
    records it (record functions are off for this thread while a profiler is on, and back on when the outermost
    such block ends)."""

    __slots__ = ("dispatch", "function", "profiled")
    _depth = threading.local()

    def __enter__(self) -> "hidden_from_user":
        self.function = _disable_function()
        _enter_function(self.function)
        self.dispatch = _disable_dispatch()
        _enter_dispatch(self.dispatch)  # called unbound: see _enter_dispatch below
        self.profiled = False
        if _profiler_enabled():  # the depth is counted only while a profiler is on: no user code runs inside
            depth = getattr(self._depth, "value", 0)
            self._depth.value = depth + 1
            self.profiled = depth == 0
            if self.profiled:
                torch._C._autograd._enable_record_function(False)
            else:
                self.profiled = None  # an inner block: counted, nothing to switch back
        return self

    def __exit__(self, *exc: object) -> None:
        if self.profiled is not False:
            self._depth.value -= 1
            if self.profiled:
                torch._C._autograd._enable_record_function(True)
        _exit_dispatch(self.dispatch, *exc)
        _exit_function(self.function, *exc)


_disable_dispatch = torch._C._DisableTorchDispatch
# Its methods are pybind11's: ``obj.__enter__()`` calls a bound method, which Python 3.12-3.13 report to
# sys.monitoring as a CALL of the method but a C_RETURN of the function inside it, so cProfile (and %prun) pop
# a frame they never pushed and lose the functions around the lens (tests/test_profilers.py).  Called through
# the class, CALL and C_RETURN name the same function.
_enter_dispatch = _disable_dispatch.__enter__
_exit_dispatch = _disable_dispatch.__exit__
_disable_function = torch._C.DisableTorchFunction  # (its methods called the same way)
_enter_function = _disable_function.__enter__
_exit_function = _disable_function.__exit__
_profiler_enabled = torch._C._autograd._profiler_enabled


_dispatch_modes = torch._C._len_torch_dispatch_stack  # dispatch modes on: the user's, and torch's (fake, proxy, ...)
_Tensor = torch.Tensor


_PLAIN_LEAVES = (torch.Tensor, torch.nn.Parameter)


def grad_of(variable: Any) -> Any:
    """``variable.grad``, read without running a ``__torch_function__`` of the user's (a subclass leaf's)."""
    if type(variable) in _PLAIN_LEAVES:
        return variable.grad
    with torch._C.DisableTorchFunction():
        return variable.grad


def plain_or_none(value: object) -> bool:
    """None, or a plain ``torch.Tensor`` (no subclass: no ``__torch_dispatch__`` of a user's to reach)."""
    return value is None or type(value) is _Tensor


def unseen_by_modes(observer: Any, fn: Any, grad_inputs: Any, grad_outputs: Any) -> bool:
    """True when the lens's tensor work at node ``fn`` cannot reach Python dispatch even without the guard of
    :class:`hidden_from_user` (``torch._C._DisableTorchDispatch``, about 0.9 us a node, at every node): no
    ``TorchDispatchMode`` on (the user's, or torch's own), every gradient the node got or sent a plain
    ``torch.Tensor``, a leaf's ``.grad`` too, no replay of the graph without hooks (``unhooked``: saved tensors),
    and the profile function watching (it sees any Python the engine runs).  ``observer.plain`` turns False for the
    rest of the pass the first time one of these fails, or when the engine runs Python other than the lens's own
    hooks (a hook could leave a tensor subclass where the lens copies it later, calls.py): so every value the lens
    compares on the way was copied from plain tensors.  Otherwise the node is recorded under the guard, as always."""
    if _dispatch_modes() or not observer.profiling or observer.unhooked.active or type(grad_inputs) is not tuple \
            or type(grad_outputs) is not tuple:
        observer.plain = False
        return False
    for value in grad_inputs:
        if value is not None and type(value) is not _Tensor:
            observer.plain = False
            return False
    for value in grad_outputs:
        if value is not None and type(value) is not _Tensor:
            observer.plain = False
            return False
    if id(fn) in observer.shape.leaves:
        grad = grad_of(fn.variable)
        if grad is not None and type(grad) is not _Tensor:
            observer.plain = False
            return False
    return True


# ----------------------------------------------------------------------------- the walk's values (walk.py)


def leaf_state(shape: Any, options: Any) -> dict[int, tuple[Value, Value]]:
    """The ``.grad`` of every leaf (and the value of small ones) of ``shape`` (a ``structure.Structure``) as labels
    will show them (``options``: the ``GraphOptions``), read before a pass changes them.  A large ``.grad`` is kept
    as shape and dtype only (no reduction runs); one that was None stays None, so nothing read after the pass is
    shown as what the leaf held before it.  A large leaf's value (None here) is read when the model is built: a pass
    does not change it."""
    limit = options.max_elements
    state = {}
    for key, variable in shape.variables().items():
        grad = variable.grad
        state[key] = (_small(variable, options, False) if variable.numel() <= limit else None,
                      None if grad is None else _small(grad, options, False))
    return state


def _small(tensor: torch.Tensor | None, options: Any, stats: bool = True,
           shape: tuple[int, ...] | None = None) -> Value:
    """A value for a label: clone when small enough to print (``options.max_elements``), otherwise a summary
    (``shape``: the tensor's, when already read)."""
    if tensor is None:
        return None
    if tensor.numel() > options.max_elements and not stats:
        summary = _new(TensorSummary)  # TensorSummary(shape, dtype) without a frozen dataclass's setattr per field
        summary.__dict__.update(_SUMMARY_DEFAULTS, shape=tuple(tensor.shape) if shape is None else shape,
                                dtype=dtype_name(tensor.dtype))
        return summary
    return snapshot(tensor, store_limit=options.max_elements)


_SUMMARY_DEFAULTS = {item.name: item.default for item in dataclass_fields(TensorSummary)}
