"""The differential suite over real layers and training loops (``model_programs.py``): generated programs, every
statement the lens makes compared with what torch did, and the false statements it found, each as a test.

``python tests/model_programs.py --programs 2000 --seed 0`` runs a campaign (one core) and prints each failure as a
minimal program; ``--cross-check`` also compares "hooks switched off" with a run that never registered them."""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import autograd_lens as al
import model_programs
import programs
from autograd_lens.capture import build

CHUNK = 50
PROGRAMS = 300


@pytest.mark.parametrize("start", range(0, PROGRAMS, CHUNK))
def test_generated_training_programs_show_only_what_torch_did(start):
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(start, start + CHUNK):
            program, problems = model_programs.check(seed)
            if problems:
                failures.append(model_programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:3])


# ----------------------------------------------------------------------------- the checker catches what it should

TRAINING = programs.Program([
    "torch.manual_seed(0)",
    "l0 = nn.Linear(3, 4)",
    "l1 = nn.Linear(4, 1)",
    "model = nn.ModuleList([l0, l1])",
    "REG(l0.weight, 'register_hook', make_hook('h1', 'clip'))",
    "REG(l1, 'register_full_backward_hook', make_module_hook('h2', 'scale'))",
    "opt = torch.optim.SGD(model.parameters(), lr=0.5)",
    "x0 = torch.randn(5, 3)",
    "loss0 = l1(torch.tanh(l0(x0))).pow(2).mean()",
    "PASS('backward', loss0)",
    "opt.step()",
    "x1 = torch.randn(5, 3)",
    "loss1 = l1(torch.tanh(l0(x1))).pow(2).mean()",
    "PASS('backward', loss1)",
], ["l0.weight", "l0.bias", "l1.weight", "l1.bias"])


def test_the_checker_passes_a_training_program_the_lens_shows_truly():
    assert model_programs.compare(TRAINING, cross_check=True) == []


def test_the_checker_sees_a_wrong_value_without_hooks_after_an_optimizer_step(monkeypatch):
    """After the step the value is this pass without its hooks on the moved parameters; a value off by one ulp in
    the second pass only is caught."""
    original = build._results
    seen = []

    def wrong(observer, history, result):
        values = original(observer, history, result)
        seen.append(observer)
        if len(seen) % 2 == 0:  # the second pass of each run under the lens
            values["without"] = {key: None if value is None else value.nextafter(value + 1)
                                 for key, value in values["without"].items()}
        return values

    monkeypatch.setattr(build, "_results", wrong)
    problems = model_programs.compare(TRAINING)
    assert any(problem.startswith("pass 2: l0.weight without hooks") for problem in problems), problems
    assert not any(problem.startswith("pass 1") for problem in problems)


def test_the_checker_demands_unknown_where_code_changed_grad_after_hooks_did():
    """No zero_grad, clip_grad_norm_ between passes after a hook changed .grad: what .grad would hold without hooks
    is not known, and the value the checker expects says so."""
    program = programs.Program(TRAINING.lines[:10] + ["torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)"]
                               + TRAINING.lines[11:], TRAINING.leaves)
    nohook = model_programs.run(program, "nohook")
    assert isinstance(nohook.passes[1]["grads"]["l0.weight"], model_programs.Unknowable)
    assert model_programs.compare(program) == []  # and the lens says unknown


def test_switching_hooks_off_is_running_without_them_where_no_step_moved_a_leaf():
    program = programs.Program([line for line in TRAINING.lines if line != "opt.step()"], TRAINING.leaves)
    nohook, never = model_programs.run(program, "nohook"), model_programs.run(program, "never")
    for switched_off, without in zip(nohook.passes, never.passes):
        assert programs.equal(list(switched_off["grads"].values()), list(without["grads"].values()))
    assert not programs.equal(list(nohook.passes[1]["real"].values()), list(never.passes[1]["grads"].values()))


# ----------------------------------------------------------------------------- what the campaigns found


