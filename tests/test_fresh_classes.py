"""Fresh eyes on classes of programs the differential generators do not make (helper ``fresh``, 2026-11-27 night).

Each class is run plainly and under a ``Lens`` (and, where it says something about "without hooks", with the hooks
not registered), and what the lens shows is compared with what torch did.  Classes where the lens said something
false are ``xfail(strict=True)`` with the fix they need (in files others were editing at the time); classes where
it said nothing false are kept as differential tests, so that they stay guarded."""

from __future__ import annotations

import functools
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.graph import get_gradient_edge

import autograd_lens as al

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (tests/programs.py: the differential oracle)
from test_fresh_eyes5 import lensed  # noqa: E402  (program(*args) under a Lens: (lens, what it returned))




def same(a, b) -> bool:
    return programs.equal(a, b)


# --- 1. Python hooks whose code lives in torch's own files ------------------------------------------------------------
# An nn.Module instance used as a tensor hook (nn.Hardtanh, or a module of the user's: Module.__call__ is torch's
# _wrapped_call_impl), a torch.nn.functional function (F.relu), an aten overload (torch.ops.aten.neg.default): all are
# Python, and the engine calls them with its own frame as caller. The lens shows each call as "<C hook>" with "no
# Python frame showed this hook: it is written in C" (false), because calls._profile takes any code under TORCH_DIR
# that the engine calls for one of torch's wrappers (hooks.torch_wrapper; family "ignore"), and observe._users leaves
# such hooks out of known_hooks.
# Fixed (capture/torchhooks.py): a frame the engine calls from torch's files, of no wrapper family, is a hook when a
# hook found on a tensor or node of the pass runs its code and is the user's (a functools.wraps wrapper of the
# user's function, an nn.Module, an aten operator, a public torch function, bare or in a partial); observe._users
# keeps such node hooks. Left: hooks from torch's files inside a nested backward (nested.py) are still taken for
# torch's own.


class ClipGrad(torch.nn.Module):  # a module of the user's, used as a hook: its call runs torch's Module.__call__
    def __init__(self, log):
        super().__init__()
        self.log = log

    def forward(self, g):
        out = g.clamp(-0.1, 0.1)
        self.log.append((g.detach().clone(), out.detach().clone()))
        return out


def _torch_file_hook_program(make_hook):
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    y = x * 2
    hook = make_hook()
    y.register_hook(hook)
    z = y.sin()
    (z * y).sum().backward()
    return x.grad, hook


@pytest.mark.parametrize("kind", ["user_module", "hardtanh", "relu", "aten_neg"])
def test_python_hooks_from_torch_files_are_shown_as_python(kind):
    from autograd_lens.capture.hooknames import function_name

    truth_log: list = []
    makers = {
        "user_module": lambda: ClipGrad(truth_log),
        "hardtanh": lambda: torch.nn.Hardtanh(-0.1, 0.1),
        "relu": lambda: F.relu,
        "aten_neg": lambda: torch.ops.aten.neg.default,
    }
    equivalents = {"user_module": lambda g: g.clamp(-0.1, 0.1), "hardtanh": lambda g: g.clamp(-0.1, 0.1),
                   "relu": lambda g: g.clamp(min=0), "aten_neg": lambda g: -g}
    plain, _ = _torch_file_hook_program(makers[kind])
    # what the hook received and returned, from a plain run with an equivalent logging lambda
    logged: list = []
    _torch_file_hook_program(lambda: lambda g: logged.append((g.clone(), equivalents[kind](g))) or logged[-1][1])
    lens, (traced, hook) = lensed(_torch_file_hook_program, makers[kind])
    assert same(plain, traced)
    calls = lens.hook_calls
    assert len(calls) == 1
    call = calls[0]
    assert (call.hook, call.kind, call.target) == (function_name(hook), "tensor", "y"), (call.hook, call.unseen)
    assert call.unseen is None
    assert same(call.grad_in, logged[0][0]) and same(call.grad_out, logged[0][1])


# The same class where it matters most: a post-accumulate-grad hook in torch's files that edits .grad in place
# (functools.partial(torch.nn.utils.clip_grad_value_, clip_value=...) on each parameter: clipping in backward). No
# call is shown at all, and "without hooks" is the clipped .grad, shown as "same", where a run without the hooks has
# the unclipped gradients. The same fix (and the post-accumulate path must then see the call's edit, as for a lambda).


def _clip_in_backward(hooked):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(4, 3)
    if hooked:
        for parameter in lin.parameters():
            parameter.register_post_accumulate_grad_hook(
                functools.partial(torch.nn.utils.clip_grad_value_, clip_value=0.5))
    (lin(x) ** 2).sum().backward()
    return {f"lin.{name}": parameter.grad.clone() for name, parameter in lin.named_parameters()}


