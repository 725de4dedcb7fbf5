"""The graph walk: what is drawn for real autograd graphs, with names, values, saved values and hooks."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture.walk import op_label
from autograd_lens.model import TensorSummary


def labels(graph, kind=None):
    return [node.label for node in graph.nodes if kind is None or node.kind == kind]


def two_branch():
    x = torch.tensor(2.0, requires_grad=True)
    y = x**2
    z = y * 3
    w = y * 2
    out = z + w
    return dict(x=x, y=y, z=z, w=w, out=out)


def test_two_branch_graph_has_names_values_and_constants():
    ns = two_branch()
    graph = al.graph(ns["out"], names=ns)
    values = {node.label: float(node.value) for node in graph.nodes if node.is_tensor}
    assert values == {"x": 2.0, "y": 4.0, "z": 12.0, "w": 8.0, "out": 20.0}
    assert graph.find("out").kind == "output" and graph.find("x").kind == "leaf"
    assert sorted(labels(graph, "constant")) == ["2", "2", "3"]  # pow's exponent, and the 3 and 2
    assert sorted(node.op for node in graph.nodes if node.kind == "function") == [
        "AddBackward0", "MulBackward0", "MulBackward0", "PowBackward0"
    ]
    assert graph.find("x").grad is None
    ns["out"].backward()
    after = al.graph(ns["out"], names=ns)
    assert float(after.find("x").grad) == 20.0


def test_edges_follow_the_data():
    ns = two_branch()
    graph = al.graph(ns["out"], names=ns)
    by_id = {node.id: node for node in graph.nodes}
    data = {(by_id[e.src].label, by_id[e.dst].label) for e in graph.edges if e.kind == "data"}
    assert ("x", "pow") in data and ("pow", "y") in data
    assert ("y", "mul") in data and ("z", "add") in data and ("w", "add") in data and ("add", "out") in data


def test_default_names_come_from_the_caller():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = (a * a).sum()
    graph = al.graph(b)
    assert "a" in labels(graph) and "b" in labels(graph)


def test_module_parameters_are_named_by_path():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(2, 3)
    loss = model(x).sum()
    graph = al.graph(loss, names={"model": model, "x": x, "loss": loss})
    leaf_labels = set(labels(graph, "leaf"))
    assert leaf_labels == {"model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"}
    assert graph.find("loss").kind == "output"
    weight = graph.find("model.0.weight")
    assert weight.shape == (4, 3) and torch.equal(weight.value, model[0].weight.detach())
    small = al.graph(loss, names={"model": model}, max_elements=8)
    summary = small.find("model.0.weight").value
    assert isinstance(summary, TensorSummary) and summary.shape == (4, 3)
    assert summary.max == pytest.approx(float(model[0].weight.detach().max()))


def test_containers_in_the_namespace_give_names():
    p = torch.tensor(1.0, requires_grad=True)
    q = torch.tensor(2.0, requires_grad=True)
    params = [p, q]
    out = params[0] * params[1]
    graph = al.graph(out, names={"params": params, "out": out})
    assert {"params[0]", "params[1]"} <= set(labels(graph))


def test_unnamed_leaves_and_intermediates_get_short_labels():
    x = torch.tensor(1.0, requires_grad=True)
    out = (x.exp() * 2).sin()
    graph = al.graph(out, names={})
    assert labels(graph, "leaf") == ["leaf"]
    assert labels(graph, "output") == ["output"]
    assert {"sin", "mul", "exp"} <= set(labels(graph, "function"))


def test_split_draws_each_used_output():
    x = torch.arange(4.0, requires_grad=True)
    first, second = x.split(2)
    out = (first * second).sum()
    graph = al.graph(out, names={"x": x, "first": first, "second": second, "out": out})
    assert {"first", "second"} <= set(labels(graph, "tensor"))
    split = [n for n in graph.nodes if n.op.startswith("SplitBackward")]
    assert len(split) == 1
    by_id = {node.id: node for node in graph.nodes}
    outs = {by_id[e.dst].label for e in graph.edges if e.src == split[0].id}
    assert outs == {"first", "second"}


def test_unnamed_outputs_of_a_multi_output_node_are_indexed():
    x = torch.arange(6.0, requires_grad=True)
    out = sum(part.sum() for part in x.chunk(3))
    graph = al.graph(out, names={})
    assert labels(graph, "tensor") == ["split[0]", "split[1]", "split[2]"]  # chunk is a split


def test_view_and_in_place_op():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = x * 1
    v = y.view(2, 2)
    v.add_(1)
    out = y.sum()
    graph = al.graph(out, names={"x": x, "y": y, "v": v, "out": out})
    ops = [node.op for node in graph.nodes if node.kind == "function"]
    assert ops == ["SumBackward0", "torch::autograd::CopySlices", "MulBackward0"]  # the view's add_ rewrote y
    assert graph.find("y").shape == (4,)


def test_saved_tensors_are_listed_on_their_function():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, 4.0], requires_grad=True)
    c = a * b
    graph = al.graph(c, names={"a": a, "b": b, "c": c})
    mul = [n for n in graph.nodes if n.op == "MulBackward0"][0]
    assert mul.detail == "saves other=b, self=a"
    e = a.exp()
    graph = al.graph(e, names={"a": a, "e": e})
    exp = [n for n in graph.nodes if n.op == "ExpBackward0"][0]
    assert exp.detail == "saves result=e"
    assert al.graph(c, names={}, show_saved=False).find("mul").detail == ""


def test_hook_badges_on_tensors():
    x = torch.tensor(1.0, requires_grad=True)
    y = x * 2
    y.retain_grad()

    def clip(g):
        return g.clamp(-1, 1)

    y.register_hook(clip)
    x.register_post_accumulate_grad_hook(lambda t: None)
    out = y * 3
    graph = al.graph(out, names={"x": x, "y": y, "out": out})
    assert graph.find("y").hooks == ("[hook] clip", "[retain_grad]")
    assert graph.find("x").hooks == ("[post-accumulate hook] <lambda>",)
    dot = graph.to_dot()
    assert "[hook] clip" in dot and "#d97706" in dot


def test_module_hooks_show_on_the_hook_node():
    layer = nn.Linear(2, 2)
    layer.register_full_backward_hook(lambda m, gi, go: None)
    x = torch.ones(1, 2, requires_grad=True)
    out = layer(x).sum()
    graph = al.graph(out, names={"layer": layer, "x": x, "out": out})
    assert "module hook boundary" in labels(graph, "function")
    assert graph.find("layer.weight").hooks == ("[module hook] layer: <lambda>",)


def test_shared_leaf_is_drawn_once_per_use():
    w = torch.tensor(0.5, requires_grad=True)
    h = torch.tensor(1.0)
    for _ in range(10):
        h = torch.tanh(h * w)
    graph = al.graph(h, names={"w": w, "h": h})
    copies = [n for n in graph.nodes if n.label == "w"]
    assert len(copies) == 10 and copies[0].detail == "use 1 of 10"
    assert len(al.graph(h, names={"w": w}, split_leaf_uses=20).nodes) < len(graph.nodes)


def test_node_limit_cuts_with_a_message():
    x = torch.tensor(1.0, requires_grad=True)
    y = x
    for _ in range(50):
        y = y * 1.01
    graph = al.graph(y, names={"x": x}, max_nodes=10)
    hidden = [n for n in graph.nodes if n.kind == "hidden"]
    assert graph.hidden_nodes == 41 and len(hidden) == 1
    assert "41 more backward functions not drawn" in hidden[0].label
    assert "max_nodes=51" in hidden[0].detail


def test_thousand_layer_mlp_builds_iteratively():
    torch.manual_seed(0)
    layers = []
    for _ in range(1000):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    model = nn.Sequential(*layers)
    loss = model(torch.randn(2, 4)).sum()
    limit = sys.getrecursionlimit()
    graph = al.graph(loss, names={"model": model}, max_nodes=10_000)
    assert sys.getrecursionlimit() == limit
    assert sum(1 for n in graph.nodes if n.kind == "function") >= 3000
    assert "model.1998.weight" in labels(graph)  # Linear at even indices, Tanh at odd
    # the default limit cuts it instead of drawing thousands of boxes
    assert al.graph(loss, names={"model": model}).hidden_nodes > 0


def test_bad_roots_get_clear_messages():
    with pytest.raises(ValueError, match="does not require grad"):
        al.graph(torch.ones(2))
    with pytest.raises(TypeError, match="not a tensor"):
        al.graph([1, 2])
    with pytest.raises(TypeError, match="at least one tensor"):
        al.graph()


def test_options_are_validated():
    x = torch.tensor(1.0, requires_grad=True)
    with pytest.raises(ValueError, match="direction"):
        al.graph(x * 2, direction="sideways")
    with pytest.raises(ValueError, match="max_nodes"):
        al.graph(x * 2, max_nodes=0)


def test_multiple_roots():
    x = torch.tensor(1.0, requires_grad=True)
    a = x * 2
    b = x * 3
    graph = al.graph(a, b, names={"x": x, "a": a, "b": b})
    assert set(labels(graph, "output")) == {"a", "b"}


@pytest.mark.parametrize("name, expected", [
    ("MulBackward0", "mul"), ("AddmmBackward0", "addmm"), ("torch::autograd::AccumulateGrad", "accumulategrad"),
    ("BackwardHookFunctionBackward", "module hook boundary"), ("SquareBackward", "square"),
])
def test_op_labels(name, expected):
    assert op_label(name) == expected


def test_boxes_and_arrows_are_what_their_dataclasses_make():
    """The walk makes Node and Edge objects without a frozen dataclass's setattr per field: each must equal (and
    hold, field by field and in order) what the dataclass's own constructor makes from the same fields."""
    import dataclasses

    from autograd_lens.model import Edge, Node

    ns = two_branch()
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    graph = al.graph(ns["out"] + net(torch.ones(2, 3)).sum(), names={**ns, "net": net})
    assert {node.kind for node in graph.nodes} >= {"leaf", "tensor", "output", "function", "constant"}
    for made, cls in [(node, Node) for node in graph.nodes] + [(edge, Edge) for edge in graph.edges]:
        values = {item.name: getattr(made, item.name) for item in dataclasses.fields(cls)}
        plain = cls(**values)
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
        assert list(vars(made)) == list(vars(plain))  # no field missing, none added, in field order
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.label = "changed"


