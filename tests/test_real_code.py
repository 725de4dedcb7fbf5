"""Other people's code under the lens: real layers and training idioms, plain vs traced.

Each scenario runs plainly and inside a Lens (outcome, values, warnings compared); the layers with
modifying hooks also check every "without hooks" value against a run with the hooks not registered.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_lens as al
from conftest import assert_identical, live_recorders, run_plain_and_traced

S = {}


def scenario(f):
    S[f.__name__] = f
    return f


def g(*ts):
    return [None if t.grad is None else t.grad.clone() for t in ts]


@scenario
def lstm_with_hooks():
    m = nn.LSTM(4, 5, batch_first=True)
    x = torch.randn(2, 3, 4, requires_grad=True)
    out, (h, c) = m(x)
    out.register_hook(lambda g: g * 0.5)
    h.register_hook(lambda g: g.clamp(-0.1, 0.1))
    (out.sum() + h.sum() + c.sum()).backward()
    return g(x, *m.parameters())


@scenario
def conv_bn_relu_inplace():
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(inplace=True), nn.MaxPool2d(2))
    x = torch.randn(2, 2, 8, 8, requires_grad=True)
    y = m(x)
    y.register_hook(lambda g: g * 2)
    y.mean().backward()
    return g(x, *m.parameters()) + [m[1].running_mean.clone()]


@scenario
def transformer_layer():
    m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 8, requires_grad=True)
    m(x).pow(2).mean().backward()
    return g(x, *m.parameters())


@scenario
def attention_with_module_hooks():
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    seen = []
    m.register_full_backward_hook(lambda mod, gi, go: seen.append(len(gi)))
    m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2,) + tuple(go[1:]))
    x = torch.randn(2, 4, 8, requires_grad=True)
    out, w = m(x, x, x)
    out.sum().backward()
    return g(x, *m.parameters()) + [seen]


@scenario
def autocast_bf16():
    m = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
        y.register_hook(lambda g: g * 2)
        loss = y.float().pow(2).sum()
    loss.backward()
    return g(x, *m.parameters())


@scenario
def clip_grad_norm_training_loop():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for p in m.parameters():
        p.register_post_accumulate_grad_hook(lambda p: None)
    norms = []
    for _ in range(4):
        opt.zero_grad()
        loss = m(torch.randn(5, 4)).pow(2).mean()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)))
        opt.step()
    return [p.detach().clone() for p in m.parameters()] + [norms]


@scenario
def torch_func_grad_and_vmap():
    from torch.func import grad, vmap

    f = lambda w, x: (w * x).sin().sum()
    w = torch.randn(3)
    xs = torch.randn(4, 3)
    return [grad(f)(w, xs[0]), vmap(grad(f), in_dims=(None, 0))(w, xs)]


@scenario
def global_hooks_in_this_process():
    import torch.nn.modules.module as mm

    seen = []
    h1 = mm.register_module_full_backward_hook(lambda mod, gi, go: seen.append(type(mod).__name__))
    try:
        m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        m(torch.randn(3, 2, requires_grad=True)).sum().backward()
    finally:
        h1.remove()
    return seen + g(*m.parameters())


@scenario
def retain_grad_and_nonleaf_grad_warning():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    z = y * 3
    z.sum().backward()
    w = torch.randn(2, 2, requires_grad=True) * 10
    w.sum().backward()
    return [y.grad, w.grad, x.grad]


@scenario
def backward_with_inputs():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    c = a * 2
    (c * b).sum().backward(inputs=[b, c])
    return [a.grad, b.grad, c.grad]


@scenario
def grad_of_nonleaf_and_unused():
    a = torch.randn(3, requires_grad=True)
    b = a.exp()
    c = torch.randn(3, requires_grad=True)
    b.register_hook(lambda g: g + 1)
    return list(torch.autograd.grad((b * 2).sum(), [b, a, c], allow_unused=True))


@scenario
def double_backward_hessian():
    x = torch.randn(3, requires_grad=True)
    return list(torch.autograd.functional.hessian(lambda t: (t**3).sum(), x))


@scenario
def view_inplace_on_leaf_copy():
    x = torch.randn(4, requires_grad=True)
    y = x.clone()
    y[1:3].mul_(2)
    y.register_hook(lambda g: g * 3)
    z = y.view(2, 2)
    z.sum().backward()
    return g(x)


@scenario
def embedding_dense_with_padding():
    e = nn.Embedding(10, 3, padding_idx=0)
    idx = torch.tensor([[0, 2, 4], [4, 3, 0]])
    out = e(idx)
    out.register_hook(lambda g: g * 2)
    out.sum().backward()
    return g(e.weight)


@scenario
def complex_grads():
    z = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
    w = (z * z.conj()).real.sum()
    z.register_hook(lambda g: g * 2)
    w.backward()
    return g(z)


@scenario
def float64_and_int_index():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 0, 3])
    y = x[idx]
    y.register_hook(lambda g: g * 4)
    y.sum().backward()
    return g(x)


@scenario
def nll_crossentropy_step():
    torch.manual_seed(0)
    m = nn.Linear(6, 4)
    x = torch.randn(8, 6)
    t = torch.randint(4, (8,))
    logits = m(x)
    logits.register_hook(lambda g: g.clamp(-0.01, 0.01))
    F.cross_entropy(logits, t).backward()
    return g(*m.parameters())


@scenario
def parametrization_weight_norm():
    m = torch.nn.utils.parametrizations.weight_norm(nn.Linear(3, 3))
    x = torch.randn(2, 3)
    m(x).sum().backward()
    return [p.grad.clone() for p in m.parameters()]


@scenario
def hook_removal_mid_loop():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    out = []
    for i in range(3):
        y = x * 2
        h = y.register_hook(lambda g: g * 10)
        if i == 1:
            h.remove()
        y.sum().backward()
        out.append(x.grad.clone())
    return out


@scenario
def multi_output_unbind_hooks():
    x = torch.randn(3, 2, requires_grad=True)
    a, b, c = x.unbind(0)
    b.register_hook(lambda g: g * 5)
    (a * 2 + c).sum().backward()
    return g(x)


@pytest.mark.parametrize("name", sorted(S))
def test_real_code_behaves_as_without_the_lens(name):
    plain, traced, lens = run_plain_and_traced(S[name])
    assert_identical(plain, traced)
    assert live_recorders() == []
    assert [note for p in lens.passes for note in p.notes] == []
    # torch.func's passes are left alone, and said so (tests/test_untraced.py); every other scenario: nothing said
    left_alone = ["a torch.func transform (grad, vjp, jacrev, vmap, ...) ran a backward pass: not recorded (left alone)"]
    assert lens.recording_notes == (left_alone if name == "torch_func_grad_and_vmap" else [])


def lstm(h):
    m = nn.LSTM(4, 5, batch_first=True)
    x = torch.randn(2, 3, 4, requires_grad=True)
    out, (hh, c) = m(x)
    if h:
        out.register_hook(lambda g: g * 0.5)
        hh.register_hook(lambda g: g.clamp(-0.1, 0.1))
    return dict(m.named_parameters(), x=x), out.sum() + hh.sum() + c.sum()


def conv(h):
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2))
    x = torch.randn(2, 2, 8, 8, requires_grad=True)
    y = m(x)
    if h:
        y.register_hook(lambda g: g * 2)
    return dict(m.named_parameters(), x=x), y.mean()


def attn(h):
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    if h:
        m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2,) + tuple(go[1:]))
    x = torch.randn(2, 4, 8, requires_grad=True)
    out, w = m(x, x, x)
    return dict(m.named_parameters(), x=x), out.sum()


def bf16(h):
    m = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
        if h:
            y.register_hook(lambda g: g * 2)
        loss = y.float().pow(2).sum()
    return dict(m.named_parameters(), x=x), loss


def xent(h):
    m = nn.Linear(6, 4)
    x = torch.randn(8, 6)
    t = torch.randint(4, (8,))
    logits = m(x)
    if h:
        logits.register_hook(lambda g: g.clamp(-0.01, 0.01))
    return dict(m.named_parameters()), nn.functional.cross_entropy(logits, t)


def modhook(h):
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    if h:
        m[1].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 3,))
    x = torch.randn(5, 3, requires_grad=True)
    return dict(m.named_parameters(), x=x), m(x).pow(2).sum()


def transformer(h):
    m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 8, requires_grad=True)
    y = m(x)
    if h:
        y.register_hook(lambda g: g * 0.25)
    return dict(m.named_parameters(), x=x), y.pow(2).mean()


LAYERS = {
    "lstm": lstm,
    "conv + batchnorm": conv,
    "bf16 autocast": bf16,
    "cross-entropy": xent,
    "module full hook": modhook,
    "transformer layer": transformer,
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_real_layers_values_without_hooks_equal_a_run_without_them(name):
    build = LAYERS[name]
    torch.manual_seed(0)
    leaves, loss = build(False)
    loss.backward()
    expected = {key: value.grad.clone() for key, value in leaves.items()}
    torch.manual_seed(0)
    leaves, loss = build(True)
    with al.Lens(names=leaves) as lens:
        loss.backward()
    (backward_pass,) = lens.passes
    assert backward_pass.unknown == {}
    for key, value in expected.items():
        assert torch.equal(backward_pass.grads_without_hooks[key], value), key