def _decorated_hooks(hooked, decorator, tensor_hook=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(4, 3)

    @decorator
    def clip(p):  # optimizer-in-backward style: a post-accumulate hook under @torch.no_grad()
        p.grad.clamp_(-0.01, 0.01)

    @decorator
    def halve(g):
        return g * 0.5

    if hooked:
        lin.weight.register_post_accumulate_grad_hook(clip)
        lin.bias.register_post_accumulate_grad_hook(clip)
        if tensor_hook:
            lin.bias.register_hook(halve)
    (lin(x) ** 2).sum().backward()
    return {f"lin.{name}": parameter.grad.clone() for name, parameter in lin.named_parameters()}


# The commonest instance: a hook decorated with @torch.no_grad() (or torch.enable_grad(), torch.inference_mode(), or
# the class form @torch.no_grad): the function registered is torch's decorate_context (torch/utils/_contextlib.py),
# which calls the user's function inside the context. The tensor hook is shown as "<C hook>" ("written in C"); the
# post-accumulate hooks are not shown at all, and with no other hook their clipping is taken for the value without
# hooks. The fix above covers it (decorate_context is a function under TORCH_DIR the engine calls, with family
# "ignore"; code_of(clip) is its code); function_name(clip) follows __wrapped__ to "clip".
@pytest.mark.parametrize("tensor_hook", [True, False], ids=["with_tensor_hook", "post_accumulate_only"])
@pytest.mark.parametrize("decorator", ["no_grad", "no_grad_class", "enable_grad", "inference_mode"])
def test_hooks_decorated_by_torch_context_managers(decorator, tensor_hook):
    make = {"no_grad": torch.no_grad(), "no_grad_class": torch.no_grad, "enable_grad": torch.enable_grad(),
            "inference_mode": torch.inference_mode()}[decorator]
    plain, unhooked = _decorated_hooks(True, make, tensor_hook), _decorated_hooks(False, make)
    undecorated = al.Lens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with undecorated:
            _decorated_hooks(True, lambda f: f, tensor_hook)  # the same hooks undecorated: what the lens must show
    lens, traced = lensed(_decorated_hooks, True, make, tensor_hook)
    assert same(list(plain.values()), list(traced.values()))
    (p,) = lens.passes
    (q,) = undecorated.passes
    for name, value in unhooked.items():
        assert (p.grads_without_hooks[name] is None and p.unknown.get(name)) or same(p.grads_without_hooks[name], value)
    assert [(c.hook, c.kind, c.target) for c in p.hook_calls] == [(c.hook, c.kind, c.target) for c in q.hook_calls]
    for name, value in unhooked.items():
        assert (p.grads_without_hooks[name] is None and p.unknown.get(name)) or same(p.grads_without_hooks[name], value)


def _decorated_node_hooks(decorator, kind, hooked=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(4, 3, requires_grad=True)
    log = []

    @decorator
    def node_pre(grad_outputs):
        log.append(grad_outputs[0].clone())
        return tuple(g * 0.5 for g in grad_outputs)

    @decorator
    def node_post(grad_inputs, grad_outputs):
        log.append(grad_inputs[0].clone())
        return tuple(None if g is None else g * 0.5 for g in grad_inputs)

    y = lin(x).tanh()
    if hooked:
        y.grad_fn.register_prehook(node_pre) if kind == "node_pre" else y.grad_fn.register_hook(node_post)
    (y ** 2).sum().backward()
    return {"x": x.grad.clone(), "lin.weight": lin.weight.grad.clone(), "lin.bias": lin.bias.grad.clone()}, log


# Node hooks decorated the same way (and with @torch.compiler.disable, the usual decorator of a hook in compiled
# code: torch/_dynamo's wrapper): a node pre-hook is shown as "<C hook>" of kind "tensor" on y; a node post-hook that
# halves the gradients is not shown at all, and the values without hooks are the halved ones. Module full backward
# (pre-)hooks and multi-grad hooks decorated so are shown right (torch's wrapper calls them, and the lens looks one
# frame deeper). The same fix.
@pytest.mark.parametrize("kind", ["node_pre", "node_post"])
@pytest.mark.parametrize("decorator", ["no_grad", "compiler_disable"])
def test_node_hooks_decorated_by_torch(decorator, kind):
    make = {"no_grad": torch.no_grad(), "compiler_disable": torch.compiler.disable}[decorator]
    (plain, plain_log), (unhooked, _) = _decorated_node_hooks(make, kind), _decorated_node_hooks(make, kind, False)
    undecorated = al.Lens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with undecorated:
            _decorated_node_hooks(lambda f: f, kind)
    lens, (traced, lens_log) = lensed(_decorated_node_hooks, make, kind)
    assert same(list(plain.values()), list(traced.values())) and same(plain_log, lens_log)
    (p,) = lens.passes
    (q,) = undecorated.passes
    for name, value in unhooked.items():
        assert (p.grads_without_hooks[name] is None and p.unknown.get(name)) or same(p.grads_without_hooks[name], value)
    assert [(c.hook, c.kind, c.target) for c in p.hook_calls] == [(c.hook, c.kind, c.target) for c in q.hook_calls]
    assert same(p.hook_calls[0].grad_in, plain_log[0]) or same(p.hook_calls[0].grad_in[0], plain_log[0])


@pytest.mark.parametrize("kind", ["module", "module_pre", "multi"])
@pytest.mark.parametrize("decorator", ["no_grad", "compiler_disable"])
def test_module_and_multi_grad_hooks_decorated_by_torch(decorator, kind):
    """Decorated module full backward (pre-)hooks and multi-grad hooks: shown by name and kind, as undecorated ones,
    and the values without hooks are torch's."""
    make = {"no_grad": torch.no_grad(), "compiler_disable": torch.compiler.disable}[decorator]

    def program(decorator, hooked=True):
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 3)
        x = torch.randn(4, 3, requires_grad=True)
        log = []

        @decorator
        def module_hook(module, grad_input, grad_output):
            log.append(grad_input[0].clone())
            return tuple(None if g is None else g * 0.5 for g in grad_input)

        @decorator
        def module_pre(module, grad_output):
            log.append(grad_output[0].clone())
            return tuple(g * 0.5 for g in grad_output)

        @decorator
        def multi(grads):
            log.append(grads[0].clone())

        if hooked and kind == "module":
            lin.register_full_backward_hook(module_hook)
        if hooked and kind == "module_pre":
            lin.register_full_backward_pre_hook(module_pre)
        h = lin(x)
        y = h.tanh()
        if hooked and kind == "multi":
            torch.autograd.graph.register_multi_grad_hook((h, y), multi)
        (y ** 2).sum().backward()
        return {"x": x.grad.clone(), "lin.weight": lin.weight.grad.clone()}, log

    (plain, plain_log), (unhooked, _) = program(make), program(make, False)
    lens, (traced, lens_log) = lensed(program, make)
    assert same(list(plain.values()), list(traced.values())) and same(plain_log, lens_log)
    (p,) = lens.passes
    name = {"module": "module_hook", "module_pre": "module_pre", "multi": "multi"}[kind]
    expected_kind = {"module": "module_full", "module_pre": "module_full_pre", "multi": "multi_grad"}[kind]
    assert [(c.hook, c.kind) for c in p.hook_calls] == [(name, expected_kind)]
    for leaf, value in unhooked.items():
        assert same(p.grads_without_hooks[leaf], value)


def test_post_accumulate_hook_from_torch_files_is_shown_and_undone_without_hooks():
    plain, unhooked = _clip_in_backward(True), _clip_in_backward(False)
    lens, traced = lensed(_clip_in_backward, True)
    assert same(list(plain.values()), list(traced.values()))
    (p,) = lens.passes
    assert [(c.kind, c.target) for c in p.hook_calls] == [("post_accumulate_grad", name) for name in plain] or \
        sorted((c.kind, c.target) for c in p.hook_calls) == sorted(("post_accumulate_grad", name) for name in plain)
    for name, value in unhooked.items():
        assert same(p.leaf_grads[name], plain[name])
        assert (p.grads_without_hooks[name] is None and p.unknown.get(name)) or same(p.grads_without_hooks[name], value)


# --- 2. torch.autograd.grad(..., materialize_grads=True) ---------------------------------------------------------------
# torch.autograd.grad turns the engine's None for an unused input into zeros after the engine returns; the lens keeps
# the engine's result (tracer._run's ``result``), so it shows "returned None" (and None without hooks, "same") where
# the program got zeros.
# Fixed (capture/gradinputs.py, read by build._results from the stack as the pass ends): when the engine's caller is
# torch.autograd.grad's frame and its f_locals["materialize_grads"] is true, record a None result (and a None value
# without hooks) for input i as torch.zeros_like(inputs[i]), as torch.autograd.grad does.


def _materialized(hooked):
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 6.0], requires_grad=True)
    y = x * 2
    if hooked:
        y.register_hook(lambda g: g * 3)
    return torch.autograd.grad(y.sum(), [x, w], allow_unused=True, materialize_grads=True)


