"""The hooks attached before a pass starts, as the lens can list them: per target, in registration order.

Tensor hooks (on named tensors, leaves and ``autograd.grad`` inputs), ``retain_grad``, post-accumulate and
multi-grad hooks, module backward hooks (full, pre, legacy) of named modules, and global module hooks.
Hooks on backward functions (``grad_fn.register_hook`` / ``register_prehook``) come from the node's own hook
dicts, read by the observer.  Hooks on tensors with no name here cannot be listed from Python before they run;
the inventory says so instead of leaving them out silently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..model import InventoryEntry
from .hooks import function_name, multi_grad_slot, multi_grad_user_fn
from .walk import op_label

NODE_HOOKS_NOTE = ("hooks on tensors that have no name here cannot be listed before they run: one written in Python "
                   "is a step when it runs, one written in C only when it changes the gradient")


def inventory(observer: Any) -> tuple[InventoryEntry, ...]:
    """Every listable hook on the graph of ``observer``'s pass, read before the pass starts."""
    names = observer.ensure_names()
    shape = observer.shape
    entries: list[InventoryEntry] = []
    leaf_nodes = shape.by_variable()
    in_graph = shape.node_ids()
    seen: set[int] = set()
    multi: dict[int, int] = {}  # id(user function of a multi-grad hook) -> its entry
    multi_labels: dict[int, list] = {}  # its entry -> (slot, label) of each tensor: named in the order given to torch
    labelled = getattr(observer, "listed", None)  # (as the names were read: those with hooks, or retaining their gradient)
    if labelled is None:
        labelled = [(names.tensors[id(t)], t) for t in names.tensor_objects]
        labelled += [(shape.leaf_labels[id(fn)], fn.variable) for fn in leaf_nodes.values()]
        labelled += [(f"input {i}", t) for i, t in enumerate(observer.inputs) if isinstance(t, torch.Tensor)]
    for label, tensor in labelled:
        backward_hooks = getattr(tensor, "_backward_hooks", None)
        after_hooks = getattr(tensor, "_post_accumulate_grad_hooks", None)
        grad_fn = tensor.grad_fn
        if not backward_hooks and not after_hooks and (grad_fn is None or not tensor.retains_grad):
            continue  # nothing to list (most parameters): as below, without the look-ups
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        node = grad_fn if grad_fn is not None else leaf_nodes.get(id(tensor))
        if node is None or id(node) not in in_graph:
            continue
        hooks = list((backward_hooks or {}).values())
        plain = [hook for hook in hooks if multi_grad_user_fn(hook) is None]
        place = 0  # by registration: one function registered twice is two hooks, 1 of 2 and 2 of 2
        for hook in hooks:
            user = multi_grad_user_fn(hook)
            if user is None:
                place += 1
                entries.append(InventoryEntry("tensor", label, function_name(hook), place, len(plain)))
            elif id(user) in multi:  # one multi-grad hook watches several tensors: one entry naming them all
                multi_labels[multi[id(user)]].append((multi_grad_slot(hook), label))
            else:
                multi[id(user)] = len(entries)
                multi_labels[len(entries)] = [(multi_grad_slot(hook), label)]
                entries.append(InventoryEntry("multi_grad", label, function_name(user), 1, 1))
        if tensor.grad_fn is not None and tensor.retains_grad:
            entries.append(InventoryEntry("retain_grad", label, "retain_grad", 1, 1))
        after = list((after_hooks or {}).values())
        for position, hook in enumerate(after, 1):
            entries.append(InventoryEntry("post_accumulate_grad", label, function_name(hook), position, len(after)))
    for index, found in multi_labels.items():
        ordered = sorted(range(len(found)), key=lambda i: (found[i][0] is None, found[i][0] or 0, i))
        entries[index] = dataclasses.replace(entries[index], target=", ".join(found[i][1] for i in ordered))
    node_hooks = observer.node_hooks  # nodes with hooks of the user's only
    for fn in shape.nodes if node_hooks else ():  # hooks on backward functions (grad_fn.register_prehook / register_hook)
        pre, post = node_hooks.get(id(fn), ((), ()))
        if not pre and not post:
            continue
        if id(fn) in shape.leaf_labels:
            target = f"{shape.leaf_labels[id(fn)]} (AccumulateGrad)"
        else:
            output = names.outputs.get((id(fn), 0))
            target = op_label(fn.name()) + (f" → {output}" if output else "")
        for kind, hooks in (("node_pre", pre), ("node", post)):
            for position, hook in enumerate(hooks, 1):
                entries.append(InventoryEntry(kind, target, function_name(hook), position, len(hooks)))
    leaves = leaf_nodes
    copies = None  # id(module) -> the hooks torch copied at its forward (read once, if a module has hooks)
    for module in names.module_objects:
        label = names.modules[id(module)]
        legacy = module._is_full_backward_hook is False
        if not getattr(module, "_backward_pre_hooks", None) and not getattr(module, "_backward_hooks", None):
            continue
        kinds = (("_backward_pre_hooks", "module_full_pre"),
                 ("_backward_hooks", "module_legacy" if legacy else "module_full"))
        parameters = [id(parameter) for parameter in module.parameters()]
        if legacy:  # torch put its hooks on the backward function of its output at the forward, or nowhere
            if not _legacy_hooks_in_graph(observer, module):
                continue
        elif not parameters:  # nothing ties it to this graph before the pass: say so rather than guess
            entries.append(InventoryEntry("module_unknown", label, "", 1, 1))
            continue
        elif not any(parameter in leaves for parameter in parameters):
            continue  # its parameters are not in this graph: this pass does not go through it
        if not legacy and copies is None:
            copies = _copied_hooks(observer)
        copied = None if legacy else copies.get(id(module))
        for attribute, kind in kinds:
            hooks = list((getattr(module, attribute, None) or {}).values())
            if copied is not None:  # torch runs the hooks it copied at the forward: one added since does not fire
                hooks = [hook for hook in hooks if any(hook is other for other in copied)]
            for position, hook in enumerate(hooks, 1):
                entries.append(InventoryEntry(kind, label, function_name(hook), position, len(hooks)))
    from torch.nn.modules import module as module_globals

    full = getattr(module_globals, "_global_is_full_backward_hook", None)
    for attribute, kind in (("_global_backward_pre_hooks", "global_module_full_pre"),
                            ("_global_backward_hooks", "global_module_full" if full else "global_module_legacy")):
        hooks = list((getattr(module_globals, attribute, None) or {}).values())
        for position, hook in enumerate(hooks, 1):
            entries.append(InventoryEntry(kind, "every module of the pass", function_name(hook), position, len(hooks)))
    return tuple(entries)


