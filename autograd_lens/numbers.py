"""How one number and one shape are written: the smallest piece of formatting, used by the records themselves
(``model.TensorSummary``) and by ``format.py`` for everything else."""

from __future__ import annotations

import math


def format_number(number: float | int | bool | None) -> str:
    """A number as a student reads it: floats keep a decimal point (``20.0``, ``0.5``,
    ``1.235e-05``), integers do not (``3``).

    >>> format_number(20.0), format_number(0.123456789), format_number(-3), format_number(1e-5), format_number(-0.0)
    ('20.0', '0.1235', '-3', '1e-05', '0.0')
    """
    if number is None:
        return "None"
    if isinstance(number, complex):
        return f"{format_number(number.real)}{'+' if number.imag >= 0 else '-'}{format_number(abs(number.imag))}j"
    if isinstance(number, (bool, int)):
        return str(number)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    if number == 0:
        number = 0.0  # -0.0 (relu's gradient of a negative input) reads as a plain 0.0
    text = f"{number:.4g}"
    if "e" not in text and "." not in text:
        text += ".0"
    return text


def format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(size) for size in shape) if shape else "scalar"
