"""The Explorer: a JupyterLab widget that runs MTP speculative decoding and shows it live.

``Explorer(session)`` holds controls (prompt, drafter, ``n_max``, ``p_min``, ``n_min``, temperature, seed,
max tokens; Run / Step / Stop), a progress bar with tokens/s, an error area, and the figures of
:mod:`mtp_explorer.plots` as plotly ``FigureWidget``s. A generation streams in a background thread
(``Session.stream``); the views are redrawn from the trace so far at most about ten times per second.
Moving a slider during a run calls ``Session.set_params`` (it applies from the next step) and the
step-indexed figures mark the change. The drafter (:data:`DRAFTER_MODES`: ``mtp``, ``ngram`` or ``chain``,
``Session.stream(drafter=...)``) cannot change mid-generation: a new choice applies to the next Run or
Step, while the what-if prediction follows it at once. On a model without MTP layers it defaults to
``ngram``; a Run with ``mtp`` or ``chain`` there shows the session's ``MtpUnavailableError``. The plain
baseline (``n_max=0``) used for the speedup is run once per (prompt, max tokens, temperature, seed) and
cached.

The what-if mode (*Record oracle*, then a prediction on every slider or drafter move) is in
:mod:`mtp_explorer.whatif_panel`: its panel and the computations of its numbers and figures. The Explorer
holds its state (oracles cached per (prompt, max tokens), the current prediction) and wires it to the
controls; :class:`WhatIfPanel`, :func:`whatif_table` and :data:`WHATIF_NAMES` are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import math
import threading
import time
from typing import Callable, Iterator

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import traitlets as T

from . import plots
from .errors import MtpExplorerError, MtpUnavailableError, ParameterError
from .figure_sync import sync_figure
from .oracle import OracleTrace
from .session import Session
from .simulate import SimTrace, simulate
from .trace import DRAFTER_MODES, DRAFTERS, STOP_REASONS, Step, Trace
from .whatif_panel import (NO_ORACLE, WHATIF_NAMES, WhatIfPanel, measured_run, oracle_status,  # noqa: F401
                           speed_curve, whatif_figures, whatif_numbers, whatif_table)  # WHATIF_NAMES: re-exported

__all__ = ["Explorer", "LiveTrace", "RunRequest", "Controls", "ProgressView", "ErrorArea", "LiveViews",
           "WhatIfPanel"]

#: Least time between two redraws of the live views while a generation streams (about 10 per second).
MIN_REDRAW_INTERVAL = 0.1


# -- a running generation's trace ------------------------------------------------------------------
#: The per-step columns a live trace holds: those of the README's table, which the figures use.
LIVE_COLUMNS: tuple[str, ...] = (
    "step", "pos", "n_max", "p_min", "n_min", "drafted", "n_drafted", "n_accepted", "draft_prob", "topk_ids",
    "topk_probs", "target_tokens", "stop_reason", "correction", "rollback", "rs_slot", "h_norm_target",
    "h_norm_draft", "draft_target_cos", "t_catchup_ns", "t_draft_ns", "t_verify_ns", "t_sample_ns", "drafter",
)


class LiveTrace:
    """Collects the ``Step``s of a streaming generation and builds the :class:`Trace` so far, with the
    columns of :data:`LIVE_COLUMNS` (same padding and dtypes as a finished trace); ``t_prefill_ns`` is
    unknown until the end and ``finish_reason`` is ``"running"``."""

    def __init__(self, prompt: str, settings: dict, model: dict, depth: int, piece: Callable[[int], str]) -> None:
        self.prompt = prompt
        self.settings = settings
        self.model = model
        self.depth = depth
        self.piece = piece
        self.steps: list[Step] = []

    def add(self, step: Step) -> None:
        self.steps.append(step)

    def __len__(self) -> int:
        return len(self.steps)

    def columns(self) -> dict[str, np.ndarray]:
        steps, D = self.steps, self.depth
        n = len(steps)
        K = max((len(row) for s in steps for row in s.topk_ids), default=1)

        def scalar(name: str, dtype) -> np.ndarray:
            return np.array([getattr(s, name) for s in steps], dtype=dtype)

        def padded(name: str, width: int, dtype, fill) -> np.ndarray:
            out = np.full((n, width), fill, dtype=dtype)
            for i, s in enumerate(steps):
                v = getattr(s, name)[:width]
                out[i, : len(v)] = v
            return out

        topk_ids = np.full((n, D, K), -1, dtype=np.int32)
        topk_probs = np.full((n, D, K), np.nan, dtype=np.float32)
        for i, s in enumerate(steps):
            for j, (ids, ps) in enumerate(zip(s.topk_ids[:D], s.topk_probs[:D])):
                topk_ids[i, j, : len(ids)] = ids
                topk_probs[i, j, : len(ps)] = ps
        columns = {
            "step": scalar("step", np.int32), "pos": scalar("pos", np.int32),
            "n_max": scalar("n_max", np.int32), "p_min": scalar("p_min", np.float32),
            "n_min": scalar("n_min", np.int32),
            "drafted": padded("drafted", D, np.int32, -1),
            "n_drafted": np.array([s.n_drafted for s in steps], dtype=np.int32),
            "n_accepted": scalar("n_accepted", np.int32),
            "draft_prob": padded("draft_prob", D, np.float32, np.nan),
            "topk_ids": topk_ids, "topk_probs": topk_probs,
            "target_tokens": padded("target_tokens", D + 1, np.int32, -1),
            "stop_reason": np.array([STOP_REASONS.index(s.stop_reason) for s in steps], dtype=np.int8),
            "correction": scalar("correction", np.int32), "rollback": scalar("rollback", np.int32),
            "rs_slot": np.array([-1 if s.rs_slot is None else s.rs_slot for s in steps], dtype=np.int32),
            "h_norm_target": padded("h_norm_target", D + 1, np.float32, np.nan),
            "h_norm_draft": padded("h_norm_draft", D, np.float32, np.nan),
            "draft_target_cos": padded("draft_target_cos", D, np.float32, np.nan),
        }
        for phase in ("catchup", "draft", "verify", "sample"):
            columns[f"t_{phase}_ns"] = scalar(f"t_{phase}_ns", np.int64)
        columns["drafter"] = np.array([-1 if s.drafter is None else DRAFTERS.index(s.drafter) for s in steps],
                                      dtype=np.int8)
        return columns

    def trace(self) -> Trace:
        tokens = [t for s in self.steps for t in s.tokens]
        pieces = [self.piece(t) for t in tokens]
        return Trace(prompt=self.prompt, prompt_tokens=[], tokens=tokens, text="".join(pieces), pieces=pieces,
                     columns=self.columns(), finish_reason="running", settings=self.settings, model=self.model)


def _cached_piece(session: Session) -> Callable[[int], str]:
    cache: dict[int, str] = {}

    def piece(tok: int) -> str:
        tok = int(tok)
        if tok not in cache:
            cache[tok] = session.piece(tok)
        return cache[tok]

    return piece


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What one Run or Step generation is asked to do (read from the controls when it starts)."""

    prompt: str
    max_tokens: int
    n_max: int
    p_min: float
    n_min: int
    temperature: float
    seed: int
    drafter: str = "mtp"

    def stream_kwargs(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def baseline_key(self) -> tuple:
        """The plain baseline depends on these only (not on the drafting settings or the drafter)."""
        return (self.prompt, self.max_tokens, self.temperature, self.seed)

    @property
    def oracle_key(self) -> tuple:
        """An oracle (greedy, any drafting settings, the drafts of every drafter) depends on these only."""
        return (self.prompt, self.max_tokens)


def readable_error(exc: BaseException) -> str:
    """One message for the error area: the error's class and text, no traceback."""
    name = type(exc).__name__
    if isinstance(exc, MtpExplorerError):
        return f"{name}: {exc}"
    return f"{name} (unexpected): {exc}"


# -- parts of the widget ---------------------------------------------------------------------------
#: The drafter selector's tooltips, by option.
DRAFTER_TOOLTIPS: dict[str, str] = {
    "mtp": "the model's MTP head drafts",
    "ngram": "prompt look-up: the n-gram drafter (p_min does not apply: it has no confidence)",
    "chain": "both drafters asked every step; the draft with the highest expected accepted length is verified",
}
_NEXT_RUN = " · applies to the next Run (not to a running generation); the what-if prediction follows at once"


class Controls(W.VBox):
    """Prompt, drafter, drafting settings, sampling settings and the Run / Step / Stop buttons.

    ``drafter`` (options :data:`DRAFTER_MODES`) is read when a generation starts: the engine cannot change
    drafter mid-generation. ``has_mtp=False`` (a model without MTP layers) notes in the tooltips that
    ``mtp`` and ``chain`` are unavailable (a Run with them shows the session's error)."""

    def __init__(self, capacity: int, *, prompt: str, max_tokens: int, n_max: int, p_min: float, n_min: int,
                 temperature: float, seed: int, drafter: str = "mtp", has_mtp: bool = True) -> None:
        style = {"description_width": "90px"}
        self.prompt = W.Textarea(value=prompt, placeholder="prompt", description="prompt",
                                 layout=W.Layout(width="98%", height="60px"), style=style)
        if drafter not in DRAFTER_MODES:
            raise ParameterError(f"drafter must be one of {DRAFTER_MODES}, got {drafter!r}")
        unavailable = "" if has_mtp else " (unavailable: this model has no MTP layers)"
        self.drafter = W.ToggleButtons(
            options=DRAFTER_MODES, value=drafter, description="drafter", style=style | {"button_width": "80px"},
            tooltips=[DRAFTER_TOOLTIPS[d] + ("" if d == "ngram" else unavailable) + _NEXT_RUN
                      for d in DRAFTER_MODES])
        self.n_max = W.IntSlider(value=min(n_max, capacity), min=1, max=capacity, step=1, description="n_max",
                                 continuous_update=False, style=style)
        self.p_min = W.FloatSlider(value=p_min, min=0.0, max=1.0, step=0.01, description="p_min",
                                   readout_format=".2f", continuous_update=False, style=style)
        self.n_min = W.IntSlider(value=min(n_min, self.n_max.value), min=0, max=self.n_max.value, step=1,
                                 description="n_min", continuous_update=False, style=style)
        self.temperature = W.BoundedFloatText(value=temperature, min=0.0, max=5.0, step=0.1,
                                              description="temperature", style=style, layout=W.Layout(width="200px"))
        self.seed = W.BoundedIntText(value=seed, min=0, max=2**32 - 1, description="seed", style=style,
                                     layout=W.Layout(width="200px"))
        self.max_tokens = W.BoundedIntText(value=max_tokens, min=1, max=1_000_000, description="max tokens",
                                           style=style, layout=W.Layout(width="200px"))
        self.run = W.Button(description="Run", button_style="primary", icon="play", tooltip="generate to the end")
        self.step = W.Button(description="Step", icon="step-forward", tooltip="one verify step")
        self.stop = W.Button(description="Stop", button_style="danger", icon="stop", tooltip="cancel the generation",
                             disabled=True)
        T.dlink((self.n_max, "value"), (self.n_min, "max"))
        super().__init__([
            self.prompt,
            self.drafter,
            W.HBox([self.n_max, self.p_min, self.n_min]),
            W.HBox([self.temperature, self.seed, self.max_tokens]),
            W.HBox([self.run, self.step, self.stop]),
        ])

    def request(self) -> RunRequest:
        return RunRequest(prompt=self.prompt.value, max_tokens=int(self.max_tokens.value), n_max=int(self.n_max.value),
                          p_min=float(self.p_min.value), n_min=int(self.n_min.value),
                          temperature=float(self.temperature.value), seed=int(self.seed.value),
                          drafter=str(self.drafter.value))


class ProgressView(W.HBox):
    """Progress bar (tokens of max tokens) and a status line with steps and tokens/s."""

    def __init__(self) -> None:
        self.bar = W.IntProgress(value=0, min=0, max=1, description="tokens", bar_style="info")
        self.label = W.Label(value="idle")
        self.label.add_class("mtpx-status")
        super().__init__([self.bar, self.label])

    def show(self, n_tokens: int, max_tokens: int, n_steps: int, tps: float, state: str) -> None:
        self.bar.max = max(1, max_tokens)
        self.bar.value = min(n_tokens, self.bar.max)
        rate = "–" if math.isnan(tps) else f"{tps:.0f}"
        self.label.value = f"{state} · step {n_steps} · {n_tokens}/{max_tokens} tokens · {rate} tok/s"


class ErrorArea(W.HTML):
    """Shows an error as a readable message (empty when there is none)."""

    def show(self, message: str) -> None:
        if not message:
            self.value = ""
            return
        text = html.escape(message).replace("\n", "<br>")
        self.value = (f'<div class="mtpx-error" style="color:#b00020;background:#fdecea;border:1px solid #f5c2c7;'
                      f'padding:6px 10px;border-radius:4px;font-family:monospace;white-space:normal">{text}</div>')


NAMES: tuple[str, ...] = ("token_timeline", "acceptance_by_depth", "accepted_length_histogram", "hidden_norms",
                          "rs_slots", "throughput")


class LiveViews(W.VBox):
    """The figures of :mod:`mtp_explorer.plots`, as ``FigureWidget``s, redrawn from a trace."""

    HALF = ("acceptance_by_depth", "accepted_length_histogram")

    def __init__(self, piece: Callable[[int], str], width: int = 960) -> None:
        self.piece = piece
        self.width = width
        self.figures: dict[str, go.FigureWidget] = {name: go.FigureWidget() for name in NAMES}

        def box(name: str) -> W.Box:
            b = W.Box([self.figures[name]])
            b.add_class(f"mtpx-{name.replace('_', '-')}")
            return b

        super().__init__([
            box("token_timeline"),
            W.HBox([box(name) for name in self.HALF]),
            box("hidden_norms"), box("rs_slots"), box("throughput"),
        ])
        self._lock = threading.Lock()

    def build(self, trace: Trace, baseline: Trace | None,
              names: tuple[str, ...] = NAMES) -> dict[str, go.Figure]:
        """The figures ``names`` of ``trace`` (``throughput`` compares with ``baseline``)."""
        makers = {
            "token_timeline": lambda: plots.token_timeline(trace, self.piece),
            "acceptance_by_depth": lambda: plots.acceptance_by_depth(trace),
            "accepted_length_histogram": lambda: plots.accepted_length_histogram(trace),
            "hidden_norms": lambda: plots.hidden_norms(trace),
            "rs_slots": lambda: plots.rs_slots(trace),
            "throughput": lambda: plots.throughput(trace, baseline),
        }
        return {name: makers[name]() for name in names}

    def render(self, trace: Trace, baseline: Trace | None, names: tuple[str, ...] = NAMES) -> None:
        """Redraw the figures ``names`` from ``trace``, each in one batched update."""
        figs = self.build(trace, baseline, names)
        with self._lock:
            for name, fig in figs.items():
                # a fixed width: a FigureWidget cannot follow its container's width when it is first shown
                fig.update_layout(width=self.width // 2 if name in self.HALF else self.width)
                sync_figure(self.figures[name], fig)


# -- the Explorer ----------------------------------------------------------------------------------
class Explorer(W.VBox):
    """Run, step and tune MTP speculative decoding on ``session`` and watch it live.

    ``run()``, ``step()``, ``stop()`` and ``record_oracle()`` are what the buttons call; ``wait()`` blocks
    until the background work (a generation and its baseline, or an oracle recording) is done; ``width``
    is the figures' width in pixels. The state is in traitlets: ``state`` (idle / running / stepping /
    busy), ``trace`` (the latest trace, partial while streaming), ``baseline``, ``n_steps``, ``n_tokens``,
    ``tokens_per_second``, ``finish_reason``, ``error``; the drafter is ``controls.drafter.value``
    (``drafter=``: the initial choice, default ``mtp``, or ``ngram`` on a model without MTP layers). A
    generation keeps the drafter it started with; a new choice applies to the next Run or Step.

    What-if mode: ``oracle`` (the :class:`OracleTrace` of the controls' prompt and max tokens, or None;
    recorded ones are kept in ``oracles`` by (prompt, max tokens); it holds the drafts of every drafter,
    and can be recorded on a model without MTP layers with the ``ngram`` drafter selected),
    ``prediction`` (the :class:`SimTrace` of the sliders' setting and the selected drafter, redone on
    every slider or drafter move) and ``whatif`` (its numbers: ``drafter``, ``n_max``, ``p_min``,
    ``n_min``, ``acceptance_rate``, ``mean_accepted_length``, ``acceptance_by_depth``,
    ``tokens_per_second``, ``ceiling_tokens_per_second``, ``plain_tokens_per_second``, ``speedup``,
    ``note``, and ``measured``: the same numbers of the last greedy run of this prompt and max tokens
    with the selected drafter, with its ``drafter`` and ``n_max`` / ``p_min`` / ``n_min`` (None when it
    changed them mid-run), ``same_settings`` and ``tokens_per_second_ratio`` (measured / predicted, with
    the same settings), or None). ``predict()`` replays any setting; ``update_prediction()`` redraws the
    what-if panel.
    """

    state = T.Unicode("idle")
    trace = T.Any(None, allow_none=True)
    baseline = T.Any(None, allow_none=True)
    n_steps = T.Int(0)
    n_tokens = T.Int(0)
    tokens_per_second = T.Float(math.nan)
    finish_reason = T.Unicode("")
    error = T.Unicode("")
    oracle = T.Any(None, allow_none=True)
    prediction = T.Any(None, allow_none=True)
    whatif = T.Dict()

    def __init__(self, session: Session, *, prompt: str = "def fib(n):", max_tokens: int = 128, n_max: int = 3,
                 p_min: float = 0.0, n_min: int = 0, temperature: float = 0.0, seed: int = 0,
                 drafter: str | None = None, width: int = 960) -> None:
        self.session = session
        self.piece = _cached_piece(session)
        has_mtp = bool(session.info.has_mtp)
        if drafter is None:
            drafter = "mtp" if has_mtp else "ngram"
        self.controls = Controls(session.capacity, prompt=prompt, max_tokens=max_tokens, n_max=n_max, p_min=p_min,
                                 n_min=n_min, temperature=temperature, seed=seed, drafter=drafter,
                                 has_mtp=has_mtp)
        self.progress = ProgressView()
        self.error_area = ErrorArea()
        self.views = LiveViews(self.piece, width)
        self.whatif_panel = WhatIfPanel(width)
        self.baselines: dict[tuple, Trace] = {}
        self.oracles: dict[tuple, OracleTrace] = {}
        self._request: RunRequest | None = None
        self._live: LiveTrace | None = None
        self._stepper: Iterator[Step] | None = None
        self._thread: threading.Thread | None = None
        self._drafting = False          # the MTP generation (not the baseline) is in progress
        self._stop_requested = False
        self._interval = MIN_REDRAW_INTERVAL
        self._last_redraw = 0.0
        self._activity = ""             # what the status line says while an oracle is recorded
        self._whatif_lock = threading.Lock()
        self._whatif_error = ""         # the error the last prediction showed, cleared by the next one
        self._plain: tuple | None = None  # (oracle, drafter, predicted plain tokens/s)
        self._curve: tuple | None = None  # (oracle, (p_min, n_min, drafter), predicted tokens/s by n_max)
        info = session.info
        title = W.HTML(f"<b>mtp-explorer</b> · {html.escape(info.name)} ({info.arch}, "
                       f"{info.n_params / 1e6:.1f} M parameters) · n_max up to {session.capacity}"
                       + ("" if has_mtp else " · no MTP layers: n-gram drafting only"))
        super().__init__([title, self.controls, self.progress, self.error_area, self.whatif_panel, self.views])
        self.add_class("mtpx-explorer")
        self.controls.run.on_click(lambda _: self.run())
        self.controls.step.on_click(lambda _: self.step())
        self.controls.stop.on_click(lambda _: self.stop())
        self.whatif_panel.record.on_click(lambda _: self.record_oracle())
        for name in ("n_max", "p_min", "n_min"):
            getattr(self.controls, name).observe(functools.partial(self._on_setting, name), names="value")
        self.controls.drafter.observe(self._on_drafter, names="value")
        for name in ("prompt", "max_tokens", "temperature"):
            getattr(self.controls, name).observe(self._on_whatif_input, names="value")
        self.observe(self._on_oracle, names="oracle")
        self.observe(self._on_state, names="state")
        self.observe(lambda change: self.error_area.show(change["new"]), names="error")
        self.views.render(LiveTrace("", {}, info.to_dict(), session.capacity, self.piece).trace(), None)

    # -- actions (the buttons) -------------------------------------------------------------------
    def run(self) -> None:
        """Start a new generation with the controls' settings, streaming in a background thread."""
        if self.state in ("running", "busy"):
            return
        self._close_stepper()
        self._start(self.controls.request())
        self.state = "running"
        self._spawn(self._stream_all)

    def step(self) -> None:
        """Advance one verify step, starting a generation if none is being stepped."""
        if self.state in ("running", "busy"):
            return
        if self._stepper is None:
            self._start(self.controls.request())
            self._stepper = self.session.stream(**self._request.stream_kwargs())
        self.state = "busy"
        self._spawn(self._advance_one)

    def stop(self) -> None:
        """Cancel the generation within one step; the session stays usable."""
        self._stop_requested = True
        self.session.cancel()
        if self.state == "stepping":
            self.state = "busy"
            self._spawn(self._advance_one)

    def record_oracle(self) -> None:
        """Record the oracle of the controls' prompt and max tokens (greedy decoding, depth = the
        session's capacity, the drafts of every drafter) in a background thread; refused, with a
        message, at temperature > 0, or without MTP layers unless the ``ngram`` drafter is selected.
        From then on the sliders and the drafter selector predict at once."""
        if self.state in ("running", "busy"):
            return
        req = self.controls.request()
        refusal = self._oracle_refusal(req)
        if refusal is not None:
            self.error = readable_error(refusal)
            return
        self._close_stepper()
        self._stop_requested = False
        self.error = ""
        self._activity = f"recording oracle · {req.max_tokens} tokens, depth {self.session.capacity} …"
        self.whatif_panel.status.value = "<i>recording the oracle …</i>"
        self.state = "busy"
        self._spawn(functools.partial(self._record, req))

    def predict(self, n_max: int | None = None, p_min: float | None = None, n_min: int | None = None,
                drafter: str | None = None) -> SimTrace:
        """The oracle's replay of a setting (default: the sliders' and the drafter selector's): the
        accepted counts a greedy run would have, and the predicted timings."""
        if self.oracle is None:
            raise MtpExplorerError("no oracle for this prompt and max tokens: record one first")
        c = self.controls
        drafter = str(c.drafter.value) if drafter is None else drafter
        refusal = self._drafter_refusal(self.oracle, drafter)
        if refusal is not None:
            raise refusal
        return simulate(self.oracle, int(c.n_max.value) if n_max is None else n_max,
                        float(c.p_min.value) if p_min is None else p_min,
                        int(c.n_min.value) if n_min is None else n_min, drafter=drafter)

    def update_prediction(self) -> None:
        """Predict the sliders' setting and show it beside the measured run (an error goes to the error
        area); without an oracle, clear the what-if numbers."""
        with self._whatif_lock:
            if self.oracle is None:
                self.prediction = None
                self.whatif = {}
                self.whatif_panel.clear("<i>recording the oracle …</i>" if self._activity else NO_ORACLE)
                return
            refusal = self._drafter_refusal(self.oracle, str(self.controls.drafter.value))
            if refusal is not None:  # not an error: the oracle stays, for the drafters it can replay
                self.prediction = None
                self.whatif = {}
                self.whatif_panel.clear(f"<i>what-if: {html.escape(str(refusal))}</i>")
                return
            try:
                sim = self.predict()
                numbers, figs = self._whatif(sim)
            except Exception as exc:  # shown in the widget, never raised into the kernel
                self._whatif_error = self.error = readable_error(exc)
                return
            if self._whatif_error and self.error == self._whatif_error:
                self.error = ""
            self._whatif_error = ""
            self.prediction = sim
            self.whatif = numbers
            self.whatif_panel.show(oracle_status(self.oracle, numbers), whatif_table(numbers), figs)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background work (generation then baseline, or an oracle recording) is done;
        False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (thread := self._thread) is not None and thread.is_alive():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True

    @property
    def figures(self) -> dict[str, go.FigureWidget]:
        """The live figures by name (those of :mod:`mtp_explorer.plots`)."""
        return self.views.figures

    # -- callbacks ---------------------------------------------------------------------------------
    def _on_setting(self, name: str, change) -> None:
        if self._drafting:  # else it applies to the next Run
            try:
                self.session.set_params(**{name: change["new"]})
            except MtpExplorerError as exc:
                self.error = readable_error(exc)
        if self.oracle is not None:
            self.update_prediction()

    def _on_drafter(self, change) -> None:
        # a running generation keeps its drafter (Session.set_params cannot change it): the next Run
        # reads the selector; the prediction follows at once
        if self.oracle is not None:
            self.update_prediction()

    def _on_whatif_input(self, change) -> None:
        self._sync_oracle()

    def _on_oracle(self, change) -> None:
        self.update_prediction()

    def _on_state(self, change) -> None:
        busy = change["new"] in ("running", "busy")
        self.controls.run.disabled = busy
        self.controls.step.disabled = busy
        self.controls.stop.disabled = change["new"] == "idle"
        self.whatif_panel.record.disabled = busy
        self._show_progress()

    # -- background work -------------------------------------------------------------------------
    def _spawn(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name="mtp-explorer", daemon=True)
        self._thread.start()

    def _start(self, request: RunRequest) -> None:
        self._request = request
        self._stop_requested = False
        self._drafting = True
        self.error = ""
        self.finish_reason = ""
        self._live = LiveTrace(request.prompt, dataclasses.asdict(request), self.session.info.to_dict(),
                               self.session.capacity, self.piece)
        self.baseline = self.baselines.get(request.baseline_key)
        self._redraw(self._live.trace(), force=True)

    def _stream_all(self) -> None:
        try:
            before = self.session.last_trace
            for step in self.session.stream(**self._request.stream_kwargs()):
                self._live.add(step)
                self._redraw(None)
            self._finished(before)
        except Exception as exc:  # shown in the widget, never raised into the kernel
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
                self._live.add(step)
                if not self._stop_requested:
                    break
            self._redraw(None, force=True)
            self.state = "stepping"
        except Exception as exc:
            self._close_stepper()
            self._failed(exc)

    def _finished(self, before: Trace | None) -> None:
        """Show the final trace, then run the plain baseline if this prompt has none cached."""
        self._drafting = False
        final = self.session.last_trace
        if final is None or final is before:
            final = self._live.trace()
        self.finish_reason = final.finish_reason
        self._redraw(final, force=True)
        req = self._request
        if final.finish_reason != "cancelled" and req.baseline_key not in self.baselines:
            self.state = "running"
            base = self.session.generate(req.prompt, max_tokens=req.max_tokens, n_max=0,
                                         temperature=req.temperature, seed=req.seed)
            if base.finish_reason != "cancelled":
                self.baselines[req.baseline_key] = base
            self.baseline = self.baselines.get(req.baseline_key)
            if self.baseline is not None:
                self.views.render(final, self.baseline, names=("throughput",))
        if self.oracle is not None:
            self.update_prediction()  # the measured run beside the prediction
        self.state = "idle"

    def _failed(self, exc: BaseException) -> None:
        self._drafting = False
        self.error = readable_error(exc)
        if self.oracle is not None:
            self.update_prediction()
        self.state = "idle"

    def _close_stepper(self) -> None:
        if self._stepper is not None:
            self._stepper.close()
            self._stepper = None
        self._drafting = False

    def _record(self, req: RunRequest) -> None:
        """Record the oracle of ``req``'s prompt and max tokens and take it if the controls still ask
        for that prompt and max tokens."""
        failure, oracle = None, None
        try:
            oracle = self.session.record_oracle(req.prompt, req.max_tokens, depth=self.session.capacity)
        except Exception as exc:
            failure = exc
        cancelled = self._stop_requested  # Stop during the recording, even one the engine missed
        self._activity = ""
        if oracle is not None and not cancelled:
            self.oracles[req.oracle_key] = oracle
        self._sync_oracle()
        if failure is not None and not cancelled:
            self.error = readable_error(failure)
        if cancelled and self.oracle is None:
            self.whatif_panel.status.value = "<i>the oracle recording was cancelled</i>"
        self.state = "idle"

    def _oracle_refusal(self, req: RunRequest) -> MtpExplorerError | None:
        """Why no oracle can be recorded for ``req`` (None: it can)."""
        if req.temperature > 0:
            return ParameterError(f"the oracle records greedy decoding: set temperature to 0 to record one "
                                  f"(it is {req.temperature:g}); its predictions hold for greedy decoding only")
        info = self.session.info
        if not info.has_mtp and req.drafter != "ngram":
            return MtpUnavailableError(f"{info.name} has no MTP layers: the what-if mode can replay n-gram drafts "
                                       f"only; select the ngram drafter to record an oracle")
        return None

    @staticmethod
    def _drafter_refusal(oracle: OracleTrace, drafter: str) -> MtpExplorerError | None:
        """Why ``oracle`` cannot predict ``drafter`` (None: it can)."""
        if drafter != "ngram" and not oracle.has_mtp:
            return MtpUnavailableError(f"the oracle's model has no MTP layers: it predicts the ngram drafter only, "
                                       f"not {drafter}")
        return None

    def _sync_oracle(self) -> None:
        """Take the recorded oracle of the controls' prompt and max tokens (None: there is none)."""
        oracle = self.oracles.get(self.controls.request().oracle_key)
        if oracle is self.oracle:
            self.update_prediction()  # the note on the temperature, or the panel without an oracle
        else:
            self.oracle = oracle  # _on_oracle predicts

    # -- what-if numbers (computed by mtp_explorer.whatif_panel) ---------------------------------
    def _plain_tokens_per_second(self, oracle: OracleTrace, drafter: str) -> float:
        """Predicted plain decoding (``n_max=0``), cached for the last oracle and drafter."""
        if self._plain is None or self._plain[0] is not oracle or self._plain[1] != drafter:
            self._plain = (oracle, drafter, simulate(oracle, 0, drafter=drafter).predicted_tokens_per_second)
        return self._plain[2]

    def _speed_curve(self, oracle: OracleTrace, p_min: float, n_min: int, drafter: str) -> list[dict]:
        """:func:`speed_curve`, cached for the last oracle, ``p_min``, ``n_min`` and drafter."""
        key = (p_min, n_min, drafter)
        if self._curve is None or self._curve[0] is not oracle or self._curve[1] != key:
            self._curve = (oracle, key, speed_curve(oracle, p_min, n_min, drafter=drafter))
        return self._curve[2]

    def _whatif(self, sim: SimTrace) -> tuple[dict, dict[str, go.Figure]]:
        """The what-if numbers and figures of ``sim``, beside the current trace if it is a measured run
        of the oracle's prompt and max tokens with the prediction's drafter."""
        oracle, drafter = sim.oracle, sim.policy["drafter"]
        plain = self._plain_tokens_per_second(oracle, drafter)
        measured = measured_run(self.trace, oracle, drafter=drafter)
        baseline = None if measured is None else self.baselines.get(
            (measured.prompt, measured.settings.get("max_tokens"), measured.settings.get("temperature"),
             measured.settings.get("seed")))
        numbers = whatif_numbers(sim, plain_tokens_per_second=plain, measured=measured, baseline=baseline,
                                 temperature=float(self.controls.temperature.value))
        figs = whatif_figures(sim, numbers, measured_trace=measured,
                              curve=self._speed_curve(oracle, numbers["p_min"], numbers["n_min"], drafter))
        return numbers, figs

    # -- drawing -----------------------------------------------------------------------------------
    def _redraw(self, trace: Trace | None, force: bool = False) -> None:
        """Redraw from ``trace`` (None: the live trace so far), at most every ``_interval`` seconds
        unless forced."""
        if not force and time.monotonic() - self._last_redraw < self._interval:
            return
        trace = self._live.trace() if trace is None else trace
        self.trace = trace
        summary = trace.summary()
        self.n_steps, self.n_tokens = summary["n_steps"], summary["n_tokens"]
        self.tokens_per_second = summary["tokens_per_second"]
        self._show_progress()
        started = time.monotonic()
        self.views.render(trace, self.baseline)
        # about ten redraws a second, fewer when drawing is slow, so the generation is never starved
        self._interval = max(MIN_REDRAW_INTERVAL, 2 * (time.monotonic() - started))
        self._last_redraw = time.monotonic()

    def _show_progress(self) -> None:
        if self._activity:
            self.progress.label.value = self._activity
            return
        req = self._request
        state = self.finish_reason if self.state == "idle" and self.finish_reason else self.state
        self.progress.show(self.n_tokens, req.max_tokens if req else 0, self.n_steps, self.tokens_per_second, state)
