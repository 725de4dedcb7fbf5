"""Fresh eyes on the programs practitioners bring to a debugging tool (helper ``fresh16``, 2026-11-28): broken or
suspicious training code.  Gradients cut by mistake (``.detach()``, ``.data``, a NumPy round trip, ``torch.tensor(h)``,
``torch.no_grad()``, ``.item()``), accuracy, rounding or an integer cast as the loss, a parameter left out of the
optimizer, a layer created inside ``forward``, ``model.eval()`` or ``module.requires_grad = False`` taken for freezing,
frozen after the forward; NaN and inf (log of an underflowed softmax, sqrt at 0, a zero norm, a hook returning NaN,
``nan_to_num`` in a hook, anomaly mode); the errors (backward twice, an in-place change of a saved tensor, hooks
returning the wrong shape or dtype or raising, backward of a non-scalar, of a tensor computed under no_grad), each
followed by a pass that works; vanishing gradients (deep sigmoid and tanh nets, saturation, dead ReLUs).

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py), its cards, drawing and notes compared with torch (tests/test_fresh_classes10.py), and
every "no gradient" reason against torch's ``.grad`` (None, or zeros for a hook's zeros).  Three statements were
false and are fixed:

* ``Lens(why=True)`` (``%%lens --why``) swallowed the warning a call made before raising: anomaly mode's "Error
  detected in AddmmBackward0. Traceback of forward call ..." never reached the user; and that traceback listed the
  lens's own frame (debug/forward.py, debug/passthrough.py);
* the drawing of a large model outlined a parameter whose ``.grad`` is all zeros (a dead layer) with the smallest
  non-zero size step, whose legend says "grad norm 1.109 to 1.616" (views/gradsize.py, views/dot.py);
* a hook turning NaN into zeros (``nan_to_num``) was said to have "received a non-zero gradient" (debug/unreached.py).
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograd_lens as al
from autograd_lens.format import format_value

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes6 import first_nonfinite_by_torch  # noqa: E402
from test_fresh_classes7 import equal, problems_of  # noqa: E402  (the differential harness)
from test_fresh_classes10 import drawing_problems, drawn_grads, name, named, statements  # noqa: E402


# --- the checks -------------------------------------------------------------------------------------------------------

def _harness_only(problem: str, plain, index_of=None) -> bool:
    """Lines of the harness that are not the lens's: "added without hooks X; it is X" with both the same NaN (allclose
    is never true of NaN), and a box drawn with grad None where torch's .grad is None."""
    same = re.match(r"pass \d+: \S+ added without hooks (.*); it is (.*)$", problem, re.S)
    if same and same.group(1) == same.group(2):
        return True
    drawn = re.match(r"pass (\d+): (\S+) drawn with grad None; torch: \[\]$", problem)
    return bool(drawn) and plain.per[int(drawn.group(1)) - 1].get(drawn.group(2), 0) is None


def verify(program, reasons=None, static=False, drawing=True):
    """The differential harness, the cards and notes, the drawing (``drawing``: its grad fields parse one to a line),
    each leaf's grad field at the end of each pass, and ``reasons``: per pass (a list) or for every pass (a dict), the
    code of each named tensor that got no gradient; each such tensor's .grad is None in torch (zeros for hook_zeros),
    and every recorded .grad torch left None is given a reason.  Returns the named lens and the plain run."""
    assert problems_of(program) == []
    problems, lens, plain = statements(program)
    assert [p for p in problems if not _harness_only(p, plain)] == []
    if drawing:
        assert [p for p in drawing_problems(lens, plain, static) if not _harness_only(p, plain)] == []
    assert len(lens.passes) == len(plain.per)
    for index, (p, grads) in enumerate(zip(lens.passes, plain.per)):
        drawn = drawn_grads(lens, index)
        shown = {key: drawn[key] for key in grads if key in drawn and grads[key] is not None}
        assert shown == {key: format_value(grads[key], 48) for key in shown}, index
        codes = {key: reason.code for key, reason in p.unreached.items()}
        assert codes == (reasons[index] if isinstance(reasons, list) else reasons or {}), (index, p.unreached)
        for key, code in codes.items():  # no gradient: .grad None, or as the pass before left it (a failed pass)
            if key in grads and not (p.error and index and grads[key] is not None
                                     and equal(grads[key], plain.per[index - 1][key])):
                assert (not grads[key].any()) if code == "hook_zeros" else grads[key] is None, (index, key)
        assert {key for key, grad in grads.items() if grad is None} <= set(codes), (index, codes)
    return lens, plain


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def grads_of(**modules) -> dict:
    return {f"{key}.{n}": p.grad for key, module in modules.items() for n, p in module.named_parameters()}


