"""What the lens shows is what torch did: one test per class of false statement found by comparing the lens with
plain PyTorch (issue "Every statement true"; examples in ``shared/repros/truth_*.py``).  Torch is the oracle:
logging hooks record what really ran, and a run without the hooks gives "without hooks"."""

from __future__ import annotations

import contextlib
import warnings
import io

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import autograd_lens as al
from autograd_lens.views.steps import hook_totals, steps_for


def titles(lens: al.Lens) -> list[str]:
    totals = hook_totals(lens.passes)
    return [step.title for p in lens.passes for step in steps_for(p, totals) if step.kind == "hook"]


# ----------------------------------------------------------------------------- counts: one registered hook, one count


def test_closures_from_one_factory_on_tensors_made_by_one_op_are_counted_apart():
    ran: list[str] = []

    def make_hook(name):
        def hook(grad):
            ran.append(name)
        return hook

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(3)])

    def forward(h):
        for index, layer in enumerate(layers):
            h = torch.tanh(layer(h))
            h.register_hook(make_hook(f"layer {index}"))
        return h.sum()

    with al.Lens() as lens:
        forward(torch.randn(2, 3)).backward()
    assert ran == ["layer 2", "layer 1", "layer 0"]
    calls = lens.hook_calls
    assert [call.invocation for call in calls] == [1, 1, 1]
    assert len({call.registration for call in calls}) == 3
    assert all("call 1 of 1" in title for title in titles(lens))


def test_one_function_on_two_tensors_and_twice_on_one_tensor_are_separate_hooks_over_two_passes():
    counts: list[int] = []

    def log(grad):
        counts.append(1)

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        a = x * 2
        b = x * 3
        a.register_hook(log)
        b.register_hook(log)
        b.register_hook(log)
        out = (a + b).sum()
        out.backward(retain_graph=True)
        out.backward()
    assert len(counts) == 6  # three registrations, two passes
    calls = lens.hook_calls
    per_registration: dict[int, list[int]] = {}
    for call in calls:
        per_registration.setdefault(call.registration, []).append(call.invocation)
    assert sorted(per_registration.values()) == [[1, 2], [1, 2], [1, 2]]
    assert sum("of 2 in this recording" in title for title in titles(lens)) == 6


def test_a_hook_registered_after_the_first_pass_is_counted_from_one():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        x.register_hook(lambda g: None)
        (x * 3).backward()
        x.register_hook(lambda g: None)
        (x * 3).backward()
    first, second, third = lens.hook_calls
    assert (first.registration, second.registration) == (first.registration, first.registration)
    assert (first.invocation, second.invocation, third.invocation) == (1, 2, 1)
    assert third.registration != first.registration
    assert titles(lens)[2].endswith("call 1 of 1 in this recording)")


# ----------------------------------------------------------------------------- hooks written in C: present, in order


def test_c_hooks_on_a_backward_function_are_steps_in_registration_order_among_python_ones():
    seen: list = []
    order: list[str] = []
    with al.Lens() as lens, contextlib.redirect_stdout(io.StringIO()) as printed:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.grad_fn.register_prehook(lambda g: order.append("py pre 1"))
        y.grad_fn.register_prehook(seen.append)
        y.grad_fn.register_prehook(lambda g: order.append("py pre 2") or (g[0] * 2,))
        y.grad_fn.register_hook(print)
        y.grad_fn.register_hook(lambda gi, go: order.append("py post"))
        y.sum().backward()
    assert order == ["py pre 1", "py pre 2", "py post"] and len(seen) == 1 and printed.getvalue()
    shown = [(call.hook, call.kind) for call in lens.hook_calls]
    assert shown == [("<lambda>", "node_pre"), ("list.append", "node_pre"), ("<lambda>", "node_pre"),
                     ("print", "node"), ("<lambda>", "node")]
    c_pre = lens.hook_calls[1]
    assert torch.equal(c_pre.grad_in[0], seen[0][0]) and not c_pre.modified  # between two Python pre-hooks
    assert torch.equal(x.grad, torch.full((2,), 6.0))


def test_a_legacy_module_hook_written_in_c_is_a_step():
    model = torch.nn.Linear(2, 1)
    with al.Lens() as lens, contextlib.redirect_stdout(io.StringIO()), pytest.warns(FutureWarning):
        model.register_backward_hook(print)
        model(torch.ones(1, 2)).sum().backward()
    assert [(call.hook, call.kind, call.target) for call in lens.hook_calls] == [("print", "module_legacy", "model")]


