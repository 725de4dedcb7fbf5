"""Which torch and Python the lens serves, and what else may be profiling the process.

Kept free of torch imports and of syntax newer than Python 3.7, so that ``import autograd_lens`` can say in one
line what is needed on any interpreter instead of failing somewhere inside.
"""

from __future__ import annotations

import os
import sys

# Declared = tested: pyproject.toml's requirement is exactly this range, and CI runs its lowest and highest torch.
MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 13, 0)
BELOW_TORCH = (2, 16)  # the first release not tested (pyproject: torch<2.16)
TESTED_TORCH = ("2.13.0", "2.15.0")  # CI: .ci/run (2.13.0) and .ci/matrix
REQUIREMENT = "torch>=2.13,<2.16"


def parse(version: str) -> tuple:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; ``"2.16.0a0+git1234"`` -> ``(2, 16, 0)``: the release numbers only."""
    numbers = []
    for part in str(version).split("+")[0].split(".")[:3]:
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def torch_version() -> str:
    """The running torch's version: ``torch.__version__`` (importing torch, as the lens does anyway)."""
    import torch

    return str(torch.__version__)


def python_version() -> tuple:
    return tuple(sys.version_info[:3])


def _dotted(numbers: tuple) -> str:
    return ".".join(str(number) for number in numbers)


def unsupported() -> str | None:
    """One line saying what is needed when this Python or torch is below the declared range, else None."""
    python = python_version()
    if python[:2] < MIN_PYTHON:
        return (f"autograd_lens needs Python >= {_dotted(MIN_PYTHON)}; this is Python {_dotted(python)}: "
                "nothing was loaded")
    try:
        version = torch_version()
    except ImportError:
        return f"autograd_lens needs torch ({REQUIREMENT}), which is not installed: nothing was loaded"
    if parse(version) < MIN_TORCH:
        return (f"autograd_lens needs torch >= {_dotted(MIN_TORCH)}; this is torch {version}: nothing was loaded "
                f"(pip install \"{REQUIREMENT}\")")
    return None


def refuse() -> str | None:
    """For ``autograd_lens/__init__.py``: None on a supported torch and Python.  Below the range: raise
    ``ImportError`` with one line, except while IPython's ``%load_ext`` imports the package, where the line is
    returned instead (the package then loads nothing, and ``load_ipython_extension`` shows the line as IPython's
    one-line ``UsageError`` rather than a traceback)."""
    problem = unsupported()
    if problem is None or (os.environ.get("AUTOGRAD_LENS_ANY_TORCH") == "1" and "torch" in problem.split(";")[0]):
        return None  # AUTOGRAD_LENS_ANY_TORCH=1: load on an older torch anyway, to see what `selfcheck` says there
    if _imported_by_load_ext():
        return problem
    raise ImportError(problem)


def refused_in_ipython(problem: str) -> None:
    """``%load_ext autograd_lens`` below the range: one line, nothing registered."""
    from IPython.core.error import UsageError

    raise UsageError(problem)


def _imported_by_load_ext() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_load_extension" and code.co_filename.replace("\\", "/").endswith("core/extensions.py"):
            return True
        frame = frame.f_back
    return False


def untested() -> str | None:
    """A line saying this torch is newer than any the lens was tested with (it loads; ``selfcheck`` tells more)."""
    version = torch_version()
    if parse(version)[:2] >= BELOW_TORCH:
        return (f"torch {version} is newer than any torch autograd_lens was tested with (up to "
                f"{TESTED_TORCH[-1]}): run `python -m autograd_lens.selfcheck` to see what is exact here")
    return None


def other_profiler() -> str | None:
    """What else is profiling this thread, or None; named for the lens's note.

    ``sys.setprofile`` holds one function per thread: cProfile and ``%prun`` use it up to Python 3.11, yappi on
    every Python (from C, with no object: ``sys.getprofile()`` says None, so yappi itself is asked).  From Python
    3.12 cProfile and ``%prun`` register a ``sys.monitoring`` tool instead, and ``sys.getprofile()`` is None while
    they profile: the profiler slot of ``sys.monitoring`` is read too (line_profiler 5 takes it there as well; up
    to 3.11 it traces with ``sys.settrace``, and it and the lens do not share a slot).  What the lens must not do
    while one of them runs is in ``capture/snapshot.py`` (``_enter_dispatch``) and tests/test_profilers.py.
    """
    function = sys.getprofile()
    if function is not None:
        return f"{_owner(function)} through sys.setprofile"
    yappi = sys.modules.get("yappi")  # sets its profile function from C with no object: getprofile() says None
    try:
        if yappi is not None and yappi.is_running():
            return "yappi"
    except Exception:  # another module by that name, or a yappi that cannot say: not known to be running
        pass
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.get_tool(monitoring.PROFILER_ID)
        if tool is not None:
            return f"the sys.monitoring profiler {tool!r}"
    return None


