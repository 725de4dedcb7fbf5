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
from .chain import chain_rule, input_keys

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
    """A value the step is about to reveal, asked before it is shown (``predict`` mode).

    ``title`` is the card's title while the question is open (the step's own title may hold the answer);
    ``rule`` says why autograd's value is what it is, shown with the feedback; ``more`` holds further parts
    asked on the same card (a hook: what it receives, then what flows on after it)."""

    prompt: str
    answer: tuple[float, ...]  # autograd's value, flattened
    answer_text: str  # as the card prints it
    rule: str = ""
    title: str = ""
    label: str = "your answer"
    more: tuple["Question", ...] = ()

    @property
    def parts(self) -> tuple["Question", ...]:
        return (self, *self.more)


def question_about(prompt: str, value, rule: str = "", title: str = "", label: str = "your answer") -> Question | None:
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
    return Question(prompt, tuple(float(v) for v in flat), format_value(value), rule=rule, title=title, label=label)


def check_answer(question: Question, text: str) -> tuple[bool, str]:
    """Compare a student's answer (numbers in any brackets/commas; one number stands for all entries)
    with autograd's value, at the precision the cards print (one part of a question)."""
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


def check_answers(question: Question, texts) -> tuple[bool, str]:
    """Every part of a question checked (``texts``: one answer per part; a single string is split at ``;``).
    Mirrored by ``checkAnswers`` in stepper.js: same words."""
    if isinstance(texts, str):
        texts = texts.split(";") if len(question.parts) > 1 else [texts]
    texts = list(texts) + [""] * (len(question.parts) - len(texts))
    results = [check_answer(part, text) for part, text in zip(question.parts, texts)]
    if len(results) == 1:
        return results[0]
    return all(right for right, _ in results), " ".join(
        f"{part.label}: {message}" for part, (_, message) in zip(question.parts, results))


def reveal_text(question: Question) -> str:
    """What the feedback says when the student asks to be shown (mirrored in stepper.js)."""
    if len(question.parts) == 1:
        return f"Autograd computed {question.answer_text}."
    return " ".join(f"{part.label}: autograd computed {part.answer_text}." for part in question.parts)


