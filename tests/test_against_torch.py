"""The differential suite: generated programs, every statement the lens makes compared with what torch did
(see ``programs.py``).  CI runs 2,000 programs; ``python tests/programs.py --programs 20000`` runs a long
campaign and prints each failure as a minimal program."""

from __future__ import annotations

import warnings

import pytest

import programs
from autograd_lens.capture import build, observe

CHUNK = 100
PROGRAMS = 2000


@pytest.mark.parametrize("start", range(0, PROGRAMS, CHUNK))
def test_generated_programs_show_only_what_torch_did(start):
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_graph=True's reference-cycle warning, legacy hooks
        for seed in range(start, start + CHUNK):
            program, problems = programs.check(seed)
            if problems:
                failures.append(programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:3])


@pytest.mark.parametrize("dtype, start", [("float64", 520000), ("complex64", 530000)])
def test_generated_programs_of_other_dtypes_show_only_what_torch_did(dtype, start):
    """float64 leaves (a float32 ``gradient=`` is cast to the root's dtype by the engine), complex64 leaves
    (torch's own convention for complex gradients; the root is a real ``abs()``)."""
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(start, start + CHUNK):
            program, problems = programs.check(seed, dtype)
            if problems:
                failures.append(programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:3])


def test_a_gradient_of_another_dtype_than_the_root_is_no_hook_call():
    """The engine casts ``gradient=`` to the root's dtype: that is no hook written in C changing it."""
    program = programs.Program([
        "torch.manual_seed(0)",
        "x0 = torch.randn((3,), dtype=torch.float64, requires_grad=True)",
        "t1 = x0 * 2.0",
        "REG(x0, 'register_hook', make_hook('h0', 'scale'))",
        "out = (t1.sum())",
        "PASS('backward', out, gradient=torch.tensor(-1.0), retain_graph=True)",
        "PASS('backward', out, gradient=torch.tensor(2.0))",
    ], ["x0"])
    assert programs.compare(program) == []


@pytest.mark.parametrize("target, method, first, second", [
    ("t2.grad_fn", "register_prehook", "make_pre('h1', 'observe')", "make_pre('h3', 'scale')"),
    ("t2.grad_fn", "register_hook", "make_post('h1', 'observe')", "make_post('h3', 'scale')"),
    ("t2", "register_hook", "CHOOK('h1', 'neg')", "CHOOK('h3', 'neg')"),  # one function object, torch.neg, twice
    ("t2.grad_fn", "register_prehook", "CHOOK('h1', 'append')", "CHOOK('h3', 'append')"),
])
def test_two_hooks_of_one_code_stay_two_hooks_after_one_is_removed(target, method, first, second):
    """Two hooks with one code on one node or tensor (closures of one factory, or one function written in C
    registered twice): after the first is removed between passes, the second's call in pass 2 is its call 2 of
    2, not the removed hook's."""
    program = programs.Program([
        "torch.manual_seed(0)",
        "x0 = torch.randn((2, 3), requires_grad=True)",
        "t2 = x0.tanh()",
        f"h1_handle = REG({target}, '{method}', {first})",
        f"h3_handle = REG({target}, '{method}', {second})",
        "out = ((t2 * 1.0).sum())",
        "PASS('backward', out, retain_graph=True)",
        "REMOVE(h1_handle)",
        "PASS('backward', out)",
    ], ["x0"])
    assert programs.compare(program) == []


CUSTOM = '''
class Two(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        return (ga * 2 if ga is not None else 0) + (gb * 3 if gb is not None else 0)

class Boxed(torch.autograd.Function):  # its grads come in one list (torch's apply_boxed), freed one by one
    boxed_grads_call = True

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grads):
        g = grads[0]
        grads[0] = None
        return g.mul_(2)

class NonDiff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        index = x.argmax().reshape(1).float()
        ctx.mark_non_differentiable(index)
        return x.exp(), index

    @staticmethod
    def backward(ctx, g, g_index):  # g_index: zeros torch made for the output that needs no gradient
        return g * 1.5
'''

