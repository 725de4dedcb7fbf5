"""The name a hook is shown by, on the cards and on the drawing alike; light (no torch.nn), so that drawing a graph
does not load the tracer's modules."""

from __future__ import annotations

from types import CodeType
from typing import Any


def function_name(function: Any, code: CodeType | None = None) -> str:
    """A hook's display name: its ``__qualname__`` without the ``<locals>`` path."""
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
