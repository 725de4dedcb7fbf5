"""Generated training programs over real ``torch.nn`` layers, every statement the lens makes checked against torch.

The twin of ``programs.py`` (whose comparison this reuses): a program builds a small real model (an MLP, a
Conv1d/Conv2d + BatchNorm net, or a token model: Embedding, LayerNorm, MultiheadAttention,
TransformerEncoderLayer, a GPT-style block with residuals, LSTM/GRU, Linear layers called twice, weight tying),
hooks it every way (module full backward hooks and pre-hooks, global module hooks, parameter hooks,
post-accumulate hooks, hooks on activations registered by forward hooks or by hand, multi-grad hooks, node pre- and
post-hooks; written as def, lambda, partial, bound method, callable object, factory closure per layer or C function;
observing, scaling, clipping, editing in place, keeping references, raising; post-accumulate hooks that step
their leaf and clear ``.grad``, the optimizer step fused into backward) and trains it a few steps (SGD/Adam,
``zero_grad`` both ways or not at all, two micro-batches, ``clip_grad_norm_`` (``CLIP``), checkpointing both ways,
``retain_graph``, ``autograd.grad`` of parameters).  The training loop is unrolled, so a failure shrinks by lines.

It runs plain, under the lens, as "truth" (every hook wrapped so its log names the registration it belongs to, an
observer post-hook on every node) and as "nohook".  "nohook" here is what the lens promises for "without hooks":
before each pass every hook is switched off and the pass's gradient is computed on the same graph with the leaves as
they are now (``.grad`` set aside and restored), then added to what ``.grad`` would hold without hooks before the pass
(carried from the last pass while the program left ``.grad`` alone, ``None`` or zeros after ``zero_grad``, and
"must be unknown" after other code changed it).  After an optimizer step used hook-changed gradients that is not a
run that never had the hooks, and the lens says so; ``--cross-check`` compares it with a run that never registered
them where no step moved a leaf.

``python tests/model_programs.py --programs 2000 --seed 0`` runs a campaign and prints each failure as a minimal
program (this file's ``PRELUDE`` and ``programs.PRELUDE``'s helpers come first).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import random
import re
import sys
import warnings
import zlib
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.module as module_globals
import torch.utils.checkpoint

import programs
from programs import Program, Run, clone

PRELUDE = '''
def make_hook(tag, mode):
    def hook(g):
        LOGIN(tag, g)
        if mode == "raise":
            raise ValueError(tag)
        out = g * 0.5 if mode == "scale" else g.clamp(-0.01, 0.01) if mode == "clip" else None
        if mode == "inplace":
            g.mul_(2.0)
        if mode == "keep":
            KEEP.append(g)
        LOGOUT(tag, out if out is not None else g)
        return out
    return hook

def partial_hook(tag, mode, g):
    return make_hook(tag, mode)(g)

class Hooker:
    def __init__(self, tag, mode):
        self.f = make_hook(tag, mode)
    def method(self, g):
        return self.f(g)
    def __call__(self, g):
        return self.f(g)

def _each(grads, mode):
    if mode == "inplace":
        for g in grads:
            if g is not None:
                g.mul_(0.5)
    if mode == "scale":
        return tuple(None if g is None else g * 0.5 for g in grads)
    if mode == "clip":
        return tuple(None if g is None else g.clamp(-0.01, 0.01) for g in grads)
    return None

def make_module_hook(tag, mode):
    def module_hook(module, grad_input, grad_output):
        LOGIN(tag, grad_input)
        if mode == "raise":
            raise ValueError(tag)
        out = _each(grad_input, mode)
        LOGOUT(tag, out if out is not None else grad_input)
        return out
    return module_hook

def make_module_pre(tag, mode):
    def module_pre(module, grad_output):
        LOGIN(tag, grad_output)
        out = _each(grad_output, mode)
        LOGOUT(tag, out if out is not None else grad_output)
        return out
    return module_pre

def make_node_hook(tag, mode, pre):
    def node_hook(*args):
        LOGIN(tag, args[0])
        out = _each(args[0], mode)
        LOGOUT(tag, out if out is not None else args[0])
        return out
    return node_hook

def make_after(tag, mode):
    def after(p):
        LOGIN(tag, p.grad)
        if mode == "inplace":
            p.grad.mul_(0.5)
        if mode == "clip":
            p.grad.clamp_(-0.01, 0.01)
        if mode == "step":  # the optimizer step fused into backward: the leaf changes, its .grad is set to None
            with torch.no_grad():
                p.sub_(0.1 * p.grad)
        if mode in ("step", "clear"):
            p.grad = None
        LOGOUT(tag, p.grad)
    return after

def make_multi(tag, mode):
    def multi(grads):
        LOGIN(tag, tuple(grads) if isinstance(grads, (list, tuple)) else grads)
        first = grads[0] if isinstance(grads, (list, tuple)) else grads
        if mode == "inplace" and first is not None:
            first.mul_(0.5)
        LOGOUT(tag, tuple(grads) if isinstance(grads, (list, tuple)) else grads)
    return multi

def grad_catcher(tag, mode, in_c=False):
    def forward_hook(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        if out.requires_grad:
            REG(out, "register_hook", CHOOK(tag, mode) if in_c else make_hook(tag, mode))
    return forward_hook

class Block(nn.Module):
    def __init__(self, d, flash):
        super().__init__()
        self.flash = flash
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, 2, D // 2).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(D, dim=2))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // 2))
            att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf")).softmax(-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))
'''

MODES = ["observe", "observe", "scale", "clip", "inplace", "keep"]
MODULE_MODES = ["observe", "observe", "scale", "clip", "inplace"]


# ----------------------------------------------------------------------------- generating


def _py(path: str) -> str:
    """A module or parameter path as Python (``net.2.weight`` -> ``net[2].weight``)."""
    return re.sub(r"\.(\d+)", r"[\1]", path)


class ModelGenerator:
    """A random small model, hooks on it, and 1-3 unrolled training steps."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.lines: list[str] = [f"torch.manual_seed({seed})"]
        if random.Random(seed * 7919 + 17).random() < 0.15:  # drawn apart: the other programs of a seed unchanged
            self.lines.append("torch.set_default_dtype(torch.float64)")  # a model in double precision (gradcheck's)
        self.modules: list[str] = []  # every module path (submodules included), for module hooks
        self.params: list[str] = []  # every parameter path, first name of a tied one only
        self.tops: list[str] = []  # top-level modules, in definition order
        self.forward_lines: list[Any] = []  # callables (k) -> lines of one forward
        self.tags = 0
        self.inputs_leaf = False
        self.c_catchers: set[str] = set()  # modules whose output a forward hook hooks with torch.neg
        self.kind = ""

    def tag(self) -> str:
        self.tags += 1
        return f"h{self.tags}"

    def define(self, name: str, expression: str) -> None:
        self.lines.append(f"{name} = {expression}")
        self.tops.append(name)

    # --- the model

    def generate(self) -> Program:
        rng = self.rng
        self.kind = rng.choice(["seq", "seq", "conv", "mlp"])
        getattr(self, f"_{self.kind}")()
        self.lines.append(f"model = nn.ModuleList([{', '.join(self.tops)}])")
        self._names()
        for _ in range(rng.choice([0, 1, 2, 3, 4, 5])):
            self.hook()
        self.train()
        return Program(self.lines, self.params + [f"x{k}" for k in range(8)] if self.inputs_leaf else self.params,
                       self.seed)

    def _names(self) -> None:
        """Module and parameter paths as the lens names them (first name of a shared object wins)."""
        scratch: dict = {"torch": torch, "nn": nn, "F": F, "math": math}
        exec(compile(PRELUDE, "<prelude>", "exec"), scratch)
        try:
            exec("\n".join(self.lines), scratch)
        finally:
            torch.set_default_dtype(torch.float32)
        seen: set[int] = set()
        for top in self.tops:
            for path, module in scratch[top].named_modules(prefix=top, remove_duplicate=False):
                if id(module) not in seen:
                    seen.add(id(module))
                    self.modules.append(path)
                for key, param in module._parameters.items():
                    if param is not None and id(param) not in seen:
                        seen.add(id(param))
                        self.params.append(f"{path}.{key}")

    def _seq(self) -> None:
        rng = self.rng
        self.define("emb", "nn.Embedding(11, 8)")
        steps = []
        for index in range(rng.randint(1, 2)):
            kind = rng.choice(["ln", "mha", "enc", "gpt", "gpt", "lstm", "gru", "lin", "twice"])
            name = f"{kind}{index}"
            expression = {
                "ln": "nn.LayerNorm(8)",
                "mha": "nn.MultiheadAttention(8, 2, batch_first=True)",
                "enc": f"nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, "
                       f"norm_first={rng.random() < 0.5}, activation={rng.choice(['relu', 'gelu'])!r})",
                "gpt": f"Block(8, flash={rng.random() < 0.5})",
                "lstm": "nn.LSTM(8, 8, batch_first=True)",
                "gru": "nn.GRU(8, 8, batch_first=True)",
                "lin": "nn.Linear(8, 8)",
                "twice": "nn.Linear(8, 8)",
            }[kind]
            self.define(name, expression)
            steps.append((kind, name, rng.choice([None, None, True, False]) if kind in ("enc", "gpt", "lin", "ln")
                          else None, rng.random() < 0.5))
        self.define("head", "nn.Linear(8, 11, bias=False)")
        if rng.random() < 0.4:
            self.lines.append("head.weight = emb.weight")

        def forward(k: int) -> list[str]:
            out = [f"tok{k} = torch.randint(0, 11, (2, 4))", f"tgt{k} = torch.randint(0, 11, (2, 4))",
                   f"a{k}_0 = emb(tok{k})"]
            for j, (kind, name, reentrant, flag) in enumerate(steps, start=1):
                a, b = f"a{k}_{j - 1}", f"a{k}_{j}"
                call = f"checkpoint({name}, {a}, use_reentrant={reentrant})" if reentrant is not None else f"{name}({a})"
                out.append({
                    "mha": f"{b} = {a} + {name}({a}, {a}, {a}, need_weights=False"
                           f"{', attn_mask=torch.ones(4, 4).triu(1).bool()' if flag else ''})[0]",
                    "lstm": f"{b} = {name}({a})[0]",
                    "gru": f"{b} = {name}({a})[0]",
                    "lin": f"{b} = {a} + torch.tanh({call})" if flag else f"{b} = torch.tanh({call})",
                    "twice": f"{b} = {name}(torch.relu({name}({a})))",
                }.get(kind, f"{b} = {call}"))
            out.append(f"logits{k} = head(a{k}_{len(steps)})")
            out.append(f"loss{k} = F.cross_entropy(logits{k}.view(-1, 11), tgt{k}.view(-1))")
            return out
        self.forward_lines.append(forward)
        self.depth = len(steps)

    def _conv(self) -> None:
        rng = self.rng
        two = rng.random() < 0.6
        self.define("conv", "nn.Conv2d(2, 3, 3)" if two else "nn.Conv1d(2, 3, 3)")
        self.define("bn", "nn.BatchNorm2d(3)" if two else "nn.BatchNorm1d(3)")
        self.define("fc", "nn.Linear(48, 4)" if two else "nn.Linear(18, 4)")
        self.inputs_leaf = rng.random() < 0.3
        inplace = rng.random() < 0.1
        shape = "2, 2, 6, 6" if two else "2, 2, 8"

        def forward(k: int) -> list[str]:
            grad = ", requires_grad=True" if self.inputs_leaf else ""
            return [f"x{k} = torch.randn({shape}{grad})", f"y{k} = torch.randn(2, 4)",
                    f"a{k}_0 = conv(x{k})", f"a{k}_1 = bn(a{k}_0)",
                    f"a{k}_2 = F.relu(a{k}_1, inplace=True)" if inplace else f"a{k}_2 = torch.relu(a{k}_1)",
                    f"a{k}_3 = fc(a{k}_2.flatten(1))", f"loss{k} = F.mse_loss(a{k}_3, y{k})"]
        self.forward_lines.append(forward)
        self.depth = 3

    def _mlp(self) -> None:
        rng = self.rng
        if rng.random() < 0.3:  # a Sequential: parameters and modules named net.0.weight, net.2
            self.define("net", "nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))")
            self.inputs_leaf = rng.random() < 0.4

            def sequential(k: int) -> list[str]:
                grad = ", requires_grad=True" if self.inputs_leaf else ""
                return [f"x{k} = torch.randn(4, 6{grad})", f"y{k} = torch.randn(4, 1)", f"a{k}_0 = net[:2](x{k})",
                        f"a{k}_1 = net[2:](a{k}_0)", f"loss{k} = ((a{k}_1 - y{k}) ** 2).mean()"]
            self.forward_lines.append(sequential)
            self.depth = 1
            return
        self.define("l0", "nn.Linear(6, 8)")
        self.define("l1", "nn.Linear(8, 8)")
        self.define("l2", "nn.Linear(8, 1)")
        self.inputs_leaf = rng.random() < 0.4
        twice = rng.random() < 0.5
        reentrant = rng.choice([None, None, True, False])

        def forward(k: int) -> list[str]:
            grad = ", requires_grad=True" if self.inputs_leaf else ""
            middle = f"l1(torch.tanh(l1(a{k}_0)))" if twice else \
                f"checkpoint(l1, a{k}_0, use_reentrant={reentrant})" if reentrant is not None else f"l1(a{k}_0)"
            return [f"x{k} = torch.randn(4, 6{grad})", f"y{k} = torch.randn(4, 1)",
                    f"a{k}_0 = F.gelu(l0(x{k}))", f"a{k}_1 = {middle}", f"a{k}_2 = l2(a{k}_1)",
                    f"loss{k} = ((a{k}_2 - y{k}) ** 2).mean()"]
        self.forward_lines.append(forward)
        self.depth = 2

    # --- hooks

    def tensor_hook_maker(self, tag: str, mode: str) -> str:
        style = self.rng.choice(["def", "lambda", "partial", "method", "object", "c"])
        if style == "lambda" and mode == "raise":
            style = "def"
        return {
            "def": f"make_hook({tag!r}, {mode!r})",
            "lambda": f"(lambda g, _f=make_hook({tag!r}, {mode!r}): _f(g))",
            "partial": f"functools.partial(partial_hook, {tag!r}, {mode!r})",
            "method": f"Hooker({tag!r}, {mode!r}).method",
            "object": f"Hooker({tag!r}, {mode!r})",
            "c": f"CHOOK({tag!r}, {self.rng.choice(['append', 'neg'])!r})",
        }[style]

    def mode(self, modes: list[str]) -> str:
        return "raise" if self.rng.random() < 0.06 else self.rng.choice(modes)

    def hook(self) -> None:
        """One hook registered before training (module, global, parameter, post-accumulate, multi, forward)."""
        rng = self.rng
        kind = rng.choice(["module", "module", "module_pre", "global", "param", "param", "param_factory", "after",
                           "multi", "forward"])
        tag = self.tag()
        module_path = rng.choice(self.modules)
        module, param = _py(module_path), _py(rng.choice(self.params))
        if kind in ("module", "module_pre"):
            method = "register_full_backward_hook" if kind == "module" else "register_full_backward_pre_hook"
            maker = "make_module_hook" if kind == "module" else "make_module_pre"
            mode = self.mode(MODULE_MODES) if kind == "module" else rng.choice(MODULE_MODES)
            style = rng.choice(["def", "def", "lambda", "partial", "c"])
            fn = {"def": f"{maker}({tag!r}, {mode!r})",
                  "lambda": f"(lambda *a, _f={maker}({tag!r}, {mode!r}): _f(*a))",
                  "partial": f"functools.partial({maker}({tag!r}, {mode!r}))",
                  "c": f"MCHOOK({tag!r}, {'pre' if kind == 'module_pre' else 'full'!r})"}[style]
            self.lines.append(f"REG({module}, {method!r}, {fn})")
        elif kind == "global":
            which = rng.choice(["full", "pre"])
            maker = "make_module_hook" if which == "full" else "make_module_pre"
            self.lines.append(f"REG(None, 'global_{which}', {maker}({tag!r}, {rng.choice(['observe', 'scale'])!r}))")
        elif kind == "param":
            self.lines.append(f"REG({param}, 'register_hook', {self.tensor_hook_maker(tag, self.mode(MODES))})")
        elif kind == "param_factory":  # one closure per layer, all called "hook"
            mode = rng.choice(MODES)
            for index, name in enumerate(p for p in self.params if p.endswith("weight")):
                self.lines.append(f"REG({_py(name)}, 'register_hook', make_hook('{tag}.{index}', {mode!r}))")
        elif kind == "after":
            fn = f"CHOOK({tag!r}, 'append')" if rng.random() < 0.25 else \
                f"make_after({tag!r}, {rng.choice(['observe', 'inplace', 'clip', 'step', 'clear'])!r})"
            self.lines.append(f"REG({param}, 'register_post_accumulate_grad_hook', {fn})")
        elif kind == "multi":
            others = [_py(p) for p in self.params if _py(p) != param]
            watched = [param] + ([rng.choice(others)] if others and rng.random() < 0.6 else [])
            self.lines.append(f"REG(None, 'multi', ({', '.join(watched)},), make_multi({tag!r}, "
                              f"{rng.choice(['observe', 'inplace'])!r}), {rng.choice(['all', 'any'])!r})")
        else:  # a forward hook that hooks the layer's output, every forward
            mode = self.mode(MODES)  # drawn either way: the programs of every seed stay as they were but this line
            in_c = zlib.crc32(f"{self.seed}:{tag}".encode()) % 10 < 3  # torch.neg: seen from the gradients around it
            # ...but two on one output cancel out: a hook in C on a tensor with no name that leaves the gradient as
            # it was cannot be seen (torch gives no access to a node's tensor pre-hooks; the lens says so)
            in_c = in_c and module not in self.c_catchers
            if in_c:
                self.c_catchers.add(module)
            catcher = f"grad_catcher({tag!r}, 'neg', True)" if in_c else f"grad_catcher({tag!r}, {mode!r})"
            self.lines.append(f"{module_path.replace('.', '_')}_fh = {module}.register_forward_hook({catcher})")

    def activation_hooks(self, k: int) -> list[str]:
        """Hooks on this forward's activations, written by hand after it."""
        rng = self.rng
        out = []
        for _ in range(rng.choice([0, 0, 1, 2])):
            j = rng.randint(0, self.depth)
            name, tag = f"a{k}_{j}", self.tag()
            kind = rng.choice(["tensor", "tensor", "pre", "post", "multi"])
            if kind == "tensor":
                out.append(f"REG({name}, 'register_hook', {self.tensor_hook_maker(tag, self.mode(MODES))})")
            elif kind in ("pre", "post"):
                method = "register_prehook" if kind == "pre" else "register_hook"
                fn = f"CHOOK({tag!r}, {'append' if kind == 'pre' else 'print'!r})" if rng.random() < 0.3 else \
                    f"make_node_hook({tag!r}, {rng.choice(MODULE_MODES)!r}, {kind == 'pre'})"
                out.append(f"REG({name}.grad_fn, {method!r}, {fn})")
            else:
                other = f"a{k}_{rng.randint(0, self.depth)}"
                watched = name if other == name else f"{name}, {other}"
                out.append(f"REG(None, 'multi', ({watched},), make_multi({tag!r}, "
                           f"{rng.choice(['observe', 'inplace'])!r}), {rng.choice(['all', 'any'])!r})")
        return out

    # --- training

    def train(self) -> None:
        rng = self.rng
        self.lines.append(rng.choice(["opt = torch.optim.SGD(model.parameters(), lr=0.1)",
                                      "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
                                      "opt = torch.optim.Adam(model.parameters(), lr=0.01)"]))
        zero = rng.choice(["opt.zero_grad()", "opt.zero_grad(set_to_none=False)", "model.zero_grad()", None])
        micro = rng.choice([1, 1, 2])
        clip = rng.random() < 0.3
        k = 0
        for _ in range(rng.choice([1, 2, 2, 3])):
            if zero:
                self.lines.append(zero)
            for _ in range(micro):
                self.lines += self.forward_lines[0](k)
                self.lines += self.activation_hooks(k)
                loss = f"loss{k}" if micro == 1 else f"loss{k} / 2"
                self.passes(loss, k)
                k += 1
            if clip:
                self.lines.append("CLIP(model.parameters(), 0.5)")
            if rng.random() < 0.85:
                self.lines.append("opt.step()")
        self.lines += [f"GLOBALS[{index}].remove()" for index in range(sum("'global_" in line for line in self.lines))]

    def passes(self, loss: str, k: int) -> None:
        rng = self.rng
        kind = rng.choice(["backward"] * 6 + ["retain", "grad", "grad_then", "inputs"])
        if kind == "retain":
            self.lines.append(f"PASS('backward', {loss}, retain_graph=True)")
        if kind in ("grad", "grad_then"):
            chosen = [_py(p) for p in rng.sample(self.params, min(len(self.params), rng.randint(1, 3)))]
            self.lines.append(f"PASS('grad', {loss}, [{', '.join(chosen)}]"
                              f"{', retain_graph=True' if kind == 'grad_then' else ''})")
            if kind == "grad":
                return
        if kind == "inputs":
            chosen = [_py(p) for p in rng.sample(self.params, min(len(self.params), rng.randint(1, 3)))]
            self.lines.append(f"PASS('backward', {loss}, inputs=[{', '.join(chosen)}])")
            return
        self.lines.append(f"PASS('backward', {loss})")


