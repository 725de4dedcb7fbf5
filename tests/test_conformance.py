"""Conformance: code the lens did not write behaves the same with and without it.

Modelled on the categories of PyTorch's own autograd tests.  Each scenario runs plainly and inside a
``Lens`` (``run_plain_and_traced``) and the two outcomes must be identical: returned values, the
exception raised if any, every warning, and how often user code ran (forwards, unpack hooks, custom
backwards, hooks), which each scenario counts and returns.
"""

from __future__ import annotations

import cProfile
import functools
import gc
import pstats
import sys
import threading
import weakref

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import assert_identical, live_recorders, run_plain_and_traced


def same(scenario, **lens_options):
    plain, traced, lens = run_plain_and_traced(scenario, **lens_options)
    assert_identical(plain, traced)
    assert live_recorders() == []
    return plain, lens


def grads(*tensors):
    return [None if t.grad is None else t.grad.clone() for t in tensors]


# ----------------------------------------------------------------------------- checkpointing


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_with_a_modifying_hook_downstream(reentrant):
    def scenario():
        calls = []
        net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Tanh())
        x = torch.randn(8, 4, requires_grad=True)

        def segment(inp):
            calls.append(1)
            return net(inp)

        h = checkpoint(segment, x, use_reentrant=reentrant)
        h.register_hook(lambda g: g.clamp(-0.05, 0.05))
        (h * 2).sum().backward()
        return {"forwards": len(calls), "grads": grads(x, *net.parameters()),
                "stats": [net[1].running_mean.clone(), int(net[1].num_batches_tracked)]}

    plain, lens = same(scenario)
    assert plain["returned"]["forwards"] == 2 and plain["returned"]["stats"][1] == 2
    (backward_pass,) = lens.passes
    # the checkpointed segment is never run again: what lies behind it is unknown, with the reason
    assert backward_pass.grads_without_hooks["x"] is None
    reason = backward_pass.unknown["x"]
    assert ("Python code" in reason) if reentrant else ("saved-tensor hook" in reason)
    # reentrant checkpointing runs its own backward inside the pass: not mixed into this one
    assert ("net.0.weight" in backward_pass.leaf_grads) is not reentrant


def test_selective_checkpoint_with_context_fn():
    def scenario():
        x = torch.linspace(0, 1, 3, requires_grad=True)
        context = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.sin.default])
        out = checkpoint(lambda t: t.sin().cos().exp(), x, use_reentrant=False, context_fn=context)
        out.sum().backward()
        return grads(x)

    same(scenario)


def test_checkpoint_debug_mode():
    def scenario():
        a = torch.linspace(0, 1, 4, requires_grad=True)
        checkpoint(lambda t: t.sin().exp(), a, use_reentrant=False, debug=True).sum().backward()
        return grads(a)

    same(scenario)


def test_nested_checkpoints():
    def scenario():
        calls = {"inner": 0, "outer": 0}
        x = torch.randn(3, requires_grad=True)

        def inner(t):
            calls["inner"] += 1
            return t.sin() * 2

        def outer(t):
            calls["outer"] += 1
            return checkpoint(inner, t.exp(), use_reentrant=False).cos()

        checkpoint(outer, x, use_reentrant=False).sum().backward()
        return {"calls": calls, "grads": grads(x)}

    same(scenario)


# ----------------------------------------------------------------------------- saved-tensor hooks


def test_saved_tensor_hooks_run_as_often_and_where_they_would():
    def scenario():
        packs, unpacks = [], []

        def unpack(t):
            node = torch._C._current_autograd_node()
            unpacks.append(node.name() if node is not None else None)
            return t

        x = torch.ones(3, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(1) or t, unpack):
            y = (x * x).exp()
        y.register_hook(lambda g: g * 2)  # makes the lens compute values without hooks
        y.sum().backward()
        return {"packs": len(packs), "unpacks": unpacks, "grads": grads(x)}

    plain, lens = same(scenario)
    assert plain["returned"]["unpacks"] == ["ExpBackward0", "MulBackward0", "MulBackward0"]
    assert [call.hook for call in lens.hook_calls] == ["<lambda>"]  # unpack calls are not gradient hooks


