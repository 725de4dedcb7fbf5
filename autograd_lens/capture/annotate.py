"""What a pass's model gets beside its records: the cell line that made each node, the module calls that made
them (module groups), and the names of hook boundaries only a module group can tell."""

from __future__ import annotations

import math
import re
import weakref
from typing import Any

import torch

from ..model import GradWritten, TensorSummary, values_equal
from ..notes import note
from .lines import CellLines
from .modules import ModuleCalls, groups_for
from .names import modules_from, names_from


def _sources(rows: Any, cell_lines: CellLines | None) -> dict:
    """Each backward function's cell line, or why lines are not known (``rows``: the walk's ``GraphRows``)."""
    if cell_lines is None:
        return {"sources_note": "the lines of code that made the nodes are known in %%lens cells only"}
    if cell_lines.unknown:
        return {"sources_note": f"the lines of code that made the nodes are not known: {cell_lines.unknown}"}
    sources = {}
    for node_id, sequence_nr in rows.functions():
        line = cell_lines.line_of(sequence_nr)
        if line is not None:
            sources[node_id] = line
    return {"sources": sources}


GROUP_HINT_OVER = 60  # a drawing this big without module groups suggests --modules


def _groups(graph: Any, calls: ModuleCalls | None, names: Any, asked: bool) -> dict:
    """The module calls that made the pass's nodes (``modules=True``), or why they are not known."""
    if not asked:
        if graph.count() > GROUP_HINT_OVER and names.module_objects:
            return {"groups_note": "not recorded; run the cell as %%lens --modules (or use Lens(modules=True)) to group "
                                   "the nodes by the nn.Module call that made them"}
        return {}
    if calls is None:
        return {"groups_note": "module calls were not recorded"}
    found = _grouped(graph, calls, names)
    if calls.compile_note:
        found["groups_note"] = "; ".join(note for note in (found.get("groups_note"), calls.compile_note) if note)
    return found


def _grouped(graph: Any, calls: ModuleCalls, names: Any) -> dict:
    if calls.unknown:
        return {"groups_note": f"which module made each node is not known: {calls.unknown}"}
    groups = groups_for(graph, calls, names.module_name)
    if not groups:
        return {"groups_note": "no nn.Module call made a node of this pass while the lens recorded (a node made "
                               "before the cell or block began is not grouped)"}
    return {"groups": groups, **_name_output_boundaries(graph, groups, names)}


def _name_output_boundaries(graph: Any, groups: tuple, names: Any) -> dict:
    """A hook boundary no hook ran at (the output side of a module with only a full backward hook) is named by
    its group, when that group's module has backward hooks (the boundary is then that module's)."""
    by_name = {names.module_name(module): module for module in names.module_objects}
    relabel = {}
    for group in groups:
        module = by_name.get(group.path)
        if module is None or not (module._backward_hooks or module._backward_pre_hooks):
            continue
        for node_id in group.nodes:
            node = graph.node(node_id)
            if node.kind == "function" and node.op == "BackwardHookFunctionBackward" and node.label == "module hook boundary":
                relabel[node_id] = f"{group.path} hook boundary"
    return {"relabel": relabel} if relabel else {}


def _module_hooks(namespace: dict) -> set[tuple[str, int]]:
    """(module name, hook id) of every backward hook on the named modules of ``namespace`` (read as a Lens block
    starts and ends: the modules alone, not their parameters)."""
    names = modules_from(namespace)
    found = set()
    for module in names.module_objects:
        backward, pre = module._backward_hooks, module._backward_pre_hooks
        if backward or pre:  # (most modules have neither)
            name = names.module_name(module)
            found.update((name, key) for hooks in (backward, pre) for key in hooks)
    return found


