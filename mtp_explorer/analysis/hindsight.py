"""The most any draft-length schedule could make of one recording: :func:`hindsight_best` chooses every step's draft cap
knowing how each would end (the oracle holds every draft at every position), by dynamic programming over the oracle's
positions with the cost model that prices :func:`~mtp_explorer.simulate`'s steps. No schedule (fixed ``n_max`` up to
its ``n_max``, ``"heuristic"``, ``"window"``, a rule of one's own) is predicted faster on that recording."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import drafters
from ..core.drafters import DrafterMode
from ..core.errors import ParameterError
from ..core.settings import DEFAULT_WINDOW, SCHEDULES
from .oracle import OracleTrace
from .profile import Costs, with_costs
from .simulate import phase_times, simulate
from .walk import check_policy, length_candidates, steps_at_lengths


@dataclasses.dataclass(frozen=True)
class Hindsight:
    """The best schedule in hindsight on one recording: its predicted ``tokens_per_second``, the position each of its
    steps starts at (``positions``) and the draft cap it gives that step (``lengths``), and the settings (``n_max``
    bounds every cap; ``drafter``, ``p_min``, ``n_min``)."""

    tokens_per_second: float
    positions: np.ndarray
    lengths: np.ndarray
    n_tokens: int
    seconds: float
    settings: dict[str, Any]


def hindsight_best(
    oracle: OracleTrace,
    n_max: int | None = None,
    p_min: float = 0.0,
    n_min: int = 0,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    max_tokens: int | None = None,
    costs: Costs | None = None,
    server_slot: bool = False,
) -> Hindsight:
    """The fastest run of ``drafter`` on ``oracle`` whose every step drafts with a cap between 0 and ``n_max``
    (default: the oracle's depth), each cap chosen knowing the whole recording: the upper bound of every draft-length
    schedule (:func:`~mtp_explorer.simulate`'s ``schedule=``) and of every fixed ``n_max`` up to it, priced by the
    oracle's cost model (or ``costs``), the verify graph's rebuild included where a step's rows differ from the step
    before. A single drafter without state along the path, as the schedules; a
    :class:`~mtp_explorer.ParameterError` otherwise."""
    policy = check_policy(oracle, oracle.depth if n_max is None else n_max, p_min, n_min, drafter, max_tokens)
    oracle = with_costs(oracle, costs)
    replay, cand, cap = length_candidates(oracle, policy, server_slot)
    T = min(oracle.n_positions, policy.max_tokens)
    J = policy.n_max + 1
    positions = np.arange(T)
    # [length, position]: the step's verify rows, where the next step starts, and its time with the verify graph built
    # anew and reused (each phase rounded to the ns, as a simulated trace records it)
    rows = np.zeros((J, T), dtype=np.int64)
    nxt = np.zeros((J, T), dtype=np.int64)
    cost = np.zeros((2, J, T))
    for j in range(J):
        at = np.full(oracle.n_positions, j, dtype=np.int64)
        steps = steps_at_lengths(policy, replay, cand, cap, positions, at)
        rows[j] = steps.verify_rows
        nxt[j] = np.minimum(positions + steps.n_accepted + 1, T)
        for f, fresh in enumerate((False, True)):
            times = phase_times(oracle, steps, policy.mode, fresh=fresh)
            cost[f, j] = sum(np.broadcast_to(np.rint(np.asarray(v, dtype=np.float64)), (T,)) for v in times.values())
    # best[g, p]: the least time from position g on when the previous step verified p + 1 rows (p = J: no step yet)
    K = J + 1
    best = np.zeros((T + 1, K))
    choice = np.zeros((T, K), dtype=np.int64)
    prev = np.arange(K)[None, :]
    for g in range(T - 1, -1, -1):
        k = rows[:, g] - 1  # [J]
        total = np.where(prev == k[:, None], cost[0, :, g, None], cost[1, :, g, None]) + best[nxt[:, g], k][:, None]
        choice[g] = np.argmin(total, axis=0)
        best[g] = total[choice[g], np.arange(K)]
    path, lengths, g, p = [], [], 0, J
    while g < T:
        j = int(choice[g, p])
        path.append(g)
        lengths.append(j)
        g, p = int(nxt[j, g]), int(rows[j, g] - 1)
    n_tokens = path[-1] + 1 + _accepted(cand, replay, lengths[-1], path[-1]) if path else 0
    seconds = float(best[0, J]) / 1e9
    return Hindsight(
        tokens_per_second=n_tokens / seconds if seconds > 0 else float("nan"),
        positions=np.asarray(path, dtype=np.int64),
        lengths=np.asarray(lengths, dtype=np.int64),
        n_tokens=n_tokens,
        seconds=seconds,
        settings={"n_max": policy.n_max, "p_min": policy.p_min, "n_min": policy.n_min, "drafter": policy.mode.name},
    )


def _accepted(cand, replay, length: int, g: int) -> int:
    return int(min(cand.n_drafted[length, g], replay.match_len[g]))


@dataclasses.dataclass(frozen=True)
class ScheduleAdvice:
    """Whether a draft-length schedule would beat the best fixed ``n_max`` on a workload (the oracles' prompts, total
    tokens over total predicted seconds): ``table`` (one row per setting: each fixed ``n_max`` up to ``n_max``, each
    named schedule at ``n_max``, and the hindsight bound; ``tokens_per_second`` and ``vs_best_fixed``), the best fixed
    setting and its tokens/s, the best schedule and its gain over it (``gain``: best schedule / best fixed - 1, below 0
    when no schedule beats it), the bound's (``headroom``: the most any schedule could gain) and ``note``, in words."""

    table: Any
    best_fixed_n_max: int
    best_fixed_tokens_per_second: float
    best_schedule: str
    gain: float
    bound_tokens_per_second: float
    headroom: float
    note: str


def schedule_advice(
    oracles: OracleTrace | Sequence[OracleTrace],
    n_max: int | None = None,
    p_min: float = 0.0,
    n_min: int = 0,
    *,
    drafter: str | DrafterMode = drafters.DEFAULT_MODE,
    costs: Costs | None = None,
    window: int = DEFAULT_WINDOW,
) -> ScheduleAdvice:
    """Each fixed ``n_max`` from 1 to ``n_max`` (default: the shallowest oracle's depth), each named schedule
    (:data:`~mtp_explorer.analysis.schedules.SCHEDULES` but ``"fixed"``, at ``n_max``) and the hindsight bound, replayed
    on every oracle (one per prompt of the workload) and summed over them: whether a schedule pays there, and by how
    much (:class:`ScheduleAdvice`)."""
    import pandas as pd

    oracles = [oracles] if isinstance(oracles, OracleTrace) else list(oracles)
    if not oracles or not all(isinstance(o, OracleTrace) for o in oracles):
        raise ParameterError("schedule_advice needs one or more oracle traces (Session.record_oracle)")
    n_max = min(o.depth for o in oracles) if n_max is None else n_max

    def total(schedule: str, n: int) -> float:
        sims = [
            simulate(o, n, p_min, n_min, drafter=drafter, costs=costs, schedule=schedule, window=window)
            for o in oracles
        ]
        return sum(len(s.tokens) for s in sims) / sum(len(s.tokens) / s.predicted_tokens_per_second for s in sims)

    fixed = {n: total("fixed", n) for n in range(1, n_max + 1)}
    best_n = max(fixed, key=fixed.__getitem__)
    best_tps = fixed[best_n]
    named = {s: total(s, n_max) for s in SCHEDULES if s != "fixed"}
    bounds = [hindsight_best(o, n_max, p_min, n_min, drafter=drafter, costs=costs) for o in oracles]
    bound = sum(b.n_tokens for b in bounds) / sum(b.seconds for b in bounds)
    rows = [(f"fixed n_max {n}", n, tps) for n, tps in fixed.items()]
    rows += [(f"{s} (n_max {n_max})", n_max, tps) for s, tps in named.items()]
    rows.append((f"hindsight bound (n_max {n_max})", n_max, bound))
    table = pd.DataFrame(rows, columns=["setting", "n_max", "tokens_per_second"])
    table["vs_best_fixed"] = table["tokens_per_second"] / best_tps
    name = max(named, key=named.__getitem__)
    gain = named[name] / best_tps - 1.0
    headroom = bound / best_tps - 1.0
    note = (
        f"the {name} schedule beats the best fixed setting (n_max {best_n}) by {gain:.1%}"
        if gain > 0
        else f"no schedule beats the best fixed setting (n_max {best_n}); the best, {name}, is {-gain:.1%} slower"
    ) + f"; knowing the whole recording, a schedule could gain at most {headroom:.1%}"
    return ScheduleAdvice(
        table=table,
        best_fixed_n_max=best_n,
        best_fixed_tokens_per_second=best_tps,
        best_schedule=name,
        gain=gain,
        bound_tokens_per_second=bound,
        headroom=headroom,
        note=note,
    )
