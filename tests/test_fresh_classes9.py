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


# --- 2. the norm of a large float16 tensor ----------------------------------------------------------------------------
# False (not fixed here: capture/snapshot.py is not this helper's file): a tensor above store_limit is kept as a
# summary whose norm is computed in the tensor's own dtype; a float16 tensor of 5000 finite entries of 1000.0 has
# norm 70711, past float16's largest 65504, so its box says "data [100x50 float16] min 1000.0 max 1000.0 norm inf",
# and with_without() writes the red "inf" beside bars of a gradient that holds no inf. The fix: in
# capture/snapshot.py's summarize, torch.linalg.vector_norm(as_float, dtype=torch.float32) (or float64) when
# as_float is float16/bfloat16 (its min/max/mean |g| are already right).


@pytest.mark.xfail(strict=True, reason="capture/snapshot.py summarize: norm of float16 computed in float16 overflows")
def test_a_float16_summary_norm_is_the_norm_not_inf():
    w = torch.full((100, 50), 1000.0, dtype=torch.float16, requires_grad=True)
    with al.Lens() as lens:
        (w * 1).sum().backward()
        (w * 1000).sum().backward()
    assert not w.grad.isinf().any()
    true_norm = w.grad.double().norm().item()
    summary = lens.passes[1].leaf_grads["w"]
    assert summary.min == summary.max == 1001.0
    texts = [t.get_text().strip() for t in lens.plot.with_without().axes[0].texts]
    dot = al.graph((w * 2).sum(), names={"w": w}).to_dot()
    assert "norm inf" not in dot and "inf" not in texts
    assert summary.norm == pytest.approx(true_norm, rel=1e-3)
