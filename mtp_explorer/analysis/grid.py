"""Many settings over many oracles at once: :func:`simulate_grid` (vectorised over the settings for single-drafter
modes), the table behind sweeps, calibration and the what-if's curves; :func:`settings_grid` lists a grid's
settings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core import drafters, metrics
from ..core.drafters import DrafterMode
from ..core.errors import ParameterError
from ..core.options import is_full_telemetry
from ..core.settings import DraftSettings
from .oracle import OracleTrace
from .profile import Costs, resolve_costs, with_costs
from .simulate import ceiling_tokens_per_second, draft_phase_ns, follow_phase_ns, phase_times, summed_ns, uncertainty_of
from .walk import Steps, check_policy, draft_caps, model_follows, replays_of, run_policy


# -- grids ---------------------------------------------------------------------------------------------
def simulate_grid(
    oracles: OracleTrace | Iterable[OracleTrace],
    n_max: Sequence[int],
    p_min: Sequence[float],
    n_min: int | Sequence[int] = 0,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    labels: Sequence[Any] | None = None,
    costs: Costs | None = None,
    checkpoints: bool = False,
):
    """Summary metrics of every (oracle, n_max, p_min) combination as a pandas DataFrame.

    Vectorised over settings for single-drafter modes (a chain replays each setting). Columns: ``prompt``
    (label), ``n_max``, ``p_min``, ``n_min``, ``drafter``, ``n_tokens``, ``n_steps``, ``n_drafted``,
    ``n_accepted``, ``acceptance_rate``, ``mean_accepted_length``, ``acceptance_by_depth`` (list),
    ``tokens_per_second`` (predicted), ``ceiling_tokens_per_second``, ``plain_tokens_per_second``,
    ``seconds``, and where the oracle carries a measured batch shift the uncertainty columns of
    :meth:`SimTrace.uncertainty`: ``n_uncertain``, ``first_uncertain`` (the first position a real run may leave
    the predicted text at; ``None``: none), ``tokens_per_second_low`` / ``_high`` and
    ``mean_accepted_length_low`` / ``_high``. ``costs``: price every oracle with one
    :class:`~mtp_explorer.CostProfile` (or the path of a saved one, or a :class:`~mtp_explorer.CostModel`) instead
    of its own cost model, as :func:`simulate`. ``checkpoints=True``: each setting run as a session without snapshot
    slots runs it (:func:`simulate`'s ``checkpoints``; one replay per setting). Bad input raises
    :class:`~mtp_explorer.ParameterError`.
    """
    import pandas as pd

    oracles = [oracles] if isinstance(oracles, OracleTrace) else list(oracles)
    if not oracles:
        raise ParameterError("simulate_grid needs at least one oracle trace")
    costs = resolve_costs(costs)
    oracles = [with_costs(o, costs) for o in oracles]
    labels = list(labels) if labels is not None else [getattr(o, "prompt", None) for o in oracles]
    if len(labels) != len(oracles):
        raise ParameterError(f"{len(labels)} labels for {len(oracles)} oracle traces")
    mode = drafters.mode(drafter)
    grid_n, grid_p, grid_nmin = _grid(n_max, p_min, n_min)
    rows = []
    for label, oracle in zip(labels, oracles):
        policies = [
            check_policy(oracle, n, p, m, mode, None)
            for n, p, m in zip(grid_n.tolist(), grid_p.tolist(), grid_nmin.tolist())
        ]
        if checkpoints or mode.is_chain or any(oracle.replay(d).stateful for d in mode.drafters):
            stats = [_stats_of(oracle, run_policy(oracle, pol, checkpoints=checkpoints), pol) for pol in policies]
        else:
            stats = _grid_stats(oracle, grid_n, grid_p, grid_nmin, mode)
        for i, st in enumerate(stats):
            rows.append(
                {
                    "prompt": label,
                    "n_max": int(grid_n[i]),
                    "p_min": float(grid_p[i]),
                    "n_min": int(grid_nmin[i]),
                    "drafter": mode.name,
                }
                | st
            )
    return pd.DataFrame(rows)


def _grid(n_max: Sequence[int], p_min: Sequence[float], n_min) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (n_max, p_min) pair as flat arrays, with n_min cut to n_max."""
    try:
        n_max_l = [int(n) for n in n_max]
        p_min_l = [float(p) for p in p_min]
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"n_max and p_min must be sequences of numbers ({exc})") from None
    if not n_max_l or not p_min_l:
        raise ParameterError("n_max and p_min need at least one value each")
    grid_n = np.repeat(np.asarray(n_max_l, dtype=np.int64), len(p_min_l))
    grid_p = np.tile(np.asarray(p_min_l, dtype=np.float64), len(n_max_l))
    try:
        nm = np.broadcast_to(np.asarray(n_min, dtype=np.int64), grid_n.shape)
    except (TypeError, ValueError):
        raise ParameterError(f"n_min must be an integer or one per setting ({len(grid_n)}), got {n_min!r}") from None
    return grid_n, grid_p, np.minimum(nm, grid_n)


def _stats_of(oracle: OracleTrace, steps: Steps, policy: DraftSettings) -> dict:
    seconds = float(summed_ns(phase_times(oracle, steps, policy.mode)).sum()) / 1e9
    n_d, acc = steps.n_drafted, steps.n_accepted
    n_tok = int(steps.g[-1] + acc[-1] + 1) if len(acc) else 0
    row = _row(
        n_tok,
        len(acc),
        int(n_d.sum()),
        int(acc.sum()),
        metrics.acceptance_by_depth(n_d, acc, oracle.depth).rate,
        seconds,
        ceiling_tokens_per_second(oracle, policy.n_max, policy.mode),
        ceiling_tokens_per_second(oracle, 0, policy.mode),
    )
    return row | _range_columns(
        uncertainty_of(oracle, policy.n_max, steps.g, n_d, acc, row["tokens_per_second"], n_tok)
    )


