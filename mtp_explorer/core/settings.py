"""Drafting settings: one frozen value for what a generation (or a what-if replay) is asked to do.

:class:`DraftSettings` holds llama.cpp's speculative settings (``--spec-type`` as ``drafter`` with its chain policy,
``--spec-draft-n-max``, ``--spec-draft-n-min``, ``--spec-draft-p-min``, the drafters' ``--spec-ngram-*`` / look-up
options) and the sampling of one request (``max_tokens``, ``temperature``, ``seed``). It checks what it can alone
when it is made (types, ranges, a known drafter and options); :meth:`DraftSettings.check` adds what depends on where
it runs, described by :class:`Limits`: a session's capacity and drafters, or an oracle's depth, drafters and budget.
These are the package's only range and availability rules for drafting settings; the engine re-checks them as a
backstop. A trace records its settings (:meth:`DraftSettings.to_dict`) and gives them back as
:attr:`Trace.draft_settings <mtp_explorer.Trace.draft_settings>`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import drafters, native
from .checks import check_bool, check_int
from .drafters import DrafterMode
from .errors import InputTypeError, MtpExplorerError, MtpUnavailableError, ParameterError

#: The fields a trace's ``settings`` holds for its drafting settings (the drafters' options besides).
FIELDS: tuple[str, ...] = (
    "max_tokens",
    "n_max",
    "p_min",
    "n_min",
    "temperature",
    "seed",
    "drafter",
    "chain_policy",
    "server_slot",
    "schedule",
    "window",
)
SEED_MAX = 2**32 - 1
#: The engine's defaults of a generation's settings (native_ext/draft.h, sequence.h): the one place they are written.
_PARAMS = native.DraftParams()
_GENERATION = native.GenerationConfig()
#: The draft-length schedules the engine runs (each step's draft cap; :mod:`mtp_explorer.analysis.schedules`).
SCHEDULES: tuple[str, ...] = tuple(native.SCHEDULES)
DEFAULT_WINDOW: int = _GENERATION.window  #: the ``"window"`` schedule's drafting steps


class PminNotApplicable(UserWarning):
    """``p_min`` > 0 was given to a drafter (or chain) without a confidence: it does not apply (not an error, so a
    grid over drafters keeps working)."""


class NeverDrafts(UserWarning):
    """A drafter of the choice can never propose a token with its options (llama.cpp's ngram-simple with
    ``ngram_simple_size_m`` < ``ngram_simple_size_n``): it runs, and decodes plainly."""


def _number(name: str, value: Any, lo: float, hi: float) -> float:
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or not lo <= value <= hi
    ):
        bound = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
        raise ParameterError(f"{name} must be a finite number in {bound}, got {value!r}")
    return float(value)


def check_schedule(value: Any, window: Any = DEFAULT_WINDOW, custom: bool = False) -> str:
    """The name of the draft-length schedule ``value`` (one of :data:`SCHEDULES`; ``"custom"`` for a callable rule
    where ``custom``: the what-if's), its ``window`` checked; a :class:`ParameterError` otherwise."""
    check_int("window", window, 1, None)
    if callable(value):
        if custom:
            return "custom"
        raise ParameterError(
            "a schedule of your own (a callable) runs in the what-if only: mx.simulate(oracle, n_max, schedule=rule); "
            f"a generation takes one of {list(SCHEDULES)}"
        )
    if value not in SCHEDULES:
        raise ParameterError(
            f"schedule must be one of {list(SCHEDULES)}"
            + (" or a callable (history, n_max) -> length" if custom else "")
            + f", got {value!r}"
        )
    return str(value)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Where drafting settings run: what a session (or an oracle) can draft with, and how deep.

    ``capacity`` is the largest ``n_max`` (a session's ``n_rs_seq`` snapshot slots, an oracle's recorded depth);
    ``max_tokens`` the longest generation (``None``: no bound; an oracle's recorded budget); ``greedy`` whether only
    greedy decoding can be answered (an oracle). ``where``, ``reason`` and ``fix`` word the errors."""

    capacity: int
    has_mtp: bool
    has_draft_model: bool | str = False  #: its draft model's kind (drafters.draft_kind), True for a draft model
    model: str = "this model"
    where: str = "this session"
    reason: str = "its n_rs_seq recurrent snapshot slots"
    fix: str = "open the session with n_rs_seq={n_max} or more"
    max_tokens: int | None = None
    greedy: bool = False


@dataclasses.dataclass(frozen=True)
class DraftSettings:
    """The drafting settings of one generation, checked; llama.cpp's names and defaults.

    ``drafter`` is llama.cpp's ``--spec-type`` value (``"draft-mtp"``, ``"ngram-simple"``, a chain such as
    ``"ngram-mod,draft-mtp"`` or a list of names; :data:`~mtp_explorer.core.drafters.DRAFTER_MODES` lists the usual
    ones), kept as that name: the short spellings ``"mtp"``, ``"ngram"`` and ``"chain"``
    (:data:`~mtp_explorer.core.drafters.MODE_ALIASES`) are taken and kept as ``"draft-mtp"``, ``"ngram-simple"`` and
    ``"ngram-simple,draft-mtp"`` with ``chain_policy="best"``, so ``DraftSettings(drafter="mtp") ==
    DraftSettings(drafter="draft-mtp")``. ``chain_policy`` (``"first"``, llama.cpp's, or ``"best"``) is kept as the
    choice's policy. ``n_max`` / ``n_min`` / ``p_min`` are ``--spec-draft-n-max`` /
    ``-n-min`` / ``-p-min``; ``options`` the drafters' options by keyword (``ngram_simple_size_n=12``, ...; see
    :func:`~mtp_explorer.core.drafters.all_options`), kept with llama.cpp's default for every option not given.
    ``seed`` ``None`` is the session's seed. ``server_slot=True`` runs the request as a llama-server slot does: the
    prompt in the server's prompt batches (for a recurrent, hybrid or SWA target its last 4 tokens apart, where the
    server checkpoints), the first token sampled from them before any draft (``llama-speculative-simple``, the
    default, decodes the prompt but its last token, and drafts from the first step). ``schedule`` sets each step's
    draft cap from the steps before it (at most ``n_max``): ``"fixed"`` (``n_max``, llama.cpp's), ``"heuristic"`` or
    ``"window"`` over ``window`` drafting steps (:mod:`mtp_explorer.analysis.schedules`; the explorer's own, not in
    llama.cpp 0.3.36). Change one with :meth:`replace`.
    """

    n_max: int = _PARAMS.n_max
    p_min: float = _PARAMS.p_min
    n_min: int = _PARAMS.n_min
    drafter: str = drafters.DEFAULT_MODE
    chain_policy: str | None = None
    options: Mapping[str, int | str] = dataclasses.field(default_factory=dict)
    max_tokens: int = _GENERATION.max_tokens
    temperature: float = _GENERATION.temperature
    seed: int | None = None
    server_slot: bool = _GENERATION.server_slot
    schedule: str = _GENERATION.schedule
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        mode = drafters.mode(self.drafter, self.chain_policy)
        n_max = check_int("n_max", self.n_max, 0, None)
        fixed: dict[str, Any] = {
            "n_max": n_max,
            "p_min": _number("p_min", self.p_min, 0.0, 1.0),
            "n_min": check_int("n_min", self.n_min, 0, None),
            "drafter": mode.name,
            "chain_policy": mode.policy,
            "options": drafters.option_values(self.options),
            "max_tokens": check_int("max_tokens", self.max_tokens, 1, None),
            "temperature": _number("temperature", self.temperature, 0.0, math.inf),
            "seed": None if self.seed is None else check_int("seed", self.seed, 0, SEED_MAX),
            "server_slot": check_bool("server_slot", self.server_slot),
            "schedule": check_schedule(self.schedule, self.window),
            "window": int(self.window),
        }
        if fixed["n_min"] > n_max:
            raise ParameterError(f"n_min={fixed['n_min']} is larger than n_max={n_max}")
        for name, value in fixed.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_mode", mode)

    # -- what they are -------------------------------------------------------------------------------
    @property
    def mode(self) -> DrafterMode:
        """The drafter choice (one drafter, or a chain with its policy)."""
        return self._mode  # type: ignore[attr-defined]

    @property
    def spec_type(self) -> str:
        """``drafter`` as llama.cpp's ``--spec-type`` value."""
        return self.mode.spec_types

    def replace(self, **changes: Any) -> DraftSettings:
        """These settings with ``changes`` (fields, or drafter options by keyword), checked again. An ``n_max``
        below ``n_min`` given without ``n_min`` lowers ``n_min`` to it."""
        fields = {f.name for f in dataclasses.fields(self)}
        options = {k: changes.pop(k) for k in list(changes) if k not in fields}
        aliases = {a: o.name for o in drafters.all_options() for a in o.aliases}
        named = {aliases.get(k, k): v for k, v in options.items()}
        if len(named) != len(options):
            raise ParameterError(f"an option is given under two names: {sorted(options)}")
        options = named
        if options:
            changes["options"] = {**changes.get("options", self.options), **options}
        if "n_max" in changes and "n_min" not in changes and isinstance(changes["n_max"], (int, np.integer)):
            changes["n_min"] = min(self.n_min, int(changes["n_max"]))
        if "drafter" in changes and "chain_policy" not in changes:
            changes["chain_policy"] = None  # the new choice's own policy
        return dataclasses.replace(self, **changes)

    # -- where they run --------------------------------------------------------------------------------
    def refusal(self, limits: Limits) -> MtpExplorerError | None:
        """Why these settings cannot run within ``limits`` (``None``: they can)."""
        mode = self.mode
        if self.n_max > limits.capacity:
            return ParameterError(
                f"n_max={self.n_max} exceeds {limits.where}'s capacity of {limits.capacity} "
                f"({limits.reason}); {limits.fix.format(n_max=self.n_max)}"
            )
        if limits.max_tokens is not None and self.max_tokens > limits.max_tokens:
            return ParameterError(
                f"max_tokens={self.max_tokens} exceeds the {limits.max_tokens} tokens {limits.where} recorded"
            )
        if limits.greedy and self.temperature > 0:
            return ParameterError(
                f"{limits.where} records greedy decoding: set temperature to 0 (it is "
                f"{self.temperature:g}); its predictions hold for greedy decoding only"
            )
        usable = ", ".join(repr(m) for m in drafters.available_modes(limits.has_mtp, limits.has_draft_model))
        if self.n_max > 0 and mode.needs_mtp and not limits.has_mtp:
            return MtpUnavailableError(
                f"{limits.model} has no MTP layers, so {limits.where} cannot draft with "
                f"drafter={mode.name!r}; use n_max=0 for plain decoding or drafter={usable}"
            )
        if self.n_max > 0 and mode.needs_draft_model and not limits.has_draft_model:
            return ParameterError(
                f"drafter={mode.name!r} drafts with a draft model, and {limits.where} has none: "
                f"Session.open(path, draft_model='small.gguf') (llama.cpp's -md), or use n_max=0 "
                f"or drafter={usable}"
            )
        if self.n_max > 0 and not mode.runs_with(limits.has_mtp, limits.has_draft_model):
            kind = drafters.DRAFT_KIND_LABELS[drafters.draft_kind(limits.has_draft_model)]
            wanted = " and ".join(drafters.DRAFT_KIND_LABELS[d.needs] for d in mode.drafters if d.needs_draft_model)
            return ParameterError(
                f"drafter={mode.name!r} drafts with a {wanted} (Session.open(path, draft_model=...)),"
                f" and the draft model {limits.where} has is a {kind}; use n_max=0 or "
                f"drafter={usable}"
            )
        return None

    def check(self, limits: Limits) -> DraftSettings:
        """These settings if they can run within ``limits``; else the error :meth:`refusal` names."""
        refusal = self.refusal(limits)
        if refusal is not None:
            raise refusal
        return self

    def warn_unused(self, stacklevel: int = 2) -> None:
        """Warn when a setting does nothing: :class:`PminNotApplicable` when ``p_min`` > 0 applies to no drafter of
        the choice, :class:`NeverDrafts` when a drafter's options leave it nothing to propose."""
        if self.p_min > 0 and not self.mode.has_confidence:
            warnings.warn(
                f"p_min={self.p_min} does not apply to drafter={self.drafter!r}: its drafts have no confidence",
                PminNotApplicable,
                stacklevel=stacklevel + 1,
            )
        size_n, size_m = int(self.options["ngram_simple_size_n"]), int(self.options["ngram_simple_size_m"])
        if self.n_max > 0 and size_m < size_n and any(d.name == drafters.NGRAM_SIMPLE for d in self.mode.drafters):
            warnings.warn(
                f"ngram-simple never drafts with ngram_simple_size_m={size_m} < ngram_simple_size_n={size_n}:"
                " llama.cpp drops a continuation shorter than the n-gram it looked up (common_ngram_simple_"
                "draft); set ngram_simple_size_m >= ngram_simple_size_n",
                NeverDrafts,
                stacklevel=stacklevel + 1,
            )

    # -- the engine's structs ----------------------------------------------------------------------------
    def native_params(self) -> native.DraftParams:
        """``n_max``, ``p_min``, ``n_min`` as the engine takes them (also mid-generation: ``set_params``)."""
        return native.DraftParams(n_max=self.n_max, p_min=self.p_min, n_min=self.n_min)

    def native_config(self, seed: int) -> native.GenerationConfig:
        """The engine's generation config, sampling with ``seed`` (``seed`` resolved by the caller)."""
        mode = self.mode
        return native.GenerationConfig(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=seed,
            drafters=[d.name for d in mode.drafters],
            chain_policy=mode.policy,
            options=drafters.engine_options(self.options),
            server_slot=self.server_slot,
            schedule=self.schedule,
            window=self.window,
        )

    # -- records -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The settings as a trace records them: :data:`FIELDS` and every drafter option by keyword."""
        return {name: getattr(self, name) for name in FIELDS} | dict(self.options)

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> DraftSettings:
        """The settings a trace (or :meth:`to_dict`) recorded; other keys (the session's) are ignored. A short drafter
        spelling an earlier version recorded (``"mtp"``, ``"chain"``) comes back under its ``--spec-type`` name."""
        given = {name: settings[name] for name in FIELDS if name in settings}
        options = drafters.recorded_options(settings)
        return cls(**given, options=options)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in FIELDS) + tuple(sorted(self.options.items())))

    def __repr__(self) -> str:
        defaults = drafters.option_values()
        changed = {k: v for k, v in self.options.items() if defaults[k] != v}
        fields = [f"{n}={getattr(self, n)!r}" for n in FIELDS if n != "max_tokens"] + [f"max_tokens={self.max_tokens}"]
        return f"DraftSettings({', '.join(fields)}{', options=' + repr(changed) if changed else ''})"


