"""Hook set-ups that survive save and load: named hook functions and JSON recipes.

Hooks are Python callables tied to live tensors and modules: they are not part of a ``state_dict``,
pickling them is unsafe, and ``torch.load`` refuses custom objects by default since torch 2.6.  A
recipe stores *what* to register instead — target, kind, hook name, parameters — as JSON, and
re-registers it on a freshly built model.  Loading never uses pickle or ``eval``: hook names are
looked up in a registry of functions your code (or this package) defined.

>>> import torch, autograd_lens as al
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
>>> recipe = al.Recipe().add("0.weight", "tensor", "clip", max=0.5).add("1", "module_full", "scale", factor=2.0)
>>> handles = recipe.apply(model)
>>> al.Recipe.from_model(model).entries == recipe.entries
True
>>> handles.remove(); len(al.Recipe.from_model(model).entries)
0
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

KINDS = ("tensor", "post_accumulate_grad", "module_full", "module_full_pre")
_TENSOR_KINDS = ("tensor", "post_accumulate_grad")
_REGISTRY: dict[str, Callable[..., Any]] = {}
_MARK = "_autograd_lens_recipe"  # the attribute a registered wrapper carries: {"hook", "params", "kind"}
_FORMAT = "autograd_lens recipe"
log = logging.getLogger("autograd_lens.recipes")


class RecipeError(ValueError):
    """A recipe entry that cannot be saved, loaded or applied; the message names the entry."""


def hook(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(grad, **params) -> tensor or None`` under ``name`` for recipes.

    The same function serves every kind: for module hooks it is applied to each gradient of the
    tuple; for post-accumulate hooks to the parameter's ``.grad`` (a returned tensor is copied in).

    >>> @hook("halve_if_large")
    ... def halve_if_large(grad, above=1.0):
    ...     return grad * 0.5 if grad.abs().max() > above else None
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a hook name must be a Python identifier, e.g. 'clip_small', not {name!r}")

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        known = _REGISTRY.get(name)
        if known is not None and getattr(known, "__qualname__", None) != getattr(function, "__qualname__", None):
            raise ValueError(f"a hook named {name!r} is already registered ({known.__qualname__}); choose another name")
        _REGISTRY[name] = function
        return function

    return register


def registered() -> list[str]:
    """The names a recipe can use."""
    return sorted(_REGISTRY)


@hook("clip")
def clip(grad: torch.Tensor, max: float) -> torch.Tensor:  # noqa: A002  (the recipe's parameter name)
    """Clip every element to [-max, max] (by value, not by norm)."""
    return grad.clamp(-max, max)


@hook("scale")
def scale(grad: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply the gradient by ``factor``."""
    return grad * factor


@hook("log_norm")
def log_norm(grad: torch.Tensor) -> None:
    """Log the gradient's norm (logger ``autograd_lens.recipes``, level INFO); changes nothing."""
    log.info("gradient norm %.6g (shape %s)", float(grad.detach().double().norm()), tuple(grad.shape))
    return None


@hook("zero")
def zero(grad: torch.Tensor) -> torch.Tensor:
    """Replace the gradient by zeros: what lies upstream gets zeros, not None (plain SGD leaves it unchanged;
    weight decay and momentum still move it)."""
    return torch.zeros_like(grad)


@hook("nan_guard")
def nan_guard(grad: torch.Tensor) -> torch.Tensor | None:
    """Replace NaN and infinite entries by 0; a finite gradient passes unchanged."""
    if bool(torch.isfinite(grad).all()):
        return None
    return torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)


@dataclass(frozen=True)
class Entry:
    """One line of a recipe: register hook ``hook`` (with ``params``) as a ``kind`` hook on ``target``."""

    target: str  # a parameter name ("0.weight") or a module path ("encoder.layer1", "" for the model)
    kind: str
    hook: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self, index: int) -> str:
        return f"entry {index} ({self.kind} hook {self.hook!r} on {self.target!r})"


def _json_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(item) for item in value)
    return False


def _check(entry: Entry, index: int) -> None:
    where = entry.describe(index)
    if entry.kind not in KINDS:
        raise RecipeError(f"{where}: kind must be one of {', '.join(KINDS)}")
    function = _REGISTRY.get(entry.hook)
    if function is None:
        raise RecipeError(f"{where}: no hook named {entry.hook!r}; registered: {', '.join(registered())} "
                          "(register yours with @autograd_lens.hook('name') before loading)")
    if not isinstance(entry.target, str):
        raise RecipeError(f"{where}: the target must be a parameter name or module path (a string)")
    if not isinstance(entry.params, dict) or not all(isinstance(key, str) for key in entry.params):
        raise RecipeError(f"{where}: params must map names to values")
    for key, value in entry.params.items():
        if not _json_value(value):
            raise RecipeError(f"{where}: parameter {key}={value!r} is not a number, string, bool or list of them")
    try:
        inspect.signature(function).bind(None, **entry.params)
    except TypeError as error:
        raise RecipeError(f"{where}: {error} for {entry.hook}{inspect.signature(function)}") from None


def _label(entry: Entry) -> str:
    arguments = ", ".join(f"{key}={value!r}" for key, value in entry.params.items())
    return f"{entry.hook}({arguments})"


