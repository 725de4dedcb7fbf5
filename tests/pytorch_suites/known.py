"""Tests of PyTorch's suites whose outcome or warnings differ under a Lens, each with its reason.

Keys are test ids without the file part (``Class::test``).  Kinds:

``lens-defect``  the lens changes what the test observes; being fixed (xfail(strict=True) in CI)
``observer``     the test checks something any observer changes (internal counters, refcounts,
                 timing); not a lens defect (skipped in CI, with the reason)
"""

KNOWN: dict[str, tuple[str, str]] = {}
