"""Regenerate the README's pictures of the plots:  python docs/make_pictures.py

Each picture comes from a small trace made here, so it shows what the plot is for.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

import autograd_lens as al

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pictures")


def deep_network_trace() -> al.Lens:
    """Two training steps of an 8-layer tanh network: a clipping hook on one layer's output, a module hook
    halving what reaches the layers below layer 6."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(16, 1))
    model[6].register_full_backward_hook(lambda module, grad_input, grad_output: (grad_input[0] * 0.5,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with al.Lens(names={"model": model}) as lens:
        for _ in range(2):
            optimizer.zero_grad()
            hidden = model[:9](torch.randn(32, 16))
            hidden.register_hook(lambda g: g.clamp(-2e-6, 2e-6))
            model[9:](hidden).pow(2).mean().backward()
            optimizer.step()
    return lens


def small_network_trace() -> al.Lens:
    """One step of a 2-layer network with a hook doubling the hidden layer's gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    with al.Lens(names={"model": model}) as lens:
        hidden = model[:2](torch.randn(8, 3))
        hidden.register_hook(lambda g: g * 2)
        model[2:](hidden).pow(2).mean().backward()
    return lens


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    deep, small = deep_network_trace(), small_network_trace()
    for lens, name in ((deep, "grad_flow"), (deep, "timeline"), (deep, "before_after"), (small, "with_without")):
        figure = getattr(lens.plot, name)()
        figure.savefig(os.path.join(HERE, f"{name}.png"), dpi=72)
        print("wrote", os.path.join("docs", "pictures", f"{name}.png"))


if __name__ == "__main__":
    main()
