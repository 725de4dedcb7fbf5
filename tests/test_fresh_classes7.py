"""Fresh eyes on classes of programs no earlier round tried (helper ``fresh7``, 2026-11-28): ``torch.library``
custom ops with a Python backward (``register_autograd``, ``setup_context``), ``torch.fx`` GraphModules and
``torch.export``'s modules trained with hooks, pruning, parametrizations (``cached()``, spectral and weight norm),
global module hooks beside local ones, a module called many times in a loop, RNNs over packed sequences, truncated
BPTT, ``channels_last`` convolutions, ``checkpoint_sequential`` and ``clip_grad_norm_(foreach=True)``.

Each program runs plainly, under a ``Lens``, as "truth" (an observer post-hook on every node of each pass) and with
its hooks not registered.  The lens must change nothing (values, hook calls, user-code call counts, warnings,
errors, parameters after optimizer steps); every hook call it shows (which hook, its call number and its card's
"call i of n", the tensor it is on where the program says, what it received and passed on), every node's
gradients, every ``.grad``, every value "without hooks" (or "unknown", with why) and every predict answer must be what
torch did.  Sections 1 and 2 and the reason tested in section 3's mutating program were false and are fixed (one
narrower case of section 1 stays a strict xfail); the rest are kept as differential tests."""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.model import TensorSummary
from autograd_lens.views.passview import views_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (tests/programs.py: the differential oracle's graph walk)


# --- the differential harness ---------------------------------------------------------------------------------------

def clone(value):
    if isinstance(value, (tuple, list)):
        return tuple(clone(item) for item in value)
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def equal(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b) \
            and all(equal(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, TensorSummary) or isinstance(b, TensorSummary):
        return True  # shown as a summary: not compared
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())
    return a == b


RAISED = "raised: "  # what a hook that raised passed on, in the log


class Run:
    """One run of a program: ``mode`` is "plain", "lens", "truth" (observers on every node) or "nohook"."""

    def __init__(self, mode: str):
        self.mode, self.hooked = mode, mode != "nohook"
        self.log, self.per, self.nodes, self.calls = [], [], [], collections.Counter()
        self.serials, self.targets, self.made = [], [], 0

    def H(self, name, function, received=None, target=None):
        """``function`` as a hook named ``name`` (one registration) that logs what the lens must show: what it
        received (``received(args)``, default its first argument) and passed on; ``target``: the tensor it is on."""
        self.made += 1
        serial, log, serials, targets = self.made, self.log, self.serials, self.targets

        def hook(*args):
            got = clone(received(args) if received else args[0])
            serials.append(serial)
            targets.append(target)
            try:
                out = function(*args)
            except Exception as problem:
                log.append((name, got, RAISED + repr(problem)))
                raise
            log.append((name, got, clone(out if out is not None else (received(args) if received else args[0]))))
            return out
        hook.__name__ = hook.__qualname__ = name
        return hook

    def backward(self, roots, **kwargs):
        roots = list(roots) if isinstance(roots, (tuple, list)) else [roots]
        return self._observed(roots, lambda: torch.autograd.backward(roots, **kwargs))

    def grad(self, root, inputs, **kwargs):
        return self._observed([root], lambda: torch.autograd.grad(root, inputs, **kwargs))

    def _observed(self, roots, call):
        """``call()``, a pass; in the truth run with an observer on every node (what each received and sent)."""
        handles, nodes, received = [], [], {}
        if self.mode == "truth":
            for fn in {id(fn): fn for root in roots for fn in programs._nodes(root)}.values():
                if not getattr(getattr(fn, "_forward_cls", None), "__module__", "").startswith("torch."):
                    handles.append(fn.register_prehook(lambda go, fn=fn: received.__setitem__(id(fn), clone(go))))
                handles.append(fn.register_hook(
                    lambda gi, go, fn=fn: nodes.append((fn.name(), received.pop(id(fn), clone(go)), clone(gi)))))
        try:
            return call()
        finally:
            for handle in handles:
                handle.remove()
            self.nodes.append(nodes)

    def record(self, grads: dict):
        self.per.append({name: clone(value) for name, value in grads.items()})


def run(program, mode: str) -> Run:
    result = Run(mode)
    result.out = result.error = result.lens = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if mode == "lens":
                result.lens = al.Lens()
                with result.lens:
                    result.out = program(result)
            else:
                result.out = program(result)
        except Exception as problem:  # noqa: BLE001  (compared, not judged)
            result.error = f"{type(problem).__name__}: {problem}"
    result.warnings = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
    return result


def problems_of(program) -> list[str]:
    """Every false statement of the lens on ``program``, and everything it changed (empty: none)."""
    run(program, "plain")  # first calls import and warn once: not what is compared
    plain, lensed, truth, unhooked = (run(program, mode) for mode in ("plain", "lens", "truth", "nohook"))
    problems = [f"{key}: plain {getattr(plain, key)}, under the lens {getattr(lensed, key)}"
                for key in ("error", "warnings", "calls") if getattr(plain, key) != getattr(lensed, key)]
    problems += [f"{key} differs under the lens" for key in ("per", "log", "out")
                 if not equal(getattr(plain, key), getattr(lensed, key))]
    if plain.error or unhooked.error:  # (a program that means to fail catches its error and returns it)
        problems.append(f"the program failed: {plain.error or unhooked.error}")
    if problems:
        return problems
    passes = lensed.lens.passes
    calls = [call for p in passes for call in p.hook_calls]
    if [call.hook for call in calls] != [entry[0] for entry in plain.log]:
        return [f"calls shown {[(c.hook, c.kind, c.target) for c in calls]}, ran {[e[0] for e in plain.log]}"]
    counts, totals, titles = collections.Counter(), collections.Counter(plain.serials), {}
    for call, (name, received, passed), serial, target in zip(calls, plain.log, plain.serials, plain.targets):
        counts[serial] += 1
        titles[id(call)] = f"call {counts[serial]} of {totals[serial]} in this recording"
        if call.invocation != counts[serial]:
            problems.append(f"{name}: call {call.invocation} shown, it was call {counts[serial]}")
        if target is not None and call.target != target:
            problems.append(f"{name}: shown on {call.target}, it is on {target}")
        if isinstance(passed, str) and passed.startswith(RAISED):
            if call.error is None or not equal(call.grad_in, received):
                problems.append(f"{name} raised {passed[len(RAISED):]} on {received}; shown {call}")
        elif not equal(call.grad_in, received) or not equal(call.grad_out, passed):
            problems.append(f"{name} shown receiving {call.grad_in} passing {call.grad_out}; "
                            f"it got {received} and passed {passed}")
    if len(passes) != len(plain.per):
        return problems + [f"{len(passes)} passes recorded, {len(plain.per)} ran"]
    for index, (p, truth_nodes) in enumerate(zip(passes, truth.nodes)):
        shown = [(r.name, r.grad_in, r.grad_out) for r in p.node_runs]
        ran = [node for node in truth_nodes if node[0] != "torch::autograd::AccumulateGrad"]
        if [s[0] for s in shown] != [r[0] for r in ran]:
            problems.append(f"pass {index + 1}: nodes {[s[0] for s in shown]} shown, ran {[r[0] for r in ran]}")
            continue
        problems += [f"pass {index + 1}: {s[0]} shown receiving {s[1]} sending {s[2]}; it got {r[1]}, sent {r[2]}"
                     for s, r in zip(shown, ran) if not equal(s[1], r[1]) or not equal(s[2], r[2])]
    for index, (p, real, without) in enumerate(zip(passes, plain.per, unhooked.per)):
        stepped = any("changed since pass" in note for note in p.notes)  # (then compared only for that note)
        for name, value in real.items():
            if name in p.leaf_grads and not equal(p.leaf_grads[name], value):
                problems.append(f"pass {index + 1}: {name}.grad shown {p.leaf_grads[name]}, it is {value}")
            if name not in p.grads_without_hooks or stepped:
                continue
            shown = p.grads_without_hooks[name]
            if not (shown is None and p.unknown.get(name)) and not equal(shown, without[name]):
                problems.append(f"pass {index + 1}: {name} without hooks shown {shown}, it is {without[name]}")
    truth_of = {id(call): entry for call, entry in zip(calls, plain.log)}
    for index, (view, p) in enumerate(zip(views_for(passes), passes)):
        for number, step in enumerate(view.steps):
            event = p.events[number - 1] if 0 < number <= len(p.events) else None
            if step.kind == "hook" and id(event) in titles and titles[id(event)] not in step.title:
                problems.append(f"card {step.title!r}: expected {titles[id(event)]!r}")
            if step.question is not None and event is not None:  # predict mode's answers
                problems += programs._question_problems(index, p, step, event, truth_of, truth.nodes[index], {})
    return problems


def lens_of(program) -> al.Lens:
    return run(program, "lens").lens


def train(run: Run, model: nn.Module, x: torch.Tensor, steps: int) -> list:
    """``steps`` SGD steps on ``model(x).pow(2).sum()``, each pass's .grads recorded; the parameters and buffers."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        run.backward(model(x).pow(2).sum())
        run.record(dict({n: p.grad for n, p in model.named_parameters()}, x=x.grad))
        opt.step()
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]


# --- torch.library custom ops with a Python backward ------------------------------------------------------------------

USER_CALLS: collections.Counter = collections.Counter()  # calls of the custom ops' code: the same under the lens


@torch.library.custom_op("fresh7::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, k: float) -> torch.Tensor:
    USER_CALLS["scaled_sin"] += 1
    return torch.sin(x) * k


@scaled_sin.register_fake
def _(x, k):
    return torch.empty_like(x)


def _sin_setup(ctx, inputs, output):
    USER_CALLS["scaled_sin setup_context"] += 1
    ctx.save_for_backward(inputs[0])
    ctx.k = inputs[1]


def _sin_backward(ctx, g):
    USER_CALLS["scaled_sin backward"] += 1
    (x,) = ctx.saved_tensors
    return g * torch.cos(x) * ctx.k, None


scaled_sin.register_autograd(_sin_backward, setup_context=_sin_setup)


@torch.library.custom_op("fresh7::double_exp", mutates_args=())
def double_exp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    USER_CALLS["double_exp"] += 1
    return x * 2, x.exp()


@double_exp.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


def _exp_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _exp_backward(ctx, ga, gb):
    USER_CALLS["double_exp backward"] += 1
    (e,) = ctx.saved_tensors
    return ga * 2 + gb * e


double_exp.register_autograd(_exp_backward, setup_context=_exp_setup)


LIBRARY = torch.library.Library("fresh7lib", "DEF")  # the older way: a schema, a CPU kernel, a Python backward
LIBRARY.define("cube(Tensor x) -> Tensor")


def _cube(x):
    USER_CALLS["cube"] += 1
    return x ** 3


def _cube_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _cube_backward(ctx, g):
    USER_CALLS["cube backward"] += 1
    (x,) = ctx.saved_tensors
    return 3 * x * x * g


LIBRARY.impl("cube", _cube, "CPU")
torch.library.register_autograd("fresh7lib::cube", _cube_backward, setup_context=_cube_setup, lib=LIBRARY)


class DoubleExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        e = x.exp()
        ctx.save_for_backward(e)
        return x * 2, e

    @staticmethod
    def backward(ctx, ga, gb):
        (e,) = ctx.saved_tensors
        return ga * 2 + gb * e


# --- 1. a tensor hook on an output of a multi-output node whose pre-hook changes its gradients -------------------------
# Was false: with a tensor hook on output 1 of a node of several outputs (a custom op returning two tensors, an
# autograd.Function, split, unbind) and a node pre-hook there that changed a gradient, the lens placed the hook on
# output 0 ("hook b on double_exp[0]") and invented two calls of a hook written in C on output 0 (one "changing"
# what the users sent into what b's hook received, one after): it matched an unnamed tensor's hook to its output by
# what the hook passed on, compared with what the node received *after* its pre-hook; and an observing hook on
# split[1] when every output got the same gradient was shown on split[0]. Fixed in capture/placing.py: by the very
# gradient the hook received (the copy its output's one user sent, or the one the hook before it passed on), else by
# its value (what that output's users sent, added up, or what the hook before it passed on).

def multi_output(kind: str, pre: str, hooks: tuple = (("b", 1),)):
    labels = {"custom_op": "generatedbackwardfor_fresh7_double_exp_default", "function": "doubleexp",
              "split": "splitwithsizes", "unbind": "unbind"}

    def program(run):
        USER_CALLS.clear()
        x = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
        for _ in range(2):
            if kind == "custom_op":
                a, b = double_exp(x)
            elif kind == "function":
                a, b = DoubleExp.apply(x)
            else:
                a, b = (x[:2] * 1).unbind() if kind == "unbind" else (x * 1).split([1, 2])
            if run.hooked:
                for name, number in hooks:  # b1, b2 ...: the 1st, 2nd hook on b
                    change = (lambda g: g.clamp(-0.5, 0.5)) if number == 1 else (lambda g: g + 1)
                    {"a": a, "b": b}[name].register_hook(
                        run.H(f"{name}{number}", change, target=f"{labels[kind]}[{'ab'.index(name)}]"))
                change_pre = {"a": lambda go: (go[0] * 0.5, go[1]), "b": lambda go: (go[0], go[1] * 3),
                              "none": lambda go: None}[pre]
                a.grad_fn.register_prehook(run.H("pre", change_pre))
            run.backward(a.sum() + b.pow(2).sum())
            run.record({"x": x.grad})
        return dict(USER_CALLS)
    return program


@pytest.mark.parametrize("kind", ["custom_op", "function", "split", "unbind"])
@pytest.mark.parametrize("pre", ["a", "b", "none"])
def test_a_hook_on_one_output_of_several_is_placed_there(kind, pre):
    assert problems_of(multi_output(kind, pre)) == []


@pytest.mark.parametrize("hooks", [(("b", 1), ("b", 2)), (("b", 1), ("a", 1), ("b", 2)), (("a", 1), ("a", 2), ("b", 1))])
def test_chained_hooks_on_outputs_of_a_custom_op(hooks):
    program = multi_output("custom_op", "b", hooks)
    assert problems_of(program) == []
    calls = lens_of(program).hook_calls
    assert not [call for call in calls if call.hook == "<C hook>"]
    assert run(program, "lens").out == {"double_exp": 2, "double_exp backward": 2}  # run once per pass, never again


def equal_gradients(pre: bool, chained: bool, used_twice: bool = False):
    """Every output of split gets the same gradient: the hook on split[1] cannot be told apart by value."""
    def program(run):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        a, b, c = (x * 1).split(1)
        if run.hooked:
            b.register_hook(run.H("b", lambda g: None, target="split[1]"))
            if chained:
                b.register_hook(run.H("b2", lambda g: g * 1, target="split[1]"))
            if pre:
                a.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * 0.5, go[1] * 2, go[2])))
        loss = a.sum() * 2 + b.sum() + b.sum() + c.sum() * 2 if used_twice else a.sum() + b.sum() + c.sum()
        run.backward(loss)
        run.record({"x": x.grad})
    return program


@pytest.mark.parametrize("pre", [False, True])
@pytest.mark.parametrize("chained", [False, True])
def test_a_hook_on_one_of_several_equal_gradients(pre, chained):
    """Was false: an observing hook on split[1] was shown on split[0] (by value, every output matched). Placed now by
    the very gradient it received (placing.py): the copy its one user sent, or the one the hook before passed on."""
    assert problems_of(equal_gradients(pre, chained)) == []


def test_a_hook_on_one_of_several_equal_summed_gradients():
    """A tensor used twice gets the sum of what its users sent, made by the engine, of which the lens keeps no copy;
    when every output of split got equal gradients, nothing the lens saw tells the outputs apart. Was false: the hook
    on split[1] was shown on split[0]. Now (placing.py, build.py) its output is said to be not known; every other
    statement is checked as before."""
    assert problems_of(equal_gradients(False, False, used_twice=True)) == [
        "b: shown on an output of split (which one is not known: its outputs received equal gradients), it is on "
        "split[1]"]


def pre_after_equal_sums(returns: bool):
    """split's outputs 0 and 1 get equal sums (2 and 1 + 1), a hook on output 1 (no name here) observes or scales,
    then a node pre-hook of split doubles output 1's gradient: what split received no longer tells the outputs apart."""
    def program(run):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        a, b, c = (x * 1).split(1)
        if run.hooked:
            b.register_hook(run.H("b", (lambda g: g * 5) if returns else (lambda g: None), target="split[1]"))
            a.grad_fn.register_prehook(run.H("pre", lambda go: (go[0], go[1] * 2, go[2])))
        run.backward(a.sum() * 2 + b.sum() + b.sum() + c.sum() * 4)
        run.record({"x": x.grad})
    return program


@pytest.mark.parametrize("returns", [False, True])
def test_a_hook_whose_output_a_node_pre_hook_hides_is_not_placed_by_guess(returns):
    """Was false (before 2026-11-28 noon): matched by what it passed on against what split received *after* its
    pre-hook, the hook was shown on split[0] (it is on split[1]); when it scaled the gradient, a call of a hook written
    in C was invented on split[1] to explain the change. Now (placing.py, unexplained.py) which output it was is said
    to be not known, and no call is invented; every other statement is checked as before."""
    assert problems_of(pre_after_equal_sums(returns)) == [
        "b: shown on an output of split (which one is not known: its outputs received equal gradients), it is on "
        "split[1]"]


def raising_on_one_output(kind: str, weights: tuple):
    def program(run):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        a, b, c = (x * 1).split(1) if kind == "split" else (x * 1).unbind()
        if run.hooked:
            b.register_hook(run.H("b", lambda g: (_ for _ in ()).throw(ValueError("no")), target=f"{kind}[1]"))
        try:
            run.backward(a.sum() * weights[0] + b.sum() * weights[1] + c.sum() * weights[2])
        except ValueError as error:
            return str(error)
        return None
    return program


@pytest.mark.parametrize("kind", ["split", "unbind"])
@pytest.mark.parametrize("weights", [(1.0, 2.0, 3.0), (2.0, 2.0, 2.0)])
def test_a_hook_that_raises_on_one_output_of_several_is_placed_there(kind, weights):
    """Was false: the pass stopped at split before it ran, so no gradients were passed to place the call by, and the
    hook was shown on split[0]. Now it is placed by the very copy it received (or said to be not known)."""
    program = raising_on_one_output(kind, weights)
    problems = problems_of(program)
    assert problems == ["0 passes recorded, 0 ran"] or problems == ["1 passes recorded, 0 ran"], problems
    lens = lens_of(program)
    assert [(call.hook, call.target) for call in lens.hook_calls] == [("b", f"{kind}[1]")]
    assert lens.passes[0].error is not None and lens.passes[0].error.message == "no"


# --- 2. "for forward call k" of a module hook, beside another module shown under the same name ------------------------
# Was false: torch gives module hooks no call index, and the lens numbered their calls per name shown: two modules with
# no name here (``Lens()`` around a function that builds them) are both "Linear", so a cell called 4 times after
# another Linear had its hooks' calls shown "for forward call 5 ... 2" (it was called 4 times), and a module called
# once after another one "for forward call 2". Fixed in capture/build.py: calls are numbered per module object.

def loop_cell(run):
    """A Linear called 4 times in a loop after another Linear; the loss weighs call i by i + 1, so the full hook
    learns its forward call from grad_output (the truth the lens's "for forward call" must match)."""
    torch.manual_seed(0)
    cell, other = nn.Linear(3, 3), nn.Linear(3, 3)
    seen = []
    if run.hooked:
        cell.register_full_backward_hook(run.H("cell_full", lambda m, gi, go: seen.append(int(go[0][0, 0])),
                                               lambda a: a[1], target="Linear"))
        cell.register_full_backward_pre_hook(run.H("cell_pre", lambda m, go: None, lambda a: a[1], target="Linear"))
        other.register_full_backward_hook(run.H("other_full", lambda m, gi, go: seen.append(1), lambda a: a[1]))
    x = torch.randn(4, 2, 3, requires_grad=True)
    for _ in range(2):
        loss = other(x[0]).sum() * 1
        for i in range(4):
            loss = loss + cell(x[i]).sum() * (i + 1)
        run.backward(loss)
        run.record(dict({"cell." + n: p.grad for n, p in cell.named_parameters()}, x=x.grad))
    return seen


def test_a_forward_call_the_pass_did_not_reach_is_not_counted_as_if_it_were_not_there():
    """Was false: torch gives module hooks no call index and the lens counts the calls whose hooks the pass reached, so
    with a first call whose output the loss does not use (or one under no_grad), the second call was shown "for forward
    call 1". Now the count says what it counts ("of the 2 this pass reached"), and a module whose hooks ran for one
    call only gets no such clause."""
    torch.manual_seed(0)
    m, single = nn.Linear(2, 2), nn.Linear(2, 2)
    seen = []
    m.register_full_backward_hook(lambda mod, gi, go: seen.append(int(go[0][0, 0])))
    single.register_full_backward_hook(lambda mod, gi, go: None)
    x = torch.randn(1, 2)
    with al.Lens() as lens:
        with torch.no_grad():
            m(x)  # forward call 1: no graph
        m(x)  # forward call 2: its output is not used
        b, c = m(x), m(x)  # forward calls 3 and 4
        (b.sum() + 2 * c.sum() + single(x).sum()).backward()
    assert seen == [2, 1]  # c's hook first (the later call), then b's
    calls = [call for call in lens.hook_calls if call.target == "m"]
    assert [(call.forward_call, call.forward_calls) for call in calls] == [(2, 2), (1, 2)]
    titles = [step.title for view in views_for(lens.passes) for step in view.steps if step.kind == "hook"]
    assert [t for t in titles if " on m " in t] == [
        "hook <lambda> on m (module full hook, call 1 of 2 in this recording, for forward call 2 of the 2 this pass "
        "reached)",
        "hook <lambda> on m (module full hook, call 2 of 2 in this recording, for forward call 1 of the 2 this pass "
        "reached)"]
    assert [t for t in titles if " on single " in t] == [
        "hook <lambda> on single (module full hook, call 1 of 1 in this recording)"]


def test_forward_calls_of_a_module_called_in_a_loop():
    assert problems_of(loop_cell) == []
    result = run(loop_cell, "lens")
    calls = [call for call in result.lens.hook_calls if call.kind == "module_full"]
    assert [call.forward_call for call in calls] == result.out == [4, 3, 2, 1, 1] * 2
    titles = [step.title for view in views_for(result.lens.passes) for step in view.steps if step.kind == "hook"]
    assert titles[:3] == ["hook cell_pre on Linear (module full pre hook, call 1 of 8 in this recording, for forward "
                          "call 4 of the 4 this pass reached)",
                          "hook cell_full on Linear (module full hook, call 1 of 8 in this recording, for forward "
                          "call 4 of the 4 this pass reached)",
                          "hook cell_pre on Linear (module full pre hook, call 2 of 8 in this recording, for forward "
                          "call 3 of the 4 this pass reached)"]
    assert titles[8] == "hook other_full on Linear (module full hook, call 1 of 2 in this recording)"


# --- 3. custom ops in a training loop: module hooks, hooks on their outputs, node hooks --------------------------------

def custom_op_training(run):
    USER_CALLS.clear()
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(2, 3, requires_grad=True)
    if run.hooked:
        lin.register_full_backward_hook(run.H("lin_full", lambda m, gi, go: None, lambda a: a[1]))
    for _ in range(2):
        opt.zero_grad()
        y = scaled_sin(lin(x), 2.0)
        a, b = double_exp(y)
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g * 3, target="generatedbackwardfor_fresh7_scaled_sin_default"))
            b.register_hook(run.H("b", lambda g: g.clamp(-0.5, 0.5),
                                  target="generatedbackwardfor_fresh7_double_exp_default[1]"))
            a.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * 0.5, go[1])))
            a.grad_fn.register_hook(run.H("post", lambda gi, go: None))
        run.backward(a.sum() + b.pow(2).sum())
        run.record({"x": x.grad, "lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad})
        opt.step()
    return dict(USER_CALLS), [p.detach().clone() for p in lin.parameters()]


def test_custom_ops_against_torch():
    assert problems_of(custom_op_training) == []
    result = run(custom_op_training, "lens")
    assert result.out[0] == {"scaled_sin": 2, "scaled_sin setup_context": 2, "scaled_sin backward": 2,
                             "double_exp": 2, "double_exp backward": 2}  # never run again by the lens
    first = result.lens.passes[0]
    # a Python backward on the way: "without hooks" is unknown, and says why
    assert first.grads_without_hooks["leaf"] is None and "backward is Python code" in first.unknown["leaf"]
    assert [run.name for run in first.node_runs if run.name.startswith("Generated")] == [
        "GeneratedBackwardFor_fresh7_double_exp_defaultBackward", "GeneratedBackwardFor_fresh7_scaled_sin_defaultBackward"]


def library_op(run):
    """A torch.library op with a Python backward, two passes over one graph (retain_graph), a node post-hook that
    replaces what it sends, and a hook on the leaf registered again each iteration (two hooks by then)."""
    USER_CALLS.clear()
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    for _ in range(2):
        y = torch.ops.fresh7lib.cube(x)
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g * 2, target="generatedbackwardfor_fresh7lib_cube_default"))
            y.grad_fn.register_hook(run.H("post", lambda gi, go: (gi[0] + 1,)))
            x.register_hook(run.H("x", lambda g: None, target="leaf"))
        run.backward(y.sin().sum(), retain_graph=True)
        run.record({"x": x.grad})
        run.backward(y.sum())
        run.record({"x": x.grad})
    return dict(USER_CALLS)