# ----------------------------------------------------------------------------- running


class Unknowable(str):
    """An expected value "without hooks" that nothing can give (code other than a hook changed ``.grad``): the
    lens must say unknown; any value it shows compares unequal (and the failure prints this text)."""


def _leaf_values(namespace: dict, names: list[str]) -> dict[str, Any]:
    found = {}
    for name in names:
        with contextlib.suppress(AttributeError, KeyError):
            value = programs._value_of(namespace, name)
            if isinstance(value, torch.Tensor):
                found[name] = value
    return found


def _same(a: Any, b: Any) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and programs.equal(a, b))


class Shadow:
    """What "without hooks" must be for each pass (see the module's docstring)."""

    def __init__(self) -> None:
        self.without: dict[str, Any] = {}  # leaf -> .grad without hooks after the last pass (Unknowable: none)
        self.after: dict[str, Any] = {}  # leaf -> real .grad after the last pass
        self.first = True
        self.broken = False
        self.clipped = False  # CLIP (clip_grad_norm_) ran since the last pass
        self.marks: dict[str, tuple] = {}  # leaf -> (its .grad tensor, that tensor's version) after the last pass

    def before(self, leaves: dict[str, torch.Tensor]) -> dict[str, Any]:
        base = {}
        # code between passes that changed .grad may read every leaf's (clip_grad_norm_): it acts as it would
        # without hooks only where no .grad differed from its value without hooks
        alike = all(_same(self.without.get(name), self.after[name]) for name in self.after)
        # (clip_grad_norm_ writes every .grad that is not None: without hooks, maybe one that is None here)
        written = self.clipped or any(not self._untouched(name, leaf) for name, leaf in leaves.items()
                                      if name in self.marks)
        self.clipped = False
        for name, leaf in leaves.items():
            now = clone(leaf.grad)
            untouched = self._untouched(name, leaf)
            if self.first or name not in self.after:
                base[name] = now
            elif untouched and (not written or _same(self.without.get(name), self.after[name])):
                # no code wrote .grad since the last pass (clip_grad_norm_ writes it even unchanged), and none
                # wrote another leaf's, or this one's did not differ without hooks (else that code might have)
                base[name] = self.without.get(name)
            elif untouched:
                base[name] = Unknowable("unknown: code wrote other leaves' .grad between passes, and might have "
                                        "written this one's, which differed without hooks (the lens must say unknown)")
            elif now is None:
                base[name] = None
            elif not now.any():
                base[name] = torch.zeros_like(now)
            elif alike:
                base[name] = now  # nothing diverged: the program's own change happens without hooks too
            else:
                base[name] = Unknowable("unknown: .grad changed between passes by code that is no hook, after "
                                        "hooks changed a gradient (the lens must say unknown)")
        self.first = False
        return base

    def _untouched(self, name: str, leaf: torch.Tensor) -> bool:
        grad, mark = leaf.grad, self.marks.get(name)
        return mark is not None and grad is mark[0] and (grad is None or grad._version == mark[1])

    def settle(self, base: dict, added: dict, leaves: dict[str, torch.Tensor]) -> dict[str, Any]:
        for name, leaf in leaves.items():
            old, new = base.get(name), added.get(name)
            if isinstance(old, Unknowable) or new is None:
                self.without[name] = old
            else:
                self.without[name] = new if old is None else old + new
            self.after[name] = clone(leaf.grad)
            self.marks[name] = (leaf.grad, None if leaf.grad is None else leaf.grad._version)
        return dict(self.without)


