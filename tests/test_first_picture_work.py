"""Work taken off a first picture's path (issue #22), counted, never timed: the fold's structure counts its few
items without making Counters, and each size of rounded box is written once when its drawing is slimmed."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.views import fold, svgslim
from autograd_lens.views.render import render_svg, wasm_available


def mlp(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(3, 3), nn.Tanh())])
    return model, model(torch.randn(2, 3)).sum()


def test_planning_a_drawing_makes_no_counter(monkeypatch):
    made = []

    class Counted(collections.Counter):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    model, loss = mlp(40)
    graph = al.graph(loss, names={"model": model})
    monkeypatch.setattr(fold, "Counter", Counted, raising=False)
    planned = fold.plan(graph)
    assert planned.groups and not made


def test_counted_is_what_a_counter_gave():
    shapes = [("function", "mm"), ("function", "add"), ("function", "mm")]
    assert fold._counted(shapes) == tuple(sorted(collections.Counter(shapes).items())) == (
        (("function", "add"), 1), (("function", "mm"), 2))
    assert fold._counted([]) == ()


@pytest.mark.skipif(not wasm_available(), reason="the in-process renderer cannot run here")
def test_each_size_of_rounded_box_is_written_once(monkeypatch):
    model, loss = mlp(40)
    svg = render_svg(al.graph(loss, names={"model": model}).to_dot(), renderer="wasm")
    expected = svgslim.slim_svg(svg)
    sizes = []
    tail = svgslim._box_tail

    def counted(across, down, radius):
        sizes.append((across, down, radius))
        return tail(across, down, radius)

    monkeypatch.setattr(svgslim, "_box_tail", counted)
    assert svgslim.slim_svg(svg) == expected
    boxes = svg.count('stroke="black" d="M')
    assert boxes > 40 and len(sizes) == len(set(sizes)) < boxes / 2, (len(sizes), boxes)  # 53 of 121 here