def test_a_c_hook_beside_a_hook_on_an_autograd_grad_input_gets_its_own_tensor_s_gradient():
    """Found as a Conv2d+BatchNorm program (seed 36): autograd.grad(loss, [..., bn.weight]) with a Python hook on
    bn.weight and torch.neg on the conv's output.  The input's hook fires when its gradient is captured, just
    before the next node's hooks, and was taken for the C hook's neighbour: the C hook was shown receiving
    bn.weight's gradient (shape (3,)) instead of its own tensor's (2, 3)."""
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(2, 3, requires_grad=True)
    seen = []
    with al.Lens() as lens:
        w.register_hook(lambda g: g * 0.5)
        a = x * 2
        loss = (a * w).sum()
        a.register_hook(seen.append)
        returned = torch.autograd.grad(loss, [x, w])
    (backward_pass,) = lens.passes
    (c_call,) = [call for call in backward_pass.hook_calls if call.hook == "list.append"]
    assert torch.equal(c_call.grad_in, seen[0]) and torch.equal(c_call.grad_out, seen[0])
    assert c_call.target == "a"
    (python_call,) = [call for call in backward_pass.hook_calls if call.hook == "<lambda>"]
    assert python_call.target == "w" and torch.equal(python_call.grad_out, returned[1])


def _layer_and_input():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    return lin, x


def test_a_multi_grad_hook_in_a_reentrant_checkpoint_is_named_as_one():
    """A multi-grad hook on a checkpointed layer's parameters runs in the nested backward; the pass's note called
    it 'module legacy hook multi'."""
    lin, x = _layer_and_input()
    calls = []
    with al.Lens(names={"lin": lin, "x": x}) as lens:
        torch.autograd.graph.register_multi_grad_hook((lin.weight, lin.bias), lambda grads: calls.append(len(grads)))
        checkpoint(lin, x, use_reentrant=True).sum().backward()
    assert calls == [2]
    (note,) = [note for note in lens.passes[0].notes if "nested backward" in note and "wrote the .grad" not in note]
    assert "multi-grad hook <lambda>" in note and "legacy" not in note


def test_a_c_hook_on_a_reentrantly_checkpointed_parameter_is_not_left_unsaid():
    """list.append on a parameter of a layer under reentrant checkpointing runs in the nested backward, where no
    frame shows it: the pass showed no hook and no note, as if nothing had run.  Now a note names it as a hook
    that backward ran if it reached it (it changes no gradient of this graph: x's value without hooks stays)."""
    lin, x = _layer_and_input()
    seen = []
    with al.Lens(names={"lin": lin, "x": x}) as lens:
        lin.bias.register_hook(seen.append)
        checkpoint(lin, x, use_reentrant=True).sum().backward()
    assert len(seen) == 1
    (backward_pass,) = lens.passes
    (note,) = [note for note in backward_pass.notes if "nested backward" in note and "wrote the .grad" not in note]
    assert note.startswith("a nested backward run by CheckpointFunctionBackward") and note.endswith(
        "ran these hooks written in C if it reached their tensors (no Python frame shows it): lin.bias: hook list.append")
    assert torch.equal(backward_pass.grads_without_hooks["x"], x.grad)


def test_a_module_hook_in_c_in_a_reentrant_checkpoint_is_named():
    """A module's full backward hook written in C (print) under reentrant checkpointing: torch's wrapper calls it
    in the nested backward; the note left it out (only Python hooks were named)."""
    lin, x = _layer_and_input()
    with al.Lens(names={"lin": lin, "x": x}) as lens:
        lin.register_full_backward_hook(print)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            checkpoint(lin, x, use_reentrant=True).sum().backward()
    assert printed.getvalue().startswith("Linear(")
    (note,) = [note for note in lens.passes[0].notes if "nested backward" in note and "wrote the .grad" not in note]
    assert "lin: module full hook print" in note