# custom autograd.Functions whose backward edits what it received in place (DoubleInPlace, in programs.PRELUDE), gets
# None or zeros for an output: each was false before (an invented hook written in C, "without hooks" wrong)
CUSTOM_PROGRAMS = {
    "edits its gradient, hooks before and after it": [
        "c = DoubleInPlace.apply(x0 * 1.0)", "t = c.tanh()", "REG(c, 'register_hook', make_hook('h1', 'observe'))",
        "REG(t, 'register_hook', make_hook('h2', 'keep'))", "out = (t.sum())"],
    "edits a gradient another branch holds too": [
        "t1 = x0.sin()", "t2 = x0.tanh()", "t3 = DoubleInPlace.apply(t1)", "out = (t1.sum() + t2.sum() + t3.sum())"],
    "edits a shared gradient, no hook at all": [
        "t3 = x0.tanh()", "t4 = x0 + t3", "t7 = t4 - t3", "t8 = DoubleInPlace.apply(t3)", "out = (t7.sum() + t8.sum())"],
    "edits a shared gradient, a hook edits in place": [
        "t2 = x0.tanh()", "t3 = x0 * 2.0", "REG(t2, 'register_hook', make_hook('h1', 'inplace'))",
        "t4 = DoubleInPlace.apply(t2)", "out = (t2.sum() + t3.sum() + t4.sum())"],
    "boxed, edits its gradient": ["c = Boxed.apply(x0 * 1.0)", "t = c.tanh()",
                                  "REG(c, 'register_hook', make_hook('h1', 'observe'))", "out = (t.sum())"],
    "two outputs, one used": ["a, b = Two.apply(x0)", "REG(a, 'register_hook', make_hook('h1', 'scale'))",
                              "out = (a.sum())"],
    "an output that needs no gradient": ["e, i = NonDiff.apply(x0)", "REG(e, 'register_hook', make_hook('h1', 'scale'))",
                                         "out = (e.sum() + i.sum())"],
}


@pytest.mark.parametrize("name", list(CUSTOM_PROGRAMS))
@pytest.mark.parametrize("passes", [["PASS('backward', out)"],
                                    ["PASS('backward', out, retain_graph=True)", "PASS('grad', out, [x0])"]])
def test_custom_functions_are_shown_as_they_ran(name, passes):
    program = programs.Program(["torch.manual_seed(0)", CUSTOM, "x0 = torch.randn((3,), requires_grad=True)"]
                               + CUSTOM_PROGRAMS[name] + passes, ["x0"])
    assert programs.compare(program) == []


def test_a_custom_backward_editing_a_shared_gradient_leaves_values_without_hooks_unknown_once_a_hook_changed_one():
    """Seed 630704: a hook on t3 returns a new tensor, so DoubleInPlace's edit no longer reaches the gradient the
    other branches hold; without the hook it would have: x1 without hooks was shown as what it got with it."""
    program = programs.Program([
        "torch.manual_seed(630704)",
        "x0 = torch.randn((), requires_grad=True)",
        "x1 = torch.randn((2,), requires_grad=True)",
        "t2 = Double.apply(x1)",
        "t3 = DoubleInPlace.apply(x0)",
        "t4 = (x1 * 0.5).exp()",
        "out = (t2.sum() + t3.sum() + t4.sum())",
        "PASS('backward', out, gradient=torch.tensor(-1.0), retain_graph=True)",
        "h0_handle = REG(t3, 'register_hook', make_hook('h0', 'scale'))",
        "PASS('backward', out, retain_graph=True)",
    ], ["x0", "x1"])
    assert programs.compare(program) == []


# ----------------------------------------------------------------------------- the checker catches what it should


TWO_PASSES = programs.Program([
    "torch.manual_seed(0)",
    "x0 = torch.randn((2,), requires_grad=True)",
    "t1 = x0 * 2.0",
    "REG(t1, 'register_hook', make_hook('h0', 'scale'))",
    "out = (t1.sum())",
    "PASS('backward', out, retain_graph=True)",
    "PASS('backward', out)",
], ["x0"])

