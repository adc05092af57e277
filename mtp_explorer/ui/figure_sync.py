"""Showing a plotly ``Figure`` in a ``FigureWidget``: :func:`sync_figure`; figure widgets that follow their container's
width: :func:`figure_widget`, :func:`size` and :func:`flexible`."""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

__all__ = ["sync_figure", "figure_widget", "size", "flexible", "full_width"]

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


def sync_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Make ``widget`` show ``fig`` in one batched update (traces replaced when their kinds differ).

    Annotations and shapes are always sent whole, so the ones ``fig`` lacks are removed in the browser too;
    the template is sent once.
    """
    layout = fig.layout.to_plotly_json()
    with widget.batch_update():
        if [t.type for t in widget.data] == [t.type for t in fig.data]:
            for old, new in zip(widget.data, fig.data):
                old.update(new.to_plotly_json(), overwrite=True)
        else:
            widget.data = []
            widget.add_traces(list(fig.data))
        for key in ("annotations", "shapes"):
            widget.layout[key] = layout.pop(key, [])
        if widget.layout.template == fig.layout.template:
            layout.pop("template", None)
        widget.update_layout(layout, overwrite=True)
