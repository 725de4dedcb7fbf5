"""A backward pass as a list of steps a student can walk through.

Step 0 is the moment before the engine starts; step k (k ≥ 1) is event k-1 of the pass.  Each step says which
node is running, which arrows got a gradient, which leaf's ``.grad`` changed, and what happened, in plain words.
The stepper widget and the static HTML page both draw from these steps; what a step *shows* (highlight, marks,
labels) is computed by :func:`frame`, which the front-end script mirrors.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field

from ..format import format_apart, format_block, format_value
from ..model import BackwardPass, GradWritten, Graph, HookCall, NodeRun, PassError, values_equal
from ..capture.inventory import NODE_HOOKS_NOTE
from .chain import chain_rule
from .operands import card_targets, input_keys, numbered_note
from .context import BOUNDARY_TEXT, STEP_LIMIT, Step, inventory_lines, _Pass, hook_positions, hook_totals, leaf_copies
from .context import kept_lines, made_by as _made_by, same_line
from .endcard import end_step, mark_nonfinite
from .hook_cards import _hook_step, _sum_text, _summable
from .questions import (CHAIN_RULE_LIMIT, Question, check_answer, check_answers, question_about, question_html,
                        question_rule, reveal_text)

# The walk-through's public names; a step's parts live in context.py (what steps are made of), questions.py
# (predict mode) and hook_cards.py (a hook call's card).
__all__ = ["STEP_LIMIT", "Frame", "Question", "Step", "card_html", "check_answer", "check_answers", "frame",
           "grads_table_html", "hook_totals", "question_frame", "question_html", "question_rule", "reveal_text",
           "steps_for"]


@dataclass(frozen=True)
class Frame:
    """What the drawing shows at one step (computed from the steps up to it)."""

    current: str | None
    done: frozenset[str]
    edge_labels: dict[str, str] = field(default_factory=dict)
    grads: dict[str, str] = field(default_factory=dict)


def frame(steps: list[Step], index: int) -> Frame:
    """The drawing at step ``index``: the current node, the nodes done before it, every arrow's
    gradient so far and every leaf's running ``.grad``."""
    done: set[str] = set()
    edge_labels: dict[str, str] = {}
    grads: dict[str, str] = {}
    for step in steps[: index + 1]:
        edge_labels.update(step.edges)
        grads.update(step.grads)
    for step in steps[:index]:
        done.update(step.done)
    current = steps[index].node if steps else None
    return Frame(current=current, done=frozenset(done - {current}), edge_labels=edge_labels, grads=grads)


def question_frame(steps: list[Step], index: int) -> Frame:
    """The drawing while step ``index``'s gradient is being predicted: everything before it, with its
    node already current."""
    before = frame(steps, index - 1) if index > 0 else Frame(current=None, done=frozenset())
    current = steps[index].node
    return Frame(current=current, done=frozenset(before.done | ({before.current} - {None}) - {current}),
                 edge_labels=before.edge_labels, grads=before.grads)


def steps_for(backward_pass: BackwardPass, totals: dict[tuple[str, str, str], int] | None = None) -> list[Step]:
    """The walk-through of one pass.  ``totals`` (from :func:`hook_totals` over every pass of the
    recording) lets a hook's card say "call 2 of 3"; by default this pass alone is counted."""
    totals = totals if totals is not None else hook_totals([backward_pass])
    positions = hook_positions(backward_pass)
    context = _Pass.of(backward_pass)
    steps = [_start_step(backward_pass)]
    events = backward_pass.events
    placed: dict[int, int] = {}  # event position -> its step
    for event in events[:STEP_LIMIT]:
        index = placed[getattr(event, "step", -1)] = len(steps)
        if isinstance(event, NodeRun):
            steps.append(_node_step(index, event, context, _made_by(backward_pass, event.node)))
        elif isinstance(event, HookCall):
            steps.append(_hook_step(index, event, context, totals, positions.get(event.step, (1, 1))))
        elif isinstance(event, GradWritten):
            steps.append(_grad_step(index, event, context))
        elif isinstance(event, PassError):
            steps.append(Step(index, "error", None, f"The pass stopped: {event.type}: {event.message}",
                              lines=("Everything before this step happened; nothing after it did.",)))
    _add_mistakes(steps, backward_pass)
    if len(events) <= STEP_LIMIT and not backward_pass.error:
        _settle_last_grads(steps, backward_pass)
    if len(events) > STEP_LIMIT:
        steps.append(Step(len(steps), "collapsed", None,
                          f"{len(events) - STEP_LIMIT:,} more events are not shown as steps",
                          lines=(f"This pass has {len(events):,} events; the stepper shows the first {STEP_LIMIT:,}. "
                                 f"All of them are in lens.passes[{backward_pass.index}].events.",)))
    mark_nonfinite(steps, backward_pass, placed)
    end = end_step(len(steps), backward_pass)
    return steps + [end] if end is not None else steps


