"""Predict mode: a question a step asks before it reveals autograd's value, and how an answer is checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import html
import math
from dataclasses import dataclass

from ..format import format_value

if TYPE_CHECKING:
    from .context import Step

CHAIN_RULE_LIMIT = 16  # tensors up to this many elements get the numbers written out


@dataclass(frozen=True)
class Question:
    """A value the step is about to reveal, asked before it is shown (``predict`` mode).

    ``title`` is the card's title while the question is open (the step's own title may hold the answer);
    ``rule`` says why autograd's value is what it is, shown with the feedback; ``more`` holds further parts
    asked on the same card (a hook: what it receives, then what flows on after it)."""

    prompt: str
    answer: tuple[float, ...]  # autograd's value, flattened
    answer_text: str  # as the card prints it
    rule: str = ""
    title: str = ""
    label: str = "your answer"
    more: tuple["Question", ...] = ()

    @property
    def parts(self) -> tuple["Question", ...]:
        return (self, *self.more)


def question_about(prompt: str, value, rule: str = "", title: str = "", label: str = "your answer") -> Question | None:
    """A question whose answer is ``value`` (a small real tensor), or None when it cannot be asked."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_complex() \
            or not value.dtype.is_floating_point or value.numel() > CHAIN_RULE_LIMIT or value.numel() == 0:
        return None
    flat = value.detach().reshape(-1).tolist()
    if not all(abs(v) < float("inf") for v in flat):
        return None
    return Question(prompt, tuple(float(v) for v in flat), format_value(value), rule=rule, title=title, label=label)


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def answer_numbers(text: str) -> list[float]:
    """The numbers of a typed answer: a fraction such as 1/4 is one number, and the minus sign U+2212 (−) is a
    minus. Mirrored by ``answerNumbers`` in stepper_base.js."""
    import re

    numbers = []
    for token in re.findall(rf"{_NUMBER}(?:\s*/\s*{_NUMBER})?", (text or "").replace("\u2212", "-")):
        top, _, bottom = token.partition("/")
        top = float(top)
        if not bottom:
            numbers.append(top)
        elif float(bottom) != 0:
            numbers.append(top / float(bottom))
        else:  # as JavaScript divides: ±inf, or NaN for 0/0 (never close to a gradient)
            numbers.append(float("nan") if top == 0 else math.copysign(float("inf"), top))
    return numbers


def check_answer(question: Question, text: str) -> tuple[bool, str]:
    """Compare a student's answer (numbers in any brackets/commas, fractions such as 1/4; one number stands for
    all entries) with autograd's value, at the precision the cards print (one part of a question)."""
    numbers = answer_numbers(text)
    expected = question.answer
    if not numbers:
        return False, f"Type a number (or a list such as [1, 2]); autograd computed {question.answer_text}."
    if len(numbers) == 1 and len(expected) > 1:
        numbers = numbers * len(expected)
    if len(numbers) != len(expected):
        return False, (f"Not quite: that is {len(numbers)} number{'s' if len(numbers) != 1 else ''}, the gradient has "
                       f"{len(expected)}. Autograd computed {question.answer_text}.")
    # at the precision the cards print, relative to the gradient's own scale: a fixed 1e-3 took -0.0004 for 0.0004
    # each entry at the 4 significant digits the card prints it with (1e-3 of itself: 1e-3 of the largest took 0.5
    # for the 1.0 beside 1097), and a floor of 1e-6 of the largest |value| for rounding noise (at least 1e-9)
    floor = 1e-6 * max(max(abs(b) for b in expected), 1e-3)
    close = all(abs(a - b) <= floor + 1e-3 * abs(b) for a, b in zip(numbers, expected))
    if close:
        return True, f"Right: autograd computed {question.answer_text}."
    return False, f"Not quite: autograd computed {question.answer_text}."


def check_answers(question: Question, texts) -> tuple[bool, str]:
    """Every part of a question checked (``texts``: one answer per part; a single string is split at ``;``).
    Mirrored by ``checkAnswers`` in stepper.js: same words."""
    if isinstance(texts, str):
        texts = texts.split(";") if len(question.parts) > 1 else [texts]
    texts = list(texts) + [""] * (len(question.parts) - len(texts))
    results = [check_answer(part, text) for part, text in zip(question.parts, texts)]
    if len(results) == 1:
        return results[0]
    return all(right for right, _ in results), " ".join(
        f"{part.label}: {message}" for part, (_, message) in zip(question.parts, results))


def reveal_text(question: Question) -> str:
    """What the feedback says when the student asks to be shown (mirrored in stepper.js)."""
    if len(question.parts) == 1:
        return f"Autograd computed {question.answer_text}."
    return " ".join(f"{part.label}: autograd computed {part.answer_text}." for part in question.parts)


def question_rule(question: Question) -> str:
    """Why the answers are what they are: each part's rule, once."""
    return " ".join(dict.fromkeys(part.rule for part in question.parts if part.rule))


def question_html(step: Step, total: int, inputs: bool = True) -> str:
    """The card of a step whose value the student predicts first: the question under a title that gives
    nothing away (and, for the static page, a box per part and two buttons; the live widget has its own)."""
    question = step.question
    title = question.title or step.title
    boxes = "".join(
        f'<label>{html.escape(part.label)} <input type="text" class="al-answer" data-part="{number}" size="24"></label> '
        for number, part in enumerate(question.parts))
    ask = (f'<div class="al-ask">{boxes}'
           '<button type="button" data-go="check">check</button> '
           '<button type="button" data-go="reveal">show me</button></div>') if inputs else ""
    return (f'<div class="al-card al-question"><div class="al-step">step {step.index} of {total - 1}: predict</div>'
            f'<div class="al-title">{html.escape(title)}</div><div>{html.escape(question.prompt)}</div>'
            f"{ask}</div>")


def feedback_html(message: str, right: bool, rule: str = "") -> str:
    """The verdict, then the rule that gives autograd's value."""
    why = f'<div class="al-why">Why: {html.escape(rule)}</div>' if rule else ""
    return f'<div class="al-feedback {"al-right" if right else "al-wrong"}">{html.escape(message)}</div>{why}'
