"""The declared torch and Python range, the guard below it, profiler detection on every Python, the self-check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
import types
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import autograd_lens as al
from autograd_lens import compat, selfcheck

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "AUTOGRAD_LENS_ANY_TORCH"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


# ----------------------------------------------------------------------------- declared range


def test_pyproject_declares_the_range_the_guard_and_ci_use():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch_requirement,) = [Requirement(dep) for dep in project["dependencies"] if Requirement(dep).name == "torch"]
    assert str(torch_requirement.specifier) == str(Requirement(compat.REQUIREMENT).specifier)
    for tested in compat.TESTED_TORCH:
        assert Version(tested) in torch_requirement.specifier
    assert Version("2.13.0+cpu") in torch_requirement.specifier  # README's pin and CI's canonical row
    assert Version(compat.TESTED_TORCH[0]) == Version(".".join(map(str, compat.MIN_TORCH)))
    assert Version("2.12.1") not in torch_requirement.specifier
    assert Version(".".join(map(str, compat.BELOW_TORCH))) not in torch_requirement.specifier
    assert project["requires-python"] == ">=3.11,<3.14" and compat.MIN_PYTHON == (3, 11)
    rows = re.findall(r"^row (\S+) (\S+)", (ROOT / ".ci" / "matrix").read_text(), re.M)
    assert {torch_version for _, torch_version in rows} | {"2.13.0"} == set(compat.TESTED_TORCH)  # + .ci/run's
    assert {python[:4] for python, _ in rows} == {"3.12", "3.13"}
    assert "bash .ci/matrix " in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("text, numbers", [("2.13.0+cpu", (2, 13, 0)), ("2.16.0a0+git1234", (2, 16, 0)),
                                           ("2.9.1", (2, 9, 1)), ("2.12", (2, 12)), ("2.15.0.dev20260101", (2, 15, 0))])
def test_versions_are_read_by_their_release_numbers(text, numbers):
    assert compat.parse(text) == numbers


def test_the_running_torch_and_python_are_served():
    assert compat.unsupported() is None and compat.refuse() is None and al._REFUSED is None
    assert compat.untested() is None


# ----------------------------------------------------------------------------- the guard below the range

NOTHING_ELSE = """
    import sys, torch
    original = torch.autograd._engine_run_backward
    try:
        import autograd_lens
    except ImportError as error:
        print("ImportError:", error)
    loaded = sorted(name for name in sys.modules if name.startswith("autograd_lens"))
    print(loaded, torch.autograd._engine_run_backward is original)
"""


@pytest.mark.parametrize("patch, line", [
    ("import torch; torch.__version__ = '2.12.1+cu130'",
     'autograd_lens needs torch >= 2.13.0; this is torch 2.12.1+cu130: nothing was loaded '
     '(pip install "torch>=2.13,<2.16")'),
    ("import sys, torch; sys.version_info = (3, 10, 13, 'final', 0)",  # torch first: its typing needs the real one
     "autograd_lens needs Python >= 3.11; this is Python 3.10.13: nothing was loaded"),
])
def test_below_the_range_import_says_what_is_needed_in_one_line_and_loads_nothing(patch, line):
    result = run_python(patch + "\n" + textwrap.dedent(NOTHING_ELSE))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"ImportError: {line}", "['autograd_lens.compat'] True"]


def test_below_the_range_load_ext_prints_one_line_and_registers_nothing():
    result = run_python("""
        import io, sys, torch
        torch.__version__ = "2.9.1"
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            shell.run_cell("%load_ext autograd_lens")
            shell.run_cell("%load_ext autograd_lens")  # again: the same line, not "already loaded"
            said, sys.stderr = sys.stderr.getvalue(), stderr
        finally:
            sys.stderr = stderr
        print(repr(said))
        print("lens" in shell.magics_manager.magics["cell"], "lens_graph" in shell.magics_manager.magics["line"])
        print(sorted(name for name in sys.modules if name.startswith("autograd_lens")))
        import autograd_lens
        try:
            autograd_lens.Lens
        except ImportError as error:
            print("later use:", error)
    """)
    assert result.returncode == 0, result.stderr
    line = ('autograd_lens needs torch >= 2.13.0; this is torch 2.9.1: nothing was loaded '
            '(pip install "torch>=2.13,<2.16")')
    assert result.stdout.splitlines() == [repr(f"UsageError: {line}\n" * 2), "False False",
                                          "['autograd_lens', 'autograd_lens.compat']", f"later use: {line}"]


# ----------------------------------------------------------------------------- another profiler, every Python


@pytest.fixture
def monitoring_profiler(monkeypatch):
    """A profiler registered with sys.monitoring, as cProfile and %prun are from Python 3.12: the real slot where
    it exists, an imitation of it on older Pythons (where cProfile uses sys.setprofile instead)."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        monitoring.use_tool_id(monitoring.PROFILER_ID, "a test profiler")
        yield "a test profiler"
        monitoring.free_tool_id(monitoring.PROFILER_ID)
    else:
        tools = {2: "a test profiler"}
        monkeypatch.setattr(sys, "monitoring", types.SimpleNamespace(PROFILER_ID=2, get_tool=tools.get), raising=False)
        yield "a test profiler"