def _settle_last_grads(steps: list[Step], backward_pass: BackwardPass) -> None:
    """The last step shows each leaf's ``.grad`` as the pass left it.  A ``.grad`` can change after the last
    value the recording saw with no record of it: a hook of another tensor edits it, or it shares memory with
    another gradient that was added to later (a one-element gradient adopted as a view of the seed or of
    another's).  When is not recorded, so from the next step until the last the drawing says "not known"."""
    if backward_pass.kind != "backward" or not steps:
        return
    last = len(steps) - 1
    shown: dict[str, tuple[str, int]] = {}  # node -> (text drawn, step that drew it)
    for step in steps:
        for node, text in step.grads:
            shown[node] = (text, step.index)
    late: dict[int, list[tuple[str, str]]] = {}
    notes = []
    for event in backward_pass.events:
        if not isinstance(event, GradWritten) or event.by != "AccumulateGrad" or not event.node:
            continue
        final = backward_pass.leaf_grads.get(event.name)
        if final is None or event.node not in shown:
            continue
        text = format_value(final, 48)
        drawn, since = shown[event.node]
        if drawn in (text, "not known"):
            continue
        copies = leaf_copies(backward_pass.graph, event.node)
        late.setdefault(last, []).extend((copy, text) for copy in copies)
        if since + 1 < last:
            late.setdefault(since + 1, []).extend((copy, "not known") for copy in copies)
        hooks = sorted({f"{call.hook} on {call.target}" for call in backward_pass.hook_calls if call.step + 1 > since})
        cause = (f"a hook that ran after it ({', '.join(hooks)}) may have changed it, or memory it shares with a "
                 "gradient added to later" if hooks else "code the recording does not see changed it (DistributedDataParallel "
                 "writes .grad after its all-reduce), or it shares memory with a gradient added to after it")
        notes.append(f"{event.name}.grad is {format_value(final)} at the end of the pass, not the {drawn} drawn at "
                     f"step {since}: {cause}; when it changed is not recorded"
                     + (f", so it is drawn as not known from step {since + 1}" if since + 1 < last else ""))
    for index, changes in sorted(late.items()):
        step = steps[index]
        steps[index] = dataclasses.replace(
            step, grads=tuple(step.grads) + tuple(changes),
            note=" ".join(filter(None, [step.note, *(notes if index == last else [])])))


# notes the hook cards already explain in their own words
_SAID_ON_CARDS = ("legacy_hook", "used_several_times")


def _add_mistakes(steps: list[Step], backward_pass: BackwardPass) -> None:
    """Each classic-mistake note on the step where it arose (the first step when it has none)."""
    for mistake in backward_pass.mistakes:
        if mistake.code in _SAID_ON_CARDS:
            continue
        index = mistake.step + 1 if mistake.step is not None and mistake.step + 1 < len(steps) else 0
        step = steps[index]
        steps[index] = dataclasses.replace(step, note=(step.note + " " if step.note else "") + mistake.text())