GLOBAL_KINDS = {"global_full": "global_module_full", "global_pre": "global_module_full_pre"}


def run(program: Program, mode: str) -> Run:
    """Run ``program`` one way: plain, lens, truth, nohook (hooks switched off, per pass) or never (no hook)."""
    import autograd_lens as al

    result = Run()
    log: list = result.log
    gate = [True]
    stack: list[int] = []
    registered: list[int] = [0]
    kinds: dict[int, str] = {}  # truth: registration number -> how it was registered
    result.nested = []  # truth: (pass index, kind) of each hook call in a nested backward
    result.call_pass = []  # the pass each hook call ran in
    result.values = []  # per pass: the leaves' values as it starts
    handles: list = []
    namespace: dict = {"torch": torch, "nn": nn, "F": F, "math": math, "functools": functools, "clone": clone,
                       "KEEP": [], "GLOBALS": handles, "checkpoint": torch.utils.checkpoint.checkpoint}

    def tagged(tag: str) -> str:
        if mode == "truth" and _nested():
            tag = "nested:" + tag  # a call in a backward run inside the pass: not a step, named in a note
        return f"{tag}@{stack[-1]}" if stack else tag

    def login(tag: str, value: Any) -> None:
        log.append((tagged(tag), clone(value)))
        result.call_pass.append(len(result.passes))
        if log[-1][0].startswith("nested:"):
            result.nested.append((len(result.passes), kinds.get(stack[-1] if stack else 0, "c")))

    def logout(tag: str, value: Any) -> None:
        log.append((tagged(tag) + " out", clone(value)))

    def chook(tag: str, function: str) -> Any:
        raw = {"neg": torch.neg, "print": print}.get(function) or namespace.setdefault("SEEN", []).append
        if mode != "truth":
            return raw

        def logged(*args: Any) -> Any:
            value = args[0]  # a node post-hook (print) gets (grad_inputs, grad_outputs): what it got is grad_inputs
            login(tag, value)
            out = raw(*args)
            logout(tag, out if out is not None else value)
            return out
        logged.written_in_c = True
        logged.raw = raw  # what the other runs register (the lens names it)
        return logged

    def mchook(tag: str, kind: str) -> Any:
        if mode != "truth":
            return print

        def logged(module: Any, *grads: Any) -> Any:
            login(tag, grads[0])
            print(module, *grads)
            logout(tag, grads[0])
        logged.written_in_c = True
        logged.raw = print
        return logged

    @torch._dynamo.disable
    def bookkept(fn: Any, method: str, target: Any) -> Any:
        """The truth run's hook, numbered.  Out of dynamo's sight: a hook registered inside a compiled forward would
        make dynamo guard on this bookkeeping, recompile at every call until its recompile_limit and then run the
        block eagerly, so the truth run would not be the program the other runs are (it breaks the graph where the
        registration that follows breaks it anyway)."""
        registered[0] += 1
        number = registered[0]
        kinds[number] = method + (" in C" if getattr(fn, "written_in_c", False) else "")
        # what the lens must show its calls as, under the tag they log (tagged(): "<tag>@<number>")
        programs.registered(result.hooks, target, GLOBAL_KINDS.get(method, method), fn, f"@{number}")

        def numbered(*args: Any) -> Any:
            stack.append(number)
            try:
                return fn(*args)
            finally:
                stack.pop()
        return numbered

    def wrap(fn: Any, method: str, target: Any = None) -> Any:
        if mode == "truth":
            return bookkept(fn, method, target)
        if mode == "nohook":
            return lambda *args: fn(*args) if gate[0] else None
        return fn

    def reg(target: Any, method: str, *args: Any) -> Any:
        if mode == "never":
            handles.append(type("Gone", (), {"remove": lambda self: None})()) if method.startswith("global_") else None
            return None
        if method == "multi":
            tensors, fn, multi_mode = args
            return torch.autograd.graph.register_multi_grad_hook(tensors, wrap(fn, method, tensors), mode=multi_mode)
        if method.startswith("global_"):
            register = module_globals.register_module_full_backward_hook if method == "global_full" else \
                module_globals.register_module_full_backward_pre_hook
            handle = register(wrap(args[0], method))
            handles.append(handle)
            return handle
        return getattr(target, method)(wrap(args[0], method, target))

    shadow = Shadow()

    def do_pass(kind: str, root: Any, inputs: Any = None, retain_graph: bool = False) -> None:
        leaves = _leaf_values(namespace, program.leaves)
        result.before.append({name: clone(leaf.grad) for name, leaf in leaves.items()})
        result.values.append({name: clone(leaf) for name, leaf in leaves.items()})
        without = None
        if mode == "nohook":
            without = _switched_off(shadow, leaves, kind, root, inputs, gate)
        nodes: list = []
        observers = []
        if mode == "truth":
            result.targets.append({tag: programs._names_of(namespace, hook["on"]) for tag, hook in result.hooks.items()
                                   if hook["on"] is not None})
            for fn in programs._nodes(root):
                observers.append(fn.register_hook(
                    lambda gi, go, fn=fn: nodes.append((fn.name(), clone(go), clone(gi), programs._links(fn)))))
        error = None
        returned = None
        try:
            if kind == "grad":
                returned = clone(torch.autograd.grad(root, inputs, retain_graph=retain_graph, allow_unused=True))
            else:
                root.backward(inputs=inputs, retain_graph=retain_graph)
        except (ValueError, RuntimeError) as problem:
            error = f"{type(problem).__name__}: {problem}"
        finally:
            for handle in observers:
                handle.remove()
        result.nodes.append(nodes)
        entry = {"grads": {name: clone(leaf.grad) for name, leaf in leaves.items()}, "error": error,
                 "result": returned, "inputs": [programs._name_of(namespace, t) for t in inputs] if kind == "grad" else None}
        if without is not None:
            entry["real"], entry["real_error"] = entry["grads"], error
            entry.update(without)
            if kind == "backward":
                entry["grads"] = shadow.settle(without["base"], without["added"], leaves)
            shadow.broken = shadow.broken or (without["error"] is not None and error is None)
            if shadow.broken:  # the pass failed only with the hooks off: no truth from here on
                entry["error"] = "checker: the pass failed with its hooks switched off only"
        result.passes.append(entry)

    def clip(*args: Any, **kwargs: Any) -> Any:  # torch.nn.utils.clip_grad_norm_, noted for the shadow
        shadow.clipped = True
        return torch.nn.utils.clip_grad_norm_(*args, **kwargs)

    namespace.update(REG=reg, CHOOK=chook, MCHOOK=mchook, PASS=do_pass, LOGIN=login, LOGOUT=logout, CLIP=clip)
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    source = compile(program.source(), "<program>", "exec")
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if mode == "lens":
                with al.Lens(names=namespace, **programs.LENS_OPTIONS) as lens:
                    exec(source, namespace)
                result.lens = lens
            else:
                exec(source, namespace)
    except Exception as problem:  # noqa: BLE001  (the program's own failure is compared, not judged)
        result.error = f"{type(problem).__name__}: {problem}"
    finally:
        torch.set_default_dtype(torch.float32)  # a program in float64 set it for itself only
        for handle in handles:  # global hooks outlive the program otherwise
            handle.remove()
    kept = [index for index, entry in enumerate(e for e in log if not e[0].endswith(" out"))
            if not entry[0].startswith("nested:")]
    result.call_pass = [result.call_pass[index] for index in kept]
    result.log[:] = [entry for entry in log if not entry[0].startswith("nested:")]
    model = namespace.get("model")
    result.final = [clone(p) for p in model.parameters()] if isinstance(model, nn.Module) else None
    result.stdout = stdout.getvalue()
    return result