@pytest.mark.parametrize("python_first", [True, False])
def test_hooks_on_two_outputs_of_one_node_are_shown_in_firing_order(python_first):
    order: list[str] = []

    def run(lens_on: bool):
        x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        a, b = (x * 1).split(2)
        if python_first:
            b.register_hook(lambda g: order.append("python on b"))
            a.register_hook(torch.neg)
        else:
            a.register_hook(torch.neg)
            b.register_hook(lambda g: order.append("python on b"))
        (a.sum() + b.sum() * 2).backward()
        return x.grad

    plain = run(False)
    with al.Lens() as lens:
        traced = run(True)
    assert torch.equal(plain, traced)
    shown = [call.target for call in lens.hook_calls]
    assert shown == (["b", "a"] if python_first else ["a", "b"])
    neg = next(call for call in lens.hook_calls if call.hook == "torch.neg")
    assert torch.equal(neg.grad_in, torch.ones(2)) and torch.equal(neg.grad_out, -torch.ones(2))


def test_a_c_hook_on_an_autograd_grad_input_is_a_step_with_its_values():
    seen: list = []
    with al.Lens() as lens:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.register_hook(seen.append)
        (grad,) = torch.autograd.grad((y * 2).sum(), y)
    (call,) = lens.hook_calls
    assert (call.hook, call.target) == ("list.append", "y") and len(seen) == 1
    assert torch.equal(call.grad_in, seen[0]) and torch.equal(call.grad_out, grad) and not call.modified


def test_a_c_hook_before_a_raising_pre_hook_is_still_a_step():
    with al.Lens() as lens:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.register_hook(torch.neg)

        def boom(grads):
            raise ValueError("no")

        y.grad_fn.register_prehook(boom)
        with pytest.raises(ValueError):
            y.sum().backward()
    assert [(call.hook, call.error) for call in lens.hook_calls] == [("torch.neg", None), ("boom", "ValueError: no")]
    assert torch.equal(lens.hook_calls[0].grad_out, -torch.ones(2))


def test_a_c_hook_on_a_tensor_changed_in_place_later_is_found_by_what_it_did():
    def run(hooked: bool):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        if hooked:
            y.register_hook(torch.neg)
        y.add_(1)
        y.sum().backward()
        return x

    truth = run(False).grad
    with al.Lens() as lens:
        x = run(True)
    p = lens.passes[0]
    assert torch.equal(x.grad, -truth)
    assert torch.equal(p.grads_without_hooks["x"], truth)
    (call,) = lens.hook_calls
    assert call.modified and torch.equal(call.grad_in, torch.ones(2)) and torch.equal(call.grad_out, -torch.ones(2))


