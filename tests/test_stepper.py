"""What each step of the walk-through shows, checked from Python against the tracer's events."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
import conftest
from conftest import Double
from autograd_lens.model import GradWritten, HookCall, NodeRun
from autograd_lens.views.passview import PassView, frame_css
from autograd_lens.views.static_html import stepper_fragment
from autograd_lens.views.stepper import Stepper
from autograd_lens.views.trace_display import pass_title
from autograd_lens.views.steps import frame, steps_for


def two_branch_lens():
    return conftest.two_branch_lens()[0]


def test_steps_follow_the_events_one_to_one():
    lens = two_branch_lens()
    backward_pass = lens.passes[0]
    steps = steps_for(backward_pass)
    assert len(steps) == len(backward_pass.events) + 1
    assert steps[0].kind == "start" and steps[0].node is None
    for step, event in zip(steps[1:], backward_pass.events):
        expected = {NodeRun: "node", HookCall: "hook", GradWritten: "grad"}[type(event)]
        assert step.kind == expected
        assert step.node == event.node


def test_two_branch_walkthrough_from_output_to_x():
    lens = two_branch_lens()
    graph = lens.passes[0].graph
    steps = steps_for(lens.passes[0])
    labels = [graph.node(s.node).label if s.node else None for s in steps]
    assert labels == [None, "add", "mul", "mul", "y", "pow", "x"]
    hook = steps[4]
    assert hook.title == "hook <lambda> on y (tensor hook, call 1 of 1 in this recording)"
    assert hook.lines[0] == "received 5.0 → returned 2.5 — gradient modified"
    assert hook.changes == (("5.0", "2.5"),)
    assert "used by 2 ops, yet its hook fired once" in hook.note
    assert "x ends with 10.0 instead of 20.0" in hook.note
    last = steps[-1]
    assert last.title == "x.grad written: 10.0"
    assert "Without the hooks it would be 20.0." in last.lines


def test_chain_rule_cards_with_numbers():
    lens = two_branch_lens()
    steps = steps_for(lens.passes[0])
    text = {s.index: "\n".join(s.lines) for s in steps}
    assert "Chain rule: out = z + w." in text[1]
    assert "z receives g × 1 = 1.0 × 1.0 = 1.0." in text[1]
    assert "Chain rule: z = y * 3." in text[3] or "Chain rule: z = y * 3." in text[2]
    assert any("y receives g × 3 = 1.0 × 3.0 = 3.0." in t for t in text.values())
    assert "x receives g × 2·x^(2-1) = 2.5 × 4.0 = 10.0." in text[5]


@pytest.mark.parametrize(
    "op, expected",
    [
        (lambda a: a.exp(), "exp(a)"),
        (lambda a: a.tanh(), "1 - tanh(a)²"),
        (lambda a: a.sin(), "cos(a)"),
        (lambda a: a.sigmoid(), "σ(a)·(1 - σ(a))"),
        (lambda a: a.relu(), "1 where a > 0, else 0"),
        (lambda a: a.log(), "1/a"),
        (lambda a: a / 4, "1/4"),
        (lambda a: a - 1, "1"),
    ],
)
def test_chain_rule_for_common_ops_matches_autograd(op, expected):
    a = torch.tensor(0.7, requires_grad=True)
    with al.Lens() as lens:
        out = op(a)
        out.backward()
    node_steps = [s for s in steps_for(lens.passes[0]) if s.kind == "node"]
    text = "\n".join(node_steps[0].lines)
    assert expected in text
    factor = re.search(r"receives g × .* = 1\.0 × (\S+) = (\S+)\.", text)
    assert factor is not None, text
    assert float(factor.group(2)) == pytest.approx(float(a.grad), rel=1e-3)


def test_other_ops_say_what_ran_and_where_it_went():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        out = a.cumsum(0).sum()
        out.backward()
    cumsum = [s for s in steps_for(lens.passes[0]) if s.kind == "node" and "Cumsum" in s.title][0]
    assert cumsum.lines[0].startswith("It received")
    assert cumsum.lines[1].startswith("It sends a ←")


def test_frames_mark_current_done_edges_and_running_grad():
    lens = two_branch_lens()
    view = PassView(lens.passes[0])
    steps = view.steps
    graph = lens.passes[0].graph
    x = graph.find("x").id
    start = frame(steps, 0)
    assert start.current is None and not start.done and not start.edge_labels and not start.grads
    after_add = frame(steps, 1)
    add = graph.find("add").id
    assert after_add.current == add
    by_id = {e.id: e for e in graph.edges}
    carried = {(graph.node(by_id[e].src).label, graph.node(by_id[e].dst).label): t for e, t in after_add.edge_labels.items()}
    assert carried == {("z", "add"): "1.0", ("w", "add"): "1.0", ("add", "out"): "1.0"}
    before_grad = frame(steps, len(steps) - 2)
    assert x not in before_grad.grads and add in before_grad.done
    final = frame(steps, len(steps) - 1)
    assert final.grads == {x: "10.0"} and final.current == x
    # every drawn node that ran is done by the end, except the one just highlighted
    ran = {s.node for s in steps[1:-1] if s.kind in ("node", "grad")}
    assert ran <= final.done


def test_frame_css_marks_current_with_more_than_colour():
    lens = two_branch_lens()
    view = PassView(lens.passes[0])
    css = frame_css("#s", frame(view.steps, 4))
    current = frame(view.steps, 4).current
    assert f"#s #{current} > polygon" in css and "stroke-width: 5px; stroke-dasharray: 8 3" in css


def test_svg_has_before_and_after_grad_texts_for_leaves():
    lens = two_branch_lens()
    view = PassView(lens.passes[0])
    x = lens.passes[0].graph.find("x").id
    group = re.search(rf'<g id="{x}" class="node">.*?</g>', view.svg, re.S).group(0)
    assert re.search(r'<text class="al-after[^"]*"[^>]*>grad 10.0</text>', group)
    assert '<text class="al-before"' in group and ">grad None</text>" in group
    # labels are laid out once with their final text; edges carry ids the CSS can target
    assert re.search(r'<g id="e\d+" class="edge">', view.svg)


def test_static_fragment_is_deterministic_self_contained_and_small():
    first = stepper_fragment([PassView(p) for p in two_branch_lens().passes])
    second = stepper_fragment([PassView(p) for p in two_branch_lens().passes])
    assert first == second
    assert "http://" not in first.replace("http://www.w3.org", "") and "https://" not in first
    assert "<script>" in first and 'class="al-data"' in first
    assert not re.search(r"0x[0-9a-f]{6,}", first)
    assert len(first.encode()) < 200_000


def test_fifty_node_graph_static_page_under_200_kb():
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(8) for layer in (nn.Linear(3, 3), nn.Tanh())])
    x = torch.randn(2, 3)
    model[3].register_full_backward_hook(lambda m, gi, go: None)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    backward_pass = lens.passes[0]
    assert 40 <= len(backward_pass.graph.nodes) <= 80
    page = lens.to_html()
    assert len(page.encode()) < 200_000


def test_stepper_widget_steps_and_switches_passes():
    x = torch.tensor(3.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * x
        y.register_hook(lambda g: g * 2)
        y.backward(retain_graph=True)
        y.backward()
    stepper = Stepper(lens.passes)
    data = json.loads(stepper.data)
    assert [p["title"] for p in data["passes"]] == [pass_title(p) for p in lens.passes]  # the pass menu
    stepper.step = 1
    assert stepper.current_step.kind == "hook"
    assert "call 1 of 2 in this recording" in data["passes"][0]["cards"][1]
    stepper.step = 10_000  # clamped to the last step, as the browser's slider is
    assert stepper.current_step.title == "x.grad written: 12.0"
    stepper.show_pass(1)
    assert stepper.pass_index == 1 and stepper.step == 0
    stepper.step = len(stepper.view.steps) - 1
    assert stepper.current_step.title == "x.grad written: 24.0"
    assert "already held 12.0" in stepper.current_step.note
    stepper.step = -5
    assert stepper.step == 0
    stepper.pass_index = 7
    assert stepper.pass_index == 1


def test_stepper_widget_runs_the_same_module_as_the_static_page():
    from autograd_lens.views.static_html import classic_script, module_source

    stepper = Stepper(two_branch_lens().passes)
    assert stepper._esm == module_source() and "export default { render }" in module_source()
    assert "function render(" in classic_script() and "export " not in classic_script()
    # every control has a label (aria-label / title) in the module itself
    for go in ("first", "prev", "play", "next", "last", "zoom-out", "zoom-in", "fit"):
        assert re.search(rf'"{go}", "[^"]+", "[^"]+"', module_source()), go


def test_a_lens_displays_as_html_that_needs_no_kernel_and_the_widget_carries_it_too():
    """A Lens's output is the HTML stepper only: no widget view, so a notebook reopened later shows the
    stepper, not "model not found".  The widget (lens.stepper()) carries the same HTML for viewers
    without widgets."""
    lens = two_branch_lens()
    bundle = lens._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    widget_bundle = lens.stepper()._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in widget_bundle
    assert widget_bundle["text/html"] == bundle["text/html"]
    assert bundle["text/plain"] == "<autograd_lens.Lens: 1 backward pass, 1 hook call>"
    html = bundle["text/html"]
    assert html.startswith('<div class="autograd-lens al-static"')
    # scripts off (an untrusted notebook, a sanitising viewer): a picture, the last card and the table
    assert '<img class="al-picture" alt="the backward pass drawn: pass 1: backward() of out" src="data:image/svg+xml,<svg class=\'al-g\' font-family=' in html
    assert "x.grad written: 10.0" in html and "grad if no hook had run" in html


def test_no_renderer_shows_events_as_html(monkeypatch):
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "none")
    bundle = two_branch_lens()._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    assert "hook &lt;lambda&gt; on y" in bundle["text/html"] and "Traceback" not in bundle["text/html"]


def test_autograd_grad_pass_steps_and_table():
    a = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = a * 3
        y.register_hook(lambda g: g * 2)
        (ga,) = torch.autograd.grad(y * y, [a])
    view = PassView(lens.passes[0])
    assert "autograd.grad returns gradients for a" in view.steps[0].lines[1]
    assert "<td>a</td><td>72.0</td><td>36.0</td><td>differs</td>" in view.table
    assert float(ga) == 72.0


def test_module_hooks_and_error_passes_render():
    layer = nn.Linear(2, 1)
    layer.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0,))
    x = torch.ones(1, 2, requires_grad=True)
    with al.Lens(names={"layer": layer, "x": x}) as lens:
        layer(x).sum().backward()
    steps = steps_for(lens.passes[0])
    hook = [s for s in steps if s.kind == "hook"][0]
    assert "module full hook" in hook.title and "forward call" not in hook.title  # one call: no count
    y = torch.tensor(1.0, requires_grad=True) * 2
    y.register_hook(lambda g: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        with al.Lens() as failed:
            y.backward()
    steps = steps_for(failed.passes[0])
    assert steps[-1].kind == "error" and "ZeroDivisionError" in steps[-1].title
    assert "raised ZeroDivisionError" in steps[-2].lines[0]


def test_command_line_demo_writes_a_page(tmp_path):
    out = tmp_path / "trace.html"
    done = subprocess.run([sys.executable, "-m", "autograd_lens", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "x.grad = 10 (it would be 20 without the hook)" in done.stdout
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "hook &lt;lambda&gt; on y" in page


def test_command_line_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "w = torch.tensor([1.0, 2.0], requires_grad=True)\n"
        "for step in range(2):\n"
        "    loss = (w * w).sum()\n"
        "    loss.backward()\n"
    )
    out = tmp_path / "t.html"
    done = subprocess.run([sys.executable, "-m", "autograd_lens", str(script), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 backward pass(es)" in done.stdout
    assert "pass 2: backward() of loss" in out.read_text()


def test_legacy_module_hook_card_warns(quiet_warnings):
    module = nn.Linear(2, 1)
    module.register_backward_hook(lambda m, grad_input, grad_output: None)
    x = torch.ones(1, 2, requires_grad=True)
    with al.Lens(names={"module": module, "x": x}) as lens:
        module(x).sum().backward()
    hook = [s for s in steps_for(lens.passes[0]) if s.kind == "hook"][0]
    assert "module legacy hook" in hook.title and "register_full_backward_hook" in hook.note


def test_a_pass_larger_than_the_step_limit_ends_with_a_step_saying_how_many_more():
    from autograd_lens.views.steps import STEP_LIMIT, steps_for

    x = torch.tensor(1.0, requires_grad=True)
    h = x
    for _ in range(STEP_LIMIT + 200):
        h = h * 1.0
    with al.Lens() as lens:
        h.backward()
    (backward_pass,) = lens.passes
    steps = steps_for(backward_pass)
    assert len(backward_pass.events) == STEP_LIMIT + 201
    assert len(steps) == STEP_LIMIT + 2  # the start, the first STEP_LIMIT events, and the last word
    assert steps[-1].title == "201 more events are not shown as steps"
    assert "lens.passes[0].events" in steps[-1].lines[0]


def test_an_unknown_value_without_hooks_says_why_on_the_card_and_in_the_table():
    from autograd_lens.views.steps import grads_table_html, steps_for

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = Double.apply(x)
        y.register_hook(lambda g: g * 3)
        y.sum().backward()
    (backward_pass,) = lens.passes
    reason = backward_pass.unknown["x"]
    assert reason.startswith("DoubleBackward's backward is Python code")
    (card,) = [step for step in steps_for(backward_pass) if step.kind == "grad"]
    assert card.lines[-1] == f"Without the hooks: unknown, because {reason}."
    assert f"unknown: {reason}" in grads_table_html(backward_pass).replace("&#x27;", "'")


def test_cards_name_every_operand_and_print_no_negative_zero():
    from autograd_lens.views.chain import chain_rule
    from autograd_lens.views.steps import steps_for

    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    scale = torch.tensor([3.0, 4.0])  # a tensor that needs no gradient
    with al.Lens() as lens:
        a = 1 - x  # rsub: the 1 is not kept by the backward function
        b = x * scale
        c = x.relu()
        (a.sum() + b.sum() + c.sum()).backward()
    (backward_pass,) = lens.passes
    runs = {run.name: run for run in backward_pass.node_runs}
    rsub = chain_rule(runs["RsubBackward1"], backward_pass.graph)
    assert rsub == ["Chain rule: a = a number - x.", "∂a/∂x = -1; x receives g × -1 = [1.0, 1.0] × [-1.0, -1.0] = [-1.0, -1.0]."]
    mul = chain_rule(runs["MulBackward0"], backward_pass.graph)
    assert mul[0] == "Chain rule: b = x * (no-grad tensor)." and "x receives g × (no-grad tensor) = [1.0, 1.0] × [3.0, 4.0] = [3.0, 4.0]" in mul[1]
    relu_step = [s for s in steps_for(backward_pass) if s.title.startswith("relu")][0]
    assert "-0.0" not in " ".join(relu_step.lines) and "[0.0, 1.0]" in " ".join(relu_step.lines)
    assert torch.equal(x.grad, torch.tensor([-1.0 + 3.0 + 0.0, -1.0 + 4.0 + 1.0]))


def _mlp_lens(layers: int, modules: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(64, 64), nn.Tanh())])
    x = torch.randn(32, 64)
    with al.Lens(names={"model": model, "x": x}, max_nodes=5000, modules=modules) as lens:
        model(x).sum().backward()
    return lens


@pytest.mark.parametrize("modules", [False, True], ids=["plain", "module groups"])
@pytest.mark.parametrize("layers, nodes, limit", [(50, 252, 200_000), (200, 1002, 600_000)])
def test_a_large_pass_is_stored_within_its_budget_and_compressed_losslessly(layers, nodes, limit, modules):
    """Stored bytes per output (counted, not timed): ≤ 200 KB at 250 nodes, ≤ 600 KB at 1,000.  The
    compressed data unpacks to exactly what the script needs, and the same pass gives the same bytes."""
    import base64
    import json
    import zlib

    from autograd_lens.views.passview import views_for
    from autograd_lens.views.static_html import stepper_fragment

    lens = _mlp_lens(layers, modules)
    assert len(lens.passes[0].graph.nodes) == nodes
    assert len(lens.passes[0].groups) == (2 * layers + 1 if modules else 0)
    views = views_for(lens.passes)
    fragment = stepper_fragment(views)
    assert len(fragment.encode("utf-8")) <= limit
    assert "al-nopicture" in fragment and '<img class="al-picture"' not in fragment
    packed = re.search(r'data-encoding="deflate-raw-base64">([^<]+)</script>', fragment).group(1)
    data = json.loads(zlib.decompress(base64.b64decode(packed), -15).decode("utf-8"))
    assert data == json.loads(json.dumps(stepper_data_for(views)))
    assert stepper_fragment(views_for(lens.passes)) == fragment


def stepper_data_for(views):
    from autograd_lens.views.passview import stepper_data
    from autograd_lens.views.static_html import fragment_key

    return stepper_data(views, fragment_key(views), False, first_picture=True)


# ----------------------------------------------------------------------------- .grad as it was at every step


def _drawn_grad(view, step, node):
    """The text of ``node``'s grad field at a step, as the page shows it: the class the step's CSS turns on,
    looked up among the texts the drawing holds for that node."""
    css = frame_css("#s", frame(view.steps, step))
    group = re.search(rf'<g id="{node}" class="node">.*?</g>', view.svg, re.S).group(0)
    texts = dict(re.findall(r'<text class="al-after (al-v\w+)"[^>]*>grad ([^<]*)</text>', group))
    shown = [texts[cls] for cls in re.findall(rf"#s #{node} \.(al-v\w+)", css)]
    if not shown:
        return re.search(r'<text class="al-before"[^>]*>grad ([^<]*)</text>', group).group(1)
    assert len(shown) == 1, shown
    return shown[0]


def test_every_step_draws_grad_as_it_was_then_before_and_after_a_post_accumulate_hook():
    """x.grad is written (3x's gradient), then a post-accumulate hook halves it: the step of the write shows
    the written value, the hook's step and every later one what the hook left, in Python and in the page."""
    def halve(p):
        p.grad.mul_(0.5)

    def program(hooked):
        x = torch.tensor(2.0, requires_grad=True)
        w = torch.tensor(1.0, requires_grad=True)
        if hooked:
            x.register_post_accumulate_grad_hook(halve)
        (x * 3 + w * x * 5).backward()
        return x, w

    plain_x, _ = program(False)
    with al.Lens() as lens:
        x, w = program(True)
    view = PassView(lens.passes[0])
    steps = view.steps
    node = lens.passes[0].graph.find("x").id
    write = next(s.index for s in steps if s.title.startswith("x.grad written"))
    hook = next(s.index for s in steps if s.title.startswith("hook halve"))
    expected = ["None"] * write + [al.format_value(plain_x.grad)] * (hook - write) \
        + [al.format_value(x.grad)] * (len(steps) - hook)
    assert plain_x.grad.item() == 8.0 and x.grad.item() == 4.0
    assert [frame(steps, k).grads.get(node, "None") for k in range(len(steps))] == expected
    assert [_drawn_grad(view, k, node) for k in range(len(steps))] == expected


def test_a_grad_changed_by_another_leafs_hook_is_not_drawn_stale():
    """A post-accumulate hook on x halves w.grad (written earlier): the recording has no step for that, so the
    drawing says 'not known' after w's write until the end, where it shows what .grad holds; the note names the
    hook instead of blaming shared memory."""
    def program(hooked):
        x = torch.tensor(2.0, requires_grad=True)
        w = torch.tensor(1.0, requires_grad=True)

        def halve_the_other(p):
            other = w if p is x else x
            if other.grad is not None:
                other.grad.mul_(0.5)

        if hooked:
            x.register_post_accumulate_grad_hook(halve_the_other)
        (x * 3 * w * 2).backward()
        return x, w

    _, plain_w = program(False)
    with al.Lens() as lens:
        x, w = program(True)
    view = PassView(lens.passes[0])
    steps = view.steps
    node = lens.passes[0].graph.find("w").id
    write = next(s.index for s in steps if s.title.startswith("w.grad written"))
    drawn = [_drawn_grad(view, k, node) for k in range(len(steps))]
    assert drawn[write] == al.format_value(plain_w.grad) == "12.0"
    assert drawn[-1] == al.format_value(w.grad) == "6.0"
    assert write + 1 < len(steps) - 1 and set(drawn[write + 1:-1]) == {"not known"}
    assert "halve_the_other on x" in steps[-1].note and "shares memory with a gradient added to after it" not in steps[-1].note


def test_the_write_step_compares_the_written_value_with_the_one_without_hooks():
    """A hook doubles y's gradient, a post-accumulate hook halves x.grad: x ends as it would without hooks, but
    what AccumulateGrad wrote differs from it: the write card must not say 'No hook changed it'."""
    def program(hooked):
        x = torch.tensor(2.0, requires_grad=True)
        y = x * 3
        if hooked:
            y.register_hook(lambda g: g * 2)
            x.register_post_accumulate_grad_hook(lambda p: p.grad.mul_(0.5) and None)
        y.backward()
        return x

    plain = program(False)
    with al.Lens() as lens:
        x = program(True)
    (write,) = [s for s in steps_for(lens.passes[0]) if s.title.startswith("x.grad written")]
    assert write.title == "x.grad written: 6.0" and torch.equal(x.grad, plain.grad)
    assert f"Without the hooks it would be {al.format_value(plain.grad)}." in write.lines
    assert not any("No hook changed it" in line for line in write.lines)


def test_the_command_line_says_and_does_that_arguments_after_the_script_reach_it(tmp_path):
    helped = subprocess.run([sys.executable, "-m", "autograd_lens", "--help"], capture_output=True, text=True, timeout=120)
    assert "[script [args ...]]" in helped.stdout and "passed on to it" in helped.stdout
    script = tmp_path / "train.py"
    script.write_text("import sys, torch\nprint('args', sys.argv[1:])\nx = torch.ones(2, requires_grad=True)\n"
                      "(x * 2).sum().backward()\n")
    done = subprocess.run([sys.executable, "-m", "autograd_lens", str(script), "-o", str(tmp_path / "t.html"),
                           "--epochs", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "args ['--epochs', '3']" in done.stdout
