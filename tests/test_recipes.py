"""Recipes: hooks by name, saved as JSON, applied to a fresh model; checked against hand-written hooks."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import autograd_lens as al


def model_and_input():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), torch.randn(5, 3, requires_grad=True)


def grads_after(model, x):
    model(x).pow(3).sum().backward()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def clip_in_place(param):
    param.grad.copy_(param.grad.clamp(-0.1, 0.1))


def zero_in_place(param):
    param.grad.zero_()


BY_HAND = {
    ("clip", "tensor"): lambda m: m[0].weight.register_hook(lambda g: g.clamp(-0.1, 0.1)),
    ("clip", "post_accumulate_grad"): lambda m: m[0].weight.register_post_accumulate_grad_hook(clip_in_place),
    ("clip", "module_full"): lambda m: m[2].register_full_backward_hook(
        lambda mod, gi, go: tuple(g.clamp(-0.1, 0.1) for g in gi)),
    ("clip", "module_full_pre"): lambda m: m[2].register_full_backward_pre_hook(
        lambda mod, go: tuple(g.clamp(-0.1, 0.1) for g in go)),
    ("scale", "tensor"): lambda m: m[0].weight.register_hook(lambda g: g * 0.1),
    ("scale", "module_full"): lambda m: m[2].register_full_backward_hook(lambda mod, gi, go: tuple(g * 0.1 for g in gi)),
    ("zero", "module_full_pre"): lambda m: m[2].register_full_backward_pre_hook(
        lambda mod, go: tuple(torch.zeros_like(g) for g in go)),
    ("zero", "post_accumulate_grad"): lambda m: m[0].weight.register_post_accumulate_grad_hook(zero_in_place),
}
PARAMS = {"clip": {"max": 0.1}, "scale": {"factor": 0.1}, "zero": {}}


@pytest.mark.parametrize("hook, kind", sorted(BY_HAND))
def test_built_in_hooks_give_what_the_same_hook_written_by_hand_gives(hook, kind):
    model, x = model_and_input()
    BY_HAND[(hook, kind)](model)
    expected = grads_after(model, x)
    model, x = model_and_input()
    target = "0.weight" if kind in ("tensor", "post_accumulate_grad") else "2"
    handles = al.Recipe().add(target, kind, hook, **PARAMS[hook]).apply(model)
    got = grads_after(model, x)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    plain_model, plain_x = model_and_input()
    plain = grads_after(plain_model, plain_x)
    assert not all(torch.equal(a, b) for a, b in zip(plain, got))  # the hook did change something
    handles.remove()  # and once removed, the model is plain again
    model.zero_grad(set_to_none=True)
    x.grad = None
    assert all(torch.equal(a, b) for a, b in zip(grads_after(model, x), plain))


def test_nan_guard_and_log_norm(caplog):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
    al.Recipe().add("weight", "tensor", "nan_guard").add("weight", "tensor", "log_norm").apply(layer)
    with caplog.at_level(logging.INFO, logger="autograd_lens.recipes"):
        (layer(x) * float("inf")).sum().backward()  # an infinite gradient
        assert torch.equal(layer.weight.grad, torch.zeros(1, 2))
        layer.weight.grad = None
        layer(x).sum().backward()  # a finite one passes unchanged
    assert torch.equal(layer.weight.grad, torch.tensor([[1.0, 2.0]]))
    assert [record.getMessage() for record in caplog.records] == [
        "gradient norm 0 (shape (1, 2))", "gradient norm 2.23607 (shape (1, 2))"]


def test_your_own_hooks_by_name_and_the_registry_is_guarded():
    @al.hook("halve_rows")
    def halve_rows(grad, rows=1):
        grad = grad.clone()
        grad[:rows] *= 0.5
        return grad

    model, x = model_and_input()
    al.Recipe().add("0.weight", "tensor", "halve_rows", rows=2).apply(model)
    got = grads_after(model, x)
    model, x = model_and_input()
    model[0].weight.register_hook(lambda g: torch.cat([g[:2] * 0.5, g[2:]]))
    assert torch.equal(got[0], grads_after(model, x)[0])
    with pytest.raises(ValueError, match="already registered"):
        al.hook("clip")(lambda grad, max: grad)
    with pytest.raises(ValueError, match="must be a Python identifier"):
        al.hook("not a name")
    assert {"clip", "scale", "log_norm", "zero", "nan_guard"} <= set(al.recipes.registered())


def test_save_load_and_from_model_round_trip(tmp_path):
    recipe = al.Recipe().add("0.weight", "tensor", "clip", max=0.5).add("2", "module_full_pre", "scale", factor=2.0)
    path = tmp_path / "hooks.json"
    recipe.save(str(path))
    data = json.loads(path.read_text())
    assert data["format"] == "autograd_lens recipe" and data["version"] == 1
    assert data["entries"][0] == {"target": "0.weight", "kind": "tensor", "hook": "clip", "params": {"max": 0.5}}
    loaded = al.Recipe.load(str(path))
    assert loaded.entries == recipe.entries
    model, _ = model_and_input()
    handles = loaded.apply(model)
    assert len(handles) == 2 and al.Recipe.from_model(model).entries == recipe.entries
    handles.remove()
    assert al.Recipe.from_model(model).entries == []


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"entries": []}', "not a recipe: expected"),
    ('{"format": "autograd_lens recipe", "version": 2, "entries": []}', "version 2 is not supported"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "tensor"}]}',
     "entry 0: expected the keys"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "tensor", '
     '"hook": "__import__(\'os\').system(\'echo hi\')", "params": {}}]}', "entry 0 .* no hook named"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "sideways", '
     '"hook": "clip", "params": {"max": 1}}]}', "entry 0 .* kind must be one of"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "tensor", '
     '"hook": "clip", "params": {"max": 1, "maximum": 1}}]}', "entry 0 .* unexpected keyword argument 'maximum'"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "tensor", '
     '"hook": "clip", "params": {}}]}', "entry 0 .* missing a required argument: 'max'"),
    ('{"format": "autograd_lens recipe", "version": 1, "entries": [{"target": "a", "kind": "tensor", '
     '"hook": "clip", "params": {"max": {"nested": 1}}}]}', "entry 0 .* is not a number"),
])
def test_malformed_files_are_refused_with_a_message_naming_the_entry(text, message):
    with pytest.raises(al.RecipeError, match=message):
        al.Recipe.from_json(text)


def test_applying_is_all_or_nothing():
    model, _ = model_and_input()
    recipe = al.Recipe().add("0.weight", "tensor", "clip", max=1.0).add("9", "module_full", "zero")
    with pytest.raises(al.RecipeError, match=r"entry 1 \(module_full hook 'zero' on '9'\): the model has no module"):
        recipe.apply(model)
    assert not model[0].weight._backward_hooks  # nothing was registered
    model[2].register_backward_hook(lambda module, grad_input, grad_output: None)  # a legacy hook: torch refuses mixing
    recipe = al.Recipe().add("0.weight", "tensor", "clip", max=1.0).add("2", "module_full", "zero")
    with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks and full backward hooks"):
        recipe.apply(model)
        model(torch.randn(1, 3)).sum().backward()
    assert not model[0].weight._backward_hooks  # the first entry was taken off again
    with pytest.raises(al.RecipeError, match="no parameter 'nope'"):
        al.Recipe().add("nope", "post_accumulate_grad", "zero").apply(model)


def test_a_recipe_hook_is_shown_by_its_name_and_parameters():
    model, x = model_and_input()
    al.Recipe().add("0.weight", "tensor", "clip", max=0.5).add("2", "module_full", "scale", factor=2.0).apply(model)
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    assert sorted((call.hook, call.target) for call in lens.hook_calls) == [
        ("clip(max=0.5)", "model.0.weight"), ("scale(factor=2.0)", "model.2")]
    badges = {node.label: node.hooks for node in lens.passes[0].graph.nodes if node.hooks}
    assert "[hook] clip(max=0.5)" in badges["model.0.weight"]
    assert "[module hook] model.2: scale(factor=2.0)" in badges["model.2.weight"]


ROUND_TRIP = """
import sys, torch, torch.nn as nn, autograd_lens as al
def build():
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
folder = sys.argv[2]
x = torch.linspace(-1, 1, 15).reshape(5, 3)
if sys.argv[1] == "save":
    torch.manual_seed(0)
    model = build()
    al.Recipe().add("0.weight", "tensor", "clip", max=0.05).add("2", "module_full", "scale", factor=3.0) \\
        .add("2.bias", "post_accumulate_grad", "scale", factor=0.5).apply(model)
    torch.save(model.state_dict(), folder + "/weights.pt")
    al.Recipe.from_model(model).save(folder + "/hooks.json")
else:
    torch.manual_seed(123)  # a different initialisation: the weights must come from the file
    model = build()
    model.load_state_dict(torch.load(folder + "/weights.pt"))  # weights_only (the default): no custom objects
    al.Recipe.load(folder + "/hooks.json").apply(model)
model(x).pow(2).sum().backward()
torch.save([p.grad for p in model.parameters()], folder + "/grads_" + sys.argv[1] + ".pt")
"""


def test_round_trip_in_a_fresh_process_gives_bit_identical_gradients(tmp_path):
    for step in ("save", "load"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(ROUND_TRIP), step, str(tmp_path)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    saved = torch.load(tmp_path / "grads_save.pt")
    loaded = torch.load(tmp_path / "grads_load.pt")
    assert all(torch.equal(a, b) for a, b in zip(saved, loaded))
    entries = json.loads((tmp_path / "hooks.json").read_text())["entries"]
    assert sorted((e["target"], e["kind"], e["hook"], e["params"]["factor" if e["hook"] == "scale" else "max"])
                  for e in entries) == [("0.weight", "tensor", "clip", 0.05), ("2", "module_full", "scale", 3.0),
                                        ("2.bias", "post_accumulate_grad", "scale", 0.5)]
