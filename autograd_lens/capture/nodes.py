"""What each backward function of one pass received and sent, from a post-hook on every node (and a pre-hook on
the ``AccumulateGrad`` of leaves whose ``.grad`` is read before the write); where each hook call belongs."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import torch

from ..model import TensorSummary, values_equal
from .order import _MISSING, arrange_after, arrange_before
from .records import BEFORE_NODE, GradRecord, NodeRecord, adopted, budget_note, copy_tuple, snapshot_all, usual_leaf
from .snapshot import fast_snapshot, grad_of, held_bytes, snapshot
from .snapshot import _disable_dispatch, _dispatch_modes, _enter_dispatch, _exit_dispatch, _profiler_enabled
from .snapshot import hidden_from_user as _hidden_from_modes, unseen_by_modes
from .leafstate import read_before_write
from .unexplained import UnexplainedChanges
from .shared import edited_spans
from .placing import HookPlacing
from .ending import NESTED_KINDS, _distributed

_current_node = torch._C._current_autograd_node
_Tensor = torch.Tensor
NOT_KEPT = (_MISSING,)


class NodeRecorder(UnexplainedChanges, HookPlacing):
    """Part of :class:`~autograd_lens.capture.observe.PassObserver`: the node observers and the copies they keep."""

    paused = False  # the profile function switched itself off as one of the two hooks below started (calls.py)
    plain = True  # in this pass so far, nothing the lens copied could reach Python dispatch (see unseen_by_modes)

    def _before_write(self, grad_outputs: tuple) -> None:
        """Pre-hook on ``AccumulateGrad``: the old ``.grad`` and what is about to be added.  Returns None."""
        if threading.get_ident() != self.thread:
            return None  # another thread's backward: not this pass
        profiling, self.paused = self.paused, False
        try:
            if self.nested() or self.broken:
                return None
            profiling = profiling or self._pause_profile()
            with _hidden_from_modes():
                fn, incoming = _current_node(), grad_outputs[0] if grad_outputs else None
                old = fn.variable.grad
                read_before_write(self, fn, old, incoming)
        except Exception as problem:
            self._failed("a leaf's .grad", problem)
        finally:
            if profiling:
                sys.setprofile(self._profile)
        return None

    def _on_node(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        """Post-hook on every node: what reached it and what it sent.  Returns None."""
        if threading.get_ident() != self.thread:
            return None  # another thread's backward: not this pass
        profiling, self.paused = self.paused, False
        fn = None
        try:
            if self.nested() or self.broken:
                return None  # a backward run inside a hook: not this pass
            profiling = profiling or self._pause_profile()
            fn = _current_node()
            if not _profiler_enabled() and not _dispatch_modes() and self._usual_node(fn, grad_inputs, grad_outputs):
                return None
            if _profiler_enabled():  # hidden_from_user also switches record functions off
                with _hidden_from_modes():
                    self._record_node(fn, grad_inputs, grad_outputs)
            elif self.plain and unseen_by_modes(self, fn, grad_inputs, grad_outputs):
                self._record_node(fn, grad_inputs, grad_outputs)  # nothing for a mode to see: no guard needed
            else:  # hidden_from_user with no profiler on, inline: no user dispatch mode sees the lens's tensor work
                guard = _disable_dispatch()
                _enter_dispatch(guard)
                try:
                    self._record_node(fn, grad_inputs, grad_outputs)
                finally:
                    _exit_dispatch(guard, None, None, None)
        except Exception as problem:
            self._failed(f"node {fn.name() if fn is not None else '?'}", problem)
        finally:
            if profiling:
                sys.setprofile(self._profile)
        return None

    def _usual_node(self, fn: Any, grad_inputs: Any, grad_outputs: Any) -> bool:
        """What ``_record_node`` records for the usual node, in one piece, with no guard: no hook call pending or
        written in C there, no custom backward's own copies, within the memory budget, the profile function watching
        (the caller checked: no profiler, no dispatch mode): a leaf's ``usual_leaf``; a function whose every gradient
        that arrived is the copy kept of what its one user sent (``_unexplained`` finds nothing), or a None no function
        sends to, and whose every gradient sent is a plain tensor (copied as ``copy_tuple`` copies): every tensor
        touched is a plain ``torch.Tensor`` (or its copy), nothing for Python dispatch.  After a hook changed a
        gradient, ``Unhooked.on_node`` too (``replay`` runs no node whose saved tensors dispatch to Python).  Returns
        False, having recorded nothing, otherwise (``_record_node`` then goes its way)."""
        key = id(fn)
        shape = self.shape
        if type(grad_inputs) is not tuple or type(grad_outputs) is not tuple or self.pending or self.over_budget \
                or not self.profiling or key in self.c_nodes or key in self.nested_nodes:
            return False
        if key in shape.leaves:
            return not (grad_inputs or key in self.incoming or key in self.written or _distributed()) \
                and usual_leaf(self, fn, key, grad_inputs, grad_outputs)
        if self.hooks_hidden or self.python_received:
            return False
        copies, consumers, ran, records = self.copies, shape.consumers, self.ran, self.records
        arrived: list = []
        size = 0
        for output, item in enumerate(grad_outputs):
            users = consumers.get((key, output))
            if not users:
                if item is not None:
                    return False
                arrived.append(None)
                continue
            if len(users) != 1:
                return False
            position = ran.get(id(users[0][0]))
            if position is None:
                return False
            sent, slot = records[position].sent, users[0][1]
            if type(sent) is not tuple or slot >= len(sent):
                return False
            kept = sent[slot]
            if item is not None:
                if type(item) is not _Tensor:
                    return False
                hit = copies.get(id(item))
                try:
                    if hit is None or hit[2] is not kept or hit[0]() is not item or hit[1] != item._version:
                        return False
                except Exception:  # no version counter
                    return False
                if isinstance(kept, _Tensor):
                    size += kept.numel() * kept.element_size()
            elif kept is not None:
                return False
            arrived.append(kept)
        for item in grad_inputs:
            if item is not None and type(item) is not _Tensor:
                return False
        ran[key] = len(records)
        records.append(NodeRecord(fn, tuple(arrived), self._sent(size, grad_inputs)))
        if self.unhooked.active:
            self.plain = False  # (as unseen_by_modes says of the pass from here)
            self.unhooked.on_node(fn, grad_inputs, grad_outputs, [], False)
        return True

    def _sent(self, arrived_size: int, grad_inputs: tuple) -> tuple:
        """``arrived_size`` bytes (what a node received) counted, then the copies of what it sent, counted too."""
        if self.memory_budget is not None:
            self._held(arrived_size)
        if self.over_budget:
            return snapshot_all(grad_inputs, -1)
        sent, size = copy_tuple(self, grad_inputs)
        if self.memory_budget is not None:
            self._held(size)
        return sent

    def _pause_profile(self) -> bool:
        """Switch the lens's profile function off for its own work; True if it was on (to switch it back on).  A
        profiler started inside a hook during the pass (cProfile, on Python 3.11) has replaced it: that one is the
        user's and stays; the lens sees no more hook calls in this pass and says so."""
        if not self.profiling:
            return False
        if sys.getprofile() != self._profile:
            self.profiling = False
            self.hooks_hidden = True
            self.copies.clear()
            self.note("hook calls not attributed after a profiler was started during the pass: it took the place of "
                      "the lens's own watcher, which stepped aside; values without hooks are unknown")
            return False
        sys.setprofile(None)
        return True

    def _copy(self, value: Any) -> Any:
        """``snapshot_all``, reusing the copy of a tensor copied in this pass when it is the same object at the same
        version (what one node sends, the next receives), held by a weak reference: no tensor lives longer.  Reused
        only while the profile function watches: it forgets them whenever the engine runs Python (``.data`` edits)."""
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
        earlier = self._earlier_copy(value, version)
        if earlier is not None:
            return earlier
        kept = fast_snapshot(value, self.store_limit)
        try:
            self.copies[key] = (weakref.ref(value), version, kept)
        except TypeError:
            pass
        return kept

    def copied(self, value: Any, magnitudes: bool = False) -> Any:
        """The copy this pass already took of tensor ``value`` when it is the same object, unchanged since (same
        version) and no Python ran inside the engine since (which could have edited it unseen): else a new one
        (``magnitudes``: a summary with the mean |value|, see ``snapshot.summarize``)."""
        if isinstance(value, torch.Tensor):
            try:
                earlier = self._earlier_copy(value, value._version)
            except Exception:  # no version counter
                earlier = None
            if isinstance(earlier, torch.Tensor):  # a copy, not a summary made past the memory budget
                return earlier
        return snapshot(value, self.store_limit, magnitudes)

    def keep_copy(self, value: Any, kept: Any) -> None:
        """``kept``, a copy of tensor ``value`` taken just now (after a hook ran), for reuse while ``value`` stays
        the same object at the same version and no Python runs inside the engine."""
        if self.profiling and isinstance(value, torch.Tensor) and isinstance(kept, (torch.Tensor, TensorSummary)):
            try:
                self.copies[id(value)] = (weakref.ref(value), value._version, kept)
            except Exception:  # no weak reference or no version counter: not reused
                pass

    def _earlier_copy(self, value: torch.Tensor, version: int) -> Any:
        """The copy kept of ``value`` in this pass if it is the same object at the same version, else None."""
        hit = self.copies.get(id(value))
        return hit[2] if hit is not None and hit[0]() is value and hit[1] == version else None

    def _keep(self, value: Any) -> Any:
        """A copy of ``value`` for the record, within the memory budget (shape only beyond it)."""
        if not isinstance(value, (torch.Tensor, tuple, list)):
            return None
        if self.over_budget:
            return snapshot_all(value, -1)
        if type(value) is tuple and self.profiling:  # what a node received or sent: the copies in one loop
            kept, size = copy_tuple(self, value)
        else:
            kept = self._copy(value)
            size = held_bytes(kept) if self.memory_budget is not None else 0
        if self.memory_budget is not None:
            self._held(size)
        return kept

    def _held(self, size: int) -> None:
        """``size`` more bytes kept: past the memory budget, later values are kept as summaries (said once)."""
        self.bytes_held += size
        if self.bytes_held > self.memory_budget:
            self.over_budget = True
            self.note(budget_note(self.memory_budget, self.earlier_bytes))

    def _written(self, grad: Any, grad_outputs: tuple) -> Any:
        """A copy of a leaf's ``.grad`` right after AccumulateGrad wrote it.  When autograd adopted the gradient
        that arrived without a copy (``.grad`` is then a view of the same memory, same layout and version), it is
        the copy already taken of what arrived: one copy, and one object the later checks see as unchanged."""
        if grad_outputs and type(grad) is torch.Tensor and not self.over_budget and self.profiling:
            arrived = grad_outputs[0]
            try:
                made_from = type(arrived) is torch.Tensor and adopted(grad, arrived, arrived._version)
            except Exception:  # no storage to compare (ZeroTensor, a subclass): copy it
                made_from = False
            if made_from:
                earlier = self._earlier_copy(arrived, arrived._version)
                if earlier is not None:
                    try:  # .grad read again after the pass: the same object at the same version has this copy
                        self.copies[id(grad)] = (weakref.ref(grad), grad._version, earlier)
                    except TypeError:
                        pass
                    return earlier
        return self._keep(grad)

    def _arrived(self, key: int, grad_outputs: tuple) -> Any:
        """What reached a leaf with no ``.grad`` as the pass began (no pre-hook of the lens read it): ``.grad`` as
        written, when it is what arrived (autograd adopted it, or it holds the same values).  Otherwise a hook wrote
        ``.grad`` during the pass before AccumulateGrad added to it (nothing else runs during a pass): what arrived,
        and the value without hooks is not known (``GRAD_CHANGED_IN_PASS``)."""
        written = self.written[key]
        if written is None or not grad_outputs or not isinstance(grad_outputs[0], torch.Tensor):
            return written  # (None: AccumulateGrad dropped it, its variable no longer requiring grad)
        arrived = self._keep(grad_outputs[0])
        if arrived is written or values_equal(arrived, written):
            return written
        self.changed_before_write.add(key)
        return arrived

    def _received(self, fn: Any, key: int, grad_outputs: tuple, grad_inputs: tuple) -> NodeRecord:
        """A custom Function's record: what its backward got, copied as it was called (it may edit them in place,
        ``g.mul_(3)``: ``calls._python_backward``); ``zeros``: where the engine passed None and it got zeros."""
        called = self.python_received.pop(key, None)
        now = self._keep(tuple(grad_outputs))
        if called is None or len(called[0]) != len(now):
            return NodeRecord(fn, now, self._keep(tuple(grad_inputs)))
        ids, copies = called
        same = [isinstance(value, torch.Tensor) and id(value) == ids[slot] for slot, value in enumerate(grad_outputs)]
        edited = [slot for slot, kept in enumerate(same) if kept and copies[slot] is not now[slot]
                  and not values_equal(copies[slot], now[slot])]
        if edited:  # the edit reaches every branch holding that tensor: no hook call is made of what it changed there
            spans = edited_spans(tuple(grad_outputs[slot] for slot in edited))
            self.edits.append((spans, tuple(copies[slot] for slot in edited)))
            self.python_edits.extend(spans)  # part of the program, hooks or not: see Unhooked._diverged
            self.edited_in_place = True
        zeros = tuple(slot for slot, value in enumerate(grad_outputs) if value is None and copies[slot] is not None)
        return NodeRecord(fn, tuple(copies[slot] if kept else now[slot] for slot, kept in enumerate(same)),
                          self._keep(tuple(grad_inputs)), zeros)

    def _record_node(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple) -> None:
        key = id(fn)
        pending = self.pending
        shape = self.shape
        is_leaf = key in shape.leaves
        records = self.records
        if is_leaf and not (pending or self.over_budget or key in self.incoming or key in self.written) \
                and self.profiling and key not in self.c_nodes and key not in self.nested_nodes \
                and type(grad_outputs) is tuple and not _distributed() and usual_leaf(self, fn, key, grad_inputs,
                                                                                       grad_outputs):
            return
        if not (pending or is_leaf or self.python_received or self.over_budget) and self.profiling \
                and type(grad_outputs) is tuple and type(grad_inputs) is tuple and key not in self.c_nodes:
            # the usual node (no hook call to place, no custom backward's own copies, no hook in C): _keep of both
            # tuples, inline
            arrived, size = copy_tuple(self, grad_outputs)
            record: Any = NodeRecord(fn, arrived, self._sent(size, grad_inputs))
            before: list = []
            after: list = []
        else:
            if pending:
                self.pending = []
                for call in pending:
                    self.place(call, fn, grad_outputs, pending)
                before = [call for call in pending if call.kind in BEFORE_NODE]
                after = [call for call in pending if call.kind not in BEFORE_NODE]
            else:  # no hook ran since the last node: the usual case
                before, after = [], []
            if is_leaf:
                fresh = key not in self.written
                if fresh:  # no user code ran since the write
                    self.written[key] = self._written(grad_of(fn.variable), grad_outputs)
                received = self.incoming.pop(key) if key in self.incoming else self._arrived(key, grad_outputs)
                record = GradRecord(fn, received, self.written[key])
                if grad_outputs:  # what the write was, when C++ code changed .grad after it
                    received = self.check_write(fn, grad_outputs[0], record, fresh)
                arrived = (received,)
            else:
                record = self._received(fn, key, grad_outputs, grad_inputs) if self.python_received \
                    else NodeRecord(fn, self._keep(tuple(grad_outputs)), self._keep(tuple(grad_inputs)))
                arrived = record.received
        if not (pending or key in self.c_nodes or key in self.nested_nodes):
            # no hook call here: _unexplained finds nothing when each gradient that arrived is the copy of what its
            # one user sent (the copy reused as is), or a None no function sends to.  Its first steps, inline.
            consumers, ran = shape.consumers, self.ran
            for output, received in enumerate(() if self.hooks_hidden else arrived):
                users = consumers.get((key, output))
                if received is None and not users:
                    continue
                as_sent = None
                if users and len(users) == 1:
                    position = ran.get(id(users[0][0]))
                    if position is not None:
                        sent, slot = records[position].sent, users[0][1]
                        if isinstance(sent, tuple) and slot < len(sent):
                            as_sent = sent[slot]
                if as_sent is not received:
                    break
            else:
                ran[key] = len(records)
                records.append(record)
                if self.unhooked.active:
                    self.unhooked.on_node(fn, grad_inputs, grad_outputs, [], is_leaf)
                return
        nested = key in self.nested_nodes
        c_hooks = key in self.c_nodes  # hooks written in C here: arrange_before/after put them in place
        if c_hooks:
            # a backward run inside this node (reentrant checkpointing) may have edited what arrived, in place, after
            # the hooks before it ran: what they passed on is then not what the node holds now
            before = arrange_before(self, fn, before, NOT_KEPT * len(arrived) if nested else arrived, then=after)
        if not self.hooks_hidden:
            before += self._unexplained(fn, before, arrived, grad_outputs)
        if c_hooks:
            after = arrange_after(self, fn, after, None if is_leaf else record.sent, is_leaf)
        if nested and self.nested_hooks:
            self.unhooked.unknown_from(fn, f"hooks ran inside a backward that {fn.name()} ran ({NESTED_KINDS}): "
                                       "they are not recorded")
        elif nested and key in self.nested_c:
            self.unhooked.unknown_from(fn, f"hooks written in C ({', '.join(sorted(set(self.nested_c[key])))}), "
                                       f"registered during the pass on tensors {fn.name()} made, may have run in "
                                       "the backward it ran: no Python frame shows whether they did or what they "
                                       "changed")
        if before:
            records.extend(before)
        position = len(records)
        records.append(record)
        if after:
            records.extend(after)
        self.ran[key] = position
        if self.unhooked.active:
            self.unhooked.on_node(fn, grad_inputs, grad_outputs, before + after, is_leaf)
