"""The course read as a careful student and a sceptical instructor (helper ``fresh21``, 2026-11-28): every statement a
notebook makes about what torch does, each exercise's answer and its "common mistakes", and the two answer checkers
(``Exercise.check`` in autograd_lens/exercises.py, the predict cards' ``check_answer`` in views/questions.py and its
mirror ``checkAnswer`` in views/stepper_base.js), each computed from plain torch 2.13 and varied (shapes, dtypes,
broadcasting, a second pass, two calls of a module side by side, hooks registered in another order) to see whether
the statement, as a student would generalise it, stays true.

Findings, each with a test that failed on main and now passes:

* notebook 2 said a tensor hook is called with "one tensor, of that tensor's shape"; a hook on the output of a
  multi-output op that the loss does not use (``split``) is called with ``None``;
* notebook 4 said ``AddBackward0`` hands the *same* tensor to both of its inputs; only when both have the sum's shape
  and dtype: with broadcasting or a ``float64`` operand each input gets its own tensor, and the in-place edit does not
  leak;
* a predict card's rule for the second of two hooks on one tensor said "one registered with prepend=True goes first";
  ``Tensor.register_hook`` has no ``prepend`` (a TypeError), only module hooks do (views/hook_cards.py);
* ``Exercise.check`` said *Not quite* to right answers: ``'pickle.UnpicklingError'`` (the name a student catches, and
  ``_pickle.UnpicklingError``, the one the traceback and the solution print), ``'float'``/``'torch.float'`` for
  ``torch.float32``, and the strings ``'False'``/``'True'`` where the prompt asks for True or False;
* a predict card said *Not quite* to ``1/4`` for a gradient of 0.25 ("that is 2 numbers"), and read ``−6`` (typed with
  the minus sign U+2212) as 6: right answers rejected, and a wrong sign accepted; and it gave every entry a slack of
  1e-3 of the *largest* |value|, so for ``x.exp()`` at ``[0, 7]`` the answer ``[0.5, 1097]`` was "Right: autograd
  computed [1.0, 1097.0]" (views/questions.py and stepper_base.js: each entry at its printed precision now);
* notebook 0 said everything computed from a leaf that requires grad is a non-leaf with a ``grad_fn``: a comparison,
  ``argmax`` or an integer cast of it is a constant leaf; and that each in-place operation bumps the version counter,
  so backward refuses an edited saved tensor: an edit through ``.data`` is not counted, and backward silently uses it;
* notebook 5 said an input that needs no gradient has ``None`` in ``grad_input``: only when no input needs one; beside
  an input that does, it gets zeros (an int64 mask: int64 zeros);
* notebook 6 said a multi-grad hook gets "the gradients of all of them": a tensor the pass does not reach gets None;
* claims 2, 4, 13, 27 and 37 have two parts in CLAIMS.md ("the error, then backward(gradient=...)", ...); the index
  named only the cell showing the first: the cells showing the second are tagged and listed now.

The other statements held under every variation tried; they stay here as tests, so that a change of torch or of the
text that makes one false fails."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import pickle
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.exercises import Exercise
from autograd_lens.views.questions import answer_numbers, check_answer, check_answers
from autograd_lens.views.steps import steps_for

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def cells(notebook: str) -> list[dict]:
    return json.loads((NOTEBOOKS / notebook).read_text())["cells"]


def markdown(notebook: str) -> str:
    """The notebook's markdown, one string, with its line breaks made spaces (sentences wrap)."""
    text = "\n\n".join("".join(cell["source"]) for cell in cells(notebook) if cell["cell_type"] == "markdown")
    return re.sub(r"(?<!\n)\n(?!\n)", " ", text)


def sentence_with(notebook: str, phrase: str) -> str:
    """The sentence (up to the next full stop followed by a space, or the paragraph's end) of the notebook's markdown
    that holds ``phrase``."""
    text = markdown(notebook)
    at = text.index(phrase)
    start = max(text.rfind(". ", 0, at), text.rfind("\n", 0, at)) + 1
    ends = [end for end in (text.find(". ", at), text.find("\n", at)) if end != -1]
    return text[start:min(ends) if ends else len(text)]


# --- 1. statements of the notebooks' markdown, against torch ------------------------------------------------------


