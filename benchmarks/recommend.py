"""Recommend without sweeping: the setting picked from one recording against the exhaustive measured sweep's pick.

For each prompt category (code, prose): one oracle per prompt and :func:`mtp_explorer.recommend` of the simulated
sweep (``mode="simulate"`` on those oracles: the time to recommend, recording included), then the exhaustive
measured sweep of the same grid (``mode="measure"``: ``--repeats`` runs per setting alternating with plain runs) and
its own recommendation. The regret is the measured tokens/s of the sweep's pick over that of the recommendation, minus
one, both read from the measured sweep; it is judged against the measured sweep's run-to-run spread of the two
settings (:attr:`~mtp_explorer.Recommendation.spread`). Timed: run it on a quiet machine.

    .venv/bin/python benchmarks/recommend.py [--model PATH] [--threads 2] [--tokens 128] [--repeats 5]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import time

from _common import CATEGORIES, emit, machine, pick_model

import mtp_explorer as mx

N_MAX = [0, 1, 2, 3, 4]
P_MIN = [0.0, 0.5, 0.8]


def one_category(session: mx.Session, prompts: list[str], tokens: int, repeats: int) -> dict:
    grid = dict(n_max=N_MAX, p_min=P_MIN, max_tokens=tokens, progress=False)
    t0 = time.perf_counter()
    oracles = [session.record_oracle(p, max_tokens=tokens, depth=max(N_MAX)) for p in prompts]
    picked = mx.recommend(mx.sweep(session, prompts, oracles=oracles, **grid))
    recommend_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    measured = mx.sweep(session, prompts, mode="measure", repeats=repeats, **grid)
    sweep_s = time.perf_counter() - t0
    best = mx.recommend(measured)
    table = best.table.set_index(["drafter", "n_max", "p_min", "n_min"])
    key = (picked.drafter, picked.n_max, picked.p_min, picked.n_min)
    at_pick = float(table.loc[key, "tokens_per_second"])
    regret = best.tokens_per_second / at_pick - 1.0
    spread = float(max(table.loc[key, "tokens_per_second_spread"], table.iloc[0]["tokens_per_second_spread"]))
    return {
        "recommended": {
            "n_max": picked.n_max,
            "p_min": picked.p_min,
            "predicted_tokens_per_second": picked.tokens_per_second,
            "measured_tokens_per_second": at_pick,
        },
        "sweep_pick": {"n_max": best.n_max, "p_min": best.p_min, "measured_tokens_per_second": best.tokens_per_second},
        "regret": regret,
        "spread": spread,
        "regret_within_spread": regret <= spread,
        "recommend_seconds": recommend_s,
        "sweep_seconds": sweep_s,
        "time_ratio": recommend_s / sweep_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model, label = pick_model(args.model)
    doc = {
        "benchmark": "recommend",
        "model": label,
        "path": str(model),
        "machine": machine(),
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "grid": {"n_max": N_MAX, "p_min": P_MIN},
    }
    with mx.Session.open(model, n_ctx=4096, threads=args.threads, n_rs_seq=max(N_MAX)) as session:
        doc["categories"] = {
            name: one_category(session, prompts, args.tokens, args.repeats) for name, prompts in CATEGORIES.items()
        }
    emit(doc)


if __name__ == "__main__":
    main()