_ENGINE = torch.autograd.graph._engine_run_backward.__code__


def _nested() -> bool:
    """Inside a backward run by a backward (reentrant checkpointing)."""
    frame, engines = sys._getframe(), 0
    while frame is not None:
        engines += frame.f_code is _ENGINE
        frame = frame.f_back
    return engines > 1


def _switched_off(shadow: Shadow, leaves: dict, kind: str, root: Any, inputs: Any, gate: list) -> dict:
    """This pass's gradients with every hook switched off, on the same graph, ``.grad`` left as it was."""
    base = shadow.before(leaves) if kind == "backward" else {}
    every = dict(leaves)
    for fn in programs._nodes(root):
        if type(fn).__name__ == "AccumulateGrad":
            every.setdefault(f"#{len(every)}", fn.variable)
    kept = {name: leaf.grad for name, leaf in every.items()}
    gate[0] = False
    added: dict = {}
    error = returned = None
    try:
        for leaf in every.values():
            leaf.grad = None
        if kind == "grad":
            returned = clone(torch.autograd.grad(root, inputs, retain_graph=True, allow_unused=True))
        else:
            root.backward(inputs=inputs, retain_graph=True)
    except (ValueError, RuntimeError) as problem:  # no hook raised (all are off): the pass fails here without them
        error = f"{type(problem).__name__}: {problem}"
    finally:
        if kind != "grad":  # what it wrote, also before an error (leaves it reached keep it)
            added = {name: clone(leaf.grad) for name, leaf in leaves.items()}
        gate[0] = True
        for name, leaf in every.items():
            leaf.grad = kept[name]
    return {"base": base, "added": added, "error": error, "result": returned}