def test_a_c_hook_on_an_autograd_grad_input_that_ran_before_the_pass_failed_is_a_step():
    """Found with reentrant checkpointing (autograd.grad raises 'not compatible with .grad()') and with a hook
    raising on a conv output: the input's hook in C had run (its gradient is captured as soon as its last user
    ran) but the pass showed no call.  Now it is a step in its place, its values unknown (what it passed on was
    never returned)."""
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    seen = []

    def stop(g):
        raise ValueError("stop")

    with al.Lens() as lens:
        b = x * 3
        b.register_hook(stop)
        loss = (w * b).sum()
        w.register_hook(seen.append)
        with pytest.raises(ValueError, match="stop"):
            torch.autograd.grad(loss, [w, x])
    assert len(seen) == 1
    calls = lens.passes[0].hook_calls
    assert [(call.hook, call.target) for call in calls] == [("list.append", "w"), ("stop", "b")]
    assert calls[0].grad_in is None and "not known" in calls[0].unseen


def test_a_hook_on_an_autograd_grad_input_before_a_raising_hook_keeps_its_place_and_its_tensor():
    """Found as a GRU language model (seed 2972): one factory's closures on head.weight (an input of autograd.grad)
    and on the GRU's output, the second raising.  The pass showed the raising call first, on head.weight, and the
    input's call second, on the GRU output: the calls where the pass stopped were placed before those that fired
    earlier for the captured input, which then took the other tensor's hook."""
    got = {}

    def make_hook(tag, stop):
        def hook(g):
            got[tag] = g.clone()
            if stop:
                raise ValueError(tag)
        return hook

    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    with al.Lens() as lens:
        b = x * 3
        loss = (w * b).sum()
        w.register_hook(make_hook("w", False))
        b.register_hook(make_hook("b", True))
        with pytest.raises(ValueError, match="b"):
            torch.autograd.grad(loss, [w, x])
    calls = lens.passes[0].hook_calls
    assert [(call.target, call.error) for call in calls] == [("w", None), ("b", "ValueError: b")]
    assert torch.equal(calls[0].grad_in, got["w"]) and torch.equal(calls[1].grad_in, got["b"])


def test_a_hook_raising_in_a_nested_backward_leaves_unreached_leaves_unknown_without_hooks():
    """Found as a GPT block under reentrant checkpointing with a raising module hook (seed 1588): the pass stopped
    inside the nested backward before reaching the embedding, and its value without hooks was shown as None
    (.grad as before) with no reason; without the hook the pass goes on and the embedding gets a gradient."""
    def run(hooked):
        torch.manual_seed(0)
        lin, w = nn.Linear(3, 3), torch.randn(3, requires_grad=True)
        x = torch.randn(2, 3)
        if hooked:
            lin.register_full_backward_hook(lambda module, grad_input, grad_output: 1 / 0)
        checkpoint(lin, x * w, use_reentrant=True).sum().backward()
        return w.grad

    with al.Lens() as lens, pytest.raises(ZeroDivisionError):
        run(True)
    assert run(False) is not None  # what a run without the hook gives w: not None
    (backward_pass,) = lens.passes
    assert backward_pass.grads_without_hooks["w"] is None
    assert backward_pass.unknown["w"].startswith("the pass stopped at ZeroDivisionError")


def _clipped_accumulation(scale, hooked, lens=None):
    """Two passes accumulating into .grad with clip_grad_norm_ between them, a hook scaling a's gradient."""
    torch.manual_seed(0)
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    x = torch.randn(3)
    with lens or contextlib.nullcontext():
        if hooked:
            a.register_hook(lambda g: g * scale)
        ((a * x).sum() + (b * x).sum()).backward()
        torch.nn.utils.clip_grad_norm_([a, b], 1.0)
        ((a * x).sum() + (b * x).sum()).backward()
    return b.grad.clone()


