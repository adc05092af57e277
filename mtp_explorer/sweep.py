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
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .oracle import CostModel, OracleTrace
from .session import Session
from .simulate import ceiling_tokens_per_second, simulate_grid

DEFAULT_N_MAX = (0, 1, 2, 3, 4)
DEFAULT_P_MIN = (0.0, 0.3, 0.5, 0.7, 0.9)

COLUMNS = (
    "prompt", "mode", "drafter", "n_max", "p_min", "n_min", "n_tokens", "n_steps", "n_drafted", "n_accepted",
    "acceptance_rate", "mean_accepted_length", "acceptance_by_depth", "tokens_per_second",
    "ceiling_tokens_per_second", "plain_tokens_per_second", "seconds", "tokens_digest",
)
"""Columns of a sweep's DataFrame (one row per prompt and setting)."""


def _digest(tokens: Sequence[int]) -> str:
    return hashlib.sha1(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:16]


def _settings(n_max: Sequence[int], p_min: Sequence[float], n_min) -> list[tuple[int, float, int]]:
    out = []
    for n in n_max:
        for p in p_min:
            m = min(int(n_min), int(n))
            out.append((int(n), float(p), m))
    return out


# -- one prompt (runs here or on a worker) -------------------------------------------------------------
def _simulate_prompt(session: Session, prompt, settings, drafters: Sequence[str], max_tokens: int, depth: int,
                     cost: CostModel | None, ngram: tuple[int, int]) -> list[dict]:
    """One oracle of ``prompt`` (it holds both the MTP and the n-gram drafts), replayed for every
    drafter and setting."""
    oracle = session.record_oracle(prompt, max_tokens=max_tokens, depth=depth, ngram_n=ngram[0], ngram_m=ngram[1],
                                   probe=cost is None)
    if cost is not None:
        oracle = oracle.with_cost(cost)
    n_max = sorted({s[0] for s in settings})
    p_min = sorted({s[1] for s in settings})
    n_min = max(s[2] for s in settings)
    wanted = set(settings)
    rows = []
    digest = _digest(oracle.tokens)
    for drafter in drafters:
        df = simulate_grid(oracle, n_max, p_min, n_min, drafter=drafter, labels=[prompt])
        for rec in df.to_dict("records"):
            if (rec["n_max"], rec["p_min"], rec["n_min"]) in wanted:
                rec["mode"] = "simulate"
                rec["tokens_digest"] = digest
                rows.append(rec)
    return rows


def _measure_prompt(session: Session, prompt, settings, drafters: Sequence[str], max_tokens: int, depth: int,
                    cost: CostModel, ngram: tuple[int, int], repeats: int) -> list[dict]:
    """Real runs of ``prompt``: one plain baseline, then every drafter and setting; the ceiling with
    every draft accepted from ``cost`` at the positions of this prompt's generation (an oracle
    recorded without probes)."""
    oracle = session.record_oracle(prompt, max_tokens=max_tokens, depth=depth, ngram_n=ngram[0], ngram_m=ngram[1],
                                   probe=False).with_cost(cost)
    ceiling = {(d, n): ceiling_tokens_per_second(oracle, n, d) for d in drafters for n in {st[0] for st in settings}}
    plain_tps = []
    for _ in range(repeats):
        plain_tps.append(session.generate(prompt, max_tokens=max_tokens, n_max=0).summary()["tokens_per_second"])
    plain = float(np.median(plain_tps))
    rows = []
    for drafter, (n_max, p_min, n_min) in ((d, st) for d in drafters for st in settings):
        tps, secs = [], []
        for _ in range(repeats):
            t = session.generate(prompt, max_tokens=max_tokens, n_max=n_max, p_min=p_min, n_min=n_min,
                                 drafter=drafter, ngram_n=ngram[0], ngram_m=ngram[1])
            s = t.summary()
            tps.append(s["tokens_per_second"])
            secs.append(sum(s["phase_seconds"].values()))
        rows.append({
            "prompt": prompt, "mode": "measure", "drafter": drafter, "n_max": n_max, "p_min": p_min, "n_min": n_min,
            "n_tokens": s["n_tokens"], "n_steps": s["n_steps"], "n_drafted": s["n_drafted"],
            "n_accepted": s["n_accepted"], "acceptance_rate": s["acceptance_rate"],
            "mean_accepted_length": s["mean_accepted_length"], "acceptance_by_depth": s["acceptance_by_depth"],
            "tokens_per_second": float(np.median(tps)), "ceiling_tokens_per_second": ceiling[drafter, n_max],
            "plain_tokens_per_second": plain, "seconds": float(np.median(secs)), "tokens_digest": _digest(t.tokens),
        })
    return rows