# --- 1. a gradient cut by mistake -------------------------------------------------------------------------------------

def cut(kind: str):
    """Two SGD steps of a small net whose hidden activation is cut on the way to the loss as practitioners cut it;
    a hook clips the last layer's weight gradient (so "without hooks" differs)."""
    def program(run):
        model = mlp()
        scale = torch.ones(2, requires_grad=True)
        name(run, model=model, scale=scale)
        opt = torch.optim.SGD([*model.parameters(), scale], lr=0.1)
        x, y = torch.randn(5, 3), torch.randn(5, 2)
        if run.hooked:
            model[2].weight.register_hook(run.H("clip", lambda g: g.clamp(-0.1, 0.1)))
        for _ in range(2):
            opt.zero_grad()
            h = model[1](model[0](x))
            if kind == "detach":
                h = h.detach()
            elif kind == "data":
                h = h.data
            elif kind == "numpy":  # "tanh in NumPy is the same"
                h = torch.from_numpy(np.tanh(model[0](x).detach().numpy()))
            elif kind == "rewrap":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch: "To copy construct from a tensor, ..."
                    h = torch.tensor(h)
            elif kind == "no_grad":
                with torch.no_grad():
                    h = model[1](model[0](x))
            elif kind == "item":  # a scale read with .item(): the rest of h still carries the gradient
                h = h * h.mean().item()
            run.backward(F.mse_loss(model[2](h) * scale, y))
            run.record(dict(grads_of(model=model), scale=scale.grad))
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    return program


CUTS = {"detach": "detached", "data": "detached", "numpy": "unknown", "rewrap": "non_differentiable",
        "no_grad": "no_grad", "item": None}


@pytest.mark.parametrize("kind", list(CUTS))
def test_a_gradient_cut_by_mistake_against_torch(kind):
    code = CUTS[kind]
    lens, plain = verify(cut(kind), dict.fromkeys(["model.0.weight", "model.0.bias"], code) if code else None)
    texts = {p.unreached["model.0.weight"].text for p in lens.passes} if code else set()
    assert texts == {"detach": {"a tensor computed from it went through .detach(), and this graph uses the result"},
                     "data": {"a tensor computed from it went through .data, and this graph uses the result"},
                     "rewrap": {"a tensor computed from it went through tensor (autograd does not differentiate it), "
                                "and this graph uses the result"},
                     "no_grad": {"model.0.weight went through linear under no_grad → tanh, and this graph uses the "
                                 "result"}}.get(kind, texts)
    if kind == "numpy":  # the record follows torch calls only: said unknown, with the cut it saw
        assert all(".detach() → .numpy()" in text for text in texts)
    for p in lens.passes if code else ():  # the drawing marks the cut where the cut value entered: the one addmm
        (addmm,) = [node.id for node in p.graph.nodes if node.op == "AddmmBackward0"]
        assert {reason.at for reason in p.unreached.values()} <= ({(addmm,)} if kind != "numpy" else {()})


def accuracy_loss(kind: str):
    """A loss made of argmax, round or an integer cast, plus ``0 * logits.sum()`` "to keep autograd happy": every
    parameter gets zeros (not None), and nothing may be said to have stopped the gradient."""
    def program(run):
        model = mlp()
        name(run, model=model)
        x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
        logits = model(x)
        if run.hooked:
            logits.register_hook(run.H("seen", lambda g: g * 1.0, target="addmm"))
        if kind == "argmax":
            loss = (logits.argmax(1).float() - y.float()).pow(2).mean() + 0 * logits.sum()
        elif kind == "round":
            loss = (torch.sigmoid(logits[:, 1]).round() - y.float()).pow(2).mean()
        else:
            loss = (logits * 10).long().float().sum() + logits.sum() * 0.0
        run.backward(loss)
        run.record(grads_of(model=model))
    return program


