"""The Explorer's input and status widgets: :class:`Controls` (what to generate, read as a :class:`RunRequest`),
:class:`ProgressView` and :class:`ErrorArea`.

The drafter selector and the drafter option fields are generated from the drafter registry
(:mod:`mtp_explorer.core.drafters`): a new drafter or option appears here without an edit.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import math

import ipywidgets as W
import traitlets as T

from ..core import drafters
from ..core.errors import MtpExplorerError
from ..core.schema import CHAIN_POLICIES
from ..core.settings import SCHEDULES, DraftSettings

__all__ = [
    "RunRequest",
    "readable_error",
    "Controls",
    "ProgressView",
    "ErrorArea",
    "drafter_note",
    "drafter_choices",
    "unavailable_reason",
    "unavailable_note",
    "P_MIN_STEP",
]

#: the ``p_min`` slider's step: the what-if prepares the frame of every ``p_min`` on it (llama.cpp's 0.75 is one)
P_MIN_STEP = 0.05


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What one Run or Step generation (or an oracle recording) is asked to do, read from the controls
    when it starts. ``options``: the drafters' options (``ngram_simple_size_n``, ..., file names such as
    ``lookup_cache_static``) as sorted (name, value) pairs."""

    prompt: str
    max_tokens: int
    n_max: int
    p_min: float
    n_min: int
    temperature: float
    seed: int
    drafter: str = drafters.DEFAULT_MODE
    options: tuple[tuple[str, int | str], ...] = ()
    chain_policy: str | None = None
    schedule: str = "fixed"

    @property
    def settings(self) -> DraftSettings:
        """The drafting settings asked for (checked here: a bad combination is a ``ParameterError``)."""
        fields = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("prompt", "options")
        }
        return DraftSettings(**fields, options=dict(self.options))

    def stream_kwargs(self) -> dict:
        """The arguments of ``Session.stream`` / ``generate``: the prompt and :attr:`settings`."""
        return {"prompt": self.prompt, "settings": self.settings}

    @property
    def baseline_key(self) -> tuple:
        """The plain baseline depends on these only (not on the drafting settings, the drafter or its options)."""
        return (self.prompt, self.max_tokens, self.temperature, self.seed)

    @property
    def oracle_key(self) -> tuple:
        """An oracle (greedy, any drafting settings, the drafts of every drafter) depends on these only: the
        prompt, max tokens and the drafter options (the n-gram drafts it records depend on them)."""
        return (self.prompt, self.max_tokens, self.options)


def readable_error(exc: BaseException) -> str:
    """One message for the error area: the error's class and text, no traceback."""
    name = type(exc).__name__
    if isinstance(exc, MtpExplorerError):
        return f"{name}: {exc}"
    return f"{name} (unexpected): {exc}"


_NEXT_RUN = " · applies to the next Run (not to a running generation); the what-if prediction follows at once"


def unavailable_reason(m: drafters.DrafterMode, has_mtp: bool, has_draft_model: bool | str = False) -> str:
    """Why a session with (or without) an MTP head and a draft model cannot run the choice ``m`` (``""``: it can)."""
    if m.needs_mtp and not has_mtp:
        return "needs a model with MTP layers"
    if m.needs_draft_model and not has_draft_model:
        return "needs draft_model="
    if m.needs_draft_model and not m.runs_with(has_mtp, has_draft_model):
        wanted = " and ".join(drafters.DRAFT_KIND_LABELS[d.needs] for d in m.drafters if d.needs_draft_model)
        return (
            f"needs draft_model= of a {wanted} (this session's is a "
            f"{drafters.DRAFT_KIND_LABELS[drafters.draft_kind(has_draft_model)]})"
        )
    return ""


def drafter_choices(has_mtp: bool, has_draft_model: bool | str = False) -> tuple[tuple[str, str], ...]:
    """Every listed choice (:func:`~mtp_explorer.core.drafters.spec_type_choices`, llama.cpp's ``--spec-type``
    values) with why this session cannot run it (``""``: it can), in the registry's order."""
    return tuple(
        (v, unavailable_reason(drafters.mode(v), has_mtp, has_draft_model)) for v in drafters.spec_type_choices()
    )