def test_a_tensor_hook_can_be_called_with_none_and_notebook_2_says_so():
    """Notebook 2: "fn(grad) is called with the gradient of the tensor it is registered on — one tensor, of that
    tensor's shape". True for every op tried but one kind: an output of a multi-output op that the loss does not use
    gets None (split, chunk, unbind)."""
    for size, split in ((4, lambda x: x.split(2)), (4, lambda x: x.chunk(2)), (2, lambda x: x.unbind())):
        x = torch.arange(float(size), requires_grad=True)
        first, second = split(x)
        got = []
        second.register_hook(lambda g: got.append(g))
        first.sum().backward()
        assert got == [None]
    for shape, dtype in (((2, 3), torch.float32), ((), torch.float64), ((4,), torch.bfloat16)):
        x = torch.ones(shape, dtype=dtype, requires_grad=True)
        y = x * 3
        got = []
        y.register_hook(lambda g: got.append(g))
        (y * y).sum().backward()
        assert got[0].shape == y.shape and got[0].dtype == y.dtype
    said = sentence_with("02_tensor_hooks.ipynb", "is called with the gradient of the tensor it is registered on")
    assert "of that tensor's shape" in said and "None" in said and "split" in said, said


def test_add_hands_one_tensor_to_both_inputs_only_when_shapes_and_dtypes_agree():
    """Notebook 4: "AddBackward0 hands the *same* tensor to both of its inputs". Same shape and dtype: the same
    object, and the in-place edit leaks (x.grad 14, not 12). Broadcast or float64 operand: two tensors, no leak."""
    def shared(make):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        p, q = make(x)
        out = p + q
        seen = {}
        out.grad_fn.register_hook(lambda grad_inputs, grad_outputs: seen.update(same=grad_inputs[0] is grad_inputs[1]))
        out.sum().backward()
        return seen["same"]

    assert shared(lambda x: (x * 2, x * 5)) is True
    assert shared(lambda x: (x * 2, x.sum() * 5)) is False            # broadcast
    assert shared(lambda x: (x * 2, x.double() * 5)) is False         # float32 + float64

    def leaked(make):
        x = torch.tensor(1.0, requires_grad=True)
        p, q = make(x)
        q.register_hook(lambda g: g.mul_(2))
        (p + q).sum().backward()
        return x.grad.item()

    assert leaked(lambda x: (x * 2, x * 5)) == 14.0
    assert leaked(lambda x: (x * 2, x.double() * 5)) == 12.0           # its own tensor: no leak
    said = sentence_with("04_modified_gradients.ipynb", "hands the *same* tensor to both")
    assert "shape" in said and "dtype" in said, said


def test_what_is_computed_from_a_leaf_and_what_the_version_counter_sees_notebook_0():
    """Notebook 0 said "Everything computed from a leaf that requires grad (while autograd records ...) is a non-leaf
    with a grad_fn": a comparison, argmax or an integer cast of it is a leaf with no grad_fn (notebook 9 relies on
    it); round and sign have a grad_fn (a zero derivative). And "each in-place operation increments" the version
    counter, so backward refuses an edited saved tensor: an edit through .data is not counted, and backward uses the
    edited values silently."""
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    for constant in (w > 0, w.argmax(), w.long(), w.int()):
        assert constant.is_leaf and constant.grad_fn is None and not constant.requires_grad
    for differentiable in (w.round(), w.sign(), w * 0):
        assert not differentiable.is_leaf and differentiable.grad_fn is not None
    said = sentence_with("00_autograd_fundamentals.ipynb", "Everything computed from a leaf that requires grad")
    assert "comparison" in said and "argmax" in said and "integer cast" in said, said

    for edit, caught in ((lambda b: b.add_(1), True), (lambda b: b.detach().add_(1), True),
                         (lambda b: b.data.add_(1), False)):
        a = torch.tensor([1.0, 2.0], requires_grad=True)
        b = a * 1
        c = b * b
        edit(b)
        if caught:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                c.sum().backward()
        else:
            c.sum().backward()
            assert a.grad.tolist() == [4.0, 6.0]  # 2 · the edited b, not 2 · [1, 2]
    said = sentence_with("00_autograd_fundamentals.ipynb", "Every tensor has a version counter")
    assert "`.data`" in said, said


