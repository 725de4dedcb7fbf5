"""Module groups (``Lens(modules=True)``, ``%%lens --modules``): which nn.Module call made each node.

The oracle is torch itself: a forward hook registered by the test on each module records the ``grad_fn`` of
what each call returned; that node must be in that call's group.  Everything the user can see (values,
warnings, errors, hooks dicts) must be the same as a plain run.
"""

from __future__ import annotations

import sys
import threading
import warnings

import pytest
import torch
from conftest import assert_identical, run_plain_and_traced
from test_real_code import S as REAL_CODE
from test_trust import _repro_scripts, repro_failures
from torch import nn
from torch.nn.modules import module as torch_module

import autograd_lens as al
from autograd_lens.views.dot import to_dot
from autograd_lens.views.passview import PassView, group_data


def global_hooks() -> list[int]:
    return [len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks),
            len(torch_module._global_forward_hooks_always_called)]


def outputs_by_call(*modules: nn.Module) -> tuple[list, list]:
    """Test-side oracle: (module, grad_fn of its output) for every call, in call order."""
    seen: list = []
    handles = [m.register_forward_hook(lambda mod, args, out: seen.append((mod, out.grad_fn))) for m in modules]
    return seen, handles


def node_of(backward_pass, grad_fn) -> str:
    [node] = [n.id for n in backward_pass.graph.nodes if n.kind == "function" and n.sequence_nr == grad_fn._sequence_nr()]
    return node


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x).tanh() * 2  # tanh and mul are made by the block itself


def test_each_node_is_in_the_call_that_made_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3), Block())
    x = torch.randn(2, 3, requires_grad=True)
    seen, handles = outputs_by_call(*model.modules())
    with al.Lens(names={"model": model, "x": x}, modules=True) as lens:
        loss = model(x).pow(2).sum()
        loss.backward()
    for handle in handles:
        handle.remove()
    backward_pass = lens.passes[0]
    names = {id(m): name for name, m in model.named_modules(prefix="model")}
    assert [g.describe() for g in backward_pass.groups] == [
        "model · Sequential", "model.0 · Linear", "model.1 · Tanh", "model.2 · Linear", "model.3 · Block",
        "model.3.linear · Linear"]
    for module, grad_fn in seen:  # the node each call returned is in that call's group, or a group inside it
        group = backward_pass.group_of(node_of(backward_pass, grad_fn))
        enclosing = []
        while group is not None:
            enclosing.append(group.path)
            group = backward_pass.groups[group.parent] if group.parent is not None else None
        assert names[id(module)] in enclosing
    by_label = {g.path: g for g in backward_pass.groups}
    labels = lambda g: sorted(backward_pass.graph.node(n).label for n in g.nodes)
    assert labels(by_label["model.3"]) == ["2", "mul", "tanh"]  # made in Block.forward (with mul's constant)
    assert labels(by_label["model.0"]) == ["addmm", "t"]  # parameters are not made by forward: outside
    assert labels(by_label["model"]) == []  # Sequential makes no node of its own
    assert backward_pass.group_of(next(n.id for n in backward_pass.graph.nodes if n.label == "pow")) is None
    parents = [backward_pass.groups[g.parent].path if g.parent is not None else None for g in backward_pass.groups]
    assert parents == [None, "model", "model", "model", "model", "model.3"]
    assert global_hooks() == [0, 0, 0]


def test_a_module_called_twice_makes_two_groups():
    torch.manual_seed(0)
    shared = nn.Linear(2, 2)
    x = torch.randn(1, 2, requires_grad=True)
    seen, handles = outputs_by_call(shared)
    with al.Lens(names={"shared": shared, "x": x}, modules=True) as lens:
        out = shared(shared(x).relu()).sum()
        out.backward()
    handles[0].remove()
    backward_pass = lens.passes[0]
    assert [g.describe() for g in backward_pass.groups] == ["shared · Linear (call 1 of 2)", "shared · Linear (call 2 of 2)"]
    first, second = (backward_pass.group_of(node_of(backward_pass, fn)) for _, fn in seen)
    assert (first.call, second.call) == (1, 2)
    # leaves are made by no call: drawn outside the groups
    for name in ("shared.weight", "shared.bias"):
        assert backward_pass.group_of(next(n.id for n in backward_pass.graph.nodes if n.label == name)) is None