def _start_step(backward_pass: BackwardPass) -> Step:
    what = "backward()" if backward_pass.kind == "backward" else "torch.autograd.grad()"
    roots = ", ".join(backward_pass.roots) or "the output"
    lines = [f"The engine starts at {roots}: its gradient with respect to itself is 1 (or the gradient you passed)."]
    if backward_pass.kind == "grad":
        kept = sorted({e.name for e in backward_pass.events if isinstance(e, GradWritten) and e.by == "retain_grad"})
        lines.append(f"autograd.grad returns gradients for {', '.join(backward_pass.inputs)} and writes no leaf's .grad"
                     + (f"; it writes the .grad of {', '.join(kept)} (retain_grad() was called)." if kept else "."))
    lines.extend(f"Recording note: {note}." for note in backward_pass.notes)
    if backward_pass.sources_note:
        lines.append(f"Source lines: {backward_pass.sources_note}.")
    if backward_pass.groups:
        lines.append(f"Module groups: the dashed outlines are the {len(backward_pass.groups)} nn.Module calls "
                     "that made these nodes (click one to open or close it).")
    if backward_pass.groups_note:
        lines.append(f"Module groups: {backward_pass.groups_note}.")
    lines.extend(inventory_lines(backward_pass))
    lines.append(f"(Not listed: {NODE_HOOKS_NOTE}.)")
    return Step(0, "start", None, f"Before {what}", lines=tuple(lines))


def _computed(event: NodeRun, after: list[HookCall]):
    """What the backward function itself sent, before hooks on the node changed it: ``True`` when no hook
    changed anything (it is ``event.grad_out``), the values when a hook's record tells them, else None."""
    if not any(call.modified or call.error or call.edited_in_place or (call.unseen and call.grad_out is None)
               for call in after):
        return True
    if event.name == "BackwardHookFunctionBackward" and len(event.grad_in) == len(event.grad_out):
        return tuple(event.grad_in)  # the node itself passes gradients through
    first = after[0]
    if first.kind == "node" and not first.unseen and isinstance(first.grad_in, tuple) \
            and len(first.grad_in) == len(event.grad_out):
        return first.grad_in
    return None


def _node_step(index: int, event: NodeRun, context: _Pass, made_by: str = "") -> Step:
    graph = context.graph
    received = ", ".join(format_value(v) for v in event.grad_in)
    title = f"{event.label} ({event.name}) runs"
    lines = [made_by] if made_by else []
    lines.append(f"It received {received}.")
    if event.zeros:  # what a custom Function's backward(ctx, *grads) was given is not what the engine passed it
        slots = ", ".join(str(slot + 1) for slot in event.zeros)
        lines.append(f"Its backward was called with zeros where it received None (output{'s' * (len(event.zeros) > 1)}"
                     f" {slots} of {len(event.grad_in)}): torch turns a missing gradient into zeros before a custom "
                     "Function's backward runs, unless it calls ctx.set_materialize_grads(False).")
    inputs = input_keys(event, graph)
    targets = card_targets(event, graph, inputs)
    sends = [
        f"{target} ← {format_value(value)}"
        for target, value in zip(targets, event.grad_out)
        if target != "(no grad needed)"
    ]
    if sends:
        lines.append("It sends " + ", ".join(sends) + ".")
    numbered = numbered_note(event, targets)
    if numbered:
        lines.append(numbered)
    computed = _computed(event, context.after_node.get(event.step, []))
    if event.name == "BackwardHookFunctionBackward":
        rule = []
        if computed is True:
            side = next((key for key in ("output", "input") if event.label.endswith(f" {key} hook boundary")), "")
            lines.append(BOUNDARY_TEXT[side])
        else:
            lines.append("torch adds this node around the inputs and outputs of a module that has a full backward "
                         "hook (or pre-hook): the node itself passes gradients through unchanged, but the module's "
                         f"backward hooks that run here changed them: it received {received} and sends "
                         f"{', '.join(format_value(v) for v in event.grad_out)} (see the hook step).")
    else:
        rule = chain_rule(event, graph, CHAIN_RULE_LIMIT, computed, inputs, targets)
        lines.extend(rule)
    edges = [(edge, format_block(value)) for edge, value in zip(event.edges, event.grad_out) if edge]
    edges += [(edge, format_block(value)) for edge, value in zip(event.in_edges, event.grad_in) if edge]
    done = [event.node] if event.node else []
    done += [edge_dst for edge_dst in _output_tensors(graph, event)]
    question = _node_question(event, targets, computed, rule or lines[-1:], received, title, inputs)
    return Step(index, "node", event.node, title, lines=tuple(lines), edges=tuple(edges), done=tuple(done),
                question=question)


