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
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from ..compat import other_profiler
from ..model import TensorSummary, Value, values_equal
from .hooks import (
    ENGINE_CODE,
    TORCH_DIR,
    Wrapper,
    code_of,
    engine_call_args,
    runs_python,
    function_name,
    module_hook_kind,
    multi_grad_received,
    multi_grad_user_fn,
    user_function,
    wrapper_family,
    wrapper_module,
    wrapper_state,
)
from .names import Names, names_from
from .order import (UNSEEN, arrange_after, arrange_before, arrange_input_chain, describe_c_hooks, unseen_call,
                    until_error)
from .snapshot import fast_snapshot, held_bytes, hidden_from_user, snapshot
from .unhooked import Unhooked, Unknown
from .walk import Structure, saved_names

_current_node = torch._C._current_autograd_node
_hidden_from_modes = hidden_from_user  # the lens's tensor ops never reach a user's dispatch mode or profile
BEFORE_NODE = ("tensor", "node_pre", "multi_grad")
DEEP_GRAPH = 30_000  # chains deeper than this may crash torch when freed after a Python walk (measured: 40k ok, 50k not)  # hook kinds that run before their node's backward


@dataclass
class NodeRecord:
    """A backward function ran: what reached it (after hooks) and what it sent, as copies."""

    fn: Any
    received: tuple[Value, ...]
    sent: tuple[Value, ...]


@dataclass
class GradRecord:
    """``AccumulateGrad`` wrote a leaf's ``.grad``."""

    fn: Any
    received: Value  # what this pass added
    grad: Value  # .grad right after the write, before any post-accumulate hook


@dataclass
class HookRecord:
    """One user hook call while it is being recorded."""

    code: Any
    function: Any
    kind: str
    received: Any  # the live object the hook got (dropped when the call ends)
    grad_in: Any
    frame: FrameType | None  # while the hook runs
    candidates: list = field(default_factory=list)
    module: Any = None
    target: str | None = None
    node_fn: Any = None
    output_nr: int | None = None
    grad_out: Any = None
    returned_none: bool = True
    modified: bool = False
    error: str | None = None
    context: Any = None
    wrapper_seq: int | None = None
    current_fn: Any = None  # the node the engine was running the hook for (torch._C._current_autograd_node)
    edited_in_place: bool = False
    unseen: str | None = None  # a hook the profile function cannot see run (C code): how its values are known
    position: int | None = None  # its place among the hooks on its tensor, when known
    state: int | None = None  # id of the per-registration state of torch's wrapper (multi-grad hooks)
    slot: int | None = None  # a multi-grad hook (mode="all"): which watched tensor's hook called it


@dataclass
class KnownHook:
    """A hook found on a named tensor before the pass: where it is attached."""

    function: Any
    kind: str  # "tensor" / "post_accumulate_grad" / "multi_grad"
    target: str
    grad_fn: Any  # the node whose execution it precedes (AccumulateGrad for leaves)
    output_nr: int
    position: int = 0  # its place among the hooks of its kind on that tensor (registration order)
    count: int = 1  # how many hooks of its kind that tensor has
    rank: int | None = None  # when that tensor's hook dict was attached to the node (its first handle's id)


def snapshot_all(values: Any, limit: int) -> Any:
    """Copies (or summaries) of a tensor or a tuple of them; anything else becomes None."""
    if isinstance(values, (tuple, list)):
        return tuple(snapshot_all(item, limit) for item in values)
    return snapshot(values, limit) if isinstance(values, torch.Tensor) else None


