"""The live stepper: standard ipywidgets controls around a drawing laid out once per pass.

A step changes only a small ``<style>`` block and the event card (no Graphviz
run, no SVG re-sent), so stepping stays fast on large graphs.  Its display
bundle also carries the static HTML stepper as ``text/html``, for viewers
without a kernel (nbconvert, Jupyter Book, GitHub).
"""

from __future__ import annotations

import itertools

import ipywidgets as widgets

from ..model import BackwardPass
from .passview import PassView, base_css, frame_css, views_for
from .steps import Frame, Step, frame
from .trace_display import lens_text, pass_title

_live_ids = itertools.count(1)


class Stepper(widgets.VBox):
    """Step through recorded backward passes: play/pause, previous/next, first/last, a slider,
    and a pass selector when there were several passes.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     (x * 3).backward()
    >>> stepper = Stepper(lens.passes)
    >>> stepper.step = 1
    >>> stepper.current_step.title
    'mul (MulBackward0) runs'
    """

    def __init__(self, passes: list[BackwardPass], text: str = "") -> None:
        self.views = views_for(passes)
        self._text = text or f"<autograd_lens.Stepper: {len(passes)} pass{'es' if len(passes) != 1 else ''}>"
        self.scope_id = f"al-live-{next(_live_ids)}-{self.views[0].key if self.views else 'empty'}"
        self.pass_index = 0
        last = len(self.views[0].steps) - 1 if self.views else 0
        tooltip = "{}: also the left/right arrow keys when the slider has focus"
        self.play = widgets.Play(value=0, min=0, max=last, interval=900, description="play", tooltip="play / pause")
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="step", continuous_update=True,
                                        readout=True, tooltip=tooltip.format("step"))
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.buttons = {
            name: widgets.Button(description=label, tooltip=tip, layout=widgets.Layout(width="auto"))
            for name, label, tip in (
                ("first", "|<", "first step"),
                ("prev", "<", "previous step"),
                ("next", ">", "next step"),
                ("last", ">|", "last step"),
            )
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _, name=name: self._go(name))
        controls = [self.buttons["first"], self.buttons["prev"], self.play, self.buttons["next"],
                    self.buttons["last"], self.slider]
        self.pass_select = None
        if len(self.views) > 1:
            self.pass_select = widgets.Dropdown(
                options=[(pass_title(v.backward_pass), i) for i, v in enumerate(self.views)],
                value=0, description="pass", tooltip="which backward pass to step through",
            )
            self.pass_select.observe(lambda change: self.show_pass(change["new"]), names="value")
            controls.append(self.pass_select)
        self.graph_html = widgets.HTML()
        self.frame_html = widgets.HTML()
        self.card_html = widgets.HTML()
        self.table_html = widgets.HTML()
        self.slider.observe(lambda change: self._render_step(change["new"]), names="value")
        super().__init__([widgets.HBox(controls), self.frame_html, self.graph_html, self.card_html, self.table_html])
        if self.views:
            self.show_pass(0)

    # ---------------------------------------------------------------- state
    @property
    def view(self) -> PassView:
        return self.views[self.pass_index]

    @property
    def step(self) -> int:
        return self.slider.value

    @step.setter
    def step(self, value: int) -> None:
        self.slider.value = max(0, min(value, self.slider.max))

    @property
    def current_step(self) -> Step:
        return self.view.steps[self.step]

    @property
    def current_frame(self) -> Frame:
        return frame(self.view.steps, self.step)

    # ---------------------------------------------------------------- drawing
    def show_pass(self, index: int) -> None:
        self.pass_index = index
        view = self.view
        self.graph_html.value = _scoped(f'<div class="al-graph">{view.svg}</div>', self.scope_id)
        self.table_html.value = _scoped(view.table, f"{self.scope_id}-table")
        last = len(view.steps) - 1
        with self.hold_trait_notifications():
            self.slider.max = last
            self.play.max = last
        if self.slider.value != 0:
            self.slider.value = 0  # renders through the observer
        else:
            self._render_step(0)

    def _render_step(self, index: int) -> None:
        view = self.view
        scope = f"#{self.scope_id}"
        self.frame_html.value = f"<style>{frame_css(scope, frame(view.steps, index))}</style>"
        self.card_html.value = _scoped(view.cards[index], f"{self.scope_id}-card")

    def _go(self, where: str) -> None:
        self.play.playing = False
        last = self.slider.max
        target = {"first": 0, "prev": self.step - 1, "next": self.step + 1, "last": last}[where]
        self.step = target

    # ---------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        from .static_html import stepper_fragment

        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/plain"] = self._text
        bundle["text/html"] = stepper_fragment(self.views)
        return bundle


def _scoped(content: str, element_id: str) -> str:
    """Content in its own container with the stepper's styles (each widget is a separate DOM subtree)."""
    return f'<div id="{element_id}" class="autograd-lens"><style>{base_css("#" + element_id)}</style>{content}</div>'


def lens_widget(lens) -> Stepper:
    return Stepper(lens.passes, text=lens_text(lens))