@pytest.mark.parametrize("kind", ["argmax", "round", "long"])
def test_accuracy_as_a_loss_gives_zeros_and_no_reason(kind):
    lens, plain = verify(accuracy_loss(kind), static=True)
    assert all(not grad.any() for grad in plain.per[0].values())


def not_in_optimizer(run):
    """A head left out of the optimizer: ``opt.zero_grad()`` never clears its .grad, which grows every step."""
    model, head = mlp(), nn.Linear(2, 1)
    name(run, model=model, head=head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, held = torch.randn(5, 3), []
    if run.hooked:
        head.register_full_backward_hook(run.H("head", lambda m, gi, go: None, lambda a: a[1]))
    for _ in range(3):
        opt.zero_grad()
        held.append(sorted(key for key, grad in grads_of(model=model, head=head).items() if grad is not None))
        run.backward(head(model(x)).pow(2).mean())
        run.record(grads_of(model=model, head=head))
        opt.step()
    return held


def test_a_parameter_left_out_of_the_optimizer():
    lens, plain = verify(not_in_optimizer)
    notes = [(n.pass_index, set(n.message.split(" already held")[0].split(", "))) for n in lens.notes
             if n.code == "forgot_zero_grad"]
    held = plain.out  # per pass, the .grads not None when it began: exactly what the note names
    assert notes == [(index, {f"{key}.grad" for key in names}) for index, names in enumerate(held) if names] \
        == [(1, {"head.weight.grad", "head.bias.grad"}), (2, {"head.weight.grad", "head.bias.grad"})]


class NewHeadEachStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 3)

    def forward(self, x):
        self.head = nn.Linear(3, 1)  # new parameters every call: Adam never sees them, nothing is learnt
        return self.head(torch.relu(self.body(x)))


