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
    assert stepper.current_frame == hidden  # the drawing holds nothing of the answer while it is asked
    assert stepper.answer("0") == (False, f"Not quite: autograd computed {question.answer_text}. Why: {question.rule}")
    assert not stepper.asking and stepper.answers == {"0:1": [False, f"Not quite: autograd computed {question.answer_text}."]}
    assert stepper.current_frame == frame(stepper.view.steps, 1)
    stepper.step = 2
    stepper.reveal()
    assert not stepper.asking and stepper.answers["0:2"][1].startswith("Autograd computed")
    stepper.step = 1
    assert not stepper.asking  # answered steps stay answered
    # what the browser module receives: each question with autograd's answer, the tables withheld until the end
    import json

    data = json.loads(stepper.data)
    assert data["predict"] and data["passes"][0]["questions"][1][1] == [[list(question.answer), question.answer_text,
                                                                         "your answer"]]
    assert data["passes"][0]["questions"][1][2] == question.rule


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


# ----------------------------------------------------------------------------- nothing given away, every answer torch's


import html as html_module
import re

from autograd_lens.views.passview import PassView
from autograd_lens.views.static_html import stepper_fragment
from autograd_lens.views.steps import check_answers, question_html


def halve(g):
    return g * 0.5


def square(hooked=True):
    x = torch.tensor(3.0, requires_grad=True)
    y = x * x
    y.backward()
    return {"x": x}


def branches(hooked=True):
    x = torch.tensor(2.0, requires_grad=True)
    y = x ** 2
    if hooked:
        y.register_hook(halve)
    z, w = y * 3, y * 2
    (z + w).backward()
    return {"x": x}


def two_passes(hooked=True):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = x * 3
    if hooked:
        y.register_hook(lambda g: g + 1)
    out = (y * y).sum()
    out.backward(retain_graph=True)
    out.backward()
    return {"x": x}


def broadcast(hooked=True):
    w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    b = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    ((w + b) * torch.tensor([[1.0], [2.0]])).sum().backward()
    return {"w": w, "b": b}


def post_accumulate(hooked=True):
    x = torch.tensor(2.0, requires_grad=True)
    if hooked:
        x.register_post_accumulate_grad_hook(lambda p: p.grad.mul_(0.5) and None)
    (x * 3).backward()
    return {"x": x}


PROGRAMS = [square, branches, two_passes, broadcast, post_accumulate]


def recorded(program):
    with al.Lens() as lens:
        leaves = program()
    return lens, leaves


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_no_answer_shows_before_it_is_given(program):
    """While a step's question is open, its title, card lines, arrow labels and .grad texts are not shown: the
    card is the question alone, and the drawing is the one of the step before."""
    lens, _ = recorded(program)
    for backward_pass in lens.passes:
        view = PassView(backward_pass)
        steps = view.steps
        asked = [s for s in steps if s.question is not None]
        assert asked
        for step in asked:
            question = step.question
            shown = html_module.unescape(question_html(step, len(steps)))
            for part in question.parts:
                assert part.answer_text not in (question.title or step.title), step.title
            for line in step.lines:
                assert line not in shown, (line, shown)
            if step.kind == "grad":
                assert step.title not in shown and "brings" not in question.prompt
            hidden = question_frame(steps, step.index)
            before = frame(steps, step.index - 1)
            assert hidden.edge_labels == before.edge_labels and hidden.grads == before.grads
        assert any(s.kind == "hook" for s in asked) or not backward_pass.hook_calls


def answers(lens, pass_index=0):
    return {s.title: s.question for s in steps_for(lens.passes[pass_index]) if s.question is not None}


def test_a_tensor_used_twice_in_one_mul_is_asked_for_the_sum_torch_computes():
    lens, leaves = recorded(square)
    plain = square(False)["x"]
    questions = answers(lens)
    mul = questions["mul → y (MulBackward0) runs"]
    assert "x is 2 of its inputs" in mul.prompt
    assert mul.answer == (plain.grad.item(),) == (6.0,)  # what autograd sends x in all, not one slot's 3.0
    assert "the engine adds the parts" in mul.rule
    assert questions["x.grad written: 6.0"].answer == (plain.grad.item(),)


