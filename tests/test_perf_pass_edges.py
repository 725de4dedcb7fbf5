"""Per-pass shortcuts of the lens, each against the general way:

* the cyclic collector paused with a plain try/finally (no contextmanager generator per phase) is left as it was
  found, on or off, also when setting a pass up fails, when the engine raises, and when the pass is untraced;
* ``ending._distributed`` (torch.distributed resolved once at import) says what the general expression says, with
  and without a process group; with none, ``check_write`` returns before reading the leaf's ``.grad``.
"""

from __future__ import annotations

import gc

import pytest
import torch

import autograd_lens as al
from autograd_lens.capture import ending, entry


def _general_distributed() -> bool:
    distributed = getattr(torch, "distributed", None)
    return distributed is not None and distributed.is_available() and distributed.is_initialized()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_found(enabled):
    x = torch.tensor(2.0, requires_grad=True)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with al.Lens() as lens:
            (x * 3).backward()  # traced
            assert gc.isenabled() is enabled
            with pytest.raises(RuntimeError):  # the roots need no grad: setting the pass up fails, the engine says so
                torch.ones(2).sum().backward()
            assert gc.isenabled() is enabled

            def boom(grad):
                raise ValueError("from the hook")

            y = x * 2
            y.register_hook(boom)
            with pytest.raises(ValueError):  # the engine raises inside the pass
                y.backward()
            assert gc.isenabled() is enabled
        assert len(lens.passes) == 2 and lens.passes[1].error
        assert float(x.grad) == 3.0
        collecting = entry._pause_collector()
        assert collecting is enabled and not gc.isenabled()
        entry._resume_collector(collecting)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_distributed_is_the_general_expression():
    assert ending._distributed() == _general_distributed()
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or dist.is_initialized():
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert ending._distributed() is True and _general_distributed() is True
    finally:
        dist.destroy_process_group()
    assert ending._distributed() is False and _general_distributed() is False


def test_without_a_process_group_check_write_reads_no_grad():
    if _general_distributed():
        pytest.skip("a process group is up")

    class Variable:
        reads = 0

        @property
        def grad(self):
            Variable.reads += 1
            return torch.ones(2)

    class Node:
        variable = Variable()

    class Record:
        received = torch.ones(2)
        grad = torch.ones(2)

    class Observer(ending.PassEnd):
        old_grads: dict = {}

    record = Record()
    assert Observer().check_write(Node(), torch.ones(2), record, True) is record.received
    assert Observer().check_write(Node(), torch.ones(2), record, False) is record.received
    assert Variable.reads == 0
