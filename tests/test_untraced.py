"""Backward passes the lens leaves alone (docs/guarantees.md: ``autograd.grad(..., is_grads_batched=True)``,
``torch.func`` transforms, another thread's backward) are said, not passed over in silence: each kind gets a note
with how many ran, the recording notes say it once, and a cell that recorded nothing says why instead of asking for
a ``backward()`` the user did call. The autograd calls ``torch.compile`` makes while it compiles are not passes of
the user's program: nothing is said about them. Found 2026-11-27: a vmap'ed grad in a Lens showed no pass and no note
while the user's hook ran, and "call 1 of 1" for a module hook's second call."""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.views.trace_display import events_bundle


def batched(log):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y.register_hook(lambda g: log.append(g.clone()) or g * 3)
    (g,) = torch.autograd.grad(y, x, torch.eye(2), is_grads_batched=True)
    return g


def left_alone(lens):
    return [n.message for n in lens.notes if n.code == "untraced_pass"]


def test_a_vmapped_grad_is_said_and_unchanged():
    plain_log, log = [], []
    plain = batched(plain_log)
    with al.Lens() as lens:
        shown = batched(log)
        shown_again = batched(log)
    assert torch.equal(shown, plain) and torch.equal(shown_again, plain)
    assert torch.equal(plain, torch.tensor([[6.0, 0.0], [0.0, 12.0]]))
    assert len(log) == 2 * len(plain_log) == 2  # the hook ran once per pass, as without the lens
    assert lens.passes == [] and lens.hook_calls == []
    (message,) = left_alone(lens)
    assert message.startswith("torch.autograd.grad(..., is_grads_batched=True) ran a backward pass here twice")
    assert "not shown" in message and "counts the recorded passes only" in message
    assert lens.recording_notes == ["torch.autograd.grad(..., is_grads_batched=True) ran a backward pass: not "
                                    "recorded (left alone)"]
    page = events_bundle(lens)["text/html"]
    assert "leaves alone" in page and "call <code>loss.backward()</code>" not in page


def test_a_cell_with_no_backward_at_all_still_asks_for_one():
    with al.Lens() as lens:
        torch.ones(2, requires_grad=True).sum()
    assert left_alone(lens) == [] and "call <code>loss.backward()</code>" in events_bundle(lens)["text/html"]


def test_torch_func_and_another_thread_are_said_with_their_counts():
    from torch.func import grad

    x = torch.randn(3, requires_grad=True)
    with al.Lens() as lens:
        value = grad(lambda t: (t * t).sum())(torch.ones(2))
        for _ in range(3):
            worker = threading.Thread(target=lambda: (x * 3).sum().backward())
            worker.start()
            worker.join()
        (x * x).sum().backward()  # a pass the lens records
    assert torch.equal(value, torch.full((2,), 2.0))
    assert torch.allclose(x.grad, 9 + 2 * x.detach())  # three passes of 3 on another thread, then 2x
    assert len(lens.passes) == 1
    messages = left_alone(lens)
    assert [m.split(" ran ")[0] for m in messages] == ["a torch.func transform (grad, vjp, jacrev, vmap, ...)",
                                                        "another thread"]
    assert "here once" in messages[0] and "here 3 times" in messages[1]


def test_a_module_hook_whose_call_in_a_vmapped_pass_is_not_counted_says_so():
    """The hook ran twice; the recorded pass holds its second call, shown as call 1 of the recorded passes: the
    note says that the count covers the recorded passes only."""
    log = []
    with al.Lens() as lens:
        layer = nn.Linear(3, 3)
        layer.register_full_backward_hook(lambda module, grad_input, grad_output: log.append(1))
        x = torch.randn(3, requires_grad=True)
        torch.autograd.grad(layer(x), x, torch.eye(3), is_grads_batched=True)
        layer(x).sum().backward()
    assert len(log) == 2
    assert [call.invocation for call in lens.hook_calls] == [1]
    assert len(left_alone(lens)) == 1