def test_library_op_against_torch():
    assert problems_of(library_op) == []
    lens = lens_of(library_op)
    assert [(c.hook, c.invocation) for c in lens.hook_calls if c.hook == "x"] == [
        ("x", 1), ("x", 2), ("x", 3), ("x", 1), ("x", 4), ("x", 2)]  # the hook of the 2nd iteration counts apart
    assert run(library_op, "lens").out == {"cube": 2, "cube backward": 4}


@torch.library.custom_op("fresh7::scale_into", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    USER_CALLS["scale_into"] += 1
    out.copy_(x * 3)


@torch.library.custom_op("fresh7::gate", mutates_args=())
def gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@gate.register_fake
def _(x, w):
    return torch.empty_like(x)


def _gate_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gate_backward(ctx, g):
    USER_CALLS["gate backward"] += 1
    x, w = ctx.saved_tensors
    return g * w, g * x


gate.register_autograd(_gate_backward, setup_context=_gate_setup)


def gated(run):
    """A custom op that mutates a buffer, a two-input custom op used twice, .grad accumulating over two passes, and
    autograd.grad between them (the hook on w is off its path)."""
    USER_CALLS.clear()
    torch.manual_seed(0)
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    buf = torch.zeros(4)
    scale_into(x.detach(), buf)
    for _ in range(2):
        y = gate(x, w)
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g.clamp(-0.5, 0.5), target="generatedbackwardfor_fresh7_gate_default"))
            w.register_hook(run.H("w", lambda g: g * 2, target="leaf_2"))
        run.backward(gate(y, buf + 1).pow(2).sum())
        run.record({"x": x.grad, "w": w.grad})
        (gx,) = run.grad(gate(x, w).sum(), [x])
        run.record({})
        USER_CALLS["autograd.grad's sum"] += float(gx.sum())
    return dict(USER_CALLS), buf


