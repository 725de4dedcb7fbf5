"""The statements of README.md and docs/*.md that tests/test_readme.py (which runs their Python blocks) and
tests/test_layout.py (module map, import circles, module sizes) do not check: what the text says a snippet shows,
the magics' options and defaults as the docs use them, the guarantees against plain torch (each with an
adversarial program), the torch behaviour the docs state, and the direction of imports docs/architecture.md gives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import autograd_lens as al
from autograd_lens.model import TensorSummary
from conftest import Double
from test_layout import PACKAGE, _imports, _map_block, _modules
from test_readme import GUIDE, README, ROOT, lines_outside_fences, read

GUARANTEES = os.path.join(ROOT, "docs", "guarantees.md")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
DOCS = [README, *(os.path.join(ROOT, "docs", page) for page in
                  ("guide.md", "guarantees.md", "instructors.md", "course.md", "architecture.md")),
        os.path.join(ROOT, "notebooks", "README.md")]

HOOK_CELL = """%%lens --no-show
x = torch.tensor(2.0, requires_grad=True)
y = x ** 2
y.register_hook(lambda g: g * 0.5)
out = y * 3 + y * 2
out.backward()
"""


# --- what the README's and the guide's snippets say they show ---------------------------------------------------


def test_the_hook_example_shows_what_the_text_says(shell):
    """README/guide: the HookCall repr in the comment, grads without hooks 20, the card naming cell line 5,
    and `%lens_graph out`: 'x, y, z, w, out with values, MulBackward0 …, the constants 3 and 2'."""
    assert shell.run_cell(HOOK_CELL).success
    lens = shell.user_ns["_lens"]
    shown = repr(lens.hook_calls[0])
    for part in ("HookCall(hook='<lambda>', kind='tensor', target='y', ", "grad_in=tensor(5.), grad_out=tensor(2.5000), "
                 "modified=True, "):
        assert part in shown
    assert repr(lens.passes[0].grads_without_hooks["x"]) == "tensor(20.)"
    page = lens.to_html()
    assert "Made by cell line 5: out = y * 3 + y * 2" in page
    assert page.index("add → out (AddBackward0) runs") < page.index("Made by cell line 5")
    shell.run_cell("x = torch.tensor(2.0, requires_grad=True)\ny = x ** 2\nz = y * 3\nw = y * 2\nout = z + w")
    dot = shell.run_cell("%lens_graph out --dot").success and shell.user_ns["out"]
    assert dot is not None
    text = al.graph(shell.user_ns["out"], names=shell.user_ns).to_dot()
    for label in ('"x|data 2.0', '"y|data 4.0', '"z|data 12.0', '"w|data 8.0', '"out|data 20.0', "MulBackward0",
                  "label=3 ", "label=2 "):
        assert label in text, label


def _options(magic) -> dict[str, object]:
    parser = magic.parser
    return {option: action.default for action in parser._actions for option in action.option_strings}


def test_every_option_the_docs_use_is_a_magic_option_with_the_default_they_give(shell):
    magics = shell.magics_manager.registry["LensMagics"]
    cell, line = _options(magics.lens), _options(magics.lens_graph)
    used: dict[str, set[str]] = {"%%lens": set(), "%lens_graph": set()}
    for path in DOCS:
        for text in lines_outside_fences(read(path)):
            for magic, rest in re.findall(r"`(%%lens|%lens_graph)\b([^`]*)`", text):
                used[magic].update(re.findall(r"(--[a-z][a-z-]*)", rest))
    assert used["%%lens"] >= {"--modules", "--predict", "--plot", "--why"} and "--expand" in used["%lens_graph"]
    assert used["%%lens"] - set(cell) == set() and used["%lens_graph"] - set(line) == set()
    # options named alone (`--as NAME`, `--no-fold`) in the README and the guide: a magic's, or python -m autograd_lens's
    alone = {option for path in (README, GUIDE) for option in re.findall(r"`(--[a-z][a-z-]*)[^`]*`", read(path))}
    command_line = {"--output", "--modules", "--help"}  # python -m autograd_lens's (argparse adds --help)
    assert all(f'"{option}"' in read(os.path.join(ROOT, "autograd_lens", "__main__.py")) for option in command_line - {"--help"})
    assert alone >= {"--as", "--no-fold"} and alone - set(cell) - set(line) - command_line == set(), alone
    # the documented defaults, in the magics, the Lens and the help texts
    import inspect

    lens = inspect.signature(al.Lens).parameters
    assert (cell["--store-limit"], cell["--max-elements"], cell["--max-nodes"], cell["--as"]) == (4096, 16, 300, "_lens")
    assert (lens["store_limit"].default, lens["max_elements"].default, lens["max_nodes"].default) == (4096, 16, 300)
    assert lens["memory_budget"].default == 256 * 2**20 and not lens["modules"].default and not lens["why"].default
    assert "elements (default 4096)" in read(GUARANTEES) and "(default 256 MiB)" in read(GUARANTEES)
    assert set(cell) >= {"--plot"} and "flow|timeline|before-after|with-without" in read(GUIDE)
    plot = next(a for a in magics.lens.parser._actions if "--plot" in a.option_strings)
    assert tuple(plot.choices) == ("flow", "timeline", "before-after", "with-without")
    assert {"--direction", "--legend", "--no-saved", "--dot"} <= set(line)


BAD_LINES = {  # what the line says, and what the message tells the user to do instead
    "--as 1x": "e.g. --as trace", "--as print": "e.g. --as trace", "--as class": "e.g. --as trace",
    "--max-nodes 0": "e.g. --max-nodes 300", "--max-elements -1": "e.g. --max-elements 16",
    "--store-limit -5": "e.g. --store-limit 4096", "--plot bogus": "choose from 'flow'",
    "--max-nodes abc": "invalid int value", "--bogus": "unrecognized arguments: --bogus",
    "--why": "expected one argument",
}


def test_bad_magic_input_says_what_to_do_and_leaves_the_kernel_usable(shell, capsys):
    engine = torch.autograd._engine_run_backward
    body = "\nx = torch.tensor(2.0, requires_grad=True)\n(x * x).backward()\nran = True\n"
    for line, advice in BAD_LINES.items():
        shell.user_ns.pop("ran", None)
        result = shell.run_cell(f"%%lens {line}{body}", store_history=False)
        said = capsys.readouterr()
        message = said.out + said.err + str(result.error_in_exec or "")
        assert advice in message, (line, message)
        assert not result.success, line  # the cell did not run: it fails, as IPython's own option errors do
        assert "ran" not in shell.user_ns and torch.autograd._engine_run_backward is engine, line
        assert "Traceback" not in message, line
    for line, said_text in (("%lens_graph nothere", "could not evaluate 'nothere': NameError"),
                            ("%lens_graph 1+", "could not evaluate '1+': SyntaxError"),
                            ("%lens_graph out --max-nodes 0", "e.g. --max-nodes 300")):
        shell.run_cell("out = (torch.ones(2, requires_grad=True) * 2).sum()", store_history=False)
        result = shell.run_cell(line, store_history=False)
        said = capsys.readouterr()
        assert not result.success, line  # fails the cell, as %%lens's bad lines do
        assert said_text in said.out + said.err + str(result.error_in_exec or ""), line
    assert shell.run_cell(HOOK_CELL).success  # the kernel records as before
    (call,) = shell.user_ns["_lens"].hook_calls
    assert float(call.grad_out) == 2.5 and float(shell.user_ns["x"].grad) == 10.0


def test_recipes_guide_claims(shell):
    """Kinds, built-in hooks, 'all entries or none', errors that say what to do, the stepper's hook name."""
    from autograd_lens import RecipeError

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    with pytest.raises(RecipeError, match=r"registered: clip, log_norm, nan_guard, scale, zero"):
        al.Recipe().add("0.weight", "tensor", "nope").apply(model)
    with pytest.raises(RecipeError, match="kind must be one of tensor, post_accumulate_grad, module_full, "
                                          "module_full_pre"):
        al.Recipe().add("0.weight", "bogus", "clip", max=1.0).apply(model)
    with pytest.raises(RecipeError, match="the model has no parameter 'nothere'"):  # all or none: the first is off
        al.Recipe().add("0.bias", "tensor", "zero").add("nothere", "tensor", "clip", max=1.0).apply(model)
    assert not model[0].bias._backward_hooks
    recipe = al.Recipe().add("0.weight", "tensor", "clip", max=0.5).add("2", "module_full", "scale", factor=2.0)
    handles = recipe.apply(model)
    with al.Lens(names={"model": model}) as lens:
        model(torch.randn(2, 3)).sum().backward()
    assert {(c.hook, c.kind) for c in lens.hook_calls} == {("clip(max=0.5)", "tensor"), ("scale(factor=2.0)", "module_full")}
    assert "clip(max=0.5)" in lens.to_html()
    assert float(model[0].weight.grad.abs().max()) <= 0.5
    handles.remove()
    assert not model[0].weight._backward_hooks


