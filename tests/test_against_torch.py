"""The differential suite: generated programs, every statement the lens makes compared with what torch did
(see ``programs.py``).  CI runs 2,000 programs; ``python tests/programs.py --programs 20000`` runs a long
campaign and prints each failure as a minimal program."""

from __future__ import annotations

import warnings

import pytest

import programs
from autograd_lens.capture import build, observe

CHUNK = 100
PROGRAMS = 2000


@pytest.mark.parametrize("start", range(0, PROGRAMS, CHUNK))
def test_generated_programs_show_only_what_torch_did(start):
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_graph=True's reference-cycle warning, legacy hooks
        for seed in range(start, start + CHUNK):
            program, problems = programs.check(seed)
            if problems:
                failures.append(programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:3])


# ----------------------------------------------------------------------------- the checker catches what it should


TWO_PASSES = programs.Program([
    "torch.manual_seed(0)",
    "x0 = torch.randn((2,), requires_grad=True)",
    "t1 = x0 * 2.0",
    "REG(t1, 'register_hook', make_hook('h0', 'scale'))",
    "out = (t1.sum())",
    "PASS('backward', out, retain_graph=True)",
    "PASS('backward', out)",
], ["x0"])

C_HOOK_AFTER_INPLACE = programs.Program([
    "torch.manual_seed(0)",
    "x0 = torch.randn((2,), requires_grad=True)",
    "t1 = x0 * 3.0",
    "REG(t1, 'register_hook', CHOOK('h0', 'neg'))",
    "t1.add_(1.0)",
    "out = (t1.sum())",
    "PASS('backward', out)",
], ["x0"])


def test_the_checker_passes_a_program_the_lens_shows_truly():
    assert programs.compare(TWO_PASSES) == [] and programs.compare(C_HOOK_AFTER_INPLACE) == []


def test_the_checker_sees_a_wrong_call_count(monkeypatch):
    monkeypatch.setattr(build.HookCounter, "count", lambda self, call, ordinal: (1, 1))
    assert any("call 1 shown, it was call 2" in problem for problem in programs.compare(TWO_PASSES))


def test_the_checker_sees_a_missing_call_and_a_wrong_value_without_hooks(monkeypatch):
    monkeypatch.setattr(observe.PassObserver, "_unexplained", lambda self, fn, before, arrived: [])
    problems = programs.compare(C_HOOK_AFTER_INPLACE)
    assert any("0 hook calls shown, 1 ran" in problem for problem in problems)


def test_the_checker_sees_a_wrong_value_without_hooks(monkeypatch):
    original = build._results

    def wrong(observer, history, result):
        values = original(observer, history, result)
        values["without"] = {key: None if value is None else value * 3 for key, value in values["without"].items()}
        return values

    monkeypatch.setattr(build, "_results", wrong)
    assert any("without hooks" in problem for problem in programs.compare(TWO_PASSES))


def test_a_failure_prints_a_minimal_program(monkeypatch):
    monkeypatch.setattr(build.HookCounter, "count", lambda self, call, ordinal: (1, 1))
    text = programs.report(TWO_PASSES, programs.compare(TWO_PASSES))
    assert "minimal program" in text and "REG(t1, 'register_hook'" in text and "x0 = " in text
