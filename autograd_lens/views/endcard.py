"""What the debugging answers add to the walk-through: the card of the step where the pass's first NaN or inf
started says so, and a last card lists the named tensors that got no gradient in the pass, with the reason."""

from __future__ import annotations

import dataclasses

from ..model import BackwardPass
from .context import Step
from .marks import nonfinite_word


def mark_nonfinite(steps: list[Step], backward_pass: BackwardPass, placed: dict[int, int]) -> None:
    """Add to the card of the step where the first non-finite gradient appeared (``placed``: event position ->
    step index).  Nothing when the pass is finite, when the origin is not a step, or when it cannot be told."""
    try:
        origin = backward_pass.first_nonfinite
    except Exception:  # a display never raises: the card simply does not say it
        return
    if origin is None or origin.kind not in ("node", "hook") or origin.step not in placed:
        return
    index = placed[origin.step]
    what = nonfinite_word(origin.outputs)
    line = (f"⚠ {what} starts here: the first step of this pass to pass on a non-finite gradient (it received "
            f"{origin.inputs}, passed on {origin.outputs})" + (f"; {origin.note}" if origin.note else "") + ".")
    steps[index] = dataclasses.replace(steps[index], lines=tuple(steps[index].lines) + (line,))


def end_step(index: int, backward_pass: BackwardPass) -> Step | None:
    """The last card: the named tensors whose gradient stopped on this pass's graph, and why (None when there
    are none, and after an error: the error's card says the pass stopped)."""
    if backward_pass.error:
        return None
    try:
        unreached = backward_pass.unreached
    except Exception:
        return None
    # only where the break is on this pass's graph (the ✂ marks): the full list also names every tensor of the
    # notebook that this pass did not use, which is true and in lens.passes[i].unreached, but not this pass's story
    unreached = {name: reason for name, reason in (unreached or {}).items() if reason.at}
    if not unreached:
        return None
    names = list(unreached)
    lines = [f"{name}: {reason.title}: {reason.text}." for name, reason in unreached.items()]
    placed = [node for reason in unreached.values() for node in reason.at]
    lines.append("The ✂ marks on the drawing show where the path broke; lens.passes[i].unreached also lists the "
                 "named tensors this pass did not use.")
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return Step(index, "end", placed[0] if placed else None, f"After the pass: no gradient reached {shown}",
                lines=tuple(lines))
