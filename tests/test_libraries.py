"""The lens on libraries that register backward hooks themselves (code this project did not write), 2026-11-28:
captum's attributions (GuidedBackprop and DeepLift replace gradients in tensor hooks they register in forward
hooks; LRP; the per-sample gradients of its SampleGradientWrapper), opacus's DP-SGD (GradSampleModule's full
backward hooks, ghost clipping's two passes per step, expanded weights) and peft's LoRA on a tiny GPT-2 (with
activation checkpointing both ways).  Each program is written as the library's documentation shows it and run
plainly, under a Lens, with the library's hooks logged and without them (tests/real_code/libs.py): the outcome
(attributions, per-sample gradients, parameters after the steps) bit for bit, warnings, every hook call shown, and
every value without hooks."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_code import libs  # noqa: E402


class Net(nn.Module):
    """A small CNN + MLP, one module per ReLU (as captum's GuidedBackprop and DeepLift need)."""

    def __init__(self):
        super().__init__()
        self.conv, self.relu1, self.pool = nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2)
        self.fc1, self.relu2, self.fc2 = nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(self.relu2(self.fc1(self.pool(self.relu1(self.conv(x))).flatten(1))))


def attribution(method):
    def program(ns):
        ca = pytest.importorskip("captum.attr")
        net, x = Net(), torch.randn(2, 1, 6, 6, requires_grad=True)
        ns.update(net=net, x=x)
        if method == "GuidedBackprop":
            out = ca.GuidedBackprop(net).attribute(x, target=1)
        elif method == "DeepLift":
            out = ca.DeepLift(net).attribute(x, target=1, baselines=x * 0)
        elif method == "LRP":
            out = ca.LRP(net).attribute(x, target=1)
        elif method == "IntegratedGradients":
            out = ca.IntegratedGradients(net).attribute(x, target=1, n_steps=4)
        elif method == "LayerGradCam":
            out = ca.LayerGradCam(net, net.conv).attribute(x, target=1)
        else:  # per-sample gradients by hooks: a backward() pass that writes .grad
            from captum._utils.sample_gradient import SampleGradientWrapper
            wrapper = SampleGradientWrapper(net)
            wrapper.add_hooks()
            wrapper.compute_param_sample_gradients(net(x)[:, 1].sum(), loss_mode="sum")
            wrapper.remove_hooks()
            out = tuple(getattr(p, "sample_grad", None) for p in net.parameters())
        return libs.clone(out), libs.clone(x.grad), [libs.clone(p.grad) for p in net.parameters()]
    return program


CAPTUM = {"GuidedBackprop": 4, "DeepLift": 6, "LRP": 12, "IntegratedGradients": 0, "LayerGradCam": 0,
          "SampleGradientWrapper": 6}  # hook calls per run


@pytest.mark.parametrize("method", sorted(CAPTUM))
def test_captum_attributions_under_the_lens(method):
    pytest.importorskip("captum")
    found, runs = libs.problems(attribution(method))
    assert found == []
    passes = runs["lens"]["lens"].passes
    assert sum(len(p.hook_calls) for p in passes) == CAPTUM[method] == len(runs["truth"]["log"])
    if method in ("GuidedBackprop", "DeepLift", "LRP"):  # its hooks replace gradients: with and without differ
        (grad_pass,) = passes
        assert any(call.modified for call in grad_pass.hook_calls)
        assert not libs.equal(grad_pass.grads_without_hooks["x"], grad_pass.input_grads["x"])
    if method == "GuidedBackprop":  # its attribution is the gradient its hooks made
        assert libs.equal(passes[0].input_grads["x"], runs["plain"]["out"][0])


def test_captum_start_card_does_not_say_no_hook_is_attached():
    pytest.importorskip("captum")
    from autograd_lens.views.steps import hook_totals, steps_for

    lens = libs.run(attribution("GuidedBackprop"), "lens")["lens"]
    (grad_pass,) = lens.passes
    start = steps_for(grad_pass, hook_totals(lens.passes))[0]
    assert len(grad_pass.hook_calls) == 4  # four hooks of captum's were attached to this graph when it started
    assert not any("No tensor or module hook is attached" in line for line in start.lines), start.lines


def dp_training(mode, steps=2):
    """opacus's README: make_private, then the usual loop; each step's per-sample gradients, the clipped and
    noised .grad the DPOptimizer makes, and the parameters after the steps are the outcome."""
    def program(ns):
        opacus = pytest.importorskip("opacus")
        from torch.utils.data import DataLoader, TensorDataset

        model = nn.Sequential(nn.Conv1d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(9, 4), nn.GroupNorm(2, 4),
                              nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(16, 2, 5), torch.randint(0, 2, (16,))), batch_size=4)
        criterion = nn.CrossEntropyLoss()
        made = opacus.PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
            grad_sample_mode=mode, **({"criterion": criterion} if mode == "ghost" else {}))
        model, optimizer, *rest, loader = made
        criterion = rest[0] if rest else criterion
        ns.update(model=model)
        outcome = []
        for step, (xb, yb) in enumerate(loader):
            if step == steps:
                break
            optimizer.zero_grad()
            ns.setdefault("held", []).append([libs.clone(p.grad) for p in model.parameters()])
            loss = criterion(model(xb), yb)
            loss.backward()
            outcome.append(([libs.clone(getattr(p, "grad_sample", None)) for p in model.parameters()],
                            libs.clone(getattr(loss, "loss_per_sample", loss))))
            if ns["mode"] == "nohook":  # no per-sample gradient to step with: only the first pass is compared
                break
            optimizer.step()
            outcome.append([libs.clone(p.grad) for p in model.parameters()])
        return outcome + [[libs.clone(p) for p in model.parameters()]]
    return program


