"""How a :class:`~autograd_lens.capture.tracer.Lens` shows what it recorded: the methods of ``Lens`` that display,
step through, explain or write its passes.  Each imports its view when called, so recording imports no drawing code."""

from __future__ import annotations


class LensViews:
    """Mixed into ``Lens``: display, stepper, paths, why, plots and the static page of ``self.passes``."""

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..views.trace_display import lens_bundle

        return lens_bundle(self)

    def __repr__(self) -> str:
        from ..views.trace_display import lens_text

        return lens_text(self)

    def show(self, predict: bool = False) -> None:
        """Display the recorded passes (in Jupyter).  With ``predict=True`` the stepper asks for each
        gradient before it reveals it, and checks the answer against autograd's value."""
        from IPython.display import display

        if not isinstance(predict, bool):
            raise TypeError(f"predict must be True or False, not {predict!r}")
        if predict:
            from ..views.trace_display import PredictDisplay

            display(PredictDisplay(self))
        else:
            display(self)

    def stepper(self, predict: bool = False):
        """The stepper widget for these passes (``predict``: ask before revealing each gradient)."""
        from ..views.stepper import Stepper
        from ..views.trace_display import lens_text

        if not isinstance(predict, bool):
            raise TypeError(f"predict must be True or False, not {predict!r}")
        return Stepper(self.passes, text=lens_text(self), predict=predict)

    def paths_to(self, name: str, pass_index: int | None = None):
        """``name``'s gradient as a sum over the paths from the root (a :class:`~autograd_lens.debug.PathSet`),
        in the last pass whose graph has it (or pass ``pass_index``); recorded with ``Lens(why=True)``."""
        from ..debug import safe_paths_to

        return safe_paths_to(self._passes, name, pass_index)

    def why(self, name: str):
        """Where ``name``'s gradient stopped, where NaN or inf started, and which paths it took (what
        ``%%lens --why NAME`` shows): plain tables in Jupyter, text otherwise."""
        from ..debug.why import Why

        return Why(self, name)

    @property
    def plot(self):
        """``lens.plot()``: gradients with vs without hooks and hook call counts (a matplotlib figure);
        ``lens.plot.grad_flow()``, ``.timeline()``, ``.before_after()``, ``.with_without()``: one picture each."""
        from ..views.plots import Plots

        return Plots(self)

    def to_html(self, path: str | None = None, predict: bool = False) -> str:
        """A standalone HTML page of the recorded passes; written to ``path`` when given.  With
        ``predict=True`` it asks for each gradient before revealing it."""
        from ..views.static_html import lens_page

        page = lens_page(self, predict=bool(predict))
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page
