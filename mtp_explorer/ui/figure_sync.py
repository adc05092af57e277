"""Showing a plotly ``Figure`` in a ``FigureWidget``: :func:`sync_figure`."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["sync_figure"]


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
