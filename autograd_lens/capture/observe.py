"""Observe one backward pass: which node ran, what it received and sent, and every user hook call.

Read beside ``shared/HOOK_FACTS.md``.  For the length of one engine run:

* a post-hook returning ``None`` sits on every node of the graph (registered
  last, removed in ``finally``): it sees what the node received (after hooks)
  and what it sent.  Leaves that already have a ``.grad``, or that have
  post-accumulate hooks, also get a pre-hook on their ``AccumulateGrad`` that
  reads the old ``.grad`` and the incoming gradient before the write;
* a profile function — only when no other profiler (cProfile, ``%prun``,
  ``torch.profiler``) holds the slot — sees each user hook being called by the
  engine, with its arguments and its return value.  Only calls made while
  torch's C++ ``run_backward`` runs count, so whatever the Python wrapper calls
  around it (``logging``) is never taken for a hook, wherever the standard
  library is installed.

Every gradient is copied (or summarised, above ``store_limit`` elements) the
moment it is seen, so the lens holds no reference to a tensor autograd uses:
``AccumulateGrad`` adopts buffers exactly as without the lens, and nothing
outlives the pass.  The lens's own tensor work is hidden from user dispatch
modes.  Any failure of the lens becomes a note on the pass; it never reaches
the user's ``backward()``.

The observer is one object in four parts: this module sets it up and tears it down (which hooks are attached,
where), ``calls.py`` is the profile function (hook calls), ``nodes.py`` the node observers (what each node got
and sent, and where each call belongs), ``ending.py`` an error or the end of the pass; ``records.py`` holds what
they record, which ``build.py`` turns into the pass's model afterwards.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

import torch

from ..compat import RUN_ALONE, other_profiler
from .attach import attach, detach
from .calls import HookCalls
from .ending import PassEnd
from ..model import Value
from .ledger import made_by
from .hooks import TORCH_DIR, Wrapper, code_of, may_edit_in_place, multi_grad_user_fn, runs_python
from .torchhooks import users_torch_hook
from .late import LATE_CODE
from .late import restore as restore_late_hooks
from .inventory import listed
from .leafstate import watch
from .names import Names, names_from
from .nodes import NodeRecorder
from .order import describe_c_hooks
from .records import HookRecord, KnownHook
from .snapshot import snapshot
from .unhooked import Unhooked
from .boundaries import BOUNDARY, repeated
from .counting import earlier_hooks
from .structure import Structure, gradient_edge

DEEP_GRAPH = 30_000  # chains deeper than this may crash torch when freed after a Python walk (measured: 40k ok, 50k not)


COMPILED = ("a torch.compile'd backward: hooks registered inside the compiled forward (on its activations) are traced "
            "into it and run there, where no hook call can be seen, so what it would send without them is not known")


class PassObserver(HookCalls, NodeRecorder, PassEnd):
    made_by_hooked: list = []  # Ledger.made_by_hooked of the Lens, set before start()
    """Records one engine run.  ``start()`` before it, ``stop()`` after it (always)."""

    # the lens's own hooks, which the profile function must not take for the user's
    _own_codes = frozenset({NodeRecorder._on_node.__code__, NodeRecorder._before_write.__code__, LATE_CODE})

    def __init__(self, *, structure: Structure, roots: tuple, seeds: tuple, inputs: tuple, kind: str,
                 namespace: dict, store_limit: int, memory_budget: int | None, nested: Any) -> None:
        self.shape = structure
        self.roots = roots
        self.inputs = inputs
        self.kind = kind
        self.namespace = namespace
        self.store_limit = store_limit
        self.memory_budget = memory_budget
        self.nested = nested  # callable: True while a backward runs inside a hook
        self.thread = threading.get_ident()
        self.records: list[Any] = []
        self.pending: list[HookRecord] = []
        self.current: HookRecord | None = None
        self.engine_frame: FrameType | None = None
        self.in_engine = False
        self.wrapper: Wrapper | None = None
        self.profiling = False
        self.handles: list[Any] = []  # the lens's pre-hooks (leafstate.watch); its post-hooks: post_hooks, own_key
        self.post_hooks: list = []  # per node of shape.nodes: its post-hook dict, where the lens's hook is (attach.py)
        self.own_key = object()  # the key of the lens's hook in those dicts
        self.notes: list[str] = []
        self.broken = False
        self.bytes_held = 0  # bytes of kept values, this Lens's earlier passes' included (memory_budget is per Lens)
        self.earlier_bytes = 0  # of which earlier passes hold
        self.over_budget = False
        self.ran: dict[int, int] = {}  # id(fn) -> index of its record
        self.names: Names | None = None
        self.known_hooks: dict[Any, list[KnownHook]] = {}
        self.unseen_hooks: list[KnownHook] = []  # hooks written in C (list.append, torch.neg): no frame to see
        self.unseen_multi: list[KnownHook] = []  # multi-grad hooks written in C, by the tensors they watch
        self.earlier_dicts: dict = {}  # the Lens's weak references to hook dicts of tensors named in earlier passes
        self.chains: dict[tuple[int, int], list[KnownHook]] = {}  # (id(node), output) -> its tensor's hooks, in order
        self.after_chains: dict[int, list[KnownHook]] = {}  # id(AccumulateGrad) -> post-accumulate hooks, in order
        self.node_hooks: dict[int, tuple[tuple, tuple]] = {}  # id(node) -> (pre-hooks, post-hooks) of the user
        self.nested_frames: list[FrameType] = []  # engine frames of backward runs inside this pass, innermost last
        self.nested_wrapper: Wrapper | None = None
        self.nested_running = False  # the innermost nested engine is running (C++), not its Python wrapper
        self.watched, self.start_marks, self.changed_before_write = set(), {}, set()  # (leafstate.watch): id(leaf)
        self.c_nodes: set[int] = set()  # id(node) with a hook written in C of its own or on one of its tensors
        self.edited_in_place = False  # a hook seen in this pass edited the gradient it received, in place
        self.edits: list = []  # (memory it wrote (shared.span_of), value before) per such edit, or invented call
        self.nested_nodes: dict[int, str] = {}  # id(node) -> name: nodes that ran a backward inside this pass
        self.nested_hooks: list[str] = []  # hooks that ran in those nested backwards
        self.nested_c: dict[int, list[str]] = {}  # id(node) -> hooks in C registered on what its recompute made
        self.first_new = torch._C._autograd._get_sequence_nr()  # nodes made during the pass number from here
        self.nested_grads: dict | None = None  # named leaves outside the graph: .grad before a nested backward
        self.nested_written: list[str] = []  # named leaves whose .grad a nested backward wrote
        self.foreign_calls: list[str] = []  # Python code called during the pass that is no gradient hook
        self.foreign_writes = False  # some of it may write .grad (not only the standard library's: calls._foreign)
        self.boundaries: dict[int, tuple[Any, str]] = {}  # id(BackwardHookFunctionBackward) -> (module, side)
        self.leaf_ids: set[int] = set()
        self.claimed: set[int] = set()  # id(KnownHook) already matched to a call in this pass
        self.old_grads: dict[int, Value] = {}  # id(AccumulateGrad) -> .grad before this pass wrote it
        self.incoming: dict[int, Value] = {}  # id(AccumulateGrad) -> the gradient it was about to add
        self.written: dict[int, Value] = {}  # id(AccumulateGrad) -> .grad right after the write
        self.unpack_codes: set[Any] = set()
        # id(tensor) -> (weakref, version, copy): a gradient one node sent and the next received is copied once
        self.copies: dict[int, tuple[Any, int, Value]] = {}
        # node post-hooks registered while their node runs (late.py): wrapped for the pass, put back after it
        self.late_before: set[int] = set()
        self.late_wrapped: list[tuple[Any, int, Any, Any]] = []
        self.post_dicts: dict[int, int] | None = None
        self.hook_dicts: dict[int, tuple[Any, Any]] = {}  # id(node) -> its (pre, post) hook dicts, nodes with user hooks
        self.python_received, self.python_inside = {}, set()  # calls.py: id(node) -> what it got; CopySlices ids
        self.python_edits: list = []  # memory a custom Function's backward edited in place (nodes._received)
        self.node_hook_calls: dict[tuple, int] = {}  # (id(node), pre?, code) -> calls so far (calls._node_hook_function)
        self.registering: Any = None
        self.tensor_registering, self.tensor_dict_new = None, False  # register_hook mid-pass: frame, new dict? (late)
        self.late_frame: Any = None
        self.seeds = tuple(snapshot(seed, store_limit) if isinstance(seed, torch.Tensor) else None for seed in seeds)
        self.start_seeds = self.seeds  # as they were when the pass started (self.seeds: as they would be unhooked)
        self.seed_objects = seeds  # the caller's gradient= tensors, until the pass is recorded
        self.own_seeds: frozenset[int] = frozenset(id(seed) for seed in seeds)  # ids of those the caller made
        self.unhooked = Unhooked(self)
        self.error: BaseException | None = None
        self.profiling_allowed = True
        self.hooks_hidden = False  # hook calls could not be seen (another profiler, or the self-check failed)
        self.inventory: tuple = ()  # the hooks attached when the pass started (see inventory.py)
        self.walk: Any = None  # the graph's model, when drawn before the pass
        self.leaf_state: Any = None  # leaf values read before the pass, when drawn after it
        self.listed: list | None = None  # (label, tensor) with hooks, read as the names are (see listed())

    # ------------------------------------------------------------------ set-up / tear-down
    def start(self) -> None:
        observe = self._on_node
        self.post_hooks, pre_hooks = attach(self.shape.nodes, observe, self.own_key)
        self._read_node_hooks(observe, pre_hooks)
        made, boundaries = self.made_by_hooked, []
        for fn in self.shape.nodes:  # torch.compile traces hooks registered in its forward into its backward
            if (kind := type(fn).__name__) == "CompiledFunctionBackward":
                self.unhooked.unknown_from(fn, COMPILED)
            elif made and (why := made_by(made, fn)) is not None:
                self.unhooked.unknown_from(fn, why)
            if kind == BOUNDARY:  # a module hook's (boundaries.py)
                boundaries.append(fn)
        repeated(self.unhooked, self.shape, boundaries)
        variables = self.shape.variables()
        self.leaf_ids.update(self.shape.by_variable())
        for key, fn in self.shape.leaves.items():
            if (variable := variables[key]).grad is not None or getattr(variable, "_post_accumulate_grad_hooks", None):
                watch(self, fn, variable)
        if self.shape.depth > DEEP_GRAPH:
            self.note(f"this graph is {self.shape.depth:,} functions deep: torch keeps a Python object for every "
                      "function any Python code has looked at (this lens included), and freeing a chain that deep "
                      "can overflow the C stack (pytorch issue 109948)")
        try:
            from .inventory import inventory

            self.inventory = inventory(self)  # before the pass: what is attached now, in registration order
        except Exception as problem:  # an inventory is a help, never a reason to fail
            self.note(f"the hooks attached before the pass could not be listed: {type(problem).__name__}: {problem}")
        c_node_hooks = []
        for key, (pre, post) in self.node_hooks.items():
            c_hooks = [hook for hook in pre + post if not runs_python(hook)]
            if c_hooks:
                self.c_nodes.add(key)
                c_node_hooks += c_hooks
        self.c_nodes.update(id(known.grad_fn) for known in self.unseen_hooks)
        if c_node_hooks:  # only an in-place function could edit what it gets where no frame shows it
            self.unhooked.activate(edited_in_place=True, seen=not any(map(may_edit_in_place, c_node_hooks)))
            self.note("a hook written in C on a backward function (" + describe_c_hooks(c_node_hooks) + ") runs "
                      "without a Python frame: its calls are shown in their place, with the gradients around them")
        in_graph = self.shape.node_ids() if self.unseen_hooks else ()
        unseen = [known for known in self.unseen_hooks if id(known.grad_fn) in in_graph]
        if unseen:  # found with the names, which the inventory looked up
            # A hook written in C runs without a Python frame: what it returned is known only from what reached
            # the next step, so every node's "without hooks" value is checked against what it really received.
            self.unhooked.activate(edited_in_place=True,
                                   seen=not any(may_edit_in_place(known.function) for known in unseen))
            self.note("a hook written in C (" + describe_c_hooks([known.function for known in unseen])
                      + ") runs without a Python frame: its calls are shown from the gradients around it")
        defaults = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if defaults is not None:  # pack/unpack hooks active during backward (double backward) are not gradient hooks
            self.unpack_codes.update(code for code in map(code_of, defaults) if code is not None)
        if not self.profiling_allowed:
            self.hooks_hidden = True
        elif (profiler := other_profiler()) is None:  # sys.getprofile() misses cProfile on Python >= 3.12
            self.profiling = True
            sys.setprofile(self._profile)
        else:
            self.hooks_hidden = True
            self.note(f"hook calls not attributed: another profiler ({profiler}) is active, so only the backward "
                      "functions were recorded")

    def _read_node_hooks(self, observe: Any, pre_hooks: list) -> None:
        """Each node's own pre- and post-hooks, in registration order, from the hook dicts torch keeps on the
        node (``grad_fn.register_prehook`` / ``register_hook`` of the user), as ``attach`` found them."""
        for fn, posts, pres in zip(self.shape.nodes, self.post_hooks, pre_hooks):
            # usually the lens's own hook alone: nothing to go through
            post = tuple(hook for hook in posts.values() if hook is not observe and _users(hook)) \
                if posts and len(posts) > 1 else ()
            pre = tuple(hook for hook in pres.values() if _users(hook)) if pres else ()
            if pre or post:
                self.node_hooks[id(fn)] = (pre, post)
                self.hook_dicts[id(fn)] = (pres, posts)  # read again when hooks in C are placed

    def node_hook_ids(self, fn: Any, pre: bool) -> frozenset | None:
        """ids of the functions in ``fn``'s pre- or post-hook dict now (None: not known), read without changing the
        dict (torch may be going through it)."""
        dicts = self.hook_dicts.get(id(fn))
        hooks = dicts[0 if pre else 1] if dicts is not None else None
        try:
            return frozenset(id(hook) for hook in hooks.values()) if hooks is not None else None
        except Exception:  # changed while read
            return None

    def stop(self) -> None:
        if self.profiling and sys.getprofile() == self._profile:
            sys.setprofile(None)
        self.profiling = False
        restore_late_hooks(self)
        detach(self.post_hooks, self.own_key)
        self.post_hooks = []
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def release(self) -> None:
        """Let go of torch's graph, the hooks, the caller's variables and every live tensor."""
        self.records = []
        self.pending = []
        self.current = None
        self.engine_frame = None
        self.wrapper = None
        self.names = None
        self.namespace = {}
        self.known_hooks = {}
        self.unseen_hooks, self.unseen_multi = [], []
        self.chains, self.after_chains, self.node_hooks, self.hook_dicts = {}, {}, {}, {}
        self.nested_frames, self.nested_wrapper = [], None
        self.walk = self.leaf_state = self.listed = None
        self.roots = self.inputs = self.seeds = self.start_seeds = self.seed_objects = ()
        self.old_grads, self.incoming, self.written = {}, {}, {}
        self.copies, self.hook_positions = {}, None  # (hook_positions: ending.late_change's, holds nodes)
        self.post_dicts, self.registering, self.late_frame, self.tensor_registering = None, None, None, None
        self.unhooked = Unhooked(None)  # type: ignore[arg-type]  # empty, and no cycle with this observer
        self.error = None
        self.shape = None  # type: ignore[assignment]
        self.debug = None  # the pass's model holds its evidence
        self.nested = _not_nested  # the Lens's callable: a released observer keeps no Lens

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _failed(self, where: str, problem: BaseException) -> None:
        """A failure of the lens itself: stop recording this pass, say so, never raise."""
        self.broken = True
        self.current = None
        self.note(f"recording incomplete at {where}: {type(problem).__name__}: {problem}")

    def ensure_names(self) -> Names:
        """Look up names (and the hooks on named tensors) once, when first needed."""
        if self.names is None:
            self.names = names_from(self.namespace)
            root_names = [self.names.tensor_name(root) if isinstance(root, torch.Tensor) else None for root in self.roots]
            self.shape.label(self.names, root_names)
            self._index_hooks()
        return self.names

    def _index_hooks(self) -> None:
        """Map each hook function found on a known tensor to the tensor it is attached to."""
        names = self.names
        shape = self.shape
        leaf_nodes = shape.by_variable()
        self.listed = labelled = listed(names, shape, self.inputs)  # (the inventory's too)
        seen: set[int] = set()
        for label, tensor in labelled:
            hooks = tensor._backward_hooks
            after = getattr(tensor, "_post_accumulate_grad_hooks", None)
            if not hooks and not after or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if tensor.grad_fn is not None:
                grad_fn, output_nr = tensor.grad_fn, tensor.output_nr
            elif id(tensor) in leaf_nodes:
                grad_fn, output_nr = leaf_nodes[id(tensor)], 0
            elif tensor.requires_grad and (edge := gradient_edge(tensor)) is not None:
                grad_fn, output_nr = edge
            else:
                continue
            entries = list((hooks or {}).items())
            rank = min(entries)[0] if entries else None
            chain = self.chains.setdefault((id(grad_fn), output_nr), [])
            for position, (key, hook) in enumerate(entries):
                user = multi_grad_user_fn(hook)
                known = KnownHook(hook if user is None else user, "tensor" if user is None else "multi_grad", label,
                                  grad_fn, output_nr, position, len(entries), rank, hooks, key)
                self._remember(known)
                chain.append(known)
            holder = after
            after = list((after or {}).items())
            for position, (key, hook) in enumerate(after):
                known = KnownHook(hook, "post_accumulate_grad", label, grad_fn, output_nr, position, len(after),
                                  holder=holder, key=key)
                self._remember(known)
                self.after_chains.setdefault(id(grad_fn), []).append(known)
        self._index_earlier_hooks()

    def _index_earlier_hooks(self) -> None:
        """Hooks of tensors named in an earlier pass and not now, still attached (see counting.earlier_hooks)."""
        for known in earlier_hooks(self.earlier_dicts, self.chains, self.shape.nodes):
            self._remember(known)
            self.chains.setdefault((id(known.grad_fn), known.output_nr), []).append(known)

    def add_registered(self, tensor: Any, handle: Any) -> None:
        """A hook registered during the pass (by a hook) on a named tensor, or in C on any tensor: known from now on,
        as those attached before the pass are (which registered function a call is, where a hook in C runs); on a
        tensor with no name, on its drawn label (target None), as ``counting.earlier_hooks`` does."""
        names = self.names
        hooks = getattr(tensor, "_backward_hooks", None) if isinstance(tensor, torch.Tensor) else None
        if names is None or not hooks or getattr(handle, "id", None) not in hooks:
            return
        leaf = next((fn for fn in self.shape.leaves.values() if fn.variable is tensor), None)
        label = names.tensors.get(id(tensor)) or (self.shape.leaf_labels.get(id(leaf)) if leaf is not None else None)
        if tensor.grad_fn is not None:
            grad_fn, output_nr = tensor.grad_fn, tensor.output_nr
        elif leaf is not None:
            grad_fn, output_nr = leaf, 0
        else:
            return
        hook = hooks[handle.id]
        if label is None and runs_python(hook):
            return  # a tensor with no name here: its Python hooks are found as they run, as before the pass
        user = multi_grad_user_fn(hook)
        entries = list(hooks.items())
        chain = self.chains.setdefault((id(grad_fn), output_nr), [])
        known = KnownHook(hook if user is None else user, "tensor" if user is None else "multi_grad", label, grad_fn,
                          output_nr, [key for key, _ in entries].index(handle.id), len(entries), min(entries)[0],
                          hooks, handle.id)
        for other in chain:
            if other.holder is hooks:
                other.count = len(entries)
        chain.append(known)
        self._remember(known)
        if not runs_python(known.function):  # runs without a frame: found from the gradients around it
            self.c_nodes.add(id(grad_fn))
            self.unhooked.activate(edited_in_place=True, seen=not may_edit_in_place(known.function))

    def _remember(self, known: KnownHook) -> None:
        code = code_of(known.function)
        if code is not None and runs_python(known.function):
            self.known_hooks.setdefault(code, []).append(known)
        elif known.kind == "multi_grad":  # torch's Python wrapper calls it: seen as a c_call, matched by identity
            self.unseen_multi.append(known)
        else:
            self.unseen_hooks.append(known)

    # the profile function: calls.py; the node observers: nodes.py; the end of the pass: ending.py


def _users(hook: Any) -> bool:
    """A hook of the user's, not one of torch's wrappers (module and legacy hooks, whose calls are seen inside):
    torch's own code too when the user registered it (``torchhooks.users_torch_hook``)."""
    code = code_of(hook)
    return code is None or not code.co_filename.startswith(TORCH_DIR) or users_torch_hook(hook)


def _not_nested() -> bool:
    return False


# torch.compile runs these as written, and all they call (compat.skipped_by_dynamo): no user code runs inside them
RUN_ALONE.extend(function.__code__ for function in (PassObserver._on_node, PassObserver._before_write,
                                                     PassObserver._profile, PassObserver.start, PassObserver.stop))
