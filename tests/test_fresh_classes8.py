"""Fresh eyes of a practitioner debugging gradient hooks (helper ``fresh8``, 2026-11-28): hooks that go wrong (raise,
return a wrong shape, dtype or a non-tensor, warn, print), hooks that change hooks mid-pass, backward inside
backward, state kept in hooks, and threads. Each program runs plainly, then under a ``Lens`` (or a ``%%lens`` cell),
and what the lens says is compared with what plain PyTorch did: the hooks' own logs, the errors, the warnings, the
printed lines, ``.grad`` and a run without the hooks. Sections marked "Was false" failed before their fix."""

from __future__ import annotations

import contextlib
import io
import re
import threading
import warnings

import pytest
import torch

import autograd_lens as al
from autograd_lens.model import GradWritten, HookCall, PassError
from autograd_lens.views.passview import views_for


def snap(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return tuple(snap(v) for v in value)
    return value


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    return type(a) is type(b) and a == b


def run(program, lens: bool = False, hooks: bool = True):
    """``program(log, hooks)`` run plainly or under a Lens: (log, result or (error type, message), printed text,
    warnings shown, the Lens)."""
    log: list = []
    printed = io.StringIO()
    recorder = al.Lens() if lens else contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with contextlib.redirect_stdout(printed), recorder:
            try:
                result = program(log, hooks)
            except Exception as error:  # noqa: BLE001  (compared with the plain run's)
                result = (type(error), str(error))
    seen = [(str(w.message), w.category, w.filename, w.lineno) for w in shown]
    return log, result, printed.getvalue(), seen, recorder if lens else None


def compared(program):
    """The lens changes nothing the program sees; returns (plain log, plain result, result without hooks, Lens)."""
    plain = run(program)
    traced = run(program, lens=True)
    for what, a, b in zip(("hook log", "result", "printed", "warnings"), plain[:4], traced[:4]):
        assert same(a, b), f"{what} differs under the lens:\n{a}\n{b}"
    unhooked = run(program, hooks=False)
    return plain[0], plain[1], unhooked[1], traced[4]


def steps_of(backward_pass):
    (view,) = views_for([backward_pass])
    return view.steps


def hook_steps(backward_pass):
    return [step for step in steps_of(backward_pass) if step.kind == "hook"]


# --- 1. a post-accumulate-grad hook that returns a value -------------------------------------------------------------
# Was false: torch writes .grad, calls the hook, then raises "Tensor post accumulate grad hooks should return None."
# The lens showed no "x.grad written" step, no contribution of the pass (``added`` empty), and said x's value without
# hooks was not known because ".grad was replaced or written during this pass before the pass added to it (by a
# hook ...)" — nothing had written it before. Its card said nothing of the refusal. Fixed in capture/ending.py (the
# refused return stops the pass after the write, as a raising post-accumulate hook does) and views/hook_cards.py.


RETURNS = {"a new tensor": lambda leaf: leaf.grad * 2,
           "the edited .grad": lambda leaf: leaf.grad.masked_fill_(torch.tensor([True, False]), 0.0)}


def _returns_from_post_accumulate(log, hooks, returns="a new tensor"):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0], requires_grad=True)
    if hooks:
        x.register_post_accumulate_grad_hook(lambda leaf: log.append(snap(leaf.grad)) or RETURNS[returns](leaf))
    try:
        (x * w).sum().backward()
    except RuntimeError as error:
        log.append(str(error))
    return snap((x.grad, w.grad))