def _node_question(event: NodeRun, targets: list[str], computed, rule: list[str], received: str, title: str,
                   inputs: list) -> Question | None:
    """What one input receives from this node (all of it, when the input is used by several of its slots)."""
    import torch

    values = event.grad_out if computed is True else computed
    if values is None:
        return None
    for slot, target in enumerate(targets):
        if target == "(no grad needed)" or slot != inputs.index(inputs[slot]):
            continue
        if any(name == target and inputs[other] != inputs[slot] for other, name in enumerate(targets)):
            continue  # two inputs with one name: a question about "target" would not say which
        parts = [values[other] for other, key in enumerate(inputs) if key == inputs[slot] and other < len(values)]
        if not parts or not all(isinstance(p, torch.Tensor) for p in parts) or len({p.shape for p in parts}) > 1:
            continue
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        if computed is not True:
            ask = f"What does its backward function compute for {target}, before the hooks on this node change it?"
        elif len(parts) > 1:
            ask = f"What does {target} receive from it in all ({target} is {len(parts)} of its inputs)?"
        else:
            ask = f"What does {target} receive?"
        why = " ".join(line for line in rule if f"{target} receives" in line or f"{target} is used" in line
                       or "no hand-written formula" in line or "pass through" in line or "passes gradients" in line)
        question = question_about(f"{event.label} received g = {received}. {ask}", total, rule=why, title=title)
        if question is not None:
            return question
    return None


def _output_tensors(graph: Graph, event: NodeRun) -> list[str]:
    return [graph.edge(edge_id).dst for edge_id in dict.fromkeys(event.in_edges) if edge_id]


def _grad_step(index: int, event: GradWritten, context: _Pass) -> Step:
    graph, backward_pass = context.graph, context.backward_pass
    title = f"{event.name}.grad {'written' if event.received is not None else 'not written'}: {format_value(event.grad)}"
    if event.by in ("retain_grad", "inputs"):  # a non-leaf's .grad (views.context.kept_lines)
        text = format_value(event.grad, 48)
        held = graph.node(event.node).grad if event.node else None  # .grad as the pass found it
        return Step(index, "grad", event.node, title, lines=kept_lines(event, held), grads=((event.node, text),) if event.node else ())
    lines = [f"AccumulateGrad added this pass's gradient {format_value(event.received)} to {event.name}.grad."
             if event.received is not None else f"AccumulateGrad wrote no gradient to {event.name}.grad: none was "
             f"passed on to it, or {event.name} no longer requires grad (set after the forward) and torch drops it."]
    without = backward_pass.grads_without_hooks.get(event.name)
    reason = backward_pass.unknown.get(event.name)
    final = backward_pass.leaf_grads.get(event.name)
    if reason is None and without is not None and final is not None and not values_equal(final, event.grad) \
            and not any(c.kind == "post_accumulate_grad" and c.node == event.node for c in backward_pass.hook_calls):
        # .grad changes again after this write (DistributedDataParallel after its all-reduce, memory shared with
        # another gradient): what is known without hooks is the value at the end of the pass, not this write's
        lines.append(f"{event.name}.grad changes again after this write: it holds {format_value(final)} when the pass "
                     "ends, " + ("the same as without hooks." if values_equal(without, final)
                                 else f"and without the hooks it would end as {format_value(without)}."))
    elif reason is not None:
        lines.append(f"Without the hooks: unknown, because {reason}.")
    elif without is not None and not values_equal(without, event.grad):
        # without hooks no post-accumulate hook runs after the write: what it writes is where .grad ends
        shown, other = format_apart(event.grad, without)
        lines.append(f"Without the hooks it would be {other}" + (f" (it is {shown})." if shown != format_value(event.grad)
                                                                 else "."))
    elif without is not None:
        lines.append(same_line(event, backward_pass, changed_before=context.first_change < event.step))
    before = graph.node(event.node).grad if event.node else None
    note = ""
    if before is not None:
        note = f"{event.name}.grad already held {format_value(before)}: backward() adds to .grad, it does not overwrite it."
    copies = leaf_copies(graph, event.node)
    text = format_value(event.grad, 48)  # one line: the drawing swaps this text in place
    return Step(index, "grad", event.node, title, lines=tuple(lines), grads=tuple((c, text) for c in copies),
                done=tuple(copies), note=note, question=_grad_question(event, context, before))


