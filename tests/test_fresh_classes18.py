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
and the notes against torch).  Every hook call, value, node gradient, card and note they show was torch's; three
answers of ``Lens(why=True)`` were not and are fixed: ``torch.empty``'s uninitialized memory (a model built in the
block) was named where NaN started (section 5, debug/forward.py); a value cut from its graph was said to have gone
through the calls of a sibling branch thrown away (section 7, debug/forward.py and debug/evidence.py); and the paths
of a 2-layer decoder were followed for 20,001 backward-function calls before "too many" (section 13,
debug/paths.py)."""

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
from test_fresh_classes10 import check, name, named  # noqa: E402  (cards, drawing)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matrices: one intra-op thread (two threads on a loaded 2-core machine cost ~4 ms a matmul)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    micro, steps = (1, 2) if shared else (2, 1)  # accumulation, or optimizer steps (kept short: ~5 s each)
    lens, plain = check(decoder(kind, shared, norm, rope, micro, steps), clipped=("model.norm.weight",))
    assert len(lens.passes) == 2 and all(p.hook_calls for p in lens.passes)


# --- 2. KV-cache decoding: generation under no_grad, then a pass through a cache built step by step -----------------

def kv_cache(kind: str):
    """Greedy generation of 3 tokens under ``no_grad`` with a cache; then a training pass that decodes a prompt of 3
    tokens, then 2 more one at a time through the cache (``detached``: each step's cache is detached, so earlier
    steps get gradient only from their own logits), a hook on the cache's keys, on the probabilities and on the
    embedding weight; one AdamW step; a second pass (a fresh cache) with the hooks still on the parameters."""
    def program(run):
        torch.manual_seed(1)
        model = LM(layers=1, kind="hand", rope=True)
        prompt = torch.randint(0, 11, (1, 3))
        name(run, model=model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        with torch.no_grad():
            caches, tokens, pos = [[]], prompt, 0
            for _ in range(3):
                logits = model(tokens, causal(tokens.shape[1], pos + tokens.shape[1]), caches, pos)
                pos += tokens.shape[1]
                tokens = logits[:, -1:].argmax(-1)
        if run.hooked:
            model.blocks[0].attn.probs_hook = lambda: run.H("probs", lambda g: g.clamp(-0.1, 0.1), target="softmax")
            model.emb.weight.register_hook(run.H("emb", lambda g: g * 0.5))
        for _ in range(2):
            opt.zero_grad()
            caches, losses, pos, tokens = [[]], [], 0, prompt
            for step in range(3):
                logits = model(tokens, causal(tokens.shape[1], pos + tokens.shape[1]), caches, pos)
                if run.hooked and step == 1:
                    caches[0][0].register_hook(run.H("keys", lambda g: g * 3, target="cat"))
                if kind == "detached":
                    caches[0] = [t.detach() for t in caches[0]]
                pos += tokens.shape[1]
                following = logits[:, -1:].argmax(-1)
                losses.append(F.cross_entropy(logits[0], torch.cat([prompt[0, 1:], following[0]])[-logits.shape[1]:]))
                tokens = following
            run.backward(sum(losses))
            run.record(params_of(model))
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    return program


@pytest.mark.parametrize("kind", ["kept", "detached"])
def test_kv_cache_decoding_against_torch(kind):
    lens, plain = check(kv_cache(kind))


# --- 3. nn.MultiheadAttention: self-attention with module hooks, need_weights both ways, padding -------------------

class MHABlock(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.norm, self.mha = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x, pad=None, need_weights=False):
        h = self.norm(x)
        out, weights = self.mha(h, h, h, key_padding_mask=pad, need_weights=need_weights, attn_mask=causal(4)
                                if pad is None else None, average_attn_weights=False)
        return x + out, weights


def mha(kind: str):
    """``kind``: "weights" (need_weights=True, a hook on the weights, padding), "fast" (need_weights=False), "full"
    (a full backward hook and pre-hook on the MultiheadAttention itself: its inputs are wrapped, so q is k is v no
    more)."""
    def program(run):
        torch.manual_seed(2)
        block = MHABlock()
        x = torch.randn(2, 4, 8, requires_grad=True)
        name(run, block=block, x=x)
        opt = torch.optim.SGD(block.parameters(), lr=0.1)
        pad = torch.tensor([[False] * 4, [False, False, False, True]]) if kind == "weights" else None
        if run.hooked:
            block.register_full_backward_hook(run.H("block_full", lambda m, gi, go: (gi[0] * 0.5, *gi[1:]),
                                                             lambda a: a[1]))
            block.mha.out_proj.weight.register_hook(run.H("out_w", lambda g: g.clamp(-0.2, 0.2)))
            if kind == "full":
                block.mha.register_full_backward_pre_hook(run.H("mha_pre", lambda m, go: None, lambda a: a[1]))
                block.mha.register_full_backward_hook(run.H("mha_full", lambda m, gi, go: None, lambda a: a[1]))
        for _ in range(2):
            opt.zero_grad()
            x.grad = None
            out, weights = block(x, pad, need_weights=kind == "weights")
            loss = out.pow(2).mean()
            if weights is not None:
                if run.hooked:
                    weights.register_hook(run.H("weights", lambda g: g * 4))
                loss = loss + (weights * torch.arange(4.0)).sum()
            run.backward(loss)
            run.record(dict(params_of(block, "block"), x=x.grad))
            opt.step()
        return [p.detach().clone() for p in block.parameters()]
    return program


@pytest.mark.parametrize("kind", ["weights", "fast", "full"])
def test_multihead_attention_against_torch(kind):
    lens, plain = check(mha(kind))


# --- 4. padded batches: a query whose keys are all masked (NaN), cleaned by a hook or not -----------------------------

def padded(kind: str):
    """Left padding with a causal mask: the first query of the padded sequence sees only a padding key (a fully
    masked row: softmax gives NaN); its output row is zeroed (masked_fill) and left out of the loss, but NaN * 0 in
    the backward of ``p @ v`` makes the gradient of v NaN.  ``cleaned``: a hook on the qkv output replaces NaN by 0
    (the weights stay finite); ``raw``: no such hook."""
    def program(run):
        torch.manual_seed(3)
        attn = Attention(8, 2)
        x = torch.randn(2, 4, 8)
        name(run, attn=attn)
        pad = torch.tensor([[False] * 4, [True, False, False, False]])  # sequence 1: token 0 is padding
        mask = causal(4)[None, None] & ~pad[:, None, None, :]
        if run.hooked:
            attn.probs_hook = lambda: run.H("probs", lambda g: g * 1.0, target="softmax")
            if kind == "cleaned":
                def clean(module, args, output):
                    output.register_hook(run.H("clean", lambda g: g.nan_to_num(0.0), target="view"))
                attn.qkv.register_forward_hook(clean)
        out = attn(x, mask).masked_fill(pad[:, :, None], 0.0)
        loss = out[~pad].pow(2).sum()
        run.backward(loss)
        run.record(params_of(attn, "attn"))
        return out.detach()
    return program


@pytest.mark.parametrize("kind", ["cleaned", "raw"])
def test_a_fully_masked_row_against_torch(kind):
    assert problems_of(padded(kind)) == []  # (statements() compares NaN by allclose: the harness alone)
    from test_fresh_classes6 import first_nonfinite_by_torch
    from test_fresh_classes7 import Run

    def make(seen):
        run = Run("plain")
        run.backward = lambda loss: (seen.append(loss), None)[1]
        padded(kind)(run)
        return seen.pop()
    truth = first_nonfinite_by_torch(make)
    p = named(padded(kind)).passes[0]
    origin = p.first_nonfinite
    assert truth == "AddmmBackward0" and (origin.kind, origin.name) == ("node", truth)
    assert p.leaf_grads["attn.qkv.weight"].isnan().any() == (kind == "raw")
    assert p.grads_without_hooks["attn.qkv.weight"].isnan().any()



# --- 5. was false: uninitialized memory taken for where NaN started ---------------------------------------------------
# A model built inside the block (a %%lens cell that builds its transformer) makes every parameter with torch.empty,
# then writes over it (nn.init). torch.empty returns the memory as it was: it may hold NaN (here, that of NaN tensors
# just freed). The why answer said "where NaN or inf started: forward: empty (the block's first call to make NaN or
# inf from finite values ...)" for a program whose values and gradients are all finite (seen first in
# kv_cache("detached") above, by chance). debug/forward.py now leaves calls returning uninitialized memory out.

def test_uninitialized_memory_is_not_where_nan_started():
    import autograd_lens as al
    from autograd_lens.debug import forward_nonfinite

    garbage = 0
    with al.Lens(why=True) as lens:
        for _ in range(30):
            freed = [torch.full((16, 8), float("nan")) for _ in range(64)]  # (given NaN: no origin)
            del freed
            garbage += bool(torch.empty(16, 8).isnan().any())  # memory just freed: NaN about half of the time
            lin = nn.Linear(8, 16)  # its weight: torch.empty(16, 8), then kaiming_uniform_ over it
        lin(torch.randn(3, 8)).sum().backward()
    assert garbage and lin.weight.isfinite().all() and lin.weight.grad.isfinite().all()
    found, _ = forward_nonfinite(lens.passes[-1])
    assert found is None or "empty" not in found.op, found
    why = repr(lens.why("lin.weight"))
    assert "forward: empty" not in why and "every recorded gradient is finite" in why, why


# --- 6. a prompt encoded under no_grad (its cache kept), the continuation trained: why a layer got no gradient -------

def prompt_cache(kind: str):
    """A prefix projection (``prefix``) used only for the prompt; the prompt's keys and values are computed under
    ``no_grad`` (``no_grad``) or computed with grad and detached (``detached``), then the continuation is trained
    through that cache: ``prefix`` gets no gradient, the block's parameters do (from the continuation)."""
    def program(run):
        torch.manual_seed(4)
        model, prefix = LM(layers=1, kind="hand"), nn.Linear(8, 8)
        prompt, rest = torch.randint(0, 11, (1, 3)), torch.randint(0, 11, (1, 3))
        name(run, model=model, prefix=prefix)
        if run.hooked:
            prefix.weight.register_hook(run.H("prefix_w", lambda g: g * 2))  # never fires
            model.blocks[0].attn.probs_hook = lambda: run.H("probs", lambda g: g * 0.5, target="softmax")
        caches = [[]]

        def encode():
            x = prefix(model.emb(prompt))
            return model.blocks[0](x, causal(3), caches[0])
        if kind == "no_grad":
            with torch.no_grad():
                encode()
        else:
            encode()
            caches[0][:] = [t.detach() for t in caches[0]]
        logits = model(rest, causal(3, 6), caches, 3)
        run.backward(F.cross_entropy(logits[0, :-1], rest[0, 1:]))
        run.record(dict(params_of(model), **params_of(prefix, "prefix")))
        return logits.detach()
    return program


