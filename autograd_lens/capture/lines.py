"""Which line of a ``%%lens`` cell made each backward node.

Autograd numbers the nodes a thread makes, in the order it makes them (``grad_fn._sequence_nr()``), and
``torch._C._autograd._get_sequence_nr()`` reads the next number without taking it.  The ``%%lens`` magic
runs the cell with a call before each statement (:class:`Marker`) that notes that number: a node was made
by the last statement marked at or below its number.  Nothing of the user's is touched — no hook, no
mode, no attribute — and a statement that makes no node leaves no trace.

Limits, said where they apply:
- lines are numbered as the notebook's editor numbers them, the ``%%lens`` line being line 1;
- a node made before the cell (an earlier cell, ``with Lens()`` in a script) has no line;
- a statement inside a function defined in the cell counts as the line that called the function;
- numbers are per thread: when threads that could make nodes run during the cell (a thread other than
  the kernel's daemon threads is alive at a statement), every line of the cell is unknown.
"""

from __future__ import annotations

import ast
import bisect
import os
import sys
import threading
from typing import Any

import torch

from ..model import SourceLine

_next_number = torch._C._autograd._get_sequence_nr
_CURRENT: list[CellLines] = []  # the cell being run under %%lens, if any
STATEMENT_WATCHERS: list[Any] = []  # called before each statement of a %%lens cell (capture.compiled)
_MODULE = __name__


def other_thread(thread: int) -> str | None:
    """The name of a live thread, other than ``thread`` and the main thread, that could be making autograd
    nodes now: its nodes are numbered separately, so numbers no longer tell which code made a node.  Daemon
    threads (the kernel's own) and executor workers idle in their queue (``asyncio``'s default executor
    keeps some alive) are not counted."""
    frames = None
    for candidate in threading.enumerate():
        if candidate.daemon or candidate is threading.main_thread() or candidate.ident == thread:
            continue
        if frames is None:
            frames = sys._current_frames()
        if _idle_worker(frames.get(candidate.ident)):
            continue
        return candidate.name
    return None


