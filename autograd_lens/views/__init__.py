"""Model in, pictures out: DOT/SVG, HTML tables, the stepper, plots. Views never read torch's graph."""

from ..model import provide
from .display import graph_bundle, graph_text
from .dot import to_dot
from .render import render_graph

provide(to_dot=to_dot, render_graph=render_graph, graph_bundle=graph_bundle, graph_text=graph_text)
