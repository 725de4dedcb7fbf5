"""The usual node recorded in one piece (``nodes._usual_node``) after a hook ran or changed a gradient (issue #24).

Before, once any user hook had run in a pass (``observer.plain`` False) or changed a gradient (``unhooked.active``),
every later node was recorded the general way (``_record_node``) under the dispatch guard.  Now the short way takes
those nodes too, with ``Unhooked.on_node`` after it when a hook changed something; it runs only with no dispatch mode
and no profiler on, touches plain tensors only, and ``replay`` refuses saved tensors that dispatch to Python.

The counting test fails on the code before (every node after the first changing hook went the general way).  The
programs check, against plain torch, a run without the hooks and the hooks' own log (``programs.compare``), that the
lens changes no value and no call of user code: a tensor subclass with a ``__torch_dispatch__`` saved in the graph, a
``TorchDispatchMode`` on during backward, a profiler on, saved-tensor hooks, non-reentrant checkpointing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import autograd_lens as al
import programs
from autograd_lens.capture import nodes


def _layers(hook, depth: int = 6):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) if index % 2 == 0 else nn.Tanh() for index in range(2 * depth)])
    h = torch.randn(4, 8)
    for layer in model:
        h = layer(h)
        if isinstance(layer, nn.Tanh) and hook is not None:
            h.register_hook(hook)
    return model, h.sum()


def _counted(monkeypatch, hook):
    with al.Lens():  # the once-per-process self-check first, uncounted
        (torch.ones(2, requires_grad=True) * 2).sum().backward()
    general = []
    original = nodes.NodeRecorder._record_node

    def counting(self, fn, grad_inputs, grad_outputs):
        general.append(fn.name())
        return original(self, fn, grad_inputs, grad_outputs)

    monkeypatch.setattr(nodes.NodeRecorder, "_record_node", counting)
    model, loss = _layers(hook)
    with al.Lens(names={"model": model}) as lens:
        loss.backward()
    monkeypatch.undo()
    plain_model, plain_loss = _layers(hook)
    plain_loss.backward()
    bare_model, bare_loss = _layers(None)
    bare_loss.backward()
    return general, lens.passes[0], dict(model.named_parameters()), dict(plain_model.named_parameters()), \
        dict(bare_model.named_parameters())


def test_nodes_after_a_hook_go_the_short_way_and_record_the_same(monkeypatch):
    for hook, changes in ((lambda g: g * 0.5, True), (lambda g: None, False)):
        general, record, traced, plain, bare = _counted(monkeypatch, hook)
        # 6 layers: 5 nodes each (Addmm, T, Tanh, two AccumulateGrad) + the sum; the hook's call is pending at each
        # TanhBackward0 (6 nodes): only those go the general way (before: every node after the first hook, 27+)
        assert sorted(general) == ["SumBackward0"] + ["TanhBackward0"] * 6, general
        assert len(record.node_runs) == 6 * 3 + 1
        assert len(record.hook_calls) == 6 and all(call.modified == changes for call in record.hook_calls)
        for name, parameter in traced.items():
            assert torch.equal(parameter.grad, plain[name].grad), name  # the lens changed nothing
            shown = record.leaf_grads[f"model.{name}"]
            assert torch.equal(shown, plain[name].grad), name
            without = record.grads_without_hooks.get(f"model.{name}")
            if changes:  # known, and what a run without the hook gives (bit for bit: the same ops, in order)
                assert without is not None and torch.equal(without, bare[name].grad), name
            else:
                assert without is None or torch.equal(without, plain[name].grad)
        assert not record.unknown


DISPATCHING = """TORCH_FUNCTION = []
from torch.utils._mode_utils import no_dispatch
class Counting(torch.Tensor):  # its ops run user code: each one is logged
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        TORCH_FUNCTION.append(str(func))
        with no_dispatch():
            return func(*args, **(kwargs or {}))
