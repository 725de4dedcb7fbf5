"""Code Python's garbage collector runs during a NESTED backward (a backward run inside a pass: reentrant
checkpointing's recompute, a hook that calls torch.autograd.grad) is no hook: an object's ``__del__`` (freed as
the nested engine releases what a node saved) or a ``gc.callbacks`` function (a collection the nested engine's own
allocation started) has the nested engine's frame as its caller, as a hook has.

Was false: the pass's note said "hooks ran inside a nested backward run by CheckpointFunctionBackward ...: Box.__del__"
(or "on_collect"), naming them hooks that ran there; the outer pass already left them out (calls._begin).  The
user's real hooks in the nested backward are still named (nested._collector_call).

Each test first checks that the collector really ran with the nested engine as its caller, with and without the lens.
"""

from __future__ import annotations

import gc
import sys

import torch
from torch.utils.checkpoint import checkpoint

import autograd_lens as al

NESTED = "hooks ran inside a nested backward"
ENGINE = "_engine_run_backward"  # the code of the frame that runs torch's engine (torch.autograd.graph)


def _nested_note(lens):
    (backward_pass,) = lens.passes
    found = [n for n in backward_pass.notes if n.startswith(NESTED)]
    assert len(found) <= 1, backward_pass.notes
    return found[0] if found else None


def _hooks_named(note):
    """The hooks the note names: 'not recorded as steps of this pass: a; b; values without hooks ...'."""
    listed = note.split("not recorded as steps of this pass: ", 1)[1].rsplit("; values without hooks", 1)[0]
    return listed.split("; ")


class Box:
    """What a saved-tensor pack hook returns: freed (``__del__``) when the engine releases the node's saved tensors."""

    def __init__(self, log, tensor):
        self.log, self.tensor = log, tensor

    def __del__(self):
        self.log.append(("__del__", sys._getframe(1).f_code.co_name))


def _checkpointed(log, hooked_inside):
    """x, w through a reentrant checkpoint whose recompute saves y*w's inputs in Boxes; with ``hooked_inside`` a
    tensor hook in the recomputed part doubles y's gradient."""
    recomputing = []

    def doubled(g):
        log.append("doubled")
        return g * 2

    def block(x, w):
        y = x * 3
        if not recomputing:
            return (y * w).sin()
        if hooked_inside:
            y.register_hook(doubled)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: Box(log, t), lambda box: box.tensor):
            z = y * w  # saves y and w: two Boxes
        return z.sin()

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([0.5, 0.25], requires_grad=True)
    out = checkpoint(block, x, w, use_reentrant=True)
    recomputing.append(True)
    return x, w, out


def test_a_del_run_as_a_reentrant_checkpoints_nested_backward_frees_a_saved_tensor_is_no_hook():
    logs = []
    for traced in (False, True):
        log = []
        x, w, out = _checkpointed(log, hooked_inside=True)
        if traced:
            with al.Lens() as lens:
                out.sum().backward()
        else:
            out.sum().backward()
        logs.append((log, x.grad, w.grad))
    (plain_log, plain_x, plain_w), (log, traced_x, traced_w) = logs
    assert torch.equal(plain_x, traced_x) and torch.equal(plain_w, traced_w)
    assert plain_log == log == [("__del__", ENGINE), ("__del__", ENGINE), "doubled"]  # the engine freed the Boxes
    assert _hooks_named(_nested_note(lens)) == ["doubled"]  # was: ["Box.__del__", "doubled"]


def test_with_no_hook_in_the_nested_backward_a_del_there_makes_no_note_and_no_value_is_guessed():
    log = []
    x, w, out = _checkpointed(log, hooked_inside=False)
    with al.Lens() as lens:
        (out * 2).sum().backward()
    assert log == [("__del__", ENGINE), ("__del__", ENGINE)]
    assert _nested_note(lens) is None  # was: "hooks ran inside a nested backward ...: Box.__del__"
    (backward_pass,) = lens.passes
    assert backward_pass.hook_calls == ()
    x2, w2, out2 = _checkpointed([], hooked_inside=False)
    (out2 * 2).sum().backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    for name, value in backward_pass.grads_without_hooks.items():  # no hook: the same as .grad, or not known
        assert value is None or torch.equal(value, backward_pass.leaf_grads[name]), (name, value)


def test_a_gc_callback_a_collection_started_by_the_nested_engine_runs_is_no_hook():
    log = []

    def on_collect(phase, info):
        if phase == "start":
            log.append(("on_collect", sys._getframe(1).f_code.co_name))

    def release(g):  # collect at every allocation from now on: the nested engine's next one starts a collection
        log.append("release")
        gc.set_threshold(1)

    def post(grad_inputs, grad_outputs):  # the engine wraps 2 + 1 gradients and 2 tuples to call it: a collection
        log.append("post")

    recomputing = []

    def block(x, w):
        y = x * 3
        z = y * w
        if recomputing:
            z.register_hook(release)
            z.grad_fn.register_hook(post)
        return z.sin()

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([0.5, 0.25], requires_grad=True)
    out = checkpoint(block, x, w, use_reentrant=True)
    recomputing.append(True)
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collect)
    try:
        with al.Lens() as lens:
            out.sum().backward()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collect)
    assert ("on_collect", ENGINE) in log, log  # a collection the nested engine's allocation started
    assert log.index(("on_collect", ENGINE)) < log.index("post")
    assert _hooks_named(_nested_note(lens)) == ["release", "post"]  # was: ["release", "on_collect", "post"]


def test_a_del_in_the_nested_backward_of_a_hook_that_calls_autograd_grad_is_no_hook():
    """A hook on the outer graph runs torch.autograd.grad on another graph, whose saved tensors are Boxes and which
    has a hook of its own: that hook is named, the Boxes' __del__ is not."""
    def program(log):
        a = torch.tensor([1.0, -2.0], requires_grad=True)
        inner_leaf = torch.tensor([3.0, 4.0], requires_grad=True)

        def inner_hook(g):
            log.append("inner_hook")
            return g * 3

        def outer_hook(g):
            with torch.enable_grad():  # (grad mode is off inside a hook)
                with torch.autograd.graph.saved_tensors_hooks(lambda t: Box(log, t), lambda box: box.tensor):
                    u = inner_leaf * inner_leaf  # saves inner_leaf twice: two Boxes
                u.register_hook(inner_hook)
                (inner,) = torch.autograd.grad(u.sum(), [inner_leaf])
            log.append(("grad", inner.tolist()))
            return g + 1

        b = a * 2
        b.register_hook(outer_hook)
        b.sum().backward()
        return a.grad

    plain_log, log = [], []
    plain = program(plain_log)
    with al.Lens() as lens:
        traced = program(log)
    assert torch.equal(plain, traced)
    assert plain_log == log == ["inner_hook", ("__del__", ENGINE), ("__del__", ENGINE), ("grad", [18.0, 24.0])]
    assert _hooks_named(_nested_note(lens)) == ["inner_hook"]  # was: ["inner_hook", "Box.__del__"]
