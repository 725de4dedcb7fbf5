"""Generated training programs of the kinds real training code is made of, every statement the lens makes checked
against torch (``model_programs``' models, hooks and comparison, with what it does not make):

* ``DistributedDataParallel`` on CPU (gloo, world size 1, in this process): DDP's reducer puts hooks of its own (in
  C++) on every parameter's AccumulateGrad and writes ``.grad`` after its all-reduce, at the end of the pass.  With
  or without ``gradient_as_bucket_view``, small buckets, a communication hook (torch's allreduce or fp16
  compression; bf16's needs CUDA; or a Python one that halves what it reduces), ``no_sync()`` micro-batches that accumulate without
  reducing, and the user's hooks on parameters, modules and activations as in ``model_programs``;
* mixed precision on CPU: the forward under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (hooks on bfloat16
  activations), ``torch.amp.GradScaler("cpu")`` (a scaled loss, ``unscale_``, ``clip_grad_norm_``, ``step``,
  ``update``);
* training loops: optimizer step pre-/post-hooks (one prints, one scales every ``.grad`` in place), hooks registered
  in step k and removed in step k+2, and the optimizer step in backward as PyTorch's tutorial writes it (one
  optimizer per parameter, stepped and zeroed in a post-accumulate hook).

The truth "without hooks" of a DDP program is a run that never registered the hooks (DDP and its communication
hook stay): a switched-off backward on the same graph would be the one DDP reduces, not the program's.  It is
compared for the passes that start with the leaves as in the run with hooks (an optimizer step after hooks changed
gradients moves them: then "without hooks" is the lens's own definition, model_programs checks that).  The process
group is made before each program and destroyed after it.

It also makes cells with ``torch.func`` transforms (grad, vjp, vmap, jacrev) and ``torch.autograd.functional``
(jacobian, hessian) beside ``backward()`` of a small MLP with hooks (``func_program``, ``compare_func``): the passes
under a transform are left alone with a note saying how many; the others are checked call by call against a run
that counts the engine's runs.

``python tests/training_programs.py --programs 200 --seed 0`` runs a campaign (``--func``: the cells with torch.func).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import tempfile
import warnings
from typing import Any, Iterator

import torch

import model_programs
import programs
from programs import Program

NET = '''class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.l0, self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 1)
        self.spare = nn.Linear(8, 8) if unused else None
    def forward(self, x):
        a0 = torch.tanh(self.l0(x))
        a1 = torch.relu(self.l1(a0))
        return a0, a1, self.l2(a1)'''

COMM_HALF = '''def comm_half(state, bucket):
    done = torch.futures.Future()
    done.set_result(bucket.buffer() * 0.5)
    return done'''

COMM_REDUCE = '''def comm_reduce(state, bucket):
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda f: f.value()[0] / 2)'''

STEP_HOOKS = {
    "print": "opt.register_step_pre_hook(lambda o, args, kwargs: print('step', sum(p.grad is not None for g in "
             "o.param_groups for p in g['params'])))",
    "scale": "opt.register_step_pre_hook(lambda o, args, kwargs: [p.grad.mul_(0.5) for g in o.param_groups "
             "for p in g['params'] if p.grad is not None] and None)",
    "post": "opt.register_step_post_hook(lambda o, args, kwargs: print('stepped', "
            "[round(float(p.detach().sum()), 4) for g in o.param_groups for p in g['params']]))",
}

# GradScaler's unscale_ divides each .grad in place without counting a version; the checker's truth without hooks
# (model_programs.Shadow) tells code between passes by version counters, so the programs say what it did (the lens
# compares values and needs no such line: test_training_programs checks it without)
UNSCALED = "torch.autograd.graph.increment_version([p.grad for p in model.parameters() if p.grad is not None])"

FUSED = '''def fused_step(p):
    LOGIN('fused', p.grad)
    OPTS[p].step()
    OPTS[p].zero_grad()
    LOGOUT('fused', p.grad)'''


# (a ``with`` block is one line of a program: it shrinks as one, and an error inside it leaves autocast as it was for the
# next program in the process; ``__enter__()`` on lines of their own left it on, with its cast weights cached)
AUTOCAST = "with torch.autocast('cpu', dtype=torch.bfloat16):"


def _within(lines: list[str], head: str | None) -> list[str]:
    """``lines`` inside the ``with`` block ``head`` (as they are for None)."""
    if head is None:
        return lines
    return [head + "\n" + "\n".join("    " + line.replace("\n", "\n    ") for line in lines)]


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """A gloo process group of one (rank 0) for the time of one program; destroyed after it."""
    import torch.distributed as dist

    if dist.is_initialized():  # (left by a program that failed half-way: not this one's)
        dist.destroy_process_group()
    handle, path = tempfile.mkstemp(prefix="lens-ddp-")
    os.close(handle)
    os.unlink(path)  # the file store makes it
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class TrainingGenerator(model_programs.ModelGenerator):
    """A small model (``model_programs``' or a DDP-wrapped MLP), hooks on it, and 2-4 unrolled training steps with
    this file's kinds (drawn from a stream of their own)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draw = random.Random(seed * 7919 + 131)
        draw = self.draw
        self.ddp = draw.random() < 0.45
        self.autocast = draw.random() < 0.3
        self.scaler = draw.random() < 0.25
        self.step_hooks = draw.sample(sorted(STEP_HOOKS), draw.choice([0, 0, 1, 2]))
        self.fused = not self.scaler and draw.random() < 0.15
        self.lifecycle = draw.random() < 0.5  # hooks registered in step k, removed in step k+2
        self.no_sync = self.ddp and draw.random() < 0.4
        self.retired: list[tuple[int, str]] = []  # (step, handle) to remove

    def generate(self) -> Program:
        rng, draw = self.rng, self.draw
        if self.ddp:
            self._ddp_net()
        else:
            self.kind = rng.choice(["seq", "seq", "conv", "mlp"])
            getattr(self, f"_{self.kind}")()
        self.lines.append(f"model = nn.ModuleList([{', '.join(self.tops)}])")
        self._names()
        hooks = rng.choice([0, 1, 2, 3, 4, 5])
        at = draw.randint(0, hooks)  # DDP made before, between or after the hooks registered before training
        for index in range(hooks):
            if self.ddp and index == at:
                self._wrap()
            self.hook()
        if self.ddp and at == hooks:
            self._wrap()
        self.train()
        leaves = self.params + [f"x{k}" for k in range(8)] if self.inputs_leaf else self.params
        return Program(self.lines, leaves, self.seed)

    # --- DDP

    def _ddp_net(self) -> None:
        draw = self.draw
        self.lines.insert(1, "import torch.distributed as dist")
        self.lines.insert(2, "from torch.nn.parallel import DistributedDataParallel as DDP")
        self.unused = draw.random() < 0.15
        self.lines.append(NET)
        self.define("net", f"Net({self.unused})")
        self.inputs_leaf = draw.random() < 0.3

        def forward(k: int) -> list[str]:
            grad = ", requires_grad=True" if self.inputs_leaf else ""
            return [f"x{k} = torch.randn(4, 6{grad})", f"y{k} = torch.randn(4, 1)",
                    f"a{k}_0, a{k}_1, a{k}_2 = ddp(x{k})",
                    # (every output used: one unused gets None from DDP's _DDPSink, and a hook that scales it raises)
                    f"loss{k} = ((a{k}_2 - y{k}) ** 2).mean() + 0.1 * (a{k}_0.mean() + a{k}_1.mean())"]
        self.forward_lines.append(forward)
        self.depth = 2

    def _wrap(self) -> None:
        draw = self.draw
        options = [f"gradient_as_bucket_view={draw.random() < 0.5}"]
        if draw.random() < 0.4:
            options.append("bucket_cap_mb=0.0002")  # a bucket per parameter or two
        if self.unused:
            options.append("find_unused_parameters=True")
        elif not self.no_sync and draw.random() < 0.2:  # (no_sync() in its first step: torch's INTERNAL ASSERT)
            options.append("static_graph=True")
        self.lines.append(f"ddp = DDP(net, {', '.join(options)})")
        comm = draw.choice([None, None, "allreduce", "fp16", "half", "reduce"])  # (bf16 needs CUDA/NCCL)
        if comm in ("allreduce", "fp16"):
            self.lines.append("import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks")
            self.lines.append(f"ddp.register_comm_hook(None, default_hooks.{comm}_{'hook' if comm == 'allreduce' else 'compress_hook'})")
        elif comm == "half":
            self.lines += [COMM_HALF, "ddp.register_comm_hook(None, comm_half)"]
        elif comm == "reduce":
            self.lines += [COMM_REDUCE, "ddp.register_comm_hook(None, comm_reduce)"]

    # --- training

    def train(self) -> None:
        rng, draw = self.rng, self.draw
        self.lines.append(rng.choice(["opt = torch.optim.SGD(model.parameters(), lr=0.1)",
                                      "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
                                      "opt = torch.optim.AdamW(model.parameters(), lr=0.01)"]))
        self.lines += [STEP_HOOKS[name] for name in self.step_hooks]
        if self.scaler:
            self.lines.append(f"scaler = torch.amp.GradScaler('cpu', init_scale={draw.choice([4.0, 1024.0, 2.0 ** 16])})")
        if self.fused:
            optimizer = draw.choice(["torch.optim.SGD([p], lr=0.1)", "torch.optim.AdamW([p], lr=0.01)"])
            self.lines += [f"OPTS = {{p: {optimizer} for p in model.parameters()}}", FUSED,
                           "for p in model.parameters(): REG(p, 'register_post_accumulate_grad_hook', fused_step)"]
        zero = rng.choice(["opt.zero_grad()", "opt.zero_grad(set_to_none=False)", "model.zero_grad()", None])
        micro = draw.choice([1, 2, 2]) if self.no_sync else rng.choice([1, 1, 2])
        clip = rng.random() < 0.3
        k = 0
        for step in range(draw.choice([2, 3, 3, 4])):
            for at, handle in [item for item in self.retired if item[0] == step]:
                self.lines.append(f"if {handle} is not None: {handle}.remove()")
            if self.lifecycle and step == 0 or draw.random() < 0.2:
                self._registered(step)
            if zero:
                self.lines.append(zero)
            for index in range(micro):
                start = len(self.lines)
                self.lines += _within(self.forward_lines[0](k), AUTOCAST if self.autocast else None)
                self.lines += self.activation_hooks(k)
                loss = f"loss{k}" if micro == 1 else f"loss{k} / {micro}"
                self.passes(f"scaler.scale({loss})" if self.scaler else loss, k)
                if self.no_sync and index < micro - 1:  # accumulated without reducing
                    self.lines[start:] = _within(self.lines[start:], "with ddp.no_sync():")
                k += 1
            if self.fused:
                continue
            if self.scaler and (clip or draw.random() < 0.3):
                self.lines += ["scaler.unscale_(opt)", UNSCALED]
            if clip:
                self.lines.append("CLIP(model.parameters(), 0.5)")
            if self.scaler:
                self.lines += ["scaler.step(opt)", UNSCALED, "scaler.update()"]
            elif rng.random() < 0.85:
                self.lines.append("opt.step()")
        self.lines += [f"GLOBALS[{index}].remove()" for index in range(sum("'global_" in line for line in self.lines))]

    def _registered(self, step: int) -> None:
        """A hook registered now (on a parameter or a module), its handle kept, removed two steps later."""
        draw = self.draw
        tag = self.tag()
        handle = f"r{tag}"
        kind = draw.choice(["param", "param", "module"] + ([] if self.fused else ["after"]))  # (fused: .grad None)
        if kind == "param":
            param = model_programs._py(draw.choice(self.params))
            hook = self.tensor_hook_maker(tag, draw.choice(model_programs.MODES))
            self.lines.append(f"{handle} = REG({param}, 'register_hook', {hook})")
        elif kind == "module":
            module = model_programs._py(draw.choice(self.modules))
            self.lines.append(f"{handle} = REG({module}, 'register_full_backward_hook', make_module_hook({tag!r}, "
                              f"{draw.choice(model_programs.MODULE_MODES)!r}))")
        else:
            param = model_programs._py(draw.choice(self.params))
            self.lines.append(f"{handle} = REG({param}, 'register_post_accumulate_grad_hook', make_after({tag!r}, "
                              f"{draw.choice(['observe', 'inplace', 'clip'])!r}))")
        self.retired.append((step + 2, handle))

    def passes(self, loss: str, k: int) -> None:
        if not self.ddp:
            return super().passes(loss, k)
        # DDP reduces in the hooks of every parameter's AccumulateGrad: autograd.grad or inputs= leave its reduction
        # unfinished (the next forward raises, the same both ways); once in a while only
        kind = self.draw.choice(["backward"] * 30 + ["retain", "retain", "inputs"])
        if kind == "retain":
            self.lines.append(f"PASS('backward', {loss}, retain_graph=True)")
        if kind == "inputs":
            chosen = [model_programs._py(p) for p in self.draw.sample(self.params, 1)]
            self.lines.append(f"PASS('backward', {loss}, inputs=[{', '.join(chosen)}])")
            return
        self.lines.append(f"PASS('backward', {loss})")


# ----------------------------------------------------------------------------- torch.func and autograd.functional

FUNC_KINDS = ("grad", "vjp", "vmap_grad", "jacrev", "jacobian", "hessian", "backward", "backward")


def func_program(seed: int, mode: str) -> dict:
    """A cell with ``torch.func`` transforms (grad, vjp, vmap, jacrev: passes the lens leaves alone, with a note),
    ``torch.autograd.functional.jacobian`` / ``hessian`` (ordinary ``autograd.grad`` passes, made by torch) and
    ``backward()`` of a small MLP, in a random order, hooks on its parameters, activations (by a forward hook, so they
    run inside the transforms too) and modules (registered after the transforms: functorch refuses torch's
    BackwardHookFunction).  ``mode``: plain, lens, truth (every engine run counted, each hook call logged with the
    pass it ran in, or "func" for a pass under a transform) or never (no hook)."""
    import torch.autograd.graph as graph
    from torch.func import functional_call, grad, jacrev, vjp, vmap

    import autograd_lens as al

    rng = random.Random(seed)
    torch.manual_seed(seed)
    dtype = rng.choice([torch.float32, torch.float64])
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).to(dtype)
    x = torch.randn(5, 3, dtype=dtype)
    log: list = []
    runs = {"passes": 0, "func": 0, "at": []}

    def where() -> Any:
        return runs["at"][-1] if runs["at"] else None

    def logged(tag: str, scale: bool, value: Any) -> Any:
        inside = torch._C._are_functorch_transforms_active()  # (a batched tensor must not leave the transform)
        log.append((tag, where() if mode == "truth" else None, None if inside else programs.clone(value)))
        return None if not scale else tuple(None if g is None else g * 0.5 for g in value) \
            if isinstance(value, tuple) else value * 0.5

    def named(tag: str, function: Any) -> Any:  # a function whose code is called ``tag`` (as the lens names it)
        scope = {"body": function}
        exec(f"def {tag}(*args):\n    return body(*args)", scope)
        return scope[tag]

    hooked = mode != "never"
    kinds = [rng.choice(FUNC_KINDS) for _ in range(rng.randint(2, 5))] + ["backward"]
    later = rng.randint(0, len(kinds) - 1)  # module hooks registered before this operation
    for index in range(rng.randint(1, 3) if hooked else 0):
        scale = rng.random() < 0.4
        target = rng.choice(["param", "activation"])
        if target == "param":
            param = rng.choice(list(model.parameters()))
            param.register_hook(named(f"p{index}", lambda g, t=f"p{index}", s=scale: logged(t, s, g)))
        else:
            def forward_hook(module: Any, inputs: Any, output: Any, t: str = f"a{index}", s: bool = scale) -> None:
                if output.requires_grad:
                    output.register_hook(named(t, lambda g: logged(t, s, g)))
            model[rng.choice([0, 1])].register_forward_hook(forward_hook)
    module_hooks = [(rng.choice([0, 2]), rng.random() < 0.4) for _ in range(rng.randint(0, 2) if hooked else 0)]
    results: list = []
    after: list = []  # the parameters' .grad after each backward (they add up: no zero_grad in the cell)
    real = graph._engine_run_backward

    def counting(*args: Any, **kwargs: Any) -> Any:
        untraced = torch._C._are_functorch_transforms_active() or any(
            isinstance(g, torch.Tensor) and torch._C._functorch.is_batchedtensor(g) for g in (args[1] or ()))
        runs["at"].append("func" if untraced else runs["passes"])
        runs["func" if untraced else "passes"] += 1
        try:
            return real(*args, **kwargs)
        finally:
            runs["at"].pop()

    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p: Any) -> Any:
        return functional_call(model, p, (x,)).pow(2).sum()
    lens = al.Lens(names={"model": model, "x": x}, **programs.LENS_OPTIONS) if mode == "lens" else contextlib.nullcontext()
    patched = [torch.autograd, graph] if mode == "truth" else []
    for module in patched:
        module._engine_run_backward = counting
    try:
        with lens:
            for index, kind in enumerate(kinds):
                if index == later:
                    for number, (layer, scale) in enumerate(module_hooks):
                        model[layer].register_full_backward_hook(named(
                            f"m{number}", lambda m, gi, go, t=f"m{number}", s=scale: logged(t, s, gi)))
                try:
                    results.append(_func_step(kind, model, x, params, loss, (functional_call, grad, jacrev, vjp, vmap)))
                except RuntimeError as problem:  # (the same both ways: compared)
                    results.append(f"{type(problem).__name__}: {problem}"[:200])
                if kind == "backward":
                    after.append([programs.clone(p.grad) for p in model.parameters()])
    finally:
        for module in patched:
            module._engine_run_backward = real
    return {"log": log, "results": results, "runs": runs, "lens": lens if mode == "lens" else None,
            "grads": [programs.clone(p.grad) for p in model.parameters()], "kinds": kinds, "after": after}


