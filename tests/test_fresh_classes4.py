"""Fresh eyes on what the pictures and the step texts say (helper ``fresh4``, 2026-11-28): each class of program is
run under ``%%lens`` (or a ``Lens``), and the statements of its drawing (DOT), its steps and its cards are compared
with what plain PyTorch computes for the same program.  Classes where something false was said were fixed (the
section says what it said before); the rest stay as differential tests."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import autograd_lens as al
from autograd_lens.views.passview import views_for


def lens_cell(shell, body: str, name: str = "L"):
    """Run ``body`` as a ``%%lens`` cell (exactly as given: blank lines kept) and return its Lens."""
    result = shell.run_cell(f"%%lens --as {name} --no-show\n{body}")
    assert result.success, result.error_in_exec
    return shell.user_ns[name]


def made_by(step) -> str | None:
    for line in step.lines:
        if line.startswith("Made by cell line "):
            return line[len("Made by "):]
    return None


# --- 1. cell lines when the cell starts with blank lines -----------------------------------------------------------
# Was false: IPython drops a cell's leading blank lines before compiling it, so the statements' line numbers count
# from the first line kept, while the lens read the text from the cell as written: with two blank lines after
# %%lens, `h = h * 2` was "Made by cell line 4: x = torch.tensor(2.0, requires_grad=True)" (it is line 6). Fixed in
# magics.py (the lines IPython drops are counted into the offset).


@pytest.mark.parametrize("blank", ["", "\n", "\n\n", "   \n\t\n"])
def test_made_by_names_the_line_that_made_each_node(shell, blank):
    body = blank + "x = torch.tensor(2.0, requires_grad=True)\nh = x * 3\nh = h.relu()\nh = h * 2\nh.backward()\n"
    lens = lens_cell(shell, body)
    editor = ["%%lens"] + body.splitlines()  # the cell as the editor numbers it, the %%lens line being line 1
    view = views_for(lens.passes)[0]
    said = [made_by(s) for s in view.steps if s.kind == "node"]
    assert len(said) == 3 and None not in said
    expected_ops = ["h = h * 2", "h = h.relu()", "h = x * 3"]  # the engine runs the last-made node first
    for text, op in zip(said, expected_ops):
        number, line = re.fullmatch(r"cell line (\d+): (.*)", text).groups()
        assert editor[int(number) - 1].strip() == line == op, (text, editor)
