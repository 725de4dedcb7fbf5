"""The ``.grad`` torch writes for non-leaf tensors: those that called ``retain_grad()``, and those given to
``backward(inputs=...)`` (torch calls ``retain_grad()`` on them)."""

from __future__ import annotations

from typing import Any

import torch

from .snapshot import snapshot


def written_as_retained(walk: Any, observer: Any) -> dict[int, list[tuple]]:
    """id(grad_fn) -> (output_nr, tensor node id, .grad now, name, by) of the named tensors that called
    retain_grad(), and of the non-leaf tensors given to ``backward(inputs=...)``: torch calls retain_grad() on those
    (for this pass and the later ones) and writes their .grad as it does a retained tensor's."""
    badged = walk.rows.with_badge("[retain_grad]")
    inputs = [t for t in observer.inputs if isinstance(t, torch.Tensor) and t.grad_fn is not None] \
        if observer.kind == "backward" else []
    if not badged and not inputs:
        return {}
    live = {(id(t.grad_fn), t.output_nr): t for t in observer.ensure_names().tensor_objects
            if t.grad_fn is not None and t.retains_grad} if badged else {}
    found: dict[int, list[tuple]] = {}
    for (fn_id, output_nr), node_id in walk.tensor_ids.items():
        tensor = live.get((fn_id, output_nr))
        if node_id in badged and tensor is not None:
            grad = snapshot(tensor.grad, observer.store_limit) if tensor.grad is not None else None
            found.setdefault(fn_id, []).append((output_nr, node_id, grad, walk.rows.label(node_id), "retain_grad"))
    names = observer.ensure_names()
    for index, tensor in enumerate(inputs):
        fn_id, output_nr = id(tensor.grad_fn), tensor.output_nr
        entries = found.get(fn_id, [])
        same = [i for i, entry in enumerate(entries) if entry[0] == output_nr]
        if same:  # it retained its gradient before the pass (an earlier inputs= did that too): inputs= writes it anyway
            entries[same[0]] = entries[same[0]][:4] + ("inputs",)
            continue
        node_id = walk.tensor_ids.get((fn_id, output_nr))
        name = walk.rows.label(node_id) if node_id is not None else (names.tensor_name(tensor) or f"input {index}")
        grad = snapshot(tensor.grad, observer.store_limit) if tensor.grad is not None else None
        found.setdefault(fn_id, []).append((output_nr, node_id, grad, name, "inputs"))
    return found
