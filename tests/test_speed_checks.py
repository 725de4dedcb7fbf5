"""Two checks a hooked pass makes, made with less work (issue #24), answer as their general forms do.

``values_equal`` of two unequal floating tensors computes the NaN-aware comparison only when the first holds a NaN;
``shared.shared_leaves`` compares the memory of leaves' ``.grad`` within one storage, not every pair of leaves.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import torch

from autograd_lens.capture.shared import shared_leaves, span_of
from autograd_lens.model import values_equal

SPECIAL = [0.0, -0.0, 1.0, -1.5, float("nan"), float("inf"), float("-inf"), 1e-45]


def _general_equal(first, second) -> bool:
    """values_equal's tensor case as it was before the cut (commit cfbce34)."""
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    if torch.equal(first, second):
        return True
    if first.is_floating_point() or first.is_complex():
        return bool(((first == second) | (first.isnan() & second.isnan())).all())
    return False


def test_values_equal_answers_as_the_nan_aware_comparison():
    rng = random.Random(0)
    pairs = []
    for a, b in itertools.product(SPECIAL, repeat=2):
        pairs.append((torch.tensor([a, 2.0]), torch.tensor([b, 2.0])))
        pairs.append((torch.tensor([2.0, a]), torch.tensor([b, 2.0])))
        pairs.append((torch.tensor([complex(a, 1.0)]), torch.tensor([complex(b, 1.0)])))
    for _ in range(300):
        shape = rng.choice([(3,), (2, 3), ()])
        first = torch.tensor([rng.choice(SPECIAL) for _ in range(6)])[: torch.Size(shape).numel()].reshape(shape)
        second = first.clone()
        for index in range(second.numel()):
            if rng.random() < 0.3:
                second.view(-1)[index] = rng.choice(SPECIAL)
        dtype = rng.choice([torch.float32, torch.float64, torch.float16, torch.complex64])
        pairs.append((first.to(dtype), second.to(dtype)))
        pairs.append((second.to(dtype), first.to(dtype)))
    pairs.append((torch.tensor([1, 2]), torch.tensor([1, 3])))  # integers: exact
    pairs.append((torch.tensor([1.0, 2.0]).expand(3, 2), torch.tensor([[1.0, 2.0]] * 3)))  # strides differ
    verdicts = [values_equal(a, b) for a, b in pairs]
    assert verdicts == [_general_equal(a, b) for a, b in pairs]
    assert any(verdicts) and not all(verdicts)
    assert values_equal(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not values_equal(torch.tensor([1.0, 1.0]), torch.tensor([float("nan"), 1.0]))


def _general_found(spans: dict) -> set:
    """shared_leaves' first set as it was before the cut: every pair of leaves compared."""
    return {key for key, (ptr, start, end) in spans.items()
            for other, (ptr2, start2, end2) in spans.items()
            if other != key and ptr == ptr2 and start < end2 and start2 < end}


def test_leaves_sharing_memory_are_the_pairs_the_quadratic_comparison_finds():
    rng = random.Random(1)
    shared = 0
    for _ in range(50):
        buffers = [torch.zeros(24) for _ in range(rng.randint(1, 4))]
        grads = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.2:
                grads.append(None)
            elif kind < 0.4:
                grads.append(torch.zeros(4))
            else:
                buffer = rng.choice(buffers)
                start = rng.randint(0, 20)
                grads.append(buffer[start:start + rng.randint(0, 24 - start)])
        leaves = {100 + index: SimpleNamespace(variable=SimpleNamespace(grad=grad)) for index, grad in enumerate(grads)}
        observer = SimpleNamespace(shape=SimpleNamespace(leaves=leaves))
        spans = {key: span_of(fn.variable.grad) for key, fn in leaves.items() if fn.variable.grad is not None}
        spans = {key: span for key, span in spans.items() if span is not None}
        found = shared_leaves(observer, set())
        assert found == _general_found(spans)
        shared += bool(found)
    assert 10 < shared < 50  # some draws share memory, some do not
