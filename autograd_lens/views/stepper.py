"""The live stepper: an anywidget running the same ES module as the static page.

Stepping happens in the browser (no kernel round trip); the widget's ``step`` and ``pass_index`` traits are
synced both ways, so Python can read where the student is and move them.  Its display bundle also carries
the static HTML stepper as ``text/html``, for viewers without a kernel (nbconvert, Jupyter Book, GitHub)
and for untrusted notebooks (there, sanitised to a picture, a card and a table).
"""

from __future__ import annotations

import itertools

import anywidget
import traitlets

from ..model import BackwardPass
from .passview import PassView, stepper_data, views_for
from .static_html import fragment_key, module_source, stepper_fragment
from .steps import Frame, Step, check_answers, frame, question_frame, question_rule, reveal_text

_live_ids = itertools.count(1)


class Stepper(anywidget.AnyWidget):
    """Step through recorded backward passes: play/pause, previous/next, first/last, a slider, zoom,
    pan and follow, and a pass selector when there were several passes.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     (x * 3).backward()
    >>> stepper = Stepper(lens.passes)
    >>> stepper.step = 1
    >>> stepper.current_step.title
    'mul (MulBackward0) runs'
    """

    _esm = traitlets.Unicode(module_source()).tag(sync=True)
    data = traitlets.Unicode("").tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)
    pass_index = traitlets.Int(0).tag(sync=True)
    answers = traitlets.Dict().tag(sync=True)  # "pass:step" -> [right, message], from the browser or answer()

    def __init__(self, passes: list[BackwardPass], text: str = "", predict: bool = False) -> None:
        self.views = views_for(passes, predict)
        self.predict = predict
        self._text = text or f"<autograd_lens.Stepper: {len(passes)} pass{'es' if len(passes) != 1 else ''}>"
        key = f"al-live-{next(_live_ids)}-{fragment_key(self.views, predict) if self.views else 'empty'}"
        super().__init__(data=_json(stepper_data(self.views, key, predict)) if self.views else _json({"passes": []}))

    @traitlets.validate("step")
    def _valid_step(self, proposal):
        last = len(self.view.steps) - 1 if self.views else 0
        return max(0, min(int(proposal["value"]), last))

    @traitlets.validate("pass_index")
    def _valid_pass(self, proposal):
        return max(0, min(int(proposal["value"]), max(len(self.views) - 1, 0)))

    # ---------------------------------------------------------------- state
    @property
    def view(self) -> PassView:
        return self.views[self.pass_index]

    @property
    def current_step(self) -> Step:
        return self.view.steps[self.step]

    @property
    def current_frame(self) -> Frame:
        """What the drawing shows now: while a question is open, nothing of the step's own answer."""
        if self.asking:
            return question_frame(self.view.steps, self.step)
        return frame(self.view.steps, self.step)

    def show_pass(self, index: int) -> None:
        """Show pass ``index`` from its first step."""
        with self.hold_sync():
            self.pass_index = index
            self.step = 0

    @property
    def asking(self) -> bool:
        """True while the current step waits for the student's prediction (``predict`` mode)."""
        return self.predict and self.current_step.question is not None \
            and f"{self.pass_index}:{self.step}" not in self.answers

    def answer(self, text) -> tuple[bool, str]:
        """Check a predicted value for the current step against autograd's, then show the step.  A question
        with several parts (a hook: what it receives, what flows on) takes a list, or one string with the
        parts separated by ``;``.  The message ends with the rule that gives autograd's value."""
        question = self.current_step.question
        if question is None:
            return False, "This step asks nothing: step on."
        right, message = check_answers(question, text if isinstance(text, (list, tuple)) else str(text))
        self.answers = {**self.answers, f"{self.pass_index}:{self.step}": [right, message]}
        rule = question_rule(question)
        return right, f"{message} Why: {rule}" if rule else message

    def reveal(self) -> None:
        """Show the current step without an answer."""
        question = self.current_step.question
        if question is not None:
            self.answers = {**self.answers, f"{self.pass_index}:{self.step}": [False, reveal_text(question)]}

    # ---------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle)
        bundle["text/plain"] = self._text
        bundle["text/html"] = stepper_fragment(self.views, predict=self.predict)
        return bundle


def _json(data: object) -> str:
    import json

    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