def test_module_hook_order_and_timing_statements_of_notebooks_3_and_5():
    """Notebook 3: a module called twice gets its backward hooks called "the later call first" — also when the two
    calls are side by side, not one inside the other. Notebook 5: with no input requiring grad, the full hook is
    called "before the module's own backward functions run" (the weight's .grad is still None inside it), and torch
    warns; module hooks fire under torch.autograd.grad too."""
    layer = nn.Linear(2, 2)
    order = []
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: order.append(grad_output[0].sum().item()))
    a, b = torch.ones(1, 2, requires_grad=True), torch.ones(1, 2, requires_grad=True)
    first, second = layer(a), layer(b)
    ((first * 1).exp().sum() + (second * 10).sum()).backward()
    assert order[0] == 20.0 and order[1] != 20.0  # the second call's hook first
    assert "the later call first" in markdown("03_multiple_invocations.ipynb")

    layer = nn.Linear(2, 1)
    inside = {}
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: inside.update(
        grad_input=grad_input, weight_grad=layer.weight.grad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(torch.ones(1, 2)).sum().backward()
    assert inside["grad_input"] == (None,) and inside["weight_grad"] is None and layer.weight.grad is not None
    assert any("no inputs require gradients" in str(w.message) for w in caught)
    assert "before the module's own backward functions run" in markdown("05_module_hooks.ipynb")


def test_grad_input_entries_of_inputs_that_need_no_gradient_notebook_5():
    """Notebook 5 said "When a module's input does not require a gradient, its entry in grad_input is None": only
    when no input requires one. With another input requiring grad, the one that does not gets zeros (of its own
    dtype: an int64 mask gets int64 zeros)."""
    class Product(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, a, b):
            return a * b * self.scale

    def grad_input(a, b):
        module, seen = Product(), {}
        module.register_full_backward_hook(lambda module, grad_input, grad_output: seen.update(grad_input=grad_input))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module(a, b).sum().backward()
        return seen["grad_input"]

    both_none = grad_input(torch.tensor(2.0), torch.tensor(3.0))
    assert both_none == (None, None)
    first, second = grad_input(torch.tensor(2.0, requires_grad=True), torch.tensor(3.0))
    assert first.item() == 3.0 and second is not None and second.item() == 0.0
    first, second = grad_input(torch.tensor([2.0], requires_grad=True), torch.tensor([3]))
    assert first.tolist() == [3.0] and second.dtype == torch.int64 and second.tolist() == [0]
    said = sentence_with("05_module_hooks.ipynb", "gets zeros in `grad_input`, not `None`")
    assert "some do" in said, said
    assert "When none of a module's inputs requires a gradient, each entry of `grad_input` is `None`" in \
        markdown("05_module_hooks.ipynb")


def test_the_order_inside_one_node_of_notebook_6_whatever_the_registration_order():
    """Notebook 6: tensor hooks → retain_grad write → node pre-hooks; "A pre-hook therefore always sees the value
    *after* the tensor hooks", and retain_grad keeps the value after them — also when the pre-hook and retain_grad
    are registered before the tensor hook."""
    for retain_first in (True, False):
        a = torch.tensor(3.0, requires_grad=True)
        b = a * 2
        seen = []
        b.grad_fn.register_prehook(lambda grad_outputs: seen.append(grad_outputs[0].item()))
        if retain_first:
            b.retain_grad()
        b.register_hook(lambda g: g + 1)
        if not retain_first:
            b.retain_grad()
        b.backward()
        assert seen == [2.0] and b.grad.item() == 2.0 and a.grad.item() == 4.0
    text = markdown("06_beyond_backward.ipynb")
    assert "A pre-hook therefore always sees the value *after* the tensor hooks" in text


def test_post_accumulate_and_multi_grad_statements_of_notebook_6():
    """Notebook 6: a post-accumulate hook is for leaves only, receives the tensor and must return None; a
    multi-grad hook is called once with all the gradients ("any": once, with the first one's gradient alone); the
    predict card says its return value is ignored. It said the hook gets "the gradients of all of them, when the last
    one is ready": a tensor the pass does not reach gets None, and the hook fires all the same."""
    with pytest.raises(RuntimeError, match="cannot be registered on non-leaf"):
        (torch.ones(1, requires_grad=True) * 2).register_post_accumulate_grad_hook(lambda t: None)
    w = torch.tensor(1.0, requires_grad=True)
    w.register_post_accumulate_grad_hook(lambda t: t.grad * 2)
    with pytest.raises(RuntimeError, match="should return None"):
        (w * 2).backward()
    for mode, expect in (("all", [[2.0, 1.0]]), ("any", [2.0])):
        a, b = torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
        got = []
        torch.autograd.graph.register_multi_grad_hook(
            (a, b), lambda grads: (got.append([g.item() for g in grads] if isinstance(grads, (list, tuple))
                                              else grads.item()), tuple(g * 100 for g in grads)
                                   if isinstance(grads, (list, tuple)) else grads * 100)[1], mode=mode)
        (a * b).backward()
        assert got == expect and a.grad.item() == 2.0 and b.grad.item() == 1.0  # the return value is ignored
    a, b = torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    got = []
    torch.autograd.graph.register_multi_grad_hook((a, b), lambda grads: got.append(grads))
    (a * 3).backward()  # b not on the path: the hook still fires, with None for b
    assert len(got) == 1 and got[0][0].item() == 3.0 and got[0][1] is None
    text = markdown("06_beyond_backward.ipynb")
    assert "(leaves only)" in text and "it must return `None`" in text and 'mode="any"' in text
    said = sentence_with("06_beyond_backward.ipynb", "register_multi_grad_hook((a, b), fn)` calls `fn` once")
    assert "`None` for one the pass does not reach" in said, said


def test_what_the_graph_keeps_after_backward_notebooks_0_and_1():
    """Notebook 1: after backward the 3 of y * 3 is gone (a saved tensor), pow's exponent 2 stays (a number);
    notebook 0: a second backward fails when the graph saved a tensor — x * 3 saved one too; (x + 1) saved none.
    Exercise 3 of notebook 1: `s * 2` keeps only the 2; SumBackward0 keeps a size. Under torch.autograd.grad a
    retain_grad() tensor on the path still gets its .grad (notebook 3)."""
    x = torch.tensor(2.0, requires_grad=True)
    y = x ** 2
    z = y * 3
    assert torch.equal(z.grad_fn._saved_other, torch.tensor(3))
    (z + y * 2).backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        z.grad_fn._saved_other
    assert y.grad_fn._saved_exponent == 2
    single = (x * 3).sum()
    single.backward()
    with pytest.raises(RuntimeError, match="a second time"):
        single.backward()
    plain = (x + 1).sum()
    plain.backward()
    plain.backward()
    s = torch.ones(3, requires_grad=True)
    t = s * 2
    assert t.grad_fn._saved_self is None and torch.equal(t.grad_fn._saved_other, torch.tensor(2))
    assert tuple(t.sum().grad_fn._saved_self_sym_sizes) == (3,)
    a = torch.tensor(2.0, requires_grad=True)
    kept = a * 3
    kept.retain_grad()
    torch.autograd.grad(kept * 5, [a])
    assert kept.grad.item() == 5.0 and a.grad is None
    assert "(a tensor on the path that called `retain_grad()` still gets its `.grad`)" in \
        markdown("03_multiple_invocations.ipynb")
    assert "`pow`'s exponent `2` stays: it is a plain number, not a tensor" in markdown("01_reading_the_graph.ipynb")


def test_where_nan_and_anomaly_statements_of_notebook_9():
    """Notebook 9: sqrt at 0 passes on inf, which pow's backward turns into NaN (inf × 0); anomaly mode checks for NaN
    only, so it names PowBackward0; the torch.where trap gives NaN at x = 0 and -0 at x = -1, and the fix with
    x.clamp(min=1e-12) gives a finite gradient; -log(softmax) of [0, 200] has a NaN gradient, log_softmax a finite
    one."""
    a, b = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="^Function 'PowBackward0' returned nan values"):
            with torch.autograd.detect_anomaly():
                torch.sqrt(((a - b) ** 2).sum()).backward()
    x = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    torch.where(x > 0, torch.log(x), torch.zeros_like(x)).sum().backward()
    assert x.grad[0].item() == 0 and x.grad[1].isnan() and x.grad[2].item() == 0.5
    x.grad = None
    torch.where(x > 0, torch.log(x.clamp(min=1e-12)), 0).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.5]
    logits = torch.tensor([0.0, 200.0], requires_grad=True)
    (-torch.log(torch.softmax(logits, dim=0))[1]).backward()
    assert logits.grad.isnan().all()
    logits.grad = None
    (-torch.log_softmax(logits, dim=0)[1]).backward()
    assert logits.grad.tolist() == [0.0, 0.0]
    text = markdown("09_when_gradients_go_wrong.ipynb")
    assert "checks each backward function's output for **NaN** only, so it stops at `pow`" in text
    assert "`torch.where(x > 0, torch.log(x.clamp(min=1e-12)), 0)`" in text


