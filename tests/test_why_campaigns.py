"""The differential campaigns with ``Lens(why=True)``: its forward record is a TorchFunctionMode that sees every torch
call the program makes, so it could change more than the backward observer: a tensor subclass's own
``__torch_function__`` (user code) must run as often as without the lens, and every statement must stay true.
``AUTOGRAD_LENS_CAMPAIGN_WHY=1 python tests/programs.py --more ...`` runs a campaign this way (``programs.LENS_OPTIONS``).

Found this way (2026-11-28): the record read each result's ``grad_fn``, finiteness and shape through the subclass,
running its ``__torch_function__`` 2 to 10 times per call of the user's (``Logged`` in ``programs.PRELUDE``), and
a user's TorchDispatchMode saw the record's own ops (``OpLog`` in ``fresh_programs.PRELUDE``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import autograd_lens as al
import fresh_programs
import programs


@pytest.fixture(autouse=True)
def why(monkeypatch):
    monkeypatch.setattr(programs, "LENS_OPTIONS", {"why": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_graph=True's reference-cycle warning
        yield


@pytest.mark.parametrize("start", [27001000, 27001100])
def test_generated_programs_with_subclasses_under_why(start):
    failures = []
    for seed in range(start, start + 40):
        program, problems = programs.check(seed, more=True)
        if problems:
            failures.append(programs.report(program, problems))
    assert not failures, "\n\n".join(failures[:2])


@pytest.mark.parametrize("seed", [27403, 27411, 27417, 27424, 27428])
def test_real_layers_with_subclasses_under_why(seed):
    """27428: a user's TorchDispatchMode around backward saw the record's finiteness checks of a custom Function's
    backward (abs, ne, eq, all); 27424: a wrapper subclass (TwoTensor), whose numbers the record must not read."""
    program, problems = fresh_programs.check(seed)
    assert problems == [], (program.source(), problems)


class Counted(torch.Tensor):
    """Counts its own __torch_function__ calls, by function name."""

    calls: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", "?"))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("lens", [None, {}, {"why": True}], ids=["plain", "lens", "why"])
def test_a_subclass_sees_only_the_programs_calls(lens):
    """Ops of every kind the record reads (results with and without grad_fn, in place, several outputs, NaN made,
    a view), then backward: the subclass's calls, in order, are the plain run's."""
    def program():
        x = torch.tensor([1.0, -2.0, 0.0], requires_grad=True)
        c = (x * 1.0).as_subclass(Counted)
        a, b = (c * 2).split([2, 1])
        d = (a.log() + 1).sum() + b.exp().sum()  # log(-4): NaN made
        e = c.detach().add_(1)
        f = c[1:].view(2, 1).sum() * e.sum()
        (d.nan_to_num() + f).backward()
        return x.grad

    Counted.calls = []
    truth, plain = program(), list(Counted.calls)
    Counted.calls = []
    if lens is None:
        grad = program()
    else:
        with al.Lens(**lens):
            grad = program()
    assert torch.equal(grad, truth) and Counted.calls == plain
    assert len(plain) > 15  # (the program's own calls: the subclass sees them)


def test_a_compiled_module_compiles_under_why():
    """The forward record is a TorchFunctionMode: dynamo traced its __torch_function__ at every op of a compiled
    module, could not, and ran the module eagerly (NativeBatchNormBackward0 where torch.compile makes
    CompiledFunctionBackward).  While dynamo traces, the record now passes each call through as it is."""
    import torch.nn as nn

    def program():
        torch._dynamo.reset()
        torch.manual_seed(0)
        conv, bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)
        bn.compile(backend="aot_eager")
        bn.register_forward_hook(lambda module, inputs, output: output.register_hook(torch.neg) and None)
        x = torch.randn(2, 2, 6, 6, requires_grad=True)
        y = torch.relu(bn(conv(x))).sum()
        names, stack, seen = [], [y.grad_fn], set()
        while stack:
            fn = stack.pop()
            if fn is not None and fn not in seen:
                seen.add(fn)
                names.append(fn.name())
                stack += [next_fn for next_fn, _ in fn.next_functions]
        y.backward()
        return names, x.grad, bn.running_mean.clone()

    plain = program()
    with al.Lens(why=True) as lens:
        seen = program()
    assert "CompiledFunctionBackward" in plain[0] and seen[0] == plain[0]
    assert torch.equal(seen[1], plain[1]) and torch.equal(seen[2], plain[2])
    assert len(lens.passes) == 1


def test_generated_compiled_programs_under_why():
    import compiled_programs

    program, problems = compiled_programs.check(27601)
    assert problems == [], (program.source(), problems)