@pytest.mark.parametrize("scale", [10.0, 0.01])
def test_clip_grad_norm_between_passes_after_a_hook_makes_the_other_leaf_unknown_without_hooks(scale):
    """clip_grad_norm_ between two accumulating passes reads every .grad: after a hook changed a's, it scales b's
    by another factor than it would without the hook (x10: clipped harder; x0.01: not clipped at all, where
    without the hook it would be, and b's values are left as they were though clip wrote them).  The lens showed
    b's real .grad as its value without hooks; it is not (checked against torch), and not knowable: unknown."""
    lens = al.Lens()
    real = _clipped_accumulation(scale, True, lens)
    never = _clipped_accumulation(scale, False)
    assert not torch.equal(real, never)  # what a shown value would have claimed
    second = lens.passes[1]
    assert second.grads_without_hooks["b"] is None and "b" in second.unknown


def _stopped_then_step(hooked, lens=None):
    torch.manual_seed(0)
    l0, l1 = nn.Linear(3, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*l0.parameters(), *l1.parameters()], lr=0.5)
    x = torch.randn(5, 3)
    with lens or contextlib.nullcontext():
        a = l0(x)
        if hooked:
            a.register_hook(lambda g: 1 / 0)
        with contextlib.suppress(ZeroDivisionError):
            l1(torch.tanh(a)).pow(2).mean().backward()  # l1's parameters get their gradient, l0's do not
        opt.step()
        opt.zero_grad()
        l1(torch.tanh(l0(x))).pow(2).mean().backward()
    return l1.weight.grad.clone()


def test_after_a_pass_a_hook_stopped_an_optimizer_step_is_said_to_make_a_run_without_hooks_differ():
    """Found as an MLP whose activation hook raised, then opt.step() (seed 38): the step moved the parameters that
    had their gradient; a run without the hook would have moved all of them, so its next pass differs (checked
    against torch).  The note saying so came only after hooks that changed a gradient, not after one that stopped
    the pass."""
    lens = al.Lens()
    _stopped_then_step(True, lens)
    never = _stopped_then_step(False)
    first, second = lens.passes
    assert not torch.equal(second.grads_without_hooks["l1.weight"], never)  # without the note, a false statement
    (note,) = [note for note in second.notes if "changed since pass 1" in note]
    assert note.startswith("l1.bias, l1.weight changed since pass 1, whose hooks stopped it before it reached")


# ----------------------------------------------------------------------------- found by the campaigns, fixed after them


def test_a_module_pre_hook_editing_in_place_in_a_reentrant_checkpoint_is_no_hook_in_c():
    """Seed 5753: a module full backward pre-hook that edits grad_output in place, on a layer under reentrant
    checkpointing.  The nested backward gets the outer gradient itself, so the edit changes what the outer node
    received after its users sent it; the pass shows a step '<C hook>' on the checkpoint's output, a hook that does
    not exist."""
    lin, x = _layer_and_input()

    def halve(module, grad_output):
        grad_output[0].mul_(0.5)

    with al.Lens(names={"lin": lin, "x": x}) as lens:
        lin.register_full_backward_pre_hook(halve)
        checkpoint(lin, x, use_reentrant=True).pow(2).sum().backward()
    assert [call.hook for call in lens.passes[0].hook_calls] == []