@pytest.mark.parametrize("returns", list(RETURNS))
def test_a_post_accumulate_hook_returning_a_value_stops_the_pass_after_the_write(returns):
    plain_log, plain, unhooked, lens = compared(lambda log, hooks: _returns_from_post_accumulate(log, hooks, returns))
    assert plain_log[-1] == "Tensor post accumulate grad hooks should return None."
    (p,) = lens.passes
    x_grad, w_grad = plain
    assert same(p.leaf_grads["x"], x_grad) and same(p.leaf_grads["w"], w_grad)
    kinds = [type(event).__name__ for event in p.events]
    writes = [event for event in p.events if isinstance(event, GradWritten)]
    assert [w.name for w in writes] == ["x"] and kinds[-2:] == ["HookCall", "PassError"]
    assert w_grad is None and p.grads_without_hooks["w"] is None and "the pass stopped at RuntimeError" in p.unknown["w"]
    assert kinds.index("HookCall") == p.events.index(writes[-1]) + 1  # x's write, then its hook, then the error
    assert same(writes[-1].grad, plain_log[0]) and same(writes[-1].received, unhooked[0])
    assert same(p.added["x"], unhooked[0]) and same(p.added_without_hooks["x"], unhooked[0])
    assert same(p.grads_without_hooks["x"], unhooked[0]) and "x" not in p.unknown
    (call,) = p.hook_calls
    assert call.kind == "post_accumulate_grad" and not call.returned_none and same(call.grad_in, plain_log[0])
    assert same(call.grad_out, x_grad) and call.edited_in_place is (returns == "the edited .grad")
    (step,) = hook_steps(p)
    assert "torch refused it (RuntimeError: Tensor post accumulate grad hooks should return None.)" in step.lines[1]
    assert step.lines[1].endswith(f"the pass stopped here; .grad holds {al.format_value(x_grad)}.")
    assert len(step.lines) == 2 + call.edited_in_place and step.question is None
    if call.edited_in_place:  # masked_fill_ returned .grad itself: the classic slip, and its edit stays
        assert not same(x_grad, unhooked[0]) and "a lambda that calls one returns it too" in step.lines[2]


# --- 2. a backward pass on another thread, then one on the Lens's thread ---------------------------------------------
# Was false: the worker thread's pass is left alone (a note says so), but its hook tripled y's gradient there too, and
# the lens said x.grad "without hooks" was [32, 64] — the worker's hooked contribution plus this pass's unhooked one;
# a run without the hooks gives [16, 32]. Now: not known, and why, for each leaf whose .grad held something when the
# pass began (the lens cannot tell which leaves the worker wrote); a leaf whose .grad was None keeps its value. Fixed in capture/build.py with capture/leafstate.py (``unrecorded_write``).


def _thread_then_main(log, hooks):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    v = torch.tensor([5.0], requires_grad=True)
    y = x * 2
    if hooks:
        y.register_hook(lambda g: log.append((threading.current_thread().name, snap(g))) or g * 3)
    out = (y * y).sum()
    errors: list = []

    def worker():
        try:
            out.backward(retain_graph=True)
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    thread = threading.Thread(target=worker, name="worker")
    thread.start()
    thread.join()
    (out + (v * 4).sum()).backward()
    return snap((x.grad, v.grad)), errors


def test_a_pass_on_another_thread_makes_values_without_hooks_unknown_where_it_wrote():
    plain_log, plain, unhooked, lens = compared(_thread_then_main)
    assert [name for name, _ in plain_log] == ["worker", "MainThread"] and plain[1] == []
    (p,) = lens.passes
    assert [n.code for n in lens.notes].count("untraced_pass") == 1
    (call,) = p.hook_calls
    assert same(call.grad_in, plain_log[1][1]) and call.invocation == 1  # the recorded pass's call only
    x_grad, v_grad = plain[0]
    assert same(p.leaf_grads["x"], x_grad) and same(p.leaf_grads["v"], v_grad)
    assert same(unhooked[0][0], torch.tensor([16.0, 32.0])) and same(x_grad, torch.tensor([48.0, 96.0]))
    assert p.grads_without_hooks["x"] is None, p.grads_without_hooks["x"]  # was [32, 64]
    assert "did not record (another thread)" in p.unknown["x"]
    assert same(p.added_without_hooks["x"], torch.tensor([8.0, 16.0]))  # this pass's own part is known
    assert same(p.grads_without_hooks["v"], unhooked[0][1]) and "v" not in p.unknown  # .grad was None: known