def test_float16_limits_of_notebook_13():
    """Notebook 13: float16's smallest positive number is 2⁻²⁴ ≈ 6e-8, values below about 3e-8 round to 0, the
    largest is 65504 and from 65520 up values overflow; bfloat16 keeps 1e-8 and 1e5 finite."""
    half = torch.float16
    smallest = 2.0 ** -24
    assert torch.tensor(smallest).to(half).item() == smallest and torch.tensor(smallest * 0.51).to(half).item() > 0
    assert torch.tensor(2.0 ** -25).to(half).item() == 0 and torch.tensor(2.9e-8).to(half).item() == 0
    assert torch.tensor(65504.0).to(half).item() == 65504 and torch.tensor(65519.0).to(half).item() == 65504
    assert torch.tensor(65520.0).to(half).item() == float("inf")
    assert torch.tensor(1e-8).to(torch.bfloat16).item() > 0 and torch.tensor(1e5).to(torch.bfloat16).item() < 1e6
    text = markdown("13_hooks_in_real_training.ipynb")
    assert "about `6e-8` (`2⁻²⁴`)" in text and "below about `3e-8` round to 0" in text and "from 65520 up" in text


def claim_outputs(number: int) -> str:
    """The text (stdout, stderr, text/plain) of every cell tagged ``claim-NUMBER``, in course order."""
    texts = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if f"claim-{number}" in cell.get("metadata", {}).get("tags", []):
                for output in cell.get("outputs", []):
                    plain = output.get("data", {}).get("text/plain", "")
                    texts.append("".join(output.get("text", "")) + "".join(plain))
    return "\n".join(texts)