C_HOOK_AFTER_INPLACE = programs.Program([
    "torch.manual_seed(0)",
    "x0 = torch.randn((2,), requires_grad=True)",
    "t1 = x0 * 3.0",
    "REG(t1, 'register_hook', CHOOK('h0', 'neg'))",
    "t1.add_(1.0)",
    "out = (t1.sum())",
    "PASS('backward', out)",
], ["x0"])


def test_the_checker_passes_a_program_the_lens_shows_truly():
    assert programs.compare(TWO_PASSES) == [] and programs.compare(C_HOOK_AFTER_INPLACE) == []


def test_the_checker_sees_a_wrong_call_count(monkeypatch):
    monkeypatch.setattr(build.HookCounter, "count", lambda self, call, ordinal: (1, 1))
    assert any("call 1 shown, it was call 2" in problem for problem in programs.compare(TWO_PASSES))


def test_the_checker_sees_a_missing_call_and_a_wrong_value_without_hooks(monkeypatch):
    """The lens made blind to hooks written in C (neither found from the values around them nor put in their place
    as registered): the checker must see the call it no longer shows.  (Patching ``_unexplained`` alone passed only
    in this file's order: run alone, the lens still showed the call, put in its place from its registration.)"""
    from autograd_lens.capture import nodes

    placed = nodes.arrange_before
    monkeypatch.setattr(observe.PassObserver, "_unexplained", lambda self, fn, before, arrived, live: [])
    monkeypatch.setattr(nodes, "arrange_before", lambda observer, fn, before, arrived, then=(): [
        call for call in placed(observer, fn, before, arrived, then=then) if not call.unseen])
    problems = programs.compare(C_HOOK_AFTER_INPLACE)
    assert any("0 hook calls shown, 1 ran" in problem for problem in problems)


def test_the_checker_sees_a_wrong_value_without_hooks(monkeypatch):
    original = build._results

    def wrong(observer, history, result):
        values = original(observer, history, result)
        values["without"] = {key: None if value is None else value * 3 for key, value in values["without"].items()}
        return values

    monkeypatch.setattr(build, "_results", wrong)
    assert any("without hooks" in problem for problem in programs.compare(TWO_PASSES))


@pytest.mark.parametrize("kind", ["node", "grad", "hook"])
def test_the_checker_sees_a_wrong_predict_answer(monkeypatch, kind):
    """Predict mode's answers are statements too: each kind of question is checked against torch."""
    import dataclasses

    from autograd_lens.views import steps as steps_module

    original = steps_module.steps_for

    def wrong(backward_pass, totals=None):
        made = original(backward_pass, totals)
        return [dataclasses.replace(step, question=dataclasses.replace(
            step.question, answer=tuple(v + 1 for v in step.question.answer)))
            if step.question is not None and step.kind == kind else step for step in made]

    monkeypatch.setattr(steps_module, "steps_for", wrong)
    problems = programs.compare(TWO_PASSES)
    assert any("question" in problem and "answer" in problem for problem in problems), problems


TWO_INPUTS = programs.Program([
    "torch.manual_seed(0)",
    "x0 = torch.randn((2,), requires_grad=True)",
    "x1 = torch.randn((2,), requires_grad=True)",
    "out = ((x0 * x1).sum())",
    "PASS('backward', out)",
], ["x0", "x1"])


def test_the_checker_sees_a_node_answer_that_adds_the_wrong_slots(monkeypatch):
    """A node question's answer adds what the node sends on the slots the lens takes for one input. The checker
    groups the slots by torch's own next_functions, so a wrong grouping is seen even where the lens's answer and
    its own sum of the same slots agree (here: x0 and x1 taken for one input of mul)."""
    from autograd_lens.views import chain, operands, steps as steps_module

    assert programs.compare(TWO_INPUTS) == []

    original = operands.input_keys

    def merged(event, graph):  # every slot taken for the first one's input
        keys = original(event, graph)
        return keys[:1] * len(keys)

    for module in (operands, chain, steps_module):
        monkeypatch.setattr(module, "input_keys", merged)
    problems = programs.compare(TWO_INPUTS)
    assert any("torch sends slots [0] to that input" in problem or "torch sends slots [1] to that input" in problem
               for problem in problems), problems