def test_a_hook_is_asked_what_it_receives_and_what_flows_on():
    lens, leaves = recorded(branches)
    x = torch.tensor(2.0, requires_grad=True)
    y = x ** 2
    received = torch.autograd.grad(y * 3 + y * 2, y, retain_graph=True)[0]  # what reaches y, summed over its uses
    hook = [q for title, q in answers(lens).items() if title.startswith("hook halve on y")][0]
    assert [part.label for part in hook.parts] == ["what it receives", "what flows on after it"]
    assert hook.parts[0].answer == (received.item(),) == (5.0,)
    assert hook.parts[1].answer == (halve(received).item(),)
    assert "two paths add, 2.0 + 3.0 = 5.0" in hook.parts[0].rule
    assert "The hook's return replaces the gradient" in hook.parts[1].rule
    assert answers(lens)["x.grad written: 10.0"].answer == (leaves["x"].grad.item(),)
    assert check_answers(hook, ["5", "2.5"]) == (True, "what it receives: Right: autograd computed 5.0. what flows "
                                                       "on after it: Right: autograd computed 2.5.")
    assert check_answers(hook, "5; 5")[0] is False


def test_the_second_pass_is_asked_for_grad_accumulated_over_both():
    lens, leaves = recorded(two_passes)
    plain = two_passes(hooked=True)["x"]  # the same program without a lens
    (grad,) = [q for title, q in answers(lens, 1).items() if title.startswith("x.grad written")]
    first = lens.passes[0].leaf_grads["x"]
    assert grad.answer == tuple(plain.grad.tolist()) == tuple(leaves["x"].grad.tolist())
    assert f"x.grad held {al.format_value(first)}" in grad.prompt
    assert f"backward() adds it to what .grad held: {al.format_value(first)} + " in grad.rule


def test_broadcasting_and_a_post_accumulate_hook_are_asked_for_torchs_values():
    lens, leaves = recorded(broadcast)
    w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    expected = torch.autograd.grad(((w + b) * torch.tensor([[1.0], [2.0]])).sum(), b)[0]
    add = [q for title, q in answers(lens).items() if title.startswith("add")][0]
    assert "What does w receive?" in add.prompt  # the first input; b's value is on the card after it
    (b_grad,) = [q for title, q in answers(lens).items() if title.startswith("b.grad written")]
    assert b_grad.answer == tuple(expected.tolist()) == tuple(leaves["b"].grad.tolist()) == (3.0, 3.0, 3.0)
    lens, leaves = recorded(post_accumulate)
    (after,) = [q for title, q in answers(lens).items() if title.startswith("hook <lambda> on x")]
    assert after.answer == (leaves["x"].grad.item(),) == (1.5,)
    assert "3.0 became 1.5" in after.rule


def test_the_widget_and_the_page_explain_the_rule_with_the_verdict():
    lens, _ = recorded(branches)
    stepper = lens.stepper(predict=True)
    hook = next(s for s in stepper.view.steps if s.kind == "hook")
    stepper.step = hook.index
    assert stepper.asking
    right, message = stepper.answer(["5", "5"])
    assert not right and message.startswith("what it receives: Right: autograd computed 5.0. what flows on after it: "
                                            "Not quite: autograd computed 2.5. Why: A tensor hook fires once per pass")
    import json

    data = json.loads(stepper.data)["passes"][0]["questions"][hook.index]
    assert data[1] == [[[5.0], "5.0", "what it receives"], [[2.5], "2.5", "what flows on after it"]]
    assert "two paths add" in data[2] and data[0].count('class="al-answer"') == 2


def test_with_scripts_off_predict_mode_keeps_the_answers_behind_a_click():
    lens, _ = recorded(branches)
    page = stepper_fragment([PassView(p) for p in lens.passes], predict=True)
    outside = re.sub(r"<details>.*?</details>|<script.*?</script>", "", page, flags=re.S)
    assert "x.grad written" not in outside and "grad if no hook had run" not in outside and "<img" not in outside
    assert "x.grad written: 10.0" in re.search(r"<details>.*?</details>", page, re.S).group(0)
    from autograd_lens.views.trace_display import pass_html

    listed = pass_html(lens.passes[0], predict=True)
    assert "x.grad written: 10.0" not in re.sub(r"<details>.*?</details>", "", listed, flags=re.S)


def test_predict_mode_draws_no_debugging_mark_that_would_tell_an_answer():
    """'⚠ inf starts here' on the drawing would tell what log sends before the student answers; the same pass
    without predict mode has the mark."""
    from autograd_lens.views.passview import views_for
    from autograd_lens.views.static_html import stepper_fragment

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        (torch.log(x) * 2).sum().backward()
    assert torch.isinf(x.grad[0])  # the truth: log's gradient at 0 is inf
    (shown,) = views_for(lens.passes)
    (asked,) = views_for(lens.passes, predict=True)
    assert "starts here" in shown.svg and "starts here" not in asked.svg
    assert "marktitles" in shown.data() and "marktitles" not in asked.data(predict=True)
    page = stepper_fragment([asked], predict=True)
    assert "\"marktitles\":" not in page and "⚠ inf starts here" not in asked.svg
