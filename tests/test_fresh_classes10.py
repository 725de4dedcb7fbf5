"""Fresh eyes on classes of real code no earlier round tried (helper ``fresh10``, 2026-11-28): graph neural nets
(index_add_, scatter_reduce with ties, gather, embedding_bag), mixtures of experts (top-k gating, experts never
chosen, capacity dropping, a load-balancing loss), attention (scaled_dot_product_attention, MultiheadAttention with
key_padding_mask, fully masked rows), LoRA adapters written by hand, probabilistic code (rsample, REINFORCE,
Gumbel-softmax), quantization-aware training (fake_quantize, straight-through estimators) and masked losses.

Each program runs plainly, under a ``Lens``, as "truth" (an observer post-hook on every node) and with its hooks not
registered (the harness of tests/test_fresh_classes7.py, imported): the lens must change nothing, and every hook call,
node gradient, ``.grad``, value without hooks and predict answer it shows must be torch's.  On top of that harness,
:func:`statements` compares what the cards, the drawing and the notes say with torch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograd_lens as al
from autograd_lens.format import format_value
from autograd_lens.model import GradWritten, NodeRun
from autograd_lens.views.passview import views_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import Run, equal, problems_of, run  # noqa: E402  (the differential harness)


def name(run, **tensors) -> None:
    """Names for the lens of :func:`named` (the harness's own runs read names where backward is called: none)."""
    if hasattr(run, "names"):
        run.names.update(tensors)


def named(program) -> al.Lens:
    """``program`` under ``Lens(names=..., why=True)``, with the names it gives through :func:`name`
    (``lens.given``: those names)."""
    result = Run("lens")
    result.names = {}
    with al.Lens(names=result.names, why=True) as lens:
        result.out = program(result)
    lens.given = result.names
    return lens


def drawing_problems(lens: al.Lens, plain, static: bool) -> list[str]:
    """Each named leaf's box in each pass's DOT drawing: its grad field prints torch's .grad of that pass (or of the
    pass before, when .grad held it when the pass began: the drawing is laid out at the widest text), and, for a
    program whose leaves never change (``static``), its data field prints the leaf's value."""
    leaves = {}
    for key, value in lens.given.items():
        if isinstance(value, torch.Tensor):
            leaves[key] = value
        for owner in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(owner, nn.Module):
                prefix = key if owner is value else f"{key}['{next(k for k, v in value.items() if v is owner)}']"
                leaves.update({f"{prefix}.{n}": p for n, p in owner.named_parameters()})
    problems, compared = [], 0
    for index, view in enumerate(views_for(lens.passes)):
        for label in re.findall(r'label="\{?([^"]*?\|data[^"]*?)\}?"', view.dot):
            name, data, grad = re.match(r"(.+?) \[[\dx]*\](?: \(use \d+ of \d+\))?\|data(?:\\n)?(.*?)\|grad (.*?)"
                                        r"(?:\|\[.*)?$", label).groups()
            data = re.sub(r"\]\\n\[", "], [", data).strip()
            summary = re.fullmatch(r"\[[\dx]+ \w+\] min (\S+) max (\S+) norm (\S+)", data)
            if static and name in leaves and summary:
                value = leaves[name].detach().double()
                if [float(v) for v in summary.groups()] != pytest.approx(
                        [value.min().item(), value.max().item(), value.norm().item()], rel=1e-3):
                    problems.append(f"pass {index + 1}: {name} drawn with data {data}; it is {leaves[name]}")
            elif static and name in leaves and not says(data, leaves[name]):
                problems.append(f"pass {index + 1}: {name} drawn with data {data}; it is {leaves[name]}")
            truths = [per[name] for per in plain.per[max(index - 1, 0):index + 1] if per.get(name) is not None]
            if name in plain.per[index] and not any(says(grad, truth) for truth in truths):
                problems.append(f"pass {index + 1}: {name} drawn with grad {grad}; torch: {truths}")
            compared += name in leaves
    return problems + ([] if compared else ["no leaf box was compared"])


def numbers(text: str) -> list[float]:
    """The whole numbers a value text prints, in order (a text cut short ends in "…": its last part is dropped)."""
    return [float(v) for v in re.findall(r"-?(?:\d+\.?\d*(?:e[+-]\d+)?|inf|nan)(?=[,\])]|$)", text.split("…")[0])]


def says(text: str, value) -> bool:
    """Whether ``text`` prints ``value`` (to the digits it prints: 4 significant ones, or more)."""
    if text == format_value(value):
        return True
    printed, true = numbers(text), value.detach().double().reshape(-1).tolist()
    return bool(printed) and len(printed) <= len(true) and printed == pytest.approx(true[:len(printed)], rel=1e-3,
                                                                                    abs=1e-12, nan_ok=True)


def statements(program) -> tuple[list[str], al.Lens, object]:
    """What the steps say that is not torch's: each node card's "It received", the result of each chain-rule line,
    each .grad card's title (what .grad held after the write), what it says AccumulateGrad added and what .grad
    would be without the hooks.  Returns (problems, the named lens, the plain run)."""
    plain, unhooked, lens = run(program, "plain"), run(program, "nohook"), named(program)
    problems, checked = [], 0
    for index, (view, p) in enumerate(zip(views_for(lens.passes), lens.passes)):
        accumulated, stepped = set(), any("changed since pass" in note for note in p.notes)
        for number, step in enumerate(view.steps):
            event = p.events[number - 1] if 0 < number <= len(p.events) else None
            text = " ".join(step.lines)
            if isinstance(event, NodeRun):
                received = ", ".join(format_value(v) for v in event.grad_in)
                if f"It received {received}." not in step.lines:
                    problems.append(f"pass {index + 1}: {step.title}: {step.lines[:2]}, received {received}")
                for line in step.lines:
                    said = re.match(r"(?:Through its \w+ use: )?∂.*?; (.+?) receives .* = (.+)\.$", line)
                    if said and event.grad_out and event.name != "BackwardHookFunctionBackward":
                        shown = [format_value(v) for v in event.grad_out if v is not None]
                        if said.group(2) not in shown:
                            problems.append(f"pass {index + 1}: {step.title}: {line!r}; it sent {shown}")
            if not (isinstance(event, GradWritten) and event.by == "AccumulateGrad" and event.name in plain.per[index]):
                continue
            truth, without = plain.per[index][event.name], unhooked.per[index][event.name]
            after = [c for c in p.hook_calls if c.kind == "post_accumulate_grad" and c.node == event.node]
            if not after and not says(step.title.split(": ", 1)[1], truth):
                problems.append(f"pass {index + 1}: {step.title}; .grad is {format_value(truth)}")
            held = re.match(r".*\.grad already held (.*): backward\(\) adds", step.note or "")
            before = plain.per[index - 1][event.name] if held and index else None
            if held:
                accumulated.add(event.name)
            added = re.match(r"AccumulateGrad added this pass's gradient (.*) to ", step.lines[0])
            if added and not after and not says(added.group(1), truth - before if before is not None else truth):
                problems.append(f"pass {index + 1}: {step.lines[0]}; .grad went from {before} to {truth}")
            said = re.search(r"Without the hooks it would be (.*?)(?: \(it is .*\))?\.$", text)
            if said and without is not None and not stepped and event.name not in p.unknown \
                    and not says(said.group(1), without):
                problems.append(f"pass {index + 1}: {step.title}: {said.group(0)}; it is {format_value(without)}")
            checked += 1
        for name, value in p.added_without_hooks.items():  # the table's "this pass without hooks"
            if value is None or stepped or name in p.unknown or name not in unhooked.per[index]:
                continue
            truth = unhooked.per[index][name]
            if name in accumulated:
                truth = truth - unhooked.per[index - 1][name]
            if not torch.allclose(value, truth, rtol=1e-5, atol=1e-7):
                problems.append(f"pass {index + 1}: {name} added without hooks {value}; it is {truth}")
            checked += 1
    if not checked:
        problems.append("no .grad card was compared")
    return problems, lens, plain


def drawn_grads(lens: al.Lens, index: int = -1) -> dict[str, str]:
    """Each leaf's grad field in the drawing of pass ``index`` at its last step."""
    from autograd_lens.views.steps import frame

    view = views_for(lens.passes)[index]
    last = frame(view.steps, len(view.steps) - 1)
    labels = {node.id: node.label for node in view.backward_pass.graph.nodes}
    return {labels[node]: text for node, text in last.grads.items() if node in labels}


def check(program, unreached: dict | None = None, static: bool = False,
          clipped: tuple = ()) -> tuple[al.Lens, object]:
    """Both comparisons, empty; then the program under a Lens that knows its names: each named leaf's grad field at
    the end of each pass is torch's .grad, and the named tensors that got no gradient are ``unreached`` (name -> the
    reason's code), in every pass.  Returns the named lens and the plain run, for the program's own assertions.
    ``clipped``: leaves whose post-accumulate hook edits .grad; the DOT label is laid out at its widest text (the
    value before the hook), which the SVG replaces by the last one: only their last-step values are compared."""
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


# --- 1. graph neural nets: index_add_, scatter_reduce (sum, mean, amax/amin with ties), gather, embedding_bag -------

SRC, DST = torch.tensor([0, 1, 2, 3, 0, 0]), torch.tensor([1, 2, 1, 0, 3, 3])  # node 4 sends and receives nothing;
# edges 4 and 5 carry the same message to node 3 (a tie for amax/amin)


def message_passing(reduce: str):
    def program(run):
        torch.manual_seed(0)
        x = torch.randn(5, 3, requires_grad=True)
        lin, att = nn.Linear(3, 3), nn.Parameter(torch.ones(6))
        prior = torch.zeros(5, 3, requires_grad=True)  # ties with the messages of rows 0 where they are 0 after relu
        name(run, x=x, lin=lin, att=att, prior=prior)
        opt = torch.optim.SGD([*lin.parameters(), att], lr=0.1)
        if run.hooked:
            lin.register_full_backward_hook(run.H("lin_full", lambda m, gi, go: None, lambda a: a[1]))
        for _ in range(2):
            opt.zero_grad()
            h = lin(x)
            msg = h.index_select(0, SRC) * att[:, None]
            if reduce.endswith("_self"):
                msg = torch.relu(msg)
            if run.hooked:
                target = "relu" if reduce.endswith("_self") else "mul"
                msg.register_hook(run.H("msg", lambda g: g * 2, target=target))
            if reduce == "index_add_":
                agg = torch.zeros(5, 3)
                agg.index_add_(0, DST, msg)
            elif reduce == "scatter_add":
                agg = torch.zeros(5, 3).scatter_add(0, DST[:, None].expand(-1, 3), msg)
            elif reduce.endswith("_self"):  # include_self: the running value (a leaf) ties with messages too
                agg = prior.scatter_reduce(0, DST[:, None].expand(-1, 3), msg, reduce=reduce[:-len("_self")])
            else:
                agg = torch.zeros(5, 3).scatter_reduce(0, DST[:, None].expand(-1, 3), msg, reduce=reduce,
                                                       include_self=False)
            if run.hooked:
                target = {"index_add_": "indexadd", "scatter_add": "scatteradd"}.get(reduce, "scatterreduce")
                agg.register_hook(run.H("agg", lambda g: g.clamp(-1, 1), target=target))
            picked = agg.gather(1, torch.tensor([[0], [2], [1], [1], [0]]))
            loss = (torch.tanh(agg) * torch.arange(15.0).view(5, 3)).sum() + picked.pow(2).sum()
            run.backward(loss)
            run.record({"x": x.grad, "lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad, "att": att.grad,
                        "prior": prior.grad})
            opt.step()
        return [p.detach().clone() for p in (*lin.parameters(), att)]
    return program


@pytest.mark.parametrize("reduce", ["index_add_", "scatter_add", "mean", "amax", "amin", "prod", "amax_self",
                                    "prod_self", "mean_self"])
def test_message_passing_against_torch(reduce):
    # node 4 is never a source: zeros, and no note says it got no gradient
    lens, plain = check(message_passing(reduce), None if reduce.endswith("_self") else {"prior": "not_on_path"})
    assert all(not grads["x"][4].any() for grads in plain.per)


def embedding_bags(run):
    torch.manual_seed(0)
    bags = {mode: nn.EmbeddingBag(6, 2, mode=mode, padding_idx=5) for mode in ("sum", "mean", "max")}
    tokens, offsets = torch.tensor([1, 2, 2, 5, 0, 1, 5]), torch.tensor([0, 3, 4])  # bag 2 = [0, 1, 5]; 3 and 4
    weights = torch.tensor([0.5, 1.0, 2.0, 3.0, 1.0, -1.0, 4.0], requires_grad=True)
    name(run, bags=bags, weights=weights)
    if run.hooked:
        for mode, bag in bags.items():
            bag.weight.register_hook(run.H("w_" + mode, lambda g: g * 10))
        weights.register_hook(run.H("per_sample", lambda g: None))
    out = bags["sum"](tokens, offsets, per_sample_weights=weights) + bags["mean"](tokens, offsets) \
        + bags["max"](tokens, offsets) * 3
    run.backward(out.pow(2).sum())
    run.record(dict({f"bags['{m}'].weight": b.weight.grad for m, b in bags.items()}, weights=weights.grad))


def test_embedding_bags_against_torch():
    lens, plain = check(embedding_bags, static=True)
    (p,) = lens.passes
    for mode in ("sum", "mean", "max"):  # padding_idx 5 and unused tokens 3, 4: rows of zeros
        assert not plain.per[0][f"bags['{mode}'].weight"][3:].any()
    assert not plain.per[0]["weights"][[3, 6]].any()  # per-sample weights of padding tokens: zeros


# --- 2. mixture of experts: top-k gating, experts never chosen, capacity dropping, a load-balancing loss -------------

class MoE(nn.Module):
    def __init__(self, d=3, experts=4, k=2, capacity=2, per_token=False):
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))
        self.k, self.capacity, self.per_token = k, capacity, per_token

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1)
        top, chosen = probs.topk(self.k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        if self.per_token:  # one call per token routed to an expert, up to its capacity: calls vary per expert
            rows, used = [], [0] * len(self.experts)
            for t in range(x.shape[0]):
                mixed = 0
                for slot in range(self.k):
                    e = int(chosen[t, slot])
                    if used[e] < self.capacity:
                        used[e] += 1
                        mixed = mixed + self.experts[e](x[t]) * top[t, slot]
                rows.append(mixed if isinstance(mixed, torch.Tensor) else torch.zeros_like(x[t]))
            out = torch.stack(rows)
        for e, expert in enumerate(self.experts if not self.per_token else ()):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue  # never chosen: its parameters get no gradient (None), not zeros
            keep = (torch.arange(rows.numel()) < self.capacity).float()  # capacity: later tokens are dropped
            out = out.index_add(0, rows, expert(x[rows]) * (top[rows, slot] * keep)[:, None])
        load = F.one_hot(chosen[:, 0], len(self.experts)).float().mean(0)
        aux = len(self.experts) * (load * probs.mean(0)).sum()
        return out, aux


def mixture(run, per_token=False, tags=None):
    """``tags``: a list to which each expert's backward adds (expert, which forward call of the pass, the gradient
    of that call's output), from a tensor hook put on each call's output by a forward hook (the truth of "for
    forward call k")."""
    torch.manual_seed(3)
    moe = MoE(capacity=3, per_token=True) if per_token else MoE()
    with torch.no_grad():  # expert 3 is never chosen
        moe.gate.bias.copy_(torch.tensor([2.0, 1.5, 1.0, -9.0]))
    x = torch.randn(5, 3, requires_grad=True)
    name(run, moe=moe, x=x)
    opt = torch.optim.SGD(moe.parameters(), lr=0.1)
    if run.hooked:
        for e, expert in enumerate(moe.experts):
            expert.register_full_backward_hook(run.H(f"expert{e}", lambda m, gi, go: None, lambda a: a[1]))
            expert.register_full_backward_pre_hook(run.H(f"expert{e}_pre", lambda m, go: (go[0] * 0.5,),
                                                         lambda a: a[1]))
        moe.gate.weight.register_hook(run.H("gate_w", lambda g: g.clamp(-0.1, 0.1)))
    calls = [0] * 4
    if tags is not None:
        def tag(module, args, output, e):
            calls[e] += 1
            output.register_hook(lambda g, k=calls[e]: tags.append((e, k, g.clone())))
        for e, expert in enumerate(moe.experts):
            expert.register_forward_hook(lambda m, a, o, e=e: tag(m, a, o, e))
    for _ in range(2):
        opt.zero_grad()
        calls[:] = [0] * 4
        out, aux = moe(x)
        run.backward(out.pow(2).sum() + 0.01 * aux)
        run.record(dict({f"moe.{n}": p.grad for n, p in moe.named_parameters()}, x=x.grad))
        opt.step()
    return [p.detach().clone() for p in moe.parameters()]


def test_mixture_of_experts_against_torch():
    never = {"moe.experts.3.weight": "not_on_path", "moe.experts.3.bias": "not_on_path"}
    lens, plain = check(mixture, never)
    per_token = lambda run: mixture(run, per_token=True)  # noqa: E731
    lens, plain = check(per_token, never)
    tags: list = []
    mixture(Run("plain"), per_token=True, tags=tags)  # which forward call each full hook's grad_output belongs to
    for p in lens.passes:
        full = [c for c in p.hook_calls if c.kind == "module_full"]
        assert len(full) == 8 and p.hook_calls[-1].hook == "gate_w"
        for call in full:
            e = int(call.hook[len("expert"):])
            (k,) = {k for tagged, k, g in tags if tagged == e and torch.equal(g, call.context[0])}
            assert (call.forward_call, call.forward_calls) == (k, 3 if e < 2 else 2), call
    for p, grads in zip(lens.passes, plain.per):
        assert grads["moe.experts.3.weight"] is None  # never chosen
        counts = {call.hook: call.forward_calls for call in p.hook_calls if call.hook.startswith("expert")}
        assert counts


# --- 3. attention: scaled_dot_product_attention, MultiheadAttention with key_padding_mask, masked rows -------------

def attention(kind: str):
    def program(run):
        torch.manual_seed(0)
        x = torch.randn(2, 4, 8, requires_grad=True)
        proj = nn.Linear(8, 24)
        mha = nn.MultiheadAttention(8, 2, batch_first=True)
        name(run, x=x, proj=proj, mha=mha)
        if run.hooked:
            mha.register_full_backward_hook(run.H("mha_full", lambda m, gi, go: None, lambda a: a[1]))
        q, k, v = proj(x).chunk(3, dim=-1)
        if run.hooked:
            q.register_hook(run.H("q", lambda g: g * 0.5))
            k.register_hook(run.H("k", lambda g: None))
            v.register_hook(run.H("v", lambda g: g.clamp(-0.2, 0.2)))
        if kind == "sdpa_causal":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif kind == "sdpa_mask":
            mask = torch.ones(4, 4, dtype=torch.bool).tril()
            out = F.scaled_dot_product_attention(q.unflatten(-1, (2, 4)).transpose(1, 2),
                                                 k.unflatten(-1, (2, 4)).transpose(1, 2),
                                                 v.unflatten(-1, (2, 4)).transpose(1, 2),
                                                 attn_mask=mask, dropout_p=0.0).transpose(1, 2).flatten(2)
        else:  # key_padding_mask: the last two keys of the second sequence are padding
            pad = torch.tensor([[False] * 4, [False, False, True, True]])
            out, weights = mha(q, k, v, key_padding_mask=pad, need_weights=True)
            out = out + weights.sum()
        run.backward(out.pow(2).sum())
        run.record({"x": x.grad, "proj.weight": proj.weight.grad, "mha.in_proj_weight": mha.in_proj_weight.grad})
    return program


@pytest.mark.parametrize("kind", ["sdpa_causal", "sdpa_mask", "mha_padding"])
def test_attention_against_torch(kind):
    unused = dict.fromkeys(["mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight", "mha.out_proj.bias"],
                           "not_on_path")  # (MultiheadAttention is called in one program only)
    check(attention(kind), None if kind == "mha_padding" else unused, static=True)


def masked_rows(kind: str):
    """A query whose keys are all masked: NaN from softmax of -inf (by hand), or from MultiheadAttention whose
    key_padding_mask pads a whole sequence."""
    torch.manual_seed(0)
    q = torch.randn(3, 4, requires_grad=True)
    k = torch.randn(3, 4, requires_grad=True)
    if kind == "by_hand":
        scores = q @ k.T
        mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])  # row 2: none
        attn = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        loss = (attn @ k).sum()
    else:
        mha = nn.MultiheadAttention(4, 1, batch_first=True)
        pad = torch.tensor([[True, True, True]])
        loss = mha(q[None], k[None], k[None], key_padding_mask=pad)[0].sum()
    return loss, q, k