def unfired_module_hook_notes(added: set, passes: Any, notes: list, namespace: dict) -> list:
    """Notes on the module backward hooks registered in a block (``added``: (module name, key)) that never fired.
    Registered after the forward when a pass wrote the module's parameters' .grad; on a module no pass went through
    when one with a parameter requiring grad got no .grad from plain backward() passes; else the lens cannot tell."""
    fired = {call.target for p in passes for call in p.hook_calls if "module" in call.kind}
    fired.update(name for p in passes for name in p.nested_module_hooks)  # ran inside a nested backward
    written = {event.name for p in passes for event in p.events  # leaves whose .grad a pass added to
               if isinstance(event, GradWritten) and event.by == "AccumulateGrad" and event.received is not None}
    names = names_from(namespace)
    trainable = {names.module_name(module) for module in names.module_objects
                 if any(p.requires_grad for p in module.parameters())}
    by_name = {names.module_name(module): module for module in names.module_objects}
    unsure = any(p.kind != "backward" or p.inputs for p in passes)  # autograd.grad, inputs=: no parameter .grad
    found: list = []
    for name, _ in added:
        if name in fired or any(n.code.endswith("_hook") and name in n.message for n in notes + found):
            continue
        late = any(written_name.startswith(name + ".") for written_name in written) or (  # its parameters' .grad,
            name in by_name and any(names.tensor_name(p) in written for p in by_name[name].parameters()))  # tied too
        whole = _used_whole(name, written) if not late else None
        if whole and name in trainable and not unsure:  # the model it is part of was used: this part was not
            found.append(note("unused_module_hook", target=name, whole=whole))
        elif late or (name in trainable and not unsure):
            found.append(note("late_module_hook" if late else "old_model_hook", target=name))
        else:
            why = "a pass here used autograd.grad or inputs=, which write no .grad of its parameters" if unsure else \
                "it has no parameter that requires grad, whose .grad a pass through it would write"
            found.append(note("unsure_module_hook", target=name, why=why))
    return found


