"""Pictures where a picture beats a table.

``lens.plot()`` draws the summary (gradients with vs without hooks, hook call counts); ``lens.plot``'s
methods draw one picture each: :meth:`Plots.grad_flow`, :meth:`Plots.timeline`,
:meth:`Plots.before_after` and :meth:`Plots.with_without`.  Every method returns a
``matplotlib.figure.Figure`` made without pyplot (nothing accumulates in pyplot's state; works
headless), whose SVG is byte-stable (fixed hash salt, no date).  Names never start mathtext.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..model import BackwardPass, HookCall, TensorSummary

ORANGE, BLUE, GREY, RED = "#d97706", "#2563eb", "#9ca3af", "#dc2626"
SHORT = 36  # longer names are shortened on the axis and given in full in a legend


def _figure(rows: int = 4, width: float = 8.0):
    """A figure sized for ``rows`` labelled rows (readable at notebook width up to ~30 rows)."""
    from matplotlib.figure import Figure

    class StableFigure(Figure):
        """Saved as SVG, the same bytes every time: a fixed hash salt and no date."""

        def savefig(self, fname: Any, *args: Any, **kwargs: Any) -> None:
            import matplotlib

            if str(kwargs.get("format") or fname).lower().endswith("svg"):
                kwargs.setdefault("metadata", {"Date": None})
            with matplotlib.rc_context({"svg.hashsalt": "autograd_lens"}):
                super().savefig(fname, *args, **kwargs)

        def __repr__(self) -> str:
            titles = [axis.get_title() for axis in self.axes if axis.get_title()]
            return f"<autograd_lens figure: {'; '.join(titles)}>"

        def _repr_png_(self) -> bytes:
            """A picture in any IPython front end, with or without matplotlib's inline backend."""
            import io

            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    return StableFigure(figsize=(width, max(2.6, 0.9 + 0.28 * rows)), layout="constrained")


def plain_text(text: str) -> str:
    """A name as matplotlib should print it: a ``$`` never starts mathtext."""
    return text.replace("$", r"\$")


def _labels(names: list[str]) -> tuple[list[str], list[str]]:
    """Axis labels (long ones shortened and numbered) and the legend lines giving them in full."""
    labels, legend = [], []
    for index, name in enumerate(names):
        if len(name) > SHORT:
            labels.append(plain_text(f"[{index + 1}] …{name[-(SHORT - 6):]}"))
            legend.append(plain_text(f"[{index + 1}] {name}"))
        else:
            labels.append(plain_text(name))
    return labels, legend


def _add_legend(figure: Any, legend: list[str]) -> None:
    """The full names of shortened labels, under the plot (the layout makes room for them)."""
    if legend:
        from matplotlib.lines import Line2D

        blank = [Line2D([], [], linestyle="none") for _ in legend]
        figure.legend(blank, legend, loc="outside lower left", fontsize=7, frameon=False, handlelength=0,
                      handletextpad=0, prop={"family": "monospace", "size": 7})