@pytest.mark.parametrize("kind", ["by_hand", "mha"])
def test_where_nan_started_in_a_fully_masked_row(kind):
    from test_fresh_classes6 import first_nonfinite_by_torch

    truth = first_nonfinite_by_torch(lambda seen: masked_rows(kind)[0])
    loss, q, k = masked_rows(kind)
    loss.backward()
    with al.Lens(why=True) as lens:
        traced, tq, tk = masked_rows(kind)
        traced.backward()
    assert equal(q.grad, tq.grad) and equal(k.grad, tk.grad) and tk.grad.isnan().any()
    origin = lens.passes[0].first_nonfinite
    assert truth is not None and (origin.kind, origin.name) == ("node", truth)


# --- 4. LoRA adapters written by hand: a frozen base, W + B @ A in the forward, a merge under no_grad ----------------

class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank=2, alpha=4.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))  # zero at the start: A gets zeros, not None
        self.scale = alpha / rank

    def forward(self, x):
        return F.linear(x, self.base.weight + self.scale * self.B @ self.A, self.base.bias)


def lora(run):
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(nn.Linear(4, 3)), nn.GELU(), LoRALinear(nn.Linear(3, 2)))
    x = torch.randn(5, 4)
    name(run, model=model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.05)
    if run.hooked:
        model[0].A.register_hook(run.H("A0", lambda g: g * 2))
        model[2].B.register_post_accumulate_grad_hook(run.H("B2_after", lambda p: None, lambda a: a[0].grad))
        model[2].register_full_backward_pre_hook(run.H("lora2_pre", lambda m, go: None, lambda a: a[1]))
    for step in range(3):
        opt.zero_grad()
        run.backward(model(x).pow(2).mean())
        run.record({f"model.{n}": p.grad for n, p in model.named_parameters()})
        opt.step()
        if step == 1:  # merge the adapters into the base, start them again
            with torch.no_grad():
                for layer in (model[0], model[2]):
                    layer.base.weight += layer.scale * layer.B @ layer.A
                    layer.B.zero_()
    return [p.detach().clone() for p in model.parameters()]


