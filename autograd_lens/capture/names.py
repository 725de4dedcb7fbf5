"""Find the Python names of tensors and modules, so the drawing says ``y`` and ``model.0.weight``."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType, SimpleNamespace
from typing import Any

import torch

from .hooknames import function_name

# IPython keeps every displayed output under names like ``_``, ``_3`` and ``Out``:
# those are aliases, never the name a student gave.
_SKIPPED = {"In", "Out", "exit", "quit", "get_ipython"}


def hook_name(hook: Any) -> str:
    """The name a hook is shown by on the drawing: the one its calls are shown by (``torch.neg``, not
    ``_VariableFunctionsClass.neg``)."""
    return function_name(hook)


def _hook_badges(tensor: torch.Tensor) -> tuple[str, ...]:
    if not getattr(tensor, "_backward_hooks", None) and not getattr(tensor, "_post_accumulate_grad_hooks", None) \
            and tensor.grad_fn is None:
        return ()  # most leaves: no hook, and retain_grad() is for non-leaves
    badges = []
    for hook in getattr(tensor, "_backward_hooks", None) and tensor._backward_hooks.values() or ():
        badges.append(f"[hook] {hook_name(hook)}")
    for hook in (getattr(tensor, "_post_accumulate_grad_hooks", None) or {}).values():
        badges.append(f"[post-accumulate hook] {hook_name(hook)}")
    if tensor.grad_fn is not None and tensor.retains_grad:
        badges.append("[retain_grad]")
    return tuple(badges)


@dataclass
class Names:
    """Names of the tensors and modules of one namespace.

    Keys are object identities, so the objects are kept alive here (in
    ``_keep``) for as long as the lookup is used: an id can then not be
    reused by another object.
    """

    leaves: dict[int, str] = field(default_factory=dict)  # id(leaf tensor) -> name
    outputs: dict[tuple[int, int], str] = field(default_factory=dict)  # (id(grad_fn), output_nr) -> name
    tensors: dict[int, str] = field(default_factory=dict)  # id(any tensor) -> name
    modules: dict[int, str] = field(default_factory=dict)  # id(module) -> name
    tensor_objects: list[torch.Tensor] = field(default_factory=list, repr=False)  # in naming order
    module_objects: list[torch.nn.Module] = field(default_factory=list, repr=False)
    owners: dict[int, tuple] = field(default_factory=dict, repr=False)  # id(leaf parameter) -> (module, attribute)
    _keep: list[Any] = field(default_factory=list, repr=False)

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        if id(tensor) in self.tensors:
            return
        try:
            grad_fn = tensor.grad_fn
            output_nr = tensor.output_nr
        except RuntimeError:  # e.g. a split() output whose base changed in place: torch refuses to say; not a name
            return
        name = printable(name)
        self.tensors[id(tensor)] = name
        self.tensor_objects.append(tensor)
        if grad_fn is not None:
            self.outputs.setdefault((id(grad_fn), output_nr), name)
            self._keep.append(grad_fn)
        elif tensor.requires_grad:
            self.leaves.setdefault(id(tensor), name)

    def add_module(self, name: str, module: torch.nn.Module) -> None:
        """Name a module, its submodules (``model.0``) and their parameters (``model.0.weight``).

        Each parameter is named as ``add_tensor`` would name it, inlined (one call fewer per parameter; a name
        that is all ASCII is printable as it is): tests/test_perf_names.py compares the two."""
        modules = self.modules
        if id(module) in modules:
            return
        tensors, keep, module_objects = self.tensors, self._keep, self.module_objects
        tensor_objects, outputs, leaves, owners = self.tensor_objects, self.outputs, self.leaves, self.owners
        for prefix, current in _walk_modules(name, module, modules):  # in the order named_modules() would give
            keep.append(current)
            module_objects.append(current)
            for attribute, param in current._parameters.items():
                if param is None or id(param) in tensors:
                    continue
                try:
                    grad_fn = param.grad_fn
                except RuntimeError:  # as add_tensor: torch refuses to say; not a name
                    continue
                label = f"{prefix}.{attribute}"
                if not label.isascii():
                    label = printable(label)
                tensors[id(param)] = label
                tensor_objects.append(param)
                if grad_fn is not None:
                    outputs.setdefault((id(grad_fn), param.output_nr), label)
                    keep.append(grad_fn)
                elif param.requires_grad:
                    leaves.setdefault(id(param), label)
                    owners[id(param)] = (current, attribute)

    def module_badges(self) -> dict[int, tuple[str, ...]]:
        """``id(parameter)`` → badges for the backward hooks of the module that owns it."""
        badges: dict[int, tuple[str, ...]] = {}
        for module in self.module_objects:
            if not module._backward_pre_hooks and not module._backward_hooks:
                continue  # most modules: no backward hook
            hooks = [("pre-hook", h) for h in module._backward_pre_hooks.values()]
            hooks += [("hook", h) for h in module._backward_hooks.values()]
            if not hooks:
                continue
            name = self.modules[id(module)]
            texts = tuple(f"[module {kind}] {name}: {hook_name(hook)}" for kind, hook in hooks)
            for param in module._parameters.values():
                if param is not None:
                    badges[id(param)] = badges.get(id(param), ()) + texts
        return badges

    def results(self) -> dict[tuple[int, int], torch.Tensor]:
        """(id(grad_fn), output_nr) -> the first named tensor that is that output (a result of an op)."""
        found: dict[tuple[int, int], torch.Tensor] = {}
        for tensor in self.tensor_objects:
            if tensor.grad_fn is not None:
                found.setdefault((id(tensor.grad_fn), tensor.output_nr), tensor)
        return found

    def moved(self, tensor: torch.Tensor) -> bool:
        """``tensor`` was named as a module's parameter, and that module now holds another tensor there (FSDP2 puts
        its sharded parameter back after the backward pass).  Reads the module's own ``_parameters``: no user code."""
        owner = self.owners.get(id(tensor))
        if owner is None:
            return False
        found = owner[0].__dict__.get("_parameters")
        return type(found) in (dict, OrderedDict) and found.get(owner[1]) is not tensor

    def tensor_name(self, tensor: torch.Tensor) -> str | None:
        return self.tensors.get(id(tensor))

    def module_name(self, module: Any) -> str | None:
        return self.modules.get(id(module))


