"""Sweeps: every prompt under every setting, simulated from oracle traces or measured, locally or
spread over Dask workers; and :func:`recommend`, the setting with the best tokens/s.

``mode="simulate"`` records one oracle trace per prompt and replays every setting on it
(:func:`mtp_explorer.simulate_grid`); the times come from one cost model for the whole sweep,
measured once on this machine (the first prompt's oracle with its probes), so that the prompts
differ by what they accept and not by when they ran. ``mode="measure"`` runs the engine for every
prompt and setting, and prices the ceiling (every draft accepted) with the same kind of cost model.

With ``client`` (a ``dask.distributed.Client``) the prompts are spread over the workers. Each
worker opens its own session from the model path with the options of ``session`` (no session is
pickled; a worker keeps its session for the next prompts). The cost model is measured here and sent
along, so a simulated sweep equals the local one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core import drafters, metrics
from ..core.checks import check_int
from ..core.drafters import DrafterMode
from ..core.errors import CancelledError, ParameterError
from ..core.session import Session
from ..core.settings import DraftSettings
from .grid import simulate_grid
from .hindsight import ScheduleAdvice, schedule_advice
from .oracle import CostModel, OracleTrace
from .profile import Costs, check_costs, resolve_costs
from .simulate import ceiling_tokens_per_second

DEFAULT_N_MAX = (0, 1, 2, 3, 4)
DEFAULT_P_MIN = (0.0, 0.3, 0.5, 0.7, 0.9)
SWEEP_MODES = ("simulate", "measure")
"""How a sweep gets its numbers: replayed on oracle traces, or measured with real runs."""

COLUMNS = (
    "prompt",
    "mode",
    "drafter",
    "n_max",
    "p_min",
    "n_min",
    "n_tokens",
    "n_steps",
    "n_drafted",
    "n_accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_by_depth",
    "tokens_per_second",
    "ceiling_tokens_per_second",
    "plain_tokens_per_second",
    "seconds",
    "tokens_digest",
    "repeats",
    "tokens_per_second_spread",
    "speedup",
    "speedup_spread",
)
"""Columns of a sweep's DataFrame (one row per prompt and setting). ``repeats``: runs per setting (0: simulated);
``tokens_per_second_spread`` and ``speedup_spread``: the run-to-run spread ((max - min) / median; NaN where
simulated) of the measured tokens/s and of the speedup, the median of each run over the plain run beside it
(simulated: predicted tokens/s over predicted plain)."""


def _digest(tokens: Sequence[int]) -> str:
    return hashlib.sha1(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every prompt of a sweep runs (sent to Dask workers as is): every drafter and setting, checked."""

    settings: tuple[DraftSettings, ...]
    repeats: int = 1
    checkpoints: bool = False
    """Predict each setting as a session without snapshot slots runs it (simulate mode only)."""

    @property
    def modes(self) -> list[str]:
        """The ``drafter=`` choices, by name, in the sweep's order."""
        return list(dict.fromkeys(s.drafter for s in self.settings))

    @property
    def max_tokens(self) -> int:
        return self.settings[0].max_tokens

    @property
    def depth(self) -> int:
        return max(1, max(s.n_max for s in self.settings))

    def grid(self, drafter: str) -> list[tuple[int, float, int]]:
        """``drafter``'s (n_max, p_min, n_min) settings."""
        return [(s.n_max, s.p_min, s.n_min) for s in self.settings if s.drafter == drafter]

    def record(self, session: Session, prompt, probe: bool) -> OracleTrace:
        return session.record_oracle(
            prompt,
            max_tokens=self.max_tokens,
            depth=self.depth,
            probe=probe,
            **self.settings[0].options,  # type: ignore[arg-type]
        )