# Was false: a leaf whose .grad may share memory with another gradient (a Python backward on the way may return views)
# was said to share it: "its .grad shares memory (or would, in a run without hooks) with another leaf's .grad", here
# where x.grad and w.grad are tensors of their own (_gate_backward returns new tensors). Fixed in capture/shared.py:
# "shares memory, or may (in this run or in one without hooks)".
def test_custom_ops_mutating_and_autograd_grad_against_torch():
    assert problems_of(gated) == []
    result = run(gated, "lens")
    passes = result.lens.passes
    assert [p.kind for p in passes] == ["backward", "grad", "backward", "grad"]
    assert all(not p.hook_calls for p in passes if p.kind == "grad")
    plain = run(gated, "plain")
    assert result.out[0]["gate backward"] == plain.out[0]["gate backward"] == 6  # 2 + 1 per iteration, never again
    for reason in passes[2].unknown.values():
        assert "backward is Python code" in reason or "shares memory, or may (in this run or in one without hooks)" \
            in reason, reason


@torch.library.custom_op("fresh7::fragile", mutates_args=())
def fragile(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@fragile.register_fake
def _(x):
    return torch.empty_like(x)


def _fragile_backward(ctx, g):
    USER_CALLS["fragile backward"] += 1
    if USER_CALLS["fragile backward"] == 2:
        raise ValueError("fragile's backward refuses")
    return g * 2


fragile.register_autograd(_fragile_backward, setup_context=lambda ctx, inputs, output: None)


def failing(kind: str):
    """Errors in a pass: a custom op's backward that raises on its 2nd call; a hook on a GRU's weight returning the
    wrong shape; a full hook on a GraphModule that raises. The same errors, texts and calls under the lens."""
    def program(run):
        USER_CALLS.clear()
        torch.manual_seed(0)
        rnn, gm = nn.GRU(2, 3), torch.fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3)))
        x = torch.randn(4, 1, 2, requires_grad=True)
        outcome = []
        if run.hooked and kind == "shape":
            rnn.weight_hh_l0.register_hook(run.H("bad", lambda g: g[:1]))
        if run.hooked and kind == "raise":
            gm.register_full_backward_hook(run.H("raising", lambda mod, gi, go: {}["no"], lambda a: a[1]))
        for _ in range(2):
            try:
                run.backward(fragile(gm(rnn(x)[0])).pow(2).sum())
            except Exception as problem:  # noqa: BLE001  (what the user sees, compared)
                outcome.append(f"{type(problem).__name__}: {problem}")
            run.record({"x": x.grad, "whh": rnn.weight_hh_l0.grad})
        return outcome, dict(USER_CALLS)
    return program


