"""The card of a hook call: what it received, what it passed on, why (the rule), which call of that hook it was,
and the question predict mode asks about it."""

from __future__ import annotations

import dataclasses
import re

from ..model import values_equal
from ..format import format_apart, format_value
from ..model import BackwardPass, HookCall, PassError
from .context import Step, _Pass, _registration, leaf_copies
from .questions import CHAIN_RULE_LIMIT, Question, question_about


def _call_number(call: HookCall, totals: dict) -> str:
    """``call 2 of 3 in this recording``; ``of at least 3`` when a later hook may be this one; ``call number not
    known`` when this hook cannot be told from others of its code counted before its tensor had a name."""
    if call.invocation is None:
        return ("call number not known: hooks of its code ran on this tensor while it had no name, and hooks of that "
                "code were removed or added since, so which of them this is cannot be told")
    registration = _registration(call)
    total = max(totals.get(registration, 0), call.invocation)
    bound = "at least " if ("at least",) + registration in totals else ""
    return f"call {call.invocation} of {bound}{total} in this recording"


def _hook_step(index: int, call: HookCall, context: _Pass, totals: dict, position: tuple[int, int] = (1, 1)) -> Step:
    graph = context.graph
    where = _call_number(call, totals) + _nested_calls(call, context.backward_pass)
    if call.forward_call and (call.forward_calls or 0) > 1:  # (a call whose hooks this pass did not reach: uncounted)
        where += f", for forward call {call.forward_call} of the {call.forward_calls} this pass reached"
    place, count = position
    which = f"hook {place} of {count} on {call.target}: {call.hook}" if count > 1 else f"hook {call.hook} on {call.target}"
    title = f"{which} ({call.kind_label} hook, {where})"
    grads: tuple[tuple[str, str], ...] = ()
    if call.kind == "post_accumulate_grad" and call.node:  # it may change .grad: the drawing shows what .grad holds now
        text = format_value(call.grad_out, 48) if call.grad_out is not None else \
            "None" if call.grad_cleared else "not known"
        grads = tuple((copy, text) for copy in leaf_copies(graph, call.node))
    if call.error:
        return Step(index, "hook", call.node, title, lines=(f"It raised {call.error}.",), modified=False, grads=grads)
    refused = _refused(call, context.backward_pass)
    if refused and call.kind == "post_accumulate_grad":
        held = f"; .grad holds {format_value(call.grad_out)}" if call.grad_out is not None else ""
        lines = [f"It received the leaf itself; its .grad was {format_value(call.grad_in)}.",
                 f"It returned something other than None: torch refused it ({refused}) after AccumulateGrad had "
                 f"written .grad, and the pass stopped here{held}."]
        if call.edited_in_place:
            lines.append("It changed .grad in place, and that change stays. An in-place method (p.grad.mul_(...), "
                         "masked_fill_) returns the tensor it changed: a lambda that calls one returns it too.")
        return Step(index, "hook", call.node, title, modified=call.modified, grads=grads, lines=tuple(lines))
    if refused:
        return Step(index, "hook", call.node, title, modified=False, grads=grads, note=_hook_note(call, context, place),
                    lines=(f"received {format_value(call.grad_in)} → torch refused what it returned ({refused}): "
                           "nothing flowed on after it, the pass stopped here.",))
    if call.unseen and call.grad_in is None and call.grad_out is None:
        lines = [f"It ran, but {call.unseen}."]
        if call.kind == "post_accumulate_grad":
            lines.append(f"It may have changed {call.target}.grad in place: the drawing shows it as not known.")
        return Step(index, "hook", call.node, title, lines=tuple(lines), modified=False, grads=grads)
    returned = "None" if call.returned_none and not call.modified else format_value(call.grad_out)
    if call.kind == "post_accumulate_grad":
        lines = [f"It received the leaf itself; its .grad was {format_value(call.grad_in)}.",
                 "Post-accumulate hooks must return None; they may change .grad in place."]
        if call.grad_cleared:
            lines.append(f"It set {call.target}.grad to None (as optimizer.zero_grad() does): .grad is None now.")
        elif call.grad_out is None:
            lines.append(f"What .grad holds after it is not known ({call.unseen or 'not recorded'}).")
        elif call.modified:
            lines.append(f".grad is now {format_value(call.grad_out)}.")
        if call.value_after is not None:
            lines.append(f"It changed {call.target} itself, in place: {format_value(call.value_before)} → "
                         f"{format_value(call.value_after)} (an optimizer step inside the hook). The drawing shows "
                         "the value the forward pass used.")
    elif call.kind == "multi_grad" and not isinstance(call.grad_in, (tuple, list)) and len(_watched(call.target)) > 1:
        # mode="any": one gradient, the first of its tensors' to be computed, not the gradients of them all
        whose = _received_from(graph, call)
        whose = f", that of {whose}" if whose.startswith("a tensor with no name") else f", {whose}'s" if whose else ""
        lines = [f"It received one gradient{whose} (mode=\"any\": the first computed of "
                 f"{call.target}'s): {format_value(call.grad_in)}."]
        if call.modified:
            lines.append(f"It changed it in place, to {format_value(call.grad_out)}: the changed tensor flows on "
                         "(its return value is ignored).")
    elif call.kind == "multi_grad":
        lines = [f"It received the gradients of {call.target}: {format_value(call.grad_in)}."]
        if call.modified:
            lines.append(f"It changed them in place, to {format_value(call.grad_out)}: the changed tensors flow on "
                         "(its return value is ignored).")
    else:
        verdict = "gradient modified" if call.modified else "gradient unchanged"
        received = format_value(call.grad_in)
        if call.modified and returned != "None":  # changed by less than 4 digits show: more digits, never "x → x"
            received, returned = format_apart(call.grad_in, call.grad_out)
        lines = [f"received {received} → returned {returned} — {verdict}"]
        if call.unseen:
            lines = [f"received {format_value(call.grad_in)} → passed on {format_value(call.grad_out)} — {verdict}",
                     f"Known from the gradients around it: {call.unseen}."]
        elif call.modified and call.returned_none:
            lines.append("It returned None but changed the gradient in place: that counts.")
        if call.context is not None and call.kind in ("node", "module_full", "global_module_full", "module_legacy", "global_module_legacy"):
            lines.append(f"(grad_output was {format_value(call.context)})")
    changes = _changes(call.grad_in, call.grad_out) if call.modified else ()
    note = _hook_note(call, context, place)
    return Step(index, "hook", call.node, title, lines=tuple(lines), modified=call.modified, changes=changes, note=note,
                grads=grads, question=_hook_question(call, context, place, title))


