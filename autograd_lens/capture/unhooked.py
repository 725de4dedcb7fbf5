"""What each gradient would have been with no hook: computed only where a hook changed something.

Read beside ``shared/HOOK_FACTS.md`` ("Observing without changing anything" and "Traps for an
observer").  Nothing runs until some hook changes a gradient.  From then on, when a node has run:

* its *unhooked input* is what would have reached it with no hook anywhere: the root's seed
  (copied before any hook could edit it) plus, in arrival order, what each user of it sent —
  the recorded copy, or the unhooked value of a user that diverged;
* it *diverges* when a hook on it changed something, when one of its users diverged, or (after a
  hook edited a gradient in place, which can leak into a sibling branch) when its unhooked input
  differs from what it received;
* a diverged node is run again on its unhooked input (``replay.run_again``) — ``fn(*grads)`` runs the
  backward function and no hook — then each result is reduced to the shape its receiver expects, as
  the engine does after every node (broadcast dimensions summed, dtype converted).

Only torch's C++ backward functions are run again, and only when none of their saved tensors was
packed by a saved-tensor hook (unpacking would run that hook, or recompute a checkpointed
forward).  Anything else — a custom ``autograd.Function``, reentrant checkpointing, a value too
large to keep, torch's C++ CopySlices when a Function's backward ran inside it (the Function was applied
in place on a view: ``calls.py`` sees its backward start there) — makes the value *unknown*, with the
reason: never a guess.

Every node below the first changing hook comes here once per pass, so the usual case is kept short: no
diverged node yet, nothing to look at; an output with one user and no seed, that user's value as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .snapshot import hidden_from_user
from ..model import TensorSummary, values_equal
from .replay import Unknown, run_again

if TYPE_CHECKING:
    from .observe import PassObserver

_hidden_from_modes = hidden_from_user  # the lens's tensor ops never reach a user's dispatch mode or profile
_set_grad_enabled = torch._C._set_grad_enabled  # what torch.no_grad() calls
# backward functions whose formula depends on grad mode (torch's derivatives.yaml: "GradMode::is_enabled() ? ..."),
# whose numbers differ in the last bits between a create_graph=True pass and a re-run without a graph (found so far)
_GRAD_MODE_FORMULAS = frozenset({"WeightNormInterfaceBackward0", "NativeDropoutBackward0"})


EARLIER = "not known since an earlier pass: "
_NOT_RUN: Any = object()  # (Unhooked._sent_by) a user that has not run: nothing arrived from it


def _earlier(value: Any) -> Any:
    """A reason carried from an earlier pass says so (it may read "the pass stopped ..." of that pass)."""
    if isinstance(value, Unknown) and not value.reason.startswith(EARLIER):
        return Unknown(EARLIER + value.reason)
    return value


def is_known(value: Any) -> bool:
    return not isinstance(value, (Unknown, TensorSummary))


def _as_the_engine_takes(seed: Any, root: Any) -> Any:
    """A ``gradient=`` tensor as the root's node receives it: the engine casts it to the root's dtype
    (``out.backward(torch.tensor(2.0))`` on a float64 ``out`` starts from a float64 2.0)."""
    if isinstance(seed, torch.Tensor) and isinstance(root, torch.Tensor) and seed.dtype != root.dtype \
            and seed.dtype.is_floating_point and root.dtype.is_floating_point:
        with torch.no_grad(), _hidden_from_modes():
            return seed.to(root.dtype)
    return seed


def add(first: Any, second: Any, why_large: str = "") -> Any:
    """``first + second`` as the engine adds gradients (None is zero); Unknown wins."""
    for value in (first, second):
        if isinstance(value, Unknown):
            return value
        if isinstance(value, TensorSummary):
            return Unknown(why_large or _too_large(value))
    if first is None:
        return second
    if second is None:
        return first
    return first + second


def _too_large(summary: TensorSummary) -> str:
    if summary.kind != "dense":  # a subclass, sparse, nested, ...: its numbers are not read at any size
        return f"a gradient that is a {summary.kind} tensor was kept as its shape only (its numbers are not read)"
    return (f"a gradient of {summary.numel} elements was kept as a summary only (pass a larger store_limit, "
            "or a larger memory_budget, to compute it)")


def _same(unhooked: Any, received: Any) -> bool:
    if isinstance(unhooked, (Unknown, TensorSummary)):
        return False
    if not isinstance(received, torch.Tensor) or not isinstance(unhooked, torch.Tensor):
        return unhooked is None and received is None
    return values_equal(unhooked, received)


class Unhooked:
    """The unhooked values of one pass, kept as the pass goes (see the module docstring)."""

    def __init__(self, observer: "PassObserver") -> None:
        self.observer = observer
        self.active = False
        self.edited_in_place = False
        self.other_edits = False  # an edit in place no frame showed may have happened (code in C, ...)
        self.out: dict[int, tuple | Unknown] = {}  # id(fn) -> what a diverged node would have sent
        self.leaf: dict[int, Any] = {}  # id(AccumulateGrad) -> what it would have added (diverged leaves)
        self.forced: dict[int, Unknown] = {}  # id(fn) -> why what it would have sent is not known
        self.nexts: dict[int, tuple] | None = None  # id(fn) -> next_functions (Structure.next_of), once a node diverged
        self.metadata: dict[tuple, tuple] = {}  # (id(node), input) -> (shape, dtype), as read by replay.reduce_outputs
        self.root_edges: frozenset | None = None  # (id(node), output) of each root edge, once asked
        self.repeated = ""  # why no value without hooks is known in this pass (boundaries.REPEATED), or ""

    def activate(self, edited_in_place: bool, seen: bool = False) -> None:
        """A hook changed a gradient (``edited_in_place``: by editing the tensor it received, or it may have; ``seen``:
        a hook whose call the lens saw edited it, and which tensor is known)."""
        self.active = True
        self.edited_in_place = self.edited_in_place or edited_in_place
        self.other_edits = self.other_edits or (edited_in_place and not seen)

    def unknown_from(self, fn: Any, reason: str) -> None:
        """What ``fn`` sent cannot be known without hooks (hooks ran where the lens could not follow)."""
        self.activate(edited_in_place=False)
        self.forced[id(fn)] = Unknown(reason)

    def on_node(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple, calls: list, is_leaf: bool) -> None:
        """``fn`` has just run (its post-hook): decide whether it diverged, and what it would have sent."""
        key = id(fn)
        forced = self.forced
        if forced and key in forced:
            self.out[key] = forced[key]
            return
        # a call whose effect is not known (a hook written in C) may have changed anything it touched
        diverged = False
        for call in calls:
            if call.node_fn is fn and (call.modified or call.unseen and call.grad_out is None):
                diverged = True
                break
        if not diverged and not self.edited_in_place:
            # only a diverged user can change what reached fn
            out = self.out
            if not out:
                return
            consumers = self.observer.shape.consumers
            for output_nr in range(len(grad_outputs)):
                for user, _ in consumers.get((key, output_nr), ()):
                    if id(user) in out:
                        diverged = True
                        break
                if diverged:
                    break
            else:
                return  # what reached fn is what would have: nothing to compute
        # the caller (nodes.py, _record_node) has hidden the lens's work already; grad mode off once for the node
        grad_mode = torch.is_grad_enabled()
        if grad_mode:
            _set_grad_enabled(False)
        try:
            self._diverged(fn, grad_inputs, grad_outputs, diverged, is_leaf, grad_mode)
        finally:
            if grad_mode:
                _set_grad_enabled(True)

    def _diverged(self, fn: Any, grad_inputs: tuple, grad_outputs: tuple, diverged: bool, is_leaf: bool,
                  graph_mode: bool = False) -> None:
        """``on_node`` past its first checks, with grad mode off and the lens's work hidden (``graph_mode``: the engine
        runs the pass with grad mode on, ``create_graph=True``)."""
        input_of = self._input_of
        unhooked = [input_of(fn, output_nr, False) for output_nr in range(len(grad_outputs))]
        if not diverged:
            diverged = not all(_same(value, received) for value, received in zip(unhooked, grad_outputs))
            if not diverged:
                return
        key = id(fn)
        if is_leaf:
            self.leaf[key] = unhooked[0] if unhooked else None
            return
        unknown = large = None
        for value in unhooked:
            if isinstance(value, Unknown):
                unknown = value  # the first Unknown, before any summary
                break
            if large is None and isinstance(value, TensorSummary):
                large = value
        if unknown is not None:
            self.out[key] = unknown
        elif large is not None:
            self.out[key] = Unknown(_too_large(large))
        elif key in self.observer.python_inside:  # (calls.py; with calls not watched, no node is run again)
            self.out[key] = Unknown(f"{fn.name()} ran a custom autograd.Function's backward inside it (an in-place "
                                    "Function on a view), Python code: running it again could change your program")
        elif graph_mode and fn.name() in _GRAD_MODE_FORMULAS:
            self.out[key] = Unknown(
                f"{fn.name()} computes otherwise with create_graph=True (a formula that can be differentiated "
                "again), and the lens runs it again without a graph")
        else:
            nexts = self.nexts
            if nexts is None:
                nexts = self.nexts = self.observer.shape.next_of()
            self.out[key] = run_again(fn, unhooked, nexts.get(key), self.metadata,
                                      grad_inputs if type(grad_inputs) is tuple else None)

    def input_of(self, fn: Any, output_nr: int, hooked: bool = False) -> Any:
        """What output ``output_nr`` of ``fn`` would have received with no hook anywhere; ``hooked``: what
        reached it in this pass before its own tensor hooks ran (what its users really sent, added up)."""
        with torch.no_grad(), _hidden_from_modes():
            return self._input_of(fn, output_nr, hooked)

    def _input_of(self, fn: Any, output_nr: int, hooked: bool) -> Any:
        """``input_of`` with grad mode off and the lens's work hidden by the caller."""
        observer = self.observer
        if observer.python_edits and not hooked:  # what the users sent was copied before such an edit reached it
            return Unknown("a custom autograd.Function's backward edited in place a gradient it received, earlier in "
                           f"this pass; what reached {fn.name()} without hooks is not followed through that")
        edge = (id(fn), output_nr)
        users = observer.shape.consumers.get(edge, ())
        roots = self.root_edges
        if roots is None:
            roots = self.root_edges = frozenset((id(root_fn), root_nr) for root_fn, root_nr in observer.shape.root_edges)
        if len(users) == 1 and edge not in roots:  # the usual output: one user, no seed; what it sent, as add() takes it
            value = self._sent_by(users[0], hooked)
            if value is _NOT_RUN:
                return None
            return add(None, value) if isinstance(value, TensorSummary) else value
        return self._summed(fn, output_nr, users, hooked)

    def _sent_by(self, user_slot: tuple, hooked: bool) -> Any:
        """What ``user`` sent on ``slot`` (the recorded copy), or would have sent with no hook (``hooked`` False, a
        diverged user: its value without hooks, or the Unknown it is); ``_NOT_RUN`` when it has not run."""
        user, slot = user_slot
        position = self.observer.ran.get(id(user))
        if position is None:
            return _NOT_RUN
        if not hooked and id(user) in self.out:
            outputs = self.out[id(user)]
            return outputs if isinstance(outputs, Unknown) else outputs[slot]
        sent = self.observer.records[position].sent
        return sent[slot] if isinstance(sent, tuple) and slot < len(sent) else sent

    def _summed(self, fn: Any, output_nr: int, users: Any, hooked: bool) -> Any:
        """``_input_of`` in general: the seeds of the roots at this output, then what each user sent, in the order
        they ran, added up as the engine adds them."""
        observer = self.observer
        arrivals = []
        for user_slot in users:
            value = self._sent_by(user_slot, hooked)
            if value is _NOT_RUN:
                continue
            if isinstance(value, Unknown):  # (only a diverged user's is one: recorded copies are values)
                return value
            arrivals.append((observer.ran[id(user_slot[0])], value))
        arrivals.sort(key=lambda item: item[0])
        total: Any = None
        seeds = observer.start_seeds if hooked else observer.seeds
        for index, (root_fn, root_nr) in enumerate(observer.shape.root_edges):
            if root_fn is fn and root_nr == output_nr:
                seed = seeds[index] if index < len(seeds) else None
                total = add(total, _as_the_engine_takes(seed, observer.roots[index] if index < len(observer.roots)
                                                        else None))
        for _, value in arrivals:
            total = add(total, value)
        return total

    def added(self, fn: Any, received: Any) -> Any:
        """What leaf ``fn`` would have had added to its ``.grad`` in this pass with no hook."""
        if id(fn) in self.leaf:
            return self.leaf[id(fn)]
        return received


