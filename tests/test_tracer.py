"""The backward tracer against plain PyTorch: same gradients, every hook call seen, nothing left behind.

Each scenario is a function run twice, once plain and once inside a Lens.  The
user's own hooks write down what they received, so the Lens's records can be
compared with the truth and the two runs with each other, bit for bit.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.model import GradWritten, NodeRun, PassError, TensorSummary
from conftest import Double, assert_identical, live_recorders, two_branch_lens


def run_both(scenario, **lens_options):
    """(plain result, lens result, lens)."""
    torch.manual_seed(0)
    plain = scenario()
    torch.manual_seed(0)
    with al.Lens(**lens_options) as lens:
        traced = scenario()
    return plain, traced, lens


def grab(tensor):
    return None if tensor is None else tensor.detach().clone()


# ----------------------------------------------------------------------------- the course example


def two_branch(hook=lambda g: g * 0.5):
    def scenario():
        seen = []
        x = torch.tensor(2.0, requires_grad=True)
        y = x**2

        def recorded(g):
            seen.append(grab(g))
            return hook(g)

        y.register_hook(recorded)
        z = y * 3
        w = y * 2
        out = z + w
        out.backward()
        return {"x.grad": grab(x.grad), "seen": seen}

    return scenario


def test_two_branch_example_records_one_call_with_the_summed_gradient():
    plain, traced, lens = run_both(two_branch())
    assert_identical(plain, traced)
    assert len(lens.passes) == 1
    assert len(lens.hook_calls) == 1
    call = lens.hook_calls[0]
    assert call.hook == "scenario.<locals>.recorded" or call.hook.endswith("recorded")
    assert call.kind == "tensor" and call.target == "y"
    assert float(call.grad_in) == 5.0 and float(call.grad_out) == 2.5
    assert call.modified and not call.returned_none and call.invocation == 1
    p = lens.passes[0]
    assert float(p.leaf_grads["x"]) == 10.0
    assert float(p.grads_without_hooks["x"]) == 20.0


def test_issue_example_as_written_in_a_with_block():
    lens, x = two_branch_lens()
    (call,) = lens.hook_calls
    assert call.hook == "<lambda>" and call.target == "y"
    assert float(call.grad_in) == 5.0 and float(call.grad_out) == 2.5
    assert float(x.grad) == 10.0
    assert float(lens.passes[0].grads_without_hooks["x"]) == 20.0
    assert lens.passes[0].kind == "backward" and lens.passes[0].roots == ("out",)


def test_event_order_follows_the_engine():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x**2
        y.register_hook(lambda g: g * 0.5)
        out = y * 3 + y * 2
        out.backward()
    events = lens.passes[0].events
    kinds = [type(event).__name__ for event in events]
    # add, two muls (in engine order), then y's hook, then pow, then x's .grad
    assert kinds == ["NodeRun", "NodeRun", "NodeRun", "HookCall", "NodeRun", "GradWritten"]
    assert [e.name for e in events if isinstance(e, NodeRun)] == [
        "AddBackward0", "MulBackward0", "MulBackward0", "PowBackward0"
    ]
    pow_run = events[4]
    assert float(pow_run.grad_in[0]) == 2.5 and float(pow_run.grad_out[0]) == 10.0
    assert pow_run.targets == ("x",)
    written = events[5]
    assert isinstance(written, GradWritten) and written.name == "x" and float(written.grad) == 10.0
    assert [e.step for e in events] == list(range(len(events)))


def test_doubling_hook_gives_24_instead_of_12():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x**2
        y.register_hook(lambda g: g * 2)
        z = 3 * y
        z.backward()
    assert float(x.grad) == 24.0
    assert float(lens.passes[0].grads_without_hooks["x"]) == 12.0


def test_clamp_hook_example_gives_20_and_60_without():
    x = torch.tensor(10.0, requires_grad=True)
    with al.Lens() as lens:
        y = x**2
        y.register_hook(lambda g: g.clamp(-1, 1))
        out = 3 * y
        out.backward()
    assert float(x.grad) == 20.0
    assert float(lens.passes[0].grads_without_hooks["x"]) == 60.0
    (call,) = lens.hook_calls
    assert float(call.grad_in) == 3.0 and float(call.grad_out) == 1.0


# ----------------------------------------------------------------------------- chains, repeats, passes


def test_chained_hooks_each_see_the_previous_output():
    def scenario():
        seen = []
        x = torch.tensor([1.0, -2.0], requires_grad=True)
        y = x * 3

        def double(g):
            seen.append(grab(g))
            return g * 2

        def add_one(g):
            seen.append(grab(g))
            return g + 1

        y.register_hook(double)
        y.register_hook(add_one)
        y.sum().backward()
        return {"grad": grab(x.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    first, second = lens.hook_calls
    assert first.hook.endswith("double") and second.hook.endswith("add_one")
    assert torch.equal(first.grad_in, plain["seen"][0])
    assert torch.equal(second.grad_in, plain["seen"][1])
    assert torch.equal(first.grad_out, second.grad_in)
    assert torch.equal(second.grad_out, torch.tensor([3.0, 3.0]))
    assert first.step < second.step


def test_same_function_registered_twice_is_two_hooks_each_counted():
    def scenario():
        x = torch.tensor(1.0, requires_grad=True)
        y = x * 2

        def halve(g):
            return g / 2

        y.register_hook(halve)
        y.register_hook(halve)
        out = y * 1
        out.backward(retain_graph=True)
        out.backward()
        return {"grad": grab(x.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert float(traced["grad"]) == 1.0  # 2 * 1/4, twice
    calls = lens.hook_calls
    assert len(calls) == 4
    assert [c.invocation for c in calls] == [1, 1, 2, 2]
    assert [c.pass_index for c in calls] == [0, 0, 1, 1]
    assert [float(c.grad_in) for c in calls] == [1.0, 0.5, 1.0, 0.5]


def test_retain_graph_passes_accumulate_and_count_invocations():
    def scenario():
        x = torch.tensor(3.0, requires_grad=True)
        y = x * x
        y.register_hook(lambda g: g * 10)
        snapshots = []
        for _ in range(3):
            y.backward(retain_graph=True)
            snapshots.append(grab(x.grad))
        return {"grads": snapshots}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert len(lens.passes) == 3
    assert [c.invocation for c in lens.hook_calls] == [1, 2, 3]
    assert [float(p.leaf_grads["x"]) for p in lens.passes] == [60.0, 120.0, 180.0]
    # Had the hook never been registered, .grad would hold 6, 12, 18 (as a plain run without it
    # gives); each pass's own contribution is 60 with the hook, 6 without.
    assert [float(p.grads_without_hooks["x"]) for p in lens.passes] == [6.0, 12.0, 18.0]
    assert [float(p.added["x"]) for p in lens.passes] == [60.0, 60.0, 60.0]
    assert [float(p.added_without_hooks["x"]) for p in lens.passes] == [6.0, 6.0, 6.0]


def test_tensor_used_by_many_ops_gets_one_call_with_the_sum():
    def scenario():
        x = torch.tensor(1.5, requires_grad=True)
        y = x + 0
        y.register_hook(lambda g: None)
        out = y * y + y * 4 + y.exp()
        out.backward()
        return {"grad": grab(x.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    expected = 2 * 1.5 + 4 + torch.tensor(1.5).exp()
    assert torch.allclose(call.grad_in, expected)
    assert call.returned_none and not call.modified


def test_hooks_registered_before_the_lens_are_seen():
    x = torch.tensor(2.0, requires_grad=True)
    y = x * 4
    y.register_hook(lambda g: g + 1)
    x.register_hook(lambda g: g * 0)
    with al.Lens() as lens:
        y.backward()
    targets = [(c.target, c.kind, float(c.grad_in), float(c.grad_out)) for c in lens.hook_calls]
    assert targets == [("y", "tensor", 1.0, 2.0), ("x", "tensor", 8.0, 0.0)]
    assert float(x.grad) == 0.0
    assert float(lens.passes[0].grads_without_hooks["x"]) == 4.0


# ----------------------------------------------------------------------------- every hook kind


def test_node_pre_and_post_hooks():
    def scenario():
        seen = []
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        z = y.sum()

        def pre(grad_outputs):
            seen.append(("pre", grab(grad_outputs[0])))
            return (grad_outputs[0] * 2,)

        def post(grad_inputs, grad_outputs):
            seen.append(("post", grab(grad_inputs[0]), grab(grad_outputs[0])))
            return (grad_inputs[0] + 1, grad_inputs[1])

        y.grad_fn.register_prehook(pre)
        y.grad_fn.register_hook(post)
        z.backward()
        return {"grad": grab(x.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    pre_call, post_call = lens.hook_calls
    assert pre_call.kind == "node_pre" and post_call.kind == "node"
    assert isinstance(pre_call.grad_in, tuple) and torch.equal(pre_call.grad_in[0], torch.ones(2))
    assert torch.equal(pre_call.grad_out[0], torch.full((2,), 2.0))
    assert torch.equal(post_call.grad_in[0], torch.full((2,), 6.0))
    assert torch.equal(post_call.grad_out[0], torch.full((2,), 7.0))
    assert torch.equal(post_call.context[0], torch.full((2,), 2.0))
    assert post_call.target.startswith("mul")
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], torch.full((2,), 3.0))


def test_post_accumulate_grad_hook_sees_the_written_grad():
    def scenario():
        seen = []
        w = torch.tensor([1.0, 2.0], requires_grad=True)

        def after(param):
            seen.append(grab(param.grad))

        w.register_post_accumulate_grad_hook(after)
        (w * w).sum().backward()
        return {"grad": grab(w.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert call.kind == "post_accumulate_grad" and call.target == "w"
    assert torch.equal(call.grad_in, torch.tensor([2.0, 4.0]))
    assert not call.modified
    events = lens.passes[0].events
    assert isinstance(events[call.step - 1], GradWritten)


def test_module_full_hooks_with_a_module_used_twice():
    def scenario():
        seen = []
        layer = nn.Linear(2, 2)

        def pre(module, grad_output):
            seen.append(("pre", grab(grad_output[0])))

        def full(module, grad_input, grad_output):
            seen.append(("full", grab(grad_input[0])))
            return (grad_input[0] * 0.5,)

        layer.register_full_backward_pre_hook(pre)
        layer.register_full_backward_hook(full)
        x = torch.tensor([[1.0, -1.0]], requires_grad=True)
        out = layer(layer(x)).sum()
        out.backward()
        return {"x": grab(x.grad), "w": grab(layer.weight.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    calls = lens.hook_calls
    assert [c.kind for c in calls] == ["module_full_pre", "module_full", "module_full_pre", "module_full"]
    assert all(c.target == "Linear" or c.target.startswith("layer") for c in calls)
    # torch runs the later call's hooks first; the lens pairs each with its forward call
    assert [c.forward_call for c in calls] == [2, 2, 1, 1]
    assert [c.invocation for c in calls] == [1, 1, 2, 2]
    recorded = [("pre" if c.kind.endswith("pre") else "full", c.grad_in[0]) for c in calls]
    for (kind, value), (true_kind, true_value) in zip(recorded, plain["seen"]):
        assert kind == true_kind and torch.equal(value, true_value)
    assert calls[1].modified and not calls[0].modified


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # torch's own note: x needs no grad
def test_module_hooks_named_by_path_in_a_sequential():
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 1))
    model[0].register_full_backward_hook(lambda m, gi, go: None)
    x = torch.randn(4, 3)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    (call,) = lens.hook_calls
    assert call.target == "model.0" and call.kind == "module_full"
    assert call.grad_in == (None,)  # the input x does not require grad
    g = lens.passes[0].graph
    assert {"model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"} <= {n.label for n in g.nodes}


def test_legacy_module_hook(quiet_warnings):
    def scenario():
        module = nn.Linear(2, 1)

        def legacy(module, grad_input, grad_output):
            return None

        module.register_backward_hook(legacy)
        x = torch.tensor([[1.0, 2.0]], requires_grad=True)
        module(x).sum().backward()
        return {"x": grab(x.grad), "w": grab(module.weight.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert call.kind == "module_legacy" and call.hook.endswith("legacy")


def test_global_full_module_hooks_are_seen_as_global():
    from torch.nn.modules.module import register_module_full_backward_hook, register_module_full_backward_pre_hook

    def everywhere(module, grad_input, grad_output):
        return None

    def everywhere_pre(module, grad_output):
        return None

    handles = [register_module_full_backward_hook(everywhere), register_module_full_backward_pre_hook(everywhere_pre)]
    try:
        layer = nn.Linear(2, 1)
        x = torch.ones(1, 2, requires_grad=True)
        with al.Lens() as lens:
            layer(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    kinds = [c.kind for c in lens.hook_calls]
    assert kinds == ["global_module_full_pre", "global_module_full"]


def test_global_legacy_module_hook_in_a_fresh_process():
    """Global legacy and full hooks cannot share a process: this one runs alone."""
    import subprocess

    code = """
