"""The lens's work before and after the engine runs (#24 perf): its shortcuts for the usual case give what the
general code gives.

- ``walk``: a leaf drawn once and a function with one unnamed output skip the general loops (``_SHORTCUTS``); the
  graph and every index the tracer reads are the same with the shortcuts off, on many graphs and generated programs,
  and the shortcuts are taken (counted: no ``_Builder.node`` call for such boxes).
- ``build._node_event`` (now ``build._node_read`` in the pass, ``draft.node_run`` after it) reads a node's arrows from the row the walk keeps per function (``Walk.edge_rows``; the
  walk no longer fills a dict keyed by (function, slot)): each event equals the one the old form (kept below as
  ``_old_node_event``, reading ``Walk.input_edges``) makes, on generated programs and models.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_lens as al
from autograd_lens.capture import walk as walk_module
from autograd_lens.capture.names import names_from
from autograd_lens.model import GraphOptions

sys.path.insert(0, str(Path(__file__).parent))


def _graphs():
    """(name, roots, namespace) of graphs with every kind of box: leaves used once and many times, named, unnamed,
    multi-output and root tensors, saved constants, hooks, module badges."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    h = torch.tanh(x @ w + b)
    h.register_hook(lambda g: None)
    w.register_hook(lambda g: g * 2)  # hook badges on leaves
    b.register_post_accumulate_grad_hook(lambda p: None)
    yield "mlp", [(h.pow(3) * 2.5 - 1).mean()], {"x": x, "w": w, "b": b, "h": h}
    a = torch.randn(6, requires_grad=True)
    parts = a.split(2)  # a node with three outputs, two of them used
    many = sum(a * k for k in range(1, 8))  # a leaf used seven times: one box per use
    yield "split", [(parts[0] * parts[1]).sum() + many.sum()], {"a": a, "first": parts[0]}
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net[0].register_full_backward_hook(lambda m, gi, go: None)
    out = net(torch.randn(2, 3, requires_grad=True))
    yield "module", [out.sum(), out.pow(2).mean()], {"net": net, "out": out}
    img = torch.randn(1, 2, 6, 6, requires_grad=True)
    kernel = torch.randn(3, 2, 3, 3, requires_grad=True)
    conv = F.conv2d(img, kernel, padding=1, stride=2)
    yield "conv", [F.cross_entropy(conv.flatten(1), torch.tensor([1])), conv.sum(dim=1).mean()], \
        {"img": img, "kernel": kernel}


