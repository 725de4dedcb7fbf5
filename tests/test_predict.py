"""Predict, then see: the stepper asks for each gradient before revealing it and checks the answer."""

import pytest
import torch

import autograd_lens as al
from autograd_lens.views.steps import check_answer, question_frame, steps_for, frame


def chain_lens():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        z = (y ** 2).sum()
        z.backward()
    return lens, x


def test_every_question_is_answered_by_the_value_autograd_computed():
    lens, x = chain_lens()
    steps = steps_for(lens.passes[0])
    asked = [s for s in steps if s.question is not None]
    assert [s.kind for s in asked] == ["node", "node", "node", "grad"]
    # the last question is x.grad itself
    assert asked[-1].question.answer == tuple(x.grad.tolist()) == (18.0, -36.0)
    for step in asked:
        right, message = check_answer(step.question, str(list(step.question.answer)))
        assert right and message == f"Right: autograd computed {step.question.answer_text}."


@pytest.mark.parametrize("text, right, start", [
    ("[18, -36]", True, "Right"),
    ("18.0004, -36", True, "Right"),  # the cards print 4 significant digits
    ("18 36", False, "Not quite: autograd computed [18.0, -36.0]."),
    ("18", False, "Not quite: autograd computed"),
    ("1 2 3", False, "Not quite: that is 3 numbers, the gradient has 2."),
    ("", False, "Type a number"),
    ("I don't know", False, "Type a number"),
])
def test_answers_are_parsed_and_compared_leniently_but_not_wrongly(text, right, start):
    lens, _ = chain_lens()
    question = [s for s in steps_for(lens.passes[0]) if s.question is not None][-1].question
    result = check_answer(question, text)
    assert result[0] is right and result[1].startswith(start)


def test_one_number_stands_for_every_entry():
    a = torch.ones(3, requires_grad=True)
    with al.Lens() as lens:
        (a * 2).sum().backward()
    question = [s for s in steps_for(lens.passes[0]) if s.question is not None][-1].question
    assert check_answer(question, "2") == (True, "Right: autograd computed [2.0, 2.0, 2.0].")


def test_the_live_stepper_asks_and_records_answers_for_the_browser():
    lens, _ = chain_lens()
    stepper = lens.stepper(predict=True)
    stepper.step = 1
    assert stepper.asking
    hidden = question_frame(stepper.view.steps, 1)
    assert hidden.edge_labels == frame(stepper.view.steps, 0).edge_labels and hidden.current == stepper.view.steps[1].node
    question = stepper.current_step.question
    assert stepper.answer("0") == (False, f"Not quite: autograd computed {question.answer_text}.")
    assert not stepper.asking and stepper.answers == {"0:1": [False, f"Not quite: autograd computed {question.answer_text}."]}
    stepper.step = 2
    stepper.reveal()
    assert not stepper.asking and stepper.answers["0:2"][1].startswith("Autograd computed")
    stepper.step = 1
    assert not stepper.asking  # answered steps stay answered
    # what the browser module receives: each question with autograd's answer, the tables withheld until the end
    import json

    data = json.loads(stepper.data)
    assert data["predict"] and data["passes"][0]["questions"][1][1] == list(question.answer)


def test_without_predict_nothing_is_asked():
    lens, _ = chain_lens()
    stepper = lens.stepper()
    stepper.step = 1
    assert not stepper.asking
    assert '"predict":false' in stepper._repr_mimebundle_()["text/html"]
    assert "questions" not in stepper.data


def test_predict_must_be_a_bool():
    lens, _ = chain_lens()
    with pytest.raises(TypeError, match="predict must be True or False"):
        lens.stepper(predict="yes")


def test_predict_display_never_raises_without_a_renderer(monkeypatch):
    from autograd_lens.views.trace_display import PredictDisplay

    lens, _ = chain_lens()
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "none")
    bundle = PredictDisplay(lens)._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"} and "Traceback" not in bundle["text/html"]
    assert "x.grad written" in bundle["text/html"]  # the steps in words instead