# --- guarantees, each against plain torch ---------------------------------------------------------------------


def _adversarial(lens_cls=None):
    """Hooks that edit in place (leaking into a sibling branch), keep references, read a non-leaf's .grad (a
    warning), a complex leaf whose gradient torch adopts lazily conjugated, a saved-tensor unpack hook counting, a
    retained second pass whose hook raises.  Returns everything a user could see."""
    seen: dict = {"calls": [], "unpacks": 0, "kept": []}
    torch.manual_seed(0)
    a = torch.randn(3, requires_grad=True)
    c = torch.randn(3, dtype=torch.complex64, requires_grad=True)

    def unpack(t):
        seen["unpacks"] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        h = a * 2
        left, right = h * 3, h.exp()
    zc = (c * 2).conj()

    def edit(g):
        seen["calls"].append(("edit", g.clone()))
        g.mul_(2)  # in place: AddBackward0 hands the same tensor to the sibling

    def keep(g):
        seen["kept"].append(g)
        _ = h.grad  # a non-leaf's .grad: torch warns
        if len(seen["calls"]) > 1:
            raise ValueError("second pass refused")
        seen["calls"].append(("keep", g.clone()))
        return g * 0.5

    left.register_hook(edit)
    h.register_hook(keep)
    loss = ((left + right) ** 2).sum() + zc.real.sum()
    errors = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if lens_cls is None:
            loss.backward(retain_graph=True)
            try:
                loss.backward()
            except ValueError as error:
                errors.append(str(error))
        else:
            with lens_cls() as lens:
                loss.backward(retain_graph=True)
                try:
                    loss.backward()
                except ValueError as error:
                    errors.append(str(error))
            seen["lens"] = lens
    seen["warnings"] = [(w.category, str(w.message)) for w in caught if "autograd_lens" not in str(w.message)]
    seen.update(a=a, c=c, errors=errors, grads=(a.grad.clone(), c.grad.clone()), conj=c.grad.is_conj())
    return seen