# ----------------------------------------------------------------------------- comparing


def compare(program: Program, cross_check: bool = False) -> list[str]:
    """Every false statement of the lens on ``program`` (``programs.compare``), and what it changed of the
    program's own results (parameters after training, printed output); "checker:" problems are this file's."""
    runs: dict[str, Run] = {}

    def runner(candidate: Program, mode: str) -> Run:
        runs[mode] = run(candidate, mode)
        return runs[mode]

    problems = programs.compare(program, runner)
    plain, lens_run, nohook = runs["plain"], runs["lens"], runs["nohook"]
    if (plain.final is None) != (lens_run.final is None) or \
            (plain.final is not None and not programs.equal(plain.final, lens_run.final)):
        problems.append("parameters after training differ under the lens")
    if plain.stdout != lens_run.stdout:
        problems.append("the program printed something else under the lens")
    if nohook.error != plain.error or len(nohook.passes) != len(plain.passes) or any(
            q.get("real_error") != p["error"] or not programs.equal(list(p["grads"].values()), list(q["real"].values()))
            for p, q in zip(plain.passes, nohook.passes) if "real" in q):
        problems.append("checker: switching hooks off for a pass changed the program's own run")
    if lens_run.lens is not None and len(lens_run.lens.passes) == len(runs["truth"].passes):
        for index, backward_pass in enumerate(lens_run.lens.passes):
            kinds = {kind for at, kind in runs["truth"].nested if at == index}
            note = " ".join(n for n in backward_pass.notes if n.startswith("hooks ran inside a nested backward"))
            maybe = " ".join(n for n in backward_pass.notes if "ran these hooks written in C if it reached" in n)
            python = {kind for kind in kinds if not kind.endswith(" in C")}
            if (python and not note) or (note and not kinds) or (kinds and not (note or maybe)):
                problems.append(f"pass {index + 1}: hooks ran in a nested backward: {sorted(kinds) or 'none'}; "
                                f"the notes say {note or maybe or 'nothing'}")
            elif "legacy" in note or ("multi" in kinds) != ("multi-grad" in note):
                problems.append(f"pass {index + 1}: nested backward note {note!r}, hooks registered by {sorted(kinds)}")
    source = program.source()
    attention = "MultiheadAttention" in source or "TransformerEncoderLayer" in source
    module_hooks = "register_full_backward" in source or "'global_" in source
    # (registering a module backward hook makes attention project q, k, v separately: last bits differ, guarantees.md)
    lens_passes = lens_run.lens.passes if lens_run.lens is not None else []
    problems += _moved_notes(lens_passes, runs["truth"], lens_run)
    if cross_check and not (attention and module_hooks):
        # until a pass says its leaves moved since hooks changed gradients, "without hooks" is also what a run
        # that never had them gives
        never = run(program, "never")
        for index, (q, n) in enumerate(zip(nohook.passes, never.passes)):
            if index < len(lens_passes) and any("a run that never had the hooks would have" in note
                                                for note in lens_passes[index].notes):
                break
            if "real" in q and q["error"] is None and n["error"] is None and q["inputs"] is not None:
                if not programs.equal(q["result"], n["result"]):
                    problems.append(f"cross-check: pass {index + 1}: autograd.grad with hooks switched off "
                                    f"{q['result']}, never registered {n['result']}")
            elif "real" in q and q["error"] is None and n["error"] is None and q["grads"].keys() == n["grads"].keys():
                for name, value in q["grads"].items():
                    if not isinstance(value, Unknowable) and not _same(value, n["grads"][name]):
                        problems.append(f"cross-check: pass {index + 1}: {name} with hooks switched off "
                                        f"{value}, never registered {n['grads'][name]}")
    return problems


