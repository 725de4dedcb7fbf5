"""Fresh eyes on hand-built transformers with the hooks practitioners put there (helper ``fresh20``, 2026-11-28):
multi-head attention written by hand, with ``F.scaled_dot_product_attention`` and with ``nn.MultiheadAttention``
(``need_weights`` both ways); causal and padding masks (``masked_fill`` with -inf, fully masked rows giving NaN);
KV-cache decoding (the cache concatenated step by step, detached or not; generation under ``no_grad`` before a
training pass); tied embeddings; rotary embeddings written with in-place ops on views; LayerNorm and RMSNorm;
gradient accumulation over micro-batches; hooks on the attention probabilities (saving or changing their gradient),
per-head gradient masks through tensor hooks, full backward hooks on attention blocks, forward hooks that register
tensor hooks, post-accumulate-grad hooks that clip, hooks on the embedding weight; one block applied twice (ALBERT),
several passes and optimizer steps.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py), then through :func:`check` of tests/test_fresh_classes10.py (the cards, the drawing
and the notes against torch)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import lens_of, problems_of  # noqa: E402,F401  (the differential harness)
from test_fresh_classes10 import drawing_problems, drawn_grads, name, statements  # noqa: E402  (cards, drawing)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matrices: one intra-op thread (two threads on a loaded 2-core machine cost ~4 ms a matmul)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def check(program, unreached: dict | None = None, static: bool = False, clipped: tuple = ()):
    """tests/test_fresh_classes10.py's ``check``; the DOT label of a leaf whose post-accumulate hook edits .grad
    (``clipped``) is laid out at its widest text (the value before the hook), which the SVG replaces by the last
    one: those leaves are compared at each pass's last step only."""
    from autograd_lens.format import format_value

    assert problems_of(program) == []
    problems, lens, plain = statements(program)
    assert problems == []
    assert [problem for problem in drawing_problems(lens, plain, static)
            if not any(problem.startswith(f"pass {i + 1}: {leaf} drawn with grad") for leaf in clipped
                       for i in range(len(plain.per)))] == []
    assert len(lens.passes) == len(plain.per)
    for index, (p, grads) in enumerate(zip(lens.passes, plain.per)):
        drawn = drawn_grads(lens, index)
        shown = {name: drawn[name] for name in grads if name in drawn}
        assert shown == {name: format_value(grads[name], 48) for name in shown}, index
        assert len(shown) == sum(grad is not None for grad in grads.values()), (sorted(drawn), sorted(grads))
        assert {name: reason.code for name, reason in p.unreached.items()} == (unreached or {}), p.unreached
    return lens, plain


# --- the model ------------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, pos0=0):
    """Rotary embedding written in place on views of a clone: x[..., :h] and x[..., h:] rotated by the position."""
    T, h = x.shape[-2], x.shape[-1] // 2
    angle = (torch.arange(pos0, pos0 + T, dtype=x.dtype)[:, None] / 10 ** (torch.arange(h) / h))
    cos, sin = angle.cos(), angle.sin()
    out = x.clone()
    a, b = out[..., :h], out[..., h:]
    a0 = a.clone()
    a.mul_(cos).sub_(b * sin)  # in place on a view of out
    b.mul_(cos).add_(a0 * sin)
    return out


class Attention(nn.Module):
    def __init__(self, d, heads, kind="hand", rope=False):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.kind, self.rope = heads, kind, rope
        self.probs_hook = None  # makes a hook for the attention probabilities (hand-written attention only)
        self.head_hook = None  # makes a hook for the per-head output (B, H, T, dh)

    def forward(self, x, mask=None, cache=None, pos0=0):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.rope:
            q, k = rotary(q, pos0), rotary(k, pos0)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        if self.kind == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            p = scores.softmax(-1)
            if self.probs_hook is not None and p.requires_grad:
                p.register_hook(self.probs_hook())
            o = p @ v
        if self.head_hook is not None and o.requires_grad:
            o.register_hook(self.head_hook())
        return self.proj(o.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, d, heads, kind="hand", rope=False, norm="layer"):
        super().__init__()
        self.n1 = nn.LayerNorm(d) if norm == "layer" else RMSNorm(d)
        self.n2 = nn.LayerNorm(d) if norm == "layer" else RMSNorm(d)
        self.attn = Attention(d, heads, kind, rope)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, mask=None, cache=None, pos0=0):
        x = x + self.attn(self.n1(x), mask, cache, pos0)
        return x + self.mlp(self.n2(x))


