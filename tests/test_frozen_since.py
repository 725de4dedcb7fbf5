"""Parameters trained with hooks, then frozen: "without hooks" in the later passes.

After passes whose hooks changed the gradients an optimizer step used, a leaf that moved holds other values than a run
that never had the hooks would (the "changed since pass J" note, capture/annotate.moved_leaves).  A parameter frozen
since (``requires_grad_(False)``) is no leaf of the later passes, but their graphs use its values as constants: the
input's gradient "without hooks" is computed on the weights the hooked steps made.  The lens now says so for such
parameters too (their summaries then and now compared, ``annotate.leaf_ids``'s ``absent_leaves``), names only those that
changed, and says nothing where nothing moved.  Each case is compared with torch: a run that never had the hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.capture import annotate


def train_then_dream(hooked: bool, lens: bool, steps: int = 2, train_only: str = "all", poison: bool = False):
    """Two SGD steps on a small model (a hook on every parameter doubles its gradient), then the model frozen and
    its input optimized (feature visualization).  Returns (the input's gradient at each dreaming pass, the Lens)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    image = torch.zeros(1, 3, requires_grad=True)
    params = list(model.parameters()) if train_only == "all" else list(model[0].parameters())
    opt = torch.optim.SGD(params, lr=0.5)
    handles = [p.register_hook(lambda g: g * 2) for p in model.parameters()] if hooked else []
    grads = []
    recorder = al.Lens(names={"model": model, "image": image}) if lens else None
    with recorder if recorder is not None else _nothing():
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
        if poison:
            with torch.no_grad():
                model[2].bias[0] = float("nan")
        model.requires_grad_(False)
        for _ in range(2):
            image.grad = None
            model(image)[0, 1].backward()
            grads.append(image.grad.clone())
            with torch.no_grad():
                image += 0.1 * image.grad
    for handle in handles:
        handle.remove()
    return grads, recorder


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def frozen_notes(backward_pass) -> list[str]:
    return [n for n in backward_pass.notes if "of this pass (frozen?)" in n]


def test_frozen_parameters_changed_by_hooked_steps_get_the_note_and_it_is_true():
    (plain, _), (never, _) = train_then_dream(True, False), train_then_dream(False, False)
    seen, lens = train_then_dream(True, True)
    assert all(torch.equal(a, b) for a, b in zip(seen, plain))  # observing changed nothing
    assert not torch.allclose(plain[0], never[0])  # what the note warns of: without the hooks, other weights
    for backward_pass in lens.passes[2:]:
        [said] = frozen_notes(backward_pass)
        assert said.startswith("model.2.bias, model.2.weight, model.0.bias and 1 more changed since pass 1, "
                               "whose hooks changed gradients"), said  # (as the drawing orders them, from the loss)
        # the harness's test (tests/test_fresh_classes10.statements): a "changed since pass" note covers the values
        assert "changed since pass" in said and "a run that never had the hooks would have had other values" in said
        # "without hooks" on this pass: this graph with its hooks removed, on the weights as they are (no hook here)
        assert torch.equal(backward_pass.grads_without_hooks["image"], backward_pass.leaf_grads["image"])
    assert frozen_notes(lens.passes[1]) == []  # pass 2: the parameters are leaves; the usual note says it
    assert any(" and 1 more changed since pass 1, whose hooks changed gradients" in n for n in lens.passes[1].notes)


def test_only_the_frozen_parameters_that_moved_are_named():
    _, lens = train_then_dream(True, True, train_only="first")
    for backward_pass in lens.passes[2:]:
        [said] = frozen_notes(backward_pass)
        assert said.startswith("model.0.bias, model.0.weight changed since pass 1, whose hooks changed gradients"), said
        assert "model.2" not in said


def test_no_note_when_the_frozen_parameters_did_not_move():
    """The hooks changed gradients in pass 1, but nothing used them: the frozen parameters hold the same values."""
    torch.manual_seed(0)
    model, image = nn.Linear(3, 2), torch.zeros(1, 3, requires_grad=True)
    handles = [p.register_hook(lambda g: g * 2) for p in model.parameters()]
    with al.Lens(names={"model": model, "image": image}) as lens:
        model(torch.randn(4, 3)).sum().backward()  # hooks change the gradients; nothing uses them
        model.requires_grad_(False)
        model(image).sum().backward()
    for handle in handles:
        handle.remove()
    assert lens.passes[1].notes == () or not any("changed since" in n for n in lens.passes[1].notes), \
        lens.passes[1].notes


def test_an_earlier_input_not_used_again_is_named_only_when_it_changed():
    """An input that was a leaf of the hooked pass and is no leaf of the next: nothing said while its values are
    the same; said (hedged: "where this pass's graph uses its values") once it changed in place."""
    for change in (False, True):
        w = torch.tensor([1.0, 2.0], requires_grad=True)
        u = torch.tensor([3.0, 4.0], requires_grad=True)
        h = w.register_hook(lambda g: g * 3)
        with al.Lens(names={"w": w, "u": u}) as lens:
            (w * u).sum().backward()
            if change:
                with torch.no_grad():
                    w.add_(1.0)
            w.requires_grad_(False)
            (w * u).sum().backward()
        h.remove()
        notes = frozen_notes(lens.passes[1])
        assert [n.split(",")[0] for n in notes] == (["w changed since pass 1"] if change else []), notes
        if change:
            assert "and is not a leaf of this pass" in notes[0]


def test_summaries_that_cannot_be_compared_say_may_have_changed():
    """A NaN in a frozen weight: its summaries cannot tell values apart; the note says it is not known."""
    _, lens = train_then_dream(True, True, poison=True)
    notes = [n for p in lens.passes[2:] for n in frozen_notes(p)]
    assert any(n.startswith("model.2.bias may have changed since pass 1") and
               "whether they changed is not known" in n for n in notes), notes
    assert all("model.2.bias" not in n.split(" changed since")[0] for n in notes if " may have " not in n)
    assert [n for n in notes if " may have " in n][0].endswith("(whether they changed is not known: their values "
                                                               "could not be compared)")


def test_a_later_lens_cell_says_it_for_parameters_frozen_since_an_earlier_cell(shell):
    """Cell 1 trains with a hook that halves w's gradient; cell 2 freezes w and differentiates by u alone."""
    from test_fresh_eyes4 import STEP_CELL  # (pytest puts tests/ on sys.path)

    for cell in (STEP_CELL, "w.requires_grad_(False)\nu = torch.tensor([1.0, 1.0], requires_grad=True)\n"
                            "(w * w * u).sum().backward()\n"):
        result = shell.run_cell("%%lens --no-show\n" + cell, store_history=False)
        assert result.success, result.error_in_exec
    last = shell.user_ns["_lens"].passes[-1]
    said = [n for n in last.notes if n.startswith("w changed since pass 1 of an earlier %%lens cell, whose hooks "
                                                  "changed gradients") and "not a leaf of this pass" in n]
    assert len(said) == 1, last.notes
    # and it is true: without the hook w would have moved by its whole gradient, and u's gradient (w * w) differs
    w = torch.tensor([1.0, 2.0])
    w -= 0.1 * 2 * w
    assert not torch.equal(w * w, last.leaf_grads["u"])


def test_a_training_loop_with_every_parameter_a_leaf_sums_up_nothing(monkeypatch):
    """The work is done only for leaves of earlier passes that ran hooks and are not leaves now: none in a usual
    training loop, none after passes without hooks."""
    calls = []
    real = annotate._absent
    monkeypatch.setattr(annotate, "_absent", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = model[0].weight.register_hook(lambda g: g * 2)
    with al.Lens(names={"model": model}) as lens:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
    assert len(lens.passes) == 5 and calls == []
    h.remove()
    for hooked in (False, True):
        if hooked:
            h = model[0].weight.register_hook(lambda g: g * 2)
        model.requires_grad_(True)
        with al.Lens(names={"model": model}) as lens:
            model(torch.randn(2, 3)).sum().backward()
            model[2].requires_grad_(False)
            model(torch.randn(2, 3)).sum().backward()
        assert calls == ([1] if hooked else []) and len(lens.passes) == 2
        if hooked:
            h.remove()


def test_past_the_limit_absent_leaves_are_not_known(monkeypatch):
    """Past ABSENT_LIMIT summaries in a pass, the rest are "may have changed", never left out."""
    monkeypatch.setattr(annotate, "ABSENT_LIMIT", 1)
    _, lens = train_then_dream(True, True)
    for backward_pass in lens.passes[2:]:
        changed, unsure = frozen_notes(backward_pass)
        assert changed.startswith("model.2.bias changed since pass 1"), changed
        assert unsure.startswith("model.2.weight, model.0.bias, model.0.weight may have changed since pass 1"), unsure