def test_module_hook_boundaries_are_inside_their_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    calls = []
    model[1].register_full_backward_hook(lambda m, gi, go: calls.append(1))
    x = torch.randn(2, 3, requires_grad=True)
    with al.Lens(names={"model": model, "x": x}, modules=True) as lens:
        model(x).sum().backward()
    backward_pass = lens.passes[0]
    boundaries = [n for n in backward_pass.graph.nodes if n.op == "BackwardHookFunctionBackward"]
    assert len(boundaries) == 2 and calls == [1]
    for node in boundaries:  # both sides are the module's, and named so (no hook ran at the output side)
        assert backward_pass.group_of(node.id).path == "model.1"
    assert sorted(node.label for node in boundaries) == ["model.1 input hook boundary", "model.1 output hook boundary"]
    runs = [e.label for e in backward_pass.node_runs if e.name == "BackwardHookFunctionBackward"]
    assert runs == ["model.1 output hook boundary", "model.1 input hook boundary"]


def test_the_same_outcome_as_a_plain_run_and_no_hook_left_behind():
    def program():
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        seen = []
        model[0].register_forward_hook(lambda m, a, out: seen.append(out.sum().item()))
        model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))
        x = torch.randn(5, 3, requires_grad=True)
        model(x).sum().backward()
        return [x.grad.clone(), *(p.grad.clone() for p in model.parameters()), seen,
                len(model[0]._forward_hooks), len(model[0]._forward_pre_hooks)]

    plain, traced, lens = run_plain_and_traced(program, modules=True)
    assert_identical(plain, traced)
    assert len(lens.passes[0].groups) == 4
    assert global_hooks() == [0, 0, 0]


def test_an_error_in_forward_is_unchanged_and_the_hooks_are_removed():
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("broken forward")

    def program():
        nn.Sequential(nn.Linear(2, 2), Broken())(torch.randn(1, 2))

    plain, traced, lens = run_plain_and_traced(program, modules=True)
    assert plain["raised"] == "ValueError: broken forward"
    assert_identical(plain, traced)
    assert global_hooks() == [0, 0, 0]
    # calls left open by the error are closed by the enclosing call's end
    assert all(end != float("inf") for end in lens.module_calls.ends)


@pytest.mark.parametrize("name", sorted(REAL_CODE))
def test_real_code_with_module_groups_behaves_as_without_the_lens(name):
    plain, traced, lens = run_plain_and_traced(REAL_CODE[name], modules=True)
    assert_identical(plain, traced)
    assert global_hooks() == [0, 0, 0]
    for backward_pass in lens.passes:  # every group's nodes are nodes of the drawing, each in one group
        ids = [n for g in backward_pass.groups for n in g.nodes]
        assert len(ids) == len(set(ids)) and set(ids) <= {n.id for n in backward_pass.graph.nodes}
        assert backward_pass.groups_note == ("" if backward_pass.groups else
                                             "no nn.Module call made a node of this pass while the lens recorded "
                                             "(a node made before the cell or block began is not grouped)")


def test_checkpointed_module_is_grouped_once_and_values_match():
    from torch.utils.checkpoint import checkpoint

    def program():
        inner = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(inner, x, use_reentrant=False).sum().backward()
        return [x.grad.clone(), *(p.grad.clone() for p in inner.parameters())]

    plain, traced, lens = run_plain_and_traced(program, modules=True)
    assert_identical(plain, traced)
    assert [g.kind for g in lens.passes[0].groups] == ["Sequential", "Linear", "Tanh"]


def test_compiled_module_warns_only_because_of_the_global_hooks():
    """What --modules changes, said in its help: torch.compile(module) warns about global hooks."""
    torch._dynamo.reset()

    def program():
        torch.manual_seed(0)
        model = torch.compile(nn.Linear(3, 1), backend="eager")
        x = torch.randn(2, 3, requires_grad=True)
        model(x).sum().backward()
        return [x.grad.clone()]

    plain, traced, _ = run_plain_and_traced(program, modules=True)
    assert plain["returned"][0].equal(traced["returned"][0])
    extra = [w for w in traced["warnings"] if w not in plain["warnings"]]
    assert len(extra) == 1 and "global hooks" in extra[0]
    plain, traced, _ = run_plain_and_traced(program)  # without modules: nothing added
    assert_identical(plain, traced)