# -- one prompt (runs here or on a worker) -------------------------------------------------------------
def _simulate_prompt(
    session: Session, prompt, job: _Job, cost: CostModel | None, oracle: OracleTrace | None = None
) -> list[dict]:
    """One oracle of ``prompt`` (it holds every drafter's drafts; ``oracle``: one recorded before, else recorded
    here), replayed for every drafter and setting."""
    if oracle is None:
        oracle = job.record(session, prompt, probe=cost is None)
    if cost is not None:
        oracle = oracle.with_cost(cost)
    rows = []
    digest = _digest(oracle.tokens)
    for drafter in job.modes:
        grid = job.grid(drafter)
        wanted = set(grid)
        n_max, p_min = sorted({g[0] for g in grid}), sorted({g[1] for g in grid})
        mode = next(s.mode for s in job.settings if s.drafter == drafter)  # with its chain policy
        df = simulate_grid(
            oracle, n_max, p_min, max(g[2] for g in grid), drafter=mode, labels=[prompt], checkpoints=job.checkpoints
        )
        for rec in df.to_dict("records"):
            if (rec["n_max"], rec["p_min"], rec["n_min"]) in wanted:
                rec["mode"] = "simulate"
                rec["tokens_digest"] = digest
                rec |= {
                    "repeats": 0,
                    "tokens_per_second_spread": math.nan,
                    "speedup_spread": math.nan,
                    "speedup": rec["tokens_per_second"] / rec["plain_tokens_per_second"],
                }
                rows.append(rec)
    return rows


def _measure_prompt(
    session: Session, prompt, job: _Job, cost: CostModel, cancelled: Callable[[], bool] | None = None
) -> list[dict]:
    """Real runs of ``prompt``: for every drafter and setting ``repeats`` runs alternating with as many plain
    baselines (setting first, then baseline, then the other way round), their median tokens/s, the plain median,
    the median of the paired speedups and the spreads; the ceiling with every draft accepted from ``cost`` at the
    positions of this prompt's generation (an oracle recorded without probes)."""
    oracle = job.record(session, prompt, probe=False).with_cost(cost)
    ceiling = {(st.drafter, st.n_max): ceiling_tokens_per_second(oracle, st.n_max, st.mode) for st in job.settings}
    rows = []
    for st in job.settings:
        base = st.replace(n_max=0)
        tps, plain, secs = [], [], []
        for r in range(job.repeats):
            for settings in (st, base) if r % 2 == 0 else (base, st):
                if cancelled is not None and cancelled():
                    raise CancelledError("the measured sweep was stopped")
                t = session.generate(prompt, settings)
                if settings is base:
                    plain.append(t.summary()["tokens_per_second"])
                else:
                    run, s = t, t.summary()
                    tps.append(s["tokens_per_second"])
                    secs.append(sum(s["phase_seconds"].values()))
        ratios = [a / b for a, b in zip(tps, plain)]
        rows.append(
            {
                "prompt": prompt,
                "mode": "measure",
                "drafter": st.drafter,
                "n_max": st.n_max,
                "p_min": st.p_min,
                "n_min": st.n_min,
                "n_tokens": s["n_tokens"],
                "n_steps": s["n_steps"],
                "n_drafted": s["n_drafted"],
                "n_accepted": s["n_accepted"],
                "acceptance_rate": s["acceptance_rate"],
                "mean_accepted_length": s["mean_accepted_length"],
                "acceptance_by_depth": s["acceptance_by_depth"],
                "tokens_per_second": float(np.median(tps)),
                "ceiling_tokens_per_second": ceiling[st.drafter, st.n_max],
                "plain_tokens_per_second": float(np.median(plain)),
                "seconds": float(np.median(secs)),
                "tokens_digest": _digest(run.tokens),
                "repeats": job.repeats,
                "tokens_per_second_spread": metrics.spread(tps),
                "speedup": float(np.median(ratios)),
                "speedup_spread": metrics.spread(ratios),
            }
        )
    return rows


def _run_prompt(
    session: Session, mode: str, prompt, job: _Job, cost: CostModel | None, cancelled: Callable[[], bool] | None = None
) -> list[dict]:
    if mode == "simulate":
        return _simulate_prompt(session, prompt, job, cost)
    return _measure_prompt(session, prompt, job, cost, cancelled)  # type: ignore[arg-type]


_WORKER_SESSIONS: dict[tuple, Session] = {}


def _worker_session(path: str, open_kwargs: dict) -> Session:
    key = (path, tuple(sorted(open_kwargs.items())))
    s = _WORKER_SESSIONS.get(key)
    if s is None or s.closed:
        s = _WORKER_SESSIONS[key] = Session.open(path, **open_kwargs)
    return s


