"""Fresh eyes on recurrent and dynamic graphs with hooks (helper ``fresh14``, 2026-11-28): one hook, module or tensor
involved many times.  BPTT through a cell written by hand and through ``nn.RNNCell`` / ``GRUCell`` / ``LSTMCell`` with
one closure registered on the hidden state at every step, ``nn.LSTM`` / ``nn.GRU`` (two layers, bidirectional) with
full backward hooks, pre-hooks and forward hooks on their tuple outputs, truncated BPTT (the state detached every k
steps, hooks before and after the detach, a stateful hook counting its calls over the passes), seq2seq with teacher
forcing and a weight-tied embedding/decoder, data-dependent loops with several losses, a recursive tree network, a
fixed-step neural ODE (Euler, RK4) with hooks on the state, and hooks that remove themselves, register other hooks
during backward, are registered twice on one tensor or sit on a view of the hidden state.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py, imported), then through :func:`check` of tests/test_fresh_classes10.py (the cards, the
drawing and the notes against torch).  The lens counts calls per *registration* (one function registered on every
hidden state is one hook per tensor: "call 1 of 1" each), while the harness counts per function: for hooks shared
that way, :func:`problems` leaves the harness's numbers aside and checks the lens's own.

False and fixed (capture/hooks.py): a module's full backward hook called from torch's pre-hook wrapper (no input of
the call requires grad: an ``LSTMCell`` always, its state being a tuple; any cell at the first step) was shown as its
full backward *pre*-hook when both hooks share their code (one factory, the usual ``def make_hook(name)``).

False, and fixed by the integrator in capture/annotate.py (section 7): the end-of-recording notes on module hooks that
never fired said "another copy of the model?" for a hook on a tied decoder that is never called (its weight's .grad,
written under the embedding's name, was not seen as the module's), and "never fired" for a hook that ran inside
reentrant checkpointing's nested backward (now kept by the pass: ``BackwardPass.nested_module_hooks``)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import Run, equal, problems_of  # noqa: E402  (the differential harness)
from test_fresh_classes10 import drawing_problems, drawn_grads, name, statements  # noqa: E402  (cards, drawing)

from autograd_lens.format import format_value  # noqa: E402
from autograd_lens.views.passview import views_for  # noqa: E402


# --- 1. a module's full hook called from torch's pre-hook wrapper, both hooks from one factory ----------------------
# Was false: with no input of a call requiring grad, torch calls the full hooks from the pre-hook's wrapper, where the
# loop variable ``user_pre_hook`` still holds the last pre-hook; the lens took the first candidate with the running
# code, so a full hook sharing its code with the pre-hook was shown as the pre-hook (kind and name).

def logger(name: str, log: list):
    def hook(module, *grads):
        log.append((name, grads))
    hook.__qualname__ = hook.__name__ = name
    return hook


@pytest.mark.parametrize("kind", ["lstm_cell", "first_step"])
def test_a_full_hook_called_by_the_pre_hook_wrapper_is_shown_as_the_full_hook(kind):
    torch.manual_seed(0)
    cell = nn.LSTMCell(2, 3) if kind == "lstm_cell" else nn.RNNCell(2, 3)
    log: list = []
    cell.register_full_backward_pre_hook(logger("pre", log))
    cell.register_full_backward_hook(logger("full", log))
    x = torch.randn(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Full backward hook is firing when ... no inputs require gradients"
        with al.Lens() as lens:
            out = cell(x)  # the first step: no state, x needs no gradient
            h = out[0] if kind == "lstm_cell" else out
            h = cell(x, (h, out[1])) if kind == "lstm_cell" else cell(x, h)  # the state is a tuple: still none
            h = h[0] if kind == "lstm_cell" else h
            h.sum().backward()
    assert [entry[0] for entry in log] == ["pre", "full", "pre", "full"]
    assert [len(grads[0]) for hook, grads in log if hook == "full"] == [2, 1]  # the later call (x, state) first
    assert [(c.hook, c.kind) for c in lens.hook_calls] == [
        ("pre", "module_full_pre"), ("full", "module_full"), ("pre", "module_full_pre"), ("full", "module_full")]
    for call, (hook, grads) in zip(lens.hook_calls, log):  # a pre-hook gets (grad_output,), a full hook (gi, go)
        assert equal(call.grad_in, grads[0]) and (hook == "pre" or equal(call.context, grads[1])), (call, grads)
    titles = [step.title for view in views_for(lens.passes) for step in view.steps if step.kind == "hook"]
    assert [re.match(r"hook (\w+) on \w+ \(([\w ]+) hook,", t).groups() for t in titles] == [
        ("pre", "module full pre"), ("full", "module full"), ("pre", "module full pre"), ("full", "module full")]


# --- the harness, for hooks shared by many registrations -----------------------------------------------------------
# The lens numbers the calls of each registration ("call i of n" of the hook on that tensor); the harness of
# tests/test_fresh_classes7.py numbers them per function.  For the hooks in ``shared`` (one function registered on many
# tensors) the harness's numbers are left aside and the lens's are compared with ``shared[name]``: the call numbers of
# that hook's calls in the recording, in order (None: each call is its registration's only one, "call 1 of 1").

def _numbering(message: str, shared: dict) -> bool:
    """Whether ``message`` of the harness is about the per-function number of a hook in ``shared``."""
    said = re.match(r"(\w+): call \d+ shown, it was call \d+$", message)
    if said:
        return said.group(1) in shared
    card = re.match(r"card 'hook (?:\d+ of \d+ on .*?: )?(\w+)(?: on .*?)? \(.*': expected 'call \d+ of \d+", message)
    return bool(card) and card.group(1) in shared


def numbering_problems(lens: al.Lens, shared: dict) -> list[str]:
    """The lens's call numbers of the shared hooks against ``shared``, in each card's title too."""
    problems = []
    totals: dict = {}
    for view in views_for(lens.passes):
        for step in view.steps:
            said = re.search(r"(?:hook (\w+) on .*?|: (\w+)) \(.*?call (\d+) of (\d+) in this recording", step.title)
            if step.kind == "hook" and said and (said.group(1) or said.group(2)) in shared:
                totals.setdefault(said.group(1) or said.group(2), []).append((int(said.group(3)), int(said.group(4))))
    for name, expected in shared.items():
        calls = [call.invocation for call in lens.hook_calls if call.hook == name]
        if expected is None:
            expected = [1] * len(calls)
        if calls != list(expected):
            problems.append(f"{name}: call numbers {calls}, expected {list(expected)}")
        if expected and [number for number, _ in totals.get(name, [])] != list(expected):
            problems.append(f"{name}: titles say {totals.get(name)}, expected calls {list(expected)}")
        if shared[name] is None and any(total != 1 for _, total in totals.get(name, [])):
            problems.append(f"{name}: titles say {totals.get(name)}: each registration fired once")
    return problems


def check13(program, shared: dict | None = None, unreached: dict | list | None = None, drawing: bool = True,
            static: bool = False):
    """:func:`check` of tests/test_fresh_classes10.py, the numbers of the ``shared`` hooks apart; ``drawing=False``:
    the DOT text (laid out at a grad field's widest text, which a post-accumulate hook's in-place edit or a pass of
    autograd.grad leaves ambiguous for that comparison) is not compared, the stepper's last frame is; ``unreached``:
    the same for every pass, or a list (one per pass)."""
    shared = shared or {}
    assert [m for m in problems_of(program) if not _numbering(m, shared)] == []
    problems, lens, plain = statements(program)
    assert problems == []
    if drawing:
        assert drawing_problems(lens, plain, static) == []
    assert numbering_problems(lens, shared) == []
    assert len(lens.passes) == len(plain.per)
    for index, p in enumerate(lens.passes):  # the stepper's last frame: each leaf's grad field is torch's .grad
        drawn, written = drawn_grads(lens, index), {k: v for k, v in plain.per[index].items() if v is not None}
        assert {k: drawn.get(k) for k in written} == {k: format_value(v, 48) for k, v in written.items()}, index
        assert not drawn.keys() & (plain.per[index].keys() - written.keys()), index  # None: no grad field
        reasons = unreached[index] if isinstance(unreached, list) else unreached
        assert {key: reason.code for key, reason in p.unreached.items()} == (reasons or {}), p.unreached
    return lens, plain


def params(**modules) -> dict:
    return {f"{prefix}.{n}": p.grad for prefix, module in modules.items() for n, p in module.named_parameters()}


# --- 2. BPTT with one closure on the hidden state of every step ----------------------------------------------------

def hand_rnn(kind: str):
    """An RNN written by hand, ``h = tanh(x W + h U + b)``; one closure registered on every h, collecting per-step
    gradient norms and clipping (elementwise, or by norm, returning None when under the limit); the loss weighs step
    t by t + 1; two passes accumulating into .grad."""
    def program(run):
        torch.manual_seed(0)
        W, U = torch.randn(2, 3, requires_grad=True), (torch.randn(3, 3) * 0.5).requires_grad_()
        b = torch.zeros(3, requires_grad=True)
        name(run, W=W, U=U, b=b)
        xs = torch.randn(4, 2, 2)
        norms = []

        def clip(g):
            norms.append(g.norm().item())
            if kind == "clamp":
                return g.clamp(-0.2, 0.2)
            n = g.norm()
            return g * (0.3 / n) if n > 0.3 else None
        hook = run.H("step_hook", clip) if run.hooked else None
        for _ in range(2):
            h, loss = torch.zeros(2, 3), 0
            for t in range(4):
                h = torch.tanh(xs[t] @ W + h @ U + b)
                if run.hooked:
                    h.register_hook(hook)
                loss = loss + h.sum() * (t + 1)
            run.backward(loss)
            run.record({"W": W.grad, "U": U.grad, "b": b.grad})
        return norms
    return program


def cells(kind: str):
    """nn.RNNCell / GRUCell / LSTMCell over 3 steps with a head; a full hook and a halving pre-hook on the cell, one
    clamping closure on every h (and a doubling one on every c: the last c's gradient is None), two SGD steps."""
    def program(run):
        torch.manual_seed(0)
        cell = {"rnn": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}[kind](2, 3)
        head = nn.Linear(3, 1)
        name(run, cell=cell, head=head)
        opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
        xs = torch.randn(3, 2, 2)
        if run.hooked:
            cell.register_full_backward_hook(run.H("cell_full", lambda m, gi, go: None, lambda a: a[1]))
            cell.register_full_backward_pre_hook(run.H(
                "cell_pre", lambda m, go: tuple(g * 0.5 if g is not None else None for g in go), lambda a: a[1]))
            on_h = run.H("h_hook", lambda g: g.clamp(-0.1, 0.1))
            on_c = run.H("c_hook", lambda g: g * 2 if g is not None else None)
        for _ in range(2):
            opt.zero_grad()
            h, c, loss = torch.zeros(2, 3), torch.zeros(2, 3), 0
            for t in range(3):
                if kind == "lstm":
                    h, c = cell(xs[t], (h, c))
                    if run.hooked:
                        c.register_hook(on_c)
                else:
                    h = cell(xs[t], h)
                if run.hooked:
                    h.register_hook(on_h)
                loss = loss + head(h).pow(2).sum()
            run.backward(loss)
            run.record(params(cell=cell, head=head))
            opt.step()
        return [p.detach().clone() for p in cell.parameters()]
    return program


@pytest.mark.parametrize("kind", ["clamp", "norm"])
def test_bptt_by_hand_with_one_closure_on_every_step(kind):
    lens, plain = check13(hand_rnn(kind), {"step_hook": None}, static=True)
    for p in lens.passes:  # the last step first, each h once, with the sum over its two uses
        assert [c.hook for c in p.hook_calls] == ["step_hook"] * 4
        assert all(c.modified == (kind == "clamp" or c.grad_in.norm() > 0.3) for c in p.hook_calls)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_bptt_through_cells_with_module_hooks_and_state_hooks(kind):
    shared = {"h_hook": None, "c_hook": None} if kind == "lstm" else {"h_hook": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "Full backward hook is firing when ... no inputs require gradients"
        lens, plain = check13(cells(kind), shared)
    for p in lens.passes:  # pre-hook then full hook, for each forward call, the later first
        module = [(c.hook, c.kind, c.forward_call) for c in p.hook_calls if c.kind.startswith("module")]
        assert module == [(hook, kind_, k) for k in (3, 2, 1)
                          for hook, kind_ in (("cell_pre", "module_full_pre"), ("cell_full", "module_full"))]
        full = [c for c in p.hook_calls if c.hook == "cell_full"]
        # an LSTMCell's state is a tuple, never a gradient input; the first call's state is zeros without grad
        assert [c.grad_in[1] is None for c in full] == ([True, True, True] if kind == "lstm" else [False, False, True])
    if kind != "gru":
        assert forward_call_problems(cells(kind)) == []


def forward_call_problems(program) -> list[str]:
    """Each module full hook's "for forward call k of the n this pass reached" against torch: the program runs under a
    Lens with a global forward hook that puts a tagging tensor hook on each call's output (it sees the gradient the
    full hook gets as grad_output, after the pre-hooks); the calls a pass reached are those whose tag fired in it,
    numbered in forward order.  A full hook's call is matched to the call whose tag got its grad_output (skipped when
    several did); each pre-hook must name the call of the full hook that follows it on that module."""
    import torch.nn.modules.module as module_hooks

    tags, calls, marks = [], {}, []

    def tag(module, args, output):
        first = output[0] if isinstance(output, tuple) else output
        calls[id(module)] = k = calls.get(id(module), 0) + 1
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda g, m=module, k=k: tags.append((m, k, g.detach().clone())) and None)

    result = Run("lens")
    for method in ("backward", "grad"):
        def marked(*args, _method=getattr(result, method), **kwargs):
            marks.append(len(tags))
            try:
                return _method(*args, **kwargs)
            finally:
                marks.append(len(tags))
        setattr(result, method, marked)
    handle = module_hooks.register_module_forward_hook(tag)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with al.Lens() as lens:
                program(result)
    finally:
        handle.remove()
    problems, compared = [], 0
    for index, p in enumerate(lens.passes):
        fired = tags[marks[2 * index]:marks[2 * index + 1]]
        for call in p.hook_calls:
            if call.kind != "module_full" or not call.context or call.context[0] is None:
                continue
            got = call.context[0]
            owners = [(m, k) for m, k, g in fired if g.shape == got.shape and torch.equal(g, got)]
            if len({k for _, k in owners}) != 1 or len({id(m) for m, _ in owners}) != 1:
                continue
            owner, k = owners[0]
            reached = sorted(k2 for m, k2, _ in fired if m is owner)
            expected = (reached.index(k) + 1, len(reached))
            if (call.forward_call or 1, call.forward_calls or 1) != expected:
                problems.append(f"pass {index + 1}: {call.hook} shown for forward call {call.forward_call} of "
                                f"{call.forward_calls}; it is {expected}")
            compared += 1
        for before, after in zip(p.hook_calls, p.hook_calls[1:]):
            if before.kind == "module_full_pre" and after.kind == "module_full" and before.target == after.target \
                    and before.forward_call != after.forward_call:
                problems.append(f"pass {index + 1}: {before.hook} for call {before.forward_call}, then "
                                f"{after.hook} for call {after.forward_call}")
    return problems + ([] if compared else ["no module hook call was compared"])


# --- 3. nn.LSTM / nn.GRU: two layers, bidirectional, tuple outputs; a learned initial state ---------------------------

def recurrent_module(kind: str):
    """nn.LSTM / nn.GRU (2 layers, bidirectional) with a full hook and a pre-hook, a forward hook that puts a tripling
    hook on h_n of each call (a tensor inside the output tuple, which the module hooks never see), a clamping hook on
    one reverse-direction weight; ``h0``: an LSTM whose initial (h, c) are parameters, passed as a tuple (no module
    hook sees their gradient), the full hook doubling grad_input[0]."""
    def program(run):
        torch.manual_seed(0)
        if kind == "h0":
            mod = nn.LSTM(2, 3, batch_first=True)
            h0, c0 = nn.Parameter(torch.zeros(1, 1, 3)), nn.Parameter(torch.zeros(1, 1, 3))
            name(run, h0=h0, c0=c0)
        else:
            mod = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](3, 4, num_layers=2, bidirectional=True, batch_first=True)
        x = torch.randn(2, 3, mod.input_size, requires_grad=True)
        name(run, mod=mod, x=x)
        if run.hooked:
            mod.register_full_backward_hook(run.H("mod_full", lambda m, gi, go: (gi[0] * 2,) + tuple(gi[1:]),
                                                  lambda a: a[1]))
            mod.register_full_backward_pre_hook(run.H("mod_pre", lambda m, go: None, lambda a: a[1]))
            if kind == "h0":
                h0.register_hook(run.H("h0_hook", lambda g: g.clamp(-0.1, 0.1)))
            else:
                def on_state(module, args, output):
                    state = output[1][0] if isinstance(output[1], tuple) else output[1]
                    state.register_hook(run.H("hn_hook", lambda g: g * 3))
                mod.register_forward_hook(on_state)
                mod.weight_hh_l1_reverse.register_hook(run.H("whh1r", lambda g: g.clamp(-0.01, 0.01)))
        for _ in range(2):
            if kind == "h0":
                out, state = mod(x, (h0.expand(1, 2, 3).contiguous(), c0.expand(1, 2, 3).contiguous()))
            else:
                out, state = mod(x)
            hn = state[0] if isinstance(state, tuple) else state
            loss = out.pow(2).sum() + hn.sum() + (state[1].sum() * 0.5 if isinstance(state, tuple) else 0)
            run.backward(loss)
            run.record(dict(params(mod=mod), x=x.grad, **({"h0": h0.grad, "c0": c0.grad} if kind == "h0" else {})))
        return out.detach()
    return program