class LM(nn.Module):
    """A tiny decoder: tied embeddings, ``layers`` blocks or one block applied ``layers`` times (``shared``)."""

    def __init__(self, vocab=11, d=8, heads=2, layers=2, shared=False, **kw):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads, **kw)] if shared else [Block(d, heads, **kw)
                                                                            for _ in range(layers)])
        self.layers, self.norm = layers, nn.LayerNorm(d)

    def forward(self, tokens, mask=None, caches=None, pos0=0):
        x = self.emb(tokens)
        for i in range(self.layers):
            block = self.blocks[i % len(self.blocks)]
            x = block(x, mask, None if caches is None else caches[i], pos0)
        return self.norm(x) @ self.emb.weight.T  # tied


def causal(T, S=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool).tril(S - T)


def params_of(model, prefix="model"):
    return {f"{prefix}.{n}": p.grad for n, p in model.named_parameters()}


# --- 1. training a hand-built decoder: hooks on attention probabilities, per-head masks, module and forward hooks ----

def decoder(kind: str, shared: bool = False, norm: str = "layer", rope: bool = False, micro: int = 2,
            steps: int = 2):
    """Two optimizer steps of ``micro`` accumulated micro-batches each; ``kind`` is the attention (hand, sdpa)."""
    def program(run):
        torch.manual_seed(0)
        model = LM(shared=shared, kind=kind, norm=norm, rope=rope)
        tokens = torch.randint(0, 11, (micro, 2, 5))
        name(run, model=model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        saved = []
        if run.hooked:
            first = model.blocks[0].attn
            if kind == "hand":
                def probs(g):
                    saved.append(g.detach().clone())
                    return g * 2  # changes the gradient of the attention probabilities
                first.probs_hook = lambda: run.H("probs", probs, target="softmax")
            head = torch.tensor([1.0, 0.0])[None, :, None, None]
            model.blocks[-1].attn.head_hook = lambda: run.H("head", lambda g: g * head)  # head 1 masked out
            first.register_full_backward_hook(run.H("attn_full", lambda m, gi, go: None, lambda a: a[1]))
            model.blocks[-1].mlp.register_full_backward_pre_hook(
                run.H("mlp_pre", lambda m, go: (go[0].clamp(-0.5, 0.5),), lambda a: a[1]))

            def tag(module, args, output):
                output.register_hook(run.H("block_out", lambda g: g * 0.5))
            model.blocks[0].register_forward_hook(tag)
            model.emb.weight.register_hook(run.H("emb", lambda g: g + 0.01))

            def clip(p):
                p.grad.clamp_(-0.05, 0.05)
            model.norm.weight.register_post_accumulate_grad_hook(
                run.H("clip", clip, lambda a: a[0].grad.clone()))
        for _ in range(steps):
            opt.zero_grad()
            for m in range(micro):
                logits = model(tokens[m, :, :-1], causal(4))
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[m, :, 1:].flatten()) / micro
                run.backward(loss)
                run.record(params_of(model))
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    return program


@pytest.mark.parametrize("kind, shared, norm, rope", [("hand", False, "layer", False), ("sdpa", False, "rms", True),
                                                      ("hand", True, "rms", True)],
                         ids=["hand", "sdpa_rope_rms", "albert_rope"])
def test_training_a_decoder_against_torch(kind, shared, norm, rope):
    lens, plain = check(decoder(kind, shared, norm, rope, steps=1 if rope else 2), clipped=("model.norm.weight",))
