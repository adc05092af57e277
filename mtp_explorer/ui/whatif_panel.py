"""The what-if mode of the Explorer: its panel and the pure computations behind it.

*Record oracle* records the greedy generation of the prompt and max tokens once, with every drafter the session
can run asked at every position (:meth:`Session.record_oracle`). From then on every move of
``n_max`` / ``p_min`` / ``n_min`` or of the drafter selector (``draft-mtp``, ``ngram-simple``, …) replays the
setting on the oracle (:func:`mtp_explorer.analysis.simulate` with ``drafter=``, about a millisecond) and shows at
once the predicted acceptance, mean accepted length, tokens/s, the ceiling with every draft accepted and
the speedup over predicted plain decoding, beside the measured numbers of the last greedy Run of the same
prompt and max tokens with the same drafter; two figures show the predicted acceptance by depth and the
predicted tokens/s against ``n_max``. Under greedy decoding a Run with the same settings accepts exactly
the predicted counts; tokens/s come from the oracle's measured cost model. ``p_min`` does not apply to the
look-up drafters (they have no confidence): the note says so.

This module holds:

- :class:`WhatIfPanel`, the widget (Record oracle button, status line, numbers table, figures
  :data:`WHATIF_NAMES`), and :func:`whatif_table`, the numbers as HTML;
- :class:`WhatIf` (with :class:`MeasuredRun`), the typed numbers of a prediction;
- the computations, each from explicit inputs: :func:`measured_run` (which run counts as measured),
  :func:`whatif_numbers` (a :class:`WhatIf`), :func:`speed_curve`, :func:`whatif_figures` and
  :func:`oracle_status`.

The state (the oracles, the current prediction, the caches) is in
:class:`mtp_explorer.ui.whatif.WhatIfController`; :class:`mtp_explorer.widgets.Explorer` wires it to the controls.
What ``p_min`` means for a drafter, and whether it needs an MTP head, come from the drafter registry.
"""

from __future__ import annotations

import dataclasses
import html
import math
import threading

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from ..analysis.oracle import OracleTrace
from ..analysis.simulate import SimTrace, simulate
from ..core import drafters, metrics
from ..core.trace import Trace
from ..viz import whatif_figures as figures
from .figure_sync import size
from .schedule_view import ScheduleView
from .whatif_view import Frame, Key, WhatIfView

__all__ = [
    "WHATIF_NAMES",
    "NO_ORACLE",
    "MEASURE_REPEATS",
    "WhatIfPanel",
    "WhatIf",
    "MeasuredRun",
    "RepeatedRuns",
    "whatif_table",
    "measured_run",
    "whatif_numbers",
    "speed_curve",
    "whatif_figures",
    "oracle_status",
]

# -- the panel -------------------------------------------------------------------------------------
#: The what-if figures, by name (:attr:`WhatIfPanel.figures`).
WHATIF_NAMES: tuple[str, ...] = ("predicted_acceptance_by_depth", "predicted_speed_by_n_max")

#: How many runs (each beside a plain run) the Measure button makes of the controls' setting.
MEASURE_REPEATS = 5

#: The what-if table's row of tokens/s over the near-ties, and its hover text.
TIE_RANGE_LABEL = "tokens/s range (near-ties)"
TIE_RANGE_HOVER = (
    "Where the model's two likeliest next tokens are nearly tied, a real run may pick the other one "
    "(the top-2 margin is within the measured batch-shape tolerance) and follow another text: the "
    "range is the predicted tokens/s if those near-ties go either way."
)

NO_ORACLE = (
    "<i>what-if: no oracle for this prompt and max tokens. Record one (greedy, temperature 0), then "
    "move n_max / p_min / n_min or the drafter to see the predicted acceptance and speed at once.</i>"
)


