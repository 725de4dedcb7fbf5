"""A warning torch raises from a hook during backward (stacklevel=5, aimed at the user's backward() line)
is attributed to torch/autograd/__init__.py under the lens; with Python's default filter (once per
location) two different user lines then show one warning instead of two."""
import warnings
import torch
import torch.nn as nn
import autograd_lens


def run():
    shown = []
    old = warnings.showwarning
    warnings.showwarning = lambda m, c, f, l, *a: shown.append((c.__name__, f.rsplit("/", 2)[-2:], l))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            lin = nn.Linear(2, 2)
            lin.register_full_backward_hook(lambda m, gi, go: None)
            x = torch.ones(1, 2)              # no input requires grad -> torch warns from the hook
            lin(x).sum().backward()           # line A
            lin(x).sum().backward()           # line B
    finally:
        warnings.showwarning = old
    return shown


plain = run()
with autograd_lens.Lens():
    lens = run()
print("plain:", plain)
print("lens: ", lens)
print("MISMATCH" if plain != lens else "same")
