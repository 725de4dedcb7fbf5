"""README examples are executed, so they cannot drift from the API."""

from __future__ import annotations

import os
import re

import torch
from IPython.core.interactiveshell import InteractiveShell

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")


def python_blocks():
    with open(README, encoding="utf-8") as handle:
        return re.findall(r"```python\n(.*?)```", handle.read(), re.S)


def test_readme_examples_run_in_ipython(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lens.to_html("trace.html") writes here
    import matplotlib

    matplotlib.use("Agg")
    shell = InteractiveShell.instance()
    blocks = python_blocks()
    assert len(blocks) >= 4
    try:
        for block in blocks:  # in order, in one shell, magics included
            result = shell.run_cell(block, store_history=False)
            assert result.success, f"README block failed:\n{block}\n{result.error_in_exec!r}"
        ns = shell.user_ns
        (call,) = ns["_lens"].hook_calls  # exactly one hook call, wherever Python is installed (CI: a venv)
        assert (call.target, float(call.grad_in), float(call.grad_out)) == ("y", 5.0, 2.5)
        assert float(ns["_lens"].passes[0].grads_without_hooks["x"]) == 20.0
        assert torch.equal(ns["w"].grad, torch.tensor([1.0, -1.0]))
        assert (tmp_path / "trace.html").exists()
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)
