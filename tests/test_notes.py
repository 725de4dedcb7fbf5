"""Notes on classic mistakes: each has a case that triggers it and a near miss that must not."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.views.steps import steps_for


def codes(lens):
    return [note.code for note in lens.notes]


def run(scenario):
    lens = al.Lens()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        try:
            with lens:  # the block's own exception reaches the Lens, as in a with-statement that raises
                scenario()
        except (RuntimeError, TypeError):
            pass
    return lens


# ----------------------------------------------------------------------------- each note, triggered and not


def reads_nonleaf_grad():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.sum().backward()
    y.grad  # noqa: B018  (the mistake)


def reads_retained_grad():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.sum().backward()
    y.grad  # noqa: B018


def scaled_leaf_with_hook():
    x = torch.randn(2, 2, requires_grad=True) * 10
    x.register_hook(lambda g: g.clamp(-1, 1))
    x.sum().backward()


def real_leaf_with_hook():
    x = (torch.randn(2, 2) * 10).requires_grad_()
    x.register_hook(lambda g: g.clamp(-1, 1))
    x.sum().backward()


def legacy_module_hook():
    m = nn.Linear(2, 1)
    m.register_backward_hook(lambda module, grad_input, grad_output: None)
    m(torch.ones(1, 2)).sum().backward()


def full_module_hook():
    m = nn.Linear(2, 1)
    m.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    m(torch.ones(1, 2)).sum().backward()


def second_backward():
    x = torch.ones(2, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    y.backward()


def second_backward_retained():
    x = torch.ones(2, requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()


def hook_returns_wrong_shape():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: torch.ones(3))
    y.sum().backward()


def hook_returns_right_shape():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g * 3)
    y.sum().backward()


def double_in_place(g):
    g.mul_(2)


def hook_edits_in_place():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(double_in_place)
    (y * 3).sum().backward()


def hook_returns_new():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g * 2)
    (y * 3).sum().backward()


def full_hook_then_inplace_relu():
    m = nn.Linear(2, 2)
    m.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    nn.ReLU(inplace=True)(m(torch.ones(1, 2, requires_grad=True)))


def forward_hook_then_inplace_relu():
    m = nn.Linear(2, 2)
    m.register_forward_hook(lambda module, inputs, output: None)
    nn.ReLU(inplace=True)(m(torch.ones(1, 2, requires_grad=True))).sum().backward()


def tensor_used_three_times():
    x = torch.tensor(2.0, requires_grad=True)
    y = x ** 2
    y.register_hook(lambda g: g)
    (y * 3 + y * 2 + y).backward()


def tensor_used_once():
    x = torch.tensor(2.0, requires_grad=True)
    y = x ** 2
    y.register_hook(lambda g: g)
    (y * 3).backward()


def two_steps_without_zero_grad():
    model = nn.Linear(2, 1)
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()


def two_steps_with_zero_grad():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()


def hook_on_a_reloaded_model_old_output():
    old = nn.Linear(2, 1)
    output = old(torch.ones(1, 2))
    new = nn.Linear(2, 1)
    new.load_state_dict(old.state_dict())
    new.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    output.sum().backward()
    return new


def hook_on_a_reloaded_model_new_output():
    old = nn.Linear(2, 1)
    new = nn.Linear(2, 1)
    new.load_state_dict(old.state_dict())
    new.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    new(torch.ones(1, 2)).sum().backward()
    return new


def hook_edits_in_place_and_returns_it():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.mul_(2))
    (y * 3).sum().backward()


CASES = [
    ("inplace_hook_edit", hook_edits_in_place_and_returns_it, hook_returns_new),
    ("nonleaf_grad", reads_nonleaf_grad, reads_retained_grad),
    ("not_a_leaf", scaled_leaf_with_hook, real_leaf_with_hook),
    ("legacy_hook", legacy_module_hook, full_module_hook),
    ("freed_graph", second_backward, second_backward_retained),
    ("bad_hook_return", hook_returns_wrong_shape, hook_returns_right_shape),
    ("inplace_hook_edit", hook_edits_in_place, hook_returns_new),
    ("full_hook_then_inplace", full_hook_then_inplace_relu, forward_hook_then_inplace_relu),
    ("used_several_times", tensor_used_three_times, tensor_used_once),
    ("forgot_zero_grad", two_steps_without_zero_grad, two_steps_with_zero_grad),
]


@pytest.mark.parametrize("code, mistake, fine", CASES, ids=[f"{case[0]}-{case[1].__name__}" for case in CASES])
def test_a_note_for_the_mistake_and_none_for_the_near_miss(code, mistake, fine):
    noticed = run(mistake)
    assert codes(noticed).count(code) == 1, codes(noticed)
    (found,) = [note for note in noticed.notes if note.code == code]
    assert found.message and found.notebook.startswith("notebooks/") and found.notebook.endswith(".ipynb")
    assert code not in codes(run(fine))


def test_a_hook_registered_on_a_module_no_pass_went_through():
    with al.Lens() as lens:
        new = hook_on_a_reloaded_model_old_output()
    assert codes(lens) == ["old_model_hook"] and "new" in lens.notes[0].message
    with al.Lens() as lens:
        new = hook_on_a_reloaded_model_new_output()  # noqa: F841
    assert codes(lens) == []
    other = nn.Linear(2, 1)
    other.register_full_backward_hook(lambda module, grad_input, grad_output: None)  # before the block
    with al.Lens() as lens:
        nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()  # other is simply not used here: no note
    assert codes(lens) == []


def test_notes_appear_on_the_step_where_they_arise_and_under_a_lens_cell(capsys):
    lens = run(hook_edits_in_place)
    (note,) = lens.notes
    steps = steps_for(lens.passes[0])
    assert note.text() in steps[note.step + 1].note
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext autograd_lens\nimport torch", store_history=False)
    try:
        with capture_output() as captured:
            shell.run_cell("%%lens\nx = torch.ones(2, requires_grad=True)\ny = x * 2\n"
                           "def double_in_place(g):\n    g.mul_(2)\n"
                           "y.register_hook(double_in_place)\n(y * 3).sum().backward()")
        shown = [output.data for output in captured.outputs]
        assert any("inplace hook edit" in data.get("text/html", "") for data in shown)
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)


def test_warnings_are_still_shown_as_without_the_lens():
    with warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        reads_nonleaf_grad()
    with warnings.catch_warnings(record=True) as traced:
        warnings.simplefilter("always")
        with al.Lens():
            reads_nonleaf_grad()
    assert [str(w.message) for w in plain] == [str(w.message) for w in traced]
    assert warnings.showwarning.__name__ == "showwarning"  # the lens's wrapper is gone after the block


def test_every_note_points_to_a_notebook_that_exists():
    from pathlib import Path

    from autograd_lens.notes import MESSAGES

    root = Path(__file__).resolve().parent.parent
    for code, (_, notebook) in MESSAGES.items():
        assert (root / notebook).is_file(), f"{code} points to {notebook}"


@pytest.mark.parametrize("expression, said", [
    ("w * w", "w is used 2 times by one operation"),
    ("w * w * w", "w is used 3 times by 2 operations"),
    ("w * 2 + w * 3", "w is used by 2 operations"),
])
def test_used_several_times_counts_operations_and_uses_apart(expression, said):
    with al.Lens() as lens:
        x = torch.tensor(2.0, requires_grad=True)
        w = x * 1
        w.register_hook(lambda grad: None)
        eval(expression).backward()
    messages = [n.message for n in lens.passes[0].mistakes if n.code == "used_several_times"]
    assert len(messages) == 1 and messages[0].startswith(said + ", yet its hook fired once")


def test_forgot_zero_grad_on_a_real_model_names_a_few_leaves_and_counts_the_rest():
    """A model with hundreds of parameters made a note of every name (a GPT-2 of 4 layers: 50 names, a wall of text);
    past four the note names three and counts the rest, which are exactly the leaves torch accumulated into."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    lens = al.Lens(names={"model": model})
    with lens:
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
    found = [n for n in lens.notes if n.code == "forgot_zero_grad"]
    assert len(found) == 1
    held = [name for name, p in model.named_parameters() if p.grad is not None]  # all 6, each written twice
    assert len(held) == 6
    names = found[0].message.split(" already held")[0]
    shown, more = names.split(" and ")
    assert more == "3 more"
    assert all(name.endswith(".grad") and name[:-5].removeprefix("model.") in held for name in shown.split(", "))
    assert len(shown.split(", ")) == 3

    few = run(two_steps_without_zero_grad)  # two leaves: both named, no count
    message = next(n.message for n in few.notes if n.code == "forgot_zero_grad")
    assert " more" not in message.split(" already held")[0] and message.count(".grad,") == 1