def normalise_recorded(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded ``settings`` dict (a trace's, a saved one's) with its ``drafter`` and ``chain_policy`` as
    :class:`DraftSettings` keeps them: llama.cpp's ``--spec-type`` name for a short spelling an earlier version
    recorded (``"mtp"`` -> ``"draft-mtp"``, ``"chain"`` -> ``"ngram-simple,draft-mtp"`` with ``"best"``)."""
    out = dict(settings)
    if isinstance(out.get("drafter"), (str, list, tuple)):
        mode = drafters.mode(out["drafter"], out.get("chain_policy"))
        out["drafter"], out["chain_policy"] = mode.name, mode.policy
    return out


def resolve(settings: DraftSettings | None = None, keywords: Mapping[str, Any] | None = None) -> DraftSettings:
    """``settings`` (default: :class:`DraftSettings`' defaults) with ``keywords`` (fields or drafter options) on top:
    what every call that takes ``settings=`` or keywords reads."""
    if settings is None:
        settings = DraftSettings()
    elif not isinstance(settings, DraftSettings):
        raise InputTypeError(f"settings must be a DraftSettings, got {type(settings).__name__}")
    return settings.replace(**keywords) if keywords else settings


def resolve_each(
    settings: DraftSettings | Sequence[DraftSettings] | None, n: int, keywords: Mapping[str, Any] | None = None
) -> list[DraftSettings]:
    """One :class:`DraftSettings` per request of ``n``: a list of them (one each; ``keywords`` go on top of each),
    or one for all (see :func:`resolve`)."""
    if isinstance(settings, (list, tuple)):
        if len(settings) != n:
            raise ParameterError(f"settings has {len(settings)} entries for {n} prompts")
        out = []
        for i, s in enumerate(settings):
            try:
                out.append(resolve(s, keywords))
            except ParameterError as e:
                raise type(e)(f"settings[{i}]: {e}") from None
        return out
    return [resolve(settings, keywords)] * n  # type: ignore[arg-type]
