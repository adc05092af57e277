"""Why a setting wins: how well the MTP head's draft confidence predicts acceptance, per depth.

The confidence at depth ``j`` is the head's probability of its token *given* the tokens drafted
before it, so it is compared with the conditional acceptance: among draft tokens at depth ``j``
whose ``j - 1`` predecessors were accepted, the fraction accepted. A calibrated head has points on
the diagonal of :func:`mtp_explorer.plots.reliability_diagram`; ``p_min`` then cuts drafts
where the expected gain stops paying for the verify cost, which :func:`best_p_min` finds by
replaying every threshold on the oracle traces.

Sources: :class:`~mtp_explorer.analysis.oracle.OracleTrace` (every position's chain, independent of any
policy: the most data) or real :class:`~mtp_explorer.core.trace.Trace` runs (the tokens they verified).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core import drafters
from ..core.drafters import DrafterMode, DrafterSpec
from ..core.errors import ParameterError
from ..core.settings import DraftSettings
from ..core.trace import Trace
from .grid import simulate_grid
from .oracle import OracleTrace

DEFAULT_P_MIN: tuple[float, ...] = tuple(np.round(np.arange(0.0, 0.96, 0.05), 2))
"""The ``p_min`` thresholds :func:`best_p_min` and :func:`calibrate` try by default."""


def confident_drafters(drafter: str | DrafterMode = drafters.DEFAULT_MODE) -> tuple[DrafterSpec, ...]:
    """The drafters of a ``drafter=`` mode whose drafts carry a confidence (the ones calibration is about); a
    mode without any is a :class:`ParameterError`."""
    mode = drafters.mode(drafter)
    specs = tuple(d for d in mode.drafters if d.has_confidence)
    if not specs:
        usable = [m.name for m in drafters.MODES.values() if m.has_confidence]
        raise ParameterError(
            f"drafter {mode.name!r} has no confidence to calibrate (p_min does not apply to it); use one of {usable}"
        )
    return specs


def _sources(source) -> list:
    items = [source] if isinstance(source, (OracleTrace, Trace)) else list(source)
    bad = [type(i).__name__ for i in items if not isinstance(i, (OracleTrace, Trace))]
    if bad:
        raise ParameterError(f"expected oracle traces or traces, got {', '.join(sorted(set(bad)))}")
    return items


def draft_outcomes(
    source: OracleTrace | Trace | Iterable[OracleTrace | Trace], drafter: str | DrafterMode = drafters.DEFAULT_MODE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(depth, confidence, accepted)`` of every draft token of ``drafter``'s confident drafters that was put to
    the test (its predecessors accepted). ``depth`` counts from 1."""
    specs = confident_drafters(drafter)
    depth, conf, acc = [], [], []
    for item in _sources(source):
        parts = _oracle_outcomes(item, specs) if isinstance(item, OracleTrace) else [_trace_outcomes(item, specs)]
        for d, p, a in parts:
            depth.append(d)
            conf.append(p)
            acc.append(a)
    if not depth:
        return np.zeros(0, int), np.zeros(0), np.zeros(0, bool)
    return np.concatenate(depth), np.concatenate(conf), np.concatenate(acc).astype(bool)


def _oracle_outcomes(oracle: OracleTrace, specs: Sequence[DrafterSpec]) -> list[tuple]:
    """Every position's draft of each drafter (its chain drafted with ``p_min = 0``)."""
    out = []
    for spec in specs:
        replay = oracle.replay(spec)
        match = replay.match_len
        j = np.arange(replay.tokens.shape[1])[None, :]
        tested = (j < replay.length[:, None]) & (j <= match[:, None])
        out.append(
            (
                np.broadcast_to(j + 1, tested.shape)[tested],
                replay.confidence[tested].astype(np.float64),  # type: ignore[index]
                (j < match[:, None])[tested],
            )
        )
    return out


def _trace_outcomes(trace: Trace, specs: Sequence[DrafterSpec]) -> tuple:
    """The drafts a run verified from those drafters."""
    c = trace.columns
    n_d, n_a = c["n_drafted"], c["n_accepted"]
    j = np.arange(c["drafted"].shape[1])[None, :]
    theirs = np.isin(c["drafter"], [s.index for s in specs])[:, None]
    tested = (j < n_d[:, None]) & (j <= n_a[:, None]) & theirs
    return (
        np.broadcast_to(j + 1, tested.shape)[tested],
        c["draft_prob"][tested].astype(np.float64),
        (j < n_a[:, None])[tested],
    )


def reliability(depth: np.ndarray, confidence: np.ndarray, accepted: np.ndarray, n_bins: int = 10):
    """Reliability table: one row per depth and confidence bin (equal width on [0, 1]) with
    ``count``, ``confidence`` (mean in the bin) and ``acceptance`` (fraction accepted)."""
    import pandas as pd

    depth = np.asarray(depth)
    confidence = np.asarray(confidence, dtype=np.float64)
    accepted = np.asarray(accepted, dtype=bool)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    b = np.clip(np.digitize(confidence, edges[1:-1]), 0, n_bins - 1)
    rows = []
    for d in np.unique(depth):
        for k in range(n_bins):
            sel = (depth == d) & (b == k)
            n = int(sel.sum())
            if n:
                rows.append(
                    {
                        "depth": int(d),
                        "bin": k,
                        "lo": edges[k],
                        "hi": edges[k + 1],
                        "count": n,
                        "confidence": float(confidence[sel].mean()),
                        "acceptance": float(accepted[sel].mean()),
                    }
                )
    return pd.DataFrame(rows, columns=["depth", "bin", "lo", "hi", "count", "confidence", "acceptance"])


