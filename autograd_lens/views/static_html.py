"""The self-contained HTML stepper: inline SVG, a small inline script, the steps as JSON.

No network, no CDN, no kernel: it steps in nbconvert HTML, Jupyter Book, or any
browser.  With scripts off it shows the finished pass.  The bytes depend only
on the recorded passes (ids come from a content hash), so nbval can compare it.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from .passview import PassView, base_css, frame_css, views_for
from .steps import frame
from .trace_display import pass_title

_SCRIPT: str | None = None


def script() -> str:
    global _SCRIPT
    if _SCRIPT is None:
        _SCRIPT = resources.files("autograd_lens.views").joinpath("stepper.js").read_text(encoding="utf-8")
    return _SCRIPT


def _json_for_html(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def controls_html(views: list[PassView]) -> str:
    last = len(views[0].steps) - 1
    buttons = [
        ("first", "|&lt;", "first step"),
        ("prev", "&lt;", "previous step (left arrow)"),
        ("play", "play", "play / pause"),
        ("next", "&gt;", "next step (right arrow)"),
        ("last", "&gt;|", "last step"),
    ]
    parts = ['<div class="al-controls" role="toolbar" aria-label="step through the backward pass">']
    for action, text, title in buttons:
        parts.append(f'<button type="button" data-go="{action}" title="{title}" aria-label="{title}">{text}</button>')
    parts.append(
        f'<input type="range" class="al-slider" min="0" max="{last}" value="{last}" aria-label="step"> '
        f'<span class="al-pos">step {last} of {last}</span>'
    )
    if len(views) > 1:
        options = "".join(
            f'<option value="{i}">{html.escape(pass_title(view.backward_pass))}</option>' for i, view in enumerate(views)
        )
        parts.append(f' <select class="al-pass" aria-label="backward pass">{options}</select>')
    parts.append("</div>")
    return "".join(parts)


def stepper_fragment(views: list[PassView], predict: bool = False) -> str:
    """An HTML fragment (for a notebook output) stepping through the given passes.  With ``predict``,
    each step that reveals a gradient first asks the student for it."""
    if not views:
        return "<p>No backward pass was recorded.</p>"
    key = ("al-p-" if predict else "al-") + "-".join(view.key for view in views)[:32]
    scope = f"#{key}"
    first = views[0]
    last = len(first.steps) - 1
    hidden = ' style="display:none"'
    graphs = "".join(
        f'<div class="al-graph" data-pass="{i}"{"" if i == 0 else hidden}>{view.svg}</div>'
        for i, view in enumerate(views)
    )
    data = {"passes": [dict(view.data(predict), table=view.table) for view in views], "predict": predict}
    return (
        f'<div class="autograd-lens al-stepper" id="{key}" tabindex="0">'
        f"<style>{base_css(scope)}</style>"
        f'<style class="al-frame">{frame_css(scope, frame(first.steps, last))}</style>'
        f"{controls_html(views)}{graphs}"
        f'<div class="al-cardbox" aria-live="polite">{first.cards[last]}</div>'
        f'<div class="al-tablebox">{first.table}</div>'
        f'<script type="application/json" class="al-data">{_json_for_html(data)}</script>'
        f"<script>{script()}</script>"
        "</div>"
    )


def page(body: str, title: str = "autograd_lens") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}\n</body></html>\n"
    )


def lens_page(lens, predict: bool = False) -> str:
    """A standalone page for everything a Lens recorded."""
    views = views_for(lens.passes)
    return page(stepper_fragment(views, predict=predict), title="autograd_lens: backward pass")