def _idle_worker(frame: Any) -> bool:
    """A ``concurrent.futures`` worker thread waiting for work: from its innermost frame out, its ``_worker``
    loop is reached without passing through a work item's ``run`` (which would be running someone's code)."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_WORKER_FILE):
            if code.co_name == "run":
                return False
            if code.co_name == "_worker":
                return True
        frame = frame.f_back
    return False


_WORKER_FILE = os.path.join("concurrent", "futures", "thread.py")


class CellLines:
    """The statements of one cell and the node number at which each started."""

    def __init__(self, source: str, offset: int = 1) -> None:
        self.offset = offset  # cell lines before ``source`` (the ``%%lens`` line), as the editor numbers them
        self.source_lines = source.splitlines()
        self.starts: list[int] = []  # node numbers, increasing
        self.numbers: list[int] = []  # the cell line marked at each start
        self.ends: dict[int, int] = {}  # cell line -> last line of its statement
        self.thread = threading.get_ident()
        self.unknown = ""  # why no line can be told, once known
        self._threads = 0  # threading.active_count() when threads were last looked at

    def mark(self, line: int) -> None:
        if threading.get_ident() != self.thread:
            return
        number = _next_number()
        if self.starts and self.starts[-1] == number:  # the statement before made no node
            self.numbers[-1] = line
        else:
            self.starts.append(number)
            self.numbers.append(line)
        if not self.unknown and threading.active_count() != self._threads:
            self._threads = threading.active_count()
            other = other_thread(self.thread)
            if other:
                self.unknown = (f"a thread ({other}) ran during the cell, and autograd numbers the nodes of "
                                "each thread separately")

    def line_of(self, number: int | None) -> SourceLine | None:
        """The statement that made the node numbered ``number``, if it was made in this cell so far."""
        if self.unknown or number is None or not self.starts or number < self.starts[0] or number >= _next_number():
            return None
        line = self.numbers[bisect.bisect_right(self.starts, number) - 1]
        return SourceLine(line + self.offset, self.text(line))

    def text(self, line: int) -> str:
        text = self.source_lines[line - 1].strip() if 0 < line <= len(self.source_lines) else ""
        if self.ends.get(line, line) > line:
            text += " …"
        return text[:77] + "…" if len(text) > 78 else text

    def __enter__(self) -> CellLines:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.remove(self)


def mark(line: int) -> None:
    """Called by the cell before each statement (see :class:`Marker`); never raises."""
    try:
        if _CURRENT:
            _CURRENT[-1].mark(line)
        for watch in STATEMENT_WATCHERS:
            watch()
    except Exception:
        pass


class Marker(ast.NodeTransformer):
    """An IPython AST transformer: ``mark(line)`` before each statement of the cell and of the blocks in it
    (loops, ``if``, ``with``, ``try``, ``match``), and at the end of each loop body (the loop's own line then
    makes the next item or test).  Function and class bodies are left as written."""

    def __init__(self, lines: CellLines) -> None:
        self.lines = lines
        self.used = False

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if self.used:  # code the cell runs through IPython itself (%time, %timeit, run_cell): not cell lines
            return node
        self.used = True
        try:
            # a docstring and ``from __future__`` imports must stay first (they make no node)
            head = 0
            for statement in node.body:
                docstring = head == 0 and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
                    and isinstance(statement.value.value, str)
                if not (docstring or isinstance(statement, ast.ImportFrom) and statement.module == "__future__"):
                    break
                head += 1
            body = node.body[:head] + self._body(node.body[head:], None)
        except Exception as problem:  # an AST transformer that raises is dropped by IPython: never
            self.lines.unknown = f"the cell could not be marked ({type(problem).__name__})"
            return node
        node.body = body
        return node

    def _call(self, line: int, where: ast.stmt) -> ast.stmt:
        call = ast.Expr(ast.Call(
            func=ast.Attribute(
                value=ast.Call(func=ast.Name("__import__", ast.Load()),
                               args=[ast.Constant(_MODULE)],
                               keywords=[ast.keyword("fromlist", ast.Tuple([ast.Constant("mark")], ast.Load()))]),
                attr="mark", ctx=ast.Load()),
            args=[ast.Constant(line)], keywords=[]))
        for part in ast.walk(call):
            ast.copy_location(part, where)
            if hasattr(part, "end_lineno"):
                part.end_lineno, part.end_col_offset = where.lineno, where.col_offset
        return call

    def _body(self, statements: list[ast.stmt], loop: int | None) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for statement in statements:
            line = loop if isinstance(statement, ast.Continue) and loop is not None else statement.lineno
            if not hasattr(statement, "body"):  # a simple statement over several lines gets "…"
                self.lines.ends[statement.lineno] = max(self.lines.ends.get(statement.lineno, 0),
                                                        getattr(statement, "end_lineno", None) or statement.lineno)
            out.append(self._call(line, statement))
            self._inside(statement, loop)
            out.append(statement)
        return out

    def _inside(self, statement: ast.stmt, loop: int | None) -> None:
        if isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
            statement.body = self._body(statement.body, statement.lineno) + [self._call(statement.lineno, statement)]
            statement.orelse = self._body(statement.orelse, loop)
        elif isinstance(statement, ast.If):
            statement.body = self._body(statement.body, loop)
            statement.orelse = self._body(statement.orelse, loop)
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            statement.body = self._body(statement.body, loop)
        elif isinstance(statement, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            statement.body = self._body(statement.body, loop)
            for handler in statement.handlers:
                handler.body = self._body(handler.body, loop)
            statement.orelse = self._body(statement.orelse, loop)
            statement.finalbody = self._body(statement.finalbody, loop)
        elif isinstance(statement, ast.Match):
            for case in statement.cases:
                case.body = self._body(case.body, loop)
