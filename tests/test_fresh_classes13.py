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
full backward *pre*-hook when both hooks share their code (one factory, the usual ``def make_hook(name)``)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import equal, problems_of, run  # noqa: E402  (the differential harness)
from test_fresh_classes10 import check, drawing_problems, drawn_grads, name, named, statements  # noqa: E402

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