def unavailable_note(has_mtp: bool, has_draft_model: bool | str = False) -> str:
    """The listed choices this session cannot run, each with the reason (HTML; ``""``: none), shown beside the
    drafter control, which offers only the others."""
    out = [
        f"<s><code>{html.escape(v)}</code></s> ({html.escape(why)})"
        for v, why in drafter_choices(has_mtp, has_draft_model)
        if why
    ]
    return (
        ""
        if not out
        else ("<span class='mtpx-drafter-unavailable'>not available in this session: " + ", ".join(out) + "</span>")
    )


def drafter_note(value: str, policy: str | None, has_mtp: bool, has_draft_model: bool | str = False) -> str:
    """What the drafter control says under itself for the ``--spec-type`` value typed or chosen: the choice's
    description and whether this session can run it, or why the value is not a choice (HTML)."""
    try:
        m = drafters.mode(value, policy)
    except MtpExplorerError as exc:
        return f"<span class='mtpx-drafter-error'>{html.escape(str(exc))}</span>"
    text = f"<b>{html.escape(m.label or m.name)}</b>: {html.escape(m.description)}"
    if not m.has_confidence:
        text += " (p_min does not apply: it has no confidence)"
    if m.needs_mtp and not has_mtp:
        text += " <b>(unavailable: this model has no MTP layers)</b>"
    if m.needs_draft_model and not has_draft_model:
        text += " <b>(unavailable: the session was opened without draft_model=...)</b>"
    elif m.needs_draft_model and not m.runs_with(True, has_draft_model):
        text += (
            " <b>(unavailable: the session's draft model is a "
            f"{html.escape(drafters.DRAFT_KIND_LABELS[drafters.draft_kind(has_draft_model)])})</b>"
        )
    return f"<span class='mtpx-drafter-note'>{text}{html.escape(_NEXT_RUN)}</span>"


def selected_mode(value: str, policy: str | None) -> drafters.DrafterMode | None:
    """The drafter choice of a ``--spec-type`` value as typed (``None``: it is none)."""
    try:
        return drafters.mode(value, policy)
    except MtpExplorerError:
        return None