def _grad_question(event: GradWritten, context: _Pass, before) -> Question | None:
    """What .grad holds after the write: what it held plus what reached the leaf (the sum of its uses)."""
    import torch

    name = event.name
    held = f"{name}.grad held {format_value(before)}" if before is not None else f"{name}.grad was None"
    parts = [p for p in context.arrived(event.node) if isinstance(p, torch.Tensor)]
    received = event.received
    if len(parts) > 1 and _summable(parts) and isinstance(received, torch.Tensor) \
            and values_equal(sum(parts[1:], parts[0]), received):
        brought = f"what reached {name} this pass is the sum over its {len(parts)} uses (two paths add): {_sum_text(parts)}"
    elif len(parts) == 1 and isinstance(received, torch.Tensor) and values_equal(parts[0], received):
        brought = f"what reached {name} this pass is what its one use sent, {format_value(received)}"
    else:
        brought = f"what reached {name} this pass, after its tensor hooks, is {format_value(received)}"
    if before is None:
        then = f"; .grad was None, so AccumulateGrad stores it: {format_value(event.grad)}."
    else:
        then = (f"; backward() adds it to what .grad held: {format_value(before)} + {format_value(received)} = "
                f"{format_value(event.grad)}.")
    rule = brought[0].upper() + brought[1:] + then
    return question_about(f"AccumulateGrad is about to write {name}.grad ({held}). What does {name}.grad hold after "
                          "this write?", event.grad, rule=rule, title=f"AccumulateGrad writes {name}.grad")


def card_html(step: Step, total: int) -> str:
    """The event card for a step: plain words, changed entries highlighted."""
    parts = [f'<div class="al-card al-{step.kind}">',
             f'<div class="al-step">step {step.index} of {total - 1}</div>',
             f'<div class="al-title">{html.escape(step.title)}</div>']
    for line in step.lines:
        parts.append(f"<div>{html.escape(line)}</div>")
    if step.changes:
        cells = "".join(
            f'<td class="{"al-changed" if b != a else ""}">{html.escape(b)} → {html.escape(a)}</td>'
            for b, a in step.changes
        )
        parts.append(f'<table class="al-changes"><tr>{cells}</tr></table>')
    if step.note:
        parts.append(f'<div class="al-note">Note: {html.escape(step.note)}</div>')
    parts.append("</div>")
    return "".join(parts)


def grads_table_html(backward_pass: BackwardPass) -> str:
    """Leaf gradients with the hooks vs without them, differences marked."""
    grads = backward_pass.grads
    if not grads:
        return ""
    backward = backward_pass.kind == "backward"
    head = ".grad" if backward else "returned"
    # .grad may hold earlier passes too: show this pass's own part, unless it is all .grad holds (zero_grad before it)
    several = backward and backward_pass.index > 0 and not all(
        name in backward_pass.added and values_equal(backward_pass.added[name], value) and values_equal(
            backward_pass.added_without_hooks.get(name), backward_pass.grads_without_hooks.get(name))
        for name, value in grads.items())
    rows = []
    for name, value in grads.items():
        without = backward_pass.grads_without_hooks.get(name)
        reason = backward_pass.unknown.get(name)
        unknown = reason is not None or (without is None and value is not None)
        differs = not unknown and not values_equal(value, without)
        mark = ' class="al-differs"' if differs else ""
        flag = "differs" if differs else ("unknown: " + (reason or "not recorded") if unknown else "same")
        cells = [name, *(format_apart(value, without) if differs else (format_value(value), format_value(without)))]
        cells[2] = "unknown" if unknown else cells[2]
        if several:
            added = backward_pass.added.get(name)
            added_without = backward_pass.added_without_hooks.get(name)
            cells += [format_value(added) if name in backward_pass.added else "not reached",
                      format_value(added_without) if added_without is not None else
                      ("unknown" if name in backward_pass.added else "not reached")]
        rows.append(f"<tr{mark}>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
                    + f"<td>{html.escape(flag)}</td></tr>")
    columns = [f"{head} with hooks", f"{head} if no hook had run"]
    if several:
        columns += ["added by this pass", "this pass without hooks"]
    header = "".join(f"<th>{html.escape(column)}</th>" for column in ["tensor", *columns, ""])
    return f'<table class="al-grads"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'

