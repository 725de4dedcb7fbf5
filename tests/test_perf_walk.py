"""The walk's cheaper paths (#24 perf) draw what the general ones draw.

- ``_drawn_saved_values`` leaves unread the saved values the walk never shows (structural names that are no saved
  tensor): the drawing equals the one made from every saved value (``_saved_values``).
- ``format._nested`` writes a float without a call per number where ``format_number`` gives the same text.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from autograd_lens import format as fmt
from autograd_lens.capture import walk as walk_module
from autograd_lens.capture.names import names_from
from autograd_lens.capture.saved import _drawn_saved_values, _saved_values
from autograd_lens.model import GraphOptions
from autograd_lens.numbers import format_number


def _graphs():
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    h = torch.tanh(x @ w + b)
    yield "mlp", (h.pow(3) * 2.5 - 1).mean(), {"x": x, "w": w, "b": b, "h": h}
    idx = torch.tensor([0, 2, 2])
    picked = h.index_select(1, idx).gather(0, torch.tensor([[1, 0, 3]]))  # saved index tensors: structural names
    yield "index", picked.sum(dim=1).clamp(min=-1.0, max=2.0).sum(), {"h": h}
    img = torch.randn(1, 2, 6, 6, requires_grad=True)
    kernel = torch.randn(3, 2, 3, 3, requires_grad=True)
    out = F.conv2d(img, kernel, padding=1, stride=2)
    pooled, _ = F.max_pool2d(out, 2, return_indices=True)
    yield "conv", F.cross_entropy(pooled.flatten(1), torch.tensor([1])) + torch.cat([w, w]).norm(), \
        {"img": img, "kernel": kernel, "w": w}
    a = torch.randn(5, requires_grad=True)
    parts = a.split(2)
    yield "split", (parts[0] * parts[1] + a[:2].addcmul(a[1:3], a[3:], value=0.5)).sum(), {"a": a}


def _drawing(graph):
    return ([(n.id, n.kind, n.label, n.op, n.detail, n.shape, n.sequence_nr, n.reduced) for n in graph.nodes],
            [(e.id, e.src, e.dst, e.kind, e.label) for e in graph.edges])


@pytest.mark.parametrize("case", [name for name, _, _ in _graphs()])
def test_walk_draws_the_same_with_the_saved_values_it_shows(case, monkeypatch):
    name, loss, namespace = next(item for item in _graphs() if item[0] == case)
    names = names_from(namespace)
    options = GraphOptions()
    fast = walk_module.walk([loss], names, options, ["loss"]).graph
    monkeypatch.setattr(walk_module, "_drawn_saved_values", _saved_values)
    general = walk_module.walk([loss], names, options, ["loss"]).graph
    assert _drawing(fast) == _drawing(general)
    assert any(node.kind == "constant" for node in general.nodes) or case == "index"
    assert any(node.detail.startswith("saves") for node in general.nodes)


def test_drawn_saved_values_are_those_shown():
    torch.manual_seed(1)
    w = torch.randn(3, 4, requires_grad=True)
    m = torch.randn(2, 3)
    out = torch.addmm(torch.zeros(4), m, w, beta=0.5, alpha=2.0)
    every = dict(_saved_values(out.grad_fn))
    drawn = dict(_drawn_saved_values(out.grad_fn))
    assert set(every) - set(drawn) == {"mat1_sym_sizes", "mat1_sym_strides", "mat2_sym_sizes", "mat2_sym_strides"}
    assert drawn["alpha"] == 2.0 and drawn["beta"] == 0.5 and torch.equal(drawn["mat1"], m)
    picked = torch.randn(5, requires_grad=True).index_select(0, torch.tensor([4, 1]))
    assert torch.equal(dict(_drawn_saved_values(picked.grad_fn))["index"], torch.tensor([4, 1]))  # a tensor: kept


def _nested_general(values, limit=None):
    """format._nested as it was: one call per item."""
    if not isinstance(values, list):
        return format_number(values)
    parts, length = ["["], 1
    for index, item in enumerate(values):
        if index:
            parts.append(", ")
            length += 2
        text = _nested_general(item, None if limit is None else limit - length)
        parts.append(text)
        length += len(text)
        if limit is not None and length > limit:
            return "".join(parts)
    parts.append("]")
    return "".join(parts)


def test_nested_writes_what_it_wrote_with_a_call_per_number():
    rng = random.Random(5)
    specials = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-5, 123456.0, 20.0, -3.0, 1e16, 3, True, -7]
    for _ in range(400):
        shape = [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]
        tensor = torch.randn(*shape, dtype=torch.float64) * 10 ** rng.randint(-6, 6)
        values = tensor.tolist()
        if tensor.numel() and rng.random() < 0.3:
            flat = tensor.reshape(-1)
            flat[rng.randrange(flat.numel())] = rng.choice(specials[:10])
            values = tensor.tolist()
        if rng.random() < 0.2:
            values = [rng.choice(specials) for _ in range(rng.randint(0, 6))]
        for limit in (None, 0, 1, 5, 24, 60):
            assert fmt._nested(values, limit) == _nested_general(values, limit), (values, limit)
    assert fmt.format_value(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 24) == "[[1.0, 2.0], [3.0, 4.0]]"
