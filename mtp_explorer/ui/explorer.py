"""The Explorer: a JupyterLab widget that runs MTP speculative decoding and shows it live.

``Explorer(session)`` holds controls (prompt, drafter and its options, ``n_max``, ``p_min``, ``n_min``,
temperature, seed, max tokens; Run / Step / Stop), a progress bar with tokens/s, an error area, the what-if
panel and the live views (the registered figures of :mod:`mtp_explorer.ui.views`, plotly ``FigureWidget``s).
It wires three parts to these views:

- a :class:`~mtp_explorer.ui.runner.GenerationRunner` streams a generation in a background thread
  (``Session.stream``), redrawing the views from the trace so far at most about ten times per second, and
  runs the plain baseline (``n_max=0``, for the speedup) once per (prompt, max tokens, temperature, seed);
- a :class:`~mtp_explorer.ui.whatif.WhatIfController` records oracles and predicts every setting at once;
- the :class:`~mtp_explorer.ui.views.LiveViews` draw the views.

Moving a slider during a run calls ``Session.set_params`` (it applies from the next step) and the step-indexed
figures mark the change. The drafter (llama.cpp's ``--spec-type``: a listed value or a typed chain, with its chain
policy) and its options cannot change mid-generation: a new choice
applies to the next Run or Step, while the what-if prediction follows it at once. A model without MTP layers
starts with a drafter that needs none (:func:`~mtp_explorer.core.drafters.default_mode`); a Run with one that
needs MTP shows the session's ``MtpUnavailableError``.

``Explorer(session, server="http://host:8080")`` (or a :class:`~mtp_explorer.server.ServerMonitor`) adds a
"llama-server" tab (:class:`~mtp_explorer.ui.server_view.ServerView`) watching a running llama-server; a session
opened with ``n_parallel`` > 1 adds a "slots" tab (:class:`~mtp_explorer.ui.slots_view.SlotsView`).
"""

from __future__ import annotations

import functools
import html
import math

import ipywidgets as W
import plotly.graph_objects as go
import traitlets as T

from ..analysis.oracle import OracleTrace
from ..analysis.simulate import SimTrace
from ..core import drafters
from ..core.errors import MtpExplorerError
from ..core.session import Session
from ..core.trace import Trace
from ..models import demo_prompt_within
from .controls import Controls, ErrorArea, ProgressView, readable_error
from .live import LiveTrace, cached_piece
from .runner import STATES, GenerationRunner
from .server_view import ServerMonitor, ServerView
from .slots_view import SlotsView
from .views import LiveViews, View
from .whatif import WhatIfController
from .whatif_panel import MEASURE_REPEATS, WhatIf, WhatIfPanel
from .whatif_view import link_sliders

__all__ = ["Explorer"]


def _children(title: W.Widget, parts: list[W.Widget], tabs: dict[str, W.Widget | None]) -> list[W.Widget]:
    """The Explorer's children: its title and parts, and the other views (the slots of a session with several
    sequences, a watched llama-server) in tabs beside them."""
    tabs = {name: view for name, view in tabs.items() if view is not None}
    if not tabs:
        return [title, *parts]
    tab = W.Tab([W.VBox(parts), *tabs.values()])
    for i, name in enumerate(["this session", *tabs]):
        tab.set_title(i, name)
    return [title, tab]