def test_materialize_grads_shows_what_autograd_grad_returned():
    plain = _materialized(True)
    unhooked = _materialized(False)
    lens, traced = lensed(_materialized, True)
    assert same(plain, traced)
    (p,) = lens.passes
    assert same(p.input_grads["x"], plain[0]) and same(p.input_grads["w"], plain[1]), p.input_grads
    assert same(p.grads_without_hooks["x"], unhooked[0]) and same(p.grads_without_hooks["w"], unhooked[1])


# --- 3. a GradientEdge among autograd.grad's inputs ---------------------------------------------------------------------
# torch.autograd.grad(out, get_gradient_edge(y)) returns the gradient that reaches y's backward function (after y's
# tensor hooks). The lens labels it "input 0" and records its value right, but its value without hooks is None with
# no reason in ``unknown`` (the table says "unknown: not recorded"): the guarantee is a value or a reason.
# Fixed (capture/gradinputs.py unhooked_input): an input that is a GradientEdge is the gradient the edge's node
# receives at its output_nr, after that tensor's hooks: without hooks, the unhooked value arriving at that node input
# (as for a non-leaf tensor input, read where the pre-hook reads it); or, if that is not at hand, Unknown("an input
# given as a GradientEdge: ...").


def _edge_input(hooked):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    if hooked:
        y.register_hook(lambda g: g * 2)
    z = y.sin()
    if hooked:
        z.register_hook(lambda g: g * 5)
    return torch.autograd.grad(z.sum(), get_gradient_edge(y))


def test_gradient_edge_input_has_a_value_without_hooks_or_a_reason():
    plain, unhooked = _edge_input(True), _edge_input(False)
    lens, traced = lensed(_edge_input, True)
    assert same(plain, traced)
    (p,) = lens.passes
    (label,) = p.inputs
    assert same(p.input_grads[label], plain[0])
    without = p.grads_without_hooks.get(label)
    assert (without is None and p.unknown.get(label)) or same(without, unhooked[0]), (without, p.unknown)


