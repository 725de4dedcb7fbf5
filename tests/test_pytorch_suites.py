"""PyTorch's own hook-related tests behave the same with each test inside a Lens (#19).

The tests of ``test_autograd.py`` and ``test_module_hooks.py`` whose function name contains hook,
backward, grad or checkpoint run twice in a subprocess (``tests/pytorch_suites``): plain, and with each
test inside ``with autograd_lens.Lens():``.  Every test must end the same way and record the same
warnings (category, message, file, line) in both runs.  Differences listed in
``tests/pytorch_suites/known.py`` as a lens defect are expected here (xfail, strict: a fix makes them
pass, and then the entry must go); those listed as ``observer`` (the test checks something any
observer changes) are explained and not counted.

PyTorch's test files are not part of this repository: without them (see
``tests/pytorch_suites/README.md``) or without ``expecttest`` and ``pytest-timeout``, these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

SUITES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_suites")
WORDS = "hook,backward,grad,checkpoint"
# Left to the full run (tests/pytorch_suites/run.py): compiles a C++ extension, ~80 s on 2 cores.
SLOW = ["upstream/test_autograd.py::TestAutograd::test_multi_grad_all_hooks"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_pytorch_suites_{name}", os.path.join(SUITES_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load("run")
KNOWN = _load("known").KNOWN
_MISSING = [name for name in run.SUITES if not os.path.exists(run.suite_path(name))]
_NEEDED = [name for name in ("expecttest", "pytest_timeout") if importlib.util.find_spec(name) is None]

pytestmark = pytest.mark.skipif(
    bool(_MISSING) or bool(_NEEDED),
    reason=(f"PyTorch's test files are missing ({', '.join(_MISSING)}): see tests/pytorch_suites/README.md"
            if _MISSING else f"{' and '.join(_NEEDED)} not installed (PyTorch's test helpers and the runner's "
            "--timeout need them): see tests/pytorch_suites/README.md"),
)


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    """{"both": (plain records, lens records, broken, warned)} for the hook-related subset of both files,
    run by one pytest per mode (starting pytest and importing the suites is half the time)."""
    out = str(tmp_path_factory.mktemp("suites"))
    extra = [arg for test in SLOW for arg in ("--deselect", test)] + [run.suite_path("module_hooks")]
    for mode in ("plain", "lens"):
        command = run.pytest_command("autograd", mode, out, timeout=120, words=WORDS, extra=extra)
        subprocess.run(command, cwd=os.path.dirname(run.suite_path("autograd")), env=run.environment(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900, check=False)
    plain = run.load(run.record_path(out, "autograd", "plain"))
    lens = run.load(run.record_path(out, "autograd", "lens"))
    return {"both": (plain, lens, *run.differences(plain, lens))}


def _short(test_id: str) -> str:
    return test_id.split("::", 1)[-1]


def _differing(suites) -> dict[str, str]:
    """Short test id -> what differs, over both suites."""
    found = {}
    for _suite, (_plain, _lens, broken, warned) in suites.items():
        for test_id, was, now, error in broken:
            found[_short(test_id)] = f"{was} -> {now}: {error[:200]}"
        for test_id, extra, missing in warned:
            found.setdefault(_short(test_id), f"warnings only under the lens {extra}, only without it {missing}")
    return found


def test_the_subset_ran_in_both_modes(suites):
    plain, lens, _broken, _warned = suites["both"]
    assert set(plain) == set(lens)
    for name in run.SUITES.values():
        ran = [t for test_id, t in plain.items() if test_id.startswith(f"upstream/{name}::")]
        assert sum(t["outcome"] == "passed" for t in ran) >= 40, (name, run.counts(plain))


def test_no_test_breaks_or_warns_differently_under_the_lens(suites):
    unexplained = {test: what for test, what in _differing(suites).items() if test not in KNOWN}
    assert unexplained == {}


_DEFECTS = sorted(test for test, (kind, _reason) in KNOWN.items() if kind == "lens-defect")


@pytest.mark.parametrize("test", [
    pytest.param(test, marks=pytest.mark.xfail(strict=True, reason=KNOWN[test][1])) for test in _DEFECTS
])
def test_known_lens_defect_is_fixed(suites, test):
    assert any(_short(test_id) == test for _s, (plain, _l, _b, _w) in suites.items() for test_id in plain), (
        f"{test} is not in the subset run here: it cannot show whether it is fixed")
    assert test not in _differing(suites)
