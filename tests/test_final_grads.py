"""Each leaf's ``.grad`` as a pass leaves it, and "without hooks" beside it, against plain PyTorch (#19).

Two classes where ``.grad`` changes after AccumulateGrad wrote it, with no hook of its own in between:

* ``DistributedDataParallel`` (a one-process gloo group) writes the all-reduced bucket back into ``.grad`` after
  the engine's last node (or, with ``gradient_as_bucket_view``, from its own C++ hook on AccumulateGrad), through a
  Python communication hook, torch's built-in fp16 one, or none;
* one-element and view gradients adopted without a copy: ``x.sum()`` of a 0-dim leaf, ``x.view(6)`` under
  ``gradient=`` share memory with the seed and with each other, so adding to one ``.grad`` changes another.

Each program runs plainly, under the lens, with logging post-accumulate hooks (what AccumulateGrad wrote), and
without its hooks; every statement is compared: the pass's ``.grad``, "without hooks" (a value, or unknown with a
reason), the grads table's same/differs, each "x.grad written: ..." card and its without-hooks line, and the
drawing's last ``.grad``.
"""

from __future__ import annotations

import itertools
import random
import re
import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
import programs
from autograd_lens.model import GradWritten
from autograd_lens.views.steps import frame, grads_table_html, hook_totals, steps_for

dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def group():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


def _halve(state, bucket):
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda done: done.value()[0] * 0.5)


def _triple_in_place(p):
    p.grad.mul_(3.0)