def test_the_place_of_a_c_hook_among_inputs_captured_at_once_is_not_claimed():
    """Seed 2633: autograd.grad(loss, [bn.weight, bn.bias]) with list.append on bn.bias and a Python hook on
    bn.weight: both gradients are captured when BatchNorm's backward has run; torch ran bn.weight's hook first, the
    lens shows list.append first, with nothing saying its place is a guess."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    x = torch.randn(4, 3)
    order = []
    handles = [bn.bias.register_hook(lambda g: order.append("bias")),  # a Python stand-in shows torch's order
               bn.weight.register_hook(lambda g: order.append("weight"))]
    torch.autograd.grad(bn(x).pow(2).sum(), [bn.weight, bn.bias])
    for handle in handles:
        handle.remove()
    seen = []
    with al.Lens(names={"bn": bn}) as lens:
        bn.bias.register_hook(seen.append)
        bn.weight.register_hook(lambda g: None)
        torch.autograd.grad(bn(x).pow(2).sum(), [bn.weight, bn.bias])
    calls = lens.passes[0].hook_calls
    shown = ["bias" if call.target == "bn.bias" else "weight" for call in calls]
    assert order == ["weight", "bias"] and len(seen) == 1
    assert shown == order or any("order" in (call.unseen or "") for call in calls)


def test_an_observing_c_hook_before_an_optimizer_step_is_not_said_to_have_changed_gradients():
    """Seed 111: list.append on a GRU bias, then opt.step(): the next pass said the parameters 'changed since pass
    1, whose hooks changed gradients'; list.append changed nothing (its values are known around it), and a run
    without it is this very run."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    x = torch.randn(4, 3)
    seen = []
    with al.Lens(names={"lin": lin}) as lens:
        lin.bias.register_hook(seen.append)
        for _ in range(2):
            opt.zero_grad()
            lin(x).pow(2).mean().backward()
            opt.step()
    assert len(seen) == 2 and not lens.passes[0].hook_calls[0].modified
    assert not any("changed since pass" in note for note in lens.passes[1].notes)


def _negated_in_checkpoint_then_step(hooked, lens=None):
    torch.manual_seed(0)
    l0, l1 = nn.Linear(3, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*l0.parameters(), *l1.parameters()], lr=0.5)
    x = torch.randn(5, 3, requires_grad=True)  # (reentrant checkpointing needs an input that requires grad)
    with lens or contextlib.nullcontext():
        if hooked:
            l0.weight.register_hook(torch.neg)  # runs in the nested backward: no frame shows it
        for _ in range(2):
            opt.zero_grad()
            l1(checkpoint(l0, x, use_reentrant=True)).pow(2).mean().backward()
            opt.step()
    return l1.weight.grad.clone()


def test_after_hooks_in_c_in_a_nested_backward_an_optimizer_step_is_said_to_make_a_run_without_hooks_differ():
    """Seed 10548: torch.neg on a checkpointed layer's weight, then opt.step(): the step used the negated gradient,
    so a run without the hook has other parameters and another next pass (checked against torch); the next pass
    said nothing, as no recorded hook call had changed a gradient."""
    lens = al.Lens()
    real = _negated_in_checkpoint_then_step(True, lens)
    never = _negated_in_checkpoint_then_step(False)
    assert not torch.equal(real, never) and torch.equal(lens.passes[1].grads_without_hooks["l1.weight"], real)
    (note,) = [note for note in lens.passes[1].notes if "changed since pass 1" in note]
    assert "whose hooks may have changed gradients (hooks in C, or in a nested backward)" in note


def test_a_c_pre_hook_on_a_module_boundary_is_not_given_what_the_module_pre_hook_made():
    """Seed 10458: BatchNorm with a full backward pre-hook halving grad_output in place, and list.append as a
    pre-hook of its output's backward function (the module's hook boundary).  torch runs the module's pre-hook after
    the node's own: list.append passed on what it got, and the pass said it passed on the halved value."""
    lin, x = _layer_and_input()
    seen = []

    def halve(module, grad_output):
        grad_output[0].mul_(0.5)

    with al.Lens(names={"lin": lin, "x": x}) as lens:
        lin.register_full_backward_pre_hook(halve)
        out = lin(x)
        out.grad_fn.register_prehook(lambda grads: seen.append(grads[0].clone()))  # a Python stand-in: torch's order
        out.grad_fn.register_prehook(seen.append)
        out.pow(2).sum().backward()
    stand_in = seen[0]  # what list.append got and passed on (its own tuple was halved in place after it)
    (call,) = [call for call in lens.passes[0].hook_calls if call.hook == "list.append"]
    assert torch.equal(call.grad_out[0], stand_in) if call.grad_out is not None else "not known" in call.unseen


def _stopped_at_once_then_step(hooked, lens=None):
    torch.manual_seed(0)
    lin = nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    x = torch.randn(5, 3)
    with lens or contextlib.nullcontext():
        out = lin(x)
        if hooked:
            out.register_hook(lambda g: 1 / 0)
        with contextlib.suppress(ZeroDivisionError):
            out.pow(2).mean().backward()  # stopped before any leaf: nothing to step with
        opt.step()
        lin(x).pow(2).mean().backward()
    return lin.weight.grad.clone()


