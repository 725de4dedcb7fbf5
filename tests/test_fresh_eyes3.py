"""Fresh eyes on the statements the generators check least (helper-49): the classic-mistake notes (``lens.notes``),
each with a program where its condition is met and one where it is close but not met; the predict questions of the
stepper (what a node sends, what .grad holds after a write, what a hook receives and passes on), each answer compared
with what torch computes (node post-hooks and hook logs in a plain run); and the notes on small real models trained
for 3 steps (MLP with BatchNorm and Dropout, a Conv2d net, an LSTM, an Embedding + TransformerEncoderLayer; train and
eval; zero_grad both ways, after the step, or not at all), compared with the .grad torch held before each pass.

Two notes were false and are fixed here: "forgot_zero_grad" after optimizer.zero_grad(set_to_none=False) when the
previous gradient was all zeros (a dead ReLU: the zeros were "the previous pass's gradient", and the note told the user
to call the zero_grad they had called), and "old_model_hook" ("no backward pass here went through that module") for a
module hook registered after the forward, when the pass wrote the module's parameters' .grad (now "late_module_hook").
A module with no parameter gradient (nothing recorded tells the two apart) was left as a strict xfail; helper-52 made
the note say the lens cannot tell (tests/test_fresh_eyes4.py)."""

from __future__ import annotations

import re

import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from programs import _nodes  # every backward function of a graph, once
from autograd_lens.model import NodeRun
from autograd_lens.views.steps import hook_totals, steps_for

W = torch.tensor([1.0, 3.0])