def _func_step(kind: str, model: Any, x: Any, params: dict, loss: Any, func: tuple) -> Any:
    functional_call, grad, jacrev, vjp, vmap = func
    if kind == "grad":
        return grad(loss)(params)
    if kind == "vjp":
        out, back = vjp(lambda a: model(a), x)
        return back(torch.ones_like(out))
    if kind == "vmap_grad":
        return vmap(grad(lambda a: model(a).sum()))(x[:2])
    if kind == "jacrev":
        return jacrev(lambda a: model(a).sum())(x[1])
    if kind == "jacobian":
        return torch.autograd.functional.jacobian(lambda a: model(a).sum(1), x[:2])
    if kind == "hessian":
        return torch.autograd.functional.hessian(lambda a: model(a).sum(), x[0])
    model(x).pow(2).mean().backward()
    return None


def compare_func(seed: int) -> list[str]:
    """Every false statement of the lens on ``func_program(seed)``: what the cell computed and its hooks received
    under the lens, the passes recorded and left alone, each hook call shown (which, in which pass, in order, what it
    received and passed on) and each parameter's value without hooks after a backward (the run with no hook)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, lens_run, truth, never = (func_program(seed, mode) for mode in ("plain", "lens", "truth", "never"))
    problems = []
    if not programs.equal(_comparable(plain["results"]), _comparable(lens_run["results"])) or \
            not programs.equal(plain["grads"], lens_run["grads"]):
        problems.append("the cell computed other values under the lens")
    if [t for t, _, _ in plain["log"]] != [t for t, _, _ in lens_run["log"]] or not programs.equal(
            [v for _, _, v in plain["log"]], [v for _, _, v in lens_run["log"]]):
        problems.append("hooks received other values under the lens")
    lens = lens_run["lens"]
    if problems or lens is None:
        return problems
    if len(lens.passes) != truth["runs"]["passes"]:
        return [f"{len(lens.passes)} passes recorded, {truth['runs']['passes']} ran outside transforms"]
    said = sum(int(re.search(r"ran a backward pass here (once|twice|(\d+) times)", n.message).group(2) or
                   {"once": 1, "twice": 2}.get(re.search(r"here (once|twice)", n.message).group(1), 0))
               for n in getattr(lens, "notes", ()) if n.code == "untraced_pass")
    if said != truth["runs"]["func"]:
        problems.append(f"notes say {said} passes were left alone; {truth['runs']['func']} ran under transforms")
    ran = [(tag, at, value) for tag, at, value in truth["log"] if at != "func"]
    shown = lens.hook_calls
    if [(c.hook, c.pass_index) for c in shown] != [(tag, at) for tag, at, _ in ran]:
        return problems + [f"hook calls shown {[(c.hook, c.pass_index) for c in shown]}, ran "
                           f"{[(tag, at) for tag, at, _ in ran]}"]
    for call, (tag, at, value) in zip(shown, ran):
        if call.grad_in is not None and not programs.equal(programs._plain(call.grad_in), value):
            problems.append(f"pass {at + 1}: {tag} received {call.grad_in} shown, it received {value}")
    backward = [p for p in lens.passes if p.kind == "backward"]
    names = [f"model.{layer}.{kind}" for layer in (0, 2) for kind in ("weight", "bias")]
    for index, (p, values) in enumerate(zip(backward, never["after"])):
        for name, expected in zip(names, values):
            shown_value = p.grads_without_hooks.get(name)
            if shown_value is None and name in p.unknown:
                continue
            if name in p.grads_without_hooks and not programs.equal(programs._plain(shown_value), expected):
                problems.append(f"backward {index + 1}: {name} without hooks {shown_value} shown, it is {expected}")
    return problems


def _comparable(results: list) -> list:
    return [tuple(r.values()) if isinstance(r, dict) else r for r in results]


# ----------------------------------------------------------------------------- comparing


def compare(program: Program) -> list[str]:
    """``model_programs.compare``; a DDP program's truth "without hooks" from a run that never registered them."""
    source = program.source()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "DDP(" not in source:
            return model_programs.compare(program)
        return _compare_ddp(program)