def test_a_claim_whose_settling_has_two_parts_has_cells_showing_both():
    """CLAIMS.md asks of some claims two things ("the error, then backward(gradient=...)"; "the warning and None;
    then retain_grad()"; "run it verbatim; then the fix"; "in-place vs out-of-place"; "0 calls, then recompute
    output"). The index named only the cell of the first part; the cells showing the second are tagged now, and the
    outputs of the tagged cells hold both values, computed here from torch."""
    v = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError) as refused:
        (v ** 2).backward()
    (v ** 2).backward(gradient=torch.tensor([1.0, 0.1, 0.0]))
    assert str(refused.value) in claim_outputs(2) and f"v.grad: {al.format_value(v.grad)}" in claim_outputs(2)

    x = torch.tensor(3.0, requires_grad=True)
    y = x * x
    y.retain_grad()
    (y + 1).backward()
    kept = f"y.grad: {y.grad.item()} | x.grad: {x.grad.item()}"
    assert "y.grad: None" in claim_outputs(4) and kept in claim_outputs(4)

    scaled = torch.randn(2, 2, requires_grad=True) * 10
    remade = (torch.randn(2, 2) * 10).requires_grad_()
    assert not scaled.is_leaf and remade.is_leaf
    assert "w.is_leaf: False | w.grad: None" in claim_outputs(13) and "w.is_leaf: True" in claim_outputs(13)

    def x_grad(hook):
        x = torch.tensor(1.0, requires_grad=True)
        p, q = x * 2, x * 5
        q.register_hook(hook)
        (p + q).backward()
        return x.grad.item()

    leaked, local = x_grad(lambda g: g.mul_(2)), x_grad(lambda g: g * 2)
    assert (leaked, local) == (14.0, 12.0)
    assert f"x.grad = {leaked}" in claim_outputs(27) and f"x.grad = {local}" in claim_outputs(27)

    torch.manual_seed(0)
    old = nn.Linear(3, 1)
    new = nn.Linear(3, 1)
    new.load_state_dict(old.state_dict())
    calls = []
    new.register_full_backward_hook(lambda module, grad_input, grad_output: calls.append(1))
    inputs = torch.randn(2, 3, requires_grad=True)
    old(inputs).sum().backward()
    assert calls == []
    new(inputs).sum().backward()
    assert calls == [1]
    assert "hook calls: 0" in claim_outputs(37) and claim_outputs(37).count("'module_full')") == len(calls)


# --- 2. predict cards: the rules they reveal, and the checker ---------------------------------------------------


def test_a_second_tensor_hooks_rule_does_not_offer_prepend():
    """The rule of the predict question of a second hook on one tensor said "(in registration order, but one
    registered with prepend=True goes first)": Tensor.register_hook takes no prepend. Module hooks do, and there the
    rule may say so."""
    with pytest.raises(TypeError, match="prepend"):
        torch.ones(1, requires_grad=True).register_hook(lambda g: g, prepend=True)
    layer = nn.Linear(1, 1)
    order = []
    layer.register_full_backward_hook(lambda *args: order.append("first"))
    layer.register_full_backward_hook(lambda *args: order.append("prepended"), prepend=True)
    layer(torch.ones(1, 1, requires_grad=True)).sum().backward()
    assert order == ["prepended", "first"]

    p = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        h = p * p
        h.register_hook(lambda g: g / 2)
        h.register_hook(lambda g: g / 2)
        h.backward()
    rules = [part.rule for step in steps_for(lens.passes[0]) if step.question for part in step.question.parts]
    second = [rule for rule in rules if rule.startswith("Hooks on one")]
    assert second, rules
    assert all("prepend" not in rule for rule in second), second

    with al.Lens() as lens:
        double = nn.Linear(1, 1)
        double.register_full_backward_hook(lambda module, grad_input, grad_output: None)
        double.register_full_backward_hook(lambda module, grad_input, grad_output: None)
        double(torch.ones(1, 1, requires_grad=True)).sum().backward()
    rules = [part.rule for step in steps_for(lens.passes[0]) if step.question for part in step.question.parts]
    assert any(rule.startswith("Hooks on one target") and "prepend=True" in rule for rule in rules), rules


