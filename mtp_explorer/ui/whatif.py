"""The what-if mode's state: :class:`WhatIfController`.

It keeps the recorded oracles (by prompt, max tokens and drafter options), the oracle of the controls' current
request, the prediction of the current setting and drafter (a :class:`~mtp_explorer.analysis.simulate.SimTrace`)
and its numbers (a :class:`~mtp_explorer.ui.whatif_panel.WhatIf`), and shows them in a
:class:`~mtp_explorer.ui.whatif_panel.WhatIfPanel`. Which drafters an oracle can replay, and which need an
MTP head, come from the drafter registry.
"""

from __future__ import annotations

import dataclasses
import html
import threading
from collections.abc import Callable, Mapping

import traitlets as T

from ..analysis.oracle import OracleTrace
from ..analysis.simulate import SimTrace, simulate
from ..analysis.sweep import sweep
from ..core import drafters
from ..core.drafters import DrafterMode
from ..core.errors import MtpExplorerError
from ..core.session import Session
from ..core.settings import DraftSettings, Limits
from ..core.trace import Trace
from .controls import P_MIN_STEP, RunRequest, readable_error, selected_mode
from .main_thread import MainThread
from .whatif_panel import (
    MEASURE_REPEATS,
    NO_ORACLE,
    RepeatedRuns,
    WhatIf,
    WhatIfPanel,
    measured_run,
    speed_curve,
    whatif_figures,
    whatif_numbers,
)
from .whatif_view import Frame, Key

__all__ = ["WhatIfController", "oracle_refusal", "drafter_refusal"]

#: ``report(message, source)``: show an error ('' clears the error ``source`` showed, if it still shows).
Report = Callable[[str, str], None]


def oracle_refusal(request: RunRequest, limits: Limits) -> MtpExplorerError | None:
    """Why no oracle can be recorded for ``request`` in a session with ``limits`` (None: it can): the oracle records
    greedy decoding, with the request's drafter available (the settings' own rules, whatever its ``n_max``)."""
    try:
        settings = request.settings
    except MtpExplorerError as exc:
        return exc
    oracle = dataclasses.replace(limits, where="the oracle", greedy=True)
    return settings.replace(n_max=min(1, limits.capacity), n_min=0).refusal(oracle)


def drafter_refusal(oracle: OracleTrace, drafter: str | DrafterMode) -> MtpExplorerError | None:
    """Why ``oracle`` cannot predict ``drafter`` (None: it can; a value that is no drafter choice: why)."""
    try:
        return DraftSettings(drafter=drafter, n_max=1, max_tokens=1).refusal(oracle.limits)
    except MtpExplorerError as exc:
        return exc


def _choice(request: RunRequest) -> str | DrafterMode:
    """The request's drafter with its chain policy (the value as typed where it is no choice: refused later)."""
    return selected_mode(request.drafter, request.chain_policy) or request.drafter


@dataclasses.dataclass(frozen=True, eq=False)
class _Context:
    """What a what-if frame depends on besides its setting (its :class:`Key`): the oracle, the controls' drafter
    and schedule, the measured run and its baseline, and how many settings were measured
    (:attr:`WhatIfController.repeated`)."""

    oracle: OracleTrace
    oracle_key: tuple
    drafter: str | DrafterMode
    schedule: object
    temperature: float
    measured: Trace | None
    baseline: Trace | None
    repeated: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Context):
            return NotImplemented
        same = ("oracle", "measured", "baseline")
        return all(getattr(self, f) is getattr(other, f) for f in same) and all(
            getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self) if f.name not in same
        )

    __hash__ = None  # type: ignore[assignment]


Prepared = tuple[SimTrace, WhatIf, Frame]


