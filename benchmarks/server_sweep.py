"""A measured sweep of llama-server's settings (``mx.server_sweep``) beside the explorer's prediction of every cell
(``ServerSweep.with_predictions``), on the bundled model and (``--scale``) on the SYNTHETIC 0.4 B Q8_0 model of
``benchmarks/scale_model.py``.

The grid: ``--spec-type`` draft-mtp and ngram-simple,draft-mtp at ``--spec-draft-n-max`` 2 and 3, and plain
decoding, each at ``-np`` 1, 2 and 4 (15 configurations), every configuration on ``--repeats`` fresh servers (the
server's own run-to-run spread). The workload: 8 greedy ``/completion`` requests sent at once, in two categories
(``demo``: long code prompts from the bundled model's held-out files; ``short``: one-line code starts).

For each model it prints, per configuration, measured and predicted tokens/s (aggregate) with the relative error and
the measured spread, measured and predicted acceptance, and per request whether the predicted server counters
(``tokens_predicted``, ``draft_n``, ``draft_n_accepted``) are the measured ones; every request alone on two fresh
one-slot servers per drafting configuration (``single_requests``: predicted against measured, and whether the two
runs differ, the server's own nondeterminism); and a summary: the median |tokens/s error| against the median spread,
how many cells lie outside the server's own range, the single requests predicted exactly, and the share of
single-slot (``-np 1``) request runs of the sweep whose counters were predicted exactly, per ``--spec-type`` and for
those that ran first on their slot; each other one is listed with its cause: the server's own run-to-run variation,
the slot's carry (the server's draft-mtp head starts a request from the last hidden row of the request its slot served
before: reproduced on fresh servers with that request first), a batch-shape near-tie (the server's text leaves plain
greedy decoding at a token whose top-2 margin is within the file's measured shift), or unexplained.

The issue's bar is counted too: the cells whose |error| is at most twice their measured spread
(``cells_within_twice_spread``, and over ``-np`` 1 and 2 alone). The costs are measured after the sweep; with
``--bracket`` also before it, and each cell is predicted from both: the mean is judged, and the two predictions'
difference is the prediction's own spread (``predicted_spread``: how far the machine drifted over the sweep), combined
with the measured one in quadrature in ``cells_within_twice_combined_spread``. ``--overhead-seconds`` sizes the
server-overhead workloads by wall time (:func:`~mtp_explorer.server.profile_server_overhead`'s ``seconds``).

    make server
    LLAMA_SERVER=build/reference/bin/llama-server .venv/bin/python benchmarks/server_sweep.py [--scale] [--repeats 2] \
        [--bracket] [--overhead-seconds 10]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from pathlib import Path

from _common import emit, machine

import mtp_explorer as mx
from mtp_explorer.server import Workload, profile_server_overhead

SHORT = [
    "def fib(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
]
GRIDS = (
    {"spec_type": ["draft-mtp", "ngram-simple,draft-mtp"], "n_max": [2, 3], "n_parallel": [1, 2, 4]},
    {"spec_type": ["none"], "n_parallel": [1, 2, 4]},
)


def workload(n_predict: int) -> Workload:
    demo = [p.text for p in mx.demo_prompts()[:4]]
    return Workload.from_prompts(demo + SHORT, n_predict, categories=["demo"] * len(demo) + ["short"] * len(SHORT))


def _cells(frame) -> list[dict]:
    keep = [
        "spec_type",
        "n_max",
        "n_parallel",
        "category",
        "status",
        "tokens_per_second",
        "predicted_tokens_per_second",
        "tokens_per_second_error",
        "tokens_per_second_spread",
        "beyond_spread",
        "predicted_before_tokens_per_second",
        "predicted_spread",
        "combined_spread",
        "acceptance",
        "predicted_acceptance",
        "n_drafted",
        "predicted_n_drafted",
        "n_accepted",
        "predicted_n_accepted",
        "counts_vary",
        "latency_p50",
        "latency_p95",
        "prediction_note",
    ]
    return [{k: row.get(k) for k in keep} for row in frame.to_dict(orient="records")]


def _server(path: Path, spec_type: str, n_max: int, args) -> mx.LlamaServer:
    return mx.LlamaServer(
        path,
        n_parallel=1,
        n_ctx=4096 * 4,
        threads=args.threads,
        spec_type=None,
        binary=args.binary,
        args=["--spec-type", spec_type, "--spec-draft-n-max", str(n_max)],
    )


def _counts(done) -> list[int]:
    return [done.tokens_predicted, done.draft_n, done.draft_n_accepted]


def _alone(path: Path, spec_type: str, n_max: int, prompt: str, n_predict: int, args):
    """A request's answer on a fresh one-slot server that serves nothing else."""
    with _server(path, spec_type, n_max, args) as server:
        return server.client().complete(prompt, n_predict)