@pytest.mark.parametrize("kind", ["lstm", "gru", "h0"])
def test_recurrent_modules_with_module_and_state_hooks(kind):
    lens, plain = check13(recurrent_module(kind), {"hn_hook": None})
    for p in lens.passes:
        pre, full = [c for c in p.hook_calls if c.kind.startswith("module")]
        assert (pre.hook, full.hook) == ("mod_pre", "mod_full")  # grad_output: (out, state) — an LSTM's is a tuple
        assert (full.context[1] is None) == (kind != "gru") and len(full.context) == 2
        assert len(full.grad_in) == (2 if kind == "h0" else 1) and full.grad_out[1:] == full.grad_in[1:] == \
            ((None,) if kind == "h0" else ())  # the tuple state gets no gradient input


# --- 4. truncated BPTT: the state detached every 2 steps, a backward per chunk ----------------------------------------

def truncated(kind: str):
    """An RNNCell over 6 steps, the state detached every 2, a step after each chunk; a stateful closure scaling by
    1 / (its calls so far) registered on every h (``every``), or on the state just before it is detached, after that
    chunk's backward(retain_graph=True) (``before``: it never fires), or on the detached state made a leaf again
    (``leaf``: it fires in the next chunk's pass)."""
    def program(run):
        torch.manual_seed(0)
        cell, head = nn.RNNCell(2, 3), nn.Linear(3, 1)
        name(run, cell=cell, head=head)
        opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
        xs = torch.randn(6, 2, 2)
        count = [0]

        def counting(g):
            count[0] += 1
            return g * (1.0 / count[0])
        hook = run.H("count_hook", counting) if run.hooked else None
        if run.hooked:
            cell.register_full_backward_hook(run.H("cell_full", lambda m, gi, go: None, lambda a: a[1]))
        h = torch.zeros(2, 3)
        for t in range(6):
            if t % 2 == 0 and t:
                if kind == "before" and run.hooked:
                    h.register_hook(hook)
                h = h.detach()
                if kind == "leaf":
                    h.requires_grad_()
                    if run.hooked:
                        h.register_hook(hook)
            h = cell(xs[t], h)
            if run.hooked and kind == "every":
                h.register_hook(hook)
            if t % 2 == 1:
                opt.zero_grad()
                run.backward(head(h).pow(2).sum(), retain_graph=(kind == "before"))
                run.record(params(cell=cell))
                opt.step()
        return count[0], [p.detach().clone() for p in cell.parameters()]
    return program