def _owner(function: object) -> str:
    """``cProfile.Profile`` for cProfile's profiler object, ``module.name`` for a Python profile function."""
    named = function if getattr(function, "__qualname__", None) and getattr(function, "__module__", None) \
        else type(function)
    name = f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', '?')}"
    return "torch.profiler with_stack=True" if name == "builtins.TraceContext" else name  # torch's C type


_SKIPPED_BY_DYNAMO: dict = {}  # names of the lens's modules whose code torch.compile is told to run as written
_MODULES_SEEN = [0]  # len(sys.modules) when the lens's modules were last marked
RUN_ALONE: list = []  # code of the lens's hooks and profile function: all they call runs as written (no user code)


def skipped_by_dynamo() -> None:
    """Tell ``torch.compile`` to run the lens's own code as written, once ``torch._dynamo`` is imported.

    While compiled code runs (a compiled training step that calls ``backward()``, a compiled module's forward, or its
    recompute by reentrant checkpointing inside backward), dynamo compiles every Python frame that starts there: the
    lens's profile function, its node hooks, its records' dataclass methods and its wrapper of ``Tensor.register_hook``
    run there too.  Compiled, ``late.tensor_registered`` took another branch than as written, a record's ``__init__``
    failed inside the lens's dispatch guard, dynamo warned about what it could not trace and counted the frames
    towards the user's recompile limits.  Each code object of the lens's modules (functions, methods, the methods
    dataclasses generate, code nested in them) is marked to be skipped by dynamo (``torch._dynamo.skip_code``'s
    strategy, for that frame only: the user's hooks the lens calls are compiled or not as without the lens), and
    the lens's directory is put on dynamo's skip list.  Imports nothing: a program that never uses ``torch.compile``
    never imports dynamo; modules of the lens imported later are marked at the next pass."""
    if len(sys.modules) == _MODULES_SEEN[0]:  # no module imported since the last look: nothing new to mark
        return
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    if trace_rules is None:
        return
    _MODULES_SEEN[0] = len(sys.modules)
    try:
        frames = sys.modules["torch._C._dynamo"].eval_frame
        strategy = frames._FrameExecStrategy(frames._FrameAction.SKIP, frames._FrameAction.DEFAULT)
        alone = frames._FrameExecStrategy(frames._FrameAction.SKIP, frames._FrameAction.SKIP)
    except Exception:  # another torch: the skip list alone
        strategy = alone = None
    if not _SKIPPED_BY_DYNAMO:
        try:
            trace_rules.add(_PACKAGE)
        except Exception:  # another torch: the marks alone
            pass
    seen: set = set()
    for name, module in list(sys.modules.items()):
        if name.startswith(_PACKAGE) and name not in _SKIPPED_BY_DYNAMO:
            _SKIPPED_BY_DYNAMO[name] = True
            if strategy is not None:
                for code in _codes(vars(module).values(), name, seen):
                    try:
                        frames.set_code_exec_strategy(code, strategy)
                    except Exception:  # a code object it refuses: the skip list covers its file
                        pass
    for code in RUN_ALONE if alone is not None else ():  # and what they call (torch's, the standard library's)
        try:
            frames.set_code_exec_strategy(code, alone)
        except Exception:
            pass


_PACKAGE = __name__.split(".")[0]


def _codes(values, module: str, seen: set):
    """Code objects defined in ``module``: its functions and classes (methods, properties, generated dataclass
    methods) and the code nested in them (lambdas, comprehensions, inner functions)."""
    stack = list(values)
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (staticmethod, classmethod)):
            stack.append(value.__func__)
        elif isinstance(value, property):
            stack += [value.fget, value.fset, value.fdel]
        elif isinstance(value, type):
            if value.__module__ == module:
                stack += list(vars(value).values())
        elif hasattr(value, "__code__") and getattr(value, "__module__", None) == module:
            stack.append(value.__code__)
        elif type(value).__name__ == "code":
            yield value
            stack += [const for const in value.co_consts if type(const).__name__ == "code"]