@pytest.mark.parametrize("kind", ["no_grad", "detached"])
def test_why_a_prompt_layer_got_no_gradient(kind):
    lens, plain = check(prompt_cache(kind), {"prefix.weight": kind, "prefix.bias": kind}, static=True)
    assert plain.per[0]["prefix.weight"] is None and plain.per[0]["model.emb.weight"] is not None


# --- 7. was false: the calls a cut value "went through" mixed the branches it took ------------------------------------
# The forward record kept one chain of calls per cut, and every call on any value descending from it added to that
# chain: the block output computed from the prompt under no_grad (x + attn, + mlp: "→ add → add") was named as what
# this graph uses, while only the cache (keys and values from a layer_norm and a linear of their own) entered it.
# debug/forward.py now keeps a chain per value (a cut of its own for each call that extends one), and the reason
# names the longest chain this graph uses (debug/evidence.py).

def branches(run):
    """An encoder under no_grad; its output goes two ways: tanh (used by the trained head) and exp (thrown away)."""
    torch.manual_seed(5)
    encoder, head = nn.Linear(3, 3), nn.Linear(3, 1)
    x = torch.randn(4, 3)
    name(run, encoder=encoder, head=head)
    if run.hooked:
        head.weight.register_hook(run.H("head_w", lambda g: g * 2))
    with torch.no_grad():
        h = encoder(x)
    used, unused = h.tanh(), h.exp().sum()  # noqa: F841  (the second is never used)
    run.backward(head(used).pow(2).mean())
    run.record(dict(params_of(encoder, "encoder"), **params_of(head, "head")))