def test_one_shot_unpack_hooks_and_drawing_the_graph():
    import autograd_lens as al

    storage = {}

    def make():
        storage.clear()
        x = torch.tensor([1.0, 2.0], requires_grad=True)

        def pack(t):
            storage[len(storage)] = t
            return len(storage) - 1

        with torch.autograd.graph.saved_tensors_hooks(pack, storage.pop):
            z = (x.exp() * x).sum()
        return x, z

    def scenario():
        x, z = make()
        z.backward()
        return grads(x)

    same(scenario)
    x, z = make()
    drawing = al.graph(z)  # drawing reads no packed tensor ...
    z.backward()  # ... so the one-shot unpack still works
    assert "packed by a saved-tensor hook" in drawing.to_dot()
    assert torch.allclose(x.grad, x.detach().exp() * (x.detach() + 1))


# ----------------------------------------------------------------------------- sparse


def test_sparse_gather_and_embedding_with_hooks():
    def scenario():
        x = torch.randn(10, 10, requires_grad=True)
        out = torch.gather(x, 0, torch.randint(10, (5, 10)), sparse_grad=True)
        out.register_hook(lambda g: g * 2)
        out.sum().backward()
        emb = nn.Embedding(10, 3, sparse=True)
        h = emb(torch.tensor([1, 2, 1]))
        h.register_hook(lambda g: g * 3)
        h.sum().backward()
        return {"x": x.grad.to_dense(), "emb": emb.weight.grad.to_dense(), "layout": str(emb.weight.grad.layout)}

    plain, lens = same(scenario)
    (first, second) = lens.passes
    assert second.leaf_grads["emb.weight"].kind == "sparse_coo"


# ----------------------------------------------------------------------------- gradcheck, anomaly mode


def test_gradcheck_and_gradgradcheck():
    def scenario():
        x = torch.randn(3, dtype=torch.double, requires_grad=True)
        w = torch.randn(3, dtype=torch.double, requires_grad=True)
        function = lambda a, b: (a * b).sin().sum()  # noqa: E731
        return [torch.autograd.gradcheck(function, (x, w)), torch.autograd.gradgradcheck(function, (x, w))]

    plain, lens = same(scenario)
    assert plain["returned"] == [True, True] and len(lens.passes) > 4


def test_anomaly_mode_reports_the_same_error():
    class NanBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 1

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    def scenario():
        x = torch.ones(2, requires_grad=True)
        with torch.autograd.detect_anomaly():
            NanBackward.apply(x).sum().backward()
        return grads(x)

    plain, lens = same(scenario)
    assert "NanBackwardBackward" in plain["raised"]
    assert lens.passes[0].error is not None


# ----------------------------------------------------------------------------- custom Functions


def test_custom_function_backward_runs_once_and_cycles_are_freed():
    class Scale(torch.autograd.Function):
        calls = 0

        @staticmethod
        def forward(ctx, a):
            out = a * 3
            ctx.out = out  # a reference cycle through ctx
            return out

        @staticmethod
        def backward(ctx, g):
            Scale.calls += 1
            return g * 3

    def scenario():
        Scale.calls = 0
        x = torch.ones(2, requires_grad=True)
        y = Scale.apply(x)
        y.register_hook(lambda g: g * 2)
        alive = weakref.ref(y)
        (y * y).sum().backward()
        del y
        gc.collect()
        return {"calls": Scale.calls, "grads": grads(x), "freed": alive() is None}

    plain, lens = same(scenario)
    assert plain["returned"]["calls"] == 1
    assert "Python code" in lens.passes[0].unknown["x"]


def test_create_graph_with_full_backward_hooks():
    def scenario():
        seen = []
        lin = nn.Linear(3, 2)
        lin.register_full_backward_hook(lambda m, gi, go: seen.append(len(gi)) or (gi[0] * 0.5,))
        x = torch.randn(4, 3, requires_grad=True)
        (g,) = torch.autograd.grad(lin(x).tanh().sum(), x, create_graph=True)
        g.pow(2).sum().backward()
        return {"seen": seen, "grads": grads(x, *lin.parameters())}

    same(scenario)


# ----------------------------------------------------------------------------- threads, profilers, modes