def test_it_changes_nothing_it_observes_on_an_adversarial_program():
    plain, traced = _adversarial(), _adversarial(al.Lens)
    assert [(k, v.tolist()) for k, v in plain["calls"]] == [(k, v.tolist()) for k, v in traced["calls"]]
    assert plain["unpacks"] == traced["unpacks"] and plain["errors"] == traced["errors"] == ["second pass refused"]
    assert all(torch.equal(p, q) for p, q in zip(plain["grads"], traced["grads"]))
    assert plain["conj"] == traced["conj"]
    assert plain["warnings"] == traced["warnings"] and plain["warnings"]
    assert [g.tolist() for g in plain["kept"]] == [g.tolist() for g in traced["kept"]]
    # and what it shows of it is what torch did
    lens = traced["lens"]
    first = [c for c in lens.passes[0].hook_calls]
    assert [c.hook for c in first] == ["edit", "keep"] and first[0].edited_in_place
    assert lens.passes[1].error is not None and "second pass refused" in str(lens.passes[1].error)


@pytest.mark.parametrize("method", ["_record_node", "_sent", "_begin", "_end"])
def test_no_exception_of_the_lens_reaches_backward(monkeypatch, method):
    """'a failure to record becomes a note on the pass ("recording incomplete at …"), shown on the stepper's first
    step': the lens made to fail at its second call of `method`, inside the engine, with a modifying hook."""
    from autograd_lens.capture import observe

    def program():
        torch.manual_seed(1)
        w, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        h = w * 2 + b
        h.register_hook(lambda g: g * 3)
        b.register_hook(lambda g: g.clamp(-0.5, 0.5))
        return w, b, (h.tanh() * h).sum()

    w0, b0, loss = program()
    loss.backward()
    with al.Lens():  # the once-per-process self-check, before anything is broken
        program()[2].backward()
    original, count = getattr(observe.PassObserver, method), [0]

    def broken(self, *args, **kwargs):
        count[0] += 1
        if count[0] == 2:
            raise RuntimeError(f"lens bug in {method}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(observe.PassObserver, method, broken)
    w, b, loss = program()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with al.Lens() as lens:
            loss.backward()
        notes = [str(n) for n in lens.passes[0].notes]
    assert count[0] >= 2
    assert torch.equal(w.grad, w0.grad) and torch.equal(b.grad, b0.grad)
    assert any(n.startswith("recording incomplete at ") and f"lens bug in {method}" in n for n in notes), notes
    assert f"lens bug in {method}" in lens.to_html()
    assert len([x for x in caught if "autograd_lens" in str(x.message)]) <= 1


def test_it_leaves_nothing_behind_on_keyboard_interrupt():
    engine = torch.autograd._engine_run_backward
    globals_before = [len(getattr(torch.nn.modules.module, name)) for name in
                      ("_global_backward_hooks", "_global_backward_pre_hooks", "_global_forward_hooks")]
    x = torch.tensor(3.0, requires_grad=True)
    interrupt = KeyboardInterrupt("user pressed stop")

    def stop(g):
        raise interrupt

    y = x * x
    y.register_hook(stop)
    with pytest.raises(KeyboardInterrupt) as raised:
        with al.Lens():
            y.backward()
    assert raised.value is interrupt and torch.autograd._engine_run_backward is engine
    assert [len(getattr(torch.nn.modules.module, name)) for name in
            ("_global_backward_hooks", "_global_backward_pre_hooks", "_global_forward_hooks")] == globals_before
    z = x * 4
    fn = z.grad_fn
    with al.Lens():
        z.backward(retain_graph=True)
    assert z.grad_fn is fn and fn.next_functions[0][0].name() == "torch::autograd::AccumulateGrad"
    calls = []
    fn.register_hook(lambda gi, go: calls.append(1))
    z.backward()  # no hook of the lens is left to fire: only the user's
    assert calls == [1] and float(x.grad) == 8.0


def test_bounded_memory_keeps_summaries_past_the_budget():
    """guarantees.md: past memory_budget the values kept are summaries (shape, dtype, min, max, norm, first
    values), and lens.passes.clear() lets them go; store_limit makes a summary of a larger gradient."""
    w = torch.randn(100, requires_grad=True)
    with al.Lens(memory_budget=1000) as lens:
        for _ in range(3):
            w.grad = None
            (w * 2).sum().backward()
    first, *later = lens.passes
    assert first.kept_bytes > 1000 and all(p.kept_bytes == 0 for p in later)
    run = later[-1].node_runs[-1]
    assert isinstance(run.grad_out[0], TensorSummary)
    assert (run.grad_out[0].shape, run.grad_out[0].min, run.grad_out[0].max) == ((100,), 2.0, 2.0)
    assert any("memory_budget" in str(n) and "summaries" in str(n) for n in later[0].notes)
    lens.passes.clear()
    with lens:
        w.grad = None
        (w * 2).sum().backward()
    assert lens.passes[0].kept_bytes > 1000 and isinstance(lens.passes[0].node_runs[-1].grad_out[0], torch.Tensor)
    text = " ".join(read(GUARANTEES).split())
    assert "only shapes" not in text and "shapes only" not in text and "summaries (shape, dtype, min, max, norm" in text
    big = torch.randn(4097, requires_grad=True)
    with al.Lens() as lens:
        (big * 2).sum().backward()
    assert isinstance(lens.passes[0].leaf_grads["big"], TensorSummary)


def test_a_training_loop_stops_adding_copies_once_the_budget_is_reached():
    """guarantees.md: past memory_budget what a pass keeps is summaries, its leaves' final .grad and its hook calls'
    values included (tests/test_memory_budget.py checks them against torch)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_memory_budget import _held as _bytes_reachable  # the tensors every pass's values hold

    held = []
    for passes in (20, 40):
        w = torch.randn(4000, requires_grad=True)
        with al.Lens(memory_budget=100_000) as lens:
            for _ in range(passes):
                w.grad = None
                y = w * 2
                y.register_hook(lambda g: g * 2)
                y.sum().backward()
        held.append(_bytes_reachable(lens))
    assert held[1] <= held[0] * 1.1, held


def test_without_hooks_is_unknown_with_why_past_a_python_backward():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = Double.apply(x)
    y.register_hook(lambda g: g * 10)
    with al.Lens() as lens:
        (y * 3).sum().backward()
    p = lens.passes[0]
    assert torch.equal(x.grad, torch.tensor([60.0, 60.0]))
    assert p.grads_without_hooks["x"] is None and "Python" in p.unknown["x"]


DETERMINISM = """
import hashlib, sys, torch, autograd_lens as al, autograd_lens.views.display as d
print(d._WARMED, [m for m in d.WARM_MODULES + ("wasmfast",) if "autograd_lens.views." + m in sys.modules])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
model[2].register_full_backward_hook(lambda m, gi, go: None)
x = torch.randn(2, 3, requires_grad=True)
h = model[0](x)
h.register_hook(lambda g: g * 2)
a, b = h.split(2, dim=1)
b.register_hook(lambda g: None)
with al.Lens(modules=True) as lens:
    loss = model[2](model[1](torch.cat([a, b * 3], 1))).pow(2).sum()
    loss.backward()
print(hashlib.sha256((lens.to_html() + al.graph(loss, names=globals()).to_dot()).encode()).hexdigest())
"""


def test_output_is_deterministic_and_import_loads_no_renderer():
    """'DOT, SVG and HTML contain no ids, addresses or times: the same code gives the same bytes', checked where it
    is most likely to break: two processes with other hash seeds (set orders, ids).  And guide.md: %load_ext loads
    the first picture's renderer and modules; 'a plain import autograd_lens loads none of it'."""
    outputs = [subprocess.run([sys.executable, "-c", DETERMINISM], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": ROOT, "PYTHONHASHSEED": seed}).stdout.split("\n")
               for seed in ("1", "2")]
    assert outputs[0][0] == "[] []" and outputs[0] == outputs[1] and len(outputs[0][1]) == 64, outputs


# --- what the docs say torch does (torch 2.13) --------------------------------------------------------------------


def test_torch_runs_the_hooks_a_dict_held_when_its_hooks_started():
    """guarantees.md: a hook that removes a later one on the same tensor, or adds one there, changes the next pass
    only; with the lens, the calls are the same."""
    def program(lens):
        x = torch.tensor(2.0, requires_grad=True)
        y = x * 3
        calls, later = [], []

        def first(g):
            calls.append("first")
            later[0].remove()
            y.register_hook(lambda g: calls.append("added"))

        y.register_hook(first)
        later.append(y.register_hook(lambda g: calls.append("later")))
        out = y * y
        if lens:
            with al.Lens() as traced:
                out.backward(retain_graph=True)
                calls.append("|")
                out.backward()
            return calls, [c.hook for c in traced.hook_calls]
        out.backward(retain_graph=True)
        calls.append("|")
        out.backward()
        return calls, None

    plain, (traced, shown) = program(False), program(True)
    assert plain[0] == traced == ["first", "later", "|", "first", "added"]
    assert shown == ["first", "<lambda>", "first", "<lambda>"]


def test_torch_facts_the_docs_state():
    # a node post-hook registered while its node runs (from an unpack hook) receives () as the node's inputs
    got = []

    def unpack(t):
        if not got:
            torch._C._current_autograd_node().register_hook(lambda gi, go: got.append(go))
            got.append("registered")
        return t

    x = torch.tensor(2.0, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = x * x
    with al.Lens():
        y.backward()
    assert got == ["registered", ()]
    # clip_grad_norm_ writes every .grad, also when it leaves the values as they are
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 0.1)
    version = p.grad._version
    torch.nn.utils.clip_grad_norm_([p], 100.0)
    assert p.grad._version > version and torch.equal(p.grad, torch.full((3,), 0.1))
    # a module backward hook changes MultiheadAttention's forward: it no longer sees q is k is v
    import torch.nn.modules.activation as activation

    seen, original = [], activation.F.multi_head_attention_forward

    def spy(q, k, v, *args, **kwargs):
        seen.append(q is k is v)
        return original(q, k, v, *args, **kwargs)

    attention, inputs = torch.nn.MultiheadAttention(4, 1, batch_first=True), torch.randn(1, 3, 4, requires_grad=True)
    activation.F.multi_head_attention_forward = spy
    try:
        attention(inputs, inputs, inputs)
        attention.register_full_backward_hook(lambda *args: None)
        attention(inputs, inputs, inputs)
    finally:
        activation.F.multi_head_attention_forward = original
    assert seen == [True, False]
    # hooks are not in a state_dict, and torch.load refuses a pickled hook object by default
    import io
    import pickle

    layer = torch.nn.Linear(2, 2)
    layer.weight.register_hook(lambda g: g)
    assert set(layer.state_dict()) == {"weight", "bias"}
    buffer = io.BytesIO()
    torch.save({"hook": al.Recipe()}, buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        torch.load(buffer)


# --- docs/architecture.md: who imports whom -----------------------------------------------------------------------


def _cross_imports() -> dict[tuple[str, str], set[str]]:
    modules = _modules()

    def part(name: str) -> str:
        pieces = name.split(".")
        return pieces[1] if len(pieces) > 1 else "autograd_lens"

    found: dict[tuple[str, str], set[str]] = {}
    for name, path in modules.items():
        for other in _imports(name, path, modules):
            if part(name) != part(other):
                found.setdefault((part(name), part(other)), set()).add(f"{name[14:]} -> {other[14:]}")
    return found


def test_the_import_directions_architecture_md_gives():
    text = read(ARCHITECTURE)
    edges = _cross_imports()
    assert "## Imports" in text
    # model/ holds plain records: it imports numbers.py only, nothing of capture/, views/, debug/
    assert {to for (frm, to) in edges if frm == "model"} == {"numbers"}
    # views/ reads two things of capture/: entry.py's collector pause and inventory.py's note text
    assert edges[("views", "capture")] == {"views.display -> capture.entry", "views.fold -> capture.entry",
                                           "views.steps -> capture.inventory"}
    # capture/ reaches views/ only from showing.py (how a Lens shows itself, imported when it is shown)
    assert {edge.split(" -> ")[0] for edge in edges[("capture", "views")]} == {"capture.showing"}
    assert {edge.split(" -> ")[0] for edge in edges[("capture", "debug")]} == {"capture.showing", "capture.tracer"}
    assert {edge.split(" -> ")[0] for edge in edges[("views", "debug")]} == {"views.marks"}
    assert {edge.split(" -> ")[1] for edge in edges[("debug", "capture")]} <= {"capture.walk", "capture.saved",
                                                                              "capture.snapshot"}
    for sentence in ("model/ imports nothing of the package but numbers.py",
                     "views/ imports two things of capture/", "capture/ imports views/ only in showing.py"):
        assert sentence in " ".join(text.split()), sentence


# --- the guide's tables: note codes, hook kinds, what is recorded ---------------------------------------------------


def test_the_guides_tables_name_what_the_code_has():
    import dataclasses

    from autograd_lens.model import BackwardPass, HookCall
    from autograd_lens.model.passes import HOOK_KINDS
    from autograd_lens.notes import MESSAGES

    guide = read(GUIDE)
    notes_table = guide[guide.index("## Notes on classic mistakes"):guide.index("## What is recorded")]
    assert sorted(re.findall(r"^\| `(\w+)` \|", notes_table, re.M)) == sorted(MESSAGES)
    kinds = guide[guide.index("Hook kinds: "):guide.index("Hooks registered before the Lens started")]
    named = re.findall(r"`(\w+)`", kinds)
    assert [k for k in HOOK_KINDS if not k.startswith("global_module_")] == named
    assert "the three `global_module_*`" in kinds and sum(k.startswith("global_module_") for k in HOOK_KINDS) == 3
    listed = guide[guide.index("lens.passes                        # [BackwardPass]"):guide.index("lens.hook_calls    ")]
    fields = {f.name for f in dataclasses.fields(BackwardPass)} | set(dir(BackwardPass))
    words = re.findall(r"\b([a-z_]+)\b(?![^(]*\))", listed.split("#", 1)[1])
    assert {w for w in words if "_" in w or w in ("graph", "events", "added", "unknown", "notes", "sources", "groups")} \
        <= fields
    record = guide[guide.index("| `HookCall` |"):guide.index("| `GradWritten` |")]
    assert set(re.findall(r"`(\w+)`", record)) - {"HookCall"} <= {f.name for f in dataclasses.fields(HookCall)}
    # an untraced kind of pass, as the table says: torch's own result, a note counting it
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        got = torch.func.grad(lambda t: (t * t).sum())(x)
    assert torch.equal(got, torch.tensor([2.0, 4.0])) and [n.code for n in lens.notes] == ["untraced_pass"]
    assert "torch.func transform" in lens.notes[0].message and "once" in lens.notes[0].message


def test_the_why_answers_have_the_fields_the_guide_names():
    b = torch.tensor([1.0, 2.0], requires_grad=True)
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens(why=True) as lens:
        ((b * v.detach()).sum() + (b * b).sum()).backward()
        torch.log(b * 0).sum().backward()
    reason = lens.passes[0].unreached["v"]
    assert reason.code == "detached" and ".detach()" in reason.text and reason.at
    assert lens.passes[0].first_nonfinite is None and lens.passes[1].first_nonfinite.name == "LogBackward0"
    paths = lens.paths_to("b", 0)
    assert paths.hooks == "" and all(path.nodes[-1] == "b" for path in paths.paths)
    assert len(paths.paths) == 3  # b * v, and b * b twice (each of its operands)
    assert torch.equal(sum(path.contribution for path in paths.paths), torch.tensor([3.0, 6.0]))
    b.grad = None
    with al.Lens(why=True) as lens:  # "where the pass's hooks changed what the leaf received, PathSet.hooks ... say so"
        h = b * 3
        h.register_hook(lambda g: g * 2)
        h.sum().backward()
    paths = lens.paths_to("b")
    assert torch.equal(paths.total, torch.tensor([3.0, 3.0])) and "gave b [6.0, 6.0]" in paths.hooks
    assert paths.text().rstrip().splitlines()[-1].endswith(paths.hooks)


# --- python -m autograd_lens: "Arguments after the script are passed on to it" -----------------------------------


def test_the_command_line_passes_the_scripts_own_options_on(tmp_path, monkeypatch, capsys):
    """README/guide: `python -m autograd_lens train.py -o trace.html` (the lens's options right after the script),
    and its help: 'Arguments after the script are passed on to it'.  Before the fix, a script's `--out x.txt` was
    taken for the lens's --output (argparse's abbreviations: the page overwrote x.txt), its `--help` printed the
    lens's help and never ran the script, and `--` reached it as an argument."""
    from autograd_lens.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        "import sys, torch\nprint('ARGS', sys.argv[1:])\nx = torch.tensor(2.0, requires_grad=True)\n"
        "(x * x).backward()\n")

    def run(*argv):
        assert main(["train.py", *argv]) == 0
        return capsys.readouterr().out

    said = run("-o", "page.html", "--lr", "3")
    assert "ARGS ['--lr', '3']" in said and (tmp_path / "page.html").exists()
    said = run("--out", "x.txt", "--modules")
    assert "ARGS ['--out', 'x.txt', '--modules']" in said and not (tmp_path / "x.txt").exists()
    assert "ARGS ['--help']" in run("--help") and "ARGS ['-o', 'mine']" in run("--", "-o", "mine")
    assert "ARGS ['--lr', '3', '-o', 'y.html']" in run("--lr", "3", "-o", "y.html")
    assert main(["--output", "z.html", "--modules", "train.py", "--", "-o", "w"]) == 0
    assert "ARGS ['-o', 'w']" in capsys.readouterr().out and (tmp_path / "z.html").exists()
    assert main(["train.py", "--modules", "--output=v.html", "x"]) == 0
    assert "ARGS ['x']" in capsys.readouterr().out and (tmp_path / "v.html").exists()


def test_without_hooks_leaves_out_hooks_registered_before_the_lens():
    """BackwardPass's docstring said 'had no hook been registered since the Lens started'; the guarantee (and the
    code) is 'had no hook run': a hook registered before the Lens is left out too."""
    from autograd_lens.model import BackwardPass

    x = torch.tensor(2.0, requires_grad=True)
    y = x**2
    y.register_hook(lambda g: g * 0.5)
    out = y * 3 + y * 2
    with al.Lens() as lens:
        out.backward()
    assert float(x.grad) == 10.0 and float(lens.passes[0].grads_without_hooks["x"]) == 20.0
    assert "had no hook run since the ``Lens`` started (hooks\n    registered before it included" in BackwardPass.__doc__


def test_collector_renderer_and_module_hooks_as_the_docs_say(monkeypatch):
    import gc

    from torch.nn.modules import module as torch_module

    # "The garbage collector is as you left it wherever your code runs"
    x = torch.tensor(2.0, requires_grad=True)
    seen = []
    try:
        for enabled in (False, True):
            (gc.enable if enabled else gc.disable)()
            y = x * x
            y.register_hook(lambda g: seen.append(gc.isenabled()))
            with al.Lens():
                y.backward()
            assert seen[-1] is enabled and gc.isenabled() is enabled
    finally:
        gc.enable()
    # "a bad AUTOGRAD_LENS_RENDERER ... a readable fallback and one line naming the cause"; render() raises
    # GraphvizUnavailableError with the install commands
    graph = al.graph(x * 3, names={"x": x})
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "bogus")
    html = graph._repr_mimebundle_()["text/html"]
    assert "AUTOGRAD_LENS_RENDERER must be one of" in html and "not &#x27;bogus&#x27;" in html
    monkeypatch.setenv("AUTOGRAD_LENS_RENDERER", "none")
    with pytest.raises(al.GraphvizUnavailableError, match=r"(?s)switched off.*pip install .*apt-get install graphviz"):
        graph.render("never.svg")
    # --modules: "two global forward hooks for the length of the cell (returning None ...)", none after it
    before = (len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks))
    during = []
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    with al.Lens(modules=True) as lens:
        during.append((len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks)))
        model(torch.ones(1, 2)).sum().backward()
    assert sum(during[0]) - sum(before) == 2
    assert (len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks)) == before
    assert not torch_module._global_backward_hooks and not torch_module._global_backward_pre_hooks
    assert {(g.path, g.kind) for g in lens.passes[0].groups} >= {("model.0", "Linear"), ("model.1", "Tanh")}


