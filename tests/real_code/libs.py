"""Runs a program of a hook-registering library (captum, opacus, peft) four ways, for tests/test_libraries.py.

``plain``: as written; ``lens``: inside ``autograd_lens.Lens``; ``truth``: every backward hook the *library*
registers (``Tensor.register_hook``, module full/pre/legacy backward hooks, post-accumulate hooks, called from the
library's own files, not torch's) wrapped to log what it received and returned; ``nohook``: those registrations
skipped (forward hooks stay: the graph is the same), each pass's result and ``.grad`` recorded.  ``problems``
compares them: the outcome bit for bit, warnings, every hook call the lens shows (hook, what it received and passed
on, whether it changed the gradient) with the logged ones, and every value "without hooks" with the ``nohook`` run.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable

import torch
from torch import nn

LIBRARIES = ("captum", "opacus", "peft")
REGISTRATIONS = ((torch.Tensor, "register_hook", "tensor"), (nn.Module, "register_full_backward_hook", "module"),
                 (nn.Module, "register_full_backward_pre_hook", "module_pre"),
                 (nn.Module, "register_backward_hook", "module"),
                 (torch.Tensor, "register_post_accumulate_grad_hook", "after"))


def clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return tuple(clone(v) for v in value)
    return value


def equal(a: Any, b: Any) -> bool:
    """Bit for bit (NaN equal to NaN), through tuples, lists and dicts."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(7.5), b.nan_to_num(7.5))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return a == b


def _by_library() -> bool:
    """Whether the registration being made comes from a library's file (not torch's, which registers its own)."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" in filename:
            return False
        if any(f"/{name}/" in filename for name in LIBRARIES):
            return True
        if filename != __file__:
            return False
        frame = frame.f_back
    return False


def _patched(replace: Callable) -> Callable[[], None]:
    saved = {}
    for owner, method, kind in REGISTRATIONS:
        original = saved[(owner, method)] = getattr(owner, method)
        setattr(owner, method, replace(original, kind))
    return lambda: [setattr(owner, method, original) for (owner, method), original in saved.items()]


def _logging(log: list) -> Callable[[], None]:
    def replace(original, kind):
        def register(self, hook, *args, **kwargs):
            if not _by_library():
                return original(self, hook, *args, **kwargs)

            @functools.wraps(hook)
            def logged(*hook_args):
                received = hook_args[0] if kind in ("tensor", "after") else hook_args[1]
                log.append((getattr(getattr(hook, "func", hook), "__qualname__", repr(hook)), kind, clone(received)))
                out = hook(*hook_args)
                log[-1] += (clone(out if out is not None else received), out is not None)
                return out
            return original(self, logged, *args, **kwargs)
        return register
    return _patched(replace)


class _Removed:
    def remove(self) -> None:
        pass


def _skipping() -> Callable[[], None]:
    def replace(original, kind):
        def register(self, hook, *args, **kwargs):
            return _Removed() if _by_library() else original(self, hook, *args, **kwargs)
        return register
    return _patched(replace)


def leaves(namespace: dict) -> dict[str, torch.Tensor]:
    """The program's named leaves, labelled as the lens labels them (``model.<parameter name>``)."""
    found = {}
    for name, value in namespace.items():
        if isinstance(value, torch.Tensor) and value.is_leaf:
            found[name] = value
        elif isinstance(value, nn.Module):
            found.update((f"{name}.{p}", t) for p, t in value.named_parameters())
    return found