@pytest.mark.parametrize("kind", ["every", "before", "leaf"])
def test_truncated_bptt_with_a_stateful_hook(kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first chunk's first call: no input requires grad
        lens, plain = check13(truncated(kind), {"count_hook": None})
    counted = [[c.grad_out for c in p.hook_calls if c.hook == "count_hook"] for p in lens.passes]
    assert [len(c) for c in counted] == {"every": [2, 2, 2], "before": [0, 0, 0], "leaf": [0, 1, 1]}[kind]
    assert forward_call_problems(truncated(kind)) == []


# --- 5. seq2seq with teacher forcing and tied weights, a recursive tree, loops until a condition, a neural ODE --------

def seq2seq(greedy: bool):
    """A GRU encoder, a GRUCell decoder over 3 steps, the decoder's Linear tied to the embedding (one parameter used
    by both, 3 + 2 times a pass), a tensor hook and a post-accumulate hook on it; teacher forcing, or greedy decoding
    (argmax: no gradient through the choice)."""
    def program(run):
        torch.manual_seed(0)
        emb, enc, dec_cell, out = nn.Embedding(5, 4), nn.GRU(4, 4, batch_first=True), nn.GRUCell(4, 4), \
            nn.Linear(4, 5, bias=False)
        out.weight = emb.weight
        name(run, emb=emb, enc=enc, dec_cell=dec_cell)
        trained = list({id(p): p for m in (emb, enc, dec_cell, out) for p in m.parameters()}.values())
        opt = torch.optim.SGD(trained, lr=0.1)
        if run.hooked:
            emb.weight.register_hook(run.H("tied", lambda g: g.clamp(-0.05, 0.05)))
            out.register_full_backward_hook(run.H("out_full", lambda m, gi, go: None, lambda a: a[1]))
            out.register_full_backward_pre_hook(run.H("out_pre", lambda m, go: (go[0] * 2,), lambda a: a[1]))
            dec_cell.register_full_backward_hook(run.H("dec_full", lambda m, gi, go: None, lambda a: a[1]))
            emb.weight.register_post_accumulate_grad_hook(run.H("tied_post", lambda p: None, lambda a: a[0].grad))
        src, tgt = torch.tensor([[1, 2, 3], [4, 0, 2]]), torch.tensor([[2, 3, 1], [0, 1, 4]])
        for _ in range(2):
            opt.zero_grad()
            _, h = enc(emb(src))
            h, inp, loss = h[0], torch.zeros(2, dtype=torch.long), 0
            for t in range(3):
                h = dec_cell(emb(inp), h)
                logits = out(h)
                loss = loss + F.cross_entropy(logits, tgt[:, t])
                inp = logits.argmax(-1) if greedy else tgt[:, t]
            run.backward(loss)
            run.record(dict(params(dec_cell=dec_cell), **{"emb.weight": emb.weight.grad}))
            opt.step()
        return [p.detach().clone() for p in trained]
    return program


def test_seq2seq_with_tied_weights_against_torch():
    lens, plain = check13(seq2seq(greedy=False))
    assert forward_call_problems(seq2seq(greedy=True)) == []
    for p in lens.passes:  # one call of the tied weight's hook a pass, with the sum of its 3 + 2 uses (+ the decoder's)
        assert [c.hook for c in p.hook_calls if c.hook.startswith("tied")] == ["tied", "tied_post"]
        assert [c.forward_call for c in p.hook_calls if c.hook == "out_full"] == [3, 2, 1]


class Tree(nn.Module):
    """A recursive network over a binary tree of token ids: a leaf is embedded, a node combines its children."""

    def __init__(self):
        super().__init__()
        self.combine, self.leaf = nn.Linear(6, 3), nn.Embedding(4, 3)

    def forward(self, tree):
        if isinstance(tree, int):
            return self.leaf(torch.tensor(tree))
        return torch.tanh(self.combine(torch.cat([self.forward(tree[0]), self.forward(tree[1])])))


def dynamic(kind: str):
    """``tree``: two trees (4 combines, then 1); ``until``: a residual layer applied until the state's norm passes 4
    (or 6 times), a loss per step, summed in the first pass and backward one by one (retain_graph) in the second;
    ``euler`` / ``rk4``: a fixed-step neural ODE, one clamping closure on the state after every step."""
    def program(run):
        torch.manual_seed(0)
        if kind == "tree":
            net = Tree()
            name(run, net=net)
            if run.hooked:
                net.combine.register_full_backward_hook(run.H("combine_full", lambda m, gi, go: None, lambda a: a[1]))
                net.leaf.weight.register_hook(run.H("leafw", lambda g: g * 2))
            for tree in (((0, 1), (2, (3, 0))), (1, 2)):
                net.zero_grad()
                run.backward(net(tree).sum())
                run.record(params(net=net))
        elif kind == "until":
            layer, x = nn.Linear(3, 3), torch.randn(2, 3, requires_grad=True)
            name(run, layer=layer, x=x)
            if run.hooked:
                layer.register_full_backward_hook(run.H("layer_full", lambda m, gi, go: (gi[0] * 0.5,), lambda a: a[1]))
                layer.register_full_backward_pre_hook(run.H("layer_pre", lambda m, go: None, lambda a: a[1]))
                layer.weight.register_hook(run.H("w", lambda g: None))
            for separate in (False, True):
                h, losses = x, []
                while h.norm() < 4 and len(losses) < 6:
                    h = torch.relu(layer(h)) + h
                    losses.append(h.pow(2).mean())
                for i, loss in enumerate(losses if separate else [sum(losses)]):
                    run.backward(loss, retain_graph=separate and i < len(losses) - 1)
                    run.record(dict(params(layer=layer), x=x.grad))
        else:
            f, z0 = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)), torch.tensor([[1.0, -0.5]],
                                                                                             requires_grad=True)
            name(run, f=f, z0=z0)
            state = run.H("state", lambda g: g.clamp(-1.0, 1.0)) if run.hooked else None
            if run.hooked:
                f[0].register_full_backward_hook(run.H("f0_full", lambda m, gi, go: None, lambda a: a[1]))
            z, dt = z0, 0.25
            for _ in range(4):
                if kind == "euler":
                    z = z + dt * f(z)
                else:
                    k1 = f(z)
                    k2 = f(z + dt / 2 * k1)
                    k3 = f(z + dt / 2 * k2)
                    k4 = f(z + dt * k3)
                    z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
                if run.hooked:
                    z.register_hook(state)
            run.backward(z.pow(2).sum())
            run.record(dict(params(f=f), z0=z0.grad))
    return program