# --- 3b. a hook that writes a leaf's .grad before AccumulateGrad adds to it, in a pass that starts with .grad None ----
# t1.register_hook(lambda g: setattr(x0, "grad", torch.ones_like(x0))) for t1 = x0 * x1: AccumulateGrad then adds
# what arrived (0.93, ...) to the ones. The lens shows a hook call that never ran, "<C hook>" on x0, "received 0.93,
# passed on 1.93 ... modified", and AccumulateGrad "received" 1.93. With .grad set before the pass the same hook is
# shown right (GRAD_CHANGED_IN_PASS). Cause: nodes.py _record_node, leaf branch, "a leaf without a .grad before the
# pass: .grad is exactly what arrived" (received = self.written[key] when no pre-hook read it), and unexplained then
# sees a change between what the users sent and that "received".
# Fixed (capture/nodes.py _arrived, as described here): when key is not in self.incoming, take what arrived from the
# post-hook's own grad_outputs[0] (self._keep(grad_outputs[0]), or the written copy only when .grad is adopted from
# it: records.adopted(grad, grad_outputs[0], version)); when .grad is then not what arrived, add key to
# observer.changed_before_write (a hook wrote .grad during the pass: GRAD_CHANGED_IN_PASS, no invented call).


def _grad_written_by_a_hook(log, hooked=True):
    torch.manual_seed(0)
    x0 = torch.randn(3, requires_grad=True)
    x1 = torch.randn(3, requires_grad=True)
    t1 = x0 * x1

    def route(g):
        log.append(g.clone())
        x0.grad = torch.ones_like(x0)

    if hooked:
        t1.register_hook(route)
    (t1.sin() + t1).sum().backward()
    return x0.grad.clone(), x1.grad.clone()


def test_a_hook_writing_a_leaf_grad_invents_no_hook_call():
    plain_log, lens_log = [], []
    plain = _grad_written_by_a_hook(plain_log)
    unhooked = _grad_written_by_a_hook([], hooked=False)
    lens, traced = lensed(_grad_written_by_a_hook, lens_log)
    assert same(plain, traced) and same(plain_log, lens_log)
    (p,) = lens.passes
    assert same(p.leaf_grads["x0"], plain[0]) and same(p.leaf_grads["x1"], plain[1])
    assert (p.grads_without_hooks["x0"] is None and p.unknown.get("x0")) or same(p.grads_without_hooks["x0"], unhooked[0])
    assert [(c.hook, c.target) for c in p.hook_calls] == [("route", "t1")]
    written = [e for e in p.events if isinstance(e, al.GradWritten) and e.name == "x0"]
    assert same(written[0].received, unhooked[0])  # what AccumulateGrad got: the gradient x0 gets without hooks


def _hidden(a, hook):  # a tensor made in a function and never named after it (a forward's)
    h = a * 2
    h.register_hook(hook)
    return h.sin()


def _unnamed_torch_file_hooks(log):
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    first = _hidden(x, torch.no_grad()(lambda g: log.append(("lambda", g.clone())) or g * 0.5))
    second = _hidden(x, ClipGrad(log))
    (first + second).sum().backward()
    return x.grad


def test_torch_file_hooks_on_unnamed_tensors_are_all_shown():
    """Two such hooks (a decorated lambda, a module instance) on tensors made in a function: main before 8e943e7
    showed one call of the two, as '<C hook>'. Each call, in torch's order, with what it got and passed on."""
    plain_log, lens_log = [], []
    plain = _unnamed_torch_file_hooks(plain_log)
    lens, traced = lensed(_unnamed_torch_file_hooks, lens_log)
    assert same(plain, traced) and len(plain_log) == len(lens_log) == 2
    calls = lens.hook_calls
    order = ["lambda" if isinstance(entry[0], str) else "ClipGrad" for entry in plain_log]
    assert [c.hook for c in calls] == ["<lambda>" if name == "lambda" else name for name in order]
    assert all(c.unseen is None for c in calls)
    for call, entry in zip(calls, plain_log):
        received = entry[1] if isinstance(entry[0], str) else entry[0]
        assert same(call.grad_in, received)
        assert same(call.grad_out, received * 0.5 if isinstance(entry[0], str) else entry[1])


# --- 4. classes where the lens said nothing false: kept as differential tests -----------------------------------------


class MyStop(BaseException):
    pass


def _raising_base(exception, log):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    y = x * w

    def hook(g):
        log.append(g.clone())
        raise exception

    y.register_hook(hook)
    w.register_hook(lambda g: log.append(g.clone()) or g * 2)
    try:
        y.exp().sum().backward()
    except BaseException as caught:  # noqa: BLE001  (what backward() raised, compared)
        return type(caught), caught.args, x.grad, w.grad
    return None


@pytest.mark.parametrize("exception", [SystemExit(3), GeneratorExit(), MyStop("boom"), KeyboardInterrupt(),
                                       StopIteration(5)], ids=lambda e: type(e).__name__)
def test_base_exceptions_from_hooks_come_out_unchanged(exception):
    plain_log, lens_log = [], []
    plain = _raising_base(exception, plain_log)
    profile, register = sys.getprofile(), torch.Tensor.register_hook
    lens, traced = lensed(_raising_base, exception, lens_log)
    assert plain is not None and traced[:2] == plain[:2] and same(traced[2:], plain[2:])
    assert same(lens_log, plain_log)
    assert sys.getprofile() is profile and torch.Tensor.register_hook is register
    (p,) = lens.passes
    assert [(c.hook, c.target) for c in p.hook_calls] == [("hook", "y")]
    assert p.error is not None and p.error.type == type(exception).__name__