def canonical(value, depth=0, drop=()):
    """Every field of a dataclass (its custom repr left aside) but those named in ``drop``, recursively; tensors as
    dtype, shape and values."""
    assert depth < 60
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple((item.name, canonical(getattr(value, item.name), depth + 1, drop))
                                               for item in dataclasses.fields(value) if item.name not in drop)
    if isinstance(value, dict):
        return ("dict",) + tuple((canonical(k, depth + 1, drop), canonical(v, depth + 1, drop))
                                 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(canonical(item, depth + 1, drop) for item in value)
    if isinstance(value, (set, frozenset)):
        return ("set",) + tuple(sorted(repr(canonical(item, depth + 1, drop)) for item in value))
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    if callable(value):
        return ("callable", type(value).__name__)
    return (type(value).__name__,) + tuple((k, canonical(v, depth + 1, drop)) for k, v in sorted(vars(value).items()))


def _everything(made):
    return (canonical(made.graph), made.function_ids, made.input_edges, made.output_edges, made.tensor_ids, made.labels,
            made.tensor_labels)


OPTIONS = [GraphOptions(), GraphOptions(show_saved=False), GraphOptions(split_leaf_uses=0),
           GraphOptions(split_leaf_uses=100, max_nodes=6), GraphOptions(max_elements=0)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"saved{o.show_saved}-split{o.split_leaf_uses}-"
                         f"max{o.max_nodes}-el{o.max_elements}")
@pytest.mark.parametrize("case", [name for name, _, _ in _graphs()])
def test_walk_shortcuts_draw_what_the_general_code_draws(case, options, monkeypatch):
    name, roots, namespace = next(item for item in _graphs() if item[0] == case)
    names = names_from(namespace)
    root_names = [None] * len(roots)
    made = {}
    for shortcuts in (True, False):
        monkeypatch.setattr(walk_module, "_SHORTCUTS", shortcuts)
        made[shortcuts] = _everything(walk_module.walk(roots, names, options, root_names))
    assert made[True] == made[False]
    graph = walk_module.walk(roots, names, options, root_names).graph
    assert any(node.kind == "function" for node in graph.nodes) and any(node.is_tensor for node in graph.nodes)


def test_walk_shortcuts_are_taken(monkeypatch):
    """Counted: with the shortcuts, a graph of single-use leaves and unnamed results makes none of its boxes through
    ``_Builder.node`` (tensor boxes of roots and named results still do); a leaf used more than ``split_leaf_uses``
    times still goes the general way, once per use."""
    calls = []
    original = walk_module._Builder.node

    def counted(self, **fields):
        calls.append(fields["kind"])
        return original(self, **fields)

    monkeypatch.setattr(walk_module._Builder, "node", counted)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    x = torch.randn(2, 3)
    loss = net(x).sum()
    options = GraphOptions(show_saved=False)
    made = walk_module.walk([loss], names_from({"net": net, "x": x}), options, ["loss"])
    # 6 functions, 4 parameters, and the root's tensor box (which goes the general way)
    assert calls == ["output"] and len(made.graph.nodes) == 11
    calls.clear()
    a = torch.randn(3, requires_grad=True)
    walk_module.walk([sum(a * k for k in range(6))], names_from({"a": a}), options, ["s"])
    assert calls == ["output"] + ["leaf"] * 6
    calls.clear()
    monkeypatch.setattr(walk_module, "_SHORTCUTS", False)
    walk_module.walk([loss], names_from({"net": net, "x": x}), options, ["loss"])
    assert calls == ["output"] + ["leaf"] * 4


@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_passes_of_generated_programs_are_the_same_with_the_walk_shortcuts_off(seed, monkeypatch):
    """Every pass of a generated program (tests/programs.py: hooks of every kind, several passes) is built the same
    with the walk's shortcuts on and off: the whole BackwardPass, every field."""
    import programs

    program = programs.Generator(seed).generate()
    shown = {}
    for shortcuts in (True, False):
        monkeypatch.setattr(walk_module, "_SHORTCUTS", shortcuts)
        torch.manual_seed(seed)
        run = programs.run(program, "lens")
        # (torch numbers the nodes of each run anew: their sequence numbers, which the debug evidence holds, differ)
        passes = run.lens.passes if run.lens is not None else None
        shown[shortcuts] = canonical(passes, drop=("sequence_nr", "debug")) if passes is not None else run.error
    assert shown[True] == shown[False]
    assert shown[True]


def _old_node_event(walk, step, record, next_of, drawn_outputs):
    """build._node_event as it was before edge_rows (the reference); ``input_edges`` is now made from the rows, and
    compared with the dict the old walk filled in ``test_input_edges_are_those_the_old_walk_filled``."""
    from autograd_lens.model import NodeRun

    fn = record.fn
    key, name, output_label = id(fn), fn.name(), walk.output_label
    following = next_of.get(key)
    if following is None:
        following = fn.next_functions
    targets = tuple([output_label(next_fn, output_nr) if next_fn is not None else "(no grad needed)"
                     for next_fn, output_nr in following])
    received = record.received if isinstance(record.received, tuple) else ()
    sent = record.sent if isinstance(record.sent, tuple) else ()
    return NodeRun(
        step=step, node=walk.function_ids.get(key), name=name, label=walk.labels.get(key, name), grad_in=received,
        grad_out=sent, edges=tuple([walk.input_edges.get((key, slot)) for slot in range(len(sent))]) if sent else (),
        targets=targets, in_edges=tuple([walk.output_edges.get((key, k)) for k in range(len(received))])
        if key in drawn_outputs else (None,) * len(received))


def _compare_node_events(monkeypatch):
    """Make build._node_read (whose row draft.node_run makes a NodeRun from after the pass) check each event against
    the old form; returns the list of (rows used, event)."""
    from autograd_lens.capture import build

    seen = []
    original = build._node_read

    def both(walk, record, next_of):
        row_read = original(walk, record, next_of)
        drawn_outputs = {fn_id for fn_id, _ in walk.output_edges}
        maps = (walk.function_ids, walk.labels, walk.edge_rows, walk.output_edges, drawn_outputs)
        made = build.node_run(maps, 0, *row_read)
        old = _old_node_event(walk, 0, record, next_of, drawn_outputs)
        assert canonical(made) == canonical(old)
        row = walk.edge_rows.get(id(record.fn))
        seen.append((row is not None and len(row) == len(made.grad_out) and len(row) > 0, made))
        return row_read

    monkeypatch.setattr(build, "_node_read", both)
    return seen


def test_node_events_are_those_of_the_old_form_on_models(monkeypatch):
    seen = _compare_node_events(monkeypatch)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3, requires_grad=True)
    h = net[:2](x)
    h.retain_grad()
    parts = net[2:](h).split(1, dim=1)
    loss = (parts[0] * 2 + parts[1].exp()).sum()
    with al.Lens(names={"net": net, "x": x, "h": h, "first": parts[0]}) as lens:
        loss.backward(retain_graph=True)
    with al.Lens(names={"net": net, "x": x}, max_nodes=4) as cut:  # most functions not drawn: no rows for them
        loss.backward()
    assert len(seen) == len(lens.passes[0].node_runs) + len(cut.passes[0].node_runs) >= 20
    first = seen[:len(lens.passes[0].node_runs)]
    assert all(used for used, _ in first)  # every node's arrows read from its row
    assert any(not used for used, _ in seen[len(first):])  # undrawn functions: read the general way
    assert any(target in ("x", "h", "first") for _, run in first for target in run.targets)