@pytest.mark.parametrize("kind", ["custom_op_raises", "shape", "raise"])
def test_errors_in_passes_against_torch(kind):
    assert problems_of(failing(kind)) == []
    result = run(failing(kind), "lens")
    assert [p.error.type if p.error else None for p in result.lens.passes] == {
        "custom_op_raises": [None, "ValueError"], "shape": ["RuntimeError", "ValueError"],
        "raise": ["KeyError", "ValueError"]}[kind]


def custom_op_in_a_cell(shell):
    shell.user_ns["scaled_sin"] = scaled_sin
    shell.user_ns["double_exp"] = double_exp
    result = shell.run_cell("%%lens --as L --no-show\n"
                            "x = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)\n"
                            "a, b = double_exp(scaled_sin(x, 2.0))\n"
                            "b.register_hook(lambda g: g * 0.5)\n"
                            "a.grad_fn.register_prehook(lambda go: (go[0] * 3, go[1]))\n"
                            "(a.sum() + b.sum()).backward()\n")
    assert result.success, result.error_in_exec
    return shell.user_ns["L"]


def test_custom_op_in_a_lens_cell(shell):
    x = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
    a, b = double_exp(scaled_sin(x, 2.0))
    b.register_hook(lambda g: g * 0.5)
    a.grad_fn.register_prehook(lambda go: (go[0] * 3, go[1]))
    (a.sum() + b.sum()).backward()
    lens = custom_op_in_a_cell(shell)
    (p,) = lens.passes
    assert [(c.hook, c.kind, c.target) for c in p.hook_calls] == [
        ("<lambda>", "tensor", "b"), ("<lambda>", "node_pre", "generatedbackwardfor_fresh7_double_exp_default → a")]
    assert equal(p.leaf_grads["x"], x.grad)
    steps = views_for(lens.passes)[0].steps
    (card,) = [s for s in steps if s.title.startswith("hook <lambda> on b")]
    assert card.lines[0] == "received [1.0, 1.0, 1.0] → returned [0.5, 0.5, 0.5] — gradient modified"
    (pre,) = [s for s in steps if s.title.startswith("hook <lambda> on generatedbackwardfor")]
    assert pre.lines[0] == "received ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5]) → returned ([3.0, 3.0, 3.0], [0.5, 0.5, 0.5]) " \
                           "— gradient modified"
    (written,) = [s for s in steps if s.title.startswith("x.grad written")]
    assert f"x.grad written: {al.format_value(x.grad)}" == written.title
    assert "Without the hooks: unknown, because GeneratedBackwardFor_fresh7_double_exp_defaultBackward's backward is " \
           "Python code" in " ".join(written.lines)


