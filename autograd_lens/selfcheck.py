"""``python -m autograd_lens.selfcheck``: what the lens shows exactly on *this* torch and Python.

Runs a few small programs twice, once plainly and once inside ``autograd_lens.Lens``, and compares what the lens
shows with what torch did: the drawing, the backward functions that ran, the gradients, every hook call (which
hook, what it received, "call i of n" over two passes), the gradients without hooks, saved-tensor hooks, and
another profiler.  Each feature is printed as ``exact``, ``degraded`` (the lens says "unknown" and why), ``off``
or ``WRONG``; the exit status is 1 when anything is ``WRONG`` (the lens would show something untrue here).
"""

from __future__ import annotations

import cProfile
import platform
import sys
from collections import Counter
from typing import Any, Callable

import torch

from . import __version__, compat
from .model import values_equal

EXACT, DEGRADED, OFF, WRONG = "exact", "degraded", "off", "WRONG"
Result = tuple  # (status, feature, detail)


# The programs are compiled from text under a file name outside this package: the lens names tensors from the
# user's frames, and frames of its own package are not the user's.
_SOURCE = '''
import torch


def clone(value):
    if isinstance(value, tuple):
        return tuple(clone(item) for item in value)
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class Affine(torch.nn.Module):
    """A Linear with fixed numbers (no random initialisation: the check leaves torch's generator alone)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]]))
        self.bias = torch.nn.Parameter(torch.tensor([0.1, -0.2]))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias)


def program(hooks):
    """A module, a constant, five kinds of hook, two passes: the hooks' log, each pass's .grads, the output."""
    log = []

    def tensor_hook(grad):
        log.append(("tensor_hook", clone(grad)))
        return grad * 0.5

    def pre_hook(grad_outputs):
        log.append(("pre_hook", clone(grad_outputs)))

    def post_hook(grad_inputs, grad_outputs):
        log.append(("post_hook", clone(grad_inputs)))

    def acc_hook(param):
        log.append(("acc_hook", clone(param.grad)))

    def module_hook(module, grad_input, grad_output):
        log.append(("module_hook", clone(grad_input)))

    x = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    lin = Affine()
    if hooks:
        lin.register_full_backward_hook(module_hook)
    h = torch.tanh(lin(x))
    y = h * 3.0
    if hooks:
        y.register_hook(tensor_hook)
        h.grad_fn.register_prehook(pre_hook)
        y.grad_fn.register_hook(post_hook)
        x.register_post_accumulate_grad_hook(acc_hook)
    out = (y * y).sum()
    grads = []
    for _ in range(2):
        log.append(("pass", None))
        out.backward(retain_graph=True)
        grads.append({"x": clone(x.grad), "lin.weight": clone(lin.weight.grad), "lin.bias": clone(lin.bias.grad)})
    return {"log": log, "grads": grads, "out": out}


def saved(calls):
    def pack(tensor):
        calls["pack"] += 1
        return tensor

    def unpack(tensor):
        calls["unpack"] += 1
        return tensor

    x = torch.tensor([0.5, -1.5], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = (x.sin() * x).sum()
    out.backward()
    return clone(x.grad)


def profiled():
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: grad * 3)
    y.sum().backward()
'''
_PROGRAMS: dict = {}


def _programs() -> dict:
    if not _PROGRAMS:
        exec(compile(_SOURCE, "<autograd_lens selfcheck>", "exec"), _PROGRAMS)
    return _PROGRAMS


def _program(hooks: bool) -> dict:
    result = _programs()["program"](hooks)
    result["functions"] = _functions(result["out"])
    return result


def _functions(out: torch.Tensor) -> Counter:
    seen, stack, names = set(), [out.grad_fn], Counter()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names[fn.name()] += 1
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


def _traced(function: Callable[[], Any]) -> tuple[Any, Any]:
    from .capture.tracer import Lens

    with Lens() as lens:
        result = function()
    return result, lens


# ----------------------------------------------------------------------------- the checks


