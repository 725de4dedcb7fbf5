"""What the steps of one pass are made of (:class:`Step`) and what they look up: the pass's graph, the hooks that
ran right after each node, the gradients that reached each tensor, and how many times each hook fired."""

from __future__ import annotations


from dataclasses import dataclass, field

from ..format import format_value
from ..model import BackwardPass, GradWritten, Graph, HookCall, NodeRun
from .questions import Question




# what a module hook boundary card says, by side ("" when the side is not known)
BOUNDARY_TEXT = {
    "": "torch adds this node around the inputs and outputs of a module that has a full backward hook (or pre-hook): "
        "gradients pass through it unchanged, and the module's backward hooks run here.",
    "output": "torch adds this node where a module with backward hooks returned its outputs: their gradients arrive "
              "here and pass through unchanged. The module's backward pre-hooks, if any, run here, and what arrives "
              "is the grad_output its full backward hooks will receive.",
    "input": "torch adds this node where the inputs entered a module with backward hooks: their gradients pass "
             "through it unchanged, and the module's full backward hooks, if any, run here (grad_input is what this "
             "node passes on).",
}
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
            totals[key] = max(totals.get(key, 0), call.invocation or 0)
            for other in call.may_be:  # some of this hook's calls may be that one's: its total is a lower bound
                totals[("at least", "registration", other)] = 1  # as _registration() names a registered hook
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
            later_position = position + 1  # the hooks right after it, read in place (a slice would copy the rest)
            while later_position < len(events):
                later = events[later_position]
                if not (isinstance(later, HookCall) and later.node == event.node and event.node
                        and later.kind in _AFTER_NODE):
                    break
                following.append(later)
                later_position += 1
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


def inventory_lines(backward_pass: BackwardPass) -> list[str]:
    """The start card's list of the hooks attached before the pass.  A module without parameters whose hooks
    could not be placed before the pass ("module_unknown") is placed now: torch put its hook boundaries in this
    graph, or it did not (then it is left out, and the card says how many were; with part of the graph not drawn
    it stays "cannot be told")."""
    entries = list(backward_pass.inventory)
    graph = backward_pass.graph
    complete = not any(node.kind == "hidden" for node in graph.nodes)
    boundaries = {node.label for node in graph.nodes if node.op == "BackwardHookFunctionBackward"}
    kept, elsewhere, idle = [], 0, []
    for entry in entries:
        crossed = any(label.startswith(entry.target + " ") for label in boundaries)
        if entry.kind == "module_unknown" and complete:
            if crossed:
                kept.append(f"{entry.target}: module backward hooks (this graph goes through its hook boundaries)")
            else:
                elsewhere += 1
            continue
        if entry.kind in ("module_full", "module_full_pre") and complete and not _output_side(entry.target, boundaries):
            idle += [entry.target] if entry.target not in idle else []  # its hooks fire only at its boundaries
            continue
        kept.append(entry.text())
    lines = []
    if kept:
        lines.append(f"Hooks attached ({len(kept)}); on one target they fire in the order listed, across targets "
                     "in the engine's order:")
        lines.extend("• " + text for text in kept)
    unlisted = _unlisted_boundaries(entries, boundaries)
    if not kept:
        # with boundaries of modules it cannot list (no name here, or hooks removed since the forward) it cannot say
        # that no module has hooks now: an unnamed module's hooks are not listed, yet attached, and fire
        lines.append("No hook on a named tensor or on a named module is attached to this graph now." if unlisted
                     else "No hook on a named tensor or on a module is attached to this graph.")
    if unlisted:  # torch copied the module's hooks at the forward: they run at its boundaries, even if removed since
        lines.append(f"({', '.join(unlisted)}: this graph goes through {'its' if len(unlisted) == 1 else 'their'} "
                     "module hook boundaries, made at the forward: the module backward hooks attached then run there, "
                     "even if removed since.)")
    if elsewhere:
        lines.append(f"({elsewhere} module{'s' if elsewhere > 1 else ''} with backward hooks and no parameters "
                     f"{'are' if elsewhere > 1 else 'is'} not on this graph: torch made no hook boundary for "
                     f"{'them' if elsewhere > 1 else 'it'} here.)")
    if idle:
        lines.append(f"({', '.join(idle)}: module backward hooks that do not fire in this pass: torch made no hook "
                     "boundary for it in this graph (it puts them around a forward call made after the hooks were "
                     "registered, on the tensors or tuple of tensors it returns).)")
    return lines


