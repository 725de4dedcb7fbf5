"""torch.compile and the lens: the lens's own code runs as written inside compiled code, and what it shows there
is what torch does (compat.skipped_by_dynamo).

While compiled code runs, dynamo compiles every Python frame that starts there.  A compiled training step that
calls ``backward()``, and a compiled module recomputed by reentrant checkpointing inside backward, run the lens's
profile function, node hooks and records there: dynamo compiled them (``late.tensor_registered`` took another
branch, a record's dataclass ``__init__`` failed inside the lens's dispatch guard, dynamo warned about what it could
not trace).  Each test compares with the same program run without the lens."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import autograd_lens as al

torch._dynamo = pytest.importorskip("torch._dynamo")
LENS_DIR = os.path.dirname(al.__file__)


class _Compiled(logging.Handler):
    """Names and files of the frames dynamo starts compiling."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.files: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "torchdynamo start compiling" in message:
            self.files.append(message.split(", stack")[0].rsplit(" ", 1)[-1])


def _run(program, traced: bool):
    torch._dynamo.reset()
    handler = _Compiled()
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(dynamo=logging.DEBUG)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if traced:
                with al.Lens() as lens:
                    result = program()
            else:
                lens, result = None, program()
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
    return result, lens, handler.files, [str(w.message) for w in caught]


def _step_program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    log = []
    model[1].register_full_backward_hook(lambda m, gi, go: log.append(("module", gi[0].clone())))

    @torch.compile(backend="eager")
    def step(x):
        h = model(x)
        h.register_hook(lambda g: log.append(("tensor", g.clone())) or g * 2)
        loss = h.pow(2).sum()
        loss.backward()
        return loss

    def program():
        x = torch.randn(3, 4)
        for _ in range(2):
            step(x)
        return [p.grad.clone() for p in model.parameters()], log

    return program


def test_a_compiled_step_that_calls_backward_is_recorded_as_torch_runs_it():
    (plain_grads, plain_log), _, plain_compiled, plain_warnings = _run(_step_program(), False)
    (grads, log), lens, compiled, lens_warnings = _run(_step_program(), True)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads))
    assert [kind for kind, _ in log] == [kind for kind, _ in plain_log] == ["tensor", "module"] * 2
    assert lens_warnings == plain_warnings  # before: "Dynamo does not know how to trace the builtin ..."
    assert compiled == plain_compiled  # the same frames compiled: none of the lens's
    assert not any(path.startswith(LENS_DIR) or path == "<string>" for path in compiled)
    assert len(lens.passes) == 2
    for backward_pass, start in zip(lens.passes, (0, 2)):
        assert not any(note.startswith("recording incomplete") for note in backward_pass.notes), backward_pass.notes
        calls = [(call.kind, call.hook) for call in backward_pass.hook_calls]
        assert calls == [("tensor", "<lambda>"), ("module_full", "<lambda>")]
        tensor_call, module_call = backward_pass.hook_calls
        assert torch.equal(tensor_call.grad_in, log[start][1])  # what the hook received, as torch gave it
        assert torch.equal(tensor_call.grad_out, log[start][1] * 2)
        assert torch.equal(module_call.grad_in[0], log[start + 1][1])


def _recompute_program():
    torch.manual_seed(0)
    norm = nn.LayerNorm(8)
    norm.compile(backend="eager")
    made = []

    def forward_hook(module, inputs, output):
        if output.requires_grad:  # in the recompute inside backward: a hook in C on what it made
            made.append(output.register_hook(torch.neg))

    norm.register_forward_hook(forward_hook)

    def program():
        x = torch.randn(2, 4, 8, requires_grad=True)
        out = checkpoint(norm, x, use_reentrant=True)
        out.pow(2).sum().backward()
        return x.grad.clone(), len(made)

    return program


def test_a_hook_in_c_registered_in_a_compiled_recompute_is_said_as_without_compile():
    (plain_grad, plain_made), _, plain_compiled, _ = _run(_recompute_program(), False)
    (grad, made), lens, compiled, _ = _run(_recompute_program(), True)
    assert torch.equal(grad, plain_grad) and made == plain_made == 1  # in the recompute (the forward: no_grad)
    assert compiled == plain_compiled
    (backward_pass,) = lens.passes
    said = [note for note in backward_pass.notes if "torch.neg" in note]
    assert len(said) == 1 and "registered during the pass on a tensor CheckpointFunctionBackward made" in said[0]
    assert "x" in backward_pass.unknown  # what x would get without that hook is not known


@pytest.mark.parametrize("seed", [141, 7, 12])
def test_generated_programs_with_compiled_modules(seed):
    # compiled_programs.py: model_programs' models with some modules compiled in place; seed 141 compiles a
    # LayerNorm whose forward hook registers torch.neg, recomputed by reentrant checkpointing (said, as above)
    import compiled_programs

    program, problems = compiled_programs.check(seed)
    assert problems == [], (program.source(), problems)
