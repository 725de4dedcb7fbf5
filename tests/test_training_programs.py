"""The differential suite over the training code ``training_programs.py`` makes (DistributedDataParallel on CPU,
bf16 autocast, GradScaler, optimizer step hooks, hooks that live two steps, the optimizer step in backward), every
statement the lens makes compared with what torch did; and the false statement it found, as a test.

``python tests/training_programs.py --programs 200 --seed 0`` runs a campaign."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
import training_programs

# one program or two of each kind (each seed's draw asserted below, so that a change of the generator shows here)
SEEDS = {
    "ddp, no_sync, comm hook, GradScaler": 30,
    "ddp, no_sync, autocast, step hooks": 3,
    "ddp, comm hook, static_graph, autocast, fused optimizer": 27,
    "ddp, no_sync, comm hook, fused optimizer, hooks registered and removed two steps later": 41,
    "autocast, GradScaler": 47,
    "GradScaler, step hooks": 64,
    "fused optimizer, hooks registered and removed two steps later": 15,
    "autocast, step hooks, hooks registered and removed two steps later": 88,
}


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_training_programs_show_only_what_torch_did(name):
    seed = SEEDS[name]
    generator = training_programs.TrainingGenerator(seed)
    drawn = {"ddp": generator.ddp, "no_sync": generator.no_sync, "GradScaler": generator.scaler,
             "autocast": generator.autocast, "step hooks": bool(generator.step_hooks),
             "fused optimizer": generator.fused, "comm hook": False,
             "hooks registered and removed two steps later": generator.lifecycle}
    program, problems = training_programs.check(seed)
    drawn["comm hook"] = "register_comm_hook" in program.source()
    drawn["static_graph"] = "static_graph=True" in program.source()
    assert all(drawn[kind] for kind in name.split(", ")), (name, drawn)
    assert not problems, "\n".join(problems[:3]) + "\n" + program.source()


# ----------------------------------------------------------------------------- DDP's float16 communication hook
# Was false (training_programs seed 1052): a hook changed a gradient in a no_sync() micro-batch; the next micro-batch
# was reduced through torch's fp16_compress_hook, which rounds the accumulated .grad to float16 and DDP writes it back.
# With the hook, 0.5 + 2**-11 is a float16 number: the write left .grad as it was, so the lens took it that nothing
# changed .grad after the engine's last write and showed "without hooks" 1 + 2**-11 as fact; without the hook DDP
# rounds that to 1.0.  torch's own communication hooks (Python in torch/distributed) were not even seen as code that
# ran during the pass.  Now they are (as a user's comm hook was), and where such code ran and hooks made a leaf's
# gradient differ, its value without hooks is unknown, with why.

def _fp16_program(hooked):
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks

    net = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(1.0)
    ddp = DDP(net)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    handle = net.weight.register_hook(lambda g: g * 0.5) if hooked else None
    with ddp.no_sync():  # accumulated, not reduced: 0.5 with the hook, 1 without
        ddp(torch.ones(1, 1)).sum().backward()
    if handle is not None:
        handle.remove()
    ddp(torch.full((1, 1), 2.0 ** -11)).sum().backward()  # reduced through float16
    return net.weight.grad.clone()


def test_values_without_hooks_after_ddp_reduced_through_float16_are_not_guessed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with training_programs.process_group():
            without = _fp16_program(False)
            plain = _fp16_program(True)
            with al.Lens() as lens:
                traced = _fp16_program(True)
    assert torch.equal(plain, traced) and plain.item() == 0.5 + 2.0 ** -11 and without.item() == 1.0
    first, second = lens.passes
    (name, value), = first.grads_without_hooks.items()  # (the weight, however the lens names it)
    assert value.item() == 1.0  # no reduction in no_sync(): known, and right
    shown = second.grads_without_hooks[name]
    assert shown is None or shown.item() == without.item(), shown
    assert shown is None and "fp16_compress_hook" in second.unknown[name], second.unknown
    assert any("fp16_compress_hook" in note for note in second.notes)


def test_the_process_group_is_destroyed_after_each_program():
    import torch.distributed as dist

    with training_programs.process_group():
        assert dist.is_initialized() and dist.get_world_size() == 1
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- a hook stops a DDP pass
# Was false (training_programs seed 27): a hook raised in a pass after a parameter's .grad was written; DDP's
# reducer, which writes every .grad after its all-reduce at the end of the pass, never ran.  The lens showed that
# parameter's value without hooks as the gradient written, as fact; without the hook the pass runs to its end and DDP
# writes what its communication hook returns (here half of it).  Where a process group is initialized, a pass that a
# hook stopped leaves the values without hooks of the leaves it reached unknown, with why.

def _stopped_program(hooked):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def comm_half(state, bucket):
        done = torch.futures.Future()
        done.set_result(bucket.buffer() * 0.5)
        return done

    def raising(module, inputs, output):
        output.register_hook(lambda g: (_ for _ in ()).throw(ValueError("stop")))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False))
    ddp = DDP(net)
    ddp.register_comm_hook(None, comm_half)
    if hooked:
        net[0].register_forward_hook(raising)
    error = None
    try:
        ddp(torch.ones(1, 2)).sum().backward()
    except ValueError as problem:
        error = str(problem)
    return net[1].weight.grad.clone(), error


def test_values_without_hooks_of_a_ddp_pass_a_hook_stopped_are_not_guessed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with training_programs.process_group():
            without, _ = _stopped_program(False)
            plain, stopped = _stopped_program(True)
            with al.Lens() as lens:
                traced, error = _stopped_program(True)
    assert torch.equal(plain, traced) and stopped == error == "stop"
    assert torch.equal(without, plain * 0.5)  # the reduction at the end of the pass: comm_half
    (backward_pass,) = lens.passes
    (name,) = [name for name, value in backward_pass.leaf_grads.items() if value is not None and value.shape == (1, 2)]
    shown = backward_pass.grads_without_hooks[name]
    assert shown is None or torch.equal(shown, without), shown
    assert shown is None and "DistributedDataParallel" in backward_pass.unknown[name], backward_pass.unknown


# The same where a hook set .grad to None (the optimizer step in backward, training_programs seed 5039): DDP then
# reduced nothing into it, and the lens took "nothing changed .grad after the hook" for what happens without hooks,
# where DDP writes what the communication hook returns.

def _fused_program(hooked):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def comm_half(state, bucket):
        done = torch.futures.Future()
        done.set_result(bucket.buffer() * 0.5)
        return done

    torch.manual_seed(0)
    net = nn.Linear(2, 1, bias=False)
    ddp = DDP(net, static_graph=True)  # (without it, DDP writes zeros into the .grad a hook set to None)
    ddp.register_comm_hook(None, comm_half)
    if hooked:
        opt = torch.optim.SGD([net.weight], lr=0.1)
        net.weight.register_post_accumulate_grad_hook(lambda p: (opt.step(), opt.zero_grad()) and None)
    ddp(torch.ones(1, 2)).sum().backward()
    return net.weight.grad


def test_values_without_hooks_of_a_ddp_pass_whose_hook_cleared_grad_are_not_guessed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with training_programs.process_group():
            without = _fused_program(False)
            plain = _fused_program(True)
            with al.Lens() as lens:
                traced = _fused_program(True)
    assert plain is None and traced is None and torch.equal(without, torch.full((1, 2), 0.5))
    (backward_pass,) = lens.passes
    (name,) = backward_pass.grads_without_hooks
    shown = backward_pass.grads_without_hooks[name]
    assert shown is None or torch.equal(shown, without), shown
    assert shown is None and "comm_half" in backward_pass.unknown[name], backward_pass.unknown


# ----------------------------------------------------------------------------- found by the campaigns, not DDP's
# A multi-grad hook (mode="any") on two outputs of one node (a module with a full backward hook returns both through
# one BackwardHookFunction), then a hook in C on one of them: torch runs the hook dicts of a node's outputs in the
# order they were attached to it, so the multi-grad hook fired from the dict attached first, before the C hook there;
# the lens placed it on the other output and showed the C hook first (training_programs seed 6165, any model with a
# global or module full backward hook).  mode="all": it fires from the tensor whose inner hook completes it.

class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        a = torch.tanh(self.lin(x))
        return a, a * 3


def _multi_program(order, seen, mode):
    torch.manual_seed(0)
    net = _Two()
    net.register_full_backward_hook(lambda module, grad_input, grad_output: order.append("module") or None)
    a, b = net(torch.randn(1, 2))

    def multi(grads):
        order.append(f"multi after {len(seen)} C calls")
    torch.autograd.graph.register_multi_grad_hook((b, a), multi, mode=mode)
    b.register_hook(seen.append)
    ((a ** 2).sum() + (b ** 2).sum()).backward()
    return net.lin.weight.grad


@pytest.mark.parametrize("mode", ["any", "all"])
def test_a_multi_grad_hook_on_two_outputs_of_a_module_is_placed_where_torch_ran_it(mode):
    order, seen = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (full backward hook on a module whose inputs need no gradient)
        plain = _multi_program(order, seen, mode)
        traced_order, traced_seen = [], []
        with al.Lens() as lens:
            traced = _multi_program(traced_order, traced_seen, mode)
    assert torch.equal(plain, traced) and order == traced_order
    multi_first = order[0] == "multi after 0 C calls"
    assert multi_first == (mode == "any"), order
    shown = [call.hook for call in lens.hook_calls if call.kind != "module_full"]
    assert shown == (["multi", "list.append"] if multi_first else ["list.append", "multi"]), shown


# The optimizer step in backward (post-accumulate hooks, one optimizer per parameter) and a pass with inputs=: it
# steps only the parameters it reaches.  The next pass's note said parameters the first pass did not reach "changed
# since pass 1, whose hooks changed gradients": it compared the values drawn for each pass, and a large one's summary
# in the second pass was read after that pass's own step had moved it (training_programs seed 6242, shrunk).  Now the
# values each pass started with are compared (before the first hook of the pass that changed the leaf itself).

STEPPED_IN_BACKWARD = """torch.manual_seed(6242)
emb = nn.Embedding(11, 8)
gru0 = nn.GRU(8, 8, batch_first=True)
mha1 = nn.MultiheadAttention(8, 2, batch_first=True)
head = nn.Linear(8, 11, bias=False)
model = nn.ModuleList([emb, gru0, mha1, head])
OPTS = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}
def fused_step(p):
    LOGIN('fused', p.grad)
    OPTS[p].step()
    OPTS[p].zero_grad()
    LOGOUT('fused', p.grad)