def test_a_cut_value_went_through_the_calls_of_its_own_branch():
    lens, plain = check(branches, {"encoder.weight": "no_grad", "encoder.bias": "no_grad"}, static=True)
    assert lens.passes[0].unreached["encoder.weight"].text == \
        "encoder.weight went through linear under no_grad → tanh, and this graph uses the result"
    lens, plain = check(prompt_cache("no_grad"), {"prefix.weight": "no_grad", "prefix.bias": "no_grad"}, static=True)
    assert lens.passes[0].unreached["prefix.weight"].text == \
        "prefix.weight went through linear under no_grad, and this graph uses the result"  # (through the cache)


# --- 8. one block applied three times (ALBERT): which forward call each module hook call belongs to ------------------

def test_module_hooks_of_a_block_applied_three_times_name_their_forward_call():
    """The full hook and pre-hook of the shared block's attention and MLP fire once per forward call, the later call
    first; which call each belongs to is told by a tensor hook a forward hook put on each call's output."""
    from test_fresh_classes7 import Run

    def program(run, tags=None):
        torch.manual_seed(6)
        model = LM(layers=3, shared=True, kind="sdpa", norm="rms")
        tokens = torch.randint(0, 11, (2, 5))
        name(run, model=model)
        block = model.blocks[0]
        if run.hooked:
            block.attn.register_full_backward_hook(run.H("attn_full", lambda m, gi, go: None, lambda a: a[1]))
            block.mlp.register_full_backward_pre_hook(run.H("mlp_pre", lambda m, go: (go[0] * 0.5,),
                                                            lambda a: a[1]))
        calls = {"attn": 0, "mlp": 0}
        if tags is not None:
            def tag(kind):
                def forward_hook(module, args, output):
                    calls[kind] += 1
                    output.register_hook(lambda g, k=calls[kind]: tags.append((kind, k, g.clone())))
                return forward_hook
            block.attn.register_forward_hook(tag("attn"))
            block.mlp.register_forward_hook(tag("mlp"))
        logits = model(tokens[:, :-1], causal(4))
        run.backward(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))
        run.record(params_of(model))
    lens, plain = check(program, static=True)
    tags: list = []
    program(Run("plain"), tags)
    (p,) = lens.passes
    shown = [(c.hook, c.forward_call, c.forward_calls) for c in p.hook_calls]
    truth = []
    for call in p.hook_calls:
        kind = "attn" if call.hook == "attn_full" else "mlp"
        # grad_output (a tensor hook put on the output by a forward hook sees it after the pre-hook's change)
        received = call.context[0] if call.kind == "module_full" else call.grad_out[0]
        (k,) = {k for tagged, k, g in tags if tagged == kind and torch.equal(g, received)}
        truth.append((call.hook, k, 3))
    assert shown == truth and len(shown) == 6