def _after(path: Path, spec_type: str, n_max: int, before, req, args):
    """A request's answer on a fresh one-slot server that served ``before`` (a request) just before it."""
    with _server(path, spec_type, n_max, args) as server:
        client = server.client()
        client.complete(before.prompt, before.n_predict)
        return client.complete(req.prompt, req.n_predict)


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
            return {
                "token": i,
                "margin": margin,
                "tie": margin < shift.tolerance(None, pos),
                "explanation": shift.explain(margin, None, pos),
            }
        done += piece
    return None


def _single_requests(single, wl: Workload, path: Path, args) -> list[dict]:
    """Every request of the workload alone on a fresh one-slot server (nothing served before it), twice, per drafting
    configuration: the measured counters ``[tokens_predicted, draft_n, draft_n_accepted]`` of both runs, the
    predicted ones, whether they are equal (``exact``) and whether the two runs differ (``run_to_run``: the server's
    own nondeterminism, not a prediction error)."""
    out = []
    for (spec, n_max), cell in single.groupby(["spec_type", "n_max"]):
        first = cell.groupby("request").first()
        for i, req in enumerate(wl.requests):
            predicted = [
                int(first.loc[i, k]) for k in ("predicted_tokens", "predicted_draft_n", "predicted_draft_n_accepted")
            ]
            measured = [_counts(_alone(path, spec, int(n_max), req.prompt, req.n_predict, args)) for _ in range(2)]
            out.append(
                {
                    "spec_type": spec,
                    "n_max": int(n_max),
                    "request": i,
                    "predicted": predicted,
                    "measured": measured,
                    "exact": all(m == predicted for m in measured),
                    "run_to_run": measured[0] != measured[1],
                }
            )
    return out


def _classify(single, alone: list[dict], wl: Workload, path: Path, args) -> list[dict]:
    """Each single-slot (-np 1) request run of the sweep whose counters differ from the prediction, with its cause:
    ``server_run_to_run`` (alone on two fresh servers the request's counters differ: the server's own
    nondeterminism), ``slot_carry`` (alone it gives the predicted counters, and on two fresh servers after the request
    its slot served before it in the sweep it gives the measured ones both times: llama-server's draft-mtp head
    pairs the request's first prompt token with that request's last hidden row, a deterministic carry the
    prediction of a fresh slot does not replay), ``slot_history`` (alone it gives the predicted counters, after its
    predecessor not the measured ones), ``batch_shape_tie`` (alone, the server's text leaves plain greedy decoding at
    a token whose one-row top-2 margin is within the file's measured batch-shape shift), else ``unexplained`` (a bug
    to report)."""
    by_request = {(a["spec_type"], a["n_max"], a["request"]): a for a in alone}
    out = []
    bad = single[~single["counts_match"].astype(bool)]
    for (spec, n_max, i, prev), runs in bad.groupby(["spec_type", "n_max", "request", "served_after"]):
        first = runs.iloc[0]
        predicted = [int(first[k]) for k in ("predicted_tokens", "predicted_draft_n", "predicted_draft_n_accepted")]
        measured = sorted(
            {(int(r.tokens_predicted), int(r.draft_n), int(r.draft_n_accepted)) for r in runs.itertuples()}
        )
        req, a = wl.requests[i], by_request[(spec, int(n_max), int(i))]
        row = {
            "spec_type": spec,
            "n_max": int(n_max),
            "request": int(i),
            "served_after": int(prev),
            "runs": len(runs),
            "measured": [list(m) for m in measured],
            "predicted": predicted,
            "alone_on_fresh_servers": a["measured"],
        }
        if a["run_to_run"]:
            row["cause"] = "server_run_to_run"
        elif a["measured"][0] != predicted:
            done = _alone(path, spec, int(n_max), req.prompt, req.n_predict, args)
            diverged = _divergence(path, req.prompt, req.n_predict, int(n_max), done.text, args)
            row["server_text_leaves_plain_greedy"] = diverged
            row["cause"] = "batch_shape_tie" if diverged is not None and diverged["tie"] else "unexplained"
        elif prev < 0:
            row["cause"] = "server_run_to_run"  # first on a fresh slot in the sweep, yet not as alone
        else:
            after = [_counts(_after(path, spec, int(n_max), wl.requests[int(prev)], req, args)) for _ in range(2)]
            row["after_its_predecessor_on_fresh_servers"] = after
            row["cause"] = (
                "slot_carry"
                if all(tuple(x) in measured for x in after) and after[0] == after[1]
                else "server_run_to_run"
                if after[0] != after[1]
                else "slot_history"
            )
        out.append(row)
    return out


