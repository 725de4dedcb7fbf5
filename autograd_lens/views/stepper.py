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
from .steps import Frame, Step, check_answer, feedback_html, frame, question_frame, question_html
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

    def __init__(self, passes: list[BackwardPass], text: str = "", predict: bool = False) -> None:
        self.views = views_for(passes)
        self.predict = predict
        self.answers: dict[tuple[int, int], tuple[bool, str]] = {}  # (pass, step) -> (right, message)
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
        self.answer_box = widgets.Text(placeholder="e.g. 3.0 or [1, 2]", description="your answer",
                                       continuous_update=False)
        check = widgets.Button(description="check", tooltip="compare with autograd's value")
        reveal = widgets.Button(description="show me", tooltip="reveal autograd's value")
        check.on_click(lambda _: self.answer(self.answer_box.value))
        reveal.on_click(lambda _: self.reveal())
        # Enter (or leaving the box) commits the text: that checks it too
        self.answer_box.observe(lambda change: change["new"] and self.asking and self.answer(change["new"]), names="value")
        self.ask = widgets.HBox([self.answer_box, check, reveal], layout=widgets.Layout(display="none"))
        super().__init__([widgets.HBox(controls), self.frame_html, self.graph_html, self.card_html, self.ask,
                          self.table_html])
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

    @property
    def asking(self) -> bool:
        """True while the current step waits for the student's prediction (``predict`` mode)."""
        return self.predict and self.current_step.question is not None \
            and (self.pass_index, self.step) not in self.answers

    def answer(self, text: str) -> tuple[bool, str]:
        """Check a predicted gradient for the current step against autograd's value, then show the step."""
        question = self.current_step.question
        if question is None:
            return False, "This step asks nothing: step on."
        result = check_answer(question, str(text))
        self.answers[(self.pass_index, self.step)] = result
        self._render_step(self.step)
        return result

    def reveal(self) -> None:
        """Show the current step without an answer."""
        question = self.current_step.question
        if question is not None:
            self.answers[(self.pass_index, self.step)] = (False, f"Autograd computed {question.answer_text}.")
        self._render_step(self.step)

    def _render_step(self, index: int) -> None:
        view = self.view
        scope = f"#{self.scope_id}"
        asking = self.asking and index == self.step
        shown = question_frame(view.steps, index) if asking else frame(view.steps, index)
        self.frame_html.value = f"<style>{frame_css(scope, shown)}</style>"
        if asking:
            card = question_html(view.steps[index], len(view.steps), inputs=False)
            self.answer_box.value = ""
        else:
            settled = self.answers.get((self.pass_index, index))
            card = (feedback_html(settled[1], settled[0]) if settled else "") + view.cards[index]
        self.card_html.value = _scoped(card, f"{self.scope_id}-card")
        self.ask.layout.display = "flex" if asking else "none"
        # in predict mode the with/without table would give the answers away: it shows at the last step
        last = index == len(view.steps) - 1
        self.table_html.layout.display = "none" if self.predict and not last else None

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
        bundle["text/html"] = stepper_fragment(self.views, predict=self.predict)
        return bundle


def _scoped(content: str, element_id: str) -> str:
    """Content in its own container with the stepper's styles (each widget is a separate DOM subtree)."""
    return f'<div id="{element_id}" class="autograd-lens"><style>{base_css("#" + element_id)}</style>{content}</div>'


def lens_widget(lens, predict: bool = False) -> Stepper:
    return Stepper(lens.passes, text=lens_text(lens), predict=predict)
