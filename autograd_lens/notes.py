"""Notes on classic autograd mistakes, each with the course notebook that covers it.

The notes that can be read off a pass's record are computed here, from the model alone; the few that
need live objects (a warning, a tensor that only looks like a leaf, a module hook that never fired)
are made by the ``Lens`` with :func:`note` and the same wording.
"""

from __future__ import annotations

import re

from .model import BackwardPass, GradWritten, HookCall, Note, PassError

FUNDAMENTALS = "notebooks/00_autograd_fundamentals.ipynb"
GRAPH = "notebooks/01_reading_the_graph.ipynb"
INVOCATIONS = "notebooks/03_multiple_invocations.ipynb"
MODIFIED = "notebooks/04_modified_gradients.ipynb"
MODULES = "notebooks/05_module_hooks.ipynb"
PERSISTING = "notebooks/07_persisting_hooks.ipynb"
JACOBIANS = "notebooks/10_chain_rule_and_jacobians.ipynb"

MESSAGES = {
    "nonleaf_grad": (
        "You read .grad of a tensor that is not a leaf: it is None (torch warned). Only leaves — tensors you created "
        "with requires_grad=True — get .grad; call t.retain_grad() before backward() to keep a non-leaf's gradient, "
        "or register a hook on it.", FUNDAMENTALS),
    "not_a_leaf": (
        "{name} is not a leaf: it was computed ({op}) from a tensor that requires grad but has no name here, e.g. "
        "torch.randn(2, 2, requires_grad=True) * 10. Its .grad stays None, and hooks on it see the gradient of the "
        "result, not of the tensor you created. Make the leaf last: (torch.randn(2, 2) * 10).requires_grad_().",
        GRAPH),
    "legacy_hook": (
        "{target} has a legacy register_backward_hook: its grad_input belongs to the module's last operation only, "
        "which is wrong for any module made of more than one op. Use register_full_backward_hook.", MODULES),
    "freed_graph": (
        "backward() ran through a graph whose saved tensors the previous backward() had freed. Pass "
        "retain_graph=True to the first backward() if you need a second one — or recompute the forward.", FUNDAMENTALS),
    "bad_hook_return": (
        "A hook returned {what}: a hook must return None (nothing changed) or a tensor of the same shape and dtype "
        "as the gradient it received.", MODIFIED),
    "inplace_hook_edit": (
        "The hook {hook} on {target} edited its gradient in place{how}. That works, but the "
        "same tensor object can also be what a sibling branch receives (AddBackward sends one tensor to both inputs "
        "when they have the sum's shape and dtype): return g * 2 rather than calling g.mul_(2).", MODIFIED),
    "full_hook_then_inplace": (
        "A module with a full backward hook (or pre-hook) was followed by an in-place op on its output (e.g. "
        "ReLU(inplace=True)): torch refuses that. Use an out-of-place op, or a forward hook plus a tensor hook on "
        "the output instead of the module backward hook.", MODULES),
    "used_several_times": (
        "{target} is used {uses}, yet its hook fired once: autograd adds up the gradients from every use first, "
        "then calls the hook with the sum.", INVOCATIONS),
    "forgot_zero_grad": (
        "{names} already held the previous pass's gradient when this pass added to it: backward() accumulates into "
        ".grad. If each step should start fresh, call optimizer.zero_grad() (or set .grad = None) before backward(); "
        "if you meant to accumulate, all is well.", FUNDAMENTALS),
    "old_model_hook": (
        "The backward hook on {target} never fired: no backward pass here went through that module. Was the output "
        "computed by another copy of the model (e.g. before reloading)? Recompute it with this one.", PERSISTING),
    "untraced_pass": (
        "{what} ran a backward pass here {times}, of a kind the lens leaves alone: what it computed is torch's own, "
        "but its steps and any hook calls in it are not shown, and a hook's \"call i of n\" counts the recorded "
        "passes only.", JACOBIANS),
    "unused_module_hook": (
        "The backward hook on {target} never fired: no backward pass here went through that module, though passes "
        "went through {whole}, which contains it: its forward was not called for the output the pass started from, "
        "or what it returned did not reach that output through autograd (an expert the router did not choose, a "
        "branch not taken, a call under torch.no_grad() or detached, a submodule replaced after that forward). torch "
        "calls a module's backward hooks only for the forward calls whose outputs the pass differentiates.", MODULES),
    "late_module_hook": (
        "The backward hook on {target} never fired, though a backward pass here wrote the .grad of its parameters: "
        "torch attaches a module's backward hooks when the module's forward runs, so a hook registered after the "
        "forward that made the output does not fire for it (nor when the parameters were used outside the module's "
        "call). Register the hook before the forward.", MODULES),
    "unsure_module_hook": (
        "The backward hook on {target} never fired, and the lens cannot tell why ({why}): either the output came from "
        "another copy of the model (e.g. made before reloading), so that no pass here went through this one, "
        "or the hook was registered after the forward that made the output: torch attaches a module's backward hooks "
        "when the module's forward runs. Register the hook before the forward, on the model that computes the output.",
        MODULES),
}


