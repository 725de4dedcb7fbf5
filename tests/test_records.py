"""records.copy_tuple: the one-loop copy of what a node received or sent equals the general path (NodeRecorder._copy
and held_bytes), reuses the same copies, and copies each tensor once."""

import contextlib

import pytest
import torch

from autograd_lens.capture.observe import PassObserver
from autograd_lens.capture.records import copy_tuple
from autograd_lens.capture.snapshot import held_bytes
from autograd_lens.capture.structure import structure
from autograd_lens.model import TensorSummary


def _observer() -> PassObserver:
    x = torch.ones(2, requires_grad=True)
    observer = PassObserver(structure=structure([(x * 2).sum()]), roots=(), seeds=(), inputs=(), kind="backward",
                            namespace={}, store_limit=8, memory_budget=None, nested=lambda: False)
    observer.profiling = True  # copies are reused only while the profile function watches
    return observer


def test_copy_tuple_equals_the_general_path():
    small, large, edited = torch.arange(4.0), torch.arange(20.0), torch.zeros(3)
    values = (small, None, large, (small, 3), edited, small.t(), torch.ones(2, 2).expand(2, 2, 2)[0])
    general, fast = _observer(), _observer()
    expected = general._copy(values)
    kept, size = copy_tuple(fast, values)
    assert size == held_bytes(expected) == held_bytes(kept) == (4 + 4 + 3 + 4 + 4) * 4
    assert len(kept) == len(expected)
    for mine, theirs in zip(kept, expected):
        if isinstance(theirs, torch.Tensor):
            assert torch.equal(mine, theirs) and mine.stride() == theirs.stride() and mine.dtype == theirs.dtype
        elif isinstance(theirs, TensorSummary):
            assert mine == theirs
        else:
            assert (mine is None) == (theirs is None) and type(mine) is type(theirs)
    assert kept[0] is kept[3][0]  # one copy of one tensor at one version
    assert kept[0] is not small  # a copy, never the live tensor
    assert set(fast.copies) == set(general.copies)
    again, _ = copy_tuple(fast, (small, edited))
    assert again[0] is kept[0] and again[1] is kept[4]  # what one node sent is what the next receives: not copied again
    edited.add_(1)  # a new version: copied anew
    after, _ = copy_tuple(fast, (edited,))
    assert after[0] is not kept[4] and torch.equal(after[0], torch.ones(3)) and torch.equal(kept[4], torch.zeros(3))


def test_a_pass_removes_each_hook_handle_once_and_the_probe_without_a_call():
    """Work a traced pass does per node, counted: one post-hook registered per node, and no RemovableHandle.remove
    call at all: stop() deletes the post-hooks' keys from their dicts itself (c19ca3f; tests/test_perf_handles.py
    checks none is left), and a probe's removal is a dict deletion too (issue #24)."""
    import torch.nn as nn
    from torch.utils.hooks import RemovableHandle

    import autograd_lens as al
    from autograd_lens.capture.structure import _reachable

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    loss = net(torch.randn(4, 3)).sum()
    nodes = len(_reachable([loss.grad_fn]))
    with al.Lens():  # the once-per-process self-check registers and removes hooks of its own: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    removed = []
    original = RemovableHandle.remove

    def counted(handle):
        removed.append(handle.id)
        return original(handle)

    RemovableHandle.remove = counted
    try:
        with al.Lens(names={"net": net}) as lens:
            loss.backward()
    finally:
        RemovableHandle.remove = original
    assert nodes == len(lens.passes[0].node_runs) + 4 >= 9  # every function ran, and the four parameters' leaves
    assert removed == []  # the lens's own post-hooks and probes: removed by key, no handle kept (c19ca3f)


def test_the_lens_own_node_hooks_run_unwatched_from_their_first_line(monkeypatch):
    """The profile function switches itself off as the lens's own node hook (or its pre-hook on a leaf's
    AccumulateGrad) starts: the hook's own calls (thread checks, pausing) reach it no more; only its start and its
    end do (issue #24). The user's hooks are still seen, before and after it, with what they got."""
    import autograd_lens as al
    from autograd_lens.capture.calls import HookCalls
    from autograd_lens.capture.nodes import NodeRecorder

    own = {NodeRecorder._on_node.__code__: "node", NodeRecorder._before_write.__code__: "leaf"}
    seen: list = []
    original = HookCalls._profile

    def counting(self, frame, event, arg):
        if frame.f_code in own:
            seen.append((own[frame.f_code], event))
        return original(self, frame, event, arg)

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    x.grad = torch.ones(2)  # a .grad before the pass: the lens reads it in a pre-hook on AccumulateGrad
    y = x * 3
    y.register_hook(lambda g: g * 2)
    loss = (y * y).sum()
    monkeypatch.setattr(HookCalls, "_profile", counting)
    with al.Lens(names={"x": x, "y": y}) as lens:
        loss.backward()
    backward_pass = lens.passes[0]
    assert [run.name for run in backward_pass.node_runs] == ["SumBackward0", "MulBackward0", "MulBackward0"]
    runs = 4  # and x's AccumulateGrad
    assert seen.count(("node", "call")) == seen.count(("node", "return")) == runs
    assert seen.count(("leaf", "call")) == seen.count(("leaf", "return")) == 1
    assert len(seen) == 2 * runs + 2  # no c_call, no call of its own helpers
    (call,) = backward_pass.hook_calls
    assert torch.equal(call.grad_in, 2 * 3 * x.detach()) and torch.equal(call.grad_out, 4 * 3 * x.detach())
    assert torch.equal(x.grad, 1 + 4 * 9 * x.detach())