def _layout(case):
    torch.manual_seed(0)
    if case == "transposed_leaf":
        x = torch.randn(3, 2).t().detach().requires_grad_()
        y = x * 2
        y.register_hook(lambda g: g * 0.5)
        y.sin().sum().backward()
        return {"x": x}
    if case == "channels_last":
        conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last).requires_grad_()
        out = conv(x)
        out.register_hook(lambda g: g * 2)
        conv.weight.register_hook(lambda g: g.contiguous() * 1.0)
        out.sum().backward()
        return {"conv.weight": conv.weight, "conv.bias": conv.bias, "x": x}
    if case == "hook_returns_transposed":
        x = torch.randn(3, 4, requires_grad=True)
        x.register_hook(lambda g: g.t().contiguous().t())
        (x * 1.0).sum().backward()
        return {"x": x}
    if case == "hook_returns_expanded":
        x = torch.randn(3, 4, requires_grad=True)
        x.register_hook(lambda g: torch.ones(()).expand(3, 4))
        (x * 2).sum().backward()
        return {"x": x}
    emb = torch.nn.Embedding(10, 3, sparse=True)  # sparse gradients, accumulated over two passes
    emb.weight.register_hook(lambda g: g * 2)
    for index in ([1, 2, 2], [3, 1]):
        emb(torch.tensor(index)).sum().backward()
    return {"emb.weight": emb.weight}


def _layout_of(leaves):
    out = []
    for leaf in leaves.values():
        grad = leaf.grad
        if grad.is_sparse:
            out.append(("sparse", grad.is_coalesced(), grad._indices().tolist(), grad._values().tolist()))
        else:
            out.append((grad.stride(), grad.is_contiguous(), grad.tolist(), grad.is_conj(), grad._base is None))
    return out


@pytest.mark.parametrize("case", ["transposed_leaf", "channels_last", "hook_returns_transposed",
                                  "hook_returns_expanded", "sparse_embedding"])
def test_grad_layout_is_what_torch_makes(case):
    """.grad's strides, contiguity, sparsity and coalescing, and its values, as without the lens; the lens's
    .grad as torch's."""
    plain = _layout_of(_layout(case))
    lens, leaves = lensed(_layout, case)
    assert _layout_of(leaves) == plain
    last = lens.passes[-1]
    for name, leaf in leaves.items():
        shown = last.leaf_grads[name]
        if not leaf.grad.is_sparse and not isinstance(shown, al.TensorSummary):
            assert same(shown, leaf.grad), name


def _edge_roots(log, hooked):
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    t1 = x * 2
    t2 = t1.sin()
    if hooked:
        t1.register_hook(lambda g: log.append(("t1", g.clone())) or g * 3)
        t2.register_hook(lambda g: log.append(("t2", g.clone())) or g * 5)
    torch.autograd.backward([get_gradient_edge(t2)], [torch.ones(3)], retain_graph=True)
    first = x.grad.clone()
    torch.autograd.backward([get_gradient_edge(t1)], [torch.ones(3)], retain_graph=True)
    second = x.grad.clone()
    returned = torch.autograd.grad([get_gradient_edge(t2)], [x], [torch.ones(3)])
    return first, second, returned


def test_gradient_edges_as_roots():
    """backward() / autograd.grad() from GradientEdges: the hooks each pass ran, .grad, values without hooks."""
    plain_log, lens_log = [], []
    plain = _edge_roots(plain_log, True)
    unhooked = _edge_roots([], False)
    lens, traced = lensed(_edge_roots, lens_log, True)
    assert same(plain, traced) and same(plain_log, lens_log)
    assert [c.target for c in lens.hook_calls] == [target for target, _ in plain_log]
    assert same([c.grad_in for c in lens.hook_calls], [g for _, g in plain_log])
    assert same([c.grad_out for c in lens.hook_calls], [g * (3 if t == "t1" else 5) for t, g in plain_log])
    first, second, third = lens.passes
    assert same(first.grads_without_hooks["x"], unhooked[0])
    assert same(second.grads_without_hooks["x"], unhooked[1])
    assert same(third.grads_without_hooks["x"], unhooked[2][0])


# Hand-written programs in tests/programs.py's form (its PRELUDE: make_hook & co, REG, PASS), checked by its oracle
# (every hook call, node run, .grad, value without hooks against a plain, a logged and an unhooked run): views and
# in-place ops around hooks, multi-output views, a leaf as root, several roots over one graph, an error from a saved
# tensor changed in place, Functions with non-tensor outputs, module hooks on a module with keyword and non-tensor
# outputs or inputs that need no grad, complex views, clip_grad_norm_ inside post-accumulate hooks, hooks removing
# themselves and others over passes, grad of grad with hooks on each level.