def _range_columns(u: dict[str, Any]) -> dict[str, Any]:
    """A grid row's uncertainty columns, from :func:`uncertainty_of`."""
    return {
        "n_uncertain": len(u["uncertain_positions"]),
        "first_uncertain": u["first_uncertain"],
        "tokens_per_second_low": u["tokens_per_second_range"][0],
        "tokens_per_second_high": u["tokens_per_second_range"][1],
        "mean_accepted_length_low": u["mean_accepted_length_range"][0],
        "mean_accepted_length_high": u["mean_accepted_length_range"][1],
    }


def _row(
    n_tokens: int,
    n_steps: int,
    n_drafted: int,
    n_accepted: int,
    by_depth: list[float],
    seconds: float,
    ceiling: float,
    plain: float,
) -> dict:
    """One row of a grid: the run's numbers (from :mod:`~mtp_explorer.core.metrics`)."""
    return {
        "n_tokens": n_tokens,
        "n_steps": n_steps,
        "n_drafted": n_drafted,
        "n_accepted": n_accepted,
        "acceptance_rate": metrics.accepted_per_drafted(n_accepted, n_drafted),
        "mean_accepted_length": metrics.accepted_per_step(n_accepted, n_steps),
        "acceptance_by_depth": by_depth,
        "tokens_per_second": metrics.tokens_per_second(n_tokens, seconds),
        "ceiling_tokens_per_second": ceiling,
        "plain_tokens_per_second": plain,
        "seconds": seconds,
    }


def _grid_stats(oracle: OracleTrace, grid_n, grid_p, grid_nmin, mode: DrafterMode) -> list[dict]:
    """All settings of one oracle and a single-drafter mode at once: per-position outcomes as [S, T] arrays,
    then the paths followed in lock step."""
    (replay,) = replays_of(oracle, mode)
    T_end = min(oracle.n_positions, oracle.max_tokens)
    cap, reason = draft_caps(oracle, grid_n, oracle.max_tokens)
    cand = replay.candidate(cap, reason, grid_p, grid_nmin, grid_n > 0)
    n_d = cand.n_drafted
    acc = np.minimum(n_d, replay.match_len[None, :])
    tel = is_full_telemetry(oracle.settings.get("telemetry"))
    pos = oracle.columns["pos"].astype(np.float64)[None, :]
    draft = draft_phase_ns(oracle, (replay,), (cand,), cap > 0, pos)
    step_fresh = summed_ns(
        oracle.cost.phase_ns(
            model_follows((replay,), (cand,), cand.asked.shape),
            n_d + 1,
            draft,
            n_d + 1 if tel else acc + 1,
            n_d - acc,
            pos,
            fresh=True,
            follow=follow_phase_ns(oracle, (replay,), pos),
        )
    )
    visited, total_ns = _follow_lanes(n_d + 1, acc, step_fresh, step_fresh - oracle.cost.fresh_ns, T_end)
    n_steps = visited.sum(axis=1)
    n_drafted = np.where(visited, n_d, 0).sum(axis=1)
    n_accepted = np.where(visited, acc, 0).sum(axis=1)
    by_depth = metrics.acceptance_by_depth_runs(n_d, acc, oracle.depth, visited)
    ceiling = {n: ceiling_tokens_per_second(oracle, n, mode) for n in set(grid_n.tolist())}
    plain = ceiling_tokens_per_second(oracle, 0, mode)
    rows = [
        _row(
            T_end,
            int(n_steps[i]),
            int(n_drafted[i]),
            int(n_accepted[i]),
            by_depth[i].tolist(),
            float(total_ns[i] / 1e9),
            ceiling[int(grid_n[i])],
            plain,
        )
        for i in range(len(grid_n))
    ]
    g = np.arange(n_d.shape[1])
    for row, n, v, nd, a in zip(rows, grid_n.tolist(), visited, n_d, acc):
        row.update(_range_columns(uncertainty_of(oracle, n, g[v], nd[v], a[v], row["tokens_per_second"], T_end)))
    return rows


def _follow_lanes(k: np.ndarray, acc: np.ndarray, step_fresh: np.ndarray, step_reused: np.ndarray, T_end: int):
    """Every setting's path followed in lock step (the verify graph is reused when ``k`` repeats): which
    positions each visits [S, T] and its total time in ns [S]."""
    S, T = k.shape
    nxt = np.arange(T)[None, :] + acc + 1
    visited = np.zeros((S, T), dtype=bool)
    total_ns = np.zeros(S)
    prev_k = np.full(S, -1, dtype=np.int64)
    lanes = np.arange(S)
    cur = np.zeros(S, dtype=np.int64)
    while lanes.size:
        visited[lanes, cur] = True
        kk = k[lanes, cur]
        total_ns[lanes] += np.where(kk == prev_k[lanes], step_reused[lanes, cur], step_fresh[lanes, cur])
        prev_k[lanes] = kk
        cur = nxt[lanes, cur]
        keep = cur < T_end
        lanes, cur = lanes[keep], cur[keep]
    return visited, total_ns


def settings_grid(n_max: Sequence[int], p_min: Sequence[float]) -> list[tuple[int, float]]:
    return [(int(n), float(p)) for n in n_max for p in p_min]