def test_every_budget_keeps_what_the_box_count_keeps():
    """The walk skips _within_budget when every box fits: for each max_nodes around the graph's size, the functions
    drawn are the first ones _within_budget keeps (leaves counted once per use), no more, no fewer."""
    from autograd_lens.capture.names import names_from
    from autograd_lens.capture.structure import _within_budget, structure
    from autograd_lens.capture.walk import walk
    from autograd_lens.model import GraphOptions

    w = torch.tensor(0.5, requires_grad=True)
    b = torch.tensor(0.1, requires_grad=True)
    h = torch.tensor(1.0)
    for _ in range(6):
        h = torch.tanh(h * w + b)
    names = names_from({"w": w, "b": b})
    for max_nodes in range(1, 40):
        shape = structure([h])
        shape.label(names, [None])
        kept = shape.nodes[:_within_budget(shape.nodes, shape, max_nodes)]
        graph = walk(shape, names, GraphOptions(max_nodes=max_nodes, split_leaf_uses=10)).graph
        drawn = [node for node in graph.nodes if node.kind == "function"]
        assert len(drawn) == sum(1 for fn in kept if id(fn) not in shape.leaf_labels), max_nodes
        assert graph.hidden_nodes == len(shape.nodes) - len(kept), max_nodes
        leaf_boxes = [node for node in graph.nodes if node.kind == "leaf"]
        assert len(leaf_boxes) == sum(1 for fn in kept if id(fn) in shape.leaf_labels), max_nodes
        uses = {id(fn): 0 for fn in kept if id(fn) in shape.leaf_labels}
        for fn in kept:
            for next_fn, _ in fn.next_functions:
                if id(next_fn) in uses:
                    uses[id(next_fn)] += 1
        graph = walk(shape, names, GraphOptions(max_nodes=max_nodes, split_leaf_uses=1)).graph
        copies = [node for node in graph.nodes if node.kind == "leaf"]  # one box per use past one use
        assert len(copies) == sum(count if count > 1 else 1 for count in uses.values()), max_nodes


