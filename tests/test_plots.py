"""The plots draw what the trace says: bar lengths, marker positions and labels checked against it."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn
from matplotlib.collections import PathCollection

import autograd_lens as al
from conftest import Double


def widths(axis):
    return [float(bar.get_width()) for bar in axis.patches]


def mlp_pass(**lens_options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    with al.Lens(names={"model": model}, **lens_options) as lens:
        model(torch.randn(16, 4)).pow(2).mean().backward()
    return model, lens


@pytest.mark.parametrize("store_limit", [4096, 4])  # tensors, and summaries of them
def test_grad_flow_bars_are_mean_and_max_abs_grad_per_parameter(store_limit):
    model, lens = mlp_pass(store_limit=store_limit)
    figure = lens.plot.grad_flow()
    (axis,) = figure.axes
    names = list(lens.passes[0].leaf_grads)
    assert sorted(names) == sorted(f"model.{name}" for name, _ in model.named_parameters())
    assert [label.get_text() for label in axis.get_yticklabels()] == names
    grads = {f"model.{name}": p.grad for name, p in model.named_parameters()}
    expected_max = [float(grads[name].abs().max()) for name in names]
    expected_mean = [float(grads[name].abs().double().mean()) for name in names]
    bars = widths(axis)
    assert bars[: len(names)] == pytest.approx(expected_max, rel=1e-6)
    assert bars[len(names):] == pytest.approx(expected_mean, rel=1e-6)
    assert axis.get_xscale() == "log"
    assert lens.plot.grad_flow(log=False).axes[0].get_xscale() == "linear"


def test_grad_flow_says_which_leaf_got_no_gradient():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0], requires_grad=True)
    with al.Lens(names={"a": a, "b": b}) as lens:
        (a * 2 + b).sum().backward(inputs=[a])  # b is in the graph, but gets no gradient
    (axis,) = lens.plot.grad_flow().axes
    assert [label.get_text() for label in axis.get_yticklabels()] == ["b", "a"]  # graph order
    assert widths(axis) == [0.0, 2.0, 0.0, 2.0]  # max |grad| for b, a; then mean |grad| for b, a
    assert [(text.get_text(), text.get_position()[1]) for text in axis.texts] == [(" no gradient", 0)]
    with al.Lens(names={"a": a, "b": b}) as both:
        (a * 2 + b).sum().backward()
    assert [text.get_text() for text in both.plot.grad_flow().axes[0].texts] == []


def test_timeline_places_each_call_at_its_event_and_hook_row():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(lambda g: g * 2)  # changes the gradient
        z = y.sin()

        def look(g):
            return None  # changes nothing

        z.register_hook(look)
        z.sum().backward(retain_graph=True)
        z.sum().backward()
    (axis,) = lens.plot.timeline().axes
    changed, unchanged, raised = [c for c in axis.collections if isinstance(c, PathCollection)]
    first, second = lens.passes
    offset = len(first.events)
    lambda_steps = [c.step for c in first.hook_calls if c.hook == "<lambda>"]
    look_steps = [c.step for c in first.hook_calls if c.hook == "look"]
    rows = [label.get_text() for label in axis.get_yticklabels()]
    assert rows == ["look on z (tensor)", "<lambda> on y (tensor)"]  # in the order they first fired
    assert changed.get_offsets().tolist() == [[lambda_steps[0], 1], [offset + lambda_steps[0], 1]]
    assert unchanged.get_offsets().tolist() == [[look_steps[0], 0], [offset + look_steps[0], 0]]
    assert len(raised.get_offsets()) == 0
    assert [line.get_xdata()[0] for line in axis.lines] == [-0.5, offset - 0.5]  # pass boundaries


def test_timeline_marks_a_hook_that_raised():
    x = torch.tensor(1.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        y.register_hook(lambda g: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            y.backward()
    (axis,) = lens.plot.timeline().axes
    raised = [c for c in axis.collections if isinstance(c, PathCollection)][2]
    assert raised.get_offsets().tolist() == [[0, 0]]


def test_before_after_bars_for_scalars_tensors_and_module_hooks():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    def halve_input(module, grad_input, grad_output):
        return (grad_input[0] * 0.5,)

    lin.register_full_backward_hook(halve_input)
    x = torch.randn(4, 3, requires_grad=True)
    with al.Lens() as lens:
        y = lin(x)
        y.register_hook(lambda g: g.clamp(-0.5, 0.5))
        y.sum().backward()
    calls = lens.hook_calls
    (axis,) = lens.plot.before_after().axes
    bars = widths(axis)
    n = len(calls)
    def norm(value):
        values = value if isinstance(value, tuple) else (value,)
        return float(torch.sqrt(sum(v.double().pow(2).sum() for v in values if v is not None)))
    assert bars[:n] == pytest.approx([norm(c.grad_in) for c in calls])
    assert bars[n:] == pytest.approx([norm(c.grad_out) for c in calls])
    only = lens.plot.before_after(hook="<lambda>")
    assert [t.get_text() for t in only.axes[0].get_yticklabels()] == ["<lambda> on y (tensor) #1"]
    with pytest.raises(ValueError, match="no call of a hook named 'nope'"):
        lens.plot.before_after(hook="nope")


def test_with_without_bars_and_unknown_values_per_pass():
    x = torch.tensor(1.5, requires_grad=True)
    w = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * 4
        y.register_hook(lambda g: g * 0.5)
        y.backward()
        z = Double.apply(w)
        z.register_hook(lambda g: g * 3)
        z.backward()
    (axis,) = lens.plot.with_without().axes
    assert [t.get_text() for t in axis.get_yticklabels()] == ["pass 1: x", "pass 2: w"]
    assert widths(axis) == [2.0, 6.0, 4.0, 0.0]  # with hooks (x, w), then without (x, w: unknown)
    assert [t.get_text() for t in axis.texts] == [" unknown"]


def test_svg_is_byte_stable_and_names_never_start_mathtext():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"$\\frac{cost}$_a": x}) as lens:
        y = x * 3
        y.register_hook(lambda g: g * 2)
        y.sum().backward()
    for draw in (lens.plot, lens.plot.grad_flow, lens.plot.timeline, lens.plot.before_after, lens.plot.with_without):
        outputs = []
        for _ in range(2):
            buffer = io.BytesIO()
            draw().savefig(buffer, format="svg")
            outputs.append(buffer.getvalue())
        assert outputs[0] == outputs[1]
        assert b"<dc:date>" not in outputs[0]
    label = lens.plot.grad_flow().axes[0].get_yticklabels()[0].get_text()
    assert label == "\\$\\frac{cost}\\$_a"


def test_thirty_rows_stay_readable_long_names_are_shortened_and_given_in_full():
    leaves = {f"layer_{i:02d}.a_rather_long_parameter_name.weight": torch.tensor([float(i + 1)], requires_grad=True)
              for i in range(30)}
    with al.Lens(names=leaves) as lens:
        sum(t * t for t in leaves.values()).sum().backward()
    figure = lens.plot.grad_flow()
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert len(labels) == 30 and all(len(label) <= 38 for label in labels)
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend[0] == "[1] layer_29.a_rather_long_parameter_name.weight"  # graph order: the last use first
    assert figure.get_size_inches()[1] >= 0.28 * 30  # about a quarter inch per row


def test_lens_cell_plot_option_adds_the_figures(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext autograd_lens\nimport torch", store_history=False)
    try:
        with capture_output() as captured:
            result = shell.run_cell("%%lens --plot flow --plot timeline\n"
                                    "x = torch.tensor(2.0, requires_grad=True)\ny = x * 3\n"
                                    "y.register_hook(lambda g: g * 2)\ny.backward()")
        assert result.success
        kinds = [sorted(output.data) for output in captured.outputs]
        assert len(kinds) == 3 and all("image/png" in kind for kind in kinds[1:])
        with capture_output() as captured:
            shell.run_cell("%%lens --plot flow\n1 + 1")
        assert "no backward pass was recorded" in captured.stdout
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)