_WORKER_SESSIONS: dict[tuple, Session] = {}


def _worker_session(path: str, open_kwargs: dict) -> Session:
    key = (path, tuple(sorted(open_kwargs.items())))
    s = _WORKER_SESSIONS.get(key)
    if s is None or s.closed:
        s = _WORKER_SESSIONS[key] = Session.open(path, **open_kwargs)
    return s


def _run_on_worker(path: str, open_kwargs: dict, mode: str, prompt, settings, drafters: list[str], max_tokens: int,
                   depth: int, cost: dict | None, ngram: tuple[int, int], repeats: int) -> list[dict]:
    """A Dask task: one prompt on this worker's own session (opened from the model path)."""
    session = _worker_session(path, open_kwargs)
    if mode == "simulate":
        return _simulate_prompt(session, prompt, settings, drafters, max_tokens, depth,
                                CostModel.from_dict(cost) if cost else None, ngram)
    return _measure_prompt(session, prompt, settings, drafters, max_tokens, depth, CostModel.from_dict(cost), ngram,
                           repeats)


# -- sweep ----------------------------------------------------------------------------------------------
def sweep(session: Session, prompts: str | Iterable, n_max: Sequence[int] = DEFAULT_N_MAX,
          p_min: Sequence[float] = DEFAULT_P_MIN, n_min: int = 0, mode: str = "simulate", client=None, *,
          max_tokens: int = 128, drafter: str | Sequence[str] = "mtp", cost: CostModel | None = None,
          repeats: int = 1, ngram_n: int | None = None, ngram_m: int | None = None, progress: bool = True):
    """Every prompt under every (``n_max``, ``p_min``) setting: a pandas DataFrame with one row per
    prompt, drafter and setting (columns :data:`COLUMNS`).

    ``drafter``: ``"mtp"``, ``"ngram"``, ``"chain"`` or several of them (e.g. ``mx.DRAFTER_MODES``);
    in simulate mode one oracle per prompt serves them all.

    ``mode="simulate"``: one oracle per prompt, replayed for each setting; times from ``cost`` or
    else one cost model measured here on the first prompt. ``mode="measure"``: real runs (``repeats``
    each, median tokens/s), plus a plain run per prompt for ``plain_tokens_per_second``; its
    ``ceiling_tokens_per_second`` (every draft accepted) comes from the same cost model, priced at
    the positions of each prompt's generation.
    ``client``: a ``dask.distributed.Client`` to spread the prompts over its workers.
    """
    import pandas as pd

    from .session import DEFAULT_NGRAM_M, DEFAULT_NGRAM_N
    from .trace import DRAFTER_MODES

    if mode not in ("simulate", "measure"):
        raise ValueError(f"mode must be 'simulate' or 'measure', got {mode!r}")
    drafters = [drafter] if isinstance(drafter, str) else list(drafter)
    if not drafters:
        raise ValueError("no drafter")
    for d in drafters:
        if d not in DRAFTER_MODES:
            raise ValueError(f"drafter must be one of {DRAFTER_MODES} (or several of them), got {d!r}")
    if len(set(drafters)) != len(drafters):
        raise ValueError(f"drafter lists one drafter twice: {drafters}")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("no prompts")
    n_max = [int(n) for n in n_max]
    p_min = [float(p) for p in p_min]
    if not n_max or not p_min:
        raise ValueError("n_max and p_min need at least one value each")
    for n in n_max:
        if not 0 <= n <= session.capacity:
            raise ValueError(f"n_max={n} is outside this session's capacity 0..{session.capacity}")
    for p in p_min:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p_min={p} is outside [0, 1]")
    settings = _settings(n_max, p_min, n_min)
    depth = max(1, max(n_max))
    ngram = (ngram_n or DEFAULT_NGRAM_N, ngram_m or DEFAULT_NGRAM_M)
    if cost is None:
        cost = session.record_oracle(prompts[0], max_tokens=max_tokens, depth=depth, ngram_n=ngram[0],
                                     ngram_m=ngram[1]).fitted_cost

    rows: list[dict] = []
    bar = _progress(len(prompts), f"sweep ({mode})", progress)
    try:
        if client is None:
            for prompt in prompts:
                if mode == "simulate":
                    rows += _simulate_prompt(session, prompt, settings, drafters, max_tokens, depth, cost, ngram)
                else:
                    rows += _measure_prompt(session, prompt, settings, drafters, max_tokens, depth, cost, ngram,
                                            repeats)
                bar.update(1)
        else:
            from distributed import as_completed

            open_kwargs = dict(session.open_kwargs)
            futures = {
                client.submit(_run_on_worker, str(Path(session.path)), open_kwargs, mode, prompt, settings, drafters,
                              max_tokens, depth, cost.to_dict() if cost is not None else None, ngram, repeats,
                              pure=False): i
                for i, prompt in enumerate(prompts)
            }
            by_prompt: dict[int, list[dict]] = {}
            for fut in as_completed(futures):
                by_prompt[futures[fut]] = fut.result()
                bar.update(1)
            for i in range(len(prompts)):
                rows += by_prompt[i]
    finally:
        bar.close()
    df = pd.DataFrame(rows)
    return df[list(COLUMNS)]


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
    margin_over_runner_up: float          # best / runner-up - 1
    plain_tokens_per_second: float
    margin_over_plain: float              # best / plain - 1
    table: Any                            # every setting, best first (pandas DataFrame)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("table")
        return d