# -- the numbers -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """The numbers of the measured run shown beside a prediction: the last finished greedy run of the
    oracle's prompt and max tokens with the predicted drafter (:func:`measured_run`)."""

    drafter: str
    n_max: int | None  #: its settings (None: they changed during the run)
    p_min: float | None
    n_min: int | None
    same_settings: bool  #: it ran with the predicted settings throughout
    acceptance_rate: float
    mean_accepted_length: float
    acceptance_by_depth: list[float]
    tokens_per_second: float
    speedup: float  #: over its plain baseline (NaN without one)
    plain_tokens_per_second: float
    tokens_per_second_ratio: float  #: measured / predicted tokens/s (NaN unless ``same_settings``)


@dataclasses.dataclass(frozen=True)
class RepeatedRuns:
    """A setting measured several times, each run beside a plain run (``sweep(mode="measure")``): the median
    tokens/s, its run-to-run spread ((max - min) / median), the plain median and the median paired speedup."""

    drafter: str
    n_max: int
    p_min: float
    n_min: int
    repeats: int
    tokens_per_second: float
    spread: float
    plain_tokens_per_second: float
    speedup: float

    @classmethod
    def from_row(cls, row: dict) -> RepeatedRuns:
        """From a measured sweep's row (:data:`~mtp_explorer.analysis.sweep.COLUMNS`)."""
        return cls(
            drafter=str(row["drafter"]),
            n_max=int(row["n_max"]),
            p_min=float(row["p_min"]),
            n_min=int(row["n_min"]),
            repeats=int(row["repeats"]),
            tokens_per_second=float(row["tokens_per_second"]),
            spread=float(row["tokens_per_second_spread"]),
            plain_tokens_per_second=float(row["plain_tokens_per_second"]),
            speedup=float(row["speedup"]),
        )

    def judge(self, predicted: float) -> str:
        """The prediction against these runs, in words: within their spread about the median, or how far outside."""
        off = predicted / self.tokens_per_second - 1.0
        half = self.spread / 2 if math.isfinite(self.spread) else 0.0
        where = "within" if abs(off) <= half else "outside"
        return (
            f"Measured {self.repeats} times, each beside a plain run: median {self.tokens_per_second:.0f} tokens/s, "
            f"run-to-run spread {self.spread:.1%}; the predicted {predicted:.0f} tokens/s is {off:+.1%} from the "
            f"median, {where} half that spread."
        )


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """The numbers of a prediction (:func:`whatif_numbers`): the drafter and setting replayed, the
    predicted acceptance and speed, and the measured run beside it (or None): what ``Explorer.whatif`` holds."""

    drafter: str
    n_max: int
    p_min: float
    n_min: int
    acceptance_rate: float
    mean_accepted_length: float
    acceptance_by_depth: list[float]
    tokens_per_second: float
    ceiling_tokens_per_second: float  #: with every draft accepted
    plain_tokens_per_second: float  #: predicted plain decoding (n_max = 0)
    speedup: float  #: predicted over plain
    measured: MeasuredRun | None
    note: str  #: what the measured column is, and caveats
    tokens_per_second_range: tuple[float, float]  #: if the uncertain positions' batch-shape ties flip
    uncertain_positions: list[int]  #: where a real run may leave the predicted text (SimTrace.uncertainty)
    tie_tolerance: float  #: the measured batch-shape tolerance they are judged by (NaN: not measured)
    repeated: RepeatedRuns | None = None  #: this setting measured several times (Measure), or None

    def as_dict(self) -> dict:
        """The numbers as a dict (``measured`` a dict too, or None)."""
        return dataclasses.asdict(self)