def test_backward_in_other_threads_is_neither_broken_nor_recorded():
    w = torch.randn(16, 16, requires_grad=True)

    def scenario():
        errors, results = [], []

        def worker(seed):
            try:
                generator = torch.Generator().manual_seed(seed)
                x = torch.randn(4, 16, generator=generator)
                (g,) = torch.autograd.grad(torch.tanh(x @ w).sum(), w)
                results.append(float(g.sum()))
                results.append(sys.getprofile() is None)
            except Exception as error:  # pragma: no cover - reported below
                errors.append(repr(error))

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        x = torch.randn(4, 16, requires_grad=True)
        y = torch.tanh(x @ w)
        y.register_hook(lambda g: g * 2)
        y.sum().backward()
        for thread in threads:
            thread.join()
        return {"errors": errors, "results": sorted(results, key=str), "grads": grads(x)}

    plain, lens = same(scenario)
    (backward_pass,) = lens.passes  # only the main thread's pass
    assert [run.name for run in backward_pass.node_runs] == ["SumBackward0", "TanhBackward0", "MmBackward0"]
    assert sorted(event.name for event in backward_pass.events if type(event).__name__ == "GradWritten") == ["w", "x"]


def test_under_cprofile_the_lens_records_nodes_and_the_profile_survives():
    import autograd_lens as al
    from autograd_lens.compat import other_profiler

    def user_step(x):
        y = x * 2
        y.register_hook(lambda g: g * 3)
        y.sum().backward()

    profiler = cProfile.Profile()
    x = torch.ones(3, requires_grad=True)
    profiler.enable()
    try:
        with al.Lens() as lens:
            user_step(x)
        still_on = other_profiler() is not None  # cProfile is sys.monitoring's on Python >= 3.12, not getprofile's
    finally:
        profiler.disable()
    assert still_on and torch.equal(x.grad, torch.full((3,), 6.0))
    stats = pstats.Stats(profiler)
    assert any(name == "user_step" for (_, _, name) in stats.stats)
    (backward_pass,) = lens.passes
    assert len(backward_pass.node_runs) == 2 and backward_pass.hook_calls == ()
    assert any("another profiler" in note for note in backward_pass.notes)
    assert backward_pass.grads_without_hooks["x"] is None and "could not see the hook calls" in backward_pass.unknown["x"]
    (x * 5).sum().backward()  # later, plain: nothing of the lens is left
    assert sys.getprofile() is None


def test_torch_profiler_with_stack():
    from torch.profiler import ProfilerActivity, profile

    def scenario():
        x = torch.ones(3, requires_grad=True)
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
            (x * 2).sin().sum().backward()
        names = {event.name for event in prof.events()}
        return {"grads": grads(x), "profiled backward": any("Backward" in name for name in names)}

    plain, _ = same(scenario)
    assert plain["returned"]["profiled backward"]


def test_dispatch_modes_see_only_the_users_ops():
    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args, kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def scenario():
        x = torch.rand(10, requires_grad=True)
        y = x.mul(2).div(3)
        y.register_hook(lambda g: g * 2)
        with OpLog() as log:
            y.sum().backward()
        from torch.utils.flop_counter import FlopCounterMode

        w = torch.randn(8, 8, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            (torch.randn(4, 8) @ w).sum().backward()
        return {"ops": log.ops, "flops": counter.get_total_flops(), "grads": grads(x, w)}

    same(scenario)


def test_torch_compile_inside_a_lens():
    def scenario():
        compiled = torch.compile(lambda t: (t.sin() * 2).exp(), backend="aot_eager")
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        compiled(x).sum().backward()
        return grads(x)

    torch._dynamo.reset()
    plain, traced, lens = run_plain_and_traced(scenario)
    torch._dynamo.reset()
    assert_identical(plain["returned"], traced["returned"])
    assert not any("autograd_lens" in warning for warning in traced["warnings"])
    (backward_pass,) = lens.passes  # the user's backward, not the compiler's own autograd calls
    assert backward_pass.notes == ()


def test_no_random_numbers_are_consumed():
    def scenario():
        torch.manual_seed(3)
        x = torch.randn(6, 4, requires_grad=True)
        y = nn.functional.dropout(x.tanh(), p=0.5, training=True)
        y.register_hook(lambda g: g * 2)  # "without hooks" is computed through dropout's backward
        y.pow(2).sum().backward()
        return {"grads": grads(x), "next random": torch.rand(3)}

    plain, lens = same(scenario)
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], plain["returned"]["grads"][0] / 2)
