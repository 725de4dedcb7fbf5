"""Debugging lenses: where the gradient stopped, where it blew up, and which paths it took.

* ``lens.passes[i].unreached``: ``{name: Reason}`` for each named tensor requiring
  grad that got no gradient in the pass (:mod:`.unreached`);
* ``lens.passes[i].first_nonfinite``: where NaN or inf started (:mod:`.nonfinite`);
* ``lens.paths_to(name)``: a leaf's gradient as a sum over paths (:mod:`.paths`,
  recorded with ``Lens(why=True)``);
* ``%%lens --why NAME``: the three for one tensor (:mod:`.why`).

Everything reached from the model's properties goes through the ``safe_*``
functions here, which never raise: a failure of the lens becomes an answer that
says "unknown" and why.
"""

from __future__ import annotations

from typing import Any

import dataclasses

from .evidence import Evidence, collect
from .nonfinite import NonFinite
from .paths import Path, PathSet
from .unreached import REASONS, Reason

__all__ = ["NonFinite", "Path", "PathSet", "REASONS", "Reason", "Unreached", "DebugRecording"]


_NO_PATHS = "paths are followed while the graph is alive, in a Lens(why=True) or a %%lens --why cell"


class Unreached(dict):
    """``{name: Reason}``; ``note`` says what the answer could not cover (empty when complete)."""

    note: str = ""


class DebugRecording:
    """The Lens's part of the debugging lenses: the forward record (``why=True``) and, before each pass,
    the evidence the pass's answers are built from."""

    def __init__(self, why: bool = False) -> None:
        self.why = why
        self.recorder: Any = None
        self.problem = ""

    def start(self) -> None:
        if not self.why:
            return
        try:
            from .forward import ForwardRecorder

            self.recorder = ForwardRecorder()
            self.recorder.__enter__()
        except Exception as problem:
            self.recorder = None
            self.problem = f"forward ops could not be recorded ({type(problem).__name__}: {problem})"

    def stop(self) -> None:
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return
        try:
            recorder.__exit__(None, None, None)
        except Exception:  # another mode entered inside the block and left on top: torch says so itself
            pass
        self.last_recorder = recorder

    def before_pass(self, observer: Any) -> Any:
        """Evidence for the pass about to run (never raises)."""
        try:
            names = observer.ensure_names()
            evidence = collect(observer.shape, names, self.recorder, "" if self.recorder is not None else _NO_PATHS)
        except Exception as problem:
            return Evidence(forward_note=f"the evidence could not be collected ({type(problem).__name__}: {problem})",
                            saved_note="not looked at")
        if self.problem and not evidence.forward_note:
            evidence = dataclasses.replace(evidence, forward_note=self.problem)
        if self.recorder is None:
            return evidence
        try:
            from .paths import compute

            paths, note = compute(observer.shape, tuple(observer.seed_objects), dict(observer.shape.leaf_labels), names)
        except Exception as problem:
            paths, note = {}, f"the paths could not be followed ({type(problem).__name__}: {problem})"
        return dataclasses.replace(evidence, paths=paths, paths_note=note)


def safe_unreached(backward_pass: Any) -> Unreached:
    from .unreached import unreached

    result = Unreached()
    try:
        result.update(unreached(backward_pass))
        if getattr(backward_pass, "debug", None) is None:
            result.note = "unknown: no evidence was recorded for this pass"
        else:
            result.note = backward_pass.debug.saved_note
    except Exception as problem:
        result.clear()
        result.note = f"unknown: the answer could not be worked out ({type(problem).__name__}: {problem})"
    return result


def safe_first_nonfinite(backward_pass: Any) -> NonFinite | None:
    from .nonfinite import first_nonfinite

    try:
        return first_nonfinite(backward_pass)
    except Exception as problem:
        return NonFinite("unknown", "unknown", "unknown", -1, None, "", "",
                         note=f"could not be worked out ({type(problem).__name__}: {problem})")


