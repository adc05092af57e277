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
(``-np 1``) request runs whose counters were predicted exactly, per ``--spec-type``; each other one is listed with its
cause: the server's own run-to-run variation, the slot's history (alone on a fresh server the request gives the
predicted counters), a batch-shape near-tie (the server's text leaves plain greedy decoding at a token whose top-2
margin is within the file's measured shift), the look-up's draft length (llama-server 0.3.36 does not cut look-up
drafts to ``--spec-draft-n-max``), or unexplained.

    make server
    LLAMA_SERVER=build/reference/bin/llama-server .venv/bin/python benchmarks/server_sweep.py [--scale] [--repeats 2]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import collections
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


def _alone(path: Path, spec_type: str, n_max: int, prompt: str, n_predict: int, args):
    """A request's answer on a fresh one-slot server that serves nothing else."""
    with mx.LlamaServer(path, n_parallel=1, n_ctx=4096 * 4, threads=args.threads, spec_type=None, binary=args.binary,
                        args=["--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]) as server:
        return server.client().complete(prompt, n_predict)


def _divergence(path: Path, prompt: str, n_predict: int, n_max: int, text: str, args) -> dict | None:
    """Where the server's greedy ``text`` leaves plain greedy decoding (an oracle recorded here), with that
    position's one-row top-2 margin against the file's measured batch-shape shift; None if it does not."""
    with mx.Session.open(path, threads=args.threads, n_ctx=4096, n_rs_seq=max(3, n_max)) as s:
        oracle = s.record_oracle(prompt, max_tokens=n_predict, depth=n_max, probe=False, batch_shift=False)
        # the server decodes the whole prompt in one batch, where this engine decodes its last token alone:
        # the shift of batches of the prompt's size counts too
        n_prompt = min(len(oracle.prompt_tokens), 512)
        shift = s.batch_shift(sorted({*range(2, n_max + 2), n_prompt}), max_position=512)
    done = ""
    for i, piece in enumerate(oracle.pieces):
        if not text.startswith(done + piece):
            margin = float(oracle.columns["target_margin"][i])
            pos = int(oracle.columns["pos"][i])
            return {"token": i, "margin": margin, "tie": margin < shift.tolerance(None, pos),
                    "explanation": shift.explain(margin, None, pos)}
        done += piece
    return None


def _classify(single, wl: Workload, path: Path, args) -> list[dict]:
    """Each single-slot request whose counters differ from the prediction in some run, with its cause:
    ``server_run_to_run`` (the server's runs of it disagree), ``slot_history`` (alone on a fresh server it gives the
    predicted counters: what the slot served before changed them), ``batch_shape_tie`` (alone, the server's text
    leaves plain greedy decoding at a token whose one-row top-2 margin is within the file's measured batch-shape
    shift), ``lookup_cap`` (the configuration drafts with a look-up, whose drafts the server does not cut to n_max),
    else ``unexplained`` (a divergence past the shift included: a bug to report)."""
    out = []
    for (spec, n_max, i), runs in single.groupby(["spec_type", "n_max", "request"]):
        bad = runs[~runs["counts_match"].astype(bool)]
        if bad.empty:
            continue
        predicted = (int(runs.iloc[0]["predicted_draft_n"]), int(runs.iloc[0]["predicted_draft_n_accepted"]))
        req = wl.requests[i]
        done = _alone(path, spec, int(n_max), req.prompt, req.n_predict, args)
        alone = (done.draft_n, done.draft_n_accepted)
        lookups = any(d.is_lookup for d in mx.core.drafters.mode(spec).drafters)
        diverged = None if alone == predicted else _divergence(path, req.prompt, req.n_predict, int(n_max),
                                                               done.text, args)
        cause = ("server_run_to_run" if runs["draft_n"].nunique() > 1 else "slot_history" if alone == predicted
                 else ("batch_shape_tie" if diverged["tie"] else "unexplained") if diverged is not None
                 else "lookup_cap" if lookups else "unexplained")
        out.append({"spec_type": spec, "n_max": int(n_max), "request": int(i), "runs": len(runs),
                    "mismatched_runs": len(bad), "measured": sorted(set(zip(bad["draft_n"].astype(int),
                                                                            bad["draft_n_accepted"].astype(int)))),
                    "predicted": list(predicted), "alone_on_a_fresh_server": list(alone),
                    "server_text_leaves_plain_greedy": diverged, "cause": cause})
    return out


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
    misses = _classify(single, wl, path, args)
    errors = everything["tokens_per_second_error"].abs()
    return {
        "model": label, "path": str(path), "configurations": int(len(everything)), "sweep_seconds": sweep_s,
        "predict_seconds": predict_s,
        "summary": {
            "median_abs_tokens_per_second_error": float(errors.median()),
            "max_abs_tokens_per_second_error": float(errors.max()),
            "median_run_to_run_spread": float(everything["tokens_per_second_spread"].median()),
            "cells_beyond_spread": int(everything["beyond_spread"].astype(bool).sum()),
            "single_slot_counts_exact_by_spec_type": {
                spec: f"{int(g['counts_match'].astype(bool).sum())} of {len(g)}" for spec, g in single.groupby("spec_type")},
            "single_slot_mismatches_by_cause": dict(collections.Counter(m["cause"] for m in misses)),
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
