"""How a ``Lens`` shows itself: text and an HTML account of each pass."""

from __future__ import annotations

import html
from typing import Any

from ..format import format_value
from ..model import BackwardPass, GradWritten, HookCall, NodeRun, PassError


def describe(event: Any) -> str:
    """One plain-words sentence for an event (the stepper's card uses the same words)."""
    if isinstance(event, NodeRun):
        sent = ", ".join(
            f"{target} ← {format_value(value)}" for target, value in zip(event.targets, event.grad_out)
        )
        received = ", ".join(format_value(value) for value in event.grad_in)
        return f"{event.label} ({event.name}) ran: received {received}; sent {sent or 'nothing'}"
    if isinstance(event, GradWritten):
        return f"{event.name}.grad written: {format_value(event.grad)} (this pass added {format_value(event.received)})"
    if isinstance(event, HookCall):
        outcome = "gradient modified" if event.modified else "gradient unchanged"
        if event.error:
            return f"hook {event.hook} on {event.target} ({event.kind_label} hook) raised {event.error}"
        returned = "None" if event.returned_none else format_value(event.grad_out)
        forward = f", forward call {event.forward_call}" if event.forward_call else ""
        return (
            f"hook {event.hook} on {event.target} ({event.kind_label} hook, call {event.invocation}{forward}): "
            f"received {format_value(event.grad_in)} → returned {returned} — {outcome}"
        )
    if isinstance(event, PassError):
        return f"the pass stopped: {event.type}: {event.message}"
    return str(event)


def pass_title(backward_pass: BackwardPass) -> str:
    what = "backward()" if backward_pass.kind == "backward" else "autograd.grad()"
    roots = ", ".join(backward_pass.roots)
    return f"pass {backward_pass.index + 1}: {what} of {roots}"


def lens_text(lens: Any) -> str:
    passes = lens.passes
    calls = sum(len(p.hook_calls) for p in passes)
    return f"<autograd_lens.Lens: {len(passes)} backward pass{'es' if len(passes) != 1 else ''}, {calls} hook call{'s' if calls != 1 else ''}>"


def grads_table_html(backward_pass: BackwardPass) -> str:
    rows = []
    names = list(backward_pass.leaf_grads) or list(backward_pass.grads_without_hooks)
    for name in names:
        with_hooks = backward_pass.leaf_grads.get(name)
        without = backward_pass.grads_without_hooks.get(name)
        from ..capture.snapshot import values_equal

        differs = backward_pass.kind == "backward" and without is not None and not values_equal(with_hooks, without)
        mark = ' style="background:#fef3c7"' if differs else ""
        rows.append(
            f"<tr{mark}><td>{html.escape(name)}</td><td>{html.escape(format_value(with_hooks))}</td>"
            f"<td>{html.escape(format_value(without))}</td><td>{'differs' if differs else ''}</td></tr>"
        )
    return (
        '<table class="autograd-lens-grads"><thead><tr><th>tensor</th><th>.grad with hooks</th>'
        f"<th>without hooks</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def pass_html(backward_pass: BackwardPass) -> str:
    items = "".join(f"<li>{html.escape(describe(event))}</li>" for event in backward_pass.events)
    return f"<h4>{html.escape(pass_title(backward_pass))}</h4><ol>{items}</ol>{grads_table_html(backward_pass)}"


def events_bundle(lens: Any, hint: str = "") -> dict[str, str]:
    """The passes as HTML lists and tables: what shows when no drawing can be made."""
    if not lens.passes:
        body = (
            "<p>No backward pass ran in this cell: call <code>loss.backward()</code> "
            "(or <code>torch.autograd.grad</code>) inside it.</p>"
        )
    else:
        body = "".join(pass_html(p) for p in lens.passes)
    return {"text/html": f'<div class="autograd-lens">{hint}{body}</div>', "text/plain": lens_text(lens)}


def lens_bundle(lens: Any) -> dict[str, str]:
    """A stepper widget (with a static HTML stepper inside) or, without a renderer, the events in HTML."""
    from .display import RENDER_PROBLEMS, hint_html
    from .stepper import lens_widget

    if not lens.passes:
        return events_bundle(lens)
    try:
        widget = lens_widget(lens)
        return widget._repr_mimebundle_()
    except RENDER_PROBLEMS as error:
        return events_bundle(lens, hint_html(error))
