"""Which cell line made each backward node (``capture/lines.py``), through a real InteractiveShell.

The line of each node is checked against the statement that made it; the cell's own behaviour — values,
the displayed last expression, tracebacks, its namespace, IPython's AST transformers — is checked
against the same cell run without the lens."""

from __future__ import annotations

import re

import ast
import traceback

import pytest
import torch

from autograd_lens.capture.lines import CellLines, Marker
from autograd_lens.views.passview import PassView
from autograd_lens.views.steps import steps_for


def lens_cell(shell, body: str, options: str = "--no-show"):
    result = shell.run_cell(f"%%lens {options}\n{body}", store_history=False)
    return result, shell.user_ns["_lens"]


def lines_by_op(backward_pass) -> list[tuple[str, int | None, str | None]]:
    """(op, cell line, text) of each backward function, in graph order."""
    out = []
    for node in backward_pass.graph.nodes:
        if node.kind == "function":
            source = backward_pass.sources.get(node.id)
            out.append((node.op, source.line if source else None, source.text if source else None))
    return out


def test_each_node_gets_the_line_that_made_it_numbered_as_the_editor_shows_it(shell):
    result, lens = lens_cell(shell, (
        "x = torch.tensor([1.0, 2.0], requires_grad=True)\n"   # line 2 (the %%lens line is line 1)
        "y = x * 3\n"                                          # 3
        "z = y.exp()\n"                                        # 4
        "z.sum().backward()\n"))                               # 5
    assert result.success
    assert lines_by_op(lens.passes[0]) == [
        ("SumBackward0", 5, "z.sum().backward()"), ("ExpBackward0", 4, "z = y.exp()"), ("MulBackward0", 3, "y = x * 3")]
    assert lens.passes[0].sources_note == ""


def test_loops_branches_and_statements_over_several_lines(shell):
    result, lens = lens_cell(shell, (
        "x = torch.tensor(0.5, requires_grad=True)\n"          # 2
        "h = x\n"                                              # 3
        "for i in range(3):\n"                                 # 4
        "    if i == 1:\n"                                     # 5
        "        continue\n"                                   # 6
        "    h = h.sin()\n"                                    # 7
        "while (h * 2).item() < 100:\n"                        # 8: makes a MulBackward per test, not kept
        "    h = h * 4\n"                                      # 9
        "loss = (h\n"                                          # 10
        "        + 1)\n"                                       # 11
        "loss.backward()\n"))
    assert result.success
    ops = lines_by_op(lens.passes[0])
    assert ops[0] == ("AddBackward0", 10, "loss = (h …")
    assert [line for op, line, _ in ops if op == "MulBackward0"] == [9] * (len(ops) - 3)
    assert [line for op, line, _ in ops if op == "SinBackward0"] == [7, 7]


def test_code_run_by_a_magic_inside_the_cell_keeps_the_magic_line(shell):
    """%time compiles its statement through IPython's AST transformers again: that inner code is not the
    cell, so its nodes count as the line of the magic."""
    result, lens = lens_cell(shell, (
        "x = torch.tensor(3.0, requires_grad=True)\n"         # 2
        "y = x * 2\n"                                          # 3
        "%time z = y.exp()\n"                                  # 4
        "z.backward()\n"))
    assert result.success
    assert lines_by_op(lens.passes[0]) == [("ExpBackward0", 4, "%time z = y.exp()"), ("MulBackward0", 3, "y = x * 2")]


def test_a_function_defined_in_the_cell_counts_as_the_line_that_calls_it(shell):
    result, lens = lens_cell(shell, (
        "def f(t):\n"                                          # 2
        "    return t.tanh() * 2\n"                            # 3
        "x = torch.ones(2, requires_grad=True)\n"              # 4
        "out = f(x).sum()\n"                                   # 5
        "out.backward()\n"))
    assert result.success
    assert {line for _, line, _ in lines_by_op(lens.passes[0])} == {5}