class Controls(W.VBox):
    """Prompt, drafter and its options, drafting settings, sampling settings and the Run / Step / Stop buttons.

    ``drafter`` is llama.cpp's ``--spec-type``: a dropdown of the listed choices this session can run, by their
    llama.cpp values (:func:`drafter_choices`), that also takes a typed value (any chain, e.g.
    ``ngram-map-k4v,draft-mtp``; a short spelling such as ``mtp`` or ``chain`` is replaced by its llama.cpp value
    and policy), with ``chain_policy`` beside it for chains; ``drafter_note`` says what the choice does, or why a
    typed value is not one. The listed choices the session cannot run (``has_mtp=False``: a model without MTP
    layers; ``has_draft_model=False``: a session without a draft model, or one of another kind) are not offered:
    ``unavailable`` lists them struck through, each with the reason (``needs draft_model=``); typed, the note says
    so, and a Run with one shows the session's error. Only the options of the chosen drafters show
    (``option_fields``, one per :func:`~mtp_explorer.core.drafters.all_options`, labelled with llama.cpp's flags).
    Both are read when a generation starts: the engine cannot change them mid-generation."""

    def __init__(
        self,
        capacity: int,
        *,
        prompt: str,
        max_tokens: int,
        n_max: int,
        p_min: float,
        n_min: int,
        temperature: float,
        seed: int,
        drafter: str = drafters.DEFAULT_MODE,
        has_mtp: bool = True,
        has_draft_model: bool | str = False,
        options: dict[str, int | str] | None = None,
    ) -> None:
        style = {"description_width": "90px"}
        chosen = drafters.mode(drafter)  # a ParameterError naming the choices
        values = drafters.option_values(options)
        self._has_mtp, self._has_draft_model = has_mtp, has_draft_model
        self._normalising = False
        self.prompt = W.Textarea(
            value=prompt,
            placeholder="prompt",
            description="prompt",
            layout=W.Layout(width="98%", height="60px"),
            style=style,
        )
        self.drafter = W.Combobox(
            options=tuple(v for v, why in drafter_choices(has_mtp, has_draft_model) if not why),
            value=chosen.spec_types,
            description="--spec-type",
            placeholder="a --spec-type value, e.g. ngram-map-k4v,draft-mtp",
            ensure_option=False,
            continuous_update=False,
            style=style,
            layout=W.Layout(width="440px"),
            tooltip="llama.cpp's --spec-type: pick one, or type a comma-separated chain" + _NEXT_RUN,
        )
        self.chain_policy = W.Dropdown(
            options=CHAIN_POLICIES,
            value=chosen.policy,
            description="chain policy",
            style=style,
            layout=W.Layout(width="200px"),
            tooltip="which draft of a chain is verified: first (llama.cpp's: the first drafter with a draft) or "
            "best (the highest expected accepted length)" + _NEXT_RUN,
        )
        self.drafter_note = W.HTML(layout=W.Layout(width="98%"))
        self.unavailable = W.HTML(value=unavailable_note(has_mtp, has_draft_model), layout=W.Layout(width="98%"))
        self.option_fields: dict[str, W.BoundedIntText | W.Text] = {
            o.name: (W.Text if o.is_path else functools.partial(W.BoundedIntText, min=o.lo, max=o.hi))(
                value=values[o.name],
                description=o.flag,
                style={"description_width": "initial"},
                tooltip=f"{o.help} ({o.name}){_NEXT_RUN}",
                layout=W.Layout(width="auto"),
            )
            for o in drafters.all_options()
        }
        self.option_box = W.HBox(list(self.option_fields.values()), layout=W.Layout(flex_flow="row wrap"))
        self.drafter.add_class("mtpx-spec-type")
        self.option_box.add_class("mtpx-drafter-options")
        self.drafter.observe(lambda _: self._take_policy(), names="value")
        self.chain_policy.observe(lambda _: self._show_drafter(), names="value")
        self.schedule = W.Dropdown(
            options=SCHEDULES,
            value="fixed",
            description="schedule",
            tooltip="each step's draft cap: fixed (n_max, llama.cpp's), heuristic (+2 after a step fully accepted, -1 "
            "after a rejection) or window (the depth the last 8 drafting steps accepted half the time); the "
            "explorer's own, not in llama.cpp 0.3.36",
            style={"description_width": "initial"},
            layout=W.Layout(width="200px"),
        )
        self._show_drafter()
        self.n_max = W.IntSlider(
            value=min(n_max, capacity),
            min=1,
            max=capacity,
            step=1,
            description="n_max",
            continuous_update=False,
            style=style,
        )
        self.p_min = W.FloatSlider(
            value=p_min,
            min=0.0,
            max=1.0,
            step=P_MIN_STEP,
            description="p_min",
            readout_format=".2f",
            continuous_update=False,
            style=style,
        )
        self.n_min = W.IntSlider(
            value=min(n_min, self.n_max.value),
            min=0,
            max=self.n_max.value,
            step=1,
            description="n_min",
            continuous_update=False,
            style=style,
        )
        self.temperature = W.BoundedFloatText(
            value=temperature,
            min=0.0,
            max=5.0,
            step=0.1,
            description="temperature",
            style=style,
            layout=W.Layout(width="200px"),
        )
        self.seed = W.BoundedIntText(
            value=seed, min=0, max=2**32 - 1, description="seed", style=style, layout=W.Layout(width="200px")
        )
        self.max_tokens = W.BoundedIntText(
            value=max_tokens,
            min=1,
            max=1_000_000,
            description="max tokens",
            style=style,
            layout=W.Layout(width="200px"),
        )
        self.run = W.Button(description="Run", button_style="primary", icon="play", tooltip="generate to the end")
        self.step = W.Button(description="Step", icon="step-forward", tooltip="one verify step")
        self.stop = W.Button(description="Stop", icon="stop", tooltip="cancel the generation", disabled=True)
        T.dlink((self.n_max, "value"), (self.n_min, "max"))
        super().__init__(
            [
                self.prompt,
                W.HBox([self.drafter, self.chain_policy]),
                self.drafter_note,
                self.unavailable,
                self.option_box,
                W.HBox([self.n_max, self.p_min, self.n_min]),
                W.HBox([self.temperature, self.seed, self.max_tokens, self.schedule]),
                W.HBox([self.run, self.step, self.stop]),
            ]
        )
        self.add_class("mtpx-controls")

    @property
    def settings(self) -> dict[str, W.ValueWidget]:
        """The sliders that apply to a running generation (``Session.set_params``), by name."""
        return {"n_max": self.n_max, "p_min": self.p_min, "n_min": self.n_min}

    @property
    def oracle_inputs(self) -> list[W.ValueWidget]:
        """The fields an oracle depends on (a new value selects another oracle), with the temperature (the
        what-if mode notes a temperature above 0)."""
        return [self.prompt, self.max_tokens, self.temperature, *self.option_fields.values()]

    def set_busy(self, busy: bool, idle: bool) -> None:
        """Run and Step only when nothing runs; Stop while anything does (red only then: disabled, it looks it)."""
        self.run.disabled = self.step.disabled = busy
        self.stop.disabled = idle
        self.stop.button_style = "" if idle else "danger"

    @property
    def mode(self) -> drafters.DrafterMode | None:
        """The drafter choice the control holds (``None``: the typed value is not one)."""
        return selected_mode(str(self.drafter.value), self.chain_policy.value)

    def _show_drafter(self) -> None:
        """The note for the choice, the chain policy only for a chain, and only the options of its drafters."""
        mode = selected_mode(str(self.drafter.value), None)
        self.chain_policy.disabled = mode is None or not mode.is_chain
        self.drafter_note.value = drafter_note(
            str(self.drafter.value), self._policy(mode), self._has_mtp, self._has_draft_model
        )
        shown = {o.name for o in mode.options} if mode is not None else set()
        for name, field in self.option_fields.items():
            field.layout.display = None if name in shown else "none"

    def _take_policy(self) -> None:
        """A new choice comes with its own chain policy (a ``--spec-type`` chain: first; the ``chain`` spelling:
        best); a short spelling (``mtp``, ``chain``) or a chain typed in another order shows as its llama.cpp value."""
        if self._normalising:
            return
        value = str(self.drafter.value)
        mode = selected_mode(value, None)
        if mode is not None and value != mode.name:
            self._normalising = True
            try:
                self.drafter.value = mode.name
            finally:
                self._normalising = False
        if mode is not None and mode.policy != self.chain_policy.value:
            self.chain_policy.value = mode.policy  # shows the choice through its observer
        else:
            self._show_drafter()

    def _policy(self, mode: drafters.DrafterMode | None) -> str | None:
        """The chain policy chosen, for a chain (``None``: the choice's own)."""
        return self.chain_policy.value if mode is not None and mode.is_chain else None

    def request(self) -> RunRequest:
        return RunRequest(
            prompt=self.prompt.value,
            max_tokens=int(self.max_tokens.value),
            n_max=int(self.n_max.value),
            p_min=float(self.p_min.value),
            n_min=int(self.n_min.value),
            temperature=float(self.temperature.value),
            seed=int(self.seed.value),
            drafter=str(self.drafter.value),
            chain_policy=self._policy(selected_mode(str(self.drafter.value), None)),
            schedule=str(self.schedule.value),
            options=tuple(
                sorted((k, w.value if isinstance(w, W.Text) else int(w.value)) for k, w in self.option_fields.items())
            ),
        )


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

    def say(self, text: str) -> None:
        """A status line of its own (e.g. what background work is doing)."""
        self.label.value = text


class ErrorArea(W.HTML):
    """Shows an error as a readable message (empty when there is none). ``report(message, source)`` shows one
    and remembers who reported it: an empty ``message`` clears the error only if ``source`` showed it."""

    message = T.Unicode("", help="the error shown ('' when none)")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._source = ""
        self.observe(lambda change: self.show(change["new"]), names="message")

    def report(self, message: str, source: str = "") -> None:
        if message:
            self.message, self._source = message, source
        elif self._source == source:
            self.message = ""

    def clear(self) -> None:
        self.message, self._source = "", ""

    def show(self, message: str) -> None:
        if not message:
            self.value = ""
            return
        text = html.escape(message).replace("\n", "<br>")
        self.value = (
            f'<div class="mtpx-error" style="color:#b00020;background:#fdecea;border:1px solid #f5c2c7;'
            f'padding:6px 10px;border-radius:4px;font-family:monospace;white-space:normal">{text}</div>'
        )
