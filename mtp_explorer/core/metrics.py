"""The numbers every view, table and summary shares, computed in one place from trace columns.

Acceptance by depth, per-step and per-phase seconds, tokens/s, speedup over a baseline, and the runs of
steps that shared one setting (``set_params`` during a generation). Numpy only: no figures, no widgets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from .schema import PHASES

#: The live-tunable settings recorded per step, in the order labels show them.
SETTINGS: tuple[str, ...] = ("n_max", "p_min", "n_min")


class HasColumns(Protocol):
    columns: Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class DepthAcceptance:
    """Per draft depth 1..D: steps that drafted that deep (``reached``), those whose draft was accepted
    that deep (``accepted``), and their ratio (``rate``, NaN where no step reached the depth)."""

    reached: list[int]
    accepted: list[int]

    @property
    def rate(self) -> list[float]:
        return [a / r if r else math.nan for a, r in zip(self.accepted, self.reached)]


def acceptance_by_depth(n_drafted: np.ndarray, n_accepted: np.ndarray, depth: int) -> DepthAcceptance:
    """Acceptance at each depth 1..``depth``: accepted at depth d among the steps that drafted d tokens."""
    n_drafted, n_accepted = np.asarray(n_drafted), np.asarray(n_accepted)
    reached = [int((n_drafted >= d).sum()) for d in range(1, depth + 1)]
    accepted = [int(((n_drafted >= d) & (n_accepted >= d)).sum()) for d in range(1, depth + 1)]
    return DepthAcceptance(reached=reached, accepted=accepted)


def acceptance_by_head(
    n_drafted: np.ndarray, n_accepted: np.ndarray, mtp: np.ndarray, n_heads: int, chained: bool
) -> list[float]:
    """Per MTP head, accepted over drafted tokens of the steps the MTP head drafted (``mtp``): chained heads draft
    one depth each (head i depth i: its rate is the acceptance at depth i); one head drafts every depth. NaN where
    a head drafted nothing; empty for a model without MTP heads."""
    n_drafted, n_accepted, mtp = np.asarray(n_drafted), np.asarray(n_accepted), np.asarray(mtp, dtype=bool)
    if not chained:
        return [acceptance_rate(n_drafted[mtp], n_accepted[mtp])] * min(n_heads, 1)
    return list(acceptance_by_depth(n_drafted[mtp], n_accepted[mtp], n_heads).rate)


def acceptance_by_depth_runs(
    n_drafted: np.ndarray, n_accepted: np.ndarray, depth: int, where: np.ndarray | None = None
) -> np.ndarray:
    """:func:`acceptance_by_depth` rates of many runs at once: per-step arrays ``[runs, steps]`` (``where``: the
    steps each run took), rates ``[runs, depth]`` (NaN where no step of a run reached the depth)."""
    n_drafted, n_accepted = np.asarray(n_drafted), np.asarray(n_accepted)
    taken = np.ones(n_drafted.shape, dtype=bool) if where is None else np.asarray(where, dtype=bool)
    rates = []
    for d in range(1, depth + 1):
        at_depth = taken & (n_drafted >= d)
        reached = at_depth.sum(axis=-1)
        accepted = (at_depth & (n_accepted >= d)).sum(axis=-1)
        rates.append(np.where(reached > 0, accepted / np.maximum(reached, 1), math.nan))
    return np.stack(rates, axis=-1)


def acceptance_rate(n_drafted: np.ndarray, n_accepted: np.ndarray) -> float:
    """Accepted drafts over drafted tokens (NaN without drafts)."""
    total = int(np.sum(n_drafted))
    return int(np.sum(n_accepted)) / total if total else math.nan


def mean_accepted_length(n_accepted: np.ndarray) -> float:
    """Accepted drafts per step (NaN without steps)."""
    return float(np.mean(n_accepted)) if len(n_accepted) else math.nan


def accepted_per_drafted(n_accepted: int, n_drafted: int) -> float:
    """:func:`acceptance_rate` from totals: accepted drafts over drafted tokens (NaN without drafts)."""
    return n_accepted / n_drafted if n_drafted else math.nan


def accepted_per_step(n_accepted: int, n_steps: int) -> float:
    """:func:`mean_accepted_length` from totals: accepted drafts over steps (NaN without steps)."""
    return n_accepted / n_steps if n_steps else math.nan


def phase_seconds(columns: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Total seconds spent in each phase (:data:`~mtp_explorer.core.schema.PHASES`)."""
    return {p: float(columns[f"t_{p}_ns"].sum()) / 1e9 for p in PHASES}


