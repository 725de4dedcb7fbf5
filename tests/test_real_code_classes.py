"""Code this project did not write, in the lens, against torch: torch.distributions, TorchScript, quantization-aware
training, pruning and parametrizations, spectral norm, EmbeddingBag, a conv/BatchNorm/pool stack, gumbel-softmax and
label smoothing (2026-11-28).  Each program runs plainly, under a Lens and without its hooks (tests/programs.py's
compare: every hook call, node run, .grad and value without hooks); the lens said nothing false on any, and these
tests keep it so.  An LBFGS closure (several passes inside one optimizer step, the parameters moved between them by
what the hooks made) is checked for its note: "without hooks" there is the pass with its hooks removed, on the values
the parameters hold now."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (tests/programs.py: the differential oracle)
from test_fresh_classes import EXTRA  # noqa: E402  (programs.py's prelude for hand-written programs)

PRELUDE = EXTRA + '''
import torch.distributions as D
from real_code.scripted import scripted
'''

PROGRAMS = {
 "distributions_rsample_logprob_kl": ("""
    mu = torch.randn(3, requires_grad=True)
    ls = torch.randn(3, requires_grad=True)
    h0 = REG(mu, 'register_hook', make_hook('h0', 'scale'))
    d = D.Normal(mu, ls.exp())
    z = d.rsample()
    h1 = REG(z, 'register_hook', make_hook('h1', 'scale'))
    lp = d.log_prob(z.detach()).sum()
    kl = D.kl_divergence(d, D.Normal(torch.zeros(3), torch.ones(3))).sum()
    h2 = REG(kl, 'register_hook', make_hook('h2', 'observe'))
    PASS('backward', (z ** 2).sum() + lp + kl)
    """, ["mu", "ls"]),
 "transformed_distribution_and_categorical": ("""
    logits = torch.randn(4, requires_grad=True)
    loc = torch.randn(2, requires_grad=True)
    c = D.Categorical(logits=logits)
    h0 = REG(c.logits, 'register_hook', make_hook('h0', 'scale'))
    td = D.TransformedDistribution(D.Normal(loc, torch.ones(2)), [D.transforms.TanhTransform(), D.transforms.AffineTransform(0.5, 2.0)])
    y = td.rsample()
    h1 = REG(y, 'register_hook', make_hook('h1', 'scale'))
    PASS('backward', c.log_prob(torch.tensor(2)) + c.entropy() + td.log_prob(y).sum())
    """, ["logits", "loc"]),
 "fake_quant_qat": ("""
    lin = torch.ao.nn.qat.Linear(3, 2, qconfig=torch.ao.quantization.get_default_qat_qconfig('fbgemm'))
    x0 = torch.randn(4, 3, requires_grad=True)
    h0 = REG(lin, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
    out = lin(x0)
    h1 = REG(out, 'register_hook', make_hook('h1', 'scale'))
    PASS('backward', out.sum())
    """, ["x0", "lin.weight", "lin.bias"]),
 "gumbel_softmax_and_label_smoothing": ("""
    logits = torch.randn(3, 5, requires_grad=True)
    g = torch.nn.functional.gumbel_softmax(logits, tau=0.5, hard=True)
    h0 = REG(g, 'register_hook', make_hook('h0', 'scale'))
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 3, 4]), label_smoothing=0.2)
    h1 = REG(ce, 'register_hook', make_hook('h1', 'scale'))
    PASS('backward', (g * torch.arange(5.0)).sum() + ce)
    """, ["logits"]),
 "spectral_norm_power_iteration": ("""
    lin = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(3, 3))
    x0 = torch.randn(2, 3, requires_grad=True)
    h0 = REG(lin, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
    out = lin(x0)
    h1 = REG(out, 'register_hook', make_hook('h1', 'scale'))
    PASS('backward', (out ** 2).sum())
    out = lin(x0)
    PASS('backward', out.sum())
    """, ["x0", "lin.parametrizations.weight.original", "lin.bias"]),
 "prune_l1_unstructured": ("""
    import torch.nn.utils.prune
    lin = torch.nn.Linear(4, 3)
    torch.nn.utils.prune.l1_unstructured(lin, 'weight', amount=0.5)
    x0 = torch.randn(2, 4, requires_grad=True)
    h0 = REG(lin.weight_orig, 'register_hook', make_hook('h0', 'scale'))
    h1 = REG(lin, 'register_full_backward_hook', make_module_hook('h1', 'scale'))
    out = lin(x0)
    PASS('backward', (out ** 2).sum())
    """, ["x0", "lin.weight_orig", "lin.bias"]),
 "parametrize_symmetric": ("""
    class Sym(torch.nn.Module):
        def forward(self, X):
            return X.triu() + X.triu(1).transpose(-1, -2)
    lin = torch.nn.Linear(3, 3)
    torch.nn.utils.parametrize.register_parametrization(lin, 'weight', Sym())
    x0 = torch.randn(2, 3, requires_grad=True)
    h0 = REG(lin.parametrizations.weight.original, 'register_hook', make_hook('h0', 'scale'))
    w = lin.weight
    h1 = REG(w, 'register_hook', make_hook('h1', 'scale'))
    out = torch.nn.functional.linear(x0, w, lin.bias) + lin(x0)
    PASS('backward', out.sum())
    """, ["x0", "lin.parametrizations.weight.original", "lin.bias"]),
 "embedding_bag_and_sparse_free_dense": ("""
    eb = torch.nn.EmbeddingBag(6, 3, mode='max')
    idx = torch.tensor([0, 2, 4, 5, 1, 3])
    off = torch.tensor([0, 3])
    e = eb(idx, off)
    h0 = REG(e, 'register_hook', make_hook('h0', 'scale'))
    h1 = REG(eb.weight, 'register_post_accumulate_grad_hook', make_after('h1', 'inplace'))
    PASS('backward', (e * e).sum())
    """, ["eb.weight"]),
 "conv_bn_relu_maxpool": ("""
    conv = torch.nn.Conv2d(1, 2, 3, padding=1)
    bn = torch.nn.BatchNorm2d(2)
    net = torch.nn.Sequential(conv, bn, torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    x0 = torch.randn(2, 1, 4, 4, requires_grad=True)
    h0 = REG(conv, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
    h1 = REG(bn, 'register_full_backward_pre_hook', make_module_pre('h1', 'scale'))
    out = net(x0)
    h2 = REG(out, 'register_hook', make_hook('h2', 'scale'))
    PASS('backward', out.sum())
    """, ["x0", "conv.weight", "bn.weight"]),
 "jit_scripted_function_three_passes": ("""
    x0 = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    y = scripted(x0, w)
    h0 = REG(y, 'register_hook', make_hook('h0', 'scale'))
    PASS('backward', y.sum())
    y = scripted(x0, w)
    h1 = REG(y, 'register_hook', make_hook('h1', 'scale'))
    PASS('backward', y.sum())
    y = scripted(x0, w)
    h2 = REG(y, 'register_hook', make_hook('h2', 'scale'))
    h3 = REG(y.grad_fn, 'register_prehook', make_pre('h3', 'scale'))
    PASS('backward', y.sum())
    """, ["x0", "w"]),
}


def _run(program, mode):
    return programs.run(program, mode, PRELUDE)


def _program(source, leaves, seed):
    return programs.Program([f"torch.manual_seed({seed})"] + textwrap.dedent(source).strip().splitlines(), leaves, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_code_we_did_not_write_against_torch(name, seed):
    program = _program(*PROGRAMS[name], seed)
    plain = _run(program, "plain")
    assert plain.error is None, plain.error
    assert programs._truth_calls(_run(program, "truth").log), "no hook ran: the program tests nothing"
    assert programs.compare(program, _run) == []


LBFGS = """
    w = torch.randn(3, requires_grad=True)
    target = torch.randn(3)
    opt = torch.optim.LBFGS([w], max_iter=3, history_size=2)
    h0 = REG(w, 'register_hook', make_hook('h0', 'scale'))
    def closure():
        opt.zero_grad()
        loss = ((w - target) ** 2).sum()
        PASS('backward', loss)
        return loss
    opt.step(closure)
    """


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lbfgs_closure_passes_say_what_without_hooks_means_there(seed):
    program = _program(LBFGS, ["w"], seed)
    lensed, unhooked = _run(program, "lens"), _run(program, "nohook")
    shown = lensed.lens.passes
    assert len(shown) == len(lensed.passes) >= 2
    # the first pass: the value without hooks is torch's
    assert programs.equal(shown[0].grads_without_hooks["w"], unhooked.passes[0]["grads"]["w"])
    # later passes: w moved by a step that used the hooked gradient; said, not passed off as a run without hooks
    for later in shown[1:]:
        assert any(note.startswith("w changed since pass 1, whose hooks changed gradients") for note in later.notes)