def test_a_failure_prints_a_minimal_program(monkeypatch):
    monkeypatch.setattr(build.HookCounter, "count", lambda self, call, ordinal: (1, 1))
    text = programs.report(TWO_PASSES, programs.compare(TWO_PASSES))
    assert "minimal program" in text and "REG(t1, 'register_hook'" in text and "x0 = " in text


# ----------------------------------------------------------------------------- hooks removed during a pass

# Found by the generator once it removed and added hooks (a hook calling another's handle.remove() or registering
# a hook, handles removed between passes): each program is a minimal one it printed.
REMOVED = {
    # a hook in C removed by an earlier Python hook never runs: no call of it may be shown
    "C tensor hook removed before its turn": [
        "x0 = torch.randn((2, 3), requires_grad=True)",
        "x2 = torch.randn((2, 3), requires_grad=True)",
        "t3 = x0 * x0",
        "h0_handle = REG(t3, 'register_hook', CHOOK('h0', 'append'))",
        "h1_handle = REG(x2, 'register_hook', make_hook('h1', 'remove'))",
        "REMOVE_TARGETS['h1'] = [h0_handle]",
        "out = (x2.sum() + t3.sum() + x2.tanh().sum())",
        "PASS('backward', out, gradient=torch.tensor(-1.0))",
    ],
    # ... also on a backward function
    "C node post-hook removed before its node ran": [
        "x0 = torch.randn((2,), requires_grad=True)",
        "t1 = x0.tanh()",
        "h0_handle = REG(t1.grad_fn, 'register_hook', CHOOK('h0', 'append'))",
        "t5 = t1.sin()",
        "h1_handle = REG(t5, 'register_hook', (lambda g, _f=make_hook('h1', 'remove'): _f(g)))",
        "REMOVE_TARGETS['h1'] = [h0_handle]",
        "out = t5.sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    # a hook in C removed by a later hook on the same tensor ran before that: its call is shown
    "C tensor hook removed after its turn": [
        "x0 = torch.randn((3,), requires_grad=True)",
        "t1 = x0.exp()",
        "h0_handle = REG(t1, 'register_hook', CHOOK('h0', 'neg'))",
        "h1_handle = REG(t1, 'register_hook', make_hook('h1', 'remove'))",
        "REMOVE_TARGETS['h1'] = [h0_handle]",
        "out = t1.sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    # torch runs the hooks a tensor's dict holds when that tensor's hooks start: a hook in C after the one that
    # removes it still runs in this pass (not in the next), and one a hook adds to its own tensor runs from the next
    "C tensor hook removed by an earlier hook on its tensor": [
        "x0 = torch.randn((3,), requires_grad=True)",
        "t1 = x0.exp()",
        "h1_handle = REG(t1, 'register_hook', make_hook('h1', 'remove'))",
        "h0_handle = REG(t1, 'register_hook', CHOOK('h0', 'neg'))",
        "REMOVE_TARGETS['h1'] = [h0_handle]",
        "out = t1.sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    "C hook added to its own tensor by a hook": [
        "x0 = torch.randn((3,), requires_grad=True)",
        "t1 = x0.exp()",
        "t2 = t1 * t1",
        "h1_handle = REG(t1, 'register_hook', make_hook('h1', 'add'))",
        "ADD_TARGETS['h1'] = [(t1, CHOOK('h1a', 'neg'))]",
        "out = t2.sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    "hooks added to another tensor by a hook, in C and in Python": [
        "x0 = torch.randn((3,), requires_grad=True)",
        "t1 = x0.exp()",
        "t2 = t1 * 2.0",
        "h1_handle = REG(t2, 'register_hook', make_hook('h1', 'add'))",
        "ADD_TARGETS['h1'] = [(t1, CHOOK('h1a', 'append'))]",
        "h2_handle = REG(t2, 'register_hook', make_hook('h2', 'add'))",
        "ADD_TARGETS['h2'] = [(t1, make_hook('h2a', 'scale'))]",
        "out = t2.sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    # two closures of one factory on one tensor: when one removes itself, the other keeps its own count
    "factory closure removes itself": [
        "x2 = torch.randn((2,), requires_grad=True)",
        "h1_handle = REG(x2, 'register_hook', make_hook('h1', 'remove'))",
        "REMOVE_TARGETS['h1'] = [h1_handle]",
        "h2_handle = REG(x2, 'register_hook', make_hook('h2', 'inplace'))",
        "out = x2.tanh().sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    # two objects of one class: one removed by the other
    "callable object removes its twin": [
        "x0 = torch.randn((), requires_grad=True)",
        "t1 = (x0 * 0.5).exp()",
        "h0_handle = REG(t1, 'register_hook', Hooker('h0', 'inplace'))",
        "h2_handle = REG(t1, 'register_hook', Hooker('h2', 'remove'))",
        "REMOVE_TARGETS['h2'] = [h0_handle]",
        "out = (t1 * 2.0).sum()",
        "PASS('backward', out, retain_graph=True)",
        "PASS('backward', out)",
    ],
    # removed between passes, and one registered between them
    "between passes": [
        "x0 = torch.randn((3,), requires_grad=True)",
        "t1 = x0.sin()",
        "h0_handle = REG(t1, 'register_hook', make_hook('h0', 'scale'))",
        "h1_handle = REG(t1, 'register_hook', make_hook('h1', 'observe'))",
        "out = t1.sum()",
        "PASS('backward', out, retain_graph=True)",
        "REMOVE(h0_handle)",
        "h2_handle = REG(t1, 'register_hook', make_hook('h2', 'observe'))",
        "PASS('backward', out)",
    ],
}


def assert_shown_as_torch_ran(lines: list[str]) -> None:
    """A program written out (its leaves are the lines that make an ``x``): no statement of the lens is false."""
    leaves = [line.split(" =")[0] for line in lines if line.startswith("x")]
    program = programs.Program(["torch.manual_seed(0)", *lines], leaves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert programs.compare(program) == []


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_hooks_removed_or_added_during_or_between_passes_are_shown_as_torch_ran_them(name):
    assert_shown_as_torch_ran(REMOVED[name])


# autograd.grad of one output of a multi-output node: the engine runs the tensor hooks of every output of that
# node as it captures the gradient, so a hook in C on the other output runs too (found by an 8,000-program
# campaign: it was not shown)
SIBLINGS = {
    "the sibling is used": [
        "x0 = torch.randn((2, 3), requires_grad=True)",
        "t3 = x0.tanh() * 1.0",
        "t5, t5b = t3.split(2, dim=1)",
        "h1_handle = REG(t5b, 'register_hook', CHOOK('h1', 'append'))",
        "h3_handle = REG(t5b, 'register_hook', make_hook('h3', 'scale'))",
        "out = (t5.sum() + t5b.sum())",
        "PASS('grad', out, [t5], retain_graph=True)",
        "PASS('grad', out, [t5b, t5])",
    ],
    "the input itself is unused": [
        "x1 = torch.randn((2, 3), requires_grad=True)",
        "t2, t2b = x1.split(2, dim=1)",
        "h2_handle = REG(t2, 'register_hook', CHOOK('h2', 'append'))",
        "out = (t2 * 2.0).tanh().sum()",
        "PASS('grad', out, [t2b])",
    ],
}


@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_hooks_in_c_on_the_other_outputs_of_an_autograd_grad_input_node_are_shown(name):
    assert_shown_as_torch_ran(SIBLINGS[name])