class Explorer(W.VBox):
    """Run, step and tune speculative decoding on ``session`` and watch it live.

    ``run()``, ``step()``, ``stop()`` and ``record_oracle()`` are what the buttons call; ``wait()`` blocks
    until the background work (a generation and its baseline, or an oracle recording) is done; ``predict()``
    replays any setting on the oracle. ``drafter=``: the initial drafter (default: MTP, or a drafter that needs
    no MTP head on a model without one); ``options``: the drafters' options (``ngram_simple_size_n=``, ...);
    ``width``: the figures' width in pixels (default: they follow the Explorer's width); ``views``: the views to show
    (default: all; they set the session's telemetry). The state is in the traitlets below; the parts are
    ``controls``, ``progress``, ``error_area``, ``whatif_panel``, ``views``, and ``runner`` / ``whatif_controller``.
    """

    state = T.Enum(
        STATES,
        default_value="idle",
        help="idle; running: a Run streams, or its plain baseline runs; stepping: a Step generation "
        "waits for the next Step; busy: a step or an oracle recording is under way",
    )
    trace = T.Instance(Trace, allow_none=True, help="the latest trace (partial while a generation streams)")
    baseline = T.Instance(
        Trace, allow_none=True, help="the plain (n_max=0) run of the current prompt, max tokens, temperature and seed"
    )
    n_steps = T.Int(0, help="verify steps of the latest trace")
    n_tokens = T.Int(0, help="tokens generated in the latest trace")
    tokens_per_second = T.Float(math.nan, help="decode tokens/s of the latest trace (NaN before any step)")
    finish_reason = T.Unicode(
        "", help="why the last generation ended (budget, eos, context, cancelled; '' while one runs)"
    )
    error = T.Unicode("", help="the last error, as the error area shows it ('' when none)")
    oracle = T.Instance(
        OracleTrace,
        allow_none=True,
        help="the recorded oracle of the controls' prompt, max tokens and drafter options, or None",
    )
    prediction = T.Instance(
        SimTrace, allow_none=True, help="the oracle's replay of the controls' setting and drafter, or None"
    )
    whatif = T.Instance(
        WhatIf,
        allow_none=True,
        help="the prediction's numbers (a WhatIf, with the measured runs beside them); None without a prediction",
    )

    def __init__(
        self,
        session: Session,
        *,
        prompt: str | None = None,
        max_tokens: int = 128,
        n_max: int = 3,
        p_min: float = 0.0,
        n_min: int = 0,
        temperature: float = 0.0,
        seed: int = 0,
        drafter: str | None = None,
        width: int | None = None,
        views: list[str | View] | None = None,
        server: str | ServerMonitor | None = None,
        **options: int | str,
    ) -> None:
        self.session = session
        self.piece = cached_piece(session)
        has_mtp = bool(session.info.has_mtp)
        if prompt is None:  # the bundled model's demo prompt, or the longest part of it that fits this session
            prompt = demo_prompt_within(lambda t: len(session.tokenize(t)), session.n_ctx_seq - max_tokens)
        self.controls = Controls(
            session.capacity,
            prompt=prompt,
            max_tokens=max_tokens,
            n_max=n_max,
            p_min=p_min,
            n_min=n_min,
            temperature=temperature,
            seed=seed,
            has_mtp=has_mtp,
            has_draft_model=session.has_draft_model and session.draft_kind,
            options=options,
            drafter=drafters.default_mode(has_mtp) if drafter is None else drafter,
        )
        self.progress = ProgressView()
        self.error_area = ErrorArea()
        self.views = LiveViews(self.piece, width, views)
        session.telemetry = self.views.telemetry  # full only where a view draws per-depth detail
        self.whatif_panel = WhatIfPanel(width)
        self.runner = GenerationRunner(
            session, self.piece, show=self._show, started=self.error_area.clear, ended=self._generation_ended
        )
        self.whatif_controller = WhatIfController(
            session,
            self.whatif_panel,
            request=self.controls.request,
            trace=lambda: self.trace,
            baselines=self.runner.baselines,
            report=self.error_area.report,
        )
        title = W.HTML(title_html(session))
        parts = [self.controls, self.progress, self.error_area, self.whatif_panel, self.views]
        self.server_view = None if server is None else ServerView(server, width=width)
        self.slots_view = SlotsView(session, width=width) if session.n_parallel > 1 else None
        super().__init__(_children(title, parts, {"slots": self.slots_view, "llama-server": self.server_view}))
        self.add_class("mtpx-explorer")
        self._wire()
        self.views.render(LiveTrace.of(session, piece=self.piece).trace(), None)

    def _wire(self) -> None:
        """Connect the buttons and fields to the actions, and the parts' state to the traits."""
        c, ctl = self.controls, self.whatif_controller
        c.run.on_click(lambda _: self.run())
        c.step.on_click(lambda _: self.step())
        c.stop.on_click(lambda _: self.stop())
        self.whatif_panel.record.on_click(lambda _: self.record_oracle())
        self.whatif_panel.measure.on_click(lambda _: self.measure_setting())
        for name, slider in c.settings.items():
            slider.observe(functools.partial(self._on_setting, name), names="value")
        self._key_links = link_sliders(c.settings, self.whatif_panel.view)  # prepared frames shown in the browser
        for choice in (c.drafter, c.chain_policy, c.schedule):
            choice.observe(lambda _: self._refresh_prediction(), names="value")
        for field in c.oracle_inputs:
            field.observe(lambda _: ctl.select(), names="value")
        for name in ("state", "finish_reason", "baseline"):
            T.dlink((self.runner, name), (self, name))
        T.dlink((ctl, "oracle"), (self, "oracle"))
        T.dlink((ctl, "prediction"), (self, "prediction"))
        T.dlink((ctl, "numbers"), (self, "whatif"))
        self.observe(lambda _: self._show_state(), names="state")
        self.runner.observe(lambda _: self._show_progress(), names="activity")
        T.link((self.error_area, "message"), (self, "error"))

    # -- actions (the buttons) -------------------------------------------------------------------
    def run(self) -> None:
        """Start a new generation with the controls' settings, streaming in a background thread."""
        self.runner.run(self.controls.request())

    def step(self) -> None:
        """Advance one verify step, starting a generation if none is being stepped."""
        self.runner.step(self.controls.request())

    def stop(self) -> None:
        """Cancel the generation (or the oracle recording) within one step; the session stays usable."""
        self.runner.stop()

    def record_oracle(self) -> None:
        """Record the oracle of the controls' prompt, max tokens and drafter options (greedy decoding, depth =
        the session's capacity, the drafts of every drafter) in a background thread; refused, with a message,
        at temperature > 0, or without MTP layers unless a drafter that needs none is selected. From then on
        the sliders and the drafter selector predict at once."""
        if self.runner.busy:
            return
        req = self.controls.request()
        refusal = self.whatif_controller.refusal(req)
        if refusal is not None:
            self.error_area.report(readable_error(refusal))
            return
        self.error_area.clear()
        self.whatif_controller.begin_recording()
        self.runner.submit(
            functools.partial(self.whatif_controller.record, req, lambda: self.runner.stop_requested),
            activity=f"recording oracle · {req.max_tokens} tokens, depth {self.session.capacity} …",
        )

    def measure_setting(self, repeats: int = MEASURE_REPEATS) -> None:
        """Measure the controls' setting ``repeats`` times, each beside a plain run, in a background thread (needs
        the oracle): the what-if table then shows the median tokens/s and its spread beside the prediction."""
        req = self.controls.request()
        if self.whatif_controller.oracles.get(req.oracle_key) is None:
            return self.error_area.report("Measure needs the oracle of this prompt and max tokens: record one first")
        self.runner.submit(
            functools.partial(self.whatif_controller.measure, req, lambda: self.runner.stop_requested, repeats),
            activity=f"measuring n_max={req.n_max} · {repeats} runs …",
        )

    def predict(
        self, n_max: int | None = None, p_min: float | None = None, n_min: int | None = None, drafter: str | None = None
    ) -> SimTrace:
        """The oracle's replay of a setting (default: the sliders' and the drafter selector's): the
        accepted counts a greedy run would have, and the predicted timings."""
        return self.whatif_controller.predict(n_max, p_min, n_min, drafter)

    def update_prediction(self) -> None:
        """Predict the controls' setting again, from scratch (the oracle may have been changed in place), and redraw
        the what-if panel."""
        self.whatif_controller.refresh(fresh=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background work (generation then baseline, or an oracle recording) is done;
        False on timeout."""
        return self.runner.wait(timeout)

    @property
    def figures(self) -> dict[str, go.FigureWidget]:
        """The live figures by view name."""
        return self.views.figures

    @property
    def oracles(self) -> dict[tuple, OracleTrace]:
        """The recorded oracles, by (prompt, max tokens, drafter options)."""
        return self.whatif_controller.oracles

    @property
    def baselines(self) -> dict[tuple, Trace]:
        """The plain baselines, by (prompt, max tokens, temperature, seed)."""
        return self.runner.baselines

    @property
    def _thread(self):
        return self.runner.thread

    # -- what the parts report -------------------------------------------------------------------
    def _show(self, trace: Trace, changed: str | None) -> None:
        """Show ``trace``: every view, or (``changed="baseline"``) those that compare with the baseline."""
        self.trace = trace
        summary = trace.summary()
        self.n_steps, self.n_tokens = summary["n_steps"], summary["n_tokens"]
        self.tokens_per_second = summary["tokens_per_second"]
        self._show_progress()
        names = None if changed is None else [n for n, v in self.views.views.items() if changed in v.inputs]
        self.views.render(trace, self.baseline, names)

    def _generation_ended(self, error: BaseException | None) -> None:
        if error is not None:
            self.error_area.report(readable_error(error))
        self._refresh_prediction()  # the measured run beside the prediction

    def _refresh_prediction(self) -> None:
        if self.oracle is not None:
            self.whatif_controller.refresh()

    def _on_setting(self, name: str, change) -> None:
        if self.runner.drafting:  # else it applies to the next Run
            try:
                self.session.set_params(**{name: change["new"]})
            except MtpExplorerError as exc:
                self.error_area.report(readable_error(exc))
        self._refresh_prediction()

    def _show_state(self) -> None:
        busy = self.state in ("running", "busy")
        self.controls.set_busy(busy, idle=self.state == "idle")
        self.whatif_panel.record.disabled = busy
        self.whatif_panel.measure.disabled = busy
        self._show_progress()

    def _show_progress(self) -> None:
        if self.runner.activity:
            self.progress.say(self.runner.activity)
            return
        req = self.runner.request
        state = self.finish_reason if self.state == "idle" and self.finish_reason else self.state
        self.progress.show(self.n_tokens, req.max_tokens if req else 0, self.n_steps, self.tokens_per_second, state)


def title_html(session: Session) -> str:
    """The Explorer's title line: the model, its size and type, the session's capacity and placement."""
    info = session.info
    return (
        f"<b>mtp-explorer</b> · {html.escape(info.name)} ({info.arch}, "
        f"{info.n_params / 1e6:.1f} M parameters, {info.file_type}"
        + ("" if not info.moe_layers else f", {html.escape(info.experts_label())}")
        + f") · n_max up to {session.capacity}"
        f' · <span title="{html.escape(placement_hover(session.placement))}">'
        f"{html.escape(placement_label(session.placement))}</span>"
        + ("" if session.draft_info is None else f" · draft model {html.escape(session.draft_info.name)}")
        + ("" if info.has_mtp else f" · no MTP layers: {', '.join(drafters.available_modes(False))} drafting only")
    )


def placement_label(placement: dict) -> str:
    """Where a session computes, in llama.cpp's words: ``CPU · fa auto · KV f16/f16`` (plus ``-ngl`` on a GPU build)."""
    p = placement
    gpu = f"ngl {p['n_gpu_layers']} · " if p["gpu_offload"] else ""
    return f"{'+'.join(p['devices'])} · {gpu}fa {p['flash_attn']} · KV {p['type_k']}/{p['type_v']}"


def placement_hover(placement: dict) -> str:
    """The placement in plain words, for the hover text of :func:`placement_label`'s llama.cpp shorthand."""
    p = placement
    gpu = f"{p['n_gpu_layers']} layers offloaded to the GPU (llama.cpp's -ngl); " if p["gpu_offload"] else ""
    return (
        f"computes on {' + '.join(p['devices'])}; {gpu}flash attention: {p['flash_attn']} (llama.cpp's -fa); "
        f"the KV cache stores keys as {p['type_k']} and values as {p['type_v']} "
        "(--cache-type-k / --cache-type-v)"
    )