def test_exercises_and_stepper_as_the_course_pages_say(capsys, tmp_path):
    """notebooks/README.md: check() says 'Right' or 'Not quite' and the rule, never the value (also for answers of
    the wrong form); docs/course.md: predict mode in the static page; guide.md: the widget's step and pass_index."""
    from autograd_lens.exercises import Exercise

    exercise = Exercise("x.grad?", program="x = torch.tensor([1.5, 2.5], requires_grad=True)\n(x ** 2).sum().backward()",
                        value="x.grad", rule="The derivative of x² is 2x.")
    for answer in (None, 3, "RuntimeError", torch.tensor([3.0, 5.5]), torch.tensor([[3.0, 5.0]]), "3, 5", True,
                   float("nan"), [3, 5], (3.0, 5.0)):
        exercise.check(answer)
        said = capsys.readouterr().out
        assert said.startswith(("Right.", "Not quite.")) and said.rstrip().endswith("The derivative of x² is 2x.")
        assert said.startswith("Right.") == isinstance(answer, (list, tuple)), (answer, said)
        assert "5.0" not in said and "3.0" not in said and "[3" not in said, said
    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        (x * 3).backward()
        (x * 4).backward()
    page = lens.to_html(str(tmp_path / "p.html"), predict=True)
    assert (tmp_path / "p.html").read_text(encoding="utf-8") == page and "predict" in page
    stepper = lens.stepper()
    assert isinstance(stepper, al.Stepper) and {"step", "pass_index"} <= set(stepper.trait_names())
    stepper.pass_index, stepper.step = 1, 1
    assert stepper.current_step.title == "mul (MulBackward0) runs"