@pytest.mark.parametrize("mode, passes", [("hooks", 2), ("ghost", 4)])
def test_opacus_dp_sgd_under_the_lens(mode, passes):
    """GradSampleModule's full backward hooks (one per layer with parameters) compute per-sample gradients and
    return None: the lens shows each call with what it received, and values without hooks equal to .grad."""
    pytest.importorskip("opacus")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found, runs = libs.problems(dp_training(mode), without=False)
        unhooked = libs.run(dp_training(mode), "nohook") if mode == "hooks" else None  # ghost: fails without
    assert found == []
    shown = runs["lens"]["lens"].passes
    assert len(shown) == passes and [len(p.hook_calls) for p in shown] == [4] * passes  # conv, linear, norm, linear
    assert all(call.kind == "module_full" and not call.modified for p in shown for call in p.hook_calls)
    if mode == "hooks":  # the first pass, before any step: the same .grad with the hooks never registered
        assert libs._without(shown[:1], unhooked["passes"][:1]) == []
        # one registration per layer, made once by GradSampleModule: call k of 2 in pass k, each for forward call 1
        assert [[(c.invocation, c.forward_call) for c in p.hook_calls] for p in shown] == [[(1, 1)] * 4, [(2, 1)] * 4]
        from autograd_lens.views.steps import hook_totals, steps_for
        totals = hook_totals(shown)
        titles = [s.title for p in shown for s in steps_for(p, totals) if s.kind == "hook"]
        assert sum(f"call {k} of 2 in this recording" in t for t in titles for k in (1, 2)) == 8
        # "already held": DPOptimizer.zero_grad() leaves zeros (set_to_none=False), which the second pass adds to
        held = runs["plain"]["held"]
        assert held[0] == [None] * 8 and all(float(g.abs().sum()) == 0 for g in held[1])
        notes = [s.note for p in shown for s in steps_for(p, totals) if s.kind == "grad"]
        assert sum("already held" in n for n in notes[:8]) == 0 and sum("already held" in n for n in notes[8:]) == 8


def test_opacus_expanded_weights_no_extra_torch_function_call():
    """grad_sample_mode="ew": the leaves of the graph are torch's ExpandedWeight, a tensor subclass whose
    __torch_function__ raises for what it cannot handle: the lens must not call it (the program never does)."""
    pytest.importorskip("opacus")
    from torch.nn.utils._expanded_weights.expanded_weights_impl import ExpandedWeight

    original, calls = ExpandedWeight.__torch_function__.__func__, []

    def counted(cls, func, types, args=(), kwargs=None):
        calls.append(getattr(func, "__name__", str(func)))
        return original(cls, func, types, args, kwargs)
    ExpandedWeight.__torch_function__ = classmethod(counted)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = libs.run(dp_training("ew", steps=1), "plain")
            plain_calls = list(calls)
            lensed = libs.run(dp_training("ew", steps=1), "lens")
    finally:
        ExpandedWeight.__torch_function__ = classmethod(original)
    assert libs.equal(plain["out"], lensed["out"])
    assert plain_calls == ["conv1d", "linear", "group_norm", "linear"]
    assert calls[len(plain_calls):] == plain_calls  # under the lens: the same calls, no "__get__"
    assert not any("recording incomplete" in n for p in lensed["lens"].passes for n in p.notes)


def lora_training(checkpointing):
    """peft's quicktour on a tiny GPT-2 from a config (random weights, nothing downloaded): LoRA on c_attn,
    two AdamW steps, activation checkpointing none, non-reentrant or reentrant."""
    def program(ns):
        transformers, peft = pytest.importorskip("transformers"), pytest.importorskip("peft")
        transformers.logging.set_verbosity_error()
        config = transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        base = transformers.GPT2LMHeadModel(config)
        if checkpointing is not None:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
        model = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"],
                                                          lora_dropout=0.0, init_lora_weights="gaussian"))
        ns.update(model=model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
        outcome = []
        for _ in range(2):
            tokens = torch.randint(0, 11, (2, 5))
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            outcome.append((libs.clone(loss), [libs.clone(p.grad) for p in model.parameters() if p.requires_grad]))
            optimizer.step()
            optimizer.zero_grad()
        return outcome + [[libs.clone(p) for p in model.parameters()]]
    return program


@pytest.mark.parametrize("checkpointing", [None, False, True])
def test_peft_lora_training_under_the_lens(checkpointing):
    pytest.importorskip("peft")
    # (reentrant: the LoRA weights' .grad is written by the nested backward, no value without hooks to compare)
    found, runs = libs.problems(lora_training(checkpointing), without=checkpointing is not True)
    assert found == []
    shown = runs["lens"]["lens"].passes
    assert len(shown) == 2
    lora = [name for name in shown[0].leaf_grads if "lora_" in name]
    assert len(lora) == 2 or checkpointing is True  # reentrant: written by the nested backward, said in a note
    if checkpointing is True:
        assert all("nested backward run by CheckpointFunctionBackward" in " ".join(p.notes) for p in shown)
