"""Which ``nn.Module`` call made each backward node (opt-in: ``%%lens --modules``, ``Lens(modules=True)``).

Autograd numbers the nodes a thread makes (``grad_fn._sequence_nr()``) and
``torch._C._autograd._get_sequence_nr()`` reads the next number without taking it (see ``capture.lines``).
For the length of the block, two *global forward* hooks note that number when any module's ``__call__``
starts and ends: a node was made inside the innermost call whose numbers include its own.  The hooks return
``None`` (inputs and outputs untouched), keep only a weak reference to the module, do nothing inside
``torch.compile``'s tracing, and are removed when the block ends.

This is opt-in because global forward hooks are not invisible: every module call takes ``nn.Module``'s hooked
path (same values, a few more frames in a traceback), and each call of a ``torch.compile(module)`` warns that
global hooks exist.  ``torch.compile`` would also trace them (other graphs around graph breaks, guards on every
module's hook dicts): while it compiles they are out of sight (``capture.compiled``).  Global *backward* hooks
are never used (see HOOK_FACTS: registering one kind forbids the other kind for the rest of the process).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import Any

import torch
from torch.nn.modules import module as _module

from ..model import ModuleGroup
from ..model.graph import attach_to_groups
from .compiled import HiddenWhileCompiling
from .lines import STATEMENT_WATCHERS, other_thread

_next_number = torch._C._autograd._get_sequence_nr
_is_compiling = torch.compiler.is_compiling
MAX_CALLS = 200_000  # module calls kept per block; past this, groups are unknown (a long training loop)


class ModuleCalls:
    """The module calls of one block: for each, the module (weakly), its class, and the node numbers
    [start, end) it made; calls nest (``parent``)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.refs: list[Any] = []  # weakref.ref to the module, or None when it takes no weak reference
        self.kinds: list[str] = []
        self.starts: list[int] = []  # increasing (calls are recorded as they start)
        self.ends: list[float] = []  # inf while the call runs
        self.parents: list[int] = []  # index of the enclosing call, -1 at top level
        self._open: list[int] = []
        self._same: dict[int, list[int]] = {}  # id(module) -> its calls (checked against the weak reference)
        self.numbers: list[int] = []  # each call's number among the calls of its module (1 for the first)
        self.ended_at: dict[int, list[int]] = {}  # end number -> the calls that ended there (read per pass: no scan)
        self.unknown = ""  # why calls cannot tell which module made a node, once known
        self._threads = 0
        self._handles: list[Any] = []
        self._hidden: HiddenWhileCompiling | None = None

    # ------------------------------------------------------------------ recording
    def __enter__(self) -> ModuleCalls:
        self._handles = [
            _module.register_module_forward_pre_hook(self._started),
            _module.register_module_forward_hook(self._ended, always_call=True),
        ]
        self._hidden = HiddenWhileCompiling(self._handles)
        self._hidden.watch()
        STATEMENT_WATCHERS.append(self._hidden.watch)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hidden is not None:
            self._hidden.close()
            if self._hidden.watch in STATEMENT_WATCHERS:
                STATEMENT_WATCHERS.remove(self._hidden.watch)
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def compile_note(self) -> str:
        """Why code compiled in the block may differ from a run without module groups (empty: it does not)."""
        return self._hidden.seen if self._hidden is not None else ""

    def _started(self, module: Any, args: Any) -> None:
        if _is_compiling():  # inside torch.compile's tracing: nothing to record, nothing traced
            return
        try:
            if self._hidden is not None and self._hidden.handler is None:
                self._hidden.watch()  # torch.compile may have loaded dynamo since (a compiled module calls this first)
            if threading.get_ident() != self.thread or self.unknown:
                return
            if threading.active_count() != self._threads:
                self._threads = threading.active_count()
                name = other_thread(self.thread)
                if name:
                    self.unknown = f"a thread ({name}) ran during the block, and autograd numbers each thread's nodes separately"
                    return
            if len(self.starts) >= MAX_CALLS:
                self.unknown = f"more than {MAX_CALLS:,} module calls were made in the block"
                return
            try:
                ref = weakref.ref(module)
            except TypeError:
                ref = None
            index, kind, start = len(self.starts), type(module).__name__, _next_number()
            same = self._same.setdefault(id(module), [])
            if same and not (self.refs[same[-1]] is not None and self.refs[same[-1]]() is module):
                same.clear()  # that id belonged to a module that is gone: this is another module
            # every list grows by one together (nothing below can raise)
            self.parents.append(self._open[-1] if self._open else -1)
            same.append(index)
            self.numbers.append(len(same))
            self._open.append(index)
            self.refs.append(ref)
            self.kinds.append(kind)
            self.starts.append(start)
            self.ends.append(float("inf"))
        except Exception:  # noqa: BLE001, S110 - a hook of the lens never raises into the user's forward
            pass

    def _ended(self, module: Any, args: Any, result: Any) -> None:
        if _is_compiling():
            return
        try:
            if threading.get_ident() != self.thread:
                return
            # the innermost open call of this module (a call whose pre-hook was skipped has none)
            for depth in range(len(self._open) - 1, -1, -1):
                index = self._open[depth]
                ref = self.refs[index]
                if ref is not None and ref() is module:
                    end = _next_number()
                    for inner in self._open[depth:]:  # calls left open inside it (no end seen) end with it
                        if end < self.ends[inner]:  # (open calls end once: then they leave _open)
                            self.ends[inner] = end
                            self.ended_at.setdefault(end, []).append(inner)
                    del self._open[depth:]
                    break
        except Exception:  # noqa: BLE001, S110 - a hook of the lens never raises into the user's forward
            pass

    # ------------------------------------------------------------------ reading
    def call_of(self, number: int | None) -> int | None:
        """The index of the innermost call that made the node numbered ``number``."""
        if self.unknown or number is None or not self.starts:
            return None
        index = bisect.bisect_right(self.starts, number) - 1
        while index >= 0 and not number < self.ends[index]:
            index = self.parents[index]
        return index if index >= 0 else None

    def module(self, index: int) -> Any:
        ref = self.refs[index]
        return ref() if ref is not None else None

    def call_number(self, index: int) -> tuple[int, int]:
        """(this call's number, how many calls) of the module of call ``index``, counted over the block."""
        module = self.module(index)
        if module is None:
            return self.numbers[index], self.numbers[index]
        return self.numbers[index], len(self._same.get(id(module), ()))


