""""call i of n" across passes of a retained graph when a tensor's name goes away between them (``del t``, or the
name given to another tensor): the lens reads a named tensor's hooks by their handles, and once the name is gone it
still tells them apart through the tensor's hook dict, which the graph keeps alive (a weak reference: nothing lives
longer). Each case is compared with counters kept by the hooks themselves."""

from __future__ import annotations

import functools

import pytest
import torch

import autograd_lens as al


def make(tag: str, log: list, scale: float = 2.0):
    def hook(g):
        log.append(tag)
        return g * scale
    return hook


def shown(lens) -> list[tuple[int, str, int, int]]:
    return [(c.pass_index, c.hook, c.invocation, c.registration) for c in lens.hook_calls]


class Hooker:
    def __init__(self, log):
        self.log = log

    def __call__(self, g):
        self.log.append("h")
        return g * 2


def scaled(log, g, scale=2.0):
    log.append("h")
    return g * scale


HOOKS = {
    "function": lambda log: make("h", log),
    "callable object": Hooker,
    "partial": lambda log: functools.partial(scaled, log),
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
@pytest.mark.parametrize("forget", ["del", "rebind"])
def test_a_hook_on_a_tensor_whose_name_went_away_keeps_its_count(forget, hook):
    log: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        t2 = x * 3
        t2.register_hook(HOOKS[hook](log))
        out = (t2 * t2).sum()
        out.backward(retain_graph=True)
        if forget == "del":
            del t2
        else:
            t2 = torch.zeros(1)  # noqa: F841  (the name now holds another tensor)
        out.backward()
    assert log == ["h", "h"]
    assert [(c.pass_index, c.invocation, c.registration) for c in lens.hook_calls] == [(0, 1, 1), (1, 2, 1)]


def test_two_closures_of_one_factory_and_one_function_twice_keep_their_counts():
    log: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        t2 = x * 3
        a, b = make("a", log), make("b", log, 0.5)
        t2.register_hook(a)
        t2.register_hook(b)
        t2.register_hook(a)  # the same function again: a third registration
        out = (t2 * t2).sum()
        out.backward(retain_graph=True)
        del t2
        out.backward()
    assert log == ["a", "b", "a"] * 2
    calls = [(c.pass_index, c.invocation, c.registration) for c in lens.hook_calls]
    assert calls == [(0, 1, 1), (0, 1, 2), (0, 1, 3), (1, 2, 1), (1, 2, 2), (1, 2, 3)], calls


def test_a_hook_removed_between_passes_does_not_shift_the_others():
    log: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        t2 = x * 3
        a, b = make("a", log), make("b", log, 0.5)
        first = t2.register_hook(a)
        t2.register_hook(b)
        out = (t2 * t2).sum()
        out.backward(retain_graph=True)
        del t2
        first.remove()
        out.backward()
    assert log == ["a", "b", "b"]
    calls = [(c.pass_index, c.invocation, c.registration) for c in lens.hook_calls]
    assert calls == [(0, 1, 1), (0, 1, 2), (1, 2, 2)], calls


def test_a_new_hook_of_the_same_code_registered_through_another_reference_is_a_new_hook():
    """The name is gone, the old hook removed and a closure of the same factory registered through a list that
    holds the tensor: a different registration, whose first call it is."""
    log: list = []
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with al.Lens() as lens:
        t2 = x * 3
        keep = [t2]
        first = t2.register_hook(make("a", log))
        out = (t2 * t2).sum()
        out.backward(retain_graph=True)
        del t2
        first.remove()
        keep[0].register_hook(make("b", log))
        out.backward()
    assert log == ["a", "b"]
    calls = [(c.pass_index, c.invocation) for c in lens.hook_calls]
    assert calls == [(0, 1), (1, 1)], calls
    assert lens.hook_calls[0].registration != lens.hook_calls[1].registration


def test_the_counter_keeps_no_hook_dict_alive():
    """Only weak references: once the graph is gone, so are the tensor's hooks (and their closures)."""
    import gc
    import weakref

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    lens = al.Lens()
    with lens:
        t2 = x * 3

        def hook(g):
            return g

        t2.register_hook(hook)
        watch = weakref.ref(hook)
        (t2 * t2).sum().backward()
        del t2, hook
    gc.collect()
    assert watch() is None
    assert all(ref() is None for ref in lens._invocations.dicts.values())


def unnamed_then_named(log: list, hooks: list, between=None):
    """Pass 1 and 2 with the hooked tensor reachable only through a closure (no name), pass 3 with a name."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)

    def build():
        t = x * 3
        handles = [t.register_hook(hook) for hook in hooks]
        return (t * t).sum(), (lambda: t), handles

    with al.Lens() as lens:
        out, get, handles = build()
        out.backward(retain_graph=True)
        out.backward(retain_graph=True)
        t2 = get()
        if between is not None:
            between(t2, handles, log)
        out.backward()
    return lens


def test_a_tensor_that_gets_a_name_later_keeps_its_hooks_counts():
    log: list = []
    a, b = make("a", log), make("b", log, 0.5)
    lens = unnamed_then_named(log, [a, b, a])
    assert log == ["a", "b", "a"] * 3
    calls = [(c.pass_index, c.invocation) for c in lens.hook_calls]
    assert calls == [(p, p + 1) for p in range(3) for _ in range(3)], calls
    registrations = [c.registration for c in lens.hook_calls]
    assert registrations[:3] == registrations[3:6] == registrations[6:] and len(set(registrations[:3])) == 3


def test_a_hook_of_the_same_code_registered_once_the_tensor_has_a_name_is_a_new_hook():
    log: list = []

    def swap(t2, handles, log):
        handles[0].remove()
        t2.register_hook(make("b", log))

    lens = unnamed_then_named(log, [make("a", log)], swap)
    assert log == ["a", "a", "b"]
    calls = [(c.pass_index, c.invocation) for c in lens.hook_calls]
    assert calls == [(0, 1), (1, 2), (2, 1)], calls
    assert lens.hook_calls[2].registration != lens.hook_calls[0].registration


def test_one_of_two_hooks_of_one_code_removed_before_the_name_is_given_is_not_known():
    """Two closures of one factory counted on a tensor with no name, one removed before the tensor gets a name: the
    survivor cannot be told from its code, so its call number is "not known" (it was b's third call), and the two
    hooks counted before have totals that are lower bounds: no card states a false count."""
    from autograd_lens.views.steps import hook_totals, steps_for

    log: list = []

    def drop_first(t2, handles, log):
        handles[0].remove()

    lens = unnamed_then_named(log, [make("a", log), make("b", log, 0.5)], drop_first)
    assert log == ["a", "b", "a", "b", "b"]
    calls = lens.hook_calls
    assert [(c.pass_index, c.invocation) for c in calls] == [(0, 1), (0, 1), (1, 2), (1, 2), (2, None)]
    assert set(calls[-1].may_be) == {calls[0].registration, calls[1].registration}
    totals = hook_totals(lens.passes)
    titles = [step.title for p in lens.passes for step in steps_for(p, totals) if step.kind == "hook"]
    assert "call number not known" in titles[-1]
    assert all("of at least 2 in this recording" in title for title in titles[:4]), titles


@pytest.mark.parametrize("forget", ["del", "rebind"])
def test_hooks_written_in_c_on_a_tensor_whose_name_went_away_are_still_shown(forget):
    """A hook written in C that leaves the gradient as it was (``list.append``) cannot be seen running; on a named
    tensor the lens knows it is there. After the name goes away, the tensor's hook dict (read through a weak
    reference) still says so: every call torch made is shown, with its count (found by programs.py's rebinding)."""
    seen: list = []
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    with al.Lens() as lens:
        a, b = x.split(2, dim=1)
        b.register_hook(seen.append)
        b.register_hook(torch.neg)
        out = (a.sum() + b.sum() + b.sin().sum())
        out.backward(retain_graph=True)
        if forget == "del":
            del b
        else:
            b = torch.zeros(1)  # noqa: F841
        out.backward()
    assert len(seen) == 2
    calls = [(c.pass_index, c.hook, c.invocation) for c in lens.hook_calls]
    assert calls == [(0, "list.append", 1), (0, "torch.neg", 1), (1, "list.append", 2), (1, "torch.neg", 2)], calls
    assert [c.target for c in lens.hook_calls[2:]] == ["split[1]"] * 2  # its drawn label now, not the lost name
    assert x.grad is not None and torch.equal(x.grad, 2 * torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]) + 2 * (
        torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]) * -(1 + torch.cos(x))))


