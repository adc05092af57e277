"""The what-if for N sequences against measured parallel runs, and where speculation stops paying.

On ``--model`` (default: a SYNTHETIC qwen35 of width 512 and 16 layers whose trunk mixes in little context, written
into a temporary directory: large enough for the target's weights to dominate a CPU step, its MTP drafts accepted
about 70% of the time) with ``n_parallel`` = the largest size:

- ``profile``: the batch cost model fit to parallel runs (``mx.profile_batch_costs``) and its fit errors per phase;
- ``measured``: plain and speculative (``--n-max``) aggregate decode tokens/s at N in ``--sizes``, the medians of
  ``--repeats`` alternating runs each (``mx.measure_crossover``), and the crossover;
- ``predicted``: the same from one oracle per prompt and the cost model (``mx.predict_parallel``), without running
  the batches, and ``predicted / measured`` per N and setting; ``recommended``: the best ``n_max`` / ``p_min`` per N
  (``mx.recommend_parallel``).

    .venv/bin/python benchmarks/parallel.py [--model PATH] [--sizes 1 2 4 8 16] [--threads 2]

Prints one JSON document. Runs on this machine vary by a quarter to a half from one to the next: quote the ratios
and the crossover, not single numbers.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import emit, machine

import mtp_explorer as mx

PROMPTS = ["def f(x):", "import os", "class A:", "for i in", "while x", "print(", "return", "if a"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtp-explorer-parallel-") as tmp:
        if args.model:
            path, origin = Path(args.model), "given"
        else:
            from mtp_explorer.models.synthetic import write_synthetic_qwen35

            path = write_synthetic_qwen35(Path(tmp) / "synthetic-512x16.gguf", n_embd=512, n_layer=16, context_mix=0.2)
            origin = "SYNTHETIC qwen35 512x16, context_mix=0.2 (random weights)"
        N = max(args.sizes)
        doc = {
            "model": str(path),
            "model_origin": origin,
            "sizes": args.sizes,
            "threads": args.threads,
            "tokens": args.tokens,
            "n_max": args.n_max,
            "machine": machine(),
        }
        with mx.Session.open(path, n_ctx=N * 256, threads=args.threads, n_parallel=N) as s:
            costs = mx.profile_batch_costs(
                s, PROMPTS, n_parallel=args.sizes, n_max=(0, 1, 2, 3), max_tokens=args.tokens, repeats=2
            )
            oracles = [
                s.record_oracle(p, max_tokens=args.tokens, depth=max(4, args.n_max), probe=False) for p in PROMPTS
            ]
            measured = mx.measure_crossover(
                s, PROMPTS, n_parallel=args.sizes, n_max=args.n_max, max_tokens=args.tokens, repeats=args.repeats
            )
        doc["profile"] = costs.measured
        rows = []
        for _, m in measured.iterrows():
            n = int(m["n_parallel"])
            batch = [oracles[j % len(oracles)] for j in range(n)]
            plain = mx.predict_parallel(batch, costs, n_parallel=n, n_max=0)["decode_tokens_per_second"]
            spec = mx.predict_parallel(batch, costs, n_parallel=n, n_max=args.n_max)["decode_tokens_per_second"]
            rows.append(
                {
                    "n_parallel": n,
                    "measured_plain": m["plain_tokens_per_second"],
                    "predicted_plain": plain,
                    "measured_speculative": m["goodput"],
                    "predicted_speculative": spec,
                    "ratio_plain": plain / m["plain_tokens_per_second"],
                    "ratio_speculative": spec / m["goodput"],
                    "measured_speedup": m["speedup"],
                    "predicted_speedup": spec / plain,
                }
            )
        doc["per_n"] = rows
        doc["measured_crossover"] = measured.attrs["crossover"]
        doc["predicted_crossover"] = next((r["n_parallel"] for r in rows if r["predicted_speedup"] < 1), None)
        recommended = mx.recommend_parallel(
            oracles, costs, n_parallel=args.sizes, n_max=range(1, args.n_max + 1), p_min=(0.0, 0.3, 0.5, 0.7)
        )
        doc["recommended"] = recommended.to_dict("records")
        doc["recommended_crossover"] = recommended.attrs["crossover"]
    emit(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
