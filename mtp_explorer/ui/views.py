"""The Explorer's live views: a registry of figures (:data:`VIEWS`) and the widget that shows them
(:class:`LiveViews`).

A view is a name, a figure function of a trace and a layout width. The per-trace figures of
:mod:`mtp_explorer.plots` are registered here, in the order the Explorer stacks them; a new view is one
call, and every Explorer made after it shows it::

    from mtp_explorer.widgets import register_view

    @register_view(width="half")
    def drafted_per_step(trace):                 # any function of a Trace returning a plotly figure
        return go.Figure(go.Bar(y=trace.columns["n_drafted"]))

A figure function's first parameter gets the trace; parameters named ``baseline`` (the plain run, or None)
and ``piece`` (token id -> text) get those. ``width="half"`` views sit side by side, two to a row.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterable, Sequence

import ipywidgets as W
import plotly.graph_objects as go

from .. import plots
from ..core.errors import ParameterError
from ..core.trace import Trace
from .figure_sync import figure_widget, flexible, full_width, size, sync_figure

__all__ = ["View", "VIEWS", "WIDTHS", "register_view", "unregister_view", "LiveViews"]

#: The layout widths a view can take: the Explorer's full width, or half of it (two views to a row).
WIDTHS: tuple[str, ...] = ("full", "half")

#: The inputs besides the trace a figure function can ask for, by parameter name.
EXTRA_INPUTS: tuple[str, ...] = ("baseline", "piece")


@dataclasses.dataclass(frozen=True)
class View:
    """One live view: its ``name`` (the key of ``Explorer.figures`` and of the CSS class ``mtpx-<name>``),
    the ``figure`` function that draws it from a trace, its layout ``width`` (:data:`WIDTHS`) and the
    ``telemetry`` level its figure draws from (``"steps"``, or ``"full"`` for per-depth detail: top-k, target
    tokens past a rejection, hidden-state norms)."""

    name: str
    figure: Callable[..., go.Figure]
    width: str = "full"
    telemetry: str = "steps"

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ParameterError(f"a view's width is one of {WIDTHS}, got {self.width!r}")
        if self.telemetry not in ("steps", "full"):
            raise ParameterError(f"a view draws from telemetry 'steps' or 'full', got {self.telemetry!r}")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs besides the trace its figure function takes (of :data:`EXTRA_INPUTS`)."""
        params = list(inspect.signature(self.figure).parameters)[1:]
        return tuple(p for p in params if p in EXTRA_INPUTS)

    def draw(self, trace: Trace, baseline: Trace | None = None, piece: Callable[[int], str] | None = None) -> go.Figure:
        """The view's figure of ``trace``."""
        given = {"baseline": baseline, "piece": piece}
        return self.figure(trace, **{name: given[name] for name in self.inputs})

    @property
    def css_class(self) -> str:
        return f"mtpx-{self.name.replace('_', '-')}"


#: The registered views, by name, in the order the Explorer shows them.
VIEWS: dict[str, View] = {}


def register_view(
    figure: Callable[..., go.Figure] | None = None,
    *,
    name: str | None = None,
    width: str = "full",
    telemetry: str = "steps",
    replace: bool = False,
):
    """Register ``figure`` (a function of a trace returning a plotly figure) as a live view named ``name``
    (default: the function's name) that draws from ``telemetry`` (``"steps"`` or ``"full"``); usable as a
    decorator, with or without arguments. Returns the function. Registering a taken name is a ``ValueError``
    unless ``replace=True`` (which keeps its place)."""

    def add(fn: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
        view = View(name or fn.__name__, fn, width, telemetry)
        if view.name in VIEWS and not replace:
            raise ParameterError(f"a view named {view.name!r} is registered already (replace=True replaces it)")
        VIEWS[view.name] = view
        return fn

    return add if figure is None else add(figure)


def unregister_view(name: str) -> View:
    """Remove a registered view; returns it."""
    return VIEWS.pop(name)


# the per-trace figures of mtp_explorer.plots, in the Explorer's order
register_view(plots.token_timeline, telemetry="full")  # alternatives and the target's tokens past a rejection
register_view(plots.acceptance_by_depth, width="half")
register_view(plots.accepted_length_histogram, width="half")
register_view(plots.hidden_norms, telemetry="full")
register_view(plots.rs_slots)
register_view(plots.throughput)


def rows(views: Iterable[View]) -> list[list[View]]:
    """The views laid out in rows: a full-width view alone, half-width views two to a row."""
    out: list[list[View]] = []
    for view in views:
        if view.width == "half" and out and out[-1][-1].width == "half" and len(out[-1]) < 2:
            out[-1].append(view)
        else:
            out.append([view])
    return out


class LiveViews(W.VBox):
    """The registered views (:data:`VIEWS` when made, or ``views``: names or :class:`View` records) as plotly
    ``FigureWidget``s, as wide as the Explorer (``width=None``) or ``width`` pixels wide, redrawn from a trace."""

    def __init__(
        self, piece: Callable[[int], str], width: int | None = None, views: Sequence[str | View] | None = None
    ) -> None:
        self.piece = piece
        self.width = width
        chosen = list(VIEWS.values()) if views is None else [v if isinstance(v, View) else VIEWS[v] for v in views]
        self.views: dict[str, View] = {v.name: v for v in chosen}
        self.figures: dict[str, go.FigureWidget] = {name: figure_widget() for name in self.views}
        super().__init__([self._row(row) for row in rows(self.views.values())])
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        """The views shown, in order."""
        return tuple(self.views)

    @property
    def telemetry(self) -> str:
        """The telemetry level the views draw from: ``"full"`` if any of them needs it, else ``"steps"``."""
        return "full" if any(v.telemetry == "full" for v in self.views.values()) else "steps"

    @property
    def half(self) -> tuple[str, ...]:
        """The half-width views shown."""
        return tuple(name for name, view in self.views.items() if view.width == "half")

    def _box(self, view: View) -> W.Box:
        fig = self.figures[view.name]
        box = flexible(fig) if view.width == "half" else full_width(fig)
        box.add_class(view.css_class)
        return box

    def _row(self, row: list[View]) -> W.Box:
        if len(row) == 1 and row[0].width == "full":
            return self._box(row[0])
        return W.HBox([self._box(v) for v in row], layout=W.Layout(width="100%"))

    def build(self, trace: Trace, baseline: Trace | None, names: Iterable[str] | None = None) -> dict[str, go.Figure]:
        """The figures ``names`` (default: all) of ``trace``, those that take one comparing with ``baseline``."""
        names = self.names if names is None else tuple(names)
        return {name: self.views[name].draw(trace, baseline, self.piece) for name in names}

    def render(self, trace: Trace, baseline: Trace | None, names: Iterable[str] | None = None) -> None:
        """Redraw the figures ``names`` (default: all) from ``trace``, each in one batched update."""
        figs = self.build(trace, baseline, names)
        with self._lock:
            for name, fig in figs.items():
                half = self.views[name].width == "half"
                size(fig, None if self.width is None else self.width // 2 if half else self.width)
                sync_figure(self.figures[name], fig)