def size(value: Any) -> float | None:
    """One number for a recorded value: a scalar's value, otherwise the norm (tuples: of all of it)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        parts = [size(item) for item in value if item is not None]
        if not parts or any(part is None for part in parts):
            return None
        return math.sqrt(sum(part * part for part in parts)) if len(parts) > 1 else abs(parts[0])
    if isinstance(value, TensorSummary):
        return value.norm
    if value.numel() == 1 and not value.is_complex():
        return float(value.reshape(()))
    return float(value.abs().double().norm())


def not_finite(number: float | None) -> str | None:
    """"NaN", "inf" or "-inf" for a number a bar cannot show (matplotlib draws NaN as nothing), else None."""
    if number is None or math.isfinite(number):
        return None
    return "NaN" if math.isnan(number) else ("inf" if number > 0 else "-inf")


def _drawable(values: list) -> list[float]:
    """Bar lengths: None, NaN and inf drawn as 0 (each said in words beside its bar)."""
    return [0.0 if v is None or not_finite(v) else v for v in values]


def abs_stats(value: Any) -> tuple[float, float] | None:
    """(mean |g|, max |g|) of a recorded gradient; None when not known."""
    if value is None:
        return None
    if isinstance(value, TensorSummary):
        if value.mean_abs is None or value.min is None:
            return None
        return value.mean_abs, max(abs(value.min), abs(value.max))
    magnitude = value.detach().abs().double()
    if magnitude.numel() == 0:
        return None
    return float(magnitude.mean()), float(magnitude.max())


def _passes_and_calls(source: Any) -> tuple[list[BackwardPass], list[HookCall]]:
    if isinstance(source, BackwardPass):
        return [source], list(source.hook_calls)
    return list(source.passes), list(source.hook_calls)


def _pass(source: Any, pass_index: int) -> BackwardPass:
    passes, _ = _passes_and_calls(source)
    if not passes:
        raise ValueError("nothing to plot: no backward pass was recorded")
    return passes[pass_index]


def grad_flow(source: Any, pass_index: int = -1, log: bool = True):
    """Per parameter (leaf), the mean and the largest |gradient| after one pass: vanishing and exploding
    layers at a glance (bars in graph order, from the output towards the inputs).

    >>> import torch, autograd_lens as al
    >>> w = torch.tensor([1.0, -4.0], requires_grad=True)
    >>> with al.Lens() as lens:
    ...     (w * w).sum().backward()
    >>> figure = lens.plot.grad_flow()
    >>> [float(bar.get_width()) for bar in figure.axes[0].patches]   # max, then mean
    [8.0, 5.0]
    """
    backward_pass = _pass(source, pass_index)
    rows = [(name, abs_stats(value)) for name, value in backward_pass.leaf_grads.items()]
    names = [name for name, _ in rows]
    figure = _figure(len(rows))
    axis = figure.subplots()
    labels, legend = _labels(names)
    positions = list(range(len(rows)))
    highest = _drawable([stats[1] if stats else None for _, stats in rows])
    mean = _drawable([stats[0] if stats else None for _, stats in rows])
    axis.barh(positions, highest, color="#fde68a", label="max |grad|")
    axis.barh(positions, mean, height=0.45, color=ORANGE, label="mean |grad|")
    for position, (_, stats) in zip(positions, rows):
        if stats is None:
            axis.text(0, position, " no gradient", va="center", fontsize=8, color=GREY)
        elif not_finite(stats[0]) or not_finite(stats[1]):  # a NaN bar would be drawn as nothing: as if zero
            word = "NaN" if "NaN" in (not_finite(stats[0]), not_finite(stats[1])) else "inf"
            axis.text(0, position, f" {word} in .grad", va="center", fontsize=8, color=RED)
        elif stats[1] == 0 and log and any(value > 0 for value in highest):  # a log axis has no room for 0
            axis.text(0, position, " all zero", va="center", fontsize=8, color=GREY)
    axis.set_yticks(positions, labels, fontsize=8)
    axis.invert_yaxis()
    if log and any(value > 0 for value in highest):
        axis.set_xscale("log")
    axis.set_xlabel("|gradient|" + (" (log scale)" if axis.get_xscale() == "log" else ""))
    axis.set_title(f"pass {backward_pass.index + 1}: gradient flow (mean and max |grad| per parameter)")
    axis.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _add_legend(figure, legend)
    return figure


def _hook_key(call: HookCall) -> str:
    return f"{call.hook} on {call.target} ({call.kind.replace('_', ' ')})"


def timeline(source: Any):
    """Every hook call of every pass: x is the event's position (passes one after another), one row per
    registered hook; filled markers changed the gradient, hollow ones did not, crosses raised.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x * 3
    ...     _ = y.register_hook(lambda g: g * 2)
    ...     y.backward(retain_graph=True); y.backward()
    >>> figure = lens.plot.timeline()   # each pass: the hook call, then mul, then x.grad written
    >>> [tuple(point) for point in figure.axes[0].collections[0].get_offsets().tolist()]
    [(0.0, 0.0), (3.0, 0.0)]
    """
    passes, _ = _passes_and_calls(source)
    keys: list[str] = []
    rows: dict[Any, int] = {}  # registered hook -> its row (two hooks with one name get two rows)
    points: dict[str, list[tuple[float, float]]] = {"changed": [], "unchanged": [], "raised": []}
    boundaries = []
    offset = 0
    for backward_pass in passes:
        boundaries.append((offset, backward_pass.index))
        for call in backward_pass.hook_calls:
            registration = call.registration or _hook_key(call)
            if registration not in rows:
                rows[registration] = len(keys)
                key = _hook_key(call)
                same = sum(1 for known in keys if known == key or known.startswith(key + " ["))
                keys.append(key if not same else f"{key} [{same + 1}]")
            kind = "raised" if call.error else ("changed" if call.modified else "unchanged")
            points[kind].append((offset + call.step, rows[registration]))
        offset += len(backward_pass.events)
    figure = _figure(len(keys))
    axis = figure.subplots()
    styles = {"changed": dict(color=ORANGE, marker="o"), "unchanged": dict(facecolors="none", edgecolors=GREY,
              marker="o"), "raised": dict(color=RED, marker="x")}
    for kind, coordinates in points.items():
        xs = [x for x, _ in coordinates]
        ys = [y for _, y in coordinates]
        axis.scatter(xs, ys, s=40, label=f"{kind} the gradient" if kind != "raised" else "raised", **styles[kind])
    for start, index in boundaries:
        axis.axvline(start - 0.5, color=GREY, linestyle="--", linewidth=0.8)
        axis.text(start - 0.4, -0.6, f"pass {index + 1}", fontsize=7, color=GREY, va="bottom")
    labels, legend = _labels(keys)
    axis.set_yticks(range(len(keys)), labels, fontsize=8)
    axis.set_ylim(len(keys) - 0.4, -0.8)
    axis.set_xlim(-1, max(offset, 1))
    axis.set_xlabel("event (passes one after another)")
    axis.set_title("hook calls over time")
    if not keys:
        axis.text(0.5, 0.5, "no hook fired", ha="center", va="center", transform=axis.transAxes)
    else:
        axis.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _add_legend(figure, legend)
    return figure


def before_after(source: Any, hook: str | None = None):
    """Per hook call, what the hook received against what it passed on (scalars as values, tensors and
    tuples as norms).  ``hook``: only the calls of the hook with that name.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x ** 2
    ...     _ = y.register_hook(lambda g: g * 0.5)
    ...     (y * 3 + y * 2).backward()
    >>> bars = lens.plot.before_after().axes[0].patches
    >>> [float(bar.get_width()) for bar in bars]   # received 5, passed on 2.5
    [5.0, 2.5]
    """
    _, calls = _passes_and_calls(source)
    if hook is not None:
        calls = [call for call in calls if call.hook == hook]
        if not calls:
            raise ValueError(f"no call of a hook named {hook!r}; hooks that fired: "
                             f"{sorted({call.hook for call in _passes_and_calls(source)[1]})}")
    rows = [(f"{_hook_key(call)} #{'?' if call.invocation is None else call.invocation}", size(call.grad_in),
             size(call.grad_out)) for call in calls]
    figure, axis = _paired_bars([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows],
                                (dict(color=GREY, label="received"), dict(color=ORANGE, label="passed on")),
                                "what each hook received and passed on")
    if not rows:
        axis.text(0.5, 0.5, "no hook fired", ha="center", va="center", transform=axis.transAxes)
    return figure


def with_without(source: Any):
    """Each leaf's gradient after each pass, with the hooks and without them (scalars as values, tensors
    as norms); "unknown" where the lens cannot know the value without hooks (``pass.unknown`` says why).

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x ** 2
    ...     _ = y.register_hook(lambda g: g * 0.5)
    ...     (y * 3 + y * 2).backward()
    >>> [float(bar.get_width()) for bar in lens.plot.with_without().axes[0].patches]
    [10.0, 20.0]
    """
    passes, _ = _passes_and_calls(source)
    rows = []
    for backward_pass in passes:
        for name, value in backward_pass.grads.items():
            label = f"pass {backward_pass.index + 1}: {name}" if len(passes) > 1 else name
            rows.append((label, size(value), size(backward_pass.grads_without_hooks.get(name)),
                         name in backward_pass.unknown))
    figure, axis = _paired_bars([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows],
                                (dict(color=ORANGE, label="with hooks"),
                                 dict(color=BLUE, hatch="//", label="without hooks")),
                                "gradients with and without hooks")
    for position, row in enumerate(rows):
        if row[3]:
            axis.text(0, position + 0.2, " unknown", va="center", fontsize=8, color=GREY)
    return figure


def _paired_bars(names: list[str], first: list, second: list, styles: tuple[dict, dict], title: str):
    """Two bars per row (values or norms; None drawn as 0), names down the side."""
    figure = _figure(2 * len(names))
    axis = figure.subplots()
    positions = list(range(len(names)))
    for offset, values, style in ((-0.2, first, styles[0]), (0.2, second, styles[1])):
        axis.barh([p + offset for p in positions], _drawable(values), height=0.4, **style)
        for position, value in zip(positions, values):
            if not_finite(value):
                axis.text(0, position + offset, f" {not_finite(value)}", va="center", fontsize=8, color=RED)
    labels, legend = _labels(names)
    axis.set_yticks(positions, labels, fontsize=8)
    axis.invert_yaxis()
    axis.axvline(0, color=GREY, linewidth=0.8)
    axis.set_xlabel("value (norm for tensors)")
    axis.set_title(title)
    if names:
        axis.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _add_legend(figure, legend)
    return figure, axis


def plot(source: Any, pass_index: int = -1):
    """A summary figure: each leaf's gradient with the hooks and without them (scalars as values,
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
    backward_pass = _pass(source, pass_index)
    _, calls = _passes_and_calls(source)
    names = list(backward_pass.grads)
    with_hooks = [size(backward_pass.grads[name]) for name in names]
    without = [size(backward_pass.grads_without_hooks.get(name)) for name in names]
    figure = _figure(max(len(names), 4), width=9)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    positions = range(len(names))
    left.bar([p - 0.2 for p in positions], _drawable(with_hooks), width=0.4, label="with hooks", color=ORANGE)
    left.bar([p + 0.2 for p in positions], _drawable(without), width=0.4, label="without hooks", color=BLUE, hatch="//")
    for offset, values in ((-0.2, with_hooks), (0.2, without)):
        for position, value in zip(positions, values):
            if not_finite(value):
                left.text(position + offset, 0, not_finite(value), ha="center", va="bottom", fontsize=8, color=RED)
    left.set_xticks(list(positions), [plain_text(name) for name in names], rotation=30 if len(names) > 4 else 0,
                    ha="right" if len(names) > 4 else "center")
    left.axhline(0, color="#6b7280", linewidth=0.8)
    left.set_title(f"pass {backward_pass.index + 1}: gradients")
    left.set_ylabel("value (norm for tensors)")
    left.legend(frameon=False, fontsize=8)
    counts = Counter(plain_text(f"{call.hook}\non {call.target}") for call in calls)
    labels = list(counts)
    right.barh(range(len(labels)), [counts[label] for label in labels], color=ORANGE)
    right.set_yticks(range(len(labels)), labels, fontsize=8)
    right.invert_yaxis()
    right.set_title("hook calls")
    right.set_xlabel("times fired")
    if not labels:
        right.text(0.5, 0.5, "no hook fired", ha="center", va="center", transform=right.transAxes)
    return figure


class Plots:
    """``lens.plot``: call it for the summary figure; each method draws one picture (a ``Figure``)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def __call__(self, pass_index: int = -1):
        return plot(self._source, pass_index)

    def grad_flow(self, pass_index: int = -1, log: bool = True):
        """Mean and max |grad| per parameter after a pass (see :func:`grad_flow`)."""
        return grad_flow(self._source, pass_index, log)

    def timeline(self):
        """Every hook call over all passes (see :func:`timeline`)."""
        return timeline(self._source)

    def before_after(self, hook: str | None = None):
        """What each hook call received and passed on (see :func:`before_after`)."""
        return before_after(self._source, hook)

    def with_without(self):
        """Each leaf's gradient with and without hooks, per pass (see :func:`with_without`)."""
        return with_without(self._source)

    def __repr__(self) -> str:
        return "<lens.plot: call it, or .grad_flow() .timeline() .before_after() .with_without()>"


# by the name a %%lens --plot option gives
BY_NAME = {"flow": "grad_flow", "timeline": "timeline", "before-after": "before_after", "with-without": "with_without"}
