"""The what-if panel's view of its predictions: :class:`WhatIfView`.

A prediction's status line, numbers table and figures are prepared in the kernel for every ``n_max`` the slider can
take (:class:`Frame`); the browser holds them and shows the frame of the slider's value as soon as it moves (``key``
is linked to the slider in the browser, :func:`link_key`), so that a move of ``n_max`` redraws the charts without a
round trip to the kernel. The kernel still follows the slider and fills in a frame the browser lacks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import anywidget
import ipywidgets as W
import plotly.graph_objects as go
import plotly.io as pio
import traitlets as T

from .figure_sync import RESPONSIVE

__all__ = ["Frame", "WhatIfView", "link_key"]

_PLOTLY_JS = Path(pio.__file__).resolve().parents[1] / "package_data" / "plotly.min.js"


@functools.cache
def _plotly_js() -> str:
    """plotly.js from plotly's package (the version its figures are made for)."""
    return _PLOTLY_JS.read_text(encoding="utf-8")


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
    """A status line, a table and a row of plotly charts, shown for the current ``key`` from ``frames`` (prepared
    per key); where ``frames`` has none for it the charts are folded away. A ``message`` (HTML), where there is one,
    is the status line."""

    # The module stays small: anywidget gives a model 2 s to load its module (the model's updates are dropped for
    # good after that), which a module with plotly.js inlined missed on a busy machine. plotly.js comes as a trait,
    # run by the view only where the page has no plotly.js yet.
    _esm = Path(__file__).with_name("whatif_view.js")
    _plotly_js = T.Unicode(help="plotly.js, run by the browser where the page has none").tag(sync=True)
    key = T.Int(0, help="the key whose frame is shown (the n_max slider's value)").tag(sync=True)
    frames = T.Dict(help="str(key) -> the frame's message (Frame.as_message)").tag(sync=True)
    message = T.Unicode("", help="HTML shown as the status line, where not empty").tag(sync=True)
    config = T.Dict(dict(RESPONSIVE), help="plotly's config of the charts").tag(sync=True)

    def __init__(self, **kwargs) -> None:
        super().__init__(_plotly_js=_plotly_js(), **kwargs)
        self.layout.width = "100%"

    def show(self, key: int, frames: dict[int, Frame]) -> None:
        """Hold ``frames`` (by key) and show the one of ``key``, with no message."""
        with self.hold_sync():
            self.frames = {str(k): f.as_message() for k, f in frames.items()}
            self.key = int(key)
            self.message = ""

    def clear(self, message: str) -> None:
        """No frames: ``message`` only."""
        with self.hold_sync():
            self.frames = {}
            self.message = message

    @property
    def shown(self) -> dict | None:
        """The frame shown now (its message), or None (``message`` is)."""
        return self.frames.get(str(self.key))

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


def link_key(slider: W.Widget, view: WhatIfView) -> W.Widget:
    """Make ``view.key`` follow ``slider``'s value in the browser (the kernel sets the key as well when it sees the
    move); returns the link."""
    return W.jsdlink((slider, "value"), (view, "key"))
