"""IPython doors: ``%lens_graph`` and ``%%lens``.  Argument parsing and display only;
all the work is done by :func:`autograd_lens.graph` and :class:`autograd_lens.Lens`."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


@magics_class
class LensMagics(Magics):
    @magic_arguments()
    @argument("expression", nargs="+", help="Python expression(s) giving the tensor(s) whose graph to draw.")
    @argument("--max-elements", type=int, default=16, help="Show values of tensors with at most this many elements (default 16).")
    @argument("--max-nodes", type=int, default=300, help="Draw at most this many backward functions (default 300).")
    @argument("--direction", choices=("forward", "backward"), default="forward", help="Arrows follow the data (forward, default) or the gradients (backward).")
    @argument("--legend", action="store_true", help="Add a legend of the colours and shapes.")
    @argument("--no-saved", action="store_true", help="Hide saved tensors and constants.")
    @argument("--dot", action="store_true", help="Print the DOT source instead of drawing it.")
    @argument("--no-fold", action="store_true", help="Draw every block, even past 60 boxes (no module outlines, no folds).")
    @argument("--expand", action="append", default=[], help="Draw this folded block in full, e.g. --expand layers.3 (repeatable).")
    @line_magic
    def lens_graph(self, line: str) -> Any:
        """Draw the autograd graph of a tensor, labelled with your variable names.

        Example: ``%lens_graph out --legend``
        """
        from .api import graph

        # bad input fails the cell as IPython's own option errors do (UsageError: one line, no traceback), as %%lens
        args = parse_argstring(self.lens_graph, line)
        if args.max_nodes < 1 or args.max_elements < 0:
            raise UsageError("%lens_graph: --max-nodes must be at least 1 and --max-elements at least 0, e.g. "
                             "--max-nodes 300")
        namespace = self.shell.user_ns
        source = " ".join(args.expression)
        try:
            value = eval(source, namespace)
        except Exception as error:
            raise UsageError(f"%lens_graph: could not evaluate {source!r}: {type(error).__name__}: {error}") from None
        roots = value if isinstance(value, (tuple, list)) else (value,)
        try:
            result = graph(
                *roots,
                names=namespace,
                max_elements=args.max_elements,
                max_nodes=args.max_nodes,
                direction=args.direction,
                legend=args.legend,
                show_saved=not args.no_saved,
                fold=not args.no_fold,
                expand=args.expand,
            )
        except (TypeError, ValueError) as error:
            raise UsageError(f"%lens_graph: {error}") from None
        if args.dot:
            print(result.to_dot())
            return None
        return result

    @magic_arguments()
    @argument("--as", dest="name", default="_lens", help="Bind the Lens to this name in the notebook (default _lens).")
    @argument("--no-show", action="store_true", help="Record only; show nothing (inspect the Lens object instead).")
    @argument("--predict", action="store_true", help="Ask for each gradient before the stepper reveals it, and check the answer.")
    @argument("--modules", action="store_true",
              help="Group the drawing's nodes by the nn.Module call that made them. Adds two global forward hooks "
                   "for the length of the cell (torch.compile(module) then warns that global hooks exist).")
    @argument("--why", metavar="NAME", default=None,
              help="Also show, for the tensor NAME: where its gradient stopped, where NaN or inf started, and "
                   "which paths its gradient took. Records forward ops for the length of the cell (a "
                   "TorchFunctionMode).")
    @argument("--store-limit", type=int, default=4096, help="Gradients with more elements are kept as summaries (default 4096).")
    @argument("--max-elements", type=int, default=16, help="Show values of tensors with at most this many elements (default 16).")
    @argument("--max-nodes", type=int, default=300, help="Draw at most this many backward functions (default 300).")
    @argument("--plot", action="append", default=[], choices=("flow", "timeline", "before-after", "with-without"),
              help="Also draw a figure: flow (gradient flow per parameter), timeline (hook calls), before-after "
                   "(what each hook received and passed on), with-without (gradients with vs without hooks). "
                   "Repeat for several.")
    @cell_magic
    def lens(self, line: str, cell: str) -> Any:
        """Run the cell as ordinary Python and record every backward pass in it.

        Shows the graph and a step-through of each pass, hooks included. The
        recording is kept as a ``Lens`` object under ``_lens`` (``--as NAME``).
        If the cell raises, what was recorded is shown first, then the usual traceback.
        """
        __tracebackhide__ = True  # noqa: F841  (the cell's error is re-raised here: IPython shows no frame of the lens)
        import builtins
        import keyword

        from .capture.tracer import Lens

        # a bad line fails the cell as IPython's own option errors do (UsageError: one line, no traceback), so
        # that Run All and nbval stop at it rather than at the next cell's NameError
        args = parse_argstring(self.lens, line)
        if not args.name.isidentifier() or keyword.iskeyword(args.name):
            raise UsageError(f"%%lens: --as needs a Python name, e.g. --as trace, not {args.name!r}; "
                             "the cell did not run")
        if hasattr(builtins, args.name):
            raise UsageError(f"%%lens: --as {args.name} would hide Python's built-in {args.name}; choose another "
                             "name, e.g. --as trace; the cell did not run")
        for option, value, lowest, example in (("--max-nodes", args.max_nodes, 1, 300),
                                               ("--max-elements", args.max_elements, 0, 16),
                                               ("--store-limit", args.store_limit, 0, 4096)):
            if value < lowest:
                raise UsageError(f"%%lens: {option} must be at least {lowest}, e.g. {option} {example}; "
                                 "the cell did not run")
        lens = Lens(
            names=self.shell.user_ns,
            store_limit=args.store_limit,
            max_elements=args.max_elements,
            max_nodes=args.max_nodes,
            modules=args.modules,
            why=args.why is not None,
        )
        # what each leaf's .grad would hold without hooks carries over from the earlier %%lens cells of this kernel:
        # a .grad a hook changed in one cell is not "the same as without hooks" in the next
        lens._history = self.__dict__.setdefault("_leaf_history", {})
        # and so does the first earlier pass whose hooks changed gradients (an optimizer step may have used them)
        earlier, pending = self.__dict__.get("_earlier_lens"), None
        if earlier is not None and any(getattr(entry, "hooked", False) for entry in lens._history.values()):
            from .capture.ledger import inheritable

            pending = inheritable(earlier, self.shell.user_ns)
            if pending is not None:  # its leaves, for the passes of this cell that have them no more (frozen)
                lens._ledger.seed(pending[3])
        self._earlier_lens = lens
        self.shell.user_ns[args.name] = lens
        result = self._run_quietly(lens, cell)
        if pending is not None:
            from .capture.ledger import inherit

            inherit(lens._ledger, pending, self.shell.user_ns)
        if result.error_in_exec is not None:
            lens.saw_error(result.error_in_exec)
        if not args.no_show and (lens.passes or result.success):
            from IPython.display import display

            if args.predict:
                from .views.trace_display import PredictDisplay

                display(PredictDisplay(lens))
            else:
                display(lens)
            self._show_plots(lens, args.plot)
            if args.why is not None:
                from .debug.why import Why

                display(Why(lens, args.why))
        if not args.no_show and lens.notes:
            from IPython.display import display

            from .views.trace_display import NotesDisplay

            display(NotesDisplay(lens.notes))
        # A failing cell fails as any cell does (Run All and nbclient stop), after the partial trace.
        if result.error_before_exec is not None:
            raise result.error_before_exec
        if result.error_in_exec is not None:
            raise result.error_in_exec
        return None

    @staticmethod
    def _show_plots(lens: Any, names: list[str]) -> None:
        from IPython.display import display

        from .views.plots import BY_NAME

        for name in names:
            if not lens.passes:
                print(f"%%lens --plot {name}: no backward pass was recorded, so there is nothing to plot")
                continue
            try:
                display(getattr(lens.plot, BY_NAME[name])())
            except Exception as error:  # a plot must not turn a successful cell into a failing one
                print(f"%%lens --plot {name}: could not draw it ({type(error).__name__}: {error})")

    def _run_quietly(self, lens: Any, cell: str) -> Any:
        """Run the cell under the Lens; its traceback is shown once, when the magic re-raises.  Each
        statement is marked so the pass can tell which cell line made each node (see capture.lines)."""
        from .capture.lines import CellLines, Marker

        shell = self.shell
        shell.showtraceback = lambda *args, **kwargs: None
        shell.showsyntaxerror = lambda *args, **kwargs: None
        # IPython drops the cell's leading blank lines before it compiles it (inputtransformer2.leading_empty_lines):
        # statements are numbered from the first line it keeps, which is line 2 + that many in the editor
        lines = cell.splitlines()
        blank = next((i for i, text in enumerate(lines) if text and not text.isspace()), 0)
        lens.cell_lines = CellLines("\n".join(lines[blank:]), offset=1 + blank)
        marker = Marker(lens.cell_lines)
        shell.ast_transformers.append(marker)
        # IPython silences a cell's last value when the cell ends with ';', reading the last cell in its history:
        # here that is the %%lens line, so the displayhook is told about the body itself while it runs
        hook = shell.displayhook
        own_quiet = vars(hook).get("quiet")
        quiet = _ends_with_semicolon(_transformed(shell, cell))
        hook.quiet = lambda: quiet
        try:
            with lens, lens.cell_lines:
                return shell.run_cell(cell, store_history=False)
        finally:
            if own_quiet is None:
                vars(hook).pop("quiet", None)
            else:
                hook.quiet = own_quiet
            if marker in shell.ast_transformers:
                shell.ast_transformers.remove(marker)
            del shell.showtraceback
            del shell.showsyntaxerror


def _transformed(shell: Any, cell: str) -> str:
    """The cell as IPython keeps it in its history (magics and ``!`` lines turned into Python)."""
    try:
        return shell.transform_cell(cell)
    except Exception:  # IPython reports it when it runs the cell
        return cell


def _ends_with_semicolon(source: str) -> bool:
    """Whether the last token of ``source`` (comments and blank lines aside) is ';', as IPython decides
    whether to show a cell's last value.

    >>> _ends_with_semicolon("x = 1\\nx;  # quiet"), _ends_with_semicolon("x"), _ends_with_semicolon("s = ';'")
    (True, False, False)
    """
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    skipped = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)  # as IPython's DisplayHook
    for token in reversed(tokens):
        if token.type not in skipped:
            return token.type == tokenize.OP and token.string == ";"
    return False


def load(ipython: Any) -> None:
    ipython.register_magics(LensMagics)


def unload(ipython: Any) -> None:
    manager = ipython.magics_manager
    for kind, names in (("line", ("lens_graph",)), ("cell", ("lens",))):
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop("LensMagics", None)
