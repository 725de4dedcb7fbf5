"""Overhead of the lens on transformers: plain vs inside ``al.Lens()``, alternated in one process.

    python benchmarks/bench_models.py [--rounds 15]

Two models written here in plain torch, after nanoGPT's ``model.py`` (pre-LayerNorm blocks, causal
``F.scaled_dot_product_attention``, GELU MLP, tied embedding/head, no dropout):

- the small GPT: 2 blocks, d=64, 4 heads, block 32, vocab 65, batch 4; the ratio is of ``backward()``;
- the nanoGPT-shaped model: 6 layers, d=128, 4 heads, block 64, vocab 65, batch 8, AdamW; one training step
  (zero_grad, forward, backward, ``optimizer.step()``), the whole step inside the lens as a user would write
  it; the ratio of the step and the ratio of its ``backward()`` are both reported.

Times are CPU time of this thread (``time.thread_time``; on CPU autograd runs on the calling thread),
one torch thread, medians of alternating runs.  Beside each, the floors ``bench_tracer.py`` measures, on
the same graph in the same run: a no-op hook on every node (a C-level callable, no Python frame) plus an
idle ``sys.setprofile`` function; and a Python post-hook on every node that only clones what the node
sends.  The floors walk the graph here (not with the lens's code), so they do not move when the lens does.
Extra peak memory: one step in a fresh Python, what it adds to peak RSS traced vs plain (medians of 5).
"""

from __future__ import annotations

import functools
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_lens as al

SMALL = dict(layers=2, d=64, heads=4, block=32, vocab=65, batch=4)
NANO = dict(layers=6, d=128, heads=4, block=64, vocab=65, batch=8)
clock = time.thread_time


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, block: int, vocab: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        for name, p in self.named_parameters():  # nanoGPT's init
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(config: dict):
    """The model, an AdamW optimizer and one batch (seeded)."""
    torch.manual_seed(0)
    shape = {key: config[key] for key in ("layers", "d", "heads", "block", "vocab")}
    model = GPT(**shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config["vocab"], (config["batch"], config["block"]))
    targets = torch.randint(0, config["vocab"], (config["batch"], config["block"]))
    return model, optimizer, idx, targets


def reachable(loss) -> list:
    """Every backward function of ``loss``'s graph, each once (the lens's own walk, as bench_tracer.py uses)."""
    from autograd_lens.capture.structure import _reachable

    return _reachable([loss.grad_fn])


def floor_backward(loss) -> float:
    """backward() with a no-op hook on every node (no Python frame) and an idle profile function."""
    start = clock()
    seen: dict = {}
    handles = [fn.register_prehook(functools.partial(seen.__setitem__, id(fn))) for fn in reachable(loss)]
    sys.setprofile(lambda frame, event, arg: None)
    try:
        loss.backward()
    finally:
        sys.setprofile(None)
        for handle in handles:
            handle.remove()
    return clock() - start


def copy_floor_backward(loss) -> float:
    """backward() with a Python post-hook on every node that only clones each gradient it sends."""
    start = clock()
    kept: list = []

    def keep(sent, received):
        kept.append([g.clone() for g in sent if g is not None])

    handles = [fn.register_hook(keep) for fn in reachable(loss)]
    try:
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return clock() - start


def plain_backward(loss) -> float:
    start = clock()
    loss.backward()
    return clock() - start


BACKWARDS = {"plain": plain_backward, "floor": floor_backward, "copy_floor": copy_floor_backward}


def step(model, optimizer, idx, targets, kind: str, names: dict, train: bool) -> tuple[float, float, object]:
    """One step (zero_grad, forward, backward, and ``optimizer.step()`` when ``train``); ``kind`` is "traced"
    (the whole step inside ``al.Lens``) or a key of ``BACKWARDS``.  Returns (step seconds, backward seconds, lens)."""
    start = clock()
    lens = al.Lens(names=names) if kind == "traced" else None
    if lens is not None:
        lens.__enter__()
    try:
        optimizer.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        if lens is not None:
            backward = plain_backward(loss)
        else:
            backward = BACKWARDS[kind](loss)
        if train:
            optimizer.step()
    finally:
        if lens is not None:
            lens.__exit__(None, None, None)
    return clock() - start, backward, lens


