"""What the lens checks before it traces: the arguments of a ``Lens``, the passes it leaves alone, and the cyclic
collector paused while the lens's own code (no user code) sets a pass up or builds its model."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Mapping
from typing import Any

import torch

_EXAMPLES = {"store_limit": "4096", "max_elements": "16", "max_nodes": "300", "memory_budget": "256 * 2**20",
             "split_leaf_uses": "4"}


def _check_options(names: Any, **numbers: Any) -> None:
    """Refuse bad arguments with a message that says what to pass."""
    if names is not None and not isinstance(names, Mapping):
        raise TypeError(
            f"names must be a mapping from variable names to tensors or modules, e.g. names=globals() or "
            f"names={{'x': x, 'model': model}}, not a {type(names).__name__}"
        )
    for keyword, (value, lowest) in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int):
            example = _EXAMPLES.get(keyword, max(lowest, 1))
            raise TypeError(f"{keyword} must be a whole number (at least {lowest}), e.g. {keyword}={example}, "
                            f"not {value!r}")
        if value < lowest:
            raise ValueError(f"{keyword} must be at least {lowest}, not {value}")


def _pause_collector() -> bool:
    """No cyclic collection while the lens sets a pass up or builds its model (no user code runs there): it would go
    through objects that live until the pass ends.  Returns whether the collector was on, for
    :func:`_resume_collector` in a ``finally`` (a plain try/finally: no generator made per use, as a contextmanager
    would)."""
    collecting = gc.isenabled()
    gc.disable()
    return collecting


def _resume_collector(collecting: bool) -> None:
    """The collector left as :func:`_pause_collector` found it."""
    if collecting:
        gc.enable()


@contextlib.contextmanager
def _collector_paused() -> Any:
    """``_pause_collector`` / ``_resume_collector`` around a ``with`` block."""
    collecting = _pause_collector()
    try:
        yield
    finally:
        _resume_collector(collecting)


def _untraceable(args: tuple) -> str:
    """Passes the lens leaves alone, by kind ("" for a pass it traces): vmap'ed grads (``is_grads_batched``,
    "vmap"), ``torch.func`` transforms ("func"), and the autograd calls ``torch.compile`` makes on fake tensors
    while it compiles ("compile": not a pass of the user's program)."""
    grads = args[0] if args else None
    functorch = torch._C._functorch
    for grad in grads or ():
        if isinstance(grad, torch.Tensor) and (functorch.is_legacy_batchedtensor(grad) or functorch.is_batchedtensor(grad)):
            return "vmap"
    if torch._C._are_functorch_transforms_active():
        return "func"
    modes = torch._C._TorchDispatchModeKey
    if any(torch._C._get_dispatch_mode(key) is not None for key in (modes.FAKE, modes.PROXY, modes.FUNCTIONAL)):
        return "compile"
    if torch.compiler.is_compiling():
        return "compile"
    return "compiled" if compiled_autograd_on() else ""


def compiled_autograd_on() -> bool:
    """Compiled autograd will run a backward started now (``torch._dynamo.compiled_autograd._enable``, what
    ``torch._dynamo.config.compiled_autograd = True`` turns on around a compiled function): its module's flag, which
    its own ``_disable`` clears while the compiled graph runs (a backward inside a hook there runs on the usual
    engine).  Never imports the module: not imported, it was never turned on."""
    compiled = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled is not None and getattr(compiled, "compiled_autograd_enabled", False) is True \
        and not getattr(compiled, "compiled_autograd_enabled_force_eager", False)


class LeftAlone(Exception):
    """Raised while a pass is set up: the lens leaves it alone; its argument is the kind (a key of ``UNTRACED``)."""


def unfreed(shape: Any) -> Any:
    """``shape`` (the pass's ``structure.Structure``), or :class:`LeftAlone` raised when a leaf's memory was freed."""
    if freed_leaf(shape.leaves.values()):
        raise LeftAlone("freed")
    return shape


def freed_leaf(leaves: Any) -> bool:
    """A leaf of the graph (an ``AccumulateGrad``'s variable) whose memory was freed after the forward: its storage
    holds fewer bytes than its elements need (``fully_shard`` resizes an unsharded parameter's storage to 0 after the
    forward and gives it back in its pre-backward hook).  Reading such a tensor (or a tensor saved from it, or running
    a backward function on it) before that hook runs reads freed memory: the process can crash.  Looked at closely only
    where the data pointer is the null storage's (a storage resized to 0 bytes): a few calls per leaf otherwise.
    ``leaves``: the graph's ``AccumulateGrad`` nodes."""
    with torch._C.DisableTorchFunction():  # a subclass's __torch_function__ is not called
        for fn in leaves:
            try:
                variable = fn.variable
                if variable.data_ptr() != variable.storage_offset() * variable.element_size():
                    continue  # its storage has memory (the usual case: three calls); freed storage has none (null)
                if variable.layout != torch.strided or variable.numel() == 0:
                    continue
                needed = variable.storage_offset() + 1 + sum((size - 1) * stride for size, stride in
                                                             zip(variable.shape, variable.stride()))
                if variable.untyped_storage().nbytes() < needed * variable.element_size():
                    return True
            except Exception:  # no storage to read (a meta, nested or wrapper tensor): not memory that was freed
                continue
    return False


# what each kind of pass left alone is, in a note's words (see ``notes.MESSAGES["untraced_pass"]``)
UNTRACED = {
    "vmap": "torch.autograd.grad(..., is_grads_batched=True)",
    "func": "a torch.func transform (grad, vjp, jacrev, vmap, ...)",
    "thread": "another thread",
    "compiled": "compiled autograd (torch._dynamo.config.compiled_autograd)",
    "freed": "a graph whose parameters' memory was freed after the forward (FSDP's fully_shard resharding them)",
}
