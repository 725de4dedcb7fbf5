"""How a ``Lens`` shows itself: the HTML stepper, or (no renderer) the steps as an HTML list."""

from __future__ import annotations

import html
from typing import Any

from ..model import BackwardPass
from .passview import pass_title


def lens_text(lens: Any) -> str:
    passes = lens.passes
    calls = sum(len(p.hook_calls) for p in passes)
    return (
        f"<autograd_lens.Lens: {len(passes)} backward pass{'es' if len(passes) != 1 else ''}, "
        f"{calls} hook call{'s' if calls != 1 else ''}>"
    )


def pass_html(backward_pass: BackwardPass, predict: bool = False) -> str:
    """A pass as a numbered list of its steps, in the stepper's words, and the gradients table.  With
    ``predict``, a step that asks something shows its question, and what it reveals waits behind a click."""
    from .steps import grads_table_html, question_rule, steps_for

    items = []
    for step in steps_for(backward_pass)[1:]:
        details = "".join(f"<br>{html.escape(line)}" for line in step.lines)
        note = f"<br><i>Note: {html.escape(step.note)}</i>" if step.note else ""
        shown = f"<b>{html.escape(step.title)}</b>{details}{note}"
        if predict and step.question is not None:
            question = step.question
            why = question_rule(question)
            answers = " ".join(f"{part.label}: {part.answer_text}." if len(question.parts) > 1 else
                               f"Autograd computed {part.answer_text}." for part in question.parts)
            shown = (f"<b>{html.escape(question.title or step.title)}</b><br>{html.escape(question.prompt)}"
                     f"<details><summary>answer</summary>{html.escape(answers)}"
                     f"{'<br>Why: ' + html.escape(why) if why else ''}<br>{shown}</details>")
        items.append(f"<li>{shown}</li>")
    table = grads_table_html(backward_pass)
    if predict and table:
        table = f"<details><summary>gradients with and without hooks (answers)</summary>{table}</details>"
    return f"<h4>{html.escape(pass_title(backward_pass))}</h4><ol>{''.join(items)}</ol>{table}"


def events_bundle(lens: Any, hint: str = "", predict: bool = False) -> dict[str, str]:
    """The passes as HTML lists and tables: what shows when no drawing can be made."""
    if not lens.passes and any(note.code == "untraced_pass" for note in lens.notes):
        body = ("<p>No backward pass was recorded: the ones that ran here are of a kind the lens leaves alone "
                "(its notes say which).</p>")
    elif not lens.passes:
        body = (
            "<p>No backward pass was recorded: call <code>loss.backward()</code> "
            "(or <code>torch.autograd.grad</code>) inside the <code>%%lens</code> cell or the "
            "<code>with Lens()</code> block.</p>"
        )
    else:
        body = "".join(pass_html(p, predict) for p in lens.passes)
    return {"text/html": f'<div class="autograd-lens">{hint}{body}</div>', "text/plain": lens_text(lens)}


def lens_bundle(lens: Any, predict: bool = False) -> dict[str, str]:
    """The stepper as a self-contained HTML output (or, without a renderer, the steps in HTML).

    Not the anywidget: a widget's output needs its kernel-side model, so a saved notebook reopened
    later would show "Error displaying widget: model not found" where the pass was (JupyterLab does not
    save widget state by default).  The HTML stepper runs the same module and steps in the browser just
    the same, live or reopened; ``lens.stepper()`` gives the widget, whose ``step`` Python can read and set.
    """
    from .display import hint_html, safe_bundle
    from .passview import views_for
    from .static_html import stepper_fragment

    try:
        if not lens.passes:
            return events_bundle(lens)
        try:
            views = views_for(lens.passes, predict)
            for view in views:
                _ = view.svg  # drawn now: a renderer that cannot run falls back below, before anything is shown
            return {"text/html": stepper_fragment(views, predict=predict), "text/plain": lens_text(lens)}
        except Exception as error:  # never raise from a display method: the steps in words, and the cause
            return events_bundle(lens, hint_html(error), predict)
    except Exception as error:
        return safe_bundle("recording", error)


class PredictDisplay:
    """A Lens shown in predict mode; like the Lens itself, it never raises while displaying."""

    def __init__(self, lens: Any) -> None:
        self.lens = lens

    def _repr_mimebundle_(self, include=None, exclude=None):
        return lens_bundle(self.lens, predict=True)

    def __repr__(self) -> str:
        return lens_text(self.lens)


class NotesDisplay:
    """The notes on classic mistakes under a ``%%lens`` cell: a short list, each with its notebook."""

    def __init__(self, notes: list) -> None:
        self.notes = notes

    def _repr_html_(self) -> str:
        items = "".join(f"<li><b>{html.escape(note.code.replace('_', ' '))}</b>: {html.escape(note.text())}</li>"
                        for note in self.notes)
        return f'<div class="autograd-lens al-notes"><b>autograd_lens notes</b><ul>{items}</ul></div>'

    def __repr__(self) -> str:
        return "autograd_lens notes:\n" + "\n".join(f"- {note.code}: {note.text()}" for note in self.notes)
