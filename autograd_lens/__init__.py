"""autograd_lens: see PyTorch's autograd graph and step through the backward pass, hooks included.

In Jupyter::

    %load_ext autograd_lens
    %lens_graph out          # draw the graph behind `out`

    %%lens                   # run a cell and record every backward pass in it
    out.backward()

From Python::

    import autograd_lens as al
    al.graph(out)                      # a Graph that displays itself
    with al.Lens() as lens:
        out.backward()
    lens.passes[0].hook_calls
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compat import refuse as _refuse

# Below the declared torch or Python: one line (ImportError, or %load_ext's UsageError) and nothing else loaded.
_REFUSED = _refuse()
if _REFUSED is None:
    from .api import graph
    from .format import format_value
    from .model import BackwardPass, Edge, Graph, GradWritten, HookCall, Node, NodeRun, PassError, TensorSummary
    from .recipes import Recipe, RecipeError, hook
    from .views.render import GraphvizUnavailableError, RenderError, RenderTimeoutError

if TYPE_CHECKING:
    from .capture.tracer import Lens
    from .views.plots import plot
    from .views.stepper import Stepper

__version__ = "0.1.0"

__all__ = [
    "BackwardPass",
    "Edge",
    "Graph",
    "GradWritten",
    "GraphvizUnavailableError",
    "HookCall",
    "Lens",
    "Node",
    "NodeRun",
    "PassError",
    "Recipe",
    "RecipeError",
    "RenderError",
    "RenderTimeoutError",
    "TensorSummary",
    "format_value",
    "graph",
    "hook",
    "plot",
    "Stepper",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    if _REFUSED is not None:
        raise ImportError(_REFUSED)
    if name == "Lens":
        from .capture.tracer import Lens

        return Lens
    if name == "plot":
        from .views.plots import plot

        return plot
    if name == "Stepper":
        from .views.stepper import Stepper

        return Stepper
    raise AttributeError(f"module 'autograd_lens' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext autograd_lens``: register ``%lens_graph`` and ``%%lens``."""
    if _REFUSED is not None:
        from .compat import refused_in_ipython

        refused_in_ipython(_REFUSED)
    from .magics import load
    from .views.display import start_warm_up

    load(ipython)
    start_warm_up()  # the first picture's renderer and modules, loaded now (a picture cells later does not wait)


def unload_ipython_extension(ipython: Any) -> None:
    from .magics import unload

    unload(ipython)