torch.manual_seed(0)
x = torch.randn(3, 4, requires_grad=True)
w = torch.Tensor._make_subclass(Counting, torch.randn(3, 4))
v = (x * 3) * w
s = v.tanh()
h0_handle = REG(s, 'register_hook', make_hook('h0', 'scale'))
t = (s * 2).sin()
h1_handle = REG(t, 'register_hook', make_hook('h1', 'observe'))
PASS('backward', t.sum())
TORCH_FUNCTION.append(str(type(v).__name__))"""

HALVED = """TORCH_FUNCTION = []
torch.manual_seed(0)
x = torch.randn(3, 4, requires_grad=True)
s = (x * 3).tanh()
h0_handle = REG(s, 'register_hook', make_hook('h0', 'scale'))
out = ((s * 2).sin() * 2).sum()
"""

MODE = HALVED + """from torch.utils._python_dispatch import TorchDispatchMode
class Logging(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        TORCH_FUNCTION.append(str(func))
        return func(*args, **(kwargs or {}))
with Logging():
    PASS('backward', out)"""

PROFILED = HALVED + """with torch.profiler.profile() as prof:
    PASS('backward', out)
TORCH_FUNCTION.extend(sorted(event.name for event in prof.events()))"""

PACKED = """TORCH_FUNCTION = []
def pack(t):
    TORCH_FUNCTION.append('pack')
    return t
def unpack(t):
    TORCH_FUNCTION.append('unpack')
    return t
torch.manual_seed(0)
x = torch.randn(3, 4, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    s = (x * 3).tanh()
    h0_handle = REG(s, 'register_hook', make_hook('h0', 'scale'))
    t = (s * x).sin() * 2
PASS('backward', t.sum())"""

CHECKPOINTED = """TORCH_FUNCTION = []
def part(a):
    TORCH_FUNCTION.append('forward of part')
    return (a * 2).sin() * a
torch.manual_seed(0)
x = torch.randn(3, 4, requires_grad=True)
s = (x * 3).tanh()
h0_handle = REG(s, 'register_hook', make_hook('h0', 'scale'))
t = checkpoint(part, s, use_reentrant=False)
u = (t * 2).cos()
h1_handle = REG(u, 'register_hook', make_hook('h1', 'scale'))
PASS('backward', u.sum())"""


def test_no_user_code_runs_otherwise_after_a_changing_hook():
    for source in (DISPATCHING, MODE, PROFILED, PACKED, CHECKPOINTED):
        program = programs.Program(source.splitlines(), ["x"])
        assert programs.compare(program) == [], source
        plain, lens_run = programs.run(program, "plain"), programs.run(program, "lens")
        assert plain.error is None and plain.torch_function, source  # the user code ran, the same under the lens
        assert plain.torch_function == lens_run.torch_function
        record = lens_run.lens.passes[0]
        assert any(call.modified for call in record.hook_calls)
        if source is DISPATCHING:  # the node that saved the subclass is not run again: said, not guessed
            assert plain.torch_function[-1] == "Tensor"  # v is plain: the gradients are, the short way open to them
            assert "aten.mul.Tensor" in plain.torch_function[:-1]  # the real backward ran the subclass's code
            assert not any("__torch_dispatch__" in call.hook for call in record.hook_calls)  # (was shown as a hook)
            assert any("__torch_dispatch__" in str(reason) for reason in record.unknown.values()), record.unknown
        if source is MODE:
            assert any("mul" in op for op in plain.torch_function)


def test_a_hook_that_returned_none_and_edited_nothing_costs_no_comparison(monkeypatch):
    """``bits.values_differ`` of one object twice (what the hook passed on is the copy of what it got) is False with
    no ``torch.equal``: before, one per hook call (9 in 6 layers, 15 in 12)."""
    with al.Lens():  # the once-per-process self-check first, uncounted
        (torch.ones(2, requires_grad=True) * 2).sum().backward()
    from autograd_lens.capture import leafstate

    real, leaf_equal = torch.equal, leafstate.values_equal
    counts = []
    for depth in (6, 12):
        compared, leaf_checks = [], []
        model, loss = _layers(lambda g: None, depth)
        monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or real(a, b))
        # (the pass's end compares each small leaf's value with the one before it, once per leaf: a hook may have
        # changed it through .data, leafstate.changed_by_hooks; counted apart)
        monkeypatch.setattr(leafstate, "values_equal", lambda a, b: leaf_checks.append(1) or leaf_equal(a, b))
        with al.Lens(names={"model": model}) as lens:
            loss.backward()
        monkeypatch.undo()
        assert len(leaf_checks) == depth  # one per leaf (each layer's weight is small enough to keep)
        counts.append(len(compared) - len(leaf_checks))
        calls = lens.passes[0].hook_calls
        assert len(calls) == depth and not any(call.modified for call in calls)
        assert all(call.grad_out is call.grad_in or real(call.grad_out, call.grad_in) for call in calls)
    assert counts[0] == counts[1] <= 3, counts  # none per hook call


SELF_CHECK_SEEN = """
import torch, autograd_lens as al
from torch.overrides import TorchFunctionMode
seen = []
class Seeing(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        seen.append(getattr(func, '__name__', str(func)))
        return func(*args, **(kwargs or {}))
x = torch.randn(3, requires_grad=True)
out = (x * 2).tanh().sum()
with Seeing():
    with al.Lens(names={'x': x}):  # the first Lens of the process: its self-check runs here
        out.backward()
print(seen)
"""


def test_the_first_lens_of_a_process_shows_a_torch_function_mode_nothing_of_its_own():
    found = subprocess.run([sys.executable, "-c", SELF_CHECK_SEEN], capture_output=True, text=True, timeout=300,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip().splitlines()[-1] == "['backward']"  # what the mode sees without the lens
