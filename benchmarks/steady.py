"""Where a generation's time goes, ours against llama-speculative-simple: the steady cost of a verify step and the
fixed cost of a run, each side by its own clocks.

A tokens/s figure over one budget mixes what each verify step costs once the loop runs with what a run costs once
(its first steps, its end). Here each side decodes the same prompt at two budgets ``-n`` (``--tokens L1 L2``) with
the same drafts (checked: the reference's drafted and accepted totals are ours' at each budget). With S the verify
steps (ours counts them; the work is the same) and W the decode window (ours: the native loop, its prefill
excluded, as ``engine.budget_seconds``; the reference: its "decoded ... in T s"):

- the steady cost of a step is (W2 - W1) / (S2 - S1); its target share is the same slope of the target's decode time
  (ours: the trace's ``t_verify_ns``; the reference: its target context's perf counters,
  ``ReferenceRun.target_decode_seconds``), the rest is the drafters' and the loop's;
- the fixed cost of a run is W2 - S2 x the steady cost.

Each run is a new process on each side, as in engine.py's drafters section (``ours_process``): the rounds sample
the memory layout a process draws, and each run pays a process's first-run costs, as the reference's does (until
2026-11-27 ours ran both budgets in one process, so its second run did not grow llama.cpp's output buffer, and its
slope read low: ours' windows 3-6% ahead on the bundled model's look-ups). Medians over the rounds, with 95%
intervals; a ratio above 1 means ours is faster.
A round's slope is the difference of two windows, so it scatters several times as much as a window does: at the
SYNTHETIC 0.4 B scale model 6 rounds gave intervals of +-3-8% for the steady ratios and +-1-3% for the windows' (the
fixed costs, extrapolated from the slopes, are rougher still). More rounds narrow them.

    LLAMA_SPECULATIVE_SIMPLE=build/reference/bin/llama-speculative-simple .venv/bin/python benchmarks/steady.py \\
        --scale [TYPE] [--spec-type draft-mtp] [--n-max 1 4] [--tokens 48 96] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

from _common import emit, machine
from engine import KIND_PROMPTS, SPEC_TYPES, capacity_kwargs, lookup_limits, median_95ci
from ours_process import OursProcess
from scale_model import write_scale_model

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.devtools.reference import reference_n_max, run_reference_spec, spec_type_args


def decompose(windows: list[float], target: list[float], steps: list[int]) -> dict:
    """Steady and fixed costs (ms) from the windows and target decode times (s) at two budgets of ``steps`` steps."""
    per = 1e3 / (steps[1] - steps[0])
    steady = (windows[1] - windows[0]) * per
    target_ms = (target[1] - target[0]) * per
    return {
        "steady_ms": steady,
        "target_ms": target_ms,
        "rest_ms": steady - target_ms,
        "fixed_ms": windows[1] * 1e3 - steps[1] * steady,
        "window_ms": windows[1] * 1e3,
    }


def one_round(
    session: mx.Session, binary: str, spec: str, n_max: int, prompt: str, budgets: list[int], ours_first: bool
) -> dict | None:
    """Both sides' costs (:func:`decompose`) on ``prompt``, each run in a new process; ``None`` where the drafts differ
    or the reference printed no target perf counters (counted as ``other_drafts``)."""
    options = lookup_limits(drafters.mode(spec), n_max)
    kwargs = capacity_kwargs(session, n_max, spec)

    def ours() -> list[dict]:  # each budget its process's first timed run, as the reference's (OursProcess)
        runs = []
        for n in budgets:
            with OursProcess(session.path, kwargs, spec) as proc:
                runs.append(proc.run(prompt, n, n_max, "off", drafter=spec, **options))
        return runs

    def ref() -> list:
        return [
            run_reference_spec(
                binary,
                session.path,
                prompt,
                spec_type_args(spec, n_max, options),
                max_tokens=n,
                n_ctx=session.n_ctx,
                threads=session.threads,
            )
            for n in budgets
        ]

    if ours_first:
        o, r = ours(), ref()
    else:
        r, o = ref(), ours()
    if any((a["drafted"], a["accepted"]) != (b.n_drafted, b.n_accept) for a, b in zip(o, r)) or any(
        b.target_decode_seconds is None for b in r
    ):
        return None
    steps = [a["totals"]["n_steps"] for a in o]
    return {
        "ours": decompose([a["seconds"] for a in o], [a["totals"]["t_verify_ns"] / 1e9 for a in o], steps),
        "reference": decompose([b.decode_seconds for b in r], [b.target_decode_seconds for b in r], steps),
        "steps": steps,
    }


def summary(rounds: list[dict]) -> dict:
    """Medians of each side's costs, and of the rounds' ratios (reference / ours) with 95% intervals."""
    doc: dict = {"rounds": len(rounds), "steps": rounds[0]["steps"] if rounds else None}
    if not rounds:
        return doc
    for side in ("ours", "reference"):
        doc[side] = {k: statistics.median(r[side][k] for r in rounds) for k in rounds[0][side]}
    for key, name in (
        ("steady_ms", "steady_speed_ratio"),
        ("target_ms", "target_speed_ratio"),
        ("rest_ms", "rest_speed_ratio"),
        ("window_ms", "window_speed_ratio"),
    ):
        ratios = [r["reference"][key] / r["ours"][key] for r in rounds]
        doc[name] = statistics.median(ratios)
        doc[name + "_95ci"] = median_95ci(ratios)
    doc["fixed_ms_difference"] = statistics.median(r["reference"]["fixed_ms"] - r["ours"]["fixed_ms"] for r in rounds)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="a GGUF file")
    where.add_argument(
        "--scale",
        nargs="?",
        const="Q8_0",
        metavar="TYPE",
        help="the SYNTHETIC 0.4 B scale model of scale_model.py, as TYPE (default Q8_0; e.g. Q4_K_M)",
    )
    ap.add_argument("--spec-type", nargs="+", choices=SPEC_TYPES, default=["draft-mtp"], metavar="SPEC")
    ap.add_argument("--n-max", nargs="+", type=int, default=[1, 4], metavar="N")
    ap.add_argument(
        "--tokens",
        nargs=2,
        type=int,
        default=[48, 96],
        metavar=("L1", "L2"),
        help="the two budgets -n (default: 48 96)",
    )
    ap.add_argument("--rounds", type=int, default=6, help="rounds per row, prompts taking turns (default: 6)")
    ap.add_argument("--threads", type=int, default=1, help="threads on both sides (default: 1)")
    args = ap.parse_args()
    binary = os.environ.get("LLAMA_SPECULATIVE_SIMPLE")
    if not binary:
        ap.error("set LLAMA_SPECULATIVE_SIMPLE to llama.cpp's llama-speculative-simple (make reference)")
    if args.tokens[0] >= args.tokens[1]:
        ap.error("--tokens L1 L2 needs L1 < L2")
    path = args.model or write_scale_model(file_type=args.scale, log=lambda msg: print(msg, file=sys.stderr))
    out: dict = {"model": str(path), "tokens": args.tokens, "threads": args.threads, "machine": machine()}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", mx.CpuKernelWarning)
        session = mx.Session.open(path, n_ctx=2048, threads=args.threads)
    out["warnings"] = [str(w.message) for w in said]
    with session:
        needs_file = [spec for spec in args.spec_type if not drafters.mode(spec).runs_with(session.info.has_mtp, False)]
        if needs_file:
            ap.error(f"{', '.join(needs_file)}: not with this model alone (a draft model or head file, or MTP layers)")
        for spec in args.spec_type:
            for n_max in dict.fromkeys(reference_n_max(spec, n) for n in args.n_max):
                for kind, prompts in KIND_PROMPTS.items():
                    rounds = [
                        one_round(
                            session, binary, spec, n_max, prompts[r % len(prompts)], args.tokens, ours_first=r % 2 == 0
                        )
                        for r in range(args.rounds)
                    ]
                    kept = [r for r in rounds if r is not None]
                    out[f"{spec} / {kind} / n_max {n_max}"] = summary(kept) | {"other_drafts": len(rounds) - len(kept)}
                    print(f"{spec} {kind} n_max {n_max}: done", file=sys.stderr, flush=True)
    emit(out)


if __name__ == "__main__":
    main()
