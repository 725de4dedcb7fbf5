"""Tests of PyTorch's suites whose outcome or warnings differ under a Lens, each with its reason.

Keys are test ids without the file part (``Class::test``).  Kinds:

``lens-defect``  the lens changes what the test observes; being fixed (xfail(strict=True) in CI)
``observer``     the test checks something any observer changes (internal counters, refcounts,
                 timing); not a lens defect (not counted in CI, with the reason)

Each reason names the repro in RESULTS.md (D1..D4); D1, D3 and D4 were fixed in abd19a4 and left this list.
"""

KNOWN: dict[str, tuple[str, str]] = {
    "TestAutograd::test_node_post_hook_registered_during_unpack_hook": (
        "lens-defect",
        "D2: a node post-hook registered while the node unpacks a saved tensor receives non-None grad_inputs: the "
        "lens's own post-hook on every node makes the engine keep the node's inputs (has_post_hooks is decided "
        "before the node runs)",
    ),
}
