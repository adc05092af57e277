"""A real trace against its oracle's prediction, step by step: :func:`compare` replays the trace's own settings from
each of its steps and classifies every difference (a floating-point argmax tie between the real run's batched numerics
and the oracle's, within the measured batch-shape tolerance, or unexplained)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..core import drafters
from ..core.drafters import DRAFTER_SPECS, DrafterMode
from ..core.schema import DRAFTERS, STOP_REASONS
from ..core.settings import DraftSettings
from ..core.trace import Trace
from .batch_shift import BatchShift, tolerance_of
from .oracle import OracleTrace
from .replay import DrafterReplay
from .walk import Steps, replays_of, run_policy

DEFAULT_TOL_LOGIT = 1e-3
"""The tie tolerance in logits where the batch-shape shift was not measured (an oracle without one)."""


# -- exactness -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    """A real trace checked step by step against the oracle's prediction at the same positions.

    ``mismatches``: one dict per differing step with ``step``, ``g``, the real and predicted values,
    ``kind`` (``tie`` or ``unexplained``) and ``cause``: ``target_argmax`` (the real run's greedy
    token differs where the target's top-2 logits are within ``tol_logit``: the rest of the run is
    not comparable), ``draft_argmax`` (a draft token differs where the drafting head's top-2 are within
    ``tol_logit`` / ``tol_prob``), ``p_min_threshold`` (a confidence within ``tol_prob`` of
    ``p_min``), ``chain_choice`` (the chain's two best expected lengths within ``tol_prob`` of each other,
    or moved by a confidence tie), or ``none``.
    """

    n_steps: int
    n_compared: int
    mismatches: list[dict]

    @property
    def ties(self) -> list[dict]:
        return [m for m in self.mismatches if m["kind"] == "tie"]

    @property
    def unexplained(self) -> list[dict]:
        return [m for m in self.mismatches if m["kind"] != "tie"]

    @property
    def exact(self) -> bool:
        return not self.mismatches


def trace_mode(trace: Trace) -> DrafterMode:
    return drafters.mode(trace.settings.get("drafter", drafters.DEFAULT_MODE), trace.settings.get("chain_policy"))


def step_starts(n_accepted: np.ndarray) -> list[int]:
    """The oracle position each step of a trace starts at."""
    starts, g = [], 0
    for a in n_accepted.tolist():
        starts.append(g)
        g += a + 1
    return starts


def settings_along(trace: Trace) -> list[tuple]:
    """Each step's (n_max, p_min, n_min); a checkpoint replay's (n_max 0, drafting nothing) are the step's before it."""
    c = trace.columns
    settings = list(zip(c["n_max"].tolist(), c["p_min"].tolist(), c["n_min"].tolist()))
    replayed = c["replayed"].tolist() if "replayed" in c else []  # (traces saved before the column)
    for j, r in enumerate(replayed):
        if r > 0 and j > 0:
            settings[j] = settings[j - 1]
    return settings


def _predict_at(oracle: OracleTrace, trace: Trace, starts: list[int]) -> dict[int, tuple[Steps, int]]:
    """The prediction for each step of ``trace`` at its position, with the settings in force there (the
    drafters' running statistics are replayed per stretch of constant settings)."""
    mode = trace_mode(trace)
    max_tokens = int(trace.settings.get("max_tokens", oracle.max_tokens))
    checkpoints = bool(trace.settings.get("checkpoints", False))
    settings = settings_along(trace)
    out: dict[int, tuple[Steps, int]] = {}
    i = 0
    while i < trace.n_steps:
        j = i
        while j < trace.n_steps and settings[j] == settings[i]:
            j += 1
        n_max, p_min, n_min = settings[i]
        seg = [s for s in starts[i:j] if s < oracle.n_positions]
        if seg:
            policy = DraftSettings(
                n_max=int(n_max),
                p_min=float(np.float32(p_min)),
                n_min=int(n_min),
                drafter=mode,  # type: ignore[arg-type]
                max_tokens=max_tokens,
            )
            steps = run_policy(oracle, policy, start_steps=seg, checkpoints=checkpoints)
            out.update({step: (steps, q) for q, step in enumerate(range(i, i + len(seg)))})
        i = j
    return out


