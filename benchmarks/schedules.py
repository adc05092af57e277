"""Would an adaptive draft length pay? The best fixed n_max, each draft-length schedule and the hindsight bound,
predicted from one recording per prompt and measured on the engine, for code and prose prompts.

For each prompt category: one oracle per prompt (``--depth``, timing probes); predicted tokens/s of draft-mtp at every
fixed ``n_max`` up to the depth, of each schedule (``"heuristic"``, ``"window"``) at ``n_max`` = the depth, and the
bound :func:`mtp_explorer.hindsight_best` (summed over the category's prompts: total tokens over total predicted
seconds). Then measured: every fixed ``n_max`` and each schedule run ``--repeats`` times per prompt, each run beside a
plain run of the same prompt (alternating, same process), reported as the median speed-up over plain with its spread
((max - min) / median of the per-run ratios). The predicted speed-up is the prediction over the predicted plain
decoding of the same recordings. Greedy: the measured runs' drafted and accepted totals are checked equal to their
replay (``exact``). Timed: run it on a quiet machine.

    .venv/bin/python benchmarks/schedules.py [--model PATH | --scale] [--threads 2] [--tokens 128] [--depth 6]
        [--repeats 3]

``--scale`` measures the SYNTHETIC 0.4 B model (``benchmarks/scale_model.py``, written at run time). Prints one JSON
document.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import CATEGORIES, emit, machine, pick_model

import mtp_explorer as mx

SCHEDULES = ("heuristic", "window")


def _predicted(oracles: list[mx.OracleTrace], settings: dict) -> float:
    """Total tokens over total predicted seconds of the prompts' replays."""
    sims = [mx.simulate(o, **settings) for o in oracles]
    tokens = sum(len(s.tokens) for s in sims)
    seconds = sum(len(s.tokens) / s.predicted_tokens_per_second for s in sims)
    return tokens / seconds


def _measured(session: mx.Session, prompts, oracles, tokens: int, repeats: int, settings: dict) -> dict:
    """The median speed-up over plain runs beside it, its spread, and whether every run equals its replay."""
    ratios, exact = [], True
    for _ in range(repeats):
        for prompt, oracle in zip(prompts, oracles):
            plain = session.generate(prompt, max_tokens=tokens, n_max=0)
            run = session.generate(prompt, max_tokens=tokens, **settings)
            sim = mx.simulate(oracle, run.draft_settings)
            exact &= (sim.summary()["n_drafted"], sim.summary()["n_accepted"]) == (
                run.summary()["n_drafted"],
                run.summary()["n_accepted"],
            )
            ratios.append(run.summary()["tokens_per_second"] / plain.summary()["tokens_per_second"])
    median = statistics.median(ratios)
    return {"speedup": median, "spread": (max(ratios) - min(ratios)) / median, "runs": len(ratios), "exact": exact}


def one_category(session: mx.Session, prompts: list[str], tokens: int, depth: int, repeats: int) -> dict:
    oracles = [session.record_oracle(p, max_tokens=tokens, depth=depth) for p in prompts]
    plain = _predicted(oracles, {"n_max": 0})
    rows = []
    for n in range(1, depth + 1):
        rows.append({"setting": f"fixed n_max {n}", "settings": {"n_max": n}})
    for schedule in SCHEDULES:
        rows.append({"setting": f"{schedule} (n_max {depth})", "settings": {"n_max": depth, "schedule": schedule}})
    for row in rows:
        row["predicted_speedup"] = _predicted(oracles, row["settings"]) / plain
        row["measured"] = _measured(session, prompts, oracles, tokens, repeats, row["settings"])
    bounds = [mx.hindsight_best(o, depth) for o in oracles]
    bound = sum(b.n_tokens for b in bounds) / sum(b.seconds for b in bounds)
    fixed = [r for r in rows if r["setting"].startswith("fixed")]
    best_fixed = max(fixed, key=lambda r: r["predicted_speedup"])
    return {
        "rows": rows,
        "predicted_best_fixed": best_fixed["setting"],
        "hindsight_bound_speedup": bound / plain,
        "most_a_schedule_could_gain": bound / (best_fixed["predicted_speedup"] * plain) - 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--scale", action="store_true", help="the SYNTHETIC 0.4 B model (benchmarks/scale_model.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.scale:
        from scale_model import write_scale_model

        path, kind = write_scale_model(log=lambda *a: None), "SYNTHETIC 0.4 B (random weights)"
    else:
        path, kind = pick_model(args.model)
    t0 = time.perf_counter()
    with mx.Session.open(path, n_ctx=4096, threads=args.threads, n_rs_seq=args.depth) as session:
        categories = {
            name: one_category(session, prompts, args.tokens, args.depth, args.repeats)
            for name, prompts in CATEGORIES.items()
        }
    emit(
        {
            "benchmark": "schedules",
            "model": str(path),
            "model_kind": kind,
            "threads": args.threads,
            "tokens": args.tokens,
            "depth": args.depth,
            "repeats": args.repeats,
            "categories": categories,
            "seconds": time.perf_counter() - t0,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