# what the engine (or torch's module-hook wrapper) raises right after a hook returned something it cannot use
_REFUSALS = re.compile(r"has changed the (size|type) of value|expected (Variable|tuple), but hook returned '|"
                       r"has returned an incorrect number of values|can't replace a None gradient with a non-None|"
                       r"hook returned an invalid number of grad_(input|output)|^object of type '\w+' has no len\(\)$|"
                       r"^Tensor post accumulate grad hooks should return None")


def _refused(call: HookCall, backward_pass: BackwardPass) -> str:
    """Torch's error, when the pass stopped right after this call because torch refused what the hook returned
    (a float, a list, a tensor of another shape or dtype, a tuple of the wrong length); "" otherwise."""
    if call.returned_none or call.kind == "multi_grad":
        return ""
    events = backward_pass.events
    at = call.step if 0 <= call.step < len(events) and events[call.step] is call else \
        next((i for i, event in enumerate(events) if event is call), None)
    after = events[at + 1] if at is not None and at + 1 < len(events) else None
    if isinstance(after, PassError) and _REFUSALS.search(after.message):
        return f"{after.type}: {after.message}"
    return ""


def _single(value):
    """The one gradient in a hook's value, with its place: (None, tensor), or (index, tensor) for a tuple that
    holds one; (None, None) when there is not exactly one."""
    if isinstance(value, tuple):
        present = [(index, item) for index, item in enumerate(value) if item is not None]
        return present[0] if len(present) == 1 else (None, None)
    return None, value