def grouped_pass(model):
    """One pass through ``model`` recorded with modules=True."""
    with al.Lens(names={"model": model}, modules=True) as lens:
        model(torch.randn(1, 2)).sum().backward()
    return lens.passes[0]


def test_another_thread_makes_groups_unknown():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="worker")
    worker.start()
    try:
        backward_pass = grouped_pass(nn.Linear(2, 1))
    finally:
        stop.set()
        worker.join()
    assert backward_pass.groups == ()
    assert "a thread (worker) ran" in backward_pass.groups_note


def test_a_call_whose_end_was_never_seen_ends_with_the_call_around_it():
    """Otherwise it would claim every later node."""
    from autograd_lens.capture.modules import ModuleCalls

    outer, inner = nn.Linear(2, 2), nn.Linear(2, 2)
    calls = ModuleCalls()
    calls._started(outer, ())
    calls._started(inner, ())  # its end never comes (as if its post-hook had been skipped)
    x = torch.ones(1, 2, requires_grad=True)
    made_inside = x * 2
    calls._ended(outer, (), None)
    made_after = x * 3
    assert calls.ends[1] == calls.ends[0] != float("inf")
    assert calls.call_of(made_inside.grad_fn._sequence_nr()) == 1
    assert calls.call_of(made_after.grad_fn._sequence_nr()) is None


def test_a_big_drawing_without_groups_suggests_them():
    model = nn.Sequential(*[nn.Tanh() for _ in range(70)])
    x = torch.randn(2, requires_grad=True)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    assert "%%lens --modules" in lens.passes[0].groups_note
    start = PassView(lens.passes[0]).steps[0].lines
    assert sum("Module groups: not recorded; run the cell as %%lens --modules" in line for line in start) == 1
    with al.Lens(names={"x": x}) as small:
        (x * 2).sum().backward()
    assert small.passes[0].groups_note == ""


def test_groups_are_nested_clusters_in_the_drawing_and_the_stepper_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), Block())
    x = torch.randn(2, 3, requires_grad=True)
    with al.Lens(names={"model": model, "x": x}, modules=True) as lens:
        model(x).sum().backward()
    backward_pass = lens.passes[0]
    dot = to_dot(backward_pass.graph, groups=backward_pass.groups)
    assert dot.count("subgraph cluster_m") == len(backward_pass.groups) == 5
    # nesting: model.2.linear's cluster is inside model.2's, inside model's
    assert dot.index("cluster_m1") < dot.index("cluster_m4") < dot.index("cluster_m5")
    assert 'label="model.2.linear · Linear"' in dot
    svg = PassView(backward_pass).svg
    assert all(f'<g id="m{i}" class="cluster">' in svg for i in range(1, 6))
    data = group_data(backward_pass)
    assert data["collapse"] is False and data["total"] == len(backward_pass.graph.nodes)
    outer = data["list"][0]
    assert set(outer["nodes"]) == {n for g in backward_pass.groups for n in g.nodes}  # the model holds all
    block = next(g for g in data["list"] if g["label"] == "model.2 · Block")
    inner = next(g for g in data["list"] if g["label"] == "model.2.linear · Linear")
    assert set(inner["nodes"]) < set(block["nodes"])
    for group in data["list"]:  # an arrow is listed for a group only when both its ends are inside
        for edge_id in group["edges"]:
            edge = backward_pass.graph.edge(edge_id)
            assert edge.src in group["nodes"] and edge.dst in group["nodes"]
    # a card says where its node was made
    tanh_steps = [s for s in PassView(backward_pass).steps if s.title.startswith("tanh (")]
    assert [s.lines[0] for s in tanh_steps] == ["Made inside model.2 · Block.", "Made inside model.1 · Tanh."]


def test_modules_option_is_checked():
    with pytest.raises(TypeError, match="modules must be True or False"):
        al.Lens(modules="yes")


