"""The note "<leaves> changed since pass N, whose hooks changed gradients" names a leaf only when it is the same
tensor object in both passes and its values differ (capture/annotate.leaf_ids, moved_leaves).

Was false: the note matched leaves across passes by their label, so a name given to a new tensor between passes
(``x = torch.tensor(...)`` per step) or two unnamed inputs (both "leaf") were said to have "changed since pass 1
... a run that never had the hooks would have reached other values": the new tensor is the same without hooks.
"""

from __future__ import annotations

import torch

import autograd_lens as al

MOVED = "changed since pass"
OTHER = "is another tensor than in pass"  # the same name, another tensor: whether it came from the hooks' gradients


def _moved_notes(lens):
    return [(p.index, n) for p in lens.passes for n in p.notes if MOVED in n]


def _other_notes(lens):
    return [(p.index, n.split(",")[0]) for p in lens.passes for n in p.notes if OTHER in n]


def test_a_name_given_to_a_new_tensor_each_step_is_not_said_to_have_changed():
    ids = []
    with al.Lens() as lens:
        for step in range(3):
            x = torch.tensor([1.0 + step, 2.0], requires_grad=True)  # a new tensor under the same name
            ids.append(id(x))
            x.register_hook(lambda g: g * 2)  # changes the gradient: pass 1 is one "whose hooks changed gradients"
            (x * 3).sum().backward()
            assert x.grad.tolist() == [6.0, 6.0]  # as plain torch: the hook doubles 3
    assert [sorted(p.leaf_grads) for p in lens.passes] == [["x"]] * 3
    assert _moved_notes(lens) == []
    # not "changed", but not known to be free of the hooks' gradients either (it could be w - lr * w.grad)
    assert _other_notes(lens) == [(1, "x is another tensor than in pass 1 (the same name"),
                                  (2, "x is another tensor than in pass 1 (the same name")]


def test_a_new_tensor_made_from_a_gradient_hooks_changed_is_said_to_be_another_tensor_of_unknown_origin():
    """A functional update (``w = w - lr * w.grad`` as a new leaf): a run without the hook reaches another w, so
    'without hooks' in the second pass (on the w it has) is not what that run gives: the note says so."""
    def program(hooked):
        w = torch.tensor([1.0, 2.0], requires_grad=True)
        grads = []
        for _ in range(2):
            if hooked:
                w.register_hook(lambda g: g * 0.5)
            (w * w).sum().backward()
            grads.append(w.grad.clone())
            w = (w - 0.1 * w.grad).detach().requires_grad_()
        return grads
    never = program(False)
    with al.Lens() as lens:
        hooked = program(True)
    assert torch.equal(lens.passes[1].leaf_grads["w"], hooked[1])
    shown = lens.passes[1].grads_without_hooks["w"]  # this pass with its hook removed, on the w it has
    assert torch.allclose(shown, torch.tensor([1.8, 3.6])) and not torch.allclose(shown, never[1])  # never: 1.6, 3.2
    assert _moved_notes(lens) == []
    assert _other_notes(lens) == [(1, "w is another tensor than in pass 1 (the same name")]


def test_a_new_tensor_that_gets_a_dead_tensors_id_is_not_the_same_leaf():
    """CPython gives a freed tensor's id() to the next one often: what the lens keeps of a leaf is not its id()."""
    with al.Lens() as lens:
        for step in range(6):
            x = torch.tensor([1.0 + step], requires_grad=True)
            x.register_hook(lambda g: g * 2)
            (x * 1).sum().backward()
            del x
    assert _moved_notes(lens) == [] and len(_other_notes(lens)) == 5
    tensors = [p.leaf_ids["x"] for p in lens.passes]
    assert len({id(same) for same in tensors}) == 6  # six tensors, whatever their id()s were


def test_a_parameter_an_optimizer_step_changed_in_place_is_still_said_to_have_changed():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    w.register_hook(lambda g: g * 0.5)
    with al.Lens() as lens:
        for _ in range(2):
            (w * w).sum().backward()
            opt.step()
            opt.zero_grad()
    assert _moved_notes(lens) == [(1, lens.passes[1].notes[0])]
    assert lens.passes[1].notes[0].startswith("w changed since pass 1, whose hooks changed gradients")
    assert lens.passes[0].leaf_ids["w"] is lens.passes[1].leaf_ids["w"]


def test_the_same_tensor_unchanged_is_not_said_to_have_changed_and_another_one_beside_it_is():
    """Two leaves: the stepped parameter moved (said), the input given anew under the same name (not said)."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    w.register_hook(lambda g: g * 0.5)
    with al.Lens() as lens:
        for step in range(2):
            x = torch.tensor([3.0 + step, 1.0], requires_grad=True)
            (w * x).sum().backward()
            opt.step()
    notes = _moved_notes(lens)
    assert len(notes) == 1 and notes[0][1].startswith("w changed since pass 1"), notes
    assert _other_notes(lens) == [(1, "x is another tensor than in pass 1 (the same name")]


def test_jacobians_of_two_unnamed_inputs_are_not_one_leaf_that_moved():
    def f(a):
        y = a * 2
        y.register_hook(lambda g: g * 2)
        return y.sin()
    first, second = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    with al.Lens() as lens:
        jac1 = torch.autograd.functional.jacobian(f, first)
        jac2 = torch.autograd.functional.jacobian(f, second)
    assert torch.allclose(jac1, torch.diag(4 * torch.cos(2 * first)))  # the hook doubles: 2 * 2cos(2a)
    assert torch.allclose(jac2, torch.diag(4 * torch.cos(2 * second)))
    assert len(lens.passes) == 4 and _moved_notes(lens) == []
    assert not [n for p in lens.passes for n in p.notes if "another tensor" in n]  # "leaf": a label by place


def test_a_name_given_to_a_new_tensor_after_an_earlier_lens_cell_is_not_said_to_have_moved(shell):
    """Cell 1 steps w with a hook changing its gradient, then gives the name w to a new tensor; cell 2 goes
    through the new w: it did not move (it was not there).  Was said: "w changed since pass 1 of an earlier
    %%lens cell"."""
    cells = ["w = torch.tensor([1.0, 2.0], requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.1)\n"
             "h = w.register_hook(lambda g: g * 0.5)\n(w * w).sum().backward()\nopt.step(); opt.zero_grad(); "
             "h.remove()\nw = torch.tensor([0.5, 1.0], requires_grad=True)\n",
             "(w * w).sum().backward()\n"]
    for cell in cells:
        result = shell.run_cell("%%lens --no-show\n" + cell, store_history=False)
        assert result.success, result.error_in_exec
    last = shell.user_ns["_lens"].passes[-1]
    assert not [n for n in last.notes if MOVED in n], last.notes
    assert [n for n in last.notes if n.startswith("w is another tensor than in pass 1 of an earlier %%lens cell")]
    assert last.leaf_grads["w"].tolist() == [1.0, 2.0]