def test_lora_against_torch():
    frozen = {f"model.{i}.base.{p}": "requires_grad_false" for i in (0, 2) for p in ("weight", "bias")}
    lens, plain = check(lora, frozen)
    first = plain.per[0]
    assert first["model.0.base.weight"] is None and first["model.2.base.bias"] is None  # frozen: never a .grad
    assert not first["model.0.A"].any() and first["model.0.B"].any()  # B = 0: A's gradient is zeros


# --- 5. probabilistic: rsample, REINFORCE with a detached baseline, Gumbel-softmax straight-through, sampling -------

def probabilistic(kind: str):
    def program(run):
        torch.manual_seed(0)
        mu, log_sigma = torch.zeros(4, requires_grad=True), torch.full((4,), -0.5, requires_grad=True)
        logits = torch.tensor([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]], requires_grad=True)  # row 1: a tie
        name(run, mu=mu, log_sigma=log_sigma, logits=logits)
        if run.hooked:
            mu.register_hook(run.H("mu", lambda g: g * 3))
            logits.register_hook(run.H("logits", lambda g: g.clamp(-0.3, 0.3)))
        for _ in range(2):
            torch.manual_seed(1)
            dist = torch.distributions.Normal(mu, log_sigma.exp())
            if kind == "rsample":
                z = dist.rsample((3,))
                if run.hooked:
                    z.register_hook(run.H("z", lambda g: None))
                loss = (z - 1).pow(2).mean() + torch.distributions.kl_divergence(
                    dist, torch.distributions.Normal(0.0, 1.0)).sum()
            elif kind == "reinforce":
                z = dist.sample((3,))  # not differentiable: the gradient reaches mu through log_prob only
                reward = -(z - 1).pow(2).sum(-1)
                baseline = reward.mean().detach()
                cat = torch.distributions.Categorical(logits=logits)
                a = cat.sample()
                loss = -((reward - baseline) * dist.log_prob(z).sum(-1)).mean() - cat.log_prob(a).sum() * 0.1 \
                    - 0.01 * cat.entropy().sum()
            else:  # Gumbel-softmax, hard: one-hot forward, soft backward
                y = F.gumbel_softmax(logits, tau=0.5, hard=True)
                if run.hooked:
                    y.register_hook(run.H("y", lambda g: g * -1))
                loss = (y * torch.tensor([1.0, 2.0, 3.0])).sum() + (mu * log_sigma).sum()
            run.backward(loss)
            run.record({"mu": mu.grad, "log_sigma": log_sigma.grad, "logits": logits.grad})
        return mu.grad, log_sigma.grad, logits.grad
    return program