def make_hook(entry: Entry) -> Callable[..., Any]:
    """The callable torch registers for ``entry``; it carries the entry, and is named like ``clip(max=0.5)``."""
    function = _REGISTRY[entry.hook]
    params = dict(entry.params)

    def apply(grad: Any) -> Any:
        return function(grad, **params) if isinstance(grad, torch.Tensor) else None

    def on_tuple(grads: tuple) -> tuple | None:
        results = [apply(grad) for grad in grads]
        if all(result is None for result in results):
            return None
        return tuple(grad if result is None else result for grad, result in zip(grads, results))

    if entry.kind == "tensor":
        def recipe_hook(grad):
            return apply(grad)
    elif entry.kind == "post_accumulate_grad":
        def recipe_hook(param):
            result = apply(param.grad)
            if result is not None:
                with torch.no_grad():
                    param.grad.copy_(result)
    elif entry.kind == "module_full":
        def recipe_hook(module, grad_input, grad_output):
            return on_tuple(grad_input)
    else:
        def recipe_hook(module, grad_output):
            return on_tuple(grad_output)

    recipe_hook.__name__ = recipe_hook.__qualname__ = _label(entry)  # what the stepper and the drawing show
    setattr(recipe_hook, _MARK, {"hook": entry.hook, "params": params, "kind": entry.kind})
    return recipe_hook


class Handles:
    """What :meth:`Recipe.apply` registered; ``remove()`` takes all of it off again."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __len__(self) -> int:
        return len(self._handles)

    def __repr__(self) -> str:
        return f"<recipe handles: {len(self._handles)} hook{'s' if len(self._handles) != 1 else ''} registered>"

    def __enter__(self) -> "Handles":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()


class Recipe:
    """A list of hooks to register on a model, saved as JSON (see the module docstring)."""

    def __init__(self, entries: list[Entry] | tuple[Entry, ...] = ()) -> None:
        self.entries: list[Entry] = []
        for index, entry in enumerate(entries):
            _check(entry, index)
            self.entries.append(entry)

    def add(self, target: str, kind: str, hook: str, **params: Any) -> "Recipe":
        """Add a line; checked now (hook known, kind valid, parameters fit the hook).  Returns the recipe."""
        entry = Entry(target, kind, hook, dict(params))
        _check(entry, len(self.entries))
        self.entries.append(entry)
        return self

    # ---------------------------------------------------------------- JSON
    def to_json(self) -> str:
        return json.dumps({"format": _FORMAT, "version": 1, "entries": [asdict(e) for e in self.entries]}, indent=2)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str) -> "Recipe":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise RecipeError(f"not a recipe: not valid JSON ({error})") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), list):
            raise RecipeError(f'not a recipe: expected {{"format": "{_FORMAT}", "version": 1, "entries": [...]}}')
        if data.get("version") != 1:
            raise RecipeError(f"recipe version {data.get('version')!r} is not supported (this version reads 1)")
        entries = []
        for index, raw in enumerate(data["entries"]):
            if not isinstance(raw, dict) or set(raw) - {"target", "kind", "hook", "params"} or \
                    not {"target", "kind", "hook"} <= set(raw):
                raise RecipeError(f"entry {index}: expected the keys target, kind, hook and params, got {raw!r}")
            entries.append(Entry(raw["target"], raw["kind"], raw["hook"], raw.get("params", {})))
        return cls(entries)

    @classmethod
    def load(cls, path: str) -> "Recipe":
        with open(path, encoding="utf-8") as handle:
            return cls.from_json(handle.read())

    # ---------------------------------------------------------------- models
    def apply(self, model: torch.nn.Module) -> Handles:
        """Register every entry on ``model``, or none: targets are all found before anything is registered,
        and whatever was registered is removed again if torch refuses one."""
        resolved = [(entry, self._resolve(model, entry, index)) for index, entry in enumerate(self.entries)]
        handles: list[Any] = []
        try:
            for entry, target in resolved:
                handles.append(_register(target, entry))
        except Exception:
            for handle in handles:
                handle.remove()
            raise
        return Handles(handles)

    @staticmethod
    def _resolve(model: torch.nn.Module, entry: Entry, index: int) -> Any:
        where = entry.describe(index)
        if entry.kind in _TENSOR_KINDS:
            try:
                return model.get_parameter(entry.target)
            except AttributeError:
                names = [name for name, _ in model.named_parameters()][:8]
                raise RecipeError(f"{where}: the model has no parameter {entry.target!r} (it has {', '.join(names)}, "
                                  "…); a tensor hook's target is a parameter name") from None
        try:
            return model.get_submodule(entry.target)
        except AttributeError:
            names = [name or "''" for name, _ in model.named_modules()][:8]
            raise RecipeError(f"{where}: the model has no module {entry.target!r} (it has {', '.join(names)}, …)") \
                from None

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "Recipe":
        """The recipe of the hooks registered on ``model`` through recipes (other hooks cannot be saved)."""
        entries = []
        for name, param in model.named_parameters():
            for hooks in (param._backward_hooks, getattr(param, "_post_accumulate_grad_hooks", None)):
                for function in (hooks or {}).values():
                    entries.extend(_entry_of(function, name))
        for name, module in model.named_modules():
            for hooks in (module._backward_hooks, module._backward_pre_hooks):
                for function in hooks.values():
                    entries.extend(_entry_of(function, name))
        return cls(entries)

    def __repr__(self) -> str:
        lines = [f"  {entry.kind} hook {_label(entry)} on {entry.target!r}" for entry in self.entries]
        return "Recipe(" + ("\n" + "\n".join(lines) + "\n" if lines else "") + ")"


def _entry_of(function: Any, target: str) -> list[Entry]:
    mark = getattr(function, _MARK, None)
    return [Entry(target, mark["kind"], mark["hook"], dict(mark["params"]))] if mark else []


def _register(target: Any, entry: Entry) -> Any:
    function = make_hook(entry)
    if entry.kind == "tensor":
        return target.register_hook(function)
    if entry.kind == "post_accumulate_grad":
        return target.register_post_accumulate_grad_hook(function)
    if entry.kind == "module_full":
        return target.register_full_backward_hook(function)
    return target.register_full_backward_pre_hook(function)