@pytest.mark.parametrize("kind", ["tree", "until", "euler", "rk4"])
def test_dynamic_graphs_against_torch(kind):
    lens, plain = check13(dynamic(kind), {"state": None}, static=kind != "until")
    assert forward_call_problems(dynamic(kind)) == []
    module = [[c.forward_call or 1 for c in p.hook_calls if c.kind == "module_full"] for p in lens.passes]
    assert module == {"tree": [[4, 3, 2, 1], [1]], "until": [[6, 5, 4, 3, 2, 1]] + [list(range(k, 0, -1))
                                                                                   for k in range(1, 7)],
                      "euler": [[4, 3, 2, 1]], "rk4": [list(range(16, 0, -1))]}[kind]


# --- 6. hooks that remove themselves, register others, sit twice on one tensor or on a view --------------------------

def self_removing(run):
    """Warm-up hooks that remove themselves on their second call: a tensor hook on a parameter (across passes), a
    module full hook (within a pass: the cell runs 3 times), a post-accumulate hook halving .grad in place; and one
    closure on every hidden state that removes all its handles on its second call of a pass (the earlier steps'
    registrations never fire)."""
    torch.manual_seed(0)
    cell = nn.RNNCell(2, 3)
    name(run, cell=cell)
    xs = torch.randn(3, 2, 2)
    handles, calls = {}, {"w": 0, "m": 0, "p": 0}

    def warmup(g):
        calls["w"] += 1
        if calls["w"] == 2:
            handles["w"].remove()
        return g * 0.1

    def warm_module(m, gi, go):
        calls["m"] += 1
        if calls["m"] == 2:
            handles["m"].remove()
        return None if gi[0] is None else (gi[0] * 0.1, *gi[1:])

    def post(p):
        calls["p"] += 1
        if calls["p"] == 2:
            handles["p"].remove()
        p.grad.mul_(0.5)
    if run.hooked:
        handles["w"] = cell.weight_hh.register_hook(run.H("warmup", warmup))
        handles["m"] = cell.register_full_backward_hook(run.H("warm_module", warm_module, lambda a: a[1]))
        handles["p"] = cell.weight_ih.register_post_accumulate_grad_hook(run.H("post", post, lambda a: a[0].grad))
    for _ in range(3):
        cell.zero_grad()
        state_handles, state_calls = [], [0]

        def first_two(g):
            state_calls[0] += 1
            if state_calls[0] == 2:
                for handle in state_handles:
                    handle.remove()
            return g * 3
        on_state = run.H("first_two", first_two) if run.hooked else None
        h = torch.zeros(2, 3, requires_grad=True)
        loss = 0
        for t in range(3):
            h = cell(xs[t], h)
            if run.hooked:
                state_handles.append(h.register_hook(on_state))
            loss = loss + h.sum()
        run.backward(loss)
        run.record(params(cell=cell))
    return calls


