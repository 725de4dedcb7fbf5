"""Short, deterministic text for recorded values: what labels, cards and tables print."""

from __future__ import annotations

from typing import Any

from .model import TensorSummary
from .numbers import format_number, format_shape  # noqa: F401  (re-exported: they were defined here)


def _nested(values: Any, limit: int | None = None) -> str:
    """``[1.0, [2.0, 3.0]]`` text of nested lists; with ``limit``, text may stop once it is longer than
    ``limit`` characters (what is written is the same as the start of the whole text).  A float is written without
    a call where ``format_number`` would give the same text (tests/test_perf_walk.py compares the two)."""
    if not isinstance(values, list):
        return format_number(values)
    parts = ["["]
    length = 1
    for index, item in enumerate(values):
        if index:
            parts.append(", ")
            length += 2
        if type(item) is float:  # format_number's text when it has a point or an exponent (nan, inf, 0, 20: asked)
            text = f"{item:.4g}"
            if "." not in text and "e" not in text:
                text = format_number(item)
        elif isinstance(item, list):
            text = _nested(item, None if limit is None else limit - length)
        else:
            text = format_number(item)
        parts.append(text)
        length += len(text)
        if limit is not None and length > limit:
            return "".join(parts)
    parts.append("]")
    return "".join(parts)


def format_value(value: Any, max_chars: int = 60) -> str:
    """A recorded value (tensor clone, summary, tuple, None) as one line of text.

    >>> import torch
    >>> format_value(torch.tensor(2.5)), format_value(torch.tensor([1.0, 2.0])), format_value(None)
    ('2.5', '[1.0, 2.0]', 'None')
    """
    if value is None:
        return "None"
    if isinstance(value, TensorSummary):
        return value.text()
    if isinstance(value, tuple):
        return "(" + ", ".join(format_value(item, max_chars) for item in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, (int, float, bool)):
        return format_number(value)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return str(value)
    if isinstance(value, torch.Tensor):
        try:
            if value.dim() == 0:
                return format_number(value.item())
            if value.numel() > 64:
                raise ValueError("too many numbers to print")
            listed = value.detach().cpu().tolist()
        except Exception:  # large, or with no readable numbers (sparse, meta, no storage): shape and dtype
            layout = "" if value.layout == torch.strided else " " + str(value.layout).replace("torch.", "")
            return f"[{format_shape(tuple(value.shape))} {str(value.dtype).replace('torch.', '')}{layout}]"
        return format_listed(listed, max_chars)
    return str(value)[:max_chars]


def format_listed(listed: list, max_chars: int = 60) -> str:
    """:func:`format_value`'s text of a tensor of 1 to 64 numbers, from its ``tolist()`` (read when it was recorded;
    written here when it is shown).

    >>> format_listed([[1.0, 2.0], [3.0, 4.5]]), format_listed([0.125] * 8, 24), format_listed([0.5, 12345.0], 12)
    ('[[1.0, 2.0], [3.0, 4.5]]', '[0.125, 0.125, 0.125, …', '[0.5, …')
    """
    return _cut(_nested(listed, max_chars), max_chars)


def _cut(text: str, max_chars: int) -> str:
    if len(text) > max_chars:
        cut = text[: max_chars - 1]
        if text[max_chars - 1] not in ",]":  # never a number's start alone: "1.234…" of 1.234e+04, "-1.5…" of -1.5e-05
            cut = cut.rstrip("0123456789.e+-naifj")
        return cut + "…"
    return text


def format_block(value: Any, max_chars: int = 60) -> str:
    """Like :func:`format_value`, but a small matrix is written one row per line (for drawings).

    >>> import torch
    >>> print(format_block(torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    [1.0, 2.0]
    [3.0, 4.0]
    """
    try:
        import torch
    except ImportError:  # pragma: no cover
        return format_value(value, max_chars)
    if isinstance(value, torch.Tensor) and value.dim() == 2 and 1 < value.shape[0] <= 8 and value.numel() <= 64:
        return "\n".join(format_value(row, max_chars) for row in value.detach())
    return format_value(value, max_chars)


def format_apart(first: Any, second: Any, max_chars: int = 60) -> tuple[str, str]:
    """:func:`format_value` of two values, with more digits where the two would print the same but differ (a hook
    that scales by 1 + 1e-7 must not read "received [1.0, 2.0] → returned [1.0, 2.0] — gradient modified").

    >>> import torch
    >>> format_apart(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    ('[1.0, 2.0]', '[1.0, 2.0]')
    >>> format_apart(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 2.0000001], dtype=torch.float64))
    ('[1.0, 2.0]', '[1.0, 2.0000001]')
    """
    texts = format_value(first, max_chars), format_value(second, max_chars)
    if texts[0] == texts[1]:
        try:
            import torch

            from .model import values_equal

            if not values_equal(first, second) and all(isinstance(v, (float, torch.Tensor)) for v in (first, second)):
                lists = [v.detach().cpu().tolist() if isinstance(v, torch.Tensor) and v.numel() <= 64 else v
                         for v in (first, second)]
                for digits in (6, 8, 10, 13, 17):
                    more = tuple(_cut(_with_digits(listed, digits), max_chars) for listed in lists)
                    if more[0] != more[1]:
                        return more
        except Exception:  # a large tensor (no list), an unreadable one: the usual texts
            pass
    return texts


def _with_digits(value: Any, digits: int) -> str:
    """Text of a number or nested list with ``digits`` significant digits (floats keep a point or an exponent)."""
    if isinstance(value, list):
        return "[" + ", ".join(_with_digits(item, digits) for item in value) + "]"
    if type(value) is not float or value != value or value in (float("inf"), float("-inf")) or value == 0:
        return format_number(value)
    text = f"{value:.{digits}g}"
    return text if "e" in text or "." in text else text + ".0"