# --- 9. attention probabilities kept with retain_grad, a cache made under inference_mode --------------------------

def retained(run):
    """An untied output layer; retain_grad on the attention probabilities of each pass and a hook that edits their
    gradient in place; two SGD steps (the harness cannot compare sparse gradients: the embedding is dense)."""
    torch.manual_seed(7)
    emb, attn, out = nn.Embedding(11, 8), Attention(8, 2), nn.Linear(8, 11)
    tokens = torch.randint(0, 11, (2, 5))
    name(run, emb=emb, attn=attn, out=out)
    opt = torch.optim.SGD([*emb.parameters(), *attn.parameters(), *out.parameters()], lr=0.1)
    if run.hooked:
        emb.weight.register_hook(run.H("emb", lambda g: g * 3))
        attn.probs_hook = lambda: run.H("probs_in_place", lambda g: g.mul_(0.5), target="softmax")
    kept, probs = [], []
    original = Attention.forward

    def forward(self, x, mask=None, cache=None, pos0=0):  # keeps the probabilities: retain_grad
        hook, self.probs_hook = self.probs_hook, None
        B, T, D = x.shape
        q, k, v = (t.view(B, T, 2, 4).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        p = (q @ k.transpose(-2, -1) / 2).masked_fill(~mask, float("-inf")).softmax(-1)
        p.retain_grad()
        kept.append(p)
        if hook is not None:
            p.register_hook(hook())
        self.probs_hook = hook
        return self.proj((p @ v).transpose(1, 2).reshape(B, T, D))
    for _ in range(2):
        opt.zero_grad()
        Attention.forward = forward
        try:
            logits = out(attn(emb(tokens[:, :-1]), causal(4)))
        finally:
            Attention.forward = original
        run.backward(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))
        run.record(dict(params_of(attn, "attn"), **params_of(out, "out"), **params_of(emb, "emb")))
        probs.append(kept[-1].grad.clone())
        opt.step()
    return [p.detach().clone() for p in attn.parameters()] + probs  # (retain_grad's .grad: compared too)


