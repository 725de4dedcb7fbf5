"""Regenerate the README's pictures of the plots:  python docs/make_pictures.py

Each picture comes from a small trace made here, so it shows what the plot is for.
The other pictures in docs/pictures/ are screenshots taken by the browser tests, written there (instead of to
artifacts/) only with AL_UPDATE_PICTURES=1:
  AL_UPDATE_PICTURES=1 python -m pytest tests/test_debug_picture.py tests/test_navigation.py -k pictured
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


def mlp_trace() -> al.Lens:
    """One step of a 3-layer MLP with a tensor hook clipping the second hidden layer's gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    inputs = torch.randn(16, 4)
    with al.Lens(names={"model": model, "inputs": inputs}) as lens:
        hidden = model[:4](inputs)
        hidden.register_hook(lambda g: g.clamp(-0.01, 0.01))
        model[4:](hidden).pow(2).mean().backward()
    return lens


def grouped_trace() -> al.Lens:
    """12 x (Linear + Tanh) recorded with module groups: past 60 boxes the layers start collapsed."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(4, 4), nn.Tanh())])
    inputs = torch.randn(2, 4)
    with al.Lens(names={"model": model, "inputs": inputs}, modules=True) as lens:
        model(inputs).sum().backward()
    return lens


def stepper_picture(lens: al.Lens, path: str, step: int) -> bool:
    """A screenshot of the static stepper at ``step`` in Chromium (Debian's; skipped without it)."""
    import shutil
    import tempfile

    chromium = shutil.which("chromium")
    if chromium is None:
        print("chromium not found: the stepper picture was not redrawn")
        return False
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        page_path = os.path.join(folder, "trace.html")
        lens.to_html(page_path)
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto("file://" + page_path)
            page.wait_for_selector(".al-stepper[data-step='0']")
            for _ in range(step):
                page.click("button[data-go=next]")
            page.locator(".al-stepper").screenshot(path=path)
            browser.close()
    return True


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    deep, small = deep_network_trace(), small_network_trace()
    for lens, name in ((deep, "grad_flow"), (deep, "timeline"), (deep, "before_after"), (small, "with_without")):
        figure = getattr(lens.plot, name)()
        figure.savefig(os.path.join(HERE, f"{name}.png"), dpi=72)
        print("wrote", os.path.join("docs", "pictures", f"{name}.png"))
    if stepper_picture(mlp_trace(), os.path.join(HERE, "stepper_mlp.png"), step=9):
        print("wrote", os.path.join("docs", "pictures", "stepper_mlp.png"))
    if stepper_picture(grouped_trace(), os.path.join(HERE, "stepper_modules.png"), step=4):
        print("wrote", os.path.join("docs", "pictures", "stepper_modules.png"))


if __name__ == "__main__":
    main()