def _used_whole(name: str, written: set) -> str | None:
    """The innermost module containing module ``name`` (``moe`` for ``moe.experts.3``) of which a pass wrote another
    parameter's .grad: the output came from that model, not from another copy of it."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        whole = ".".join(parts[:end])
        if any(leaf.startswith(whole + ".") and not leaf.startswith(name + ".") for leaf in written):
            return whole
    return None


def leaves_may_move(earlier: Any) -> tuple[bool, bool, bool] | None:
    """``(changed, stopped, maybe)`` when ``earlier``'s hooks changed gradients, stopped it before it reached every
    leaf, or may have changed gradients (hooks in C whose values are not known, hooks in a nested backward); None
    when none of these: an optimizer step after that pass moved the leaves as a run without the hooks would have."""
    changed = any(call.modified or call.edited_in_place for call in earlier.hook_calls)
    # a hook in C whose values are not known may have changed one, or a hook in a nested backward (not steps)
    maybe = any(call.unseen and call.grad_in is None for call in earlier.hook_calls) or any(
        note.startswith("hooks ran inside a nested backward") or "ran these hooks written in C if it reached" in note
        for note in earlier.notes)
    # a hook that raised stopped the pass: leaves it had yet to reach got nothing, which they would have got
    stopped = any(call.error is not None for call in earlier.hook_calls) or earlier.error is not None and any(
        note.startswith("hooks ran inside a nested backward") for note in earlier.notes)
    return (changed, stopped, maybe) if changed or stopped or maybe else None


class LeafTensor:
    """Stands for one tensor object a pass had as a leaf: two passes' leaves are one tensor when they hold the same
    ``LeafTensor`` (compared with ``is``; it holds nothing, not even a number, so that no output depends on it)."""

    def __repr__(self) -> str:
        return "<a leaf tensor>"


# id(leaf tensor) -> (weak reference to it, its LeafTensor): each pass reads them while its leaves live, so that a
# LeafTensor is never given to another tensor, even when the first dies and another gets its id().  Process-wide, so
# that the passes of two Lenses (%%lens cells) compare
_SEEN: dict[int, tuple[Any, LeafTensor]] = {}
_PRUNE_OVER = [4096]  # entries at which the dead ones are dropped (doubled when most are alive)


def leaf_ids(shape: Any, seen: dict | None = None, register: bool = False) -> dict:
    """``{"leaf_ids": {label: LeafTensor}}`` for the pass whose graph ``shape`` is (``structure.Structure``, its
    leaves labelled), read while the pass runs.  A label two tensors have in one pass gets none (which one is which
    is not known), nor a tensor that takes no weak reference.  ``seen`` (``Ledger.leaves``: LeafTensor -> (weak
    reference, label), the leaves of the Lens's passes whose hooks may have changed gradients) gets this pass's
    when ``register``; those of them that are alive and not leaves of this pass (frozen since: constants its graph
    may use) are summed up as they are now, under ``"absent_leaves"`` (LeafTensor -> (label, summary or None: not
    summed up, past ``ABSENT_LIMIT`` of them)), for :func:`moved_leaves`."""
    found: dict[str, Any] = {}
    variables = shape.variables()
    present = set()
    for key in shape.leaves:
        label = shape.leaf_labels.get(key)
        try:
            same = _leaf_tensor(variables[key])
        except Exception:
            same = None
        if label is not None:
            found[label] = same if label not in found or found[label] is same else None
        if seen is not None and same is not None:
            present.add(same)
            if register and (label is not None or same not in seen):
                seen[same] = (_SEEN[id(variables[key])][0], label)
    if len(_SEEN) > _PRUNE_OVER[0]:
        for dead in [key for key, (ref, _) in _SEEN.items() if ref() is None]:
            del _SEEN[dead]
        _PRUNE_OVER[0] = max(4096, 2 * len(_SEEN))
    ids = {"leaf_ids": {label: same for label, same in found.items() if same is not None}}
    if seen and any(same not in present for same in seen):  # a leaf of an earlier pass is not one of this pass
        return {**ids, "absent_leaves": _absent(seen, present)}
    return ids


ABSENT_LIMIT = 1024  # summaries of absent leaves made per pass at most (the rest: whether they changed is not known)


def _absent(seen: dict, present: set) -> dict:
    """The summaries of ``seen``'s tensors that are alive and not in ``present`` (the dead ones are forgotten)."""
    from .snapshot import summarize

    absent: dict = {}
    for same, (ref, label) in list(seen.items()):
        if same in present:
            continue
        tensor = ref()
        if tensor is None:
            del seen[same]
        elif label is not None and isinstance(tensor, torch.Tensor):
            absent[same] = (label, summarize(tensor) if len(absent) < ABSENT_LIMIT else None)
    return absent


def _leaf_tensor(tensor: Any) -> LeafTensor:
    entry = _SEEN.get(id(tensor))
    if entry is not None and entry[0]() is tensor:
        return entry[1]
    same = LeafTensor()
    _SEEN[id(tensor)] = (weakref.ref(tensor), same)
    return same


def _at_start(backward_pass: Any) -> dict:
    """Each leaf's value as the pass started: as drawn (read after it), or before the first hook of the pass that
    changed the leaf itself (an optimizer step in a post-accumulate hook)."""
    values = {node.label: node.value for node in backward_pass.graph.nodes if node.kind == "leaf"}
    stepped = {call.target: call.value_before for call in reversed(backward_pass.hook_calls)
               if call.value_before is not None}
    return {label: _like(stepped[label], value) if label in stepped else value for label, value in values.items()}


def _like(value: Any, drawn: Any) -> Any:
    """``value`` kept as the drawing keeps the leaf's: summed up where it keeps a summary."""
    from .snapshot import summarize

    return summarize(value) if isinstance(value, torch.Tensor) and isinstance(drawn, TensorSummary) else value


def moved_leaves(moving: tuple[Any, tuple[bool, bool, bool]] | None, built: Any, ids: dict | None = None,
                 absent: dict | None = None) -> dict:
    """A note when leaves (parameters) hold other values than in an earlier pass whose hooks changed gradients
    (an optimizer step used them): "without hooks" is then this pass's graph with its hooks removed, on the values
    the leaves hold now, not what a run that never had the hooks would reach (its leaves would differ).  Only leaves
    that are the same tensor objects in both passes "changed" (``ids``: this pass's :func:`leaf_ids`, the earlier
    pass's ``leaf_ids``); a name that holds another tensor now (with other values) gets a note that whether its
    values came from those gradients (``w = w - lr * w.grad``) is not known; where either pass does not know which
    tensor a label was, or the leaf has no name ("leaf", "leaf_2": labels by place), nothing is said of it.
    ``moving`` is the first earlier pass for which :func:`leaves_may_move` says something, with what it says (the
    Lens keeps it, so that a pass costs the same after a thousand passes as after one).  ``absent``: leaves of the
    Lens's earlier passes that are not leaves of this one (:func:`leaf_ids`); those that were leaves of that pass and
    changed since (frozen parameters, say) get a note too: this pass's graph may use their values."""
    if moving is None:
        return {}
    now = _at_start(built)
    earlier, (changed, stopped, maybe), *cell = moving  # cell: (" of an earlier %%lens cell", its same leaves)
    where = f"pass {earlier.index + 1}{cell[0] if cell else ''}"
    before, ids, earlier_ids = _at_start(earlier), ids or {}, getattr(earlier, "leaf_ids", None) or {}
    differ = [name for name, value in now.items() if name in before and value is not None and name in ids
              and name in earlier_ids and before[name] is not None and not values_equal(value, before[name])]
    moved = [name for name in differ if (not cell or name in cell[1]) and ids[name] is earlier_ids[name]]
    others = [name for name in differ if ids[name] is not earlier_ids[name] and not _BY_PLACE.match(name)]
    frozen, unsure = _frozen_since(absent or {}, earlier_ids, before, cell[1] if cell else None)
    made_inf = _made_non_finite(earlier) if changed and not (moved or others or frozen or unsure) else []
    if made_inf:  # nothing moved here: code that skips an update on non-finite gradients (GradScaler) skipped it
        note = (f"{where}'s hooks made non-finite gradients ({_listed(made_inf)}) and no leaf here has changed since: "
                "code that skips an update on them (GradScaler's step, finding an inf) would have made it without the "
                "hooks, so a run that never had the hooks would have other values here (and other state, such as "
                "a GradScaler's scale), which the lens does not compute; 'without hooks' here is this pass with its "
                "hooks removed, on the values the leaves hold now")
        return {"notes": tuple(built.notes) + (note,)}
    if not (moved or others or frozen or unsure) and stopped:  # nothing moved; without the hooks that pass would go on
        note = (f"{where} stopped at a hook's error before it reached every leaf: if code used "
                ".grad since (an optimizer step), a run that never had the hooks would have other parameters and "
                "other values here, which the lens does not compute")
        return {"notes": tuple(built.notes) + (note,)}
    why = "changed gradients" if changed else "stopped it before it reached every leaf" if stopped else \
        "may have changed gradients (hooks in C, or in a nested backward)"
    notes = []
    if moved:  # (none: as at the first pass a hook changed, what a run without the hooks would have had too)
        notes.append(f"{_listed(moved)} changed since {where}, whose hooks {why} (an optimizer step "
                     "used them?): 'without hooks' here is this pass with its hooks removed, on the values the leaves "
                     "hold now; a run that never had the hooks would have reached other values, which the lens does "
                     "not compute")
    if others:
        one = len(others) == 1
        notes.append(f"{_listed(others)} {'is another tensor' if one else 'are other tensors'} than in {where} "
                     f"(the same name, other values), whose hooks {why}: whether {'its' if one else 'their'} values "
                     "came from gradients those hooks made (an update written as w = w - lr * w.grad) is not known; "
                     "'without hooks' here is this pass with its hooks removed, on the values the leaves hold now")
    for names, verb in ((frozen, "changed"), (unsure, "may have changed")):
        if names:
            one = len(names) == 1
            notes.append(f"{_listed(names)} {verb} since {where}, whose hooks {why} (an optimizer step used "
                         f"{'it' if one else 'them'}?), and {'is not a leaf' if one else 'are not leaves'} of this "
                         f"pass (frozen?): where this pass's graph uses {'its' if one else 'their'} values, 'without hooks' "
                         f"here is computed on the values {'it holds' if one else 'they hold'} now; a run that never "
                         "had the hooks would have had other values, which the lens does not compute"
                         + ("" if verb == "changed" else " (whether they changed is not known: their values "
                            "could not be compared)"))
    return {"notes": tuple(built.notes) + tuple(notes)} if notes else {}


def _frozen_since(absent: dict, earlier_ids: dict, before: dict, same_names: Any) -> tuple[list, list]:
    """The leaves of the earlier pass (``earlier_ids``, their values at its start ``before``) that this pass does not
    have as leaves (``absent``) and that changed since (their summaries differ), and those where it is not known."""
    from .leafstate import _compared
    from .snapshot import summarize

    now_of = {same: summary for same, (_, summary) in absent.items()}
    changed, unsure = [], []
    for label, then in before.items():  # in the earlier drawing's order
        same = earlier_ids.get(label)
        if same not in now_of or then is None or (same_names is not None and label not in same_names):
            continue
        now = now_of[same]
        then = summarize(then) if isinstance(then, torch.Tensor) else then
        if not (_compared(then) and _compared(now)):
            unsure.append(label)
        elif then != now:
            changed.append(label)
    return changed, unsure


def _made_non_finite(earlier: Any) -> list[str]:
    """The leaves whose gradient ``earlier`` left holds an inf or NaN that its run without hooks would not have
    (finite there, or not known)."""
    def non_finite(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all())
        return isinstance(value, TensorSummary) and value.norm is not None and not math.isfinite(value.norm)

    without = earlier.grads_without_hooks
    return [name for name, value in earlier.leaf_grads.items()
            if non_finite(value) and not (name not in earlier.unknown and non_finite(without.get(name)))]


_BY_PLACE = re.compile(r"leaf(_\d+)?$")  # structure.Structure.label's labels of leaves with no name


def _listed(names: list) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def renamed_leaves(observer: Any) -> str | None:
    """A note when a leaf's name, a module's parameter when the pass began, denotes another tensor at its end: the
    module put a new tensor in that place during the pass (FSDP2 puts its sharded parameters back).  The values shown
    under the name stay those of the graph's tensor; the note says whose they are."""
    names = observer.names
    if names is None or not names.owners:
        return None
    variables = observer.shape.variables()
    moved = sorted(label for key, label in observer.shape.leaf_labels.items()
                   if key in variables and names.leaves.get(id(variables[key])) == label and names.moved(variables[key]))
    if not moved:
        return None
    which = "names another tensor" if len(moved) == 1 else "name other tensors"
    return (f"After this pass, {_listed(moved)} {which} than the graph used: during the pass, a module put a new "
            "tensor in that place (FSDP2 puts its sharded parameters back). What is shown under "
            f"{'that name' if len(moved) == 1 else 'these names'} (.grad included) is the graph's tensor, the one "
            "named so when the pass began, not what the name holds now.")


def not_leaves(observer: Any) -> tuple:
    """Named tensors with hooks that look like leaves but are the result of one op on an unnamed leaf
    (``x = torch.randn(2, 2, requires_grad=True) * 10``): (name, op) each; :func:`.draft.complete` makes the notes."""
    names = observer.ensure_names()
    in_graph = None  # ids of the graph's nodes, once a named result with hooks is seen (most tensors are leaves)
    found = []
    for tensor in names.tensor_objects:
        fn = tensor.grad_fn
        if fn is None or tensor.retains_grad or not tensor._backward_hooks:
            continue
        if in_graph is None:
            in_graph = {id(node) for node in observer.shape.nodes}
        if id(fn) not in in_graph:
            continue
        inputs = [next_fn for next_fn, _ in fn.next_functions if next_fn is not None]
        if len(inputs) == 1 and type(inputs[0]).__name__ == "AccumulateGrad" \
                and names.tensor_name(inputs[0].variable) is None:
            found.append((names.tensor_name(tensor), fn.name()))
    return tuple(found)
