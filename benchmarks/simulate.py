"""The what-if simulator: replay speed, exactness against real runs, predicted vs measured tokens/s.

    .venv/bin/python benchmarks/simulate.py [--model PATH] [--tokens 512] [--prompts 10] [--repeats 5]
                                            [--threads 1] [--clock wall|cpu]
                                            [--skip speed lookups exactness timing]

Prints JSON:

- ``speed``: a full 8 (n_max 1..8) x 10 (p_min 0..0.9) grid over ``--prompts`` oracle traces of
  ``--tokens`` tokens with :func:`mtp_explorer.simulate_grid` (seconds: first call, which also fits
  the cost models, and the median of warm calls; target: under 1 s), and one :func:`simulate`
  call (what a slider callback pays).
- ``lookups``: one :func:`simulate` call of each look-up drafter whose drafts depend on its state along the path
  (ngram-mod, ngram-map-k, ngram-map-k4v, ngram-cache: the engine's drafter walked position by position), on
  ``--prompts`` oracles recorded with small n-gram sizes so that they draft; median ms per call over n_max 1..8.
- ``exactness``: real runs over 6 n_max x 5 p_min on 3 prompts compared step by step with the
  simulator (:func:`mtp_explorer.compare`): exact cases, floating-point argmax ties, unexplained.
- ``timing``: for a few settings, the simulator's predicted tokens/s beside the engine's measured
  tokens/s (wall clock, decode phases; median over ``--repeats`` interleaved rounds, each with its
  own oracle recorded right before the runs), their ratio, and the robust ratio of
  :func:`mtp_explorer.cost_consistency` (typical step vs prediction, spikes of other processes
  aside). ``load`` tells how busy the machine was: the mean over the median of the oracle's
  single-token verify times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import emit, machine, pick_model

import mtp_explorer as mx
from mtp_explorer.analysis.compare import compare
from mtp_explorer.analysis.consistency import cost_consistency
from mtp_explorer.analysis.grid import simulate_grid
from mtp_explorer.analysis.simulate import simulate

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    "    return self._value",
    "# Copyright",
    "with open(path) as f:",
    "if __name__ == '__main__':",
    "def parse_args(argv):",
    "from typing import Any\n\n",
]
#: (n_max, p_min, drafter); "chain" is the short spelling of ngram-simple,draft-mtp with chain_policy="best"
TIMING_SETTINGS = [
    (0, 0.0, "draft-mtp"),
    (1, 0.0, "draft-mtp"),
    (2, 0.0, "draft-mtp"),
    (3, 0.0, "draft-mtp"),
    (4, 0.5, "draft-mtp"),
    (8, 0.0, "draft-mtp"),
    (4, 0.0, "ngram-simple"),
    (4, 0.0, "chain"),
]
#: the same for a model without MTP layers (Gemma 3 270M): plain decoding and the look-up drafters
LOOKUP_TIMING_SETTINGS = [
    (0, 0.0, "ngram-simple"),
    (2, 0.0, "ngram-simple"),
    (4, 0.0, "ngram-simple"),
    (8, 0.0, "ngram-simple"),
    (4, 0.0, "ngram-mod"),
    (4, 0.0, "ngram-map-k"),
]


def bench_speed(s: mx.Session, prompts: list[str], tokens: int) -> dict:
    t0 = time.perf_counter()
    probed = s.record_oracle(prompts[0], max_tokens=tokens, depth=8)
    oracles = [probed] + [s.record_oracle(p, max_tokens=tokens, depth=8, probe=False) for p in prompts[1:]]
    oracles = [o.with_cost(probed.fitted_cost) for o in oracles]
    record_s = time.perf_counter() - t0
    n_max = list(range(1, 9))
    p_min = [round(0.1 * i, 1) for i in range(10)]
    fresh = [mx.OracleTrace.from_json(o.to_json()) for o in oracles]  # no cached derived arrays
    t0 = time.perf_counter()
    df = simulate_grid(fresh, n_max, p_min)
    first = time.perf_counter() - t0
    warm = []
    for _ in range(5):
        t0 = time.perf_counter()
        simulate_grid(oracles, n_max, p_min)
        warm.append(time.perf_counter() - t0)
    one = []
    for i in range(50):
        t0 = time.perf_counter()
        simulate(oracles[i % len(oracles)], 1 + i % 8, p_min[i % 10])
        one.append(time.perf_counter() - t0)
    return {
        "oracles": len(oracles),
        "tokens_per_oracle": [o.n_positions for o in oracles],
        "grid": f"{len(n_max)} n_max x {len(p_min)} p_min",
        "rows": len(df),
        "record_seconds": record_s,
        "grid_seconds_first_call": first,
        "grid_seconds_warm_median": statistics.median(warm),
        "under_1s": first < 1.0 and statistics.median(warm) < 1.0,
        "simulate_one_ms_median": 1e3 * statistics.median(one),
    }


#: small n-gram sizes, so that the look-ups draft on short code prompts (llama.cpp's defaults find few matches)
LOOKUP_OPTIONS = {
    "ngram_mod_n_match": 3,
    "ngram_mod_n_min": 1,
    "ngram_mod_n_max": 8,
    "ngram_map_k_size_n": 2,
    "ngram_map_k_size_m": 8,
    "ngram_map_k4v_size_n": 2,
    "ngram_map_k4v_size_m": 8,
}
STATEFUL_LOOKUPS = ("ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache")


def bench_lookups(s: mx.Session, prompts: list[str], tokens: int, rounds: int = 3) -> dict:
    oracles = [s.record_oracle(p, max_tokens=tokens, depth=8, probe=False, **LOOKUP_OPTIONS) for p in prompts]
    out = {}
    for drafter in STATEFUL_LOOKUPS:
        times, drafted = [], 0
        for _ in range(rounds):
            for o in oracles:
                for n_max in range(1, 9):
                    t0 = time.perf_counter()
                    r = simulate(o, n_max, 0.0, drafter=drafter)
                    times.append(time.perf_counter() - t0)
                    drafted += int(r.summary()["n_drafted"])
        out[drafter] = {
            "calls": len(times),
            "simulate_one_ms_median": 1e3 * statistics.median(times),
            "simulate_one_ms_quartiles": [1e3 * q for q in statistics.quantiles(times, n=4)[::2]],
            "tokens_drafted": drafted,
        }
    return {"oracles": len(oracles), "tokens_per_oracle": tokens, "options": LOOKUP_OPTIONS, "drafters": out}


def bench_exactness(s: mx.Session, prompts: list[str], tokens: int) -> dict:
    cases = exact = 0
    ties, unexplained = [], []
    for prompt in prompts:
        o = s.record_oracle(prompt, max_tokens=tokens, depth=8, probe=False)
        for n_max in (1, 2, 3, 4, 6, 8):
            for p_min in (0.0, 0.3, 0.5, 0.7, 0.9):
                real = s.generate(prompt, max_tokens=tokens, n_max=n_max, p_min=p_min)
                cmp = compare(o, real)
                cases += 1
                exact += cmp.exact
                case = {"prompt": prompt, "n_max": n_max, "p_min": p_min}
                ties += [case | m for m in cmp.ties]
                unexplained += [case | m for m in cmp.unexplained]
    return {"cases": cases, "exact": exact, "ties": ties, "unexplained": unexplained}


def bench_timing(s: mx.Session, prompt: str, tokens: int, repeats: int) -> dict:
    settings = TIMING_SETTINGS if s.info.has_mtp else LOOKUP_TIMING_SETTINGS
    pred: dict = {k: [] for k in settings}
    meas: dict = {k: [] for k in settings}
    robust: dict = {k: [] for k in settings}
    load = []
    for _ in range(repeats):
        o = s.record_oracle(prompt, max_tokens=tokens, depth=8)
        v = o.columns["t_verify_ns"].astype(float)
        load.append(float(v.mean() / np.median(v)))
        for key in settings:
            n_max, p_min, drafter = key
            t = s.generate(prompt, max_tokens=tokens, n_max=n_max, p_min=p_min, drafter=drafter)
            meas[key].append(t.summary()["tokens_per_second"])
            pred[key].append(simulate(o, n_max, p_min, drafter=drafter).summary()["tokens_per_second"])
            if compare(o, t).exact:
                robust[key].append(cost_consistency(o, t)["ratio_robust"])
    rows = []
    for key in settings:
        p, m = statistics.median(pred[key]), statistics.median(meas[key])
        rows.append(
            {
                "n_max": key[0],
                "p_min": key[1],
                "drafter": key[2],
                "predicted_tokens_per_second": p,
                "measured_tokens_per_second": m,
                "predicted_over_measured": p / m,
                "within_10pct": abs(p / m - 1) <= 0.10,
                "robust_measured_over_predicted": statistics.median(robust[key]) if robust[key] else None,
                "measured_spread": [min(meas[key]), max(meas[key])],
            }
        )
    return {
        "prompt": prompt,
        "tokens": tokens,
        "rounds": repeats,
        "load_mean_over_median": statistics.median(load),
        "settings": rows,
        "within_10pct": sum(r["within_10pct"] for r in rows),
        "median_abs_error": statistics.median(abs(r["predicted_over_measured"] - 1) for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time phases with the wall clock or the thread's CPU time (one thread: other processes' load left out)",
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["speed", "lookups", "exactness", "timing"])
    args = ap.parse_args()
    path, origin = pick_model(args.model)
    out: dict = {"model": str(path), "model_origin": origin, "machine": machine()}
    prompts = (PROMPTS * ((args.prompts + len(PROMPTS) - 1) // len(PROMPTS)))[: args.prompts]
    with mx.Session.open(
        path, n_ctx=max(2048, args.tokens + 64), threads=args.threads, n_rs_seq=8, clock=args.clock
    ) as s:
        out["threads"], out["clock"] = s.threads, s.clock
        s.generate(prompts[0], max_tokens=16, n_max=2 if s.info.has_mtp else 0)  # warm-up
        if "speed" not in args.skip:
            out["speed"] = bench_speed(s, prompts, args.tokens)
        if "lookups" not in args.skip:
            out["lookups"] = bench_lookups(s, prompts, args.tokens)
        if "exactness" not in args.skip:
            out["exactness"] = bench_exactness(s, prompts[:3], min(args.tokens, 128))
        if "timing" not in args.skip:
            out["timing"] = bench_timing(s, prompts[0], min(args.tokens, 256), args.repeats)
    emit(out)


if __name__ == "__main__":
    main()
