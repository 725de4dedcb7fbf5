"""Overhead of tracing a backward pass: plain vs inside a Lens, alternated in one process.

    python benchmarks/bench_tracer.py [--batch 256]

Model: 50 x (Linear(64, 64) + Tanh), batch 32 (about 251 autograd nodes).  Prints the median time of
plain and traced ``backward()`` and their ratio (target of issue #24: at most 4.0), the same with a tensor hook on
every Tanh output (one that returns None, one that halves the gradient), a teaching-size graph (how
many milliseconds the lens adds), and the floors any per-node observer pays: Python hooks that record
nothing, and hooks that only copy each gradient a node sends.  Inside ``backward()`` the lens reads what each pass's
model needs (it keeps nothing of torch's graph afterwards) and makes the model itself when the passes are first read
(capture/deferred.py): "traced" times ``backward()`` alone, "traced + model" times ``backward()`` and the first
``lens.passes`` together (the model made), alternated with the others in one process.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn

import autograd_lens as al


def build(depth: int = 50, width: int = 64, batch: int = 32):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers)
    x = torch.randn(batch, width)
    return model, x


def timed_backward(loss, lens=None, model=False):
    """Seconds spent in ``loss.backward()``, inside ``lens`` when one is given; with ``model``, the first read of
    ``lens.passes`` after it too (the pass's model made: what a user who looks at the pass waits for)."""
    if lens is None:
        start = time.perf_counter()
        loss.backward()
        return time.perf_counter() - start
    with lens:
        start = time.perf_counter()
        loss.backward()
        if model:
            lens.passes
        return time.perf_counter() - start


def one_pass(model, x, lens=None, made=False):
    """Seconds spent in ``loss.backward()`` (traced: what it reads for the pass's model, at the end of the pass, so
    that it keeps nothing of torch's graph afterwards); with ``made``, plus the first ``lens.passes`` (the model)."""
    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    return timed_backward(loss, lens, made)


def floor_pass(model, x):
    """The least any per-node observer can cost: a hook on every node that runs no Python at all
    (a C-level callable), plus an idle profile function, registered and removed around backward()."""
    import functools

    from autograd_lens.capture.structure import _reachable

    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    start = time.perf_counter()
    seen: dict = {}
    handles = [node.register_prehook(functools.partial(seen.__setitem__, id(node))) for node in _reachable([loss.grad_fn])]
    sys.setprofile(lambda frame, event, arg: None)
    try:
        loss.backward()
    finally:
        sys.setprofile(None)
        for handle in handles:
            handle.remove()
    return time.perf_counter() - start


def copy_floor_pass(model, x):
    """The least an observer that keeps what each node sent can cost: a Python post-hook on every node
    that clones each gradient it sent, and nothing else (no names, no graph, no hooks attributed)."""
    from autograd_lens.capture.structure import _reachable

    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    start = time.perf_counter()
    kept: list = []

    def keep(sent, received):
        kept.append([g.clone() for g in sent if g is not None])

    handles = [node.register_hook(keep) for node in _reachable([loss.grad_fn])]
    try:
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return time.perf_counter() - start


def profiler_pass(model, x):
    """torch.profiler around backward(): the anchor a practitioner would otherwise reach for."""
    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        loss.backward()
    return time.perf_counter() - start


def measure(rounds: int = 60, batch: int = 32) -> dict:
    """Medians (seconds) of plain, floor (no-op hooks), torch.profiler and traced backward(), alternated."""
    torch.set_num_threads(1)
    model, x = build(batch=batch)
    names = {"model": model, "x": x}
    for _ in range(5):  # warm-up: allocator, first walk
        one_pass(model, x)
        one_pass(model, x, al.Lens(names=names))
        profiler_pass(model, x)
    plain, traced, made, floor, copy_floor, profiled = [], [], [], [], [], []
    for _ in range(rounds):
        plain.append(one_pass(model, x))
        floor.append(floor_pass(model, x))
        copy_floor.append(copy_floor_pass(model, x))
        profiled.append(profiler_pass(model, x))
        lens = al.Lens(names=names)
        traced.append(one_pass(model, x, lens))
        made.append(one_pass(model, x, al.Lens(names=names), made=True))
    return {
        "nodes": len(lens.passes[0].graph.nodes),
        "ran": len(lens.passes[0].node_runs),
        "plain": statistics.median(plain),
        "floor": statistics.median(floor),
        "copy_floor": statistics.median(copy_floor),
        "profiler": statistics.median(profiled),
        "traced": statistics.median(traced),
        "traced_model": statistics.median(made),
        # what a loop of many passes feels: the mean, with the garbage collections medians leave out
        "plain_mean": statistics.fmean(plain),
        "traced_mean": statistics.fmean(traced),
        "traced_model_mean": statistics.fmean(made),
    }


HOOKS = {"returns None": lambda g: None, "halves the gradient": lambda g: g * 0.5}


def hooked_pass(model, x, hook, lens=None, made=False):
    """Like ``one_pass``, with ``hook`` registered on every Tanh output during the forward."""
    model.zero_grad(set_to_none=True)
    h = x
    for layer in model:
        h = layer(h)
        if isinstance(layer, nn.Tanh):
            h.register_hook(hook)
    loss = h.sum()
    return timed_backward(loss, lens, made)


def measure_hooked(rounds: int = 60, batch: int = 32) -> dict:
    """Medians (seconds) of plain and traced backward() (and traced + the model) with each of ``HOOKS`` on every
    Tanh output."""
    torch.set_num_threads(1)
    model, x = build(batch=batch)
    names = {"model": model, "x": x}
    found = {}
    for label, hook in HOOKS.items():
        for _ in range(5):
            hooked_pass(model, x, hook)
            hooked_pass(model, x, hook, al.Lens(names=names))
        plain, traced, made = [], [], []
        for _ in range(rounds):
            plain.append(hooked_pass(model, x, hook))
            lens = al.Lens(names=names)
            traced.append(hooked_pass(model, x, hook, lens))
            made.append(hooked_pass(model, x, hook, al.Lens(names=names), made=True))
        assert len(lens.hook_calls) == 50, len(lens.hook_calls)  # every hook call recorded
        found[label] = {"plain": statistics.median(plain), "traced": statistics.median(traced),
                        "traced_model": statistics.median(made)}
    return found


def teaching_model():
    """A graph a lesson draws: a 3-4-4-1 MLP on 4 samples with a squared-error loss (about 20 boxes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    return model, torch.randn(4, 3), torch.randn(4, 1)


def measure_teaching(rounds: int = 200) -> dict:
    """Medians (seconds) of plain and traced backward() (and traced + the model) on ``teaching_model``."""
    model, x, y = teaching_model()
    names = {"model": model, "x": x, "y": y}

    def one(lens=None, made=False):
        model.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        return timed_backward(loss, lens, made)

    for _ in range(10):
        one()
        one(al.Lens(names=names))
    plain, traced, made = [], [], []
    for _ in range(rounds):
        plain.append(one())
        lens = al.Lens(names=names)
        traced.append(one(lens))
        made.append(one(al.Lens(names=names), made=True))
    return {"nodes": len(lens.passes[0].graph.nodes), "plain": statistics.median(plain),
            "traced": statistics.median(traced), "traced_model": statistics.median(made)}


def measure_chain(nodes: int = 5001, rounds: int = 5) -> dict:
    """A chain ``h = h * 1.0001`` of ``nodes`` backward functions: medians (seconds) of plain and traced
    backward(), of building the pass's model (read inside the traced backward, made at the first ``lens.passes``:
    both halves) and of its steps (at display)."""
    from autograd_lens.capture import tracer
    from autograd_lens.views.steps import steps_for

    built: list = []
    original = tracer.Lens._build

    def timed_build(self, *args):
        start = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            built.append(time.perf_counter() - start)

    def chain():
        x = torch.tensor(1.0, requires_grad=True)
        h = x
        for _ in range(nodes - 1):
            h = h * 1.0001
        return h

    plain, traced, steps = [], [], []
    tracer.Lens._build = timed_build
    try:
        for _ in range(rounds):
            h = chain()
            start = time.perf_counter()
            h.backward()
            plain.append(time.perf_counter() - start)
            h = chain()
            with al.Lens() as lens:
                start = time.perf_counter()
                h.backward()
                traced.append(time.perf_counter() - start)
            start = time.perf_counter()
            lens.passes  # the model made from what the pass read
            built[-1] += time.perf_counter() - start
            start = time.perf_counter()
            steps_for(lens.passes[0])
            steps.append(time.perf_counter() - start)
    finally:
        tracer.Lens._build = original
    return {"nodes": len(lens.passes[0].node_runs) + 1, "plain": statistics.median(plain),
            "traced": statistics.median(traced), "build": statistics.median(built), "steps": statistics.median(steps)}


def main(rounds: int = 60, batch: int = 32) -> float:
    found = measure(rounds, batch)
    ratio = found["traced"] / found["plain"]
    print(f"graph: {found['nodes']} drawn nodes; {found['ran']} backward functions ran")
    print(f"plain backward   median {found['plain'] * 1e3:7.2f} ms")
    print(f"traced backward  median {found['traced'] * 1e3:7.2f} ms  (backward() alone; the model is made later)")
    print(f"traced + model   median {found['traced_model'] * 1e3:7.2f} ms  (backward() and the first lens.passes)")
    print(f"ratio traced/plain: {ratio:.2f}  (target <= 4.0, issue #24)")
    print(f"ratio traced + model/plain: {found['traced_model'] / found['plain']:.2f}  (target <= 6.0)")
    print(f"means, garbage collections included: plain {found['plain_mean'] * 1e3:.2f} ms, traced "
          f"{found['traced_mean'] * 1e3:.2f} ms, ratio {found['traced_mean'] / found['plain_mean']:.2f}")
    print(f"reference, hooks that record nothing: ratio {found['floor'] / found['plain']:.2f}")
    print(f"reference, hooks that only copy what each node sends: ratio {found['copy_floor'] / found['plain']:.2f}")
    print(f"reference, torch.profiler: ratio {found['profiler'] / found['plain']:.2f}")
    for label, times in measure_hooked(rounds, batch).items():
        print(f"a tensor hook on every Tanh output that {label}: traced/plain {times['traced'] / times['plain']:.2f}, "
              f"traced + model/plain {times['traced_model'] / times['plain']:.2f}")
    teaching = measure_teaching()
    print(f"teaching graph ({teaching['nodes']} boxes): plain {teaching['plain'] * 1e3:.2f} ms, traced "
          f"{teaching['traced'] * 1e3:.2f} ms: the lens adds {(teaching['traced'] - teaching['plain']) * 1e3:.2f} ms "
          f"({(teaching['traced_model'] - teaching['plain']) * 1e3:.2f} ms with the model made)")
    chain = measure_chain()
    print(f"a {chain['nodes']:,}-node chain: plain {chain['plain'] * 1e3:.0f} ms, traced {chain['traced'] * 1e3:.0f} ms, "
          f"of which the pass's model {chain['build'] * 1e3:.0f} ms; its steps {chain['steps'] * 1e3:.0f} ms "
          f"(model + steps target <= 300 ms)")
    return ratio


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32, the issue's setting)")
    parser.add_argument("--rounds", type=int, default=60)
    options = parser.parse_args()
    sys.exit(0 if main(options.rounds, options.batch) <= 2.0 else 1)