def test_hooks_that_remove_themselves_against_torch():
    lens, plain = check13(self_removing, {"first_two": None}, drawing=False)  # (post halves .grad in place)
    # a module hook removed during a pass still runs for the forward calls made before (torch kept its list then)
    assert [[(c.hook, c.invocation) for c in p.hook_calls if c.hook != "first_two"] for p in lens.passes] == [
        [("warm_module", 1), ("warm_module", 2), ("post", 1), ("warmup", 1), ("warm_module", 3)],
        [("post", 2), ("warmup", 2)], []]
    assert [sum(c.hook == "first_two" for c in p.hook_calls) for p in lens.passes] == [2, 2, 2]
    titles = [s.title for s in views_for(lens.passes)[0].steps if s.kind == "hook" and "warm_module" in s.title]
    assert [re.search(r"call \d+ of \d+", t).group(0) for t in titles] == ["call 1 of 3", "call 2 of 3", "call 3 of 3"]


def registering(run):
    """Hooks registering hooks while backward runs: a hook on h_t registers the next one on h_{t-1} (a chain built
    backwards), a hook on the last state registers one on the weight (it fires this pass: its AccumulateGrad has not
    run), and a hook on h_1 registers another on h_1 itself (too late: torch does not call it this pass)."""
    torch.manual_seed(0)
    W = (torch.randn(3, 3) * 0.5).requires_grad_()
    name(run, W=W)
    xs = torch.randn(4, 1, 3)
    for _ in range(2):
        h, hs = torch.zeros(1, 3), []
        for t in range(4):
            h = torch.tanh(xs[t] + h @ W)
            hs.append(h)
        if run.hooked:
            def make(t):
                def chain(g):
                    if t > 0:
                        hs[t - 1].register_hook(chained[t - 1])
                    return g * 0.5
                return chain
            chained = [run.H(f"chain{t}", make(t)) for t in range(4)]
            on_w = run.H("on_w", lambda g: g + 1)
            itself = run.H("itself", lambda g: g * 10)
            hs[-1].register_hook(chained[-1])
            hs[-1].register_hook(run.H("registers_on_w", lambda g: W.register_hook(on_w) and None))
            hs[1].register_hook(run.H("registers_itself", lambda g: hs[1].register_hook(itself) and None))
        run.backward(sum(h.sum() for h in hs))
        run.record({"W": W.grad})
    return W.grad


