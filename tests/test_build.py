"""build.py makes the events of a pass (NodeRun, GradWritten) without a frozen dataclass's setattr per field: each
must equal, hash and repr as what the dataclass's own constructor makes, with every field in field order."""

import dataclasses

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
from autograd_lens.model import GradWritten, NodeRun


def test_events_are_what_their_dataclasses_make():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3, requires_grad=True)
    split = net(x).split(1, dim=1)  # a node with two outputs
    loss = (split[0] * 2 + split[1].exp()).sum()
    with al.Lens(names={"net": net, "x": x, "loss": loss}) as lens:
        loss.backward()
    events = lens.passes[0].events
    runs = [event for event in events if isinstance(event, NodeRun)]
    writes = [event for event in events if isinstance(event, GradWritten)]
    assert len(runs) >= 8 and len(writes) == 5  # four parameters and x
    assert any(len(run.grad_in) == 2 for run in runs) and any(len(run.targets) == 3 for run in runs)
    default_by = next(item.default for item in dataclasses.fields(GradWritten) if item.name == "by")
    assert {write.by for write in writes} == {default_by}
    for made in runs + writes:
        cls = type(made)
        plain = cls(**{item.name: getattr(made, item.name) for item in dataclasses.fields(cls)})
        assert made == plain and repr(made) == repr(plain)
        assert list(vars(made)) == list(vars(plain)) == [item.name for item in dataclasses.fields(cls)]
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.step = -1
    linear = next(run for run in runs if run.name == "AddmmBackward0" and len(run.targets) == 3)
    assert linear.label == "addmm" and linear.targets[1] in ("x", "tanh") and len(linear.edges) == 3


def test_node_events_read_from_the_kept_edges_are_those_read_from_torch():
    """_node_event reads each node's targets from the edges structure() kept, and skips the output-arrow look-ups
    for nodes with no tensor box of their own: the same events as read from torch's next_functions, for every node
    of a pass with named, split and unnamed outputs."""
    from autograd_lens.capture import build

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3, requires_grad=True)
    h = net(x)
    split = h.split(1, dim=1)
    loss = (split[0] * 2 + split[1].exp()).sum()
    compared = []
    original = build._node_read

    class Everything:
        def __contains__(self, key):
            return True

    def both(walk, record, next_of):
        # (the node runs are made from these rows after the pass: build._node_event makes one at once)
        drawn_outputs = {fn_id for fn_id, _ in walk.output_edges}
        maps = (walk.function_ids, walk.labels, walk.edge_rows, walk.output_edges)
        made = build.node_run((*maps, drawn_outputs), 0, *original(walk, record, next_of))
        general = build.node_run((*maps, Everything()), 0, *original(walk, record, {}))  # from torch, every arrow
        assert made == general and repr(made) == repr(general)
        compared.append((id(record.fn) in next_of, id(record.fn) in drawn_outputs, made))
        return original(walk, record, next_of)

    build._node_read = both
    try:
        with al.Lens(names={"net": net, "x": x, "loss": loss, "h": h}) as lens:
            loss.backward()
    finally:
        build._node_read = original
    runs = lens.passes[0].node_runs
    assert len(compared) == len(runs) >= 8 and all(kept for kept, _, _ in compared)
    assert any(drawn for _, drawn, _ in compared) and not all(drawn for _, drawn, _ in compared)
    assert [repr(dataclasses.replace(run, step=0)) for run in runs] == [repr(made) for _, _, made in compared]