def test_the_grad_the_course_s_predict_cards_ask_for_is_the_grad_torch_leaves():
    """Each ``%%lens --predict`` exercise of notebooks 0-6, run with its notebook's set-up: the last question of the
    last pass about each leaf's .grad (AccumulateGrad's write, or what a post-accumulate hook leaves) has torch's own
    final .grad as its answer (a Lens changes nothing it observes, so the run's .grad is the plain one)."""
    asked = 0
    for path in sorted(NOTEBOOKS.glob("0[0-6]_*.ipynb")):
        setup = {"torch": torch, "nn": nn, "al": al}
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code":
                continue
            if source.startswith("%load_ext") or source.startswith("class ClipGrad"):
                exec("\n".join(line for line in source.splitlines() if not line.startswith("%")), setup)
            if not source.startswith("%%lens --predict"):
                continue
            namespace = dict(setup)
            with contextlib.redirect_stdout(io.StringIO()), al.Lens(names=namespace) as lens:
                exec(source.split("\n", 1)[1], namespace)
            last = {}
            for step in steps_for(lens.passes[-1]):
                found = step.question and re.match(r"(?:AccumulateGrad is about to write (\S+)\.grad|Hook .* runs "
                                                   r"after AccumulateGrad wrote (\S+)\.grad)", step.question.prompt)
                if found:
                    last[found.group(1) or found.group(2)] = step.question.answer
            for name, answer in last.items():
                if name.split(".")[0] not in namespace:
                    continue  # a leaf made inline, with no name in the cell (the lens calls it "leaf")
                assert answer == tuple(eval(name, namespace).grad.reshape(-1).tolist()), (path.name, name)
                asked += 1
    assert asked >= 12


def _mean_question():
    m = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    with al.Lens() as lens:
        m.mean().backward()
    return [s.question for s in steps_for(lens.passes[0]) if s.question is not None][-1]


def _negative_question():
    x = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * x
        y.register_hook(lambda g: -g)
        y.backward()
    return [s.question for s in steps_for(lens.passes[0]) if s.question is not None and s.question.answer == (-6.0,)][0]


CHECKER_CASES = [  # (question, answer typed, right?)
    ("mean", "1/4", True), ("mean", "[1/4, 1/4, 1/4, 1/4]", True), ("mean", "0.25", True), ("mean", "1/2", False),
    ("mean", "1/0", False), ("mean", "[1, 4]", False),
    ("negative", "\u22126", True), ("negative", "-6", True), ("negative", "6", False), ("negative", "\u22126.5", False),
]


@pytest.mark.parametrize("which, text, right", CHECKER_CASES)
def test_the_predict_checker_reads_fractions_and_the_minus_sign(which, text, right):
    """A card asking for mean's gradient (0.25 each) said "that is 2 numbers" to 1/4; a card whose answer is -6
    read −6 (U+2212, the sign the course's own text uses) as 6: rejected, and +6 typed that way accepted."""
    question = _mean_question() if which == "mean" else _negative_question()
    assert check_answer(question, text)[0] is right


def _exp_question(values):
    x = torch.tensor(values, requires_grad=True)
    with al.Lens() as lens:
        x.exp().sum().backward()
    return [s.question for s in steps_for(lens.passes[0]) if s.question is not None][-1]


MIXED = [[0.0, 7.0], [-3.0, 4.0, 0.5], [2.0, -6.5, 1.0, 0.0]]  # exp: gradients a thousand times apart


@pytest.mark.parametrize("values", MIXED)
def test_a_small_entry_beside_a_large_one_is_still_checked(values):
    """x.exp().sum() at x = [0, 7]: x.grad is [1.0, 1097.0]. Answering [0.5, 1097] was "Right: autograd computed
    [1.0, 1097.0]": every entry had a slack of 1e-3 of the largest |value|. Each entry is now checked at the
    precision the card prints it (4 significant digits), with a floor of 1e-6 of the largest for rounding noise."""
    question = _exp_question(values)
    answer = list(question.answer)
    assert check_answer(question, question.answer_text)[0] and check_answer(question, str(answer))[0]
    small = min(range(len(answer)), key=lambda i: abs(answer[i]))
    for factor in (0.5, 1.5, -1.0):
        wrong = [v * factor if i == small else v for i, v in enumerate(answer)]
        assert check_answer(question, str(wrong))[0] is False, (question.answer_text, wrong)
    noisy = [v + 1e-7 * max(map(abs, answer)) if i == small else v for i, v in enumerate(answer)]
    assert check_answer(question, str(noisy))[0]