def test_without_hooks_is_unknown_with_why_in_the_readmes_cases():
    """README's table: 'unknown, and why': packed saved tensors, an error after hooks ran; guarantees.md: a value
    larger than store_limit (the reason says what to pass)."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):
        y = x * x
    y.register_hook(lambda g: g * 2)
    with al.Lens() as lens:
        (y * 3).sum().backward()
    assert torch.equal(x.grad, torch.tensor([12.0, 24.0])) and lens.passes[0].grads_without_hooks["x"] is None
    assert "packed by a saved-tensor hook" in lens.passes[0].unknown["x"]
    w = torch.randn(50, requires_grad=True)
    h = w * w
    h.register_hook(lambda g: g * 2)
    with al.Lens(store_limit=10) as lens:
        h.sum().backward()
    assert lens.passes[0].grads_without_hooks["w"] is None and "larger store_limit" in lens.passes[0].unknown["w"]
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    u = v * 2
    u.register_hook(lambda g: g * 2)

    def refuse(g):
        raise ValueError("refused")

    v.register_hook(refuse)
    with al.Lens() as lens, pytest.raises(ValueError, match="refused"):
        (u * 3).sum().backward()
    assert lens.passes[0].grads_without_hooks["v"] is None
    assert "stopped at ValueError: refused after hooks ran" in lens.passes[0].unknown["v"]


def test_the_keys_the_readme_and_guide_give_are_the_steppers():
    """README said '← → (or j k)', pairing ← with j; the stepper's j is next (as the guide and its button say)."""
    source = read(os.path.join(ROOT, "autograd_lens", "views", "stepper.js"))
    actions = dict(re.findall(r'"?([\w+=\-]+)"?: "([\w-]+)"', source[source.index("const actions = {"):][:400]))
    assert {key: actions[key] for key in ("ArrowRight", "j", "ArrowLeft", "k", "Home", "End", "0", "r", "Escape")} == {
        "ArrowRight": "next", "j": "next", "ArrowLeft": "prev", "k": "prev", "Home": "first", "End": "last",
        "0": "fit", "r": "root", "Escape": "unselect"}
    assert "→ or j next, ← or k back, Home, End; + − 0 zoom" in read(README)
    assert "→ or j next step, ← or k previous, Home and End the\nfirst and last, + and − zoom, 0 fits the drawing, r " \
           "shows the root, Escape clears a selection" in read(GUIDE)


