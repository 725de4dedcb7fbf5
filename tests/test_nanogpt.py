"""A nanoGPT-shaped model trained a step under the lens: every hook call it shows is one that ran, counted per
registered hook, with what the hook really received; no note it makes is false; checkpointed blocks are
recorded or marked.  Torch is the oracle: the hooks log what they get, and the same step runs without the lens."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import autograd_lens as al
from autograd_lens.views.steps import hook_totals, steps_for


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=17, d=16, heads=2, layers=3, block=8, reentrant=None) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # weight tying: one leaf used twice
        self.reentrant = reentrant

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x) if self.reentrant is None else checkpoint(block, x, use_reentrant=self.reentrant)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def train_step(reentrant=None, lens_on=False):
    """One step with the hooks practitioners add: a norm logger per activation (one closure per block, made by a
    factory), a clipping hook per parameter, a full backward hook per block, a post-accumulate hook on the
    embedding.  Returns what the hooks logged and the gradients."""
    torch.manual_seed(0)
    model = GPT(reentrant=reentrant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 17, (2, 8))
    targets = torch.randint(0, 17, (2, 8))
    log: list[tuple] = []

    def make_logger(name):
        def hook(grad):
            log.append(("act", name, grad.clone()))
        return hook

    def clip(grad):
        log.append(("clip", grad.shape, grad.clone()))
        return grad.clamp(-0.01, 0.01)

    handles = [p.register_hook(clip) for name, p in model.named_parameters() if name.endswith("weight")]
    for index, block in enumerate(model.blocks):
        handles.append(block.register_full_backward_hook(
            lambda m, gi, go, index=index: log.append(("block", index, go[0].clone()))))
    handles.append(model.wte.weight.register_post_accumulate_grad_hook(lambda p: log.append(("acc", p.grad.clone()))))
    original = Block.forward

    def forward_with_loggers(self, x):
        out = original(self, x)
        if out.requires_grad:  # not in the no-grad forward of reentrant checkpointing
            out.register_hook(make_logger(f"block {list(model.blocks).index(self)}"))
        return out

    Block.forward = forward_with_loggers
    try:
        if lens_on:
            with al.Lens() as lens:
                loss = model(idx, targets)
                loss.backward()
        else:
            lens = None
            loss = model(idx, targets)
            loss.backward()
    finally:
        Block.forward = original
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    for handle in handles:
        handle.remove()
    return log, grads, lens, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_training_step_under_the_lens_shows_every_hook_call_once_with_what_it_received():
    plain_log, plain_grads, _, plain_after = train_step()
    log, grads, lens, after = train_step(lens_on=True)
    assert plain_grads.keys() == grads.keys() and all(torch.equal(plain_grads[k], grads[k]) for k in grads)
    assert all(torch.equal(plain_after[k], after[k]) for k in after)
    calls = lens.hook_calls
    assert len(calls) == len(log)  # every call that ran, none invented
    kinds = {"act": "tensor", "clip": "tensor", "block": "module_full", "acc": "post_accumulate_grad"}
    assert [call.kind for call in calls] == [kinds[entry[0]] for entry in log]
    for call, entry in zip(calls, log):  # what each hook received, call by call, in firing order
        received = call.context[0] if call.kind == "module_full" else call.grad_in  # a block's hook: grad_output
        assert torch.equal(received, entry[-1]), (call.hook, call.target)
    # each registered hook ran once in this single pass: "call 1 of 1" everywhere
    assert {call.invocation for call in calls} == {1}
    assert len({call.registration for call in calls}) == len(calls)
    totals = hook_totals(lens.passes)
    assert all("call 1 of 1" in s.title for s in steps_for(lens.passes[0], totals) if s.kind == "hook")
    # no note is false: .grad was None before the step for every parameter
    p = lens.passes[0]
    assert not [n for n in lens.notes if n.code == "forgot_zero_grad"]
    assert not any("already held" in (s.note or "") for s in steps_for(p, totals))
    # the clipping hooks changed gradients: without hooks is computed, and equal to a run with no hook at all
    torch.manual_seed(0)
    model = GPT()
    model(torch.randint(0, 17, (2, 8)), torch.randint(0, 17, (2, 8))).backward()
    for name, parameter in model.named_parameters():
        shown = p.grads_without_hooks.get(f"model.{name}")
        if shown is not None and name != "head.weight":  # tied: drawn once, as wte.weight
            assert torch.allclose(shown, parameter.grad, rtol=0, atol=1e-6), name


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_blocks_are_recorded_or_marked(reentrant):
    plain_log, plain_grads, _, _ = train_step(reentrant=reentrant)
    log, grads, lens, _ = train_step(reentrant=reentrant, lens_on=True)
    assert all(torch.equal(plain_grads[k], grads[k]) for k in grads)
    assert len(log) == len(plain_log)
    p = lens.passes[0]
    recorded = len(p.hook_calls)
    if recorded != len(log):  # some ran where the lens could not follow: the pass says which, and why
        assert reentrant
        (note,) = [n for n in p.notes if "nested backward" in n and "wrote the .grad" not in n]
        assert "blocks.0: module full hook" in note
        unknown = [name for name in p.grads_without_hooks if p.grads_without_hooks[name] is None]
        assert unknown and all("nested" in p.unknown[name] or "reentrant" in p.unknown[name] for name in unknown)