def _unlisted_boundaries(entries: list, boundaries: set) -> list[str]:
    """The modules whose hook boundaries the graph goes through though no module hook of theirs is listed (their
    hooks were removed after the forward, or the boundary's module has no name here)."""
    if any(entry.kind.startswith("global_module") for entry in entries):
        return []  # a global hook's boundaries are every module's: it is listed for all of them
    listed = {entry.target for entry in entries if entry.kind.startswith("module")}
    found = []
    for label in sorted(boundaries):
        module = label.rsplit(" hook boundary", 1)[0].removesuffix(" output").removesuffix(" input")
        module = "a module with no name here" if module == "module" else module
        if module not in listed and module not in found:
            found.append(module)
    return found


def _output_side(target: str, boundaries: set) -> bool:
    """Whether the graph may go through the output-side hook boundary of module ``target``: torch runs its full
    backward (pre-)hooks there (or at the input side once the output side set them up; a forward returning a dict
    gets an input side only, and no hook fires).  A boundary whose module or side is not named may be it."""
    if "module hook boundary" in boundaries:
        return True
    return any(label.startswith(target + " ") and not label.endswith(" input hook boundary") for label in boundaries)


def kept_lines(event: GradWritten, held=None) -> tuple[str, ...]:
    """The card of a non-leaf's ``.grad`` write: kept by ``retain_grad()``, or by ``backward(inputs=[…])``.
    ``held``: what ``.grad`` held when the pass began (a non-leaf's ``.grad`` accumulates over passes, as a leaf's)."""
    name, received, grad = event.name, format_value(event.received), format_value(event.grad)
    into = f"to {name}.grad" if held is None else f"to {name}.grad, which held {format_value(held)}"
    if event.by == "inputs":
        verb = "writes" if held is None else "adds"
        return (f"backward(inputs=[…]) {verb} the gradient {received} that reached {name}, after its tensor hooks, "
                f"{into}: {grad} once this pass ends.", f"{name} is not a leaf: for inputs= torch called "
                f"{name}.retain_grad(), so later passes add to {name}.grad too.")
    if held is not None:
        return (f"retain_grad() adds the gradient {received} that reached {name}, after its tensor hooks, {into} "
                f"(backward() accumulates into a retained .grad as into a leaf's): {name}.grad is {grad} once this "
                "pass ends.", f"{name} is not a leaf: without retain_grad() its .grad would stay None.")
    return (f"retain_grad() keeps the gradient {received} that reached {name}, after its tensor hooks: {name}.grad is "
            f"{grad} once this pass ends.", f"{name} is not a leaf: without retain_grad() its .grad would stay None.")


def same_line(event: GradWritten, backward_pass: BackwardPass, changed_before: bool) -> str:
    """A leaf's .grad written as it would be without hooks: said so, and that it may change yet when a
    post-accumulate hook of this leaf's runs next (its card says what it does)."""
    after = any(call.kind == "post_accumulate_grad" and call.node == event.node and (call.step or 0) > event.step
                for call in backward_pass.hook_calls)
    if changed_before:
        return "The same as without hooks" + ("; its post-accumulate hook runs next." if after else ".")
    if after:
        return "No hook changed it yet: the same as without hooks; its post-accumulate hook runs next."
    return "No hook changed it: the same as without hooks."


def made_by(backward_pass: BackwardPass, node: str | None) -> str:
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
