"""Extra peak memory of a traced pass, with the default settings (target: at most 10% of the gradients' size).

    python benchmarks/bench_memory.py

A 25M-element leaf (100 MB; its gradients are 100 MB each) through a few element-wise ops, with and without a
modifying tensor hook. Each case runs in a fresh Python; peak RSS above the start is compared with the plain
run of the same case.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r'''
import resource, sys, torch
import autograd_lens as al
mode = sys.argv[1]
x = torch.randn(25_000_000, requires_grad=True)
def step():
    y = x * 2
    z = y.tanh()
    if mode.endswith("hook"):
        z.register_hook(lambda g: g * 0.5)
    return ((z * 3).exp() + y).sum()
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if mode.startswith("lens"):
    with al.Lens():
        step().backward()
else:
    step().backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) // 1024)
'''
GRADIENT_MB = 100


def peak(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def measure() -> dict[str, float]:
    """case -> extra peak MB of the traced run over the plain one."""
    return {case: peak(f"lens{case}") - peak(f"plain{case}") for case in ("", "+hook")}


def main() -> None:
    for case, extra in measure().items():
        print(f"{'with a modifying hook' if case else 'no hook':22s} extra peak {extra:5.0f} MB "
              f"= {extra / GRADIENT_MB:.0%} of one gradient ({GRADIENT_MB} MB; target <= 10%)")


if __name__ == "__main__":
    main()