def _costs(path: Path, args) -> mx.BatchCostModel:
    """The batch costs and the server's overheads of ``path`` on this machine, now."""
    # the costs on a session with llama-server's snapshot slots (its n_rs_seq is --spec-draft-n-max, 3 at most here):
    # 64 of them make every step dearer (plain decoding 793 against 1,173 tokens/s at 3, bundled model, 2 threads)
    with mx.Session.open(path, threads=args.threads, n_ctx=4096 * 4, n_parallel=4, n_rs_seq=3) as like:
        costs = mx.profile_batch_costs(like, n_parallel=[1, 2, 4], n_max=[0, 2, 3])
        # what a workload costs the server beyond the engine's work (HTTP, tokenization, slot set-up, its loop's
        # steps, drafting slots and sampled rows), measured on real llama-servers of the sweep's slot counts (other
        # prompts than the sweep's): without it the prediction prices the engine's steps alone (ServerOverheadMissing)
        return profile_server_overhead(
            like, costs, binary=args.binary, n_parallel=(1, 2, 4), repeats=3, seconds=args.overhead_seconds
        )


def _within(cells, spread) -> str:
    """How many ``cells`` (ok, category "all") lie within twice ``spread`` (a column) of their measurement."""
    ok = cells[spread].notna()
    return f"{int((cells['tokens_per_second_error'].abs() <= 2 * cells[spread])[ok].sum())} of {int(ok.sum())}"


