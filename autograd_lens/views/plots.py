"""Pictures where a picture beats a table: gradients with vs without hooks, and hook call counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..model import BackwardPass, TensorSummary


def _size(value: Any) -> float | None:
    """One number for a gradient: the value of a scalar, the norm of anything larger."""
    if value is None:
        return None
    if isinstance(value, TensorSummary):
        return value.norm
    if value.numel() == 1:
        return float(value.reshape(()))
    return float(value.double().norm())


def plot(lens_or_pass: Any, pass_index: int = -1):
    """A matplotlib figure: each leaf's gradient with the hooks and without them (scalars as values,
    tensors as norms), and how many times each hook fired over all passes.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x ** 2
    ...     _ = y.register_hook(lambda g: g * 0.5)
    ...     (y * 3).backward()
    >>> figure = al.plot(lens)
    >>> [axis.get_title() for axis in figure.axes]
    ['pass 1: gradients', 'hook calls']
    """
    import matplotlib.pyplot as plt

    if isinstance(lens_or_pass, BackwardPass):
        passes = [lens_or_pass]
        calls = list(lens_or_pass.hook_calls)
    else:
        passes = lens_or_pass.passes
        calls = lens_or_pass.hook_calls
    if not passes:
        raise ValueError("nothing to plot: no backward pass was recorded")
    backward_pass = passes[pass_index]
    names = list(backward_pass.grads)
    with_hooks = [_size(backward_pass.grads[name]) for name in names]
    without = [_size(backward_pass.grads_without_hooks.get(name)) for name in names]

    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [3, 2]})
    positions = range(len(names))
    left.bar([p - 0.2 for p in positions], [v if v is not None else 0 for v in with_hooks], width=0.4,
             label="with hooks", color="#d97706")
    left.bar([p + 0.2 for p in positions], [v if v is not None else 0 for v in without], width=0.4,
             label="without hooks", color="#2563eb", hatch="//")
    left.set_xticks(list(positions), [plain_text(name) for name in names], rotation=30 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center")
    left.axhline(0, color="#6b7280", linewidth=0.8)
    left.set_title(f"pass {backward_pass.index + 1}: gradients")
    left.set_ylabel("value (norm for tensors)")
    left.legend(frameon=False, fontsize=8)

    counts = Counter(plain_text(f"{call.hook}\non {call.target}") for call in calls)
    labels = list(counts)
    right.barh(range(len(labels)), [counts[label] for label in labels], color="#d97706")
    right.set_yticks(range(len(labels)), labels, fontsize=8)
    right.invert_yaxis()
    right.set_title("hook calls")
    right.set_xlabel("times fired")
    if not labels:
        right.text(0.5, 0.5, "no hook fired", ha="center", va="center", transform=right.transAxes)
    figure.tight_layout()
    return figure


def plain_text(text: str) -> str:
    """A name as matplotlib should print it: a ``$`` never starts mathtext."""
    return text.replace("$", r"\$")