def _moved_notes(lens_passes: list, truth: Run, lens_run: Run) -> list[str]:
    """Each "<leaves> changed since pass J, whose hooks changed gradients" note: pass J's hooks did change a
    gradient (some call passed on other values than it got), and each leaf named holds other values now."""
    import re

    problems = []
    changed_by_pass: dict[int, bool] = {}
    for (tag, received, passed), at in zip(programs._truth_calls(truth.log), truth.call_pass):
        changed_by_pass[at] = changed_by_pass.get(at, False) or passed is programs._MISSING \
            or not programs.equal(received, passed)
    for index, backward_pass in enumerate(lens_passes):
        for note in backward_pass.notes:
            found = re.match(r"(.*?)(?: and \d+ more)? changed since pass (\d+), whose hooks (changed gradients|stopped it|may have)", note)
            if not found:
                continue
            earlier = int(found.group(2)) - 1
            if found.group(3) == "changed gradients" and not changed_by_pass.get(earlier):
                problems.append(f"pass {index + 1}: note says pass {earlier + 1}'s hooks changed gradients; they did not")
            if found.group(3) == "stopped it" and truth.passes[earlier]["error"] is None:
                problems.append(f"pass {index + 1}: note says pass {earlier + 1}'s hooks stopped it; it did not stop")
            for name in found.group(1).split(", "):
                then, now = lens_run.values[earlier].get(name), lens_run.values[index].get(name)
                if then is not None and now is not None and programs.equal(then, now):
                    problems.append(f"pass {index + 1}: note says {name} changed since pass {earlier + 1}; it did not")
    return problems


