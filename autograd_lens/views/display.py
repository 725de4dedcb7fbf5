"""How a :class:`Graph` shows itself in Jupyter: SVG when a renderer runs, an HTML table when not.

A display method must never raise: a traceback in place of a picture teaches
nothing.  Rendering problems become a short hint above a table of the graph.
"""

from __future__ import annotations

import html
import os
import threading

from ..capture.entry import _pause_collector, _resume_collector
from ..format import format_shape, format_value
from ..model import Graph
from .drawn import changed_since_drawn
from .render import (GraphvizUnavailableError, RenderError, RenderTimeoutError, _import_wasm_backend,
                     _prepare_wasm_backend, start_svg, start_svgs, wasm_available)

RENDER_PROBLEMS = (GraphvizUnavailableError, RenderError, RenderTimeoutError)


def graph_text(graph: Graph) -> str:
    """A short deterministic ``text/plain`` (IPython would otherwise print an address).

    Lists tensor names in drawing order.
    """
    tensors = [node.label for node in graph.nodes if node.is_tensor]
    functions = sum(1 for node in graph.nodes if node.kind == "function")
    shown = ", ".join(tensors[:12]) + (", …" if len(tensors) > 12 else "")
    hidden = f", {graph.hidden_nodes} hidden" if graph.hidden_nodes else ""
    return f"<autograd_lens.Graph: {len(tensors)} tensors ({shown}), {functions} backward functions{hidden}>"


def graph_table_html(graph: Graph) -> str:
    """The graph as an HTML table: what is drawn, in words."""
    rows = []
    incoming: dict[str, list[str]] = {}
    labels = {node.id: node.label for node in graph.nodes}
    for edge in graph.edges:
        incoming.setdefault(edge.dst, []).append(labels.get(edge.src, edge.src))
    for node in graph.nodes:
        shape = format_shape(node.shape) if node.shape is not None else ""
        value = format_value(node.value) if node.value is not None else ""
        grad = format_value(node.grad) if node.grad is not None else ""
        cells = [node.label, node.kind, node.op, shape, value, grad, ", ".join(incoming.get(node.id, [])), "; ".join(node.hooks)]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells) + "</tr>")
    header = "".join(f"<th>{name}</th>" for name in ("node", "kind", "backward fn", "shape", "data", "grad", "inputs", "hooks"))
    return f'<table class="autograd-lens-table"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def hint_html(error: Exception) -> str:
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    if not isinstance(error, RENDER_PROBLEMS):
        first_line = f"the graph could not be drawn ({type(error).__name__}: {first_line})"
    full = html.escape(str(error))
    return (
        f'<p style="color:#92400e"><b>autograd_lens:</b> {html.escape(first_line)} '
        f'<details><summary>how to fix</summary><pre>{full}</pre></details></p>'
    )


def graph_bundle(graph: Graph) -> dict[str, str]:
    """The MIME bundle for a graph: SVG + text, or (no renderer) HTML table + text.

    No cyclic collection runs while the lens writes the DOT and starts its layout, nor while it makes the page from
    the SVG (no user code runs there; the collector left as found, always): the collections those allocations are
    due come while Graphviz lays out, when this thread would only wait (a first picture: one middle collection,
    about 1 ms, off its path)."""
    try:
        collecting, svg_of = _pause_collector(), None
        try:
            svg_of = start_svg(graph.to_dot())
        except Exception as error:  # never raise from a display method: a table and the real cause
            problem = error
        finally:
            _resume_collector(collecting)
        if svg_of is None:
            return {"text/html": hint_html(problem) + stale_note(graph) + graph_table_html(graph), "text/plain": graph_text(graph)}
        from .fold import FOLD_OVER, expanded, fold_states

        graph_html = states = laid = made = None
        table_of = graph_table_html
        try:
            text = graph_text(graph)  # (the bundle's text made while Graphviz lays out, as what follows)
            if len(graph.nodes) > FOLD_OVER:  # a large graph: zoom, pan, find, upstream/downstream (see graphview)
                # the drawings with folds opened, which the page stores, laid out after this one and meanwhile
                # the navigator's module loaded (a first display's imports) and what needs no drawing made: the
                # table of the drawn boxes, the page's script and (without folds) its data
                states = fold_states(graph)
                if len(states) > 1:
                    laid = start_svgs([expanded(graph, state).to_dot() for state, _ in states[1:]], after=svg_of)
                from .graphview import graph_html, page_made

                table_of = _table_made(states[0][1].graph)
                made = page_made(graph, text, table_of, states)  # (the page's script: the stepper's module loaded)
            svg, failed = _waited(svg_of)
            if failed is not None:
                return {"text/html": hint_html(failed) + stale_note(graph) + graph_table_html(graph), "text/plain": text}
            stale = stale_note(graph)
            if graph_html is not None:
                collecting = _pause_collector()
                try:
                    return {"text/html": stale + graph_html(graph, svg, text, table_of, states, laid, made),
                            "text/plain": text}
                finally:
                    _resume_collector(collecting)
            if stale:
                return {"text/html": stale + svg, "image/svg+xml": svg, "text/plain": text}
            return {"image/svg+xml": svg, "text/plain": text}
        finally:  # in any case: no layout outlives the display
            _waited(svg_of)
            if laid is not None:
                laid()
    except Exception as error:
        return safe_bundle("graph", error)