# A registration removed and the same function registered again is a new hook (torch counts nothing across them).
# Module hooks were keyed by their function alone and a multi-grad hook by the id of its wrapper's state, which a
# new registration made at the freed one's address shares: both kept counting the old registration.
MODULE = torch.nn.modules.module
REGISTER = {  # kind -> (how to register hook on (lin, x, y), the hook's arguments but the log)
    "module full": lambda lin, x, y, hook: lin.register_full_backward_hook(hook),
    "module full pre": lambda lin, x, y, hook: lin.register_full_backward_pre_hook(hook),
    "module legacy": lambda lin, x, y, hook: lin.register_backward_hook(hook),
    "global full": lambda lin, x, y, hook: MODULE.register_module_full_backward_hook(hook),
    "global full pre": lambda lin, x, y, hook: MODULE.register_module_full_backward_pre_hook(hook),
    "multi-grad all": lambda lin, x, y, hook: torch.autograd.graph.register_multi_grad_hook((x, y), hook),
    "multi-grad any": lambda lin, x, y, hook: torch.autograd.graph.register_multi_grad_hook((x, y), hook, mode="any"),
    "tensor": lambda lin, x, y, hook: y.register_hook(hook),
}


def logger(log: list):
    def hook(*args):
        log.append("ran")
    return hook


@pytest.mark.parametrize("same_function", [True, False], ids=["same-function", "new-closure"])
@pytest.mark.parametrize("kind", sorted(REGISTER))
def test_a_hook_removed_and_registered_again_is_counted_as_a_new_hook(kind, same_function):
    log: list = []
    torch.manual_seed(0)
    lin = torch.nn.Linear(1, 1)
    x = torch.tensor([[1.0]], requires_grad=True)
    with al.Lens() as lens:
        y = x * 2
        hook = logger(log)
        handle = REGISTER[kind](lin, x, y, hook)
        lin(y).sum().backward(retain_graph=True)  # a forward each pass: module hooks are set up by the call
        handle.remove()
        lin(y).sum().backward(retain_graph=True)
        handle = REGISTER[kind](lin, x, y, hook if same_function else logger(log))
        lin(y).sum().backward(retain_graph=True)
        lin(y).sum().backward(retain_graph=True)
        handle.remove()
    assert log == ["ran"] * 3  # torch: the first registration once, the second twice
    counts = [[(call.invocation, call.registration) for call in lens.hook_calls if call.pass_index == index]
              for index in range(4)]
    (first,), (), (second,), (third,) = counts
    assert (first[0], second[0], third[0]) == (1, 1, 2), counts
    assert second[1] == third[1] != first[1], counts