# --- 3. a %%lens cell whose hook raises: the traceback IPython shows -------------------------------------------------
# Was false: the traceback had one more frame than the same cell without %%lens, autograd_lens/magics.py's
# `raise result.error_in_exec`. Fixed (magics.py: the frame is hidden, as the tracer's own frames already were). The
# cell magic's call line ("Cell In[n], line 1: get_ipython().run_cell_magic(...)") is IPython's, for any cell magic.

RAISING_CELL = '''x = torch.tensor([1.0, 2.0], requires_grad=True)
y = x * 2
def bad(g):
    print("in the hook", g.tolist())
    warnings.warn("a warning from the hook")
    raise ValueError("boom " + str(g.tolist()))
y.register_hook(bad)
print("before")
y.sum().backward()
print("after")
'''


def _shown(shell, cell):
    printed, errors = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            result = shell.run_cell(cell)
    text = re.sub(r"\x1b\[[0-9;]*m", "", printed.getvalue())
    frames = [line for line in text.splitlines() if re.match(r"(File |Cell In\[)", line)]
    return result, text, frames, [(str(w.message), w.lineno) for w in shown]


def test_a_raising_hook_in_a_lens_cell_shows_the_plain_traceback_and_the_partial_pass(shell):
    shell.run_cell("import warnings", store_history=False)
    plain, plain_text, plain_frames, plain_warned = _shown(shell, RAISING_CELL)
    traced, text, frames, warned = _shown(shell, "%%lens --as L\n" + RAISING_CELL)
    assert type(traced.error_in_exec) is type(plain.error_in_exec) is ValueError
    assert str(traced.error_in_exec) == str(plain.error_in_exec) == "boom [1.0, 1.0]"
    assert warned == plain_warned == [("a warning from the hook", 5)]  # once each, at the hook's line
    assert frames[0].startswith("Cell In[") and frames[1:] == plain_frames, (frames, plain_frames)
    assert "autograd_lens" not in text.split("Traceback (most recent call last)")[1]
    assert text.index("before\nin the hook [1.0, 1.0]\n") < text.index("<autograd_lens.Lens: 1 backward pass")
    assert "\nafter\n" not in plain_text and "\nafter\n" not in text
    (p,) = shell.user_ns["L"].passes
    assert p.error.type == "ValueError" and p.error.message == "boom [1.0, 1.0]"
    (call,) = p.hook_calls
    assert call.error == "ValueError: boom [1.0, 1.0]" and same(call.grad_in, torch.ones(2)) and call.grad_out is None
    assert p.leaf_grads["x"] is None and shell.user_ns["x"].grad is None and p.grads_without_hooks["x"] is None
    assert [s.kind for s in steps_of(p)] == ["start", "node", "hook", "error"]
    assert hook_steps(p)[0].lines == ("It raised ValueError: boom [1.0, 1.0].",)
    again = shell.run_cell("z = (x * 3).sum(); z.backward(); x.grad")  # the kernel goes on as usual
    assert again.success and same(again.result, torch.full((2,), 3.0))


# --- 4. a hook that changes a saved tensor's value, not a gradient ---------------------------------------------------
# Was false: a hook on y does ``x.data.mul_(10)`` (an in-place step no version counter sees) before MulBackward0 of
# ``y = x * w`` runs; that node computes w's gradient from the saved x, now ten times larger. No gradient was changed
# by a hook, so the lens said w.grad was "the same as without hooks" ([202.9, 59621.2]); a run without the hook gives
# [22.1, 5963.9]. Fixed in capture/build.py with capture/leafstate.py (``changed_by_hooks``): a leaf whose value
# changed during a pass in which hooks ran makes that pass's values without hooks unknown, with why — found for the
# leaves whose values the walk kept before the pass (at most ``max_elements`` elements); larger leaves since 2026-11-28
# noon by their summaries (min, max, norm, first entries), in drawings of up to 200 functions.


def _hook_steps_a_saved_leaf(log, hooks, size=2):
    x = torch.arange(1.0, size + 1).requires_grad_()
    w = torch.arange(3.0, size + 3).requires_grad_()
    y = x * w
    if hooks:
        def steps_x(g):
            log.append(snap(g))
            x.data.mul_(10)
        y.register_hook(steps_x)
    (y.tanh().sum() + (w * 2).sum()).backward()
    return snap((x.grad, w.grad))


