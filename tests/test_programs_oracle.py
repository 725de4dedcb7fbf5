"""The differential oracle itself (``programs._call_problems``): a shown hook call must be a call of the hook that
ran at that position, not only of *a* hook that maps one-to-one to it.

Was blind: it checked that tags and registrations map one-to-one, call numbers and values; two hooks called once
each with equal values, shown swapped (each call shown as the other hook's: its name, kind, tensor), passed.  Now the
truth run notes each generated hook as it is registered (``programs.registered``: tag -> kind, name, the tensor) and
each shown call is checked against the hook that ran there.
"""

from __future__ import annotations

import torch

import programs
from autograd_lens.model import HookCall


def _call(hook, target, registration, kind="tensor", value=1.0, pass_index=0):
    grad = torch.tensor([value])
    return HookCall(hook=hook, kind=kind, target=target, pass_index=pass_index, invocation=1, grad_in=grad,
                    grad_out=grad, modified=False, returned_none=True, node="n1", step=1, registration=registration)


def _ran(*tags):
    return [(tag, torch.tensor([1.0]), torch.tensor([1.0])) for tag in tags]  # equal values: only identity differs


NOTED = ({"h0": {"kind": "tensor", "name": "hook", "on": None},
          "h1": {"kind": "tensor", "name": "Hooker", "on": None},
          "h2": {"kind": "tensor", "name": "hook", "on": None},
          "h3": {"kind": "node_pre", "name": "hook", "on": None}},
         [{"h0": frozenset({"x"}), "h1": frozenset({"y"}), "h2": frozenset({"y"})}])


def test_two_hooks_of_other_names_shown_swapped_are_a_false_statement():
    ran = _ran("h0", "h1")  # h0 (hook, on x) ran first, then h1 (Hooker, on y)
    right = [_call("hook", "x", 1), _call("Hooker", "y", 2)]
    swapped = [_call("Hooker", "y", 1), _call("hook", "x", 2)]
    assert programs._call_problems(right, ran, NOTED) == []
    problems = programs._call_problems(swapped, ran, NOTED)
    assert len(problems) == 2 and "the hook that ran there is hook (tensor on x)" in problems[0], problems
    # what the oracle saw before: tags and registrations one-to-one, equal values, so nothing
    assert programs._call_problems(swapped, ran) == []


def test_two_hooks_of_one_name_on_two_tensors_shown_swapped_are_told_apart_by_their_tensor():
    ran = _ran("h0", "h2")  # both named "hook": h0 on x, h2 on y
    assert programs._call_problems([_call("hook", "x", 1), _call("hook", "y", 2)], ran, NOTED) == []
    problems = programs._call_problems([_call("hook", "y", 1), _call("hook", "x", 2)], ran, NOTED)
    assert [p.rsplit(": ", 1)[1] for p in problems] == ["the hook that ran there is hook (tensor on x)",
                                                        "the hook that ran there is hook (tensor on y)"]


def test_a_call_shown_as_another_kind_of_hook_is_a_false_statement():
    ran = _ran("h3")
    assert programs._call_problems([_call("hook", "mul → t1", 1, kind="node_pre")], ran, NOTED) == []
    assert programs._call_problems([_call("hook", "mul → t1", 1, kind="node")], ran, NOTED)


def test_a_hook_the_truth_did_not_note_is_checked_as_before():
    assert programs._call_problems([_call("anything", "z", 1)], _ran("h9"), NOTED) == []


def test_the_aligned_pairing_passes_the_notes_on():
    ran = _ran("h0", "h1")
    swapped = [_call("Hooker", "y", 1), _call("hook", "x", 2)]
    assert programs._aligned(list(swapped), ran, NOTED)[1]
    assert programs._aligned(list(swapped), ran)[1] == []


# The truth run's notes, from a program with every way the generator writes a hook
EVERY_WAY = """x0 = torch.tensor([1.0, -2.0], requires_grad=True)
x1 = torch.tensor([0.5, 3.0], requires_grad=True)
t0 = x0 * x1
t1 = t0.sin()
alias = t1
h0_handle = REG(x0, 'register_hook', make_hook('h0', 'observe'))
h1_handle = REG(t0, 'register_hook', Hooker('h1', 'observe').method)
h2_handle = REG(t0, 'register_hook', Hooker('h2', 'scale'))
h3_handle = REG(x1, 'register_hook', functools.partial(partial_hook, 'h3', 'observe'))
h4_handle = REG(t1, 'register_hook', (lambda g, _f=make_hook('h4', 'observe'): _f(g)))
h5_handle = REG(t1, 'register_hook', wrapped(make_hook('h5', 'inplace')))
h6_handle = REG(t0, 'register_hook', CHOOK('h6', 'neg'))
h7_handle = REG(t1.grad_fn, 'register_prehook', make_pre('h7', 'observe'))
h8_handle = REG(t1.grad_fn, 'register_hook', make_post('h8', 'observe'))
h9_handle = REG(x0, 'register_post_accumulate_grad_hook', make_after('h9', 'observe'))
h10_handle = REG(None, 'multi', (x0, t0,), make_multi('h10', 'observe'), 'all')
h11_handle = REG(t0, 'register_hook', CHOOK('h11', 'append'))
ADD_TARGETS['h0'] = [(t0, make_hook('h0a', 'observe'))]
out = (t1.sum() + t0.sum())
PASS('backward', out, retain_graph=True)
PASS('backward', out)"""


def test_the_truth_run_notes_every_generated_hook_by_the_tag_it_logs_under():
    program = programs.Program(EVERY_WAY.splitlines(), ["x0", "x1"])
    truth = programs.run(program, "truth")
    assert truth.error is None
    shown = {tag: (hook["kind"], hook["name"]) for tag, hook in truth.hooks.items()}
    assert shown == {"h0": ("tensor", "hook"), "h1": ("tensor", "Hooker.method"), "h2": ("tensor", "Hooker"),
                     "h3": ("tensor", "partial_hook"), "h4": ("tensor", "<lambda>"), "h5": ("tensor", "hook"),
                     "h6": ("tensor", "torch.neg"), "h7": ("node_pre", "pre"), "h8": ("node", "post"),
                     "h9": ("post_accumulate_grad", "after"), "h10": ("multi_grad", "multi"),
                     "h11": ("tensor", "list.append"), "h0a": ("tensor", "hook")}
    assert truth.targets[0]["h0"] == {"x0"} and truth.targets[0]["h4"] == {"t1", "alias"}
    assert {tag for tag, _ in truth.log if not tag.endswith(" out")} <= set(truth.hooks)
    assert programs.compare(program) == []  # and the lens shows each call as the hook that ran