def test_the_limits_the_docs_give_are_the_codes():
    from autograd_lens.capture import annotate, modules, observe
    from autograd_lens.views import context, fold, passview, static_html

    guide, guarantees = " ".join(read(GUIDE).split()), " ".join(read(GUARANTEES).split())
    assert fold.FOLD_OVER == passview.COLLAPSE_OVER == annotate.GROUP_HINT_OVER == 60
    assert "Past 60 boxes, `%lens_graph` / `graph()` outlines" in guide and "Past 60 boxes the groups start" in guide
    assert (fold.VARIANT_LAYOUTS, fold.VARIANT_BOXES) == (8, 300) and "At most 8 such drawings (300 boxes in all)" in guide
    assert context.STEP_LIMIT == 1000 and "more than 1,000 events shows its first 1,000 as steps" in guarantees
    assert modules.MAX_CALLS == 200_000 and "at most 200,000 calls per cell" in guarantees
    assert observe.DEEP_GRAPH == 30_000 and "deeper than 30,000 functions" in guarantees
    assert static_html.PICTURE_INLINE_LIMIT == 100_000 and "larger than 100 KB" in guarantees
    assert static_html.OVERVIEW_BOXES == 150 and "(past ~150 nodes)" in guide


def test_module_groups_are_labelled_as_the_guide_shows(shell):
    """guide.md: outlines labelled 'model.3 · Linear', 'shared · Linear (call 2 of 2)'; cards 'Made by cell line 4:
    out = model(x), inside model.3 · Linear'."""
    assert shell.run_cell("""%%lens --modules --no-show
shared = torch.nn.Linear(2, 2)
model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
out = model(shared(shared(torch.ones(1, 2))))
out.sum().backward()
""").success
    page = shell.user_ns["_lens"].to_html()
    for text in ("model.3 · Linear", "shared · Linear (call 1 of 2)", "shared · Linear (call 2 of 2)",
                 "Made by cell line 4: out = model(shared(shared(torch.ones(1, 2)))), inside model.3 · Linear",
                 "Made by cell line 4: out = model(shared(shared(torch.ones(1, 2)))), inside shared · Linear (call 2 of 2)"):
        assert text in page, text


