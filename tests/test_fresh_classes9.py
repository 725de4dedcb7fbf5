"""Fresh eyes on what the lens draws and asks, on models this project did not write (helper ``fresh9``,
2026-11-28): small real architectures written as users write them, run plainly and under a ``Lens``; every number a
drawing, a step, a predict question or a plot prints is compared with what plain PyTorch computed at the moment the
step claims.  Where something false was printed it was fixed (the section says what it printed before); the rest
stay as differential tests."""

from __future__ import annotations

import re

import pytest
import torch

import autograd_lens as al
from autograd_lens.format import format_block, format_listed, format_number


def _numbers(text: str) -> list[str]:
    """The numbers a one-line list text prints, whole ones only (a cut text ends in "…")."""
    return re.findall(r"-?(?:\d+\.?\d*(?:e[+-]\d+)?|inf|nan)(?=[,\]])", text)


# --- 1. a long list cut in the middle of a number ------------------------------------------------------------------
# Was false: a value text longer than its room was cut at a fixed width, so the last number could be cut in its middle:
# x = [0.5]*8 + [12345.0] was drawn "data [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.234e…" (12345 read as 1.234)
# and [0.5]*6 + [12345.0, -1.5e-05] "..., 1.234e+04, -1.5e…" (-1.5e-05 read as -1.5). Fixed in format.py: a cut
# text ends after the last whole number.


@pytest.mark.parametrize("tail", [[12345.0, -1.5e-05], [1e12, 1e-12], [-0.0, float("nan"), float("-inf")],
                                  [-98765.4, 0.001234]])
def test_a_cut_value_text_never_ends_in_part_of_a_number(tail):
    for count in range(0, 12):
        values = [0.5] * count + tail
        x = torch.tensor(values, requires_grad=True)
        y = (x * 1).sum()
        y.backward()
        dot = al.graph(y, names={"x": x}).to_dot()
        (label,) = [line for line in dot.splitlines() if 'label="x [' in line]
        data = re.search(r"\|data (.*?)\|grad", label).group(1)
        for text in (data, format_listed(values, 48), format_listed([values, values], 60), format_block(x, 30)):
            whole = _numbers(text)
            assert whole == [format_number(v) for v in values + values][: len(whole)], text
            if not text.endswith("…"):
                assert len(whole) in (len(values), 2 * len(values)), text
            else:  # what follows the last whole number is only a separator
                assert re.search(r"(\d|inf|nan)\]*(, ?)?\[*…$", text) or text in ("[…", "[[…"), text
