"""Generated autograd programs, run four ways, and every statement the lens makes checked against torch.

A program is a list of source lines (so a failure prints as a runnable program, and shrinks by dropping lines).
It builds leaves, ops, hooks of every kind written every way, and one or more passes.  It runs:

* ``plain``: as written;
* ``lens``: inside ``autograd_lens.Lens``;
* ``truth``: as written, with every hook written in C wrapped so that it logs its call, and a post-hook of this
  file's own on every node before each pass (what each node received and sent);
* ``nohook``: with no hook registered (what "without hooks" must equal).

Hooks log what they received and passed on (``LOG``); the lens's statements are compared with those logs:
every hook call (which registered hook, kind, order, received, passed on, "call i of n"), every node run, every
``.grad`` after each pass, every value "without hooks" (or "unknown" with a reason), and, in the views, "call i of
n" titles, "already held" notes and the drawing's last ``.grad``.  ``plain`` and ``lens`` must see the same
values, logs and errors.

``python tests/programs.py --programs 20000 --seed 0`` runs a long campaign and prints each failure as a
minimal program.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import random
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint

PRELUDE = '''
def make_hook(tag, mode):
    def hook(g):
        LOG.append((tag, clone(g)))
        if mode == "raise":
            raise ValueError(tag)
        out = g * 0.5 if mode == "scale" else None
        if mode == "inplace":
            g.mul_(2.0)
        if mode == "keep":
            KEEP.append(g)
        if mode == "remove":  # removes other hooks in the middle of the pass
            for handle in REMOVE_TARGETS.get(tag, ()):
                REMOVE(handle)
        if mode == "add":  # registers a hook in the middle of the pass
            for target, new_hook in ADD_TARGETS.pop(tag, ()):  # once: the same function twice is two hooks
                target.register_hook(new_hook)
        LOG.append((tag + " out", clone(out if out is not None else g)))
        return out
    return hook

REMOVE_TARGETS = {}
ADD_TARGETS = {}

def REMOVE(handle):
    if handle is not None:  # None: the run without hooks registered nothing
        handle.remove()

class DoubleInPlace(torch.autograd.Function):  # its backward edits what it received, in place
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g.mul_(2)

def block(a):
    return (a * 2).sin()

def partial_hook(tag, mode, g):
    return make_hook(tag, mode)(g)

class Hooker:
    def __init__(self, tag, mode):
        self.f = make_hook(tag, mode)
    def method(self, g):
        return self.f(g)
    def __call__(self, g):
        return self.f(g)

def make_pre(tag, mode):
    def pre(grads):
        LOG.append((tag, clone(grads)))
        out = tuple(None if g is None else g * 0.5 for g in grads) if mode == "scale" else None
        LOG.append((tag + " out", clone(out if out is not None else grads)))
        return out
    return pre

def make_post(tag, mode):
    def post(grad_inputs, grad_outputs):
        LOG.append((tag, clone(grad_inputs)))
        out = tuple(None if g is None else g * 0.5 for g in grad_inputs) if mode == "scale" else None
        LOG.append((tag + " out", clone(out if out is not None else grad_inputs)))
        return out
    return post

def make_after(tag, mode):
    def after(p):
        LOG.append((tag, clone(p.grad)))
        if mode == "inplace":
            p.grad.mul_(0.5)
        LOG.append((tag + " out", clone(p.grad)))
    return after

def make_multi(tag, mode):
    def multi(grads):
        LOG.append((tag, clone(tuple(grads) if isinstance(grads, (list, tuple)) else grads)))
        first = grads[0] if isinstance(grads, (list, tuple)) else grads
        if mode == "inplace" and first is not None:
            first.mul_(0.5)
        LOG.append((tag + " out", clone(tuple(grads) if isinstance(grads, (list, tuple)) else grads)))
    return multi

def make_module_hook(tag, mode):
    def hook(module, grad_input, grad_output):
        LOG.append((tag, clone(grad_input)))
        out = tuple(None if g is None else g * 0.5 for g in grad_input) if mode == "scale" else None
        LOG.append((tag + " out", clone(out if out is not None else grad_input)))
        return out
    return hook

def make_module_pre(tag, mode):
    def hook(module, grad_output):
        LOG.append((tag, clone(grad_output)))
        out = tuple(None if g is None else g * 0.5 for g in grad_output) if mode == "scale" else None
        LOG.append((tag + " out", clone(out if out is not None else grad_output)))
        return out
    return hook

class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * 2

class Logged(torch.Tensor):  # a tensor subclass with a __torch_function__ of its own
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        TORCH_FUNCTION.append(getattr(func, "__name__", "?"))
        return super().__torch_function__(func, types, args, kwargs or {})

TORCH_FUNCTION = []

def wrapped(f):  # a decorator: the hook runs `inner`, is called f's name (by torch too)
    @functools.wraps(f)
    def inner(*args):
        return f(*args)
    return inner

def on_thread(make):  # an op run on a thread of its own: torch numbers the nodes of each thread from 0
    import threading
    made = []
    thread = threading.Thread(target=lambda: made.append(make()))
    thread.start()
    thread.join()
    return made[0]

def hidden(a, k, register):  # a tensor made in a function and never named (a forward's): hooks registered there
    h = a * k
    register(h)
    return h.sin()
'''


def clone(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(clone(item) for item in value)
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


# ----------------------------------------------------------------------------- generating


@dataclass
class Program:
    lines: list[str]
    leaves: list[str]  # names of the leaves and parameters whose .grad is compared
    seed: int = 0

    def source(self) -> str:
        return "\n".join(self.lines)


class Generator:
    """A random program: 1-3 leaves, 2-7 ops, 0-5 hooks, 1-3 passes; its leaves float32 (most programs), float64
    or complex64 (whose gradients torch defines by its own convention: the root is then ``abs()`` of a sum)."""

    def __init__(self, seed: int, dtype: str | None = None, more: bool = False) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        # kinds added in 2026-11 (helper-54): subclass tensors, hooks behind a functools.wraps decorator, hooks and
        # multi-grad hooks on tensors made in a function and never named, ops run on threads of their own (node
        # numbers shared across threads). Only with more=True (--more), from a stream
        # of their own: the programs of every seed without it stay the programs it always made
        self.more = random.Random(seed * 7919 + 67) if more else None
        # drawn apart, so that a float32 program of a seed is the program that seed always made
        self.dtype = dtype or random.Random(seed * 7919 + 17).choice(["float32"] * 8 + ["float64", "complex64"])
        self.between = random.Random(seed * 7919 + 29)  # edits of .grad between passes (drawn apart, likewise)
        self.forget = random.Random(seed * 7919 + 41)  # a tensor's name given to another between passes (likewise)
        self.extra = random.Random(seed * 7919 + 53)  # ops added later: in-place on a view, matmul, ... (likewise)
        self.lines: list[str] = []
        self.tensors: list[tuple[str, tuple[int, ...]]] = []  # (name, shape) of tensors that require grad
        self.leaves: list[str] = []
        self.hooks = 0
        self.handles: list[str] = []  # variables holding the handles of the hooks registered so far
        self.modules: list[str] = []
        # tensors given a hook written in C since the last pass: their names are not dropped before the next one (a C
        # hook that only looks, on a tensor that had no name in any pass since it was registered, cannot be seen:
        # the documented limit, docs/guarantees.md)
        self.fresh_c: set[str] = set()

    def new(self, expression: str, shape: tuple[int, ...]) -> str:
        name = f"t{len(self.tensors)}"
        self.lines.append(f"{name} = {expression}")
        self.tensors.append((name, shape))
        return name

    def generate(self) -> Program:
        rng = self.rng
        self.lines.append(f"torch.manual_seed({self.seed})")
        for index in range(rng.randint(1, 3)):
            shape = rng.choice([(), (2,), (3,), (2, 3)])
            name = f"x{index}"
            dtype = "" if self.dtype == "float32" else f", dtype=torch.{self.dtype}"
            self.lines.append(f"{name} = torch.randn({shape}{dtype}, requires_grad=True)")
            self.tensors.append((name, shape))
            self.leaves.append(name)
        if rng.random() < 0.25 and self.dtype == "float32":
            self.lines.append("lin = torch.nn.Linear(3, 3)")
            self.modules.append("lin")
            self.leaves += ["lin.weight", "lin.bias"]
        for _ in range(rng.randint(2, 7)):
            self.op()
            if rng.random() < 0.45:
                self.hook()
        root = self.root()
        self.passes(root)
        return Program(self.lines, self.leaves, self.seed)

    def extra_op(self, a: str, shape: tuple[int, ...]) -> bool:
        """One of the ops added after the first campaigns (drawn from their own stream): False when ``a`` does not
        fit the one drawn (the usual op is made then)."""
        extra = self.extra
        kind = extra.choice(["view_inplace", "matmul", "reduce", "clamp", "index", "where"])
        if kind == "view_inplace" and shape in ((3,), (2, 3)):  # CopySlices: the base's grad_fn changes
            fresh = self.new(f"{a} * 1.0", shape)
            b, other = self.pick(shape[1:] if len(shape) == 2 else ())
            part = "[0]" if other == shape[1:] else "[0]"
            self.lines.append(extra.choice([f"{fresh}{part}.mul_(2.0)", f"{fresh}{part}.add_({b})"
                                            if other == (shape[1:] if len(shape) == 2 else ()) else
                                            f"{fresh}{part}.mul_(-1.0)"]))
            return True
        if kind == "matmul" and shape == (2, 3):
            b, other = self.pick((2, 3))
            self.new(f"{a} @ {b}.t()", (2, 2))
            return True
        if kind == "reduce" and len(shape) == 2:
            dim = extra.choice([0, 1])
            op = extra.choice(["sum", "mean", "amax"])
            self.new(f"{a}.{op}(dim={dim}, keepdim=True)", (1, shape[1]) if dim == 0 else (shape[0], 1))
            return True
        if kind == "clamp":  # zero gradient where clipped
            self.new(f"{a}.clamp(-0.5, 0.5)", shape)
            return True
        if kind == "index" and shape in ((3,), (2, 3)):  # repeated indices: the gradients add up
            self.new(f"{a}[torch.tensor([0, 0, 1])]", (3,) + shape[1:])
            return True
        if kind == "where":
            b, other = self.pick(shape)
            if other != shape:
                return False
            self.new(f"torch.where({a} > 0, {a} * 2.0, {b})", shape)
            return True
        return False

    def more_op(self, a: str, shape: tuple[int, ...]) -> None:
        """One of the kinds only ``more=True`` makes (drawn from its own stream)."""
        more = self.more
        kind = more.choice(["subclass", "hidden", "hidden", "hidden_multi", "thread", "thread"])
        if kind == "subclass":
            self.new(f"({a} * 1.0).as_subclass(Logged)", shape)
            return
        if kind == "thread":
            self.new(f"on_thread(lambda: ({a} * {more.choice([2.0, -1.0])}).{more.choice(['sin', 'tanh'])}())", shape)
            return
        tag = f"h{self.hooks}"
        self.hooks += 1
        factor = more.choice([2.0, -0.5])
        if kind == "hidden":
            mode = more.choice(["observe", "scale", "inplace"])
            maker = more.choice([f"wrapped(make_hook({tag!r}, {mode!r}))", f"make_hook({tag!r}, {mode!r})",
                                 f"functools.partial(partial_hook, {tag!r}, {mode!r})",
                                 f"wrapped(functools.partial(partial_hook, {tag!r}, {mode!r}))",
                                 f"CHOOK({tag!r}, {more.choice(['neg', 'append'])!r})"])
            self.new(f"hidden({a}, {factor}, lambda h: REG(h, 'register_hook', {maker}))", shape)
            return
        others = [name for name, _ in self.tensors if name != a]
        named = more.choice(others) if others else a
        multi_mode = more.choice(["all", "any"])
        order = more.choice(["(h, {0})", "({0}, h)"]).format(named)
        maker = f"make_multi({tag!r}, {more.choice(['observe', 'inplace'])!r})"
        if more.random() < 0.3:
            maker = f"wrapped({maker})"
        self.new(f"hidden({a}, {factor}, lambda h: REG(None, 'multi', {order}, {maker}, {multi_mode!r}))", shape)

    def pick(self, shape: tuple[int, ...] | None = None) -> tuple[str, tuple[int, ...]]:
        choices = [t for t in self.tensors if shape is None or t[1] == shape]
        return self.rng.choice(choices or self.tensors)

    def op(self) -> None:
        rng = self.rng
        a, shape = self.pick()
        kind = rng.choice(["mul", "add", "sin", "exp", "pow", "mulc", "sub", "self", "double", "split", "inplace",
                           "linear", "view", "bcast", "checkpoint", "twice", "retain"])
        if self.extra.random() < 0.2 and self.extra_op(a, shape):
            return
        if self.more is not None and self.more.random() < 0.3:
            self.more_op(a, shape)
            return
        if kind in ("mul", "add", "sub"):
            b, other = self.pick()
            result = torch.broadcast_shapes(shape, other) if _broadcastable(shape, other) else None
            if result is None:
                b, other = a, shape
                result = shape
            sign = {"mul": "*", "add": "+", "sub": "-"}[kind]
            self.new(f"{a} {sign} {b}", tuple(result))
        elif kind == "sin":
            self.new(f"{a}.sin()", shape)
        elif kind == "exp":
            self.new(f"({a} * 0.5).exp()", shape)
        elif kind == "pow":
            self.new(f"{a} ** 2", shape)
        elif kind == "mulc":
            self.new(f"{a} * {rng.choice([2.0, -1.5, 0.5])}", shape)
        elif kind == "self":
            self.new(f"{a} * {a}", shape)
        elif kind == "double":
            function = "DoubleInPlace" if self.between.random() < 0.3 else "Double"  # drawn apart, likewise
            self.new(f"{function}.apply({a})", shape)
        elif kind == "split" and shape == (2, 3):
            name = f"t{len(self.tensors)}"
            self.lines.append(f"{name}, {name}b = {a}.split(2, dim=1)")
            self.tensors.append((name, (2, 2)))
            self.tensors.append((f"{name}b", (2, 1)))
        elif kind == "inplace" and not self.is_leaf(a):
            fresh = self.new(f"{a} * 1.0", shape)
            self.lines.append(f"{fresh}.add_(1.0)")
        elif kind == "linear" and self.modules and shape and shape[-1] == 3:
            self.new(f"lin({a})", shape)
        elif kind == "twice" and self.modules and shape and shape[-1] == 3:
            self.new(f"lin(lin({a}))", shape)
        elif kind == "checkpoint":
            reentrant = rng.choice([True, False])
            self.new(f"checkpoint(block, {a}, use_reentrant={reentrant})", shape)
        elif kind == "retain" and not self.is_leaf(a):
            self.lines.append(f"{a}.retain_grad()")
        elif kind == "view" and shape == (2, 3):
            self.new(f"{a}.view(3, 2)", (3, 2))
        elif kind == "bcast" and shape in ((), (3,)):
            self.new(f"{a}.expand(2, 3) * 1.0", (2, 3))
        else:
            self.new(f"{a}.tanh()", shape)

    def is_leaf(self, name: str) -> bool:
        return name in self.leaves

    def hook(self) -> None:
        rng = self.rng
        tag = f"h{self.hooks}"
        self.hooks += 1
        name, shape = self.pick()
        modes = ["observe", "observe", "scale", "inplace", "keep"] + (["raise"] if rng.random() < 0.15 else []) \
            + (["remove"] if self.handles and rng.random() < 0.3 else []) \
            + (["add"] if rng.random() < 0.2 else [])
        mode = rng.choice(modes)
        handle = f"{tag}_handle"
        kind = rng.choice(["tensor"] * 5 + ["c", "pre", "post", "after", "multi", "module", "module_pre"])
        if kind == "after" and not self.is_leaf(name):
            kind = "tensor"
        if kind in ("pre", "post") and self.is_leaf(name):
            kind = "tensor"
        if kind in ("module", "module_pre") and not self.modules:
            kind = "tensor"
        if mode in ("remove", "add") and kind != "tensor":
            mode = "observe"
        if kind == "tensor":
            style = rng.choice(["def", "lambda", "partial", "method", "object", "factory"])
            if mode == "raise" and style == "lambda":
                style = "def"
            maker = {
                "def": f"make_hook({tag!r}, {mode!r})",
                "factory": f"make_hook({tag!r}, {mode!r})",
                "lambda": f"(lambda g, _f=make_hook({tag!r}, {mode!r}): _f(g))",
                "partial": f"functools.partial(partial_hook, {tag!r}, {mode!r})",
                "method": f"Hooker({tag!r}, {mode!r}).method",
                "object": f"Hooker({tag!r}, {mode!r})",
            }[style]
            self.lines.append(f"{handle} = REG({name}, 'register_hook', {maker})")
        elif kind == "c":
            function = rng.choice(["neg", "append"])
            self.lines.append(f"{handle} = REG({name}, 'register_hook', CHOOK({tag!r}, {function!r}))")
            self.fresh_c.add(name)
        elif kind == "pre":
            maker = f"CHOOK({tag!r}, 'append')" if rng.random() < 0.3 else f"make_pre({tag!r}, {mode if mode != 'raise' else 'observe'!r})"
            self.lines.append(f"{handle} = REG({name}.grad_fn, 'register_prehook', {maker})")
        elif kind == "post":
            maker = f"CHOOK({tag!r}, 'append')" if rng.random() < 0.3 else f"make_post({tag!r}, {mode if mode != 'raise' else 'observe'!r})"
            self.lines.append(f"{handle} = REG({name}.grad_fn, 'register_hook', {maker})")
        elif kind == "after":
            maker = f"CHOOK({tag!r}, 'append')" if rng.random() < 0.3 else f"make_after({tag!r}, {'inplace' if mode in ('scale', 'inplace') else 'observe'!r})"
            self.lines.append(f"{handle} = REG({name}, 'register_post_accumulate_grad_hook', {maker})")
        elif kind == "multi":
            others = [t for t in self.tensors if t[0] != name]
            watched = [name] + ([rng.choice(others)[0]] if others and rng.random() < 0.4 else [])
            multi_mode = rng.choice(["all", "any"])
            self.lines.append(f"{handle} = REG(None, 'multi', ({', '.join(watched)},), make_multi({tag!r}, "
                              f"{'inplace' if mode == 'inplace' else 'observe'!r}), {multi_mode!r})")
        elif kind == "module":
            self.lines.append(f"{handle} = REG(lin, 'register_full_backward_hook', make_module_hook({tag!r}, "
                              f"{'scale' if mode == 'scale' else 'observe'!r}))")
        else:
            self.lines.append(f"{handle} = REG(lin, 'register_full_backward_pre_hook', make_module_pre({tag!r}, "
                              f"{'scale' if mode == 'scale' else 'observe'!r}))")
        if mode == "remove":  # a hook that removes an earlier one (or itself) when it runs
            self.lines.append(f"REMOVE_TARGETS[{tag!r}] = [{rng.choice(self.handles + [handle])}]")
        if mode == "add":  # a hook that registers another (Python or C) on a tensor when it runs
            others = [t for t, _ in self.tensors if not self.is_leaf(t)] or [t for t, _ in self.tensors]
            new_tag = f"{tag}a"
            new_mode = rng.choice(["observe", "scale", "inplace"])
            maker = f"CHOOK({new_tag!r}, {rng.choice(['neg', 'append'])!r})" if rng.random() < 0.4 \
                else f"make_hook({new_tag!r}, {new_mode!r})"
            self.lines.append(f"ADD_TARGETS[{tag!r}] = [({rng.choice(others)}, {maker})]")
        self.handles.append(handle)

    def root(self) -> str:
        names = [name for name, _ in self.tensors[-3:]]
        real = "" if self.dtype != "complex64" else ".abs()"  # backward() starts from a real number
        self.lines.append(f"out = ({' + '.join(f'{n}.sum()' for n in names)}){real}")
        return "out"

    def passes(self, root: str) -> None:
        rng = self.rng
        count = rng.choice([1, 1, 2, 3])
        for index in range(count):
            last = index == count - 1
            kind = rng.choice(["backward", "backward", "grad", "inputs", "gradient"])
            retain = "" if last else ", retain_graph=True"
            if kind == "grad":
                target = rng.choice(self.tensors)[0]
                self.lines.append(f"PASS('grad', {root}, [{target}]{retain})")
            elif kind == "inputs":
                target = rng.choice(self.leaves[: len([n for n in self.leaves if n.startswith('x')])] or self.leaves)
                self.lines.append(f"PASS('backward', {root}, inputs=[{target}]{retain})")
            elif kind == "gradient" and rng.random() < 0.3:
                self.lines.append(f"PASS('backward', {root}, create_graph=True{retain})")
            elif kind == "gradient":
                self.lines.append(f"PASS('backward', {root}, gradient=torch.tensor({rng.choice([2.0, -1.0])}){retain})")
            else:
                self.lines.append(f"PASS('backward', {root}{retain})")
            self.fresh_c.clear()
            if not last and rng.random() < 0.3:
                leaf = rng.choice(self.leaves)
                self.lines.append(f"{leaf}.grad = None")
            if not last and self.between.random() < 0.25:  # code of the user's that edits a .grad between passes
                leaf = self.between.choice(self.leaves)
                self.lines.append(self.between.choice([
                    f"if {leaf}.grad is not None: {leaf}.grad.mul_(0.5)",  # clip_grad_norm_ scales in place
                    f"if {leaf}.grad is not None: {leaf}.grad.zero_()",  # zero_grad(set_to_none=False)
                    f"{leaf}.grad = torch.full_like({leaf}, 0.25)",  # a .grad set by hand
                    f"if {leaf}.grad is not None: {leaf}.grad = {leaf}.grad * 2",  # replaced by a new tensor
                ]))
            if not last and rng.random() < 0.2:  # a hook registered between passes
                self.hook()
            if not last and self.handles and rng.random() < 0.15:  # one removed between passes
                self.lines.append(f"REMOVE({rng.choice(self.handles)})")
            unnamed = [name for name, _ in self.tensors if not self.is_leaf(name) and name not in self.fresh_c]
            if not last and unnamed and self.forget.random() < 0.2:  # its name now holds another tensor (a notebook
                name = self.forget.choice(unnamed)                   # reusing a name): the retained graph still has it
                self.lines.append(self.forget.choice([f"{name} = {name} * 1.0", f"{name} = {name}.detach()"]))


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


# ----------------------------------------------------------------------------- running


@dataclass
class Run:
    log: list = field(default_factory=list)  # what hooks logged
    passes: list = field(default_factory=list)  # per pass: {"grads": {name: value}, "error": str|None, "result": ...}
    nodes: list = field(default_factory=list)  # truth: per pass, [(name, received, sent)]
    before: list = field(default_factory=list)  # per pass: {name: .grad before the pass}
    error: str | None = None  # the program itself failed (outside a pass)
    lens: Any = None
    torch_function: list = field(default_factory=list)  # what the subclass's __torch_function__ was called for
    # truth: each generated hook's tag -> what the lens must show for its calls (``registered``): kind, name, and the
    # object it was registered on (whose names each pass reads: ``targets``)
    hooks: dict = field(default_factory=dict)
    targets: list = field(default_factory=list)  # truth: per pass, tag -> the names its tensor has as the pass starts


def _value_of(namespace: dict, name: str) -> Any:
    target: Any = namespace
    first, *rest = name.split(".")
    target = namespace.get(first)
    for part in rest:
        target = getattr(target, part)
    return target


# The lens's options in the "lens" runs of every campaign: AUTOGRAD_LENS_CAMPAIGN_WHY=1 also records the forward
# (Lens(why=True): a TorchFunctionMode sees every torch call the program makes, which must change nothing either)
LENS_OPTIONS = {"why": True} if os.environ.get("AUTOGRAD_LENS_CAMPAIGN_WHY") == "1" else {}


def run(program: Program, mode: str, prelude: str = "") -> Run:
    """``program`` run one way; ``prelude``: definitions of another generator's, run after ``PRELUDE``."""
    import autograd_lens as al

    result = Run()
    log: list = result.log
    namespace: dict = {"torch": torch, "functools": functools, "LOG": log, "clone": clone, "KEEP": [],
                       "checkpoint": torch.utils.checkpoint.checkpoint}

    def chook(tag: str, function: str) -> Any:
        seen: list = namespace.setdefault("SEEN", [])
        raw = torch.neg if function == "neg" else seen.append
        if mode != "truth":
            return raw

        def logged(*args):
            value = args[0] if len(args) == 1 else args
            log.append((tag, clone(value)))
            out = raw(*args)
            log.append((tag + " out", clone(out if out is not None else value)))
            return out
        logged.raw = raw  # what the other runs register (the lens names it)
        return logged

    def reg(target: Any, method: str, *args: Any) -> Any:
        if mode == "nohook":
            return None
        if mode == "truth":
            registered(result.hooks, target, method, args[1] if method == "multi" else args[-1])
        if method == "multi":
            tensors, fn, multi_mode = args
            return torch.autograd.graph.register_multi_grad_hook(tensors, fn, mode=multi_mode)
        return getattr(target, method)(*args)

    def do_pass(kind: str, root: Any, inputs: Any = None, gradient: Any = None, retain_graph: bool = False,
                create_graph: bool = False) -> None:
        names = program.leaves
        result.before.append({name: clone(_value_of(namespace, name).grad) for name in names})
        nodes: list = []
        written: dict = {}
        handles = []
        if mode == "truth":
            for target, new_hook in [pair for pairs in namespace.get("ADD_TARGETS", {}).values() for pair in pairs]:
                registered(result.hooks, target, "register_hook", new_hook)  # (a hook registers it during a pass)
            result.targets.append({tag: _names_of(namespace, hook["on"]) for tag, hook in result.hooks.items()
                                   if hook["on"] is not None})
            received: dict = {}  # what each node got, read before its backward runs (one may edit it in place)
            for name in names:  # .grad right after each write (aliased .grads change later)
                leaf = _value_of(namespace, name)
                if isinstance(leaf, torch.Tensor) and leaf.is_leaf and leaf.requires_grad:
                    handles.append(leaf.register_post_accumulate_grad_hook(
                        lambda p, name=name: written.__setitem__(name, clone(p.grad))))
            for fn in _nodes(root):
                if not getattr(getattr(fn, "_forward_cls", None), "__module__", "").startswith("torch."):
                    # (torch's own Functions run the module hooks inside their node: what they edit there is
                    # what reached the node, after its hooks, as for any node)
                    handles.append(fn.register_prehook(lambda go, fn=fn: received.__setitem__(id(fn), clone(go))))
                handles.append(fn.register_hook(
                    lambda gi, go, fn=fn: nodes.append((fn.name(), received.pop(id(fn), clone(go)), clone(gi),
                                                        _links(fn)))))
        error = None
        returned = raw = None
        try:
            if kind == "grad":
                raw = torch.autograd.grad(root, inputs, retain_graph=retain_graph, allow_unused=True,
                                          create_graph=create_graph)
                returned = clone(raw)
            else:
                root.backward(gradient=gradient, inputs=inputs, retain_graph=retain_graph, create_graph=create_graph)
        except (ValueError, RuntimeError) as problem:
            error = f"{type(problem).__name__}: {problem}"
        finally:
            for handle in handles:
                handle.remove()
        result.nodes.append(nodes)
        result.passes.append({"grads": {name: clone(_value_of(namespace, name).grad) for name in names},
                              "error": error, "result": returned, "written": written,
                              "inputs": [_name_of(namespace, t) for t in inputs] if kind == "grad" else None})
        return raw  # what autograd.grad returned (a program may go on with it: double backward)

    namespace.update(REG=reg, CHOOK=chook, PASS=do_pass)
    exec(compile(PRELUDE + prelude, "<prelude>", "exec"), namespace)
    source = compile(program.source(), "<program>", "exec")
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            if mode == "lens":
                with al.Lens(names=namespace, **LENS_OPTIONS) as lens:
                    exec(source, namespace)
                result.lens = lens
            else:
                exec(source, namespace)
    except Exception as problem:  # noqa: BLE001  (the program's own failure is compared, not judged)
        result.error = f"{type(problem).__name__}: {problem}"
    result.torch_function = list(namespace.get("TORCH_FUNCTION", ()))
    return result