def stale_note(graph: Graph) -> str:
    """A line above a drawing shown again after the tensors it draws changed (an optimizer step, another
    backward, .grad zeroed): its values are those of when it was drawn.  Empty when nothing is known to differ."""
    changed = changed_since_drawn(graph)
    if not changed:
        return ""
    shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
    return (f'<p style="color:#92400e"><b>autograd_lens:</b> drawn earlier: {html.escape(shown)} '
            f'{"has" if len(changed) == 1 else "have"} changed since; the values below are those of when it was '
            "drawn (draw it again to see them now).</p>")


def _table_made(drawn: Graph):
    """``graph_table_html``, with the table of ``drawn`` made now (while Graphviz lays it out)."""
    table = graph_table_html(drawn)
    return lambda graph: table if graph is drawn else graph_table_html(graph)


def _waited(svg_of) -> tuple[str, Exception | None]:
    try:
        return svg_of(), None
    except Exception as error:
        return "", error


_WARMED: list[bool] = []  # the warm-up ran (at most once per process)
_warming_lock = threading.Lock()
# what a first picture imports after the renderer: the navigator (past FOLD_OVER boxes) and what it loads
WARM_MODULES = ("fold", "gradsize", "groups", "svgslim", "pagecss", "static_html", "graphview")


def wasm_wanted() -> bool:
    """Whether an SVG would be drawn in-process if wasm loads here (no setting says otherwise)."""
    return (not os.environ.get("AUTOGRAD_LENS_DISABLE_WASM")
            and (os.environ.get("AUTOGRAD_LENS_RENDERER") or "auto") in ("auto", "wasm"))


def start_warm_up() -> bool:
    """``%load_ext autograd_lens``: load what a first picture needs now (the in-process Graphviz, compiled module
    instantiated; the navigator's modules), so that a picture cells later does not wait for it: about 0.1-0.3 s
    added to ``%load_ext`` (the first time on a machine, compiling the wasm, about a second).  Not on a thread: a
    thread running while the next cells run is seen by the user's tools (cProfile on Python 3.12+ watches every
    thread through sys.monitoring, and its counts of the user's own calls came out wrong) and could hold a lock or an
    import across a fork.  At most once per process; nothing when wasm would not draw.  Never prints, warns or
    raises: what fails is left for the first picture to meet and say, as without it.  The pictures are the same
    bytes either way."""
    try:
        with _warming_lock:
            if _WARMED or not wasm_wanted():
                return False
            _WARMED.append(True)
        _warm_up()
        return True
    except BaseException:
        return False


def _warm_up() -> None:
    """The in-process renderer's modules, then its compiled module instantiated where layouts find it (as the first
    layout would: what fails is left for it to meet and say), then the navigator's modules."""
    try:
        if not wasm_wanted() or not wasm_available():
            return
        _import_wasm_backend()
        _prepare_wasm_backend()
        from importlib import import_module

        for name in WARM_MODULES:
            import_module(f"{__package__}.{name}")
        import_module(f"{__package__}.static_html").module_source()
    except BaseException:  # a thread's exception would be printed: the first picture meets it and says it
        pass


def safe_bundle(what: str, error: Exception) -> dict[str, str]:
    """The last resort of a display method: one line naming the problem."""
    line = f"autograd_lens could not show this {what}: {type(error).__name__}: {error}"
    return {"text/plain": line, "text/html": f"<p>{html.escape(line)}</p>"}