def run(program):
    """``program()`` under a Lens (its own error is kept, as a cell's is shown): (lens, what it returned or the error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lens = al.Lens()
        try:
            with lens:
                out = program()
        except (RuntimeError, TypeError) as error:
            out = error
    return lens, out


def notes(lens, code):
    return [note for note in lens.notes if note.code == code]


# --- 1. each note: met, and close but not met ----------------------------------------------------------------------

def hooked_y(use):
    def program():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 2
        calls = []
        y.register_hook(lambda g: calls.append(g.clone()))
        use(y).sum().backward()
        return calls
    return program


USES = {  # how y is used: (number of uses the note should say, or None for no note)
    "once": (lambda y: y * W, None),
    "a view of it once": (lambda y: y.view(2) * W, None),
    "twice, one use not in the loss": (lambda y: (y * W, y.exp())[0], None),
    "twice, one through detach": (lambda y: y * W + y.detach(), None),
    "y * y": (lambda y: y * y, "2 times by one operation"),
    "by two operations": (lambda y: y * W + y.sin(), "by 2 operations"),
}


@pytest.mark.parametrize("how", list(USES))
def test_used_several_times_only_when_torch_summed_the_uses_before_one_hook_call(how):
    use, words = USES[how]
    lens, calls = run(hooked_y(use))
    assert len(calls) == 1  # torch: the hook fired once, whatever the uses
    found = notes(lens, "used_several_times")
    if words is None:
        assert found == []
    else:
        assert len(found) == 1 and f"y is used {words}, yet its hook fired once" in found[0].message


def test_used_several_times_not_said_for_outputs_of_one_split():
    def program():
        x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        a, b = (x * 1).split(2)
        calls = []
        a.register_hook(lambda g: calls.append(1))
        ((a * 2).sum() + (b * 3).sum() + b.sum()).backward()  # b used twice, a once
        return calls
    lens, calls = run(program)
    assert calls == [1] and notes(lens, "used_several_times") == []


def edits(hook, node_pre=False):
    def program():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 2
        (y.grad_fn.register_prehook if node_pre else y.register_hook)(hook)
        (y * W).sum().backward()
        return x.grad.clone()
    return program


def _mul_none(g):
    g.mul_(2)


def _pre_mul_none(grads):
    grads[0].mul_(2)


@pytest.mark.parametrize("hook, node_pre, factor, words", [
    (lambda g: g * 2, False, 2, None),
    (lambda g: g.clone().mul_(2), False, 2, None),  # edits its own copy in place: not the gradient it received
    (lambda g: torch.zeros_like(g), False, 0, None),
    (_mul_none, False, 2, "edited its gradient in place instead of returning a new one"),
    (lambda g: g.mul_(2), False, 2, "(the tensor it received changed, whatever it returned)"),
    (_pre_mul_none, True, 2, "edited its gradient in place instead of returning a new one"),
], ids=["returns g*2", "clone then mul_", "zeros_like", "mul_ returns None", "returns g.mul_(2)", "node pre-hook mul_"])
def test_inplace_hook_edit_only_for_an_edit_of_the_received_gradient(hook, node_pre, factor, words):
    lens, grad = run(edits(hook, node_pre))
    assert torch.equal(grad, W * 2 * factor)  # torch: x.grad (the hook's effect, whichever way it was made)
    found = notes(lens, "inplace_hook_edit")
    assert (found == []) if words is None else (len(found) == 1 and words in found[0].message)


@pytest.mark.parametrize("retain, saved", [(True, True), (False, True), (False, False)])
def test_freed_graph_only_when_torch_refused_the_second_backward(retain, saved):
    def program():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = (x.exp() if saved else x * 2).sum()
        y.backward(retain_graph=retain)
        y.backward()
        return x.grad.clone()
    lens, out = run(program)
    refused = isinstance(out, RuntimeError) and "second time" in str(out)
    assert refused == (not retain)  # torch refuses the second pass through a freed graph, saved tensors or not
    assert bool(notes(lens, "freed_graph")) == refused


@pytest.mark.parametrize("returns, words", [
    (lambda g: g.sum(), "a tensor of another shape"), (lambda g: g.double(), "a tensor of another dtype or device"),
    (lambda g: 3.0, "a float instead of a tensor"), (lambda g: torch.zeros_like(g), None), (lambda g: None, None)])
def test_bad_hook_return_only_when_torch_refused_what_the_hook_returned(returns, words):
    lens, out = run(edits(returns))
    assert isinstance(out, (RuntimeError, TypeError)) == (words is not None)
    found = notes(lens, "bad_hook_return")
    assert (found == []) if words is None else (len(found) == 1 and f"A hook returned {words}:" in found[0].message)


def test_nonleaf_grad_only_when_a_non_leaf_grad_is_read_without_retain_grad():
    def read(retain):
        def program():
            x = torch.tensor([1.0, 2.0], requires_grad=True)
            y = x * 2
            if retain:
                y.retain_grad()
            (y * W).sum().backward()
            return y.grad, x.grad
        return program
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with al.Lens() as lens:
            y_grad, _ = read(False)()
    assert y_grad is None and len(notes(lens, "nonleaf_grad")) == 1
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with al.Lens() as lens:
            y_grad, x_grad = read(True)()
    assert torch.equal(y_grad, W) and torch.equal(x_grad, 2 * W) and notes(lens, "nonleaf_grad") == []


@pytest.mark.parametrize("make, op", [
    (lambda: torch.randn(2, requires_grad=True) * 10, "MulBackward0"),
    (lambda: torch.randn(2, requires_grad=True).clone(), "CloneBackward0"),
    (lambda: (torch.randn(2) * 10).requires_grad_(), None)])
def test_not_a_leaf_only_for_a_result_of_an_unnamed_leaf(make, op):
    def program():
        x = make()
        x.register_hook(lambda g: None)
        (x * W).sum().backward()
        return x
    lens, x = run(program)
    assert x.is_leaf == (op is None)
    found = notes(lens, "not_a_leaf")
    assert (found == []) if op is None else (len(found) == 1 and f"x is not a leaf: it was computed ({op})"
                                             in found[0].message)


def test_not_a_leaf_not_said_when_the_base_has_a_name():
    def program():
        base = torch.randn(2, requires_grad=True)
        x = base * 10
        x.register_hook(lambda g: None)
        (x * W).sum().backward()
    lens, _ = run(program)
    assert notes(lens, "not_a_leaf") == []


@pytest.mark.parametrize("legacy", [True, False])
def test_legacy_hook_only_for_register_backward_hook(legacy):
    def program():
        lin = nn.Linear(2, 2)
        (lin.register_backward_hook if legacy else lin.register_full_backward_hook)(lambda m, gi, go: None)
        lin(torch.ones(1, 2, requires_grad=True)).sum().backward()
    lens, _ = run(program)
    assert len(notes(lens, "legacy_hook")) == (1 if legacy else 0)


@pytest.mark.parametrize("then, refused", [(lambda y: torch.relu_(y), True), (lambda y: torch.relu(y), False),
                                           (lambda y: torch.relu_(y.clone()), False)])
def test_full_hook_then_inplace_only_when_torch_refused_it(then, refused):
    def program():
        lin = nn.Linear(2, 2)
        lin.register_full_backward_hook(lambda m, gi, go: None)
        then(lin(torch.ones(1, 2, requires_grad=True))).sum().backward()
    lens, out = run(program)
    assert isinstance(out, RuntimeError) == refused
    assert len(notes(lens, "full_hook_then_inplace")) == (1 if refused else 0)


# forgot_zero_grad: the note says .grad held the previous pass's gradient when this pass added to it

def _train(zero, loss_of, steps=2):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    opt = torch.optim.SGD([x], lr=0.1)
    held = []
    for _ in range(steps):
        zero(x, opt)
        held.append(None if x.grad is None else x.grad.clone())
        loss_of(x).sum().backward()
        opt.step()
    return held


ZEROS = {
    "zero_grad": (lambda x, opt: opt.zero_grad(), False),
    "zero_grad(set_to_none=False)": (lambda x, opt: opt.zero_grad(set_to_none=False), False),
    "x.grad.zero_()": (lambda x, opt: x.grad is not None and x.grad.zero_(), False),
    "x.grad.mul_(0.5)": (lambda x, opt: x.grad is not None and x.grad.mul_(0.5), False),
    "nothing": (lambda x, opt: None, True),
}


@pytest.mark.parametrize("zero", list(ZEROS))
def test_forgot_zero_grad_only_when_grad_held_the_previous_gradient(zero):
    how, said = ZEROS[zero]
    lens, held = run(lambda: _train(how, lambda x: x * W))
    assert (held[1] is not None and torch.equal(held[1], W)) == said  # torch: what .grad held before pass 2
    found = notes(lens, "forgot_zero_grad")
    assert (found == []) if not said else (len(found) == 1 and found[0].pass_index == 1
                                           and found[0].message.startswith("x.grad already held the previous pass's"))


# Was false: with zero_grad(set_to_none=False) and a previous gradient of zeros (x * 0, a dead ReLU), .grad held zeros
# equal to the previous gradient and the note said "already held the previous pass's gradient ... call
# optimizer.zero_grad()": the user had called it, and adding to zeros changes nothing. Fixed in capture/build.py: a
# .grad of zeros is no refill.
@pytest.mark.parametrize("zero", ["zero_grad(set_to_none=False)", "nothing"])
def test_no_forgot_zero_grad_when_the_grad_held_was_zeros(zero):
    lens, held = run(lambda: _train(ZEROS[zero][0], lambda x: x * 0))
    assert torch.equal(held[1], torch.zeros(2))
    assert notes(lens, "forgot_zero_grad") == []


def test_no_forgot_zero_grad_for_a_dead_relu_layer_after_zero_grad():
    torch.manual_seed(0)
    lin, head = nn.Linear(2, 2), nn.Linear(2, 1)
    with torch.no_grad():
        lin.bias.fill_(-100.0)
    opt = torch.optim.SGD([*lin.parameters(), *head.parameters()], lr=0.1)
    held = []
    with al.Lens() as lens:
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            held.append([p.grad.clone() if p.grad is not None else None for p in (lin.weight, head.weight)])
            head(torch.relu(lin(torch.ones(1, 2)))).sum().backward()
            opt.step()
    assert all(torch.equal(g, torch.zeros_like(g)) for g in held[1])
    assert notes(lens, "forgot_zero_grad") == []


# old_model_hook: "no backward pass here went through that module". Was false for a hook registered after the forward
# (the pass wrote lin.weight.grad: it went through the module; torch attaches module backward hooks in the forward).
# Now "late_module_hook", said only when a pass wrote the module's parameters' .grad (capture/tracer.py).

def test_a_module_hook_registered_after_the_forward_is_not_said_to_be_on_a_module_no_pass_went_through():
    torch.manual_seed(0)
    lin = nn.Linear(2, 2)
    fired = []
    with al.Lens() as lens:
        y = lin(torch.ones(1, 2))
        lin.register_full_backward_hook(lambda m, gi, go: fired.append(1))
        y.sum().backward()
    assert fired == [] and lin.weight.grad is not None  # torch: no call, and the pass went through lin
    assert notes(lens, "old_model_hook") == []
    (found,) = notes(lens, "late_module_hook")
    assert "The backward hook on lin never fired, though a backward pass here wrote the .grad of its parameters" \
        in found.message


def test_old_model_hook_still_said_for_another_copy_and_for_an_output_not_in_the_loss():
    import copy
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    old = copy.deepcopy(model)
    with al.Lens() as lens:
        model.register_full_backward_hook(lambda m, gi, go: None)
        old(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is None and [n.code for n in lens.notes] == ["old_model_hook"]
    other = nn.Linear(2, 2)
    with al.Lens() as lens:
        model.register_full_backward_hook(lambda m, gi, go: None)
        model(torch.ones(1, 2))
        other(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is None and [n.code for n in lens.notes] == ["old_model_hook"]


def test_late_module_hook_in_a_lens_cell(shell):
    shell.run_cell("import torch.nn as nn", store_history=False)
    cell = ("torch.manual_seed(0)\nlin = nn.Linear(2, 2)\ny = lin(torch.ones(1, 2))\n"
            "h = lin.register_full_backward_hook(lambda m, gi, go: print('fired'))\ny.sum().backward()\n")
    result = shell.run_cell("%%lens --no-show\n" + cell, store_history=False)
    assert result.success, result.error_in_exec
    assert [n.code for n in shell.user_ns["_lens"].notes] == ["late_module_hook"]


# Was false (helper-52 fixed it): now "unsure_module_hook", which says the lens cannot tell (tests/test_fresh_eyes4.py).
def test_a_late_hook_on_a_frozen_module_is_not_said_to_be_on_a_module_no_pass_went_through():
    lin = nn.Linear(2, 2).requires_grad_(False)
    x = torch.ones(1, 2, requires_grad=True)
    fired = []
    with al.Lens() as lens:
        y = lin(x)
        lin.register_full_backward_hook(lambda m, gi, go: fired.append(1))
        y.sum().backward()
    assert fired == [] and x.grad is not None  # the pass went through lin to reach x
    assert not any("no backward pass here went through that module" in n.message for n in lens.notes)


# --- 2. predict questions: every answer is what torch computed ------------------------------------------------------

def _truth(program):
    """Per backward function run (AccumulateGrad aside), in order: (name, what it sends: each slot, and the sum of
    the slots going to one function), from node post-hooks registered after the program's own; and each leaf's .grad."""
    torch.manual_seed(0)
    root, leaves = program()
    runs = []
    for fn in _nodes(root):
        if type(fn).__name__ == "AccumulateGrad":
            continue

        def post(grad_inputs, grad_outputs, fn=fn):
            groups: dict = {}
            for slot, (next_fn, _) in enumerate(fn.next_functions):
                if next_fn is not None and grad_inputs[slot] is not None:
                    groups.setdefault(id(next_fn), []).append(grad_inputs[slot].detach().clone())
            sent = [sum(g[1:], g[0]) for g in groups.values() if len({part.shape for part in g}) == 1]
            runs.append((fn.name(), sent + [part for g in groups.values() for part in g]))
        fn.register_hook(post)
    root.backward()
    return runs, {name: leaf.grad.clone() for name, leaf in leaves.items()}


def _hook_log(program):
    """What each Python hook of the program received and passed on, in a plain run (the program's hooks log it)."""
    torch.manual_seed(0)
    root, leaves = program()
    root.backward()
    return leaves["log"]


def q_mul_exp():
    x, w = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([0.5, -1.0], requires_grad=True)
    y = x * w
    return (y.exp() + y * y).sum(), {"x": x, "w": w}


def q_matmul():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    return ((x @ x.t() + 1).tanh().mean(0) * W).sum(), {"x": x}


def q_broadcast_split_cat():
    x, b = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor(2.0, requires_grad=True)
    a, c = (x + b).split([1, 2])
    return a.sum() * 3 + (c ** 2).sum() + torch.cat([a, c]).sum(), {"x": x, "b": b}


def q_inplace():
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = x.clone()
    y.relu_()
    z = y * x
    z[0] = z[0] * 2
    return (z * torch.tensor([1.0, 3.0, 5.0])).sum(), {"x": x}


def q_linear():
    lin = nn.Linear(2, 2)
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    return (torch.sigmoid(lin(x)) * W).sum(), {"x": x, "weight": lin.weight, "bias": lin.bias}


def q_stack():
    x, w = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)
    return (torch.stack([x, w, x * w]).sum(0) ** 2).sum(), {"x": x, "w": w}


