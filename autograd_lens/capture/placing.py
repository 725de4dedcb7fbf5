"""Where each hook call belongs (tensor name, node, output index): part of
:class:`~autograd_lens.capture.nodes.NodeRecorder`."""

from __future__ import annotations

from typing import Any

import torch

from ..model import TensorSummary, values_equal
from .order import multi_grad_source, multi_grad_target
from .records import HookRecord
from .snapshot import snapshot
from .structure import gradient_edge


class HookPlacing:
    """Part of :class:`~autograd_lens.capture.observe.PassObserver`: what each hook call is attached to."""

    def place(self, call: HookRecord, fn: Any, grad_outputs: tuple, beside: list | tuple = ()) -> None:
        """Decide what a hook call is attached to (tensor name, node, output index).

        The engine says which node it runs a hook for (``current_fn``); ``fn`` is the node whose
        post-hook is placing the call (the next to run), the fallback when the engine said nothing; ``beside``: the
        calls placed there with it (its node pre-hooks among them)."""
        if call.current_fn is not None and call.kind != "multi_grad":
            if call.current_fn is not fn:
                grad_outputs = ()  # fired for another node (an input of autograd.grad): no outputs to match
            fn = call.current_fn
        if call.kind in ("tensor", "post_accumulate_grad", "multi_grad"):
            candidates = [h for h in call.candidates if h.kind == call.kind and id(h) not in self.claimed]
            if call.kind == "multi_grad":
                call.target = multi_grad_target(candidates, call.grad_in, call.current_fn)  # (its gradients' order)
                call.node_fn = fn
                mine = multi_grad_source(candidates, fn, call.slot)
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
                call.position, call.key = chosen.position, chosen.key
                return
            if fn is None:  # fired after the last node ran and matches no known tensor
                call.target = "an unnamed tensor"
                return
            call.node_fn = fn
            call.output_nr = self._output_of(call, fn, grad_outputs, beside)
            return  # target: the output's label, known once the model is built
        call.node_fn = fn
        if call.module is not None:
            call.target = self.ensure_names().module_name(call.module) or type(call.module).__name__
            if fn is not None:
                call.wrapper_seq = fn._sequence_nr()
        # node hooks: the target is the node's label, known once the model is built

    def _output_of(self, call: HookRecord, fn: Any, grad_outputs: tuple, beside: list | tuple = ()) -> int | None:
        """Which output of a multi-output node ``fn`` an unnamed tensor hook belonged to.  By what it received: the
        very gradient that output's one user sent, or the one the hook placed just before on ``fn`` passed on (a
        later hook of the same tensor); else by value: what that output's users sent, added up, or what that hook
        passed on; else by what it passed on, which is what the node received there when no node pre-hook changed it
        since.  None (``call.unplaced`` says why) when nothing recorded tells which output it was."""
        outputs = len(grad_outputs) or _outputs_of(fn)
        if outputs < 2:
            return 0  # one output (or none): that one, whatever the values (no copy of it to compare)
        chains = self.__dict__.setdefault("_unnamed_chains", {})  # id(fn) -> (output, what its last hook passed on)
        previous = chains.get(id(fn))
        received = call.grad_in
        # the very copy it received: the one its one user sent there, or the one the hook before it passed on (the
        # observer reuses the copy of a tensor while it is the same object, unchanged)
        found = [output for output in range(outputs)
                 if received is not None and self._sent_as_is(fn, output) is received]
        if previous is not None and received is not None and previous[1] is received and previous[0] not in found:
            found.append(previous[0])
        if len(found) != 1:  # else by value
            found = [previous[0]] if previous is not None and previous[0] is not None \
                and _known_equal(previous[1], received) else []
            found += [output for output in range(outputs) if output not in found
                      and _known_equal(self.unhooked.input_of(fn, output, hooked=True), received)]
        if received is None and not found:  # None: what an output nothing used receives
            found = self._unused_output(fn, outputs)
        if len(found) != 1:
            # what the hook passed on is what the node received there only when nothing ran between the two that could
            # change it: a node pre-hook that returned gradients, a hook written in C
            trusted = grad_outputs and id(fn) not in self.c_nodes and not any(
                other.kind == "node_pre" and not other.returned_none for other in beside)
            output = _output_by_result(call, grad_outputs if trusted else (), self.store_limit, found)
        else:
            output = found[0]
        chains[id(fn)] = (output, call.grad_out)
        return output

    def _unused_output(self, fn: Any, outputs: int) -> list[int]:
        """[the one output of ``fn`` nothing used and that is no root of the pass] when every other output received
        a gradient (a tensor recorded): a hook that received None sits there; else []."""
        roots = {(id(root_fn), root_nr) for root_fn, root_nr in self.shape.root_edges}
        unused = [output for output in range(outputs)
                  if not self.shape.consumers.get((id(fn), output)) and (id(fn), output) not in roots]
        if len(unused) != 1 or not all(isinstance(self.unhooked.input_of(fn, output, hooked=True),
                                                  (torch.Tensor, TensorSummary))
                                       for output in range(outputs) if output != unused[0]):
            return []
        return unused

    def _is_input_node(self, node: Any) -> bool:
        for tensor in self.inputs:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                edge = gradient_edge(tensor, self.shape.leaves)
                if edge is not None and edge[0] is node:
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


def _known_equal(first: Any, second: Any) -> bool:
    """Two recorded values (copies, or summaries of large ones) known to be equal; an unknown one is not."""
    return isinstance(first, (torch.Tensor, TensorSummary)) and type(first) is type(second) \
        and values_equal(first, second)


def _output_by_result(call: HookRecord, grad_outputs: tuple, limit: int, among: list) -> int | None:
    """The output (of ``among``, when it names several) whose gradient, as the node received it (``grad_outputs``;
    empty when that is not what the hook passed on), equals what the hook passed on; None when that does not single
    one out (``call.unplaced`` then says why: nothing the lens kept tells which output it was)."""
    produced = call.grad_out
    matched = []
    for index, value in enumerate(grad_outputs):
        if among and index not in among:
            continue
        if isinstance(value, torch.Tensor) and produced is not None:
            if values_equal(snapshot(value, limit), produced):
                matched.append(index)
    if len(matched) == 1 or (matched and len(among) < 2):
        return matched[0]
    call.unplaced = UNPLACED_EQUAL if len(among) > 1 or len(matched) > 1 else UNPLACED
    return None


UNPLACED_EQUAL = "its outputs received equal gradients"
UNPLACED = "no gradient the lens kept of its outputs is the one the hook received"


def _outputs_of(fn: Any) -> int:
    """How many outputs the forward call of node ``fn`` made (what its backward receives), 1 when not known."""
    try:
        return len(fn._input_metadata)
    except Exception:  # noqa: BLE001  (a node without metadata: treated as one output, as before)
        return 1
