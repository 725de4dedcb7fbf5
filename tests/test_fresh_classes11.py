"""Fresh eyes on hooks as practitioners use them for interpretability and training tricks (helper ``fresh12``,
2026-11-28): Grad-CAM (a forward hook keeps a conv activation, a tensor hook on it keeps its gradient), guided
backprop and deconvnet (full backward hooks on every ReLU clamping grad_input) with saliency maps, Opacus-style
per-sample gradients (forward hooks keep activations, full backward hooks compute ``grad_sample`` with einsum), the
gradient reversal layer of DANN (an autograd.Function, and a tensor hook returning ``-lambda * g``), FGSM with several
passes on the input, and PCGrad-style gradient surgery with several ``autograd.grad`` calls.

Each program runs plainly, under a ``Lens``, as "truth" and with its hooks not registered (the harness of
tests/test_fresh_classes7.py, imported), then through :func:`check` of tests/test_fresh_classes10.py (the cards, the
drawing and the notes against torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fresh_classes7 import Run, run  # noqa: E402  (the differential harness)
from test_fresh_classes10 import check, name  # noqa: E402  (statements of cards, drawing, notes)


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