def q_hooks():
    x, w = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, -1.0], requires_grad=True)
    log = []

    def logged(fn):
        def hook(g):
            out = fn(g)
            log.append((g.clone(), (g if out is None else out).clone()))
            return out
        return hook
    y = x * w
    y.register_hook(logged(lambda g: g * 3))
    y.register_hook(logged(lambda g: None))
    z = y * y + y.sin()
    x.register_hook(logged(lambda g: g + 1))
    return (z * W).sum(), {"x": x, "w": w, "log": log}


def q_node_prehook():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y.grad_fn.register_prehook(lambda go: (go[0] + 1,))
    return (y * W).sum(), {"x": x}


QUESTION_PROGRAMS = [q_mul_exp, q_matmul, q_broadcast_split_cat, q_inplace, q_linear, q_stack, q_hooks, q_node_prehook]


def _close(answer, value):
    return value.numel() == len(answer) and torch.allclose(value.reshape(-1).double(), torch.tensor(answer).double(),
                                                            atol=1e-6)


@pytest.mark.parametrize("program", QUESTION_PROGRAMS, ids=[p.__name__ for p in QUESTION_PROGRAMS])
def test_predict_answers_are_what_torch_computed(program):
    runs, grads = _truth(lambda: (lambda out: (out[0], {k: v for k, v in out[1].items() if k != "log"}))(program()))
    torch.manual_seed(0)
    with al.Lens() as lens:
        root, leaves = program()
        root.backward()
    (backward_pass,) = lens.passes
    steps = steps_for(backward_pass, hook_totals(lens.passes))
    node_runs = [e for e in backward_pass.events if isinstance(e, NodeRun)]
    assert [e.name for e in node_runs if e.name != "AccumulateGrad"] == [name for name, _ in runs]
    asked = 0
    for step, event in zip([s for s in steps if s.kind == "node"], node_runs):
        if step.question is not None and event.name != "AccumulateGrad":
            asked += 1
            _, sent = runs[[e for e in node_runs if e.name != "AccumulateGrad"].index(event)]
            assert any(_close(step.question.answer, value) for value in sent), (step.title, step.question.answer)
    for step in steps:
        if step.kind == "grad" and step.question is not None:
            asked += 1
            name = next(n for n in grads if f"['{n}']" in step.question.title)
            assert _close(step.question.answer, grads[name]), (name, step.question.answer)
    hook_questions = [s.question for s in steps if s.kind == "hook" and s.question is not None]
    if "log" in leaves:
        log = _hook_log(program)
        assert len(hook_questions) == len(log)
        for question, (received, passed) in zip(hook_questions, log):
            asked += 1
            assert _close(question.parts[0].answer, received) and _close(question.parts[1].answer, passed)
    assert asked >= 3


