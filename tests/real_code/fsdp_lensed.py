"""FSDP2's fully_shard on CPU (gloo, world size 1), its backward run under a Lens in a process of its own (a crash
of the lens would be a crash of the process): prints one JSON line, what the test compares with a plain run.

``python tests/real_code/fsdp_lensed.py``: one line with reshard_after_forward=True for the inner module (its
parameters' memory freed after the forward, fully_shard's default), then one with False (kept)."""

from __future__ import annotations

import json
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch import nn

import autograd_lens as al


def program(log: list, reshard: bool) -> list[dict]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    fully_shard(m[0], reshard_after_forward=reshard)
    fully_shard(m)

    def doubled(module, grad_input, grad_output):
        log.append(grad_input[0].detach().clone().tolist())
        return (grad_input[0] * 2,)

    m[2].register_full_backward_hook(doubled)
    x = torch.randn(5, 3, requires_grad=True)
    grads = []
    for _ in range(2):
        m.zero_grad()
        m(x).pow(2).sum().backward()
        grads.append({**{"m." + n: p.grad.full_tensor().tolist() for n, p in m.named_parameters()},
                      "x": x.grad.tolist()})
    return grads


def main() -> None:
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group("gloo", store=dist.FileStore(store.name, 1), rank=0, world_size=1)
        try:
            for reshard in (True, False):
                once(reshard)
        finally:
            dist.destroy_process_group()


def once(reshard: bool) -> None:
    plain_log: list = []
    plain = program(plain_log, reshard)
    lens_log: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with al.Lens() as lens:
            lensed = program(lens_log, reshard)
    print(json.dumps({
        "same": plain == lensed and plain_log == lens_log,
        "plain": plain,
        "passes": len(lens.passes),
        "calls": [[c.hook, c.kind, c.target, c.invocation, c.grad_in[0].tolist(), c.grad_out[0].tolist()]
                  for c in lens.hook_calls],
        "log": plain_log,
        "notes": [n.message for n in lens.notes],
        "pass_notes": [list(p.notes) for p in lens.passes],
        "unknown": [sorted(p.unknown) for p in lens.passes],
        "leaf_grads": [{k: None if v is None else v.tolist() for k, v in p.leaf_grads.items() if k != "x"}
                       for p in lens.passes],
    }), flush=True)


if __name__ == "__main__":
    main()
