"""The lens's post-hook on every node of a pass, and each node's own hook dicts, in one go.

``fn.register_hook(h)`` and ``fn.register_prehook(h)`` (C++) find the node's hook dict, if it has one, and call
torch's Python ``_HookMixin._register_hook(dict_or_None, h)``, which makes the dict if needed, a ``RemovableHandle``
and its id; C++ then attaches a new dict to the node.  The lens needs, per node, its own post-hook in the post-hook
dict and a look at the pre-hook dict (the user's ``register_prehook``s), which no Python attribute shows.

Reading the pre-hook dict by registering a hook and deleting it at once left an empty dict on every node that had
none: the engine then wrapped and unwrapped each node's gradients for it, and each registration made a handle.
While :func:`attach` runs, ``_register_hook`` answers the lens's own two calls itself: for the post-hook it puts the
hook in the dict under a key of its own (no handle, torch's handle ids not advanced); for the probe it reads the
pre-hook dict and raises, so C++ attaches nothing and the node is left exactly as it was.  Every other call (another
thread's registration) goes to torch's function unchanged.  Where torch has no such function, or does not call it,
the handles' way is taken (:func:`attach_with_handles`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

try:
    from torch.autograd.function import _HookMixin
except ImportError:  # another torch: the handles' way
    _HookMixin = None

_LOCK = threading.RLock()  # (re-entered only if a collection during attach ran a finalizer that traced a pass)


class _Read(Exception):
    """Raised by the probe's registration: C++ then attaches nothing."""


def _probe(grad_outputs: Any) -> None:
    """Never registered: its registration is answered by reading the dict."""
    return None


def attach(nodes: list, observe: Any, key: Any) -> tuple[list, list]:
    """``observe`` as a post-hook on each node of ``nodes`` under ``key``; returns (post-hook dict, pre-hook dict or
    None) per node, in the order of ``nodes``.  Remove with :func:`detach`."""
    if _HookMixin is None or not isinstance(_HookMixin.__dict__.get("_register_hook"), staticmethod):
        return attach_with_handles(nodes, observe, key)
    posts: list = []
    pres: list = []
    original = _HookMixin.__dict__["_register_hook"]
    torch_register = original.__func__

    def _register_hook(backward_hooks: Any, hook: Any) -> Any:
        if hook is observe:
            if backward_hooks is None:
                backward_hooks = OrderedDict()
            backward_hooks[key] = hook
            posts.append(backward_hooks)
            return backward_hooks, key
        if hook is _probe:
            pres.append(backward_hooks)
            raise _Read
        return torch_register(backward_hooks, hook)

    done = 0
    ours = staticmethod(_register_hook)
    with _LOCK:  # two passes on two threads: one at a time, each putting back what it found
        _HookMixin._register_hook = ours
        try:
            for fn in nodes:
                handle = fn.register_hook(observe)
                if len(posts) == done:  # torch did not call this _register_hook: the handles' way, for every node
                    handle.remove()
                    break
                done += 1
                try:
                    fn.register_prehook(_probe)
                except _Read:
                    pass
                if len(pres) != done:
                    break
        except BaseException:
            detach(posts, key)
            raise
        finally:
            if _HookMixin.__dict__.get("_register_hook") is ours:  # unless something replaced it meanwhile
                _HookMixin._register_hook = original
    if done == len(nodes):
        return posts, pres
    detach(posts[:done], key)
    return attach_with_handles(nodes, observe, key)


def attach_with_handles(nodes: list, observe: Any, key: Any) -> tuple[list, list]:
    """:func:`attach` through torch's handles (the lens's hook under its handle's id moved to ``key``; the pre-hook
    dict read by registering and removing a hook: it leaves an empty dict on a node that had none)."""
    posts: list = []
    pres: list = []
    for fn in nodes:
        handle = fn.register_hook(observe)
        hooks = handle.hooks_dict_ref()
        hooks[key] = hooks.pop(handle.id)
        posts.append(hooks)
        probe = fn.register_prehook(_probe)
        found = probe.hooks_dict_ref()
        del found[probe.id]
        pres.append(found)
    return posts, pres


def detach(posts: list, key: Any) -> None:
    """Take the lens's post-hook out of each dict (``RemovableHandle.remove``, without the handle)."""
    for hooks in posts:
        if hooks is not None and key in hooks:
            del hooks[key]