def test_a_node_question_under_a_node_post_hook_asks_what_the_backward_function_computed():
    def program():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 2
        y.grad_fn.register_hook(lambda gi, go: (gi[0] * 10, None))
        return (y * W).sum(), x
    with al.Lens() as lens:
        root, x = program()
        root.backward()
    assert torch.equal(x.grad, W * 20)  # torch: the post-hook's return reached x
    (question,) = [s.question for s in steps_for(lens.passes[0]) if s.kind == "node" and s.question
                   and "before the hooks on this node change it" in s.question.prompt]
    assert question.answer == (2.0, 6.0)  # what MulBackward0 computed: 2 * [1, 3]
    (hook,) = [s.question for s in steps_for(lens.passes[0]) if s.kind == "hook"]
    assert [part.answer for part in hook.parts] == [(2.0, 6.0), (20.0, 60.0)]


# --- 3. small real models, 3 training steps: every note is true of the program --------------------------------------

def _models():
    torch.manual_seed(0)
    yield "mlp", nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1)), \
        lambda: torch.randn(6, 4)
    yield "conv", nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(32, 1)), \
        lambda: torch.randn(3, 1, 6, 6)

    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])
    yield "lstm", LSTMNet(), lambda: torch.randn(2, 5, 3)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)).mean(1))
    yield "transformer", Encoder(), lambda: torch.randint(0, 10, (2, 4))