def test_after_a_pass_a_hook_stopped_before_any_leaf_the_next_says_a_run_without_hooks_may_differ():
    """Seeds 10268, 11895: a hook raised at the first function, opt.step() then had no gradient to use and moved
    nothing; without the hook it would have (checked against torch).  Nothing moved here, so no leaf 'changed
    since' that pass, and the next pass said nothing."""
    lens = al.Lens()
    real = _stopped_at_once_then_step(True, lens)
    assert not torch.equal(real, _stopped_at_once_then_step(False))
    assert lens.passes[1].grads_without_hooks["lin.weight"] is None and "lin.weight" in lens.passes[1].unknown
    (note,) = [note for note in lens.passes[1].notes if "a run that never had the hooks" in note]
    assert note.startswith("pass 1 stopped at a hook's error before it reached every leaf: if code used .grad since")


def test_a_c_hook_before_a_reentrant_checkpoint_whose_recompute_edits_in_place_is_not_given_that_value():
    """Seed 8087 of a 1,500-program campaign: a forward hook on a layer under reentrant checkpointing registers a
    tensor hook that edits its gradient in place; it runs again in the recompute inside the nested backward and
    edits what reached the checkpoint's node after the hook in C on the checkpoint's output had run.  That C hook
    was shown passing on the edited value; what it passed on is not known (the node holds an edited tensor)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program, problems = model_programs.check(8087)
    assert problems == [], model_programs.report(program, problems)


def test_a_c_hook_whose_place_is_said_unknown_is_paired_where_torch_ran_it():
    """Seed 7368: autograd.grad over an LSTM's weight_hh_l0 (a multi-grad hook, mode="any", editing in place) and
    bias_ih_l0 (list.append), captured at once. The lens shows the C hook first and says its place among those
    hooks is not known; torch ran the multi-grad hook first. The checker pairs such a call where the rest holds
    (it was comparing the multi-grad call's values with the C hook's), and the C call says why its values are not
    known without naming a hook before it that is not there."""
    program = programs.Program([
        "torch.manual_seed(7368)",
        "emb = nn.Embedding(11, 8)",
        "twice0 = nn.Linear(8, 8)",
        "lstm1 = nn.LSTM(8, 8, batch_first=True)",
        "head = nn.Linear(8, 11, bias=False)",
        "REG(None, 'multi', (lstm1.weight_hh_l0, head.weight,), make_multi('h1', 'inplace'), 'any')",
        "REG(lstm1.bias_ih_l0, 'register_hook', CHOOK('h2', 'append'))",
        "tok0 = torch.randint(0, 11, (2, 4))",
        "tgt0 = torch.randint(0, 11, (2, 4))",
        "a0_0 = emb(tok0)",
        "a0_1 = twice0(torch.relu(twice0(a0_0)))",
        "a0_2 = lstm1(a0_1)[0]",
        "logits0 = head(a0_2)",
        "loss0 = F.cross_entropy(logits0.view(-1, 11), tgt0.view(-1))",
        "PASS('grad', loss0 / 2, [emb.weight, lstm1.weight_hh_l0, lstm1.bias_ih_l0], retain_graph=True)",
    ], ["emb.weight", "lstm1.weight_hh_l0", "lstm1.bias_ih_l0"], 7368)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problems = model_programs.compare(program)
        lens = model_programs.run(program, "lens").lens
    assert problems == [], problems
    (c_call,) = [call for p in lens.passes for call in p.hook_calls if programs.PLACE_UNKNOWN in (call.unseen or "")]
    assert c_call.hook == "list.append" and c_call.target == "lstm1.bias_ih_l0"
    assert "a hook before it" not in c_call.unseen  # none is
    assert "what reached it (its tensor's gradient before any hook) was not kept" in c_call.unseen


def _call(name, kind="tensor", registration=1, unseen=None, pass_index=0):
    from autograd_lens.model import HookCall

    value = None if unseen else torch.tensor([float(registration)])
    return HookCall(hook=name, kind=kind, target="t", pass_index=pass_index, invocation=1, grad_in=value,
                    grad_out=value, modified=False, returned_none=True, node="n1", step=1, unseen=unseen,
                    registration=registration)


def test_the_checker_moves_only_a_call_said_to_have_no_known_place_and_only_among_captured_hooks():
    unknown = "it is written in C; " + programs.PLACE_UNKNOWN
    ran = [(f"{name}@{number}", torch.tensor([float(number)]), torch.tensor([float(number)]))
           for name, number in (("a", 1), ("c", 2), ("b", 3))]
    movable = [_call("c", registration=2, unseen=unknown), _call("a", registration=1), _call("b", registration=3)]
    order, problems = programs._aligned(list(movable), ran)
    assert problems == [] and [call.hook for call in order] == ["a", "c", "b"]
    # a Python call out of place stays a false statement
    fixed = [_call("a", registration=1), _call("b", registration=3), _call("c", registration=2, unseen="in C")]
    assert programs._aligned(list(fixed), ran)[1]
    # a movable call does not move past a module hook's call or into another pass
    for other in (_call("a", kind="module", registration=1), _call("a", registration=1, pass_index=1)):
        blocked = [_call("c", registration=2, unseen=unknown), other, _call("b", registration=3)]
        assert programs._aligned(list(blocked), ran)[1]


@pytest.mark.parametrize("c_hook", [torch.neg, "append"])
def test_a_c_hook_registered_in_a_reentrant_recompute_makes_values_past_it_unknown_and_is_named(c_hook):
    """A forward hook registers a gradient hook on its layer's output; under reentrant checkpointing the forward
    runs without grad, so the hook is registered only in the recompute, during the pass, and runs in the nested
    backward. Written in C (torch.neg), no frame shows it: x's gradient was negated while the lens said "No hook
    changed it: the same as without hooks". Now: a note names it, and x without hooks is unknown, with why."""
    def program(lens_on):
        torch.manual_seed(0)
        lin = nn.Linear(3, 3)
        seen = []
        function = seen.append if c_hook == "append" else c_hook

        def catch(module, inputs, output):
            if output.requires_grad:
                output.register_hook(function)
        lin.register_forward_hook(catch)
        x = torch.randn(2, 3, requires_grad=True)
        with (al.Lens(names={"lin": lin, "x": x}) if lens_on else contextlib.nullcontext()) as lens:
            checkpoint(lin, x, use_reentrant=True).pow(2).sum().backward()
        return x.grad, lin.weight.grad, len(seen), lens

    plain, traced = program(False), program(True)
    assert torch.equal(plain[0], traced[0]) and torch.equal(plain[1], traced[1]) and plain[2] == traced[2]
    backward_pass = traced[3].passes[0]
    name = "list.append" if c_hook == "append" else "torch.neg"
    (note,) = [n for n in backward_pass.notes if "ran these hooks written in C if it reached" in n]
    assert f"{name} (registered during the pass on a tensor CheckpointFunctionBackward made" in note
    assert backward_pass.grads_without_hooks["x"] is None
    assert backward_pass.unknown["x"].startswith(f"hooks written in C ({name}), registered during the pass")
    assert backward_pass.hook_calls == ()


@pytest.mark.parametrize("seed", [936236])
def test_a_module_pre_hook_editing_in_place_is_after_what_its_boundary_node_received(seed):
    """Seed 936236: a module full backward pre-hook editing grad_output in place runs inside
    torch's hook-boundary node (BackwardHookFunctionBackward); what that node received is shown after its hooks,
    as for every node, not as the engine handed it over (the lens's copy of what a custom Function's backward gets
    is for users' Functions only)."""
    program, problems = model_programs.check(seed)
    assert problems == [], problems