class PreparedFrames:
    r"""The what-if frames of one context (:class:`_Context`) by setting (:class:`Key`), and the background thread
    that prepares the missing ones of ``keys(context, shown())`` (the settings the sliders can move to next from the
    shown one), nearest first, and then has them ``send``\ ed on the main thread (``main``: widgets are changed from
    one thread only).

    Everything is done under ``lock`` (the controller's): ``prepare(context, key)`` makes one frame; the thread
    stops where the context is no longer ``current(context)`` or was replaced (it goes on with the new one); the
    send is skipped where the context changed before the main thread got to it (the change showed its own frame); a
    send that fails goes to ``report``."""

    def __init__(
        self,
        lock: threading.Lock,
        *,
        prepare: Callable[[_Context, Key], Prepared],
        keys: Callable[[_Context, Key], list[Key]],
        current: Callable[[_Context], bool],
        shown: Callable[[], Key],
        send: Callable[[Key, dict[Key, Frame]], None],
        main: MainThread,
        report: Callable[[Exception], None],
    ) -> None:
        self._lock = lock
        self._prepare, self._keys, self._current, self._shown = prepare, keys, current, shown
        self._send, self._main, self._report = send, main, report
        self._context: _Context | None = None
        self._frames: dict[Key, Prepared] = {}
        self._thread: threading.Thread | None = None
        self._running = False  # the thread prepares (set and cleared under the lock)

    def reset(self) -> None:
        """Forget every frame (the caller holds the lock)."""
        self._context, self._frames = None, {}

    def get(self, context: _Context, key: Key) -> Prepared:
        """The frame of ``key`` in ``context``, prepared now where it is not yet (the caller holds the lock)."""
        if context != self._context:
            self._context, self._frames = context, {}
        if key not in self._frames:
            self._frames[key] = self._prepare(context, key)
        return self._frames[key]

    def around(self, shown: Key) -> dict[Key, Frame]:
        """The prepared frames of ``shown`` and of the settings the sliders can move to from it (the caller holds the
        lock)."""
        if self._context is None:
            return {}
        wanted = [shown, *self._keys(self._context, shown)]
        return {k: self._frames[k][2] for k in wanted if k in self._frames}

    def keys(self) -> list[Key]:
        """The settings whose frames are prepared."""
        with self._lock:
            return sorted(self._frames)

    def start(self) -> None:
        """Prepare the missing frames in the background (the caller holds the lock)."""
        if self._running or self._context is None:
            return  # a running thread goes on with the newest context
        if all(k in self._frames for k in self._keys(self._context, self._shown())):
            return
        self._running = True
        self._thread = threading.Thread(target=self._run, name="mtpx-whatif-frames", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the thread (its send may still wait for the main thread: see :class:`MainThread`); False on
        timeout."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while self._next():
            pass

    def _next(self) -> bool:
        """Prepare the missing frame nearest to the shown key and return True; once none is missing, post their send
        to the main thread and return False (and stop where the context went or a frame fails: the kernel's refresh
        reports it, should the slider go there). ``_running`` is cleared under the lock on the way out."""
        more = flush = False
        with self._lock:
            context = self._context
            try:
                if context is not None and self._current(context):
                    shown = self._shown()
                    missing = sorted(
                        (k for k in self._keys(context, shown) if k not in self._frames),
                        key=lambda k: (_distance(k, shown), k),
                    )
                    if missing:
                        self._frames[missing[0]] = self._prepare(context, missing[0])
                        more = True
                    else:
                        flush = True
            except Exception:
                pass  # a frame that fails is made again, and its error shown, by the refresh of that setting
            finally:
                self._running = more
        if flush:
            self._main.post(lambda: self._flush(context))
        return more

    def _flush(self, context: _Context | None) -> None:
        """Send every frame of ``context`` with the shown key (on the main thread), unless the context went; a
        failure goes to ``report``."""
        with self._lock:
            if context is None or context != self._context or not self._current(context):
                return
            try:
                shown = self._shown()
                self._send(shown, self.around(shown))
            except Exception as exc:
                self._report(exc)


def _distance(key: Key, shown: Key) -> float:
    """How far the sliders move from ``shown`` to ``key`` (in slider steps)."""
    return abs(key.n_max - shown.n_max) + abs(key.p_min - shown.p_min) / P_MIN_STEP + abs(key.n_min - shown.n_min)


class WhatIfController(T.HasTraits):
    """Oracles, predictions and the what-if panel of one session.

    ``request()`` reads the controls (prompt, max tokens, drafter options: which oracle; the setting and
    drafter: what to predict), ``trace()`` the latest trace (a measured run to show beside the prediction),
    ``baselines`` the plain runs by :attr:`RunRequest.baseline_key`; errors go to ``report``.
    """

    oracle = T.Instance(
        OracleTrace,
        allow_none=True,
        help="the oracle of the controls' prompt, max tokens and drafter options (None: none recorded)",
    )
    prediction = T.Instance(
        SimTrace,
        allow_none=True,
        help="the oracle's replay of the controls' setting and drafter (None: nothing to predict)",
    )
    numbers = T.Instance(WhatIf, allow_none=True, help="the numbers of the prediction (None: no prediction)")

    def __init__(
        self,
        session: Session,
        panel: WhatIfPanel,
        *,
        request: Callable[[], RunRequest],
        trace: Callable[[], Trace | None],
        baselines: Mapping[tuple, Trace],
        report: Report,
    ) -> None:
        super().__init__()
        self.session = session
        self.panel = panel
        self._request, self._trace, self._baselines, self._report = request, trace, baselines, report
        panel.schedules.toggle.observe(lambda _: self.show_schedules(), names="value")
        self.oracles: dict[tuple, OracleTrace] = {}  #: recorded oracles by RunRequest.oracle_key
        #: settings measured several times (:meth:`measure`), by oracle key, drafter and setting
        self.repeated: dict[tuple, RepeatedRuns] = {}
        self.recording = False  #: an oracle recording is under way
        self._lock = threading.Lock()
        self._plain: tuple | None = None  # (oracle, drafter, predicted plain tokens/s)
        #: the frames shown and prepared, by setting, for the context they were made in
        self.frames = PreparedFrames(
            self._lock,
            prepare=self._prepare,
            keys=self._keys,
            current=lambda c: self.oracle is c.oracle,
            shown=lambda: self.panel.view.key,
            send=panel.show,
            main=MainThread(),
            report=lambda exc: self._report(readable_error(exc), "whatif"),
        )
        self._repeated_version = 0  # counts the additions to self.repeated
        self._curves: tuple[OracleTrace | None, dict[tuple, list[dict]]] = (None, {})  # speed curves of one oracle

    # -- oracles ---------------------------------------------------------------------------------
    def refusal(self, request: RunRequest) -> MtpExplorerError | None:
        """Why no oracle can be recorded for ``request`` on this session (None: it can)."""
        return oracle_refusal(request, self.session.limits)

    def begin_recording(self) -> None:
        self.recording = True
        self.panel.note("<i>recording the oracle …</i>")

    def record(self, request: RunRequest, cancelled: Callable[[], bool]) -> None:
        """Record the oracle of ``request`` (in the caller's thread) and take it if the controls still ask for
        its prompt, max tokens and drafter options; ``cancelled()`` tells whether Stop was pressed."""
        failure, oracle = None, None
        try:
            oracle = self.session.record_oracle(
                request.prompt, request.max_tokens, depth=self.session.capacity, **dict(request.options)
            )
        except Exception as exc:
            failure = exc
        stopped = cancelled()  # Stop during the recording, even one the engine missed
        self.recording = False
        if oracle is not None and not stopped:
            self.oracles[request.oracle_key] = oracle
        self.select()
        if failure is not None and not stopped:
            self._report(readable_error(failure), "record")
        if stopped and self.oracle is None:
            self.panel.note("<i>the oracle recording was cancelled</i>")

    def measure(self, request: RunRequest, cancelled: Callable[[], bool], repeats: int = MEASURE_REPEATS) -> None:
        """Measure the setting of ``request`` ``repeats`` times, each beside a plain run (``sweep(mode="measure")``,
        in the caller's thread; the ceiling priced with the oracle's cost model), and show the median and its
        spread beside the prediction; ``cancelled()`` tells whether Stop was pressed."""
        oracle = self.oracles.get(request.oracle_key)
        try:
            if oracle is None:
                raise MtpExplorerError(
                    "no oracle for this prompt and max tokens: record one first (its cost model "
                    "prices the ceiling beside the measured runs)"
                )
            drafter = _choice(request)
            frame = sweep(
                self.session,
                [request.prompt],
                n_max=[request.n_max],
                p_min=[request.p_min],
                n_min=request.n_min,
                mode="measure",
                max_tokens=request.max_tokens,
                drafter=drafter,
                cost=oracle.cost,
                repeats=repeats,
                progress=False,
                cancelled=cancelled,
                **dict(request.options),
            )
        except Exception as exc:
            if not cancelled():
                self._report(readable_error(exc), "measure")
            return
        if cancelled():
            return
        row = RepeatedRuns.from_row(frame.iloc[0].to_dict())
        with self._lock:
            self.repeated[self._repeated_key(request.oracle_key, row.drafter, row.n_max, row.p_min, row.n_min)] = row
            self._repeated_version += 1
        self.refresh()

    @staticmethod
    def _repeated_key(oracle_key: tuple, drafter: str, n_max: int, p_min: float, n_min: int) -> tuple:
        return (oracle_key, str(drafter), int(n_max), round(float(p_min), 6), int(n_min))

    def select(self) -> None:
        """Take the recorded oracle of the controls' request (None: there is none); predict with it."""
        oracle = self.oracles.get(self._request().oracle_key)
        if oracle is self.oracle:
            self.refresh()  # the note on the temperature, or the panel without an oracle
        else:
            self.oracle = oracle  # _oracle_changed predicts

    @T.observe("oracle")
    def _oracle_changed(self, change) -> None:
        self.refresh()

    # -- predictions -----------------------------------------------------------------------------
    def predict(
        self, n_max: int | None = None, p_min: float | None = None, n_min: int | None = None, drafter: str | None = None
    ) -> SimTrace:
        """The oracle's replay of a setting (default: the controls'): the accepted counts a greedy run would
        have, and the predicted timings."""
        if self.oracle is None:
            raise MtpExplorerError("no oracle for this prompt and max tokens: record one first")
        req = self._request()
        drafter = _choice(req) if drafter is None else drafter
        refusal = drafter_refusal(self.oracle, drafter)
        if refusal is not None:
            raise refusal
        return simulate(
            self.oracle,
            req.n_max if n_max is None else n_max,
            req.p_min if p_min is None else p_min,
            req.n_min if n_min is None else n_min,
            drafter=drafter,
            schedule=req.schedule,
        )

    def refresh(self, fresh: bool = False) -> None:
        """Predict the controls' setting and show it beside the measured run (an error is reported, the last
        prediction stays); without an oracle, or with a drafter it cannot replay, clear the numbers. The frames of
        the other ``n_max`` are then prepared in a background thread (:meth:`wait_prepared`), so that the browser
        shows a move of the ``n_max`` slider at once. A frame prepared before is reused unless ``fresh``."""
        with self._lock:
            if fresh:
                self.frames.reset()
            if self.oracle is None:
                self._clear("<i>recording the oracle …</i>" if self.recording else NO_ORACLE)
                return
            request = self._request()
            refusal = drafter_refusal(self.oracle, _choice(request))
            if refusal is not None:  # not an error: the oracle stays, for the drafters it can replay
                self._clear(f"<i>what-if: {html.escape(str(refusal))}</i>")
                return
            try:
                context = self._context(request)
                key = Key.of(request.n_max, request.p_min, request.n_min)
                sim, numbers, _ = self.frames.get(context, key)
                self.panel.show(key, self.frames.around(key))
            except Exception as exc:  # shown in the widget, never raised into the kernel
                self._report(readable_error(exc), "whatif")
                return
            self._report("", "whatif")
            self.prediction = sim
            self.numbers = numbers
            self.frames.start()
        self.show_schedules()

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Wait until the frames of every setting the sliders can move to from the current one are prepared (in a
        kernel their send then waits for the main thread to be free: after the running cell); False on timeout."""
        return self.frames.wait(timeout)

    @property
    def prepared(self) -> list[Key]:
        """The settings whose frames are prepared for the current prediction."""
        return self.frames.keys()

    def _keys(self, context: _Context, shown: Key) -> list[Key]:
        """The settings the sliders can move to from ``shown`` in one move: every ``n_max`` the oracle can replay,
        every ``p_min`` of the slider's steps (where the drafter has a confidence) and every ``n_min`` up to the
        ``n_max``; ``shown`` excluded."""
        top = min(self.session.capacity, context.oracle.depth)
        keys = [Key.of(n, shown.p_min, shown.n_min) for n in range(1, top + 1)]
        if drafters.mode(context.drafter).has_confidence:
            keys += [Key.of(shown.n_max, i * P_MIN_STEP, shown.n_min) for i in range(round(1 / P_MIN_STEP) + 1)]
        keys += [Key.of(shown.n_max, shown.p_min, m) for m in range(shown.n_max + 1)]
        return [k for k in dict.fromkeys(keys) if k != shown]

    def _context(self, request: RunRequest) -> _Context:
        """Everything a frame depends on but its setting."""
        drafter = _choice(request)
        oracle = self.oracle
        assert oracle is not None
        measured = measured_run(self._trace(), oracle, drafter=drafters.mode_name(drafter))
        baseline = (
            None
            if measured is None
            else self._baselines.get(
                (
                    measured.prompt,
                    measured.settings.get("max_tokens"),
                    measured.settings.get("temperature"),
                    measured.settings.get("seed"),
                )
            )
        )
        return _Context(
            oracle=oracle,
            oracle_key=request.oracle_key,
            drafter=drafter,
            schedule=request.schedule,
            temperature=request.temperature,
            measured=measured,
            baseline=baseline,
            repeated=self._repeated_version,
        )

    def _prepare(self, context: _Context, key: Key) -> Prepared:
        """The prediction of ``key`` in ``context``, its numbers and its frame (the caller holds the lock)."""
        oracle = context.oracle
        sim = simulate(oracle, key.n_max, key.p_min, key.n_min, drafter=context.drafter, schedule=context.schedule)
        drafter, pol = sim.policy["drafter"], sim.policy
        repeated = self.repeated.get(
            self._repeated_key(context.oracle_key, drafter, pol["n_max"], pol["p_min"], pol["n_min"])
        )
        numbers = whatif_numbers(
            sim,
            plain_tokens_per_second=self._plain_tokens_per_second(oracle, drafter),
            measured=context.measured,
            baseline=context.baseline,
            temperature=context.temperature,
            repeated=repeated,
        )
        figs = whatif_figures(
            sim,
            numbers,
            measured_trace=context.measured,
            curve=self._speed_curve(oracle, numbers.p_min, numbers.n_min, drafter),
        )
        return sim, numbers, self.panel.frame(oracle, numbers, figs)

    def show_schedules(self) -> None:
        """The panel's schedule comparison (shown while its toggle is on) for the current oracle and every recorded
        oracle the controls' drafter can replay, at the controls' ``p_min`` and ``n_min``."""
        req = self._request()
        drafter = _choice(req)
        recorded = [o for o in self.oracles.values() if drafter_refusal(o, drafter) is None]
        try:
            current = self.oracle if any(o is self.oracle for o in recorded) else None
            self.panel.schedules.show(current, recorded, req.p_min, req.n_min, drafter)
        except Exception as exc:  # shown in the widget, never raised into the kernel
            self._report(readable_error(exc), "whatif")

    def _clear(self, status: str) -> None:
        self.frames.reset()
        self.prediction = None
        self.numbers = None
        self.panel.clear(status)

    def _plain_tokens_per_second(self, oracle: OracleTrace, drafter: str) -> float:
        """Predicted plain decoding (``n_max=0``), cached for the last oracle and drafter."""
        if self._plain is None or self._plain[0] is not oracle or self._plain[1] != drafter:
            self._plain = (oracle, drafter, simulate(oracle, 0, drafter=drafter).predicted_tokens_per_second)
        return self._plain[2]

    def _speed_curve(self, oracle: OracleTrace, p_min: float, n_min: int, drafter: str) -> list[dict]:
        """:func:`~mtp_explorer.ui.whatif_panel.speed_curve`, cached by ``p_min``, ``n_min`` and drafter for the last
        oracle."""
        if self._curves[0] is not oracle:
            self._curves = (oracle, {})
        curves, key = self._curves[1], (p_min, n_min, drafter)
        if key not in curves:
            curves[key] = speed_curve(oracle, p_min, n_min, drafter=drafter)
        return curves[key]