def _saved_leaf_checked(size):
    _, plain, unhooked, lens = compared(lambda log, hooks: _hook_steps_a_saved_leaf(log, hooks, size))
    (p,) = lens.passes
    assert same(p.leaf_grads["w"], plain[1]) and not torch.allclose(plain[1], unhooked[1])
    for name, real, without in zip("xw", plain, unhooked):
        shown = p.grads_without_hooks[name]
        assert shown is None or torch.allclose(shown, without), f"{name}: {shown} shown, it is {without}"
    return p


def test_a_hook_that_changes_a_small_saved_leaf_makes_values_without_hooks_unknown():
    p = _saved_leaf_checked(2)
    assert p.unknown["w"].startswith("a hook changed x itself during this pass (not a gradient")


def test_a_hook_that_changes_a_large_saved_leaf_makes_values_without_hooks_unknown():
    """Was a strict xfail: a leaf of more than max_elements elements is kept as a summary (min, max, norm, first
    entries), and was not compared. Now its summary before the pass is compared with one made at its end
    (leafstate.changed_by_hooks), in drawings of up to 200 functions, which keep such summaries."""
    p = _saved_leaf_checked(32)
    assert p.unknown["w"].startswith("a hook changed x itself during this pass (not a gradient")


def test_a_hook_that_leaves_a_large_saved_leaf_alone_keeps_values_without_hooks():
    """The summaries of a leaf no hook changed are equal: the values without hooks stay known (and true)."""
    def program(log, hooks):
        x = torch.arange(1.0, 33.0).requires_grad_()
        w = torch.arange(3.0, 35.0).requires_grad_()
        y = x * w
        if hooks:
            y.register_hook(lambda g: log.append(snap(g)))
        (y.tanh().sum() + (w * 2).sum()).backward()
        return snap((x.grad, w.grad))
    _, plain, unhooked, lens = compared(program)
    (p,) = lens.passes
    assert not p.unknown
    for name, without in zip("xw", unhooked):
        assert same(p.grads_without_hooks[name], without)


# --- 5. hooks that go wrong: checked and true ------------------------------------------------------------------------
# Each program: torch's error (type and text) comes out unchanged, the hooks receive the same values, the pass's
# record ends with that error after the calls that ran, a refused return is said to be refused, and the Lens records
# the next pass as usual.

WRONG = {
    "raises": (lambda g: (_ for _ in ()).throw(KeyError("no such key")), "KeyError", "'no such key'"),
    "shape": (lambda g: g[:1], "RuntimeError", "hook 'wrong' has changed the size of value"),
    "dtype": (lambda g: g.double(), "RuntimeError", "hook 'wrong' has changed the type of value (was "
              "torch.FloatTensor got torch.DoubleTensor)"),
    "float": (lambda g: 1.5, "TypeError", "expected Variable, but hook returned 'float'"),
    "list": (lambda g: [g], "TypeError", "expected Variable, but hook returned 'list'"),
    "meta": (lambda g: torch.empty(2, device="meta"), "RuntimeError", "hook 'wrong' has changed the type of value "
             "(was torch.FloatTensor got MetaFloatType)"),
}


def _wrong_hook(kind):
    def program(log, hooks):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        w = torch.tensor([3.0, 4.0], requires_grad=True)
        y = x * w
        if hooks:
            w.register_hook(lambda g: log.append(("w", snap(g))))

            def wrong(g):
                log.append(("wrong", snap(g)))
                return WRONG[kind][0](g)

            y.register_hook(wrong)
        out = (y * y).sum() + (w * 5).sum()
        raised = None
        try:
            out.backward(retain_graph=True)
        except Exception as error:  # noqa: BLE001
            raised = (type(error).__name__, str(error))
        first = snap((x.grad, w.grad))
        if hooks:
            y._backward_hooks.clear()  # (torch's own dict: the second pass runs without the wrong hook)
        out.backward()
        return snap((x.grad, w.grad)), first, raised
    return program