@pytest.mark.parametrize("kind", ["rsample", "reinforce", "gumbel"])
def test_probabilistic_against_torch(kind):
    check(probabilistic(kind), {"logits": "not_on_path"} if kind == "rsample" else None, static=True)


# --- 6. quantization-aware training: fake_quantize, x + (q - x).detach(), a custom STE Function, clamp edges --------

class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g


def quantized(kind: str):
    def program(run):
        torch.manual_seed(0)
        lin = nn.Linear(4, 3)
        x = torch.tensor([[-2.0, -1.0, 0.0, 1.0], [0.25, 0.5, 1.5, 3.0]], requires_grad=True)  # 1.0: a clamp edge
        scale, zero = nn.Parameter(torch.tensor([0.05])), nn.Parameter(torch.tensor([0.0]))
        fq = torch.ao.quantization.FakeQuantize(quant_min=-4, quant_max=3, dtype=torch.qint8,
                                                qscheme=torch.per_tensor_symmetric)
        name(run, lin=lin, x=x, scale=scale, zero=zero)
        opt = torch.optim.SGD([*lin.parameters(), scale, zero], lr=0.1)
        if run.hooked:
            scale.register_hook(run.H("scale", lambda g: g * 0.1))
        if run.hooked:
            lin.weight.register_hook(run.H("w", lambda g: g * 0.5))
        for _ in range(2):
            opt.zero_grad()
            w = lin.weight
            if kind == "fake_quantize":
                w = torch.fake_quantize_per_tensor_affine(w, 0.05, 0, -8, 7)  # values past ±0.4: no gradient
                xq = torch.fake_quantize_per_tensor_affine(x, 0.5, 0, -2, 2)  # -2.0 and 3.0 outside: zero
            elif kind == "detach_trick":
                w = w + ((w * 8).round() / 8 - w).detach()
                xq = x + (x.clamp(-1.0, 1.0) - x).detach()
            elif kind == "learnable":  # LSQ: the scale and zero point learn too (a backward with three outputs)
                w = torch._fake_quantize_learnable_per_tensor_affine(w, scale, zero, -8, 7, 1.0)
                xq = fq(x)  # torch.ao's FakeQuantize: its observer updates buffers at each forward
            else:
                w = RoundSTE.apply(w * 8) / 8
                xq = x.clamp(-1.0, 1.0)  # at exactly -1.0 and 1.0 the gradient passes
            if run.hooked:
                xq.register_hook(run.H("xq", lambda g: g + 1))
            run.backward(F.linear(xq, w, lin.bias).pow(2).sum())
            run.record({"x": x.grad, "lin.weight": lin.weight.grad, "lin.bias": lin.bias.grad, "scale": scale.grad,
                        "zero": zero.grad})
            opt.step()
        return [p.detach().clone() for p in (*lin.parameters(), scale, zero, *fq.buffers())]
    return program