class PassObserver:
    """Records one engine run.  ``start()`` before it, ``stop()`` after it (always)."""

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
        self.handles: list[Any] = []
        self.notes: list[str] = []
        self.broken = False
        self.bytes_held = 0
        self.over_budget = False
        self.ran: dict[int, int] = {}  # id(fn) -> index of its record
        self.names: Names | None = None
        self.known_hooks: dict[Any, list[KnownHook]] = {}
        self.unseen_hooks: list[KnownHook] = []  # hooks written in C (list.append, torch.neg): no frame to see
        self.unseen_multi: list[KnownHook] = []  # multi-grad hooks written in C, by the tensors they watch
        self.chains: dict[tuple[int, int], list[KnownHook]] = {}  # (id(node), output) -> its tensor's hooks, in order
        self.after_chains: dict[int, list[KnownHook]] = {}  # id(AccumulateGrad) -> post-accumulate hooks, in order
        self.node_hooks: dict[int, tuple[tuple, tuple]] = {}  # id(node) -> (pre-hooks, post-hooks) of the user
        self.nested_frames: list[FrameType] = []  # engine frames of backward runs inside this pass, innermost last
        self.nested_wrapper: Wrapper | None = None
        self.nested_running = False  # the innermost nested engine is running (C++), not its Python wrapper
        self.watched: set[int] = set()  # id(AccumulateGrad) with the lens's pre-hook (reads .grad before the write)
        self.c_nodes: set[int] = set()  # id(node) with a hook written in C of its own or on one of its tensors
        self.edited_in_place = False  # a hook seen in this pass edited the gradient it received, in place
        self.nested_nodes: dict[int, str] = {}  # id(node) -> name: nodes that ran a backward inside this pass
        self.nested_hooks: list[str] = []  # hooks that ran in those nested backwards
        self.leaf_ids: set[int] = set()
        self.claimed: set[int] = set()  # id(KnownHook) already matched to a call in this pass
        self.old_grads: dict[int, Value] = {}  # id(AccumulateGrad) -> .grad before this pass wrote it
        self.incoming: dict[int, Value] = {}  # id(AccumulateGrad) -> the gradient it was about to add
        self.written: dict[int, Value] = {}  # id(AccumulateGrad) -> .grad right after the write
        self.unpack_codes: set[Any] = set()
        # id(tensor) -> (weakref, version, copy): a gradient one node sent and the next received is copied once
        self.copies: dict[int, tuple[Any, int, Value]] = {}
        self.seeds = tuple(snapshot(seed, store_limit) if isinstance(seed, torch.Tensor) else None for seed in seeds)
        self.start_seeds = self.seeds  # as they were when the pass started (self.seeds: as they would be unhooked)
        self.seed_objects = seeds  # the caller's gradient= tensors, until the pass is recorded
        self.unhooked = Unhooked(self)
        self.error: BaseException | None = None
        self.profiling_allowed = True
        self.hooks_hidden = False  # hook calls could not be seen (another profiler, or the self-check failed)
        self.inventory: tuple = ()  # the hooks attached when the pass started (see inventory.py)
        self.walk: Any = None  # the graph's model, when drawn before the pass
        self.leaf_state: Any = None  # leaf values read before the pass, when drawn after it

    # ------------------------------------------------------------------ set-up / tear-down
    def start(self) -> None:
        observe = self._on_node
        self.handles = [fn.register_hook(observe) for fn in self.shape.nodes]
        self._read_node_hooks(observe)
        for fn in self.shape.leaves.values():
            variable = fn.variable
            self.leaf_ids.add(id(variable))
            if variable.grad is not None or getattr(variable, "_post_accumulate_grad_hooks", None):
                self.handles.append(fn.register_prehook(self._before_write))
                self.watched.add(id(fn))
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
        if c_node_hooks:
            self.unhooked.activate(edited_in_place=True)
            self.note("a hook written in C on a backward function (" + describe_c_hooks(c_node_hooks) + ") runs "
                      "without a Python frame: its calls are shown in their place, with the gradients around them")
        in_graph = {id(fn) for fn in self.shape.nodes}
        unseen = [known for known in self.unseen_hooks if id(known.grad_fn) in in_graph]
        if unseen:  # found with the names, which the inventory looked up
            # A hook written in C runs without a Python frame: what it returned is known only from what reached
            # the next step, so every node's "without hooks" value is checked against what it really received.
            self.unhooked.activate(edited_in_place=True)
            self.note("a hook written in C (" + describe_c_hooks([known.function for known in unseen])
                      + ") runs without a Python frame: its calls are shown from the gradients around it")
        defaults = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if defaults is not None:  # pack/unpack hooks active during backward (double backward) are not gradient hooks
            self.unpack_codes.update(code for code in map(code_of, defaults) if code is not None)
        if not self.profiling_allowed:
            self.hooks_hidden = True
        elif other_profiler() is None:  # sys.getprofile() misses cProfile on Python >= 3.12
            self.profiling = True
            sys.setprofile(self._profile)
        else:
            self.hooks_hidden = True
            self.note("hook calls not attributed: another profiler (cProfile, %prun or torch.profiler) is active, "
                      "so only the backward functions were recorded")

    def _read_node_hooks(self, observe: Any) -> None:
        """Each node's own pre- and post-hooks, in registration order, from the hook dicts torch keeps on the
        node: the handle of the lens's post-hook points to the post-hook dict, and a pre-hook registered and
        removed at once to the pre-hook dict (``grad_fn.register_prehook`` / ``register_hook`` of the user)."""
        probe = _no_hook
        for fn, handle in zip(self.shape.nodes, self.handles):
            posts = handle.hooks_dict_ref()
            post = tuple(hook for hook in posts.values() if hook is not observe and _users(hook)) if posts else ()
            probe_handle = fn.register_prehook(probe)
            pres = probe_handle.hooks_dict_ref()
            probe_handle.remove()
            pre = tuple(hook for hook in pres.values() if hook is not probe and _users(hook)) if pres else ()
            if pre or post:
                self.node_hooks[id(fn)] = (pre, post)

    def stop(self) -> None:
        if self.profiling and sys.getprofile() == self._profile:
            sys.setprofile(None)
        self.profiling = False
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
        self.chains, self.after_chains, self.node_hooks = {}, {}, {}
        self.nested_frames, self.nested_wrapper = [], None
        self.walk = self.leaf_state = None
        self.roots = self.inputs = self.seeds = self.start_seeds = self.seed_objects = ()
        self.old_grads, self.incoming, self.written = {}, {}, {}
        self.copies = {}
        self.unhooked = Unhooked(self)
        self.error = None
        self.shape = None  # type: ignore[assignment]

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
        leaf_nodes = {id(fn.variable): fn for fn in shape.leaves.values()}
        labelled: list[tuple[str, torch.Tensor]] = [(names.tensors[id(t)], t) for t in names.tensor_objects]
        labelled += [(shape.leaf_labels[id(fn)], fn.variable) for fn in leaf_nodes.values()]
        labelled += [(f"input {i}", t) for i, t in enumerate(self.inputs) if isinstance(t, torch.Tensor)]
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
            elif tensor.requires_grad:
                grad_fn, output_nr = torch.autograd.graph.get_gradient_edge(tensor).node, 0
            else:
                continue
            entries = list((hooks or {}).items())
            rank = min(entries)[0] if entries else None
            chain = self.chains.setdefault((id(grad_fn), output_nr), [])
            for position, (_, hook) in enumerate(entries):
                user = multi_grad_user_fn(hook)
                known = KnownHook(hook if user is None else user, "tensor" if user is None else "multi_grad", label,
                                  grad_fn, output_nr, position, len(entries), rank)
                self._remember(known)
                chain.append(known)
            after = list((after or {}).values())
            for position, hook in enumerate(after):
                known = KnownHook(hook, "post_accumulate_grad", label, grad_fn, output_nr, position, len(after))
                self._remember(known)
                self.after_chains.setdefault(id(grad_fn), []).append(known)

    def _remember(self, known: KnownHook) -> None:
        code = code_of(known.function)
        if code is not None and runs_python(known.function):
            self.known_hooks.setdefault(code, []).append(known)
        elif known.kind == "multi_grad":  # torch's Python wrapper calls it: seen as a c_call, matched by identity
            self.unseen_multi.append(known)
        else:
            self.unseen_hooks.append(known)

    # ------------------------------------------------------------------ the profile function
    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        try:
            if event == "call":
                if self.nested_frames:
                    self._nested_profile(frame)
                    return
                if frame.f_code is ENGINE_CODE and self.in_engine:  # a backward() run inside the pass
                    self._nested_start(frame)
                    return
                if self.current is not None or not self.in_engine:
                    if self.engine_frame is None and frame.f_code is ENGINE_CODE:
                        self.engine_frame = frame
                    return  # inside a user hook (its own calls are not hooks), or outside the C++ engine
                parent = frame.f_back
                if parent is self.engine_frame:
                    code = frame.f_code
                    if code in _OWN_CODES:
                        return
                    # The engine runs Python (a hook, a custom Function's backward): it may edit a gradient
                    # where the version counter does not see it (``.data``, numpy), so no earlier copy is reused.
                    self.copies.clear()
                    if code.co_filename.startswith(TORCH_DIR):
                        self.wrapper = Wrapper(frame, wrapper_family(code))
                    elif code not in self.unpack_codes and not self._is_unpack_hook(code):
                        self._begin(frame, None)
                elif self.wrapper is not None and parent is self.wrapper.frame:
                    if self.wrapper.family != "ignore" and user_function(frame, self.wrapper) is not None:
                        self._begin(frame, self.wrapper)
            elif self.nested_frames and event != "return":
                if frame is self.nested_frames[-1] and getattr(arg, "__name__", None) == "run_backward":
                    self.nested_running = event == "c_call"  # like in_engine, for the nested engine
            elif event == "return" and self.nested_frames:
                if frame is self.nested_frames[-1]:
                    self.nested_frames.pop()
                    self.nested_running = bool(self.nested_frames)
                elif self.nested_wrapper is not None and frame is self.nested_wrapper.frame:
                    self.nested_wrapper = None
            elif event == "return":
                current = self.current
                if current is not None and frame is current.frame:
                    self._end(current, arg)
                elif self.wrapper is not None and frame is self.wrapper.frame:
                    self.wrapper = None
            elif event == "c_call" and self.wrapper is not None and frame is self.wrapper.frame:
                if self.current is None and self.in_engine and self.wrapper.family != "ignore" \
                        and any(function is arg for function in _wrapped_user_functions(self.wrapper)):
                    self._begin_unseen(self.wrapper, arg)  # torch's wrapper calls a hook written in C
            elif frame is self.engine_frame and getattr(arg, "__name__", None) == "run_backward":
                self.in_engine = event == "c_call"  # c_call starts the engine; c_return / c_exception end it
        except Exception as problem:  # never let the profile function raise into the user's code
            self._failed("a hook call", problem)

    def _nested_start(self, frame: FrameType) -> None:
        """A backward run inside this pass (reentrant checkpointing, a ``backward()`` in a hook): its hooks are
        not steps of this pass; they are listed in a note, and values without hooks past the node that ran it
        are unknown."""
        self.nested_frames.append(frame)
        node = _current_node()
        if node is not None:
            self.nested_nodes.setdefault(id(node), node.name())
        # it may write the .grad of leaves this pass has yet to reach: read theirs just before the write
        for key, leaf in self.shape.leaves.items():
            if key not in self.ran and key not in self.watched:
                self.handles.append(leaf.register_prehook(self._before_write))
                self.watched.add(key)

    def _nested_profile(self, frame: FrameType) -> None:
        """A call inside a nested backward: note the user hooks its engine calls (directly or through torch's
        wrappers), by name and target."""
        parent = frame.f_back
        code = frame.f_code
        if code is ENGINE_CODE:
            self.nested_frames.append(frame)
            return
        if parent is None:
            return
        if not self.nested_running:
            return  # the nested engine's Python wrapper (logging), before or after its C++ run
        if parent.f_code is ENGINE_CODE and parent is self.nested_frames[-1]:
            if code.co_filename.startswith(TORCH_DIR):
                self.nested_wrapper = Wrapper(frame, wrapper_family(code))
            elif code not in _OWN_CODES and code not in self.unpack_codes and not self._is_unpack_hook(code):
                self._nested_hook(function_name(None, code))
        elif self.nested_wrapper is not None and parent is self.nested_wrapper.frame \
                and self.nested_wrapper.family != "ignore":
            function = user_function(frame, self.nested_wrapper)
            if function is not None:
                module = wrapper_module(self.nested_wrapper)
                kind = module_hook_kind(self.nested_wrapper, function, module).replace("_", " ")
                target = self.ensure_names().module_name(module) if module is not None else None
                where = f"{target or type(module).__name__}: " if module is not None else ""
                self._nested_hook(f"{where}{kind} hook {function_name(function)}")

    def _nested_hook(self, text: str) -> None:
        if text not in self.nested_hooks:
            self.nested_hooks.append(text)

    def _is_unpack_hook(self, code: Any) -> bool:
        """A saved-tensor unpack hook called while the current node unpacks what it saved."""
        node = _current_node()
        if node is None:
            return False
        for attribute in saved_names(node):
            raw_name = "_raw" + attribute
            if hasattr(type(node), raw_name):
                raw = getattr(node, raw_name)
                for item in raw if isinstance(raw, (tuple, list)) else (raw,):
                    hook = getattr(item, "unpack_hook", None)
                    if hook is not None and code_of(hook) is code:
                        self.unpack_codes.add(code)
                        return True
        return False

    def _begin(self, frame: FrameType, wrapper: Wrapper | None) -> None:
        if self.broken:
            return
        with _hidden_from_modes():
            self.ensure_names()
            function = user_function(frame, wrapper)
            candidates = self._candidates(frame, function)
            if function is None and len({id(h.function) for h in candidates}) == 1:
                function = candidates[0].function
            args = engine_call_args(frame, function)
            module = None
            context = None
            if wrapper is None:
                first = args[0] if args else None
                second = args[1] if len(args) > 1 else None
                if isinstance(first, tuple) and isinstance(second, tuple):
                    kind, received, context = "node", first, second
                elif isinstance(first, tuple):
                    kind, received = "node_pre", first
                elif isinstance(first, torch.Tensor) and id(first) in self.leaf_ids and first.grad_fn is None:
                    kind, received = "post_accumulate_grad", first
                else:
                    kind, received = "tensor", first
            elif wrapper.family == "multi_grad":
                kind, received = "multi_grad", multi_grad_received(wrapper, args)
            else:
                module = wrapper_module(wrapper)
                kind = module_hook_kind(wrapper, function, module)
                if kind.endswith("module_full_pre"):
                    received = args[1] if len(args) > 1 else ()
                else:
                    received, context = (args[1], args[2]) if len(args) > 2 else ((), ())
            limit = self.store_limit
            node = _current_node()
            if kind in ("post_accumulate_grad", "node") and node is not None and id(node) in self.shape.leaves \
                    and id(node) not in self.written:
                # user code is about to run after AccumulateGrad wrote .grad: keep the value it wrote
                self.written[id(node)] = snapshot(node.variable.grad, limit)
            if kind == "post_accumulate_grad":
                grad_in = snapshot(received.grad, limit)
            else:
                grad_in = snapshot_all(received, limit)
            self.current = HookRecord(
                code=frame.f_code,
                function=function,
                kind=kind,
                received=received,
                grad_in=grad_in,
                frame=frame,
                candidates=candidates,
                module=module,
                context=snapshot_all(context, limit) if context is not None else None,
                current_fn=node,
                state=wrapper_state(wrapper) if wrapper is not None else None,
                slot=wrapper.frame.f_locals.get("idx") if wrapper is not None and wrapper.family == "multi_grad" else None,
            )

    def _begin_unseen(self, wrapper: Wrapper, function: Any) -> None:
        """A module or multi-grad hook written in C, called by torch's Python wrapper: the call is seen (a
        ``c_call`` event) but not its arguments or result, and it may have changed a gradient."""
        if self.broken:
            return
        module = wrapper_module(wrapper)
        kind = "multi_grad" if wrapper.family == "multi_grad" else module_hook_kind(wrapper, function, module)
        self.pending.append(HookRecord(
            code=None, function=function, kind=kind, received=None, grad_in=None, frame=None, module=module,
            current_fn=_current_node(), candidates=[known for known in self.unseen_multi if known.function is function],
            unseen=f"{UNSEEN}, so what it received and returned is not known", state=wrapper_state(wrapper),
        ))
        self.unhooked.activate(edited_in_place=True)  # "without hooks" is checked against every node

    def _candidates(self, frame: FrameType, function: Any) -> list[KnownHook]:
        """Hooks found on named tensors that could be the one running in ``frame``.

        Closures made by one ``def`` share a code object; their cells tell them apart.
        """
        found = []
        for known in self.known_hooks.get(frame.f_code, ()):
            if function is not None:
                if known.function is function:
                    found.append(known)
                continue
            cells = getattr(known.function, "__closure__", None) or ()
            names = getattr(getattr(known.function, "__code__", None), "co_freevars", ())
            try:
                if all(frame.f_locals.get(name) is cell.cell_contents for name, cell in zip(names, cells)):
                    found.append(known)
            except ValueError:  # an empty cell
                continue
        return found

    def _end(self, call: HookRecord, returned: Any) -> None:
        self.current = None
        limit = self.store_limit
        with _hidden_from_modes():
            call.returned_none = returned is None
            if call.kind == "post_accumulate_grad":
                call.grad_out = snapshot(call.received.grad, limit)
            elif call.kind == "multi_grad":  # its return value is ignored; edits in place of what it got count
                call.grad_out = snapshot_all(call.received, limit)
            elif returned is None:
                call.grad_out = snapshot_all(call.received, limit)  # edits in place count
            else:
                call.grad_out = snapshot_all(returned, limit)
            call.modified = not values_equal(call.grad_in, call.grad_out)
            if call.kind in ("post_accumulate_grad", "multi_grad") or returned is None:
                edited = call.modified
            else:  # returned a new value: did it also edit what it received?
                edited = not values_equal(call.grad_in, snapshot_all(call.received, limit))
        call.edited_in_place = edited
        self.edited_in_place = self.edited_in_place or edited
        if call.modified or edited:
            self.unhooked.activate(edited)
        call.frame = None  # don't keep the hook's locals alive
        call.received = None
        self.pending.append(call)

    # ------------------------------------------------------------------ node observers
    def _before_write(self, grad_outputs: tuple) -> None:
        """Pre-hook on ``AccumulateGrad``: the old ``.grad`` and what is about to be added.  Returns None."""
        if threading.get_ident() != self.thread or self.nested() or self.broken:
            return None
        profiling = self.profiling
        if profiling:
            sys.setprofile(None)
        try:
            with _hidden_from_modes():
                fn = _current_node()
                self.old_grads[id(fn)] = self._keep(fn.variable.grad)
                self.incoming[id(fn)] = self._keep(grad_outputs[0] if grad_outputs else None)
        except Exception as problem:
            self._failed("a leaf's .grad", problem)
        finally:
            if profiling:
                sys.setprofile(self._profile)
        return None

    def _on_node(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        """Post-hook on every node: what reached it and what it sent.  Returns None."""
        if threading.get_ident() != self.thread or self.nested() or self.broken:
            return None  # another thread's backward, or one run inside a hook: not this pass
        profiling = self.profiling
        if profiling:
            sys.setprofile(None)
        fn = None
        try:
            with _hidden_from_modes():
                fn = _current_node()
                self._record_node(fn, grad_inputs, grad_outputs)
        except Exception as problem:
            self._failed(f"node {fn.name() if fn is not None else '?'}", problem)
        finally:
            if profiling:
                sys.setprofile(self._profile)
        return None

    def _copy(self, value: Any) -> Any:
        """``snapshot_all``, reusing the copy of a tensor already copied in this pass when it is the same
        object, unchanged since (same version): what one node sends is usually what the next receives.
        Only a weak reference is kept, so no tensor lives longer and autograd's buffers stay its own.
        Copies are reused only while the profile function watches: it forgets them whenever the engine runs
        Python, which could edit a gradient unseen by the version counter (through ``.data``)."""
        if not self.profiling:
            return snapshot_all(value, self.store_limit)
        if isinstance(value, (tuple, list)):
            return tuple(self._copy(item) for item in value)
        if not isinstance(value, torch.Tensor):
            return None
        key = id(value)
        try:
            version = value._version
        except Exception:  # tensors without a version counter: copy each time
            return snapshot(value, self.store_limit)
        hit = self.copies.get(key)
        if hit is not None and hit[0]() is value and hit[1] == version:
            return hit[2]
        kept = fast_snapshot(value, self.store_limit)
        try:
            self.copies[key] = (weakref.ref(value), version, kept)
        except TypeError:
            pass
        return kept

    def _keep(self, value: Any) -> Any:
        """A copy of ``value`` for the record, within the memory budget (shape only beyond it)."""
        if not isinstance(value, (torch.Tensor, tuple, list)):
            return None
        if self.over_budget:
            return snapshot_all(value, -1)
        kept = self._copy(value)
        if self.memory_budget is not None:
            self.bytes_held += held_bytes(kept)
            if self.bytes_held > self.memory_budget:
                self.over_budget = True
                self.note(f"values not kept past {self.memory_budget} bytes (memory_budget): later gradients are "
                          "shown as summaries")
        return kept

    def _record_node(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple) -> None:
        pending, self.pending = self.pending, []
        for call in pending:
            self.place(call, fn, grad_outputs)
        records = self.records
        before = [call for call in pending if call.kind in BEFORE_NODE]
        after = [call for call in pending if call.kind not in BEFORE_NODE]
        is_leaf = id(fn) in self.shape.leaves
        if is_leaf:
            key = id(fn)
            if key not in self.written:  # no user code ran since the write
                self.written[key] = self._keep(fn.variable.grad)
            # a leaf without a .grad before the pass: .grad is exactly what arrived
            received = self.incoming.pop(key) if key in self.incoming else self.written[key]
            record: Any = GradRecord(fn, received, self.written[key])
            arrived: tuple = (received,)
        else:
            record = NodeRecord(fn, self._keep(tuple(grad_outputs)), self._keep(tuple(grad_inputs)))
            arrived = record.received
        before = arrange_before(self, fn, before, arrived)
        if not self.hooks_hidden:
            before += self._unexplained(fn, before, arrived)
        after = arrange_after(self, fn, after, None if is_leaf else record.sent, is_leaf)
        if id(fn) in self.nested_nodes and self.nested_hooks:
            self.unhooked.unknown_from(fn, "hooks ran inside a backward that " + fn.name() + " ran (reentrant "
                                       "checkpointing, or a backward() inside a hook): they are not recorded")
        pending = before + after
        records.extend(before)
        position = len(records)
        records.append(record)
        records.extend(after)
        self.ran[id(fn)] = position
        if self.unhooked.active:
            self.unhooked.on_node(fn, grad_inputs, grad_outputs, pending, is_leaf)

    def _unexplained(self, fn: Any, before: list[HookRecord], arrived: tuple) -> list[HookRecord]:
        """A gradient that changed on its way into ``fn`` with no hook seen there: a hook no Python frame showed
        (written in C, on a tensor whose hooks the lens cannot list) changed it.  It becomes a call of an unknown
        hook, with what the users sent and what ``fn`` received; "without hooks" is then checked at every node.
        Not when a hook seen in this pass edited a gradient in place, which can reach a sibling branch: then the
        values without hooks are computed node by node, and no call is invented."""
        found: list[HookRecord] = []
        hooked = {_output_of_call(call) for call in before}
        pre = next((call for call in before if call.kind == "node_pre"), None)
        if pre is not None:  # what reached the node's pre-hooks is what the tensor hooks passed on
            if pre.unseen or not isinstance(pre.grad_in, tuple) or len(pre.grad_in) != len(arrived):
                return found
            arrived = pre.grad_in
        consumers = self.shape.consumers
        records, ran = self.records, self.ran
        for output, received in enumerate(arrived):
            users = consumers.get((id(fn), output), ())
            if output in hooked or received is None and not users:
                continue
            if len(users) == 1 and id(users[0][0]) in ran:  # the usual case: one user, its copy reused as is
                sent = records[ran[id(users[0][0])]].sent
                slot = users[0][1]
                if isinstance(sent, tuple) and slot < len(sent) and sent[slot] is received:
                    continue
            sent = self.unhooked.input_of(fn, output, hooked=True)
            if sent is received or isinstance(sent, (Unknown, TensorSummary)) or isinstance(received, TensorSummary):
                continue
            if values_equal(sent, received):
                continue
            if self.unhooked.edited_in_place:
                continue
            call = unseen_call(None, "tensor", None, fn, output, "which hook it is")
            call.grad_in, call.grad_out, call.modified, call.returned_none = sent, received, True, False
            call.unseen = ("no Python frame showed this hook: it is written in C, on a tensor whose hooks cannot "
                           "be listed (no name here, or changed in place after the hook was registered); what it "
                           "received is what the tensor's users sent, added up, and what it passed on is what "
                           f"reached {fn.name()}")
            found.append(call)
        if found:
            self.unhooked.activate(edited_in_place=True)
        return found

    def place(self, call: HookRecord, fn: Any, grad_outputs: tuple) -> None:
        """Decide what a hook call is attached to (tensor name, node, output index).

        The engine says which node it runs a hook for (``current_fn``); ``fn`` is the node whose
        post-hook is placing the call (the next to run), the fallback when the engine said nothing."""
        if call.current_fn is not None and call.kind != "multi_grad":
            if call.current_fn is not fn:
                grad_outputs = ()  # fired for another node (an input of autograd.grad): no outputs to match
            fn = call.current_fn
        if call.kind in ("tensor", "post_accumulate_grad", "multi_grad"):
            candidates = [h for h in call.candidates if h.kind == call.kind and id(h) not in self.claimed]
            if call.kind == "multi_grad":
                targets = sorted({h.target for h in candidates}, key=[h.target for h in candidates].index)
                call.target = ", ".join(targets) if targets else "several tensors"
                call.node_fn = fn
                mine = next((h for h in candidates if h.grad_fn is fn), None)
                if mine is not None:  # its place among the hooks of the tensor whose hook called it
                    call.position, call.output_nr = mine.position, mine.output_nr
                return
            here = [h for h in candidates if h.grad_fn is fn]
            if call.current_fn is not None:  # the engine named the node: only a hook attached there can be it
                candidates = here
            if not here and fn is not None:
                # Only an input of autograd.grad fires its hooks without its node running next.
                here = [h for h in candidates if self._is_input_node(h.grad_fn) and self._all_consumers_ran(h.grad_fn)]
            same_target = len({(h.target, id(h.grad_fn)) for h in candidates}) == 1
            chosen = here[0] if here else (candidates[0] if candidates and same_target and fn is None else None)
            if chosen is not None:
                self.claimed.add(id(chosen))  # a tensor hook fires once per pass
                call.target, call.node_fn, call.output_nr = chosen.target, chosen.grad_fn, chosen.output_nr
                call.position = chosen.position
                return
            if fn is None:  # fired after the last node ran and matches no known tensor
                call.target = "an unnamed tensor"
                return
            call.node_fn = fn
            call.output_nr = _output_of(call, grad_outputs, self.store_limit)
            return  # target: the output's label, known once the model is built
        call.node_fn = fn
        if call.module is not None:
            call.target = self.ensure_names().module_name(call.module) or type(call.module).__name__
            if fn is not None:
                call.wrapper_seq = fn._sequence_nr()
        # node hooks: the target is the node's label, known once the model is built

    def _is_input_node(self, node: Any) -> bool:
        for tensor in self.inputs:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                if torch.autograd.graph.get_gradient_edge(tensor).node is node:
                    return True
        return False

    def _all_consumers_ran(self, node: Any) -> bool:
        """True when the engine could now reach ``node`` (it is used, and every user of it ran)."""
        found = False
        for (node_id, _), consumers in self.shape.consumers.items():
            if node_id == id(node):
                found = True
                if not all(id(consumer) in self.ran for consumer, _ in consumers):
                    return False
        return found

    # ------------------------------------------------------------------ end of the pass
    def fail(self, error: BaseException) -> None:
        """The engine raised: keep what was recorded, and attribute the error to the hook that raised."""
        self.error = error
        frames = set()
        traceback = error.__traceback__
        while traceback is not None:
            frames.add(traceback.tb_frame.f_code)
            traceback = traceback.tb_next
        message = f"{type(error).__name__}: {error}"
        if self.current is not None:  # a hook raised: the profiler saw its call but no normal return
            call = self.current
            self.current = None
            call.error = message
            call.frame = None
            call.received = None
            self.pending.append(call)
        else:
            # Usually the profiler already saw the raising hook "return" (with None): it is the
            # last call recorded, and its code is in the traceback.
            call = self.pending[-1] if self.pending else None
            if call is not None and call.error is None and call.returned_none and call.code in frames:
                call.error = message
                call.grad_out = None
                call.modified = False
            else:
                call = None
        with _hidden_from_modes():
            if call is None:  # no Python hook raised: a backward function in Python (its ctx), a hook in C, or torch
                node = self._raising_node(error)
                if node is not None:
                    self._stopped_at(node, None)
                    return
                maybe = sorted({known.target for ready in self._ready() for known in self.unseen_hooks
                                if known.grad_fn is ready and known.kind == "tensor"})
                if maybe:
                    self.note(f"the pass stopped at an error no Python frame explains: the hooks in C on "
                              f"{', '.join(maybe)} may or may not have run before it, and are not shown")
                return
            node = call.current_fn
            if call.kind in ("post_accumulate_grad", "node") and node is not None and id(node) in self.shape.leaves \
                    and id(node) not in self.ran and id(node) in self.written:
                # it raised after AccumulateGrad wrote .grad: the write happened, and is a step before it
                written = self.written[id(node)]
                self._record_node(node, (), (self.incoming.get(id(node), written),))
            elif call.kind in BEFORE_NODE and node is not None and id(node) not in self.ran:
                self._stopped_at(node, call)

    def _stopped_at(self, fn: Any, raised: HookRecord | None) -> None:
        """The pass stopped at ``fn`` before its backward ran: the hooks that ran there (those in C included, up
        to the one that raised) are steps; the node is not."""
        if fn is None or self.broken:
            return
        pending = [call for call in self.pending if call.current_fn is fn or call.current_fn is None]
        self.pending = [call for call in self.pending if call not in pending]
        for call in pending:
            self.place(call, fn, ())
        before = arrange_before(self, fn, [call for call in pending if call.kind in BEFORE_NODE], None)
        if raised is not None:
            before = until_error(before)
        else:
            for call in before:
                if call.unseen and call.grad_in is None:
                    call.unseen += ("; the pass stopped with an error at this node, raised by this hook, a hook "
                                    "after it or the backward function")
        self.records.extend(before + [call for call in pending if call.kind not in BEFORE_NODE])

    def _raising_node(self, error: BaseException) -> Any:
        """The node whose backward (Python: a custom Function, checkpointing) raised ``error``, from its frames."""
        nodes = {id(fn): fn for fn in self.shape.nodes}
        traceback = error.__traceback__
        while traceback is not None:
            local = traceback.tb_frame.f_locals
            for name in ("ctx", "self"):
                candidate = local.get(name)
                if candidate is not None and id(candidate) in nodes and nodes[id(candidate)] is candidate:
                    return candidate
            traceback = traceback.tb_next
        return None

    def _ready(self) -> list:
        """The nodes not run whose users all ran: the engine may have been at any of them."""
        waiting: dict[int, int] = {}
        for (node_id, _), consumers in self.shape.consumers.items():
            waiting[node_id] = waiting.get(node_id, 0) + sum(1 for user, _ in consumers if id(user) not in self.ran)
        return [fn for fn in self.shape.nodes if id(fn) not in self.ran and waiting.get(id(fn), 0) == 0]

    def seal(self, result: Any = None) -> None:
        """Calls seen after the last node ran (an autograd.grad input's hooks, a raising hook) are placed."""
        if self.nested_hooks:
            ran = ", ".join(sorted(set(self.nested_nodes.values()))) or "a backward function"
            self.note(f"hooks ran inside a nested backward run by {ran} (reentrant checkpointing, or a backward() "
                      f"inside a hook), not recorded as steps of this pass: {'; '.join(self.nested_hooks)}; values "
                      "without hooks that depend on them are unknown")
        for call in self.pending:
            if call.target is None and call.node_fn is None:
                self.place(call, None, ())
            self.records.append(call)
        self.pending = []
        if self.kind == "grad" and result is not None and not self.broken:
            with _hidden_from_modes():
                self._c_hooks_on_inputs(result)

    def _c_hooks_on_inputs(self, result: Any) -> None:
        """Hooks written in C on an input of ``autograd.grad``: they run when its gradient is captured (its node
        does not run), with the node's other tensor hooks; each becomes a step in its place among them (or after
        the last of its tensor's users), with the values around it (what the users sent, added up; what
        autograd.grad returned)."""
        done: set[int] = set()
        for index, tensor in enumerate(self.inputs):
            if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
                continue
            edge = torch.autograd.graph.get_gradient_edge(tensor)
            node, output = edge.node, edge.output_nr
            chain = self.chains.get((id(node), output))
            if not chain or id(node) in self.ran or all(runs_python(known.function) for known in chain):
                continue
            users = self.shape.consumers.get((id(node), output), ())
            if not users or not all(id(user) in self.ran for user, _ in users):
                continue  # its gradient was never captured (not on a path from the root): its hooks did not run
            if id(node) in done:
                continue
            done.add(id(node))
            seen = [record for record in self.records if isinstance(record, HookRecord)
                    and record.kind in ("tensor", "multi_grad") and (record.current_fn is node or record.node_fn is node
                    or any(known.grad_fn is node for known in record.candidates))]
            merged = arrange_input_chain(self, node, output, seen, result[index] if index < len(result) else None)
            if seen:
                at = next(position for position, record in enumerate(self.records) if record is seen[0])
            else:  # after the last user's record and the calls that ran after its backward (its post-hooks)
                last = max(self.ran[id(user)] for user, _ in users)
                at = last + 1
                while at < len(self.records) and isinstance(self.records[at], HookRecord) \
                        and self.records[at].kind not in BEFORE_NODE and self.records[at].node_fn is self.records[last].fn:
                    at += 1
            self.records = [record for record in self.records if not any(record is call for call in seen)]
            self.records[at:at] = merged
            shift = len(merged) - len(seen)
            self.ran = {key: position + shift if position >= at else position for key, position in self.ran.items()}


def _output_of_call(call: HookRecord) -> int | None:
    return call.output_nr if call.kind in ("tensor", "multi_grad") else None


def _users(hook: Any) -> bool:
    """A hook of the user's, not one of torch's wrappers (module and legacy hooks, whose calls are seen inside)."""
    code = code_of(hook)
    return code is None or not code.co_filename.startswith(TORCH_DIR)


def _no_hook(grad_outputs: Any) -> None:
    """Registered for an instant on each node to reach its pre-hook dict; never called."""
    return None


def _wrapped_user_functions(wrapper: Wrapper) -> tuple:
    """The user functions torch's wrapper may be calling now (its loop variables or closure)."""
    local = wrapper.frame.f_locals
    if wrapper.family == "module_full":
        return (local.get("hook"),)
    if wrapper.family == "module_pre":
        return local.get("user_pre_hook"), local.get("user_hook")
    if wrapper.family == "multi_grad":
        return (local.get("fn"),)
    if wrapper.family == "legacy":
        return (getattr(local.get("self"), "hook", None),)
    return ()


def _output_of(call: HookRecord, grad_outputs: tuple, limit: int) -> int:
    """Which output of a multi-output node an unnamed tensor hook belonged to: the one whose
    gradient equals what the hook passed on."""
    produced = call.grad_out
    for index, value in enumerate(grad_outputs):
        if isinstance(value, torch.Tensor) and produced is not None:
            if values_equal(snapshot(value, limit), produced):
                return index
    return 0


_OWN_CODES = frozenset({PassObserver._on_node.__code__, PassObserver._before_write.__code__})
