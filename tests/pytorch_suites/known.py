"""Tests of PyTorch's suites whose outcome or warnings differ under a Lens, each with its reason.

Keys are test ids without the file part (``Class::test``).  Kinds:

``lens-defect``  the lens changes what the test observes; being fixed (xfail(strict=True) in CI)
``observer``     the test checks something any observer changes (internal counters, refcounts,
                 timing); not a lens defect (not counted in CI, with the reason)

Each reason names the repro in RESULTS.md (D1..D4); D1, D3 and D4 were fixed in abd19a4, D2 by capture/late.py, and
left this list: it is empty now.
"""

KNOWN: dict[str, tuple[str, str]] = {}