@pytest.mark.parametrize("kind", list(WRONG))
def test_a_hook_that_goes_wrong_leaves_torchs_error_and_the_next_pass_alone(kind):
    log, (plain, after_first, raised), _, lens = compared(_wrong_hook(kind))
    _, error_type, message = WRONG[kind]
    assert raised == (error_type, message)
    first, second = lens.passes
    assert first.error is not None and (first.error.type, first.error.message) == (error_type, message)
    assert isinstance(first.events[-1], PassError)
    calls = [(c.hook, c.target) for c in first.hook_calls]
    assert calls == [("<lambda>", "w"), ("wrong", "y")] or calls == [("wrong", "y")], calls
    shown = [(c.hook if c.hook == "wrong" else "w", c.grad_in) for c in first.hook_calls]
    assert same(shown, log[:len(shown)]) and len(log) == len(shown) + 1  # (then w's hook in the second pass)
    wrong = first.hook_calls[-1]
    texts = hook_steps(first)[-1].lines
    if kind == "raises":
        assert wrong.error == "KeyError: 'no such key'" and texts == ("It raised KeyError: 'no such key'.",)
    else:
        assert wrong.error is None and not wrong.returned_none and wrong.modified
        assert texts[0].startswith(f"received {al.format_value(wrong.grad_in)} → torch refused what it returned "
                                   f"({error_type}: {message})")
    assert same(first.leaf_grads["x"], after_first[0]) and same(first.leaf_grads["w"], after_first[1])
    assert first.grads_without_hooks["x"] is None and "the pass stopped at" in first.unknown["x"]
    assert [c.hook for c in second.hook_calls] == ["<lambda>"] and second.error is None
    assert same(second.leaf_grads["x"], plain[0]) and same(second.leaf_grads["w"], plain[1])


# --- 6. hooks that print, warn and change hooks mid-pass: checked and true ------------------------------------------


def logged(log, name, body=lambda g: None):
    """A tensor hook named ``name`` that logs (name, what it received, what flows on after it)."""
    def hook(g):
        out = body(g)
        log.append((name, snap(g), snap(out if out is not None else g)))
        return out
    hook.__name__ = hook.__qualname__ = name
    return hook


def _changing_hooks(log, hooks):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = y * 3
    out = (z * z).sum() + y.sum()
    handles = {}
    if hooks:
        def adds_late(g):
            print("adds_late sees", g.tolist())
            warnings.warn("adds_late ran")  # once per location under "default", however many passes
            if "late" not in handles:
                handles["late"] = y.register_hook(logged(log, "late", lambda h: h * 10))
            else:
                handles["late"].remove()
                handles["adds_late"].remove()
                handles["gone"].remove()  # on z too: torch still calls it in this pass (not y's "late")
        handles["adds_late"] = z.register_hook(logged(log, "adds_late", adds_late))
        handles["gone"] = z.register_hook(logged(log, "gone", lambda g: g * 100))
        with x.register_hook(logged(log, "scoped", lambda g: g + 1)):  # RemovableHandle as a context manager
            out.backward(retain_graph=True)
    else:
        out.backward(retain_graph=True)
    grads = [snap(x.grad)]
    for _ in range(2):
        out.backward(retain_graph=True)
        grads.append(snap(x.grad))
    return grads


def _unhooked_grads(program):
    return run(program, hooks=False)[1]


def test_hooks_that_print_warn_register_and_remove_hooks_mid_pass():
    plain = run(_changing_hooks)
    assert plain[2].count("adds_late sees") == 2 and len(plain[3]) == 1  # printed twice, warned once
    log, grads, unhooked, lens = compared(_changing_hooks)
    shown = [(c.hook, c.grad_in, c.grad_out) for p in lens.passes for c in p.hook_calls]
    assert same(shown, log), (shown, log)
    assert [[c.hook for c in p.hook_calls] for p in lens.passes] == \
        [["adds_late", "gone", "late", "scoped"], ["adds_late", "gone"], []]
    assert [[c.invocation for c in p.hook_calls] for p in lens.passes] == [[1, 1, 1, 1], [2, 2], []]
    for p, grad, without in zip(lens.passes, grads, unhooked):
        assert same(p.leaf_grads["x"], grad)
        assert same(p.grads_without_hooks["x"], without), (p.index, p.grads_without_hooks["x"], without)
    assert [e.text() for e in lens.passes[1].inventory] == ["z: tensor hook adds_late (1 of 2)",
                                                            "z: tensor hook gone (2 of 2)", "y: tensor hook late"]
    assert lens.passes[2].inventory == ()


