"""Showing a plotly ``Figure`` in a ``FigureWidget``: :func:`sync_figure`; figure widgets that follow their container's
width: :func:`figure_widget`, :func:`size` and :func:`flexible`."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.io.json import to_json_plotly

__all__ = ["sync_figure", "changed_properties", "figure_widget", "size", "flexible", "full_width"]

#: plotly's config of the Explorer's figure widgets: the plot takes its container's width when it is drawn and
#: again when the window is resized (plotly's ``responsive``), where no fixed width is given.
RESPONSIVE = {"responsive": True, "displaylogo": False}


def figure_widget() -> go.FigureWidget:
    """An empty ``FigureWidget`` that follows its container's width (:data:`RESPONSIVE`)."""
    widget = go.FigureWidget()
    widget._config = dict(widget._config or {}, **RESPONSIVE)
    return widget


def size(fig: go.Figure, width: int | None) -> go.Figure:
    """``fig`` at ``width`` pixels, or (``None``) as wide as its container (plotly's ``autosize``)."""
    if width is None:
        fig.update_layout(autosize=True, width=None)
    else:
        fig.update_layout(width=width)
    return fig


def flexible(widget: W.Widget) -> W.Box:
    """``widget`` in a box that shares a row's width with its siblings (never wider than its share) and stretches
    ``widget`` to its own width (a column box: a plotly figure drawn in it takes that width)."""
    return W.VBox([widget], layout=W.Layout(flex="1 1 0", min_width="0"))


def full_width(widget: W.Widget) -> W.Box:
    """``widget`` stretched to the width of the box it is in (a column box: see :func:`flexible`)."""
    return W.VBox([widget], layout=W.Layout(width="100%"))


#: Trace properties a sync never clears when the new figure lacks them: plotly's own id of a widget's trace, and the
#: visibility a click on the legend sets in the browser (the user's choice outlives a slider move).
_KEPT = frozenset({"uid", "visible"})


def _json(value: Any) -> str:
    return to_json_plotly(value)


def changed_properties(old: dict, new: dict, clear: bool = True) -> dict:
    """The top-level properties of ``new`` whose values differ from ``old``'s and, where ``clear``, ``None`` for each
    property ``old`` has and ``new`` lacks (but those of :data:`_KEPT`): the update that turns ``old`` into ``new``."""
    out = {k: v for k, v in new.items() if k not in old or _json(old[k]) != _json(v)}
    if clear:
        out.update({k: None for k in old if k not in new and k not in _KEPT})
    return out


def sync_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Make ``widget`` show ``fig`` in one batched update that carries only what changed.

    Traces of the same kinds are updated property by property (a property ``fig`` lacks is cleared); traces of other
    kinds replace them. The layout's changed top-level properties are sent whole; annotations and shapes that
    ``fig`` lacks are removed; the template is sent once. A slider move that only moves a marker sends that marker.
    """
    layout = fig.layout.to_plotly_json()
    for key in ("annotations", "shapes"):
        layout.setdefault(key, [])
    shown = widget.layout.to_plotly_json()
    if widget.layout.template == fig.layout.template:
        layout.pop("template", None)
        shown.pop("template", None)
    with widget.batch_update():
        if [t.type for t in widget.data] == [t.type for t in fig.data]:
            for old, new in zip(widget.data, fig.data):
                update = changed_properties(old.to_plotly_json(), new.to_plotly_json())
                if update:
                    old.update(update, overwrite=True)
        else:
            widget.data = []
            widget.add_traces(list(fig.data))
        update = changed_properties(shown, layout, clear=False)  # what the browser sets (its ranges) stays
        if update:
            widget.update_layout(update, overwrite=True)
