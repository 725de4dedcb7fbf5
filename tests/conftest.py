import contextlib
import gc
import os
import sys
import warnings

import pytest
import torch

HERE = os.path.dirname(__file__)


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite the golden DOT files under tests/golden from the current output",
    )


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden")


@pytest.fixture(autouse=True)
def _no_lens_left_behind():
    """Every test must leave torch's engine entry and the profiler as it found them."""
    original = torch.autograd._engine_run_backward
    profile = sys.getprofile()
    yield
    assert torch.autograd._engine_run_backward is original, "a Lens left torch's engine entry patched"
    assert sys.getprofile() is profile, "a Lens left a profile function installed"


def live_recorders():
    """Pass observers that still have hooks registered on some graph (there must be none).

    An observer object may outlive its pass (a traceback keeps its frame), but never its hooks.
    """
    from autograd_lens.capture.observe import PassObserver

    gc.collect()
    return [obj for obj in gc.get_objects() if type(obj) is PassObserver and (obj.handles or obj.post_hooks)]


def two_branch_lens():
    """The course example: y used twice, a hook halving y's gradient.  Returns (lens, x)."""
    import autograd_lens as al

    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens() as lens:
        y = x**2
        y.register_hook(lambda g: g * 0.5)
        z = y * 3
        w = y * 2
        out = z + w
        out.backward()
    return lens, x


@pytest.fixture
def quiet_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def assert_identical(first, second):
    assert type(first) is type(second)
    if isinstance(first, dict):
        assert first.keys() == second.keys()
        for key in first:
            assert_identical(first[key], second[key])
    elif isinstance(first, (list, tuple)):
        assert len(first) == len(second)
        for a, b in zip(first, second):
            assert_identical(a, b)
    elif isinstance(first, torch.Tensor):
        assert first.dtype == second.dtype and first.shape == second.shape and first.layout == second.layout
        if first.layout != torch.strided:
            first, second = first.to_dense(), second.to_dense()
        assert torch.equal(first, second) or (first.isnan() == second.isnan()).all() and torch.equal(
            first.nan_to_num(), second.nan_to_num()
        )
    else:
        assert first == second


def run_plain_and_traced(scenario, **lens_options):
    """Run ``scenario`` plainly and inside a Lens, from the same seed, and return
    ``(plain, traced, lens)``: each an outcome dict with the returned values (or the exception raised,
    by type and message) and every warning raised, for comparison with :func:`assert_identical`."""
    import autograd_lens as al

    def outcome(lens):
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with lens if lens is not None else contextlib.nullcontext():
                    result = {"returned": scenario()}  # one line for both runs: tracebacks in warnings match
            except Exception as error:
                result = {"raised": f"{type(error).__name__}: {error}"}
        result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        return result

    lens = al.Lens(**lens_options)
    plain, traced = [outcome(each) for each in (None, lens)]  # plain first, from the same line
    return plain, traced, lens


class Double(torch.autograd.Function):
    """A custom Function (Python backward): values behind it without hooks are unknown."""

    @staticmethod
    def forward(ctx, a):
        return a * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@pytest.fixture
def shell():
    """A real IPython shell with the extension loaded and torch imported; names made by a test are removed."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext autograd_lens", store_history=False)
    shell.run_cell("import torch", store_history=False)
    yield shell
    shell.run_cell("%unload_ext autograd_lens", store_history=False)
    for name in list(shell.user_ns):
        if not name.startswith("_") and name not in ("In", "Out", "exit", "quit", "get_ipython"):
            del shell.user_ns[name]


def anomaly_blames(program):
    """The backward function torch's anomaly mode blames for the first NaN of ``program().backward()`` (it checks
    NaN only, not inf), or None."""
    import re
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autograd.detect_anomaly():
                program().backward()
        except RuntimeError as error:
            found = re.search(r"Function '(\w+)' returned nan", str(error))
            return found.group(1) if found else None
    return None


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless (test_browser.py has its own, and skips its whole module without it)."""
    from test_browser import CHROMIUM, LAUNCH_ARGS, playwright

    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield chromium
        chromium.close()