def test_the_browser_checker_judges_as_the_python_one(tmp_path):
    """views/stepper_base.js's checkAnswer mirrors views/questions.py's check_answer: same verdicts."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    cases = []
    for which, text, right in CHECKER_CASES:
        question = _mean_question() if which == "mean" else _negative_question()
        cases.append([text, list(question.answer), question.answer_text, right])
        assert check_answers(question, text)[0] is right
    for values in MIXED:
        question = _exp_question(values)
        answer = list(question.answer)
        small = min(range(len(answer)), key=lambda i: abs(answer[i]))
        for factor in (1.0, 1.0004, 0.5):
            text = str([v * factor if i == small else v for i, v in enumerate(answer)])
            cases.append([text, answer, question.answer_text, check_answers(question, text)[0]])
        assert [case[3] for case in cases[-3:]] == [True, True, False]
    module = tmp_path / "stepper_base.mjs"  # node reads .js beside no package.json as CommonJS
    shutil.copy(Path(al.__file__).parent / "views" / "stepper_base.js", module)
    script = (f"const {{ checkAnswer, answerNumbers }} = await import({json.dumps(module.as_uri())});"
              f"const verdicts = {json.dumps(cases)}.map(([text, answer, shown]) =>"
              " checkAnswer(text, answer, shown)[0]);"
              "console.log(JSON.stringify([verdicts, answerNumbers('[1/4, \u22122, 3e-1]')]));")
    verdicts, numbers = json.loads(subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True,
                                                  text=True, check=True).stdout)
    assert verdicts == [case[3] for case in cases] and numbers == [0.25, -2, 0.3]
    assert answer_numbers('[1/4, \u22122, 3e-1]') == numbers


# --- 3. the exercises: answers, mistakes and the checker ----------------------------------------------------------


def exercises() -> dict[str, tuple[str, Exercise]]:
    """Every Exercise of the course's notebooks (exercise cells of notebooks 0-13), by question."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "Exercise(" not in source:
                continue
            namespace = {"Exercise": Exercise, "torch": torch, "nn": nn}
            with contextlib.redirect_stdout(io.StringIO()):
                exec(source.replace("from autograd_lens.exercises import Exercise", ""), namespace)
            for value in namespace.values():
                if isinstance(value, Exercise):
                    found[value.question] = (path.name, value)
    return found


def solution_answers() -> dict[str, tuple[object, str]]:
    """Each solution notebook's ``name.check(answer)``: the question (from the Exercise built in the same cell) and
    the answer, with the program the solution states."""
    answers = {}
    for path in sorted((NOTEBOOKS / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if "Exercise(" not in source:
                continue
            namespace = {"Exercise": Exercise, "torch": torch, "nn": nn}
            tree = ast.parse(source)
            calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Attribute) and node.func.attr == "check"]
            body = [node for node in tree.body if not (isinstance(node, ast.Expr) and node.value in calls)]
            exec(compile(ast.Module(body=body, type_ignores=[]), path.name, "exec"), namespace)
            for call in calls:
                exercise = namespace[call.func.value.id]
                answer = eval(compile(ast.Expression(call.args[0]), path.name, "eval"), namespace)
                answers[exercise.question] = (answer, exercise.program)
    return answers


@pytest.fixture(scope="module")
def course_exercises():
    return exercises()


def test_every_exercise_has_a_solution_that_torch_judges_right(course_exercises):
    """Each exercise of notebooks 0-13 appears in a solution notebook with the same program, and the answer the
    solution gives is right by torch's value (and by the checker)."""
    answers = solution_answers()
    assert len(course_exercises) >= 30
    assert set(course_exercises) == set(answers), set(course_exercises) ^ set(answers)
    for question, (notebook, exercise) in course_exercises.items():
        answer, program = answers[question]
        assert program == exercise.program, (notebook, question)
        assert exercise.is_right(answer), (notebook, question, answer, exercise.expected())