for p in model.parameters(): REG(p, 'register_post_accumulate_grad_hook', fused_step)
tok1 = torch.randint(0, 11, (2, 4))
tgt1 = torch.randint(0, 11, (2, 4))
a1_0 = emb(tok1)
a1_1 = gru0(a1_0)[0]
a1_2 = a1_1 + mha1(a1_1, a1_1, a1_1, need_weights=False)[0]
logits1 = head(a1_2)
loss1 = F.cross_entropy(logits1.view(-1, 11), tgt1.view(-1))
PASS('backward', loss1 / 2, inputs=[gru0.weight_ih_l0, mha1.in_proj_weight, gru0.bias_ih_l0])
tok2 = torch.randint(0, 11, (2, 4))
tgt2 = torch.randint(0, 11, (2, 4))
a2_0 = emb(tok2)
a2_1 = gru0(a2_0)[0]
a2_2 = a2_1 + mha1(a2_1, a2_1, a2_1, need_weights=False)[0]
logits2 = head(a2_2)
loss2 = F.cross_entropy(logits2.view(-1, 11), tgt2.view(-1))
PASS('backward', loss2 / 2)"""


def test_the_moved_note_compares_the_values_each_pass_started_with():
    import programs

    leaves = training_programs.TrainingGenerator(6242).generate().leaves
    program = programs.Program(STEPPED_IN_BACKWARD.splitlines(), leaves, 6242)
    assert training_programs.compare(program) == []


# ----------------------------------------------------------------------------- torch.func and autograd.functional

@pytest.mark.parametrize("seed", [0, 6, 12, 38])
def test_cells_with_torch_func_and_jacobians_show_only_what_torch_did(seed):
    kinds = training_programs.func_program(seed, "never")["kinds"]
    assert {"grad", "jacobian"} <= set(kinds) or {"hessian", "vjp"} <= set(kinds) or "vmap_grad" in kinds, kinds
    assert training_programs.compare_func(seed) == []


# Was false: the note on leaves that moved since an earlier pass whose hooks changed gradients compared leaves by their
# label.  Two jacobian() calls make two input leaves with no name, both labelled "leaf": the second call's passes said
# "leaf changed since pass 1, whose hooks changed gradients (an optimizer step used them?) ... a run that never had
# the hooks would have reached other values", which is false (its input is another tensor, the same without hooks).
# The same for a name given to a new tensor between passes.  Now each pass keeps which tensor object each leaf was
# (annotate.leaf_ids) and the note names only leaves that are the same object in both passes (tests/test_leaf_identity.py).

def test_the_moved_note_does_not_take_another_tensor_for_the_same_leaf():
    def f(a):
        y = a * 2
        y.register_hook(lambda g: g * 2)
        return y.sin()
    with al.Lens() as lens:
        torch.autograd.functional.jacobian(f, torch.tensor([1.0, 2.0]))
        torch.autograd.functional.jacobian(f, torch.tensor([3.0, 4.0]))
    assert not [n for p in lens.passes for n in p.notes if "changed since pass" in n]


# A hook in C registered (by a forward hook) on a layer's output, which has no name, then a pass that stops at an error
# no hook raised (a saved weight changed in place: the optimizer step in backward of the pass before, seed 7259):
# the lens's note on the hooks in C that may or may not have run joined their targets, None for that tensor, and
# failed: "recording incomplete at the error: TypeError ...", and the C hook's call went unsaid.

def test_c_hooks_on_a_tensor_with_no_name_before_an_unexplained_error_are_said_to_maybe_have_run():
    torch.manual_seed(0)
    lin = nn.Linear(2, 1)
    lin.register_forward_hook(lambda module, inputs, output: output.register_hook(torch.neg) and None)
    x = torch.randn(3, 2, requires_grad=True)
    with al.Lens() as lens:
        out = (lin(x) * 2).sum()
        with torch.no_grad():
            lin.weight.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()
    notes = lens.passes[0].notes
    assert not any("recording incomplete" in n for n in notes), notes
    assert any("hooks in C on a tensor with no name may or may not have run" in n for n in notes), notes


# GradScaler.unscale_ divides every .grad in place without counting a version: after hooks changed a gradient the
# lens must not carry its value without hooks past it (it compares values: unknown).  (The checker's truth reads
# version counters: generated programs say what unscale_ did with torch.autograd.graph.increment_version.)

def test_values_without_hooks_after_gradscaler_unscale_are_not_carried():
    def program(hooked):
        torch.manual_seed(0)
        lin = nn.Linear(2, 1)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        if hooked:
            lin.weight.register_hook(lambda g: g * 0.5)
        x = torch.randn(3, 2)
        scaler.scale(lin(x).sum()).backward()
        scaler.unscale_(opt)
        scaler.scale(lin(x).sum()).backward()
        return lin.weight.grad.clone()
    without = program(False)
    with al.Lens(names={}) as lens:
        program(True)
    second = lens.passes[1]
    (name,) = [name for name, value in second.leaf_grads.items() if value.shape == (1, 2)]  # the weight
    shown = second.grads_without_hooks[name]
    assert shown is None or torch.equal(shown, without), (shown, without)