def test_hooks_registering_hooks_during_backward_against_torch():
    lens, plain = check13(registering, static=True)
    # h_1's own hook first (registered in the forward), then chain1 (by chain2, during the pass); not "itself"
    assert [[(c.hook, c.invocation) for c in p.hook_calls] for p in lens.passes] == [[
        ("chain3", 1), ("registers_on_w", 1), ("chain2", 1), ("registers_itself", 1), ("chain1", 1), ("chain0", 1),
        ("on_w", 1)], [("chain3", 1), ("registers_on_w", 1), ("chain2", 1), ("registers_itself", 1), ("chain1", 1),
                       ("chain0", 1), ("on_w", 2), ("on_w", 1)]]  # pass 1's hook on W fires again, then pass 2's
    titles = [s.title for s in views_for(lens.passes)[1].steps if s.kind == "hook" and ": on_w (" in s.title]
    assert [re.search(r"call \d+ of \d+", t).group(0) for t in titles] == ["call 2 of 2", "call 1 of 1"]


def twice_and_views(kind: str):
    """One function registered twice on every GRUCell state (two hooks, chained), or on a view of it (a slice, a
    view of the whole), while the state goes on to the next step; ``leaky``: the classic bug, a hook registered on a
    parameter inside the training loop (pass k runs k registrations)."""
    def program(run):
        torch.manual_seed(0)
        cell = nn.GRUCell(2, 3)
        name(run, cell=cell)
        xs = torch.randn(3, 2, 2)
        halve = run.H("halve", lambda g: g * 0.5) if run.hooked else None
        opt = torch.optim.SGD(cell.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            if run.hooked and kind == "leaky":
                cell.weight_hh.register_hook(halve)
            h, outs = torch.zeros(2, 3), []
            for t in range(3):
                h = cell(xs[t], h)
                v = h[:, :2] if kind == "slice" else h.view(-1) if kind == "view" else h
                if run.hooked and kind != "leaky":
                    for _ in range(2 if kind == "twice" else 1):
                        v.register_hook(halve)
                outs.append(v.pow(2).sum())
            run.backward(sum(outs))
            run.record(params(cell=cell))
            opt.step()
        return h.detach()
    return program


@pytest.mark.parametrize("kind", ["twice", "slice", "view", "leaky"])
def test_hooks_twice_on_one_tensor_on_views_and_leaking_against_torch(kind):
    numbers = [1, 2, 1, 3, 2, 1] if kind == "leaky" else None  # registration k's i-th call is in pass k + i - 1
    lens, plain = check13(twice_and_views(kind), {"halve": numbers})
    per_pass = [len(p.hook_calls) for p in lens.passes]
    assert per_pass == {"twice": [6] * 3, "leaky": [1, 2, 3]}.get(kind, [3] * 3)
    if kind in ("twice", "leaky"):  # "hook i of n on <target>", in registration order, each chained on the last
        titles = [s.title for s in views_for(lens.passes)[2].steps if s.kind == "hook"]
        assert [re.match(r"hook (\d+ of \d+) on ", t).group(1) for t in titles] == (
            ["1 of 2", "2 of 2"] * 3 if kind == "twice" else ["1 of 3", "2 of 3", "3 of 3"])
        for first, second in zip(lens.passes[2].hook_calls[::2], lens.passes[2].hook_calls[1::2]):
            if kind == "twice":
                assert equal(second.grad_in, first.grad_out)


def state_programs(kind: str):
    """``masked``: padding zeroed in place on each GRUCell state after a doubling hook was registered on it, an adding
    hook after (each hook sees its version's gradient); ``retained``: retain_grad() on every state, a halving hook
    registered before it on even steps, after it on odd ones (.grad holds the value after all hooks either way);
    ``raising``: a check hook on every state raising on an exploding gradient in the first pass, caught."""
    def program(run):
        torch.manual_seed(0)
        cell = nn.GRUCell(2, 3)
        name(run, cell=cell)
        xs = torch.randn(4, 3, 2)
        lengths = torch.tensor([4, 2, 3])
        double = run.H("double", lambda g: g * 2) if run.hooked else None
        add = run.H("add", lambda g: g + 0.1) if run.hooked else None

        def check(g):
            if g.abs().max() > 2.0:
                raise ValueError(f"exploding gradient {g.abs().max().item():.3f}")
        checking = run.H("check", check) if run.hooked else None
        kept, errors = [], []
        for scale in (30.0, 1.0):
            h, outs = torch.zeros(3, 3), []
            for t in range(4):
                h = cell(xs[t], h)
                if kind == "masked":
                    if run.hooked:
                        h.register_hook(double)
                    h[~(t < lengths)] = 0.0
                    if run.hooked:
                        h.register_hook(add)
                elif kind == "retained":
                    if run.hooked and t % 2 == 0:
                        h.register_hook(double)
                    h.retain_grad()
                    if run.hooked and t % 2 == 1:
                        h.register_hook(add)
                elif run.hooked:
                    h.register_hook(checking)
                outs.append(h)
            try:
                run.backward(torch.stack(outs).pow(2).sum() * (scale if kind == "raising" else 1.0))
            except ValueError as error:
                errors.append(str(error))
            run.record(params(cell=cell))
            kept.append([o.grad.clone() for o in outs] if kind == "retained" else None)
        return kept, errors
    return program


@pytest.mark.parametrize("kind", ["masked", "retained", "raising"])
def test_hooks_on_masked_retained_and_checked_states_against_torch(kind):
    stopped = dict.fromkeys(["cell.weight_ih", "cell.weight_hh", "cell.bias_ih", "cell.bias_hh"], "unknown")
    lens, plain = check13(state_programs(kind), {"double": None, "add": None, "check": None},
                          [stopped, {}] if kind == "raising" else None,
                          drawing=kind != "raising")  # (the failed pass wrote no .grad: the DOT says None)
    if kind == "raising":
        first, second = lens.passes
        assert first.error is not None and first.error.type == "ValueError" and second.error is None
        assert [c.error is not None for c in first.hook_calls] == [True] and len(second.hook_calls) == 4
        assert all(reason.text == "the pass stopped with ValueError before a gradient reached it"
                   for reason in first.unreached.values())


# --- 7. notes on module hooks said never to have fired ----------------------------------------------------------------

def test_a_hook_on_a_tied_decoder_never_called_is_not_blamed_on_another_copy_of_the_model():
    """A tied language model computing its logits as h @ emb.weight.T: the decoder Linear holding the same weight is
    never called, so its full hook never fires, though every pass writes that weight's .grad.  The note must not ask
    whether the output came from another copy of the model ("Recompute it with this one": it did come from this
    one); the note for hooks whose module's parameters got .grad without the hook firing says why that happens
    (registered after the forward, or the parameters used outside the module's call)."""
    torch.manual_seed(0)
    emb, dec, rnn = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False), nn.GRUCell(4, 4)
    dec.weight = emb.weight
    seen = []
    tokens = torch.tensor([[1, 2], [3, 4], [0, 1]])
    with al.Lens(names={"emb": emb, "dec": dec, "rnn": rnn}) as lens:
        dec.register_full_backward_hook(lambda m, gi, go: seen.append(go))
        h, loss = torch.zeros(2, 4), 0
        for t in range(2):
            h = rnn(emb(tokens[t]), h)
            loss = loss + F.cross_entropy(h @ emb.weight.T, tokens[t + 1])
        loss.backward()
    assert seen == [] and dec.weight.grad is not None  # never fired; its weight's .grad written
    codes = {note.code for note in lens.notes if "on dec " in note.message}
    assert codes == {"late_module_hook"}, [note.message for note in lens.notes]


def test_a_module_hook_that_ran_inside_reentrant_checkpointing_is_not_said_never_to_have_fired():
    """An RNN-like loop checkpointed per step (use_reentrant=True): the Linear's full hook runs inside the nested
    backward of each step (torch calls it twice), which writes its parameters' .grad; the lens's pass notes say so.
    No note may then say that the hook "never fired: no backward pass here went through that module"."""
    torch.manual_seed(0)
    head = nn.Linear(3, 3)
    fired = []
    x = torch.randn(2, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with al.Lens(names={"head": head, "x": x}) as lens:
            head.register_full_backward_hook(lambda m, gi, go: fired.append(go))
            h = x
            for _ in range(2):
                h = checkpoint(lambda t: torch.tanh(head(t)), h, use_reentrant=True)
            h.sum().backward()
    assert len(fired) == 2 and head.weight.grad is not None
    (p,) = lens.passes
    assert any("head: module full hook <lambda>" in note for note in p.notes)  # the pass says it ran, nested
    assert [note.message for note in lens.notes if "never fired" in note.message] == []
