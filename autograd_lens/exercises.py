"""Exercises for the course: ask for a value, check an answer against what torch computes, explain the rule.

An :class:`Exercise` holds a small program and the expression whose value the student predicts. ``check(answer)``
runs the program afresh (a new namespace with ``torch``, ``nn`` and ``F``), compares the answer with the value
torch computed, and prints ``Right.`` or ``Not quite.`` followed by the rule that decides it. It never prints the
value itself, so an exercise can sit above its answer without giving it away; solutions live in their own
notebooks. ::

    >>> ex = Exercise("x.grad for y = x³ at x = 2?",
    ...               program="x = torch.tensor(2.0, requires_grad=True)\\n(x ** 3).backward()",
    ...               value="x.grad", rule="The derivative of x³ is 3x², taken at x = 2.")
    >>> ex.check(12)
    Right. The derivative of x³ is 3x², taken at x = 2.
    >>> ex.check(8)
    Not quite. The derivative of x³ is 3x², taken at x = 2.

A program that raises makes the exception the value: answer with its name (``"RuntimeError"``) or its class.
``mistakes`` name common wrong answers, each an expression computed like ``value`` and a sentence saying what
that answer overlooked.
"""

from __future__ import annotations

import contextlib
import io
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Exercise"]

_NO_ANSWER = "No answer yet: replace ... with your prediction"


@dataclass
class _Outcome:
    """What running an exercise's program produced: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    namespace: dict = field(default_factory=dict)


@dataclass
class Exercise:
    """One question whose answer torch computes when the answer is checked.

    ``program``: Python source run in a fresh namespace (``torch``, ``nn``, ``F`` and ``names`` predefined), or a
    function of no arguments returning the value. ``value``: the expression to predict, evaluated after the
    program (ignored when ``program`` is a function). ``rule``: the sentence printed after Right / Not quite; it
    must explain, not state the value. ``mistakes``: ``(expression, explanation)`` pairs for known wrong answers.
    ``tolerance``: relative and absolute tolerance for numbers.
    """

    question: str
    program: str | Callable[[], Any]
    value: str = ""
    rule: str = ""
    mistakes: tuple[tuple[str, str], ...] = ()
    tolerance: float = 1e-4
    names: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Exercise({self.question!r})"

    def _run(self) -> _Outcome:
        namespace = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional, **self.names}
        quiet = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            try:
                if callable(self.program):
                    return _Outcome(value=self.program(), namespace=namespace)
                exec(compile(textwrap.dedent(self.program), "<exercise>", "exec"), namespace)
                value = eval(self.value, namespace) if self.value else None
                return _Outcome(value=value, namespace=namespace)
            except Exception as error:  # the exception is the value to predict
                return _Outcome(error=error, namespace=namespace)

    def expected(self) -> Any:
        """The value torch computes now (the exception's class if the program raises). For tests and solutions."""
        outcome = self._run()
        return type(outcome.error) if outcome.error is not None else outcome.value

    def is_right(self, answer: Any) -> bool:
        """True when ``answer`` matches the value torch computes (within ``tolerance`` for numbers)."""
        return _matches(answer, self.expected(), self.tolerance)

    def check(self, answer: Any = ...) -> None:
        """Print ``Right.`` or ``Not quite.`` and the rule, never the value. Never raises."""
        try:
            print(self._verdict(answer))
        except Exception as error:  # a check must not break the student's notebook
            print(f"Could not check this answer ({type(error).__name__}: {error}).")

    def _verdict(self, answer: Any) -> str:
        expected = self.expected()
        if answer is ...:
            return f"{_NO_ANSWER} ({_form(expected)})."
        if _matches(answer, expected, self.tolerance):
            return _join("Right.", self.rule)
        form = _form_mismatch(answer, expected)
        return _join("Not quite.", form, self._mistake(answer), self.rule)

    def _mistake(self, answer: Any) -> str:
        if not self.mistakes:
            return ""
        namespace = self._run().namespace
        for expression, explanation in self.mistakes:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    wrong = eval(expression, namespace)
            except Exception:
                continue
            if _matches(answer, wrong, self.tolerance):
                return explanation
        return ""


def _join(*parts: str) -> str:
    return " ".join(part.strip() for part in parts if part and part.strip())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_tensor(value: Any) -> torch.Tensor | None:
    """A float64 tensor of a number, a nested list of numbers or a tensor; None for anything else."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    try:
        tensor = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if tensor.dtype == torch.bool or tensor.is_complex():
            return None
        return tensor.to(torch.float64)
    except Exception:
        return None


def _name(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


def _matches(answer: Any, expected: Any, tolerance: float) -> bool:
    if answer is ...:
        return False
    if expected is None or isinstance(expected, bool):
        if isinstance(answer, str):  # 'False' typed as a word means False
            answer = {"true": True, "false": False, "none": None}.get(answer.strip().lower(), answer)
        return answer is expected
    if isinstance(expected, (type, torch.dtype, str)):
        if not isinstance(answer, (type, torch.dtype, str)):
            return False
        said = _name(answer).strip().lower().removeprefix("torch.")
        if isinstance(expected, torch.dtype) and isinstance(answer, str):
            return getattr(torch, said, None) is expected  # torch's own names: 'float', 'torch.float' are float32
        if isinstance(expected, type) and isinstance(answer, str):
            said = said.rsplit(".", 1)[-1]  # 'pickle.UnpicklingError', '_pickle.UnpicklingError': the class's name
        return said == _name(expected).strip().lower()
    if isinstance(expected, torch.Tensor) or _is_number(expected):
        want, got = _as_tensor(expected), _as_tensor(answer)
        if want is None or got is None or got.shape != want.shape:
            return False
        return bool(torch.allclose(got, want, rtol=tolerance, atol=tolerance, equal_nan=True))
    if isinstance(expected, (list, tuple)):
        if not isinstance(answer, (list, tuple)) or len(answer) != len(expected):
            return _matches(answer, _as_tensor(expected), tolerance) if _as_tensor(expected) is not None else False
        return all(_matches(a, e, tolerance) for a, e in zip(answer, expected))
    return answer == expected


def _form(expected: Any) -> str:
    """How to write an answer of this kind, without its value."""
    if expected is None or isinstance(expected, bool):
        return "answer True, False or None"
    if isinstance(expected, type) and issubclass(expected, BaseException):
        return "answer with the exception's name, such as 'TypeError', or 'none' if nothing is raised"
    if isinstance(expected, torch.dtype):
        return "answer with a dtype, such as torch.float16"
    if isinstance(expected, str):
        return "answer with a word or name, as a string"
    tensor = _as_tensor(expected)
    if tensor is None:
        return "answer with a value"
    if tensor.dim() == 0:
        return "answer with a number"
    if tensor.dim() == 1:
        return f"answer with a list of {tensor.shape[0]} numbers"
    return f"answer with a nested list of shape {list(tensor.shape)}"


def _form_mismatch(answer: Any, expected: Any) -> str:
    """A sentence when the answer is of the wrong kind or shape (which says nothing about the value)."""
    want, got = _as_tensor(expected), _as_tensor(answer)
    if want is not None and got is not None and got.shape != want.shape:
        return f"The value has shape {list(want.shape)}, your answer {list(got.shape)}."
    if want is not None and got is None and not isinstance(expected, (list, tuple)):
        return f"Please {_form(expected)}."
    return ""