def _run_on_worker(path: str, open_kwargs: dict, mode: str, prompt, job: _Job, cost: dict | None) -> list[dict]:
    """A Dask task: one prompt on this worker's own session (opened from the model path)."""
    return _run_prompt(
        _worker_session(path, open_kwargs), mode, prompt, job, CostModel.from_dict(cost) if cost else None
    )


# -- sweep ----------------------------------------------------------------------------------------------
def sweep(
    session: Session,
    prompts: str | Iterable,
    n_max: Sequence[int] = DEFAULT_N_MAX,
    p_min: Sequence[float] = DEFAULT_P_MIN,
    n_min: int = 0,
    mode: str = "simulate",
    client=None,
    *,
    max_tokens: int = 128,
    drafter: str | DrafterMode | Sequence[str | DrafterMode] = drafters.DEFAULT_MODE,
    cost: CostModel | None = None,
    costs: Costs | None = None,
    repeats: int = 1,
    progress: bool = True,
    checkpoints: bool = False,
    oracles: OracleTrace | Sequence[OracleTrace] | None = None,
    cancelled: Callable[[], bool] | None = None,
    **options: int | str | None,
):
    """Every prompt under every (``n_max``, ``p_min``) setting: a pandas DataFrame with one row per
    prompt, drafter and setting (columns :data:`COLUMNS`).

    ``drafter``: one of :data:`~mtp_explorer.core.drafters.DRAFTER_MODES` or several of them (e.g.
    ``mx.DRAFTER_MODES``); in simulate mode one oracle per prompt serves them all. ``options``: the
    drafters' options (``ngram_simple_size_n=...``: see :func:`~mtp_explorer.core.drafters.all_options`; ``None`` or
    not given: llama.cpp's default).

    ``mode="simulate"``: one oracle per prompt, replayed for each setting; times from ``cost`` or
    else one cost model measured here on the first prompt. ``costs``: a :class:`~mtp_explorer.CostProfile`
    measured on another machine (or the path of a saved one): the sweep predicts that machine's tokens/s from
    the acceptance recorded here (the profile must be of this session's model, measured to a depth of at least
    ``max(n_max)``). ``mode="measure"``: real runs (``repeats``
    each, median tokens/s and its spread), alternating with as many plain runs (``plain_tokens_per_second``,
    ``speedup``: the median of each run over the plain run beside it); its
    ``ceiling_tokens_per_second`` (every draft accepted) comes from the same cost model, priced at
    the positions of each prompt's generation.
    ``client``: a ``dask.distributed.Client`` to spread the prompts over its workers.
    ``checkpoints=True`` (simulate mode; the look-ups and draft-simple): predict each setting as a session without
    snapshot slots runs it (``Session.open(n_rs_seq=0)``; llama.cpp's rollback for a chain of look-ups on a recurrent
    target; :func:`~mtp_explorer.simulate`'s ``checkpoints``) from oracles recorded on this session, which needs
    slots: an oracle rolls back through them.
    ``oracles`` (simulate mode): one :class:`~mtp_explorer.OracleTrace` per prompt, in the prompts' order, recorded
    before (``session.record_oracle(prompt, max_tokens, depth)`` with ``depth >= max(n_max)`` and the sweep's drafter
    options): they are replayed as they are and nothing is recorded, so one recording serves several sweeps (other
    grids, drafters or cost models); without ``cost`` or ``costs`` the times come from the first one's cost model. The
    replay runs here (not with ``client``).
    ``cancelled`` (measure mode, here): asked before each run; True stops the sweep with
    :class:`~mtp_explorer.CancelledError` (what the Explorer's Stop does to its Measure).
    Bad input raises :class:`~mtp_explorer.ParameterError`.
    """
    import pandas as pd

    prompts, job = _check_sweep(
        session, prompts, n_max, p_min, n_min, mode, max_tokens, drafter, repeats, options, checkpoints
    )
    if cost is not None and costs is not None:
        raise ParameterError("give cost (a CostModel) or costs (a CostProfile), not both")
    if cost is not None and not isinstance(cost, CostModel):  # a profile given as cost=
        cost, costs = None, cost
    given = _check_oracles(oracles, prompts, job, mode, client)
    if costs is not None:
        cost = check_costs(resolve_costs(costs), session.info.to_dict(), job.depth, "the sweep")  # type: ignore[arg-type]
    if cost is None:
        cost = given[0].cost if given else job.record(session, prompts[0], probe=True).fitted_cost
    rows: list[dict] = []
    bar = _progress(len(prompts), f"sweep ({mode})", progress)
    try:
        if given:
            for prompt, oracle in zip(prompts, given):
                rows += _simulate_prompt(session, prompt, job, cost, oracle)
                bar.update(1)
        elif client is None:
            for prompt in prompts:
                rows += _run_prompt(session, mode, prompt, job, cost, cancelled)
                bar.update(1)
        else:
            rows = _run_distributed(client, session, mode, prompts, job, cost, bar)
    finally:
        bar.close()
    df = pd.DataFrame(rows)
    return df[list(COLUMNS)]


