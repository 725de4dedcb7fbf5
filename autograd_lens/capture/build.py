"""Turn one observed pass into the model (:class:`~autograd_lens.model.BackwardPass`).

:func:`read_pass` runs at the end of each pass, while torch's graph is still reachable, and reads what the model
needs from it into a plain :class:`~.draft.PassDraft`; afterwards the lens keeps nothing of the graph, the hooks or
the caller's variables, and :func:`.draft.complete` makes the model when the Lens's passes are first read.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import torch

from ..model import BackwardPass, GradWritten, HookCall, NodeRun, PassError, Value, values_equal
from .hooks import function_name
from .observe import PassObserver
from .records import GradRecord, HookRecord, NodeRecord
from .rows import _VALUE
from .snapshot import snapshot
from .annotate import not_leaves, renamed_leaves
from .ending import LeafState, final_grad, late_change, stopped_by_hooks, untrusted_pass
from .leafstate import changed_by_hooks, changed_off_graph, changed_since, unrecorded_passes, unrecorded_write
from .retained import written_as_retained
from .shared import SHARED, shared_leaves, shared_write
from .unhooked import SAME, Unknown, add, carry, is_known
from .gradinputs import materializes, returned, unhooked_input
from .structure import gradient_edge
from .walk import Walk
from .counting import HookCounter, _function_key
from .draft import PassDraft, complete, node_run


def build_pass(observer: PassObserver, walk: Walk, index: int, history: dict, invocations: "HookCounter",
               result: Any = None) -> BackwardPass:
    """The model of a finished pass, made at once (the Lens makes it in two halves: :func:`read_pass` inside the
    pass, :func:`.draft.complete` when its passes are first read)."""
    return complete(read_pass(observer, walk, index, history, invocations, result))


def read_pass(observer: PassObserver, walk: Walk, index: int, history: dict, invocations: "HookCounter",
              result: Any = None) -> PassDraft:
    """What the model of a finished pass needs from torch's live objects, read while the graph lives, as a
    :class:`PassDraft` that holds none of them.  ``history`` (per leaf, across passes) and ``invocations``
    (per hook, across passes) belong to the Lens and are updated here, in pass order."""
    events: list[Any] = []
    ordinals: dict[Any, int] = {}  # (hook, node) -> calls seen in this pass
    _name_hook_boundaries(walk, observer)
    retained = written_as_retained(walk, observer)
    next_of = walk.structure.next_of()  # each node's next_functions, as read before the pass
    append, function_id, leaf_label = events.append, walk.function_ids.get, observer.shape.leaf_labels.get
    forward_calls = _forward_calls(observer.records)
    for record in observer.records:
        if retained:
            fn = record.fn if isinstance(record, NodeRecord) else getattr(record, "node_fn", None)
            if fn is not None and id(fn) in retained \
                    and not (isinstance(record, HookRecord) and record.kind == "tensor"):
                # torch writes a retain_grad() tensor's .grad after the tensor hooks, before node pre-hooks
                received = record.received if isinstance(record, NodeRecord) else record.grad_in
                for output_nr, node_id, grad, name, by in retained.pop(id(fn)):
                    value = received[output_nr] if isinstance(received, tuple) and output_nr < len(received) else None
                    append(GradWritten(step=len(events), node=node_id, name=name, grad=grad, received=value, by=by))
        if isinstance(record, NodeRecord):
            append(_node_read(walk, record, next_of))  # a plain row: complete() makes its NodeRun
        elif isinstance(record, GradRecord):  # a plain row too: complete() makes its GradWritten (draft.grad_written)
            key = id(record.fn)
            append((function_id(key), leaf_label(key, "leaf"), record.grad, record.received))
        elif isinstance(record, HookRecord):
            append(_hook_event(walk, len(events), record, index, invocations, ordinals, forward_calls))
    pass_error = None
    if observer.error is not None:
        error = observer.error
        pass_error = PassError(step=len(events), type=type(error).__name__, message=str(error))
        events.append(pass_error)
    observer.changed_by_hooks = changed_by_hooks(observer, walk, _VALUE)  # (read by _results)
    values = _results(observer, history, result)
    renamed = renamed_leaves(observer)
    if renamed:
        observer.note(renamed)
    names = _Namer(observer)
    drawn_outputs = {fn_id for fn_id, _ in walk.output_edges}  # nodes with an arrow to a tensor box of theirs
    return PassDraft(
        index=index,
        kind=observer.kind,
        graph=walk.rows,  # made into the Graph by complete(), after the pass
        events=events,
        # the walk's plain indexes (the walk itself holds torch's graph)
        maps=(walk.function_ids, walk.labels, walk.edge_rows, walk.output_edges, drawn_outputs),
        error=pass_error,
        values=values,
        leaf_labels=dict(observer.shape.leaf_labels),
        input_names=tuple(names.input_name(i, t) for i, t in enumerate(observer.inputs)),
        roots=tuple(observer.shape.root_labels),
        notes=tuple(observer.notes),
        inventory=tuple(observer.inventory),
        not_leaves=not_leaves(observer),
    )


def _name_hook_boundaries(walk: Walk, observer: PassObserver) -> None:
    """A ``BackwardHookFunctionBackward`` node where a module's backward hook (or torch's wrapper of them) ran is
    that module's hook boundary: label it with the module's path and side ("net.2 output hook boundary" where the
    gradients of the module's outputs arrive, "input" where its inputs' leave), in the drawing and on the cards."""
    found = {}
    names = observer.ensure_names() if observer.boundaries else None
    for fn_id, (module, side) in observer.boundaries.items():
        name = names.module_name(module) or type(module).__name__  # a module with no name here: its class
        found[fn_id] = f"{name} {side[:-1]} hook boundary"
    for record in observer.records:
        if isinstance(record, HookRecord) and record.module is not None and record.node_fn is not None \
                and record.target and record.node_fn.name() == "BackwardHookFunctionBackward":
            found.setdefault(id(record.node_fn), f"{record.target} hook boundary")
    walk.labels.update(found)  # drawn or not: the steps name it
    relabel(walk, {walk.function_ids[fn_id]: label for fn_id, label in found.items() if fn_id in walk.function_ids})


def relabel(walk: Walk, labels: dict[str, str]) -> None:
    """Rename backward functions (node id -> label) in the drawing and in what the steps will call them."""
    if not labels:
        return
    for fn_id, node_id in walk.function_ids.items():
        if node_id in labels:
            walk.labels[fn_id] = labels[node_id]
    walk.rows.relabel(labels)


# ----------------------------------------------------------------------------- values with and without hooks


# AccumulateGrad adopts the tensor that reaches a leaf whose .grad is None when nothing else holds it (a hook that
# keeps it decides that), and a custom backward's edit in place then reaches .grad, or not
ADOPTED_EDIT = ("a custom autograd.Function's backward edited a gradient in place in this pass; without hooks (which "
                "may hold a gradient) AccumulateGrad might have adopted that tensor as .grad, so that the edit reached "
                "it: not known")


# a hook changed a gradient and a custom backward edited one in place: whether that edit reached a tensor other
# branches hold (an edit of the hook's new tensor does not; of the one torch passed to several, it does) depends on
# the hooks
GRAD_CHANGED_IN_PASS = (".grad was replaced or written during this pass before the pass added to it (by a hook, or "
                        "through memory it shares with another gradient): what it would hold without hooks is not known")
CHANGED_AND_EDITED = ("a hook changed a gradient and a custom autograd.Function's backward edited one in place in this "
                      "pass; without hooks that edit may have reached other branches' gradients, or not: not known")


def _results(observer: PassObserver, history: dict, result: Any) -> dict[str, dict]:
    """Per leaf (backward) or per input (autograd.grad): real values, values without hooks, reasons."""
    limit = observer.store_limit
    out: dict[str, Any] = {key: {} for key in ("grads", "without", "added", "added_without", "unknown", "returned")}
    out["refilled"] = []  # leaves whose .grad still held the previous pass's gradient when this one added to it
    untrusted = untrusted_pass(observer) or getattr(observer, "changed_by_hooks", None)  # a hook changed a leaf
    unhooked = observer.unhooked
    stopped = stopped_by_hooks(observer)

    def settle(key: Any, value: Any, real: Value) -> None:
        if value is SAME:
            out["without"][key] = real
        elif isinstance(value, Unknown):
            out["without"][key] = None
            out["unknown"][key] = value.reason
        else:
            out["without"][key] = snapshot(value, limit) if isinstance(value, torch.Tensor) else value

    if observer.kind == "grad":
        materialize = materializes()
        for index, tensor in enumerate(observer.inputs):
            out["returned"][index] = snapshot(returned(result, index, observer.inputs, materialize), limit)
            if untrusted is not None:
                value: Any = untrusted
            elif stopped is not None:
                value = stopped
            elif not unhooked.active:
                value = SAME
            else:
                value = unhooked_input(observer, tensor, materialize)
            settle(index, value, out["returned"][index])
        return out
    hooked = any(map(isinstance, observer.records, repeat(HookRecord))) \
        or any(getattr(entry, "hooked", False) for entry in history.values())  # a hook ran in this Lens
    adopted: set[int] = set()  # leaves whose .grad was None before this pass
    # some leaf's .grad differed from its value without hooks after the last pass it ran in
    touched_leaves = getattr(observer, "touched", {})  # id(leaf) -> written since its last pass (tracer._run)
    any_touched = any(touched_leaves.values())
    others = any(entry.without is not SAME and entry.ref() is not None and not (
        is_known(entry.without) and values_equal(entry.without, entry.grad)) for entry in history.values())
    spread = hooked and shared_write(observer, history)  # added to shared memory: what flows on may have changed
    grads, added, added_without, unknown = out["grads"], out["added"], out["added_without"], out["unknown"]
    ran, records, old_grads, active = observer.ran, observer.records, observer.old_grads, unhooked.active
    variables = observer.shape.variables()
    unrecorded = unrecorded_passes(observer)  # passes the Lens left alone (another thread's) that may have written .grad
    for key, fn in observer.shape.leaves.items():
        variable = variables[key]
        real = final_grad(observer, variable)
        grads[key] = real
        leaf_id = id(variable)
        entry = history.get(leaf_id)
        if entry is not None and entry.ref() is not variable:
            entry = None  # another tensor that happened to get the same id
        # its .grad shared memory with another gradient after an earlier pass (and still does): not known unhooked
        shared = getattr(entry, "shared", False) and hooked
        position = ran.get(key)
        if position is None:  # not reached in this pass: .grad as before, unless hooks stopped the pass
            shared = shared and variable.grad is not None
            value = stopped or (Unknown(SHARED) if shared else carry(entry, real, others, touched_leaves.get(leaf_id), any_touched))
            if not observer.plain and changed_since(observer.start_marks.get(key), variable.grad):
                value = Unknown(GRAD_CHANGED_IN_PASS)  # by a hook: nothing else runs during a pass
            elif real is not None and stopped is None:
                value = unrecorded_write(entry, unrecorded, touched_leaves.get(leaf_id)) or value
            settle(key, value, real)
            if stopped is not None or entry is not None:
                history[leaf_id] = LeafState.of(variable, real, value, shared, hooked)
                history[leaf_id].unrecorded = unrecorded
            continue
        record = records[position]
        received = record.received
        added[key] = received
        if untrusted is not None:
            contribution: Any = untrusted
        else:
            contribution = unhooked.added(fn, received) if active else received
        # diverged: a hook changed what reached this leaf, or its .grad after the write (post-accumulate)
        diverged = contribution is not received or (active and key in unhooked.leaf)
        added_without[key] = contribution if is_known(contribution) else None
        if isinstance(contribution, Unknown):
            unknown[key] = contribution.reason
        old = old_grads.get(key)
        shared = shared and old is not None or spread
        if old is None:
            adopted.add(key)
        if entry is not None and old is not None and entry.grad is not None and values_equal(old, entry.grad) \
                and not _all_zero(old):  # zeros (zero_grad(set_to_none=False) after a zero gradient) add nothing
            out["refilled"].append(observer.shape.leaf_labels[key])
        base = carry(entry, old, others, touched_leaves.get(leaf_id), any_touched) if entry is not None else SAME
        unseen = unrecorded_write(entry, unrecorded, touched_leaves.get(leaf_id)) if old is not None else None
        if key in observer.changed_before_write:
            without: Any = Unknown(GRAD_CHANGED_IN_PASS)
        elif unseen is not None:
            without = unseen
        elif shared:
            without = Unknown(SHARED)
        elif observer.python_edits and active:
            without = Unknown(CHANGED_AND_EDITED)
        elif hooked and old is None and observer.python_edits:
            without = Unknown(ADOPTED_EDIT)
        elif base is SAME and not diverged:
            without = SAME
        else:
            without = add(old if base is SAME else base, contribution)
        late = late_change(observer, fn, position, real, without is not SAME) if is_known(without) else None
        settle(key, late or without, real)
        history[leaf_id] = state = LeafState.of(variable, real, late or without, shared, hooked)
        state.unrecorded = unrecorded
    changed_off_graph(observer, history, observer.shape.by_variable())  # (the ids of its leaves)
    for key in shared_leaves(observer, adopted) if hooked else ():
        if id(observer.shape.leaves[key].variable) in history:
            history[id(observer.shape.leaves[key].variable)].shared = True
    return out


# ----------------------------------------------------------------------------- events


def _node_read(walk: Walk, record: NodeRecord, next_of: dict) -> tuple:
    """What a node run needs from torch's live node: (key, name, targets, received, sent, zeros); :func:`.draft.node_run`
    makes the NodeRun from it after the pass."""
    fn = record.fn
    key = id(fn)
    following = next_of.get(key)
    if following is None:  # a node made during the pass
        following = fn.next_functions
    name = walk.op_names.get(key) or fn.name()  # (read by the walk for the functions it drew)
    return key, name, walk.target_labels(following), record.received, record.sent, record.zeros


def _node_event(walk: Walk, step: int, record: NodeRecord, next_of: dict, drawn_outputs: set) -> NodeRun:
    """One node run made at once (what :func:`read_pass` and :func:`.draft.complete` make in two halves)."""
    maps = (walk.function_ids, walk.labels, walk.edge_rows, walk.output_edges, drawn_outputs)
    return node_run(maps, step, *_node_read(walk, record, next_of))




def _forward_calls(records: list) -> dict:
    """Module hooks get no call index from torch: per module (and pre-hooks apart), the sequence numbers of the hook
    wrappers its calls made in this pass, in forward order.  Counted per module object: two modules shown under one
    name (two Linear with no name here) are two modules, each with its own calls."""
    numbers: dict[tuple[int, bool], set] = {}
    for record in records:
        if isinstance(record, HookRecord) and record.module is not None and record.wrapper_seq is not None:
            numbers.setdefault((id(record.module), record.kind.endswith("pre")), set()).add(record.wrapper_seq)
    return {key: sorted(seen) for key, seen in numbers.items()}


def _hook_event(walk: Walk, step: int, call: HookRecord, index: int, invocations: "HookCounter",
                ordinals: dict, forward_calls: dict) -> HookCall:
    if call.target is None and call.node_fn is not None:
        if call.kind in ("tensor", "post_accumulate_grad"):
            call.target = walk.output_label(call.node_fn, call.output_nr) if call.output_nr is not None else \
                f"an output of {walk.labels.get(id(call.node_fn), call.node_fn.name())} (which one is not known: " \
                f"{call.unplaced or 'its outputs received equal gradients'})"
        else:
            call.target = walk.labels.get(id(call.node_fn), call.node_fn.name())
    # The same function registered twice on one tensor is two hooks: within a pass, the n-th call of it at one
    # node is its n-th registration.  Calls of another function object with the same code (two closures of one
    # factory, two objects of one class) are counted apart: when one of them is removed, the other keeps its count.
    position = (call.kind, _function_key(call), id(call.node_fn), id(call.function) if call.function is not None else None)
    ordinal = ordinals.get(position, 0)
    ordinals[position] = ordinal + 1
    invocation, registration = invocations.count(call, ordinal)
    forward_call, made = call.wrapper_seq, None
    if forward_call is not None and call.module is not None:  # its module's n-th call (draft numbers by name)
        made = forward_calls[(id(call.module), call.kind.endswith("pre"))]
        forward_call = made.index(forward_call) + 1
    return HookCall(
        hook=_shown_name(call),
        kind=call.kind,
        target=call.target or "?",
        pass_index=index,
        invocation=invocation,
        registration=registration,
        grad_in=call.grad_in,
        grad_out=call.grad_out,
        modified=call.modified,
        returned_none=call.returned_none,
        node=_node_id_for(walk, call),
        step=step,
        context=call.context,
        error=call.error,
        forward_call=forward_call,
        forward_calls=len(made) if made is not None else None,
        edited_in_place=call.edited_in_place,
        unseen=call.unseen,
        may_be=invocations.ambiguous.get(registration, ()),
        grad_cleared=call.grad_none,
        value_before=call.leaf_before,
        value_after=call.leaf_after,
    )


def _shown_name(call: HookRecord) -> str:
    """The hook's name; when which of several hooks of one code ran is not known, the name they all share
    (``functools.wraps`` wrappers of one function: its name, as the drawing and the inventory show them)."""
    if call.function is None and call.candidates:
        names = {function_name(known.function) for known in call.candidates}
        if len(names) == 1:
            return names.pop()
    if call.function is None and call.shown is not None:
        return call.shown
    return function_name(call.function, call.code) if call.function is not None or call.code is not None \
        else "<C hook>"


def _node_id_for(walk: Walk, call: HookRecord) -> str | None:
    if call.node_fn is None:
        return None
    if call.kind in ("tensor", "multi_grad") and call.output_nr is not None:
        tensor_id = walk.tensor_ids.get((id(call.node_fn), call.output_nr))
        if tensor_id is not None:
            return tensor_id
    return walk.function_ids.get(id(call.node_fn))


class _Namer:
    """Results are kept by leaf node (backward) or input position (grad); shown by name."""

    def __init__(self, observer: PassObserver) -> None:
        self.observer = observer

    def by_name(self, values: dict) -> dict[str, Any]:
        observer = self.observer
        if observer.kind == "grad":
            return {self.input_name(index, observer.inputs[index]): value for index, value in values.items()}
        return {observer.shape.leaf_labels[key]: value for key, value in values.items()}

    def input_name(self, index: int, tensor: Any) -> str:
        observer = self.observer
        if isinstance(tensor, torch.Tensor):
            name = observer.ensure_names().tensor_name(tensor)
            if name is not None:
                return name
            edge = gradient_edge(tensor, observer.shape.leaves) if tensor.grad_fn is None and tensor.requires_grad else None
            if edge is not None:
                fn = edge[0]
                if id(fn) in observer.shape.leaf_labels:
                    return observer.shape.leaf_labels[id(fn)]
        return f"input {index}"


def _all_zero(value: Any) -> bool:
    """A kept .grad that holds only zeros (a summary: min and max 0); False when that cannot be told."""
    if isinstance(value, torch.Tensor):
        return value.layout == torch.strided and not value.is_complex() and not bool(value.any())
    return getattr(value, "kind", "") == "dense" and getattr(value, "min", None) == 0 == getattr(value, "max", None)