def test_what_torch_compile_runs_while_it_compiles_is_not_said():
    layer = nn.Linear(3, 1)
    compiled = torch.compile(layer, backend="aot_eager")
    x = torch.randn(2, 3)
    with al.Lens() as lens:
        compiled(x).sum().backward()
    assert left_alone(lens) == [] and lens.recording_notes == []


# --- compiled autograd -------------------------------------------------------------------------------------------
# Found 2026-11-28: with compiled autograd on (torch._dynamo.config.compiled_autograd, or its _enable), the lens put
# its post-hook on every node; compiled autograd traced those into the graph it compiles (a capture of its own,
# not the user's) and ran them outside any node, and the lens warned "could not record backward pass 1
# (AttributeError: 'NoneType' object has no attribute 'next_functions')" and said nothing else.

def compiled_autograd_program(log, lens=None, passes=1):
    """A hooked pass under compiled autograd (backend "eager": no compiler needed), then a usual pass."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3)
    before = dict(counters["compiled_autograd"])
    with lens if lens is not None else contextlib.nullcontext():
        with compiled_autograd._enable(torch.compile(backend="eager")):
            for _ in range(passes):
                y = (w * x).tanh()
                y.register_hook(lambda g: log.append(g.clone()) or g * 2)
                y.sum().backward()
        compiled = w.grad.clone()
        (w * 3).sum().backward()  # compiled autograd off again: a pass the lens records
    made = {key: value - before.get(key, 0) for key, value in counters["compiled_autograd"].items()}
    return compiled, w.grad.clone(), made


def test_a_compiled_autograd_pass_is_left_alone_and_said(recwarn):
    import torch._dynamo

    torch._dynamo.reset()
    plain_log: list = []
    plain = compiled_autograd_program(plain_log, passes=2)
    torch._dynamo.reset()
    lens_log: list = []
    lens = al.Lens()
    seen = compiled_autograd_program(lens_log, lens, passes=2)
    torch._dynamo.reset()
    # nothing changed: values, the user's hook calls, what compiled autograd captured and compiled
    assert all(torch.equal(a, b) for a, b in zip(plain[:2], seen[:2]))
    assert len(plain_log) == len(lens_log) == 2 and all(torch.equal(a, b) for a, b in zip(plain_log, lens_log))
    assert plain[2] == seen[2] and plain[2].get("captures", 0) >= 1
    assert not [w for w in recwarn if "autograd_lens" in str(w.message)]
    # said: two passes left alone, the usual pass after them recorded
    assert [m.split(" ran ")[0] for m in left_alone(lens)] == [
        "compiled autograd (torch._dynamo.config.compiled_autograd)"]
    assert "here twice" in left_alone(lens)[0]
    assert len(lens.passes) == 1 and lens.hook_calls == []
    assert [run.name for run in lens.passes[0].node_runs] == ["SumBackward0", "MulBackward0"]


def test_compiled_autograd_turned_on_by_the_config_around_a_compiled_step():
    """``torch._dynamo.config.compiled_autograd = True``: a compiled step that calls backward() runs it under
    compiled autograd; left alone and said, the parameter's hook called as without the lens."""
    import torch._dynamo

    def run(lens=None):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        x = torch.randn(4, 3)
        log = []
        model.weight.register_hook(lambda g: log.append(g.clone()))

        @torch.compile(backend="eager")
        def step(x):
            loss = model(x).tanh().sum()
            loss.backward()
            return loss

        with lens if lens is not None else contextlib.nullcontext():
            step(x)
        return model.weight.grad, log

    with torch._dynamo.config.patch(compiled_autograd=True):
        torch._dynamo.reset()
        plain, plain_log = run()
        torch._dynamo.reset()
        lens = al.Lens()
        seen, seen_log = run(lens)
        torch._dynamo.reset()
    assert torch.equal(plain, seen) and len(plain_log) == len(seen_log) == 1
    assert torch.equal(plain_log[0], seen_log[0])
    assert lens.passes == [] and [m.split(" ran ")[0] for m in left_alone(lens)] == [
        "compiled autograd (torch._dynamo.config.compiled_autograd)"]
