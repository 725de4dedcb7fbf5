"""Generated autograd programs over code ``programs.py`` does not make, checked as it checks its own.

``programs.Generator``'s programs, with (from random streams of their own) custom ``autograd.Function``s of every
kind torch allows (``mark_non_differentiable``, ``set_materialize_grads(False)`` with an output never used,
``once_differentiable``, ``mark_dirty`` in place, a ``None`` gradient for an input that requires one,
``needs_input_grad``, saved outputs, an input returned as it is, ``setup_context``), leaves that are wrapper subclasses
(torch's ``TwoTensor``: a ``__torch_dispatch__``, no storage of its own), layers under
``torch.nn.utils.parametrize`` (a symmetric weight, ``weight_norm``, ``spectral_norm``'s power iteration in forward,
``parametrize.cached()``), double backward (``autograd.grad(create_graph=True)``, then a backward through the
gradient, hooks on the gradient), node hooks that register hooks in C or Python on a tensor during the pass
(``--late``), and passes run under a ``TorchDispatchMode`` that logs every op (the lens's own ops must not reach it).  Each program
runs plain, under the lens, as truth and without hooks, and every statement the lens makes is compared
(``programs.compare``).

``python tests/fresh_programs.py --programs 500 --seed 0`` runs a campaign.
"""

from __future__ import annotations

import argparse
import random
import re
import sys

import programs
from programs import Program

PRELUDE = '''
import torch.nn.utils.parametrize as parametrize
from torch.utils._python_dispatch import TorchDispatchMode
from torch.testing._internal.two_tensor import TwoTensor

class NonDiff(torch.autograd.Function):  # a second output marked non-differentiable
    @staticmethod
    def forward(ctx, x):
        mask = (x.real > 0).to(x.dtype)
        ctx.mark_non_differentiable(mask)
        return x * 2, mask
    @staticmethod
    def backward(ctx, g, g_mask):
        return g * 2

class Lazy(torch.autograd.Function):  # an output never used: its gradient reaches backward as None
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3
    @staticmethod
    def backward(ctx, g1, g2):
        out = None
        if g1 is not None:
            out = g1 * 2
        if g2 is not None:
            out = g2 * 3 if out is None else out + g2 * 3
        return out

class OnceSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos()

class Dirty(torch.autograd.Function):  # in place, marked dirty
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x
    @staticmethod
    def backward(ctx, g):
        return g * 2

class NoneFor(torch.autograd.Function):  # no gradient for its second input, which requires one
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(y)
        return x * y
    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * y, None

class Needs(torch.autograd.Function):  # what it returns follows ctx.needs_input_grad
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y + x
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * (y + 1) if ctx.needs_input_grad[0] else None
        gy = g * x if ctx.needs_input_grad[1] else None
        return gx, gy

class ExpOut(torch.autograd.Function):  # saves its output
    @staticmethod
    def forward(ctx, x):
        y = (x * 0.5).exp()
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * y * 0.5

class Ident(torch.autograd.Function):  # returns its input as it is
    @staticmethod
    def forward(ctx, x):
        return x
    @staticmethod
    def backward(ctx, g):
        return g * 3

class Cube(torch.autograd.Function):  # forward without ctx, setup_context apart
    @staticmethod
    def forward(x):
        return x ** 3
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3 * x ** 2

class Sym(torch.nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)

def CACHED(f):
    with parametrize.cached():
        return f()

class OpLog(TorchDispatchMode):  # every op that reaches dispatch while a pass runs, compared plain vs lens
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        TORCH_FUNCTION.append(str(func))
        return func(*args, **(kwargs or {}))

def OPLOG_PASS(*args, **kwargs):
    with OpLog():
        return PASS(*args, **kwargs)

def registering(tag, target, hook):  # a node hook that registers ``hook`` on ``target`` the first time it runs
    todo = [hook]
    def node_hook(*grads):
        LOG.append((tag, clone(grads[0])))
        while todo:
            target.register_hook(todo.pop())
        LOG.append((tag + " out", clone(grads[0])))
    return node_hook

def DSQ(g, fallback):  # a loss made of a gradient (double backward); the first loss where it has no graph
    return (g * g).sum() if g is not None and g.requires_grad else fallback
'''

PARAMETRIZED = {
    "sym": ("parametrize.register_parametrization(torch.nn.Linear(3, 3), 'weight', Sym())",
            [("plin.parametrizations.weight.original", (3, 3)), ("plin.bias", (3,))]),
    "weight_norm": ("torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(3, 3))",
                    [("plin.parametrizations.weight.original0", (3, 1)),
                     ("plin.parametrizations.weight.original1", (3, 3)), ("plin.bias", (3,))]),
    "spectral_norm": ("torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(3, 3))",
                      [("plin.parametrizations.weight.original", (3, 3)), ("plin.bias", (3,))]),
}


