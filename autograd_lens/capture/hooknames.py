"""The name a hook is shown by, on the cards and on the drawing alike; light (no torch.nn), so that drawing a graph
does not load the tracer's modules."""

from __future__ import annotations

import os
import re
import weakref
from types import CodeType
from typing import Any

# torch.compile (torch 2.15, dynamo alone or any backend that runs its graph as traced) turns a tensor hook registered
# inside compiled code into a subgraph (an fx GraphModule, ``hook_body``) that a closure of its own registers and
# calls: the user's function never runs, the graph traced from it does.  A hook with side effects (or whose handle the
# code uses) is registered as it is (seen on torch 2.13 and 2.15).
COMPILED_HOOK = "RegisterHookOp.__call__.<locals>.hook"
_COMPILED_FILE = os.path.join("torch", "_higher_order_ops", "register_hook.py")
TRACED_UNNAMED = "<hook traced by torch.compile>"
_FRAME = re.compile(r'^  File "(.*)", line (\d+), in (.+)$', re.MULTILINE)
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook_body -> its name, once read


def is_compiled_hook(code: Any) -> bool:
    """``code`` is dynamo's closure calling a hook it traced (``COMPILED_HOOK``)."""
    return getattr(code, "co_qualname", None) == COMPILED_HOOK and code.co_filename.endswith(_COMPILED_FILE)


def function_name(function: Any, code: CodeType | None = None) -> str:
    """A hook's display name: its ``__qualname__`` without the ``<locals>`` path; for a hook torch.compile traced
    (``COMPILED_HOOK``), the name of the user's function it was traced from (``traced_hook_name``)."""
    if is_compiled_hook(getattr(function, "__code__", None)):
        cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
        try:
            return traced_hook_name(cells["hook_body"].cell_contents)
        except (KeyError, ValueError):
            return TRACED_UNNAMED
    if function is None and is_compiled_hook(code):
        return TRACED_UNNAMED
    target = function
    for attribute in ("func", "hook", "__wrapped__"):
        inner = getattr(target, attribute, None)
        if callable(inner):
            target = inner
    name = getattr(target, "__qualname__", None)
    if name is None and target is not None:
        name = type(target).__qualname__
    if name is None and code is not None:
        name = code.co_qualname
        if name.endswith(".__call__"):
            name = name[: -len(".__call__")]
    name = (name or "?").split("<locals>.")[-1]
    if name.startswith("_VariableFunctionsClass."):  # torch.neg and the other torch.* functions
        name = "torch." + name[len("_VariableFunctionsClass."):]
    return name


def traced_hook_name(body: Any) -> str:
    """The name of the user's hook that ``body`` (the graph dynamo traced it into) computes: the function that its
    operations' stack traces enter below the frame that registered it (a Python hook: its ``co_name``, as dynamo
    records frames, so a method shows without its class); else the one function the graph runs (a hook written in C,
    ``torch.neg``, or one torch puts in a graph whole, ``F.relu``); else ``TRACED_UNNAMED`` (a graph that computes
    nothing, from a hook that returns its gradient or None, does not say whose it is)."""
    try:
        name = _TRACED.get(body)
    except TypeError:  # not weakly referable: read each time
        name = None
    if name is None:
        try:
            name = _traced_name(body) or TRACED_UNNAMED
        except Exception:  # another torch's graph: no name read from it
            name = TRACED_UNNAMED
        try:
            _TRACED[body] = name
        except TypeError:
            pass
    return name


def _frames(stack_trace: Any) -> list[tuple[str, str, str]]:
    return _FRAME.findall(stack_trace) if isinstance(stack_trace, str) else []


def _traced_name(body: Any) -> str | None:
    nodes = list(body.graph.nodes)
    inputs = [node for node in nodes if node.op == "placeholder"]
    ops = [node for node in nodes if node.op in ("call_function", "call_method", "call_module")]
    registered_at = _frames(inputs[0].meta.get("stack_trace")) if inputs else []  # the gradient: made at the call
    if not ops or not registered_at:
        return None
    entered = set()
    for node in ops:
        frames = _frames(node.meta.get("stack_trace"))
        if frames[: len(registered_at)] != registered_at:
            return None  # not traced below the registration: the frames do not say
        if len(frames) > len(registered_at):
            entered.add(frames[len(registered_at)][2])
    if entered:
        return entered.pop() if len(entered) == 1 else None
    # a hook in C is the graph's one operation: its source, last on the stack (after the registration, torch 2.15)
    source = (ops[0].meta.get("source_fn_stack") or [()])[-1] if len(ops) == 1 else ()
    if len(source) != 2 or source[0] == "register_hook":
        return None
    target = source[1]
    if isinstance(target, str):  # a Tensor method (``torch.Tensor.neg``)
        import torch

        target = getattr(torch.Tensor, target, None)
    return function_name(target) if callable(target) else None
