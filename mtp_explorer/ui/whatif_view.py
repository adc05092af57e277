"""The what-if panel's view of its predictions: :class:`WhatIfView`.

A prediction's status line, numbers table and figures are prepared in the kernel for the settings the sliders can
move to next (:class:`Frame`, by :class:`Key`: every ``n_max``, every ``p_min`` of the slider's steps, every ``n_min``
around the shown setting); the browser holds them and shows the frame of the sliders' values as soon as one moves (the
view's ``n_max``, ``p_min`` and ``n_min`` are linked to the sliders in the browser, :func:`link_sliders`), so that a
move redraws the charts without a round trip to the kernel. The kernel still follows the sliders and fills in a frame
the browser lacks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import NamedTuple

import anywidget
import ipywidgets as W
import plotly.graph_objects as go
import plotly.io as pio
import traitlets as T

from .figure_sync import RESPONSIVE

__all__ = ["Frame", "Key", "WhatIfView", "link_sliders"]

_PLOTLY_JS = Path(pio.__file__).resolve().parents[1] / "package_data" / "plotly.min.js"


@functools.cache
def _plotly_js() -> str:
    """plotly.js from plotly's package (the version its figures are made for)."""
    return _PLOTLY_JS.read_text(encoding="utf-8")


class Key(NamedTuple):
    """The setting a frame shows (:meth:`of` makes one the way the browser does)."""

    n_max: int
    p_min: float
    n_min: int

    @classmethod
    def of(cls, n_max: int, p_min: float, n_min: int) -> Key:
        """The key of a setting: ``p_min`` to 4 decimals, ``n_min`` at most ``n_max`` (as the replay takes it)."""
        return cls(int(n_max), round(float(p_min), 4), min(int(n_min), int(n_max)))

    @property
    def text(self) -> str:
        """The key as the browser writes it (``whatif_view.js``: ``frameKey``)."""
        return f"{self.n_max}/{round(self.p_min * 10_000)}/{self.n_min}"


@dataclasses.dataclass(frozen=True)
class Frame:
    """What the view shows for one key: the status line and the table (HTML) and the figures (plotly JSON)."""

    status: str
    table: str
    figures: tuple[str, ...]

    @classmethod
    def of(cls, status: str, table: str, figures: list[go.Figure]) -> Frame:
        return cls(status, table, tuple(fig.to_json() for fig in figures))

    def as_message(self) -> dict:
        return {"status": self.status, "table": self.table, "figures": list(self.figures)}


class WhatIfView(anywidget.AnyWidget):
    """A status line, a table and a row of plotly charts, shown for the current setting (``n_max``, ``p_min``,
    ``n_min``: its :class:`Key`) from ``frames`` (prepared per key); where ``frames`` has none for it the charts are
    folded away. A ``message`` (HTML), where there is one, is the status line."""

    # The module stays small: anywidget gives a model 2 s to load its module (the model's updates are dropped for
    # good after that), which a module with plotly.js inlined missed on a busy machine. plotly.js comes as a trait,
    # run by the view only where the page has no plotly.js yet.
    _esm = Path(__file__).with_name("whatif_view.js")
    _plotly_js = T.Unicode(help="plotly.js, run by the browser where the page has none").tag(sync=True)
    n_max = T.Int(0, help="the n_max of the frame shown (the n_max slider's value)").tag(sync=True)
    p_min = T.Float(0.0, help="the p_min of the frame shown (the p_min slider's value)").tag(sync=True)
    n_min = T.Int(0, help="the n_min of the frame shown (the n_min slider's value)").tag(sync=True)
    frames = T.Dict(help="Key.text -> the frame's message (Frame.as_message)").tag(sync=True)
    message = T.Unicode("", help="HTML shown as the status line, where not empty").tag(sync=True)
    config = T.Dict(dict(RESPONSIVE), help="plotly's config of the charts").tag(sync=True)

    def __init__(self, **kwargs) -> None:
        super().__init__(_plotly_js=_plotly_js(), **kwargs)
        self.layout.width = "100%"

    @property
    def key(self) -> Key:
        """The key of the setting shown."""
        return Key.of(self.n_max, self.p_min, self.n_min)

    def show(self, key: Key, frames: dict[Key, Frame]) -> None:
        """Hold ``frames`` (by key) and show the one of ``key``, with no message."""
        with self.hold_sync():
            self.frames = {k.text: f.as_message() for k, f in frames.items()}
            self.n_max, self.p_min, self.n_min = key
            self.message = ""

    def clear(self, message: str) -> None:
        """No frames: ``message`` only."""
        with self.hold_sync():
            self.frames = {}
            self.message = message

    @property
    def shown(self) -> dict | None:
        """The frame shown now (its message), or None (``message`` is)."""
        return self.frames.get(self.key.text)

    @property
    def status(self) -> str:
        """The status line shown now (HTML): ``message``, else the frame's."""
        frame = self.shown
        return self.message or ("" if frame is None else frame["status"])

    @property
    def table(self) -> str:
        """The table shown now (HTML; empty without a frame)."""
        frame = self.shown
        return "" if frame is None else frame["table"]

    def figure(self, index: int) -> go.Figure | None:
        """The ``index``-th figure shown now (None without a frame)."""
        frame = self.shown
        return None if frame is None else go.Figure(json.loads(frame["figures"][index]))


def link_sliders(sliders: dict[str, W.Widget], view: WhatIfView) -> list[W.Widget]:
    """Make ``view``'s ``n_max``, ``p_min`` and ``n_min`` follow the sliders of those names in the browser (the kernel
    sets them as well when it sees the move); returns the links."""
    return [W.jsdlink((sliders[name], "value"), (view, name)) for name in ("n_max", "p_min", "n_min")]