def one_model(path: Path, label: str, args) -> dict:
    wl = workload(args.tokens)
    before = _costs(path, args) if args.bracket else None
    t0 = time.perf_counter()
    sweeps = [
        mx.server_sweep(
            path,
            wl,
            grid,
            threads=args.threads,
            n_ctx=4096 * 4,
            binary=args.binary,
            timeout_s=args.timeout,
            repeats=args.repeats,
            progress=False,
        )
        for grid in GRIDS
    ]
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # snapshot slots for ngram-simple's longest look-up, which llama-server does not cut to n_max (the prediction runs
    # each request as a server slot with the look-up's length as the step's n_max: predict.slot_run_counters): at most
    # the request's tokens and llama.cpp's size_m (48), within the engine's 64
    n_rs_seq = min(64, max(3, args.tokens))
    costs = _costs(path, args)
    with mx.Session.open(path, threads=args.threads, n_ctx=4096 * 4, n_parallel=4, n_rs_seq=n_rs_seq) as s:
        predicted = [sw.with_predictions(s, costs=costs, progress=False) for sw in sweeps]
        earlier = None if before is None else [sw.with_predictions(s, costs=before, progress=False) for sw in sweeps]
    predict_s = time.perf_counter() - t0
    import pandas as pd

    frame = pd.concat([p.frame for p in predicted], ignore_index=True)
    if earlier is not None:
        # the prediction from the costs measured before the sweep as well as after it: their mean is judged, their
        # difference is the prediction's own spread (the machine's drift over the sweep)
        first = pd.concat([p.frame for p in earlier], ignore_index=True)["predicted_tokens_per_second"]
        last = frame["predicted_tokens_per_second"]
        mean = (first + last) / 2
        frame["predicted_before_tokens_per_second"] = first
        frame["predicted_spread"] = (first - last).abs() / mean
        frame["predicted_tokens_per_second"] = mean
        frame["tokens_per_second_error"] = mean / frame["tokens_per_second"] - 1
        frame["combined_spread"] = (frame["tokens_per_second_spread"] ** 2 + frame["predicted_spread"] ** 2) ** 0.5
        spread = frame["tokens_per_second_spread"]
        frame["beyond_spread"] = (frame["tokens_per_second_error"].abs() > spread / 2).where(spread.notna())
    requests = pd.concat([p.requests for p in predicted], ignore_index=True)
    everything = frame[(frame["category"] == "all") & (frame["status"] == "ok")]
    single = requests[(requests["n_parallel"] == 1) & requests["spec_type"].ne("none")]
    alone = _single_requests(single, wl, path, args)
    misses = _classify(single, alone, wl, path, args)
    fresh = single[single["served_after"] < 0]
    errors = everything["tokens_per_second_error"].abs()
    return {
        "model": label,
        "path": str(path),
        "configurations": int(len(everything)),
        "sweep_seconds": sweep_s,
        "predict_seconds": predict_s,
        "server_overhead": {k: v for k, v in (costs.server or {}).items() if k != "measured"},
        "server_overhead_before": None
        if before is None
        else {k: v for k, v in (before.server or {}).items() if k != "measured"},
        "summary": {
            "median_abs_tokens_per_second_error": float(errors.median()),
            "max_abs_tokens_per_second_error": float(errors.max()),
            "median_run_to_run_spread": float(everything["tokens_per_second_spread"].median()),
            "cells_beyond_spread": int(everything["beyond_spread"].astype(bool).sum()),
            "cells_within_twice_spread": _within(everything, "tokens_per_second_spread"),
            "np_1_2_median_abs_tokens_per_second_error": float(errors[everything["n_parallel"] <= 2].median()),
            "np_1_2_cells_within_twice_spread": _within(
                everything[everything["n_parallel"] <= 2], "tokens_per_second_spread"
            ),
            **(
                {
                    "median_predicted_spread": float(everything["predicted_spread"].median()),
                    "cells_within_twice_combined_spread": _within(everything, "combined_spread"),
                }
                if earlier is not None
                else {}
            ),
            "single_requests_exact": f"{sum(a['exact'] for a in alone)} of {len(alone)}",
            "single_requests_run_to_run": sum(a["run_to_run"] for a in alone),
            "single_slot_counts_exact_by_spec_type": {
                spec: f"{int(g['counts_match'].astype(bool).sum())} of {len(g)}"
                for spec, g in single.groupby("spec_type")
            },
            "single_slot_fresh_slot_counts_exact": f"{int(fresh['counts_match'].astype(bool).sum())} of {len(fresh)}",
            "single_slot_mismatches_by_cause": dict(
                collections.Counter(m["cause"] for m in misses for _ in range(m["runs"]))
            ),
            "all_request_runs": int(requests["spec_type"].ne("none").sum()),
            "all_counts_exact": int(requests[requests["spec_type"].ne("none")]["counts_match"].astype(bool).sum()),
            "acceptance_abs_error_median": float(everything["acceptance_error"].abs().median()),
        },
        "single_requests": alone,
        "single_slot_mismatches": misses,
        "cells": _cells(frame),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="store_true", help="also the SYNTHETIC 0.4 B Q8_0 model")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--bracket",
        action="store_true",
        help="measure the costs before the sweep as well as after it: predict with both, judge their mean",
    )
    ap.add_argument(
        "--overhead-seconds",
        type=float,
        default=10.0,
        help="each overhead server's workloads repeat until they have lasted this long (profile_server_overhead)",
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--binary", default=os.environ.get("LLAMA_SERVER"))
    args = ap.parse_args()
    models = [(mx.default_model_path(), "bundled")]
    if args.scale:
        from scale_model import write_scale_model

        models.append((write_scale_model(log=lambda *_: None), "SYNTHETIC 0.4B Q8_0"))
    emit(
        {
            "benchmark": "server_sweep",
            "machine": machine(),
            "repeats": args.repeats,
            "overhead_seconds": args.overhead_seconds,
            "bracket": args.bracket,
            "tokens": args.tokens,
            "threads": args.threads,
            "grids": list(GRIDS),
            "models": [one_model(path, label, args) for path, label in models],
        }
    )


if __name__ == "__main__":
    main()