def run_ddp(config: dict, mode: str) -> dict:
    """One DDP program.  ``mode``: plain, lens, truth (plain + a logging post-accumulate hook registered first on
    each parameter: what AccumulateGrad wrote), nohook (no hook of the program's, logged the same way)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=config["bucket_view"])
    written: list = []
    if mode in ("truth", "nohook"):
        for name, param in (("weight", model.weight), ("bias", model.bias)):
            param.register_post_accumulate_grad_hook(lambda p, name=name: written.append((name, p.grad.clone())))
    if mode != "nohook":
        if config["hook"]:
            model.weight.register_hook(lambda g: g * 2)
        if config["post"]:
            model.bias.register_post_accumulate_grad_hook(_triple_in_place)
    if config["comm"] == "halve":
        ddp.register_comm_hook(state=None, hook=_halve)
    elif config["comm"] == "fp16":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    x = torch.full((2, 3), 0.1)
    grads = []

    def passes():
        for _ in range(config["passes"]):
            ddp(x).sum().backward()
            grads.append({"weight": model.weight.grad.clone(), "bias": model.bias.grad.clone()})

    lens = None
    if mode == "lens":
        with al.Lens(names={"model": model}) as lens:
            passes()
    else:
        passes()
    return {"grads": grads, "written": written, "lens": lens}


CONFIGS = [dict(zip(("comm", "hook", "post", "passes", "bucket_view"), values))
           for values in itertools.product(("none", "halve", "fp16"), (False, True), (False, True), (1, 2),
                                           (False, True))]


def _row_flags(html: str) -> dict[str, str]:
    rows = re.findall(r"<tr[^>]*><td>([^<]*)</td>(?:<td>[^<]*</td>)*?<td>([^<]*)</td></tr>", html)
    return {name: flag for name, flag in rows}


def check_ddp(config: dict) -> tuple[list[str], list[str]]:
    """(false statements, known false statements of the write cards: see test_write_card_...)."""
    plain, lensed, truth, nohook = (run_ddp(config, mode) for mode in ("plain", "lens", "truth", "nohook"))
    problems: list[str] = []
    known: list[str] = []
    lens = lensed["lens"]
    for index, (p, q) in enumerate(zip(plain["grads"], lensed["grads"])):
        if any(not torch.equal(p[k], q[k]) for k in p):
            problems.append(f"pass {index + 1}: .grad differs under the lens")
    assert len(lens.passes) == config["passes"]
    per_pass = len(truth["written"]) // config["passes"]
    for index, bp in enumerate(lens.passes):
        real, unhooked = plain["grads"][index], nohook["grads"][index]
        wrote = dict(truth["written"][index * per_pass:(index + 1) * per_pass])
        wrote_unhooked = dict(nohook["written"][index * per_pass:(index + 1) * per_pass])
        flags = _row_flags(grads_table_html(bp))
        for short in ("weight", "bias"):
            name = f"model.{short}"
            if not torch.equal(bp.leaf_grads[name], real[short]):
                problems.append(f"pass {index + 1}: {name}.grad {bp.leaf_grads[name]} shown, it is {real[short]}")
            if name in bp.unknown:
                if bp.grads_without_hooks[name] is not None or not bp.unknown[name]:
                    problems.append(f"pass {index + 1}: {name} unknown without a reason, or with a value")
                if not flags.get(name, "").startswith("unknown"):
                    problems.append(f"pass {index + 1}: table says {flags.get(name)!r} for unknown {name}")
            else:
                shown = bp.grads_without_hooks[name]
                if not torch.equal(shown, unhooked[short]):
                    problems.append(f"pass {index + 1}: {name} without hooks {shown} shown, it is {unhooked[short]}")
                same = torch.equal(real[short], unhooked[short])
                if flags.get(name) != ("same" if same else "differs"):
                    problems.append(f"pass {index + 1}: table says {flags.get(name)!r} for {name}, it is "
                                    f"{'same' if same else 'differs'}")
        steps = steps_for(bp, hook_totals(lens.passes))
        for step, event in zip(steps[1:], bp.events):
            if not isinstance(event, GradWritten):
                continue
            short = event.name.split(".")[-1]
            if not torch.equal(event.grad, wrote[short]):
                problems.append(f"pass {index + 1}: card {step.title!r}, AccumulateGrad wrote {wrote[short]}")
            text = " ".join(step.lines)
            ends = re.search(r"changes again after this write: it holds (.*?) when the pass ends, (?:the same as "
                             r"without hooks|and without the hooks it would end as (.*?))\.", text)
            if ends:  # what the card says of the end of the pass: plain torch's .grad then, with and without hooks
                if ends.group(1) != al.format_value(real[short]):
                    problems.append(f"pass {index + 1}: {event.name} card says it ends as {ends.group(1)}, it is "
                                    f"{al.format_value(real[short])}")
                if (ends.group(2) or ends.group(1)) != al.format_value(unhooked[short]):
                    problems.append(f"pass {index + 1}: {event.name} card says without hooks it ends as "
                                    f"{ends.group(2) or ends.group(1)}, it is {al.format_value(unhooked[short])}")
            claim = re.search(r"Without the hooks it would be (.*?)\.$", text)
            says_same = "same as without hooks" in text and not ends
            if claim or says_same:
                expected = al.format_value(wrote_unhooked[short])
                value = claim.group(1) if claim else al.format_value(event.grad)
                if value != expected:
                    (known if claim and value == al.format_value(unhooked[short]) else problems).append(
                        f"pass {index + 1}: {event.name} card says without hooks the write is {value}, it is {expected}")
        if not bp.error:
            last = frame(steps, len(steps) - 1)
            for event in bp.events:
                if isinstance(event, GradWritten) and event.node in last.grads:
                    expected = al.format_value(real[event.name.split(".")[-1]], 48)
                    if last.grads[event.node] not in (expected, "not known"):
                        problems.append(f"pass {index + 1}: drawing ends with {event.name}.grad "
                                        f"{last.grads[event.node]}, it is {expected}")
    return problems, known


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_ddp_every_final_grad_and_without_hooks_is_torchs(group, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problems, _ = check_ddp(config)
    assert not problems, "\n".join(problems)


def test_ddp_without_hooks_is_unknown_when_a_hook_changed_what_ddp_then_rewrote(group):
    config = dict(comm="halve", hook=True, post=False, passes=1, bucket_view=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bp = run_ddp(config, "lens")["lens"].passes[0]
    assert bp.grads_without_hooks["model.weight"] is None
    assert "changed after the last write" in bp.unknown["model.weight"] and "_halve" in bp.unknown["model.weight"]


def test_ddp_bucket_view_shows_no_hook_that_did_not_run(group):
    """With gradient_as_bucket_view, DDP's own C++ hook on AccumulateGrad rewrites .grad before the lens's: the
    write is what arrived, not a "<C hook>" on the parameter."""
    config = dict(comm="fp16", hook=False, post=False, passes=1, bucket_view=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bp = run_ddp(config, "lens")["lens"].passes[0]
    assert bp.hook_calls == ()
    write = next(e for e in bp.events if isinstance(e, GradWritten) and e.name == "model.weight")
    assert torch.equal(write.grad, torch.full((1, 3), 0.2))  # two rows of 0.1 arrived: no fp16 rounding yet


def test_write_card_says_ddp_changes_grad_after_the_write_and_compares_the_end_values(group):
    """DDP writes .grad again after its all-reduce, with or without hooks: the write card gives plain torch's .grad
    at the end of the pass (halved by the comm hook) and says it is the same as without hooks."""
    config = dict(comm="halve", hook=False, post=False, passes=1, bucket_view=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, lensed = run_ddp(config, "plain"), run_ddp(config, "lens")
        problems, known = check_ddp(config)
    assert not problems and not known, "\n".join(problems + known)
    cards = [step for step in steps_for(lensed["lens"].passes[0]) if step.title.startswith("model.weight.grad written")]
    assert len(cards) == 1
    final = al.format_value(plain["grads"][0]["weight"])
    assert (f"model.weight.grad changes again after this write: it holds {final} when the pass ends, the same as "
            "without hooks.") in cards[0].lines


# ----------------------------------------------------------------------------- gradients that share memory


class AliasGenerator:
    """Leaves whose gradients autograd adopts as views of the seed or of each other (0-dim ``sum``/``view``,
    ``view(6)`` under ``gradient=``, rows of a ``stack`` or slices of a ``cat`` under ``gradient=``, a 0-dim root under
    the caller's own 0-dim ``gradient=``), beside ordinary ones; hooks that scale, observe, keep or edit ``.grad`` in
    place on some; 2-3 passes, a ``gradient=`` tensor fresh or reused, ``.grad = None`` between passes."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed

    def generate(self) -> programs.Program:
        rng = self.rng
        lines = [f"torch.manual_seed({self.seed})"]
        flat = rng.random() < 0.5  # (2, 3) leaves seen as (6,) under gradient=, else 0-dim leaves
        # parts: each leaf gets a part of one gradient= tensor (a row of stack's, a slice of cat's), not all of it
        parts = not flat and rng.random() < 0.4
        count = rng.randint(2, 3)
        leaves = [f"x{i}" for i in range(count)]
        for name in leaves:
            lines.append(f"{name} = torch.randn({(2, 3) if flat else ()}, requires_grad=True)")
        terms = []
        for name in leaves:
            form = rng.choice(["view", "view", "sum", "mul"] if not flat else ["view", "view", "mul"])
            terms.append({"view": f"{name}.view({'6' if flat else '()'})", "sum": f"{name}.sum()",
                          "mul": f"({name} * 2.0).view({'6' if flat else '()'})"}[form])
        for index in range(rng.randint(1, 3)):
            name = rng.choice(leaves)
            kind = rng.choice(["scale", "observe", "keep", "after", "after_observe"])
            if kind.startswith("after"):
                mode = "inplace" if kind == "after" else "observe"
                lines.append(f"REG({name}, 'register_post_accumulate_grad_hook', make_after('h{index}', {mode!r}))")
            else:
                lines.append(f"REG({name}, 'register_hook', make_hook('h{index}', {kind!r}))")
        if parts:
            joined = rng.choice(["stack", "cat"])
            if joined == "stack":
                lines.append(f"out = torch.stack([{', '.join(terms)}])")
            else:
                lines.append(f"out = torch.cat([{', '.join(term + '.view(1)' for term in terms)}])")
        else:
            lines.append(f"out = {' + '.join(terms)}")
        size = count if parts else 6
        # a 0-dim root: backward() makes a new seed each time, unless the caller passes its own (fresh or reused)
        scalar_seed = not (flat or parts) and rng.random() < 0.4
        new_seed = "torch.tensor(0.75)" if scalar_seed else f"torch.linspace(0.5, 1.5, {size})"
        reuse = (flat or parts or scalar_seed) and rng.random() < 0.5
        if reuse:
            lines.append(f"g = {new_seed}")
        passes = rng.randint(2, 3)
        for index in range(passes):
            retain = ", retain_graph=True" if index < passes - 1 else ""
            gradient = ("g" if reuse else new_seed) if flat or parts or scalar_seed else None
            lines.append(f"PASS('backward', out{', gradient=' + gradient if gradient else ''}{retain})")
            if index < passes - 1 and rng.random() < 0.2:
                lines.append(f"{rng.choice(leaves)}.grad = None")
        return programs.Program(lines, leaves, self.seed)


SHARED_CASES = {
    "two 0-dim sums, a hook on one": ["x0 = torch.randn((), requires_grad=True)",
                                      "x1 = torch.randn((), requires_grad=True)",
                                      "REG(x0, 'register_hook', make_hook('h0', 'scale'))",
                                      "out = x0.sum() + x1.sum()",
                                      "PASS('backward', out, retain_graph=True)", "PASS('backward', out)"],
    "views of a reused gradient=": ["x0 = torch.randn((2, 3), requires_grad=True)",
                                    "x1 = torch.randn((2, 3), requires_grad=True)", "g = torch.ones(6)",
                                    "REG(x0, 'register_hook', make_hook('h0', 'scale'))",
                                    "out = x0.view(6) + x1.view(6)",
                                    "PASS('backward', out, gradient=g, retain_graph=True)",
                                    "PASS('backward', out, gradient=g)"],
    "a post-accumulate hook halves memory two leaves share": [
        "x0 = torch.randn((), requires_grad=True)", "x1 = torch.randn((), requires_grad=True)",
        "REG(x1, 'register_post_accumulate_grad_hook', make_after('h0', 'inplace'))",
        "out = x0.sum() + x1.sum()", "PASS('backward', out, retain_graph=True)", "PASS('backward', out)"],
    "a 0-dim root under the caller's own reused gradient=": [
        "x0 = torch.randn((), requires_grad=True)", "x1 = torch.randn((), requires_grad=True)",
        "REG(x0, 'register_hook', make_hook('h0', 'scale'))", "out = x0.sum()", "g = torch.tensor(0.75)",
        "PASS('backward', out, gradient=g, retain_graph=True)", "PASS('backward', out, gradient=g, retain_graph=True)",
        "PASS('backward', out, gradient=g)"],
    "a hook that keeps its gradient stops the adoption": [
        "x0 = torch.randn((), requires_grad=True)", "x1 = torch.randn((), requires_grad=True)",
        "REG(x0, 'register_hook', make_hook('h0', 'keep'))",
        "out = x0.sum() + x1.sum()", "PASS('backward', out, retain_graph=True)", "PASS('backward', out)"],
}


@pytest.mark.parametrize("case", sorted(SHARED_CASES))
def test_shared_gradients_shown_as_torch_has_them(case):
    program = programs.Program(["torch.manual_seed(0)"] + SHARED_CASES[case], ["x0", "x1"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert programs.compare(program) == []


def test_shared_gradients_without_hooks_unknown_with_the_reason():
    program = programs.Program(["torch.manual_seed(0)"] + SHARED_CASES["two 0-dim sums, a hook on one"], ["x0", "x1"])
    lens = programs.run(program, "lens").lens
    first, second = lens.passes
    assert first.unknown == {}  # adopted in this pass: nothing was added through shared memory yet
    assert set(second.unknown) == {"x0", "x1"} and "shares memory" in second.unknown["x1"]


def test_a_single_scalar_leaf_keeps_its_value_without_hooks():
    """A 0-dim leaf whose .grad views the seed alone shares nothing: two passes keep a value, not unknown."""
    program = programs.Program(["torch.manual_seed(0)", "x0 = torch.randn((), requires_grad=True)",
                                "REG(x0, 'register_hook', make_hook('h0', 'scale'))", "out = x0.sum() * 1.0",
                                "PASS('backward', out, retain_graph=True)", "PASS('backward', out)"], ["x0"])
    lens = programs.run(program, "lens").lens
    assert lens.passes[1].unknown == {} and programs.compare(program) == []


@pytest.mark.parametrize("start", range(0, 300, 50))
def test_generated_shared_gradient_programs(start):
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(start, start + 50):
            program = AliasGenerator(seed).generate()
            problems = programs.compare(program)
            if problems:
                failures.append(programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:3])