def step_seconds(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Seconds of each step: the sum of its phases."""
    n = len(columns["step"])
    return sum(columns[f"t_{p}_ns"].astype(np.float64) for p in PHASES) / 1e9 if n else np.zeros(0)  # type: ignore[return-value]


def cost_breakdown(trace) -> dict[str, float]:
    """Where a generation's time went, per verify step: milliseconds in each phase, draft tokens and verify
    rows per step with the milliseconds of each, tokens per step and milliseconds per token (NaN where a
    run has no draft). A plain run (``n_max=0``) gives the cost of one target decode per token."""
    c = trace.columns
    n_steps = len(c["step"])
    if not n_steps:
        return {}
    phases = phase_seconds(c)
    drafted = int(c["n_drafted"].sum())
    out = {f"{p}_ms_per_step": 1e3 * s / n_steps for p, s in phases.items()}
    out.update(
        {
            "draft_tokens_per_step": drafted / n_steps,
            "ms_per_draft_token": 1e3 * phases["draft"] / drafted if drafted else math.nan,
            "verify_rows_per_step": (drafted + n_steps) / n_steps,
            "ms_per_verify_row": 1e3 * phases["verify"] / (drafted + n_steps),
            "tokens_per_step": len(trace.tokens) / n_steps,
            "ms_per_token": 1e3 * sum(phases.values()) / max(1, len(trace.tokens)),
        }
    )
    return out


def tokens_per_second(n_tokens: int, seconds: float) -> float:
    """Decode throughput (NaN for no time)."""
    return n_tokens / seconds if seconds > 0 else math.nan


def spread(values: Sequence[float]) -> float:
    """The run-to-run spread of repeated measurements: (max - min) / median (NaN for fewer than two runs, whose
    spread is unknown, and without a positive median)."""
    values = [float(v) for v in values]
    middle = float(np.median(values)) if len(values) > 1 else math.nan
    return (max(values) - min(values)) / middle if middle > 0 else math.nan


def speedup(tokens_per_second_a: float, tokens_per_second_b: float) -> float:
    """``a`` over ``b`` (NaN where ``b`` is unknown or zero)."""
    b = tokens_per_second_b
    return tokens_per_second_a / b if b and not math.isnan(b) else math.nan


def trace_speedup(trace, baseline) -> float:
    """Decode tokens/s of ``trace`` over that of the plain ``baseline`` trace."""
    return speedup(trace.summary()["tokens_per_second"], baseline.summary()["tokens_per_second"])


# -- settings over a generation -----------------------------------------------------------------------
def format_setting(name: str, value) -> str:
    """A setting's value as views print it."""
    return f"{value:.2f}" if name == "p_min" else str(int(value))


def settings_at(columns: Mapping[str, np.ndarray], i: int) -> dict:
    """The settings step ``i`` ran with."""
    return {
        "n_max": int(columns["n_max"][i]),
        "p_min": round(float(columns["p_min"][i]), 6),
        "n_min": int(columns["n_min"][i]),
    }


@dataclasses.dataclass(frozen=True)
class SettingsChange:
    """The settings in force changed at ``step`` (the first step run with the new values)."""

    step: int
    before: dict
    after: dict

    @property
    def label(self) -> str:
        parts = [
            f"{k} {format_setting(k, self.before[k])}→{format_setting(k, self.after[k])}"
            for k in SETTINGS
            if self.before[k] != self.after[k]
        ]
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class SettingsSegment:
    """Consecutive steps ``start <= step < stop`` run with the same settings."""

    start: int
    stop: int
    settings: dict

    @property
    def label(self) -> str:
        s = ", ".join(f"{k}={format_setting(k, self.settings[k])}" for k in SETTINGS)
        return f"steps {self.start}–{self.stop - 1}: {s}"


def settings_changes(trace: HasColumns) -> list[SettingsChange]:
    """Every step where ``n_max``, ``p_min`` or ``n_min`` differ from the step before."""
    c = trace.columns
    out = []
    for i in range(1, len(c["step"])):
        before, after = settings_at(c, i - 1), settings_at(c, i)
        if before != after:
            out.append(SettingsChange(step=int(c["step"][i]), before=before, after=after))
    return out


def settings_segments(trace: HasColumns) -> list[SettingsSegment]:
    """The steps cut into runs with the same settings (one segment if they never changed)."""
    c = trace.columns
    n = len(c["step"])
    if n == 0:
        return []
    bounds = [0] + [i for i in range(1, n) if settings_at(c, i) != settings_at(c, i - 1)] + [n]
    return [SettingsSegment(a, b, settings_at(c, a)) for a, b in zip(bounds[:-1], bounds[1:])]


def steps_by_drafter(drafter: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """Verified drafts per drafter name (``none``: steps without a draft)."""
    out = {name: int((drafter == i).sum()) for i, name in enumerate(names)}
    out["none"] = int((drafter < 0).sum())
    return out