EXTRA = '''
import torch.nn as nn
class TwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
    def forward(self, a, b=None, scale=1.0):
        h = self.lin(a)
        return h * scale, (b * 2 if b is not None else None), 7
class NonTensorOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, 5
    @staticmethod
    def backward(ctx, g, _):
        return g * 2
def raising(tag, kind):  # a hook of each kind that raises (programs.py's raise only tensor hooks)
    def pre(grads):
        LOG.append((tag, clone(grads)))
        raise ValueError(tag)
    def post(grad_inputs, grad_outputs):
        LOG.append((tag, clone(grad_inputs)))
        raise ValueError(tag)
    def after(p):
        LOG.append((tag, clone(p.grad)))
        raise ValueError(tag)
    def multi(grads):
        LOG.append((tag, clone(tuple(grads))))
        raise ValueError(tag)
    def module(m, grad_input, grad_output):
        LOG.append((tag, clone(grad_input)))
        raise ValueError(tag)
    def module_pre(m, grad_output):
        LOG.append((tag, clone(grad_output)))
        raise ValueError(tag)
    return dict(pre=pre, post=post, after=after, multi=multi, module=module, module_pre=module_pre)[kind]
def make_clipper(tag, module):
    def clipper(p):
        LOG.append((tag, clone(p.grad)))
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.1)
        LOG.append((tag + ' out', clone(p.grad)))
    return clipper
'''