def _check_sweep(
    session: Session,
    prompts,
    n_max,
    p_min,
    n_min,
    mode,
    max_tokens,
    drafter,
    repeats,
    options,
    checkpoints: bool = False,
) -> tuple[list, _Job]:
    """The prompts and the job, or a :class:`ParameterError` naming what is wrong."""
    if mode not in SWEEP_MODES:
        raise ParameterError(f"mode must be one of {SWEEP_MODES}, got {mode!r}")
    if session.checkpoints:
        raise ParameterError(
            "a sweep records oracle traces, which roll the target back through snapshot slots, and "
            "this session has none (n_rs_seq=0): open one with slots and sweep with checkpoints=True "
            "to predict the run without them"
        )
    if checkpoints and mode != "simulate":
        raise ParameterError(
            "checkpoints=True predicts from oracle traces (mode='simulate'); to measure the rollback "
            "without slots, generate on a session opened with n_rs_seq=0"
        )
    given = [drafter] if isinstance(drafter, (str, DrafterMode)) else list(drafter)
    if not given:
        raise ParameterError("no drafter: give one of the drafter modes or several of them")
    try:
        modes = {drafters.mode(d).name: drafters.mode(d).policy for d in given}  # llama.cpp's names, policies
        names = [drafters.mode(d).name for d in given]
    except ParameterError as exc:
        raise ParameterError(f"{exc} (or several of them)") from None
    if len(set(names)) != len(names):
        raise ParameterError(f"drafter lists one drafter twice: {names}")
    slotted = [n for n in names if drafters.mode(n).gets_snapshot_slots]
    if checkpoints and slotted:
        raise ParameterError(
            f"checkpoints=True predicts the drafters llama.cpp gives no snapshot slots (the look-ups "
            f"and draft-simple), as a session without slots runs only them; not {slotted}"
        )
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ParameterError("no prompts")
    try:
        n_max, p_min = [int(n) for n in n_max], [float(p) for p in p_min]
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"n_max and p_min must be sequences of numbers ({exc})") from None
    if not n_max or not p_min:
        raise ParameterError("n_max and p_min need at least one value each")
    n_min = check_int("n_min", n_min, 0, None)
    check_int("repeats", repeats, 1, None)
    base = DraftSettings(max_tokens=max_tokens, options={k: v for k, v in options.items() if v is not None})
    settings = tuple(
        base.replace(drafter=d, chain_policy=modes[d], n_max=n, p_min=p, n_min=min(n_min, n)).check(session.limits)
        for d in names
        for n in n_max
        for p in p_min
    )
    return prompts, _Job(settings, repeats, bool(checkpoints))


