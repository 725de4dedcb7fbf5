"""The user's warning filters see the same warnings, raise the same errors and print the same text under the lens as
without it: ``Lens(why=True)``'s forward record catches the warnings of each call and warns them again, and torch's
C++ side treats a warning made an error while its own error is raised in its own way (``PyErr_Print``: printed, the
call's error raised).  Compared with plain torch, for each filter action and each kind of call."""

from __future__ import annotations

import contextlib
import io
import sys
import warnings

import pytest
import torch

import autograd_lens as al


@pytest.fixture(autouse=True)
def warn_always():
    """torch's C++ side warns some things once a process (``x.T``): each run here sees them."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def anomaly_error():
    """Anomaly mode (check_nan): torch's C++ side warns "Error detected in SqrtBackward0 ..." and raises."""
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    w = torch.tensor([[1.0, -3.0], [0.5, 2.0]], requires_grad=True)
    with torch.autograd.set_detect_anomaly(True, check_nan=True):  # (it warns nothing; detect_anomaly() does)
        z = torch.nn.functional.linear(x, w).sqrt().sum()
        return z.backward(), x.grad


def hook_error():
    """A hook raises during backward under anomaly mode: torch warns where the node was made, then the error."""
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    with torch.autograd.set_detect_anomaly(True):
        y = (x * 3).exp()
        y.register_hook(lambda g: 1 / 0)
        return y.sum().backward(), x.grad


def forward_warning():
    """A C++ warning in the forward that raises nothing (a tensor made from a tensor), then a plain backward."""
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = torch.tensor(x * 2) + x  # UserWarning: To copy construct from a tensor ... (torch's C++ side)
    y.sum().backward()
    return x.grad


def python_warning():
    """A warning of torch's Python code during the forward (a deprecated argument)."""
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    y = torch.nn.functional.softmax(x)  # "Implicit dimension choice for softmax has been deprecated"
    y[:, 0].sum().backward()
    return x.grad


def torch_warnings_twice():
    """Warnings of torch's C++ side that a TorchFunctionMode can drop or move (``x.T`` of 3 dims, ``float()`` of a
    tensor requiring grad), twice each from one line (the "default" and "once" filters show them once)."""
    x = torch.tensor([[[1.0, -2.0], [0.5, 3.0]]], requires_grad=True)
    total = 0.0
    for _ in range(2):
        y = x.T.sum() * float(x.sum())
        y.backward()
        total += float(x.grad.sum())
    return total


def softmax_in_a_loop():
    """A warning of torch's Python code (stacklevel) from one line three times."""
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    for _ in range(3):
        torch.nn.functional.softmax(x)[:, 0].sum().backward()
    return x.grad


def hook_warns_in_a_loop():
    """The user's own hook warns (stacklevel 2: torch's frame that called it), a module hook too, three passes."""
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    layer = torch.nn.Linear(2, 2).requires_grad_(True)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.5, -1.0], [2.0, 0.25]]))
    layer.register_full_backward_hook(lambda module, gi, go: warnings.warn("module hook ran", RuntimeWarning))
    for _ in range(3):
        y = layer(x * 2)
        y.register_hook(lambda g: warnings.warn("tensor hook ran", stacklevel=2))
        y.sum().backward()
    return x.grad, layer.weight.grad


def _run(program, mode: str, action: str):
    """(outcome, what stderr shows, sys.last_value's type, the warnings shown: category, text, file and line) of
    ``program`` under the filter ``action``."""
    err, last, shown = io.StringIO(), getattr(sys, "last_value", None), []
    outcome = None
    with warnings.catch_warnings(), contextlib.redirect_stderr(err):
        warnings.simplefilter(action)
        warnings.showwarning = lambda message, category, filename, lineno, *rest: shown.append(
            (category.__name__, str(message).splitlines()[0], filename, lineno))
        lens = al.Lens(why=True) if mode == "why" else al.Lens() if mode == "lens" else contextlib.nullcontext()
        try:
            with lens: result = program()  # noqa: E701  (one line: warnings name it, the same way in each mode)
            outcome = ("returned", repr(result))
        except BaseException as error:  # noqa: BLE001  (compared, whatever it is)
            outcome = ("raised", type(error).__name__, str(error).splitlines()[0] if str(error) else "")
    now = getattr(sys, "last_value", None)
    return outcome, err.getvalue(), type(now).__name__ if now is not last else None, shown


@pytest.mark.parametrize("action", ["error", "ignore", "default", "always", "once"])
@pytest.mark.parametrize("program", [anomaly_error, hook_error, forward_warning, python_warning,
                                     torch_warnings_twice, softmax_in_a_loop, hook_warns_in_a_loop],
                         ids=lambda p: p.__name__)
@pytest.mark.parametrize("mode", ["lens", "why"])
def test_warning_filters_as_without_the_lens(program, action, mode):
    plain, seen = [_run(program, each, action) for each in ("plain", mode)]  # (one line: tracebacks show it)
    assert seen == plain
    if program is anomaly_error and action == "error":  # torch's own rule, so that this test sees it
        assert plain[0][:2] == ("raised", "RuntimeError") and "Error detected in SqrtBackward0" in plain[1]
        assert plain[2] == "UserWarning"