def test_magic_modules_flag(shell):
    shell.run_cell("import torch.nn as nn\nmodel = nn.Sequential(nn.Linear(2, 2), nn.Tanh())\nx = torch.ones(1, 2)")
    result = shell.run_cell("%%lens --modules --no-show\nout = model(x).sum()\nout.backward()")
    assert result.success
    backward_pass = shell.user_ns["_lens"].passes[0]
    assert [g.describe() for g in backward_pass.groups] == ["model · Sequential", "model.0 · Linear", "model.1 · Tanh"]
    addmm = next(n.id for n in backward_pass.graph.nodes if n.label == "addmm")
    card = PassView(backward_pass).cards
    assert any("Made by cell line 2: out = model(x).sum(), inside model.0 · Linear" in c for c in card)
    assert backward_pass.group_of(addmm).path == "model.0"
    assert global_hooks() == [0, 0, 0]
    result = shell.run_cell("%%lens --no-show\nout = model(x).sum()\nout.backward()")
    assert shell.user_ns["_lens"].passes[0].groups == ()


def test_command_line_modules_option(tmp_path):
    from autograd_lens.__main__ import main

    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(2, 1))\n"
                      "model(torch.ones(1, 2)).sum().backward()\n")
    for flag, expected in ((["--modules"], True), ([], False)):
        page = tmp_path / "trace.html"
        assert main([str(script), *flag, "-o", str(page)]) == 0
        text = page.read_text(encoding="utf-8")
        assert ("model.0 · Linear" in text) is expected
    assert global_hooks() == [0, 0, 0]


def test_an_idle_executor_worker_does_not_make_groups_unknown_but_a_busy_one_does():
    """asyncio's default executor keeps worker threads alive, waiting for work: they make no nodes."""
    from concurrent.futures import ThreadPoolExecutor

    model = nn.Linear(2, 1)
    with ThreadPoolExecutor(1, thread_name_prefix="idle") as pool:
        pool.submit(lambda: None).result()  # the worker now waits in its queue
        idle = grouped_pass(model)
        assert idle.groups_note == "" and len(idle.groups) == 1
        started, stop = threading.Event(), threading.Event()
        busy = pool.submit(lambda: (started.set(), stop.wait()))
        started.wait()
        try:
            backward_pass = grouped_pass(model)
        finally:
            stop.set()
            busy.result()
    assert backward_pass.groups == () and "a thread (idle_0) ran" in backward_pass.groups_note


def test_a_forward_run_before_the_block_is_said_to_be_ungrouped(shell):
    shell.run_cell("import torch.nn as nn\nlayer = nn.Linear(2, 1)\nloss = layer(torch.ones(1, 2)).sum()")
    assert shell.run_cell("%%lens --modules --no-show\nloss.backward()").success
    backward_pass = shell.user_ns["_lens"].passes[0]
    assert backward_pass.groups == () and "no nn.Module call made a node" in backward_pass.groups_note
    start = PassView(backward_pass).steps[0].lines
    assert any(line.startswith("Module groups: no nn.Module call made a node") for line in start)


MODULES_ON = """
import runpy, sys
import autograd_lens.capture.tracer as tracer
original = tracer.Lens.__init__
def init(self, *args, **kwargs):
    kwargs.setdefault("modules", True)
    original(self, *args, **kwargs)
tracer.Lens.__init__ = init
path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name="__main__")
"""


@pytest.mark.skipif(not _repro_scripts(), reason="../shared/repros is not beside this checkout")
def test_every_repro_script_behaves_as_without_the_lens_with_module_groups_on(tmp_path):
    """The shared repro scripts again, every Lens in them made with modules=True."""
    import subprocess
    import sys

    wrapper = tmp_path / "modules_on.py"
    wrapper.write_text(MODULES_ON)
    probe = tmp_path / "probe.py"
    probe.write_text("import autograd_lens as al\nprint(al.Lens().modules)\n")
    assert subprocess.run([sys.executable, str(wrapper), str(probe)], capture_output=True, text=True,
                          check=True).stdout == "True\n"
    assert repro_failures(tmp_path, before=(str(wrapper),)) == []


def test_a_module_called_in_a_loop_is_numbered_per_call_and_counted_once_per_pass():
    """An RNN-style cell called 300 times: each call its own group (call k of 300), read back in the order made."""
    cell = nn.Linear(2, 2)
    x = torch.ones(1, 2, requires_grad=True)
    with al.Lens(names={"cell": cell, "x": x}, modules=True, max_nodes=5000) as lens:
        h = x
        for _ in range(300):
            h = cell(h).tanh()
        h.sum().backward()
    groups = lens.passes[0].groups
    assert [g.call for g in groups] == list(range(1, 301)) and {g.calls for g in groups} == {300}
    assert lens.module_calls.numbers == list(range(1, 301))


