"""The IPython doors, exercised through a real InteractiveShell."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import autograd_lens


SETUP = """
import torch
x = torch.tensor(2.0, requires_grad=True)
y = x ** 2
z = y * 3
w = y * 2
out = z + w
"""


def test_lens_graph_draws_names_from_the_notebook(shell):
    shell.run_cell(SETUP)
    result = shell.run_cell("g = %lens_graph out --legend")
    assert result.success
    graph = shell.user_ns["g"]
    assert isinstance(graph, autograd_lens.Graph)
    assert [n.label for n in graph.nodes if n.is_tensor] == ["out", "z", "w", "y", "x"]
    assert graph.options.legend


def test_lens_graph_dot_option_prints(shell, capsys):
    shell.run_cell(SETUP)
    shell.run_cell("%lens_graph out --dot --direction backward")
    printed = capsys.readouterr().out
    assert printed.startswith("digraph autograd") and "rankdir=RL" in printed


def test_lens_graph_bad_expression_is_a_message_not_a_traceback(shell, capsys):
    """Bad input fails the cell with one line and no traceback (a UsageError, as %%lens's): Run All stops there, not
    at a later cell that uses what the line did not draw."""
    result = shell.run_cell("%lens_graph not_defined_anywhere")
    said = capsys.readouterr()
    shown = said.out + said.err + str(result.error_in_exec or "")
    assert not result.success and "could not evaluate" in shown and "NameError" in shown and "Traceback" not in shown
    shell.run_cell("import torch\nplain = torch.ones(2)")
    result = shell.run_cell("g = %lens_graph plain")
    said = capsys.readouterr()
    assert not result.success and "does not require grad" in said.out + said.err + str(result.error_in_exec)
    assert "g" not in shell.user_ns
    assert shell.run_cell("x = torch.ones(2, requires_grad=True)\ng = %lens_graph (x * 2).sum()").success


def test_lens_graph_help_documents_options(shell):
    doc = shell.find_line_magic("lens_graph").__doc__
    for option in ("--max-elements", "--max-nodes", "--direction", "--legend", "--no-saved", "--dot"):
        assert option in doc


def test_lens_cell_records_and_binds_the_lens(shell):
    cell = """
a = torch.tensor(2.0, requires_grad=True)
b = a ** 2
b.register_hook(lambda g: g * 0.5)
(b * 3 + b * 2).backward()
"""
    shell.run_cell("import torch")
    result = shell.run_cell(f"%%lens --as L --no-show\n{cell}")
    assert result.success
    lens = shell.user_ns["L"]
    (call,) = lens.hook_calls
    assert call.target == "b" and float(call.grad_in) == 5.0 and float(call.grad_out) == 2.5
    assert float(shell.user_ns["a"].grad) == 10.0
    assert float(lens.passes[0].grads_without_hooks["a"]) == 20.0


def test_lens_cell_default_name_and_partial_trace_on_error(shell, capsys):
    shell.run_cell("import torch")
    shell.run_cell(
        "%%lens\n"
        "c = torch.tensor(1.0, requires_grad=True)\n"
        "d = c * 2\n"
        "d.register_hook(lambda g: 1 / 0)\n"
        "d.backward()\n"
    )
    captured = capsys.readouterr()
    assert "ZeroDivisionError" in captured.out + captured.err
    lens = shell.user_ns["_lens"]
    assert lens.passes[0].error.type == "ZeroDivisionError"
    assert torch.autograd._engine_run_backward is torch.autograd.graph._engine_run_backward
    # the kernel is still usable
    assert shell.run_cell("1 + 1").result == 2


def test_lens_help_documents_options(shell):
    doc = shell.find_cell_magic("lens").__doc__
    for option in ("--as", "--no-show", "--store-limit", "--max-elements", "--max-nodes"):
        assert option in doc


def test_lens_rejects_a_bad_name(shell, capsys):
    result = shell.run_cell("%%lens --as 3x\npass\n")
    assert not result.success  # the cell did not run: Run All stops here
    said = capsys.readouterr()
    assert "--as needs a Python name" in said.out + said.err and "Traceback" not in said.out + said.err


def test_unload_removes_the_magics(shell):
    shell.run_cell("%unload_ext autograd_lens")
    assert shell.find_line_magic("lens_graph") is None
    assert shell.find_cell_magic("lens") is None
    shell.run_cell("%load_ext autograd_lens")
    assert shell.find_line_magic("lens_graph") is not None


def test_lens_cell_without_backward_says_so(shell):
    shown = []
    shell.display_pub.publish = lambda data, metadata=None, **kwargs: shown.append(data)
    try:
        shell.run_cell("%%lens\nimport torch\nt = torch.ones(2) * 3\n")
    finally:
        del shell.display_pub.publish
    assert len(shown) == 1
    assert "No backward pass was recorded" in shown[0]["text/html"]
    assert shown[0]["text/plain"] == "<autograd_lens.Lens: 0 backward passes, 0 hook calls>"


def test_lens_magic_predict_option(shell):
    shell.run_cell("import torch")
    result = shell.run_cell(
        "%%lens --predict --as guess\nx = torch.tensor(2.0, requires_grad=True)\n(x * x).backward()"
    )
    assert result.success
    assert shell.user_ns["x"].grad.item() == 4.0  # the cell ran as usual
    from autograd_lens.views.steps import steps_for

    lens = shell.user_ns["guess"]
    assert [s.question.answer for s in steps_for(lens.passes[0]) if s.question] == [(4.0,), (4.0,)]  # what x receives from mul in all (two uses add), then x.grad