@pytest.mark.parametrize("kind", ["fake_quantize", "detach_trick", "ste_function", "learnable"])
def test_quantization_against_torch(kind):
    unused = {} if kind == "learnable" else {"scale": "not_on_path", "zero": "not_on_path"}
    check(quantized(kind), unused)


# --- 7. losses with masks: ignore_index, label_smoothing, reduction='none' then weighted, NLL with class weights ----

def masked_losses(run):
    torch.manual_seed(0)
    logits = torch.randn(5, 4, requires_grad=True)
    name(run, logits=logits)
    target = torch.tensor([1, -100, 3, 0, -100])
    weight = torch.tensor([1.0, 0.0, 2.0, 0.5])  # class 1 weighs nothing: row 0's NLL gradient is zeros
    per_row = torch.tensor([1.0, 1.0, 0.0, 2.0, 1.0])
    if run.hooked:
        logits.register_hook(run.H("logits", lambda g: g * 10))
    h = logits * 1
    if run.hooked:
        h.register_hook(run.H("h", lambda g: None))
    ce = F.cross_entropy(h, target, ignore_index=-100, label_smoothing=0.1)
    none = (F.cross_entropy(h, target.clamp(min=0), reduction="none") * per_row).sum() / per_row.sum()
    nll = F.nll_loss(F.log_softmax(h, -1), target, weight=weight, ignore_index=-100)
    run.backward(ce + none + nll)
    run.record({"logits": logits.grad})
    run.backward(F.nll_loss(F.log_softmax(logits, -1), target, weight=weight, reduction="sum"))
    run.record({"logits": logits.grad})


