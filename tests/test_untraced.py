"""Backward passes the lens leaves alone (docs/guarantees.md: ``autograd.grad(..., is_grads_batched=True)``,
``torch.func`` transforms, another thread's backward) are said, not passed over in silence: each kind gets a note
with how many ran, the recording notes say it once, and a cell that recorded nothing says why instead of asking for
a ``backward()`` the user did call. The autograd calls ``torch.compile`` makes while it compiles are not passes of
the user's program: nothing is said about them. Found 2026-11-27: a vmap'ed grad in a Lens showed no pass and no note
while the user's hook ran, and "call 1 of 1" for a module hook's second call."""

from __future__ import annotations

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