def test_the_module_map_puts_each_module_in_its_folder():
    """test_layout checks that the map names every module; here, that each is named under its own folder's line
    (a module of views/ described under capture/ would be a false map)."""
    files = {path.name: path.relative_to(PACKAGE) for path in PACKAGE.rglob("*") if path.suffix in (".py", ".js")}
    section, misplaced = "autograd_lens", []
    for line in _map_block().splitlines():
        folder = re.match(r"^  (\w+)/", line)
        if folder or re.match(r"^  \S", line):
            section = folder.group(1) if folder else "autograd_lens"
        for name in re.findall(r"\b(\w+\.(?:py|js))\b", line):
            where = files[name].parts[0] if len(files[name].parts) > 1 else "autograd_lens"
            if name != "__init__.py" and where != section:
                misplaced.append((name, section, str(files[name])))
    assert misplaced == []


def test_why_records_forward_ops_with_a_mode_only_for_the_block():
    """%%lens --why's help and Lens's docstring: 'Records forward ops for the length of the cell (a
    TorchFunctionMode)'; without why=True no mode is pushed."""
    from torch.overrides import _get_current_function_mode_stack as modes

    with al.Lens(why=True):
        inside = [isinstance(mode, torch.overrides.TorchFunctionMode) for mode in modes()]
    with al.Lens():
        plain = list(modes())
    assert inside == [True] and plain == [] and modes() == []