def _compare_ddp(program: Program) -> list[str]:
    runs: dict[str, programs.Run] = {}

    def runner(candidate: Program, mode: str) -> programs.Run:
        with process_group():  # each run in a group of its own: none sees what another left in one
            result = model_programs.run(candidate, "never" if mode == "nohook" else mode)
        if mode == "nohook":
            for index, entry in enumerate(result.passes):
                moved = index >= len(runs["lens"].values) or not programs.equal(
                    list(result.values[index].values()), list(runs["lens"].values[index].values()))
                if moved and entry["error"] is None:  # (the leaves moved: another graph, not a truth for this pass)
                    entry["error"] = "checker: the leaves differ from the run with hooks"
        runs[mode] = result
        return result

    problems = programs.compare(program, runner)
    plain, lens_run = runs["plain"], runs["lens"]
    if (plain.final is None) != (lens_run.final is None) or \
            (plain.final is not None and not programs.equal(plain.final, lens_run.final)):
        problems.append("parameters after training differ under the lens")
    if plain.stdout != lens_run.stdout:
        problems.append("the program printed something else under the lens")
    lens_passes = lens_run.lens.passes if lens_run.lens is not None else []
    return problems + model_programs._moved_notes(lens_passes, runs["truth"], lens_run)


def generate(seed: int) -> Program:
    program = TrainingGenerator(seed)
    if not program.ddp:
        return program.generate()
    with process_group():  # (the generator runs the model's lines to name its parameters)
        return program.generate()


def check(seed: int) -> tuple[Program, list[str]]:
    program = generate(seed)
    return program, compare(program)


def report(program: Program, problems: list[str]) -> str:
    first = model_programs._class_of(problems[0])
    small = programs.shrink(program, lambda candidate: any(model_programs._class_of(p) == first
                                                           for p in compare(candidate)))
    return (f"seed {program.seed}: {problems[0][:600]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            + "\nminimal program (model_programs.PRELUDE first):\n" + small.source()
            + "\n  -> " + "; ".join(p[:400] for p in compare(small)[:3]))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.set_defaults(programs=200)
    parser.add_argument("--func", action="store_true", help="cells with torch.func and autograd.functional instead")
    torch.set_num_threads(1)

    def check_seed(seed: int, options: Any) -> tuple[Any, list[str]]:
        return (seed, compare_func(seed)) if options.func else check(seed)

    def show(program: Any, problems: list[str], options: Any) -> str:
        if options.func:  # (program: the seed)
            return f"seed {program} ({', '.join(func_program(program, 'never')['kinds'])}): {problems[0][:600]}"
        return report(program, problems)

    return programs.campaign(parser, argv, check_seed, show, classify=model_programs._class_of)


if __name__ == "__main__":
    sys.exit(main())
