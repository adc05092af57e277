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

import plotly.graph_objects as go
import traitlets as T

from ..analysis.oracle import OracleTrace
from ..analysis.simulate import SimTrace, simulate
from ..analysis.sweep import sweep
from ..core.drafters import DrafterMode
from ..core.errors import MtpExplorerError
from ..core.session import Session
from ..core.settings import DraftSettings, Limits
from ..core.trace import Trace
from .controls import RunRequest, readable_error, selected_mode
from .whatif_panel import (
    MEASURE_REPEATS,
    NO_ORACLE,
    RepeatedRuns,
    WhatIf,
    WhatIfPanel,
    measured_run,
    oracle_status,
    speed_curve,
    whatif_figures,
    whatif_numbers,
    whatif_table,
)

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
        self._curve: tuple | None = None  # (oracle, (p_min, n_min, drafter), predicted tokens/s by n_max)

    # -- oracles ---------------------------------------------------------------------------------
    def refusal(self, request: RunRequest) -> MtpExplorerError | None:
        """Why no oracle can be recorded for ``request`` on this session (None: it can)."""
        return oracle_refusal(request, self.session.limits)

    def begin_recording(self) -> None:
        self.recording = True
        self.panel.status.value = "<i>recording the oracle …</i>"

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
            self.panel.status.value = "<i>the oracle recording was cancelled</i>"

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
        self.repeated[self._repeated_key(request.oracle_key, row.drafter, row.n_max, row.p_min, row.n_min)] = row
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

    def refresh(self) -> None:
        """Predict the controls' setting and show it beside the measured run (an error is reported, the last
        prediction stays); without an oracle, or with a drafter it cannot replay, clear the numbers."""
        with self._lock:
            if self.oracle is None:
                self._clear("<i>recording the oracle …</i>" if self.recording else NO_ORACLE)
                return
            refusal = drafter_refusal(self.oracle, _choice(self._request()))
            if refusal is not None:  # not an error: the oracle stays, for the drafters it can replay
                self._clear(f"<i>what-if: {html.escape(str(refusal))}</i>")
                return
            try:
                sim = self.predict()
                numbers, measured = self._numbers(sim)
                # the numbers first: they are shown while the figures are built
                self.panel.show_numbers(oracle_status(self.oracle, numbers), whatif_table(numbers))
                figs = self._figures(sim, numbers, measured)
            except Exception as exc:  # shown in the widget, never raised into the kernel
                self._report(readable_error(exc), "whatif")
                return
            self._report("", "whatif")
            self.prediction = sim
            self.numbers = numbers
            self.panel.show_figures(figs)
        self.show_schedules()

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
        self.prediction = None
        self.numbers = None
        self.panel.clear(status)

    def _numbers(self, sim: SimTrace) -> tuple[WhatIf, Trace | None]:
        """The numbers of ``sim``, beside the latest trace if it is a measured run of the oracle's prompt and max
        tokens with the prediction's drafter (returned too, or None)."""
        oracle, drafter = sim.oracle, sim.policy["drafter"]
        measured = measured_run(self._trace(), oracle, drafter=drafter)
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
        req, pol = self._request(), sim.policy
        repeated = self.repeated.get(
            self._repeated_key(req.oracle_key, drafter, pol["n_max"], pol["p_min"], pol["n_min"])
        )
        numbers = whatif_numbers(
            sim,
            plain_tokens_per_second=self._plain_tokens_per_second(oracle, drafter),
            measured=measured,
            baseline=baseline,
            temperature=req.temperature,
            repeated=repeated,
        )
        return numbers, measured

    def _figures(self, sim: SimTrace, numbers: WhatIf, measured: Trace | None) -> dict[str, go.Figure]:
        """The what-if figures of ``sim`` and its ``numbers``, with the ``measured`` run where there is one."""
        return whatif_figures(
            sim,
            numbers,
            measured_trace=measured,
            curve=self._speed_curve(sim.oracle, numbers.p_min, numbers.n_min, sim.policy["drafter"]),
        )

    def _plain_tokens_per_second(self, oracle: OracleTrace, drafter: str) -> float:
        """Predicted plain decoding (``n_max=0``), cached for the last oracle and drafter."""
        if self._plain is None or self._plain[0] is not oracle or self._plain[1] != drafter:
            self._plain = (oracle, drafter, simulate(oracle, 0, drafter=drafter).predicted_tokens_per_second)
        return self._plain[2]

    def _speed_curve(self, oracle: OracleTrace, p_min: float, n_min: int, drafter: str) -> list[dict]:
        """:func:`~mtp_explorer.ui.whatif_panel.speed_curve`, cached for the last oracle, ``p_min``, ``n_min``
        and drafter."""
        key = (p_min, n_min, drafter)
        if self._curve is None or self._curve[0] is not oracle or self._curve[1] != key:
            self._curve = (oracle, key, speed_curve(oracle, p_min, n_min, drafter=drafter))
        return self._curve[2]
