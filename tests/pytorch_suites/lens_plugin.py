"""pytest plugin: run each test inside ``with autograd_lens.Lens():`` and record what happened.

Loaded by ``run.py`` with ``-p lens_plugin``.  Options:

``--lens``            wrap every test's call phase (unittest's setUp, the test, tearDown) in a Lens
``--suite-record F``  write one JSON line per test to F: outcome, warnings, duration, and under
                      ``--lens`` how many passes the lens recorded and its recording notes

Warnings are taken from pytest's own per-test record (``pytest_warning_recorded``), so both runs
see them the same way; a warning a test catches itself (``catch_warnings(record=True)``) is not
there, but then the test's own assertions see it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("autograd_lens suites")
    group.addoption("--lens", action="store_true", default=False, help="run each test inside a Lens")
    group.addoption("--suite-record", default=None, help="write one JSON line per test to this file")
    group.addoption("--name-words", default=None,
                    help="keep only tests whose function name contains one of these comma-separated words")


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    words = config.getoption("--name-words")
    if not words:
        return
    words = [w for w in words.split(",") if w]
    kept, dropped = [], []
    for item in items:
        (kept if any(w in item.name for w in words) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


class _Recorder:
    def __init__(self, config: Any) -> None:
        self.lens_mode = config.getoption("--lens")
        path = config.getoption("--suite-record")
        self.out = open(path, "w", encoding="utf-8") if path else None
        self.tests: dict[str, dict] = {}

    def entry(self, nodeid: str) -> dict:
        return self.tests.setdefault(nodeid, {"id": nodeid, "phases": {}, "warnings": [], "duration": 0.0})

    # ------------------------------------------------------------------ the lens around each test
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: Any):
        if not self.lens_mode:
            yield
            return
        import autograd_lens

        lens = autograd_lens.Lens()
        lens.__enter__()
        outcome = yield
        excinfo = outcome.excinfo
        try:
            if excinfo is None:
                lens.__exit__(None, None, None)
            else:
                lens.__exit__(excinfo[0], excinfo[1], excinfo[2])
        finally:
            entry = self.entry(item.nodeid)
            entry["passes"] = len(lens.passes)
            entry["lens_notes"] = [_ADDRESS.sub("0x?", str(n)) for n in lens.recording_notes]

    # ------------------------------------------------------------------ what happened
    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str, location: Any) -> None:
        if not nodeid:
            return
        self.entry(nodeid)["warnings"].append({
            "category": warning_message.category.__name__,
            "message": _ADDRESS.sub("0x?", str(warning_message.message))[:500],
            "file": warning_message.filename.rsplit("/", 1)[-1],
            "line": warning_message.lineno,
            "when": when,
        })

    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = self.entry(report.nodeid)
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome
        phase: dict[str, Any] = {"outcome": outcome}
        if report.failed:
            text = str(report.longrepr)
            noise = ("PYTORCH_PRINT_REPRO", "To execute this test", "E       python ")
            lines = [line[1:].strip() for line in text.splitlines()
                     if line.startswith("E ") and line[1:].strip() and not any(n in line for n in noise)]
            phase["error"] = _ADDRESS.sub("0x?", " | ".join(lines[:4]) if lines else text[-300:])[:600]
        elif report.skipped and isinstance(report.longrepr, tuple):
            phase["reason"] = str(report.longrepr[2])[:200]
        entry["phases"][report.when] = phase
        entry["duration"] += report.duration

    # pytest reports a test's warnings after its teardown (its warning capture wraps the whole
    # protocol): an entry is written when the next test starts, or at the end of the session.
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        for entry in [e for e in self.tests.values() if "teardown" in e["phases"]]:
            self._write(entry)

    def pytest_sessionfinish(self, session: Any) -> None:
        for entry in list(self.tests.values()):
            self._write(entry)

    def _write(self, entry: dict) -> None:
        phases = entry["phases"]
        outcome = "passed"
        for when in ("setup", "call", "teardown"):
            got = phases.get(when, {}).get("outcome")
            if got and got != "passed":
                outcome = "error" if when == "teardown" and got == "failed" else got
                break
        entry["outcome"] = outcome
        entry["duration"] = round(entry["duration"], 3)
        if self.out is not None:
            self.out.write(json.dumps(entry, sort_keys=True) + "\n")
            self.out.flush()
        self.tests.pop(entry["id"], None)

    def pytest_unconfigure(self, config: Any) -> None:
        for entry in list(self.tests.values()):
            self._write(entry)
        if self.out is not None:
            self.out.close()


def pytest_configure(config: Any) -> None:
    config.pluginmanager.register(_Recorder(config), "autograd_lens_suite_recorder")