# --- 7. backward inside backward ------------------------------------------------------------------------------------
# Was false: a hook shown by another name than its code's (``functools.wraps``, a factory setting ``__name__``) that
# also ran inside a nested backward (``autograd.grad`` in another hook) was listed in the pass's note by its code's
# name ("not recorded as steps of this pass: hook" / "wrapper"), so its card said "call 1 of 1 in this recording"
# with no word of the uncounted call. Fixed in capture/nested.py (the note names it as its steps do). The rest of
# the section (calls of each later pass, double backward, inputs=, materialize_grads) was true.


def _nested(log, hooks):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    u = torch.tensor([0.5, 0.5], requires_grad=True)
    y = x ** 2 * w
    aux = (w ** 2).sum()
    if hooks:
        def with_grad_inside(g):
            (gw,) = torch.autograd.grad(aux, [w], retain_graph=True)  # runs w's hook too, in a nested pass
            return g + gw
        y.register_hook(logged(log, "with_grad_inside", with_grad_inside))
        w.register_hook(logged(log, "on_w"))
    y.sum().backward(retain_graph=True)  # 1: the nested pass is not a pass of its own
    # 2: double backward: autograd.grad with create_graph, then a backward through the gradient
    (gx,) = torch.autograd.grad((y * y).sum(), [x], create_graph=True)
    if hooks:
        gx.register_hook(logged(log, "on_gx"))
    (gx ** 2).sum().backward(inputs=[x, w], retain_graph=True)
    # 3: unused input, materialized; non-scalar root with an explicit gradient
    found = torch.autograd.grad(y.sum(), [x, u], allow_unused=True, materialize_grads=True, retain_graph=True)
    y.backward(gradient=torch.tensor([1.0, -1.0]))
    return snap((x.grad, w.grad, gx, found))


def test_backward_inside_backward_and_double_backward():
    log, plain, unhooked, lens = compared(_nested)
    passes = lens.passes
    assert [p.kind for p in passes] == ["backward", "grad", "backward", "grad", "backward"]
    names = [[c.hook for c in p.hook_calls] for p in passes]
    assert names[0] == ["with_grad_inside", "on_w"]
    # the nested autograd.grad called on_w once more inside with_grad_inside: said in a note, not counted
    assert [entry[0] for entry in log[:3]] == ["on_w", "with_grad_inside", "on_w"]
    assert any("not recorded as steps of this pass: on_w" in note for note in passes[0].notes)
    (on_w,) = [c for c in passes[0].hook_calls if c.hook == "on_w"]
    assert same(on_w.grad_in, log[2][1]) and on_w.invocation == 1
    (step,) = [s for s in hook_steps(passes[0]) if "on_w" in s.title]
    assert "a hook named on_w also ran inside a nested backward, not counted" in step.title
    assert passes[0].grads_without_hooks["x"] is None and "hooks ran inside a backward that MulBackward0 ran" in passes[0].unknown["x"]
    # each later call is attributed to the pass it ran in, in the order torch made them
    shown = [(c.hook, c.grad_in, c.grad_out) for p in passes for c in p.hook_calls]
    # (every with_grad_inside call logs after the nested on_w call inside it: those are not steps)
    outer = [entry for entry, following in zip(log, log[1:] + [("",)])
             if not (entry[0] == "on_w" and following[0] == "with_grad_inside")]
    assert same(shown, outer), (shown, log)
    assert "on_gx" in names[2] and "on_gx" not in names[1] + names[3] + names[4]
    x_grad, w_grad, gx, found = plain
    assert same(passes[1].input_grads["x"], gx)
    assert same(passes[3].input_grads["x"], found[0]) and same(passes[3].input_grads["u"], torch.zeros(2))
    assert same(passes[4].leaf_grads["x"], x_grad) and same(passes[4].leaf_grads["w"], w_grad)
    assert same(passes[3].grads_without_hooks["u"], torch.zeros(2))