def note(code: str, pass_index: int | None = None, step: int | None = None, **words: str) -> Note:
    message, notebook = MESSAGES[code]
    return Note(code=code, message=message.format(**words), notebook=notebook, pass_index=pass_index, step=step)


_BAD_RETURN = (
    (re.compile(r"has changed the size of value"), "a tensor of another shape"),
    (re.compile(r"has changed the type of value"), "a tensor of another dtype or device"),
    (re.compile(r"expected Variable, but hook returned '(\w+)'"), "a {0} instead of a tensor"),
)


def pass_notes(backward_pass: BackwardPass, refilled: tuple[str, ...] = ()) -> tuple[Note, ...]:
    """The notes a pass's record shows.  ``refilled``: leaves whose ``.grad`` still held the previous pass's
    gradient when this one added to it (known to the Lens)."""
    found: list[Note] = []
    index = backward_pass.index
    graph = backward_pass.graph
    said: set[tuple[str, str]] = set()
    for event in backward_pass.events:
        if isinstance(event, HookCall):
            if event.kind in ("module_legacy", "global_module_legacy") and ("legacy", event.target) not in said:
                said.add(("legacy", event.target))
                found.append(note("legacy_hook", index, event.step, target=event.target))
            if event.edited_in_place and event.kind in ("tensor", "node_pre"):
                how = " instead of returning a new one" if event.returned_none else \
                    " (the tensor it received changed, whatever it returned)"  # g.mul_(2) returns that tensor itself
                found.append(note("inplace_hook_edit", index, event.step, hook=event.hook, target=event.target, how=how))
            if event.kind == "tensor" and event.node and ("uses", event.target) not in said:
                edges = [edge for edge in graph.edges_from(event.node) if edge.kind == "data"]
                if len(edges) > 1:
                    said.add(("uses", event.target))
                    found.append(note("used_several_times", index, event.step, target=event.target,
                                      uses=_uses_text(len(edges), len({edge.dst for edge in edges}))))
        elif isinstance(event, PassError):
            if "backward through the graph a second time" in event.message:
                found.append(note("freed_graph", index, event.step))
            for pattern, what in _BAD_RETURN:
                match = pattern.search(event.message)
                if match:
                    found.append(note("bad_hook_return", index, event.step, what=what.format(*match.groups())))
    if refilled:
        first = next((e.step for e in backward_pass.events if isinstance(e, GradWritten) and e.name in refilled), None)
        found.append(note("forgot_zero_grad", index, first, names=_some(tuple(f"{name}.grad" for name in refilled))))
    return tuple(found)


def _some(names: tuple[str, ...], shown: int = 4) -> str:
    """``a, b, c``; past ``shown`` names the first three and how many more (a real model has hundreds of leaves)."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown - 1])} and {len(names) - shown + 1} more"


def _uses_text(uses: int, operations: int) -> str:
    """``by 3 operations``; ``2 times by one operation`` (``w * w``); ``3 times by 2 operations``."""
    if uses == operations:
        return f"by {operations} operations"
    return f"{uses} times by {'one operation' if operations == 1 else f'{operations} operations'}"