def _hooked_pass(everywhere: bool, monkeypatch) -> str:
    """A pass with Python hooks of every kind the engine calls at a node (tensor hooks on a named and on one output of
    a multi-output node, a node pre- and post-hook, a post-accumulate hook, a leaf with a .grad), as text; with
    ``everywhere`` every node is taken for one with a hook written in C, so that each goes the general way
    (order.arrange_before / arrange_after) the lens skips for nodes without one."""
    import autograd_lens as al
    from autograd_lens.capture.observe import PassObserver

    if everywhere:
        start = PassObserver.start

        def start_everywhere(self):
            start(self)
            self.c_nodes.update(id(fn) for fn in self.shape.nodes)

        monkeypatch.setattr(PassObserver, "start", start_everywhere)
    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    w.grad = torch.ones(3, 4)
    b.register_post_accumulate_grad_hook(lambda leaf: None)
    h = torch.tanh(torch.randn(2, 3) @ w + b)
    h.register_hook(lambda g: g * 0.5)
    left, right = h.split(2, dim=1)
    right.register_hook(lambda g: g + 1)
    z = left * right
    z.grad_fn.register_prehook(lambda grads: (grads[0] * 3,))
    z.grad_fn.register_hook(lambda sent, got: None)
    with al.Lens(names={"w": w, "b": b, "h": h, "left": left, "right": right, "z": z}) as lens:
        z.sum().backward()
    if everywhere:
        monkeypatch.undo()
    backward_pass = lens.passes[0]
    return "\n".join(map(repr, (backward_pass.node_runs, backward_pass.hook_calls, backward_pass.events,
                               backward_pass.grads, backward_pass.grads_without_hooks, backward_pass.notes)))


def test_nodes_without_hooks_in_c_record_what_the_general_way_records(monkeypatch):
    """_record_node skips order.arrange_before/after (and _unexplained its set-up) at a node with no hook written in C
    and no hook call (issue #24): what it records is what the general way records, hook for hook."""
    fast = _hooked_pass(False, monkeypatch)
    general = _hooked_pass(True, monkeypatch)
    assert fast == general
    assert "tensor([[" in fast and "'<lambda>'" in fast  # values and hooks are in the text compared


@pytest.mark.parametrize("profiled", [False, True])
def test_each_node_is_recorded_with_the_users_dispatch_modes_off(monkeypatch, profiled):
    """_on_node enters torch's DisableTorchDispatch guard itself when no profiler is on (hidden_from_user's work
    without its Python object, issue #24) and hidden_from_user when one is, unless nothing could reach Python dispatch
    at that node (no mode on, plain tensors, no Python run by the engine yet in the pass): the Python dispatch key is
    excluded wherever a user TorchDispatchMode could see the lens's copies, and it is back on after."""
    from torch.profiler import profile

    import autograd_lens as al
    from autograd_lens.capture.nodes import NodeRecorder

    with al.Lens():  # the once-per-process self-check traces a pass of its own: before counting
        torch.ones(1, requires_grad=True).sum().backward()
    excluded: list = []
    original = NodeRecorder._record_node

    def checking(self, fn, grad_inputs, grad_outputs):
        excluded.append(torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python))
        return original(self, fn, grad_inputs, grad_outputs)

    monkeypatch.setattr(NodeRecorder, "_record_node", checking)
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 3).sin()
    y.register_hook(lambda g: g * 2)
    with contextlib.ExitStack() as stack:
        if profiled:
            stack.enter_context(profile())
        with al.Lens(names={"x": x, "y": y}) as lens:
            y.sum().backward()
    # with a profiler on, every node under hidden_from_user; without, the guard from the first Python the engine runs
    # (y's hook, before sin's backward) on: before it, no mode is on and every tensor is a plain one, nothing to hide
    # from (snapshot.unseen_by_modes; with a mode on, see test_a_dispatch_mode_on_during_backward_sees_no_lens_op).
    # Without a profiler and with no mode on, the nodes after the hook take the short way (nodes._usual_node: plain
    # tensors only, no guard needed, tests/test_speed_fastpath.py); the one with the hook's call pending, the general.
    assert len(lens.passes[0].node_runs) == 3 and excluded == ([True] * 4 if profiled else [False, True])
    assert not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python)
    assert torch.equal(x.grad, 2 * 3 * torch.cos(3 * x.detach()))


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Logged(torch.Tensor):
    """A tensor subclass whose __torch_dispatch__ logs every op run on it (and unwraps)."""

    ops: list = []

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data):
        self.data_ = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        _Logged.ops.append(str(func))
        unwrap = lambda value: value.data_ if isinstance(value, _Logged) else value  # noqa: E731
        result = func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))
        return torch.utils._pytree.tree_map(lambda v: _Logged(v) if isinstance(v, torch.Tensor) else v, result)


