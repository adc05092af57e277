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

__all__ = ["RunRequest", "readable_error", "Controls", "ProgressView", "ErrorArea", "drafter_tooltip"]


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

    def stream_kwargs(self) -> dict:
        """The keyword arguments of ``Session.stream`` / ``generate``."""
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        return kw | dict(self.options)

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


def drafter_tooltip(name: str, has_mtp: bool, has_draft_model: bool = False) -> str:
    """The drafter selector's tooltip for the ``drafter=`` choice ``name``, from its registry record."""
    m = drafters.mode(name)
    text = m.description
    if not m.has_confidence:
        text += " (p_min does not apply: it has no confidence)"
    if m.needs_mtp and not has_mtp:
        text += " (unavailable: this model has no MTP layers)"
    if m.needs_draft_model and not has_draft_model:
        text += " (unavailable: the session was opened without draft_model=...)"
    return text + _NEXT_RUN


class Controls(W.VBox):
    """Prompt, drafter and its options, drafting settings, sampling settings and the Run / Step / Stop buttons.

    ``drafter`` (options :data:`~mtp_explorer.core.drafters.DRAFTER_MODES`) and the drafter options
    (``option_fields``, one per :func:`~mtp_explorer.core.drafters.all_options`) are read when a generation
    starts: the engine cannot change them mid-generation. ``has_mtp=False`` (a model without MTP layers) and
    ``has_draft_model=False`` (a session without a draft model) note in the tooltips which drafters are
    unavailable (a Run with them shows the session's error)."""

    def __init__(self, capacity: int, *, prompt: str, max_tokens: int, n_max: int, p_min: float, n_min: int,
                 temperature: float, seed: int, drafter: str = drafters.DEFAULT_MODE, has_mtp: bool = True,
                 has_draft_model: bool = False, options: dict[str, int | str] | None = None) -> None:
        style = {"description_width": "90px"}
        drafters.mode(drafter)  # a ParameterError naming the choices
        values = drafters.option_values(options)
        self.prompt = W.Textarea(value=prompt, placeholder="prompt", description="prompt",
                                 layout=W.Layout(width="98%", height="60px"), style=style)
        self.drafter = W.ToggleButtons(
            options=drafters.DRAFTER_MODES, value=drafter, description="drafter",
            style=style | {"button_width": "80px"},
            tooltips=[drafter_tooltip(d, has_mtp, has_draft_model) for d in drafters.DRAFTER_MODES])
        self.option_fields: dict[str, W.BoundedIntText | W.Text] = {
            o.name: (W.Text if o.is_path else functools.partial(W.BoundedIntText, min=o.lo, max=o.hi))(
                value=values[o.name], description=o.name, style=style, tooltip=f"{o.help} ({o.flag}){_NEXT_RUN}",
                layout=W.Layout(width="200px"))
            for o in drafters.all_options()}
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
            W.HBox([self.drafter, *self.option_fields.values()]),
            W.HBox([self.n_max, self.p_min, self.n_min]),
            W.HBox([self.temperature, self.seed, self.max_tokens]),
            W.HBox([self.run, self.step, self.stop]),
        ])

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
        """Run and Step only when nothing runs; Stop while anything does."""
        self.run.disabled = self.step.disabled = busy
        self.stop.disabled = idle

    def request(self) -> RunRequest:
        return RunRequest(prompt=self.prompt.value, max_tokens=int(self.max_tokens.value), n_max=int(self.n_max.value),
                          p_min=float(self.p_min.value), n_min=int(self.n_min.value),
                          temperature=float(self.temperature.value), seed=int(self.seed.value),
                          drafter=str(self.drafter.value),
                          options=tuple(sorted((k, w.value if isinstance(w, W.Text) else int(w.value))
                                               for k, w in self.option_fields.items())))


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
        self.value = (f'<div class="mtpx-error" style="color:#b00020;background:#fdecea;border:1px solid #f5c2c7;'
                      f'padding:6px 10px;border-radius:4px;font-family:monospace;white-space:normal">{text}</div>')
