"""The end of one pass: an error (which hook or node raised, what may or may not have run), the calls seen after
the last node (an ``autograd.grad`` input's hooks), and each leaf's ``.grad`` as the pass left it (changed after its
write by code that is no hook, or sharing memory with another gradient)."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import torch

from ..model import TensorSummary, Value, values_equal
from .hooks import function_name, runs_python
from .order import NOT_RETURNED, arrange_before, arrange_input_chain, until_error
from .records import BEFORE_NODE, GradRecord, HookRecord, NodeRecord
from .unhooked import Unknown
from .leafstate import LeafState, _compared, touched  # noqa: F401  (build.py and tracer.py read them here)
from .structure import gradient_edge
from .snapshot import hidden_from_user as _hidden_from_modes, summarize
from .shared import span_of
from .finalgrad import final_grad, last_seen  # noqa: F401  (build.py reads final_grad here)

# what runs a backward inside a node's backward: examples (the lens does not tell them apart)
NESTED_KINDS = ("e.g. reentrant checkpointing, a backward() inside a hook, or a custom Function's backward calling "
                "autograd.grad")

# what torch raises when a post-accumulate-grad hook returns anything but None (after .grad was written)
POST_ACCUMULATE_RETURNED = "post accumulate grad hooks should return None"

AFTER_BACKWARD = ("node", "module_full", "module_pre", "legacy")  # calls made by a node's post-hooks (torch's
# module-hook wrappers are post-hooks of the module's boundary nodes)


def _distributed() -> bool:
    return _DISTRIBUTED is not None and _DISTRIBUTED.is_initialized()


_DISTRIBUTED = getattr(torch, "distributed", None)  # torch.distributed when this build has it (is_available() is
if _DISTRIBUTED is not None and not _DISTRIBUTED.is_available():  # the build's: it does not change)
    _DISTRIBUTED = None


class PassEnd:
    """Part of :class:`~autograd_lens.capture.observe.PassObserver`: what happens when the engine returns or raises."""

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
            elif call is not None and call.kind == "post_accumulate_grad" and not call.returned_none \
                    and call.error is None and isinstance(error, RuntimeError) and POST_ACCUMULATE_RETURNED in str(error):
                pass  # torch refused what it returned, after AccumulateGrad wrote .grad (the write is a step: below)
            else:
                call = None
        with _hidden_from_modes():
            if call is None:  # no Python hook raised: a backward function in Python (its ctx), a hook in C, or torch
                node = self._raising_node(error)
                if node is not None:
                    self.stopped_fn = node
                    self._stopped_at(node, None)
                    return
                maybe = sorted({known.target or "a tensor with no name" for ready in self._ready()  # (a forward's)
                                for known in self.unseen_hooks if known.grad_fn is ready and known.kind == "tensor"})
                if maybe:
                    self.note(f"the pass stopped at an error no Python frame explains: the hooks in C on "
                              f"{', '.join(maybe)} may or may not have run before it, and are not shown")
                return
            node = self.stopped_fn = call.current_fn
            if call.kind in ("post_accumulate_grad", "node") and node is not None and id(node) in self.shape.leaves \
                    and id(node) not in self.ran and id(node) in self.written:
                # it raised after AccumulateGrad wrote .grad: the write happened, and is a step before it
                written = self.written[id(node)]
                self._record_node(node, (), (self.incoming.get(id(node), written),))
            elif call.kind in BEFORE_NODE and node is not None and id(node) not in self.ran:
                self._stopped_at(node, call)
            elif call.kind in AFTER_BACKWARD and node is not None and id(node) not in self.ran \
                    and id(node) not in self.shape.leaves:
                # a post-hook of the node raised (a module's backward hooks are torch's post-hooks on its boundary
                # node): its tensor hooks and pre-hooks ran before its backward, those in C included
                self._stopped_at(node, None, f"; the pass stopped with an error in {function_name(call.function)}, "
                                 "which ran after this node's backward")

    def check_write(self, fn: Any, incoming: Any, record: GradRecord, fresh: bool) -> Any:
        """AccumulateGrad of leaf ``fn`` added ``incoming`` to ``.grad`` (or stored it, when there was none).  When
        ``.grad`` is not what the write made although no Python ran since (``fresh``), C++ code
        changed it after the write (DistributedDataParallel's hook on AccumulateGrad, with gradient_as_bucket_view):
        the write is recorded as what it made.  Returns what arrived."""
        if not fresh or not _distributed():  # asked first: every leaf of every pass comes here
            return record.received  # only torch.distributed's reducers hook AccumulateGrad in C++ and rewrite .grad
        grad = fn.variable.grad
        old = self.old_grads.get(id(fn))
        if not isinstance(incoming, torch.Tensor) or not isinstance(grad, torch.Tensor):
            return record.received
        if isinstance(record.grad, TensorSummary):
            return record.received
        arrived = self._keep(incoming) if old is None else record.received
        made = arrived
        if old is not None:
            if not (isinstance(old, torch.Tensor) and isinstance(arrived, torch.Tensor) and old.shape == arrived.shape
                    and old.dtype == arrived.dtype and old.layout == arrived.layout == torch.strided):
                return record.received
            with torch.no_grad():
                made = old + arrived
        if isinstance(made, torch.Tensor) and not values_equal(made, record.grad):
            record.grad = self.written[id(fn)] = made
            record.received = arrived
        return record.received

    def wrote_shared(self) -> bool:
        """A leaf that ran in this pass added to a ``.grad`` that shares memory with a gradient passed to backward()
        (adopted in an earlier pass): that write changed the gradient on its way to later functions (said once in a
        note), which explains a gradient that changed between two functions with no hook in between."""
        seeds = [span for span in map(span_of, (s for s in self.seed_objects if isinstance(s, torch.Tensor))) if span]
        for key, label in self.shape.leaf_labels.items():
            grad = self.shape.leaves[key].variable.grad
            span = span_of(grad) if key in self.ran and self.old_grads.get(key) is not None \
                and isinstance(grad, torch.Tensor) else None
            if span and any(span[0] == seed[0] and span[1] < seed[2] and seed[1] < span[2] for seed in seeds):
                self.note(f"{label}.grad shares memory with the gradient passed to backward() (autograd adopted it "
                          "without a copy in an earlier pass): adding to it changed that gradient while it was still "
                          "on its way, so a backward function after it received more than was sent")
                return True
        return False

    def _stopped_at(self, fn: Any, raised: HookRecord | None, where: str = "") -> None:
        """The pass stopped at ``fn`` before its backward ran, or in one of its post-hooks (``where`` says so): the
        hooks that ran there (those in C included, up to the one that raised) are steps; the node is not."""
        if fn is None or self.broken:
            return
        pending = [call for call in self.pending if call.current_fn is fn or call.current_fn is None]
        # calls that fired before this node's, for another node (an autograd.grad input's, at its capture): steps
        # before this node's, in the order they ran
        first = next((index for index, call in enumerate(self.pending) if any(call is mine for mine in pending)),
                     len(self.pending))
        earlier = [call for call in self.pending[:first] if not any(call is mine for mine in pending)]
        self.pending = [call for call in self.pending if not any(call is other for other in pending + earlier)]
        for call in earlier:
            self.place(call, None, ())
        self.records.extend(earlier)
        for call in pending:
            self.place(call, fn, ())
        before = arrange_before(self, fn, [call for call in pending if call.kind in BEFORE_NODE], None)
        if raised is not None:
            before = until_error(before)
        else:
            for call in before:
                if call.unseen and call.grad_in is None:
                    call.unseen += where or ("; the pass stopped with an error at this node, raised by this hook, a "
                                             "hook after it or the backward function")
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
        by = ", ".join(sorted(set(self.nested_nodes.values()))) or "a backward function"
        by += f" ({NESTED_KINDS})"
        if self.nested_hooks:
            self.note(f"hooks ran inside a nested backward run by {by}, not recorded as steps of this pass: "
                      f"{'; '.join(self.nested_hooks)}; values without hooks that depend on them are unknown")
        for key, functions in self.nested_c.items():  # hooks in C registered on what a recompute made (late.py)
            if key in self.nested_nodes:
                maybe = self.__dict__.setdefault("nested_maybe", [])
                maybe += [f"{name} (registered during the pass on a tensor {self.nested_nodes[key]} made: a recompute)"
                          for name in dict.fromkeys(functions)]
        if getattr(self, "nested_maybe", None):  # hooks in C on tensors outside this graph (calls._nested_start)
            self.note(f"a nested backward run by {by} ran these hooks written in C if it reached their tensors (no "
                      f"Python frame shows it): {'; '.join(self.nested_maybe)}")
        if self.nested_written:
            self.note(f"a nested backward run by {by} wrote the .grad of {', '.join(self.nested_written)}: not steps "
                      "of this pass")
        if self.foreign_calls and not self.foreign_writes:  # only the standard library's (calls._foreign)
            self.note(f"Python's standard library ran during this pass, called by torch's C++ side (torch showing a "
                      f"warning, say: {', '.join(self.foreign_calls)}); it is not a step")
        elif self.foreign_calls:
            self.note(f"Python code that is not a gradient hook ran during this pass, called by torch's C++ side "
                      f"({', '.join(self.foreign_calls)}: e.g. torch.compile compiling a hook as it is first called, "
                      "a DistributedDataParallel communication hook, or a callback queued on the engine); it is not a "
                      "step, and what it changed (DDP writes .grad after its all-reduce) is not attributed to it")
        for call in self.pending:
            if call.target is None and call.node_fn is None:
                self.place(call, None, ())
            self.records.append(call)
        self.pending = []
        if self.kind == "grad" and not self.broken and (result is not None or self.error is not None):
            with _hidden_from_modes():
                self._c_hooks_on_inputs(result)

    def _c_hooks_on_inputs(self, result: Any) -> None:
        """Hooks written in C on an input of ``autograd.grad``: they run when its gradient is captured (its node
        does not run), with the node's other tensor hooks; each becomes a step in its place among them (or after
        the last of its tensor's users), with the values around it (what the users sent, added up; what
        autograd.grad returned).  ``result`` None: the pass stopped at an error (at ``stopped_fn``); a leaf's gradient
        was captured as soon as its last user ran (the engine runs AccumulateGrad first), unless the error came
        from such a capture (or from no known node): what it returned is not known."""
        done: set[int] = set()
        stopped = getattr(self, "stopped_fn", None)
        at_once = self._captured_at_once()
        for index, tensor in enumerate(self.inputs):
            if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
                continue
            edge = gradient_edge(tensor, self.shape.leaves)
            if edge is None:
                continue  # torch cannot say which node takes its gradient: no hook of it can be placed
            node, output = edge
            if result is None and (id(node) not in self.shape.leaves or stopped is None
                                   or id(stopped) in self.shape.leaves):
                continue
            # the engine runs the tensor hooks of every output of a node whose gradient it captures (not only the
            # input's): hooks in C on a sibling output (the other half of a split) run too
            chain = [known for (key, _), hooks in self.chains.items() if key == id(node) for known in hooks]
            if not chain or id(node) in self.ran or all(runs_python(known.function) for known in chain):
                continue
            # the node is reached (its gradients captured) once every user of any of its outputs ran
            users = [user for (key, _), found in self.shape.consumers.items() if key == id(node) for user in found]
            if not users or not all(id(user) in self.ran for user, _ in users):
                continue  # its gradient was never captured (not on a path from the root): its hooks did not run
            if id(node) in done:
                continue
            done.add(id(node))
            seen = [record for record in self.records if isinstance(record, HookRecord)
                    and record.kind in ("tensor", "multi_grad") and (record.current_fn is node or record.node_fn is node
                    or record.current_fn is None and record.node_fn is None  # placed nowhere yet: its candidates say
                    and any(known.grad_fn is node for known in record.candidates))]
            returned = NOT_RETURNED if result is None else result[index] if index < len(result) else None
            merged = arrange_input_chain(self, node, output, seen, returned)
            if at_once.get(id(node)):
                for call in merged:
                    if call.unseen:
                        call.unseen += ("; the gradients of several inputs of autograd.grad were captured at once "
                                        "(when the same node had run), in an order no frame shows: its place among "
                                        "their hooks is not known")
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
            # where each node's record is now (the calls taken out may have sat on either side of them)
            self.ran = {id(record.fn): position for position, record in enumerate(self.records)
                        if isinstance(record, (NodeRecord, GradRecord))}


    def _captured_at_once(self) -> dict[int, bool]:
        """id(node) of each input of autograd.grad whose node did not run -> whether another such input's gradient
        was captured at the same moment (both became ready when the same node ran)."""
        last: dict[int, int] = {}
        for tensor in self.inputs:
            edge = gradient_edge(tensor, self.shape.leaves) if isinstance(tensor, torch.Tensor) else None
            if edge is None or id(edge[0]) in self.ran:
                continue
            users = [user for (key, _), found in self.shape.consumers.items() if key == id(edge[0]) for user in found]
            if users and all(id(user) in self.ran for user, _ in users):
                last[id(edge[0])] = max(self.ran[id(user)] for user, _ in users)
        return {node: sum(1 for other in last.values() if other == when) > 1 for node, when in last.items()}


# ----------------------------------------------------------------------------- each leaf's .grad as the pass left it

def untrusted_pass(observer: Any) -> Unknown | None:
    if observer.broken:
        return Unknown("the recording of this pass is incomplete (see the notes)")
    if observer.hooks_hidden:
        return Unknown("the lens could not see the hook calls of this pass (see the notes), so not which changed "
                       "gradients")
    return Unknown(observer.unhooked.repeated) if observer.unhooked.repeated else None


def stopped_by_hooks(observer: Any) -> Unknown | None:
    """The pass stopped with an error after hooks ran: had none run, it might have gone on (a hook raised, or
    returned what torch refused), so what it would have given the leaves it did not reach is not known."""
    if observer.error is None:
        return None
    calls = [record for record in observer.records if isinstance(record, HookRecord)]
    attached = observer.inventory or observer.chains or observer.node_hooks
    if not calls and not attached and not observer.hooks_hidden and not observer.nested_hooks:
        return None  # no hook was there to run (here or in a nested backward): the same error stops it without hooks
    error = observer.error
    return Unknown(f"the pass stopped at {type(error).__name__}: {error} after hooks ran; had no hook run it might "
                   "have gone on and reached this tensor")



def late_change(observer: Any, fn: Any, position: int, real: Value, diverged: bool) -> Unknown | None:
    """``.grad`` changed after the last value the recording saw (DistributedDataParallel writes the all-reduced
    bucket back after the engine's last node; a hook of another tensor; memory shared with another gradient).
    Nothing to say when it did not; nor when no hook changed anything and none ran after the write, since the same
    code then makes the same change without hooks.  Otherwise what it would have made of the values without hooks
    is not known; so too where such code (a DDP communication hook) ran after hooks made this gradient differ, even if
    it left .grad as it was (float16 rounding, a .grad a hook set to None), and where a hook stopped a pass that DDP
    would have reduced at its end."""
    if getattr(observer, "error", None) is not None and _distributed() \
            and stopped_by_hooks(observer) is not None:  # without hooks DDP would reduce at the end, and write .grad
        return Unknown(f"the pass stopped at {type(observer.error).__name__} after hooks ran; had none run, it would "
                       "have gone on to its end, where DistributedDataParallel writes .grad after its all-reduce (a "
                       "process group is initialized): what .grad would hold without hooks is not known")
    seen = last_seen(observer, fn, position)
    # the copy taken at the write, reused (values_equal would say so): the usual case
    same = seen is real or summaries_agree(seen, real)
    if same:
        if diverged and getattr(observer, "foreign_writes", False):  # what it did with these values (nothing) says
            # not what it would do with others
            return Unknown(f"code that is no gradient hook ran during this pass ({', '.join(observer.foreign_calls)}: "
                           "e.g. a DistributedDataParallel communication hook, whose result DDP writes to .grad) after "
                           "hooks made this gradient differ; what it would have made of the values without hooks is "
                           "not known")
        return None
    later = sorted({function_name(r.function, r.code) if r.function is not None or r.code is not None else "<C hook>"
                    for r in _hook_records_after(observer, position)
                    if not (r.kind == "post_accumulate_grad" and (r.current_fn is fn or r.node_fn is fn))})
    if not diverged and not later:
        return None
    if same is None:  # summaries (past the memory budget, or over store_limit) with no numbers to compare
        return Unknown(f"{LATE_UNSEEN}: whether .grad changed after the last write the recording saw (by code that is "
                       "no gradient hook, e.g. DistributedDataParallel's all-reduce, "
                       + (f"or a hook that ran after it ({', '.join(later)}), " if later else "")
                       + "or through memory it shares with another gradient) is not known, nor what it would hold "
                       "without hooks")
    foreign = ", ".join(observer.foreign_calls)
    by = (f"code that is no gradient hook ({foreign}: e.g. DistributedDataParallel's all-reduce), " if foreign else
          "code that is no gradient hook (e.g. DistributedDataParallel's all-reduce, in C++), ")
    return Unknown(f".grad changed after the last write the recording saw, by {by}"
                   + (f"a hook that ran after it ({', '.join(later)}) " if later else "")
                   + "or through memory it shares with another gradient; what that change would have been without "
                   "hooks is not known")


LATE_UNSEEN = ("the lens kept only a summary of this .grad (its numbers past memory_budget or store_limit), one "
               "without numbers to compare (not dense, complex, or holding NaN)")


def summaries_agree(seen: Value, real: Value) -> bool | None:
    """Whether ``seen`` (the last value of ``.grad`` the recording saw) and ``real`` (as the pass left it) hold the
    same values; where either is a summary, their summaries (shape, dtype, min, max, norm, first entries; a tensor
    summarised to compare), as ``leafstate.changed_by_hooks`` compares them (a change keeping all four is not seen);
    None: not known (a summary without those numbers: not dense, complex, or holding NaN)."""
    if not isinstance(seen, TensorSummary) and not isinstance(real, TensorSummary):
        return values_equal(seen, real)
    if seen is None or real is None:
        return False
    seen, real = (summarize(value) if isinstance(value, torch.Tensor) else value for value in (seen, real))
    if not (isinstance(seen, TensorSummary) and isinstance(real, TensorSummary)):
        return None  # (no value the recording keeps: not known)
    if (seen.shape, seen.dtype, seen.kind) != (real.shape, real.dtype, real.kind) or seen.numel == 0:
        return seen.numel == 0 == real.numel and seen.shape == real.shape and seen.dtype == real.dtype
    return seen == real if all(_compared(s) and s.min is not None for s in (seen, real)) else None


def _hook_records_after(observer: Any, position: int) -> list:
    """The hook calls recorded after ``position``, in order.  The pass's hook calls and their positions are found
    once per pass (``late_change`` asks for each leaf whose ``.grad`` changed late: going through every record after
    each leaf's would take the records times the leaves)."""
    found = vars(observer).get("hook_positions")
    if found is None:  # once per pass: (positions, calls), both in record order
        calls = [(index, record) for index, record in enumerate(observer.records) if isinstance(record, HookRecord)]
        found = observer.hook_positions = ([index for index, _ in calls], [record for _, record in calls])
    positions, records = found
    return records[bisect_right(positions, position):]
