"""What the long calls' checks for signals cost (prints JSON).

``Session.generate`` on Python's main thread takes the GIL between engine steps, at most once per
``_native.signal_check_interval()`` (10 ms), to run pending signal handlers (a SIGINT stops it within one step).
One process, one session at ``telemetry="off"`` (the level where any per-step cost shows most): every round
generates the same prompt once with the checks off (interval 0), at the default interval, and at every step
(interval 1 us), in an order rotated every round. Each setting's time is divided by the same round's run without
checks; the medians of those ratios are printed with a bootstrap 95% interval, beside the spread of the runs
without checks against each other (odd rounds against even), which is the noise a cost must stay within.

    .venv/bin/python benchmarks/interrupt_cost.py [--rounds 40] [--tokens 512] [--n-max 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _common import emit, machine

import mtp_explorer as mx
from mtp_explorer import _native

SETTINGS = {"off": 0.0, "default": None, "every_step": 1e-6}


def interval_of(name: str, default: float) -> float:
    value = SETTINGS[name]
    return default if value is None else value


def bootstrap(ratios: list[float], draws: int = 2000, seed: int = 0) -> list[float]:
    """The median's 95% bootstrap interval."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return [medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    default = _native.signal_check_interval()
    prompt = mx.demo_prompt()
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with mx.Session.open(None, n_ctx=4096, threads=args.threads, telemetry="off") as s:
        s.generate(prompt, max_tokens=32, n_max=args.n_max)  # warm-up
        names = list(SETTINGS)
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                _native.set_signal_check_interval(interval_of(name, default))
                t0 = time.perf_counter()
                t = s.generate(prompt, max_tokens=args.tokens, n_max=args.n_max)
                seconds[name].append(time.perf_counter() - t0)
                assert len(t.tokens) == args.tokens
        _native.set_signal_check_interval(default)
    base = seconds["off"]
    doc = {
        "benchmark": "interrupt_cost",
        "machine": machine(),
        "model": str(mx.default_model_path().name),
        "rounds": args.rounds,
        "tokens": args.tokens,
        "n_max": args.n_max,
        "threads": args.threads,
        "default_interval_s": default,
        "median_seconds": {k: statistics.median(v) for k, v in seconds.items()},
    }
    for name in ("default", "every_step"):
        ratios = [a / b for a, b in zip(seconds[name], base)]
        doc[f"{name}/off"] = {"median": statistics.median(ratios), "ci95": bootstrap(ratios)}
    noise = [a / b for a, b in zip(base[0::2], base[1::2])]
    doc["off/off (noise)"] = {"median": statistics.median(noise), "ci95": bootstrap(noise)}
    emit(doc)


if __name__ == "__main__":
    main()
