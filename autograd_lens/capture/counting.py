""""call i of n": which hook calls are calls of the same registered hook, over the passes of one Lens."""

from __future__ import annotations

import weakref
from typing import Any

import torch.nn.modules.module as module_hooks

from .hooks import code_of, multi_grad_user_fn
from .records import HookRecord, KnownHook


def _function_key(call: HookRecord) -> tuple:
    """Which function ran: its code when a frame showed it (the object may not be known: a hook on a tensor
    with no name), else the object (a hook written in C)."""
    if call.code is not None:
        return ("code", call.code)
    return ("object", id(call.function))


class HookCounter:
    """Counts the calls of each *registered* hook over the passes of one Lens.

    A registration is a function attached to one thing: a tensor (a leaf by its tensor, any other by the node
    that made it and the output), a node, a module, or one ``register_multi_grad_hook`` call; a global module
    hook is one registration.  Two closures made by one factory are two hooks, as is one function registered
    on two tensors; hooks with one code on one tensor are told apart by their order there.  Only ids are kept,
    each guarded by a weak reference where the object allows one (the function, when known, and the tensor or
    module), so nothing lives longer, and a new hook or tensor at a freed address is counted afresh."""

    def __init__(self) -> None:
        self.counts: dict[tuple, list] = {}  # key -> [calls, registration number, function guard, holder guard]
        # (where) -> a weak reference to the hook dict of a tensor that had a name in an earlier pass: its node keeps
        # it (and its hooks) alive, so in a later pass where the tensor has no name (``del t``, or the name now
        # holds another tensor) its registrations are still told apart by their handles' ids
        self.dicts: dict[tuple, Any] = {}
        self._unnamed: dict[tuple, int] = {}  # (node id, output, code) -> calls of this pass from a tensor with no name
        self._matched: dict[tuple, int] = {}  # the same, counted so far
        # (where, code) -> the first pass that counted calls there from a tensor with no name: the keys it counted
        # them under, in call order, how many, the first handle id of that pass (registrations older than it were
        # there), and whether every later such pass had as many (else nothing is matched there)
        self._first_unnamed: dict[tuple, dict] = {}
        self._seen_unnamed: set = set()  # (where, code) counted in this pass
        self._handles_before = 0
        # registration -> the registrations counted earlier from the tensor with no name that it may be one of: its
        # calls' numbers are not known (HookCall.invocation None), and those registrations' totals are lower bounds
        self.ambiguous: dict[int, tuple[int, ...]] = {}
        self._module_handles: dict[tuple, tuple] = {}  # (kind, where, function id) -> (function guard, handle id)
        self._registrations = 0
        self._passes = 0  # passes begun

    def begin(self, chains: dict, records: list, handles_before: int = 0) -> None:
        """Before a pass's calls are counted: remember the hook dicts of the pass's named non-leaf tensors
        (``chains``, the observer's known hooks by place), and count the calls whose tensor has no name.
        ``handles_before``: torch's next handle id when the pass started."""
        self._handles_before = handles_before
        self._seen_unnamed = set()
        self._passes += 1
        for known_hooks in chains.values():
            for known in known_hooks:
                fn = known.grad_fn
                if known.kind == "tensor" and known.holder is not None and not hasattr(fn, "variable"):
                    try:
                        self.dicts[("node", id(fn), _sequence_nr(fn), known.output_nr)] = weakref.ref(known.holder)
                    except TypeError:  # a hook dict that allows no weak reference: not kept
                        pass
        for where in [where for where, ref in self.dicts.items() if ref() is None]:
            del self.dicts[where]
        self._unnamed, self._matched = {}, {}
        for record in records:
            if isinstance(record, HookRecord) and record.kind == "tensor" and record.key is None \
                    and record.node_fn is not None and record.code is not None:
                place = (id(record.node_fn), record.output_nr, record.code)
                self._unnamed[place] = self._unnamed.get(place, 0) + 1

    def count(self, call: HookRecord, ordinal: int) -> tuple[int, int]:
        """This call's number among the calls of its registration, and that registration's number."""
        key, holder = self._key(call, ordinal)
        function = call.function
        unnamed = None
        ambiguous: tuple[int, ...] = ()
        if call.kind == "tensor" and key[2][0] == "node" and call.code is not None:
            if call.key is None:
                found = self._registered(call, key[2])
                if found is not None:  # as in the earlier pass that read its handle: (kind, code, where, function, key)
                    handle_key, function = found
                    key = key[:3] + (id(function), ("key", handle_key))
                else:
                    unnamed = (key[2], call.code)
                    ambiguous = self._changed_number(call, unnamed)
                    if ambiguous:  # which of the hooks counted before this is, is not known: a registration apart
                        key = key[:4] + (("not known", key[4]),)
            elif key not in self.counts:
                ambiguous = self._adopt(call, key)
        entry = self.counts.get(key)
        if entry is not None and (not _same(entry[3], holder) or function is not None and not _same(entry[2], function)):
            entry = None  # the thing it was attached to, or the function, is another one now
        if entry is None:
            self._registrations += 1
            entry = self.counts[key] = [0, self._registrations, None, _guard(holder)]
            if ambiguous:
                self.ambiguous[entry[1]] = ambiguous
        if unnamed is not None:
            self._note_unnamed(unnamed, key, call, entry[1])
        if function is not None and entry[2] is None:
            entry[2] = _guard(function)
        entry[0] += 1
        return (None if entry[1] in self.ambiguous else entry[0]), entry[1]

    def _registered(self, call: HookRecord, where: tuple) -> tuple[Any, Any] | None:
        """A call from a tensor with no name in this pass, at a place whose hook dict an earlier pass read: its
        registration (handle id, function), when the dict tells it for sure: the n-th call of this code there is
        the n-th hook of this code in the dict, when as many of them are there as ran (none removed meanwhile)."""
        ref = self.dicts.get(where)
        hooks = ref() if ref is not None else None
        if hooks is None:
            return None
        try:
            same = [(handle_key, function) for handle_key, function in list(hooks.items())
                    if code_of(function) is call.code]
        except Exception:  # a dict changed while read: not known for sure
            return None
        place = (id(call.node_fn), call.output_nr, call.code)
        turn = self._matched.get(place, 0)
        self._matched[place] = turn + 1
        if len(same) != self._unnamed.get(place, 0) or turn >= len(same):
            return None
        return same[turn]

    def _changed_number(self, call: HookRecord, place: tuple) -> tuple[int, ...]:
        """A call from a tensor with no name (and no hook dict read), at a place where an earlier pass counted
        another number of calls of this code: hooks of this code were removed or added there since (one function
        registered twice, one handle removed), and the n-th call now need not be the n-th then. The registrations
        counted there before (its calls' numbers are not known), or () when the number is the same."""
        first = self._first_unnamed.get(place)
        if first is None or first["pass"] == self._passes:
            return ()
        if self._unnamed.get((id(call.node_fn), call.output_nr, call.code), 0) == first["calls"]:
            return ()
        return tuple(sorted(first["registrations"]))

    def _note_unnamed(self, place: tuple, key: tuple, call: HookRecord, registration: int) -> None:
        """A call counted from a tensor with no name (and no hook dict read before): where a later pass reads that
        tensor's dict (it has a name then), :meth:`_adopt` finds which registration this was."""
        calls_here = self._unnamed.get((id(call.node_fn), call.output_nr, call.code), 0)
        first = self._first_unnamed.get(place)
        if first is None:
            first = self._first_unnamed[place] = {"keys": [], "calls": calls_here, "handles": self._handles_before,
                                                  "same": True, "pass": self._passes, "registrations": set()}
        first["registrations"].add(registration)
        first["last_handles"] = self._handles_before  # hooks older than this were there in a pass counted so
        if first["pass"] == self._passes:
            first["keys"].append(key)
        elif place not in self._seen_unnamed:
            self._seen_unnamed.add(place)
            if first["calls"] != calls_here:
                first["same"] = False  # another number of hooks of this code here than in that pass: not told apart

    def _adopt(self, call: HookRecord, key: tuple) -> tuple[int, ...]:
        """A call read by its handle at a place where an earlier pass counted calls of this code from the tensor with
        no name: when that registration is older than that pass and every hook of this code there then is still
        in the dict, the n-th of them (in the dict's order, which is torch's call order) is the n-th counted then.
        When it is older than such a pass and cannot be matched (one of them was removed since), it is one of the
        registrations counted then, not known which: those are returned (its calls' numbers are not known)."""
        first = self._first_unnamed.get((key[2], call.code))
        if first is None:
            return ()
        ref = self.dicts.get(key[2])
        hooks = ref() if ref is not None else None
        ran_unnamed = isinstance(call.key, int) and call.key < first.get("last_handles", first["handles"])
        unknown = tuple(sorted(first["registrations"])) if ran_unnamed else ()
        if not first["same"] or hooks is None or len(first["keys"]) != first["calls"]:
            return unknown
        try:
            older = [handle_key for handle_key, function in list(hooks.items()) if code_of(function) is call.code
                     and isinstance(handle_key, int) and handle_key < first["handles"]]
        except Exception:  # a dict changed while read: not known for sure
            return unknown
        if len(older) == len(first["keys"]) and call.key in older:
            earlier = self.counts.get(first["keys"][older.index(call.key)])
            if earlier is not None:
                self.counts[key] = earlier
                return ()
        return unknown

    def _module_handle(self, call: HookRecord, where: tuple, module: Any = None) -> Any:
        """A module hook's handle id (see _handle_key); one removed after the forward call that set it up still runs
        for that call's graph: the id it had when last seen registered (torch calls what the forward collected)."""
        place = (call.kind, where, id(call.function))
        handle = _handle_key(call, module)
        if handle is not None:
            self._module_handles[place] = (_guard(call.function), handle)
            return handle
        seen = self._module_handles.get(place)
        if seen is not None and _same(seen[0], call.function):
            return seen[1]
        return None

    def _key(self, call: HookRecord, ordinal: int) -> tuple[tuple, Any]:
        fn = call.node_fn
        holder = None
        if call.kind.startswith("global_"):
            where: tuple = ()
            handle = self._module_handle(call, where)
            if handle is not None:  # its handle's id names the registration: registered again, it is a new one
                ordinal = ("key", handle)
        elif call.kind == "multi_grad":
            state = call.state[0] if isinstance(call.state, tuple) else call.state
            where = ("multi", call.target if state is None else state)
            if isinstance(call.state, tuple):  # guarded: a new registration at a freed one's address is new (once
                holder = call.state[1]()  # removed and freed, None: the id alone tells it)
        elif call.module is not None:
            where, holder = ("module", id(call.module)), call.module
            handle = self._module_handle(call, where, call.module) if call.kind.startswith("module_") else None
            if handle is not None:  # as for a global hook
                ordinal = ("key", handle)
        elif fn is not None and hasattr(fn, "variable"):  # a leaf: its hooks live on the tensor, whatever node
            where, holder = ("leaf", id(fn.variable)), fn.variable
        elif fn is not None:  # a node lives as long as its graph: its number tells a new one at the same address
            where = ("node", id(fn), _sequence_nr(fn), call.output_nr if call.kind == "tensor" else None)
        else:
            where = ("target", call.target)
        if call.kind == "multi_grad" and call.state is not None:
            ordinal = 0  # its wrapper's state names the registration, wherever it fires
        elif call.key is not None and call.kind != "multi_grad":
            ordinal = ("key", call.key)  # its handle's id names the registration: hooks removed before it do not count
        # guarded in count(); a handle's id names the registration alone (two hooks of one code on a tensor: which
        # function ran is not known when both run, known when one did: the same registration either way)
        keyed = isinstance(ordinal, tuple) and ordinal[0] == "key"
        function = id(call.function) if call.function is not None and not keyed else None
        return (call.kind, _function_key(call), where, function, ordinal), holder