def forward_nonfinite(backward_pass: Any) -> tuple[Any, Any]:
    """(the block's first forward call that returned NaN or inf from finite inputs, up to this pass; the cell
    line that made it, when its result is on this pass's graph): (None, None) when there is none or forward ops
    were not recorded (``Lens(why=True)``).  Never raises."""
    try:
        evidence = getattr(backward_pass, "debug", None)
        found = getattr(evidence, "forward_nonfinite", None)
        if found is None:
            return None, None
        source = None
        if found.node is not None:
            for node in backward_pass.graph.nodes:
                if node.kind == "function" and (node.sequence_nr, node.op) == found.node:
                    source = backward_pass.sources.get(node.id)
                    break
        return found, source
    except Exception:
        return None, None


def safe_paths_to(passes: list, name: str, index: int | None = None) -> PathSet:
    """The paths to ``name`` in pass ``index`` (default: the last pass whose graph has it)."""
    try:
        chosen = passes if index is None else [passes[index]]
        for backward_pass in reversed(chosen):
            if backward_pass.inputs and name not in backward_pass.inputs:  # backward(inputs=...) left it out
                if index is not None:
                    return PathSet(name, unknown=f"{name} is not among the inputs of pass {index + 1}, so no gradient "
                                                 "was computed for it")
                continue
            evidence = getattr(backward_pass, "debug", None)
            if evidence is not None and name in evidence.paths:
                return with_hooks(evidence.paths[name], backward_pass, name)
            kinds = {node.kind for node in backward_pass.graph.nodes if node.label == name}
            if "tensor" in kinds and not kinds & {"leaf", "output"}:  # x = torch.randn(3, requires_grad=True) * 2
                return PathSet(name, unknown=f"{name} is not a leaf but a tensor computed on this graph, between the "
                                             "root and its leaves; paths are followed from the root to leaves only")
            if not kinds & {"leaf", "output"}:
                continue
            if evidence is None:
                return PathSet(name, unknown="no evidence was recorded for this pass")
            return PathSet(name, unknown=evidence.paths_note or f"{name} is not a leaf of the graph")
        return PathSet(name, unknown=f"no recorded pass reaches a leaf named {name}: no path from a root leads to it (unreached says why)")
    except Exception as problem:
        return PathSet(name, unknown=f"could not be worked out ({type(problem).__name__}: {problem})")


def with_hooks(path_set: PathSet, backward_pass: Any, name: str) -> PathSet:
    """The paths are the chain rule without hooks (backward functions called directly): when the pass's hooks changed
    what ``name`` received, or may have, the PathSet says so, with what the pass gave it."""
    from ..format import format_value
    from ..model import values_equal

    if not path_set.known:
        return path_set
    if backward_pass.kind == "grad":
        given, without = backward_pass.input_grads.get(name), backward_pass.grads_without_hooks.get(name)
    else:
        given, without = backward_pass.added.get(name), backward_pass.added_without_hooks.get(name)
    if given is None:  # nothing arrived: the paths are what it would have received
        reason = backward_pass.unreached.get(name)
        if reason is None:
            return path_set
        return dataclasses.replace(path_set, hooks=f"this pass gave {name} no gradient ({reason.text}); the paths "
                                                   "above are the chain rule without hooks: what it would have received")
    if without is not None and values_equal(given, without):
        return path_set
    if without is None and name not in backward_pass.unknown:
        return path_set
    received = f"with the hooks, this pass gave {name} {format_value(given, 40)}"
    if without is None:
        line = (f"{received}; the paths above are the chain rule without hooks, and whether hooks changed it is "
                f"unknown ({backward_pass.unknown[name]})")
    else:
        line = f"{received}: hooks changed it; the paths above are the chain rule without hooks"
    return dataclasses.replace(path_set, hooks=line)


def _register() -> None:
    """Hand ``BackwardPass.unreached`` / ``.first_nonfinite`` their answers (``model/`` imports nothing of this
    package)."""
    from ..model import provide

    provide(unreached=safe_unreached, first_nonfinite=safe_first_nonfinite)


_register()