class FreshGenerator(programs.Generator):
    """``programs.Generator``'s program with the kinds above mixed in (float32 mostly, some float64)."""

    def __init__(self, seed: int, dtype: str | None = None, more: bool = False, late: bool = False) -> None:
        dtype = dtype or random.Random(seed * 7919 + 83).choice(["float32"] * 5 + ["float64"])
        super().__init__(seed, dtype, more)
        self.fresh = random.Random(seed * 7919 + 97)
        self.wrapper = random.Random(seed * 7919 + 101)
        # node hooks that register hooks during the pass: only with late=True (--late), so that every seed without it
        # makes the program it always made
        self.registers = random.Random(seed * 7919 + 103) if late else None
        self.plin = False

    def generate(self) -> Program:
        rng, fresh = self.rng, self.fresh
        self.lines.append(f"torch.manual_seed({self.seed})")
        for index in range(rng.randint(1, 3)):
            shape = rng.choice([(), (2,), (3,), (2, 3)])
            name = f"x{index}"
            dtype = "" if self.dtype == "float32" else f", dtype=torch.{self.dtype}"
            self.lines.append(f"{name} = torch.randn({shape}{dtype}, requires_grad=True)")
            self.tensors.append((name, shape))
            self.leaves.append(name)
        if self.wrapper.random() < 0.2:  # a leaf that is a wrapper subclass (__torch_dispatch__, no storage of its own)
            leaf = self.wrapper.choice(self.leaves)
            self.lines.append(f"{leaf} = TwoTensor({leaf}.detach(), ({leaf} * 2).detach()).requires_grad_()")
        if rng.random() < 0.25 and self.dtype == "float32":
            self.lines.append("lin = torch.nn.Linear(3, 3)")
            self.modules.append("lin")
            self.leaves += ["lin.weight", "lin.bias"]
        if fresh.random() < 0.4 and self.dtype == "float32":
            made, params = PARAMETRIZED[fresh.choice(sorted(PARAMETRIZED))]
            self.lines.append(f"plin = {made}")
            self.plin = True
            for name, shape in params:
                self.leaves.append(name)
                self.tensors.append((name, shape))
            if fresh.random() < 0.3:
                tag = f"h{self.hooks}"
                self.hooks += 1
                hook = fresh.choice([f"make_module_hook({tag!r}, 'scale')", f"make_module_hook({tag!r}, 'observe')"])
                self.lines.append(f"{tag}_handle = REG(plin, 'register_full_backward_hook', {hook})")
                self.handles.append(f"{tag}_handle")
        for _ in range(rng.randint(2, 7)):
            self.op()
            if rng.random() < 0.45:
                self.hook()
        root = self.root()
        self.passes(root)
        return Program(self.lines, self.leaves, self.seed)

    def op(self) -> None:
        if self.fresh.random() < 0.45 and self.fresh_op():
            return
        super().op()
        if self.registers is not None and self.registers.random() < 0.15:
            self.node_registers()

    def node_registers(self) -> None:
        """A node pre- or post-hook (of the node that made a tensor, or of a leaf's AccumulateGrad) that registers a
        hook, in C or Python, on that tensor or another the first time it runs (drawn from a stream of its own)."""
        draw = self.registers
        a, _ = draw.choice(self.tensors)
        target = draw.choice([a, a, draw.choice(self.tensors)[0]])
        node = f"torch.autograd.graph.get_gradient_edge({a}).node" if self.is_leaf(a) else f"{a}.grad_fn"
        tag = f"h{self.hooks}"
        self.hooks += 1
        hook = draw.choice([f"CHOOK({tag + 'a'!r}, {draw.choice(['neg', 'append'])!r})",
                            f"make_hook({tag + 'a'!r}, {draw.choice(['observe', 'scale'])!r})"])
        method = draw.choice(["register_prehook", "register_hook"])
        self.lines.append(f"{tag}_handle = REG({node}, {method!r}, registering({tag!r}, {target}, {hook}))")
        self.handles.append(f"{tag}_handle")

    def fresh_op(self) -> bool:
        """One of this generator's kinds; False when the tensor drawn does not fit it."""
        fresh = self.fresh
        a, shape = self.pick()
        kind = fresh.choice(["nondiff", "lazy", "once", "dirty", "nonefor", "needs", "expout", "ident", "cube",
                             "plin", "plin", "cached"])
        if kind == "nondiff":
            name = f"t{len(self.tensors)}"
            self.lines.append(f"{name}, {name}m = NonDiff.apply({a})")
            self.tensors.append((name, shape))
            if fresh.random() < 0.5:
                self.new(f"{name} * {name}m + {name}", shape)
            return True
        if kind == "lazy":
            name = f"t{len(self.tensors)}"
            self.lines.append(f"{name}, {name}b = Lazy.apply({a})")
            self.tensors.append((name, shape))
            self.tensors.append((f"{name}b", shape))
            return True
        if kind in ("nonefor", "needs"):
            b, other = self.pick(shape)
            if other != shape:
                return False
            self.new(f"{'NoneFor' if kind == 'nonefor' else 'Needs'}.apply({a}, {b})", shape)
            return True
        if kind == "dirty":
            if self.is_leaf(a):
                return False
            fresh_name = self.new(f"{a} * 1.0", shape)
            if fresh.random() < 0.5:  # a hook on the old version: it sees the gradient before the in-place op
                tag = f"h{self.hooks}"
                self.hooks += 1
                self.lines.append(f"{tag}_handle = REG({fresh_name}, 'register_hook', "
                                  f"make_hook({tag!r}, {fresh.choice(['observe', 'scale', 'inplace'])!r}))")
                self.handles.append(f"{tag}_handle")
            self.new(f"Dirty.apply({fresh_name})", shape)
            return True
        if kind in ("once", "expout", "ident", "cube"):
            self.new(f"{ {'once': 'OnceSin', 'expout': 'ExpOut', 'ident': 'Ident', 'cube': 'Cube'}[kind]}.apply({a})",
                     shape)
            return True
        if not self.plin or not shape or shape[-1] != 3 or self.dtype != "float32":
            return False
        if kind == "plin":
            self.new(f"plin({a})", shape)
        else:
            self.new(f"CACHED(lambda: plin(plin({a})))", shape)
        return True

    def passes(self, root: str) -> None:
        fresh = self.fresh
        start = len(self.lines)
        if fresh.random() < 0.35:  # double backward first: a gradient with a graph, a loss of it, its backward
            target = fresh.choice(self.tensors)[0]
            name = f"d{len(self.lines)}"
            self.lines.append(f"{name} = PASS('grad', {root}, [{target}], create_graph=True, retain_graph=True)[0]")
            if fresh.random() < 0.5:
                tag = f"h{self.hooks}"
                self.hooks += 1
                self.lines.append(f"{tag}_handle = REG({name}, 'register_hook', "
                                  f"make_hook({tag!r}, {fresh.choice(['observe', 'scale', 'inplace'])!r})) "
                                  f"if {name} is not None and {name}.requires_grad else None")
                self.handles.append(f"{tag}_handle")
            self.lines.append(f"PASS('backward', DSQ({name}, {root}), retain_graph=True)")
        super().passes(root)
        for index in range(start, len(self.lines)):  # some passes under a dispatch mode that logs every op
            if self.lines[index].startswith("PASS(") and fresh.random() < 0.2:
                self.lines[index] = "OPLOG_" + self.lines[index]