def _name(names: Sequence[str], i: int) -> str | None:
    return names[i] if i >= 0 else None


def compare(
    oracle: OracleTrace,
    trace: Trace,
    *,
    tol_logit: float | None = None,
    tol_prob: float = 1e-4,
    batch_rows: int | None = None,
) -> Comparison:
    """Check every step of a real greedy ``trace`` against the oracle's prediction for the same
    position and the settings in force at that step (live ``set_params`` changes included; in a
    chain mode the drafters' running statistics are then replayed per stretch of constant
    settings, so a change mid-run can leave chain choices unexplained; a stateful drafter, ngram-mod's table or
    ngram-map's key statistics, likewise starts afresh at each such stretch).

    ``tol_logit`` is the top-2 logit margin below which a differing token is a batch-shape tie. Default: the
    oracle's measured :attr:`~OracleTrace.batch_shift` tolerance for the run's largest target batch
    (``batch_rows``, default its largest verify batch, ``n_drafted + 1``; a parallel run's batches hold every
    active sequence's rows), else :data:`DEFAULT_TOL_LOGIT`. Every mismatch carries an ``explanation`` sentence
    and the ``tolerance`` used."""
    c = trace.columns
    given_tol = tol_logit
    if batch_rows is None:
        batch_rows = int(c["n_drafted"].max()) + 1 if trace.n_steps else 1
    replays = replays_of(oracle, trace_mode(trace))
    starts = step_starts(c["n_accepted"])
    diverge = next((i for i, (a, b) in enumerate(zip(trace.tokens, oracle.tokens)) if a != b), None)
    # the KV length the tolerance is measured at: the divergence's, else the deepest the run compared
    kv = int(oracle.columns["pos"][min(diverge if diverge is not None else oracle.n_positions, oracle.n_positions) - 1])
    tol_logit = tolerance_of(oracle.batch_shift, tol_logit, DEFAULT_TOL_LOGIT, batch_rows, kv)
    predicted = _predict_at(oracle, trace, starts)
    mismatches: list[dict] = []
    n_compared = 0
    for i in range(trace.n_steps):
        g = starts[i]
        if (diverge is not None and g > diverge) or i not in predicted:
            break
        steps, q = predicted[i]
        n_compared += 1
        real_nd, real_acc = int(c["n_drafted"][i]), int(c["n_accepted"][i])
        real = {
            "n_drafted": real_nd,
            "n_accepted": real_acc,
            "drafted": c["drafted"][i, :real_nd].tolist(),
            "stop_reason": int(c["stop_reason"][i]),
            "drafter": int(c["drafter"][i]),
        }
        pred_nd = int(steps.n_drafted[q])
        pred = {
            "n_drafted": pred_nd,
            "n_accepted": int(steps.n_accepted[q]),
            "drafted": replays[int(steps.chosen[q])].tokens[g, :pred_nd].tolist(),
            "stop_reason": int(steps.stop_reason[q]),
            "drafter": int(steps.drafter[q]),
        }
        if real == pred and (diverge is None or g + real_acc < diverge):
            continue
        mm = {
            "step": i,
            "g": g,
            "n_max": int(c["n_max"][i]),
            "p_min": float(c["p_min"][i]),
            "n_min": int(c["n_min"][i]),
            "real": _named(real),
            "predicted": _named(pred),
        }
        mm.update(_classify(oracle, trace, i, g, replays[int(steps.chosen[q])], diverge, tol_logit, tol_prob))
        mm["tolerance"] = tol_logit
        mm["explanation"] = _explain(mm, oracle.batch_shift if given_tol is None else None, tol_logit, batch_rows, kv)
        mismatches.append(mm)
        if mm["cause"] == "target_argmax":
            break
    return Comparison(n_steps=trace.n_steps, n_compared=n_compared, mismatches=mismatches)


def _named(outcome: dict) -> dict:
    """A step's outcome with its stop reason and drafter as names."""
    return outcome | {
        "stop_reason": STOP_REASONS[outcome["stop_reason"]],
        "drafter": _name(DRAFTERS, outcome["drafter"]),
    }