# --- 4. torch.fx GraphModules and torch.export modules trained with module and parameter hooks -------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h) + h[:, :2]


def traced(kind: str):
    def program(run):
        torch.manual_seed(0)
        net = Net()
        gm = torch.fx.symbolic_trace(net) if kind == "fx" else torch.export.export(net, (torch.randn(5, 3),)).module()
        if run.hooked:
            gm.register_full_backward_hook(run.H("gm_full", lambda m, gi, go: None, lambda a: a[1]))
            if kind == "fx":  # (export's module calls its submodules' code inline: their hooks never fire)
                gm.a.register_full_backward_pre_hook(run.H("a_pre", lambda m, go: (go[0] * 2,), lambda a: a[1]))
            for n, p in gm.named_parameters():
                if n.endswith("weight"):
                    p.register_hook(run.H("w_" + n, lambda g: g.clamp(-0.3, 0.3)))
        return train(run, gm, torch.randn(5, 3, requires_grad=True), 2)
    return program


@pytest.mark.parametrize("kind", ["fx", "export"])
def test_graph_modules_against_torch(kind):
    assert problems_of(traced(kind)) == []


def test_graph_module_hooks_named_in_a_cell(shell):
    result = shell.run_cell("%%lens --as L --no-show\n"
                            "from torch import nn\n"
                            "torch.manual_seed(0)\n"
                            "gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.Tanh()))\n"
                            "gm.register_full_backward_hook(lambda m, gi, go: None)\n"
                            "getattr(gm, '0').register_full_backward_pre_hook(lambda m, go: (go[0] * 2,))\n"
                            "x = torch.randn(4, 2, 3, requires_grad=True)\n"
                            "loss = gm(x[0]).sum() + gm(x[1]).sum() * 2\n"
                            "loss.backward()\n")
    assert result.success, result.error_in_exec
    (p,) = shell.user_ns["L"].passes
    assert [(c.kind, c.target, c.invocation, c.forward_call) for c in p.hook_calls] == [
        ("module_full_pre", "gm.0", 1, 2), ("module_full", "gm", 1, 2),
        ("module_full_pre", "gm.0", 2, 1), ("module_full", "gm", 2, 1)]
    assert sorted(p.leaf_grads) == ["gm.0.bias", "gm.0.weight", "x"]
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.Tanh()))
    x = torch.randn(4, 2, 3, requires_grad=True)
    (gm(x[0]).sum() + gm(x[1]).sum() * 2).backward()
    assert equal(p.grads_without_hooks["x"], x.grad) and equal(p.grads_without_hooks["gm.0.weight"], getattr(gm, "0").weight.grad)
    assert equal(p.leaf_grads["x"][:2], x.grad[:2] * 2)  # the pre-hook doubled what reached Linear


# --- 5. pruning and parametrizations over several passes ----------------------------------------------------------------

