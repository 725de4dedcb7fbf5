"""DistributedDataParallel over two processes on CPU (gloo, a TCP store on localhost), a Lens in rank 0 only: prints,
from rank 0, one JSON line per way of running (plain, under the Lens, without hooks), what the test compares.

``python tests/real_code/ddp_two_ranks.py PORT [comm]``: ``comm`` adds a Python comm hook (all-reduce, then halve)."""

from __future__ import annotations

import datetime
import json
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import autograd_lens as al


def program(rank: int, hooked: bool, comm: bool, log: list) -> list:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    ddp = DistributedDataParallel(m)
    if comm:
        def halved(state, bucket):
            tensor = bucket.buffer()
            future = dist.all_reduce(tensor, async_op=True).get_future()
            return future.then(lambda f: f.value()[0] * 0.25)
        ddp.register_comm_hook(None, halved)
    if hooked:
        def twice(g):
            log.append(g.tolist())
            return g * 2
        m[0].weight.register_hook(twice)
    torch.manual_seed(1 + rank)  # each rank its own batch: the all-reduce averages different gradients
    x = torch.randn(5, 3)
    per = []
    for _ in range(2):
        m.zero_grad()
        ddp(x).pow(2).sum().backward()
        per.append({"m." + n: p.grad.tolist() for n, p in m.named_parameters()})
    return per


def worker(rank: int, port: int, comm: bool) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        for way in ("plain", "lens", "nohook"):
            log: list = []
            if way == "lens" and rank == 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with al.Lens() as lens:
                        per = program(rank, True, comm, log)
                shown = {
                    "calls": [[c.hook, c.target, c.invocation, c.grad_in.tolist(), c.grad_out.tolist()]
                              for c in lens.hook_calls],
                    "leaf_grads": [{k: None if v is None else v.tolist() for k, v in p.leaf_grads.items()}
                                   for p in lens.passes],
                    "without": [{k: None if v is None else v.tolist() for k, v in p.grads_without_hooks.items()}
                                for p in lens.passes],
                    "unknown": [dict(p.unknown) for p in lens.passes],
                    "notes": [list(p.notes) for p in lens.passes],
                }
            else:
                per = program(rank, way != "nohook", comm, log)
                shown = None
            if rank == 0:
                print(json.dumps({"way": way, "per": per, "log": log, "shown": shown}), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), "comm" in sys.argv[2:]), nprocs=2, join=True)