def test_node_events_are_those_of_the_old_form_on_generated_programs(monkeypatch):
    import programs

    seen = _compare_node_events(monkeypatch)
    for seed in range(1, 40, 3):
        torch.manual_seed(seed)
        programs.run(programs.Generator(seed).generate(), "lens")
    assert len(seen) > 100 and sum(used for used, _ in seen) > 100


def test_input_edges_are_those_the_old_walk_filled():
    """``Walk.input_edges`` (made from the rows): (function, slot) -> the arrow into the function's input at that slot,
    read back from the graph's edges as the old walk filled it: one per drawn input, none for an input not drawn."""
    for name, roots, namespace in _graphs():
        for options in OPTIONS:
            made = walk_module.walk(roots, names_from(namespace), options, [None] * len(roots))
            edges = {edge.id: edge for edge in made.graph.edges}
            shape = made.structure
            expected = {}
            for fn, following in zip(shape.nodes, shape.edges()):
                if id(fn) in shape.leaf_labels or id(fn) not in made.function_ids:
                    continue
                for slot, (next_fn, output_nr) in enumerate(following):
                    if next_fn is not None and id(next_fn) in made.function_ids:
                        expected[(id(fn), slot)] = made.function_ids[id(fn)]
            assert {key: edges[edge_id].dst for key, edge_id in made.input_edges.items()} == expected, (name, options)
            assert all(edges[edge_id].kind == "data" for edge_id in made.input_edges.values())
            assert len(made.input_edges) == sum(len(row) - row.count(None) for row in made.edge_rows.values())


