"""Fresh eyes on hooks as practitioners use them for interpretability and training tricks (helper ``fresh12``,
2026-11-28): Grad-CAM (a forward hook keeps a conv activation, a tensor hook on it keeps its gradient), guided
backprop and deconvnet (full or legacy backward hooks on every ReLU clamping grad_input) with saliency maps,
Opacus-style per-sample gradients (forward hooks keep activations, full backward hooks compute ``grad_sample`` with
einsum), the gradient reversal layer of DANN (an autograd.Function, and a tensor hook returning ``-lambda * g``), FGSM
and PGD on the input, PCGrad's gradient surgery with several ``autograd.grad`` calls, Captum-style DeepLift (rescale
hooks) with integrated gradients, and the optimizer step inside a post-accumulate-grad hook.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py, imported), then through :func:`check` of tests/test_fresh_classes10.py (the cards, the
drawing and the notes against torch).  One statement was false and is fixed (debug/unreached.py): a hook returning
zeros was blamed for zeros a dead ReLU made anyway (:func:`test_a_hook_returning_zeros_is_not_blamed_for_a_dead_relu`);
the rest are kept as differential tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import problems_of  # noqa: E402  (the differential harness)
from test_fresh_classes10 import check, drawing_problems, name, named, statements  # noqa: E402  (cards, drawing)

from autograd_lens.views.passview import views_for  # noqa: E402


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


# --- 1. Grad-CAM --------------------------------------------------------------------------------------------------

def grad_cam(kind: str):
    """Grad-CAM as tutorials write it: a forward hook on the last conv saves its activation and registers a tensor
    hook on it that saves its gradient; backward from one class score; the map is relu(sum(weights * activation))."""
    def program(run):
        model = small_cnn()
        x = torch.randn(2, 1, 5, 5, requires_grad=(kind == "saliency"))
        name(run, model=model, x=x)
        saved = {}

        def keep_activation(module, args, output):
            saved["act"] = output.detach()
            if run.hooked and kind != "full":
                output.register_hook(run.H("save_grad", lambda g: saved.__setitem__("grad", g.detach()),
                                           target="convolution"))
        handle = model[2].register_forward_hook(keep_activation) if kind != "full" else None
        if run.hooked and kind == "full":  # the other way: a full backward hook keeps grad_output[0]
            handle = model[2].register_full_backward_hook(run.H(
                "save_grad", lambda m, gi, go: saved.__setitem__("grad", go[0].detach()), lambda a: a[1]))
            model[2].register_forward_hook(keep_activation)
        maps = []
        for cls in (0, 2):
            model.zero_grad()
            scores = model(x)
            if kind == "retain":
                run.backward(scores[:, cls].sum(), retain_graph=True)
            else:
                run.backward(scores[0, cls])
            run.record(dict({f"model.{n}": p.grad for n, p in model.named_parameters()},
                            **({"x": x.grad} if kind == "saliency" else {})))
            if run.hooked:
                weights = saved["grad"].mean(dim=(2, 3), keepdim=True)
                maps.append(F.relu((weights * saved["act"]).sum(1)))
        if handle is not None:
            handle.remove()
        return maps
    return program


@pytest.mark.parametrize("kind", ["plain", "retain", "saliency", "full"])
def test_grad_cam_against_torch(kind):
    lens, plain = check(grad_cam(kind), static=True)
    for index, p in enumerate(lens.passes):  # one call a pass: a new hook each forward, or one module hook
        (call,) = [c for c in p.hook_calls if c.hook == "save_grad"]
        assert call.invocation == (index + 1 if kind == "full" else 1)


# --- 2. guided backprop, deconvnet, saliency maps --------------------------------------------------------------------

def guided(kind: str):
    """Hooks on every ReLU of a small CNN: guided backprop (clamp grad_input at 0), deconvnet (clamp grad_output at
    0, ignoring the ReLU's mask), pytorch-cnn-visualizations' version (a forward hook keeps each ReLU's output, the
    backward hook multiplies the clamped gradient by (output > 0)), written with full hooks or legacy ones; the
    saliency map is x.grad.abs().max over channels, for two images, one pass each."""
    def program(run):
        model = small_cnn()
        outputs = []
        name(run, model=model)
        relus = [m for m in model if isinstance(m, nn.ReLU)]
        for number, relu in enumerate(relus):
            if kind == "guided":
                hook = lambda m, gi, go: (torch.clamp(gi[0], min=0.0),)  # noqa: E731
            elif kind == "deconvnet":
                hook = lambda m, gi, go: (torch.clamp(go[0], min=0.0),)  # noqa: E731
            else:  # "visualizations" (full) or "legacy" (register_backward_hook), a forward hook keeping outputs
                relu.register_forward_hook(lambda m, a, o: outputs.append(o))
                hook = lambda m, gi, go: (outputs.pop() .gt(0).float() * torch.clamp(gi[0], min=0.0),)  # noqa: E731
            if run.hooked:
                register = relu.register_backward_hook if kind == "legacy" else relu.register_full_backward_hook
                register(run.H(f"relu{number}", hook, lambda a: a[1]))
        maps = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            x = torch.randn(1, 1, 5, 5).requires_grad_()
            name(run, x=x)
            model.zero_grad()
            outputs.clear()
            scores = model(x)
            run.backward(scores[0, scores.argmax()])
            run.record(dict({f"model.{n}": p.grad for n, p in model.named_parameters()}, x=x.grad))
            maps.append(x.grad.abs().amax(dim=1))
        return maps
    return program


@pytest.mark.parametrize("kind", ["guided", "deconvnet", "visualizations", "legacy"])
def test_guided_backprop_against_torch(kind):
    lens, plain = check(guided(kind))
    for index, p in enumerate(lens.passes):  # the later ReLU first, each its pass's call
        assert [(c.hook, c.invocation) for c in p.hook_calls] == [("relu1", index + 1), ("relu0", index + 1)]


# --- 3. Opacus-style per-sample gradients --------------------------------------------------------------------------

def per_sample(kind: str):
    """Opacus' way: a forward hook keeps each trainable module's input, a full backward hook computes per-sample
    gradients from it and grad_output with einsum into ``p.grad_sample`` (conv: through ``unfold``); then DP-SGD
    clips each sample's gradient, sums them into ``p.grad`` (no noise) and steps.  ``twice``: one Linear called on two
    inputs in one forward (Opacus keeps a list of activations, pops the last for the first backward call)."""
    def program(run):
        torch.manual_seed(0)
        if kind == "conv":
            model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))
            x = torch.randn(4, 1, 4, 4)
        else:
            model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
            x = torch.randn(4, 3)
        y = torch.tensor([0, 1, 1, 0])
        name(run, model=model)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        trainable = [m for m in model if isinstance(m, (nn.Linear, nn.Conv2d))]

        def capture(module, args, output):
            module.__dict__.setdefault("activations", []).append(args[0].detach())

        def compute(module, grad_input, grad_output):
            a, b = module.activations.pop(), grad_output[0].detach()
            if isinstance(module, nn.Conv2d):
                a = F.unfold(a, module.kernel_size)  # (n, c*k*k, L)
                b = b.flatten(2)  # (n, out, L)
                ws = torch.einsum("noL,niL->noi", b, a).view(-1, *module.weight.shape)
                bs = b.sum(2)
            else:
                ws, bs = torch.einsum("n...i,n...j->nij", b, a), b.reshape(b.shape[0], -1, b.shape[-1]).sum(1)
            for p, g in ((module.weight, ws), (module.bias, bs)):
                p.grad_sample = p.grad_sample + g if getattr(p, "grad_sample", None) is not None else g

        for number, module in enumerate(trainable):
            module.register_forward_hook(capture)
            if run.hooked:
                module.register_full_backward_hook(run.H(f"per_sample{number}", compute, lambda a: a[1]))
        kept = []  # each pass: name -> (the per-sample gradients, torch's .grad)
        for _ in range(2):
            opt.zero_grad()
            for p in model.parameters():
                p.grad_sample = None
            for m in trainable:
                m.activations = []
            out = model(x) if kind != "twice" else model[2](model[1](model[0](x))) + model[2](x[:, :1].expand(4, 4))
            run.backward(F.cross_entropy(out, y, reduction="sum"))
            record = {f"model.{n}": p.grad for n, p in model.named_parameters()}
            if not run.hooked:  # the same per-sample gradients, one sample at a time (the lens sees no such pass)
                forward = model if kind != "twice" else \
                    (lambda v: model[2](model[1](model[0](v))) + model[2](v[:, :1].expand(1, 4)))
                samples = [torch.autograd.grad(F.cross_entropy(forward(x[i:i + 1]), y[i:i + 1], reduction="sum"),
                                               list(model.parameters())) for i in range(len(x))]
                for p, per in zip(model.parameters(), zip(*samples)):
                    p.grad_sample = torch.stack(per)
            # each sample's gradient clipped at norm 1, added up: DP-SGD's .grad (no noise)
            norms = torch.stack([p.grad_sample.flatten(1).norm(dim=1) for p in model.parameters()]).norm(dim=0)
            scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
            kept.append({n: (p.grad_sample, p.grad.clone()) for n, p in model.named_parameters()})
            for p in model.parameters():
                p.grad = torch.einsum("n,n...->...", scale, p.grad_sample)
            run.record(record)
            opt.step()
        return [p.detach().clone() for p in model.parameters()], kept
    return program


@pytest.mark.parametrize("kind", ["linear", "conv", "twice"])
def test_per_sample_gradients_against_torch(kind):
    lens, plain = check(per_sample(kind))
    for kept in plain.out[1]:  # the per-sample gradients add up to torch's .grad (before the clipping)
        for samples, grad in kept.values():
            assert torch.allclose(samples.sum(0), grad, atol=1e-5)
    for index, p in enumerate(lens.passes):  # twice: the Linear's second call first, each "call k of 2"
        expected = [("per_sample1", index + 1), ("per_sample0", index + 1)] if kind != "twice" else \
            [("per_sample1", 2 * index + 1), ("per_sample1", 2 * index + 2), ("per_sample0", index + 1)]
        assert [(c.hook, c.invocation) for c in p.hook_calls] == expected
        if kind == "twice":
            assert [(c.forward_call, c.forward_calls) for c in p.hook_calls[:2]] == [(2, 2), (1, 2)]


# --- 4. the gradient reversal layer (DANN) ----------------------------------------------------------------------------

class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lambd):
        ctx.lambd = lambd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.lambd, None


def reversal(kind: str):
    """DANN: a feature extractor feeds a label classifier and, through a gradient reversal layer, a domain
    classifier; the reversal is an autograd.Function (``function``), a tensor hook returning ``-lambda * g`` on a
    copy of the features (``hook``), or the hook on the features themselves (``hook_on_features``: it reverses the
    label loss's gradient too, the classic mistake); lambda grows over three training steps (from step 1: at step 0 it
    is 0, see :func:`dead_relu`)."""
    def program(run):
        torch.manual_seed(2)  # 14 of the 18 features are live
        features, label, domain = nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2), nn.Linear(3, 1)
        x, y, d = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 1, 0]), torch.tensor([0., 0., 0., 1., 1., 1.])
        name(run, features=features, label=label, domain=domain)
        params = [*features.parameters(), *label.parameters(), *domain.parameters()]
        opt = torch.optim.SGD(params, lr=0.1)
        for step in range(1, 4):
            lambd = 2.0 / (1.0 + torch.exp(torch.tensor(-10.0 * step / 3)).item()) - 1.0
            opt.zero_grad()
            h = features(x)
            if kind == "function":
                reversed_h = GradReverse.apply(h, lambd)  # not a hook: there "without hooks" too
            else:
                reversed_h = h.clone() if kind == "hook" else h
                if run.hooked:
                    reversed_h.register_hook(run.H("reverse", lambda g, lambd=lambd: -lambd * g,
                                                   target="clone" if kind == "hook" else "relu"))
            loss = F.cross_entropy(label(h), y) + F.binary_cross_entropy_with_logits(
                domain(reversed_h).squeeze(1), d)
            run.backward(loss)
            run.record({f"{m}.{n}": p.grad for m, module in (("features", features), ("label", label),
                                                              ("domain", domain))
                        for n, p in module.named_parameters()})
            opt.step()
        return [p.detach().clone() for p in params]
    return program


@pytest.mark.parametrize("kind", ["function", "hook", "hook_on_features"])
def test_gradient_reversal_against_torch(kind):
    lens, plain = check(reversal(kind))
    for p in lens.passes:
        assert [c.hook for c in p.hook_calls] == ([] if kind == "function" else ["reverse"])


def dead_relu(alive: bool, grad: bool = False):
    """A hook returning zeros (GRL's lambda at step 0) on a copy of a ReLU's output; the ReLU is dead (all its outputs
    0, ``alive`` False) or not: the first Linear gets zeros either way, but only the live one because of the hook.
    ``grad``: by torch.autograd.grad."""
    def program(run):
        torch.manual_seed(0)
        lin = nn.Linear(4, 3)
        with torch.no_grad():
            lin.bias.fill_(1.0 if alive else -9.0)
        name(run, lin=lin)
        h = torch.relu(lin(torch.randn(6, 4))).clone()
        if run.hooked:
            h.register_hook(run.H("reverse", lambda g: -0.0 * g, target="clone"))
        if grad:
            run.record(dict(zip(["lin.weight", "lin.bias"], run.grad(h.sum(), list(lin.parameters())))))
        else:
            run.backward(h.sum())
            run.record({f"lin.{n}": p.grad for n, p in lin.named_parameters()})
    return program


@pytest.mark.parametrize("alive", [False, True])
def test_a_hook_returning_zeros_is_not_blamed_for_a_dead_relu_by_autograd_grad(alive):
    lens, plain = check_grad_only(dead_relu(alive, grad=True))
    assert {name: reason.code for name, reason in lens.passes[0].unreached.items()} == \
        ({"lin.weight": "hook_zeros", "lin.bias": "hook_zeros"} if alive else {})


@pytest.mark.parametrize("alive", [False, True])
def test_a_hook_returning_zeros_is_not_blamed_for_a_dead_relu(alive):
    """Was false: DANN's reversal hook at step 0 (lambda 0) on the output of a dead ReLU: the lens said the leaves
    got only zeros because "the tensor hook reverse on clone received a non-zero gradient and passed on zeros" (code
    hook_zeros), but without the hook they get zeros too (the ReLU passes none of it). Fixed in debug/unreached.py:
    a hook is blamed only when the leaf's gradient without hooks is not all zeros."""
    reasons = {"lin.weight": "hook_zeros", "lin.bias": "hook_zeros"} if alive else None
    lens, plain = check(dead_relu(alive), reasons, static=True)
    assert not plain.per[0]["lin.weight"].any()


# --- 5. FGSM and iterative attacks on the input; PCGrad's gradient surgery ------------------------------------------

def attack(kind: str):
    """FGSM as tutorials write it (x.requires_grad_(), loss.backward(), x + eps * x.grad.sign()), then iterated on
    the same leaf, its data moved under no_grad: ``zeroed`` (x.grad = None each step), ``zero_`` (x.grad.zero_()),
    ``forgotten`` (x.grad never zeroed: each step's sign is of the sum so far), ``pgd`` (a new leaf each step,
    torch.autograd.grad, a projection onto the eps-ball).  A full backward hook on the first Linear and a hook on x
    clipping its gradient (a "gradient masking" defence) are what the lens must show."""
    def program(run):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
        x0, y, eps = torch.randn(2, 4), torch.tensor([2, 0]), 0.1
        name(run, model=model)
        if run.hooked:
            model[0].register_full_backward_hook(run.H("first", lambda m, gi, go: (gi[0] * 2,), lambda a: a[1]))
        x = x0.clone().requires_grad_()
        adversarial = []
        for step in range(3):
            if kind == "pgd":
                x = x.detach().requires_grad_()
            name(run, x=x)
            if run.hooked and (step == 0 or kind == "pgd"):
                x.register_hook(run.H("mask", lambda g: g.clamp(-0.05, 0.05)))
            loss = F.cross_entropy(model(x), y)
            if kind == "pgd":
                (g,) = run.grad(loss, [x])
                run.record({"x": g})
            else:
                model.zero_grad()
                run.backward(loss)
                run.record(dict({f"model.{n}": p.grad for n, p in model.named_parameters()}, x=x.grad))
                g = x.grad
            with torch.no_grad():
                if kind == "pgd":
                    x = (x0 + (x + 0.04 * g.sign() - x0).clamp(-eps, eps))
                else:
                    x += eps * g.sign()
                    if kind == "zeroed":  # (as optimizer.zero_grad() does)
                        x.grad = None
                    elif kind == "zero_":  # the pass after holds zeros: checked by problems_of only
                        x.grad.zero_()
            adversarial.append(x.detach().clone())
        return adversarial
    return program


def check_grad_only(program) -> tuple:
    """:func:`check` for a program whose passes are all torch.autograd.grad calls (no .grad card to compare)."""
    assert problems_of(program) == []
    problems, lens, plain = statements(program)
    assert problems == ["no .grad card was compared"]
    drawn = drawing_problems(lens, plain, False)  # compares the grad field with what autograd.grad returned: here
    assert drawn and all(" drawn with grad None; " in line for line in drawn)  # .grad, None (autograd.grad writes none)
    return lens, plain


@pytest.mark.parametrize("kind", ["zeroed", "zero_", "forgotten", "pgd"])
def test_attacks_on_the_input_against_torch(kind):
    if kind == "zero_":  # statements() takes .grad before a pass to be the last pass's: not here
        assert problems_of(attack(kind)) == []
        lens = named(attack(kind))
        card = [s for s in views_for(lens.passes)[1].steps if s.title.startswith("x.grad written")]
        assert card and card[0].note.startswith("x.grad already held [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]")
    else:
        lens, plain = (check_grad_only if kind == "pgd" else check)(attack(kind))
    for index, p in enumerate(lens.passes):
        assert [(c.hook, c.invocation) for c in p.hook_calls] == \
            [("first", index + 1), ("mask", 1 if kind == "pgd" else index + 1)]


def pcgrad(run):
    """PCGrad: two task losses on a shared trunk; each task's gradient by torch.autograd.grad (retain_graph for the
    first); where they conflict (negative dot product) each is projected off the other; the sum goes into .grad and
    Adam steps.  A hook on the shared features scales task gradients, one on a head's weight clips."""
    torch.manual_seed(0)
    trunk, heads = nn.Sequential(nn.Linear(3, 4), nn.ReLU()), nn.ModuleList([nn.Linear(4, 1), nn.Linear(4, 2)])
    x, t1, t2 = torch.randn(5, 3), torch.randn(5, 1), torch.tensor([0, 1, 1, 0, 1])
    name(run, trunk=trunk, heads=heads)
    shared = list(trunk.parameters())
    opt = torch.optim.Adam([*shared, *heads.parameters()], lr=0.05)
    if run.hooked:
        heads[1].weight.register_hook(run.H("head1_w", lambda g: g.clamp(-0.1, 0.1)))
    for _ in range(2):
        opt.zero_grad()
        h = trunk(x)
        if run.hooked:
            h.register_hook(run.H("features", lambda g: g * 0.5, target="relu"))
        losses = [F.mse_loss(heads[0](h), t1), F.cross_entropy(heads[1](h), t2)]
        grads = []
        for number, loss in enumerate(losses):
            g = run.grad(loss, shared + list(heads[number].parameters()), retain_graph=number == 0)
            run.record(dict(zip(["trunk.0.weight", "trunk.0.bias", f"heads.{number}.weight", f"heads.{number}.bias"],
                                g)))
            grads.append(g)
        flat = [torch.cat([v.flatten() for v in g[:2]]) for g in grads]
        surgery = [list(g[:2]) for g in grads]
        for i, j in ((0, 1), (1, 0)):
            dot = flat[i] @ flat[j]
            if dot < 0:
                surgery[i] = [a - dot / flat[j].pow(2).sum() * b for a, b in zip(surgery[i], grads[j][:2])]
        for p, a, b in zip(shared, *surgery):
            p.grad = a + b
        for head, g in zip(heads, grads):
            head.weight.grad, head.bias.grad = g[2], g[3]
        opt.step()
    return [p.detach().clone() for p in (*shared, *heads.parameters())]


def test_pcgrad_against_torch():
    lens, plain = check_grad_only(pcgrad)
    assert [(p.kind, tuple(sorted(p.unreached))) for p in lens.passes] == [
        ("grad", ("heads.1.bias", "heads.1.weight")), ("grad", ("heads.0.bias", "heads.0.weight"))] * 2
    # the other head is off the graph: said plainly in pass 1; later "unknown" (after autograd.grad returned its
    # gradient, or Adam's step made values from it, the forward record cannot follow every step): true, if weak
    assert [{r.code for r in p.unreached.values()} for p in lens.passes] == [{"not_on_path"}] + [{"unknown"}] * 3


def deeplift(run):
    """Captum's DeepLift (rescale rule) and integrated gradients on one model: the input and its baseline go through
    in one batch; forward hooks keep each Tanh's input and output, full backward hooks on them return
    grad_output * (out - out_ref) / (in - in_ref) for both halves; the attributions come from torch.autograd.grad
    with grad_outputs; then integrated gradients on 4 interpolated inputs with the hooks removed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x, base = torch.randn(2, 3), torch.zeros(2, 3)
    kept, handles = {}, []
    for number, act in enumerate(m for m in model if isinstance(m, nn.Tanh)):
        handles.append(act.register_forward_hook(lambda m, a, o: kept.__setitem__(m, (a[0].detach(), o.detach()))))

        def rescale(m, gi, go):
            i, o = kept[m]
            di, do = i[:2] - i[2:], o[:2] - o[2:]
            moved = di.abs() > 1e-7
            ratio = torch.where(moved, do / di.where(moved, torch.ones_like(di)), gi[0][:2] / go[0][:2])
            return (go[0] * torch.cat([ratio, ratio]),)
        if run.hooked:
            handles.append(act.register_full_backward_hook(run.H(f"rescale{number}", rescale, lambda a: a[1])))
    both = torch.cat([x, base]).requires_grad_()
    name(run, model=model, both=both)
    out = model(both)
    (g,) = run.grad(out, [both], grad_outputs=torch.tensor([[1.0, 0.0]] * 4))
    run.record({"both": g})
    attributions = [(g[:2] + g[2:]) / 2 * (x - base)]
    for handle in handles:
        handle.remove()
    alphas = torch.linspace(0.25, 1.0, 4)[:, None, None]
    path = (base + alphas * (x - base)).reshape(-1, 3).requires_grad_()
    name(run, path=path)
    (g,) = run.grad(model(path)[:, 0].sum(), [path])
    run.record({"path": g})
    attributions.append(g.view(4, 2, 3).mean(0) * (x - base))
    return attributions


def test_deeplift_and_integrated_gradients_against_torch():
    lens, plain = check_grad_only(deeplift)
    assert [[(c.hook, c.invocation) for c in p.hook_calls] for p in lens.passes] == [
        [("rescale1", 1), ("rescale0", 1)], []]


def optimizer_in_backward(run):
    """PyTorch's "optimizer step in backward" recipe: one optimizer per parameter, stepped and zeroed by a
    post-accumulate-grad hook, so .grad is None after each pass and the parameters change during it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    name(run, model=model)
    optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

    def step(p):
        optimizers[p].step()
        optimizers[p].zero_grad()
    for number, p in enumerate(model.parameters()):
        hook = run.H(f"step{number}", step, lambda a: a[0].grad) if run.hooked else step
        p.register_post_accumulate_grad_hook(hook)
    for _ in range(2):
        run.backward(model(x).pow(2).mean())
        run.record({f"model.{n}": p.grad for n, p in model.named_parameters()})
    return [p.detach().clone() for p in model.parameters()]


def test_optimizer_in_backward_against_torch():
    assert problems_of(optimizer_in_backward) == []
    lens = named(optimizer_in_backward)
    for p in lens.passes:
        assert [c.hook for c in p.hook_calls] == ["step3", "step2", "step1", "step0"]
        assert all(value is None for value in p.leaf_grads.values()) and len(p.leaf_grads) == 4


def noisy_training(run):
    """Gradient noise (annealed Gaussian noise added by a hook on every parameter, drawn from torch's generator),
    dropout in the model, and feature visualization: the input image is a parameter optimized with Adam to excite one
    channel, read by a forward hook.  The lens must not draw random numbers: every value depends on the generator."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    image = nn.Parameter(torch.zeros(1, 4))
    name(run, model=model, image=image)
    opt, seen = torch.optim.SGD(model.parameters(), lr=0.1), {}
    for number, p in enumerate(model.parameters()):
        if run.hooked:
            p.register_hook(run.H(f"noise{number}", lambda g: g + 0.01 * torch.randn_like(g)))
    model[2].register_forward_hook(lambda m, a, o: seen.__setitem__("act", o))
    for _ in range(2):
        opt.zero_grad()
        run.backward(F.cross_entropy(model(x), y))
        run.record(dict({f"model.{n}": p.grad for n, p in model.named_parameters()}, image=image.grad))
        opt.step()
    model.eval()
    model.requires_grad_(False)
    dream = torch.optim.Adam([image], lr=0.1)
    for _ in range(2):
        dream.zero_grad()
        model(image)
        run.backward(-seen["act"][0, 1])
        run.record(dict({f"model.{n}": p.grad for n, p in model.named_parameters()}, image=image.grad))
        dream.step()
    return [p.detach().clone() for p in (*model.parameters(), image)], torch.rand(1)


def test_noise_dropout_and_feature_visualization_against_torch():
    assert problems_of(noisy_training) == []  # (its answers without hooks: only where a note says what they mean)


def test_without_hooks_after_training_with_hooks_then_freezing():
    """False: after two training passes whose noise hooks changed the gradients the optimizer used, the model is
    frozen (requires_grad_(False)) and the input image optimized (feature visualization).  In passes 3 and 4 the lens
    gives image's gradient "without hooks" as [[0.1879, -0.1474, -0.0105, -0.4227]], with no note; but a run that
    never had the hooks (its definition: what .grad would hold had no hook run since the Lens started) gives
    [[0.1873, -0.1453, -0.0047, -0.4188]]: the frozen weights it uses came from the hooks' gradients.  Pass 2 says
    so ("changed since pass 1, whose hooks changed gradients"): the weights are leaves there; frozen, they are not,
    and no note is made."""
    assert statements(noisy_training)[0] == []


def sam(run):
    """Sharpness-aware minimization: a first backward, the weights moved by rho * g / ||g|| under no_grad, a second
    backward at the moved weights, the move undone, then SGD steps with the second gradient; a hook clamps one
    weight's gradient, a full backward pre-hook scales what reaches the first Linear."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x, y = torch.randn(6, 3), torch.randn(6, 1)
    name(run, model=model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if run.hooked:
        model[2].weight.register_hook(run.H("clamp", lambda g: g.clamp(-0.2, 0.2)))
        model[0].register_full_backward_pre_hook(run.H("scale", lambda m, go: (go[0] * 3,), lambda a: a[1]))
    record = lambda: run.record({f"model.{n}": p.grad for n, p in model.named_parameters()})  # noqa: E731
    for _ in range(2):
        opt.zero_grad()
        run.backward(F.mse_loss(model(x), y))
        record()
        with torch.no_grad():
            norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
            moves = [0.05 * p.grad / (norm + 1e-12) for p in model.parameters()]
            for p, e in zip(model.parameters(), moves):
                p.add_(e)
        opt.zero_grad()
        run.backward(F.mse_loss(model(x), y))
        record()
        with torch.no_grad():
            for p, e in zip(model.parameters(), moves):
                p.sub_(e)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_sharpness_aware_minimization_against_torch():
    lens, plain = check(sam)
    assert [[c.hook for c in p.hook_calls] for p in lens.passes] == [["clamp", "scale"]] * 4
