"""Engine throughput: plain vs MTP, telemetry on vs off, Python streaming overhead, and (with
LLAMA_SPECULATIVE_SIMPLE set to a llama-speculative-simple binary) the reference beside ours.

    .venv/bin/python benchmarks/engine.py [--model PATH] [--tokens 256] [--repeats 3] [--threads N]
                                          [--only throughput telemetry stream reference]

Prints JSON. Timings are medians over repeats of decode time (prompt processing excluded). The
telemetry overhead is the median over pairs of back-to-back runs in alternating order (see
:func:`telemetry_overhead`), on a shared machine far steadier than comparing two medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import mtp_explorer as mx
from mtp_explorer.devtools.reference import compare_with_reference, replay_reference_budget, run_reference

from _common import emit, machine, pick_model

SECTIONS = ("throughput", "telemetry", "stream", "reference")
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):"]


def decode_seconds(s: mx.Session, prompt: str, tokens: int, n_max: int) -> tuple[float, mx.Trace]:
    t0 = time.perf_counter_ns()
    trace = s.generate(prompt, max_tokens=tokens, n_max=n_max)
    wall = time.perf_counter_ns() - t0
    return (wall - trace.t_prefill_ns) / 1e9, trace


def tokens_per_second(s, tokens, n_max, repeats) -> tuple[float, list[mx.Trace]]:
    rates, traces = [], []
    for prompt in PROMPTS:
        per_prompt = []
        for _ in range(repeats):
            secs, trace = decode_seconds(s, prompt, tokens, n_max)
            per_prompt.append(len(trace.tokens) / secs)
        rates.append(statistics.median(per_prompt))
        traces.append(trace)
    return statistics.mean(rates), traces


def phase_seconds(trace: mx.Trace) -> float:
    c = trace.columns
    return sum(int(c[k].sum()) for k in ("t_catchup_ns", "t_draft_ns", "t_verify_ns", "t_sample_ns")) / 1e9


def telemetry_overhead(s: mx.Session, tokens: int, rounds: int, n_max: int = 3) -> dict:
    """Telemetry on vs off, in pairs: each pair runs the same prompt both ways back to back, in
    alternating order (on first in even rounds, off first in odd ones), so drift and whatever else
    the machine runs hit both sides alike. The overhead is the median of the pairs' time ratios,
    on the decode wall time (what a user waits for) and on the engine's summed phase times."""
    wall, phases, on_rates, off_rates = [], [], [], []
    for r in range(rounds):
        for prompt in PROMPTS:
            pair = {}
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                s.telemetry = on
                secs, t = decode_seconds(s, prompt, tokens, n_max)
                pair[on] = (secs, phase_seconds(t), len(t.tokens))
            wall.append(pair[True][0] / pair[False][0])
            phases.append(pair[True][1] / pair[False][1])
            on_rates.append(pair[True][2] / pair[True][0])
            off_rates.append(pair[False][2] / pair[False][0])
    s.telemetry = True
    q = lambda xs, f: float(statistics.quantiles(xs, n=4)[f] - 1)  # noqa: E731
    # 95% bootstrap interval of the median ratio (how precisely this machine's noise lets us tell)
    rng = np.random.default_rng(0)
    boot = np.median(rng.choice(np.asarray(wall), size=(2000, len(wall))), axis=1) - 1
    return {
        "n_max": n_max, "pairs": len(wall),
        "on_tokens_per_second": statistics.median(on_rates),
        "off_tokens_per_second": statistics.median(off_rates),
        "overhead": statistics.median(wall) - 1,
        "overhead_95ci": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "overhead_quartiles": [q(wall, 0), q(wall, 2)],
        "overhead_phase_time": statistics.median(phases) - 1,
        "target_overhead": 0.03,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--telemetry-rounds", type=int, default=20,
                    help="rounds of on/off pairs over the prompts for the telemetry overhead (default 20)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="run only these sections (default: all)")
    args = ap.parse_args()
    path, origin = pick_model(args.model)
    out: dict = {"model": str(path), "model_origin": origin, "tokens": args.tokens, "machine": machine()}

    with mx.Session.open(path, n_ctx=2048, threads=args.threads) as s:
        s.generate(PROMPTS[0], max_tokens=16, n_max=2)  # warm-up
        out["threads"] = s.threads
        if "throughput" in args.only:
            plain, _ = tokens_per_second(s, args.tokens, 0, args.repeats)
            out["plain_tokens_per_second"] = plain
            out["mtp"] = {}
            for n_max in (1, 2, 3, 4):
                rate, traces = tokens_per_second(s, args.tokens, n_max, args.repeats)
                acc = sum(int(t.n_accepted.sum()) for t in traces) / max(1, sum(int(t.n_drafted.sum()) for t in traces))
                out["mtp"][n_max] = {"tokens_per_second": rate, "speedup_over_plain": rate / plain,
                                     "acceptance_rate": acc}

        if "telemetry" in args.only:
            out["telemetry"] = telemetry_overhead(s, args.tokens, args.telemetry_rounds)

        # Python streaming: per-step cost of yielding a Step versus the native loop
        native, streamed, steps = [], [], 0
        for _ in range(args.repeats if "stream" in args.only else 0):
            for prompt in PROMPTS:
                secs, t = decode_seconds(s, prompt, args.tokens, 3)
                native.append(secs)
                t0 = time.perf_counter_ns()
                for _step in s.stream(prompt, max_tokens=args.tokens, n_max=3):
                    pass
                streamed.append((time.perf_counter_ns() - t0 - s.last_trace.t_prefill_ns) / 1e9)
                steps = s.last_trace.n_steps
        if native:
            out["stream"] = {
                "steps_per_generation": steps,
                "native_seconds": statistics.median(native),
                "stream_seconds": statistics.median(streamed),
                "overhead_per_step_us": (statistics.median(streamed) - statistics.median(native)) / steps * 1e6,
            }

        binary = os.environ.get("LLAMA_SPECULATIVE_SIMPLE")
        if binary and "reference" in args.only:
            ref = {}
            for n_max in (1, 2, 3, 4):
                ref_rates, ours_rates, parity = [], [], True
                for prompt in PROMPTS:
                    r = run_reference(binary, path, prompt, max_tokens=args.tokens, n_max=n_max, n_ctx=2048,
                                      threads=s.threads)
                    ref_rates.append(r.tokens_per_second)
                    t = replay_reference_budget(s, prompt, max_tokens=args.tokens, n_max=n_max)
                    parity &= compare_with_reference(r, t, 0.0)["match"]
                    secs, t = decode_seconds(s, prompt, args.tokens, n_max)
                    ours_rates.append(len(t.tokens) / secs)
                ref[n_max] = {"reference_tokens_per_second": statistics.mean(ref_rates),
                              "ours_tokens_per_second": statistics.mean(ours_rates),
                              "ratio": statistics.mean(ours_rates) / statistics.mean(ref_rates),
                              "parity_of_totals_and_text": parity}
            out["reference"] = {"binary": binary, "target_ratio": 0.97, "by_n_max": ref}
    emit(out)


if __name__ == "__main__":
    main()