@pytest.mark.parametrize("case", [name for name, _, _ in _graphs()])
def test_structure_made_with_its_users_is_the_same(case):
    """``structure(roots, users=True)`` (the tracer's: ``consumers`` made in the walk that finds the nodes, leaves found
    among the nodes with no inputs) holds what ``structure(roots)`` and its ``consumers`` made when first read hold,
    in the same order."""
    name, roots, namespace = next(item for item in _graphs() if item[0] == case)
    from autograd_lens.capture.structure import structure

    plain, made = structure(roots), structure(roots, users=True)
    assert made._consumers is not None and plain._consumers is None
    assert made.nodes == plain.nodes and made.nexts == plain.edges() and made.depth == plain.depth
    assert list(made.leaves.items()) == list(plain.leaves.items()) and made.leaves
    assert list(made.consumers.items()) == list(plain.consumers.items())


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"saved{o.show_saved}-split{o.split_leaf_uses}-"
                         f"max{o.max_nodes}-el{o.max_elements}")
@pytest.mark.parametrize("case", [name for name, _, _ in _graphs()])
def test_walk_of_a_structure_with_its_users_draws_what_the_general_code_draws(case, options, monkeypatch):
    """The walk of the tracer's Structure (its users made: the uses of each leaf counted from them, arrows drawn by
    ``rows._arrows``) equals the general code's (shortcuts off: uses counted from every node's inputs)."""
    from autograd_lens.capture.structure import structure

    name, roots, namespace = next(item for item in _graphs() if item[0] == case)
    names = names_from(namespace)
    made = {}
    for shortcuts in (True, False):
        monkeypatch.setattr(walk_module, "_SHORTCUTS", shortcuts)
        shape = structure(roots, users=True)
        shape.label(names, [None] * len(roots))
        made[shortcuts] = _everything(walk_module.walk(shape, names, options))
    assert made[True] == made[False]


def test_reduced_dims_are_read_only_where_a_node_type_can_have_them():
    """The walk reads ``structure._reduced_dims`` only for node types that can have ``_saved_dim`` (``_may_reduce``):
    a custom Function's node (attributes of its own) always; what it draws equals what the function gives for each."""
    from autograd_lens.capture.structure import _may_reduce, _reduced_dims, structure

    class Keeps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx._saved_dim, ctx._saved_self_sym_sizes = (0,), (3, 2)  # as a sum(dim=0) would keep them
            return a * 1

        @staticmethod
        def backward(ctx, g):
            return g

    a = torch.randn(3, 2, requires_grad=True)
    out = (Keeps.apply(a).sum(dim=1) * 2).mean() + a.sum(dim=[0, 1])
    shape = structure([out])
    walked = walk_module.walk([out], names_from({"a": a}), GraphOptions(), ["out"])
    reduced = {node.sequence_nr: node.reduced for node in walked.graph.nodes if node.kind == "function"}
    for fn in shape.nodes:
        if type(fn).__name__ != "AccumulateGrad":
            assert reduced[fn._sequence_nr()] == _reduced_dims(fn), fn.name()
            if _reduced_dims(fn) is not None:
                assert _may_reduce(type(fn))
    assert sorted(value for value in reduced.values() if value is not None) == [(0,), (0, 1), (1,)]


def test_inventory_of_the_listed_tensors_is_the_whole_inventory(monkeypatch):
    """``inventory.listed`` (read with the names: the named tensors, leaves and inputs with hooks or retaining their
    gradient) gives the inventory of every named tensor, leaf and input, on generated programs (hooks of every kind)."""
    import programs

    from autograd_lens.capture import inventory as inventory_module

    seen = []
    original = inventory_module.inventory

    def both(observer):
        fast = original(observer)
        listed, observer.listed = observer.listed, None
        try:
            whole = original(observer)
        finally:
            observer.listed = listed
        assert fast == whole
        seen.append((len(fast), len(listed), len(observer.names.tensor_objects) + len(observer.shape.leaves)))
        return fast

    monkeypatch.setattr(inventory_module, "inventory", both)
    for seed in range(1, 60, 3):
        torch.manual_seed(seed)
        programs.run(programs.Generator(seed).generate(), "lens")
    assert len(seen) > 20 and sum(entries for entries, _, _ in seen) > 20
    assert sum(listed for _, listed, _ in seen) < sum(every for _, _, every in seen)  # fewer looked at