def pruned(run):
    """prune's forward pre-hook computes weight = weight_orig * weight_mask at each call."""
    import torch.nn.utils.prune as prune

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    prune.l1_unstructured(m[0], "weight", amount=0.5)
    prune.random_unstructured(m[2], "weight", amount=0.3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    if run.hooked:
        m[0].weight_orig.register_hook(run.H("orig", lambda g: g * 2))
        m[2].register_full_backward_hook(run.H("m2", lambda mod, gi, go: None, lambda a: a[1]))
    x = torch.randn(5, 3)
    for _ in range(2):
        opt.zero_grad()
        run.backward(m(x).pow(2).sum())
        run.record({n: p.grad for n, p in m.named_parameters()})
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


class Symmetric(nn.Module):
    def forward(self, X):
        USER_CALLS["Symmetric"] += 1
        return X.triu() + X.triu(1).transpose(-1, -2)


def parametrized(cached: bool):
    import torch.nn.utils.parametrize as P

    def program(run):
        USER_CALLS.clear()
        torch.manual_seed(0)
        m = nn.Linear(3, 3)
        P.register_parametrization(m, "weight", Symmetric())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        if run.hooked:
            m.parametrizations.weight.original.register_hook(run.H("orig", lambda g: g * 0.5))
            m.parametrizations.weight[0].register_full_backward_hook(
                run.H("sym_full", lambda mod, gi, go: None, lambda a: a[1]))
        x = torch.randn(4, 3, requires_grad=True)
        for _ in range(2):
            opt.zero_grad()
            if cached:
                with P.cached():
                    y = m(x) + m(x * 2)
            else:
                y = m(x) + m(x * 2)
            run.backward(y.pow(2).sum())
            run.record(dict({n: p.grad for n, p in m.named_parameters()}, x=x.grad))
            opt.step()
        return [p.detach().clone() for p in m.parameters()], dict(USER_CALLS)
    return program


def normed(kind: str):
    from torch.nn.utils import parametrizations

    def program(run):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        {"spectral": parametrizations.spectral_norm, "weight": parametrizations.weight_norm,
         "old_spectral": torch.nn.utils.spectral_norm, "old_weight": torch.nn.utils.weight_norm}[kind](m[0])
        if run.hooked:
            for n, p in m.named_parameters():
                p.register_hook(run.H("p_" + n, lambda g: g.clamp(-0.2, 0.2)))
            m[0].register_full_backward_pre_hook(run.H("pre0", lambda mod, go: (go[0] * 3,), lambda a: a[1]))
        return train(run, m, torch.randn(5, 3, requires_grad=True), 3)
    return program


@pytest.mark.parametrize("program", [pruned, parametrized(False), parametrized(True), normed("spectral"),
                                     normed("weight"), normed("old_spectral"), normed("old_weight")],
                         ids=["prune", "parametrize", "parametrize_cached", "spectral_norm", "weight_norm",
                              "old_spectral_norm", "old_weight_norm"])
def test_pruning_and_parametrizations_against_torch(program):
    assert problems_of(program) == []


def test_pruned_weight_names_in_a_cell(shell):
    result = shell.run_cell("%%lens --as L --no-show\n"
                            "import torch.nn.utils.prune as prune\n"
                            "from torch import nn\n"
                            "torch.manual_seed(0)\n"
                            "m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))\n"
                            "prune.l1_unstructured(m[0], 'weight', amount=0.5)\n"
                            "m[0].weight_orig.register_hook(lambda g: g * 2)\n"
                            "out = m(torch.randn(5, 3)).pow(2).sum()\n"
                            "out.backward()\n")
    assert result.success, result.error_in_exec
    lens, m = shell.user_ns["L"], shell.user_ns["m"]
    (p,) = lens.passes
    assert sorted(p.leaf_grads) == ["m.0.bias", "m.0.weight_orig", "m.2.bias", "m.2.weight"]  # the parameters
    assert [(c.target, c.kind) for c in p.hook_calls] == [("m.0.weight_orig", "tensor")]
    assert equal(p.leaf_grads["m.0.weight_orig"], m[0].weight_orig.grad)
    assert equal(p.grads_without_hooks["m.0.weight_orig"] * 2, m[0].weight_orig.grad)
    # the mask zeroes half of weight_orig's gradient: the card of mul says what it sends there
    (mul,) = [s for s in views_for(lens.passes)[0].steps if s.title.startswith("mul (MulBackward0)")]
    half = m[0].weight_orig.grad / 2
    assert f"It sends m.0.weight_orig ← {al.format_value(half)}." in mul.lines


# --- 6. global module hooks beside local ones ------------------------------------------------------------------------------

def global_hooks(run):
    import torch.nn.modules.module as module_globals

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    handles, forwards = [], []

    def doubled_at_tanh(mod, gi, go):
        return tuple(None if g is None else g * 2 for g in gi) if isinstance(mod, nn.Tanh) else None
    if run.hooked:
        handles.append(module_globals.register_module_full_backward_pre_hook(
            run.H("gpre", lambda mod, go: None, lambda a: a[1])))
        handles.append(module_globals.register_module_full_backward_hook(
            run.H("gfull", doubled_at_tanh, lambda a: a[1])))
        handles.append(module_globals.register_module_forward_hook(lambda mod, i, o: forwards.append(type(mod).__name__)))
        m[2].register_full_backward_hook(run.H("local2", lambda mod, gi, go: None, lambda a: a[1]))
        m[2].register_full_backward_pre_hook(run.H("localpre2", lambda mod, go: (go[0] * 0.5,), lambda a: a[1]))
    x = torch.randn(5, 3, requires_grad=True)
    try:
        for _ in range(2):
            m.zero_grad()
            run.backward(m(x).pow(2).sum())
            run.record(dict({n: p.grad for n, p in m.named_parameters()}, x=x.grad))
    finally:
        for handle in handles:
            handle.remove()
    return forwards


def test_global_module_hooks_against_torch():
    assert problems_of(global_hooks) == []
    lens = lens_of(global_hooks)
    first = lens.passes[0]
    # global hooks before the module's own, the pre-hooks of a module before its full hooks, containers included
    assert [(c.hook, c.kind, c.target, c.forward_call) for c in first.hook_calls] == [
        ("gpre", "global_module_full_pre", "Sequential", 1), ("gpre", "global_module_full_pre", "Linear", 1),
        ("localpre2", "module_full_pre", "Linear", 1), ("gfull", "global_module_full", "Linear", 1),
        ("local2", "module_full", "Linear", 1), ("gpre", "global_module_full_pre", "Tanh", 1),
        ("gfull", "global_module_full", "Tanh", 1), ("gpre", "global_module_full_pre", "Linear", 1),
        ("gfull", "global_module_full", "Linear", 1), ("gfull", "global_module_full", "Sequential", 1)]
    start = views_for(lens.passes)[0].steps[0].lines
    assert "• every module of the pass: global module full pre hook gpre" in start
    assert "• every module of the pass: global module full hook gfull" in start
    assert [c.invocation for c in lens.passes[1].hook_calls if c.hook == "gpre"] == [5, 6, 7, 8]


# --- 7. recurrent nets: packed sequences, truncated BPTT -------------------------------------------------------------------

def packed(kind: str):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    def program(run):
        torch.manual_seed(0)
        rnn = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[kind](3, 4, batch_first=True)
        head = nn.Linear(4, 1)
        opt = torch.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=0.1)
        if run.hooked:
            rnn.weight_hh_l0.register_hook(run.H("whh", lambda g: g * 0.5))
            rnn.register_full_backward_hook(run.H("rnn_full", lambda m, gi, go: None, lambda a: a[1]))
        x = torch.randn(3, 5, 3, requires_grad=True)
        lengths = torch.tensor([5, 3, 2])
        for _ in range(2):
            opt.zero_grad()
            out, _ = rnn(pack_padded_sequence(x, lengths, batch_first=True))
            padded, _ = pad_packed_sequence(out, batch_first=True)
            if run.hooked:
                padded.register_hook(run.H("padded", lambda g: g.clamp(-0.1, 0.1)))
            run.backward(head(padded).pow(2).sum())
            run.record(dict({n: p.grad for n, p in rnn.named_parameters()}, x=x.grad))
            opt.step()
        return [p.detach().clone() for p in rnn.parameters()]
    return program


