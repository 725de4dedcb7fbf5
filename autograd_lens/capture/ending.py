"""The end of one pass: an error (which hook or node raised, what may or may not have run) and the calls seen after
the last node (an ``autograd.grad`` input's hooks)."""

from __future__ import annotations

from typing import Any

import torch

from .hooks import runs_python
from .order import arrange_before, arrange_input_chain, until_error
from .records import BEFORE_NODE, GradRecord, HookRecord, NodeRecord
from .walk import gradient_edge
from .snapshot import hidden_from_user as _hidden_from_modes

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
        if self.foreign_calls:
            self.note(f"Python code that is not a gradient hook ran during this pass, called by torch's C++ side "
                      f"({', '.join(self.foreign_calls)}: e.g. a DistributedDataParallel communication hook, or a "
                      "callback queued on the engine); it is not a step, and what it changed (DDP writes .grad after "
                      "its all-reduce) is not attributed to it")
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
            edge = gradient_edge(tensor, self.shape.leaves)
            if edge is None:
                continue  # torch cannot say which node takes its gradient: no hook of it can be placed
            node, output = edge
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
                    or record.current_fn is None and record.node_fn is None  # placed nowhere yet: its candidates say
                    and any(known.grad_fn is node for known in record.candidates))]
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
            # where each node's record is now (the calls taken out may have sat on either side of them)
            self.ran = {id(record.fn): position for position, record in enumerate(self.records)
                        if isinstance(record, (NodeRecord, GradRecord))}