def test_structure_keeps_each_nodes_edges_as_torch_gives_them():
    """Structure reads each node's next_functions once: the same nodes, in the same slots, as torch gives them,
    and consumers as found from torch's own tuples."""
    from autograd_lens.capture.structure import structure

    x = torch.randn(3, requires_grad=True)
    a, c = torch.randn(3).split([1, 2])
    out = (x * 2).sum() + (x.exp() * c.sum()).sum() + torch.cat([a * x[:1], x[1:]]).sum()
    shape = structure([out])
    assert len(shape.nexts) == len(shape.nodes)
    consumers: dict = {}
    for fn, kept in zip(shape.nodes, shape.nexts):
        fresh = fn.next_functions
        assert len(kept) == len(fresh)
        assert all(k is f or (k[0] is f[0] and k[1] == f[1]) for k, f in zip(kept, fresh))
        for slot, (next_fn, output_nr) in enumerate(fresh):
            if next_fn is not None:
                consumers.setdefault((id(next_fn), output_nr), []).append((fn, slot))
    assert {key: [(id(fn), slot) for fn, slot in users] for key, users in shape.consumers.items()} \
        == {key: [(id(fn), slot) for fn, slot in users] for key, users in consumers.items()}
    assert shape.next_of() == {id(fn): kept for fn, kept in zip(shape.nodes, shape.nexts)}


def test_large_leaf_values_are_the_summary_the_dataclass_makes():
    """A large leaf's value on a big graph is TensorSummary(shape, dtype), made without its setattr per field."""
    import dataclasses

    from autograd_lens.capture.walk import _small
    from autograd_lens.model import GraphOptions

    for tensor in (torch.zeros(64, 64), torch.zeros(3, 7, dtype=torch.float64), torch.zeros(40, dtype=torch.int32)):
        made = _small(tensor, GraphOptions(max_elements=16), stats=False)
        plain = TensorSummary(shape=tuple(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."))
        assert made == plain and repr(made) == repr(plain) and hash(made) == hash(plain)
        assert list(vars(made)) == [item.name for item in dataclasses.fields(TensorSummary)]
        assert _small(tensor, GraphOptions(max_elements=16), False, tuple(tensor.shape)) == plain
