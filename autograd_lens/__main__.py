"""``python -m autograd_lens [SCRIPT.py] [-o trace.html]``: run a script under a Lens and write the
static stepper page.  With no script, a built-in demo (the two-branch example with a hook) runs."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

DEMO = '''\
import torch

x = torch.tensor(2.0, requires_grad=True)
y = x ** 2
y.register_hook(lambda g: g * 0.5)   # halve the gradient flowing into y
z = y * 3
w = y * 2
out = z + w
out.backward()
print(f"x.grad = {x.grad.item():g} (it would be 20 without the hook)")
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autograd_lens",
        usage="%(prog)s [-h] [-o OUTPUT] [--modules] [script [args ...]]",
        description="Run a Python script under autograd_lens and write a step-through of every backward pass "
        "as a standalone HTML page (no server, no network needed to view it).",
        epilog="Arguments after the script are passed on to it (its sys.argv[1:]), except -o/--output FILE and "
               "--modules right after it, which are the lens's (python -m autograd_lens train.py -o trace.html); "
               "put -- before the script's own -o.",
        allow_abbrev=False,
    )
    parser.add_argument("script", nargs="?", help="the script to run (default: a built-in demo)")
    parser.add_argument("-o", "--output", default="trace.html", help="where to write the page (default: trace.html)")
    parser.add_argument("--modules", action="store_true",
                        help="group the nodes by the nn.Module call that made them (adds two global forward hooks "
                             "while the script runs; torch.compile(module) then warns that global hooks exist)")
    own, script_args = _split(sys.argv[1:] if argv is None else list(argv))
    options = parser.parse_args(own)

    problem = _unwritable(options.output)
    if problem:  # say so before running a script that may take long
        parser.error(f"cannot write {options.output!r}: {problem}")
    if options.script and not os.path.isfile(options.script):
        parser.error(f"no script at {options.script!r}")

    from .capture.tracer import Lens

    lens = Lens(modules=options.modules)
    error: BaseException | None = None
    saved_argv = sys.argv
    try:
        with lens:
            if options.script:
                sys.argv = [options.script, *script_args]
                runpy.run_path(options.script, run_name="__main__")
            else:
                exec(compile(DEMO, "<autograd_lens demo>", "exec"), {"__name__": "__main__"})
    except SystemExit as raised:  # `sys.exit(main())`: the usual end of a script
        if raised.code not in (None, 0):
            error = raised
    except Exception as raised:  # still write what was recorded up to the error
        error = raised
    finally:
        sys.argv = saved_argv
    if error is not None and not isinstance(error, SystemExit):
        _print_traceback(error, options.script)  # as Python prints it: from the script's own frames
    code = (error.code if isinstance(error.code, int) else 1) if isinstance(error, SystemExit) else int(error is not None)
    stopped = "" if error is None else (f" stopped with {type(error).__name__}" + (f": {error}" if str(error) else "")
                                         + " and")
    if not lens.passes:
        print(f"autograd_lens: the script{stopped} ran no backward pass, so there is nothing to show: no page written.",
              file=sys.stderr)
        return code or 1
    lens.to_html(options.output)
    calls = len(lens.hook_calls)
    done = f"wrote {options.output} ({len(lens.passes)} backward pass(es), {calls} hook call(s))"
    if error is not None:
        print(f"autograd_lens: the script{stopped} {done}, with what ran before the error", file=sys.stderr)
        return code
    print(f"autograd_lens: {done}")
    return 0


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The lens's part of the command line, and the script's arguments: the options before the
    script, and -o/--output FILE and --modules (spelled in full) right after it, up to a ``--`` or the first other
    argument; everything after that is the script's, its ``--help`` and ``-o`` included."""
    lens, index = [], 0
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
        takes_value = argv[index] in ("-o", "--output")
        lens.extend(argv[index:index + 1 + takes_value])
        index += 1 + takes_value
    if index < len(argv) and argv[index] == "--":
        index += 1
    if index >= len(argv):
        return lens, []
    lens.append(argv[index])  # the script
    rest, index = argv[index + 1:], 0
    while index < len(rest) and (rest[index] in ("-o", "--output", "--modules") or rest[index].startswith("--output=")):
        takes_value = rest[index] in ("-o", "--output")
        lens.extend(rest[index:index + 1 + takes_value])
        index += 1 + takes_value
    if index < len(rest) and rest[index] == "--":
        index += 1
    return lens, rest[index:]


def _print_traceback(error: BaseException, script: str | None) -> None:
    """The traceback Python would print for the script: the frames before the script's first one (runpy, this
    module) are left out."""
    import traceback

    target = os.path.abspath(script) if script else "<autograd_lens demo>"
    tb = error.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target \
            and tb.tb_frame.f_code.co_filename != target:
        tb = tb.tb_next
    lines = traceback.format_exception(type(error), error, tb if tb is not None else error.__traceback__)
    sys.stderr.write("".join(lines))


def _unwritable(path: str) -> str:
    """Why ``path`` cannot be written, or ``""``."""
    if os.path.isdir(path):
        return "it is a folder"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or os.path.exists(path) and not os.access(path, os.W_OK):
        return "permission denied"
    return ""


if __name__ == "__main__":
    sys.exit(main())
