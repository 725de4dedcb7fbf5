"""A frozen dataclass's behaviour for the few small classes a first picture imports (``views.fold``,
``views.gradsize``): ``@dataclass`` writes and compiles each class's methods when its module is imported (about
0.5 ms a class in a new kernel, on the path of a first picture in one cell: benchmarks/README.md, 2026-11-27);
these are written once, here.

A subclass names its fields in ``FIELDS`` (and the defaults of the last ones in ``DEFAULTS``); it gets what
``@dataclass(frozen=True)`` would give it: the constructor (positional or by name), equality and hash over the
fields (with an instance of the same class only), the ``repr`` and ``FrozenInstanceError`` on assignment."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, ClassVar


class Frozen:
    FIELDS: ClassVar[tuple[str, ...]] = ()
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, *values: Any, **named: Any) -> None:
        fields = self.FIELDS
        if len(values) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments, {len(values)} given")
        given = dict(zip(fields, values))
        for name, value in named.items():
            if name not in fields or name in given:
                raise TypeError(f"{type(self).__name__}() got an unexpected or repeated argument {name!r}")
            given[name] = value
        for name in fields:
            if name in given:
                value = given[name]
            elif name in self.DEFAULTS:
                value = self.DEFAULTS[name]
            else:
                raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        listed = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__qualname__}({listed})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