def _check_oracles(oracles, prompts: list, job: _Job, mode: str, client) -> list[OracleTrace] | None:
    """The oracles given to a sweep, one per prompt and fit to replay its job, or a :class:`ParameterError`."""
    if oracles is None:
        return None
    if mode != "simulate":
        raise ParameterError("oracles are replayed in simulate mode; mode='measure' runs the engine")
    if client is not None:
        raise ParameterError("given oracles are replayed here, with nothing to record: give no client")
    oracles = [oracles] if isinstance(oracles, OracleTrace) else list(oracles)
    if len(oracles) != len(prompts):
        raise ParameterError(f"{len(oracles)} oracles for {len(prompts)} prompts: give one per prompt, in their order")
    wanted = drafters.option_values(job.settings[0].options)
    for i, (prompt, o) in enumerate(zip(prompts, oracles)):
        if not isinstance(o, OracleTrace):
            raise ParameterError(f"oracles[{i}] is a {type(o).__name__}, not an OracleTrace")
        if isinstance(prompt, str) and o.prompt != prompt:
            raise ParameterError(f"oracles[{i}] was recorded for the prompt {o.prompt!r}, not {prompt!r}")
        if o.max_tokens != job.max_tokens:
            raise ParameterError(
                f"oracles[{i}] was recorded with max_tokens={o.max_tokens}, the sweep asks for "
                f"max_tokens={job.max_tokens}"
            )
        if o.depth < job.depth:
            raise ParameterError(f"oracles[{i}] was recorded to depth {o.depth}, the sweep asks for n_max={job.depth}")
        recorded = drafters.recorded_options(o.settings)
        differ = {k: (recorded[k], v) for k, v in wanted.items() if k in recorded and recorded[k] != v}
        if differ:
            raise ParameterError(f"oracles[{i}] was recorded with other drafter options (recorded, asked): {differ}")
    return oracles


def _run_distributed(client, session: Session, mode: str, prompts: list, job: _Job, cost: CostModel, bar) -> list:
    """The prompts spread over the Dask workers; rows in the prompts' order."""
    from distributed import as_completed

    open_kwargs = dict(session.open_kwargs)
    futures = {
        client.submit(
            _run_on_worker,
            str(Path(session.path)),
            open_kwargs,
            mode,
            prompt,
            job,
            cost.to_dict() if cost is not None else None,
            pure=False,
        ): i
        for i, prompt in enumerate(prompts)
    }
    by_prompt: dict[int, list[dict]] = {}
    for fut in as_completed(futures):
        by_prompt[futures[fut]] = fut.result()
        bar.update(1)
    return [row for i in range(len(prompts)) for row in by_prompt[i]]


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="prompt", disable=not enabled, leave=False)


# -- recommend -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Recommendation:
    """The setting with the best tokens/s over a sweep's prompts (total tokens / total seconds)."""

    n_max: int
    p_min: float
    n_min: int
    drafter: str
    tokens_per_second: float
    runner_up: dict[str, Any] | None
    margin_over_runner_up: float  # best / runner-up - 1
    plain_tokens_per_second: float
    margin_over_plain: float  # best / plain - 1
    table: Any  # every setting, best first (pandas DataFrame)
    #: the larger run-to-run spread of the best and the runner-up (a measured sweep's ``tokens_per_second_spread``,
    #: the largest over the prompts; NaN where simulated)
    spread: float = math.nan
    note: str = ""  #: in words, when the margin over the runner-up is within that spread
    #: with the sweep's oracles (``recommend(df, oracles)``): whether a draft-length schedule beats the best fixed
    #: ``n_max`` of the recommended drafter and ``p_min`` (:func:`~mtp_explorer.schedule_advice`; None where not
    #: asked, or where the recommended drafter cannot be scheduled: plain, a chain, a look-up with state)
    schedules: ScheduleAdvice | None = None

    @property
    def drafters(self) -> Any:
        """The drafters ranked: each drafter's best setting (one row of :attr:`table` per drafter, best first) and its
        tokens/s against the best drafter's (``vs_best``, 1.0 for the first) and plain decoding's (``vs_plain``)."""
        ranked = self.table.drop_duplicates("drafter").reset_index(drop=True)  # the table is sorted, best first
        ranked["vs_best"] = ranked["tokens_per_second"] / self.tokens_per_second
        ranked["vs_plain"] = ranked["tokens_per_second"] / self.plain_tokens_per_second
        return ranked

    @property
    def settings(self) -> DraftSettings:
        """The recommended setting, ready for ``Session.generate(prompt, settings)``."""
        return DraftSettings(n_max=self.n_max, p_min=self.p_min, n_min=self.n_min, drafter=self.drafter)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("table", "schedules")}
        advice = self.schedules
        d["schedules"] = None if advice is None else {k: v for k, v in vars(advice).items() if k != "table"}
        return d


