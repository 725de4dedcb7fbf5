"""A module with backward hooks given the same tensor more than once.

A module's full backward hooks (and pre-hooks) make torch wrap the module's inputs and outputs in a
``BackwardHookFunction``, which hands the module's forward one new tensor object per argument.  A module called with
the same tensor in several arguments (``attention(x, x, x)``) then no longer sees one tensor, and a forward that
checks (``nn.MultiheadAttention``: ``query is key``, self-attention's packed projection) computes in other steps
than it would with no hook: its numbers can differ in their last bits.  The replay without hooks starts from the
pass that ran, so in such a pass no value without hooks is known (the reason below says why).
"""

from __future__ import annotations

from typing import Any

BOUNDARY = "BackwardHookFunctionBackward"
REPEATED = ("a module with backward hooks was given the same tensor more than once (as in attention(x, x, x)): torch "
            "hands its forward a new tensor object for each argument, so the forward no longer sees one tensor "
            "(nn.MultiheadAttention then projects query, key and value separately) and may compute in other steps; "
            "without hooks the numbers can differ in their last bits, and the lens cannot know them")


def repeated(unhooked: Any, shape: Any, boundaries: list) -> None:
    """Before the pass: ``unhooked.repeated`` says why, when a boundary of ``boundaries`` (the pass's
    ``BackwardHookFunctionBackward`` nodes) sends two of its gradients to the same input: one tensor given twice.
    Nothing to read without a boundary (the usual pass): ``shape.next_of()`` is built only when there is one."""
    if not boundaries:
        return
    nexts = shape.next_of()
    for fn in boundaries:
        edges = [(id(target), nr) for target, nr in nexts.get(id(fn), ()) if target is not None]
        if len(set(edges)) < len(edges):
            unhooked.repeated = REPEATED
            return