def _explain(mm: dict, shift: BatchShift | None, tol_logit: float, batch_rows: int, kv: int) -> str:
    """A sentence for a mismatch: its kind, cause, margin and the tolerance it was judged by (``shift``: the
    measured shift that tolerance came from, else ``None``)."""
    margin, cause = mm.get("margin", math.nan), mm["cause"]
    if cause in ("target_argmax", "draft_argmax") and shift is not None and math.isfinite(margin):
        where = "the target's token" if cause == "target_argmax" else f"the draft at depth {mm.get('depth')}"
        return f"{where} differs: " + shift.explain(margin, batch_rows, kv)
    if mm["kind"] == "tie":
        return (
            f"{cause} near-tie: margin {margin:.3g} < tolerance {tol_logit:.3g} (given, not measured)"
            if cause in ("target_argmax", "draft_argmax")
            else f"{cause} near-tie: margin {margin:.3g}"
        )
    return f"unexplained ({cause}): margin {margin:.3g}, tolerance {tol_logit:.3g}: report it as a bug"


def _classify(
    oracle: OracleTrace, trace: Trace, i: int, g: int, chosen: DrafterReplay, diverge, tol_logit: float, tol_prob: float
) -> dict:
    c = trace.columns
    real_nd = int(c["n_drafted"][i])
    real_acc = int(c["n_accepted"][i])
    if diverge is not None and g + real_acc >= diverge:
        margin = float(oracle.columns["target_margin"][diverge]) if diverge < oracle.n_positions else math.inf
        return {
            "kind": "tie" if margin < tol_logit else "unexplained",
            "cause": "target_argmax",
            "margin": margin,
            "position": diverge,
        }
    real_src = int(c["drafter"][i])
    # a draft token that differs: an argmax tie in the drafting head?
    if chosen.margins is not None and real_src in (-1, chosen.spec.index):
        tie = _draft_tie(chosen, c, i, g, real_nd, tol_logit, tol_prob)
        if tie is not None:
            return tie
    # the same tokens but a different cut: a confidence at p_min?
    p_min = float(np.float32(c["p_min"][i]))
    probs = [
        p for spec in DRAFTER_SPECS.values() if spec.has_confidence for p in _confidences(oracle.replay(spec), g)
    ] + list(c["draft_prob"][i, :real_nd])
    near = [float(p) for p in probs if not math.isnan(p) and abs(float(p) - p_min) < tol_prob]
    if near and p_min > 0:
        return {"kind": "tie", "cause": "p_min_threshold", "margin": min(abs(p - p_min) for p in near)}
    gap = _choice_gap(c["candidate_expected"][i, [s.index for s in trace_mode(trace).drafters]])
    if gap < tol_prob:
        return {"kind": "tie", "cause": "chain_choice", "margin": gap}
    return {"kind": "unexplained", "cause": "none", "margin": math.nan}


def _draft_tie(replay: DrafterReplay, c, i: int, g: int, real_nd: int, tol_logit: float, tol_prob: float):
    """The first draft token that differs from the replay's, classified (``None``: none differs)."""
    real_draft = c["drafted"][i, :real_nd]
    for j in range(min(real_nd, int(replay.length[g]))):
        if int(real_draft[j]) != int(replay.tokens[g, j]):
            margin = float(replay.margins[g, j])  # type: ignore[index]
            tp = c["topk_probs"][i, j]
            real_gap = float(tp[0] - tp[1]) if tp.shape[0] > 1 and not np.isnan(tp[1]) else math.inf
            tie = margin < tol_logit or real_gap < tol_prob
            return {"kind": "tie" if tie else "unexplained", "cause": "draft_argmax", "margin": margin, "depth": j + 1}
    return None


def _confidences(replay: DrafterReplay, g: int) -> list:
    return list(replay.confidence[g, : int(replay.length[g])])  # type: ignore[index]


def _choice_gap(expected: np.ndarray) -> float:
    """How far apart a chain's two best expected lengths were (inf unless every drafter was asked)."""
    if len(expected) < 2 or np.isnan(expected).any():
        return math.inf
    best = sorted((float(e) for e in expected), reverse=True)
    return best[0] - best[1]
