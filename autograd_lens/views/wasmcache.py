"""Graphviz's wasm module compiled once per machine and kept on disk, and the wasmtime engine that runs it
(``render`` builds the in-process renderer from them)."""

from __future__ import annotations

import os


def _cache_dir() -> str:
    base = os.environ.get("AUTOGRAD_LENS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "autograd_lens")
    return base


def _compiled_module(engine, wasm_path):
    """Graphviz's wasm module, compiled once per machine: the machine code is cached on disk, keyed by
    wasmtime's library and the wasm file (size and time of each) and the stack size, so a new kernel loads it in
    milliseconds instead of compiling for about a second.  An unwritable or broken cache (or one another
    wasmtime wrote: it refuses to load it) only costs the compile."""
    import wasmtime

    path = cache_file(wasm_path)
    if os.path.isfile(path):
        try:
            return wasmtime.Module.deserialize_file(engine, path)
        except Exception:  # written by another wasmtime, truncated, ...: compile again and replace it
            pass
    module = wasmtime.Module.from_file(engine, str(wasm_path))
    try:
        os.makedirs(_cache_dir(), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(module.serialize())
        os.replace(temporary, path)  # atomic: a concurrent kernel never reads half a file
    except OSError:
        pass
    return module


def cache_file(wasm_path, found: dict | None = None) -> str:
    """Where the compiled module of ``wasm_path`` for the installed wasmtime is kept (found without importing
    wasmtime: the binding of ``wasmfast`` and wasmtime-py read and write the same file)."""
    import hashlib

    stat = os.stat(wasm_path)
    key = hashlib.sha256(f"{_wasmtime_stamp(found)}|{stat.st_size}|{stat.st_mtime_ns}|{WASM_STACK}"
                         .encode()).hexdigest()[:20]
    return os.path.join(_cache_dir(), f"graphviz-{key}.cwasm")


def package_dir(name: str, found: dict | None = None) -> str | None:
    """The folder of the installed package ``name`` (found without importing it), or None when it is not installed;
    ``found``: where the folders found are kept (the binding's state: a first picture asks 4 times, ~0.1 ms each)."""
    if found is not None and name in found:
        return found[name]
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    if found is not None:
        found[name] = spec.submodule_search_locations[0]
    return spec.submodule_search_locations[0]


def library_path(found: dict | None = None) -> str:
    """wasmtime-py's C library, as its ``_ffi.filename`` names it, found without importing the package."""
    import sys

    folder = package_dir("wasmtime", found)
    if folder is None:
        raise ImportError("wasmtime is not installed")
    machine = {"AMD64": "x86_64", "arm64": "aarch64", "ARM64": "aarch64"}.get(os.uname().machine, os.uname().machine)
    name = {"linux": "_libwasmtime.so", "win32": "_wasmtime.dll", "darwin": "_libwasmtime.dylib"}[sys.platform]
    return os.path.join(folder, f"{sys.platform}-{machine}", name)


def _wasmtime_stamp(found: dict | None = None) -> str:
    """What identifies the installed wasmtime: its library's size and time (a stat; its version from the
    package metadata costs a few milliseconds of Python in a new kernel, on the first picture's path)."""
    try:
        library = os.stat(library_path(found))
    except Exception:  # another layout of the package
        try:
            from wasmtime import _ffi

            library = os.stat(_ffi.filename)
        except Exception:
            from importlib.metadata import version

            return version("wasmtime")
    return f"{library.st_size}|{library.st_mtime_ns}"


# Graphviz's layout recurses deeply on large drawings: with wasmtime's default 512 KiB of wasm stack it traps
# past about 3,300 nodes; with 1.9 MiB (the most wasmtime allows without async stacks) 10,000 nodes lay out.
WASM_STACK = 1900 * 1024


def _engine():
    import wasmtime

    try:
        config = wasmtime.Config()
        config.max_wasm_stack = WASM_STACK
        return wasmtime.Engine(config)
    except Exception:  # an older wasmtime: its defaults (smaller drawings only)
        return wasmtime.Engine()