def _decorated(log, hooks):
    import functools

    def logging(fn):
        @functools.wraps(fn)
        def wrapper(g):
            log.append((fn.__name__, snap(g)))
            return fn(g)
        return wrapper

    @logging
    def halve(g):
        return g / 2

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    inner = (x * 5).sum()
    if hooks:
        x.register_hook(halve)
        y.register_hook(lambda g: g + torch.autograd.grad(inner, [x], retain_graph=True)[0])
    (y * y).sum().backward()
    return snap(x.grad)


def test_a_decorated_hook_that_ran_in_a_nested_backward_is_named_in_the_note_as_in_its_steps():
    log, grad, _, lens = compared(_decorated)
    assert [name for name, _ in log] == ["halve", "halve"]  # in the nested grad, then in the pass
    (p,) = lens.passes
    (call,) = [c for c in p.hook_calls if c.hook == "halve"]
    assert same(call.grad_in, log[1][1]) and same(p.leaf_grads["x"], grad)
    assert any(note.endswith("not recorded as steps of this pass: halve; values without hooks that depend on them "
                             "are unknown") for note in p.notes), p.notes
    (step,) = [s for s in hook_steps(p) if "halve" in s.title]
    assert "call 1 of 1 in this recording; a hook named halve also ran inside a nested backward, not counted" \
        in step.title


# --- 8. state kept in hooks: checked and true ------------------------------------------------------------------------


def _stateful(log, hooks, set_to_none=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 1)
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    count = [0]
    if hooks:
        def alternate(g):  # a closure counter: scales on odd calls only
            count[0] += 1
            return g * 10 if count[0] % 2 else None
        a.register_hook(logged(log, "alternate", alternate))
        optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in lin.parameters()}

        def step(p):  # the optimizer inside backward, per parameter
            log.append(("step", snap(p), snap(p.grad)))
            optimizers[p].step()
            optimizers[p].zero_grad(set_to_none=set_to_none)
        for p in lin.parameters():
            p.register_post_accumulate_grad_hook(step)
    x = torch.tensor([[1.0, 2.0]])
    out = []
    for _ in range(3):
        (lin(x * a).pow(2).sum() + (a * a).sum()).backward()
        out.append(snap((a.grad, lin.weight, lin.bias, lin.weight.grad)))
        if set_to_none:
            a.grad = None
        else:
            a.grad.zero_()
    return out


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_counter_closure_and_an_optimizer_step_inside_backward(set_to_none):
    log, steps, _, lens = compared(lambda log, hooks: _stateful(log, hooks, set_to_none))
    assert len(lens.passes) == 3
    for p, (a_grad, weight, bias, weight_grad) in zip(lens.passes, steps):
        calls = {c.hook if c.hook != "step" else c.target: c for c in p.hook_calls}
        assert set(calls) == {"alternate", "lin.weight", "lin.bias"}
        assert same(p.leaf_grads["a"], a_grad)
        assert calls["alternate"].modified is (p.index % 2 == 0)  # calls 1 and 3 scale
        for name, value in (("lin.weight", weight), ("lin.bias", bias)):
            call = calls[name]
            assert same(call.value_after, value) and call.grad_cleared is set_to_none
            assert same(p.leaf_grads[name], None if set_to_none else torch.zeros_like(value))
        assert same(p.leaf_grads["lin.weight"], weight_grad)
    shown = [(c.hook, c.grad_in, c.grad_out) for p in lens.passes for c in p.hook_calls if c.hook == "alternate"]
    assert same(shown, [entry for entry in log if entry[0] == "alternate"])
    steps_seen = [(c.value_before, c.grad_in) for p in lens.passes for c in p.hook_calls if c.hook == "step"]
    assert same(steps_seen, [entry[1:] for entry in log if entry[0] == "step"])
    # a's gradient without hooks is known when the hooks' own leaves are not on its way: the first pass's
    first = lens.passes[0]
    assert same(first.added_without_hooks["a"], first.added["a"] / 10)


