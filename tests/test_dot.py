"""DOT text: golden files for typical graphs, determinism, and escaping of any user text.

Regenerate the golden files after an intended change with ``pytest tests/test_dot.py --update-golden``.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd_lens as al
from autograd_lens.views.dot import plain_text, record_text, to_dot

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def scalar_two_branch():
    x = torch.tensor(2.0, requires_grad=True)
    y = x**2
    z = y * 3
    w = y * 2
    out = z + w
    out.backward(retain_graph=True)
    return al.graph(out, names=locals(), legend=True)


def small_mlp():
    torch.manual_seed(0)
    w1 = torch.randn(3, 2, requires_grad=True)
    b1 = torch.zeros(3, requires_grad=True)
    w2 = torch.randn(1, 3, requires_grad=True)
    x = torch.tensor([1.0, -1.0])
    h = torch.tanh(w1 @ x + b1)
    loss = (w2 @ h).sum()
    return al.graph(loss, names=locals())


def split_graph():
    x = torch.arange(4.0, requires_grad=True)
    first, second = x.split(2)
    out = (first * 2 + second).sum()
    return al.graph(out, names=locals())


def view_in_place():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = x * 2
    v = y.view(2, 2)
    v.mul_(3)
    out = y.sum()
    return al.graph(out, names=locals())


def module_with_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    model[0].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.tensor([[0.5, -0.5]])
    loss = model(x).sum()
    return al.graph(loss, names={"model": model, "x": x, "loss": loss}, direction="backward")


def saved_tensors():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, 4.0], requires_grad=True)
    c = a * b
    d = c.exp() / b
    out = d.sum()
    return al.graph(out, names=locals())


CASES = {
    "two_branch": scalar_two_branch,
    "small_mlp": small_mlp,
    "split": split_graph,
    "view_in_place": view_in_place,
    "module_with_parameters": module_with_parameters,
    "saved_tensors": saved_tensors,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_dot(name, update_golden):
    dot = CASES[name]().to_dot()
    path = os.path.join(GOLDEN, f"{name}.dot")
    if update_golden or not os.path.exists(path):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(dot)
        if not update_golden:
            pytest.fail(f"golden file {path} was missing and has been written: check it in")
    with open(path, encoding="utf-8") as handle:
        assert dot == handle.read(), f"DOT for {name} changed; if intended, rerun with --update-golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_code_gives_the_same_dot(name):
    assert CASES[name]().to_dot() == CASES[name]().to_dot()


def test_dot_has_no_addresses_or_python_ids():
    dot = module_with_parameters().to_dot()
    assert not re.search(r"0x[0-9a-f]{6,}", dot)
    assert not re.search(r"\b\d{9,}\b", dot)  # id() values are long integers


def test_two_branch_dot_shows_values_grads_and_constants():
    dot = scalar_two_branch().to_dot()
    for text in ('"x|data 2.0|grad 20.0"', '"y|data 4.0|grad None"', '"z|data 12.0', '"w|data 8.0', '"out|data 20.0',
                 "label=3", "label=2", "PowBackward0", "cluster_legend"):
        assert text in dot, text


def test_small_matrices_are_written_one_row_per_line():
    dot = small_mlp().to_dot()
    assert re.search(r'label="w1 \[3x2\]\|data\\n\[-?[0-9.]+, -?[0-9.]+\]\\n', dot), dot


def test_backward_direction_reverses_arrows():
    dot = module_with_parameters().to_dot()
    assert "rankdir=RL" in dot and "dir=back" in dot


def test_edge_labels_and_grad_texts_are_applied():
    graph = scalar_two_branch()
    first_edge = graph.edges[0].id
    leaf = graph.find("x").id
    dot = to_dot(graph, edge_labels={first_edge: "5.0 → 2.5"}, grad_texts={leaf: "10.0"})
    assert 'label="5.0 → 2.5"' in dot and "grad 10.0" in dot


# ----------------------------------------------------------------------------- escaping

NASTY = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(NASTY)
def test_any_name_renders_and_survives(name):
    """Whatever a variable or dict key is called, the DOT parses and the name is shown."""
    from autograd_lens.views.render import render_svg

    x = torch.tensor(1.0, requires_grad=True)
    out = x * 2
    graph = al.graph(out, names={"holder": {name: x}, "out": out})
    label = f"holder[{name!r}]"
    assert graph.find(label).kind == "leaf"
    written = graph.to_dot()
    svg = render_svg(written)
    assert svg.startswith("<svg") and svg.count('class="node"') == len(graph.nodes)
    import graphviz
    import unittest.mock

    with unittest.mock.patch("autograd_lens.views.dot._Digraph", graphviz.Digraph):
        assert graph.to_dot() == written  # the DOT writer gives the library's bytes


@given(NASTY)
def test_record_text_escapes_every_special(text):
    escaped = record_text(text)
    unescaped = re.sub(r"\\(.)", "", escaped)
    assert not set('{}|<>"') & set(unescaped)


@given(NASTY)
def test_plain_text_leaves_no_bare_quote(text):
    escaped = str(plain_text(text))
    assert '"' not in re.sub(r'\\.', "", escaped)


def deep_chain(layers: int):
    x = torch.ones(1, 3, requires_grad=True)
    model = nn.Sequential(*[module for _ in range(layers) for module in (nn.Linear(3, 3), nn.Tanh())])
    out = model(x).sum()
    return al.graph(out, names={"x": x, "model": model, "out": out}, max_nodes=5000)


def test_deep_graphs_are_drawn_down_the_page_and_small_ones_across():
    """A 40-layer chain (depth ≫ width) reads by scrolling down; a teaching graph stays left to right.
    Tensor records get braces when drawn down, so their fields still stack top to bottom."""
    from autograd_lens.views.dot import orientation

    deep, shallow = deep_chain(40), deep_chain(2)
    assert orientation(deep) == "down" and orientation(shallow) == "across"
    assert orientation(scalar_two_branch()) == "across"
    deep_dot, shallow_dot = deep.to_dot(), shallow.to_dot()
    assert "rankdir=TB" in deep_dot and "rankdir=LR" in shallow_dot
    assert re.search(r'label="\{model\.0\.weight \[3x3\]\|', deep_dot), deep_dot[:2000]
    assert re.search(r'label="model\.0\.weight \[3x3\]\|', shallow_dot)
    assert "rankdir=BT" in to_dot(deep, direction="backward") and "rankdir=RL" in to_dot(shallow, direction="backward")
    # the rendered drawing is taller than wide, as the orientation promises
    from autograd_lens.views.render import render_svg

    svg = render_svg(deep_dot)
    width, height = (float(v) for v in re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
    assert height > 3 * width


# ----------------------------------------------------------------------------- the DOT writer
# to_dot writes DOT itself (the graphviz library's per-call checks were most of its time); the library stays
# the reference: the same bytes for every graph, option and name.

def _library_dot(graph, monkeypatch, **options):
    import graphviz

    from autograd_lens.views import dot as dot_module

    with monkeypatch.context() as patch:
        patch.setattr(dot_module, "_Digraph", graphviz.Digraph)
        return to_dot(graph, **options)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_dot_writer_matches_the_graphviz_library(name, direction, monkeypatch):
    graph = CASES[name]()
    options = {"direction": direction, "legend": True,
               "edge_labels": {edge.id: f'{edge.id} "gradient" \\ <b>' for edge in graph.edges[:3]}}
    assert to_dot(graph, **options) == _library_dot(graph, monkeypatch, **options)
    deep = deep_chain(20)
    assert to_dot(deep, direction=direction) == _library_dot(deep, monkeypatch, direction=direction)


@settings(max_examples=200, deadline=None)
@given(NASTY, st.booleans())
def test_quoting_matches_the_graphviz_library_for_any_text(text, no_html):
    import warnings

    import graphviz

    from autograd_lens.views.dot import _quote, _quote_short

    value = graphviz.nohtml(text) if no_html else text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the library warns about a final odd backslash; the bytes are what count
        expected = graphviz.quoting.quote(value)
    assert _quote(value) == expected and _quote_short(value) == expected
    for sample in ("<b>x</b>", "<x>\n", "node", "Graph", "-1.5", ".5", "1.", "a_b9", '"', '\\"', "a\\", "#fff"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _quote(sample) == graphviz.quoting.quote(sample), sample


def _record_text_reference(text):
    """record_text as first written, one character at a time (the table-driven version must match it)."""
    from autograd_lens.views.dot import _RECORD_SPECIALS

    out = []
    for char in text:
        if char in _RECORD_SPECIALS:
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char in "\r\t":
            out.append(" ")
        elif ord(char) >= 32:
            out.append(char)
    return "".join(out).strip() or "\\ "


def _plain_text_reference(text):
    out = []
    for char in text:
        if char in '\\"':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        else:
            out.append(" " if ord(char) < 32 else char)
    return "".join(out)


def test_escaping_matches_the_character_by_character_reference():
    import random

    from autograd_lens.views.dot import plain_text, record_text

    rng = random.Random(1)
    alphabet = [chr(i) for i in range(130)] + list("λ→∂é漢")
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert record_text(text) == _record_text_reference(text), repr(text)
        assert str(plain_text(text)) == _plain_text_reference(text), repr(text)


# ----------------------------------------------------------------------------- the usual lines written at once (#22)

def _written_both_ways(monkeypatch, make) -> tuple[str, str]:
    """``make()``'s DOT with the usual boxes and arrows written at once, and through the writer's general path."""
    from autograd_lens.views import dot as dot_module

    fast = make()
    with monkeypatch.context() as patch:
        patch.setattr(dot_module, "_Writer", type(None))  # never the writer's own type: the general path each time
        return fast, make()


def _dots_of_every_kind():
    """Graphs as graph(), the navigator and the stepper draw them: folded blocks and module outlines, hooks, grads
    on arrows and in boxes, debugging marks, saved tensors, both directions, across and down the page."""
    from autograd_lens.views.fold import expanded, fold_states
    from autograd_lens.views.passview import PassView

    graphs = [case() for case in CASES.values()] + [deep_chain(20)]
    makes = [lambda graph=graph, direction=direction: to_dot(graph, direction=direction)
             for graph in graphs for direction in ("forward", "backward")]
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh()) for _ in range(8)])
    folded = al.graph(blocks(torch.randn(2, 3)).sum(), names={"model": blocks})
    makes += [lambda state=state: expanded(folded, state).to_dot() for state, _ in fold_states(folded)[:3]]
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    model[0].weight.register_hook(lambda grad: grad * 2)
    with al.Lens(names={"model": model}) as lens:
        loss = model(torch.randn(2, 3)).sum()
        loss.backward()
        (model(torch.tensor([[float("inf"), 0.0, 1.0]])).sum() * 0).backward()  # a NaN: the debugging marks
    makes += [lambda backward_pass=backward_pass: PassView(backward_pass).dot for backward_pass in lens.passes]
    return makes


def test_the_usual_lines_are_what_the_writer_writes(monkeypatch):
    for make in _dots_of_every_kind():
        fast, general = _written_both_ways(monkeypatch, make)
        assert fast == general


def test_a_large_drawings_boxes_and_arrows_are_written_without_the_writers_attribute_calls(monkeypatch):
    """mlp-50 of the first-picture benchmark, shrunk: its boxes and arrows are each written as one line, so the
    writer's per-box attribute sorting and quoting runs only for the graph's own attributes and the outlines."""
    from autograd_lens.views import dot as dot_module

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(3, 3), nn.Tanh())])
    graph = al.graph(model(torch.randn(2, 3)).sum(), names={"model": model})
    calls = []
    original = dot_module._Digraph._attributes
    monkeypatch.setattr(dot_module._Digraph, "_attributes", staticmethod(lambda *a: calls.append(1) or original(*a)))
    dot = graph.to_dot()
    outlines = dot.count("subgraph cluster_")
    assert len(graph.nodes) > 200 and outlines > 40
    assert len(calls) == 3  # rankdir and the rest, node and edge defaults (the outlines' own writer is kept aside)
    assert dot.count(" -> ") == len(graph.edges) and dot.count(" [label=") >= len(graph.nodes)
