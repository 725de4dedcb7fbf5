"""The lens's post-hook on every node is kept as its dict's weak reference and key, not as a handle object per node
(issue #24: fewer objects alive during the user's backward, so fewer for the cyclic collector to go through), and
it is still removed from every node after the pass.  Counted here, never timed."""

from __future__ import annotations

import gc

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

import autograd_lens as al
from autograd_lens.capture.structure import _reachable


def _handles() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is RemovableHandle)


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(10) for layer in (nn.Linear(4, 4), nn.Tanh())])
    return model, torch.randn(2, 4)


def test_no_handle_object_per_node_while_the_pass_runs():
    model, x = _model()
    seen = {}

    def look(grad):
        seen["during"] = _handles()

    with al.Lens(names={"model": model, "x": x}) as lens:
        out = model(x).sum()
        out.register_hook(look)
        nodes = len(_reachable([out.grad_fn]))
        functions = sum(1 for fn in _reachable([out.grad_fn]) if fn.name() != "torch::autograd::AccumulateGrad")
        seen["before"] = _handles()
        out.backward()
    assert nodes > 40
    assert seen["during"] - seen["before"] <= 1, seen  # before: one per node
    assert len(lens.passes[0].node_runs) == functions  # every backward function recorded


def test_the_lens_hooks_are_removed_from_every_node():
    model, x = _model()
    out = model(x).sum()
    nodes = _reachable([out.grad_fn])
    with al.Lens(names={"model": model, "x": x}) as lens:
        out.backward(retain_graph=True)
    traced = {name: p.grad.clone() for name, p in model.named_parameters()}
    assert len(lens.passes[0].node_runs) == sum(1 for fn in nodes if fn.name() != "torch::autograd::AccumulateGrad")
    for fn in nodes:  # what is left in each node's post-hook dict: nothing of the lens's
        handle = fn.register_hook(_mine)
        left = handle.hooks_dict_ref()
        assert list(left.values()) == [_mine], fn.name()
        handle.remove()
    model.zero_grad(set_to_none=True)
    out.backward()  # untraced, the same graph: the same values
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, traced[name]), name


def _mine(grad_inputs, grad_outputs):
    return None