def expected_calibration_error(table) -> float:
    """ECE of a reliability table: the count-weighted mean of |acceptance - confidence| over its bins."""
    if table.empty:
        return math.nan
    w = table["count"].to_numpy(dtype=np.float64)
    gap = np.abs(table["acceptance"].to_numpy() - table["confidence"].to_numpy())
    return float((w * gap).sum() / w.sum())


def best_p_min(
    oracles: OracleTrace | Sequence[OracleTrace],
    n_max: Sequence[int] | None = None,
    p_min: Sequence[float] = DEFAULT_P_MIN,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
):
    """The ``p_min`` with the best simulated tokens/s over the oracles, for each ``n_max`` and
    overall. Returns ``(best_by_n_max: dict[n_max, p_min], overall: dict, table: DataFrame)``. Only for drafter
    modes with a confidence; bad input raises :class:`~mtp_explorer.ParameterError`."""
    confident_drafters(drafter)
    oracles = [oracles] if isinstance(oracles, OracleTrace) else list(oracles)
    if not oracles or not all(isinstance(o, OracleTrace) for o in oracles):
        raise ParameterError("best_p_min needs one or more oracle traces (Session.record_oracle)")
    depth = min(o.depth for o in oracles)
    n_max = list(range(1, depth + 1)) if n_max is None else [int(n) for n in n_max]
    df = simulate_grid(oracles, n_max, p_min, drafter=drafter)
    df["_sec"] = df["n_tokens"] / df["tokens_per_second"]
    agg = df.groupby(["n_max", "p_min"], as_index=False).agg(n_tokens=("n_tokens", "sum"), seconds=("_sec", "sum"))
    agg["tokens_per_second"] = agg["n_tokens"] / agg["seconds"]
    by_n = {}
    for n, grp in agg.groupby("n_max"):
        row = grp.sort_values(["tokens_per_second", "p_min"], ascending=[False, True]).iloc[0]
        by_n[int(n)] = float(row["p_min"])
    top = agg.sort_values(["tokens_per_second", "n_max", "p_min"], ascending=[False, True, True]).iloc[0]
    overall = {
        "n_max": int(top["n_max"]),
        "p_min": float(top["p_min"]),
        "tokens_per_second": float(top["tokens_per_second"]),
    }
    return by_n, overall, agg


@dataclasses.dataclass
class Calibration:
    """Reliability of the draft confidence per depth, its ECE, and the ``p_min`` the simulator finds
    best (per ``n_max`` and overall) on the same oracle traces."""

    table: Any  # reliability table (see reliability())
    ece_by_depth: dict[int, float]
    ece: float
    mean_confidence_by_depth: dict[int, float]
    acceptance_by_depth: dict[int, float]
    best_p_min: dict[int, float] | None
    best_setting: dict[str, Any] | None
    p_min_table: Any = None
    drafter: str = drafters.DEFAULT_MODE  #: whose confidence was calibrated

    @property
    def settings(self) -> DraftSettings | None:
        """:attr:`best_setting` as settings for ``Session.generate(prompt, settings)`` (``None``: no oracle)."""
        if self.best_setting is None:
            return None
        return DraftSettings(n_max=self.best_setting["n_max"], p_min=self.best_setting["p_min"], drafter=self.drafter)

    def to_dict(self) -> dict:
        return {
            "ece": self.ece,
            "ece_by_depth": self.ece_by_depth,
            "mean_confidence_by_depth": self.mean_confidence_by_depth,
            "acceptance_by_depth": self.acceptance_by_depth,
            "best_p_min": self.best_p_min,
            "best_setting": self.best_setting,
        }


def calibrate(
    source: OracleTrace | Trace | Iterable[OracleTrace | Trace],
    n_bins: int = 10,
    p_min: Sequence[float] = DEFAULT_P_MIN,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
) -> Calibration:
    """Reliability diagram data, ECE per depth and overall, and (for oracle sources) the best
    ``p_min`` found by the simulator, for the confidence of ``drafter``'s drafts (a mode with a confidence).
    Bad input raises :class:`~mtp_explorer.ParameterError`."""
    if not isinstance(n_bins, int) or isinstance(n_bins, bool) or n_bins < 1:
        raise ParameterError(f"n_bins must be a positive integer, got {n_bins!r}")
    items = _sources(source)
    if not items:
        raise ParameterError("nothing to calibrate: give one or more oracle traces or traces")
    depth, conf, acc = draft_outcomes(items, drafter)
    table = reliability(depth, conf, acc, n_bins)
    ece_by = {int(d): expected_calibration_error(g) for d, g in table.groupby("depth")}
    mean_conf = {int(d): float(conf[depth == d].mean()) for d in np.unique(depth)}
    acc_by = {int(d): float(acc[depth == d].mean()) for d in np.unique(depth)}
    oracles = [o for o in items if isinstance(o, OracleTrace)]
    best = overall = ptab = None
    if oracles:
        best, overall, ptab = best_p_min(oracles, p_min=p_min, drafter=drafter)
    return Calibration(
        table=table,
        ece_by_depth=ece_by,
        ece=expected_calibration_error(table),
        mean_confidence_by_depth=mean_conf,
        acceptance_by_depth=acc_by,
        best_p_min=best,
        best_setting=overall,
        p_min_table=ptab,
        drafter=drafters.mode(drafter).name,
    )
