"""The lens's post-hook on every node and its read of each node's pre-hook dict (capture/attach.py) leave torch's
graph and hook numbering as they were, and find the user's node hooks as registering through handles does."""

from __future__ import annotations

import torch
from torch.autograd.function import _HookMixin
from torch.utils.hooks import RemovableHandle

import autograd_lens as al
from autograd_lens.capture import attach as attach_module
from autograd_lens.capture.structure import _reachable


def _pre_dict(fn):
    """The pre-hook dict torch keeps on ``fn`` (None: none), read without changing the node."""
    found = []
    original = _HookMixin.__dict__["_register_hook"]

    def reader(backward_hooks, hook):
        found.append(backward_hooks)
        raise LookupError

    _HookMixin._register_hook = staticmethod(reader)
    try:
        fn.register_prehook(print)
    except LookupError:
        pass
    finally:
        _HookMixin._register_hook = original
    return found[0]


def _graph():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    h = (x @ w).tanh()
    return w, h, (h * h).sum()


def test_a_traced_pass_leaves_no_pre_hook_dict_on_the_nodes():
    _, _, loss = _graph()
    nodes = _reachable([loss.grad_fn])
    assert all(_pre_dict(fn) is None for fn in nodes)  # plain torch: none
    with al.Lens():
        loss.backward(retain_graph=True)
    assert [_pre_dict(fn) for fn in nodes] == [None] * len(nodes)


def test_a_traced_pass_takes_no_hook_handle_ids_of_torch():
    _, _, loss = _graph()
    before = RemovableHandle.next_id
    with al.Lens():
        loss.backward()
    assert RemovableHandle.next_id == before  # it took two per node before


def test_the_users_node_hooks_are_found_and_run_as_without_the_lens():
    calls = []
    results = []
    for traced in (False, True):
        torch.manual_seed(0)
        w, h, loss = _graph()
        pre = h.grad_fn.register_prehook(lambda g: calls.append(("pre", traced)) or (g[0] * 2,))
        post = h.grad_fn.register_hook(lambda gi, go: calls.append(("post", traced)))
        if traced:
            with al.Lens() as lens:
                loss.backward()
            shown = [(c.kind, c.hook, c.target) for c in lens.passes[-1].hook_calls]
            assert shown == [("node_pre", "<lambda>", "tanh → h"), ("node", "<lambda>", "tanh → h")]
            (pre_call,) = [c for c in lens.passes[-1].hook_calls if c.kind == "node_pre"]
            assert torch.equal(pre_call.grad_out[0], pre_call.grad_in[0] * 2)
        else:
            loss.backward()
        results.append(w.grad.clone())
        pre.remove()
        post.remove()
    assert torch.equal(results[0], results[1])  # the same graph, the same gradient, the lens watching or not
    assert calls == [("pre", False), ("post", False), ("pre", True), ("post", True)]


def test_attach_finds_what_the_handles_way_finds():
    def hooked():
        _, h, loss = _graph()
        h.grad_fn.register_prehook(print)
        h.grad_fn.register_hook(print)
        return _reachable([loss.grad_fn])

    def observe(grad_inputs, grad_outputs):
        return None

    fast_nodes, slow_nodes = hooked(), hooked()
    key = object()
    fast = attach_module.attach(fast_nodes, observe, key)
    slow = attach_module.attach_with_handles(slow_nodes, observe, key)
    try:
        assert [list(d.values()) for d in fast[0]] == [list(d.values()) for d in slow[0]]
        assert [list(d.values()) if d is not None else [] for d in fast[1]] == [list(d.values()) for d in slow[1]]
        assert sum(d is not None for d in fast[1]) == 1  # only the node the user gave a pre-hook has a dict
    finally:
        attach_module.detach(fast[0], key)
        attach_module.detach(slow[0], key)
    assert all(list(d.values()) in ([], [print]) for d in fast[0])
    assert _HookMixin.__dict__["_register_hook"].__func__.__module__ == "torch.autograd.function"


def test_another_threads_registration_during_attach_goes_to_torch():
    # what attach puts in place answers only the lens's own two calls: another hook's registration is torch's
    _, h, loss = _graph()
    nodes = _reachable([loss.grad_fn])
    seen = []

    def observe(grad_inputs, grad_outputs):
        if not seen:
            seen.append(h.grad_fn.register_hook(print))  # registered while hooks are attached: torch's handle
        return None

    key = object()
    posts, _ = attach_module.attach(nodes, observe, key)
    try:
        handle = h.grad_fn.register_hook(print)
        assert isinstance(handle, RemovableHandle)
        handle.remove()
    finally:
        attach_module.detach(posts, key)


def test_where_torch_calls_another_register_function_the_handles_way_is_taken(monkeypatch):
    # a torch (or a library) where Function._register_hook is not _HookMixin's: attach's own never runs
    import torch.autograd.function as function

    torch_register = _HookMixin.__dict__["_register_hook"].__func__
    monkeypatch.setattr(function.Function, "_register_hook", staticmethod(lambda d, h: torch_register(d, h)),
                        raising=False)
    _, h, loss = _graph()
    h.grad_fn.register_prehook(print)
    nodes = _reachable([loss.grad_fn])

    def observe(grad_inputs, grad_outputs):
        return None

    key = object()
    posts, pres = attach_module.attach(nodes, observe, key)
    try:
        assert [list(d.values()) for d in posts] == [[observe]] * len(nodes)  # once on each node, the first too
        assert [list(d.values()) for d in pres if d] == [[print]]
        assert all(d is not None for d in pres)  # the handles' way: a dict read (or left) on every node
    finally:
        attach_module.detach(posts, key)
    assert all(not d for d in posts)
