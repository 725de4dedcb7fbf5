"""Gradients that changed on their way where no hook was seen: a hook written in C on a tensor whose hooks cannot be
listed (no name here) changed them. Part of :class:`~autograd_lens.capture.nodes.NodeRecorder`: each such change
becomes a call of an unknown hook, with what went in and out, unless an edit in place (by a hook seen editing, or a
hook in C that could) may have reached that gradient through shared memory, or a nested backward ran there."""

from __future__ import annotations

from typing import Any

import torch

from ..model import TensorSummary, values_equal
from .order import unseen_call
from .records import HookRecord
from .shared import edited_spans, span_of
from .unhooked import Unknown


def _output_of_call(call: HookRecord) -> int | None:
    return call.output_nr if call.kind in ("tensor", "multi_grad") else None


class UnexplainedChanges:
    def _unexplained(self, fn: Any, before: list[HookRecord], arrived: tuple, live: tuple) -> list[HookRecord]:
        """A gradient that changed on its way into ``fn`` with no hook seen there: a hook no Python frame showed
        (written in C, on a tensor whose hooks the lens cannot list) changed it.  It becomes a call of an unknown
        hook, with what the users sent and what ``fn`` received; "without hooks" is then checked at every node.
        Not when a hook seen in this pass edited in place a gradient sharing memory with this one (an edit reaches
        every branch holding that tensor), or an edit no frame showed may have: then the values without hooks are
        computed node by node, and no call is invented."""
        found: list[HookRecord] = []
        # a backward ran inside this node (reentrant checkpointing): its hooks get the gradient that arrived here
        # itself and may edit it in place, which is no hook of this tensor (they are in the pass's note)
        key = id(fn)
        nested = key in self.nested_nodes
        hooked: Any = ()  # outputs with a hook seen on them (none, the usual case)
        if before:
            hooked = {_output_of_call(call) for call in before}
            if any(call.kind == "tensor" and call.output_nr is None for call in before):
                return found  # a hook on an output not known (placing.py) may have made any change seen here
            pre = next((call for call in before if call.kind == "node_pre"), None)
            if pre is not None:  # what reached the node's pre-hooks is what the tensor hooks passed on
                if pre.unseen or not isinstance(pre.grad_in, tuple) or len(pre.grad_in) != len(arrived):
                    return found
                arrived = pre.grad_in
        for output, received in enumerate(arrived):
            if output in hooked:
                found += self._around_seen_hooks(fn, output, received, before, live, nested)
                continue
            if received is None and not self.shape.consumers.get((key, output)):
                continue
            if self._sent_as_is(fn, output) is received:  # the usual case: one user, its copy reused as is
                continue
            sent = self.unhooked.input_of(fn, output, hooked=True)
            if not _changed(sent, received):
                continue
            if self.unhooked.other_edits or self.wrote_shared() or self._edited_on_its_way(fn, output, live):
                continue  # an edit in place of a gradient sharing its memory may have changed it: no call invented
            if nested:
                self.unhooked.unknown_from(fn, f"what reached {fn.name()} was changed inside the backward it ran "
                                               "(reentrant checkpointing), by code the lens does not record")
                continue
            found.append(_unseen(fn, output, sent, received, "on a tensor whose hooks cannot be listed (no name here, "
                                 "or changed in place after the hook was registered); what it received is what the "
                                 "tensor's users sent, added up, and what it passed on is what reached " + fn.name()))
        self._invented(found, live)
        return found

    def _sent_as_is(self, fn: Any, output: int) -> Any:
        """The copy of what the one user of ``fn``'s ``output`` sent there, when it has one user that ran."""
        users = self.shape.consumers.get((id(fn), output), ())
        if len(users) == 1 and id(users[0][0]) in self.ran:
            sent, slot = self.records[self.ran[id(users[0][0])]].sent, users[0][1]
            if isinstance(sent, tuple) and slot < len(sent):
                return sent[slot]
        return None

    def _invented(self, calls: list[HookRecord], live: tuple) -> None:
        """Calls of unseen hooks found from the values around them: each may have edited in place what it got."""
        if calls:
            self.edits.extend((edited_spans(live), call.grad_in) for call in calls)
            self.unhooked.activate(edited_in_place=True, seen=True)

    def _around_seen_hooks(self, fn: Any, output: int, received: Any, before: list, live: tuple,
                           nested: bool) -> list[HookRecord]:
        """The hooks seen on ``fn``'s ``output`` did not get what its users sent, one did not get what the one before
        passed on, or what the last one passed on is not what reached ``fn``: a hook written in C on the same tensor
        (no name here, so not listed) registered before, between or after them changed it. One before or between
        them is put in ``before``; one after them is returned."""
        seen = [call for call in before if _output_of_call(call) == output]
        if nested or not seen or any(call.kind != "tensor" or call.unseen or call.error
                                     or (call.node_fn or call.current_fn) is not fn for call in seen):
            return []  # a nested backward ran here, or calls of another kind or node
        first, last = seen[0], seen[-1]
        sent = self._sent_as_is(fn, output)
        if sent is not first.grad_in:  # not the one user's copy as is: what the users sent, added up
            sent = self.unhooked.input_of(fn, output, hooked=True)
        # (earlier call, later call, what went in, what came out) around each hook: compared before any text is made
        gaps = [(None, first, sent, first.grad_in)]
        gaps += [(earlier, later, earlier.grad_out, later.grad_in) for earlier, later in zip(seen, seen[1:])]
        gaps.append((last, None, last.grad_out, received))
        gaps = [gap for gap in gaps if _changed(gap[2], gap[3])]
        if not gaps or self.unhooked.other_edits or self.wrote_shared():
            return []  # unchanged, or changed by what the lens does not follow (code in C that edits)
        own = tuple(call.grad_in for call in seen)  # their own edits are in what they passed on
        if self._edited_on_its_way(fn, output, live, own):
            return []
        after = []
        for earlier, later, got, gave in gaps:
            where, got_text, gave_text = (
                ("before the hooks after it", "what the tensor's users sent, added up",
                 "what the hook after it received") if earlier is None else
                ("after the hooks before it", "what the hook before it passed on", f"what reached {fn.name()}")
                if later is None else
                ("between the hooks around it", "what the hook before it passed on", "what the hook after it received"))
            call = _unseen(fn, output, got, gave, f"registered {where} on a tensor whose hooks cannot be listed (no "
                           f"name here); what it received is {got_text}, and what it passed on is {gave_text}")
            if later is None:
                after.append(call)
            else:
                before.insert(_position(before, later), call)
                self._invented([call], live)
        return after

    def _edited_on_its_way(self, fn: Any, output: int, live: tuple, own: tuple = ()) -> bool:
        """Whether an edit in place (by a hook seen editing, or a hook in C found before) may have reached what
        arrived at ``fn``'s ``output``: what arrived shares its memory, or a user sent a tensor that may have been
        a view of the edited one (every value it sent was among that tensor's values before the edit) and the
        edit reached it before it was added up here."""
        edits = [(spans, value) for spans, value in self.edits if not any(value is mine for mine in own)]
        if not edits:
            return False
        arrived = live[output] if output < len(live) else None
        if _overlaps(arrived, [span for spans, _ in edits for span in spans]):
            return True
        records, ran = self.records, self.ran
        for user, slot in self.shape.consumers.get((id(fn), output), ()):
            if id(user) not in ran:
                continue
            sent = records[ran[id(user)]].sent
            value = sent[slot] if isinstance(sent, tuple) and slot < len(sent) else None
            if value is None:
                continue
            for _, before in edits:
                if _may_view(value, before):
                    return True
        return False


