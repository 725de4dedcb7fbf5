"""A Lens block's set-up and end (#24 perf): the module hooks there before the block and after it are found from the
namespace's modules alone (``names.modules_from``), not from a ``names_from`` that also names every parameter."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import annotate
from autograd_lens.capture.names import modules_from, names_from
from test_perf_names import _awkward_model


class _Counted(dict):
    """A module's ``_parameters`` that counts how often its items are gone through."""

    reads = 0

    def items(self):
        _Counted.reads += 1
        return super().items()


def _module_hooks_as_before(namespace: dict) -> set:
    names = names_from(namespace)
    found = set()
    for module in names.module_objects:
        for hooks in (module._backward_hooks, module._backward_pre_hooks):
            found.update((names.module_name(module), key) for key in hooks)
    return found


def _namespaces() -> list[dict]:
    model = _awkward_model()
    other = nn.Sequential(nn.Linear(2, 2), model[2])  # shares a submodule with model
    holder = SimpleNamespace(net=other, w=model[0].weight)
    return [
        {"model": model},
        {"w": model[0].weight, "other": other, "model": model},
        {"layers": [model[3], model[0]], "by_name": {"a": other}, "holder": holder, "model": model, "_hidden": model},
        {"m\udcff": nn.Linear(1, 1), "x": torch.ones(2, requires_grad=True), "n": 3, "In": model},
        {},
    ]


def test_modules_from_names_modules_as_names_from():
    for namespace in _namespaces():
        fast, full = modules_from(namespace), names_from(namespace)
        assert list(fast.modules.items()) == list(full.modules.items())  # same names, same order
        assert [id(m) for m in fast.module_objects] == [id(m) for m in full.module_objects]
        for module in full.module_objects:
            assert fast.module_name(module) == full.module_name(module)


def test_module_hooks_as_before():
    for namespace in _namespaces():
        modules = names_from(namespace).module_objects
        for index, module in enumerate(modules[::3]):
            module.register_full_backward_hook(lambda *args: None)
            if index % 2:
                module.register_full_backward_pre_hook(lambda *args: None)
        found = annotate._module_hooks(namespace)
        assert found == _module_hooks_as_before(namespace)
        assert len(found) == sum(len(m._backward_hooks) + len(m._backward_pre_hooks)
                                 for m in {id(m): m for m in modules}.values()) > 0 or not modules


def test_block_reads_parameters_only_for_its_passes():
    """Before: ``with Lens()`` named every parameter as it started, and again as it ended after a pass (1 read of a
    module's parameters without a pass, 3 with one); now only the pass names them (0 and 1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh())
    model[0].__dict__["_parameters"] = _Counted(model[0]._parameters)
    x = torch.randn(4, 3)
    _Counted.reads = 0
    with al.Lens(names={"model": model, "x": x}):
        pass
    assert _Counted.reads == 0
    with al.Lens(names={"model": model, "x": x}) as lens:
        model(x).sum().backward()
    assert _Counted.reads == 1
    plain = nn.Sequential(nn.Linear(3, 2), nn.Tanh())
    plain.load_state_dict(model.state_dict())
    plain(x).sum().backward()
    assert torch.equal(plain[0].weight.grad, model[0].weight.grad)
    assert torch.equal(lens.passes[0].grads["model.0.weight"], plain[0].weight.grad)
    model.zero_grad()
    with al.Lens(names={"model": model, "x": x}) as lens:  # a hook registered in the block is still found at its end
        model(x).sum().backward()
        hook = model[0].register_full_backward_hook(lambda *args: None)  # after the forward: never fires
    hook.remove()
    assert [n.code for n in lens.notes if "module" in n.code] == ["late_module_hook"]


class _Key:
    """A dict key of the user's whose repr is counted (the lens must never call user code)."""

    reprs = 0

    def __repr__(self) -> str:
        _Key.reprs += 1
        return "_Key()"


def test_containers_make_labels_only_for_tensors_and_modules():
    """Before: every item of a list, tuple or dict (up to 64) got its label made, the repr of a dict's key included
    (a user's ``__repr__`` called at each pass and block start); now only items that are tensors or modules do.
    The names are the same."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2))
    w = torch.ones(2, requires_grad=True)
    head = nn.Linear(2, 1)
    key = _Key()
    namespace = {"losses": [0.5, 0.25, w], "log": {key: 1.0, "w": w, 3: head}, "pairs": ((1, 2), model[0]),
                 "model": model}
    _Key.reprs = 0
    names = names_from(namespace)
    modules = modules_from(namespace)
    assert _Key.reprs == 0
    assert names.tensors[id(w)] == "losses[2]"
    assert names.modules == {id(model): "model", id(model[0]): "model.0", id(head): "log[3]"} == modules.modules
    assert names.tensor_name(head.weight) == "log[3].weight" and names.tensor_name(model[0].bias) == "model.0.bias"
    v = torch.zeros(2, requires_grad=True)
    namespace["log"] = {key: v}
    assert names_from(namespace).tensors[id(v)] == "log[_Key()]" and _Key.reprs == 1  # a tensor's key: its name
    x = torch.randn(3, 2)
    with al.Lens(names={"run": {key: 0.1, "model": model}, "x": x}) as lens:
        model(x).sum().backward()
    assert _Key.reprs == 1
    assert "run['model'].0.weight" in lens.passes[0].grads
