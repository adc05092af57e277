"""Generations of one session in a background thread: :class:`GenerationRunner`.

Run streams a whole generation, Step advances a suspended one by one verify step, Stop cancels within a
step; after a generation that was not cancelled, the plain baseline (``n_max=0``) of its prompt, max tokens,
temperature and seed is run once and cached. Other work on the session (an oracle recording) runs in the
same thread with :meth:`GenerationRunner.submit`. The runner holds no widgets: it reports through its traits
and the ``show`` / ``started`` / ``ended`` hooks, and never raises into the caller (errors go to ``ended``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import traitlets as T

from ..core.errors import MtpExplorerError
from ..core.session import Session
from ..core.trace import Step, Trace
from .controls import RunRequest
from .live import LiveTrace

__all__ = ["GenerationRunner", "STATES", "MIN_REDRAW_INTERVAL"]

#: What the runner is doing: ``idle``; ``running``: a Run streams, or a baseline runs after a
#: generation; ``stepping``: a Step generation waits for the next Step; ``busy``: a step or other
#: background work runs.
STATES: tuple[str, ...] = ("idle", "running", "stepping", "busy")

#: Least time between two redraws of the live views while a generation streams (about 10 per second).
MIN_REDRAW_INTERVAL = 0.1

Show = Callable[[Trace, "str | None"], None]


class GenerationRunner(T.HasTraits):
    """Runs generations of ``session`` in a background thread.

    Hooks: ``show(trace, changed)`` draws a trace (the live one so far, at most about every
    :data:`MIN_REDRAW_INTERVAL` seconds, more rarely when drawing is slow; then the final one) with
    ``changed=None``, and again with ``changed="baseline"`` when the plain baseline arrived after it (only
    what compares with the baseline needs a redraw); ``started()`` is called when a generation starts,
    ``ended(error)`` when it is over (``error``: the exception, or None), just before the state returns
    to idle.
    """

    state = T.Enum(STATES, default_value="idle", help="what the runner is doing (see STATES)")
    finish_reason = T.Unicode("", help="why the last generation ended ('' while one runs)")
    baseline = T.Instance(
        Trace, allow_none=True, help="the plain (n_max=0) run of the current generation's prompt, if there is one yet"
    )
    activity = T.Unicode("", help="what background work other than a generation is doing ('' when none)")

    def __init__(
        self,
        session: Session,
        piece: Callable[[int], str],
        *,
        show: Show,
        started: Callable[[], None] = lambda: None,
        ended: Callable[[BaseException | None], None] = lambda error: None,
    ) -> None:
        super().__init__()
        self.session = session
        self.piece = piece
        self._show, self._started, self._ended = show, started, ended
        self.baselines: dict[tuple, Trace] = {}  #: plain baselines by RunRequest.baseline_key
        self.request: RunRequest | None = None  #: the current (or last) generation's request
        self.live: LiveTrace | None = None  #: its trace so far
        self.drafting = False  #: a drafting generation (not its baseline) is under way
        self.stop_requested = False  #: Stop was pressed since the work started
        self._stepper: Iterator[Step] | None = None
        self._thread: threading.Thread | None = None
        self._interval = MIN_REDRAW_INTERVAL
        self._last_redraw = 0.0

    @property
    def busy(self) -> bool:
        """Whether a Run, a step or other background work is under way (a suspended Step generation is not)."""
        return self.state in ("running", "busy")

    # -- actions ---------------------------------------------------------------------------------
    def run(self, request: RunRequest) -> bool:
        """Start a new generation streaming in the background (one being stepped is closed first); False
        when busy."""
        if self.busy:
            return False
        self.close_stepper()
        if not self._start(request):
            return True
        self.state = "running"
        self._spawn(self._stream_all)
        return True

    def step(self, request: RunRequest) -> bool:
        """Advance one verify step, starting a generation of ``request`` if none is being stepped; False
        when busy."""
        if self.busy:
            return False
        if self._stepper is None:
            if not self._start(request):
                return True
            self._stepper = self.session.stream(**request.stream_kwargs())
        self.state = "busy"
        self._spawn(self._advance_one)
        return True

    def stop(self) -> None:
        """Cancel the generation (or the background work) within one step; the session stays usable."""
        self.stop_requested = True
        self.session.cancel()
        if self.state == "stepping":
            self.state = "busy"
            self._spawn(self._advance_one)

    def submit(self, work: Callable[[], None], activity: str) -> bool:
        """Run ``work`` (which uses the session) in the background thread, ``activity`` saying what it does;
        False when busy. ``work`` reads :attr:`stop_requested` to learn of a Stop."""
        if self.busy:
            return False
        self.close_stepper()
        self.stop_requested = False
        self.activity = activity
        self.state = "busy"
        self._spawn(lambda: self._background(work))
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background work is done; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (thread := self._thread) is not None and thread.is_alive():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True

    @property
    def thread(self) -> threading.Thread | None:
        """The background thread of the latest work."""
        return self._thread

    def close_stepper(self) -> None:
        """Abandon a generation being stepped."""
        if self._stepper is not None:
            self._stepper.close()
            self._stepper = None
        self.drafting = False

    # -- the background thread -------------------------------------------------------------------
    def _spawn(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name="mtp-explorer", daemon=True)
        self._thread.start()

    def _start(self, request: RunRequest) -> bool:
        """Take ``request`` and show its empty trace; False (the error reported): its settings are wrong."""
        try:
            settings = request.settings
        except MtpExplorerError as exc:
            self._failed(exc)
            return False
        self.request = request
        self.stop_requested = False
        self.drafting = True
        self._started()
        self.finish_reason = ""
        self.live = LiveTrace.of(self.session, request.prompt, settings.to_dict(), self.piece)
        self.baseline = self.baselines.get(request.baseline_key)
        self._redraw(self.live.trace(), force=True)
        return True

    def _stream_all(self) -> None:
        try:
            before = self.session.last_trace
            for step in self.session.stream(**self.request.stream_kwargs()):
                self.live.add(step)
                self._redraw(None)
            self._finished(before)
        except Exception as exc:  # reported, never raised into the kernel
            self._failed(exc)

    def _advance_one(self) -> None:
        try:
            before = self.session.last_trace
            while True:  # one step, or to the end once Stop was pressed
                try:
                    step = next(self._stepper)
                except StopIteration:
                    self._stepper = None
                    self._finished(before)
                    return
                self.live.add(step)
                if not self.stop_requested:
                    break
            self._redraw(None, force=True)
            self.state = "stepping"
        except Exception as exc:
            self.close_stepper()
            self._failed(exc)

    def _finished(self, before: Trace | None) -> None:
        """Show the final trace, then run the plain baseline if this request has none cached."""
        self.drafting = False
        final = self.session.last_trace
        if final is None or final is before:
            final = self.live.trace()
        self.finish_reason = final.finish_reason
        self._redraw(final, force=True)
        req = self.request
        if final.finish_reason != "cancelled" and req.baseline_key not in self.baselines:
            self.state = "running"
            base = self.session.generate(req.prompt, req.settings.replace(n_max=0, p_min=0.0))
            if base.finish_reason != "cancelled":
                self.baselines[req.baseline_key] = base
            self.baseline = self.baselines.get(req.baseline_key)
            if self.baseline is not None:
                self._show(final, "baseline")
        self._ended(None)
        self.state = "idle"

    def _failed(self, exc: BaseException) -> None:
        self.drafting = False
        self._ended(exc)
        self.state = "idle"

    def _background(self, work: Callable[[], None]) -> None:
        try:
            work()
        finally:
            self.activity = ""
            self.state = "idle"

    def _redraw(self, trace: Trace | None, force: bool = False) -> None:
        """Show ``trace`` (None: the live trace so far), at most every ``_interval`` seconds unless forced."""
        if not force and time.monotonic() - self._last_redraw < self._interval:
            return
        trace = self.live.trace() if trace is None else trace
        started = time.monotonic()
        self._show(trace, None)
        # about ten redraws a second, fewer when drawing is slow, so the generation is never starved
        self._interval = max(MIN_REDRAW_INTERVAL, 2 * (time.monotonic() - started))
        self._last_redraw = time.monotonic()