def _overlaps(received: Any, spans: list) -> bool:
    """``received`` (a live gradient) shares memory with one a hook edited or may have edited in place (``spans``)."""
    if not spans or not isinstance(received, torch.Tensor):
        return False
    span = span_of(received)
    return span is None or any(span[0] == other[0] and span[1] < other[2] and other[1] < span[2] for other in spans)


def _may_view(sent: Any, before: Any) -> bool:
    """Could ``sent`` have been a view of (one of) ``before`` (values an edit in place then changed)? Not when one of
    its values is none of theirs; a summary or an unknown value could be anything."""
    if not isinstance(sent, torch.Tensor):
        return True
    for tensor in before if isinstance(before, (tuple, list)) else (before,):
        if not isinstance(tensor, torch.Tensor):
            if tensor is not None:
                return True
            continue
        try:
            if sent.numel() == 0 or bool(torch.isin(sent.detach().flatten(), tensor.detach().flatten()).all()):
                return True
        except Exception:  # noqa: BLE001 - other dtypes or devices: could be anything
            return True
    return False


def _changed(before: Any, after: Any) -> bool:
    """Two recorded values known to differ (an unknown, a summary or nothing: not known to)."""
    if before is None or after is None or before is after:
        return False
    if isinstance(before, (Unknown, TensorSummary)) or isinstance(after, (Unknown, TensorSummary)):
        return False
    return not values_equal(before, after)


def _unseen(fn: Any, output: int, received: Any, passed: Any, how: str) -> HookRecord:
    """A call of a hook no frame showed, on ``fn``'s ``output``, which changed ``received`` into ``passed``."""
    call = unseen_call(None, "tensor", None, fn, output, "which hook it is")
    call.grad_in, call.grad_out, call.modified, call.returned_none = received, passed, True, False
    call.unseen = f"no Python frame showed this hook: it is written in C, {how}"
    return call


def _position(calls: list, call: HookRecord) -> int:
    return next(index for index, other in enumerate(calls) if other is call)  # records hold tensors: no ==
