"""The evidence a pass keeps for ``unreached`` (debug/evidence.collect), made without a frozen dataclass's setattr
per field and without a copy of the graph's consumer keys, is what the general way makes: compared field by field
(and by repr and hash) with the code as it was, on namespaces with leaves, named intermediates, frozen parameters,
detached copies and a parameter frozen after the forward."""

from __future__ import annotations

import dataclasses

import torch

import autograd_lens as al
from autograd_lens.capture.names import names_from
from autograd_lens.capture.structure import structure
from autograd_lens.debug import DebugRecording, evidence
from autograd_lens.debug.evidence import Candidate, Evidence


def _general(shape, names, recorder=None):
    """``collect`` as it was, for the passes where every named tensor is reachable or the general path runs."""
    leaf_ids = {id(fn.variable) for fn in shape.leaves.values()}
    consumed = set(shape.consumers) | {(id(fn), nr) for fn, nr in shape.root_edges}
    candidates, missing = [], []
    for tensor in names.tensor_objects:
        name = names.tensors[id(tensor)]
        frozen = isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad
        if not (tensor.requires_grad or frozen):
            continue
        fn = tensor.grad_fn
        reachable = id(tensor) in leaf_ids if fn is None else (id(fn), tensor.output_nr) in consumed
        if reachable:
            node = None if fn is None else (fn._sequence_nr(), fn.name())
            # requires_grad as it is: a parameter frozen after the forward is reachable and False (the code as it
            # was wrote True for every reachable one, which made --why say no gradient reached it: 810921d)
            candidates.append(Candidate(name, fn is None, tensor.requires_grad, True, node, tensor.output_nr))
        else:
            missing.append(name)
    return candidates, missing


def _namespaces():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model[2].bias.requires_grad_(False)  # frozen before the forward
    x = torch.randn(5, 3)
    hidden = model[1](model[0](x))
    a, b = hidden.split(2, dim=1)  # two outputs of one node, both named
    side = hidden.detach().requires_grad_()  # off the graph
    loss = model[2](hidden).sum() + a.mean() * 2
    yield loss, {"model": model, "x": x, "hidden": hidden, "a": a, "b": b, "side": side, "loss": loss}
    w = torch.nn.Parameter(torch.randn(3))
    y = (w * 2).sum()
    w.requires_grad_(False)  # frozen after the forward: still the graph's leaf
    yield y, {"w": w, "y": y, "n": torch.ones(2)}


def test_collect_makes_the_general_candidates():
    for root, namespace in _namespaces():
        shape = structure((root,))
        names = names_from(namespace)
        shape.label(names, [None])
        found = evidence.collect(shape, names)
        made, missing = _general(shape, names)
        mine = [c for c in found.candidates if c.reachable]
        assert mine == made
        assert [repr(c) for c in mine] == [repr(c) for c in made]  # the same fields, in the same order
        assert [hash(c) for c in mine] == [hash(c) for c in made]
        assert [list(vars(c).items()) for c in mine] == [list(vars(c).items()) for c in made]
        assert all(type(c) is Candidate for c in mine)
        assert [c.name for c in found.candidates if not c.reachable] == missing
    assert any(c.name == "w" and c.reachable for c in found.candidates)  # the leaf frozen after the forward


def test_before_pass_says_what_it_said():
    root, namespace = next(_namespaces())

    class Observer:
        shape = structure((root,))
        seed_objects = ()

        def ensure_names(self):
            names = names_from(namespace)
            self.shape.label(names, [None])
            return names

    for why in (False, True):
        recording = DebugRecording(why)
        recording.start()
        try:
            made = recording.before_pass(Observer())
        finally:
            recording.stop()
        assert isinstance(made, Evidence)
        if not why:
            assert made.paths_note == ("paths are followed while the graph is alive, in a Lens(why=True) or a "
                                       "%%lens --why cell")
            assert made == dataclasses.replace(evidence.collect(Observer.shape, Observer().ensure_names()),
                                               paths_note=made.paths_note)
        else:
            assert "%%lens" not in made.paths_note


def test_unreached_answers_unchanged():
    """The answers read from the evidence, through a Lens (compared with what torch computed)."""
    for root, namespace in _namespaces():
        with al.Lens(names=namespace) as lens:
            root.backward()
        unreached = lens.passes[0].unreached
        for name, tensor in namespace.items():
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad and tensor.grad_fn is None:
                assert (name in unreached) == (tensor.grad is None), name
