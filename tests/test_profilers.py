"""Profilers record the same user code with and without a Lens, on every Python (#21).

Up to Python 3.11 cProfile and ``%prun`` hold ``sys.setprofile``'s slot; from 3.12 they are ``sys.monitoring``'s
profiler tool.  yappi sets a profile function from C on every Python; line_profiler 5 traces with ``sys.settrace`` up
to 3.11 and takes ``sys.monitoring``'s profiler tool from 3.12.  Each test runs the same program under the profiler
twice, plainly and with a backward inside a ``Lens``, and compares what the profiler recorded for the functions of
this file (calls, callers, line hits); and checks that the lens either recorded every hook call or said why not.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import sys

import pytest
import torch

import autograd_lens as al
from autograd_lens import compat

HERE = __file__


def triple(grad):
    return grad * 3


def helper(x):
    return float(x.grad.sum())


def user_step(x):
    y = x * 2
    y.register_hook(triple)
    y.sum().backward()
    return helper(x)


def deep_step(x):
    """A graph larger than the lens models before the pass (capture/tracer.py EAGER_MODEL_LIMIT)."""
    y = x
    for _ in range(120):
        y = y * 1.0
    y.register_hook(triple)
    y.sum().backward()
    return helper(x)


def failing_step(x):
    """A hook raising: the error leaves the backward through the lens."""
    y = x * 2
    y.register_hook(refuse)
    try:
        y.sum().backward()
    except ValueError:
        return "refused"
    return "ran"


def refuse(grad):
    raise ValueError("no")


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.linear.register_full_backward_hook(module_hook)

    def forward(self, x):
        return self.linear(x) * 2


def module_hook(module, grad_input, grad_output):
    return None


def module_step(x):
    torch.manual_seed(0)
    model = Scaled()
    model(x).sum().backward()
    return helper(x)


def program(step, lens):
    x = torch.ones(3, requires_grad=True)
    with lens if lens is not None else contextlib.nullcontext():
        first = step(x)
        second = step(x)
    after = step(x)  # a backward after the block, plainly
    return first, second, after, x.grad.clone() if x.grad is not None else None


STEPS = {"hook": (user_step, {}), "deep graph": (deep_step, {}), "hook raises": (failing_step, {}),
         "modules": (module_step, {"modules": True}), "why": (user_step, {"why": True})}


def _same_result(plain, traced):
    assert plain[:3] == traced[:3]
    assert (plain[3] is None and traced[3] is None) or torch.equal(plain[3], traced[3])


def _steps_the_lens_stepped_aside(lens, seen):
    """The lens recorded the backward functions only, and said why hook calls and values without hooks are
    missing (naming the profiler it saw)."""
    assert seen is not None
    assert lens.passes and all(backward_pass.node_runs for backward_pass in lens.passes)
    assert lens.hook_calls == []
    for backward_pass in lens.passes:
        assert any("another profiler" in note and seen in note for note in backward_pass.notes)


def _cprofile_own(stats: pstats.Stats, here: str = HERE) -> dict:
    """Calls of this file's functions: (calls, primitive calls) and callers from this file, with their counts."""
    own = {}
    for (filename, line, name), (cc, nc, _, _, callers) in stats.stats.items():
        if filename == here:
            own[(line, name)] = (cc, nc, {key[1:]: value[:2] for key, value in callers.items() if key[0] == here})
    return own


def _cprofiled(step, lens):
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        seen = compat.other_profiler()
        result = program(step, lens)
    finally:
        profiler.disable()
    return result, _cprofile_own(pstats.Stats(profiler)), seen


@pytest.mark.parametrize("case", list(STEPS))
def test_cprofile_records_the_same_calls_with_a_lens(case):
    step, options = STEPS[case]
    plain, plain_stats, _ = _cprofiled(step, None)
    lens = al.Lens(**options)
    traced, traced_stats, seen = _cprofiled(step, lens)
    _same_result(plain, traced)
    assert traced_stats == plain_stats
    assert (step.__code__.co_firstlineno, step.__name__) in plain_stats and len(plain_stats) >= 3
    assert len(lens.passes) == 2
    _steps_the_lens_stepped_aside(lens, seen)
    assert sys.getprofile() is None and compat.other_profiler() is None


def test_prun_records_the_same_calls_with_a_lens(shell):
    shell.user_ns.update(program=program, user_step=user_step, al=al)
    plain = shell.run_line_magic("prun", "-q -r program(user_step, None)")
    shell.user_ns["lens"] = lens = al.Lens()
    traced = shell.run_line_magic("prun", "-q -r program(user_step, lens)")
    here = os.path.basename(HERE)  # %prun strips directories
    assert _cprofile_own(traced, here) == _cprofile_own(plain, here) and len(_cprofile_own(plain, here)) == 4
    _steps_the_lens_stepped_aside(lens, "cProfile" if sys.version_info >= (3, 12) else "sys.setprofile")


def _yappi_own(yappi) -> dict:
    return {(stat.lineno, stat.name): (stat.ncall, stat.nactualcall,
                                       sorted((child.name, child.ncall) for child in stat.children
                                              if child.module == HERE))
            for stat in yappi.get_func_stats() if stat.module == HERE}