def question_rule(question: Question) -> str:
    """Why the answers are what they are: each part's rule, once."""
    return " ".join(dict.fromkeys(part.rule for part in question.parts if part.rule))


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
    or module call) in registration order, so the place is the registration order.  Hooks are told apart
    by their registration: one hook firing twice on a target is one hook, two hooks are two."""
    groups: dict[tuple, list[HookCall]] = {}
    for event in backward_pass.events:
        if isinstance(event, HookCall):
            key = (event.kind, event.target, event.node, event.forward_call)
            groups.setdefault(key, []).append(event)
    positions = {}
    for calls in groups.values():
        hooks = list(dict.fromkeys(call.registration or ("step", call.step) for call in calls))
        for call in calls:
            positions[call.step] = (hooks.index(call.registration or ("step", call.step)) + 1, len(hooks))
    return positions


# hooks that run on a backward function after it computed (they may change what it sends)
_AFTER_NODE = ("node", "module_full", "global_module_full", "module_legacy", "global_module_legacy",
               "module_full_pre", "global_module_full_pre")


@dataclass
class _Pass:
    """What the steps of one pass look up: its graph, the hooks that ran right after each node on that node,
    and every gradient that arrived at each drawn tensor (one entry per use)."""

    backward_pass: BackwardPass
    after_node: dict[int, list[HookCall]] = field(default_factory=dict)
    arrivals: dict[str, list] = field(default_factory=dict)
    first_change: float = float("inf")  # the step of the first hook that changed a gradient, or may have

    @property
    def graph(self) -> Graph:
        return self.backward_pass.graph

    @classmethod
    def of(cls, backward_pass: BackwardPass) -> "_Pass":
        context = cls(backward_pass)
        graph = backward_pass.graph
        events = backward_pass.events
        for position, event in enumerate(events):
            if isinstance(event, HookCall) and (event.modified or event.edited_in_place or event.error or (
                    event.unseen and (event.grad_in is None or event.grad_out is None))):
                context.first_change = min(context.first_change, event.step)
            if not isinstance(event, NodeRun):
                continue
            following = context.after_node.setdefault(event.step, [])
            for later in events[position + 1:]:
                if not (isinstance(later, HookCall) and later.node == event.node and event.node
                        and later.kind in _AFTER_NODE):
                    break
                following.append(later)
            for edge_id, value in zip(event.edges, event.grad_out):
                if edge_id and value is not None:
                    context.arrivals.setdefault(graph.edge(edge_id).src, []).append((event.step, value))
        return context

    def arrived(self, node_id: str | None, by_op: bool = False) -> list:
        """The gradients the uses of a tensor sent it (a leaf drawn once per use: all its copies); with
        ``by_op``, (step of the node that sent it, gradient) pairs."""
        if node_id is None:
            return []
        copies = leaf_copies(self.graph, node_id) if self.graph.node(node_id).kind == "leaf" else [node_id]
        found = [item for copy in copies for item in self.arrivals.get(copy, ())]
        return found if by_op else [value for _, value in found]


def steps_for(backward_pass: BackwardPass, totals: dict[tuple[str, str, str], int] | None = None) -> list[Step]:
    """The walk-through of one pass.  ``totals`` (from :func:`hook_totals` over every pass of the
    recording) lets a hook's card say "call 2 of 3"; by default this pass alone is counted."""
    totals = totals if totals is not None else hook_totals([backward_pass])
    positions = hook_positions(backward_pass)
    context = _Pass.of(backward_pass)
    steps = [_start_step(backward_pass)]
    events = backward_pass.events
    for event in events[:STEP_LIMIT]:
        index = len(steps)
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
    return steps


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
                 "gradient added to later" if hooks else "it shares memory with a gradient added to after it")
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
    sends = [
        f"{target} ← {format_value(value)}"
        for target, value in zip(event.targets, event.grad_out)
        if target != "(no grad needed)"
    ]
    if sends:
        lines.append("It sends " + ", ".join(sends) + ".")
    computed = _computed(event, context.after_node.get(event.step, []))
    if event.name == "BackwardHookFunctionBackward":
        rule = []
        if computed is True:
            lines.append("torch adds this node around the inputs and outputs of a module that has a full backward "
                         "hook (or pre-hook): gradients pass through it unchanged, and the module's backward hooks "
                         "run here.")
        else:
            lines.append("torch adds this node around the inputs and outputs of a module that has a full backward "
                         "hook (or pre-hook): the node itself passes gradients through unchanged, but the module's "
                         f"backward hooks that run here changed them: it received {received} and sends "
                         f"{', '.join(format_value(v) for v in event.grad_out)} (see the hook step).")
    else:
        rule = chain_rule(event, graph, CHAIN_RULE_LIMIT, computed)
        lines.extend(rule)
    edges = [(edge, format_block(value)) for edge, value in zip(event.edges, event.grad_out) if edge]
    edges += [(edge, format_block(value)) for edge, value in zip(event.in_edges, event.grad_in) if edge]
    done = [event.node] if event.node else []
    done += [edge_dst for edge_dst in _output_tensors(graph, event)]
    question = _node_question(event, computed, rule or lines[-1:], received, title, input_keys(event, graph))
    return Step(index, "node", event.node, title, lines=tuple(lines), edges=tuple(edges), done=tuple(done),
                question=question)


def _node_question(event: NodeRun, computed, rule: list[str], received: str, title: str, inputs: list) -> Question | None:
    """What one input receives from this node (all of it, when the input is used by several of its slots)."""
    import torch

    values = event.grad_out if computed is True else computed
    if values is None:
        return None
    for slot, target in enumerate(event.targets):
        if target == "(no grad needed)" or slot != inputs.index(inputs[slot]):
            continue
        if any(name == target and inputs[other] != inputs[slot] for other, name in enumerate(event.targets)):
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