def module_in_forward(run):
    torch.manual_seed(0)
    model = NewHeadEachStep()
    name(run, model=model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    for _ in range(2):
        opt.zero_grad()
        run.backward(model(x).pow(2).mean())
        run.record(grads_of(model=model))
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def freezing(kind: str):
    """``eval()`` and ``module.requires_grad = False`` freeze nothing; ``requires_grad_(False)`` does, and after the
    forward only the AccumulateGrad drops what arrives.  BatchNorm and Dropout keep their modes."""
    def program(run):
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
        torch.manual_seed(0)
        name(run, model=model)
        if kind == "eval":
            model[0].eval()
        elif kind == "attribute":
            model[0].requires_grad = False  # a new attribute of the module, not its parameters' flag
        elif kind == "frozen":
            model[0].requires_grad_(False)
        x = torch.randn(6, 3)
        for step in range(2):
            model.zero_grad()
            out = model(x)
            if kind == "late" and step == 0:
                model[0].requires_grad_(False)
            run.backward(out.sum())
            run.record(grads_of(model=model))
        return [b.clone() for b in model.buffers()]
    return program


@pytest.mark.parametrize("kind", ["eval", "attribute", "frozen", "late"])
def test_freezing_that_does_and_does_not_freeze(kind):
    frozen = dict.fromkeys(["model.0.weight", "model.0.bias"], "requires_grad_false")
    lens, plain = verify(freezing(kind), frozen if kind in ("frozen", "late") else None, drawing=kind != "late")
    if kind == "late":
        assert [p.unreached["model.0.weight"].text.split(" (")[0] for p in lens.passes] == [
            "model.0.weight no longer required grad when the pass ran", "model.0.weight has requires_grad=False"]


def test_a_layer_created_in_forward_against_torch():
    lens, plain = verify(module_in_forward)
    assert [sorted(p.leaf_grads) for p in lens.passes] == [sorted(per) for per in plain.per]


# --- 2. NaN and inf -----------------------------------------------------------------------------------------------------

def nonfinite_loss(kind: str, model, x, run=None):
    if kind == "log0":  # a probability that underflows to 0
        return -torch.log(torch.softmax(model(x) * 200, dim=1)).mean()
    if kind == "sqrt0":  # the distance of a point to itself
        z = model(x)
        return torch.sqrt(((z - z) ** 2).sum(1)).mean() + z.sum() * 0
    if kind == "norm0":  # normalising a column that is all zeros
        with torch.no_grad():
            model.weight[0].zero_()
            model.bias[0] = 0.0
        z = model(x)
        return (z / z.norm(dim=0, keepdim=True)).sum()
    z = model(x)
    if run is not None and run.hooked:
        z.register_hook(run.H("bad", lambda g: g * float("nan"), target="addmm"))
    return z.pow(2).sum()


def nonfinite(kind: str):
    def program(run):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        name(run, model=model)
        loss = nonfinite_loss(kind, model, torch.randn(4, 3), run)
        run.backward(loss)
        run.record(grads_of(model=model))
        return loss.detach()
    return program


@pytest.mark.parametrize("kind", ["log0", "sqrt0", "norm0", "hook_nan"])
def test_where_nan_started_in_training_code(kind):
    lens, plain = verify(nonfinite(kind))
    assert any(grad.isnan().any() or grad.isinf().any() for grad in plain.per[0].values())

    def make(seen):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        loss = nonfinite_loss(kind if kind != "hook_nan" else "plain", model, torch.randn(4, 3))
        if kind == "hook_nan":  # the hook as the engine calls it, after the addmm's output
            loss.grad_fn.next_functions[0][0].register_prehook(lambda go: seen.append("hook"))
        return loss
    texts = [text.get_text() for text in lens.plot.grad_flow().axes[0].texts]  # one per parameter: NaN, as torch
    assert texts == [" NaN in .grad"] * 2 and all(grad.isnan().any() for grad in plain.per[0].values())
    origin = lens.passes[0].first_nonfinite
    truth = first_nonfinite_by_torch(make)
    assert (origin.kind, origin.name) == (("hook", "bad") if kind == "hook_nan" else ("node", truth)), origin


def nan_to_num_hook(run):
    """sqrt at 0 sends inf into the weight's gradient, which becomes NaN; a hook on the weight cleans it with
    ``nan_to_num``: zeros.  The bias keeps its inf."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    name(run, model=model)
    x = torch.randn(4, 3)
    z = torch.sqrt(model(x) - model(x).detach())
    if run.hooked:
        model.weight.register_hook(run.H("fix", lambda g: torch.nan_to_num(g, nan=0.0, posinf=1.0, neginf=-1.0)))
    run.backward(z.sum())
    run.record(grads_of(model=model))


def test_a_hook_cleaning_nan_is_said_to_receive_nan_not_a_non_zero_gradient():
    """Was false: "the tensor hook fix on model.weight received a non-zero gradient and passed on zeros": it received
    NaN (which is not zero, but no number either).  Fixed in debug/unreached.py."""
    lens, plain = verify(nan_to_num_hook, {"model.weight": "hook_zeros"})
    ((name_, reason),) = lens.passes[0].unreached.items()
    received = lens.passes[0].hook_calls[0].grad_in
    assert received.isnan().all() and not plain.per[0]["model.weight"].any() and plain.per[0]["model.bias"].isinf().all()
    assert reason.text == ("the tensor hook fix on model.weight received a gradient holding NaN or inf and passed on "
                           "zeros; this leaf received only zeros")


def where_trap(kind: str):
    """The torch.where trap: the branch not taken still gets a gradient (zeros), and sqrt's backward turns 0 * inf
    into NaN; clamping the input first is the fix.  A float16 cube of 1e-4 underflows: zeros, from the math."""
    def program(run):
        w = torch.tensor([4.0, -1.0, 0.0, 9.0], dtype=torch.float16 if kind == "half" else torch.float32,
                         requires_grad=True)
        name(run, w=w)
        if kind == "where":
            y = torch.where(w > 0, torch.sqrt(w), torch.zeros_like(w))
        elif kind == "clamped":
            y = torch.where(w > 0, torch.sqrt(w.clamp(min=1e-12)), torch.zeros_like(w))
        else:
            y = (w * 1e-4) ** 3
        if run.hooked:
            y.register_hook(run.H("seen", lambda g: None))
        run.backward(y.sum())
        run.record({"w": w.grad})
    return program


@pytest.mark.parametrize("kind", ["where", "clamped", "half"])
def test_the_where_trap_and_underflow_against_torch(kind):
    lens, plain = verify(where_trap(kind), static=True)
    grad, origin = plain.per[0]["w"], lens.passes[0].first_nonfinite
    if kind == "where":
        assert grad[1:3].isnan().all() and (origin.kind, origin.name) == ("node", "SqrtBackward0")
        assert (origin.kind, origin.name) == ("node", first_nonfinite_by_torch(
            lambda seen: (lambda w: torch.where(w > 0, torch.sqrt(w), torch.zeros_like(w)).sum())(
                torch.tensor([4.0, -1.0, 0.0, 9.0], requires_grad=True))))
    else:
        assert origin is None and grad.isfinite().all() and (kind != "half" or not grad.any())


def anomaly(depth: int = 1):
    """The program of a practitioner who turned anomaly detection on to find a NaN: sqrt at 0 in the forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    with torch.autograd.set_detect_anomaly(True):
        z = model(x)
        torch.sqrt(z - z.detach()).sum().backward()


def under(lens, program):
    """``program()`` under ``lens`` (None: plainly), from one line (anomaly mode's traceback lists the callers):
    (the error, the warnings, the parameters' .grad)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with lens if lens is not None else contextlib.nullcontext():
                program()
        except Exception as problem:  # noqa: BLE001  (compared)
            error = (type(problem), str(problem))
    return error, [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


@pytest.mark.parametrize("why", [False, True])
def test_anomaly_mode_errors_and_warnings_are_torchs(why):
    """Was false with ``why``: the forward record (a TorchFunctionMode around backward()) caught the warnings of a
    call and warned them again only when the call returned: anomaly mode's "Error detected in AddmmBackward0.
    Traceback of forward call that caused the error: ..." (warned just before its RuntimeError) was lost; and that
    traceback, kept on each node at the forward, listed the recorder's own frame.  Fixed in debug/forward.py and
    debug/passthrough.py."""
    lens = al.Lens(why=why)
    plain, traced = [under(each, anomaly) for each in (None, lens)]  # from one line
    assert traced == plain
    (error_type, message), ((warned, category, filename, _),) = plain
    assert error_type is RuntimeError and message == "Function 'AddmmBackward0' returned nan values in its 1th output."
    assert warned.startswith("Error detected in AddmmBackward0. Traceback of forward call that caused the error:")
    assert "autograd_lens" not in warned and category is UserWarning and filename.endswith("torch/autograd/graph.py")
    (backward_pass,) = lens.passes
    assert backward_pass.error.type == "RuntimeError" and backward_pass.first_nonfinite.name == "SqrtBackward0"
    with lens:  # the kernel stays usable
        torch.ones(2, requires_grad=True).sum().backward()
    assert len(lens.passes) == 2 and lens.passes[1].error is None


# --- 3. errors, each followed by a pass that works --------------------------------------------------------------------

def errors(kind: str):
    def program(run):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(1 if kind == "row" else 4, 2))
        name(run, model=model)
        x, outcome, handle, ran = torch.randn(5, 3), [], None, True
        try:
            if kind == "twice":
                loss = model(x).pow(2).mean()
                run.backward(loss)
                run.record(grads_of(model=model))
                run.backward(loss)
            elif kind == "inplace_saved":
                h = model[1](model[0](x))
                out = model[2](h)
                h.mul_(2)  # sigmoid saved its output
                run.backward(out.sum())
            elif kind in ("hook_shape", "hook_dtype", "hook_raises"):
                bad = {"hook_shape": lambda g: g.sum(0), "hook_dtype": lambda g: g.double(),
                       "hook_raises": lambda g: 1 / 0}[kind]
                target = model[0].weight if kind == "hook_shape" else model[2].bias
                if run.hooked:
                    handle = target.register_hook(run.H("bad", bad))
                run.backward(model(x).sum())
            elif kind == "nonscalar":  # refused before the engine starts: no pass (nor run.backward's record)
                ran = False
                model(x).backward()
            else:  # "no_grad_output"
                ran = False
                with torch.no_grad():
                    out = model(x)
                out.sum().backward()
        except Exception as problem:  # noqa: BLE001  (what the user sees, compared)
            outcome.append(f"{type(problem).__name__}: {problem}")
        if handle is not None:
            handle.remove()
        if ran:
            run.record(grads_of(model=model))
        model.zero_grad()
        run.backward(model(x).pow(2).sum())  # the next cell works
        run.record(grads_of(model=model))
        return outcome
    return program


ERRORS = {"twice": ("RuntimeError: Trying to backward through the graph a second time", "freed_graph"),
          "inplace_saved": ("RuntimeError: one of the variables needed for gradient computation has been modified by "
                            "an inplace operation: [torch.FloatTensor [5, 4]], which is output 0 of Mul, is at "
                            "version 1; expected version 0 instead.",
                            None),
          "hook_shape": ("RuntimeError: hook 'bad' has changed the size of value", "bad_hook_return"),
          "hook_dtype": ("RuntimeError: hook 'bad' has changed the type of value (was torch.FloatTensor got "
                         "torch.DoubleTensor)", "bad_hook_return"),
          "hook_raises": ("ZeroDivisionError: division by zero", None),
          "nonscalar": ("RuntimeError: grad can be implicitly created only for scalar outputs", None),
          "no_grad_output": ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
                             None)}


@pytest.mark.parametrize("kind", list(ERRORS))
def test_errors_reach_the_user_unchanged_and_the_partial_pass_is_true(kind):
    every = ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"]
    stopped = {"twice": every, "inplace_saved": every, "hook_shape": ["model.0.weight"],
               "hook_dtype": every, "hook_raises": every}.get(kind)
    reasons = [{}] if stopped is None else [dict.fromkeys(stopped, "unknown"), {}]
    reasons = [{}, *reasons] if kind == "twice" else reasons
    lens, plain = verify(errors(kind), reasons, drawing=kind not in ("twice", "hook_shape"))
    text, note = ERRORS[kind]
    ((said,),) = [plain.out]
    assert said.startswith(text), said
    failed = [p for p in lens.passes if p.error is not None]
    assert [f"{p.error.type}: {p.error.message}" for p in failed] == ([said] if stopped is not None else [])
    hooked = {"hook_shape": "model.0.weight", "hook_dtype": "model.2.bias", "hook_raises": "model.2.bias"}.get(kind)
    assert [entry[0] for entry in plain.log if isinstance(entry[1], torch.Tensor)] == (["bad"] if hooked else [])
    for p in failed:  # torch called the leaf's hook with its gradient (above): it reached the leaf, not its .grad
        for key, reason in p.unreached.items():
            assert re.fullmatch(rf"\w+ sent it a gradient, but the pass stopped with {p.error.type} before it was "
                                r"written to \.grad" if key == hooked else
                                f"the pass stopped with {p.error.type} before a gradient reached it", reason.text), key
    assert [n.code for n in lens.notes if n.code != "forgot_zero_grad"] == ([note] if note else [])
    assert all(n.pass_index == failed[0].index for n in lens.notes if n.code == note)


# --- 4. vanishing gradients, dead and saturated units ----------------------------------------------------------------

def deep(kind: str, depth: int = 12):
    def program(run):
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layer = nn.Linear(4, 4)
            if kind == "explode":
                nn.init.normal_(layer.weight, std=3.0)
            layers += [layer, nn.Sigmoid() if kind == "sigmoid" else nn.Tanh()]
        model = nn.Sequential(*layers)
        name(run, model=model)
        x = torch.randn(2, 4) * (10 if kind == "saturate" else 1)
        if run.hooked:
            model[0].weight.register_hook(run.H("watch", lambda g: None))
        run.backward(model(x).sum())
        run.record({f"model.{n}": p.grad for n, p in model.named_parameters() if n.split(".")[0] in ("0", "2", "22")})
    return program


@pytest.mark.parametrize("kind", ["sigmoid", "tanh", "explode", "saturate"])
def test_vanishing_and_exploding_gradients_against_torch(kind):
    lens, plain = verify(deep(kind), static=True)
    figure = lens.plot.grad_flow()  # the bars: torch's max and mean |grad| per parameter
    grads = lens.passes[0].leaf_grads
    widths = [float(bar.get_width()) for bar in figure.axes[0].patches]
    truth = [float(g.abs().max()) for g in grads.values()] + [float(g.abs().mean()) for g in grads.values()]
    assert widths == pytest.approx(truth, rel=1e-6)
    for key, value in plain.per[0].items():
        assert torch.equal(grads[key], value)


def dead_relu_net(run):
    """Every unit of the first layer dead (bias -20): zeros for its parameters and the next layer's weight, from the
    math; a full hook on the first layer and a halving hook on the next weight see and pass on zeros."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].bias.fill_(-20.0)
    name(run, model=model)
    if run.hooked:
        model[2].weight.register_hook(run.H("half", lambda g: g * 0.5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        run.backward(model(torch.randn(5, 3)).pow(2).mean())
        run.record(grads_of(model=model))
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def saturated(run):
    w = torch.tensor([40.0, -40.0, 0.5], requires_grad=True)
    b = torch.tensor([0.0], requires_grad=True)
    name(run, w=w, b=b)
    s = torch.sigmoid(w * 2 + b)
    if run.hooked:
        s.register_hook(run.H("keep", lambda g: g.clone(), target="sigmoid"))
    run.backward(s.sum())
    run.record({"w": w.grad, "b": b.grad})


def test_zeros_from_dead_and_saturated_units_are_not_blamed_on_hooks():
    lens, plain = verify(dead_relu_net)
    assert all(not per[key].any() for per in plain.per for key in ("model.0.weight", "model.0.bias", "model.2.weight"))
    lens, plain = verify(saturated, static=True)
    assert plain.per[0]["w"][0] == 0 and 0 < plain.per[0]["w"][1] < 1e-30  # sigmoid(80) is 1.0 in float32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act = nn.Linear(4, 4), nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


class DeadFirstLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.layers, self.head = nn.Linear(3, 4), nn.ModuleList(Block() for _ in range(14)), nn.Linear(4, 1)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for block in self.layers:
            h = block(h)
        return self.head(h)


def test_a_dead_layer_is_not_outlined_as_the_smallest_nonzero_gradient():
    """Was false: a graph() of a model past ~60 boxes outlines each parameter by the size of its .grad; the dead first
    layer's (all zeros) got the smallest step, whose legend reads "grad norm 1.109 to 1.616".  Fixed in
    views/gradsize.py and views/dot.py: zeros have their own step, "grad norm 0 (all zeros)", grey and dashed."""
    torch.manual_seed(0)
    model = DeadFirstLayer()
    with torch.no_grad():
        model.inp.bias.fill_(-50.0)
        for block in model.layers:
            block.lin.bias.fill_(0.1)
    x = torch.randn(5, 3)
    model(x).sum().backward()
    assert not model.inp.weight.grad.any() and not model.inp.bias.grad.any() and model.head.bias.grad.norm() > 0
    dot = al.graph(model(x).sum(), names={"model": model}).to_dot()
    found = re.findall(r'\t\t(grad_size\d) \[label="([^"]+)" color="([^"]+)"', dot)
    legend, colors = {key: text for key, text, _ in found}, {text: color for _, text, color in found}
    assert legend["grad_size1"] == "grad norm 0 (all zeros)" and len(legend) == 5
    for param, grad in (("inp.weight", model.inp.weight.grad), ("inp.bias", model.inp.bias.grad),
                        ("head.bias", model.head.bias.grad)):
        line = next(line for line in dot.splitlines() if f'label="model.{param} [' in line)
        color = re.search(r' color="([^"]+)"', line).group(1)
        (step,) = [text for text, c in colors.items() if c == color]
        low, high = (0.0, 0.0) if step.startswith("grad norm 0 ") else map(float, step.split()[2::2])
        assert low * (1 - 1e-3) <= float(grad.norm()) <= high * (1 + 1e-3), (param, step, float(grad.norm()))
        assert ("dashed" in line) is (high == 0)


def test_the_paths_of_a_pass_that_stopped_say_no_gradient_came():
    """Was false: ``--why`` on a pass stopped by a hook's error listed "which paths it took" and their sum for a leaf
    the gradient never reached (torch: .grad None), with nothing saying so.  Fixed in debug/__init__.py: the paths
    are said to be what it would have received, with the reason it received nothing."""
    from autograd_lens.debug.why import Why

    torch.manual_seed(0)
    model = mlp()
    x = torch.randn(4, 3)
    with al.Lens(names={"model": model}, why=True) as lens:
        h = model[0](x)
        h.register_hook(lambda g: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            model[2](model[1](h)).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    stopped, reached = lens.paths_to("model.0.weight"), lens.paths_to("model.2.weight")
    assert stopped.known and stopped.hooks == (
        "this pass gave model.0.weight no gradient (the pass stopped with ZeroDivisionError before a gradient reached "
        "it); the paths above are the chain rule without hooks: what it would have received")
    assert reached.hooks == "" and torch.allclose(reached.total, model[2].weight.grad)
    assert stopped.hooks in repr(Why(lens, "model.0.weight"))


@pytest.mark.parametrize("make", ["double", "scaled"])
def test_why_a_weight_that_is_not_a_leaf_has_no_paths(make):
    """Was false: ``w = torch.randn(3, requires_grad=True).double()`` (or ``* 0.01``): torch leaves w.grad None (w is
    not a leaf) and warns; ``--why w`` said "no recorded pass reaches a leaf named w: no path from a root leads to it
    (unreached says why)" while the pass goes through w and unreached says nothing.  Fixed in debug/__init__.py."""
    from autograd_lens.debug.why import Why

    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    w = w.double() if make == "double" else w * 0.01
    x = torch.randn(5, 3, dtype=w.dtype)
    with al.Lens(names={"w": w}, why=True) as lens:
        (x @ w).pow(2).sum().backward()
    assert not w.is_leaf and w.grad_fn is not None and dict(lens.passes[0].unreached) == {}
    assert any(n.label == "w" and n.kind == "tensor" for n in lens.passes[0].graph.nodes)
    assert lens.paths_to("w").unknown == ("w is not a leaf but a tensor computed on this graph, between the root and "
                                          "its leaves; paths are followed from the root to leaves only")
    assert "no path from a root leads to it" not in repr(Why(lens, "w"))
    assert [n.code for n in lens.notes] == []  # (w.grad was not read here: no nonleaf_grad note)


def test_autograd_grad_of_an_unused_input_fails_after_the_gradient_reached_the_others():
    """Was false: ``torch.autograd.grad(loss, [*model.parameters(), extra])`` with ``extra`` unused: torch runs the
    whole pass, then refuses ("The differentiated Tensor at index 4 appears to not have been used in the graph");
    the lens said each parameter got nothing because "the pass stopped with RuntimeError before a gradient reached
    it".  The gradients did reach them (allow_unused=True returns them).  Fixed in debug/unreached.py."""
    def program():
        torch.manual_seed(0)
        model, extra = mlp(), torch.randn(2, requires_grad=True)
        return model, extra, model(torch.randn(4, 3)).sum()

    model, extra, loss = program()
    allowed = torch.autograd.grad(loss, [*model.parameters(), extra], allow_unused=True)
    assert allowed[-1] is None and all(g is not None for g in allowed[:-1])
    model, extra, loss = program()
    with pytest.raises(RuntimeError) as plain:
        torch.autograd.grad(loss, [*model.parameters(), extra])
    with al.Lens(names={}, why=True) as lens:
        model, extra, loss = program()
        lens.names = {"model": model, "extra": extra}
        with pytest.raises(RuntimeError) as traced:
            torch.autograd.grad(loss, [*model.parameters(), extra])
    assert str(traced.value) == str(plain.value) == ("The differentiated Tensor at index 4 appears to not have been "
                                                     "used in the graph. Set allow_unused=True if this is the desired "
                                                     "behavior.")
    reasons = {key: (reason.code, reason.text) for key, reason in lens.passes[0].unreached.items()}
    assert reasons.pop("extra")[0] == "not_on_path"
    assert reasons == {key: ("unknown", f"{sender} sent it a gradient, but the pass stopped with RuntimeError before "
                                        "autograd.grad returned it")
                       for key, sender in (("model.0.weight", "t"), ("model.0.bias", "addmm"),
                                           ("model.2.weight", "t"), ("model.2.bias", "addmm"))}