def _fmt(value, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _setting_text(n_max: int, p_min: float, n_min: int) -> str:
    return f"n_max={n_max}, p_min={p_min:.2f}, n_min={n_min}"


def whatif_table(numbers: WhatIf) -> str:
    """The what-if numbers as an HTML table: predicted, measured and their ratio, with a note on what the
    measured column is."""
    m = numbers.measured
    rows = (
        ("drafter", "drafter", "s", ""),
        ("acceptance rate", "acceptance_rate", ".3f", ""),
        ("mean accepted length (drafts per step)", "mean_accepted_length", ".2f", ""),
        ("tokens/s", "tokens_per_second", ".0f", ""),
        ("speedup vs plain", "speedup", ".2f", "×"),
        ("ceiling tokens/s (every draft accepted)", "ceiling_tokens_per_second", ".0f", ""),
        ("plain tokens/s", "plain_tokens_per_second", ".0f", ""),
    )
    ratio = m is not None and m.same_settings
    rep = numbers.repeated
    head = "<th></th><th>predicted</th>"
    if m is not None:
        head += "<th>measured</th>" + ("<th>measured / predicted</th>" if ratio else "")
    if rep is not None:
        head += f"<th>median of {rep.repeats} (spread)</th>"
    body = []
    if numbers.uncertain_positions:
        lo, hi = numbers.tokens_per_second_range
        rows = rows[:4] + ((TIE_RANGE_LABEL, "tokens_per_second_range", "range", ""),) + rows[4:]
    for label, key, spec, suffix in rows:
        if spec == "range":
            blank = "<td></td>" * ((m is not None) + ratio + (rep is not None))
            body.append(
                f'<tr><td title="{html.escape(TIE_RANGE_HOVER)}">'
                f'<span style="border-bottom:1px dotted;cursor:help">{label}</span></td>'
                f"<td>{_fmt(lo, '.0f')}–{_fmt(hi, '.0f')}</td>{blank}</tr>"
            )
            continue
        pred = getattr(numbers, key)
        cells = f"<td>{label}</td><td>{_fmt(pred, spec, suffix)}</td>"
        if m is not None:
            meas = getattr(m, key, None)
            cells += f"<td>{_fmt(meas, spec, suffix)}</td>"
            if ratio:
                if key == "drafter":
                    body.append(f"<tr>{cells}<td></td></tr>")
                    continue
                r = meas / pred if isinstance(meas, (int, float)) and pred and not math.isnan(pred) else None
                cells += f"<td>{_fmt(r, '.3f')}</td>"
        if rep is not None:
            value = {
                "tokens_per_second": f"{_fmt(rep.tokens_per_second, '.0f')} ({_fmt(rep.spread, '.1%')})",
                "speedup": _fmt(rep.speedup, ".2f", "×"),
                "plain_tokens_per_second": _fmt(rep.plain_tokens_per_second, ".0f"),
            }.get(key, "")
            cells += f"<td>{value}</td>"
        body.append(f"<tr>{cells}</tr>")
    style = 'style="border-collapse:collapse;font-size:13px" cellpadding="3"'
    table = f'<table class="mtpx-whatif-numbers" {style}><tr>{head}</tr>{"".join(body)}</table>'
    note = numbers.note
    hover = (
        ""
        if not numbers.uncertain_positions
        else (
            f' title="the technical terms: a target top-2 margin within the measured batch-shape tolerance '
            f'{numbers.tie_tolerance:.3g} (oracle.batch_shift)"'
        )
    )
    return table + (
        f'<div class="mtpx-whatif-note" style="font-size:12px;color:#555"{hover}>{html.escape(note)}</div>'
        if note
        else ""
    )


class WhatIfPanel(W.VBox):
    """The what-if mode's part of the Explorer: the Record oracle and Measure buttons, the schedules toggle and
    the :class:`~mtp_explorer.ui.whatif_view.WhatIfView` of the predictions: a status line and, once an oracle
    exists, the predicted numbers beside the measured run's and the figures :data:`WHATIF_NAMES`, prepared for every
    ``n_max`` (:meth:`show`)."""

    def __init__(self, width: int | None = None) -> None:
        self.width = width
        self.record = W.Button(
            description="Record oracle",
            icon="database",
            tooltip="record the greedy generation once; the sliders then predict at once",
            layout=W.Layout(width="150px", flex="none"),
        )
        self.measure = W.Button(
            description=f"Measure ×{MEASURE_REPEATS}",
            icon="tachometer",
            tooltip=f"run this setting {MEASURE_REPEATS} times, each beside a plain run: the median "
            "tokens/s and its spread, to judge the prediction by",
            layout=W.Layout(width="130px", flex="none"),
        )
        self.view = WhatIfView(message=NO_ORACLE)
        self.schedules = ScheduleView()
        self._header = W.HBox([self.record, self.measure, self.schedules.toggle])
        super().__init__([self._header, self.view, self.schedules])
        self.add_class("mtpx-whatif")
        self._lock = threading.Lock()

    @property
    def showing(self) -> bool:
        """Whether the numbers and figures of a prediction are shown."""
        return self.view.shown is not None

    @property
    def status(self) -> str:
        """The status line shown (HTML)."""
        return self.view.status

    @property
    def table(self) -> str:
        """The numbers table shown (HTML; empty without a prediction)."""
        return self.view.table

    def figure(self, name: str) -> go.Figure | None:
        """The figure ``name`` (of :data:`WHATIF_NAMES`) shown, or None."""
        return self.view.figure(WHATIF_NAMES.index(name))

    def frame(self, oracle: OracleTrace, numbers: WhatIf, figs: dict[str, go.Figure]) -> Frame:
        """The frame of a prediction: its status line, its ``numbers`` as a table and its figures ``figs``."""
        for fig in figs.values():
            size(fig, None if self.width is None else self.width // 2)
        return Frame.of(oracle_status(oracle, numbers), whatif_table(numbers), [figs[name] for name in WHATIF_NAMES])

    def show(self, key: Key, frames: dict[Key, Frame]) -> None:
        """Hold the prepared ``frames`` (by setting) and show the one of ``key``."""
        with self._lock:
            self.view.show(key, frames)

    def note(self, status: str) -> None:
        """Show ``status`` (HTML) as the status line, over the prediction's."""
        self.view.message = status

    def clear(self, status: str) -> None:
        """No prediction: the buttons and the ``status`` line (HTML) only."""
        with self._lock:
            self.view.clear(status)
            self.schedules.table.value = ""


# -- the computations ------------------------------------------------------------------------------
def measured_run(trace: Trace | None, oracle: OracleTrace, drafter: str = drafters.DEFAULT_MODE) -> Trace | None:
    """``trace`` if it is a finished greedy run with ``drafter`` (``settings["drafter"]``) of the oracle's
    prompt and max tokens, with the oracle's values of the drafter's options (e.g. the n-gram sizes), else None."""
    if trace is None or trace.finish_reason in ("running", "cancelled") or trace.n_steps == 0:
        return None
    s = trace.settings
    if (
        trace.prompt != oracle.prompt
        or s.get("max_tokens") != oracle.max_tokens
        or float(s.get("temperature", 0.0)) != 0.0
        or s.get("drafter", drafters.DEFAULT_MODE) != drafter
    ):
        return None
    if any(s.get(o.name) != oracle.settings.get(o.name) for o in drafters.mode(drafter).options):
        return None
    return trace


def _same_p_min(drafter: str, a: float, b: float) -> bool:
    """Whether two ``p_min`` behave alike: always for a drafter without confidence (``p_min`` does not apply)."""
    return not drafters.mode(drafter).has_confidence or np.float32(a) == np.float32(b)


def _measured_numbers(
    measured: Trace,
    baseline: Trace | None,
    *,
    drafter: str,
    n_max: int,
    p_min: float,
    n_min: int,
    predicted_tokens_per_second: float,
) -> tuple[MeasuredRun, tuple[int, float, int]]:
    """The numbers of the measured run, and the setting it started with."""
    c = measured.columns
    constant = len(metrics.settings_segments(measured)) == 1
    ms = measured.summary()
    m_n_max, m_p_min, m_n_min = int(c["n_max"][0]), float(c["p_min"][0]), int(c["n_min"][0])
    same = bool(constant and m_n_max == n_max and m_n_min == n_min and _same_p_min(drafter, m_p_min, p_min))
    tps = predicted_tokens_per_second
    return MeasuredRun(
        drafter=str(measured.settings.get("drafter", drafters.DEFAULT_MODE)),
        n_max=m_n_max if constant else None,
        p_min=round(m_p_min, 6) if constant else None,
        n_min=m_n_min if constant else None,
        same_settings=same,
        acceptance_rate=ms["acceptance_rate"],
        mean_accepted_length=ms["mean_accepted_length"],
        acceptance_by_depth=ms["acceptance_by_depth"][:n_max],
        tokens_per_second=ms["tokens_per_second"],
        speedup=metrics.trace_speedup(measured, baseline) if baseline is not None else math.nan,
        plain_tokens_per_second=baseline.summary()["tokens_per_second"] if baseline is not None else math.nan,
        tokens_per_second_ratio=ms["tokens_per_second"] / tps if same and tps else math.nan,
    ), (m_n_max, m_p_min, m_n_min)


def _uncertainty_note(u: dict) -> str:
    """What the uncertain positions of a prediction mean, in one sentence (empty: none)."""
    where = u["uncertain_positions"]
    if not where:
        return ""
    return (
        f"{len(where)} near-tie(s), the first at token {u['first_uncertain']}: there the model's two likeliest "
        "next tokens are so close that a verify batch of another size may pick the other one (their gap is "
        f"within the {u['tolerance']:.3g} this model's results move between batch sizes), and a real run would "
        "then follow another text; so tokens/s is given as a range too."
    )


def _notes(
    m: MeasuredRun | None,
    first: tuple[int, float, int] | None,
    *,
    drafter: str,
    n_max: int,
    p_min: float,
    n_min: int,
    temperature: float,
) -> str:
    notes = []
    if m is None:
        notes.append(
            f"No measured run of this prompt and max tokens at temperature 0 with the {drafter} drafter "
            "yet: Run puts its numbers beside the prediction."
        )
    elif m.same_settings:
        notes.append(f"Measured: the last Run, with these settings and the {drafter} drafter.")
    elif m.n_max is not None:
        notes.append(
            f"The measured run used {_setting_text(*first)}; "
            f"the prediction is for {_setting_text(n_max, p_min, n_min)}."
        )
    else:
        notes.append(f"The measured run changed its settings mid-run (it started with {_setting_text(*first)}).")
    if not drafters.mode(drafter).has_confidence:
        notes.append(f"p_min does not apply to the {drafter} drafter: it has no confidence.")
    if temperature > 0:
        notes.append(
            f"Predictions are for greedy decoding (temperature 0); the controls' temperature is {temperature:g}."
        )
    return " ".join(notes)


def whatif_numbers(
    sim: SimTrace,
    *,
    plain_tokens_per_second: float,
    measured: Trace | None,
    baseline: Trace | None,
    temperature: float,
    repeated: RepeatedRuns | None = None,
) -> WhatIf:
    """The what-if numbers of the prediction ``sim``.

    ``plain_tokens_per_second``: the oracle's predicted plain decoding speed (for the speedup);
    ``measured``: the run to show beside the prediction (:func:`measured_run`), or None; ``baseline``:
    that run's plain baseline, or None; ``temperature``: the controls' temperature (a note when > 0);
    ``repeated``: the setting measured several times (:class:`RepeatedRuns`), or None.
    ``drafter`` is the prediction's (``sim.policy["drafter"]``); for a drafter without confidence the note
    says that ``p_min`` does not apply, and a measured run counts as having the same settings whatever its
    ``p_min``.
    """
    pol = sim.policy
    drafter = str(pol.get("drafter", drafters.DEFAULT_MODE))
    n_max, p_min, n_min = int(pol["n_max"]), float(pol["p_min"]), int(pol["n_min"])
    s = sim.summary()
    plain, tps = plain_tokens_per_second, s["tokens_per_second"]
    m, first = (
        (None, None)
        if measured is None
        else _measured_numbers(
            measured, baseline, drafter=drafter, n_max=n_max, p_min=p_min, n_min=n_min, predicted_tokens_per_second=tps
        )
    )
    u = sim.uncertainty()
    note = _notes(m, first, drafter=drafter, n_max=n_max, p_min=p_min, n_min=n_min, temperature=temperature)
    return WhatIf(
        drafter=drafter,
        n_max=n_max,
        p_min=p_min,
        n_min=n_min,
        acceptance_rate=s["acceptance_rate"],
        mean_accepted_length=s["mean_accepted_length"],
        acceptance_by_depth=s["acceptance_by_depth"][:n_max],
        tokens_per_second=tps,
        ceiling_tokens_per_second=sim.ceiling_tokens_per_second(),
        plain_tokens_per_second=plain,
        speedup=tps / plain if plain else math.nan,
        measured=m,
        note=" ".join(filter(None, (note, _uncertainty_note(u), repeated.judge(tps) if repeated is not None else ""))),
        tokens_per_second_range=u["tokens_per_second_range"],
        uncertain_positions=u["uncertain_positions"],
        tie_tolerance=u["tolerance"],
        repeated=repeated,
    )


def speed_curve(oracle: OracleTrace, p_min: float, n_min: int, drafter: str = drafters.DEFAULT_MODE) -> list[dict]:
    """Predicted and ceiling tokens/s of ``drafter`` for every ``n_max`` the oracle covers (``n_min``
    capped by it), with the predicted tokens per step and milliseconds per step whose ratio they are."""
    rows = []
    for n in range(1, oracle.depth + 1):
        sim = simulate(oracle, n, p_min, min(n_min, n), drafter=drafter)
        s = sim.summary()
        rows.append(
            {
                "n_max": n,
                "tokens_per_second": sim.predicted_tokens_per_second,
                "ceiling_tokens_per_second": sim.ceiling_tokens_per_second(),
                "tokens_per_step": s["n_tokens"] / s["n_steps"] if s["n_steps"] else float("nan"),
                "ms_per_step": 1e3 * s["n_tokens"] / s["tokens_per_second"] / s["n_steps"]
                if s["n_steps"] and s["tokens_per_second"] > 0
                else float("nan"),
            }
        )
    return rows


def whatif_figures(
    sim: SimTrace, numbers: WhatIf, *, measured_trace: Trace | None, curve: list[dict]
) -> dict[str, go.Figure]:
    """The figures :data:`WHATIF_NAMES` of the prediction ``sim`` and its ``numbers`` (:func:`whatif_numbers`).

    ``measured_trace``: the run ``numbers.measured`` describes (its acceptance is drawn beside the
    prediction when it used the same settings); ``curve``: the :func:`speed_curve` of the oracle at the
    numbers' ``p_min``, ``n_min`` and drafter. The titles name the drafter.
    """
    n_max, p_min, n_min, drafter = numbers.n_max, numbers.p_min, numbers.n_min, numbers.drafter
    m = numbers.measured
    point = None
    if (
        m is not None
        and m.n_max is not None
        and _same_p_min(drafter, m.p_min, p_min)
        and m.n_min == min(n_min, m.n_max)
    ):
        point = {"n_max": m.n_max, "tokens_per_second": m.tokens_per_second}
    figs = {
        "predicted_acceptance_by_depth": figures.predicted_acceptance_by_depth(
            sim, measured_trace if m is not None and m.same_settings else None
        ),
        "predicted_speed_by_n_max": figures.predicted_speed_by_n_max(
            curve, n_max=n_max, plain=numbers.plain_tokens_per_second, p_min=p_min, n_min=n_min, measured=point
        ),
    }
    for fig in figs.values():
        fig.update_layout(title_text=f"{drafter} · {fig.layout.title.text}")
    return figs


def oracle_status(oracle: OracleTrace, numbers: WhatIf) -> str:
    """The panel's status line (HTML): the oracle and the drafter and setting ``numbers`` predict."""
    setting = _setting_text(numbers.n_max, numbers.p_min, numbers.n_min)
    drafter = html.escape(str(numbers.drafter))
    return (
        f"<b>what-if</b> · oracle: {oracle.n_positions} tokens of greedy decoding, depth {oracle.depth}, "
        f"recorded in {oracle.wall_seconds:.2f} s · predicting the {drafter} drafter, {setting}"
    )