def test_a_node_made_before_the_cell_is_said_to_be_unknown_on_its_card(shell):
    shell.run_cell("x = torch.tensor(2.0, requires_grad=True)\ny = x * 3", store_history=False)
    result, lens = lens_cell(shell, "z = y ** 2\nz.backward()")
    assert result.success
    backward_pass = lens.passes[0]
    assert lines_by_op(backward_pass) == [("PowBackward0", 2, "z = y ** 2"), ("MulBackward0", None, None)]
    cards = {step.node: step.lines for step in steps_for(backward_pass) if step.kind == "node"}
    by_op = {node.op: node.id for node in backward_pass.graph.nodes if node.kind == "function"}
    assert cards[by_op["PowBackward0"]][0] == "Made by cell line 2: z = y ** 2"
    assert cards[by_op["MulBackward0"]][0] == "Made before this cell ran, so the line that made it is not known."
    data = PassView(backward_pass).data()
    assert data["sources"] == {by_op["PowBackward0"]: "cell line 2: z = y ** 2"}  # the hover text


def test_with_lens_says_once_why_lines_are_unknown():
    import autograd_lens as al

    x = torch.tensor(2.0, requires_grad=True)
    with al.Lens(names={"x": x}) as lens:
        (x * 3).backward()
    steps = steps_for(lens.passes[0])
    assert lens.passes[0].sources == {}
    assert "Source lines: the lines of code that made the nodes are known in %%lens cells only." in steps[0].lines
    assert not any(line.startswith("Made") for step in steps[1:] for line in step.lines)


def test_a_thread_alive_during_the_cell_makes_every_line_unknown(shell):
    result, lens = lens_cell(shell, (
        "import threading\n"
        "stop = threading.Event()\n"
        "worker = threading.Thread(target=stop.wait)\n"
        "worker.start()\n"
        "x = torch.tensor(2.0, requires_grad=True)\n"
        "(x * 3).backward()\n"
        "stop.set(); worker.join()\n"))
    assert result.success
    assert lens.passes[0].sources == {}
    assert "a thread (" in lens.passes[0].sources_note


CELL = (
    "x = torch.tensor([1.0, -2.0], requires_grad=True)\n"
    "h = x\n"
    "for k in range(2):\n"
    "    h = torch.tanh(h * 1.5)\n"
    "h.register_hook(lambda g: g * 2)\n"
    "h.sum().backward()\n"
    "[float(v) for v in x.grad]\n"
)


def test_the_cell_behaves_as_without_the_lens(shell, capsys):
    """Same values, same displayed last expression, same namespace, transformers put back."""
    transformers = list(shell.ast_transformers)
    shell.user_ns.pop("_lens", None)
    plain = shell.run_cell(CELL, store_history=False)
    plain_names = set(shell.user_ns)
    plain_grad = shell.user_ns["x"].grad.clone()
    plain_shown = capsys.readouterr().out
    traced, lens = lens_cell(shell, CELL)
    assert plain.success and traced.success
    assert plain.result == [float(v) for v in plain_grad]
    assert capsys.readouterr().out == plain_shown  # the last expression still shows, as Out[n] (n: the shell's count)
    assert re.fullmatch(rf"Out\[\d+\]: {re.escape(str(plain.result))}\n", plain_shown), plain_shown
    assert torch.equal(shell.user_ns["x"].grad, plain_grad)
    assert set(shell.user_ns) - plain_names == {"_lens"}
    assert shell.ast_transformers == transformers
    assert lens.passes[0].sources  # and lines were recorded


def test_tracebacks_name_the_same_line_as_without_the_lens(shell):
    body = "x = torch.ones(2, requires_grad=True)\ny = x * 2\nraise ValueError('third line')\n"
    plain = shell.run_cell(body, store_history=False)
    traced, _ = lens_cell(shell, body)
    assert isinstance(traced.error_in_exec, ValueError)
    plain_frame = traceback.extract_tb(plain.error_in_exec.__traceback__)[-1]
    traced_frame = traceback.extract_tb(traced.error_in_exec.__traceback__)[-1]
    assert (traced_frame.lineno, traced_frame.line) == (plain_frame.lineno, plain_frame.line) == (3, body.splitlines()[2])