def test_a_sys_monitoring_profiler_makes_the_lens_step_aside_and_say_so(monitoring_profiler):
    assert sys.getprofile() is None
    assert compat.other_profiler() == f"the sys.monitoring profiler {monitoring_profiler!r}"
    seen = []
    x = torch.ones(3, requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        y.register_hook(lambda grad: seen.append(grad.clone()) or grad * 3)
        y.sum().backward()
    assert sys.getprofile() is None  # the lens installed no profile function beside the profiler
    assert torch.equal(x.grad, torch.full((3,), 6.0)) and len(seen) == 1
    (backward_pass,) = lens.passes
    assert [run.name for run in backward_pass.node_runs] == ["SumBackward0", "MulBackward0"]
    assert backward_pass.hook_calls == ()
    assert any("another profiler" in note for note in backward_pass.notes)
    assert backward_pass.grads_without_hooks["x"] is None and "x" in backward_pass.unknown


# ----------------------------------------------------------------------------- the self-check


def test_the_self_check_command_passes_here_and_names_each_feature():
    result = subprocess.run([sys.executable, "-m", "autograd_lens.selfcheck"], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"autograd_lens {al.__version__} self-check on torch {torch.__version__}, Python ")
    assert {line.split()[0] for line in lines[1:-1]} <= {"exact", "degraded"}
    for feature in ("graph drawing", "backward functions and .grad", "hook calls", "gradients without hooks",
                    "saved-tensor hooks", "hook calls under cProfile/%prun"):
        assert sum(feature in line for line in lines[1:-1]) >= 1, feature
    assert lines[-1].startswith("ok:")


def test_the_self_check_fails_when_calls_over_two_passes_are_miscounted(monkeypatch, capsys):
    """What torch 2.11-2.12 do to the lens: every call of a hook shown as "call 1 of 1"."""
    from autograd_lens.capture import build

    monkeypatch.setattr(build.HookCounter, "count", lambda self, call, ordinal: (1, 1))
    assert selfcheck.main() == 1
    out = capsys.readouterr().out
    assert "  WRONG     hook calls" in out and out.splitlines()[-1].startswith("WRONG here: hook calls")


def test_the_self_check_fails_when_a_saved_constant_is_not_drawn(monkeypatch):
    """What torch 2.9 does to the lens: constants vanish from the drawing."""
    from autograd_lens.capture import walk

    monkeypatch.setattr(walk, "_drawn_saved_values", lambda fn: [])
    results = selfcheck.run_checks()
    assert [(status, feature) for status, feature, _ in results if status == selfcheck.WRONG] == [
        (selfcheck.WRONG, "graph drawing")]


def test_the_self_check_fails_when_the_lens_misses_a_running_profiler(monkeypatch):
    monkeypatch.setattr(compat, "other_profiler", lambda: None)
    (result,) = selfcheck.check_other_profiler()
    assert result[0] == selfcheck.WRONG and "not detected" in result[2]


def test_yappi_which_getprofile_cannot_see_makes_the_lens_step_aside(monkeypatch):
    """yappi sets its profile function from C with no object, so sys.getprofile() is None while it runs, on every
    Python: before the lens asked yappi, a Lens replaced yappi's function and yappi saw nothing more."""
    running = types.SimpleNamespace(is_running=lambda: True)
    monkeypatch.setitem(sys.modules, "yappi", running)
    assert compat.other_profiler() == "yappi"
    x = torch.ones(2, requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        y.register_hook(lambda grad: grad * 3)
        y.sum().backward()
    assert not lens.hook_calls and any("yappi" in note for note in lens.passes[0].notes)
    monkeypatch.setitem(sys.modules, "yappi", types.SimpleNamespace(is_running=lambda: False))
    assert compat.other_profiler() is None
    monkeypatch.setitem(sys.modules, "yappi", types.SimpleNamespace())  # not the profiler: not known to run
    assert compat.other_profiler() is None


def test_a_real_yappi_keeps_profiling_through_a_lens():
    yappi = pytest.importorskip("yappi")

    def user_step(x):
        y = x * 2
        y.register_hook(lambda grad: grad * 3)
        y.sum().backward()

    x = torch.ones(2, requires_grad=True)
    yappi.clear_stats()
    yappi.start()
    try:
        with al.Lens() as lens:
            user_step(x)
        user_step(x)
    finally:
        yappi.stop()
    assert [stat.ncall for stat in yappi.get_func_stats() if stat.name == "user_step"] == [2]
    assert not lens.hook_calls and torch.equal(x.grad, torch.full((2,), 12.0))