def test_no_common_mistake_is_the_right_answer_and_the_checker_tells_numbers_apart(course_exercises):
    """A "mistake" equal to torch's value would tell a right answer it is wrong (the right answer is checked first,
    so its text would never show, but the exercise would teach a wrong rule); and for every numeric answer, 0 (where
    the value is not 0), the value times 1.5 and the value negated are judged wrong: the tolerance does not swallow
    the value."""
    for question, (notebook, exercise) in course_exercises.items():
        expected = exercise.expected()
        namespace = exercise._run().namespace
        for expression, explanation in exercise.mistakes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrong = eval(expression, namespace)
            assert not exercise.is_right(wrong), (notebook, question, expression, explanation)
        numeric = isinstance(expected, (int, float)) and not isinstance(expected, bool)
        if isinstance(expected, torch.Tensor) or numeric:
            value = torch.as_tensor(expected, dtype=torch.float64)
            if value.abs().max() > 0:
                assert not exercise.is_right(torch.zeros_like(value).tolist()), (notebook, question)
                assert not exercise.is_right((value * 1.5).tolist()), (notebook, question)
                assert not exercise.is_right((-value).tolist()), (notebook, question)
            assert exercise.is_right(value.tolist()), (notebook, question)


def test_the_rule_a_check_prints_never_gives_the_value(course_exercises):
    """"It never prints the value": no rule holds the value as a number (a one-digit value would match too often:
    checked from 2 characters up)."""
    for question, (notebook, exercise) in course_exercises.items():
        expected = exercise.expected()
        if isinstance(expected, (torch.Tensor, int, float)) and not isinstance(expected, bool):
            for number in torch.as_tensor(expected, dtype=torch.float64).reshape(-1).tolist():
                for text in {f"{number:g}", f"{number:.4g}"}:
                    if len(text.lstrip("-")) > 1:
                        assert not re.search(rf"(?<![\d.]){re.escape(text)}(?![\d])", exercise.rule), \
                            (notebook, question, text)
        elif isinstance(expected, str):
            assert expected.lower() not in exercise.rule.lower(), (notebook, question)


def test_exception_answers_are_judged_by_the_class_not_by_how_it_is_spelled(course_exercises):
    """Notebook 7's *A*: torch.load of a whole module raises pickle.UnpicklingError, whose class lives in _pickle (the
    solution prints "_pickle.UnpicklingError: Weights only load failed ..."). 'pickle.UnpicklingError' and
    '_pickle.UnpicklingError' were *Not quite*."""
    (_, exercise), = [v for q, v in course_exercises.items() if q.startswith("what torch.load (defaults) does")]
    assert exercise.expected() is pickle.UnpicklingError and pickle.UnpicklingError.__module__ == "_pickle"
    for right in ("UnpicklingError", "pickle.UnpicklingError", "_pickle.UnpicklingError", pickle.UnpicklingError,
                  "unpicklingerror"):
        assert exercise.is_right(right), right
    for wrong in ("RuntimeError", "pickle.PicklingError", "none", "Error", "torch.UnpicklingError.x", RuntimeError):
        assert not exercise.is_right(wrong), wrong


def test_dtype_answers_accept_torch_s_own_names(course_exercises):
    """Notebook 13's *3* asks for a dtype, float32: 'float' and 'torch.float' (torch.float is torch.float32) were
    *Not quite*; 'bfloat16' and 'float16' stay wrong."""
    (_, exercise), = [v for q, v in course_exercises.items() if q.startswith("dtype of weight.grad")]
    assert exercise.expected() is torch.float32 and torch.float is torch.float32
    for right in (torch.float32, torch.float, "float32", "torch.float32", "float", "torch.float"):
        assert exercise.is_right(right), right
    for wrong in (torch.bfloat16, "bfloat16", "torch.half", "half", "double", "float64", "torch.float16", "f"):
        assert not exercise.is_right(wrong), wrong


def test_true_false_answers_typed_as_words(course_exercises):
    """Notebooks 11 and 12 ask "(`True` or `False`)"; the check said *Not quite* to 'False' typed as a string where
    the answer is False (and the form hint says "answer True, False or None")."""
    (_, gradcheck), = [v for q, v in course_exercises.items() if q.startswith("does gradcheck pass")]
    (_, reentrant), = [v for q, v in course_exercises.items() if q.startswith("is weight.grad None after")]
    assert gradcheck.expected() is False and reentrant.expected() is True
    for exercise, right, wrong in ((gradcheck, False, True), (reentrant, True, False)):
        for answer in (right, str(right), str(right).lower(), f" {str(right).upper()} "):
            assert exercise.is_right(answer), answer
        for answer in (wrong, str(wrong), "none", None, 0, 1, "yes"):
            assert not exercise.is_right(answer), answer
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        gradcheck.check("True")
    assert buffer.getvalue().startswith("Not quite.")