MODEL_CASES = [(name, train, zero) for name in ("mlp", "conv", "lstm", "transformer") for train in (True, False)
               for zero in ("zero_grad", "zero_grad(set_to_none=False)", "after step", "nothing")]


@pytest.mark.parametrize("name, train, zero", MODEL_CASES)
def test_notes_on_a_small_model_training_loop_are_true(name, train, zero):
    model, data = next((m, d) for n, m, d in _models() if n == name)
    model.train(train)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    named = dict(model.named_parameters())
    held = []  # per pass: parameters whose .grad held a nonzero gradient of the previous pass when it began
    with al.Lens() as lens:
        first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.LSTM, nn.Embedding)))
        handles = [first.register_full_backward_hook(lambda m, gi, go: None),
                   next(model.parameters()).register_hook(lambda g: g * 0.5)]
        for step in range(3):
            torch.manual_seed(step)
            x = data()
            if zero == "zero_grad":
                opt.zero_grad()
            elif zero == "zero_grad(set_to_none=False)":
                opt.zero_grad(set_to_none=False)
            held.append({n for n, p in named.items() if p.grad is not None and bool(p.grad.any())})
            ((model(x) - torch.randn(x.shape[0], 1)) ** 2).mean().backward()
            opt.step()
            if zero == "after step":
                opt.zero_grad()
        for handle in handles:
            handle.remove()
    found = notes(lens, "forgot_zero_grad")
    assert [n.code for n in lens.notes if n.code != "forgot_zero_grad"] == []
    assert [n.pass_index for n in found] == [i for i in range(3) if held[i]]
    for note in found:
        listed = re.sub(r" and \d+ more$", "", note.message.split(" already held")[0])  # past 4: 3 and a count
        said = {part.strip().removesuffix(".grad") for part in listed.split(",")}
        assert {s.split(".", 1)[1] if s.startswith("model.") else s for s in said} <= held[note.pass_index]
        more = re.search(r" and (\d+) more$", note.message.split(" already held")[0])
        assert len(said) + (int(more.group(1)) if more else 0) == len(held[note.pass_index])


