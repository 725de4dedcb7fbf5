"""``Lens``: record every backward pass run inside a ``with`` block, hooks included.

For the length of the block, torch's single entry to the engine (``torch.autograd._engine_run_backward``) is wrapped and
put back when the block ends, whatever happens. Each pass is observed by :mod:`.observe`, its values without hooks
computed by :mod:`.unhooked`, and what its model needs read by :mod:`.build` as it ends (the lens keeps nothing of the
graph); the model is made from those records when the passes are first read (:mod:`.deferred`).
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..debug import DebugRecording
from ..model import GraphOptions, Note, values_equal
from ..notes import note
from .build import read_pass, relabel
from .deferred import DeferredPasses
from .draft import PassDraft
from .counting import HookCounter
from .ending import touched
from .leafstate import pass_marks
from .entry import _check_options, _collector_paused, _untraceable  # noqa: F401  (api.py reads _check_options)
from .entry import UNTRACED, _pause_collector, _resume_collector, LeftAlone, unfreed
from . import registrations
from .lines import CellLines
from .modules import ModuleCalls
from .names import caller_namespace, user_frame
from .observe import PassObserver
from .stack import install as install_warn, lens_frame, uninstall as uninstall_warn
from .snapshot import hidden_from_user, snapshot
from .unhooked import Unknown
from .structure import pass_structure as structure  # (its users made; one argument: tests replace it)
from .walk import leaf_state, walk
from .rows import without_saved as _without_saved
from .annotate import _groups, _module_hooks, _sources, unfired_module_hook_notes
from .ledger import Ledger, _sequence_nr
from .records import budget_note
from .selfcheck_run import _SELF_CHECK, _self_check  # noqa: F401  (tests read tracer._SELF_CHECK)
from .shared import own_seeds
from .showing import LensViews

# Graphs up to this many nodes are modelled before the pass (saved tensors included); larger ones after it.
EAGER_MODEL_LIMIT = 100

_ACTIVE: list["Lens"] = []
_NONLEAF_WARNING = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
_INPLACE_AFTER_HOOK = "of BackwardHookFunction is a view and is being modified inplace"
_hidden_from_modes = hidden_from_user  # the lens's tensor ops never reach a user's dispatch mode or profile


class Lens(LensViews, DeferredPasses):
    """Record every backward pass run inside a ``with`` block.

    >>> import torch, autograd_lens as al
    >>> x = torch.tensor(2.0, requires_grad=True)
    >>> with al.Lens() as lens:
    ...     y = x ** 2
    ...     _ = y.register_hook(lambda g: g * 0.5)
    ...     (y * 3 + y * 2).backward()
    >>> call = lens.hook_calls[0]
    >>> call.target, float(call.grad_in), float(call.grad_out), float(x.grad)
    ('y', 5.0, 2.5, 10.0)
    >>> float(lens.passes[0].grads_without_hooks["x"])
    20.0

    ``names`` is the namespace used for labels (default: the namespace of the code that calls ``backward()``).
    Gradients with more than ``store_limit`` elements are kept as summaries, as are later values (nodes', hooks', .grad) past
    ``memory_budget`` bytes of kept values (all of the Lens's passes together).  ``modules=True`` groups each pass's
    nodes by the ``nn.Module`` call that made them (``BackwardPass.groups``; drawn as outlines): it adds two global
    forward hooks for the length of the block,
    which ``torch.compile(module)`` warns about (see ``capture.modules``).  ``why=True`` records the block's
    forward ops with a ``TorchFunctionMode`` (what tells a ``.detach()`` from a ``no_grad`` block in
    ``passes[i].unreached``) and follows every path of each pass for ``paths_to`` (see ``autograd_lens.debug``);
    it slows the block down, and ``torch.compile`` inside it sees the mode.
    """

    def __init__(
        self,
        names: Mapping[str, Any] | None = None,
        *,
        store_limit: int = 4096,
        max_elements: int = 16,
        max_nodes: int = 300,
        memory_budget: int = 256 * 2**20,
        modules: bool = False,
        why: bool = False,
    ) -> None:
        _check_options(names, store_limit=(store_limit, 0), max_elements=(max_elements, 0),
                       max_nodes=(max_nodes, 1), memory_budget=(memory_budget, 0))
        self.names = names
        self.store_limit = store_limit
        self.memory_budget = memory_budget
        self.options = GraphOptions(max_elements=max_elements, max_nodes=max_nodes)
        self._init_passes()  # passes (BackwardPass), made from drafts when first read: see deferred.py
        self._history: dict[int, Any] = {}  # per leaf, across passes (see unhooked.LeafHistory)
        self._edited_seeds: dict[int, tuple] = {}  # id(gradient= tensor) -> (weakref, value now, value without hooks)
        self._invocations = HookCounter()  # calls of each registered hook, over the passes
        self._handles_before = 0  # torch's next hook handle id when the pass being recorded started
        self._ledger = Ledger()  # what holds for all of its passes: the first whose hooks changed gradients, bytes kept
        self._original: Any = None
        self._thread: int | None = None
        self._recording = False
        self._nested, self._warned = 0, False
        self._untraced: dict[str, int] = {}  # passes left alone, by kind (entry.UNTRACED): said in ``notes``
        self._notes: list[Note] = []  # classic mistakes seen outside any pass's record
        self._showwarning: Any = None
        self._hooks_before: set | None = None  # module hooks that existed when the block started
        self.cell_lines: CellLines | None = None  # set by %%lens: which cell line made each node
        if not isinstance(modules, bool):
            raise TypeError(f"modules must be True or False, not {modules!r}")
        self.modules = modules  # group nodes by the nn.Module call that made them (adds global forward hooks)
        self.module_calls: ModuleCalls | None = None
        if not isinstance(why, bool):
            raise TypeError(f"why must be True or False, not {why!r}")
        self._debug = DebugRecording(why)  # why=True: forward ops recorded for .unreached, paths for paths_to

    def __enter__(self) -> "Lens":
        if _ACTIVE:
            raise RuntimeError(
                "a Lens is already recording; nested Lens blocks are not supported. "
                "End the outer `with Lens()` (or %%lens cell) first."
            )
        _self_check(Lens)
        self._original = torch.autograd._engine_run_backward
        self._thread = threading.get_ident()
        lens = self

        def traced_run_backward(t_outputs, *args, **kwargs):
            __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
            return lens._run(t_outputs, args, kwargs)

        torch.autograd._engine_run_backward = traced_run_backward
        lens_frame(traced_run_backward.__code__)
        install_warn()  # warnings raised in a pass point past the lens's two frames, as without it
        registrations.install(self._invocations.dicts, self._thread)  # hooks in C on tensors that lose their name
        _ACTIVE.append(self)
        if self.modules:
            self.module_calls = ModuleCalls().__enter__()
        self._debug.start()
        self._watch_warnings()
        try:
            self._hooks_before = _module_hooks(self._namespace(sys._getframe(1)))
        except Exception:
            self._hooks_before = None
        return self

    def __exit__(self, exc_type: Any = None, exc: Any = None, traceback: Any = None) -> None:
        torch.autograd._engine_run_backward = self._original
        uninstall_warn()
        registrations.uninstall()
        _ACTIVE.remove(self)
        if self.module_calls is not None:
            self.module_calls.__exit__()
        self._debug.stop()
        if warnings.showwarning == self._showwarning_wrapper:  # ==: each attribute read makes a new bound method
            warnings.showwarning = self._showwarning
        try:
            if exc is not None:
                self.saw_error(exc)
            self._check_module_hooks(sys._getframe(1))
        except Exception as problem:  # notes are advice: never a reason to fail
            self._recording_notes.append(f"notes incomplete ({type(problem).__name__}: {problem})")

    # ------------------------------------------------------------------ notes needing live objects
    def _watch_warnings(self) -> None:
        """See torch's "non-leaf .grad" warning as it is shown; what is shown (and where) is unchanged."""
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._showwarning_wrapper

    def _showwarning_wrapper(self, message: Any, category: Any, filename: Any, lineno: Any, file: Any = None,
                             line: Any = None) -> Any:
        try:
            if str(message).startswith(_NONLEAF_WARNING) and not any(n.code == "nonleaf_grad" for n in self._notes):
                self._notes.append(note("nonleaf_grad", self._count() - 1 if self._count() else None))
        except Exception:
            pass
        return self._showwarning(message, category, filename, lineno, file, line)

    def saw_error(self, error: BaseException) -> None:
        """The block (or a %%lens cell) raised: a note if it is a classic mistake."""
        if _INPLACE_AFTER_HOOK in str(error):
            self._notes.append(note("full_hook_then_inplace"))

    def _namespace(self, frame: Any) -> dict:
        return dict(self.names) if self.names is not None else caller_namespace(user_frame(frame))

    def _check_module_hooks(self, frame: Any) -> None:
        """Module backward hooks registered in this block on a named module that no pass went through (``frame``: the
        block's, its namespace copied only when a pass ran)."""
        if not self._count() or self._hooks_before is None:
            return
        added = _module_hooks(namespace := self._namespace(frame)) - self._hooks_before
        if not added:  # (the usual case: no pass's calls are read, however many passes the Lens holds)
            return
        self._notes += unfired_module_hook_notes(added, self.passes, self._notes, namespace)

    def _say(self, text: str, stacklevel: int = 4) -> None:
        """A problem of the lens itself: a note, and at most one quiet warning per Lens."""
        self._recording_notes.append(text)
        if not self._warned:
            self._warned = True
            warnings.warn(f"autograd_lens: {text}", RuntimeWarning, stacklevel=stacklevel)

    def _left_alone(self, kind: str) -> None:
        """A pass of the user's program that the lens does not record (not one torch.compile makes): counted, for
        the note that says so, and a recording note the first time."""
        if kind in UNTRACED:
            if kind not in self._untraced:
                self._recording_notes.append(f"{UNTRACED[kind]} ran a backward pass: not recorded (left alone)")
            self._untraced[kind] = self._untraced.get(kind, 0) + 1

    def _run(self, t_outputs: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True  # noqa: F841
        original = self._original
        if threading.get_ident() != self._thread:  # another thread's backward: neither traced nor touched
            self._left_alone("thread")
            return original(t_outputs, *args, **kwargs)
        if self._recording:  # a backward run inside a hook: not mixed into the outer pass
            self._nested += 1
            try:
                return original(t_outputs, *args, **kwargs)
            finally:
                self._nested -= 1
        try:
            untraceable = _untraceable(args)
        except Exception:  # cannot tell: leave the pass alone
            untraceable = "compile"
        if untraceable:
            return self._left_alone(untraceable) or original(t_outputs, *args, **kwargs)
        failure: Exception | None = None
        registrations.skipped_by_dynamo()  # (torch.compile imported since the Lens started)
        try:
            collecting = _pause_collector()
            try:
                with _hidden_from_modes():
                    observer = self._observer(t_outputs, args, kwargs, sys._getframe(1))
            finally:
                _resume_collector(collecting)
        except LeftAlone as kind:  # reading its values could crash the process: torch runs it alone
            return self._left_alone(str(kind)) or original(t_outputs, *args, **kwargs)
        except Exception as problem:  # e.g. the roots need no grad: the engine says so in its own words
            failure = problem
        if failure is not None:
            # Outside the except block: the user's error, if the engine raises one, comes out as it would without
            # the lens (no "During handling of the above exception" with the lens's own error in front of it).
            result = original(t_outputs, *args, **kwargs)
            self._say(f"could not trace a backward pass ({type(failure).__name__}: {failure}); it ran untraced")
            return result
        try:
            collecting = _pause_collector()
            try:
                with torch._C.DisableTorchFunction():  # its reads of subclass tensors call no __torch_function__
                    # which leaves' .grad code wrote since their last pass (before this pass writes any):
                    observer.touched = {key: touched(entry) for key, entry in self._history.items()}
                    observer.pass_marks = pass_marks(self._history)  # (leafstate.changed_off_graph reads them)
                    observer.made_by_hooked = self._ledger.made_by_hooked
                    observer.start()
            finally:
                _resume_collector(collecting)
        except Exception as problem:
            observer.stop()
            observer.release()
            self._say(f"could not trace a backward pass ({type(problem).__name__}: {problem}); it ran untraced")
            failure = problem
        if failure is not None:  # outside the except block, as above
            return original(t_outputs, *args, **kwargs)
        self._recording = True
        self._handles_before = RemovableHandle.next_id  # registrations older than the pass were there when it ran
        first_made = _sequence_nr()
        result: Any = None
        try:
            result = original(t_outputs, *args, **kwargs)
            return result
        except BaseException as raised:
            try:
                observer.fail(raised)
            except Exception as problem:  # the user's exception comes out unchanged, whatever happens here
                observer.note(f"recording incomplete at the error: {type(problem).__name__}: {problem}")
            raise
        finally:
            observer.stop()
            self._recording = False
            self._ledger.note_made(observer, first_made, self._count() + 1)
            collecting = _pause_collector()
            try:
                self._finish(observer, result)
            finally:
                _resume_collector(collecting)

    def _observer(self, t_outputs: Any, args: tuple, kwargs: dict, caller: Any) -> PassObserver:
        roots = tuple(t_outputs) if isinstance(t_outputs, (tuple, list)) else (t_outputs,)
        inputs = args[3] if len(args) > 3 else kwargs.get("inputs", ())
        accumulate = args[5] if len(args) > 5 else kwargs.get("accumulate_grad", True)
        seeds = tuple(args[0]) if args and args[0] is not None else ()
        if self.names is not None:
            namespace = dict(self.names)
        else:  # a shallow copy: names are looked up as the variables were during this pass
            namespace = caller_namespace(user_frame(caller))
        observer = PassObserver(
            structure=unfreed(structure(roots)), roots=roots, seeds=seeds, inputs=tuple(inputs or ()),
            kind="backward" if accumulate else "grad", namespace=namespace, store_limit=self.store_limit,
            memory_budget=self.memory_budget, nested=lambda: self._nested > 0,
        )
        observer.earlier_dicts, observer.untraced = self._invocations.dicts, self._untraced  # (weak), (left alone)
        if self.memory_budget is not None:  # the budget holds for the Lens: its earlier passes' values count
            observer.bytes_held = observer.earlier_bytes = self._earlier_bytes()
            if observer.bytes_held > self.memory_budget:
                observer.over_budget = True
                observer.note(budget_note(self.memory_budget, observer.earlier_bytes))
        if _SELF_CHECK.get("result"):
            observer.note(f"hook calls not recorded: {_SELF_CHECK['result']}")
            observer.profiling_allowed = False
        observer.own_seeds = own_seeds(caller.f_back, seeds)  # caller.f_back: torch's backward() or grad()
        self._restore_seeds(observer, seeds)
        if len(observer.shape.nodes) <= EAGER_MODEL_LIMIT:
            # small graphs: read saved tensors and values now, they are gone after the pass
            observer.walk = walk(observer.shape, observer.ensure_names(), self.options)
        else:  # large graphs: keep what the pass will change (leaf values), draw after it
            observer.leaf_state = leaf_state(observer.shape, _without_saved(self.options))
        observer.debug = self._debug.before_pass(observer)  # evidence for .unreached / paths_to (never raises)
        return observer

    def _restore_seeds(self, observer: PassObserver, seeds: tuple) -> None:
        """A ``backward(gradient=...)`` tensor that changed in place during an earlier pass in which hooks
        changed gradients (a hook, or AccumulateGrad through a ``.grad`` that aliases it): how it would have
        changed with no hook is not known, so nothing computed from it is."""
        for index, seed in enumerate(seeds):
            entry = self._edited_seeds.get(id(seed))
            if entry is None or entry[0]() is not seed:
                continue
            if values_equal(snapshot(seed, self.store_limit), entry[1]):  # untouched since that pass
                observer.seeds = observer.seeds[:index] + (entry[2],) + observer.seeds[index + 1:]
                observer.unhooked.activate(edited_in_place=True)

    def _remember_seeds(self, observer: PassObserver, seeds: tuple, index: int) -> None:
        for index, seed in enumerate(seeds):
            if not isinstance(seed, torch.Tensor):
                continue
            now = snapshot(seed, self.store_limit)
            changed = not values_equal(now, observer.start_seeds[index])
            if changed and (observer.unhooked.active or id(seed) in self._edited_seeds):
                reason = Unknown(f"the gradient passed to backward() changed in place during pass {index + 1}, "
                                 "while hooks changed gradients (a hook edited it, or a .grad that shares its memory "
                                 "was added to)")
                self._edited_seeds[id(seed)] = (weakref.ref(seed), now, reason)
            elif id(seed) in self._edited_seeds:
                entry = self._edited_seeds[id(seed)]
                self._edited_seeds[id(seed)] = (entry[0], now, entry[2])

    def _finish(self, observer: PassObserver, result: Any) -> None:
        """Read what the pass's model needs now, then let go of everything torch (graph, hooks, variables); the model
        is made from what was read when the passes are first read (deferred.py)."""
        with self._making:  # a model being made on another thread takes its place first
            index = self._count()
            try:  # with the collector paused (see _run): what is read is kept, then the pass's records die
                with _hidden_from_modes():
                    draft = self._build(observer, index, result)
            except Exception as problem:
                self._say(f"could not record backward pass {index + 1} ({type(problem).__name__}: {problem})")
            else:
                self._keep(draft)
            finally:
                observer.release()
                self._forget_dead_leaves()

    def _build(self, observer: PassObserver, index: int, result: Any) -> PassDraft:
        observer.seal(result)
        self._remember_seeds(observer, observer.seed_objects, index)
        names = observer.ensure_names()
        graph_walk = observer.walk
        if graph_walk is None:
            options = _without_saved(self.options)
            graph_walk = walk(observer.shape, names, options, leaf_state=observer.leaf_state)
        # (without module groups only the number of boxes is read: the Graph is made from its rows after the pass)
        grouped = _groups(graph_walk.graph if self.modules else graph_walk.rows, self.module_calls, names,
                          self.modules)
        relabel(graph_walk, grouped.pop("relabel", {}))  # before the steps are made: they use the same names
        self._invocations.begin(observer.chains, observer.records, self._handles_before)
        draft = read_pass(observer, graph_walk, index, self._history, self._invocations, result)
        # the cell lines are read now: the CellLines of a %%lens cell changes as the cell goes on
        draft.extra = {**_sources(graph_walk.rows, self.cell_lines), **grouped, **self._ledger.at_end(observer),
                       "debug": observer.debug, "kept_bytes": max(0, observer.bytes_held - observer.earlier_bytes)}
        return draft

    def _forget_dead_leaves(self) -> None:
        if len(self._history) > 64:
            for key in [key for key, entry in self._history.items() if entry.ref() is None]:
                del self._history[key]


lens_frame(Lens._run.__code__)
registrations.RUN_ALONE.extend(code.__code__ for code in (Lens._observer, Lens._finish, Lens._say, Lens._count))
