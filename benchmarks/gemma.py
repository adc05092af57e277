"""Gemma 3 270M Q4_K_M (mx.models.fetch): ours against llama-speculative-simple per look-up drafter, and the best
look-up setting on the editing workload, measured and predicted. Prints one JSON document.

    .venv/bin/python benchmarks/gemma.py [--quick] [--repeats N] [--threads T]

ours/reference: the engine under the reference's budget rule (generate_reference_budget, the harness's own Python
time subtracted) against llama-speculative-simple's "decoded ... t/s", same prompt, same options, interleaved, in this
one run; the median ratio over the repeats and its spread (min..max). The speed-up: the best look-up setting by the
what-if (mx.sweep + mx.recommend on the editing prompts), measured as real generations against plain decoding in the
same session, beside the predicted speed-up. Run it on an otherwise idle machine."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.devtools.reference import (
    generate_reference_budget,
    reference_n_max,
    run_reference_spec,
    spec_type_args,
)

ROOT = Path(__file__).resolve().parents[1]
EDIT = [
    "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
    "# The same two functions with type hints:\n\ndef area(w: float, h: float) -> float:\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n\n\n"
    "# Point3D: the same class with a z coordinate\nclass Point3D:\n    def __init__(self, x, y, z):\n",
]
N_MAX = 8
LOOKUP_OPTIONS = {
    "ngram_simple_size_n": 3,
    "ngram_simple_size_m": N_MAX,
    "ngram_map_k_size_n": 3,
    "ngram_map_k_size_m": N_MAX,
    "ngram_map_k4v_size_n": 3,
    "ngram_map_k4v_size_m": N_MAX,
    "ngram_mod_n_match": 3,
    "ngram_mod_n_min": 1,
    "ngram_mod_n_max": N_MAX,
}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def ours_vs_reference(
    session, model, binary, spec: str, prompt: str, max_tokens: int, repeats: int, threads: int
) -> dict:
    names = {o.name for o in drafters.mode(spec).options}
    options = {k: v for k, v in LOOKUP_OPTIONS.items() if k in names}
    n_max = reference_n_max(spec, N_MAX)
    ours, ref, ratios = [], [], []
    for _ in range(repeats):
        r = run_reference_spec(
            binary,
            model,
            prompt,
            spec_type_args(spec, n_max, options),
            max_tokens=max_tokens,
            n_ctx=2048,
            threads=threads,
        )
        run = generate_reference_budget(session, prompt, max_tokens=max_tokens, n_max=n_max, drafter=spec, **options)
        tps = run.trace.summary()["tokens_per_second"]  # the engine's own step times: the harness left out
        ours.append(tps)
        ref.append(r.tokens_per_second)
        ratios.append(tps / r.tokens_per_second)
    return {
        "spec_type": spec,
        "ours_tokens_per_second": spread(ours),
        "reference_tokens_per_second": spread(ref),
        "ours_over_reference": spread(ratios),
    }


def best_lookup(session, prompts, max_tokens: int, repeats: int) -> dict:
    modes = [s.name for s in mx.DRAFTER_SPECS.values() if s.is_lookup]
    table = mx.sweep(
        session,
        prompts,
        n_max=[2, 4, 8],
        p_min=[0.0],
        drafter=modes,
        max_tokens=max_tokens,
        progress=False,
        **LOOKUP_OPTIONS,
    )
    rec = mx.recommend(table)
    names = {o.name for o in drafters.mode(rec.drafter).options}
    options = {k: v for k, v in LOOKUP_OPTIONS.items() if k in names}
    speedups = []
    for _ in range(repeats):
        plain = spec = 0.0
        for p in prompts:  # interleaved, same session
            t0 = time.perf_counter()
            session.generate(p, max_tokens=max_tokens, n_max=0)
            plain += time.perf_counter() - t0
            t0 = time.perf_counter()
            session.generate(p, max_tokens=max_tokens, n_max=rec.n_max, drafter=rec.drafter, **options)
            spec += time.perf_counter() - t0
        speedups.append(plain / spec)
    return {
        "drafter": rec.drafter,
        "n_max": rec.n_max,
        "options": options,
        "predicted_speedup": 1 + rec.margin_over_plain,
        "measured_speedup": spread(speedups),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, 24 tokens, one prompt: checks that it runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--binary", default=str(ROOT / "build" / "reference" / "bin" / "llama-speculative-simple"))
    args = ap.parse_args()
    repeats, max_tokens, prompts = (1, 24, EDIT[:1]) if args.quick else (args.repeats, args.max_tokens, EDIT)
    warnings.simplefilter("ignore", mx.CpuKernelWarning)
    model = mx.models.fetch(mx.models.GEMMA_3_270M, progress=False)
    out = {
        "model": str(model),
        "threads": args.threads,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "quick": args.quick,
        "per_drafter": [],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with mx.Session.open(model, n_ctx=2048, threads=args.threads) as session:
        for spec in (s.name for s in mx.DRAFTER_SPECS.values() if s.is_lookup):
            out["per_drafter"].append(
                ours_vs_reference(session, model, args.binary, spec, prompts[0], max_tokens, repeats, args.threads)
            )
        out["editing_workload"] = best_lookup(session, prompts, max_tokens, repeats)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