def check_drawing() -> list[Result]:
    from .api import graph

    plain = _program(hooks=False)
    drawn = graph(plain["out"])
    ops = Counter(node.op for node in drawn.nodes if node.kind in ("function", "leaf"))
    torch_ops = Counter({name: count for name, count in plain["functions"].items()})
    if ops != torch_ops:
        return [(WRONG, "graph drawing", f"drew {dict(ops)}, torch's graph has {dict(torch_ops)}")]
    constants = [node.label for node in drawn.nodes if node.kind == "constant"]
    if "3.0" not in constants:
        return [(WRONG, "graph drawing", f"the constant 3.0 that `h * 3.0` saved is not drawn (constants: {constants})")]
    return [(EXACT, "graph drawing", f"{sum(ops.values())} functions as torch links them, saved constants drawn")]


def check_recording() -> list[Result]:
    plain = _program(hooks=True)
    traced, lens = _traced(lambda: _program(hooks=True))
    results = []
    problems = []
    if len(lens.passes) != 2:
        return [(WRONG, "backward passes", f"{len(lens.passes)} recorded, 2 ran")]
    expected_runs = Counter({name: n for name, n in plain["functions"].items() if "AccumulateGrad" not in name})
    for index, backward_pass in enumerate(lens.passes):
        runs = Counter(run.name for run in backward_pass.node_runs)
        if runs != expected_runs:
            problems.append(f"pass {index + 1}: ran {dict(runs)}, torch ran {dict(expected_runs)}")
        for name, value in plain["grads"][index].items():
            if not values_equal(backward_pass.leaf_grads.get(name), value):
                problems.append(f"pass {index + 1}: {name}.grad shown {backward_pass.leaf_grads.get(name)}, was {value}")
    if not all(values_equal(traced["grads"][i][k], v) for i in range(2) for k, v in plain["grads"][i].items()):
        problems.append("the gradients of the program changed under the lens")
    results.append((WRONG, "backward functions and .grad", "; ".join(problems)) if problems else
                   (EXACT, "backward functions and .grad", "every function torch ran, every .grad after each pass"))
    results.append(_hook_calls(plain["log"], traced["log"], lens))
    results.append(_without_hooks(lens))
    return results


def _hook_calls(plain_log: list, traced_log: list, lens: Any) -> Result:
    feature = "hook calls"
    if [tag for tag, _ in plain_log] != [tag for tag, _ in traced_log]:
        return (WRONG, feature, "the hooks ran differently under the lens")
    from .capture import tracer

    disabled = tracer._SELF_CHECK.get("result")
    calls = list(lens.hook_calls)
    if disabled:
        return (OFF, feature, disabled) if not calls else (WRONG, feature, f"{disabled}, yet hook calls were shown")
    expected, pass_index, counts = [], -1, Counter()
    for tag, value in plain_log:
        if tag == "pass":
            pass_index += 1
            continue
        counts[tag] += 1
        expected.append((tag, pass_index, counts[tag], value))
    if len(calls) != len(expected):
        return (WRONG, feature, f"{len(calls)} shown, {len(expected)} ran")
    registrations: dict[str, set] = {}
    for call, (tag, pass_index, invocation, value) in zip(calls, expected):
        shown = (call.hook, call.pass_index, call.invocation)
        if shown != (tag, pass_index, invocation):
            return (WRONG, feature, f"shown {shown} (hook, pass, call i), was {(tag, pass_index, invocation)}")
        if not values_equal(call.grad_in, value):
            return (WRONG, feature, f"{tag} in pass {pass_index + 1} shown receiving {call.grad_in}, got {value}")
        registrations.setdefault(tag, set()).add(call.registration)
    if any(len(found) != 1 for found in registrations.values()) or len(
            {next(iter(found)) for found in registrations.values()}) != len(registrations):
        return (WRONG, feature, f"calls grouped into registered hooks wrongly: {registrations}")
    return (EXACT, feature, f"{len(calls)} calls of 5 kinds of hook over 2 passes: which, order, values, call i of n")


