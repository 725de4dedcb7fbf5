"""Errors a user can catch by type."""

from .views.render import GraphvizUnavailableError, RenderError, RenderTimeoutError

__all__ = ["GraphvizUnavailableError", "RenderError", "RenderTimeoutError"]