PROGRAMS = {
    "view_inplace_hooks_on_base_and_view": ("""
        x0 = torch.randn(2, 3, requires_grad=True)
        t1 = x0 * 2
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        t2 = t1[0]
        t2.mul_(3)
        h1 = REG(t1, 'register_hook', make_hook('h1', 'observe'))
        h2 = REG(t2, 'register_hook', make_hook('h2', 'scale'))
        out = t1.sum() * 2 + t2.sum()
        PASS('backward', out)
        """, ["x0"]),
    "unbind_outputs_with_tensor_and_node_hooks": ("""
        x0 = torch.randn(3, 2, requires_grad=True)
        a, b, c = (x0 * 1.5).unbind(0)
        h0 = REG(a, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(c, 'register_hook', make_hook('h1', 'observe'))
        h2 = REG(a.grad_fn, 'register_prehook', make_pre('h2', 'scale'))
        out = (a * b).sum()
        PASS('backward', out)
        """, ["x0"]),
    "leaf_as_root": ("""
        x0 = torch.randn(3, requires_grad=True)
        h0 = REG(x0, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(x0, 'register_post_accumulate_grad_hook', make_after('h1', 'inplace'))
        PASS('backward', x0, gradient=torch.ones(3))
        PASS('backward', x0, gradient=torch.full((3,), 2.0))
        """, ["x0"]),
    "several_roots_over_one_graph": ("""
        x0 = torch.randn(3, requires_grad=True)
        x1 = torch.randn(3, requires_grad=True)
        t1 = x0 * x1
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        t2 = t1.sin()
        t3 = t1.exp()
        h1 = REG(t3, 'register_hook', make_hook('h1', 'scale'))
        PASS('backward', t2.sum(), retain_graph=True)
        PASS('backward', t3.sum(), retain_graph=True)
        PASS('backward', t1, gradient=torch.ones(3), retain_graph=True)
        PASS('backward', (t2 * t3).sum())
        """, ["x0", "x1"]),
    "saved_tensor_changed_in_place": ("""
        x0 = torch.randn(3, requires_grad=True)
        t1 = x0 * 2
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        t2 = t1.sin()
        t3 = t1.exp()
        h1 = REG(t3, 'register_hook', make_hook('h1', 'scale'))
        t1.add_(1.0)
        PASS('backward', (t2 + t3).sum())
        """, ["x0"]),
    "function_with_non_tensor_output": ("""
        x0 = torch.randn(3, requires_grad=True)
        t1, n = NonTensorOut.apply(x0)
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(t1.grad_fn, 'register_hook', make_post('h1', 'scale'))
        out = (t1 * n).sum()
        PASS('backward', out)
        """, ["x0"]),
    "module_keywords_and_non_tensor_outputs": ("""
        m = TwoOut()
        x0 = torch.randn(2, 3, requires_grad=True)
        x1 = torch.randn(2, requires_grad=True)
        h0 = REG(m, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
        h1 = REG(m, 'register_full_backward_pre_hook', make_module_pre('h1', 'scale'))
        a, b, k = m(x0, b=x1, scale=2.0)
        out = a.sum() + b.sum() * k
        PASS('backward', out)
        """, ["x0", "x1", "m.lin.weight", "m.lin.bias"]),
    "module_inputs_need_no_grad": ("""
        m = TwoOut()
        x0 = torch.randn(2, 3)
        h0 = REG(m, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
        h1 = REG(m, 'register_full_backward_pre_hook', make_module_pre('h1', 'scale'))
        a, b, k = m(x0)
        PASS('backward', a.sum(), retain_graph=True)
        PASS('backward', (a * a).sum())
        """, ["m.lin.weight", "m.lin.bias"]),
    "module_output_fed_back_three_times": ("""
        m = torch.nn.Linear(3, 3)
        x0 = torch.randn(2, 3, requires_grad=True)
        h0 = REG(m, 'register_full_backward_hook', make_module_hook('h0', 'scale'))
        a = m(x0)
        b = m(a)
        c = m(a * b)
        PASS('backward', a.sum() + b.sum() + c.sum())
        """, ["x0", "m.weight", "m.bias"]),
    "complex_conj_and_real_views": ("""
        x0 = torch.randn(3, dtype=torch.complex64, requires_grad=True)
        t1 = x0.conj()
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        t2 = torch.view_as_real(t1 * 2)
        h1 = REG(t2, 'register_hook', make_hook('h1', 'scale'))
        t3 = (t1 * (1 + 2j)).imag
        h2 = REG(t3, 'register_hook', make_hook('h2', 'scale'))
        PASS('backward', (t2 ** 2).sum() + (t3 * t3).sum())
        """, ["x0"]),
    "clip_grad_norm_in_post_accumulate_hooks": ("""
        lin = torch.nn.Linear(3, 3)
        x0 = torch.randn(2, 3, requires_grad=True)
        h0 = REG(lin.weight, 'register_post_accumulate_grad_hook', make_clipper('h0', lin))
        h1 = REG(lin.bias, 'register_post_accumulate_grad_hook', make_clipper('h1', lin))
        h2 = REG(x0, 'register_hook', make_hook('h2', 'scale'))
        out = (lin(x0) ** 2).sum()
        PASS('backward', out, retain_graph=True)
        PASS('backward', out)
        """, ["x0", "lin.weight", "lin.bias"]),
    "multi_grad_any_and_all_over_passes": ("""
        x0 = torch.randn(3, requires_grad=True)
        x1 = torch.randn(3, requires_grad=True)
        t1 = x0 * 2
        t2 = x1 * 3
        h0 = REG(None, 'multi', (t1, t2), make_multi('h0', 'observe'), 'any')
        h1 = REG(None, 'multi', (t1, t2), make_multi('h1', 'observe'), 'all')
        h2 = REG(t1, 'register_hook', make_hook('h2', 'scale'))
        PASS('backward', t1.sum(), retain_graph=True)
        PASS('backward', (t1 * t2).sum(), retain_graph=True)
        PASS('grad', t2.sum(), [x1])
        """, ["x0", "x1"]),
    "hooks_removing_themselves_and_others": ("""
        x0 = torch.randn(3, requires_grad=True)
        t1 = x0 * 2
        h0 = REG(t1, 'register_hook', make_hook('h0', 'remove'))
        h1 = REG(t1, 'register_hook', make_hook('h1', 'scale'))
        h2 = REG(t1, 'register_hook', make_hook('h2', 'remove'))
        REMOVE_TARGETS['h0'] = [h1, h0]
        REMOVE_TARGETS['h2'] = [h2]
        out = (t1 * t1).sum()
        PASS('backward', out, retain_graph=True)
        PASS('backward', out, retain_graph=True)
        PASS('backward', out)
        """, ["x0"]),
    # layers the generators do not use: parametrizations.orthogonal, the old weight_norm (a forward pre-hook),
    # EmbeddingBag, log_softmax + nll_loss, sort / max / gather
    "orthogonal": ("""
        plin = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(3, 3))
        x0 = torch.randn(2, 3, requires_grad=True)
        h0 = REG(plin.parametrizations.weight.original, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(plin, 'register_full_backward_hook', make_module_hook('h1', 'scale'))
        t1 = plin(x0)
        h2 = REG(t1, 'register_hook', make_hook('h2', 'scale'))
        PASS('backward', (t1 ** 2).sum(), retain_graph=True)
        PASS('backward', t1.sum())
        """, ['x0', 'plin.parametrizations.weight.original', 'plin.bias']),
    "old_weight_norm": ("""
        wlin = torch.nn.utils.weight_norm(torch.nn.Linear(3, 3))
        x0 = torch.randn(2, 3, requires_grad=True)
        h0 = REG(wlin.weight_g, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(wlin.weight_v, 'register_post_accumulate_grad_hook', make_after('h1', 'inplace'))
        t1 = wlin(x0)
        h2 = REG(t1, 'register_hook', make_hook('h2', 'scale'))
        PASS('backward', (t1 ** 2).sum())
        t3 = wlin(x0 * 2)
        PASS('backward', t3.sum())
        """, ['x0', 'wlin.weight_g', 'wlin.weight_v', 'wlin.bias']),
    "embedding_bag": ("""
        bag = torch.nn.EmbeddingBag(10, 3, mode='mean')
        idx = torch.tensor([1, 2, 4, 5, 4, 3])
        off = torch.tensor([0, 3])
        h0 = REG(bag.weight, 'register_hook', make_hook('h0', 'scale'))
        t1 = bag(idx, off)
        h1 = REG(t1, 'register_hook', make_hook('h1', 'scale'))
        PASS('backward', (t1 ** 2).sum(), retain_graph=True)
        PASS('backward', t1.sum())
        """, ['bag.weight']),
    "ctc_like_logsoftmax_nll": ("""
        x0 = torch.randn(4, 5, requires_grad=True)
        t1 = torch.log_softmax(x0, dim=1)
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        t2 = torch.nn.functional.nll_loss(t1, torch.tensor([1, 0, 4, 2]))
        h1 = REG(t2, 'register_hook', make_hook('h1', 'scale'))
        PASS('backward', t2)
        """, ['x0']),
    "sort_max_gather": ("""
        x0 = torch.randn(2, 5, requires_grad=True)
        v, i = x0.sort(dim=1)
        h0 = REG(v, 'register_hook', make_hook('h0', 'scale'))
        m, j = x0.max(dim=1)
        h1 = REG(m, 'register_hook', make_hook('h1', 'scale'))
        g = x0.gather(1, torch.tensor([[0, 0], [4, 1]]))
        h2 = REG(g, 'register_hook', make_hook('h2', 'scale'))
        PASS('backward', v[:, :2].sum() + m.sum() + g.sum())
        """, ['x0']),
    "grad_of_grad_with_hooks_on_each_level": ("""
        x0 = torch.randn(3, requires_grad=True)
        t1 = x0 ** 3
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        h1 = REG(x0, 'register_hook', make_hook('h1', 'scale'))
        d = PASS('grad', t1.sum(), [x0], create_graph=True)[0]
        h2 = REG(d, 'register_hook', make_hook('h2', 'scale'))
        e = PASS('grad', d.sum(), [x0], create_graph=True)[0]
        PASS('backward', e.sum())
        """, ["x0"]),
}