def _nodes(root: torch.Tensor) -> list:
    seen: set[int] = set()
    order = []
    stack = [root.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        order.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return order


def _name_of(namespace: dict, tensor: Any) -> str | None:
    for name, value in namespace.items():
        if value is tensor:
            return name
    return None


# ----------------------------------------------------------------------------- comparing


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if not (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))) or len(a) != len(b):
            return False
        return all(equal(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _wrapper(a) + _wrapper(b):
        # a wrapper subclass (``__torch_dispatch__``, fresh_programs' TwoTensor): equal when its parts are
        return type(a) is type(b) and a.__tensor_flatten__()[0] == b.__tensor_flatten__()[0] and all(
            equal(getattr(a, part), getattr(b, part)) for part in a.__tensor_flatten__()[0])
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())
    return a == b


def _wrapper(value: torch.Tensor) -> bool:
    return type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__")


KINDS = {"register_prehook": "node_pre", "register_post_accumulate_grad_hook": "post_accumulate_grad",
         "multi": "multi_grad", "register_full_backward_hook": "module_full",
         "register_full_backward_pre_hook": "module_full_pre"}


def registered(hooks: dict, target: Any, method: str, function: Any, suffix: str = "") -> None:
    """The truth run's note of a generated hook as it is registered: under its tag (the one it logs its calls
    under, + ``suffix``), the kind and name of hook the lens must show for those calls, and the tensor it was
    registered on (tensor and post-accumulate hooks: the lens names the tensor).  A hook whose tag is not found is
    not noted."""
    from autograd_lens.capture.hooknames import function_name  # the lens's way to name a function (names differ
    # in style, not in what they name: this checks which hook a call is shown as, not how names are written)

    tag = _tag_of(function)
    if tag is None or tag + suffix in hooks:
        return
    tag += suffix
    kind = KINDS.get(method) or (method if method.startswith("global_") else
                                 "tensor" if isinstance(target, torch.Tensor) else "node")
    hooks[tag] = {"kind": kind, "name": function_name(getattr(function, "raw", function)),
                  "on": target if kind in ("tensor", "post_accumulate_grad") else None}


def _tag_of(function: Any) -> str | None:
    """The tag a generated hook logs its calls under: ``make_hook('h3', ...)``'s closure holds it, a
    ``functools.partial(partial_hook, 'h3', ...)`` binds it, a ``Hooker``, its method, a lambda's default or a
    ``wrapped`` function leads to one that does."""
    todo, seen = [function], set()
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        code = getattr(item, "__code__", None)
        if code is not None and "tag" in code.co_freevars and item.__closure__:
            tag = item.__closure__[code.co_freevars.index("tag")].cell_contents
            return tag if isinstance(tag, str) else None
        if isinstance(item, functools.partial):
            if item.args and isinstance(item.args[0], str):
                return item.args[0]
            todo.append(item.func)
            continue
        todo += [getattr(item, "__wrapped__", None), getattr(item, "__self__", None), getattr(item, "f", None)]
        todo += [value for value in (getattr(item, "__defaults__", None) or ()) if callable(value)]
    return None


def _names_of(namespace: dict, target: Any) -> frozenset:
    """The names ``target`` (that very object) has in the program's namespace."""
    return frozenset(name for name, value in namespace.items() if value is target and not name.startswith("_"))


def _truth_calls(log: list) -> list[tuple[str, Any, Any]]:
    """(tag, received, passed on) per hook call, in firing order; passed on is absent for a call that raised."""
    calls = []
    pending: dict[str, int] = {}
    for tag, value in log:
        if tag.endswith(" out"):
            calls[pending.pop(tag[:-4])][2] = value
        else:
            pending[tag] = len(calls)
            calls.append([tag, value, _MISSING])
    return [tuple(call) for call in calls]


_MISSING: Any = object()


def compare(program: Program, runner: Any = None) -> list[str]:
    """Every false statement of the lens on ``program`` (empty: none); ``runner(program, mode)`` runs it one way
    (``run`` here; ``model_programs.run`` for the programs over real layers)."""
    plain, lens_run, truth, nohook = ((runner or run)(program, mode) for mode in ("plain", "lens", "truth", "nohook"))
    problems: list[str] = []
    # 1. the lens changes nothing the program sees
    if plain.error != lens_run.error:
        problems.append(f"program error: plain {plain.error!r}, lens {lens_run.error!r}")
    if not equal([v for _, v in plain.log], [v for _, v in lens_run.log]) or [t for t, _ in plain.log] != [t for t, _ in lens_run.log]:
        problems.append("hooks received other values under the lens")
    if plain.torch_function != lens_run.torch_function:
        problems.append(f"a subclass's __torch_function__ ran {len(lens_run.torch_function)} times under the lens, "
                        f"{len(plain.torch_function)} without it")
    for index, (p, q) in enumerate(zip(plain.passes, lens_run.passes)):
        if p["error"] != q["error"] or not equal(list(p["grads"].values()), list(q["grads"].values())):
            problems.append(f"pass {index + 1}: .grad or error differs under the lens")
    if problems or lens_run.lens is None:
        return problems
    lens = lens_run.lens
    passes = lens.passes
    if len(passes) != len(lens_run.passes):
        return [f"{len(passes)} passes recorded, {len(lens_run.passes)} ran"]
    # 2. hook calls: the same calls, of the same hooks, in the same order, with the same values
    truth_calls = _truth_calls(truth.log)
    shown = [call for p in passes for call in p.hook_calls]
    unshown = [n for p in passes for n in p.notes if "may or may not have run" in n]
    if len(shown) != len(truth_calls) and unshown:
        return problems  # said: hooks in C may have run before an error no frame explains (not shown)
    if len(shown) != len(truth_calls):
        problems.append(f"{len(shown)} hook calls shown, {len(truth_calls)} ran: shown "
                        f"{[(c.hook, c.kind, c.target) for c in shown]}, ran {[c[0] for c in truth_calls]}")
        return problems
    shown, call_problems = _aligned(shown, truth_calls, (truth.hooks, truth.targets))
    problems += call_problems
    # 3. node runs
    for index, (p, truth_nodes) in enumerate(zip(passes, truth.nodes)):
        runs = [(run.name, run.grad_in, run.grad_out) for run in p.node_runs]
        truth_runs = [node for node in truth_nodes if node[0] != "torch::autograd::AccumulateGrad"]
        if [r[0] for r in runs] != [t[0] for t in truth_runs]:
            problems.append(f"pass {index + 1}: node order {[r[0] for r in runs]} shown, ran {[t[0] for t in truth_runs]}")
            continue
        for shown_run, true_run in zip(runs, truth_runs):
            if not equal(_plain(shown_run[1]), _plain(true_run[1])) or not equal(_plain(shown_run[2]), _plain(true_run[2])):
                problems.append(f"pass {index + 1}: {shown_run[0]} shown receiving {shown_run[1]} sending "
                                f"{shown_run[2]}; it received {true_run[1]} and sent {true_run[2]}")
    # 4. .grad after each pass, and without hooks
    for index, (p, real, unhooked) in enumerate(zip(passes, lens_run.passes, nohook.passes)):
        if p.kind == "grad":
            for position, name in enumerate(real["inputs"] or ()):
                if name is None or name not in p.grads_without_hooks:
                    continue
                shown_value = p.grads_without_hooks[name]
                expected = unhooked["result"][position] if unhooked["result"] is not None else None
                if shown_value is None and name in p.unknown:
                    continue
                if unhooked["error"] is None and not equal(_plain(shown_value), expected):
                    problems.append(f"pass {index + 1}: {name} without hooks {shown_value} shown, it is {expected}")
            continue
        for label, value in real["grads"].items():
            if label in p.leaf_grads and not equal(_plain(p.leaf_grads[label]), value):
                problems.append(f"pass {index + 1}: {label}.grad {p.leaf_grads[label]} shown, it is {value}")
            if label not in p.grads_without_hooks:
                continue
            shown_value = p.grads_without_hooks[label]
            if shown_value is None and label in p.unknown:
                continue
            if unhooked["error"] is not None or nohook.error is not None:
                continue
            expected = unhooked["grads"][label]
            if not equal(_plain(shown_value), expected):
                problems.append(f"pass {index + 1}: {label} without hooks {shown_value} shown, it is {expected} "
                                f"(no reason given)")
    # 5. views: "call i of n", "already held", the drawing's last .grad
    problems += _views(passes, truth_calls, lens_run, shown, truth.nodes, truth.passes)
    return problems


PLACE_UNKNOWN = "its place among their hooks is not known"


def _aligned(shown: list, truth_calls: list, hooks: tuple = ({}, [])) -> tuple[list, list[str]]:
    """The shown calls paired with the calls that ran, and what is false in that pairing. A call the lens says
    it cannot place (a hook in C on one of several autograd.grad inputs captured at once) may have run anywhere
    among the tensor and multi-grad hook calls of its pass: it is paired where the rest holds, if anywhere.
    ``hooks``: the truth run's ``(hooks, targets)``, what each call's hook must be shown as (``_call_problems``)."""
    problems = _call_problems(shown, truth_calls, hooks)
    for call in [c for c in shown if PLACE_UNKNOWN in (c.unseen or "")]:
        if not problems:
            break
        start = shown.index(call)
        rest = shown[:start] + shown[start + 1:]
        for position in range(len(shown)):
            moved = rest[:position] + [call] + rest[position:]
            low, high = min(position, start), max(position, start)
            if moved == shown or any(other.pass_index != call.pass_index or other.kind not in ("tensor", "multi_grad")
                                     for other in shown[low:high + 1]):
                continue
            found = _call_problems(moved, truth_calls, hooks)
            if not found:
                return moved, found
    return shown, problems


def _call_problems(shown: list, truth_calls: list, hooks: tuple = ({}, [])) -> list[str]:
    """What is false in the shown calls, paired in order with the calls that ran (``_truth_calls``): each must be
    shown as a call of the hook that ran there (the same registration for the same hook, and, where the truth run
    noted the hook, its kind, name and the tensor's name: two calls of different hooks shown swapped are false even
    when their values are equal), with its call number, what it received and what it passed on."""
    problems: list[str] = []
    by_tag: dict[str, int] = {}
    by_registration: dict[int, str] = {}
    counts: dict[str, int] = {}
    noted, targets = hooks
    for index, (call, (tag, received, passed)) in enumerate(zip(shown, truth_calls)):
        where = f"hook call {index + 1} ({tag}: {call.hook} {call.kind} on {call.target})"
        if by_tag.setdefault(tag, call.registration) != call.registration or \
                by_registration.setdefault(call.registration, tag) != tag:
            problems.append(f"{where}: shown as another registered hook's call")
        hook = noted.get(tag)
        named = targets[call.pass_index] if hook is not None and call.pass_index < len(targets) else {}
        names = named.get(tag) or frozenset()
        # a tensor has several true labels (another name, a module path, its op's name once a name holds another
        # tensor): false is, for a tensor with a name as the pass starts, the name of another hooked tensor that is
        # not one of its own
        elsewhere = bool(names) and call.target not in names and any(call.target in other for other in named.values())
        if hook is not None and (call.hook != hook["name"] or call.kind != hook["kind"] or elsewhere):
            problems.append(f"{where}: the hook that ran there is {hook['name']} ({hook['kind']}"
                            f"{' on ' + ' or '.join(sorted(names)) if names else ''})")
        counts[tag] = counts.get(tag, 0) + 1
        if call.invocation != counts[tag]:
            problems.append(f"{where}: call {call.invocation} shown, it was call {counts[tag]}")
        if call.unseen and call.grad_in is None:
            continue  # "not known", with why: a true statement
        if not equal(_plain(call.grad_in), _plain(received)):  # module hooks: grad_input; the others: what they got
            problems.append(f"{where}: received {call.grad_in!r} shown, it received {received!r}")
        if passed is _MISSING:
            if call.error is None:
                problems.append(f"{where}: it raised, not shown")
            continue
        if call.grad_out is not None and not equal(_plain(call.grad_out), _plain(passed)):
            problems.append(f"{where}: passed on {call.grad_out!r} shown, it passed on {passed!r}")
    return problems


def _plain(value: Any) -> Any:
    """A recorded value as a tensor (summaries are not compared: they are shown as summaries)."""
    from autograd_lens.model import TensorSummary

    if isinstance(value, TensorSummary):
        return _SKIP
    if isinstance(value, (tuple, list)):
        return tuple(_plain(item) for item in value)
    return value


class _Skip:
    def __eq__(self, other: Any) -> bool:
        return True


_SKIP = _Skip()


def _flat(value: Any) -> tuple[float, ...] | None:
    """A gradient as a predict question's answer holds it (one tensor of a tuple: the one that is not None)."""
    if isinstance(value, (tuple, list)):
        present = [item for item in value if item is not None]
        value = present[0] if len(present) == 1 else None
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(float(v) for v in value.detach().reshape(-1).tolist())


def _links(fn: Any) -> tuple:
    """Where each gradient a node sends goes: (the next node, its input), as torch's graph says (ids are read while
    the pass runs, so they name live nodes); None where nothing goes."""
    return tuple((id(next_fn), number) if next_fn is not None else None for next_fn, number in fn.next_functions)


def _question_problems(index: int, p: Any, step: Any, event: Any, truth_by_call: dict, truth_nodes: list,
                       truth_written: dict) -> list[str]:
    """A predict question's answer (and its second part) against what torch did."""
    from autograd_lens.model import GradWritten, HookCall, NodeRun
    from autograd_lens.views.operands import card_targets, input_keys

    question = step.question
    where = f"pass {index + 1}: question {question.prompt[:70]!r}"
    if isinstance(event, HookCall) and id(event) in truth_by_call:
        _, received, passed = truth_by_call[id(event)]
        if event.kind == "post_accumulate_grad":
            expected = [_flat(passed)]
        else:
            expected = [_flat(received), _flat(passed)]
        asked = [question.answer] + [part.answer for part in question.more]
        for got, want in zip(asked, expected):
            if want is not None and got != want:
                return [f"{where}: answer {got}, torch's {want}"]
        return []
    if isinstance(event, NodeRun):
        position = next((i for i, run in enumerate(p.node_runs) if run is event), None)
        true_runs = [node for node in truth_nodes if node[0] != "torch::autograd::AccumulateGrad"]
        if position is None or position >= len(true_runs) or true_runs[position][0] != event.name:
            return []
        sent = true_runs[position][2]
        if "before the hooks on this node change it" in question.prompt:
            return []  # what the backward computed before the node's hooks: what its first hook received (asked there)
        targets, keys = card_targets(event, p.graph), input_keys(event, p.graph)
        links = true_runs[position][3] if len(true_runs[position]) > 3 else ()  # (a runner may log no links)
        for slot, target in enumerate(targets):
            if f"What does {target} receive" not in question.prompt:
                continue
            if slot < len(links) and links[slot] is not None:  # the slots added up are those torch sends to one input
                added = sorted(other for other, key in enumerate(keys) if key == keys[slot] and other < len(links))
                same = sorted(other for other, link in enumerate(links) if link == links[slot])
                if added != same:
                    return [f"{where}: the answer adds what {event.name} sends from slots {added}; torch sends slots "
                            f"{same} to that input"]
            parts = [sent[other] for other, key in enumerate(keys) if key == keys[slot] and other < len(sent)
                     and sent[other] is not None]
            if not parts:
                return [f"{where}: torch sent {target} nothing"]
            total = parts[0]
            for part in parts[1:]:
                total = total + part
            if _flat(total) != question.answer:
                return [f"{where}: answer {question.answer}, torch's {_flat(total)}"]
            return []
        return [f"{where}: no input of {event.name} is named in it"]
    if isinstance(event, GradWritten):
        # .grad right after the write, as a post-accumulate hook of the checker's saw it (registered last: after the
        # user's own, so only where none of theirs ran on that leaf)
        later = [call for call in p.hook_calls if call.kind == "post_accumulate_grad" and call.target == event.name]
        written = truth_written.get(event.name)
        if not later and written is not None and _flat(written) != question.answer:
            return [f"{where}: answer {question.answer}, {event.name}.grad right after the write is {_flat(written)}"]
    return []


def _views(passes: list, truth_calls: list, lens_run: Run, shown_calls: list, truth_nodes: list,
           truth_passes: list) -> list[str]:
    import autograd_lens as al
    from autograd_lens.model import GradWritten
    from autograd_lens.views.steps import frame, hook_totals, steps_for

    problems = []
    totals_by_tag: dict[str, int] = {}
    for tag, _, _ in truth_calls:
        totals_by_tag[tag] = totals_by_tag.get(tag, 0) + 1
    totals = hook_totals(passes)
    tag_of = {id(call): tag for call, (tag, _, _) in zip(shown_calls, truth_calls)}
    truth_of = {id(call): truth for call, truth in zip(shown_calls, truth_calls)}
    for index, p in enumerate(passes):
        steps = steps_for(p, totals)
        for step_index, step in enumerate(steps):
            event = p.events[step_index - 1] if step_index > 0 and step_index - 1 < len(p.events) else None
            if step.kind == "hook" and event is not None and id(event) in tag_of:
                tag = tag_of[id(event)]
                expected = f"call {event.invocation} of {totals_by_tag[tag]} in this recording"
                if expected not in step.title:
                    problems.append(f"pass {index + 1}: card {step.title!r}, expected {expected!r}")
            if step.question is not None and event is not None:
                problems += _question_problems(index, p, step, event, truth_of, truth_nodes[index],
                                               truth_passes[index].get("written", {}) if index < len(truth_passes) else {})
            if "already held" in (step.note or "") and isinstance(event, GradWritten):
                before = lens_run.before[index]  # (a leaf the program has no name for, e.g. made inside a
                if event.name in before and before[event.name] is None:  # model's forward: not checked here)
                    problems.append(f"pass {index + 1}: card says {event.name}.grad already held a gradient; it was None")
        for call in p.hook_calls:  # every hook that ran on a tensor or a backward function has its badge there
            if call.kind in ("tensor", "node", "node_pre") and call.node is not None and id(call) in tag_of:
                badges = p.graph.node(call.node).hooks if call.node in {n.id for n in p.graph.nodes} else None
                if badges is not None and not any(badge.endswith(f"] {call.hook}") for badge in badges):
                    problems.append(f"pass {index + 1}: {call.kind} hook {call.hook} ran on {call.target} "
                                    f"({call.node}); its box has no badge for it: {badges}")
        if steps and not p.error:
            last = frame(steps, len(steps) - 1)
            for event in p.events:
                if isinstance(event, GradWritten) and event.by == "AccumulateGrad" and event.node in last.grads:
                    real = lens_run.passes[index]["grads"].get(event.name)
                    if real is not None and real.numel() <= 16 and not _wrapper(real) and last.grads[event.node] not in (
                            al.format_value(real, 48), "not known"):
                        problems.append(f"pass {index + 1}: drawing ends with {event.name}.grad "
                                        f"{last.grads[event.node]}, it is {al.format_value(real, 48)}")
    return problems


def shrink(program: Program, still_fails: Any) -> Program:
    """Drop lines while the program still fails (the first line, the seed, stays)."""
    lines = list(program.lines)
    changed = True
    while changed:
        changed = False
        for index in range(len(lines) - 1, 0, -1):
            candidate = Program(lines[:index] + lines[index + 1:], program.leaves, program.seed)
            try:
                if still_fails(candidate):
                    lines = candidate.lines
                    changed = True
            except Exception:  # noqa: BLE001  (a line others need: keep it)
                continue
    return Program(lines, program.leaves, program.seed)


def check(seed: int, dtype: str | None = None, more: bool = False) -> tuple[Program, list[str]]:
    program = Generator(seed, dtype, more).generate()
    return program, compare(program)


def report(program: Program, problems: list[str]) -> str:
    small = shrink(program, lambda candidate: bool(compare(candidate)))
    return (f"seed {program.seed}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            + "\nminimal program (tests/programs.py PRELUDE first):\n" + small.source()
            + "\n  -> " + "; ".join(compare(small)[:3]))


def campaign(parser: argparse.ArgumentParser, argv: list[str] | None, check_seed: Any, show: Any,
             classify: Any = None) -> int:
    """A campaign from the command line (``--programs N --seed S --show K`` and ``parser``'s own options):
    ``check_seed(seed, options)`` gives (program, problems), ``show(program, problems, options)`` the text printed
    in full for each of the first K programs with a false statement (the others: their first problem); with
    ``classify``, a count of the failures by ``classify(first problem)``.  Returns the exit status."""
    parser.add_argument("--programs", type=int, default=parser.get_default("programs") or 2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="failures printed in full (shrunk)")
    options = parser.parse_args(argv)
    failures = 0
    classes: dict[str, list[int]] = {}
    for seed in range(options.seed, options.seed + options.programs):
        try:
            program, problems = check_seed(seed, options)
        except Exception:  # noqa: BLE001
            print(f"seed {seed}: the checker failed\n{traceback.format_exc()}", flush=True)
            failures += 1
            continue
        if problems:
            failures += 1
            if classify is not None:
                classes.setdefault(classify(problems[0]), []).append(seed)
            if failures <= options.show:
                print(show(program, problems, options), "\n", flush=True)
            else:
                print(f"seed {seed}: {problems[0][:300]}", flush=True)
    for name, seeds in sorted(classes.items(), key=lambda item: -len(item[1])):
        print(f"{len(seeds):5d}  {name}  (seeds {seeds[:8]})")
    print(f"{options.programs} programs, {failures} with a false statement")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "float64", "complex64"],
                        help="every program's leaves of this dtype (default: float32 mostly, some float64, complex64)")
    parser.add_argument("--more", action="store_true", help="also the kinds added in 2026-11 (Generator(more=True))")
    return campaign(parser, argv, lambda seed, options: check(seed, options.dtype, options.more),
                    lambda program, problems, options: report(program, problems))


if __name__ == "__main__":
    sys.exit(main())