def truncated_bptt(run):
    """A GRUCell over 3 chunks of 2 steps, the state detached between chunks, a step after each."""
    torch.manual_seed(0)
    cell = nn.GRUCell(2, 3)
    opt = torch.optim.SGD(cell.parameters(), lr=0.05)
    if run.hooked:
        cell.register_full_backward_hook(run.H("cell_full", lambda m, gi, go: None, lambda a: a[1]))
        cell.weight_ih.register_hook(run.H("wih", lambda g: g.clamp(-0.05, 0.05)))
    xs = torch.randn(6, 4, 2)
    h = torch.zeros(4, 3)
    for chunk in range(3):
        h = h.detach()
        opt.zero_grad()
        loss = 0
        for t in range(2):
            h = cell(xs[chunk * 2 + t], h)
            loss = loss + h.pow(2).mean()
        run.backward(loss)
        run.record({n: p.grad for n, p in cell.named_parameters()})
        opt.step()
    return [p.detach().clone() for p in cell.parameters()]


@pytest.mark.parametrize("program", [packed("rnn"), packed("gru"), packed("lstm"), truncated_bptt],
                         ids=["rnn", "gru", "lstm", "truncated_bptt"])
def test_recurrent_nets_against_torch(program):
    assert problems_of(program) == []


def test_truncated_bptt_hook_counts():
    lens = lens_of(truncated_bptt)
    # one full-hook call per cell call (2 per chunk, the later first), counted over the recording
    assert [[(c.hook, c.invocation, c.forward_call) for c in p.hook_calls] for p in lens.passes] == [
        [("cell_full", 1, 2), ("cell_full", 2, 1), ("wih", 1, None)],
        [("cell_full", 3, 2), ("cell_full", 4, 1), ("wih", 2, None)],
        [("cell_full", 5, 2), ("cell_full", 6, 1), ("wih", 3, None)]]


# --- 8. channels_last, checkpoint_sequential, clip_grad_norm_(foreach=True) ---------------------------------------------

def channels_last(run):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 2, 1))
    m = m.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    if run.hooked:
        m[0].weight.register_hook(run.H("w0", lambda g: g * 0.5))
        m[1].register_full_backward_pre_hook(run.H("bn_pre", lambda mod, go: (go[0] * 2,), lambda a: a[1]))
    x = torch.randn(2, 2, 5, 5).to(memory_format=torch.channels_last).requires_grad_()
    for _ in range(2):
        opt.zero_grad()
        y = m(x)
        if run.hooked:
            y.register_hook(run.H("y", lambda g: g.contiguous() * 1.5))
        run.backward(y.pow(2).sum())
        run.record(dict({n: p.grad for n, p in m.named_parameters()}, x=x.grad))
        opt.step()
    layouts = (x.grad.is_contiguous(memory_format=torch.channels_last), m[0].weight.grad.stride())
    return [p.detach().clone() for p in m.parameters()] + [b.clone() for b in m.buffers()], layouts


def checkpointed(reentrant: bool, inside: bool = False):
    """``inside``: hooks on checkpointed modules too (a full hook, and a tensor hook a forward hook registers on each
    output, again when the checkpoint recomputes it: that one is on a tensor the pass never reaches)."""
    import torch.utils.checkpoint as checkpoint

    def program(run):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        USER_CALLS.clear()
        m[0].register_forward_hook(lambda mod, i, o: USER_CALLS.update(["m.0 forward"]))  # run again in backward
        if run.hooked:
            m[0].weight.register_hook(run.H("w0", lambda g: g * 2))
            m[4].register_full_backward_hook(run.H("m4", lambda mod, gi, go: None, lambda a: a[1]))
        if run.hooked and inside:
            m[0].register_full_backward_hook(run.H("m0", lambda mod, gi, go: (gi[0] * 0.5,), lambda a: a[1]))
            m[1].register_forward_hook(lambda mod, i, o: (o.register_hook(run.H("act1", lambda g: g * 3)), None)[1])
        x = torch.randn(5, 3, requires_grad=True)
        out = checkpoint.checkpoint_sequential(m, 3, x, use_reentrant=reentrant)  # m[0], m[1] checkpointed
        run.backward(out.pow(2).sum())
        run.record(dict({n: p.grad for n, p in m.named_parameters()}, x=x.grad))
        return dict(USER_CALLS)
    return program


def clipped(run):
    """Post-accumulate hooks observing, a hook scaling one weight by 10, then clip_grad_norm_(foreach=True)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    norms = []
    if run.hooked:
        for n, p in m.named_parameters():
            p.register_post_accumulate_grad_hook(run.H("after_" + n, lambda p: None, lambda a: a[0].grad))
        m[2].weight.register_hook(run.H("w2", lambda g: g * 10))
    x = torch.randn(5, 3)
    for _ in range(3):
        opt.zero_grad()
        run.backward(m(x).pow(2).sum())
        run.record({n: p.grad for n, p in m.named_parameters()})
        norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5, foreach=True))
        opt.step()
    return [p.detach().clone() for p in m.parameters()], norms


def clipped_inside(run):
    """clip_grad_norm_(foreach=True) inside the pass: a post-accumulate hook of the last leaf written clips every
    .grad written so far, in place."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    norms = []

    def clip_all(p):
        written = [q for q in m.parameters() if q.grad is not None]
        norms.append(torch.nn.utils.clip_grad_norm_(written, 0.1, foreach=True))
    if run.hooked:
        m[0].weight.register_post_accumulate_grad_hook(run.H("clip_all", clip_all, lambda a: a[0].grad))
        m[2].weight.register_hook(run.H("w2", lambda g: g * 10))
    return train(run, m, torch.randn(5, 3, requires_grad=True), 2), norms


@pytest.mark.parametrize("program", [channels_last, checkpointed(False), checkpointed(False, inside=True), clipped,
                                     clipped_inside],
                         ids=["channels_last", "checkpoint_sequential", "checkpoint_sequential_hooks_inside",
                              "clip_grad_norm_foreach", "clipped_inside"])
def test_layouts_checkpoints_and_clipping_against_torch(program):
    assert problems_of(program) == []


