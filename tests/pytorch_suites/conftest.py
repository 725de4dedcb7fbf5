"""Keep the PyTorch suites out of the project's own test run.

They run only through ``run.py`` (which sets ``AUTOGRAD_LENS_SUITE=1``); a plain ``python -m pytest``
of the project never collects ``upstream/`` nor imports the runner modules as doctests.
"""

import os

if not os.environ.get("AUTOGRAD_LENS_SUITE"):
    collect_ignore_glob = ["upstream/*", "*.py"]