def _threads_between_passes(log, hooks):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    u = torch.tensor([4.0], requires_grad=True)
    y = x * 2
    if hooks:
        y.register_hook(lambda g: log.append(threading.current_thread().name) or g * 3)
    out = (y * y).sum()
    grads = []

    def on_thread(loss):
        thread = threading.Thread(target=lambda: loss.backward(retain_graph=True), name="worker")
        thread.start()
        thread.join()

    out.backward(retain_graph=True)  # recorded
    on_thread((u * 5).sum())  # another graph: x.grad untouched
    out.backward(retain_graph=True)  # recorded
    grads.append(snap(x.grad))
    on_thread(out)  # x's graph, its hook tripling y's gradient
    out.backward(retain_graph=True)  # recorded
    grads.append(snap(x.grad))
    return grads, snap(u.grad)


def test_a_thread_between_recorded_passes_makes_unknown_only_what_it_wrote():
    log, (grads, u_grad), (unhooked, _), lens = compared(_threads_between_passes)
    assert log == ["MainThread", "MainThread", "worker", "MainThread"] and same(u_grad, torch.tensor([5.0]))
    first, second, third = lens.passes
    assert same(second.leaf_grads["x"], grads[0]) and same(third.leaf_grads["x"], grads[1])
    assert same(second.grads_without_hooks["x"], unhooked[0])  # the worker's pass did not write x.grad
    assert third.grads_without_hooks["x"] is None and "another thread" in third.unknown["x"]
    assert same(third.added_without_hooks["x"], unhooked[0] / 2)  # what this pass itself adds, without the hook


# --- 9. module backward hooks that return the wrong thing: checked and true -----------------------------------------

MODULE_RETURNS = {"a tensor": lambda t: t[0] * 2, "a list": lambda t: [t[0] * 2], "two": lambda t: (t[0], t[0]),
                  "(None,)": lambda t: (None,)}


def _module_hook_returns(kind, returns):
    def program(log, hooks):
        torch.manual_seed(0)
        lin = torch.nn.Linear(2, 2)
        x = torch.tensor([[1.0, 2.0]], requires_grad=True)
        if hooks and kind == "full":
            lin.register_full_backward_hook(lambda m, gi, go: log.append(snap(gi)) or MODULE_RETURNS[returns](gi))
        elif hooks:
            lin.register_full_backward_pre_hook(lambda m, go: log.append(snap(go)) or MODULE_RETURNS[returns](go))
        raised = None
        try:
            lin(x).sum().backward()
        except RuntimeError as error:
            raised = str(error)
        return {"x": snap(x.grad), "lin.weight": snap(lin.weight.grad), "lin.bias": snap(lin.bias.grad)}, raised
    return program


@pytest.mark.parametrize("kind", ["full", "pre"])
@pytest.mark.parametrize("returns", list(MODULE_RETURNS))
def test_module_hooks_returning_the_wrong_thing(kind, returns):
    log, (grads, raised), (unhooked, _), lens = compared(_module_hook_returns(kind, returns))
    (p,) = lens.passes
    (call,) = p.hook_calls
    assert call.kind == f"module_{'full' if kind == 'full' else 'full_pre'}" and same(call.grad_in, log[0])
    for name, value in grads.items():
        assert same(p.leaf_grads[name], value), name
    (step,) = hook_steps(p)
    if raised is None:  # a list is taken as the tuple; (None,) drops the gradient it replaces
        assert p.error is None and call.modified and "torch refused" not in step.lines[0]
        for name, value in unhooked.items():
            assert same(p.grads_without_hooks[name], value), name
    else:
        assert p.error.message == raised and f"torch refused what it returned (RuntimeError: {raised})" in step.lines[0]
        assert p.grads_without_hooks["x"] is None