def groups_for(graph: Any, calls: ModuleCalls, module_name: Any) -> tuple[ModuleGroup, ...]:
    """The module calls that made nodes of ``graph``, innermost first for each node, as groups of node ids.

    Backward functions go to the call that made them (by number); a named tensor goes with the function that
    made it, a saved value or constant with the function that keeps it.  Leaves (parameters, inputs) are not
    made by a forward: they stay outside (inside, a layer's parameters would also push each layer's outline
    beside the last one in a top-to-bottom drawing).  ``module_name(module)`` gives the notebook's name for a
    module (``None`` if it has none).
    """
    made: dict[str, int] = {}
    ended_at = calls.ended_at  # (not built from calls.ends here: that grew with every call of the block)
    for node in graph.nodes:
        if node.kind == "function":
            index = calls.call_of(node.sequence_nr)
            if node.op == "BackwardHookFunctionBackward":
                index = _output_boundary(node.sequence_nr, ended_at, calls, index)
            if index is not None:
                made[node.id] = index
    if not made:
        return ()
    attach_to_groups(graph, made)
    # the calls drawn, with every call that encloses one of them, in the order they started
    used = set()
    for index in set(made.values()):
        while index >= 0 and index not in used:
            used.add(index)
            index = calls.parents[index]
    order = sorted(used)
    position = {index: number for number, index in enumerate(order)}
    paths: dict[int, str | None] = {}
    for index in order:
        module = calls.module(index)
        paths[index] = module_name(module) if module is not None else None
    members: dict[int, list[str]] = {index: [] for index in order}
    for node in graph.nodes:
        if node.id in made:
            members[made[node.id]].append(node.id)
    groups = []
    for index in order:
        call, count = calls.call_number(index)
        parent = calls.parents[index]
        groups.append(ModuleGroup(
            id=f"m{position[index] + 1}", path=paths[index], kind=calls.kinds[index], call=call, calls=count,
            parent=position[parent] if parent >= 0 else None, nodes=tuple(members[index]),
        ))
    return tuple(groups)


def _output_boundary(number: int | None, ended_at: dict, calls: ModuleCalls, index: int | None) -> int | None:
    """torch makes a hooked module's output-side hook boundary right after the call ends (after the forward
    hooks, so after the lens noted the end): a boundary numbered exactly where calls ended belongs to the
    outermost of them whose module has backward hooks.  Otherwise (the input side, made inside the call, or a
    forward hook made nodes in between) the call that was running keeps it."""
    for candidate in sorted(ended_at.get(number, ())):  # in start order: outermost first
        module = calls.module(candidate)
        if module is not None and (getattr(module, "_backward_hooks", None) or getattr(module, "_backward_pre_hooks", None)):
            return candidate
    return index