GUARD_WARNING_3_13_0 = "Guards may run slower on Python 3.13.0. Consider upgrading to Python 3.13.1+."


def no_op_global_forward_hooks() -> list:
    """What --modules adds, as torch sees it: a global forward pre-hook and an always-called global forward hook,
    both returning None (the oracle for what torch.compile does while the lens's hooks exist)."""
    return [torch_module.register_module_forward_pre_hook(lambda module, args: None),
            torch_module.register_module_forward_hook(lambda module, args, result: None, always_call=True)]


def test_compiled_function_traces_the_same_graphs_with_groups_on():
    """While dynamo compiles, the lens's two global hooks are out of torch's dicts (capture/compiled.py), so it
    compiles what it compiles without them: the same graphs, graph breaks, guards and warnings as plain torch (on
    Python 3.13.0 its "Guards may run slower" warnings too, which with any global forward hook present come once
    per guard on a module's hook dicts, #21). Nodes made by compiled code are not grouped, and the first step says
    so; code compiled with two no-op global hooks really present still traces the hooked path (the oracle shows
    what the lens no longer does)."""
    import warnings

    from torch._dynamo.utils import counters

    def run(modules, hooks=False):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
        compiled = torch.compile(lambda x: model(x).sum(), backend="eager")
        x = torch.randn(2, 3, requires_grad=True)
        handles = no_op_global_forward_hooks() if hooks else []
        try:
            with warnings.catch_warnings(record=True) as caught, al.Lens(names={"model": model, "x": x}, modules=modules) as lens:
                warnings.simplefilter("always")
                compiled(x).backward()
                compiled(x).backward()  # compiled code runs again with the hooks present: no recompile
        finally:
            for handle in handles:
                handle.remove()
        return (dict(counters["stats"]), dict(counters["graph_break"]), x.grad.clone(),
                [str(w.message) for w in caught], lens.passes[0])

    plain, grouped = run(False), run(True)
    assert plain[:2] == grouped[:2] and plain[0]["unique_graphs"] == 1 and plain[1] == {}
    assert torch.equal(plain[2], grouped[2])
    assert plain[3] == grouped[3]
    assert grouped[4].groups == () and grouped[4].groups_note.startswith("no nn.Module call made a node")
    assert global_hooks() == [0, 0, 0]
    if sys.version_info[:3] == (3, 13, 0):  # what the lens spares: with the hooks present, more guard warnings
        hooked = run(False, hooks=True)
        assert hooked[3].count(GUARD_WARNING_3_13_0) > plain[3].count(GUARD_WARNING_3_13_0)


def test_a_compiled_module_compiles_as_without_groups_and_warns_that_hooks_exist():
    """torch.compile(module): the same graphs, breaks and gradients as plain torch; the one thing left is torch's
    own warning, given outside compilation each time an OptimizedModule is called while any global hook exists
    ("Using `torch.compile(module)` when there are global hooks ...": the guide and README say so)."""
    import warnings

    from torch._dynamo.utils import counters

    def run(modules):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = torch.compile(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)), backend="eager")
        x = torch.randn(2, 3, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught, al.Lens(names={"model": model, "x": x}, modules=modules):
            warnings.simplefilter("always")
            model(x).sum().backward()
        return (dict(counters["stats"]), dict(counters["graph_break"]), x.grad.clone(),
                [f"{w.category.__name__}: {w.message}" for w in caught])

    plain, grouped = run(False), run(True)
    assert grouped[:2] == plain[:2] and grouped[0]["unique_graphs"] == 1 and grouped[1] == {}
    assert torch.equal(grouped[2], plain[2])
    extra = [w for w in grouped[3] if "global hooks" in w]
    assert len(extra) == 1 and [w for w in grouped[3] if w not in extra] == plain[3]
    assert global_hooks() == [0, 0, 0]


class _BrokenBlock(nn.Module):
    """Attention and an MLP with a graph break between them (as code that prints or calls .item() has)."""

    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj, self.fc, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, 2, d // 2).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        torch._dynamo.graph_break()
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def test_a_compiled_model_with_a_graph_break_fires_parameter_hooks_in_torch_s_order_with_groups_on():
    """Issue #19, class 7: with --modules around a compiled transformer, parameter hooks fired in another order
    within the pass than without it (two global forward hooks make dynamo compile other graphs around a break).
    The order is now torch's own; the same model with two no-op global hooks really present is the control."""
    def run(way):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(11, 16), _BrokenBlock(16), nn.LayerNorm(16), nn.Linear(16, 11))
        order = []
        for name, parameter in model.named_parameters():
            parameter.register_hook(lambda g, name=name: order.append(name))
        compiled = torch.compile(model, backend="aot_eager")
        tokens = torch.randint(0, 11, (2, 8))
        handles = no_op_global_forward_hooks() if way == "hooked" else []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with al.Lens(names={"model": model}, modules=way == "grouped") as lens:
                    compiled(tokens).logsumexp(-1).mean().backward()
        finally:
            for handle in handles:
                handle.remove()
        return order, [call.target for call in lens.passes[0].hook_calls], model[0].weight.grad.clone()

    plain, grouped = run("plain"), run("grouped")
    assert grouped[0] == plain[0] and len(plain[0]) == 17
    assert grouped[1] == [f"model.{name}" for name in plain[0]]  # shown as they fired
    assert torch.equal(grouped[2], plain[2])
    hooked = run("hooked")
    assert hooked[0] != plain[0]  # the control: what the hooks do when dynamo sees them
    assert global_hooks() == [0, 0, 0]