def _sum_text(parts: list) -> str:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return " + ".join(format_value(part) for part in parts) + f" = {format_value(total)}"


def _receive_rule(call: HookCall, context: _Pass, place: int) -> str:
    """Why a hook receives what it receives."""
    import torch

    if place > 1:  # only a module's own full backward (pre-)hooks take prepend=True (Tensor/Node hooks: TypeError)
        order = ("registration order, but one registered with prepend=True goes first"
                 if call.kind in ("module_full", "module_full_pre") else "registration order")
        return (f"Hooks on one {'tensor' if call.kind == 'tensor' else 'target'} run one after another (in {order}), "
                f"each receiving what the one before it passed on: here {format_value(call.grad_in)}.")
    if call.kind == "tensor":
        parts = [p for p in context.arrived(call.node) if isinstance(p, torch.Tensor)]
        total = None
        if parts and len({p.shape for p in parts}) == 1:
            total = parts[0]
            for part in parts[1:]:
                total = total + part
        if total is not None and isinstance(call.grad_in, torch.Tensor) and values_equal(total, call.grad_in) \
                and len(parts) > 1:
            return (f"A tensor hook fires once per pass, with the sum of what every use of {call.target} sent: two "
                    f"paths add, {_sum_text(parts)}.")
        if total is not None and isinstance(call.grad_in, torch.Tensor) and values_equal(total, call.grad_in):
            return f"A tensor hook receives the gradient of {call.target}: what its one use sent, {format_value(total)}."
        return (f"A tensor hook receives the gradient of {call.target}: the sum of what its uses sent, "
                f"{format_value(call.grad_in)}.")
    return {
        "node_pre": "A node pre-hook receives the gradient of the node's output (after that tensor's hooks).",
        "node": "A node hook runs after the backward function: it receives what the node computed for its inputs.",
        "module_full_pre": "A module's full backward pre-hook receives the gradient of the module's output.",
        "global_module_full_pre": "A module's full backward pre-hook receives the gradient of the module's output.",
        "module_full": "A module's full backward hook receives the gradients with respect to the module's inputs.",
        "global_module_full": "A module's full backward hook receives the gradients with respect to the module's inputs.",
        "multi_grad": "A multi-grad hook receives the gradients of its tensors once they are computed.",
    }.get(call.kind, f"It receives the gradient that reached {call.target}.")


def _flow_rule(call: HookCall) -> str:
    """Why what flows on after a hook is what it is."""
    if call.kind == "multi_grad":
        return ("A multi-grad hook's return value is ignored; what flows on is the gradients, with any in-place edit "
                "it made.")
    if call.unseen:
        return ("It is written in C: what flows on is what the step after it received, "
                + ("a new value: it replaced the gradient." if call.modified else "the same value: it changed nothing."))
    if call.returned_none and not call.modified:
        return "It returned None, so the gradient flows on unchanged."
    if call.returned_none:
        return "It returned None but changed the gradient in place: the changed tensor flows on."
    if not call.modified:
        return "It returned a tensor equal to what it received: the same numbers flow on."
    return (f"The hook's return replaces the gradient: {format_value(call.grad_out)} flows on where "
            f"{format_value(call.grad_in)} would have.")


