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


@pytest.mark.parametrize("seed", [141, 7, 12, 26821])
def test_generated_programs_with_compiled_modules(seed):
    # compiled_programs.py: model_programs' models with some modules compiled in place; seed 141 compiles a
    # LayerNorm whose forward hook registers torch.neg, recomputed by reentrant checkpointing (said, as above).
    # 26821: a compiled GPT block whose ln2 forward hook registers a tensor hook, under a non-reentrant checkpoint;
    # the checker's truth run used to number that hook where dynamo traced it: it recompiled at every call, ran the
    # block eagerly past its recompile_limit, and its node order was not the program's (model_programs.bookkept)
    import compiled_programs

    program, problems = compiled_programs.check(seed)
    assert problems == [], (program.source(), problems)


def _double(g):
    return g * 2


def _registered_in_compiled_program(hook, hooked: bool = True, reentrant: bool = False):
    """A compiled module (dynamo alone: its graph runs as traced) whose forward hook registers ``hook`` on its output.
    The handle is not used: torch 2.15 then traces the hook into a subgraph that a closure of dynamo's own
    (``RegisterHookOp.__call__.<locals>.hook``, in torch's files) registers and calls; torch 2.13 registers ``hook``."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(8)
    norm.compile(backend="eager")

    def forward_hook(module, inputs, output):
        if output.requires_grad and hooked:
            output.register_hook(hook)

    norm.register_forward_hook(forward_hook)
    weight = torch.arange(64.0).reshape(2, 4, 8)
    registered = []

    def program():
        x = torch.randn(2, 4, 8, requires_grad=True)
        out = checkpoint(norm, x, use_reentrant=True) if reentrant else norm(x)
        registered.extend((out._backward_hooks or {}).values())
        (out * weight).sum().backward()
        return x.grad.clone()

    return program, weight, registered


@pytest.mark.parametrize("hook, name, factor", [(torch.neg, "torch.neg", -1), (_double, "_double", 2)])
def test_a_hook_registered_inside_compiled_code_is_shown_as_the_users(hook, name, factor):
    # torch 2.15: seen as a frame in torch's files, it was taken for a wrapper of torch's own: the call was placed
    # from the gradients around it as "<C hook>", "written in C, on a tensor whose hooks cannot be listed"
    plain, _, plain_compiled, plain_warnings = _run(_registered_in_compiled_program(hook)[0], False)
    unhooked, _, _, _ = _run(_registered_in_compiled_program(hook, hooked=False)[0], False)
    program, weight, registered = _registered_in_compiled_program(hook)
    grad, lens, compiled, lens_warnings = _run(program, True)
    (registered,) = registered
    assert torch.equal(grad, plain) and not torch.equal(grad, unhooked)
    assert compiled == plain_compiled and lens_warnings == plain_warnings
    (backward_pass,) = lens.passes
    (call,) = backward_pass.hook_calls
    assert (call.kind, call.hook, call.target) == ("tensor", name, "out")
    # torch 2.13 registers torch.neg itself (no frame: placed between its neighbours, said so); 2.15 a Python closure
    assert (call.unseen is None) == (registered is not torch.neg), (registered, call.unseen)
    assert torch.equal(call.grad_in, weight) and torch.equal(call.grad_out, weight * factor)  # out's gradient is weight
    assert torch.equal(backward_pass.grads_without_hooks["x"], unhooked) and not backward_pass.unknown


@pytest.mark.parametrize("hook, name", [(torch.neg, "torch.neg"), (_double, "_double")])
def test_a_hook_registered_inside_a_compiled_recompute_is_named_in_the_note(hook, name):
    # torch 2.15: dynamo's closure ran in the nested backward unnoticed (a frame in torch's files): no note at all
    plain, _, plain_compiled, _ = _run(_registered_in_compiled_program(hook, reentrant=True)[0], False)
    grad, lens, compiled, _ = _run(_registered_in_compiled_program(hook, reentrant=True)[0], True)
    assert torch.equal(grad, plain) and compiled == plain_compiled
    (backward_pass,) = lens.passes
    said = [note for note in backward_pass.notes if name in note]
    assert len(said) == 1 and "CheckpointFunctionBackward" in said[0], backward_pass.notes
    assert "x" in backward_pass.unknown


def _traced_step_program(hooked: bool = True):
    """A compiled step whose hooks have no side effect: torch (2.13 and 2.15) traces them into graphs that closures
    of dynamo's own call."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    @torch.compile(backend="eager")
    def step(x):
        h = model(x)
        if hooked:
            h.register_hook(lambda g: g * 2)
            h.register_hook(torch.neg)
        loss = h.pow(2).sum()
        loss.backward()
        return h.detach()

    def program():
        x = torch.randn(3, 4)
        outputs, grads = [], []
        for _ in range(2):
            outputs.append(step(x))
            grads.append([p.grad.clone() for p in model.parameters()])
        return grads, outputs

    return program


def test_hooks_traced_in_a_compiled_step_are_shown_with_their_values():
    # before: on torch 2.13 the first pass showed no hook call and the second one "<C hook>"; on 2.15 one "<C hook>"
    (plain, _), _, plain_compiled, _ = _run(_traced_step_program(), False)
    (unhooked, _), _, _, _ = _run(_traced_step_program(hooked=False), False)
    (grads, outputs), lens, compiled, _ = _run(_traced_step_program(), True)
    assert all(torch.equal(a, b) for a, b in zip(plain[1], grads[1])) and compiled == plain_compiled
    assert len(lens.passes) == 2
    for index, (backward_pass, h) in enumerate(zip(lens.passes, outputs)):
        calls = [(call.kind, call.hook, call.unseen) for call in backward_pass.hook_calls]
        assert calls == [("tensor", "<lambda>", None), ("tensor", "torch.neg", None)]
        double, neg = backward_pass.hook_calls
        assert torch.equal(double.grad_in, 2 * h) and torch.equal(double.grad_out, 4 * h)  # d(h²)/dh, doubled
        assert torch.equal(neg.grad_in, 4 * h) and torch.equal(neg.grad_out, -4 * h)
        without = backward_pass.grads_without_hooks
        assert not backward_pass.unknown
        if index == 0:  # (the second pass adds to .grad that the hooks changed: no run without them gives it)
            names = ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias")
            assert all(torch.equal(without[name], grad) for name, grad in zip(names, unhooked[0]))


def test_a_weak_dictionary_dropping_an_entry_in_a_recompute_is_no_hook():
    # found by compiled_programs seed 505 on torch 2.15 (a compiled block recomputed by reentrant checkpointing),
    # shrunk to plain code: the recompute's backward frees a tensor a WeakValueDictionary held, Python calls the
    # dictionary's ``remove`` from the nested engine's frame, and the pass said "hooks ran inside a nested backward:
    # remove" (x unknown) where no hook ran
    import weakref

    def program(traced):
        registry = weakref.WeakValueDictionary()

        def block(x):
            t = x * 2
            registry[len(registry)] = t  # only the graph keeps t alive: freed during the recompute's backward
            return t * t

        x = torch.arange(3.0, requires_grad=True)
        with (al.Lens() if traced else warnings.catch_warnings()) as lens:
            checkpoint(block, x, use_reentrant=True).sum().backward()
        return x.grad, lens, len(registry)

    plain, _, plain_left = program(False)
    grad, lens, left = program(True)
    assert torch.equal(grad, plain) and left == plain_left == 0
    (backward_pass,) = lens.passes
    assert not [note for note in backward_pass.notes if "hooks ran" in note], backward_pass.notes
    assert not backward_pass.unknown and torch.equal(backward_pass.grads_without_hooks["x"], plain)