def printable(name: str) -> str:
    """A name every page and notebook can carry: lone surrogates (e.g. from ``os.fsdecode``) escaped.

    >>> printable("loss\\udcff")
    'loss\\\\udcff'
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def names_from(namespace: Mapping[str, Any] | None) -> Names:
    """Collect names from a namespace: tensors, parameters of modules, and tensors
    one level inside lists, tuples and dicts (``params[0]``, ``grads['w']``) and objects of the user's own
    classes (``m.W1``).

    >>> w = torch.ones(2, requires_grad=True)
    >>> names_from({"w": w, "_": w}).tensor_name(w)
    'w'
    """
    names = Names()
    if not namespace:
        return names
    with torch._C.DisableTorchFunction():  # reading a subclass tensor's grad_fn runs no __torch_function__ of theirs
        _collect(names, namespace)
    return names


def _walk_modules(name: str, module: torch.nn.Module, modules: dict[int, str]) -> Any:
    """(name, module) of ``module`` and of its submodules not yet in ``modules`` (``id(module)`` -> name), iteratively
    (a deep model must not hit the recursion limit), in the order ``named_modules()`` gives; each is put in
    ``modules`` as it is given."""
    stack = [(printable(name), module)]
    while stack:
        prefix, current = stack.pop()
        key = id(current)
        if key in modules:
            continue
        modules[key] = prefix
        yield prefix, current
        children = current._modules
        if children:
            stack.extend([(f"{prefix}.{attribute}", child) for attribute, child in reversed(children.items())
                          if child is not None])


class ModuleNames:
    """The modules ``names_from`` names, with the same names (the same walk of the namespace: ``_collect``), without
    naming any tensor or parameter: what ``annotate._module_hooks`` reads as a Lens block starts and ends.
    tests/test_perf_setup.py compares it with ``names_from``."""

    def __init__(self) -> None:
        self.modules: dict[int, str] = {}  # id(module) -> name
        self.module_objects: list[torch.nn.Module] = []  # in naming order (kept: the ids stay theirs)

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        return None

    def add_module(self, name: str, module: torch.nn.Module) -> None:
        """``Names.add_module``'s walk (``model.0``, in the order of ``named_modules()``), its parameters left out."""
        if id(module) not in self.modules:
            self.module_objects.extend(current for _, current in _walk_modules(name, module, self.modules))

    def module_name(self, module: Any) -> str | None:
        return self.modules.get(id(module))


def modules_from(namespace: Mapping[str, Any] | None) -> ModuleNames:
    """The named modules of a namespace, as ``names_from(namespace)`` names them (its ``modules``)."""
    found = ModuleNames()
    if namespace:
        with torch._C.DisableTorchFunction():
            _collect(found, namespace)  # type: ignore[arg-type]
    return found


