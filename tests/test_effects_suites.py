"""What PyTorch's own test suites found the lens changing (tests/pytorch_suites/RESULTS.md), tested as classes.

Each test runs the same program plain and inside a Lens and compares what the program sees."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens


def _warned_at(program) -> list[tuple[str, str, int]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program()
    return [(str(w.message), w.filename, w.lineno) for w in caught]


def _both(program):
    """What ``program`` warns, plain and inside a Lens; called from one line, so that frames above it match.
    A first run, not compared, spends torch's once-per-process warnings (sparse CSR, nested tensors)."""
    program()
    found, lens = [], None
    for traced in (False, True):
        lens = autograd_lens.Lens() if traced else lens
        with lens if traced else contextlib.nullcontext():
            found.append(_warned_at(program))
    return found[0], found[1], lens


@pytest.mark.parametrize("stacklevel", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("where", ["tensor_hook", "function_backward", "module_hook", "autograd_grad"])
def test_a_warning_raised_in_a_pass_points_where_it_would_without_the_lens(where, stacklevel):
    """Any stacklevel (torch's module hooks use 5: the user's backward() line) names the same file and line."""

    def warn(*_):
        warnings.warn(f"level {stacklevel}", UserWarning, stacklevel=stacklevel)

    class Loud(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            warn()
            return grad * 2

    def program():
        x = torch.ones(3, requires_grad=True)
        if where == "tensor_hook":
            y = x * 3
            y.register_hook(warn)
            y.sum().backward()
        elif where == "function_backward":
            Loud.apply(x).sum().backward()
        elif where == "module_hook":
            layer = nn.Linear(3, 3)
            layer.register_full_backward_hook(lambda module, gin, gout: warn())
            layer(x).sum().backward()
        else:
            y = x * 3
            y.register_hook(warn)
            torch.autograd.grad(y.sum(), x)

    plain, seen, lens = _both(program)
    assert plain and seen == plain
    assert len(lens.passes) == 1


def test_torch_module_hook_warning_on_two_lines_is_shown_twice():
    """torch's own 'Full backward hook is firing...' warning, from two backward() lines: two locations, as plain."""

    def program():
        layer = nn.Linear(2, 2)
        layer.register_full_backward_hook(lambda module, gin, gout: None)
        x = torch.ones(1, 2)
        layer(x).sum().backward()
        layer(x).sum().backward()

    plain, seen, _ = _both(program)
    assert len({(f, n) for _, f, n in plain}) == 2 and seen == plain


def test_warn_is_the_users_again_after_the_block():
    before = warnings.warn
    with autograd_lens.Lens():
        pass
    assert warnings.warn is before


LAYOUTS = {
    "sparse_coo": lambda: torch.rand(2, 2, dtype=torch.double).to_sparse().requires_grad_(),
    "sparse_csr": lambda: torch.rand(2, 2, dtype=torch.double).to_sparse_csr().requires_grad_(),
    "mkldnn": lambda: torch.rand(4).to_mkldnn().requires_grad_(),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_autograd_grad_of_an_input_without_views_is_recorded_without_a_warning(layout):
    """``get_gradient_edge`` makes a view of a leaf, which sparse and mkldnn layouts refuse."""
    if layout == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("no mkldnn in this torch build")

    def program():
        torch.manual_seed(0)
        x = LAYOUTS[layout]()
        out = x.to_dense().sum() * 2
        (grad,) = torch.autograd.grad(out, x)
        program.grad = grad.to_dense()

    plain, seen, lens = _both(program)
    assert seen == plain
    assert torch.equal(program.grad, torch.full((2, 2) if layout != "mkldnn" else (4,), 2.0, dtype=program.grad.dtype))
    assert len(lens.passes) == 1 and not lens.recording_notes


def test_a_nested_tensor_root_is_traced_without_a_warning():
    def program():
        a = torch.arange(6.0).reshape(2, 3).requires_grad_()
        nt = torch.nested.as_nested_tensor([a, a * 2])
        (nt * 2).backward(torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)]))
        program.grad = a.grad.clone()

    plain, seen, lens = _both(program)
    assert seen == plain
    assert torch.equal(program.grad, torch.full((2, 3), 6.0))  # 2 through a, and 2 * 2 through a * 2
    assert not lens.recording_notes
