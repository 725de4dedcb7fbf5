"""Run PyTorch's own test suites plain and with every test inside a Lens, and compare.

    python tests/pytorch_suites/run.py run autograd plain      # baseline
    python tests/pytorch_suites/run.py run autograd lens       # each test inside `with Lens():`
    python tests/pytorch_suites/run.py compare autograd        # broken tests, lens-only warnings

Suites: ``autograd`` (test_autograd.py), ``module_hooks`` (test_module_hooks.py); the files must be in
``upstream/`` (see README.md).  Records go to ``--out`` (default ``/tmp/autograd_lens_suites``), one JSON
line per test (see ``lens_plugin.py``).  ``-k EXPR`` and ``--timeout S`` are passed to pytest (the
timeout needs pytest-timeout).  ``compare`` exits 1 when a test not in ``known.py`` broke or warned
only under the lens.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SUITES = {"autograd": "test_autograd.py", "module_hooks": "test_module_hooks.py"}
DEFAULT_OUT = "/tmp/autograd_lens_suites"


def suite_path(suite: str) -> str:
    return os.path.join(HERE, "upstream", SUITES[suite])


def record_path(out: str, suite: str, mode: str) -> str:
    return os.path.join(out, f"{suite}.{mode}.jsonl")


def pytest_command(suite: str, mode: str, out: str, k: str | None = None, timeout: int | None = None,
                   extra: list[str] | None = None, words: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-c", os.path.join(HERE, "pytest.ini"), "-p", "lens_plugin",
           "-q", "-p", "no:cacheprovider", "--suite-record", record_path(out, suite, mode), suite_path(suite)]
    if mode == "lens":
        cmd.append("--lens")
    if k:
        cmd += ["-k", k]
    if timeout:
        cmd += [f"--timeout={timeout}"]
    if words:
        cmd += ["--name-words", words]
    return cmd + list(extra or [])


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["AUTOGRAD_LENS_SUITE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTORCH_TEST_WITH_SLOW", "0")
    return env


def run(suite: str, mode: str, out: str, k: str | None, timeout: int | None, extra: list[str],
        words: str | None = None) -> int:
    if not os.path.exists(suite_path(suite)):
        print(f"{suite_path(suite)} is missing: see {os.path.join(HERE, 'README.md')}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    code = subprocess.call(pytest_command(suite, mode, out, k, timeout, extra, words), cwd=os.path.dirname(suite_path(suite)),
                           env=environment())
    print(f"{suite} {mode}: pytest exit {code}, {time.monotonic() - start:.0f} s", flush=True)
    return code


def load(path: str) -> dict[str, dict]:
    tests = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            tests[entry["id"]] = entry
    return tests


def _warning_key(w: dict) -> tuple:
    return (w["category"], w["message"], w["file"], w["line"])


def differences(plain: dict[str, dict], lens: dict[str, dict]) -> tuple[list, list]:
    """(broken, warned): tests whose outcome differs; tests whose warnings differ (lens-only, missing)."""
    broken, warned = [], []
    for test_id in sorted(set(plain) | set(lens)):
        a, b = plain.get(test_id), lens.get(test_id)
        if a is None or b is None:
            broken.append((test_id, a and a["outcome"], b and b["outcome"], "run in one mode only"))
            continue
        if a["outcome"] != b["outcome"]:
            error = b["phases"].get("call", {}).get("error") or b["phases"].get("setup", {}).get("error", "")
            broken.append((test_id, a["outcome"], b["outcome"], error))
        seen_plain = collections.Counter(map(_warning_key, a["warnings"]))
        seen_lens = collections.Counter(map(_warning_key, b["warnings"]))
        extra, missing = seen_lens - seen_plain, seen_plain - seen_lens
        if extra or missing:
            warned.append((test_id, sorted(extra), sorted(missing)))
    return broken, warned


def counts(tests: dict[str, dict]) -> dict[str, int]:
    return dict(sorted(collections.Counter(t["outcome"] for t in tests.values()).items()))


def compare(suite: str, out: str) -> int:
    from known import KNOWN  # noqa: PLC0415  (this folder is on sys.path when run as a script)

    plain = load(record_path(out, suite, "plain"))
    lens = load(record_path(out, suite, "lens"))
    broken, warned = differences(plain, lens)
    print(f"{suite}: plain {counts(plain)} ({sum(t['duration'] for t in plain.values()):.0f} s in tests)")
    print(f"{suite}: lens  {counts(lens)} ({sum(t['duration'] for t in lens.values()):.0f} s in tests)")
    print(f"{suite}: {len(broken)} broken, {len(warned)} with lens-only warnings")
    unexplained = 0
    for test_id, was, now, error in broken:
        known = KNOWN.get(test_id.split("::", 1)[-1])
        unexplained += known is None
        print(f"  BROKEN {test_id}: {was} -> {now}  {'[known: ' + known[0] + ']' if known else ''}\n      {error[:300]}")
    for test_id, extra, missing in warned:
        known = KNOWN.get(test_id.split("::", 1)[-1])
        unexplained += known is None
        print(f"  WARNED {test_id} {'[known: ' + known[0] + ']' if known else ''}")
        for key in extra:
            print(f"      only under the lens: {key}")
        for key in missing:
            print(f"      only without it:     {key}")
    passes = sum(t.get("passes", 0) for t in lens.values())
    notes = collections.Counter(n.split(":")[0] for t in lens.values() for n in t.get("lens_notes", ()))
    print(f"{suite}: the lens recorded {passes} backward passes; recording notes: {dict(notes.most_common(8))}")
    return 1 if unexplained else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("suite", choices=sorted(SUITES))
    r.add_argument("mode", choices=["plain", "lens"])
    r.add_argument("-k", default=None)
    r.add_argument("--timeout", type=int, default=None)
    r.add_argument("--out", default=DEFAULT_OUT)
    r.add_argument("--words", default=None, help="only tests whose function name has one of these words (a,b,c)")
    r.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    c = sub.add_parser("compare")
    c.add_argument("suite", choices=sorted(SUITES))
    c.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.suite, args.mode, args.out, args.k, args.timeout, args.extra, args.words)
    return compare(args.suite, args.out)


if __name__ == "__main__":
    sys.exit(main())