# --- 4. a hook card's "It is the only hook that changed anything in this pass, so it is why ..." --------------------
# Was false: pass 1 has a hook doubling x's gradient (removed after it), pass 2 one multiplying w's by 10. The card of
# pass 2's hook said "so it is why this pass adds [3.0, 4.0] to x.grad instead of [3.0, 4.0], this pass adds [10.0,
# 20.0] to w.grad instead of [1.0, 2.0]": torch adds [3, 4] to x.grad in pass 2 with or without that hook (x.grad
# differs from its value without hooks by what pass 1's hook did). Fixed in views/hook_cards.py: a leaf to which this
# pass added what it adds without hooks is not credited to the hook.

def test_the_only_hook_credit_names_only_what_this_pass_changed():
    x, w = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)
    with al.Lens() as lens:
        handle = x.register_hook(lambda g: g * 2)
        (x * w).sum().backward()
        handle.remove()
        handle = w.register_hook(lambda g: g * 10)
        (x * w).sum().backward()
        handle.remove()
    x2, w2 = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)
    (x2 * w2).sum().backward()  # pass 2 without its hook: what each leaf gets
    assert torch.equal(x2.grad, torch.tensor([3.0, 4.0])) and torch.equal(w2.grad, torch.tensor([1.0, 2.0]))
    assert torch.equal(x.grad, torch.tensor([9.0, 12.0])) and torch.equal(w.grad, torch.tensor([11.0, 22.0]))
    totals = hook_totals(lens.passes)
    (card,) = [s.note for s in steps_for(lens.passes[1], totals) if s.kind == "hook"]
    assert card.endswith("It is the only hook that changed anything in this pass, so it is why this pass adds "
                         "[10.0, 20.0] to w.grad instead of [1.0, 2.0].")
    (card,) = [s.note for s in steps_for(lens.passes[0], totals) if s.kind == "hook"]
    assert card.endswith("so it is why x ends with [6.0, 8.0] instead of [3.0, 4.0].")


