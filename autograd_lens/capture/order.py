"""Where each hook call sits at a node, and what the calls no Python frame showed received and passed on.

Read beside ``shared/HOOK_FACTS.md`` ("Order of events inside one backward pass").  At one node the engine
runs, in this order: the tensor hooks of each output (the outputs in the order their hook dicts were attached,
each dict in registration order, every call's result feeding the next), then the node's pre-hooks, the
backward function, and the node's post-hooks; at a leaf, after ``.grad`` is written, its post-accumulate
hooks, then ``AccumulateGrad``'s post-hooks.

The profile function sees the calls of Python hooks in their true order.  A hook written in C (``list.append``,
``torch.neg``, ``print``) runs without a frame; where it is registered is known (a named tensor's hook dict, a
node's pre- and post-hook dicts, read before the pass), so its call is put in its place here.  What it
received and passed on is the value between its neighbours in the chain: known when the neighbour on that
side is known (a Python hook's recorded value, what the tensor's users sent, what the node received or sent),
unknown otherwise, and then said to be unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model import TensorSummary, values_equal
from .hooks import function_name, multi_grad_slot, multi_grad_user_fn, runs_python
from .records import HookRecord
from .unhooked import Unknown

if TYPE_CHECKING:
    from .observe import PassObserver
    from .records import KnownHook

UNSEEN = "it is written in C: no Python frame shows its call"
_MISSING: Any = object()  # a value between two hooks that is not known
NOT_RETURNED: Any = object()  # autograd.grad raised: what it would have returned for an input is not known


def unseen_call(function: Any, kind: str, target: str | None, fn: Any, output_nr: int | None, what: str,
                position: int | None = None, key: Any = None) -> "HookRecord":
    """The call of a hook written in C, placed at ``fn``; ``what`` of it is not known (yet)."""
    return HookRecord(code=None, function=function, kind=kind, received=None, grad_in=None, frame=None,
                      target=target, node_fn=fn, output_nr=output_nr, position=position,
                      unseen=f"{UNSEEN}, so {what} is not known", key=key)


def arrange_before(observer: "PassObserver", fn: Any, before: list["HookRecord"],
                   arrived: tuple | None, captured: dict | None = None, then: list | tuple = ()) -> list["HookRecord"]:
    """The calls that ran before ``fn``'s backward (tensor hooks of its outputs, then its pre-hooks), with the
    hooks written in C put in their places and given the values around them where those are known.
    ``arrived``: what the node received after them all (None: not known, the node never ran).  ``captured``:
    the node is an input of ``autograd.grad`` (it does not run, nor do its pre-hooks): output -> what grad
    returned for it.  ``then``: the calls recorded after the node (a module's full backward (pre-)hooks, which
    torch runs in a pre-hook of the node at the module's boundary, after every tensor hook of its outputs)."""
    if id(fn) not in observer.c_nodes and arrived is not None:
        return before  # no hook in C here: the calls seen are all there were, in firing order
    for call in before:  # a multi-grad hook on a tensor with no name: its place, if that tensor's dict is known
        if call.kind == "multi_grad" and call.output_nr is None and call.position is None \
                and not any(known.grad_fn is fn for known in call.candidates):
            place = _multi_place(observer.chains, fn, call.function)
            if place is not None:
                call.output_nr, call.position = place
    # hooks of an input of autograd.grad fire when its gradient is captured (its node does not run), before this
    # node's: they are placed on their own tensor and are no neighbours of this node's hooks
    # (so are the calls of a multi-grad hook watching no tensor this node made: placed here, as it ran next)
    elsewhere = [call for call in before if call.kind == "tensor" and call.node_fn is not None and call.node_fn is not fn
                 or call.kind == "multi_grad" and call.output_nr is None
                 and not any(known.grad_fn is fn for known in call.candidates)]
    if elsewhere:
        mine = [call for call in before if not any(call is other for other in elsewhere)]
        return elsewhere + arrange_before(observer, fn, mine, arrived, captured)
    tensor_calls = [call for call in before if call.kind != "node_pre"]
    pre_calls = [call for call in before if call.kind == "node_pre"]
    chains = observer.chains
    outputs = len(arrived) if arrived is not None else len(getattr(fn, "_input_metadata", ()) or ()) or 1
    if arrived is None:
        arrived = (_MISSING,) * outputs
    groups: list[tuple[int, list]] = []  # (output, calls) in firing order
    for call in tensor_calls:
        output = _output_of(call, fn)
        if not groups or groups[-1][0] != output:
            groups.append((output, []))
        groups[-1][1].append(call)
    merged: dict[int, list] = {}
    for output, calls in groups:
        merged.setdefault(output, []).extend(calls)
    for output in range(outputs):
        known = chains.get((id(fn), output))
        if known and any(_is_c(entry.function) and entry.kind == "tensor" for entry in known):
            merged[output] = _with_c_entries(merged.get(output, []), known, fn, output)
    order = _output_order([output for output, _ in groups], merged, chains, fn)
    # what the users sent, added up, from the copies taken as they sent it; after a hook edited a gradient in
    # place (which can reach a sibling branch) the tensor that arrived may differ from those copies: not known
    leaked = observer.edited_in_place
    start = {output: _MISSING if leaked else observer.unhooked.input_of(fn, output, hooked=True) for output in merged}
    pre_functions = observer.node_hooks.get(id(fn), ((), ()))[0] if captured is None else ()
    pre_functions = _still_there(observer, fn, pre_functions, pre_calls, pre=True)
    pre = _merge_node_hooks(pre_calls, pre_functions, "node_pre", fn)
    # what reached the pre-hooks: the first pre-hook's record, or (no pre-hook) what the node received; a module's
    # hook at this boundary that edits in place changes what the node received after the tensor hooks passed it on
    boundary = next((call for call in then if "module_full" in call.kind and call.node_fn is fn), None)
    if not pre and boundary is not None and not boundary.unseen and isinstance(boundary.grad_in, tuple):
        after_tensor_hooks: Any = boundary.grad_in
    elif not pre:
        after_tensor_hooks = arrived
    elif not pre[0].unseen and isinstance(pre[0].grad_in, tuple):
        after_tensor_hooks = pre[0].grad_in
    else:
        after_tensor_hooks = None
    for output in order:
        end = after_tensor_hooks[output] if after_tensor_hooks is not None and output < len(after_tensor_hooks) \
            else _MISSING
        if captured is not None:
            end = captured.get(output, _MISSING)
        _fill(merged[output], start[output], end, slot=output)
    if pre:
        begin: Any = _MISSING
        if all(output not in merged for output in range(outputs)) and not leaked:
            begin = tuple(observer.unhooked.input_of(fn, output, hooked=True) for output in range(outputs))
        # at a module's output boundary torch's wrapper of the module's full backward pre-hooks runs after the
        # node's own pre-hooks and may change (or edit in place) what reaches the node
        wrapped = getattr(observer, "boundaries", {}).get(id(fn), (None, None))[1] == "outputs"
        _fill(pre, begin, _MISSING if wrapped else arrived, slot=None)
    return [call for output in order for call in merged[output]] + pre


def arrange_after(observer: "PassObserver", fn: Any, after: list["HookRecord"], sent: Any,
                  is_leaf: bool) -> list["HookRecord"]:
    """The calls after ``fn``'s backward: a leaf's post-accumulate hooks, then the node's post-hooks, each kind
    in registration order with the hooks written in C in their places."""
    if id(fn) not in observer.c_nodes:
        return after
    if is_leaf:
        known = observer.after_chains.get(id(fn), ())
        seen = [call for call in after if call.kind == "post_accumulate_grad"]
        if any(_is_c(entry.function) for entry in known):
            arranged = _with_c_entries(seen, known, fn, 0, what="what it did to .grad")
            after = _replace_kind(after, "post_accumulate_grad", arranged, front=True)
    post_functions = observer.node_hooks.get(id(fn), ((), ()))[1]
    if any(_is_c(function) for function in post_functions):
        seen = [call for call in after if call.kind == "node"]
        post_functions = _still_there(observer, fn, post_functions, seen, pre=False)
        arranged = _merge_node_hooks(seen, post_functions, "node", fn)
        if not is_leaf:
            _fill(arranged, _MISSING, sent, slot=None)
        after = _replace_kind(after, "node", arranged, front=False)
    return after


def arrange_input_chain(observer: "PassObserver", fn: Any, output: int, seen: list["HookRecord"],
                        returned: Any) -> list["HookRecord"]:
    """The hooks that ran when ``autograd.grad`` captured the gradient of output ``output`` of ``fn`` (which
    does not run): ``seen`` (the Python calls there, any output) with those in C put in place, the captured
    output's between what its users sent and what autograd.grad returned."""
    for call in seen:  # placed by the node that ran next, not this one: their place on their tensor
        mine = next((known for known in call.candidates if known.grad_fn is fn), None)
        if mine is not None:
            call.position, call.output_nr = mine.position, mine.output_nr
    from .snapshot import snapshot

    end = _MISSING if returned is NOT_RETURNED else snapshot(returned, observer.store_limit) if returned is not None \
        else None
    return arrange_before(observer, fn, seen, None, captured={output: end})


def _is_c(function: Any) -> bool:
    return not runs_python(function)


def _output_of(call: "HookRecord", fn: Any) -> int:
    if call.output_nr is not None:
        return call.output_nr
    for known in call.candidates:  # a multi-grad hook: the watched tensor made by this node
        if known.grad_fn is fn:
            return known.output_nr
    return 0


def _with_c_entries(seen: list["HookRecord"], known: list["KnownHook"], fn: Any, output: int,
                    what: str = "what it received and returned") -> list["HookRecord"]:
    """``seen`` (Python calls on one tensor, in firing order) with a call for each hook written in C of that
    tensor's dict, in registration order."""
    c_entries = [entry for entry in known if _is_c(entry.function) and entry.kind in ("tensor", "post_accumulate_grad")
                 and _ran(entry, seen)]
    pending = [unseen_call(entry.function, entry.kind, entry.target, fn, output, what, entry.position, entry.key)
               for entry in c_entries]
    result: list = []
    for call in seen:
        position = call.position
        if position is not None:
            while pending and pending[0].position is not None and pending[0].position < position:
                result.append(pending.pop(0))
        result.append(call)
    return result + pending


def _multi_place(chains: dict, fn: Any, function: Any) -> tuple[int, int] | None:
    """(output, place in its hook dict) of the inner hook of the multi-grad hook ``function`` among the hook
    dicts known on ``fn``'s outputs (read through a tensor with no name, where it has no entry of its own)."""
    for (node, output), known in list(chains.items()):
        holder = next((entry.holder for entry in known if entry.holder is not None), None)
        if node != id(fn) or holder is None:
            continue
        try:
            hooks = list(holder.values())
        except Exception:  # a dict changed while read
            continue
        place = next((index for index, hook in enumerate(hooks) if multi_grad_user_fn(hook) is function), None)
        if place is not None:
            return output, place
    return None


def _ran(entry: "KnownHook", seen: list["HookRecord"]) -> bool:
    """Whether a hook written in C ran: torch runs the hooks its tensor's dict holds when that tensor's hooks start
    (removing one, or adding one, from a hook on the same tensor changes the next pass only).  What the dict held
    then: as the first Python hook there started (hooks in C before it cannot change the dict), else as now."""
    if entry.holder is None:
        return True
    first = next((call for call in seen if call.kind == entry.kind and call.present is not None), None)
    return entry.key in (first.present if first is not None else entry.holder)


def _still_there(observer: "PassObserver", fn: Any, functions: tuple, seen: list["HookRecord"], pre: bool) -> tuple:
    """``fn``'s pre- or post-hooks attached when the pass started, less those written in C that a hook removed
    before they started (torch runs what the dict holds then; a removal by one of them counts from the next pass):
    what the dict held as the first Python hook there started, else what it holds now."""
    if not any(_is_c(function) for function in functions):
        return functions
    first = next((call for call in seen if not call.unseen and call.present is not None), None)
    held = first.present if first is not None else observer.node_hook_ids(fn, pre)
    if held is None:
        return functions  # the dict cannot be read: as attached when the pass started
    return tuple(function for function in functions if not _is_c(function) or id(function) in held)


def _output_order(fired: list[int], merged: dict[int, list], chains: dict, fn: Any) -> list[int]:
    """Outputs in the order their hooks ran: as seen, with outputs whose only hooks are in C put by when their
    hook dict was attached to the node (its first registration)."""
    order: list[int] = []
    for output in fired:
        if output not in order:
            order.append(output)

    def rank(output: int) -> float:
        entries = chains.get((id(fn), output)) or ()
        return min((entry.rank for entry in entries if entry.rank is not None), default=float("inf"))

    for output in sorted((o for o in merged if o not in order), key=rank):
        place = next((index for index, other in enumerate(order) if rank(other) > rank(output)), len(order))
        order.insert(place, output)
    return order


def _merge_node_hooks(seen: list["HookRecord"], functions: tuple, kind: str, fn: Any) -> list["HookRecord"]:
    """Seen node (pre-)hook calls with a call for each hook written in C, in the node's registration order."""
    if not any(_is_c(function) for function in functions):
        return list(seen)
    remaining = list(seen)
    result = []
    for function in functions:
        if _is_c(function):
            result.append(unseen_call(function, kind, None, fn, None, "what it received and returned"))
        elif remaining:
            result.append(remaining.pop(0))
    return result + remaining


def _replace_kind(calls: list, kind: str, arranged: list, front: bool) -> list:
    """``calls`` with its calls of ``kind`` replaced by ``arranged`` (where the first of them was)."""
    result: list = []
    placed = False
    for call in calls:
        if call.kind == kind:
            if not placed:
                result.extend(arranged)
                placed = True
            continue
        result.append(call)
    if not placed:
        result = (arranged + result) if front else (result + arranged)
    return result


def _fill(calls: list["HookRecord"], start: Any, end: Any, slot: int | None) -> None:
    """Give each call written in C the value before it and after it in the chain ``start -> calls -> end``,
    where the neighbours tell them; values of Python calls are what they recorded."""
    if not any(call.unseen for call in calls):
        return
    values = [_MISSING] * (len(calls) + 1)  # values[i]: before call i; values[-1]: after the last
    values[0] = _usable(start)
    values[-1] = _usable(end)
    for index, call in enumerate(calls):
        if call.unseen:
            continue
        received, passed = _seen_values(call, slot)
        if received is not _MISSING:
            values[index] = received
        values[index + 1] = passed if call.error is None else _MISSING
    for index, call in enumerate(calls):
        if not call.unseen or call.grad_in is not None or call.kind == "multi_grad":
            continue  # a multi-grad hook gets a list of gradients: one tensor's values do not say what it got
        received, passed = values[index], values[index + 1]
        if received is _MISSING or passed is _MISSING:
            if received is _MISSING:
                gap = ("a hook before it on the same gradient is also unseen or its value was not kept" if index
                       else "what reached it (its tensor's gradient before any hook) was not kept")
            else:
                gap = ("a hook after it on the same gradient is also unseen or its value was not kept"
                       if index < len(calls) - 1 else "what came after it (the value its node received) was not kept")
            call.unseen = f"{UNSEEN}, and {gap}, so what it received and returned is not known"
            continue
        call.grad_in, call.grad_out = received, passed
        call.modified = not values_equal(received, passed)
        call.returned_none = not call.modified
        call.unseen = (f"{UNSEEN}, so what it received is the value before it (what the tensor's users sent, "
                       "added up, or what the hook before it passed on) and what it passed on is the value after "
                       "it (what the next hook or the node received)")


def _seen_values(call: "HookRecord", slot: int | None) -> tuple[Any, Any]:
    """What a call seen by the profile function received and passed on, for the chain of output ``slot``."""
    received, passed = call.grad_in, call.grad_out
    if call.kind == "multi_grad":
        if not isinstance(received, tuple):  # mode="any": the one gradient
            return received, passed if passed is not None else _MISSING
        index = call.slot
        if index is None or slot is None:
            return _MISSING, _MISSING
        pick = (lambda values: values[index] if isinstance(values, tuple) and index < len(values) else _MISSING)
        return pick(received), pick(passed)
    if call.kind == "post_accumulate_grad":
        return _MISSING, _MISSING
    return received, passed


def _usable(value: Any) -> Any:
    if value is _MISSING or isinstance(value, (Unknown, TensorSummary)):
        return _MISSING
    if isinstance(value, tuple) and any(item is _MISSING or isinstance(item, (Unknown, TensorSummary)) for item in value):
        return _MISSING
    return value


def until_error(calls: list["HookRecord"]) -> list["HookRecord"]:
    """The calls up to the one that raised: the engine ran none after it."""
    for index, call in enumerate(calls):
        if call.error is not None:
            return calls[: index + 1]
    return calls


def describe_c_hooks(functions: list) -> str:
    return ", ".join(sorted({function_name(function) for function in functions}))


def multi_grad_targets(candidates: list) -> list[str]:
    """The tensors of a ``register_multi_grad_hook`` call (its KnownHooks), in the order given to it, which is the
    order of the gradients its function receives (mode="all": each inner hook's closure holds its ``idx``); in the
    order found where that cannot be read."""
    found = [known.target for known in candidates]
    slots = [multi_grad_slot(known.holder.get(known.key)) if known.holder is not None else None
             for known in candidates]
    order = sorted(range(len(candidates)), key=lambda i: (slots[i] is None, slots[i] or 0, i))
    return sorted({found[i] for i in order}, key=[found[i] for i in order].index)


def multi_grad_source(candidates: list, fn: Any, slot: int | None) -> Any:
    """Of the tensors made by ``fn`` that a multi-grad hook watches (its KnownHooks), the one whose hook dict torch
    called it from: mode="all", the inner hook whose ``idx`` the call's frame holds (``slot``); mode="any" (one wrapper
    on each, run once), the dict torch runs first at that node: the one attached to it first (``rank``)."""
    mine = [known for known in candidates if known.grad_fn is fn]
    if len(mine) > 1 and slot is not None:
        mine = [known for known in mine if known.holder is not None
                and multi_grad_slot(known.holder.get(known.key)) == slot] or mine
    elif len(mine) > 1:
        mine.sort(key=lambda known: (known.rank is None, known.rank or 0))
    return mine[0] if mine else None


def multi_grad_target(candidates: list, received: Any, fn: Any) -> str:
    """What a multi-grad call is shown on: its named tensors (``multi_grad_targets``), and those it watches with no
    name where the call says there are some: mode="all" gets one gradient per tensor it watches (fewer named ones:
    the rest have none); mode="any" gets one gradient, from a hook torch runs for the node that made its tensor
    (``fn``, the node the engine names: none of the named ones made there, its tensor has no name; the engine names
    none for the input of ``autograd.grad`` whose hook it runs)."""
    names = multi_grad_targets(candidates)
    if isinstance(received, tuple):
        unnamed = len(received) - len(candidates)
    else:
        unnamed = int(fn is not None and not any(known.grad_fn is fn for known in candidates))
    if unnamed <= 0:
        return ", ".join(names) if names else "several tensors"
    more = "a tensor with no name" if unnamed == 1 else f"{unnamed} tensors with no name"
    return f"{', '.join(names)} and {more}" if names else more