def _hook_step(index: int, call: HookCall, context: _Pass, totals: dict, position: tuple[int, int] = (1, 1)) -> Step:
    graph, backward_pass = context.graph, context.backward_pass
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
        lines = [f"It ran, but {call.unseen}."]
        if call.kind == "post_accumulate_grad":
            lines.append(f"It may have changed {call.target}.grad in place: the drawing shows it as not known.")
        return Step(index, "hook", call.node, title, lines=tuple(lines), modified=False, grads=grads)
    returned = "None (gradient unchanged)" if call.returned_none and not call.modified else format_value(call.grad_out)
    if call.kind == "post_accumulate_grad":
        lines = [f"It received the leaf itself; its .grad was {format_value(call.grad_in)}.",
                 "Post-accumulate hooks must return None; they may change .grad in place."]
        if call.grad_out is None:
            lines.append(f"What .grad holds after it is not known ({call.unseen or 'not recorded'}).")
        elif call.modified:
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
    note = _hook_note(call, context, place)
    return Step(index, "hook", call.node, title, lines=tuple(lines), modified=call.modified, changes=changes, note=note,
                grads=grads, question=_hook_question(call, context, place, title))


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

    if place > 1:
        return (f"Hooks on one {'tensor' if call.kind == 'tensor' else 'target'} run in registration order, each "
                f"receiving what the one before it passed on: here {format_value(call.grad_in)}.")
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
    if call.modified and call.kind not in ("post_accumulate_grad", "multi_grad"):
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
            said.append(f"this pass adds {format_value(added)} to {name}.grad instead of {format_value(without)}")
        else:
            said.append(f"{name} ends with {format_value(backward_pass.grads[name])} instead of "
                        f"{format_value(backward_pass.grads_without_hooks[name])}")
    return "It is the only hook that changed anything in this pass, so it is why " + ", ".join(said) + "."


def _changed_leaves(backward_pass: BackwardPass) -> list[str]:
    return [
        name for name, value in backward_pass.grads.items()
        if backward_pass.grads_without_hooks.get(name) is not None
        and not values_equal(value, backward_pass.grads_without_hooks[name])
    ]


def _grad_step(index: int, event: GradWritten, context: _Pass) -> Step:
    graph, backward_pass = context.graph, context.backward_pass
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
    elif without is not None and not values_equal(without, event.grad):
        # without hooks no post-accumulate hook runs after the write: what it writes is where .grad ends
        lines.append(f"Without the hooks it would be {format_value(without)}.")
    elif without is not None:
        lines.append("The same as without hooks." if context.first_change < event.step
                     else "No hook changed it: the same as without hooks.")
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


def question_html(step: Step, total: int, inputs: bool = True) -> str:
    """The card of a step whose value the student predicts first: the question under a title that gives
    nothing away (and, for the static page, a box per part and two buttons; the live widget has its own)."""
    question = step.question
    title = question.title or step.title
    boxes = "".join(
        f'<label>{html.escape(part.label)} <input type="text" class="al-answer" data-part="{number}" size="24"></label> '
        for number, part in enumerate(question.parts))
    ask = (f'<div class="al-ask">{boxes}'
           '<button type="button" data-go="check">check</button> '
           '<button type="button" data-go="reveal">show me</button></div>') if inputs else ""
    return (f'<div class="al-card al-question"><div class="al-step">step {step.index} of {total - 1}: predict</div>'
            f'<div class="al-title">{html.escape(title)}</div><div>{html.escape(question.prompt)}</div>'
            f"{ask}</div>")


def feedback_html(message: str, right: bool, rule: str = "") -> str:
    """The verdict, then the rule that gives autograd's value."""
    why = f'<div class="al-why">Why: {html.escape(rule)}</div>' if rule else ""
    return f'<div class="al-feedback {"al-right" if right else "al-wrong"}">{html.escape(message)}</div>{why}'


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