def test_the_live_widget_carries_the_same_groups_as_the_static_page():
    import json

    from autograd_lens.views.passview import views_for
    from autograd_lens.views.static_html import stepper_fragment

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    with al.Lens(names={"model": model}, modules=True) as lens:
        model(torch.ones(1, 2)).sum().backward()
    widget = json.loads(lens.stepper().data)["passes"][0]["groups"]
    assert widget == group_data(lens.passes[0])
    assert [g["label"] for g in widget["list"]] == ["model · Sequential", "model.0 · Linear", "model.1 · Tanh"]
    assert '"model.0 · Linear"' in stepper_fragment(views_for(lens.passes))  # the static page's data


FRESH_COMPILE = r'''
import sys, warnings
import torch, torch.nn as nn
import autograd_lens as al
from torch.nn.modules import module as torch_module
warnings.simplefilter("ignore")
assert "torch._dynamo" not in sys.modules
model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
x = torch.randn(2, 3, requires_grad=True)
if sys.argv[1] == "block":  # torch.compile first loads dynamo inside the block, and compiles at once
    with al.Lens(names={"model": model, "x": x}, modules=True) as lens:
        model(x)  # eager: grouped
        torch.compile(lambda t: model(t).sum(), backend="eager")(x).backward()
    print(lens.passes[0].groups_note)
else:  # a %%lens cell: dynamo loaded by one statement, compiled by a later one
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.user_ns.update(model=model, x=x, torch=torch, torch_module=torch_module)
    shell.run_cell("%load_ext autograd_lens")
    result = shell.run_cell("""%%lens --modules --no-show
compiled = torch.compile(lambda t: model(t).sum(), backend="eager")
seen = []
torch._dynamo.callback_handler.register_start_callback(
    lambda args: seen.append(len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks)))
compiled(x).backward()""")
    assert result.success, result.error_in_exec
    print(shell.user_ns["seen"], repr(shell.user_ns["_lens"].passes[0].groups_note) if "_lens" in shell.user_ns else "")
'''


@pytest.mark.parametrize("where", ["block", "cell"])
def test_dynamo_loaded_inside_the_block_is_watched_from_the_next_statement_or_said(where, tmp_path):
    """Dynamo is not imported by the lens (two seconds): its callbacks are registered when it is found loaded. In
    a %%lens cell that is before the next statement, so a compile there runs with the hooks out of sight (a
    compile-start callback registered after the lens's counts no global forward hook). In a ``with`` block that
    compiles in the statement that loaded dynamo, the pass says the compiled code may have seen the hooks."""
    import subprocess

    script = tmp_path / "fresh.py"
    script.write_text(FRESH_COMPILE)
    done = subprocess.run([sys.executable, str(script), where], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.strip().splitlines()[-1]
    if where == "block":
        assert "torch.compile compiled code in this block before the lens could hide its module-group hooks" in out
    else:
        assert out.startswith("[0]"), out
        assert "before the lens could hide" not in out
