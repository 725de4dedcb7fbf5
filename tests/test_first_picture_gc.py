"""No cyclic collection runs while the lens walks a graph, writes its DOT or makes its page from the SVG (issue 22:
a first picture made ~9 collections, one of them a middle one, on the main thread's path to the display bundle),
and the collector is always left as the lens found it.  Collections are counted (``gc.callbacks``), never timed."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens import api
from autograd_lens.model.graph import Graph
from autograd_lens.views import graphview
from autograd_lens.views.display import graph_bundle


def mlp(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(3, 3), nn.Tanh())])
    return model, model(torch.randn(2, 3)).sum()


@pytest.fixture
def frequent():
    """Young collections every 20 net allocations (none older), as the test's own setting, put back after."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.enable()
    gc.set_threshold(20, 10**6, 10**6)
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def counting(monkeypatch, owner, name, inside):
    """``owner.name`` wrapped to count the collections that start during its calls into ``inside[name]``."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        inside.setdefault(name, 0)
        inside["now"] = name
        try:
            return original(*args, **kwargs)
        finally:
            inside["now"] = None

    monkeypatch.setattr(owner, name, wrapped)


def test_no_collection_runs_in_the_walk_the_dot_or_the_page(monkeypatch, frequent):
    model, loss = mlp(40)
    inside: dict = {"now": None}
    counting(monkeypatch, api, "walk", inside)
    counting(monkeypatch, Graph, "to_dot", inside)
    counting(monkeypatch, graphview, "slim_svg", inside)
    seen: list[str] = []

    def callback(phase, info):
        if phase == "start" and inside["now"]:
            inside[inside["now"]] += 1
        if phase == "start":
            seen.append(inside["now"] or "elsewhere")

    gc.callbacks.append(callback)
    try:
        bundle = graph_bundle(al.graph(loss, names={"model": model}))
    finally:
        gc.callbacks.remove(callback)
    assert "al-graph" in bundle["text/html"]
    assert {key: inside[key] for key in ("walk", "to_dot", "slim_svg")} == {"walk": 0, "to_dot": 0, "slim_svg": 0}
    assert "elsewhere" in seen  # the collections are not lost: they run where the lens's own work paused them
    assert gc.isenabled() and gc.get_threshold() == (20, 10**6, 10**6)


def test_no_collection_runs_in_the_walk_of_a_graph_without_modules(monkeypatch, frequent):
    """graph() with no module among the names walks without folding: that walk is paused too."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, requires_grad=True)
    h = x
    for _ in range(40):
        h = torch.tanh(h * 1.5 + 0.1)
    inside: dict = {"now": None}
    counting(monkeypatch, api, "walk", inside)

    def callback(phase, info):
        if phase == "start" and inside["now"]:
            inside[inside["now"]] += 1

    gc.callbacks.append(callback)
    try:
        drawn = al.graph(h.sum(), names={"x": x})
    finally:
        gc.callbacks.remove(callback)
    assert drawn.find("x") is not None and len(drawn.nodes) > 100
    assert inside["walk"] == 0
    assert gc.isenabled() and gc.get_threshold() == (20, 10**6, 10**6)
    gc.disable()
    try:
        al.graph(h.sum(), names={"x": x})
        assert not gc.isenabled()  # left as found
    finally:
        gc.enable()


def test_the_collector_is_left_as_found(monkeypatch):
    model, loss = mlp(40)
    enabled = gc.isenabled()
    try:
        gc.disable()  # the user's own setting: the lens does not turn the collector on
        bundle = graph_bundle(al.graph(loss, names={"model": model}))
        assert "al-graph" in bundle["text/html"] and not gc.isenabled()
        gc.enable()
        graph = al.graph(loss, names={"model": model})

        def broken(self, **options):
            assert not gc.isenabled()  # (paused here)
            raise RuntimeError("no DOT")

        monkeypatch.setattr(Graph, "to_dot", broken)
        bundle = graph_bundle(graph)  # the table and the cause, and the collector on again
        assert "no DOT" in bundle["text/html"] and gc.isenabled()

        def interrupted(self, **options):
            raise KeyboardInterrupt

        monkeypatch.setattr(Graph, "to_dot", interrupted)
        with pytest.raises(KeyboardInterrupt):
            graph_bundle(graph)
        assert gc.isenabled()
    finally:
        (gc.enable if enabled else gc.disable)()
