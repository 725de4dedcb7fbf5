"""A backward pass as a list of steps a student can walk through.

Step 0 is the moment before the engine starts; step k (k ≥ 1) is event k-1 of
the pass.  Each step says which node is running, which arrows got a gradient,
which leaf's ``.grad`` changed, and what happened, in plain words.  The
stepper widget and the static HTML page both draw from these steps; what a
step *shows* (highlight, marks, labels) is computed by :func:`frame`, which
the front-end script mirrors.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field

from ..model import values_equal
from ..format import format_block, format_value
from ..model import BackwardPass, GradWritten, Graph, HookCall, NodeRun, PassError
from ..capture.inventory import NODE_HOOKS_NOTE
from .chain import chain_rule

CHAIN_RULE_LIMIT = 16  # tensors up to this many elements get the numbers written out
STEP_LIMIT = 1000  # events shown as steps; a larger pass ends with one step saying how many more there are


@dataclass(frozen=True)
class Step:
    """One step of the walk-through."""

    index: int
    kind: str  # "start", "node", "hook", "grad", "error"
    node: str | None  # graph node to highlight
    title: str  # one line, plain text
    lines: tuple[str, ...] = ()  # more plain-text lines for the card
    edges: tuple[tuple[str, str], ...] = ()  # (edge id, gradient text) revealed at this step
    grads: tuple[tuple[str, str], ...] = ()  # (node id, new text of its grad field)
    done: tuple[str, ...] = ()  # nodes that are finished after this step
    modified: bool = False
    changes: tuple[tuple[str, str], ...] = ()  # (before, after) entries, for a hook that changed a tensor
    note: str = ""  # a "classic surprise" remark
    question: Question | None = None  # what a student may predict before this step reveals it


@dataclass(frozen=True)
class Question:
    """A gradient the step is about to reveal, asked before it is shown (``predict`` mode)."""

    prompt: str
    answer: tuple[float, ...]  # autograd's value, flattened
    answer_text: str  # as the card prints it


def question_about(prompt: str, value) -> Question | None:
    """A question whose answer is ``value`` (a small real tensor), or None when it cannot be asked."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_complex() \
            or not value.dtype.is_floating_point or value.numel() > CHAIN_RULE_LIMIT or value.numel() == 0:
        return None
    flat = value.detach().reshape(-1).tolist()
    if not all(abs(v) < float("inf") for v in flat):
        return None
    return Question(prompt, tuple(float(v) for v in flat), format_value(value))


