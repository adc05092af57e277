"""A measured sweep of llama-server's settings (``mx.server_sweep``) beside the explorer's prediction of every cell
(``ServerSweep.with_predictions``), on the bundled model and (``--scale``) on the SYNTHETIC 0.4 B Q8_0 model of
``benchmarks/scale_model.py``.

The grid: ``--spec-type`` draft-mtp and ngram-simple,draft-mtp at ``--spec-draft-n-max`` 2 and 3, and plain
decoding, each at ``-np`` 1, 2 and 4 (15 configurations), every configuration on ``--repeats`` fresh servers (the
server's own run-to-run spread). The workload: 8 greedy ``/completion`` requests sent at once, in two categories
(``demo``: long code prompts from the bundled model's held-out files; ``short``: one-line code starts).

For each model it prints, per configuration, measured and predicted tokens/s (aggregate) with the relative error and
the measured spread, measured and predicted acceptance, and per request whether the predicted server counters
(``tokens_predicted``, ``draft_n``, ``draft_n_accepted``) are the measured ones; and a summary: the median |tokens/s
error| against the median spread, how many cells lie outside the server's own range, and the share of single-slot
(``-np 1``) request runs whose counters were predicted exactly (the others listed, with whether the server itself
varied between runs).

    make server
    LLAMA_SERVER=build/reference/bin/llama-server .venv/bin/python benchmarks/server_sweep.py [--scale] [--repeats 2]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import mtp_explorer as mx
from mtp_explorer.server import Workload

from _common import emit, machine

SHORT = ["def fib(n):", "import os\n\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
         "for i in range(10):"]
GRIDS = ({"spec_type": ["draft-mtp", "ngram-simple,draft-mtp"], "n_max": [2, 3], "n_parallel": [1, 2, 4]},
         {"spec_type": ["none"], "n_parallel": [1, 2, 4]})


def workload(n_predict: int) -> Workload:
    demo = [p.text for p in mx.demo_prompts()[:4]]
    return Workload.from_prompts(demo + SHORT, n_predict, categories=["demo"] * len(demo) + ["short"] * len(SHORT))


def _cells(frame) -> list[dict]:
    keep = ["spec_type", "n_max", "n_parallel", "category", "status", "tokens_per_second",
            "predicted_tokens_per_second", "tokens_per_second_error", "tokens_per_second_spread", "beyond_spread",
            "acceptance", "predicted_acceptance", "n_drafted", "predicted_n_drafted", "n_accepted",
            "predicted_n_accepted", "counts_vary", "latency_p50", "latency_p95", "prediction_note"]
    return [{k: row.get(k) for k in keep} for row in frame.to_dict(orient="records")]


def one_model(path: Path, label: str, args) -> dict:
    wl = workload(args.tokens)
    t0 = time.perf_counter()
    sweeps = [mx.server_sweep(path, wl, grid, threads=args.threads, n_ctx=4096 * 4, binary=args.binary,
                              timeout_s=args.timeout, repeats=args.repeats, progress=False) for grid in GRIDS]
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with mx.Session.open(path, threads=args.threads, n_ctx=4096 * 4, n_parallel=4, n_rs_seq=3) as s:
        costs = mx.profile_batch_costs(s, n_parallel=[1, 2, 4], n_max=[0, 2, 3])
        predicted = [sw.with_predictions(s, costs=costs, progress=False) for sw in sweeps]
    predict_s = time.perf_counter() - t0
    import pandas as pd

    frame = pd.concat([p.frame for p in predicted], ignore_index=True)
    requests = pd.concat([p.requests for p in predicted], ignore_index=True)
    everything = frame[(frame["category"] == "all") & (frame["status"] == "ok")]
    single = requests[(requests["n_parallel"] == 1) & requests["spec_type"].ne("none")]
    varied = {(r["spec_type"], r["n_max"], r["request"]) for _, r in single.iterrows()
              if len(set(single[(single["spec_type"] == r["spec_type"]) & (single["n_max"] == r["n_max"])
                                & (single["request"] == r["request"])]["draft_n"])) > 1}
    misses = [{"spec_type": r["spec_type"], "n_max": int(r["n_max"]), "request": int(r["request"]),
               "repeat": int(r["repeat"]), "measured": [int(r["draft_n"]), int(r["draft_n_accepted"])],
               "predicted": [int(r["predicted_draft_n"]), int(r["predicted_draft_n_accepted"])],
               "server_varied": (r["spec_type"], r["n_max"], r["request"]) in varied}
              for _, r in single[~single["counts_match"].astype(bool)].iterrows()]
    errors = everything["tokens_per_second_error"].abs()
    return {
        "model": label, "path": str(path), "configurations": int(len(everything)), "sweep_seconds": sweep_s,
        "predict_seconds": predict_s,
        "summary": {
            "median_abs_tokens_per_second_error": float(errors.median()),
            "max_abs_tokens_per_second_error": float(errors.max()),
            "median_run_to_run_spread": float(everything["tokens_per_second_spread"].median()),
            "cells_beyond_spread": int(everything["beyond_spread"].astype(bool).sum()),
            "single_slot_request_runs": int(len(single)),
            "single_slot_counts_exact": int(single["counts_match"].astype(bool).sum()),
            "all_request_runs": int(requests["spec_type"].ne("none").sum()),
            "all_counts_exact": int(requests[requests["spec_type"].ne("none")]["counts_match"].astype(bool).sum()),
            "acceptance_abs_error_median": float(everything["acceptance_error"].abs().median()),
        },
        "single_slot_mismatches": misses,
        "cells": _cells(frame),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="store_true", help="also the SYNTHETIC 0.4 B Q8_0 model")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--binary", default=os.environ.get("LLAMA_SERVER"))
    args = ap.parse_args()
    models = [(mx.default_model_path(), "bundled")]
    if args.scale:
        from scale_model import write_scale_model

        models.append((write_scale_model(log=lambda *_: None), "SYNTHETIC 0.4B Q8_0"))
    emit({"benchmark": "server_sweep", "machine": machine(), "repeats": args.repeats, "tokens": args.tokens,
          "threads": args.threads, "grids": list(GRIDS),
          "models": [one_model(path, label, args) for path, label in models]})


if __name__ == "__main__":
    main()