def test_max_elements_shows_values_up_to_it():
    """'Tensors with at most max_elements entries show their values' (graph()'s docstring, the magics' help)."""
    a, b = torch.arange(4.0, requires_grad=True), torch.arange(5.0, requires_grad=True)
    dot = al.graph((a * 2).sum() + (b * 2).sum(), names={"a": a, "b": b}, max_elements=4).to_dot()
    assert 'label="a [4]|data [0.0, 1.0, 2.0, 3.0]|grad None"' in dot
    assert 'label="b [5]|data [5 float32] min 0.0 max 4.0 norm 5.477|grad None"' in dot
    with al.Lens(names={"a": a, "b": b}, max_elements=4) as lens:
        ((a * 2).sum() + (b * 2).sum()).backward()
    values = {node.label: node.value for node in lens.passes[0].graph.nodes if node.label in ("a", "b")}
    assert torch.equal(values["a"], a.detach()) and isinstance(values["b"], TensorSummary)


def test_it_adds_no_node_and_leaves_the_graph_as_it_was():
    """guarantees.md: 'It adds no node to your graph'; its hooks are removed at the end of each pass: every
    backward function's links, metadata and the user's tensor hooks are as in a plain run, and a second pass
    over the retained graph gives the same .grad."""
    def program(lens_cls):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3
        y.register_hook(lambda g: g * 2)
        z = (y * y).sum()
        functions, stack = [], [z.grad_fn]
        while stack:
            fn = stack.pop()
            functions.append(fn)
            stack += [next_fn for next_fn, _ in fn.next_functions if next_fn is not None]
        for _ in range(2):
            if lens_cls is None:
                z.backward(retain_graph=True)
            else:
                with lens_cls():
                    z.backward(retain_graph=True)
        links = [(fn.name(), dict(fn.metadata), [n.name() if n else None for n, _ in fn.next_functions])
                 for fn in functions]
        return links, len(y._backward_hooks), x.grad.tolist()

    assert program(None) == program(al.Lens)


OLD_TORCH = """
import sys, torch
torch.__version__ = "2.12.0"
try:
    import autograd_lens
except ImportError as error:
    print("import:", error)
print([name for name in sys.modules if name.startswith("autograd_lens.")])
from IPython.core.interactiveshell import InteractiveShell
result = InteractiveShell.instance().run_cell("%load_ext autograd_lens")
print("load_ext:", result.success, result.error_in_exec)
"""


def test_below_the_supported_torch_one_line_says_what_to_install():
    """README/guide: below 2.13 `import autograd_lens` raises, and `%load_ext` prints, one line naming the version
    needed, and nothing else is loaded."""
    out = subprocess.run([sys.executable, "-c", OLD_TORCH], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout.splitlines()
    line = 'autograd_lens needs torch >= 2.13.0; this is torch 2.12.0: nothing was loaded (pip install "torch>=2.13,<2.16")'
    assert out == [f"import: {line}", "['autograd_lens.compat']", f"load_ext: False {line}"], out