def test_a_c_hook_on_an_unnamed_activation_is_found_and_without_hooks_is_right():
    """Grad-CAM style: the hook is registered inside the model's forward, on a tensor with no name."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)

    def forward(x, hooked):
        h = torch.tanh(layer(x))
        if hooked:
            h.register_hook(torch.neg)
        return (h * h).sum()

    x = torch.randn(2, 3)
    forward(x, False).backward()
    truth = layer.weight.grad.clone()
    layer.zero_grad(set_to_none=True)
    with al.Lens() as lens:
        forward(x, True).backward()
    assert torch.equal(lens.passes[0].grads_without_hooks["layer.weight"], truth)
    assert torch.equal(layer.weight.grad, -truth)
    # registered while the Lens was on: known by name (capture/registrations.py); "<C hook>", found by what it did,
    # before that
    assert [call.hook for call in lens.hook_calls] == ["torch.neg"]


# ----------------------------------------------------------------------------- in-place edits are noticed


@pytest.mark.parametrize("mode", ["all", "any"])
def test_a_multi_grad_hook_editing_in_place_makes_without_hooks_differ(mode):
    def edit(grads):
        (grads[0] if mode == "all" else grads).mul_(0.5)

    def run(hooked: bool):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        if hooked:
            torch.autograd.graph.register_multi_grad_hook((y,), edit, mode=mode)
        (y * torch.ones(2)).sum().backward()
        return x.grad

    truth = run(False)
    with al.Lens() as lens:
        hooked = run(True)
    p = lens.passes[0]
    assert torch.equal(hooked, truth * 0.5)
    assert torch.equal(p.grads_without_hooks["x"], truth)
    (call,) = lens.hook_calls
    assert call.modified and call.edited_in_place


# ----------------------------------------------------------------------------- "without hooks": right or unknown


def test_a_raising_hook_makes_the_leaves_it_kept_from_their_gradient_unknown():
    def boom(grad):
        raise ValueError("hook refuses")

    with al.Lens() as lens:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        w = torch.tensor([1.0, 2.0], requires_grad=True)
        a = x * 2
        a.register_hook(boom)
        with pytest.raises(ValueError):
            (a.sum() + (w * 5).sum()).backward()
    p = lens.passes[0]
    assert p.grads_without_hooks["x"] is None and "stopped" in p.unknown["x"]
    assert torch.equal(p.grads_without_hooks["w"], torch.full((2,), 5.0))  # reached before the error


def test_hooks_inside_reentrant_checkpointing_are_named_and_make_values_past_it_unknown():
    torch.manual_seed(0)
    inner = torch.nn.Linear(4, 4)
    block = torch.nn.Sequential(inner, torch.nn.Tanh())
    head = torch.nn.Linear(4, 1)
    inner.register_full_backward_hook(lambda m, gi, go: (gi[0] * 10,))
    x = torch.randn(2, 4, requires_grad=True)
    with al.Lens() as lens:
        head(checkpoint(block, x, use_reentrant=True)).sum().backward()
    p = lens.passes[0]
    (note,) = [text for text in p.notes if "nested backward" in text and "wrote the .grad" not in text]
    assert "inner: module full hook" in note and "CheckpointFunctionBackward" in note
    (written,) = [text for text in p.notes if "wrote the .grad" in text]  # the checkpointed layer's parameters
    assert written.endswith("wrote the .grad of inner.weight, inner.bias: not steps of this pass")
    assert p.grads_without_hooks["x"] is None and "reentrant" in p.unknown["x"]
    assert torch.equal(p.grads_without_hooks["head.weight"], head.weight.grad)  # before the checkpoint: known


# ----------------------------------------------------------------------------- leaves' state before the pass


def test_no_leaf_of_a_large_graph_is_said_to_have_held_a_gradient_it_did_not_hold():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(5, 5) for _ in range(40)])
    with al.Lens() as lens:
        model(torch.randn(2, 5)).sum().backward()
    p = lens.passes[0]
    assert len(p.graph.nodes) > 100
    assert all(node.grad is None for node in p.graph.nodes if node.kind == "leaf")
    assert not any("already held" in (step.note or "") for step in steps_for(p))
    with al.Lens() as lens:  # a second pass: now they do hold one, and the drawing says so before the pass
        model(torch.randn(2, 5)).sum().backward()
    held = [step for step in steps_for(lens.passes[0]) if "already held" in (step.note or "")]
    assert len(held) == 80


def test_hooks_on_backward_functions_are_listed_before_the_pass_with_their_kind_and_order():
    seen: list = []
    with al.Lens() as lens:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.grad_fn.register_prehook(seen.append)
        y.grad_fn.register_hook(lambda gi, go: None)
        y.grad_fn.register_hook(print)
        with contextlib.redirect_stdout(io.StringIO()):
            y.sum().backward()
    listed = [entry.text() for entry in lens.passes[0].inventory]
    assert listed == ["mul → y: node pre hook list.append", "mul → y: node hook <lambda> (1 of 2)",
                      "mul → y: node hook print (2 of 2)"]
    assert [call.hook for call in lens.hook_calls] == ["list.append", "<lambda>", "print"]


# ----------------------------------------------------------------------------- cards and drawing


def test_the_drawing_shows_grad_as_a_post_accumulate_hook_left_it_and_unknown_after_one_in_c():
    from autograd_lens.views.steps import frame

    seen: list = []

    def halve(p):
        p.grad.mul_(0.5)

    with al.Lens() as lens:
        x = torch.tensor(2.0, requires_grad=True)
        w = torch.tensor(1.0, requires_grad=True)
        x.register_post_accumulate_grad_hook(halve)
        w.register_post_accumulate_grad_hook(seen.append)
        (x * 3 + w * 4).backward()
    p = lens.passes[0]
    steps = steps_for(p)
    last = frame(steps, len(steps) - 1)
    x_node = next(e.node for e in p.events if type(e).__name__ == "GradWritten" and e.name == "x")
    w_node = next(e.node for e in p.events if type(e).__name__ == "GradWritten" and e.name == "w")
    assert last.grads[x_node] == al.format_value(x.grad) == "1.5"  # written 3.0, then halved
    assert last.grads[w_node] == "not known"  # a hook in C ran after the write: what it did is not known


def test_no_card_says_a_hook_was_the_only_one_to_change_anything_beside_a_hook_in_c():
    with al.Lens() as lens:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        z = x * 2
        y.register_hook(lambda g: g * 10)
        z.register_hook(torch.neg)
        (y + z).sum().backward()
    notes = " ".join(step.note or "" for step in steps_for(lens.passes[0]))
    assert "only hook that changed anything" not in notes
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], torch.full((2,), 5.0))


# ----------------------------------------------------------------------------- errors are torch's own


@pytest.mark.parametrize("mistake", [
    lambda: torch.tensor(1.0).backward(),
    lambda: (torch.ones(2) * 2).sum().backward(),
    lambda: torch.autograd.grad((torch.ones(2, requires_grad=True) * 2).sum(), [torch.ones(2)]),
])
def test_forgetting_requires_grad_shows_torchs_error_alone(mistake):
    import traceback

    def caught():
        try:
            mistake()
        except Exception as error:  # noqa: BLE001
            return error
        raise AssertionError("no error")

    plain = caught()
    with al.Lens():
        traced = caught()
    assert type(traced) is type(plain) and str(traced) == str(plain)
    assert traced.__context__ is plain.__context__ is None and traced.__cause__ is None
    text = "".join(traceback.format_exception(traced))
    assert "During handling" not in text and "autograd_lens" not in text.split("\n")[-2]


def test_the_command_line_shows_a_failing_scripts_traceback_as_python_does(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(2)\nraise ValueError('bad data')\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    lensed = subprocess.run([sys.executable, "-m", "autograd_lens", str(script), "-o", str(tmp_path / "t.html")],
                            capture_output=True, text=True, check=False)
    assert lensed.returncode == plain.returncode == 1
    assert lensed.stderr.startswith(plain.stderr)  # the same traceback, then one line from the lens
    assert "no backward pass" in lensed.stderr.splitlines()[-1] and "no page written" in lensed.stderr
    assert not (tmp_path / "t.html").exists()
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 2).sum().backward()\n"
                      "raise ValueError('after backward')\n")
    lensed = subprocess.run([sys.executable, "-m", "autograd_lens", str(script), "-o", str(tmp_path / "t.html")],
                            capture_output=True, text=True, check=False)
    assert lensed.returncode == 1 and "ValueError: after backward" in lensed.stderr
    assert "Traceback (most recent call last)" in lensed.stderr and "runpy" not in lensed.stderr
    assert (tmp_path / "t.html").exists() and "1 backward pass" in lensed.stderr


def test_a_tensor_torch_refuses_to_describe_in_the_namespace_does_not_stop_the_recording():
    base = torch.ones(4, requires_grad=True) * 1
    a, b = base.split(2)  # noqa: F841  (in the namespace, as in a notebook)
    base.add_(1)  # now a.grad_fn raises
    x = torch.tensor(2.0, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of the lens
        with al.Lens() as lens:
            (x * 3).backward()
    assert len(lens.passes) == 1 and lens.recording_notes == [] and float(lens.passes[0].leaf_grads["x"]) == 3.0


def test_a_users_torch_profiler_lists_the_same_ops_with_and_without_the_lens():
    from torch.profiler import profile

    def profiled():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.register_hook(lambda g: g * 2)
        with profile() as prof:
            (y * y).sum().backward()
        return sorted((event.key, event.count) for event in prof.key_averages())

    plain = profiled()
    with al.Lens() as lens:
        traced = profiled()
    assert traced == plain
    assert len(lens.passes) == 1 and lens.passes[0].hook_calls


def test_python_code_the_engine_calls_that_is_no_hook_is_not_shown_as_a_hook_call():
    """A callback queued on the engine (what DDP does), called with no arguments at the end of the pass, is noted,
    never listed as a tensor hook; the real hook is listed once, as it fired."""
    ran = []

    def finish():
        ran.append("finish")

    def hook(grad):
        torch.autograd.Variable._execution_engine.queue_callback(finish)
        return grad * 2

    def program():
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.register_hook(hook)
        y.sum().backward()
        return x.grad

    plain = program()
    assert ran == ["finish"]
    with al.Lens() as lens:
        traced = program()
    assert ran == ["finish", "finish"] and torch.equal(traced, plain)
    calls = lens.passes[0].hook_calls
    assert [(call.hook, call.kind, call.target) for call in calls] == [("hook", "tensor", "y")]
    assert any("finish" in note and "not a gradient hook" in note for note in lens.passes[0].notes)


def test_the_garbage_collectors_callbacks_during_a_pass_are_no_hook_and_no_note():
    """With gc thresholds at 1, Python's collector runs (and calls gc.callbacks) from inside the engine, between
    nodes: that is Python's doing, not torch's, so the pass shows no hook call and no 'torch's C++ side' note; the
    gradients are plain torch's."""
    import gc

    from conftest import Double

    collected = []

    def callback(phase, info):
        collected.append(phase)

    def program(x):
        y = Double.apply(Double.apply(x))
        z = (y * y).sum()
        gc.callbacks.append(callback)
        old = gc.get_threshold()
        gc.set_threshold(1, 1, 1)
        try:
            z.backward()
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(callback)

    plain = torch.ones(3, requires_grad=True)
    program(plain)
    x = torch.ones(3, requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        program(x)
    assert collected  # the collector did run during the passes
    assert torch.equal(x.grad, plain.grad)
    assert list(lens.hook_calls) == [] and lens.passes[0].notes == ()


def _train_two_steps(clip: bool, zero: bool):
    """Two SGD steps of a small MLP, a clipping hook on the first layer's weight when ``clip``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x, target = torch.randn(5, 3), torch.randn(5, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    lens = al.Lens(names={"model": model})
    with lens:
        if clip:
            model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
        for _ in range(2):
            if zero:
                optimizer.zero_grad()
            ((model(x) - target) ** 2).mean().backward()
            optimizer.step()
    return lens, model[0].weight.grad.clone()


@pytest.mark.parametrize("zero", [True, False])
def test_without_hooks_after_an_optimizer_step_says_it_is_this_pass_not_another_training_run(zero):
    """After a step that used hook-changed gradients the parameters differ from a run without the hooks: the
    lens's 'without hooks' of the next pass is this pass with its hooks removed (checked against torch), and the
    pass says that a training run without the hooks would differ (it does: checked too)."""
    lens, _ = _train_two_steps(clip=True, zero=zero)
    _, never_hooked = _train_two_steps(clip=False, zero=zero)
    first, second = lens.passes
    assert not any("changed since pass" in note for note in first.notes)
    (note,) = [note for note in second.notes if "changed since pass 1" in note]
    assert note.startswith("model.2.bias, model.2.weight, model.0.bias and 1 more changed since pass 1")
    assert "a run that never had the hooks would have reached other values" in note
    shown = second.grads_without_hooks["model.0.weight"]
    assert not torch.equal(shown, never_hooked)  # why the note is needed: that would be a false statement
    # what it is: this pass with the hook removed, on the parameters as they are (recomputed by hand below)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x, target = torch.randn(5, 3), torch.randn(5, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    handle = model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
    optimizer.zero_grad()
    ((model(x) - target) ** 2).mean().backward()
    optimizer.step()
    handle.remove()
    if zero:
        optimizer.zero_grad()
        ((model(x) - target) ** 2).mean().backward()
        assert torch.equal(shown, model[0].weight.grad)


def test_no_note_when_the_leaves_did_not_change_between_passes():
    x = torch.ones(3, requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        y.register_hook(lambda g: g * 3)
        out = y.sum()
        out.backward(retain_graph=True)
        out.backward()
    assert not any("changed since pass" in note for backward_pass in lens.passes for note in backward_pass.notes)


def test_an_unknown_carried_from_an_earlier_pass_says_so():
    """A leaf not reached because a hook stopped pass 1 is unknown without hooks in pass 2 as well; pass 2's reason
    said "the pass stopped at ValueError ..." as if pass 2 had stopped."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)

    def boom(grad):
        raise ValueError("boom")

    with al.Lens(names={"x": x, "w": w}) as lens:
        y = x * 2
        handle = y.register_hook(boom)
        z = y.sum() + w.sum()
        with pytest.raises(ValueError):
            z.backward(retain_graph=True)
        handle.remove()
        z.backward()
    first, second = lens.passes
    assert first.unknown["x"].startswith("the pass stopped at ValueError: boom")
    assert second.unknown["x"] == "not known since an earlier pass: " + first.unknown["x"]
    assert "w" not in second.unknown and torch.equal(second.grads_without_hooks["w"], torch.tensor([2.0, 2.0]))