_RECOMMEND_NEEDS = ["prompt", "n_tokens", "tokens_per_second", "plain_tokens_per_second", "acceptance_rate"]


def recommend(df, oracles: Sequence[OracleTrace] | None = None) -> Recommendation:
    """Pick the setting with the best tokens/s over all prompts of a sweep and say by how much it
    beats the runner-up and plain decoding (the ``n_max = 0`` rows, else the cost model's plain
    rate). With the sweep's ``oracles`` (one per prompt, ``sweep(..., oracles=...)``), also whether a draft-length
    schedule would beat the best fixed ``n_max`` of the recommended drafter there, and by how much
    (:attr:`Recommendation.schedules`). A table without rows or without those columns raises
    :class:`~mtp_explorer.ParameterError`."""
    keys = ["drafter", "n_max", "p_min", "n_min"]
    missing = [c for c in keys + _RECOMMEND_NEEDS if c not in getattr(df, "columns", ())]
    if missing:
        raise ParameterError(f"recommend needs a sweep's DataFrame; it lacks the columns {missing}")
    if df.empty:
        raise ParameterError("empty sweep: no setting to recommend")
    d = df.copy()
    d["_sec"] = d["n_tokens"] / d["tokens_per_second"]
    d["_plain_sec"] = d["n_tokens"] / d["plain_tokens_per_second"]
    if "tokens_per_second_spread" not in d:
        d["tokens_per_second_spread"] = math.nan
    agg = d.groupby(keys, as_index=False).agg(
        n_tokens=("n_tokens", "sum"),
        seconds=("_sec", "sum"),
        plain_seconds=("_plain_sec", "sum"),
        acceptance_rate=("acceptance_rate", "mean"),
        n_prompts=("prompt", "nunique"),
        tokens_per_second_spread=("tokens_per_second_spread", "max"),
    )
    agg["tokens_per_second"] = agg["n_tokens"] / agg["seconds"]
    agg = agg.sort_values("tokens_per_second", ascending=False, kind="stable").reset_index(drop=True)
    best = agg.iloc[0]
    runner = agg.iloc[1] if len(agg) > 1 else None
    plain_rows = agg[agg["n_max"] == 0]
    if len(plain_rows):
        plain = float(plain_rows["tokens_per_second"].max())
    else:
        plain = float(agg["n_tokens"].iloc[0] / agg["plain_seconds"].iloc[0])
    tps = float(best["tokens_per_second"])
    margin = (tps / float(runner["tokens_per_second"]) - 1.0) if runner is not None else math.nan
    spread = float(
        np.fmax(best["tokens_per_second_spread"], runner["tokens_per_second_spread"])
        if runner is not None
        else best["tokens_per_second_spread"]
    )
    note = ""
    if margin <= spread:
        note = (
            f"the best setting beats the runner-up by {margin:.1%}, within the runs' spread of {spread:.1%}: "
            "the two are not told apart; measure more repeats or longer generations"
        )
    advice = None
    if oracles is not None and int(best["n_max"]) > 0:
        try:
            advice = schedule_advice(
                oracles, int(agg["n_max"].max()), float(best["p_min"]), int(best["n_min"]), drafter=str(best["drafter"])
            )
        except ParameterError:  # a drafter the schedules cannot replay (a chain, a look-up with state)
            advice = None
    return Recommendation(
        n_max=int(best["n_max"]),
        p_min=float(best["p_min"]),
        n_min=int(best["n_min"]),
        drafter=str(best["drafter"]),
        tokens_per_second=tps,
        runner_up=None
        if runner is None
        else {k: (runner[k].item() if hasattr(runner[k], "item") else runner[k]) for k in keys + ["tokens_per_second"]},
        margin_over_runner_up=margin,
        plain_tokens_per_second=plain,
        margin_over_plain=tps / plain - 1.0 if plain > 0 else math.nan,
        table=agg.drop(columns=["plain_seconds"]),
        spread=spread,
        note=note,
        schedules=advice,
    )


__all__ = ["COLUMNS", "Recommendation", "recommend", "sweep", "ceiling_tokens_per_second", "OracleTrace"]