def _collect(names: Names, namespace: Mapping[str, Any]) -> None:
    """(Types read with type(), not isinstance: a proxy's ``__class__`` is the user's code, which the lens never calls.)"""
    containers = []
    for name, value in list(namespace.items()):
        if not _is(name, str) or name.startswith("_") or name in _SKIPPED:
            continue
        if _is(value, torch.Tensor):
            names.add_tensor(name, value)
        elif _is(value, torch.nn.Module):
            names.add_module(name, value)
        elif _is(value, (list, tuple, dict)) or _plain_object(value):
            containers.append((name, value))
    for name, value in containers:
        attributes = not _is(value, (list, tuple, dict))
        items = _attributes(value).items() if attributes else value.items() if _is(value, dict) else \
            enumerate(value)
        for index, (key, item) in enumerate(items):
            if index >= 64:
                break
            if attributes and (not _is(key, str) or key.startswith("_")):
                continue
            tensor = _is(item, torch.Tensor)
            if not tensor and not _is(item, torch.nn.Module):
                continue  # (no label made: a list of numbers has no name to give, a key's repr may be user code)
            label = f"{name}.{key}" if attributes else f"{name}[{key!r}]" if _is(value, dict) else f"{name}[{key}]"
            if tensor:
                names.add_tensor(label, item)
            else:
                names.add_module(label, item)


def _is(value: Any, kinds: Any) -> bool:
    return issubclass(type(value), kinds)


def _plain_object(value: Any) -> bool:
    """An instance of a class defined in the notebook or script itself (``m.W1`` of a hand-written model), or a
    ``SimpleNamespace``: its attributes are named one level down, read from its ``__dict__`` (no property runs)."""
    kind = type(value)
    if kind is not SimpleNamespace and (kind.__dict__.get("__module__") != "__main__" or issubclass(kind, type)):
        return False
    return _attributes(value) is not None


def _attributes(value: Any) -> dict | None:
    """The object's own ``__dict__``, read past any ``__getattr__`` / ``__getattribute__`` of its class (the user's
    code, which the lens never calls); None where it has none (``__slots__``)."""
    try:
        found = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return found if type(found) is dict else None


def caller_namespace(frame: FrameType | None) -> dict[str, Any]:
    """The globals and locals a frame sees, locals winning."""
    if frame is None:
        return {}
    namespace = dict(frame.f_globals)
    local = frame.f_locals
    if local is not frame.f_globals:
        namespace.update(local)
        if sys.version_info < (3, 13) and frame.f_code.co_flags & _CO_OPTIMIZED:
            # Before 3.13, reading a function frame's f_locals leaves a snapshot dict on the frame that
            # keeps every local alive until the next read; the function's own `del y` would no longer free y.
            # The snapshot is rebuilt from the real locals whenever anything reads it again.
            local.clear()
    return namespace


_CO_OPTIMIZED = 0x0001  # a function's frame: its f_locals is a snapshot, not its namespace


_INTERNAL_PREFIXES: tuple[str, ...] = ()


def _internal_prefixes() -> tuple[str, ...]:
    global _INTERNAL_PREFIXES
    if not _INTERNAL_PREFIXES:
        import os

        import autograd_lens

        _INTERNAL_PREFIXES = (
            os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(autograd_lens.__file__) + os.sep,
        )
    return _INTERNAL_PREFIXES


# torch calls these for a tensor subclass or a mode of the user's: their frames are torch's dispatch, not where the
# user called backward() (``y.backward()`` on a subclass runs torch's backward inside the subclass's method)
_DISPATCH_CODES = frozenset({"__torch_function__", "__torch_dispatch__"})


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """The innermost frame that is neither torch's nor this package's, nor a ``__torch_function__`` (and what it
    calls) that torch called on the way: the student's code."""
    frame = start if start is not None else sys._getframe(1)
    prefixes = _internal_prefixes()
    while True:
        while frame is not None and frame.f_code.co_filename.startswith(prefixes):
            frame = frame.f_back
        outer = frame  # the user's frames from here out to the next frame of torch's
        while outer is not None and not outer.f_code.co_filename.startswith(prefixes):
            caller = outer.f_back
            if outer.f_code.co_name in _DISPATCH_CODES and caller is not None \
                    and caller.f_code.co_filename.startswith(prefixes):
                break
            outer = caller
        else:
            return frame
        frame = outer.f_back  # torch called the subclass's (or mode's) method: the user's call is further out
