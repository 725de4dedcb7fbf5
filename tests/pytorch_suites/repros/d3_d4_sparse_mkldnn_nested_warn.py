"""Backward passes whose gradients are sparse COO/CSR, mkldnn or nested tensors run without warnings
plain; under the lens each adds a RuntimeWarning 'autograd_lens: could not record/trace a backward
pass ...' to the user's program (PyTorch's test_gradcheck_input_layout*, *_mkldnn_*, multiple_dispatch).
Run: python sparse_grad_warns.py  (each case in a fresh process, plain then lens)."""
import subprocess
import sys
import warnings

import torch

CASES = {
    # gradcheck of sum over a sparse input: the lens fails on aten::view for SparseCPU / SparseCsrCPU
    "sparse_coo": "torch.autograd.gradcheck(torch.sum, torch.rand(2, 2, dtype=torch.double).to_sparse().requires_grad_(), masked=True, check_batched_grad=False, fast_mode=True)",
    "sparse_csr": "torch.autograd.gradcheck(torch.sum, torch.rand(2, 2, dtype=torch.double).to_sparse_csr().requires_grad_(), masked=True, check_batched_grad=False, fast_mode=True)",
    "mkldnn": "torch.autograd.gradcheck(lambda x, y: x + y.to_dense(), (torch.rand(10, requires_grad=True), torch.rand(10).to_mkldnn().requires_grad_()), atol=1e-1, check_batched_grad=False, fast_mode=True)",
    "nested": "a = torch.arange(6.0).reshape(2, 3).requires_grad_(); nt = torch.nested.as_nested_tensor([a, a * 2]); torch._test_autograd_multiple_dispatch(nt, True).backward(torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)]))",
}


def child(case, mode):
    import autograd_lens
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if mode == "lens":
            with autograd_lens.Lens():
                exec(CASES[case])
        else:
            exec(CASES[case])
    mine = sorted({f"{x.category.__name__}: {str(x.message)[:80]}" for x in w if "autograd_lens" in str(x.message)})
    print(mine)


if len(sys.argv) == 3:
    child(sys.argv[1], sys.argv[2])
else:
    for case in CASES:
        out = {m: subprocess.run([sys.executable, __file__, case, m], capture_output=True, text=True).stdout.strip()
               for m in ("plain", "lens")}
        print(case, out, "MISMATCH" if out["plain"] != out["lens"] else "same")
