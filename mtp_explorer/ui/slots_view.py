"""The Explorer's "slots" tab: several requests on the session's ``n_parallel`` sequences, as llama-server's slots.

An N slider (requests at once), ``n_max`` / ``p_min``, and Run: the requests stream on the session's sequences
(``Session.stream_parallel``) and the per-slot token timeline and the batch rows per step redraw as they go.
"Measure crossover" runs plain and speculative batches for N = 1, 2, 4, ... and draws aggregate tokens/s against N
with the batch size where speculation stops paying marked (:func:`~mtp_explorer.analysis.batch.measure_crossover`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import ipywidgets as W
import traitlets as T

from ..analysis.batch import PROFILE_PROMPTS, measure_crossover
from ..core import drafters
from ..core.parallel import ParallelStep, ParallelTrace, RequestInfo
from ..core.session import Session
from ..viz.parallel_figures import batch_rows, parallel_crossover, slot_timeline
from .controls import readable_error
from .figure_sync import figure_widget, size, sync_figure
from .live import LiveTrace, cached_piece

__all__ = ["LiveParallel", "SlotsView"]


class LiveParallel:
    """The :class:`~mtp_explorer.ParallelTrace` of a streaming parallel generation so far: a
    :class:`~mtp_explorer.ui.live.LiveTrace` per request, and where each runs."""

    def __init__(
        self,
        session: Session,
        n_requests: int,
        arrivals: Sequence[int] | None = None,
        drafter: str = drafters.DEFAULT_MODE,
    ) -> None:
        piece = cached_piece(session)
        self.n_parallel = session.n_parallel
        self.capacity = session.capacity
        self.arrivals = list(arrivals) if arrivals is not None else [0] * n_requests
        self.traces = [LiveTrace.of(session, piece=piece) for _ in range(n_requests)]
        self.slots = [-1] * n_requests
        self.admitted = [-1] * n_requests
        self.drafter = drafter

    def add(self, rows: Sequence[ParallelStep]) -> None:
        for row in rows:
            self.traces[row.seq].add(row.step)
            if self.admitted[row.seq] < 0:
                self.slots[row.seq], self.admitted[row.seq] = row.slot, row.step.batch_step

    def result(self) -> ParallelTrace:
        traces = [t.trace() for t in self.traces]
        infos = [
            RequestInfo(
                index=i,
                slot=self.slots[i],
                arrival=self.arrivals[i],
                admitted_step=self.admitted[i],
                finished_step=-1,
                n_prompt=0,
                t_prefill_ns=0,
            )
            for i in range(len(traces))
        ]
        return ParallelTrace(
            traces=traces,
            requests=infos,
            settings={"n_parallel": self.n_parallel, "capacity": self.capacity, "drafter": self.drafter},
        )


class SlotsView(W.VBox):
    """Run ``n_requests`` requests on ``n_parallel`` of the session's sequences and watch each slot; measure where
    speculation stops paying. ``run()`` and ``measure()`` are what the buttons call (in a background thread, an
    error then shown in ``status``); both return their result, or raise, when called directly."""

    n_requests = T.Int(2, min=1, help="requests at once (at most the session's n_parallel)")
    n_max = T.Int(3, min=0, help="draft length of every request")
    p_min = T.Float(0.0, min=0.0, max=1.0, help="draft confidence threshold of every request")
    max_tokens = T.Int(64, min=1, help="tokens per request")
    state = T.Enum(("idle", "running", "measuring"), default_value="idle", help="what the view is doing")
    status = T.Unicode("", help="the last run's or measurement's numbers, or its error")

    def __init__(
        self,
        session: Session,
        prompts: Sequence[str] = PROFILE_PROMPTS,
        *,
        width: int | None = None,
        redraw_seconds: float = 0.2,
    ) -> None:
        self.session = session
        self.prompts = list(prompts)
        self.width = width
        self.redraw_seconds = redraw_seconds
        N = session.n_parallel
        self.n_slider = W.IntSlider(min=1, max=N, value=min(2, N), description="requests")
        self.n_max_slider = W.IntSlider(min=0, max=session.capacity, value=3, description="n_max")
        self.p_min_slider = W.FloatSlider(min=0.0, max=1.0, step=0.05, value=0.0, description="p_min")
        self.run_button = W.Button(description="Run", tooltip="the requests at once on the session's sequences")
        self.measure_button = W.Button(
            description="Measure crossover", tooltip=f"plain and speculative batches of 1, 2, 4, ... {N} requests"
        )
        self.status_html = W.HTML()
        self.timeline, self.rows, self.crossover = figure_widget(), figure_widget(), figure_widget()
        super().__init__(
            [
                W.HBox([self.n_slider, self.n_max_slider, self.p_min_slider]),
                W.HBox([self.run_button, self.measure_button]),
                self.status_html,
                self.timeline,
                self.rows,
                self.crossover,
            ]
        )
        for widget, name in ((self.n_slider, "n_requests"), (self.n_max_slider, "n_max"), (self.p_min_slider, "p_min")):
            T.link((widget, "value"), (self, name))
        T.dlink((self, "status"), (self.status_html, "value"))
        self.run_button.on_click(lambda _b: self._background(self.run))
        self.measure_button.on_click(lambda _b: self._background(self.measure))
        self._thread: threading.Thread | None = None

    # -- actions ---------------------------------------------------------------------------------
    def run(self) -> ParallelTrace:
        """Stream ``n_requests`` requests (the prompts in turn), redrawing the slots at most every
        ``redraw_seconds``; the finished result at the end."""
        prompts = [self.prompts[i % len(self.prompts)] for i in range(self.n_requests)]
        live = LiveParallel(self.session, len(prompts))
        self.state = "running"
        try:
            last = 0.0
            for rows in self.session.stream_parallel(
                prompts, max_tokens=self.max_tokens, n_max=self.n_max, p_min=self.p_min if self.n_max else 0.0
            ):
                live.add(rows)
                if time.monotonic() - last >= self.redraw_seconds:
                    self.show(live.result())
                    last = time.monotonic()
            result = self.session.last_parallel_trace
            self.show(result)
            s = result.summary()
            self.status = (
                f"{s['n_requests']} requests on {s['n_parallel']} slots: {s['n_tokens']} tokens, "
                f"{s['decode_tokens_per_second']:.0f} tok/s aggregate, acceptance "
                f"{s['acceptance_rate']:.2f}, {s['mean_verify_rows']:.1f} rows per verify batch"
            )
            return result
        finally:
            self.state = "idle"

    def measure(self):
        """Plain and speculative (``n_max`` / ``p_min``) batches at N = 1, 2, 4, ... up to the session's
        ``n_parallel``: the crossover frame, drawn."""
        self.state = "measuring"
        try:
            df = measure_crossover(
                self.session,
                self.prompts,
                n_max=max(1, self.n_max),
                p_min=self.p_min,
                max_tokens=self.max_tokens,
                repeats=3,
                progress=lambda d, t: setattr(self, "status", f"measuring: {d} of {t} sizes"),
            )
            fig = parallel_crossover(df)
            size(fig, self.width)
            sync_figure(self.crossover, fig)
            c = df.attrs["crossover"]
            spread = float(df["speedup_spread"].max())
            self.status = (
                "speculation pays at every N measured"
                if c is None
                else f"speculation stops paying at N={c} on this machine"
            )
            if c is not None and df.attrs.get("crossover_within_spread"):
                self.status += " (its speedup's distance below 1 is within the runs' spread: not told apart)"
            self.status += f"; speedups' run-to-run spread up to {spread:.0%}"
            return df
        finally:
            self.state = "idle"

    def show(self, result: ParallelTrace) -> None:
        """Redraw the slot timeline and the batch rows of ``result``."""
        for widget, make in ((self.timeline, slot_timeline), (self.rows, batch_rows)):
            fig = make(result)
            size(fig, self.width)
            sync_figure(widget, fig)

    def wait(self, timeout: float | None = None) -> None:
        """Block until a button's background work is done."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _background(self, action) -> None:
        if self.state != "idle":
            return
        self._thread = threading.Thread(target=self._reporting, args=(action,), name="mtpx-slots", daemon=True)
        self._thread.start()

    def _reporting(self, action) -> None:
        """A button's action; its error, which has no caller to reach, goes to the status line."""
        try:
            action()
        except Exception as e:
            self.status = readable_error(e)