def _without_hooks(lens: Any) -> Result:
    feature = "gradients without hooks"
    plain = _program(hooks=False)["grads"][0]
    first = lens.passes[0]
    unknown = [f"{name}: {why}" for name, why in first.unknown.items()]
    if unknown:
        return (DEGRADED, feature, "unknown here: " + "; ".join(unknown))
    for name, value in plain.items():
        if not values_equal(first.grads_without_hooks.get(name), value):
            return (WRONG, feature, f"{name} shown {first.grads_without_hooks.get(name)}, torch without hooks: {value}")
    return (EXACT, feature, "re-computed values equal a run without hooks")


def check_saved_tensor_hooks() -> list[Result]:
    feature = "saved-tensor hooks (pack/unpack)"

    def run() -> tuple[Counter, Any]:
        calls: Counter = Counter()
        return calls, _programs()["saved"](calls)

    plain_calls, plain_grad = run()
    (lens_calls, lens_grad), lens = _traced(run)
    if lens_calls != plain_calls or not values_equal(lens_grad, plain_grad):
        return [(WRONG, feature, f"under the lens {dict(lens_calls)}, plainly {dict(plain_calls)}")]
    if not lens.passes or not values_equal(lens.passes[0].leaf_grads.get("x"), plain_grad):
        return [(WRONG, feature, "the recorded x.grad differs from torch's")]
    return [(EXACT, feature, f"pack/unpack ran as without the lens ({dict(plain_calls)})")]


def check_other_profiler() -> list[Result]:
    feature = "hook calls under cProfile/%prun"
    if compat.other_profiler() is not None:
        return [(DEGRADED, feature, "not checked: a profiler is already running this check")]
    profiler = cProfile.Profile()

    run = _programs()["profiled"]
    profiler.enable()
    try:
        seen = compat.other_profiler()
        _, lens = _traced(run)
    finally:
        profiler.disable()
    if seen is None:
        return [(WRONG, feature, "a running cProfile is not detected on this Python")]
    (backward_pass,) = lens.passes
    noted = any("another profiler" in note for note in backward_pass.notes)
    if backward_pass.hook_calls or not noted:
        return [(WRONG, feature, "the lens did not step aside for the running profiler, or did not say so")]
    return [(DEGRADED, feature, f"detected ({seen}): backward functions and gradients recorded, hook calls "
                                "not attributed, and a note says so")]


CHECKS = (check_drawing, check_recording, check_saved_tensor_hooks, check_other_profiler)


def run_checks() -> list[Result]:
    results: list[Result] = []
    for check in CHECKS:
        try:
            with torch.enable_grad(), torch.device("cpu"):
                results.extend(check())
        except Exception as problem:  # a check that cannot run says so: the lens may be wrong here
            results.append((WRONG, check.__name__[len("check_"):].replace("_", " "),
                            f"the check failed: {type(problem).__name__}: {problem}"))
    return results


def versions() -> tuple[str, str]:
    torch_line = f"torch {torch.__version__}"
    newer = compat.untested()
    if newer:
        torch_line += " (newer than any tested: the checks below decide)"
    python = platform.python_version()
    return torch_line, f"Python {python}"


def main(argv: list[str] | None = None) -> int:
    torch_line, python_line = versions()
    print(f"autograd_lens {__version__} self-check on {torch_line}, {python_line} "
          f"(tested: torch {compat.TESTED_TORCH[0]} to {compat.TESTED_TORCH[-1]}, Python 3.11 to 3.13)")
    results = run_checks()
    width = max(len(feature) for _, feature, _ in results)
    for status, feature, detail in results:
        print(f"  {status:<8}  {feature:<{width}}  {detail}")
    wrong = [feature for status, feature, _ in results if status == WRONG]
    if wrong:
        print(f"WRONG here: {', '.join(wrong)}: the lens would show something untrue on this torch and Python; "
              f"use {compat.REQUIREMENT} and report it")
        return 1
    print("ok: nothing the lens shows here differs from what torch did")
    return 0


if __name__ == "__main__":
    sys.exit(main())