def test_masked_losses_against_torch():
    lens, plain = check(masked_losses, static=True)


# --- 8. the start card of a pass through a module with no name here --------------------------------------------------
# Was false: a module made and hooked inside a function (an expert, an adapter, a model built by a helper) has no name
# in the namespace the lens reads, so its hook is not listed; the start card then said "No hook on a named tensor or on
# a module is attached to this graph now." while that module's hook was attached, and fired in the pass (every
# program above that runs inside a function said it). Fixed in views/context.inventory_lines: "... or on a named
# module ...", beside the line naming the module whose boundaries the graph goes through.


def _head(x, calls, remove=False):
    lin = nn.Linear(2, 2)
    handle = lin.register_full_backward_hook(lambda m, gi, go: calls.append("full"))
    out = lin(x)
    if remove:  # removed after the forward: torch copied it at the forward, it still fires
        handle.remove()
    return out


@pytest.mark.parametrize("remove", [False, True])
def test_the_start_card_never_denies_a_hook_of_a_module_with_no_name(remove):
    from autograd_lens.views.steps import hook_totals, steps_for

    calls = []
    x = torch.ones(1, 2, requires_grad=True)
    with al.Lens() as lens:
        _head(x, calls, remove).sum().backward()
    assert calls == ["full"] and [c.kind for c in lens.passes[0].hook_calls] == ["module_full"]
    start = steps_for(lens.passes[0], hook_totals(lens.passes))[0]
    assert not any(line.startswith("No hook on a named tensor or on a module") for line in start.lines), start.lines
    assert "No hook on a named tensor or on a named module is attached to this graph now." in start.lines
    assert any(line.startswith("(Linear: this graph goes through its module hook boundaries") for line in start.lines)