def measure(config: dict, rounds: int = 15, train: bool = True) -> dict:
    """Medians (seconds) of each kind's step and backward, alternated; and the traced graph's size."""
    torch.set_num_threads(1)
    model, optimizer, idx, targets = build(config)
    names = {"model": model, "optimizer": optimizer, "idx": idx, "targets": targets}
    kinds = ("plain", "floor", "copy_floor", "traced")
    for _ in range(2):  # warm-up: allocator, optimizer state, first walk
        for kind in kinds:
            step(model, optimizer, idx, targets, kind, names, train)
    times: dict = {kind: ([], []) for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            whole, backward, lens = step(model, optimizer, idx, targets, kind, names, train)
            times[kind][0].append(whole)
            times[kind][1].append(backward)
    found = {"ran": len(lens.passes[0].node_runs), "drawn": len(lens.passes[0].graph.nodes),
             "params": sum(p.numel() for p in model.parameters())}
    for kind, (wholes, backwards) in times.items():
        found[kind] = {"step": statistics.median(wholes), "backward": statistics.median(backwards)}
    return found


CHILD = r'''
import re, sys, torch
sys.path.insert(0, sys.argv[3])
import autograd_lens as al
import bench_models as b
torch.set_num_threads(1)
config = getattr(b, sys.argv[1])
mode = sys.argv[2]
with al.Lens():  # both modes: the lens's own imports and first-use caches before the start
    (torch.ones(2, requires_grad=True) * 2).sum().backward()
model, optimizer, idx, targets = b.build(config)
names = {"model": model, "optimizer": optimizer, "idx": idx, "targets": targets}

def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) // 1024

with open("/proc/self/clear_refs", "w") as clear:  # peak RSS (VmHWM) := RSS now
    clear.write("5")
start = status("VmRSS")
b.step(model, optimizer, idx, targets, mode, names, True)
print(start, status("VmHWM") - start)
'''


def peak(name: str, mode: str) -> tuple[int, int]:
    """(MB resident when the step starts, MB the step's peak adds) of one step in a fresh Python (Linux: the
    peak is reset through /proc/self/clear_refs just before the step)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", CHILD, name, mode, here], capture_output=True, text=True, check=True)
    base, grown = out.stdout.split()[-2:]
    return int(base), int(grown)


def memory(name: str = "NANO", runs: int = 5) -> dict:
    """MB one training step adds to peak RSS, plain and traced (medians of ``runs`` fresh Pythons each), and
    the MB resident when it starts (Python, torch, the model)."""
    grown: dict = {"plain": [], "traced": []}
    for _ in range(runs):
        for mode in grown:
            base, added = peak(name, mode)
            grown[mode].append(added)
    gradients = sum(p.numel() * p.element_size() for p in build(globals()[name])[0].parameters()) / 2**20
    return {"base": base, "plain": statistics.median(grown["plain"]), "traced": statistics.median(grown["traced"]),
            "gradients": gradients}


def describe(found: dict, part: str) -> str:
    """'x2.31 (plain 12.3 ms; floors x1.2 / x1.4)' for ``part`` ("step" or "backward")."""
    plain = found["plain"][part]
    return (f"×{found['traced'][part] / plain:.2f} (plain {plain * 1e3:.1f} ms; floors: no-op hooks + idle profile "
            f"×{found['floor'][part] / plain:.2f}, clone-only hooks ×{found['copy_floor'][part] / plain:.2f})")


def main(rounds: int = 15) -> None:
    for label, config, train in (("small GPT (2 blocks, d=64)", SMALL, False),
                                 ("nanoGPT-shaped (6 layers, d=128), one AdamW step", NANO, True)):
        found = measure(config, rounds, train)
        print(f"{label}: {found['params']:,} parameters, {found['ran']} backward functions ran, "
              f"{found['drawn']} drawn nodes")
        parts = ("step", "backward") if train else ("backward",)
        for part in parts:
            floor = found["floor"][part] / found["plain"][part]
            print(f"  {part:8s} traced/plain {describe(found, part)}; lens / floor "
                  f"×{found['traced'][part] / found['floor'][part]:.2f} (target: within ×2 of the floor; "
                  f"floor ×{floor:.2f})")
    used = memory()
    extra = used["traced"] - used["plain"]
    print(f"nanoGPT step: peak RSS grows {used['plain']:.0f} MB plain, {used['traced']:.0f} MB traced (over "
          f"{used['base']} MB at the start): +{extra:.0f} MB, {extra / used['plain']:.0%} of the plain step's "
          f"(target <= +10%); the parameters' gradients are {used['gradients']:.1f} MB")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    main(parser.parse_args().rounds)