def test_retained_probabilities_edited_in_place_against_torch():
    lens, plain = check(retained)


def inference_cache(run):
    """A prompt's cache made under inference_mode, then used in a training pass: torch refuses to save inference
    tensors for backward (the same error under the lens)."""
    torch.manual_seed(8)
    model = LM(layers=1, kind="hand")
    name(run, model=model)
    if run.hooked:
        model.emb.weight.register_hook(run.H("emb", lambda g: g * 2))
    caches = [[]]
    with torch.inference_mode():
        model(torch.randint(0, 11, (1, 3)), causal(3), caches)
    try:
        logits = model(torch.randint(0, 11, (1, 2)), causal(2, 5), caches, 3)
        run.backward(logits.sum())
    except RuntimeError as problem:
        return str(problem)
    run.record(params_of(model))


def test_a_cache_made_under_inference_mode_against_torch():
    assert problems_of(inference_cache) == []


# --- 10. rotary embeddings in place on views, with hooks before and after the writes -------------------------------

def rope_hooks(run):
    """q and k projected, a hook on the clone rotary writes into (before the writes: it sees the gradient of the old
    version), on one half (a view written in place) and on the result; a node pre-hook on the last write's node."""
    torch.manual_seed(9)
    lin = nn.Linear(4, 8)
    x = torch.randn(1, 3, 4)
    name(run, lin=lin)
    q, k = lin(x).split(4, dim=-1)
    h = 2
    angle = torch.arange(3.0)[:, None] / 10 ** (torch.arange(h) / h)
    out = q.clone()
    if run.hooked:
        out.register_hook(run.H("before", lambda g: g * 10))
    a, b = out[..., :h], out[..., h:]
    a0 = a.clone()
    if run.hooked:
        a0.register_hook(run.H("a0", lambda g: g + 1))
    a.mul_(angle.cos()).sub_(b * angle.sin())
    b.mul_(angle.cos()).add_(a0 * angle.sin())
    if run.hooked:
        out.register_hook(run.H("after", lambda g: g.flip(-1)))
        out.grad_fn.register_prehook(run.H("pre", lambda go: (go[0] * 0.5,)))
    run.backward((out @ k.transpose(-2, -1)).softmax(-1).pow(2).sum())
    run.record(params_of(lin, "lin"))
    return out.detach()


def test_rotary_in_place_on_views_with_hooks_against_torch():
    check(rope_hooks, static=True)


# --- 11. hooks that keep the gradients they see (no clone), and the gradient of a block's input kept by reference ---

def kept_references(run):
    """A hook keeps each attention-probability gradient it sees without copying it, and another edits the kept one
    of the previous micro-batch in place; a post-accumulate hook keeps ``.grad`` itself; what was kept is returned
    (compared with the plain run's: the lens must not change what those references see)."""
    torch.manual_seed(10)
    model = LM(layers=1, kind="hand", norm="rms")
    tokens = torch.randint(0, 11, (2, 2, 5))
    name(run, model=model)
    seen, grads = [], []
    if run.hooked:
        def keep(g):
            if seen:
                seen[-1].mul_(-1)  # edits what an earlier call received, after the fact
            seen.append(g)
        model.blocks[0].attn.probs_hook = lambda: run.H("keep", keep, target="softmax")
        model.blocks[0].attn.qkv.weight.register_post_accumulate_grad_hook(
            run.H("keep_grad", lambda p: grads.append(p.grad), lambda a: a[0].grad.clone()))
    for m in range(2):
        logits = model(tokens[m, :, :-1], causal(4))
        run.backward(F.cross_entropy(logits.flatten(0, 1), tokens[m, :, 1:].flatten()))
        run.record(params_of(model))
    return [g.clone() for g in seen + grads] + [model.blocks[0].attn.qkv.weight.grad is g for g in grads]