@pytest.mark.parametrize("case", ["hook", "deep graph", "hook raises", "modules"])
def test_yappi_records_the_same_calls_with_a_lens(case):
    yappi = pytest.importorskip("yappi")
    step, options = STEPS[case]
    runs = []
    for lens in (None, al.Lens(**options)):
        yappi.clear_stats()
        yappi.start()
        try:
            seen = compat.other_profiler()
            result = program(step, lens)
        finally:
            yappi.stop()
        runs.append((result, _yappi_own(yappi), lens, seen))
    yappi.clear_stats()
    (plain, plain_stats, _, _), (traced, traced_stats, lens, seen) = runs
    _same_result(plain, traced)
    assert traced_stats == plain_stats and plain_stats[(step.__code__.co_firstlineno, step.__name__)][0] == 3
    assert seen == "yappi"
    _steps_the_lens_stepped_aside(lens, seen)


def test_line_profiler_counts_the_same_lines_with_a_lens():
    line_profiler = pytest.importorskip("line_profiler")
    runs = []
    for lens in (None, al.Lens()):
        profiler = line_profiler.LineProfiler(user_step, triple, program)
        profiler.enable_by_count()
        try:
            seen = compat.other_profiler()
            result = program(user_step, lens)
        finally:
            profiler.disable_by_count()
        hits = {key[2]: [line[:2] for line in lines] for key, lines in profiler.get_stats().timings.items()}
        runs.append((result, hits, lens, seen))
    (plain, plain_hits, _, _), (traced, traced_hits, lens, seen) = runs
    _same_result(plain, traced)
    assert traced_hits == plain_hits and dict(plain_hits["triple"]) == {triple.__code__.co_firstlineno + 1: 3}
    if sys.version_info >= (3, 12):  # sys.monitoring's profiler tool: the lens steps aside and says so
        assert seen == "the sys.monitoring profiler 'line_profiler'"
        _steps_the_lens_stepped_aside(lens, seen)
    else:  # sys.settrace's slot, not the profile function's: the lens records every hook call
        assert seen is None
        assert [call.target for call in lens.hook_calls] == ["y", "y"]
        calls = [(call.grad_in.tolist(), call.grad_out.tolist()) for call in lens.hook_calls]
        assert calls == [([1.0] * 3, [3.0] * 3)] * 2  # triple() of each pass's ones, as plain torch runs it
        assert not any("another profiler" in note for backward_pass in lens.passes for note in backward_pass.notes)


def test_the_lens_s_own_blocks_keep_a_running_cprofile_in_step():
    """What broke cProfile on Python 3.12-3.13: ``obj.__enter__()`` of a pybind11 class (torch's
    ``_DisableTorchDispatch``) is reported as a CALL of the bound method but a C_RETURN of the function inside it,
    so cProfile popped a frame it had never pushed, once per block, and lost the callers of the lens."""
    from autograd_lens.capture.snapshot import hidden_from_user

    def inside():
        for _ in range(3):
            with hidden_from_user():
                pass

    def around():
        inside()

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        around()
    finally:
        profiler.disable()
    names = {name: value[:2] for (filename, _, name), value in pstats.Stats(profiler).stats.items() if filename == HERE}
    assert names == {"inside": (1, 1), "around": (1, 1)}


def test_each_running_profiler_is_named():
    assert compat.other_profiler() is None
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        seen = compat.other_profiler()
    finally:
        profiler.disable()
    if sys.version_info >= (3, 12):
        assert seen == "the sys.monitoring profiler 'cProfile'"
    else:
        assert seen == "cProfile.Profile through sys.setprofile"
    assert compat.other_profiler() is None


def _started_in_a_hook(lensed: bool):
    """A hook starts cProfile during the pass; a later hook and a call after the pass are profiled."""
    profiler = cProfile.Profile()

    def start(grad):
        profiler.enable()
        return grad * 2

    x = torch.ones(3, requires_grad=True)
    block = al.Lens() if lensed else contextlib.nullcontext()
    try:
        with block as lens:
            y = x * 3
            z = y.sin()
            y.register_hook(start)
            z.register_hook(triple)
            z.sum().backward()
            helper(x)
    finally:
        profiler.disable()
    called = {name: stat[1] for (path, _, name), stat in pstats.Stats(profiler).stats.items() if path == HERE}
    return called, x.grad.clone(), lens


def test_a_profiler_started_inside_a_hook_keeps_running_and_the_lens_says_so():
    plain_calls, plain_grad, _ = _started_in_a_hook(lensed=False)
    lens_calls, lens_grad, lens = _started_in_a_hook(lensed=True)
    assert lens_calls == plain_calls and torch.equal(lens_grad, plain_grad)
    assert plain_calls.get("helper") == 1  # the profile kept recording after the pass
    (backward_pass,) = lens.passes
    if sys.version_info < (3, 12):  # cProfile took sys.setprofile's slot from the lens during the pass
        assert any("a profiler was started during the pass" in note for note in backward_pass.notes)
        assert "x" in backward_pass.unknown and backward_pass.grads_without_hooks["x"] is None
    else:  # cProfile runs on sys.monitoring: the lens keeps recording every hook call
        assert [call.hook for call in backward_pass.hook_calls] == ["triple", "start"]
