"""The teaching graph's pass (#24: "added by the lens to a teaching graph's backward()"): graphs small enough to be
walked before their pass have their saved tensors' numbers read then (``tolist()``, a copy) and written as text when
the pass's graph is made, after the pass, not inside ``backward()``.  The text is the one written before, and it
shows the numbers the tensor held when the pass was recorded, whatever happens to the tensor afterwards.

Operations are counted, never timed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_lens as al
from autograd_lens import format as fmt
from autograd_lens.capture import walk as walk_module
from autograd_lens.capture.names import names_from
from autograd_lens.capture.saved import _saved_summary
from autograd_lens.format import format_value
from autograd_lens.model import GraphOptions


def _teaching():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    return model, torch.randn(4, 3), torch.randn(4, 1)


class _Counted:
    def __init__(self, monkeypatch):
        self.calls = 0
        original = fmt._nested

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(fmt, "_nested", counted)


def test_the_teaching_pass_writes_no_saved_numbers_inside_backward(monkeypatch):
    model, x, y = _teaching()
    loss = ((model(x) - y) ** 2).mean()
    counted = _Counted(monkeypatch)
    lens = al.Lens(names={"model": model, "x": x, "y": y})
    with lens:
        loss.backward()
    assert counted.calls == 0  # (before: one _nested call per saved tensor written, and more per row)
    graph = lens.passes[0].graph
    assert counted.calls > 0  # written when the graph is made
    details = [node.detail for node in graph.nodes if node.detail.startswith("saves")]
    assert len(details) >= 5
    # the numbers are the ones torch saved: the first Linear's input is x itself (named), the tanh's result is not
    first = torch.tanh(model[0](x))
    second = torch.tanh(model[2](first))
    tanhs = [node.detail for node in graph.nodes if node.op == "TanhBackward0"]
    assert tanhs == [f"saves result={format_value(t.detach(), 24)}" for t in (second, first)]


def _graphs():
    torch.manual_seed(1)
    x = torch.randn(2, 3)
    w = torch.randn(3, 4, requires_grad=True)
    h = torch.tanh(x @ w)
    yield "mlp", (h.pow(3) * 2.5 - 1).mean(), {"x": x, "w": w}
    a = torch.randn(65, requires_grad=True)
    wide = torch.randn(8, 8)  # 64 numbers: written; 65: its shape
    square = a[:64].reshape(8, 8)
    yield "sizes", (square * wide).sum() + (a * torch.randn(65)).sum() + (square.t() * wide.t()).sum(), {"a": a}
    z = torch.randn(3, dtype=torch.complex64, requires_grad=True)
    yield "complex", (z * torch.randn(3, dtype=torch.complex64).conj()).abs().sum(), {"z": z}
    v = torch.randn(2, 3, requires_grad=True, dtype=torch.float64)
    yield "expanded", (v * torch.tensor(0.5, dtype=torch.float64).expand(2, 3) + v.exp()).sum(), {"v": v}
    q = torch.randn(5, requires_grad=True)
    yield "ints", (q * torch.arange(5)).sum() + (q.half() * torch.rand(5).half()).float().sum(), {"q": q}
    img = torch.randn(1, 2, 4, 4, requires_grad=True)
    yield "conv", F.conv2d(img, torch.randn(3, 2, 3, 3), padding=1).relu().sum(), {"img": img}


@pytest.mark.parametrize("limit", [16, 100])  # (16: the default max_elements; 100: 64 numbers written, 65 not)
@pytest.mark.parametrize("case", [name for name, _, _ in _graphs()])
def test_the_text_written_later_is_the_text_written_at_once(case, limit, monkeypatch):
    _, loss, namespace = next(item for item in _graphs() if item[0] == case)
    names = names_from(namespace)
    options = GraphOptions(max_elements=limit)
    later = walk_module.walk([loss], names, options, ["loss"])
    # something was left to write (with 16 numbers at most, nothing these two saved)
    assert later.rows.later or limit == 16 and case in ("sizes", "conv")
    written = later.graph

    def at_once(*args, later=False):
        return _saved_summary(*args)

    monkeypatch.setattr(walk_module, "_saved_summary", at_once)
    eager = walk_module.walk([loss], names, options, ["loss"])
    assert not eager.rows.later
    assert [(n.id, n.detail) for n in written.nodes] == [(n.id, n.detail) for n in eager.graph.nodes]
    assert any("=[" in n.detail for n in written.nodes)


def test_a_saved_tensor_changed_after_the_pass_shows_what_it_held():
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    _k = torch.tensor([1.5, -2.0, 3.25])  # (a leading "_": no name, so its numbers are drawn)
    recorded = _k.clone()
    lens = al.Lens(names={"w": w})
    with lens:
        (w * _k).sum().backward()
    _k.mul_(10)  # in place, after the pass, before the graph is made
    assert _k._version > 0 and not torch.equal(_k, recorded)
    mul = next(node for node in lens.passes[0].graph.nodes if node.op == "MulBackward0")
    assert mul.detail == f"saves other={format_value(recorded, 24)}" == "saves other=[1.5, -2.0, 3.25]"
    assert torch.equal(w.grad, recorded)  # the gradient torch computed, unchanged


def test_a_leaf_updated_by_the_optimizer_shows_its_value_at_the_pass():
    model, x, y = _teaching()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    lens = al.Lens(names={"model": model, "x": x, "y": y})
    with lens:
        ((model(x) - y) ** 2).mean().backward()
    optimizer.step()  # every parameter changes in place before the graph is made
    assert not any(torch.equal(p, old) for p, old in zip(model.parameters(), before))
    graph = lens.passes[0].graph
    leaves = {node.label: node.value for node in graph.nodes if node.kind == "leaf"}
    for (name, _), old in zip(model.named_parameters(), before):
        assert torch.equal(leaves[f"model.{name}"], old)
    saved = [node.detail for node in graph.nodes if node.op == "AddmmBackward0"]
    assert saved and all("mat2=" in text or "saves" in text for text in saved)



def test_a_scalar_ops_saved_output_is_listed_not_drawn_as_a_constant_input():
    """exp, tanh, sqrt of a 0-d tensor save their own output (``_saved_result``): no number the op was called with
    (fresh4's tests/test_fresh_classes4.py section 7 found it drawn as a dashed constant feeding the op)."""
    x = torch.tensor(2.0, requires_grad=True)
    y = torch.exp(x * 3)
    _r = y.sqrt()  # (a leading "_": no name, so its number is written)
    z = torch.tanh(_r)
    drawn = al.graph(z, names={"x": x, "y": y, "z": z})
    constants = {(n.label, n.detail) for n in drawn.nodes if n.kind == "constant"}
    assert constants == {("3", "other")}  # the 3 of x * 3 is the only number an op was called with (before: 3 more)
    details = {n.op: n.detail for n in drawn.nodes if n.kind == "function"}
    assert details["ExpBackward0"] == "saves result=y"  # exp's output is y itself
    assert details["TanhBackward0"] == "saves result=z"
    assert details["SqrtBackward0"] == f"saves result={format_value(torch.exp(torch.tensor(6.0)).sqrt())}"
    assert details["SqrtBackward0"] == "saves result=20.09"