def check_answer(question: Question, text: str) -> tuple[bool, str]:
    """Compare a student's answer (numbers in any brackets/commas; one number stands for all entries)
    with autograd's value, at the precision the cards print."""
    import re

    numbers = [float(n) for n in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", text or "")]
    expected = question.answer
    if not numbers:
        return False, f"Type a number (or a list such as [1, 2]); autograd computed {question.answer_text}."
    if len(numbers) == 1 and len(expected) > 1:
        numbers = numbers * len(expected)
    if len(numbers) != len(expected):
        return False, (f"Not quite: that is {len(numbers)} number{'s' if len(numbers) != 1 else ''}, the gradient has "
                       f"{len(expected)}. Autograd computed {question.answer_text}.")
    close = all(abs(a - b) <= 1e-3 + 1e-3 * abs(b) for a, b in zip(numbers, expected))
    if close:
        return True, f"Right: autograd computed {question.answer_text}."
    return False, f"Not quite: autograd computed {question.answer_text}."


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


def leaf_copies(graph: Graph, node_id: str | None) -> list[str]:
    """Every drawn copy of a leaf (a widely used leaf is drawn once per use)."""
    if node_id is None:
        return []
    label = graph.node(node_id).label
    return [n.id for n in graph.nodes_labelled(label)
            if n.kind in ("leaf", "output") and n.op.endswith("AccumulateGrad")] or [node_id]


def hook_totals(passes: list[BackwardPass]) -> dict[tuple, int]:
    """How many times each registered hook (``HookCall.registration``) fired over the given passes."""
    totals: dict[tuple, int] = {}
    for backward_pass in passes:
        for call in backward_pass.hook_calls:
            key = _registration(call)
            totals[key] = max(totals.get(key, 0), call.invocation)
    return totals


def _registration(call: HookCall) -> tuple:
    """Which registered hook made ``call`` (records made before ``registration`` existed: name, target, kind)."""
    return ("registration", call.registration) if call.registration else (call.hook, call.target, call.kind)


def hook_positions(backward_pass: BackwardPass) -> dict[int, tuple[int, int]]:
    """For each hook call (by step): its place among the hooks of its kind that fired on the same
    target in this pass, and how many there were.  PyTorch runs the hooks on one tensor (or node,
    or module call) in registration order, so the place is the registration order."""
    groups: dict[tuple, list[int]] = {}
    for event in backward_pass.events:
        if isinstance(event, HookCall):
            key = (event.kind, event.target, event.node, event.forward_call)
            groups.setdefault(key, []).append(event.step)
    positions = {}
    for steps in groups.values():
        for place, step in enumerate(steps, 1):
            positions[step] = (place, len(steps))
    return positions


def steps_for(backward_pass: BackwardPass, totals: dict[tuple[str, str, str], int] | None = None) -> list[Step]:
    """The walk-through of one pass.  ``totals`` (from :func:`hook_totals` over every pass of the
    recording) lets a hook's card say "call 2 of 3"; by default this pass alone is counted."""
    graph = backward_pass.graph
    totals = totals if totals is not None else hook_totals([backward_pass])
    positions = hook_positions(backward_pass)
    steps = [_start_step(backward_pass)]
    events = backward_pass.events
    for event in events[:STEP_LIMIT]:
        index = len(steps)
        if isinstance(event, NodeRun):
            steps.append(_node_step(index, event, graph, _made_by(backward_pass, event.node)))
        elif isinstance(event, HookCall):
            steps.append(_hook_step(index, event, graph, backward_pass, totals, positions.get(event.step, (1, 1))))
        elif isinstance(event, GradWritten):
            steps.append(_grad_step(index, event, graph, backward_pass))
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
    return steps


def _settle_last_grads(steps: list[Step], backward_pass: BackwardPass) -> None:
    """The last step shows each leaf's ``.grad`` as the pass left it.  A ``.grad`` can change after its own
    write with no hook of it running: it shares memory with another gradient that was added to later (a
    one-element gradient adopted as a view of the seed or of another's), so the last step says so."""
    if backward_pass.kind != "backward" or not steps:
        return
    drawn = frame(steps, len(steps) - 1).grads
    changes = []
    notes = []
    for event in backward_pass.events:
        if not isinstance(event, GradWritten) or event.by != "AccumulateGrad" or not event.node:
            continue
        final = backward_pass.leaf_grads.get(event.name)
        if final is None or event.node not in drawn:
            continue
        text = format_value(final, 48)
        if drawn[event.node] not in (text, "not known"):
            changes += [(copy, text) for copy in leaf_copies(backward_pass.graph, event.node)]
            notes.append(f"{event.name}.grad is {format_value(final)} at the end of the pass, not the "
                         f"{drawn[event.node]} written: it shares memory with a gradient added to after it")
    if changes:
        last = steps[-1]
        steps[-1] = dataclasses.replace(last, grads=tuple(last.grads) + tuple(changes),
                                        note=" ".join(filter(None, [last.note, *notes])))


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
        lines.append(f"autograd.grad returns gradients for {', '.join(backward_pass.inputs)} and writes no .grad.")
    lines.extend(f"Recording note: {note}." for note in backward_pass.notes)
    if backward_pass.sources_note:
        lines.append(f"Source lines: {backward_pass.sources_note}.")
    if backward_pass.groups_note:
        lines.append(f"Module groups: {backward_pass.groups_note}.")
    elif backward_pass.groups:
        lines.append(f"Module groups: the dashed outlines are the {len(backward_pass.groups)} nn.Module calls "
                     "that made these nodes (click one to open or close it).")
    if backward_pass.inventory:
        lines.append(f"Hooks attached ({len(backward_pass.inventory)}); on one target they fire in registration "
                     "order, across targets in the engine's order:")
        lines.extend("• " + entry.text() for entry in backward_pass.inventory)
    else:
        lines.append("No tensor or module hook is attached to this graph.")
    lines.append(f"(Not listed: {NODE_HOOKS_NOTE}.)")
    return Step(0, "start", None, f"Before {what}", lines=tuple(lines))


def _made_by(backward_pass: BackwardPass, node: str | None) -> str:
    """Where the node came from, as the card says it ("" when lines are not known: the start card says why)."""
    group = backward_pass.group_of(node) if node and backward_pass.groups else None
    inside = f"inside {group.describe()}" if group is not None else ""
    source = backward_pass.sources.get(node) if node else None
    if source is not None:
        return f"Made by {source.describe()}" + (f", {inside}" if inside else "")
    if inside:
        return f"Made {inside}."
    if backward_pass.sources_note or not node:
        return ""
    return "Made before this cell ran, so the line that made it is not known."


def _node_step(index: int, event: NodeRun, graph: Graph, made_by: str = "") -> Step:
    received = ", ".join(format_value(v) for v in event.grad_in)
    title = f"{event.label} ({event.name}) runs"
    lines = [made_by] if made_by else []
    lines.append(f"It received {received}.")
    sends = [
        f"{target} ← {format_value(value)}"
        for target, value in zip(event.targets, event.grad_out)
        if target != "(no grad needed)"
    ]
    if sends:
        lines.append("It sends " + ", ".join(sends) + ".")
    rule = chain_rule(event, graph, CHAIN_RULE_LIMIT)
    if rule:
        lines.extend(rule)
    if event.name == "BackwardHookFunctionBackward":
        lines.append("torch adds this node around the inputs and outputs of a module that has a full backward hook "
                     "(or pre-hook): gradients pass through it unchanged, and the module's backward hooks run here.")
    edges = [(edge, format_block(value)) for edge, value in zip(event.edges, event.grad_out) if edge]
    edges += [(edge, format_block(value)) for edge, value in zip(event.in_edges, event.grad_in) if edge]
    done = [event.node] if event.node else []
    done += [edge_dst for edge_dst in _output_tensors(graph, event)]
    question = None
    for target, value in zip(event.targets, event.grad_out):
        if target != "(no grad needed)":
            question = question_about(f"{event.label} received g = {received}. What does {target} receive?", value)
            if question is not None:
                break
    return Step(index, "node", event.node, title, lines=tuple(lines), edges=tuple(edges), done=tuple(done),
                question=question)


def _output_tensors(graph: Graph, event: NodeRun) -> list[str]:
    return [graph.edge(edge_id).dst for edge_id in dict.fromkeys(event.in_edges) if edge_id]


def _hook_step(index: int, call: HookCall, graph: Graph, backward_pass: BackwardPass, totals: dict,
               position: tuple[int, int] = (1, 1)) -> Step:
    total = max(totals.get(_registration(call), 0), call.invocation)
    where = f"call {call.invocation} of {total} in this recording"
    if call.forward_call:
        where += f", for forward call {call.forward_call}"
    place, count = position
    which = f"hook {place} of {count} on {call.target}: {call.hook}" if count > 1 else f"hook {call.hook} on {call.target}"
    title = f"{which} ({call.kind_label} hook, {where})"
    grads: tuple[tuple[str, str], ...] = ()
    if call.kind == "post_accumulate_grad" and call.node:  # it may change .grad: the drawing shows what .grad holds now
        text = format_value(call.grad_out, 48) if call.grad_out is not None else "not known"
        grads = tuple((copy, text) for copy in leaf_copies(graph, call.node))
    if call.error:
        return Step(index, "hook", call.node, title, lines=(f"It raised {call.error}.",), modified=False, grads=grads)
    if call.unseen and call.grad_in is None and call.grad_out is None:
        return Step(index, "hook", call.node, title, lines=(f"It ran, but {call.unseen}.",), modified=False,
                    grads=grads)
    returned = "None (gradient unchanged)" if call.returned_none and not call.modified else format_value(call.grad_out)
    if call.kind == "post_accumulate_grad":
        lines = [f"It received the leaf itself; its .grad was {format_value(call.grad_in)}.",
                 "Post-accumulate hooks must return None; they may change .grad in place."]
        if call.modified:
            lines.append(f".grad is now {format_value(call.grad_out)}.")
    elif call.kind == "multi_grad":
        lines = [f"It received the gradients of {call.target}: {format_value(call.grad_in)}."]
        if call.modified:
            lines.append(f"It changed them in place, to {format_value(call.grad_out)}: the changed tensors flow on "
                         "(its return value is ignored).")
    else:
        verdict = "gradient modified" if call.modified else "gradient unchanged"
        lines = [f"received {format_value(call.grad_in)} → returned {returned} — {verdict}"]
        if call.unseen:
            lines = [f"received {format_value(call.grad_in)} → passed on {format_value(call.grad_out)} — {verdict}",
                     f"Known from the gradients around it: {call.unseen}."]
        elif call.modified and call.returned_none:
            lines.append("It returned None but changed the gradient in place: that counts.")
        if call.context is not None and call.kind in ("node", "module_full", "global_module_full", "module_legacy", "global_module_legacy"):
            lines.append(f"(grad_output was {format_value(call.context)})")
    changes = _changes(call.grad_in, call.grad_out) if call.modified else ()
    note = _hook_note(call, graph, backward_pass)
    return Step(index, "hook", call.node, title, lines=tuple(lines), modified=call.modified, changes=changes, note=note,
                grads=grads)


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


def _hook_note(call: HookCall, graph: Graph, backward_pass: BackwardPass) -> str:
    notes = []
    if call.kind.endswith("module_legacy"):
        notes.append(
            "This is a legacy register_backward_hook: its grad_input belongs to the module's last operation "
            "only, which is wrong for any module made of more than one op. Use register_full_backward_hook."
        )
    if call.kind == "tensor" and call.node:
        uses = sum(1 for edge in graph.edges_from(call.node) if edge.kind == "data")
        if uses > 1:
            notes.append(
                f"{call.target} is used by {uses} ops, yet its hook fired once: autograd first adds up "
                f"the gradients from every use (here {format_value(call.grad_in)}), then calls the hook."
            )
    if call.modified and call.kind not in ("post_accumulate_grad", "multi_grad"):
        if call.edited_in_place:
            notes.append("It changed the gradient tensor in place: the changed tensor flows on toward the inputs, "
                         "and anything else holding the same tensor sees the change too.")
        else:
            notes.append(f"What it returned replaces what it received: {format_value(call.grad_out)} flows on toward "
                         f"the inputs where {format_value(call.grad_in)} would have.")
        # another hook that changed something, or whose effect is not known (written in C), or that raised
        others = [e for e in backward_pass.hook_calls if e.step != call.step
                  and (e.modified or e.error or e.unseen and e.grad_out is None)]
        changed = _changed_leaves(backward_pass)
        if changed and not others:
            notes.append(
                "It is the only hook that changed anything in this pass, so it is why "
                + ", ".join(f"{name} ends with {format_value(backward_pass.grads[name])} instead of "
                            f"{format_value(backward_pass.grads_without_hooks[name])}" for name in changed)
                + "."
            )
    return " ".join(notes)


def _changed_leaves(backward_pass: BackwardPass) -> list[str]:
    return [
        name for name, value in backward_pass.grads.items()
        if backward_pass.grads_without_hooks.get(name) is not None
        and not values_equal(value, backward_pass.grads_without_hooks[name])
    ]


def _grad_step(index: int, event: GradWritten, graph: Graph, backward_pass: BackwardPass) -> Step:
    title = f"{event.name}.grad written: {format_value(event.grad)}"
    if event.by == "retain_grad":
        lines = (f"retain_grad() keeps the gradient {format_value(event.received)} that reached {event.name}, "
                 f"after its tensor hooks: {event.name}.grad is {format_value(event.grad)} once this pass ends.",
                 f"{event.name} is not a leaf: without retain_grad() its .grad would stay None.")
        text = format_value(event.grad, 48)
        return Step(index, "grad", event.node, title, lines=lines, grads=((event.node, text),) if event.node else ())
    lines = [f"AccumulateGrad added this pass's gradient {format_value(event.received)} to {event.name}.grad."]
    without = backward_pass.grads_without_hooks.get(event.name)
    reason = backward_pass.unknown.get(event.name)
    if reason is not None:
        lines.append(f"Without the hooks: unknown, because {reason}.")
    elif without is not None and not values_equal(without, backward_pass.leaf_grads.get(event.name)):
        lines.append(f"Without the hooks it would be {format_value(without)}.")
    elif without is not None:
        lines.append("No hook changed it: the same as without hooks.")
    before = graph.node(event.node).grad if event.node else None
    note = ""
    if before is not None:
        note = f"{event.name}.grad already held {format_value(before)}: backward() adds to .grad, it does not overwrite it."
    copies = leaf_copies(graph, event.node)
    text = format_value(event.grad, 48)  # one line: the drawing swaps this text in place
    held = f"{event.name}.grad held {format_value(before)} and" if before is not None else f"{event.name}.grad was None and"
    question = question_about(f"AccumulateGrad is about to write {event.name}.grad: {held} this pass brings "
                              f"{format_value(event.received)}. What is {event.name}.grad now?", event.grad)
    return Step(index, "grad", event.node, title, lines=tuple(lines), grads=tuple((c, text) for c in copies),
                done=tuple(copies), note=note, question=question)


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


def question_html(step: Step, total: int, inputs: bool = True) -> str:
    """The card of a step whose gradient the student predicts first: the question (and, for the static
    page, a box and two buttons; the live widget has its own)."""
    question = step.question
    ask = ('<div class="al-ask"><label>your answer <input type="text" class="al-answer" size="24"></label> '
           '<button type="button" data-go="check">check</button> '
           '<button type="button" data-go="reveal">show me</button></div>') if inputs else ""
    return (f'<div class="al-card al-question"><div class="al-step">step {step.index} of {total - 1}: predict</div>'
            f'<div class="al-title">{html.escape(step.title)}</div><div>{html.escape(question.prompt)}</div>'
            f"{ask}</div>")


def feedback_html(message: str, right: bool) -> str:
    return f'<div class="al-feedback {"al-right" if right else "al-wrong"}">{html.escape(message)}</div>'


def grads_table_html(backward_pass: BackwardPass) -> str:
    """Leaf gradients with the hooks vs without them, differences marked."""
    grads = backward_pass.grads
    if not grads:
        return ""
    backward = backward_pass.kind == "backward"
    head = ".grad" if backward else "returned"
    several = backward and backward_pass.index > 0  # .grad may hold earlier passes too: show this pass's own part
    rows = []
    for name, value in grads.items():
        without = backward_pass.grads_without_hooks.get(name)
        reason = backward_pass.unknown.get(name)
        unknown = reason is not None or (without is None and value is not None)
        differs = not unknown and not values_equal(value, without)
        mark = ' class="al-differs"' if differs else ""
        flag = "differs" if differs else ("unknown: " + (reason or "not recorded") if unknown else "same")
        cells = [name, format_value(value), "unknown" if unknown else format_value(without)]
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

