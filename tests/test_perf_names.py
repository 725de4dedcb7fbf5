"""Names.add_module names each parameter inline (#24 perf): the same Names as the general path through add_tensor."""

from __future__ import annotations

import torch
import torch.nn as nn

from autograd_lens.capture.names import Names, names_from, printable


def _general(name: str, module: nn.Module) -> Names:
    """add_module as it was: every parameter through add_tensor, children named in named_modules() order."""
    names = Names()
    stack = [(printable(name), module)]
    while stack:
        prefix, current = stack.pop()
        if id(current) in names.modules:
            continue
        names.modules[id(current)] = prefix
        names._keep.append(current)
        names.module_objects.append(current)
        for key, param in current._parameters.items():
            if param is not None:
                names.add_tensor(f"{prefix}.{key}", param)
        children = [(f"{prefix}.{key}", child) for key, child in current._modules.items() if child is not None]
        stack.extend(reversed(children))
    return names


def _fields(names: Names) -> tuple:
    return (names.leaves, names.outputs, names.tensors, names.modules, [id(t) for t in names.tensor_objects],
            [id(m) for m in names.module_objects], [id(k) for k in names._keep])


def _awkward_model() -> nn.Module:
    shared = nn.Linear(3, 3)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), shared, nn.Sequential(shared, nn.Linear(3, 2, bias=False)))
    model.add_module("gewicht_ä", nn.Linear(2, 2))  # not ASCII, printable as is
    model.add_module("bad\udcff", nn.Linear(2, 2))  # a lone surrogate: escaped in parameter names
    model[0].register_parameter("unused", None)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    model.add_module("frozen", frozen)
    tied = nn.Linear(3, 3)
    tied.weight = model[0].weight  # one parameter under two names: the first one wins
    model.add_module("tied", tied)
    odd = nn.Module()
    base = torch.randn(4, requires_grad=True).clone()
    odd._parameters["view"] = base[:2]  # a non-leaf tensor in _parameters: named by its grad_fn
    first, _ = base.split(2)
    base.mul_(2)
    odd._parameters["broken"] = first  # torch refuses to give its grad_fn: not a name
    odd._parameters["same"] = model[0].bias
    model.add_module("odd", odd)
    return model


def test_add_module_matches_general_path():
    model = _awkward_model()
    fast = Names()
    fast.add_module("model", model)
    general = _general("model", model)
    assert _fields(fast) == _fields(general)
    assert fast.tensor_name(model[0].weight) == "model.0.weight"
    assert fast.tensor_name(model.gewicht_ä.weight) == "model.gewicht_ä.weight"
    assert fast.tensor_name(getattr(model, "bad\udcff").weight) == "model.bad\\udcff.weight"
    assert fast.tensor_name(model.odd._parameters["broken"]) is None
    view = model.odd._parameters["view"]
    assert fast.outputs[(id(view.grad_fn), view.output_nr)] == "model.odd.view"
    assert id(model.frozen.weight) not in fast.leaves and fast.tensor_name(model.frozen.weight) == "model.frozen.weight"


def test_names_from_matches_general_path_with_tensors_first():
    model = _awkward_model()
    w = model[0].weight
    namespace = {"w": w, "model": model, "layers": [model[2], model[0].bias], "_hidden": model[1]}
    fast = names_from(namespace)
    general = Names()
    general.add_tensor("w", w)
    for name, module in (("model", model), ("layers[0]", model[2])):
        reference = _general(name, module)
        for key in ("leaves", "tensors", "modules"):
            for k, v in getattr(reference, key).items():
                getattr(general, key).setdefault(k, v)
    assert fast.tensors == general.tensors and fast.leaves == general.leaves and fast.modules == general.modules
    assert fast.tensor_name(w) == "w"