def test_the_marker_never_breaks_a_cell():
    """Every statement kind a cell can hold still compiles and runs the same after marking."""
    source = (
        '"""A docstring first, then a __future__ import: both must stay first."""\n'
        "from __future__ import annotations\n"
        "import contextlib\n"
        "total = 0\n"
        "for i in range(3):\n    total += i\nelse:\n    total += 10\n"
        "while total < 20:\n    total += 1\n    if total == 15:\n        break\n"
        "with contextlib.suppress(KeyError):\n    {}['missing']\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    total += 100\nelse:\n    pass\nfinally:\n    total += 1000\n"
        "match total:\n    case 1115:\n        total = 'matched'\n    case _:\n        total = 'no'\n"
        "class C:\n    a = 1\n"
        "def g():\n    return 2\n"
        "total = (total, g(), C.a)\n"
    )
    plain: dict = {}
    exec(compile(source, "<cell>", "exec"), plain)
    lines = CellLines(source, offset=0)
    tree = Marker(lines).visit(ast.parse(source))
    marked: dict = {}
    with lines:
        exec(compile(ast.fix_missing_locations(tree), "<cell>", "exec"), marked)
    assert marked["total"] == plain["total"] == ("matched", 2, 1)
    assert marked["__doc__"] == plain["__doc__"] == "A docstring first, then a __future__ import: both must stay first."
    assert lines.numbers  # statements were marked


def test_marked_code_compiles_for_every_module_of_the_standard_library():
    """Other people's code: every top-level module of the standard library, marked as a cell would be,
    still compiles (docstrings and ``from __future__`` imports stay first; every block kind is handled)."""
    import glob
    import os
    import warnings

    checked = 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                compile(source, path, "exec")
            except SyntaxError:  # (a few test files are meant not to compile)
                continue
            lines = CellLines(source)
            tree = Marker(lines).visit(ast.parse(source))
            assert not lines.unknown, (path, lines.unknown)
            compile(ast.fix_missing_locations(tree), path, "exec")
        checked += 1
    assert checked > 150


def _cell_from(function) -> str:
    """A scenario of tests/test_real_code.py as the body of a notebook cell ("return X" -> "result = X")."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(function))
    body = textwrap.dedent(source.split(":\n", 1)[1])
    assert body.count("\nreturn ") + body.startswith("return ") == 1, "one return, at the end"
    return body.replace("\nreturn ", "\nresult = ") if not body.startswith("return ") else "result = " + body[7:]


def _real_scenarios():
    import test_real_code

    return sorted(test_real_code.S)


@pytest.mark.parametrize("name", _real_scenarios())
def test_other_peoples_code_runs_the_same_in_a_lens_cell(shell, name):
    """Each real-code scenario (LSTM, conv+BN, transformer, training loops, checkpointing, …) run as a
    plain cell and as a %%lens cell, marked statement by statement: the same values, and the nodes of
    the first pass have lines of the cell."""
    import test_real_code

    cell = _cell_from(test_real_code.S[name])
    shell.user_ns.update({"torch": torch, "nn": torch.nn, "F": torch.nn.functional, "g": test_real_code.g,
                          "Double": __import__("conftest").Double})
    results = []
    for magic in ("", "%%lens --no-show\n"):
        torch.manual_seed(0)
        shell.user_ns.pop("result", None)
        outcome = shell.run_cell(magic + cell, store_history=False)
        error = outcome.error_in_exec
        results.append((type(error).__name__, str(error)) if error is not None else shell.user_ns.pop("result"))
    plain, traced = results
    assert_same(plain, traced)
    lens = shell.user_ns["_lens"]
    if lens.passes and not lens.passes[0].sources_note:
        assert lens.passes[0].sources, "lines were recorded"
        assert all(1 < s.line <= cell.count("\n") + 2 for s in lens.passes[0].sources.values())


def assert_same(first, second):
    if isinstance(first, torch.Tensor):
        assert isinstance(second, torch.Tensor) and first.dtype == second.dtype and first.shape == second.shape
        assert torch.equal(first, second) or (first.isnan() == second.isnan()).all() and torch.equal(
            first.nan_to_num(), second.nan_to_num())
    elif isinstance(first, (list, tuple)):
        assert type(first) is type(second) and len(first) == len(second)
        for a, b in zip(first, second):
            assert_same(a, b)
    else:
        assert first == second