def _hook_question(call: HookCall, context: _Pass, place: int, title: str) -> Question | None:
    """What the hook receives and what flows on after it; for a post-accumulate hook, what .grad holds after it."""
    if call.error or call.grad_in is None or call.grad_out is None:
        return None
    if _refused(call, context.backward_pass):
        return None
    if call.kind == "post_accumulate_grad":
        if call.modified:
            rule = (f"A post-accumulate-grad hook gets the leaf after AccumulateGrad wrote .grad; it returns None, and "
                    f"what it does to .grad is what .grad holds: {format_value(call.grad_in)} became "
                    f"{format_value(call.grad_out)}.")
        else:
            rule = (f"A post-accumulate-grad hook gets the leaf after AccumulateGrad wrote .grad; this one left .grad "
                    f"as it was: {format_value(call.grad_out)}.")
        return question_about(f"Hook {call.hook} runs after AccumulateGrad wrote {call.target}.grad = "
                              f"{format_value(call.grad_in)}. What does {call.target}.grad hold after it?",
                              call.grad_out, rule=rule, title=title)
    (slot_in, received), (slot_out, passed) = _single(call.grad_in), _single(call.grad_out)
    if received is None or passed is None or slot_in != slot_out:
        return None
    prompt = (f"Hook {call.hook} on {call.target} is about to run. What does it receive, and what flows on after it "
              "(what it returns, or what it received if it returns None)?")
    first = question_about(prompt, received, rule=_receive_rule(call, context, place), title=title,
                           label="what it receives")
    second = question_about(prompt, passed, rule=_flow_rule(call), title=title, label="what flows on after it")
    if first is None or second is None:
        return None
    return dataclasses.replace(first, more=(second,))


def _changes(before, after) -> tuple[tuple[str, str], ...]:
    """Entry-by-entry (before, after) for a small tensor a hook changed; empty otherwise."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return ()
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        pairs = [(b, a) for b, a in zip(before, after) if not values_equal(b, a)]
        if len(pairs) != 1:
            return ()
        before, after = pairs[0]
    if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)) or before.shape != after.shape:
        return ()
    if before.numel() > CHAIN_RULE_LIMIT:
        return ()
    flat_before = before.reshape(-1).tolist()
    flat_after = after.reshape(-1).tolist()
    return tuple((format_value(b), format_value(a)) for b, a in zip(flat_before, flat_after))


def _uses_note(call: HookCall, context: _Pass) -> str:
    """A tensor hook that fired once for a tensor several ops (or one op, twice) used."""
    arrivals = context.arrived(call.node, by_op=True)  # one per use that sent a gradient this pass
    arrived = [value for _, value in arrivals]
    uses, ops = len(arrivals), {step for step, _ in arrivals}
    if uses < 2:
        return ""
    if len(ops) == uses:
        used = f"used by {uses} ops"
    else:
        used = f"used {uses} times" + (f" by {len(ops)} op{'s' if len(ops) > 1 else ''}" if ops else "")
    parts = f"{_sum_text(arrived)}" if len(arrived) > 1 and _summable(arrived) else format_value(call.grad_in)
    return (f"{call.target} is {used}, yet its hook fired once: autograd first adds up the gradients from every use "
            f"(here {parts}), then calls the hook.")


def _summable(values: list) -> bool:
    import torch

    return all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1


def _hook_note(call: HookCall, context: _Pass, place: int = 1) -> str:
    backward_pass = context.backward_pass
    notes = []
    if call.kind.endswith("module_legacy"):
        notes.append(
            "This is a legacy register_backward_hook: its grad_input belongs to the module's last operation "
            "only, which is wrong for any module made of more than one op. Use register_full_backward_hook."
        )
    if call.kind == "tensor" and call.node and place == 1:
        uses = _uses_note(call, context)
        if uses:
            notes.append(uses)
    if call.modified and call.kind not in ("post_accumulate_grad", "multi_grad") \
            and not _refused(call, backward_pass):
        if call.edited_in_place:
            notes.append("It changed the gradient tensor in place: the changed tensor flows on toward the inputs, "
                         "and anything else holding the same tensor sees the change too.")
        else:
            notes.append(f"What it returned replaces what it received: {format_value(call.grad_out)} flows on toward "
                         f"the inputs where {format_value(call.grad_in)} would have.")
        credit = _sole_cause(call, backward_pass)
        if credit:
            notes.append(credit)
    return " ".join(notes)


def _sole_cause(call: HookCall, backward_pass: BackwardPass) -> str:
    """"It is the only hook that changed anything …": said only when nothing else in the pass could have changed
    a gradient — no other hook that changed one, raised, or whose effect is not known (written in C), and a
    recording with no gap (no note, no unknown value, no error).  For a leaf whose .grad held a value before the
    pass, what is credited is this pass's own contribution."""
    others = [e for e in backward_pass.hook_calls if e.step != call.step
              and (e.modified or e.error or e.edited_in_place or (e.unseen and (e.grad_out is None or e.grad_in is None)))]
    if others or backward_pass.notes or backward_pass.unknown or backward_pass.error:
        return ""
    changed = _changed_leaves(backward_pass)
    if not changed:
        return ""
    graph = backward_pass.graph
    held = {node.label for node in graph.nodes if node.kind == "leaf" and node.grad is not None}
    said = []
    for name in changed:
        if backward_pass.kind == "grad":
            said.append(f"autograd.grad returns {format_value(backward_pass.grads[name])} for {name} instead of "
                        f"{format_value(backward_pass.grads_without_hooks[name])}")
        elif name in held or len(graph.nodes_labelled(name)) == 0:
            added, without = backward_pass.added.get(name), backward_pass.added_without_hooks.get(name)
            if added is None or without is None:
                return ""
            if values_equal(added, without):
                continue  # its .grad differs by what an earlier pass's hooks did: this pass added the same
            said.append(f"this pass adds {format_value(added)} to {name}.grad instead of {format_value(without)}")
        else:
            said.append(f"{name} ends with {format_value(backward_pass.grads[name])} instead of "
                        f"{format_value(backward_pass.grads_without_hooks[name])}")
    if not said:
        return ""
    return "It is the only hook that changed anything in this pass, so it is why " + ", ".join(said) + "."


