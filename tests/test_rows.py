"""The walk reads torch's graph into plain rows (capture/rows.py, issue #24): at the end of a large pass no Node or
Edge is made inside backward(); the Graph made from the rows afterwards is what the dataclasses make, every field in
field order, relabelled boxes included; and LeafState.of is LeafState(...)."""

from __future__ import annotations

import dataclasses
import sys
import weakref
from pathlib import Path

import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.capture import tracer
from autograd_lens.capture.leafstate import LeafState
from autograd_lens.capture.names import names_from
from autograd_lens.capture.rows import GraphRows
from autograd_lens.capture.walk import walk
from autograd_lens.model import Edge, GraphOptions, Node, TensorSummary

sys.path.insert(0, str(Path(__file__).parent))
from test_deferred import _inside_backward  # noqa: E402
from test_perf_build import canonical  # noqa: E402  (every field, tensors as their values)


def _plain(made):
    """``made`` as its dataclass's constructor makes it."""
    return type(made)(**{item.name: getattr(made, item.name) for item in dataclasses.fields(made)})


def _assert_as_the_dataclasses_make(graph) -> None:
    for made in graph.nodes + graph.edges:
        plain = _plain(made)
        assert made == plain and repr(made) == repr(plain) and hash(made) == hash(plain)
        assert list(vars(made)) == [item.name for item in dataclasses.fields(made)]


def _mlp(depth: int, width: int = 5):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def test_no_box_is_made_inside_backward_for_a_large_pass(monkeypatch):
    """A pass over EAGER_MODEL_LIMIT nodes is walked after the engine returns: its boxes and arrows stay rows until
    the passes are read (counted: no Node or Edge made while Lens._run is on the stack)."""
    made_inside = []
    for cls in (Node, Edge):
        original = cls.__init__

        def init(self, *args, _original=original, _name=cls.__name__, **kwargs):
            if _inside_backward():
                made_inside.append(_name)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", init)
    real_new = object.__new__
    news = []
    others = []  # (class name, made inside backward) of the other dataclasses made without their __init__

    def counting_new(cls, *args):
        if cls in (Node, Edge):
            news.append(_inside_backward())
        else:
            others.append((cls.__name__, _inside_backward()))
        return real_new(cls)

    for module in ("rows", "walk", "build", "draft"):  # (build made GradWritten events so, inside the pass)
        monkeypatch.setattr(f"autograd_lens.capture.{module}._new", counting_new, raising=False)
    net = _mlp(40)  # 40 x (addmm, t, tanh) + 80 leaves + sum: over EAGER_MODEL_LIMIT
    x = torch.randn(3, 5)
    loss = net(x).sum()
    with al.Lens(names={"net": net, "x": x}) as lens:
        loss.backward()
    assert not made_inside and not any(news)
    # nor an AccumulateGrad write's GradWritten, nor a large leaf's value summary: rows until the passes are read
    assert ("GradWritten", True) not in others and ("TensorSummary", True) not in others
    news.clear()
    others.clear()
    pending = lens._pending[0].graph
    assert isinstance(pending, GraphRows) and not pending.made and pending.count() > tracer.EAGER_MODEL_LIMIT
    graph = lens.passes[0].graph
    assert len(graph.nodes) == pending.count() and news and not any(news)  # made now, from the rows
    assert ("GradWritten", False) in others and ("TensorSummary", False) in others
    _assert_as_the_dataclasses_make(graph)
    # a weight (25 elements) is summarized, its summary made with the Graph; a bias (5) is a value
    weight, bias = graph.find("net.0.weight"), graph.find("net.0.bias")
    assert weight.value == TensorSummary(shape=(5, 5), dtype="float32") and _plain(weight.value) == weight.value
    assert list(vars(weight.value)) == [item.name for item in dataclasses.fields(TensorSummary)]
    assert torch.equal(bias.value, net[0].bias.detach()) and weight.shape == (5, 5)


def test_graphs_made_from_rows_are_those_the_dataclasses_make():
    """Tensor boxes of named and split results, a root, a leaf drawn once per use, saved constants and the note of
    boxes left out: every Node and Edge as its constructor makes it; relabelling before and after the Graph is made
    gives the same Graph."""
    torch.manual_seed(0)
    a = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    h = (a * 3).exp()
    first, second = h.split([1, 2])
    out = sum(w * k for k in range(6)).sum() + first.sum() * second.sum()
    names = names_from({"a": a, "w": w, "h": h, "out": out})
    for options in (GraphOptions(), GraphOptions(max_nodes=6), GraphOptions(show_saved=False)):
        walked = walk([out], names, options, ["out"])
        graph = walked.graph
        kinds = {node.kind for node in graph.nodes}
        assert {"function", "output"} <= kinds and ("leaf" in kinds or options.max_nodes == 6)
        _assert_as_the_dataclasses_make(graph)
        function = next(node for node in graph.nodes if node.kind == "function")
        labels = {function.id: "renamed"}
        early, late = walk([out], names, options, ["out"]), walk([out], names, options, ["out"])
        early.rows.relabel(labels)
        late.graph  # made first, relabelled after
        late.rows.relabel(labels)
        assert early.rows.label(function.id) == "renamed"
        assert canonical(early.graph) == canonical(late.graph) and repr(early.graph) == repr(late.graph)
        assert early.graph.node(function.id).label == "renamed"
        assert canonical(early.graph) == canonical(dataclasses.replace(graph, nodes=tuple(
            dataclasses.replace(node, label="renamed") if node.id == function.id else node for node in graph.nodes)))
    assert "constant" in {node.kind for node in walk([out], names, GraphOptions(), ["out"]).graph.nodes}
    assert walk([out], names, GraphOptions(max_nodes=6), ["out"]).graph.hidden_nodes > 0


def test_rows_answer_as_the_graph():
    """What the tracer asks of the rows before the Graph is made (boxes with a badge, a box's label, the function
    boxes' sequence numbers, the number of boxes) is what the Graph answers."""
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    out = (y.exp() * y).sum()
    names = names_from({"x": x, "y": y, "out": out})
    rows = walk([out], names, GraphOptions(), ["out"]).rows
    asked = (rows.with_badge("[retain_grad]"), {node_id: rows.label(node_id) for node_id, _ in rows.functions()},
             rows.functions(), rows.count())
    graph = rows.graph()
    assert asked[0] == {node.id for node in graph.nodes if "[retain_grad]" in node.hooks} and asked[0]
    assert asked[1] == {node.id: node.label for node in graph.nodes if node.kind == "function"}
    assert asked[2] == [(node.id, node.sequence_nr) for node in graph.nodes if node.kind == "function"]
    assert asked[3] == len(graph.nodes)
    assert (rows.with_badge("[retain_grad]"), rows.functions(), rows.count()) == (asked[0], asked[2], asked[3])


def test_leaf_state_of_is_the_dataclass():
    x = torch.randn(3, requires_grad=True)
    for grad in (None, torch.ones(3)):
        x.grad = grad
        made, plain = LeafState.of(x, "real", "without", True, False), LeafState(weakref.ref(x), "real", "without",
                                                                                  True, False)
        assert made == plain and repr(made) == repr(plain) and list(vars(made)) == list(vars(plain))
        assert made.ref() is x and (made.mark == plain.mark if grad is None else made.mark[0]() is grad)