def test_hooks_that_keep_references_against_torch():
    lens, plain = check(kept_references, static=True)
    assert plain.out[-2:] == [True, True]  # .grad kept its buffer across the two micro-batches


# --- 12. a preallocated (static) KV cache written in place step by step, hooks on it --------------------------------

def static_cache(run):
    """Keys and values written into preallocated zeros (index_copy, a clone written through a slice: CopySlices), each
    step attending over the filled part; a hook on the cache after each write and on each step's keys."""
    torch.manual_seed(11)
    lin = nn.Linear(4, 8)
    xs = torch.randn(3, 1, 4)
    name(run, lin=lin)
    kc, vc = torch.zeros(1, 3, 4), torch.zeros(1, 3, 4)
    outs = []
    for t in range(3):
        k, v = lin(xs[t]).split(4, dim=-1)
        if run.hooked:
            k.register_hook(run.H(f"k{t}", lambda g, t=t: g * (t + 1)))
        kc = kc.index_copy(1, torch.tensor([t]), k[:, None])  # (out of place: the last step's kc is saved)
        vc = vc.clone()
        vc[:, t:t + 1] = v[:, None]
        if run.hooked:
            vc.register_hook(run.H(f"vc{t}", lambda g: g.clamp(-0.3, 0.3)))
        p = (k[:, None] * kc[:, :t + 1]).sum(-1).softmax(-1)
        outs.append((p[..., None] * vc[:, :t + 1]).sum(1))
    run.backward(torch.stack(outs).pow(2).sum())
    run.record(params_of(lin, "lin"))
    return kc.detach(), vc.detach()


def test_a_static_cache_written_in_place_against_torch():
    check(static_cache, static=True)


# --- 13. was costly: the paths of a small transformer were followed 20,000 calls deep before being given up ---------
# Lens(why=True) writes each leaf's gradient as a sum over the paths from the root, calling backward functions
# along each; a 2-layer decoder with RMSNorm and rotary embeddings has more path steps than CALL_LIMIT allows, and the
# walk found out only after 20,001 calls (a 2.5 ms backward took 2.5 s with one thread, 10 s with two on a loaded
# machine, for the answer "too many paths"). debug/paths.py now counts the steps first (per function, the number of
# paths from the roots to it) and calls nothing when they are too many.

def test_too_many_paths_are_known_before_any_backward_function_is_called(monkeypatch):
    import autograd_lens as al
    from autograd_lens.debug import paths

    calls = []
    original = paths._Walker._call
    monkeypatch.setattr(paths._Walker, "_call", lambda self, *args: calls.append(1) or original(self, *args))
    torch.manual_seed(0)
    model = LM(kind="sdpa", norm="rms", rope=True)
    tokens = torch.randint(0, 11, (2, 5))
    plain = None
    for why in (False, True):
        model.zero_grad()
        with al.Lens(names={"model": model}, why=why) as lens:
            F.cross_entropy(model(tokens[:, :-1], causal(4)).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        plain = plain or grads
    assert all(torch.equal(a, b) for a, b in zip(plain, grads))
    found = lens.paths_to("model.emb.weight")
    assert not found.known and "too many" in found.unknown and calls == [], (found.unknown, len(calls))
    small = LM(layers=1, kind="sdpa", norm="rms", rope=True)
    with al.Lens(names={"small": small}, why=True) as lens:  # one block: followed, and its sum is autograd's
        small(tokens[:1, :2]).pow(2).sum().backward()
    found = lens.paths_to("small.norm.weight")
    assert found.known and calls and torch.allclose(torch.tensor(found.total.tolist()), small.norm.weight.grad)


def test_the_guide_gives_the_path_limits_of_the_code():
    from autograd_lens.debug import paths

    guide = " ".join((Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text().split())
    assert (paths.NODE_LIMIT, paths.CALL_LIMIT) == (300, 20_000)
    assert "more than 300 backward functions, or whose paths take more than 20,000 calls of them" in guide
