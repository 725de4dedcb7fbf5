"""Where NaN or inf started in a backward pass, read from the recorded events (no second run).

The origin is the first step, in the order the engine ran them, that received
only finite gradients and passed on a non-finite one: a backward function (the
one ``torch.autograd.detect_anomaly`` names), or a hook that returned NaN (also a node's post-hook or a module
backward hook, which anomaly mode counts as part of their node's output).  A
non-finite gradient given to ``backward()`` is its own origin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..model import BackwardPass, GradWritten, HookCall, NodeRun, SourceLine, TensorSummary

FINITE, NONFINITE, UNREADABLE = "finite", "non-finite", "unreadable"
# hooks that run as post-hooks of a node (torch's module-hook wrappers are post-hooks of the module's boundary
# nodes): what the node passed on includes what they returned
_POST_HOOKS = ("node", "module_full", "module_pre", "legacy")
_READ_AS_FLOATS = 16  # a real tensor of at most this many numbers is checked on its numbers read as floats


@dataclass(frozen=True)
class NonFinite:
    """The first step of a pass that turned finite gradients into NaN or inf."""

    kind: str  # "node", "hook", "seed", "earlier" (a .grad that held it before the pass), or "unknown" (see note)
    name: str  # backward function (e.g. "LogBackward0"), the hook's name, or "gradient="
    label: str  # what the drawing calls it ("log → y"), or the hook's target
    step: int  # position in the pass's events (-1 for the seed)
    node: str | None  # graph node id
    inputs: str  # a summary of what it received
    outputs: str  # a summary of what it passed on
    source: SourceLine | None = None  # the cell line that made the node (in %%lens cells)
    note: str = ""  # what is not known (e.g. an earlier step whose values were not kept)

    def text(self) -> str:
        where = f" ({self.source.describe()})" if self.source is not None else ""
        what = {"node": "backward function", "hook": "hook", "seed": "the gradient given to backward()",
                "earlier": "added into"}.get(self.kind, self.kind)
        return (f"first non-finite gradient: {what} {self.name} [{self.label}]{where}: received {self.inputs}, "
                f"passed on {self.outputs}" + (f"; {self.note}" if self.note else ""))


def state(value: Any) -> str:
    """FINITE, NONFINITE or UNREADABLE for a recorded value (None and tuples of values included)."""
    if value is None:
        return FINITE
    if isinstance(value, (tuple, list)):
        states = [state(item) for item in value]
        if NONFINITE in states:
            return NONFINITE
        return UNREADABLE if UNREADABLE in states else FINITE
    if isinstance(value, TensorSummary):
        if value.kind != "dense" or (value.min is None and value.norm is None):
            return FINITE if value.numel == 0 else UNREADABLE
        numbers = [number for number in (value.min, value.max, value.norm) if number is not None]
        return FINITE if all(math.isfinite(number) for number in numbers) else NONFINITE
    try:
        if not (value.is_floating_point() or value.is_complex()):
            return FINITE
        if value.is_floating_point() and value.numel() <= _READ_AS_FLOATS and str(value.layout) == "torch.strided":
            # a few real numbers (a pass of scalars: one per node): read once, cheaper than two torch ops
            return FINITE if all(math.isfinite(number) for number in _flat(value.tolist())) else NONFINITE
        return FINITE if bool(value.isfinite().all()) else NONFINITE
    except Exception:
        return UNREADABLE


def _flat(numbers: Any) -> list:
    """The numbers of ``tensor.tolist()`` (a number, or lists nested as deep as the tensor has dims)."""
    if not isinstance(numbers, list):
        return [numbers]
    return [number for item in numbers for number in _flat(item)] if numbers and isinstance(numbers[0], list) \
        else numbers


def describe(value: Any) -> str:
    from ..format import format_value

    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(describe(item) for item in value) + ")"
    if value is None:
        return "None"
    try:
        return format_value(value, 40)
    except Exception:
        return "a value that cannot be shown"


def first_nonfinite(backward_pass: BackwardPass) -> NonFinite | None:
    """The origin of the pass's first NaN or inf, or None when every recorded gradient is finite.

    Raises nothing the caller must handle: an origin that cannot be told apart is
    returned with ``note`` saying why (e.g. a value kept as shape only).
    """
    unreadable = ""
    seeds = _seed(backward_pass)
    if seeds is not None:
        return seeds
    events = backward_pass.events
    for index, event in enumerate(events):
        if isinstance(event, NodeRun):
            received, sent = event.grad_in, event.grad_out
        elif isinstance(event, HookCall) and event.error is None:
            received, sent = event.grad_in, event.grad_out
        else:
            continue
        before, after = state(received), state(sent)
        if after == UNREADABLE and not unreadable:
            unreadable = f"values at step {event.step} were not kept"
        if after != NONFINITE:
            continue
        note = ""
        if before == NONFINITE:  # it arrived non-finite from a step whose output was not recorded as such
            note = "it already received a non-finite gradient from a step whose values were not recorded"
        elif before == UNREADABLE or unreadable:
            note = "an earlier step's values were not kept, so the NaN may have started there"
        if isinstance(event, NodeRun) and before == FINITE:
            event = _post_hook_origin(events, index) or event
        return _origin(backward_pass, event, note)
    return _held_before(events)


def _held_before(events: Any) -> NonFinite | None:
    """A ``.grad`` this pass wrote with NaN or inf while it added only finite numbers: they were there before."""
    for event in events:
        if isinstance(event, GradWritten) and state(event.received) == FINITE and state(event.grad) == NONFINITE:
            return NonFinite("earlier", f"{event.name}.grad", event.name, event.step, None, describe(event.received),
                             describe(event.grad), note=f"{event.name}.grad held NaN or inf before this pass, which "
                                                        "added a finite gradient to it: an earlier pass put it there "
                                                        "(.grad adds up over passes until it is zeroed)")
    return None


def _post_hook_origin(events: Any, index: int) -> HookCall | None:
    """The first post-hook of the node run at ``events[index]`` that received finite values and returned
    non-finite ones (the node's own output, which the hook received, was finite): that hook made the NaN."""
    node = events[index].node
    for event in events[index + 1:]:
        if isinstance(event, NodeRun):
            return None
        if isinstance(event, HookCall) and event.error is None and node is not None and event.node == node \
                and (event.kind in _POST_HOOKS or event.kind.startswith("global_")) \
                and state(event.grad_in) == FINITE and state(event.grad_out) == NONFINITE:
            return event
    return None


def _origin(backward_pass: BackwardPass, event: Any, note: str) -> NonFinite:
    if isinstance(event, NodeRun):
        source = backward_pass.sources.get(event.node) if event.node else None
        return NonFinite("node", event.name, event.label, event.step, event.node, describe(event.grad_in),
                         describe(event.grad_out), source, note)
    return NonFinite("hook", event.hook, f"{event.kind_label} hook on {event.target}", event.step, event.node,
                     describe(event.grad_in), describe(event.grad_out), None, note)


def _seed(backward_pass: BackwardPass) -> NonFinite | None:
    """The first recorded node already received NaN: the gradient given to backward() held it."""
    for event in backward_pass.events:
        if isinstance(event, NodeRun):
            if state(event.grad_in) == NONFINITE and not any(
                    isinstance(other, HookCall) and other.step < event.step for other in backward_pass.events):
                return NonFinite("seed", "gradient=", ", ".join(backward_pass.roots) or "root", -1, None,
                                 describe(event.grad_in), describe(event.grad_in))
            return None
    return None