# --- 9. the note on a module hook that never fired, on an expert the router never chose ------------------------------
# Was false: expert 3 of a mixture of experts, hooked like the others, is never chosen, so its hook never fires; the
# lens noted "The backward hook on moe.experts.3 never fired: no backward pass here went through that module. Was the
# output computed by another copy of the model (e.g. before reloading)? Recompute it with this one." The passes went
# through moe (every other expert's and the gate's .grad was written): the output did come from this model, and
# recomputing it changes nothing. The same note was given for an encoder called under torch.no_grad() before a head
# that trains. Fixed in capture/annotate.py and notes.py: where a pass wrote the .grad of another parameter of a module
# containing it, the note ("unused_module_hook") says the module was not used, through autograd, for that output.


def test_a_hook_on_an_expert_never_chosen_is_not_blamed_on_another_copy():
    plain = run(mixture, "plain")
    assert "expert3" not in {entry[0] for entry in plain.log} and "expert0" in {entry[0] for entry in plain.log}
    assert all(grads["moe.experts.3.weight"] is None and grads["moe.gate.weight"] is not None for grads in plain.per)
    lens = named(mixture)
    (found,) = [note for note in lens.notes if note.code.endswith("_hook")]
    assert found.code == "unused_module_hook", found.message
    assert found.message.startswith("The backward hook on moe.experts.3 never fired: no backward pass here went "
                                    "through that module, though passes went through moe.experts, which contains it")
    assert "another copy" not in found.message and "Recompute" not in found.message


