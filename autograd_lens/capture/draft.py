"""The part of a pass's model made after ``backward()`` returns (issue #24), from plain records.

Inside the pass, :func:`.build.read_pass` reads what needs torch's live objects (every gradient and ``.grad``
value, names, hook counts, each node's name and targets) into a :class:`PassDraft`; it holds no graph node, no user
tensor, namespace or hook: only the value copies and drawn graph the finished model keeps, and plain dicts keyed
by ``id()`` numbers read while the graph lived.  :func:`complete` makes the :class:`BackwardPass` from it when the
passes are first read (``Lens.passes``; see ``capture.deferred``), in pass order, once each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..model import BackwardPass, GradWritten, HookCall, NodeRun, PassError
from ..notes import note, pass_notes
from .annotate import moved_leaves
from .badges import with_ran_hooks
from .rows import GraphRows

_new = object.__new__  # tests/test_build.py checks that the events made here equal the dataclasses' own


@dataclass
class PassDraft:
    """One pass as read while torch's graph lived: everything :func:`complete` needs, nothing live."""

    index: int
    kind: str
    graph: GraphRows  # the drawn graph as rows: complete() makes the Graph
    # the pass's events in step order; a node run is still a plain row, (key, name, targets, received, sent, zeros), and
    # a .grad written by AccumulateGrad one too, (node, name, grad, received)
    events: list
    # the walk's plain indexes (function_ids, labels, edge_rows, output_edges, functions with drawn outputs)
    maps: tuple
    error: PassError | None
    values: dict  # build._results: per leaf key (backward) or input position (grad)
    leaf_labels: dict  # id(AccumulateGrad) -> label, as read during the pass
    input_names: tuple  # autograd.grad's inputs, by position
    roots: tuple
    notes: tuple
    inventory: tuple
    not_leaves: tuple  # (name, op) of named tensors with hooks that look like leaves and are not
    extra: dict = field(default_factory=dict)  # the tracer's fields: sources, groups, debug, kept_bytes


def node_run(maps: tuple, step: int, key: int, name: str, targets: tuple, received: Any, sent: Any,
             zeros: tuple = ()) -> NodeRun:
    """A node run from its row (see ``build._node_read``) and the walk's indexes."""
    function_ids, labels, edge_rows, output_edges, drawn_outputs = maps
    received = received if isinstance(received, tuple) else ()
    sent = sent if isinstance(sent, tuple) else ()
    row = edge_rows.get(key)  # the arrow of each input slot (None: no row, a function not drawn)
    event = _new(NodeRun)  # NodeRun(...) without a frozen dataclass's setattr per field; its fields in their order
    event.__dict__.update(
        step=step,
        node=function_ids.get(key),
        name=name,
        label=labels.get(key, name),
        grad_in=received,
        grad_out=sent,
        edges=(row if row is not None and len(row) == len(sent) else _slots(row, len(sent))) if sent else (),
        targets=targets,
        in_edges=tuple([output_edges.get((key, k)) for k in range(len(received))])
        if key in drawn_outputs else (None,) * len(received),
        zeros=zeros,
    )
    return event


def grad_written(step: int, node: str | None, name: str, grad: Any, received: Any) -> GradWritten:
    """AccumulateGrad's write from its row (see ``build.read_pass``), as ``GradWritten(...)``, its fields in order."""
    event = _new(GradWritten)
    event.__dict__.update(step=step, node=node, name=name, grad=grad, received=received, by="AccumulateGrad")
    return event


def _slots(row: tuple | None, count: int) -> tuple:
    """The arrows of ``count`` input slots from a row of another length (or none): None where it has none."""
    return tuple([row[slot] if row is not None and slot < len(row) else None for slot in range(count)])


def complete(draft: PassDraft, moving: Any = None, index: int | None = None) -> BackwardPass:
    """The pass's model.  ``moving``: the Lens's first earlier pass whose hooks changed gradients (``Ledger``);
    ``index``: its place among the Lens's passes, when a pass before it could not be made."""
    maps = draft.maps
    events = [(node_run(maps, step, *event) if len(event) == 6 else grad_written(step, *event))
              if type(event) is tuple else event for step, event in enumerate(draft.events)]
    if index is not None and index != draft.index:
        events = [dataclasses.replace(event, pass_index=index) if isinstance(event, HookCall) else event
                  for event in events]
    else:
        index = draft.index
    _number_module_calls(events)
    values = draft.values
    by_name = _names(draft)
    built = BackwardPass(
        index=index,
        kind=draft.kind,
        graph=draft.graph.graph(),
        events=tuple(events),
        leaf_grads=by_name(values["grads"]),
        grads_without_hooks=by_name(values["without"]),
        error=draft.error,
        roots=draft.roots,
        inputs=draft.input_names,
        input_grads=by_name(values["returned"]),
        added=by_name(values["added"]),
        added_without_hooks=by_name(values["added_without"]),
        unknown=by_name(values["unknown"]),
        notes=draft.notes,
        inventory=draft.inventory,
    )
    not_leaves = tuple(note("not_a_leaf", index, next((c.step for c in built.hook_calls if c.target == name), None),
                            name=name, op=op) for name, op in draft.not_leaves)
    built = dataclasses.replace(built, mistakes=pass_notes(built, tuple(values["refilled"])) + not_leaves)
    built = with_ran_hooks(built)  # badges of the hooks that ran where the walk drew none
    extra = {key: value for key, value in draft.extra.items() if key != "absent_leaves"}
    moved = moved_leaves(moving, built, extra.get("leaf_ids"), draft.extra.get("absent_leaves"))
    return dataclasses.replace(built, **extra, **moved)


def _names(draft: PassDraft) -> Any:
    """Results are kept by leaf node (backward) or input position (grad); shown by name."""
    if draft.kind == "grad":
        names = draft.input_names
        return lambda values: {names[index]: value for index, value in values.items()}
    labels = draft.leaf_labels
    return lambda values: {labels[key]: value for key, value in values.items()}


def _number_module_calls(events: list[Any]) -> None:
    """Module hooks get no call index from torch: pair them with forward calls by node order."""
    sequences: dict[tuple[str, bool], list[int]] = {}
    for event in events:
        if isinstance(event, HookCall) and event.forward_call is not None:
            calls = sequences.setdefault((event.target, event.kind.endswith("pre")), [])
            if event.forward_call not in calls:
                calls.append(event.forward_call)
    for index, event in enumerate(events):
        if isinstance(event, HookCall) and event.forward_call is not None:
            order = sorted(sequences[(event.target, event.kind.endswith("pre"))])
            events[index] = dataclasses.replace(event, forward_call=order.index(event.forward_call) + 1)
