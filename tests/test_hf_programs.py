"""The differential suite over Hugging Face ``transformers`` models (``hf_programs.py``): code this project did not
write (GPT-2, BERT, Llama, T5, ViT from tiny configs), hooked and trained as ``model_programs`` does, every
statement the lens makes compared with what torch did.

``python tests/hf_programs.py --programs 500 --seed 0`` runs a campaign."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import autograd_lens as al  # noqa: E402
import hf_programs  # noqa: E402

# one program per model and checkpointing (none, non-reentrant, reentrant), chosen to take in bf16 autocast,
# enable_input_require_grads (the PEFT pattern), multi-grad hooks and double precision among them
SEEDS = {
    "bert": (125, 4, 18), "gpt2": (31, 66, 49), "llama": (45, 16, 150), "t5": (44, 83, 148), "vit": (30, 56, 94),
}


CLASSES = {"bert": "BertFor", "gpt2": "GPT2LMHead", "llama": "LlamaFor", "t5": "T5For", "vit": "ViTFor"}


@pytest.mark.parametrize("model", sorted(SEEDS))
def test_transformers_programs_show_only_what_torch_did(model):
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in SEEDS[model]:
            program, problems = hf_programs.check(seed)
            assert CLASSES[model] in program.source()  # the seed still draws this model
            if problems:
                failures.append(f"seed {seed}: " + "\n".join(problems[:3]) + "\n" + program.source())
    assert not failures, "\n\n".join(failures[:2])


def test_checkpointed_t5_leaf_made_in_forward_is_drawn_with_its_gradient_written_twice():
    """T5 under checkpointing makes its position bias a leaf inside forward (``requires_grad = True``): no name of
    the program's, one box called "leaf"; with ``retain_graph`` the second pass adds to the ``.grad`` the first
    wrote, and only that pass's card says it already held one (seed 1023 of the first campaign: the checker took
    the card for false)."""
    from autograd_lens.model import GradWritten
    from autograd_lens.views.steps import hook_totals, steps_for

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=11, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_heads=2,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    net = transformers.T5ForConditionalGeneration(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tok = torch.randint(1, 11, (2, 5))
    loss = net(input_ids=tok, labels=tok).loss
    params = {id(p) for p in net.parameters()}
    made, seen, stack = [], set(), [loss.grad_fn]
    while stack:  # the leaves torch's graph holds that are not parameters: made inside forward
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if hasattr(fn, "variable") and id(fn.variable) not in params:
            made.append(fn.variable)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    assert len(made) == 1 and made[0].grad is None
    leaf = made[0]
    lens = al.Lens(names={"net": net, "loss": loss})
    had = []
    with lens:
        loss.backward(retain_graph=True)
        had.append(leaf.grad is not None)
        written = leaf.grad.clone()
        loss.backward()
    cards = []
    for backward_pass in lens.passes:
        steps = steps_for(backward_pass, hook_totals(lens.passes))
        events = [e for e in backward_pass.events if isinstance(e, GradWritten) and not e.name.startswith("net.")]
        assert [e.name for e in events] == ["leaf"]
        index = backward_pass.events.index(events[0]) + 1
        cards.append("already held" in (steps[index].note or ""))
    assert had == [True] and cards == [False, True]
    torch.testing.assert_close(leaf.grad, 2 * written)