def test_reentrant_checkpoint_sequential_says_what_it_did_not_record():
    """Reentrant checkpointing runs the hooks of the checkpointed layers inside a backward of its own: the lens shows
    the hooks outside it, says the others ran unrecorded, and gives no value without hooks that depends on them."""
    program = checkpointed(True)
    plain, result = run(program, "plain"), run(program, "lens")
    assert equal(plain.per, result.per) and plain.out == result.out == {"m.0 forward": 2}  # recomputed once, as plain
    (p,) = result.lens.passes
    assert [c.hook for c in p.hook_calls] == ["m4"] and [e[0] for e in plain.log] == ["m4", "w0"]
    assert any("hooks ran inside a nested backward run by CheckpointFunctionBackward" in n for n in p.notes)
    # the outer graph's leaves (m[0]'s and m[1]'s parameters are leaves of the nested backward only)
    real = {name: plain.per[0][key] for name, key in (("leaf", "4.bias"), ("leaf_2", "4.weight"),
                                                       ("leaf_3", "2.bias"), ("leaf_4", "2.weight"), ("leaf_5", "x"))}
    assert equal(p.leaf_grads, real)
    assert p.unknown and all(p.grads_without_hooks[name] is None for name in p.unknown)
    assert (plain.per[0]["0.weight"] != 0).all()


def test_global_hooks_over_graph_modules_in_a_cell(shell):
    """fx shares the traced model's submodules (named by the model's names), export's module calls none of them; a
    global full backward hook sees each module that ran, with and without --modules (its global forward hooks)."""
    body = ("from torch import nn\n"
            "import torch.nn.modules.module as M\n"
            "torch.manual_seed(0)\n"
            "net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))\n"
            "gm = torch.fx.symbolic_trace(net)\n"
            "ep = torch.export.export(net, (torch.randn(5, 3),)).module()\n"
            "seen = []\n"
            "h = M.register_module_full_backward_hook(lambda m, gi, go: seen.append(type(m).__name__))\n"
            "x = torch.randn(5, 3, requires_grad=True)\n"
            "try:\n"
            "    (gm(x).sum() + ep(x).sum()).backward()\n"
            "finally:\n"
            "    h.remove()\n")
    assert shell.run_cell(body).success
    plain = list(shell.user_ns["seen"])
    assert plain == ["GraphModule", "Linear", "Tanh", "Linear", "Sequential"]
    for flags in ("", " --modules"):
        result = shell.run_cell(f"%%lens --as L --no-show{flags}\n" + body)
        assert result.success, result.error_in_exec
        assert shell.user_ns["seen"] == plain
        (p,) = shell.user_ns["L"].passes
        assert [(c.kind, c.target, c.invocation) for c in p.hook_calls] == [
            ("global_module_full", "ep", 1), ("global_module_full", "net.2", 2), ("global_module_full", "net.1", 3),
            ("global_module_full", "net.0", 4), ("global_module_full", "gm", 5)]
        assert sorted(p.leaf_grads) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight", "x"]
        assert equal(p.leaf_grads["x"], shell.user_ns["x"].grad)


PACKED_CELL = ("from torch import nn\n"
               "from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence\n"
               "torch.manual_seed(0)\n"
               "lstm = nn.LSTM(3, 4, batch_first=True)\n"
               "head = nn.Linear(4, 1)\n"
               "head.register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))\n"
               "lstm.weight_hh_l0.register_hook(lambda g: g * 0.5)\n"
               "x = torch.randn(3, 5, 3, requires_grad=True)\n"
               "out, _ = lstm(pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True))\n"
               "padded, _ = pad_packed_sequence(out, batch_first=True)\n"
               "head(padded).pow(2).sum().backward()\n")


@pytest.mark.parametrize("flags", ["", " --modules", " --predict"])
def test_packed_lstm_in_a_cell(shell, flags):
    """An LSTM over a packed batch, a full hook on the head replacing its grad_input, a hook on weight_hh: every .grad
    and every value without hooks as torch computes them, with module groups and in predict mode too."""
    names = ("x", "lstm.weight_hh_l0", "lstm.weight_ih_l0", "lstm.bias_hh_l0", "head.weight", "head.bias")

    def grads():
        return {name: eval(name, shell.user_ns).grad.clone() for name in names}
    assert shell.run_cell(PACKED_CELL.replace("head.register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))\n", "")
                          .replace("lstm.weight_hh_l0.register_hook(lambda g: g * 0.5)\n", "")).success
    without = grads()
    assert shell.run_cell(PACKED_CELL).success
    plain = grads()
    result = shell.run_cell(f"%%lens --as L --no-show{flags}\n" + PACKED_CELL)
    assert result.success, result.error_in_exec
    assert equal(grads(), plain)
    (p,) = shell.user_ns["L"].passes
    assert [(c.hook, c.kind, c.target) for c in p.hook_calls] == [
        ("<lambda>", "module_full", "head"), ("<lambda>", "tensor", "lstm.weight_hh_l0")]
    assert not p.unknown and not p.notes
    assert equal({name: p.leaf_grads[name] for name in names}, plain)
    assert equal({name: p.grads_without_hooks[name] for name in names}, without)
    assert [g.path for g in p.groups] == (["lstm", "head"] if "modules" in flags else [])


PRUNE_REMOVE_CELL = ("import torch.nn.utils.prune as prune\n"
                     "from torch import nn\n"
                     "torch.manual_seed(0)\n"
                     "m = nn.Linear(3, 2)\n"
                     "prune.l1_unstructured(m, 'weight', amount=0.5)\n"
                     "m.weight_orig.register_hook(lambda g: g * 2)\n"
                     "x = torch.randn(4, 3)\n"
                     "m(x).pow(2).sum().backward()\n"
                     "g1 = m.weight_orig.grad.clone()\n"
                     "prune.remove(m, 'weight')\n"
                     "m.weight.register_hook(lambda g: g * 3)\n"
                     "m(x).pow(2).sum().backward()\n"
                     "g2 = m.weight.grad.clone()\n")


def test_prune_remove_between_passes_in_a_cell(shell):
    """prune.remove makes weight_orig (the same Parameter, its hook still on it) the module's weight again: pass 2
    shows it as m.weight with both hooks (the first one's 2nd call), .grad accumulated, and the values without hooks
    of a run of the cell without its two hook lines."""
    assert shell.run_cell(PRUNE_REMOVE_CELL.replace("m.weight_orig.register_hook(lambda g: g * 2)\n", "")
                          .replace("m.weight.register_hook(lambda g: g * 3)\n", "")).success
    without = [shell.user_ns["g1"], shell.user_ns["g2"]]
    result = shell.run_cell("%%lens --as L --no-show\n" + PRUNE_REMOVE_CELL)
    assert result.success, result.error_in_exec
    lens = shell.user_ns["L"]
    first, second = lens.passes
    assert [(c.target, c.invocation) for c in first.hook_calls] == [("m.weight_orig", 1)]
    assert [(c.target, c.invocation) for c in second.hook_calls] == [("m.weight", 2), ("m.weight", 1)]
    assert equal(first.leaf_grads["m.weight_orig"], shell.user_ns["g1"])
    assert equal(second.leaf_grads["m.weight"], shell.user_ns["g2"])
    assert equal(first.grads_without_hooks["m.weight_orig"], without[0])
    assert equal(second.grads_without_hooks["m.weight"], without[1])
    assert any(note.code == "forgot_zero_grad" and "m.weight.grad" in note.message for note in lens.notes)
