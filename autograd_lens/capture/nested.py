"""What a backward run inside the pass (reentrant checkpointing, a ``backward()`` in a hook) writes to ``.grad``.

Its nodes are not steps of this pass, and the parameters of a reentrantly checkpointed layer are not in the outer
graph at all: the nested backward writes their ``.grad``. The lens reads, when a nested backward starts, each
named leaf's ``.grad`` (which tensor, its version) outside this graph, and when it ends, which of them it wrote;
the pass says so in a note.
"""

from __future__ import annotations

from typing import Any

import torch


def remember_grads(observer: Any) -> None:
    """As a nested backward starts: the ``.grad`` of each named leaf this graph does not reach."""
    if observer.nested_grads is not None:
        return  # inside another nested backward: its end counts both
    observer.nested_grads = {}
    names = observer.ensure_names()
    in_graph = {id(fn.variable) for fn in observer.shape.leaves.values()}
    for tensor in names.tensor_objects:
        if tensor.grad_fn is None and tensor.requires_grad and id(tensor) not in in_graph:
            grad = tensor.grad
            observer.nested_grads[id(tensor)] = (names.tensors[id(tensor)], tensor, grad,
                                                 grad._version if grad is not None else None)


def grads_written(observer: Any) -> None:
    """As the outermost nested backward ends: the leaves whose ``.grad`` it wrote (another tensor, or the same one
    changed) join ``observer.nested_written``."""
    for name, tensor, grad, version in (observer.nested_grads or {}).values():
        now = tensor.grad
        if (now is not grad or (isinstance(now, torch.Tensor) and now._version != version)) \
                and name not in observer.nested_written:
            observer.nested_written.append(name)
    observer.nested_grads = None