def _mode_program(logged_seed: bool = False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    out = net(torch.randn(5, 3)).reshape(-1)
    return net, out


def test_a_dispatch_mode_on_during_backward_sees_no_lens_op():
    """A TorchDispatchMode entered around backward() is on inside the engine too: the lens records every node under
    the guard then, and the mode logs exactly the ops of a plain backward (the engine's own), none of the lens's."""
    import autograd_lens as al

    with al.Lens():  # the self-check: before comparing
        torch.ones(1, requires_grad=True).sum().backward()
    logs = []
    for traced in (False, True):
        net, out = _mode_program()
        mode = _OpLog()
        lens = al.Lens(names={"net": net})
        if traced:
            lens.__enter__()
        try:
            with mode:
                out.sum().backward()
        finally:
            if traced:
                lens.__exit__(None, None, None)
        logs.append(mode.ops)
        if traced:
            assert len(lens.passes[0].node_runs) == 7
    assert logs[0] == logs[1] and logs[0]


def test_a_gradient_subclass_with_torch_dispatch_sees_no_lens_op():
    """A gradient that is a tensor subclass with __torch_dispatch__ (passed to backward()): the lens's copies of it
    and of everything after it are made under the guard, so the subclass logs only what a plain backward runs."""
    import autograd_lens as al

    with al.Lens():  # the self-check: before comparing
        torch.ones(1, requires_grad=True).sum().backward()
    logs = []
    for traced in (False, True):
        torch.manual_seed(0)
        x = torch.randn(4, requires_grad=True)
        y = (x * 2).tanh()
        seed = _Logged(torch.ones(4))
        _Logged.ops = []
        if traced:
            with al.Lens(names={"x": x}) as lens:
                y.backward(seed)
            assert len(lens.passes[0].node_runs) == 2
        else:
            y.backward(seed)
        logs.append(list(_Logged.ops))
    assert logs[0] == logs[1] and logs[0]


def _adopted_before(grad, arrived) -> bool:
    """The test usual_leaf and _written made before records.adopted (eight reads of both tensors)."""
    try:
        return grad.layout == torch.strided == arrived.layout and grad.numel() > 0 \
            and grad.data_ptr() == arrived.data_ptr() and grad.dtype == arrived.dtype \
            and grad.device == arrived.device and grad.shape == arrived.shape \
            and grad.stride() == arrived.stride() and grad._version == arrived._version
    except Exception:
        return False


def test_adopted_says_what_the_eight_reads_said():
    """records.adopted (Tensor.is_set_to, dtype, version, layouts, elements) against the reads it replaced, on
    what AccumulateGrad makes of an adopted gradient (a detached view) and on every near miss: a copy, another dtype
    over the same bytes, another offset, another stride, no elements, a later version, a sparse tensor."""
    from autograd_lens.capture.records import adopted

    a = torch.randn(4, 6)
    bumped = torch.randn(3)
    bumped_view = bumped.detach()
    cases = {
        "detached": (a.detach(), a, True),
        "transposed, detached": (a.t().detach(), a.t(), True),
        "expanded, detached": (a[0].expand(3, 6).detach(), a[0].expand(3, 6), True),
        "a copy": (a.clone(), a, False),
        "another dtype over the same bytes": (a.view(torch.int32), a, False),
        "another offset": (a[1:], a[:3], False),
        "the same memory, transposed": (a.t(), a, False),
        "another shape over the same memory": (a.view(6, 4), a, False),
        "no elements": (torch.empty(0), torch.empty(0), False),
        "no elements, detached": (a[:0].detach(), a[:0], False),
    }
    for name, (grad, arrived, expected) in cases.items():
        assert _adopted_before(grad, arrived) is expected, name
        assert adopted(grad, arrived, arrived._version) is expected, name
    bumped_view.add_(1)  # shares the version counter: both at the new version
    assert adopted(bumped_view, bumped, bumped._version)
    assert not adopted(bumped_view, bumped, bumped._version - 1)  # the copy kept was of an earlier version
    sparse = torch.randn(3).to_sparse()
    assert not adopted(sparse, sparse, sparse._version)  # (layouts read first: no storage is asked for)
