"""A TorchScript function for tests/test_real_code_classes.py (torch.jit.script needs its source in a file)."""

import torch


@torch.jit.script
def scripted(x, w):
    return torch.tanh(x * w) * 2
