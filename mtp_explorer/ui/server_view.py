"""The Explorer's "llama-server" tab: a watched server's figures (cumulative, and over time with the rates of the
last window), refreshed by a button or every chosen number of seconds."""

from __future__ import annotations

import html
import math
import threading

import ipywidgets as W
import traitlets as T

from ..server.monitor import STATES, ServerMonitor
from ..viz.server_figures import server_acceptance, server_rates
from .figure_sync import figure_widget, size, sync_figure

__all__ = ["ServerView"]


def status_text(monitor: ServerMonitor) -> str:
    """One line of HTML: the server's state and its figures (or why it is disconnected)."""
    s = monitor.summary()
    url = html.escape(monitor.url)
    if s["state"] == "disconnected":
        return (
            f"<b>{url}</b> · <span style='color:#d62728'>disconnected</span>: "
            f"{html.escape(monitor.readings[-1].error[:200])}"
        )
    if s["state"] == "unknown":
        return f"<b>{url}</b> · not read yet"
    fmt = lambda v, f: "–" if isinstance(v, float) and math.isnan(v) else format(v, f)  # noqa: E731
    return (
        f"<b>{url}</b> · connected · {s['drafts']} drafts verified, acceptance {fmt(s['acceptance_rate'], '.2f')}, "
        f"mean accepted length {fmt(s['mean_accepted_length'], '.2f')}, {fmt(s['tokens_per_second'], '.0f')} tok/s"
        f" · {s['requests']} requests sent here, {fmt(s['drafted_per_request'], '.1f')} drafted each"
    )


class ServerView(W.VBox):
    """A :class:`~mtp_explorer.server.ServerMonitor`'s status line and figures: ``figure`` (cumulative acceptance
    by draft position, the requests sent through the monitor) and ``rates_figure`` (tokens, drafted and accepted
    per second and the acceptance over time, titled with the rates of the last ``window`` seconds).
    ``refresh()`` polls once; ``watching = True`` polls every ``interval`` seconds in a background thread (a
    server that stops answering shows as disconnected, and the polling goes on)."""

    state = T.Enum(STATES, default_value=STATES[0], help="the monitor's state after the last refresh")
    interval = T.Float(2.0, min=0.2, help="seconds between two polls while watching")
    window = T.Float(60.0, min=1.0, help="seconds of polls the rates in the title of rates_figure cover")
    watching = T.Bool(False, help="poll every `interval` seconds in a background thread")

    def __init__(
        self, monitor: ServerMonitor | str, *, width: int | None = None, interval: float = 2.0, window: float = 60.0
    ) -> None:
        self.monitor = monitor if isinstance(monitor, ServerMonitor) else ServerMonitor(monitor)
        self.status = W.HTML()
        self.figure = figure_widget()
        self.rates_figure = figure_widget()
        self.width = width
        self.refresh_button = W.Button(description="Refresh", tooltip="read the server's /metrics now")
        self.watch_toggle = W.ToggleButton(description="Watch", tooltip="refresh every `every` seconds")
        self.interval_field = W.BoundedFloatText(
            value=interval, min=0.2, max=3600.0, step=0.5, description="every (s)", layout=W.Layout(width="160px")
        )
        self.window_field = W.BoundedFloatText(
            value=window, min=1.0, max=86400.0, step=10.0, description="window (s)", layout=W.Layout(width="170px")
        )
        super().__init__(
            [
                W.HBox([self.refresh_button, self.watch_toggle, self.interval_field, self.window_field]),
                self.status,
                self.figure,
                self.rates_figure,
            ]
        )
        T.link((self.interval_field, "value"), (self, "interval"))
        T.link((self.window_field, "value"), (self, "window"))
        self.interval, self.window = interval, window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refresh_button.on_click(lambda _b: self.refresh())
        T.link((self.watch_toggle, "value"), (self, "watching"))
        self.observe(self._on_watching, names="watching")
        self.observe(lambda _: self.show(), names="window")
        self.show()

    def show(self) -> None:
        """Redraw the status and the figure from the monitor's last readings (no request)."""
        for widget, fig in (
            (self.figure, server_acceptance(self.monitor)),
            (self.rates_figure, server_rates(self.monitor, self.window)),
        ):
            size(fig, self.width)
            sync_figure(widget, fig)
        self.status.value = status_text(self.monitor)
        self.state = self.monitor.state

    def refresh(self) -> None:
        """Poll the server once and redraw."""
        self.monitor.poll()
        self.show()

    def _on_watching(self, change) -> None:
        if change["new"] and (self._thread is None or not self._thread.is_alive()):
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="mtpx-server-watch", daemon=True)
            self._thread.start()
        elif not change["new"]:
            self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)

    def close(self) -> None:
        self.watching = False
        super().close()
