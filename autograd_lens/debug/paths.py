"""The gradient of a leaf as a sum over the paths from the root: the chain rule made visible.

:func:`compute` runs just before a pass, while the graph and its saved tensors
are alive (only with ``Lens(why=True)``).  It walks every path from each root to
each leaf and carries the root's gradient along it by calling each backward
function on the path directly (a vector-Jacobian product; calling a function
runs no hook).  The contributions of all paths to a leaf add up to what autograd
computes for it with no hook, up to float rounding: autograd adds where paths
meet, the paths are added at the end (``PathSet.total`` is that sum, not a copy
of ``.grad``).  For a graph of one-element tensors each step's
local derivative is computed on its own (the function applied to 1) and the
contribution is the product of them, times the root's gradient.

Custom ``autograd.Function`` backwards and saved tensors packed by a
saved-tensor hook are user code: a path through them is not followed, and the
leaves behind them get an "unknown" answer saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..model import Value
from .passthrough import recorded

NODE_LIMIT = 300  # graphs with more backward functions get no paths
CALL_LIMIT = 20000  # backward function calls per pass
SHOWN = 8  # paths shown per leaf; the others are summed into one "rest" entry


@dataclass(frozen=True)
class Path:
    """One path from a root to a leaf and the part of the leaf's gradient that travels along it.

    ``nodes`` are labels from the root's backward function to the leaf; ``factors``
    are the local derivatives along the path (graphs of one-element tensors only),
    after the gradient given to the root when it is not 1.
    The "rest" entry has ``nodes == ("rest",)`` and ``rest`` = how many paths it sums.
    """

    nodes: tuple[str, ...]
    contribution: Value
    factors: tuple[float, ...] = ()
    rest: int = 0
    # where it runs on the drawing: the root's ((sequence_nr, backward function), output), then one hop per arrow,
    # (user's key, what it uses: a function's key or a leaf's label, which use of it among the user's inputs)
    hops: tuple = field(default=(), compare=False)

    def text(self) -> str:
        from ..format import format_value

        value = format_value(self.contribution, 40) if self.contribution is not None else "unknown"
        if self.rest:
            return f"the other {self.rest} paths: {value}"
        route = " ← ".join(self.nodes)
        if self.factors:
            product = " × ".join(_number(factor) for factor in self.factors)
            return f"{route}: {product} = {value}"
        return f"{route}: {value}"


@dataclass(frozen=True)
class PathSet:
    """Every path's contribution to one leaf's gradient (``lens.paths_to(name)``)."""

    name: str
    paths: tuple[Path, ...] = ()
    total: Value = None  # the sum over all paths: autograd's gradient for this pass without hooks, up to float rounding
    count: int = 0  # how many paths there are
    unknown: str = ""  # why the paths are not known (then ``paths`` is empty)
    hooks: str = ""  # when the pass's hooks changed what the leaf received: what it received, said as a line
    seeded: bool = False  # the gradient given to a root is not 1: the first factor of each path is that gradient

    @property
    def known(self) -> bool:
        return not self.unknown

    def text(self) -> str:
        if self.unknown:
            return f"paths to {self.name}: unknown ({self.unknown})"
        lines = [f"{self.count} path{'s' if self.count != 1 else ''} to {self.name}:"]
        lines += [f"  {path.text()}" for path in self.paths]
        if self.hooks:
            lines.append(f"  {self.hooks}")
        return "\n".join(lines)


def _number(value: float) -> str:
    from ..format import format_number

    return format_number(value)


def compute(shape: Any, seeds: tuple, labels: dict[int, str], names: Any) -> tuple[dict[str, PathSet], str]:
    """``{leaf label: PathSet}`` for every leaf of the graph, or ({}, why not)."""
    if len(shape.nodes) > NODE_LIMIT:
        return {}, f"the graph has {len(shape.nodes)} backward functions; paths are followed up to {NODE_LIMIT}"
    if len(seeds) != len(shape.root_edges) or any(not isinstance(seed, torch.Tensor) for seed in seeds):
        return {}, "the gradient given to a root is not a tensor"
    steps = _steps(shape.root_edges, labels)  # known before any call (each residual block doubles them)
    if steps > CALL_LIMIT:
        return {}, f"the paths take up to {steps} backward-function calls, more than {CALL_LIMIT}: too many to follow"
    walker = _Walker(shape, labels, names)
    try:
        with torch.no_grad(), recorded("ignore"):  # the user saw each op's warnings once, in their own pass
            for (fn, output_nr), seed in zip(shape.root_edges, seeds):
                walker.start(fn, output_nr, seed.detach())
    except _TooMany:
        return {}, f"more than {CALL_LIMIT} steps along the paths: too many paths to follow"
    return walker.result(), ""


class _TooMany(Exception):
    pass


def _steps(root_edges: Any, labels: dict[int, str]) -> int:
    """How many backward-function calls the walk makes, at most: each function once per path from a root to it
    (counted over the functions in topological order), those refused (user code) not called nor walked past."""
    functions, order, stack = {}, [], [fn for fn, _ in root_edges]
    while stack:  # every function the walk could reach, and how many arrows enter each
        fn = stack.pop()
        if id(fn) in functions or id(fn) in labels:
            continue
        functions[id(fn)] = [fn, 0, bool(_refused(fn))]
        if not functions[id(fn)][2]:
            stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
    entering = dict.fromkeys(functions, 0)
    for fn, _, refused in functions.values():
        for next_fn, _ in () if refused else fn.next_functions:
            if next_fn is not None and id(next_fn) in entering:
                entering[id(next_fn)] += 1
    for fn, _ in root_edges:
        if id(fn) in functions:
            functions[id(fn)][1] += 1
    ready, total = [key for key, count in entering.items() if count == 0], 0
    while ready:
        fn, paths, refused = functions[ready.pop()]
        total += 0 if refused else paths
        for next_fn, _ in () if refused else fn.next_functions:
            if next_fn is not None and id(next_fn) in entering:
                functions[id(next_fn)][1] += paths
                entering[id(next_fn)] -= 1
                if not entering[id(next_fn)]:
                    ready.append(id(next_fn))
    return total


class _Walker:
    def __init__(self, shape: Any, labels: dict[int, str], names: Any) -> None:
        self.shape = shape
        self.labels = labels  # id(AccumulateGrad) -> leaf label
        self.names = names
        self.found: dict[int, list[tuple[tuple[str, ...], torch.Tensor, tuple | None]]] = {}
        self.unknown: dict[int, str] = {}
        self.calls = 0
        self.locals: dict[tuple[int, int], Any] = {}  # (id(fn), input slot) -> local derivative (scalars)
        self.seeded = False  # a root was given a one-element gradient other than 1 (the first factor of its paths)

    def start(self, fn: Any, output_nr: int, seed: torch.Tensor) -> None:
        scalar = seed.numel() == 1 and not seed.is_complex()  # (complex: conj's vjp is no product by its value at 1)
        # the gradient given to the root, written first among the factors when it is not 1 (backward(gradient=2.))
        given = (float(seed.reshape(-1)[0]),) if scalar and float(seed.reshape(-1)[0]) != 1.0 else ()
        self.seeded = self.seeded or bool(given)
        if id(fn) in self.labels:  # the root is a leaf itself
            factors = (given or (1.0,)) if scalar else None
            self.found.setdefault(id(fn), []).append(((self.labels[id(fn)],), seed, factors, ()))
            return
        stack = [(fn, output_nr, seed, (self._label(fn, output_nr),), () if scalar else None,
                  ((_key(fn), output_nr),))]
        while stack:
            fn, output_nr, grad, route, factors, hops = stack.pop()
            refused = _refused(fn)
            if refused:
                self._unknown_behind(fn, f"a path goes through {refused}, which runs user code")
                continue
            outs = self._call(fn, output_nr, grad)
            if outs is None:
                continue
            following = []
            targets = [id(next_fn) for next_fn, _ in fn.next_functions]
            for slot, (next_fn, next_nr) in enumerate(fn.next_functions):
                if next_fn is None or slot >= len(outs) or outs[slot] is None:
                    continue
                outs = outs[:slot] + (_fit(outs[slot], next_fn, next_nr),) + outs[slot + 1:]
                if targets.count(id(next_fn)) > 1:  # x * x: one path through each input
                    route = route[:-1] + (f"{route[-1].split(' [input ')[0]} [input {slot + 1}]",)
                step = factors
                if factors is not None and outs[slot].numel() == 1 and not outs[slot].is_complex():
                    step = factors + (self._local(fn, output_nr, slot, grad),)
                elif factors is not None:
                    step = None
                use = sum(1 for other, other_nr in fn.next_functions[:slot] if other is next_fn and other_nr == next_nr)
                if id(next_fn) in self.labels:
                    value = outs[slot]
                    if step is not None:
                        value = _product(seed, step, value)
                    hop = (_key(fn), self.labels[id(next_fn)], use)
                    shown = None if step is None else given + step
                    self.found.setdefault(id(next_fn), []).append((route + (self.labels[id(next_fn)],), value, shown,
                                                                   hops + (hop,)))
                else:
                    hop = (_key(fn), _key(next_fn) + (next_nr,), use)
                    following.append((next_fn, next_nr, outs[slot], route + (self._label(next_fn, next_nr),), step,
                                      hops + (hop,)))
            stack.extend(reversed(following))  # depth first, paths in next_functions order

    def _call(self, fn: Any, output_nr: int, grad: torch.Tensor) -> tuple | None:
        self.calls += 1
        if self.calls > CALL_LIMIT:
            raise _TooMany
        count = len(getattr(fn, "_input_metadata", ()) or ()) or 1
        grads = [None] * count
        grads[output_nr] = grad
        if _module_hook_wrapper(fn):  # its backward returns what it got; the module's hooks are the engine's to run
            return tuple(grads)
        try:
            outs = fn(*grads)
        except Exception as problem:
            self._unknown_behind(fn, f"{fn.name()} could not be run alone ({type(problem).__name__})")
            return None
        return outs if isinstance(outs, tuple) else (outs,)

    def _local(self, fn: Any, output_nr: int, slot: int, grad: torch.Tensor) -> float:
        key = (id(fn), output_nr, slot)
        if key not in self.locals:
            outs = self._call(fn, output_nr, torch.ones_like(grad))
            self.locals[key] = float(outs[slot].reshape(-1)[0]) if outs is not None and outs[slot] is not None else float("nan")
        return self.locals[key]

    def _label(self, fn: Any, output_nr: int) -> str:
        from ..capture.walk import op_label

        label = op_label(fn.name())
        named = self.names.outputs.get((id(fn), output_nr)) if self.names is not None else None
        return f"{named} ({label})" if named else label

    def _unknown_behind(self, fn: Any, reason: str) -> None:
        stack, seen = [fn], set()
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if id(current) in self.labels:
                self.unknown.setdefault(id(current), reason)
            stack.extend(n for n, _ in current.next_functions if n is not None)

    def result(self) -> dict[str, PathSet]:
        from ..capture.snapshot import snapshot

        sets: dict[str, PathSet] = {}
        for key, label in self.labels.items():
            if key in self.unknown:
                sets[label] = PathSet(label, unknown=self.unknown[key])
                continue
            found = self.found.get(key, [])
            if not found:
                sets[label] = PathSet(label, unknown="no path from the root reaches it")
                continue
            total = found[0][1].clone()
            for _, value, _, _ in found[1:]:
                total = total + value
            order = sorted(range(len(found)), key=lambda i: -float(found[i][1].abs().double().norm()))
            shown = [found[i] for i in sorted(order[:SHOWN])]
            paths = [Path(route, snapshot(value), tuple(factors or ()), hops=hops) for route, value, factors, hops in shown]
            rest = [found[i][1] for i in sorted(order[SHOWN:])]
            if rest:
                summed = rest[0].clone()
                for value in rest[1:]:
                    summed = summed + value
                paths.append(Path(("rest",), snapshot(summed), rest=len(rest)))
            sets[label] = PathSet(label, tuple(paths), snapshot(total), len(found), seeded=self.seeded)
        return sets


def _key(fn: Any) -> tuple[int, str]:
    return (fn._sequence_nr(), fn.name())


def _fit(grad: torch.Tensor, fn: Any, output_nr: int) -> torch.Tensor:
    """What the engine does to a gradient before handing it to ``fn``: summed down to the shape of the tensor it
    is for (a broadcast input), and cast to its dtype."""
    try:
        metadata = fn._input_metadata[output_nr]
        shape, dtype = tuple(metadata.shape), metadata.dtype
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return grad
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    return grad


def _module_hook_wrapper(fn: Any) -> bool:
    """``fn`` is the node of torch's ``BackwardHookFunction`` (full module backward hooks wrap a module's inputs and
    outputs in it): an identity whose ``backward`` returns its arguments (torch/nn/modules/_functions.py)."""
    try:
        from torch.nn.modules._functions import BackwardHookFunction
    except ImportError:  # (moved in another torch: its node is then run as any other Python backward is, or refused)
        return False
    return getattr(fn, "_forward_cls", None) is BackwardHookFunction


def _product(seed: torch.Tensor, factors: tuple, value: torch.Tensor) -> torch.Tensor:
    """seed × the local derivatives, in the dtype and shape autograd gave along the path."""
    result = seed.detach().to(value.dtype).reshape(value.shape).clone()
    for factor in factors:
        result = result * factor
    return result


def _refused(fn: Any) -> str:
    """Why calling ``fn`` alone would run user code ("" when it would not)."""
    from ..capture.saved import saved_tensors_packed

    name = fn.name()
    if isinstance(fn, torch.autograd.function.BackwardCFunction) and name != "BackwardHookFunctionBackward":
        return f"{name} (a custom autograd.Function's backward)"
    try:
        if saved_tensors_packed(fn):
            return f"{name} (its saved tensors were packed by a saved-tensor hook)"
    except Exception:
        return f"{name} (its saved tensors cannot be read)"
    return ""
