"""A pass's model is made after backward() returns, when the passes are first read (issue #24, capture/deferred.py).

- nothing of the model (no BackwardPass, no NodeRun) is made while ``Lens._run`` is on the stack;
- the models made later equal those made at the end of each pass (``deferred.DEFER = False``), every field, on
  generated programs of several passes (hooks of every kind, retained graphs, errors) and on model programs;
- what waits holds nothing live: no node of torch's graph, no hook, frame, module or namespace, and user objects die
  when the user lets them go, before the passes are read;
- a model that cannot be made becomes the note and the Lens's one warning, pointed at the user's line, never an
  exception; the passes after it are numbered as if it never was (as when a pass cannot be read at all).
"""

from __future__ import annotations

import gc
import sys
import types
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import deferred, draft, tracer
from autograd_lens.model import BackwardPass

sys.path.insert(0, str(Path(__file__).parent))


def _inside_backward() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is tracer.Lens._run.__code__:
            return True
        frame = frame.f_back
    return False


def test_no_model_is_made_inside_backward(monkeypatch):
    made_inside: list[str] = []
    original_init = BackwardPass.__init__

    def init(self, *args, **kwargs):
        if _inside_backward():
            made_inside.append("BackwardPass")
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(BackwardPass, "__init__", init)
    original_run = getattr(draft, "node_run", None)
    runs: list[bool] = []
    if original_run is not None:
        def node_run(*args):
            runs.append(_inside_backward())
            return original_run(*args)
        monkeypatch.setattr(draft, "node_run", node_run)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    with al.Lens(names={"net": net, "x": x}) as lens:
        for _ in range(3):
            h = net[:2](x)
            h.register_hook(lambda g: g * 0.5)
            net[2](h).sum().backward()
    assert made_inside == []
    assert len(lens.passes) == 3 and len(lens.hook_calls) == 3
    assert runs and not any(runs)  # each node run made after the pass, from its row
    assert [float(p.leaf_grads["net.2.bias"]) for p in lens.passes] == [5.0, 10.0, 15.0]


def _programs(module_name: str, seeds) -> list:
    import importlib

    module = importlib.import_module(module_name)
    generator = module.Generator if hasattr(module, "Generator") else module.ModelGenerator
    return [(seed, module, generator(seed).generate()) for seed in seeds]


@pytest.mark.parametrize("module_name,seeds", [("programs", range(100, 160, 3)), ("model_programs", range(200, 212, 3))])
def test_models_made_later_equal_those_made_at_the_end_of_each_pass(module_name, seeds, monkeypatch):
    from test_perf_build import canonical

    compared = 0
    for seed, module, program in _programs(module_name, seeds):
        shown = {}
        torch.manual_seed(seed)
        module.run(program, "lens")  # first: a warning shown once per process (create_graph=True) is shown here
        for defer in (True, False):
            monkeypatch.setattr(deferred, "DEFER", defer)
            torch.manual_seed(seed)
            run = module.run(program, "lens")
            lens = run.lens
            if lens is None:
                shown[defer] = ("no lens", run.error)
                continue
            if defer:
                assert lens._count() == len(lens._pending) + len(lens._built)
            # (torch numbers each run's nodes anew: their sequence numbers, which the debug evidence holds, differ)
            shown[defer] = (canonical(lens.passes, drop=("sequence_nr", "debug")), list(lens.recording_notes),
                            [n.message for n in lens.notes])
        assert shown[True] == shown[False], seed
        compared += shown[True][0] != "no lens" and len(shown[True][0]) > 1
    assert compared >= len(seeds) // 2


def _live_things(root, limit=200_000) -> list:
    """Objects reachable from ``root`` through containers, dataclasses and plain objects that are live torch or
    user things: graph nodes, functions, frames, modules, hook handles."""
    found, seen, stack = [], set(), [root]
    while stack and len(seen) < limit:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(item))
        if isinstance(item, (torch.autograd.graph.Node, types.FunctionType, types.MethodType, types.FrameType,
                             nn.Module, weakref.ref)) or type(item).__name__.endswith("Backward0"):
            found.append(type(item).__name__)
            continue
        if isinstance(item, torch.Tensor):
            if item.grad_fn is not None or item.requires_grad:
                found.append("tensor in a graph")
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return found


class _Probe:
    pass


def test_what_waits_holds_nothing_live():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    net[0].register_full_backward_hook(lambda module, grad_in, grad_out: None)
    x = torch.randn(5, 3, requires_grad=True)
    big = torch.zeros(1000)
    keep = weakref.ref(big)

    def hook(g, big=big):  # a closure holding a user object
        return g * 2

    with al.Lens() as lens:  # names: the caller's variables, read during the pass only
        h = net[:2](x)
        h.register_hook(hook)
        h.retain_grad()
        loss = net[2:](h).pow(2).sum()
        loss.backward()
        probe = _Probe()  # kept by the graph's first node: gone when the graph is
        loss.grad_fn.metadata["probe"] = probe
        node = weakref.ref(probe)
        del probe
        hidden = weakref.ref(h)
    assert len(lens._pending) == 1 and lens._built == []
    assert _live_things(lens._pending) == []
    del loss, h, hook, big
    gc.collect()
    assert node() is None and hidden() is None and keep() is None  # gone before the passes are read
    assert "h" in {call.target for call in lens.passes[0].hook_calls} and "x" in lens.passes[0].leaf_grads


def test_a_model_that_cannot_be_made_is_a_note_and_one_warning_at_the_users_line(monkeypatch):
    original = draft.complete
    failures = [1]

    def complete(made, moving=None, index=None):
        if failures:
            failures.pop()
            raise ValueError("broken on purpose")
        return original(made, moving, index)

    monkeypatch.setattr(deferred, "complete", complete)
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        for _ in range(2):
            y = x * 3
            y.register_hook(lambda g: g * 2)
            y.backward()
    assert float(x.grad) == 12.0  # the user's values as without the lens
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        passes = lens.passes  # the line the warning must name
    line = sys._getframe().f_lineno - 1
    assert len(passes) == 1 and passes[0].index == 0
    assert [call.pass_index for call in lens.hook_calls] == [0] and float(passes[0].leaf_grads["x"]) == 12.0
    assert lens.recording_notes == ["could not record backward pass 1 (ValueError: broken on purpose)"]
    assert [(w.category, Path(w.filename).name, w.lineno) for w in caught] == [(RuntimeWarning, "test_deferred.py", line)]
    assert "could not record backward pass 1" in str(caught[0].message)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert len(lens.passes) == 1 and lens.hook_calls[0].target == "output"
    assert again == []


def test_the_memory_budget_counts_passes_not_yet_modelled():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    with al.Lens(names={"w": w}) as once:
        (w * 2).sum().backward()
    assert once._built == [] and len(once._pending) == 1
    one_pass = once.passes[0].kept_bytes
    assert one_pass > 0
    with al.Lens(names={"w": w}, memory_budget=int(one_pass * 2.5)) as lens:
        for _ in range(4):
            w.grad = None
            (w * 2).sum().backward()
        assert len(lens._pending) == 4  # none read yet
    kept = [p.kept_bytes for p in lens.passes]
    assert kept[:2] == [one_pass, one_pass] and all(k < one_pass for k in kept[2:])
