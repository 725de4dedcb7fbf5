"""The short ways of capture/unhooked.py (issue #24) compute what its general ways compute.

``Unhooked.on_node`` runs a diverged node again with grad mode switched off once (not a ``torch.no_grad()`` and a
``hidden_from_user`` block per value) and reads which saved tensors a node type has once per type.  These tests
check the state it relies on (the caller hid the lens's work), that each node run again gives what the general
``run_node`` gives, that the per-type look-up answers as ``saved.saved_tensors_packed``, and the values without
hooks against plain torch with grad mode on in the hooks (``create_graph=True``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import replay, unhooked
from autograd_lens.capture.saved import saved_tensors_packed
from autograd_lens.capture.snapshot import hidden_from_user
from autograd_lens.model import values_equal

_PYTHON_KEY = torch._C.DispatchKey.Python


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def _program(hooked: bool, create_graph: bool = False, pack: bool = False, custom: bool = True):
    """A graph with broadcasting (sum_to_size), a dtype change, a module hook boundary, a custom Function
    (``custom``), a split and a matmul; hooks that change gradients (``hooked``) on three tensors.  Returns the
    leaves' .grad by the names the lens gives them."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    layer.register_full_backward_hook(lambda module, gi, go: None)
    x = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    d = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    if pack:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            h = torch.tanh(layer(x) + b)
    else:
        h = torch.tanh(layer(x) + b)
    if hooked:
        h.register_hook(lambda g: g * 0.5)
    h2 = (Triple.apply(h) if custom else h * 3) * d.float()
    first, second = h2.split(2, dim=0)
    if hooked:
        first.register_hook(lambda g: g * 0.5)
        second.register_hook(lambda g: g - 1)
    out = (first.sum() + (second @ torch.ones(4, 2)).sum()).double() * 2
    out.backward(create_graph=create_graph)
    return {"x": x.grad, "b": b.grad, "d": d.grad, "layer.weight": layer.weight.grad, "layer.bias": layer.bias.grad}


def _general_run_node(fn, grads):
    """``unhooked.run_node`` as it was before the cut (commit cfbce34): its own ``no_grad()`` and
    ``hidden_from_user`` blocks, ``saved.saved_tensors_packed``."""
    name = fn.name()
    if isinstance(fn, replay._PYTHON_NODE):
        if type(fn).__name__ not in replay._IDENTITY_NODES:
            return replay.Unknown(f"{name}'s backward is Python code (a custom autograd.Function or torch's own, "
                                    "e.g. reentrant checkpointing); running it again could change your program")
    elif type(fn).__module__ != "builtins":
        return replay.Unknown(f"{name} is not one of torch's C++ backward functions, so it is not run again")
    elif saved_tensors_packed(fn):
        return replay.Unknown(f"{name}'s saved tensors were packed by a saved-tensor hook (e.g. checkpointing); "
                                "unpacking them again would run that hook")
    with torch.no_grad(), hidden_from_user():
        outputs = tuple(grads) if isinstance(fn, replay._PYTHON_NODE) else fn(*grads)
        outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
        return replay.reduce_outputs(fn, outputs)


def _warm_up():
    """The once-per-process self-check runs before a test replaces anything."""
    with al.Lens():
        (torch.ones(2, requires_grad=True) * 2).sum().backward()


def test_a_node_run_again_gives_what_the_general_run_node_gives(monkeypatch):
    _warm_up()
    general = _general_run_node
    fast = unhooked.run_again
    seen = []

    def checked(fn, grads, *read):  # read: next_functions and _input_metadata read already (Unhooked's caches)
        assert not torch.is_grad_enabled()  # on_node switched grad mode off
        # the caller hid the lens's work, or (nodes._usual_node) nothing it runs can reach Python dispatch: no mode,
        # no profiler, plain tensors (replay refuses saved tensors that dispatch)
        assert torch._C._dispatch_tls_is_dispatch_key_excluded(_PYTHON_KEY) or (
            not torch._C._len_torch_dispatch_stack() and not torch._C._autograd._profiler_enabled()
            and all(grad is None or type(grad) is torch.Tensor for grad in grads))
        got = fast(fn, grads, *read)
        expected = general(fn, grads)  # its own no_grad() and hidden_from_user blocks, as before the cut
        assert type(got) is type(expected)
        assert got == expected if isinstance(got, replay.Unknown) else values_equal(got, expected), fn.name()
        assert _packed_agrees(fn)
        seen.append(fn.name())
        return got

    monkeypatch.setattr(unhooked, "run_again", checked)
    with al.Lens() as lens:
        _program(hooked=True)
    assert "SplitBackward0" in seen and "TripleBackward" in seen, seen
    assert lens.passes[0].unknown  # behind the custom Function: not known, with why
    seen.clear()
    with al.Lens() as lens:
        _program(hooked=True, custom=False)
    assert len(seen) >= 10, seen  # the nodes below the first changing hook were run again
    assert {"SplitBackward0", "ToCopyBackward0", "TanhBackward0", "AddBackward0", "AddmmBackward0"} <= set(seen), seen
    assert lens.passes[0].unknown == {}


def _packed_agrees(fn) -> bool:
    return replay.packed(fn) == saved_tensors_packed(fn)


def test_saved_tensors_packed_by_a_hook_are_found_by_the_per_type_look_up(monkeypatch):
    _warm_up()
    answers = []

    def checked(fn, grads, *read):
        answers.append((fn.name(), replay.packed(fn), saved_tensors_packed(fn)))
        return fast(fn, grads, *read)

    fast = unhooked.run_again
    monkeypatch.setattr(unhooked, "run_again", checked)
    with al.Lens() as lens:
        _program(hooked=True, pack=True, custom=False)
    assert answers and all(mine == general for _, mine, general in answers), answers
    assert any(mine for _, mine, _ in answers)  # the packed nodes (tanh, add, addmm) are said packed
    assert any("saved-tensor hook" in reason for reason in lens.passes[0].unknown.values())


def test_values_without_hooks_equal_plain_torch_with_grad_mode_on_in_the_hooks():
    for create_graph in (False, True):
        expected = _program(hooked=False, create_graph=create_graph, custom=False)
        with al.Lens() as lens:
            hooked = _program(hooked=True, create_graph=create_graph, custom=False)
        assert torch.is_grad_enabled()  # as it was before the pass
        plain_hooked = _program(hooked=True, create_graph=create_graph, custom=False)
        assert all(torch.equal(hooked[key], plain_hooked[key]) for key in hooked)  # the lens changed nothing
        backward_pass = lens.passes[0]
        assert backward_pass.unknown == {}
        assert sorted(backward_pass.grads_without_hooks) == sorted(expected)
        for name, grad in backward_pass.grads_without_hooks.items():
            assert not torch.equal(hooked[name], expected[name])  # every leaf's gradient was changed by a hook
            assert grad.dtype == expected[name].dtype and torch.equal(grad, expected[name].detach()), name