@dataclass
class LeafHistory:
    """Across the passes of one ``Lens``: a leaf's ``.grad`` after the last pass, and what it would
    hold had no hook been registered (``SAME``: equal to the real one, nothing to keep)."""

    ref: Any  # weakref to the leaf: the history never keeps a tensor alive
    grad: Any
    without: Any


SAME: Any = object()


CLEARED = ("a hook set .grad to None (an optimizer step inside backward?) where without hooks it held a gradient: code "
           "run between passes that reads or clears .grad (optimizer.zero_grad(), clip_grad_norm_) would have acted "
           "on that gradient, and whether any ran is not seen by the lens")


def carry(history: LeafHistory | None, old: Any, others_diverged: bool = False, touched: bool | None = None,
          others_touched: bool = False) -> Any:
    """What ``.grad`` would hold before this pass with no hook, given its real value ``old`` now.
    ``others_diverged``: after an earlier pass some leaf's ``.grad`` differed from what it would be without hooks;
    code that changed this one between passes may have read that one (``clip_grad_norm_`` reads them all).
    ``touched``: code wrote this ``.grad`` since the last pass (None: not known; then equal values mean untouched);
    ``others_touched``: it wrote some leaf's."""
    if history is None:
        return SAME
    if values_equal(old, history.grad) and not touched:
        if others_touched and is_known(history.without) and history.without is not SAME \
                and not values_equal(history.without, history.grad):
            return Unknown("code wrote other leaves' .grad between passes (clip_grad_norm_?) and might have written "
                           "this one's, which differed without hooks")
        if old is None and isinstance(history.without, torch.Tensor):
            return Unknown(CLEARED)
        return _earlier(history.without)  # untouched since the last pass (None included: nothing has written it)
    if touched is False and isinstance(history.without, Unknown):
        return _earlier(history.without)  # untouched since (a hook of a pass that did not reach it set it to None?)
    if old is None:
        return None if history.without is not SAME else SAME  # set to None by the user (zero_grad): so without hooks
    if isinstance(old, torch.Tensor) and not old.any():
        return torch.zeros_like(old) if history.without is not SAME else SAME  # zeroed in place by the user
    if history.without is SAME and not others_diverged:
        return SAME  # nothing differed from a run without hooks: the same code changed it the same way
    if history.without is SAME:
        return Unknown(".grad was changed between passes by code the lens did not see, after hooks had changed "
                       "other leaves' gradients, which that code may have read (clip_grad_norm_ reads them all)")
    if isinstance(history.without, Unknown):
        return _earlier(history.without)
    return Unknown(".grad was changed by code the lens did not see (between passes, or during this one through "
                   "memory it shares with a gradient)")