def recommend(df) -> Recommendation:
    """Pick the setting with the best tokens/s over all prompts of a sweep and say by how much it
    beats the runner-up and plain decoding (the ``n_max = 0`` rows, else the cost model's plain
    rate)."""
    if df.empty:
        raise ValueError("empty sweep")
    keys = ["drafter", "n_max", "p_min", "n_min"]
    d = df.copy()
    d["_sec"] = d["n_tokens"] / d["tokens_per_second"]
    d["_plain_sec"] = d["n_tokens"] / d["plain_tokens_per_second"]
    agg = d.groupby(keys, as_index=False).agg(n_tokens=("n_tokens", "sum"), seconds=("_sec", "sum"),
                                              plain_seconds=("_plain_sec", "sum"),
                                              acceptance_rate=("acceptance_rate", "mean"),
                                              n_prompts=("prompt", "nunique"))
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
    return Recommendation(
        n_max=int(best["n_max"]), p_min=float(best["p_min"]), n_min=int(best["n_min"]), drafter=str(best["drafter"]),
        tokens_per_second=tps,
        runner_up=None if runner is None else {k: (runner[k].item() if hasattr(runner[k], "item") else runner[k])
                                               for k in keys + ["tokens_per_second"]},
        margin_over_runner_up=(tps / float(runner["tokens_per_second"]) - 1.0) if runner is not None else math.nan,
        plain_tokens_per_second=plain,
        margin_over_plain=tps / plain - 1.0 if plain > 0 else math.nan,
        table=agg.drop(columns=["plain_seconds"]),
    )


__all__ = ["COLUMNS", "Recommendation", "recommend", "sweep", "ceiling_tokens_per_second", "OracleTrace"]