import torch, torch.nn as nn, warnings, autograd_lens as al
from torch.nn.modules.module import register_module_backward_hook
warnings.simplefilter("ignore")
def everywhere(module, gi, go):
    return None
h = register_module_backward_hook(everywhere)
layer = nn.Linear(2, 1)
x = torch.ones(1, 2, requires_grad=True)
with al.Lens() as lens:
    layer(x).sum().backward()
h.remove()
print(sorted({c.kind for c in lens.hook_calls}))
"""
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert output.returncode == 0, output.stderr
    assert output.stdout.strip() == "['global_module_legacy']"


def test_multi_grad_hook():
    def scenario():
        seen = []
        a = torch.tensor(1.0, requires_grad=True)
        b = torch.tensor(2.0, requires_grad=True)

        def both(grads):
            seen.append(tuple(grab(g) for g in grads))

        torch.autograd.graph.register_multi_grad_hook((a, b), both)
        (a * b).backward()
        return {"a": grab(a.grad), "b": grab(b.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert call.kind == "multi_grad" and call.hook.endswith("both")
    assert call.target == "a, b"
    assert [float(v) for v in call.grad_in] == [2.0, 1.0]


def test_custom_function_backward_is_not_a_hook():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    def scenario():
        x = torch.tensor([1.0, 3.0], requires_grad=True)
        y = Square.apply(x)
        y.register_hook(lambda g: g * 2)
        y.sum().backward()
        return {"grad": grab(x.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert [c.kind for c in lens.hook_calls] == ["tensor"]
    # the user's backward() is not run a second time to find the unhooked value
    assert lens.passes[0].grads_without_hooks == {"x": None}


def test_custom_function_upstream_of_the_hook_does_not_block_the_counterfactual():
    x = torch.tensor(1.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(lambda g: g * 5)
        Double.apply(y).backward()
    assert float(x.grad) == 30.0
    assert float(lens.passes[0].grads_without_hooks["x"]) == 6.0


# ----------------------------------------------------------------------------- grad(), inputs=, odd graphs


def test_autograd_grad_with_hooks_on_and_off_the_path():
    def scenario():
        seen = []
        a = torch.tensor(2.0, requires_grad=True)
        b = torch.tensor(5.0, requires_grad=True)
        y = a * 3
        y.register_hook(lambda g: (seen.append(("y", grab(g))), g * 2)[1])
        b.register_hook(lambda g: seen.append(("b", grab(g))))
        out = y * b
        (ga,) = torch.autograd.grad(out, [a])
        return {"ga": grab(ga), "a.grad": a.grad, "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert plain["seen"][0][0] == "y" and all(name != "b" for name, _ in plain["seen"])
    p = lens.passes[0]
    assert p.kind == "grad"
    assert [c.target for c in lens.hook_calls] == ["y"]
    assert p.leaf_grads == {}
    assert float(p.grads_without_hooks["a"]) == 15.0  # 3 * b, without the doubling
    assert not any(isinstance(e, GradWritten) for e in p.events)


def test_autograd_grad_of_a_non_leaf_input_sees_its_tensor_hook():
    def scenario():
        x = torch.tensor(2.0, requires_grad=True)
        y = x * 3
        y.register_hook(lambda g: g * 10)
        out = y * y
        (gy,) = torch.autograd.grad(out, [y])
        return {"gy": grab(gy)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert call.target == "y" and float(call.grad_in) == 12.0 and float(call.grad_out) == 120.0
    assert float(lens.passes[0].grads_without_hooks["y"]) == 12.0


def test_backward_with_inputs_only_touches_those_leaves():
    def scenario():
        a = torch.tensor(1.0, requires_grad=True)
        b = torch.tensor(2.0, requires_grad=True)
        (a * b).backward(inputs=[a])
        return {"a": grab(a.grad), "b": b.grad}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    written = [e.name for e in lens.passes[0].events if isinstance(e, GradWritten)]
    assert written == ["a"]


def test_split_output_hook_receives_none():
    def scenario():
        seen = []
        x = torch.arange(4.0, requires_grad=True)
        first, second = x.split(2)
        second.register_hook(lambda g: seen.append(g))
        (first * 2).sum().backward()
        return {"grad": grab(x.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert plain["seen"] == [None]  # torch calls the hook with None for the unused output
    (call,) = lens.hook_calls
    assert call.grad_in is None and call.target == "second"


def test_in_place_op_after_hook_registration():
    def scenario():
        seen = []
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: seen.append(grab(g)))
        y.mul_(3)
        y.sum().backward()
        return {"grad": grab(x.grad), "seen": seen}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert len(lens.hook_calls) == len(plain["seen"])
    for call, truth in zip(lens.hook_calls, plain["seen"]):
        assert torch.equal(call.grad_in, truth)


def test_in_place_edit_inside_a_hook_is_recorded_as_a_change():
    def scenario():
        x = torch.tensor(1.0, requires_grad=True)
        y = x * 2
        z = x * 5
        out = y + z
        y.register_hook(lambda g: g.mul_(10))  # edits in place; AddBackward gave z the same tensor
        out.backward()
        return {"grad": grab(x.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert float(call.grad_in) == 1.0 and float(call.grad_out) == 10.0
    assert call.modified and not call.returned_none
    assert float(lens.passes[0].grads_without_hooks["x"]) == 7.0
    add_run = lens.passes[0].events[0]
    assert [float(v) for v in add_run.grad_out] == [1.0, 1.0]  # as sent, before the hook edited it


def test_in_place_edit_leaking_into_the_sibling_branch_is_not_counted_as_unhooked():
    def scenario(where):
        def run():
            x = torch.tensor(1.0, requires_grad=True)
            p = x * 2
            q = x * 5
            out = p + q
            {"p": p, "q": q}[where].register_hook(lambda g: g.mul_(2))
            out.backward()
            return {"grad": grab(x.grad)}

        return run

    for where, expected in (("q", 14.0), ("p", 9.0)):  # q's node runs first, so its edit leaks into p's
        plain, traced, lens = run_both(scenario(where))
        assert_identical(plain, traced)
        assert float(traced["grad"]) == expected
        assert float(lens.passes[0].grads_without_hooks["x"]) == 7.0


def test_create_graph_double_backward():
    def scenario():
        x = torch.tensor(3.0, requires_grad=True)
        y = x**3
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        g.backward()
        return {"g": grab(g), "x": grab(x.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert [p.kind for p in lens.passes] == ["grad", "backward"]
    assert float(lens.passes[1].leaf_grads["x"]) == 18.0


def test_shared_weight_in_an_unrolled_loop():
    def scenario():
        w = torch.tensor(0.9, requires_grad=True)
        h = torch.tensor(1.0)
        for _ in range(12):
            h = torch.tanh(h * w)
        w.register_hook(lambda g: g.clamp(-0.1, 0.1))
        h.backward()
        return {"w": grab(w.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (call,) = lens.hook_calls
    assert call.target == "w"
    assert torch.equal(lens.passes[0].grads_without_hooks["w"], call.grad_in)


# ----------------------------------------------------------------------------- errors and clean-up


def test_hook_that_raises_propagates_unchanged_and_keeps_the_partial_trace():
    class Boom(Exception):
        pass

    x = torch.tensor(1.0, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: (_ for _ in ()).throw(Boom("no")))
    with pytest.raises(Boom, match="no"):
        with al.Lens() as lens:
            y.backward()
    p = lens.passes[0]
    assert isinstance(p.events[-1], PassError) and p.events[-1].type == "Boom"
    (call,) = lens.hook_calls
    assert call.error == "Boom: no"
    assert live_recorders() == []


@pytest.mark.parametrize(
    "bad_hook, message",
    [
        (lambda g: torch.ones(3), "has changed the size of value"),
        (lambda g: g.double(), "has changed the type of value"),
        (lambda g: 1.0, "expected Variable, but hook returned 'float'"),
    ],
)
def test_bad_hook_returns_give_torch_own_error(bad_hook, message):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(bad_hook)
    with pytest.raises((RuntimeError, TypeError), match=message):
        with al.Lens() as lens:
            y.sum().backward()
    assert lens.passes[0].error is not None
    assert live_recorders() == []


def test_keyboard_interrupt_in_a_hook_cleans_up():
    x = torch.tensor(1.0, requires_grad=True)
    y = x * 2

    def interrupt(g):
        raise KeyboardInterrupt

    y.register_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        with al.Lens() as lens:
            y.backward()
    assert lens.passes[0].error.type == "KeyboardInterrupt"
    assert live_recorders() == []


def test_error_in_user_code_outside_backward_still_restores():
    with pytest.raises(ZeroDivisionError):
        with al.Lens():
            1 / 0


def test_second_backward_without_retain_graph_error_is_kept():
    x = torch.tensor(2.0, requires_grad=True)
    y = x * x
    with al.Lens() as lens:
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()
    assert len(lens.passes) == 2 and lens.passes[1].error is not None


def test_no_lens_hooks_remain_on_nodes_after_the_block():
    x = torch.tensor(2.0, requires_grad=True)
    y = x * 3
    with al.Lens():
        y.backward(retain_graph=True)
    assert live_recorders() == []
    # the graph is still alive; running it again must not reach any lens code
    calls = []

    def spy(frame, event, arg):
        if event == "call" and "autograd_lens" in frame.f_code.co_filename:
            calls.append(frame.f_code.co_name)

    sys.setprofile(spy)
    try:
        y.backward()
    finally:
        sys.setprofile(None)
    assert calls == []


def test_nested_lens_is_refused_with_a_clear_message():
    with al.Lens():
        with pytest.raises(RuntimeError, match="already recording"):
            with al.Lens():
                pass


def test_backward_in_another_thread_is_not_traced():
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        worker = threading.Thread(target=lambda: (x * 2).backward())
        worker.start()
        worker.join()
    assert lens.passes == []
    assert float(x.grad) == 2.0


def test_previous_profile_function_is_restored_around_each_pass():
    events = []

    def outer(frame, event, arg):
        events.append(event)

    x = torch.tensor(2.0, requires_grad=True)
    sys.setprofile(outer)
    try:
        with al.Lens():
            (x * 2).backward()
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)


# ----------------------------------------------------------------------------- memory


def test_large_gradients_are_summarised():
    x = torch.randn(100, 100, requires_grad=True)
    with al.Lens(store_limit=1000) as lens:
        y = x * 2
        y.register_hook(lambda g: g * 3)
        y.sum().backward()
    (call,) = lens.hook_calls
    assert isinstance(call.grad_in, TensorSummary) and call.grad_in.shape == (100, 100)
    assert call.grad_out.max == 3.0 and call.grad_out.min == 3.0 and call.modified
    assert isinstance(lens.passes[0].leaf_grads["x"], TensorSummary)
    runs = lens.passes[0].node_runs
    assert all(isinstance(v, TensorSummary) for run in runs for v in run.grad_out if v is not None)


def test_small_gradients_are_real_tensors_detached_from_the_graph():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        (x * x).sum().backward()
    for run in lens.passes[0].node_runs:
        for value in run.grad_out:
            if value is not None:
                assert isinstance(value, torch.Tensor) and not value.requires_grad
    assert lens.passes[0].leaf_grads["x"] is not x.grad  # a copy: later passes accumulate in place


# ----------------------------------------------------------------------------- more observer-effect checks


def test_retained_grads_and_multiple_roots_are_unchanged():
    def scenario():
        a = torch.tensor([1.0, -2.0], requires_grad=True)
        b = torch.tensor([0.5, 3.0], requires_grad=True)
        h = a * b
        h.retain_grad()
        h.register_hook(lambda g: g * 3)
        first = h.sin()
        second = (h * a).exp()
        torch.autograd.backward([first, second], [torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])])
        return {"a": grab(a.grad), "b": grab(b.grad), "h": grab(h.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    p = lens.passes[0]
    assert set(p.roots) == {"first", "second"}
    (call,) = lens.hook_calls
    assert torch.equal(p.leaf_grads["a"], traced["a"]) and torch.equal(p.leaf_grads["b"], traced["b"])
    # without the x3 hook, the leaves get a third of the hooked part of their gradient
    a = torch.tensor([1.0, -2.0], requires_grad=True)
    b = torch.tensor([0.5, 3.0], requires_grad=True)
    h = a * b
    torch.autograd.backward([h.sin(), (h * a).exp()], [torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])])
    assert torch.allclose(p.grads_without_hooks["a"], a.grad)
    assert torch.allclose(p.grads_without_hooks["b"], b.grad)


def test_memory_budget_keeps_summaries_and_says_what_is_unknown():
    x = torch.randn(64, requires_grad=True)
    with al.Lens(memory_budget=1) as lens:
        y = x * 2
        y.register_hook(lambda g: g * 3)
        (y * y).sum().backward()
    p = lens.passes[0]
    assert all(isinstance(v, TensorSummary) for run in p.node_runs for v in run.grad_out if v is not None)
    assert p.grads_without_hooks["x"] is None  # summaries cannot be fed back through a node
    leaf = p.leaf_grads["x"]  # past the budget a summary too: torch's
    assert isinstance(leaf, TensorSummary) and (leaf.min, leaf.max, leaf.head) == (
        x.grad.min().item(), x.grad.max().item(), tuple(x.grad[:4].tolist()))


def test_the_memory_budget_holds_for_all_of_a_lenss_passes():
    """A training loop inside one Lens: its passes' kept values count together against memory_budget, so memory
    stops growing with the number of passes; later passes keep summaries and say why; clearing lens.passes lets
    the values go and the next pass keeps values again. The gradients themselves are torch's, whatever is kept."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(16, 8)
    plain = [p.detach().clone() for p in model.parameters()]

    def step():
        model.zero_grad()
        model(x).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    with al.Lens(names={"model": model, "x": x}) as probe:
        step()
    one_pass = probe.passes[0].kept_bytes
    assert one_pass > 0
    budget = int(2.5 * one_pass)  # two passes keep everything, the third reaches the budget
    with al.Lens(names={"model": model, "x": x}, memory_budget=budget) as lens:
        traced = [step() for _ in range(5)]
    assert [p.kept_bytes for p in lens.passes[:2]] == [one_pass, one_pass]
    kept = sum(p.kept_bytes for p in lens.passes)
    assert kept <= budget + one_pass  # the pass that crosses it stops keeping values from then on
    for p in lens.passes[3:]:  # past the budget from their start: summaries, and the note says whose bytes
        assert p.kept_bytes == 0
        assert all(isinstance(v, TensorSummary) for run in p.node_runs for v in run.grad_out if v is not None)
        assert any(f"values not kept past {budget} bytes (memory_budget) (" in n and "lens.passes.clear()" in n
                   for n in p.notes), p.notes
    for p in lens.passes[:2]:
        assert not any(isinstance(v, TensorSummary) for run in p.node_runs for v in run.grad_out)
    plain_grads = []
    for _ in range(5):
        plain_grads.append(step())
    assert all(torch.equal(a, b) for got, want in zip(traced, plain_grads) for a, b in zip(got, want))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain))
    lens.passes.clear()
    with lens:
        step()
    assert lens.passes[0].kept_bytes == one_pass and not any("memory_budget" in n for n in lens.passes[0].notes)


