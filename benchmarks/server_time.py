"""Where a llama-server request's time goes, beside this engine and the explorer's prediction of it.

For each configuration (plain, ``draft-mtp`` at ``--spec-draft-n-max`` 3) and each prompt, ``--repeats`` rounds of:
one ``/completion`` request alone on a fresh-enough ``-np 1`` server (greedy, no prompt cache), then this engine
running the same prompt tokens as the server's slot runs them (``DraftSettings.server_slot``), in turn. Per request:

- ``wall``: the client's time from sending to the answer; the server's own ``prompt_ms`` and ``predicted_ms``;
  ``outside`` = wall - prompt - predicted: HTTP, tokenization, slot set-up and the response, which the server's timers
  do not cover;
- the engine's prefill and decode (``prefill_seconds`` and the phases of its steps), its step count;
- the prediction of the request alone (:func:`~mtp_explorer.predict_parallel` with the batch cost model the sweep
  prediction uses, ``server_slot=True``): prefill and decode.

Then ``-np 2`` with the prompts sent two at once: the workload's wall time against the prediction's schedule.
Medians over prompts and rounds, with the run-to-run spread ((max - min) / median) of each, and the per-step and
per-request differences that a cost model of the server path must add. Timed: run it on a quiet machine.

    make server
    .venv/bin/python benchmarks/server_time.py [--model PATH] [--threads 2] [--tokens 128] [--repeats 5]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from _common import emit, machine, pick_model

import mtp_explorer as mx
from mtp_explorer.core import metrics
from mtp_explorer.server import LlamaServer
from mtp_explorer.server.predict import config_settings

PROMPTS = [
    "def fibonacci(n):\n",
    "import json\n\n\nclass Config:\n",
    "The history of the printing press begins",
    "for i in range(10):\n",
]
CONFIGS = ({"spec_type": "none"}, {"spec_type": "draft-mtp", "n_max": 3})


def _median(values) -> dict:
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "spread": metrics.spread(values), "n": len(values)}


def alone(model: Path, config: dict, tokens: int, threads: int, repeats: int, session: mx.Session, costs) -> dict:
    """Each prompt alone on a -np 1 server and on the engine as its slot, in turn, ``repeats`` rounds."""
    spec = config.get("spec_type")
    rows = []
    with LlamaServer(
        model,
        n_parallel=1,
        n_ctx=4096,
        threads=threads,
        spec_type=None if spec == "none" else spec,
        n_max=config.get("n_max", 3),
    ) as srv:
        client = srv.client()
        prompt_tokens = [client.tokenize(p) for p in PROMPTS]
        settings = config_settings(config, tokens).replace(server_slot=True)
        oracles = [
            session.record_oracle(t, max_tokens=tokens, depth=3, probe=False, batch_shift=False) for t in prompt_tokens
        ]
        client.complete(PROMPTS[0], 8)  # warm-up
        session.generate(prompt_tokens[0], settings.replace(max_tokens=8))
        for _ in range(repeats):
            for prompt, toks, oracle in zip(PROMPTS, prompt_tokens, oracles):
                t0 = time.perf_counter()
                done = client.complete(prompt, tokens)
                wall = time.perf_counter() - t0
                trace = session.generate(toks, settings)
                s = trace.summary()
                pred = mx.predict_parallel([oracle], costs, settings, n_parallel=1, server_slot=True)
                pred_prefill = costs.prefill_ns(len(toks)) / 1e9
                rows.append(
                    {
                        "wall": wall,
                        "server_prompt": done.prompt_ms / 1e3,
                        "server_decode": done.predicted_ms / 1e3,
                        "outside": wall - (done.prompt_ms + done.predicted_ms) / 1e3,
                        "engine_prefill": s["prefill_seconds"],
                        "engine_decode": sum(s["phase_seconds"].values()),
                        "predicted_prefill": pred_prefill,
                        "predicted_decode": pred["requests"][0]["latency_seconds"] - pred_prefill,
                        "steps": s["n_steps"],
                        "tokens": done.tokens_predicted,
                        "engine_tokens": s["n_tokens"],
                    }
                )
    out = {k: _median(r[k] for r in rows) for k in rows[0]}
    steps = np.array([r["steps"] for r in rows], dtype=float)
    out["per_step"] = {
        "server_decode_minus_engine_decode": _median(
            [(r["server_decode"] - r["engine_decode"]) / r["steps"] for r in rows]
        ),
        "engine_decode_minus_predicted": _median(
            [(r["engine_decode"] - r["predicted_decode"]) / r["steps"] for r in rows]
        ),
    }
    out["per_request"] = {
        "outside": out["outside"],
        "server_prompt_minus_engine_prefill": _median([r["server_prompt"] - r["engine_prefill"] for r in rows]),
        "wall_over_predicted": _median([r["wall"] / (r["predicted_prefill"] + r["predicted_decode"]) for r in rows]),
    }
    out["mean_steps"] = float(steps.mean())
    return out


def together(model: Path, config: dict, tokens: int, threads: int, repeats: int, session: mx.Session, costs) -> dict:
    """The prompts two at once on a -np 2 server: the workload's wall time against the prediction's schedule."""
    spec = config.get("spec_type")
    walls, predicted = [], None
    with LlamaServer(
        model,
        n_parallel=2,
        n_ctx=8192,
        threads=threads,
        spec_type=None if spec == "none" else spec,
        n_max=config.get("n_max", 3),
    ) as srv:
        client = srv.client()
        prompt_tokens = [client.tokenize(p) for p in PROMPTS]
        settings = config_settings(config, tokens)
        oracles = [
            session.record_oracle(t, max_tokens=tokens, depth=3, probe=False, batch_shift=False) for t in prompt_tokens
        ]
        predicted = mx.predict_parallel(
            oracles, costs, settings, n_parallel=2, arrivals=[0] * len(oracles), server_slot=True
        )
        client.complete_many(PROMPTS[:2], 8)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            answers = client.complete_many(PROMPTS, tokens)
            walls.append(time.perf_counter() - t0)
    n_tokens = sum(a.tokens_predicted for a in answers)
    predicted_s = predicted["n_tokens"] / predicted["tokens_per_second"]
    return {
        "wall": _median(walls),
        "predicted_seconds": predicted_s,
        "tokens": n_tokens,
        "wall_over_predicted": _median([w / predicted_s for w in walls]),
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
        "benchmark": "server_time",
        "model": label,
        "path": str(model),
        "machine": machine(),
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "configs": [],
    }
    with mx.Session.open(model, n_ctx=8192, threads=args.threads, n_parallel=2) as session:
        costs = mx.profile_batch_costs(session, n_parallel=[1, 2], n_max=[0, 3])
        for config in CONFIGS:
            doc["configs"].append(
                {
                    "config": config,
                    "alone": alone(model, config, args.tokens, args.threads, args.repeats, session, costs),
                    "together": together(model, config, args.tokens, args.threads, args.repeats, session, costs),
                }
            )
    emit(doc)


if __name__ == "__main__":
    main()