def _changed_leaves(backward_pass: BackwardPass) -> list[str]:
    return [
        name for name, value in backward_pass.grads.items()
        if backward_pass.grads_without_hooks.get(name) is not None
        and not values_equal(value, backward_pass.grads_without_hooks[name])
    ]


def _received_from(graph, call: HookCall) -> str:
    """Whose gradient a mode="any" multi-grad hook received: the tensor its call is drawn at (torch runs it as a
    tensor hook of that tensor), when that is one of its tensors; "" when not known."""
    if not call.node:
        return ""
    try:
        node = graph.node(call.node)
    except KeyError:
        return ""
    names = _watched(call.target)
    if node.is_tensor and node.label in names:
        return node.label
    if not node.is_tensor and names[-1].endswith("with no name"):
        # drawn at a node, not at a tensor: none of its named tensors was made there (capture.order.multi_grad_target)
        return f"a tensor with no name made by {node.label}"
    return ""


def _watched(target: str) -> list[str]:
    """The parts of a multi-grad hook's target (capture.order.multi_grad_target): "a, b and a tensor with no name"."""
    head, _, tail = target.rpartition(" and ")
    parts = head.split(",") + [tail] if head else target.split(",")
    return [part.strip() for part in parts if part.strip()]


NESTED = "hooks ran inside a nested backward run by "


def _nested_calls(call: HookCall, backward_pass: BackwardPass) -> str:
    """What "call i of n" leaves out: calls of this hook inside a nested backward of the pass (reentrant
    checkpointing), which the pass's note lists by target and name (module hooks) or by name alone."""
    for text in backward_pass.notes:
        if text.startswith(NESTED) and "not recorded as steps of this pass: " in text:
            listed = text.split("not recorded as steps of this pass: ", 1)[1].rsplit("; values without hooks", 1)[0]
            entries = listed.split("; ")
            if f"{call.target}: {call.kind_label} hook {call.hook}" in entries:
                return ", not counting its calls inside a nested backward: see the notes"
            if call.hook in entries:
                return f"; a hook named {call.hook} also ran inside a nested backward, not counted: see the notes"
    return ""