def test_a_hook_on_an_encoder_called_under_no_grad_is_not_blamed_on_another_copy():
    torch.manual_seed(0)
    model = nn.ModuleDict({"encoder": nn.Linear(2, 2), "head": nn.Linear(2, 1)})
    fired = []
    with al.Lens(names={"model": model}) as lens:
        model["encoder"].register_full_backward_hook(lambda m, gi, go: fired.append(1))
        with torch.no_grad():  # a frozen feature extractor, as in fine-tuning a head
            feats = model["encoder"](torch.ones(1, 2))
        model["head"](feats).sum().backward()
    assert fired == [] and model["encoder"].weight.grad is None and model["head"].weight.grad is not None
    assert [n.code for n in lens.notes] == ["unused_module_hook"]
    assert "a call under torch.no_grad() or detached" in lens.notes[0].message


def test_a_hook_on_a_copy_of_the_model_is_still_blamed_on_the_copy():
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1))
    new = copy.deepcopy(model)
    with al.Lens(names={"model": model, "new": new}) as lens:
        new[0].register_full_backward_hook(lambda m, gi, go: None)
        model(torch.ones(1, 2)).sum().backward()  # the old copy's output
    assert new[0].weight.grad is None and model[0].weight.grad is not None
    assert [n.code for n in lens.notes] == ["old_model_hook"] and "new.0" in lens.notes[0].message
