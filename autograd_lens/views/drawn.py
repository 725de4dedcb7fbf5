"""What a drawing of ``graph()`` showed of the user's named tensors, so that showing the same ``Graph`` again later
can say which of them have changed since (an optimizer step, another backward, ``.grad`` zeroed): a picture of the
past must not pass for the present.  Weak references only: a drawing keeps nothing of the user's alive."""

from __future__ import annotations

import weakref
from typing import Any

from ..model import Graph

# id(graph) -> [(label, weak tensor, its version, weak .grad or None, the .grad's version)], as when it was drawn
_DRAWN: dict[int, list] = {}


def remembered(drawn: Graph, found: Any) -> Graph:
    """``drawn``, its named tensors and their ``.grad`` noted (``found``: the names ``graph()`` used)."""
    by_name = {found.tensors[id(t)]: t for t in found.tensor_objects}
    kept = []
    for node in drawn.nodes:
        tensor = by_name.get(node.label) if node.is_tensor else None
        if tensor is None:
            continue
        try:
            grad = tensor.grad if tensor.is_leaf or tensor.retains_grad else None
            kept.append((node.label, weakref.ref(tensor), tensor._version,
                         None if grad is None else weakref.ref(grad), None if grad is None else grad._version))
        except Exception:  # a tensor subclass that refuses weak references or versions: not followed
            continue
    if kept:
        _DRAWN[id(drawn)] = kept
        weakref.finalize(drawn, _DRAWN.pop, id(drawn), None)
    return drawn


def changed_since_drawn(drawn: Graph) -> list[str]:
    """What of the named tensors ``drawn`` shows has changed since it was drawn ("x", "x.grad"); [] when nothing
    known (tensors gone, or never followed)."""
    changed = []
    for label, tensor_ref, version, grad_ref, grad_version in _DRAWN.get(id(drawn), ()):
        tensor = tensor_ref()
        if tensor is None:
            continue
        try:
            if tensor._version != version:
                changed.append(label)
            grad = tensor.grad if tensor.is_leaf or tensor.retains_grad else None
            if grad is not (None if grad_ref is None else grad_ref()) or (grad is not None and grad._version != grad_version):
                changed.append(f"{label}.grad")
        except Exception:
            continue
    return changed