def listed(names: Any, shape: Any, inputs: tuple) -> list[tuple[str, torch.Tensor]]:
    """(label, tensor) of the named tensors, the graph's leaves and the inputs, in that order (a leaf once, under its
    name when it has one), that have tensor or post-accumulate hooks or retain their gradient: the only ones
    ``_index_hooks`` and ``inventory.inventory`` look at (each skips every other).  One whose attributes cannot be
    read is listed: each finds that out as it did."""
    tensors, found = names.tensors, []
    variables, leaf_labels = shape.variables(), shape.leaf_labels
    labelled = [(tensors[id(t)], t) for t in names.tensor_objects]
    labelled += [(leaf_labels[id(fn)], variables[id(fn)]) for key, fn in shape.by_variable().items()
                 if key not in tensors]  # (a named leaf: listed under its name, before)
    labelled += [(f"input {i}", t) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    for entry in labelled:
        tensor = entry[1]
        try:
            if tensor._backward_hooks or getattr(tensor, "_post_accumulate_grad_hooks", None) \
                    or tensor.grad_fn is not None and tensor.retains_grad:
                found.append(entry)
        except Exception:
            found.append(entry)
    return found


def _copied_hooks(observer: Any) -> dict[int, list]:
    """id(module) -> the full backward (pre-)hooks torch copied into its ``BackwardHook`` at the forward, for the
    modules whose input-side hook boundary is in this graph (torch's closure there holds that ``BackwardHook``)."""
    found: dict[int, list] = {}
    for hooks in observer.post_hooks:  # the dict of each node's post-hooks, the lens's own among them
        for hook in (hooks or {}).values():
            for cell in getattr(hook, "__closure__", None) or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(value, torch.utils.hooks.BackwardHook) and value.module is not None:
                    found.setdefault(id(value.module), []).extend([*value.user_hooks, *value.user_pre_hooks])
    return found


def _legacy_hooks_in_graph(observer: Any, module: Any) -> bool:
    """Whether a backward function of this graph carries ``module``'s legacy backward hooks: torch registers each
    on the ``grad_fn`` of the module's output, wrapped with a weak reference to the module."""
    for hooks in observer.post_hooks:  # the dict of the lens's own post-hook on each node
        for hook in (hooks or {}).values():
            owner = getattr(hook, "module", None)
            if getattr(hook, "with_module", False) and callable(owner) and owner() is module:
                return True
    return False