def check(seed: int, cross_check: bool = False, generator: Any = None) -> tuple[Program, list[str]]:
    program = (generator or ModelGenerator)(seed).generate()
    return program, compare(program, cross_check)


def report(program: Program, problems: list[str], cross_check: bool = False) -> str:
    first = _class_of(problems[0])
    small = programs.shrink(program, lambda candidate: any(_class_of(p) == first
                                                           for p in compare(candidate, cross_check)))
    return (f"seed {program.seed}: {problems[0][:600]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            + "\nminimal program (tests/model_programs.py PRELUDE first):\n" + small.source()
            + "\n  -> " + "; ".join(p[:400] for p in compare(small, cross_check)[:3]))


def main(argv: list[str] | None = None, generator: Any = None, description: str = "") -> int:
    """A campaign; ``generator``: another generator class (``hf_programs.HFGenerator``), with its own description."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--cross-check", action="store_true",
                        help="also compare 'hooks switched off' with a run that never registered them")
    torch.set_num_threads(1)
    return programs.campaign(parser, argv, lambda seed, options: check(seed, options.cross_check, generator),
                             lambda program, problems, options: report(program, problems, options.cross_check),
                             classify=_class_of)


def _class_of(problem: str) -> str:
    """A problem without its values: what kind of statement was false."""
    import re

    text = re.sub(r"(tensor\(|\(tensor|\[\().*", "", problem.splitlines()[0])
    text = re.sub(r"pass \d+", "pass N", text)
    text = re.sub(r"hook call \d+ \([^)]*\)", "hook call", text)
    return re.sub(r"\d+", "N", text)[:120]


if __name__ == "__main__":
    sys.exit(main())
