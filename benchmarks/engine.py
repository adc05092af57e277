"""Engine throughput: plain vs MTP, telemetry on vs off, Python streaming overhead, and (with
LLAMA_SPECULATIVE_SIMPLE set to a llama-speculative-simple binary) the reference beside ours.

    .venv/bin/python benchmarks/engine.py [--model PATH] [--tokens 256] [--repeats 3]

Prints JSON. Timings are medians over repeats of decode time (prompt processing excluded).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mtp_explorer as mx
from mtp_explorer.reference import compare, replay_reference_budget, run_reference

from _common import emit, machine, pick_model

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    path, origin = pick_model(args.model)
    out: dict = {"model": str(path), "model_origin": origin, "tokens": args.tokens, "machine": machine()}

    with mx.Session.open(path, n_ctx=2048, threads=args.threads) as s:
        s.generate(PROMPTS[0], max_tokens=16, n_max=2)  # warm-up
        out["threads"] = s.threads
        plain, _ = tokens_per_second(s, args.tokens, 0, args.repeats)
        out["plain_tokens_per_second"] = plain
        out["mtp"] = {}
        for n_max in (1, 2, 3, 4):
            rate, traces = tokens_per_second(s, args.tokens, n_max, args.repeats)
            acc = sum(int(t.n_accepted.sum()) for t in traces) / max(1, sum(int(t.n_drafted.sum()) for t in traces))
            out["mtp"][n_max] = {"tokens_per_second": rate, "speedup_over_plain": rate / plain, "acceptance_rate": acc}

        # telemetry on vs off, interleaved to share whatever else the machine is doing
        on, off = [], []
        for _ in range(args.repeats):
            for prompt in PROMPTS:
                s.telemetry = True
                secs, t = decode_seconds(s, prompt, args.tokens, 3)
                on.append(len(t.tokens) / secs)
                s.telemetry = False
                secs, t = decode_seconds(s, prompt, args.tokens, 3)
                off.append(len(t.tokens) / secs)
        s.telemetry = True
        out["telemetry"] = {
            "on_tokens_per_second": statistics.median(on),
            "off_tokens_per_second": statistics.median(off),
            "overhead": 1 - statistics.median(on) / statistics.median(off),
            "target_overhead": 0.03,
        }

        # Python streaming: per-step cost of yielding a Step versus the native loop
        native, streamed, steps = [], [], 0
        for _ in range(args.repeats):
            for prompt in PROMPTS:
                secs, t = decode_seconds(s, prompt, args.tokens, 3)
                native.append(secs)
                t0 = time.perf_counter_ns()
                for _step in s.stream(prompt, max_tokens=args.tokens, n_max=3):
                    pass
                streamed.append((time.perf_counter_ns() - t0 - s.last_trace.t_prefill_ns) / 1e9)
                steps = s.last_trace.n_steps
        out["stream"] = {
            "steps_per_generation": steps,
            "native_seconds": statistics.median(native),
            "stream_seconds": statistics.median(streamed),
            "overhead_per_step_us": (statistics.median(streamed) - statistics.median(native)) / steps * 1e6,
        }

        binary = os.environ.get("LLAMA_SPECULATIVE_SIMPLE")
        if binary:
            ref = {}
            for n_max in (1, 2, 3, 4):
                ref_rates, ours_rates, parity = [], [], True
                for prompt in PROMPTS:
                    r = run_reference(binary, path, prompt, max_tokens=args.tokens, n_max=n_max, n_ctx=2048,
                                      threads=s.threads)
                    ref_rates.append(r.tokens_per_second)
                    t = replay_reference_budget(s, prompt, max_tokens=args.tokens, n_max=n_max)
                    parity &= compare(r, t, 0.0)["match"]
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