def test_a_lens_failure_never_breaks_the_students_backward(monkeypatch):
    import autograd_lens.capture.tracer as tracer

    def broken(roots):
        raise RuntimeError("lens bug")

    monkeypatch.setattr(tracer, "structure", broken)
    x = torch.tensor(3.0, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="could not trace a backward pass") as caught:
        with al.Lens() as lens:
            (x * x).backward()
            (x * x).backward()
    assert float(x.grad) == 12.0 and lens.passes == []
    assert len([w for w in caught if "autograd_lens" in str(w.message)]) == 1  # one quiet warning per Lens
    assert len(lens.recording_notes) == 2 and "lens bug" in lens.recording_notes[0]


def test_passes_are_built_lazily_but_record_the_state_at_the_time():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        (w * w).sum().backward()
        with torch.no_grad():
            w.mul_(10)  # an optimizer step after the pass
            w.grad.zero_()
        (w * 3).sum().backward()
    first, second = lens.passes
    assert torch.equal(first.graph.find("w").value, torch.tensor([1.0, 2.0]))
    assert torch.equal(first.leaf_grads["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(second.graph.find("w").value, torch.tensor([10.0, 20.0]))
    assert torch.equal(second.leaf_grads["w"], torch.tensor([3.0, 3.0]))


def test_many_passes_in_one_block_keep_their_own_records():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 3)
    expected = []
    with al.Lens(names={"model": model}) as lens:
        for _ in range(12):
            optimizer.zero_grad()
            model(data).pow(2).mean().backward()
            expected.append(model.weight.grad.clone())
            optimizer.step()
    assert len(lens.passes) == 12
    for backward_pass, grad in zip(lens.passes, expected):
        assert torch.equal(backward_pass.leaf_grads["model.weight"], grad)


# ----------------------------------------------------------------------------- odd inputs


def test_sparse_gradients():
    def scenario():
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3, sparse=True)
        emb(torch.tensor([1, 2, 1])).sum().backward()
        return {"grad": emb.weight.grad.to_dense()}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    (value,) = lens.passes[0].leaf_grads.values()
    assert isinstance(value, TensorSummary) and value.shape == (10, 3)


