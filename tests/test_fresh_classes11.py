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
