"""Whether a copy the lens took earlier is still an exact copy of a live tensor: same bits, not "equal values".

The copy cache is forgotten whenever Python runs inside the engine (a hook may edit a gradient through ``.data``,
unseen by the version counter).  A copy taken before can still stand for the tensor when every bit of it is the
same (``0.0`` and ``-0.0``, two NaNs with other payloads: different) and so is everything a new copy would differ in
(dtype, shape, strides; a plain dense CPU tensor within the limit): a new copy would be another object holding
exactly the same, and comparing the bytes costs less than the copy and the comparison made after it.
"""

from __future__ import annotations

import ctypes
import math
import sys
from typing import Any

import torch

from ..model import values_equal
from .snapshot import plain_small

_Tensor = torch.Tensor
# a float (or complex) dtype's elements read as integers of the same size: equal integers are equal bits
_AS_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _c_memcmp() -> Any:
    """The C library's ``memcmp`` (ctypes, part of Python's standard library), or None where it is not found."""
    try:
        library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        function = library.memcmp
        function.restype = ctypes.c_int
        function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        return function
    except Exception:  # noqa: BLE001 - no C library to call: torch compares
        return None


_memcmp = _c_memcmp()


def same_bits(live: Any, kept: Any, store_limit: int) -> bool:
    """True when ``kept`` (a copy the lens made) holds exactly what a new copy of ``live`` would (``snapshot``'s or
    ``fast_snapshot``'s of a plain dense CPU tensor within ``store_limit``: the same dtype, shape, strides and
    bits); False when that is not known (anything else: the caller copies, as before).  Never raises."""
    try:
        if type(kept) is not _Tensor or type(live) is not _Tensor or kept.dtype != live.dtype \
                or kept.shape != live.shape or not plain_small(live, store_limit) \
                or not plain_small(kept, store_limit) or kept.stride() != live.stride() \
                or kept.is_conj() or live.is_conj() or kept.is_neg() or live.is_neg():
            return False  # (a copy of a conjugate view holds the resolved values: not these bits)
        if _memcmp is not None and live.is_contiguous() and kept.is_contiguous():
            size = live.numel() * live.element_size()
            return size == 0 or _memcmp(live.data_ptr(), kept.data_ptr(), size) == 0
        if live.is_floating_point() or live.is_complex():
            as_integers = _AS_INTEGERS.get(live.element_size())
            if as_integers is None:  # complex128: not compared (copied)
                return False
            live, kept = live.view(as_integers), kept.view(as_integers)
        return bool(torch.equal(live, kept))
    except Exception:  # noqa: BLE001 - anything unusual: not known, copied
        return False


def values_differ(first: Any, second: Any) -> bool:
    """``not values_equal(first, second)``, answered sooner for two plain float CPU tensors of one shape and dtype
    whose elements differ (a hook that changed a gradient): ``values_equal`` then looks for a NaN in ``first`` (NaN
    equals NaN) with ``isnan().any()``, which allocates a mask; a sum that is not NaN says there is none (a NaN
    element makes every sum NaN), so they differ.  A NaN sum (a NaN, or inf - inf) asks ``values_equal``.  One object
    twice (a hook that returned None and edited nothing passes on the copy of what it got) is equal, as there."""
    if first is second:
        return False
    try:
        if type(first) is _Tensor and type(second) is _Tensor and first.dtype == second.dtype \
                and first.shape == second.shape and first.is_floating_point() and first.is_cpu and second.is_cpu \
                and first.layout == torch.strided and second.layout == torch.strided:
            if torch.equal(first, second):
                return False
            if not math.isnan(first.sum().item()):
                return True
    except Exception:  # noqa: BLE001 - values_equal decides (it never raises)
        pass
    return not values_equal(first, second)
