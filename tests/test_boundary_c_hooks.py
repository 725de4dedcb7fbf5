"""A hook written in C on a module's output, followed at the module's boundary by the module's full backward
pre-hook: torch runs that one in a pre-hook of the boundary's node, after every tensor hook of the output.  What the
C hook passed on is what the module's pre-hook received, not what the node received after that pre-hook edited it
in place (model_programs found the difference: compiled_programs seed 255, shrunk to plain code)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn

import autograd_lens as al


def _program(edit: str, traced: bool):
    torch.manual_seed(0)
    norm = nn.LayerNorm(4)
    log = []

    def module_pre(module, grad_output):
        log.append(("module_pre", grad_output[0].clone()))
        if edit == "in place":
            grad_output[0].mul_(0.5)
            return None
        return (grad_output[0] * 0.5,) if edit == "returns" else None

    def python_hook(g):
        log.append(("python", g.clone()))
        return g * 3

    norm.register_full_backward_pre_hook(module_pre)
    x = torch.randn(2, 4, requires_grad=True)
    out = norm(x)
    out.register_hook(python_hook)
    out.register_hook(torch.neg)
    loss = (out * torch.arange(4.0)).sum()
    if traced:
        with al.Lens() as lens:
            loss.backward()
        return lens.passes[-1], log, x.grad.clone()
    loss.backward()
    return None, log, x.grad.clone()


@pytest.mark.parametrize("edit", ["in place", "returns", "observes"])
def test_a_c_hook_before_a_modules_pre_hook_passes_on_what_that_hook_received(edit):
    _, plain_log, plain_grad = _program(edit, traced=False)
    backward_pass, log, grad = _program(edit, traced=True)
    assert torch.equal(grad, plain_grad)
    assert [kind for kind, _ in log] == [kind for kind, _ in plain_log] == ["python", "module_pre"]
    calls = [call for call in backward_pass.hook_calls if call.target is not None]
    neg = next(call for call in calls if call.hook == "torch.neg")
    python = next(call for call in calls if call.hook == "python_hook")
    pre = next(call for call in calls if call.kind == "module_full_pre")
    assert torch.equal(python.grad_in, plain_log[0][1]) and torch.equal(python.grad_out, plain_log[0][1] * 3)
    assert torch.equal(neg.grad_in, plain_log[0][1] * 3)  # what the hook before it passed on
    assert torch.equal(neg.grad_out, plain_log[1][1])  # what the module's pre-hook received (torch's own log)
    assert torch.equal(pre.grad_in[0], plain_log[1][1])
