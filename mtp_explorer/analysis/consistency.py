"""The cost model against a real run: :func:`cost_consistency` prices a measured trace's own steps with the oracle's
cost model and compares the predicted phase times with the measured ones."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.errors import ParameterError
from ..core.schema import PHASES
from ..core.settings import DraftSettings
from ..core.trace import Trace
from .compare import settings_along, step_starts, trace_mode
from .oracle import OracleTrace
from .profile import Costs, with_costs
from .simulate import phase_times
from .walk import run_policy


# -- cost model consistency ---------------------------------------------------------------------------
def cost_consistency(oracle: OracleTrace, trace: Trace, *, costs: Costs | None = None) -> dict[str, Any]:
    """How well the oracle's cost model (or ``costs``, as :func:`simulate` takes it) predicts a real run's step
    times.

    The steps of ``trace`` are predicted where they happened (same positions, settings, draft
    sizes, graph reuse), then compared phase by phase. ``ratio_raw`` is measured / predicted time in
    total; on a shared machine it carries the spikes of whatever else runs. ``ratio_robust`` groups
    the steps by phase and shape (verify: rows and whether the graph was reused; catch-up: rows;
    draft: model decodes), takes each group's median measured / predicted ratio, and weighs it by the
    group's predicted time: how far the model is from the typical step, spikes aside.
    """
    c = trace.columns
    oracle = with_costs(oracle, costs)
    mode = trace_mode(trace)
    settings = settings_along(trace)
    n_max, p_min, n_min = settings[0]
    if any(st != settings[0] for st in settings):
        raise ParameterError("cost_consistency needs a trace with constant settings")
    policy = DraftSettings(
        n_max=int(n_max),
        p_min=float(np.float32(p_min)),
        n_min=int(n_min),
        drafter=mode,  # type: ignore[arg-type]
        max_tokens=int(trace.settings.get("max_tokens", oracle.max_tokens)),
    )
    steps = run_policy(
        oracle,
        policy,
        start_steps=step_starts(c["n_accepted"]),
        checkpoints=bool(trace.settings.get("checkpoints", False)),
    )
    if len(steps.g) != trace.n_steps or not np.array_equal(steps.n_drafted, c["n_drafted"]):
        raise ParameterError("the trace's steps differ from the oracle's prediction (see compare())")
    pred = phase_times(oracle, steps, mode)
    k = steps.verify_rows
    fresh = np.ones(len(k), dtype=bool)
    fresh[1:] = k[1:] != k[:-1]
    keys = {"verify": k * 2 + fresh, "catchup": k, "draft": steps.n_decodes, "sample": np.zeros(len(k), int)}
    out: dict[str, Any] = {"per_phase": {}}
    total_pred = total_meas = total_robust = 0.0
    for ph in PHASES:
        p = np.broadcast_to(np.asarray(pred[ph], dtype=np.float64), k.shape)
        m = c[f"t_{ph}_ns"].astype(np.float64)
        robust = _robust_ns(m, p, keys[ph])
        out["per_phase"][ph] = {"predicted_s": p.sum() / 1e9, "measured_s": m.sum() / 1e9, "robust_s": robust / 1e9}
        total_pred += p.sum()
        total_meas += m.sum()
        total_robust += robust
    return out | _consistency_totals(len(trace.tokens), total_pred, total_meas, total_robust)


def _robust_ns(measured: np.ndarray, predicted: np.ndarray, keys: np.ndarray) -> float:
    """Per group of like steps, the median measured / predicted ratio weighed by the group's predicted time."""
    robust = 0.0
    for key in np.unique(keys):
        sel = (keys == key) & (predicted > 0)
        if sel.any():
            robust += float(np.median(measured[sel] / predicted[sel])) * float(predicted[sel].sum())
    return robust


def _consistency_totals(n_tok: int, pred: float, meas: float, robust: float) -> dict[str, float]:
    out = {
        "predicted_seconds": pred / 1e9,
        "measured_seconds": meas / 1e9,
        "robust_measured_seconds": robust / 1e9,
        "ratio_raw": meas / pred if pred else math.nan,
        "ratio_robust": robust / pred if pred else math.nan,
    }
    out["predicted_tokens_per_second"] = n_tok / out["predicted_seconds"] if pred else math.nan
    out["measured_tokens_per_second"] = n_tok / out["measured_seconds"] if meas else math.nan
    out["robust_measured_tokens_per_second"] = n_tok / out["robust_measured_seconds"] if robust else math.nan
    return out