def run(program: Program, mode: str) -> programs.Run:
    return programs.run(program, mode, PRELUDE)


def compare(program: Program) -> list[str]:
    """``programs.compare``; where values without hooks alone differ and a module has full backward (pre-)hooks, the
    run without hooks again with those hooks registered as hooks that do nothing: a module's full hooks add nodes
    (BackwardHookFunctionBackward), so torch without them may add a leaf's gradients in another order, and the
    last bits differ (a documented limit, docs/guarantees.md: spectral_norm / weight_norm on a hooked layer that
    is applied to its own weight). The lens's values must equal that run's exactly."""
    problems = programs.compare(program, run)
    if not problems or not all(" without hooks " in problem for problem in problems) \
            or not any(MODULE_HOOK.search(line) for line in program.lines):
        return problems

    def same_nodes(candidate: Program, mode: str) -> programs.Run:
        if mode == "nohook":
            candidate = Program([MODULE_HOOK.sub(lambda m: f"{m[1]}.{m[2]}({NOTHING[m[2]]})", line)
                                 for line in candidate.lines], candidate.leaves, candidate.seed)
        return run(candidate, mode)

    return programs.compare(program, same_nodes) and problems


MODULE_HOOK = re.compile(r"REG\((\w+), '(register_full_backward_hook|register_full_backward_pre_hook)', .*\)$")
NOTHING = {"register_full_backward_hook": "lambda module, grad_input, grad_output: None",
           "register_full_backward_pre_hook": "lambda module, grad_output: None"}


def check(seed: int, late: bool = False) -> tuple[Program, list[str]]:
    program = FreshGenerator(seed, late=late).generate()
    return program, compare(program)


def report(program: Program, problems: list[str]) -> str:
    small = programs.shrink(program, lambda candidate: bool(compare(candidate)))
    return (f"seed {program.seed}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            + "\nminimal program (programs.PRELUDE and fresh_programs.PRELUDE first):\n" + small.source()
            + "\n  -> " + "; ".join(compare(small)[:3]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.set_defaults(programs=500)
    parser.add_argument("--late", action="store_true", help="also node hooks that register hooks during the pass")
    return programs.campaign(parser, argv, lambda seed, options: check(seed, options.late),
                             lambda program, problems, options: report(program, problems))


if __name__ == "__main__":
    sys.exit(main())