def _recording(namespace: dict) -> Callable[[], None]:
    """Each outermost pass's result and the named leaves' .grad after it (nested ones, e.g. reentrant
    checkpointing's, are part of their pass)."""
    import torch.autograd as autograd
    original, depth = autograd._engine_run_backward, [0]
    namespace["passes"] = []

    def wrapped(*args, **kwargs):
        depth[0] += 1
        try:
            result = original(*args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            namespace["passes"].append({"result": clone(result),
                                        "grads": {k: clone(v.grad) for k, v in leaves(namespace).items()}})
        return result
    autograd._engine_run_backward = wrapped
    return lambda: setattr(autograd, "_engine_run_backward", original)


def run(program: Callable[[dict], Any], mode: str, seed: int = 0) -> dict:
    """``program(namespace)`` run one way; it puts what it names in ``namespace`` and returns its outcome."""
    import autograd_lens as al

    torch.manual_seed(seed)
    namespace: dict = {"mode": mode, "log": []}
    undo = {"truth": lambda: _logging(namespace["log"]), "nohook": _skipping}.get(mode, lambda: lambda: None)()
    undo_passes = _recording(namespace) if mode == "nohook" else (lambda: None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if mode == "lens":
                with al.Lens(names=namespace) as lens:
                    namespace["out"] = program(namespace)
                namespace["lens"] = lens
            else:
                namespace["out"] = program(namespace)
    finally:
        undo()
        undo_passes()
    namespace["warnings"] = [(type(w.message).__name__, str(w.message)) for w in caught]
    return namespace


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, (tuple, list)) else value


def problems(program: Callable[[dict], Any], seed: int = 0, without: bool = True) -> tuple[list[str], dict]:
    """Every false statement of the lens on ``program`` and every change it made (empty: none), and the runs.
    ``without``: compare the values without hooks with a run whose library backward hooks were never registered
    (False where the program cannot run without them: then, since each hook is checked to return ``None`` or what
    it received, the values without hooks must be the ``.grad`` the pass left)."""
    runs = {mode: run(program, mode, seed) for mode in ("plain", "lens", "truth") + (("nohook",) if without else ())}
    plain, lensed, truth = runs["plain"], runs["lens"], runs["truth"]
    found = []
    if not equal(plain["out"], lensed["out"]):
        found.append("the outcome differs under the lens")
    if not equal(plain["out"], truth["out"]):
        found.append("the outcome differs with the hooks logged (the harness changed it)")
    if plain["warnings"] != lensed["warnings"]:
        found.append(f"warnings: {plain['warnings']} plainly, {lensed['warnings']} under the lens")
    passes = lensed["lens"].passes
    shown = [call for p in passes for call in p.hook_calls]
    ran = truth["log"]
    if len(shown) != len(ran):
        found.append(f"{len(shown)} hook calls shown, {len(ran)} ran")
        ran = []
    for call, (name, kind, received, passed, returned) in zip(shown, ran):
        where = f"pass {call.pass_index} {call.hook} on {call.target}"
        if call.hook not in (name, name.split(".")[-1]):
            found.append(f"{where}: {name} ran")
        if not equal(_tuple(call.grad_in), _tuple(received)) or not equal(_tuple(call.grad_out), _tuple(passed)):
            found.append(f"{where}: shown {call.grad_in} -> {call.grad_out}, it was {received} -> {passed}")
        if call.modified != (not equal(received, passed)) or call.returned_none == returned:
            found.append(f"{where}: shown modified={call.modified} returned_none={call.returned_none}")
    if without:
        found += _without(passes, runs["nohook"]["passes"])
    elif all(equal(received, passed) for _, _, received, passed, _ in truth["log"]):
        for p in passes:
            found += [f"pass {p.index}: {k} without hooks {v} shown, its hooks changed nothing: {p.leaf_grads.get(k)}"
                      for k, v in p.grads_without_hooks.items() if k not in p.unknown
                      and not equal(v, p.leaf_grads.get(k))]
    return found, runs


def _without(passes: list, unhooked: list) -> list[str]:
    if len(passes) != len(unhooked):
        return [f"{len(passes)} passes shown, {len(unhooked)} ran without hooks"]
    found, compared = [], 0
    for p, real in zip(passes, unhooked):
        if p.kind == "grad":
            pairs = [(name, real["result"][i]) for i, name in enumerate(p.inputs)]
        else:
            pairs = [(name, real["grads"][name]) for name in p.grads_without_hooks if name in real["grads"]]
        for name, value in pairs:
            if name in p.grads_without_hooks and name not in p.unknown:
                compared += 1
                if not equal(p.grads_without_hooks[name], value):
                    found.append(f"pass {p.index}: {name} without hooks {p.grads_without_hooks[name]} shown, "
                                 f"it is {value}")
    return found if compared else ["no value without hooks compared"]