def test_no_credit_when_this_pass_changed_nothing_that_reached_a_leaf():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        handle = x.register_hook(lambda g: g * 2)
        (x * W).sum().backward()
        handle.remove()
        y = x * 1.0
        y.register_hook(lambda g: g * 1.0 + 0.0)  # returns equal values: changes nothing
        (y * W).sum().backward()
    cards = [s.note for s in steps_for(lens.passes[1], hook_totals(lens.passes)) if s.kind == "hook"]
    assert not any("so it is why" in card for card in cards)


# --- 5. "call i of n" of a hook registered in a training loop's body -------------------------------------------------
# Was false: `for i in range(2): x.register_hook(lambda g: ...); (x * x).sum().backward()` registers two hooks of one
# code on x; torch runs the first in both passes and the second in pass 2. The lens showed three hooks, each "call 1
# of 1": in pass 2 two hooks of one code ran on x, so which function ran was not known, and the count was keyed by the
# function id too (known in pass 1, None in pass 2), although the handle's id names the registration. Fixed in
# capture/counting.py: a call keyed by its handle's id is not keyed by its function as well.

def _loop(x, log, make_y):
    for i in range(2):
        x.register_hook(lambda g, i=i: log.append(i))
        y = make_y(x)
        (y * y).sum().backward(retain_graph=True)


@pytest.mark.parametrize("make_y", [lambda x: x, lambda x: x * 2], ids=["on the leaf", "leaf used through x*2"])
def test_call_i_of_n_of_hooks_registered_in_a_loop_body(make_y):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    log = []
    _loop(x, log, make_y)
    assert log == [0, 0, 1]  # torch: hook 0 in both passes, hook 1 in the second
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    log = []
    with al.Lens() as lens:
        _loop(x, log, make_y)
    assert log == [0, 0, 1]
    assert [(c.pass_index, c.registration, c.invocation) for c in lens.hook_calls] == [(0, 1, 1), (1, 1, 2), (1, 2, 1)]
    titles = [s.title for p in lens.passes for s in steps_for(p, hook_totals(lens.passes)) if s.kind == "hook"]
    assert [t.split("(tensor hook, ")[1] for t in titles] == [
        "call 1 of 2 in this recording)", "call 2 of 2 in this recording)", "call 1 of 1 in this recording)"]


def test_call_i_of_n_of_hooks_registered_in_a_loop_body_on_a_non_leaf():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    log = []
    with al.Lens() as lens:
        for i in range(2):
            y.register_hook(lambda g, i=i: log.append(i))
            (y * y).sum().backward(retain_graph=True)
    assert log == [0, 0, 1]
    assert [(c.pass_index, c.registration, c.invocation) for c in lens.hook_calls] == [(0, 1, 1), (1, 1, 2), (1, 2, 1)]
