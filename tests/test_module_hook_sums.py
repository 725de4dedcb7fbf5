"""Values "without hooks" where a module's full backward hooks change how torch adds gradients up.

A module with full backward hooks gets its inputs and outputs wrapped in a ``BackwardHookFunction``: in backward, one
node that adds up what its users send and passes it on.  Without the hooks that node is not there, and the gradients
reach the node behind it one by one: the same numbers added in another grouping, which with three or more can differ
in the last bits (floating-point addition is not associative), even with hooks that return None.  And a module given
the same tensor in several arguments gets one new tensor object per argument, so a forward that checks identity
(``nn.MultiheadAttention``'s ``query is key``) computes another way with hooks than without.

Found 2026-11-28 (hand-written programs outside the generators, compared with a run without hooks, bit for bit): a
TransformerEncoderLayer with a hook on its ``self_attn``, ``mha(x, x, x)`` and a module whose input is used three
times showed values without hooks (or "same") that a run without the hooks does not give.  Now the second kind is
unknown with the reason (capture/boundaries.py).  The first kind (one argument, used three times or more inside the
module, plus another use outside) is still off in the last bits: strict xfails below say what a fix needs."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (tests/programs.py: the differential oracle)

PRELUDE = '''
class UsedThrice(torch.nn.Module):  # one argument, used three times inside
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
    def forward(self, a):
        return self.l(a) * self.l(a) + self.l(a)

class Three(torch.nn.Module):  # three arguments: given the same tensor three times
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
    def forward(self, a, b, c):
        return self.l(a) * self.l(b) + self.l(c)
'''

PROGRAMS = {
    "input_used_thrice_inside": ("""
        m = UsedThrice()
        x0 = torch.randn(2, 8, requires_grad=True)
        h0 = REG(m, 'register_full_backward_hook', make_module_hook('h0', MODE))
        out = x0 + m(x0)
        PASS('backward', (out * out).sum())
        """, ["x0", "m.l.weight", "m.l.bias"], False),
    "same_tensor_three_arguments": ("""
        m = Three()
        x0 = torch.randn(2, 8, requires_grad=True)
        h0 = REG(m, 'register_full_backward_hook', make_module_hook('h0', MODE))
        out = x0 + m(x0, x0, x0)
        PASS('backward', (out * out).sum())
        """, ["x0", "m.l.weight", "m.l.bias"], True),
    "self_attention_mha": ("""
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        x0 = torch.randn(2, 3, 8, requires_grad=True)
        h0 = REG(mha, 'register_full_backward_hook', make_module_hook('h0', MODE))
        out = x0 + mha(x0, x0, x0)[0]
        PASS('backward', (out * out).sum())
        """, ["x0", "mha.in_proj_weight"], True),
    "transformer_layer_hook_on_self_attn": ("""
        layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)
        x0 = torch.randn(2, 3, 8, requires_grad=True)
        h0 = REG(layer.self_attn, 'register_full_backward_hook', make_module_hook('h0', MODE))
        out = layer(x0)
        PASS('backward', out.sum())
        """, ["x0", "layer.linear1.weight", "layer.self_attn.in_proj_weight"], True),
}


def _program(name, seed, mode):
    source, leaves, _ = PROGRAMS[name]
    lines = textwrap.dedent(source).replace("MODE", repr(mode)).strip().splitlines()
    return programs.Program([f"torch.manual_seed({seed})"] + lines, leaves, seed)


def _run(program, mode):
    return programs.run(program, mode, PRELUDE)


REGROUPED = pytest.mark.xfail(strict=True, reason=(
    "the replay adds what the boundary (BackwardHookFunctionBackward) summed as one arrival; without the hooks its "
    "users' gradients reach the node behind it one by one, so three or more are grouped otherwise (1 ulp). Adding "
    "them up at their senders' run positions (tried 2026-11-28: exact here and at the node itself) made an hf "
    "program (t5, seed 44, a hook on a T5LayerNorm under bf16 autocast) 1 ulp off downstream where it is exact now: "
    "the engine's order without the boundary needs modelling beyond run positions"))


def _cases():
    for name in sorted(PROGRAMS):
        marks = [REGROUPED] if name == "input_used_thrice_inside" else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["observe", "scale"])
@pytest.mark.parametrize("name", list(_cases()))
def test_values_without_module_hooks_are_what_torch_computes_or_unknown(name, mode, seed):
    program = _program(name, seed, mode)
    assert _run(program, "plain").error is None
    assert programs.compare(program, _run) == []


def _lensed(name, seed=0, mode="observe"):
    program = _program(name, seed, mode)
    lens_run = _run(program, "lens")
    return lens_run.lens.passes[0], _run(program, "nohook").passes[0]["grads"]


@REGROUPED
@pytest.mark.parametrize("name", [name for name, (_, _, unknown) in PROGRAMS.items() if not unknown])
def test_regrouped_sums_are_known_and_bit_for_bit(name):
    """Where only the grouping differs, the value without hooks is known, and exactly torch's."""
    shown, truth = _lensed(name, mode="scale")
    assert shown.unknown == {}
    for label, value in truth.items():
        assert torch.equal(shown.grads_without_hooks[label], value), label


@pytest.mark.parametrize("name", [name for name, (_, _, unknown) in PROGRAMS.items() if unknown])
def test_same_tensor_in_several_arguments_is_unknown_with_the_reason(name):
    shown, truth = _lensed(name)
    assert set(truth) <= set(shown.unknown) and all(value is None for value in shown.grads_without_hooks.values())
    assert all("given the same tensor more than once" in why for why in shown.unknown.values())


def test_a_module_hook_with_one_argument_used_once_changes_nothing_of_the_replay():
    """The usual module hook (input used once): no regrouping, the replay stays off for a hook returning None."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.randn(2, 4, requires_grad=True)
    with al.Lens() as lens:
        (x + layer(x)).sum().backward()
    shown = lens.passes[0]
    assert shown.unknown == {} and all(value is not None for value in shown.grads_without_hooks.values())