# post-accumulate hooks that clear, replace or edit .grad in every way (and a tensor hook editing through .data or
# numpy), over passes of both kinds, with a scaling hook on the same leaf
for _name, _statement in {"none": "p.grad = None", "replace": "p.grad = p.grad * 3",
                          "zeros_like": "p.grad = torch.zeros_like(p)", "detach_edit": "p.grad.detach_().mul_(2)",
                          "data_assign": "p.grad.data = p.grad.data * 0.5", "set_": "p.grad.set_(p.grad * 0.25)"}.items():
    PROGRAMS[f"post_accumulate_{_name}"] = (f"""
        x0 = torch.randn(3, requires_grad=True)
        x1 = torch.randn(3, requires_grad=True)
        def after(p):
            LOG.append(('h0', clone(p.grad)))
            {_statement}
            LOG.append(('h0 out', clone(p.grad)))
        h0 = REG(x0, 'register_post_accumulate_grad_hook', after)
        h1 = REG(x0, 'register_hook', make_hook('h1', 'scale'))
        t1 = x0 * x1
        t2 = t1.sin()
        PASS('backward', t2.sum(), retain_graph=True)
        PASS('backward', (t2 * 2).sum(), retain_graph=True)
        x1.grad = None
        PASS('grad', t2.sum(), [x0, x1], retain_graph=True)
        PASS('backward', t1.sum())
        """, ["x0", "x1"])
for _kind, _registration in {
        "pre": "REG(t2.grad_fn, 'register_prehook', raising('h9', 'pre'))",
        "post": "REG(t2.grad_fn, 'register_hook', raising('h9', 'post'))",
        "after": "REG(x0, 'register_post_accumulate_grad_hook', raising('h9', 'after'))",
        "multi": "REG(None, 'multi', (t1, x1), raising('h9', 'multi'), 'all')",
        "module": "REG(lin, 'register_full_backward_hook', raising('h9', 'module'))",
        "module_pre": "REG(lin, 'register_full_backward_pre_hook', raising('h9', 'module_pre'))"}.items():
    _module = _kind.startswith("module")  # (a module's backward hooks attach at its forward: registered before it)
    PROGRAMS[f"{_kind}_hook_raises"] = (f"""
        lin = torch.nn.Linear(3, 3)
        x0 = torch.randn(2, 3, requires_grad=True)
        x1 = torch.randn(2, 3, requires_grad=True)
        t1 = x0 * x1
        h0 = REG(t1, 'register_hook', make_hook('h0', 'scale'))
        {'h9 = ' + _registration if _module else 'pass'}
        t2 = lin(t1).tanh()
        h1 = REG(x1, 'register_hook', make_hook('h1', 'scale'))
        {'pass' if _module else 'h9 = ' + _registration}
        PASS('backward', t2.sum(), retain_graph=True)
        REMOVE(h9)
        PASS('backward', t2.sum())
        """, ["x0", "x1", "lin.weight", "lin.bias"])
for _name, _statement in {"data": "g.data.mul_(2)", "numpy": "g.numpy()[...] *= 2"}.items():
    PROGRAMS[f"tensor_hook_edits_through_{_name}"] = (f"""
        x0 = torch.randn(3, requires_grad=True)
        x1 = torch.randn(3, requires_grad=True)
        t1 = x0 * x1
        def edit(g):
            LOG.append(('h0', clone(g)))
            {_statement}
            LOG.append(('h0 out', clone(g)))
        h0 = REG(t1, 'register_hook', edit)
        t2 = t1.sin() + t1
        PASS('backward', t2.sum(), retain_graph=True)
        PASS('backward', t2.sum())
        """, ["x0", "x1"])


def _run(program, mode):
    return programs.run(program, mode, EXTRA)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hand_written_programs_against_torch(name, seed):
    source, leaves = PROGRAMS[name]
    program = programs.Program([f"torch.manual_seed({seed})"] + textwrap.dedent(source).strip().splitlines(), leaves,
                               seed)
    plain = _run(program, "plain")
    assert plain.error is None, plain.error
    assert programs._truth_calls(_run(program, "truth").log), "no hook ran: the program tests nothing"
    assert programs.compare(program, _run) == []


@pytest.mark.parametrize("dtype,seed", [("bfloat16", 5100000 + n) for n in range(0, 40, 4)]
                         + [("float16", 5200000 + n) for n in range(0, 40, 4)])
def test_generated_programs_in_half_precision(dtype, seed):
    """tests/programs.py's programs with bfloat16 / float16 leaves (its campaigns draw float32, float64, complex64):
    150 of each (seeds 5100000 / 5200000 on) found nothing false; a few kept here."""
    program, problems = programs.check(seed, dtype)
    assert problems == [], programs.report(program, problems)
