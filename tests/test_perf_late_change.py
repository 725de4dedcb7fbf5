"""ending.late_change goes through a pass's records once, not once per leaf (issue #24).

It names the hook calls recorded after a leaf's write when that leaf's ``.grad`` changed after the last value the
recording saw.  It used to slice ``observer.records[position + 1:]`` for every such leaf: the records times the
leaves.  Counted here (no timing): how many records are read, and the answer is unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from autograd_lens.capture.ending import late_change
from autograd_lens.capture.records import GradRecord, HookRecord, NodeRecord
from autograd_lens.capture.unhooked import Unknown


class _Counted(list):
    """A list that counts the items read from it (iterated, or taken in a slice)."""

    read = 0

    def __iter__(self):
        for item in list.__iter__(self):
            _Counted.read += 1
            yield item

    def __getitem__(self, index):
        found = list.__getitem__(self, index)
        if isinstance(index, slice):
            _Counted.read += len(found)
        return found


def _later_hook(g):
    return g


def _pass(leaves: int, nodes: int):
    """An observer's records: a GradRecord per leaf (written first), then ``nodes`` node runs, then one hook call."""
    fns = [SimpleNamespace(name=f"leaf{i}") for i in range(leaves)]
    records = [GradRecord(fn, torch.tensor(1.0), torch.tensor(1.0)) for fn in fns]
    records += [NodeRecord(SimpleNamespace(), (None,), (None,)) for _ in range(nodes)]
    records.append(HookRecord(_later_hook.__code__, _later_hook, "tensor", None, None, None))
    return SimpleNamespace(records=_Counted(records), foreign_calls=[]), fns


def test_late_change_reads_each_record_a_bounded_number_of_times():
    leaves, nodes = 200, 2000
    observer, fns = _pass(leaves, nodes)
    _Counted.read = 0
    answers = [late_change(observer, fn, position, torch.tensor(2.0), True) for position, fn in enumerate(fns)]
    total = leaves + nodes + 1
    assert _Counted.read <= 3 * total, _Counted.read  # before: about leaves * nodes (400,000 here)
    assert all(isinstance(answer, Unknown) and "_later_hook" in answer.reason for answer in answers)


def test_late_change_answers_as_before():
    """The same answers as going through every later record: the hooks after the write, a leaf's own
    post-accumulate hook left out, nothing when nothing diverged and no hook ran later."""
    observer, fns = _pass(3, 5)
    first = late_change(observer, fns[0], 0, torch.tensor(2.0), False)
    assert isinstance(first, Unknown) and "a hook that ran after it (_later_hook)" in first.reason
    assert late_change(observer, fns[0], 0, torch.tensor(1.0), True) is None  # unchanged: nothing to say
    quiet, quiet_fns = _pass(2, 3)
    quiet.records.pop()  # no hook call at all
    assert late_change(quiet, quiet_fns[1], 1, torch.tensor(2.0), False) is None
    diverged = late_change(quiet, quiet_fns[1], 1, torch.tensor(2.0), True)
    assert isinstance(diverged, Unknown) and "a hook that ran after it" not in diverged.reason
    own, own_fns = _pass(2, 1)
    own.records[-1].kind = "post_accumulate_grad"
    own.records[-1].node_fn = own_fns[0]
    own.records[-1].unseen, own.records[-1].error, own.records[-1].grad_out = "C", None, None  # not read as .grad
    assert late_change(own, own_fns[0], 0, torch.tensor(2.0), False) is None  # its own hook: not "later"
    other = late_change(own, own_fns[1], 1, torch.tensor(2.0), False)
    assert isinstance(other, Unknown) and "_later_hook" in other.reason