def test_complex_and_empty_tensors():
    z = torch.tensor([1 + 2j], requires_grad=True)
    e = torch.zeros(0, requires_grad=True)
    with al.Lens() as lens:
        (z * z).abs().sum().backward()
        e.sum().backward()
    assert torch.equal(lens.passes[0].leaf_grads["z"], z.grad)
    assert lens.passes[1].leaf_grads["e"].shape == (0,)


def test_backward_of_a_leaf_itself():
    x = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        x.backward()
    assert [type(e).__name__ for e in lens.passes[0].events] == ["GradWritten"]
    assert float(lens.passes[0].leaf_grads["x"]) == 1.0


def test_backward_inside_a_hook_runs_untraced_and_unchanged():
    def scenario():
        a = torch.tensor(2.0, requires_grad=True)
        c = torch.tensor(1.0, requires_grad=True)
        b = a * a

        def inner(g):
            with torch.enable_grad():
                (c * 5).backward()
            return g * 2

        b.register_hook(inner)
        b.backward()
        return {"a": grab(a.grad), "c": grab(c.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert len(lens.passes) == 1  # the inner backward() is not a pass of its own
    assert [call.hook.split(".")[-1] for call in lens.hook_calls] == ["inner"]


def test_batched_grads_and_torch_func_are_left_alone():
    x = torch.randn(3, requires_grad=True)
    with al.Lens() as lens:
        (jac,) = torch.autograd.grad(x * 2, x, torch.eye(3), is_grads_batched=True)
        from torch.func import grad

        value = grad(lambda t: (t * t).sum())(torch.ones(2))
    assert torch.equal(jac, 2 * torch.eye(3)) and torch.equal(value, torch.full((2,), 2.0))
    assert lens.passes == []


def test_checkpointed_module():
    from torch.utils.checkpoint import checkpoint

    def scenario():
        torch.manual_seed(0)
        layer = nn.Linear(3, 3)
        inputs = torch.randn(2, 3, requires_grad=True)
        checkpoint(lambda t: layer(t).tanh(), inputs, use_reentrant=False).sum().backward()
        return {"w": grab(layer.weight.grad), "x": grab(inputs.grad)}

    plain, traced, lens = run_both(scenario)
    assert_identical(plain, traced)
    assert len(lens.passes) == 1


def test_a_leaf_with_its_own_hook_records_what_was_written_and_added():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        x.register_hook(lambda g: g * 2)
        (x * 3).sum().backward()
    (backward_pass,) = lens.passes
    (written,) = [e for e in backward_pass.events if isinstance(e, GradWritten)]
    assert torch.equal(written.grad, torch.full((2,), 6.0)) and torch.equal(written.received, torch.full((2,), 6.0))
    assert torch.equal(backward_pass.added["x"], torch.full((2,), 6.0))
    assert torch.equal(backward_pass.added_without_hooks["x"], torch.full((2,), 3.0))


def test_no_collection_while_the_lens_sets_up_or_builds_a_pass():
    """The cyclic collector is paused while the lens sets a pass up and while it builds the model (no user code
    runs there), never while the engine runs; it is left as it was found, on or off."""
    import gc

    from autograd_lens.capture import observe, tracer

    lens_codes = {tracer.Lens._observer.__code__, observe.PassObserver.start.__code__, tracer.Lens._finish.__code__}
    seen: list[str] = []

    def on_collection(phase, info):
        if phase == "start":
            frame, part = sys._getframe(1), "user"
            while frame is not None:
                if frame.f_code in lens_codes:
                    part = "lens"
                elif frame.f_code is hook.__code__:
                    part = "hook"
                    break
                frame = frame.f_back
            seen.append(part)

    def hook(grad):
        junk = [[] for _ in range(50)]  # allocations: a collection at threshold 1
        return None

    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    thresholds = gc.get_threshold()
    gc.callbacks.append(on_collection)
    try:
        gc.set_threshold(1, 1, 1)
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            out = net(torch.ones(2, 3))
            out.register_hook(hook)
            with al.Lens(names={"net": net}) as lens:
                out.sum().backward()
            assert gc.isenabled() is enabled
            assert lens.passes[-1].hook_calls and not lens.recording_notes
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(on_collection)
    assert "lens" not in seen and "hook" in seen, seen  # collections ran, in the user's hook, none in the lens's parts


def test_a_lens_block_puts_showwarning_back_and_the_lens_is_freed_with_its_last_reference(monkeypatch):
    """The block restores warnings.showwarning (it compared a new bound method with `is`, so it never did: every
    Lens stayed reachable from warnings.showwarning, each wrapping the previous one), and nothing else keeps a Lens
    alive once the user drops it: its passes, and each pass's observer, are freed by reference counting, not left
    to the cyclic collector."""
    import gc
    import warnings
    import weakref

    from autograd_lens.capture import tracer

    observers = []
    observe = tracer.Lens._observer

    def kept(self, *args):
        observer = observe(self, *args)
        observers.append(weakref.ref(observer))
        return observer

    monkeypatch.setattr(tracer.Lens, "_observer", kept)
    x = torch.tensor(2.0, requires_grad=True)
    before = warnings.showwarning
    collecting = gc.isenabled()
    gc.disable()
    try:
        refs = []
        for _ in range(3):
            lens = al.Lens(names={"x": x})
            with lens:
                (x * 3).backward()
            assert warnings.showwarning is before
            refs.append(weakref.ref(lens))
            assert lens.passes[0].debug is not None  # the evidence is the pass's, not the observer's
            del lens
        assert [ref() for ref in refs] == [None, None, None]
        assert len(observers) >= 3 and all(ref() is None for ref in observers)  # (the first Lens: its self-check too)
    finally:
        if collecting:
            gc.enable()
    with warnings.catch_warnings(record=True) as caught:  # torch's non-leaf warning is still seen and still shown
        warnings.simplefilter("always")
        y = x * 2
        with al.Lens(names={"x": x, "y": y}) as lens:
            y.sum().backward()
            assert y.grad is None
    assert any("not a leaf" in str(w.message) for w in caught) and any(n.code == "nonleaf_grad" for n in lens.notes)
    assert warnings.showwarning is before