def earlier_hooks(earlier: dict, chains: dict, nodes: list) -> list[KnownHook]:
    """The hooks of tensors that had a name in an earlier pass of this Lens and have none now (``del t``, or the
    name given to another tensor) while their graph lives on: read through the weak references to their hook
    dicts that :class:`HookCounter` keeps (``earlier``; the graph keeps each dict alive), so that they are known as
    when the tensor had its name (hooks written in C included), on the tensor's drawn label (target None).
    ``chains``: the hooks already known by place (named tensors); ``nodes``: this pass's backward functions."""
    found: list[KnownHook] = []
    by_id = None
    for (_, fn_id, sequence_nr, output_nr), ref in list(earlier.items()):
        hooks = ref()
        if not hooks or (fn_id, output_nr) in chains:
            continue
        if by_id is None:
            by_id = {id(fn): fn for fn in nodes}
            # (a node's Python object may be a new one now) torch numbers nodes per thread: a graph built on two
            # threads may have two nodes of one number, and then the number says neither (None)
            by_number: dict = {}
            for fn in nodes:
                number = _sequence_nr(fn)
                by_number[number] = None if number in by_number else fn
        grad_fn = by_id.get(fn_id)
        if grad_fn is None or _sequence_nr(grad_fn) != sequence_nr:
            grad_fn = by_number.get(sequence_nr) if sequence_nr is not None else None
            if grad_fn is None or (id(grad_fn), output_nr) in chains:
                continue
        entries = list(hooks.items())
        rank = min(entries)[0]
        found += [KnownHook(hook, "tensor", None, grad_fn, output_nr, position, len(entries), rank, hooks, key)
                  for position, (key, hook) in enumerate(entries)
                  if multi_grad_user_fn(hook) is None]  # a multi-grad hook's card names its tensors: found as it runs
    return found


def _handle_key(call: HookRecord, module: Any = None) -> int | None:
    """The handle id of a module hook (``module``'s, or a global one), when its function is registered once in
    the dict torch keeps it in."""
    pre = call.kind.endswith("_pre")
    if module is None:
        hooks = module_hooks._global_backward_pre_hooks if pre else module_hooks._global_backward_hooks
    else:
        hooks = getattr(module, "_backward_pre_hooks" if pre else "_backward_hooks", None) or {}
    try:
        keys = [key for key, function in list(hooks.items()) if function is call.function]
    except Exception:
        return None
    return keys[0] if len(keys) == 1 else None


def _sequence_nr(fn: Any) -> int | None:
    try:
        return fn._sequence_nr()
    except Exception:
        return None


def _guard(obj: Any) -> Any:
    """A weak reference to ``obj`` (None for None); ``obj`` itself is never kept: an object that allows no weak
    reference is guarded by nothing."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _same(guard: Any, obj: Any) -> bool:
    return guard is None or obj is None or guard() is obj
