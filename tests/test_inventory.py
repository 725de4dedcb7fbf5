"""The hooks listed before a pass are the hooks that then fire: same kinds, targets, names and order."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.views.steps import steps_for


def fired(lens):
    return [(call.kind, call.target, call.hook) for call in lens.hook_calls]


def listed(lens, kinds_that_fire=True):
    return [(entry.kind, entry.target, entry.hook) for entry in lens.passes[0].inventory
            if not kinds_that_fire or entry.kind not in ("retain_grad", "module_unknown")]


def test_every_listable_hook_is_listed_in_registration_order_and_then_fires():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1))
    x = torch.ones(1, 2, requires_grad=True)

    def halve(g):
        return g / 2

    def double(g):
        return g * 2

    def both(grads):
        return None

    model[1].register_full_backward_hook(lambda m, grad_input, grad_output: None)
    model[2].register_full_backward_pre_hook(lambda m, grad_output: None)
    names = {"model": model, "x": x}
    with al.Lens(names=names) as lens:
        h = model[:2](x)
        names["h"] = h
        h.register_hook(halve)
        h.register_hook(double)
        h.retain_grad()
        x.register_post_accumulate_grad_hook(lambda t: None)
        torch.autograd.graph.register_multi_grad_hook((x, model[0].weight), both)
        model[2](h).sum().backward()
    entries = lens.passes[0].inventory
    assert [entry.text() for entry in entries if entry.target == "h"] == [
        "h: tensor hook halve (1 of 2)", "h: tensor hook double (2 of 2)", "h: retain_grad() keeps its gradient in .grad"]
    # model.1 (Tanh) has no parameters: listed as not knowable, and it does fire
    assert ("module_unknown", "model.1", "") in listed(lens, kinds_that_fire=False)
    assert sorted(listed(lens)) == sorted(call for call in fired(lens) if call[1] != "model.1")
    assert ("module_full", "model.1", "<lambda>") in fired(lens)
    # hooks on one target fire in the order listed
    assert [hook for kind, target, hook in fired(lens) if target == "h"] == ["halve", "double"]
    start = steps_for(lens.passes[0])[0]
    assert "• h: tensor hook halve (1 of 2)" in start.lines and any("cannot be listed" in line for line in start.lines)


def test_a_hook_registered_during_the_pass_fires_but_was_not_listed():
    x = torch.tensor(1.0, requires_grad=True)
    names = {"x": x}
    with al.Lens(names=names) as lens:
        y = x * 3
        names["y"] = y
        y.register_hook(lambda g: x.register_hook(lambda gx: None) and None)
        y.backward()
    assert listed(lens) == [("tensor", "y", "<lambda>")]
    assert [target for _, target, _ in fired(lens)] == ["y", "x"]


def test_global_module_hooks_are_listed_in_a_fresh_process():
    code = """
import json, torch, torch.nn as nn, autograd_lens as al
from torch.nn.modules.module import register_module_full_backward_hook
register_module_full_backward_hook(lambda module, grad_input, grad_output: None)
model = nn.Sequential(nn.Linear(2, 1))
with al.Lens(names={"model": model}) as lens:
    model(torch.ones(1, 2, requires_grad=True)).sum().backward()
print(json.dumps([[e.kind, e.target] for e in lens.passes[0].inventory] + [["fired", c.kind, c.target] for c in lens.hook_calls]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert ["global_module_full", "every module of the pass"] in found
    assert sum(1 for item in found if item[0] == "fired" and item[1] == "global_module_full") == 2  # Sequential + Linear


def test_modules_this_pass_does_not_go_through_are_not_listed_and_parameterless_ones_are_not_guessed():
    torch.manual_seed(0)
    used, unused = nn.Linear(2, 1), nn.Linear(2, 1)
    for module in (used, unused):
        module.register_full_backward_hook(lambda m, grad_input, grad_output: None)

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    elsewhere = Double()
    elsewhere.register_full_backward_hook(lambda m, grad_input, grad_output: None)
    names = {"used": used, "unused": unused, "elsewhere": elsewhere}
    with al.Lens(names=names) as lens:
        used(torch.ones(1, 2)).sum().backward()
    texts = [entry.text() for entry in lens.passes[0].inventory]
    assert "used: module full hook <lambda>" in texts
    assert not any(text.startswith("unused") for text in texts)
    assert any(text.startswith("elsewhere: has module backward hooks; whether this pass goes through it cannot be told")
               for text in texts)
    assert fired(lens) == [("module_full", "used", "<lambda>")]


def test_one_function_registered_twice_is_listed_as_two_hooks():
    """Registration, not identity: halve registered twice is 'halve (1 of 2)' and 'halve (2 of 2)', and it fires
    twice, as torch calls it."""
    calls = []

    def halve(grad):
        calls.append(grad.item())
        return grad / 2

    with al.Lens() as lens:
        x = torch.tensor(8.0, requires_grad=True)
        h = x * 1
        h.register_hook(halve)
        h.register_hook(halve)
        h.backward()
    listed = [f"{e.target}: {e.hook} ({e.position} of {e.of})" for e in lens.passes[0].inventory if e.kind == "tensor"]
    assert listed == ["h: halve (1 of 2)", "h: halve (2 of 2)"]
    assert calls == [1.0, 0.5] and x.grad.item() == 0.25


def test_legacy_hooks_of_a_module_without_parameters_are_listed_where_torch_put_them():
    """torch puts a legacy backward hook on the backward function of the module's output: a module without
    parameters is on this graph exactly when one of its functions carries that hook (the start card said "No tensor
    or module hook is attached" while the hook then fired: found reading notebook 5)."""
    import warnings

    class TwoOps(nn.Module):
        def forward(self, x):
            return x * 2 + 1

    on_graph, elsewhere = TwoOps(), TwoOps()
    for module in (on_graph, elsewhere):
        module.register_backward_hook(lambda m, grad_input, grad_output: None)
    names = {"on_graph": on_graph, "elsewhere": elsewhere}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning about non-full backward hooks
        with al.Lens(names=names) as lens:
            x = torch.tensor(1.0, requires_grad=True)
            elsewhere(torch.tensor(2.0, requires_grad=True))  # called, but its output is not in this graph
            (on_graph(x) * 3).backward()
    assert listed(lens) == [("module_legacy", "on_graph", "<lambda>")] == [
        (kind, target, hook) for kind, target, hook in fired(lens)]
    text = lens.to_html()
    assert "No hook on a named tensor or on a module is attached" not in text and "on_graph: module legacy hook" in text
