"""The telemetry levels' cost in two builds of the package, measured in one interleaved run (prints JSON).

Each build is a Python interpreter with mtp_explorer installed (e.g. the .venv of a clone at another commit). One
long-lived worker process per build opens the bundled model; the driver asks one run at a time: every round, for
each prompt, every (build, level) once, back to back, in an order rotated every round. Ratios are formed within such
a group (the same round and prompt) and summarised by their median with a bootstrap 95% interval. A build whose
``telemetry`` knows only True/False (before the levels existed) runs "full" as True and "steps" as False, and no
"off".

    .venv/bin/python benchmarks/telemetry_ab.py --python-a /tmp/before/.venv/bin/python \\
        --python-b .venv/bin/python [--rounds 60] [--tokens 256] [--n-max 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):"]
LEVELS = ("full", "steps", "off")


def worker(threads: int) -> None:
    """Answer JSON lines {"level", "prompt", "tokens", "n_max"} with the run's decode seconds (stdin -> stdout)."""
    import mtp_explorer as mx

    out, sys.stdout = sys.stdout, sys.stderr  # the protocol channel carries nothing else
    s = mx.Session.open(mx.default_model_path(), n_ctx=2048, threads=threads)
    s.generate(PROMPTS[0], max_tokens=16, n_max=2)  # warm-up
    from mtp_explorer.core import options

    legacy = not hasattr(options, "TELEMETRY_LEVELS")  # a build from before the levels: True / False
    levels = ["full", "steps"] if legacy else list(LEVELS)
    out.write(json.dumps({"levels": levels, "module": mx.__file__}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        s.telemetry = {"full": True, "steps": False}[req["level"]] if legacy else req["level"]
        t0 = time.perf_counter_ns()
        t = s.generate(req["prompt"], max_tokens=req["tokens"], n_max=req["n_max"])
        seconds = (time.perf_counter_ns() - t0 - t.t_prefill_ns) / 1e9
        out.write(json.dumps({"seconds": seconds, "tokens": [int(x) for x in t.tokens]}) + "\n")
        out.flush()


def bootstrap(values: list[float], n: int = 5000) -> list[float]:
    """A 95% bootstrap interval of the median of ``values``."""
    import numpy as np

    rng = np.random.default_rng(0)
    v = np.asarray(values)
    medians = np.median(v[rng.integers(0, len(v), (n, len(v)))], axis=1)
    return [float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-a", required=True)
    ap.add_argument("--python-b", required=True)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.threads)
        return 0
    import numpy as np

    procs, configs = {}, []
    for build, python in (("a", args.python_a), ("b", args.python_b)):
        p = subprocess.Popen(
            [
                python,
                os.path.abspath(__file__),
                "--worker",
                "--python-a",
                "-",
                "--python-b",
                "-",
                "--threads",
                str(args.threads),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/tmp",
        )
        hello = json.loads(p.stdout.readline())
        procs[build] = (p, hello)
        configs += [(build, level) for level in hello["levels"]]
    load_start = list(os.getloadavg())
    groups: list[dict] = []
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for prompt in PROMPTS:
            group, texts = {}, set()
            for build, level in order:
                p = procs[build][0]
                p.stdin.write(
                    json.dumps({"level": level, "prompt": prompt, "tokens": args.tokens, "n_max": args.n_max}) + "\n"
                )
                p.stdin.flush()
                answer = json.loads(p.stdout.readline())
                group[f"{build}/{level}"] = answer["seconds"]
                texts.add(tuple(answer["tokens"]))
            if len(texts) != 1:
                raise SystemExit(f"the configurations generated different tokens for {prompt!r}")
            groups.append(group)
    for p, _ in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    doc = {
        "rounds": args.rounds,
        "groups": len(groups),
        "tokens": args.tokens,
        "n_max": args.n_max,
        "threads": args.threads,
        "load_start": load_start,
        "load_end": list(os.getloadavg()),
        "builds": {b: h["module"] for b, (_, h) in procs.items()},
        "median_tokens_per_second": {c: args.tokens / float(np.median([g[c] for g in groups])) for c in groups[0]},
    }
    pairs = [
        ("a/full", "a/steps"),
        ("b/full", "b/steps"),
        ("b/full", "b/off"),
        ("b/steps", "b/off"),
        ("b/full", "a/full"),
        ("b/steps", "a/steps"),
    ]
    for x, y in pairs:
        if x in groups[0] and y in groups[0]:
            ratios = [g[x] / g[y] for g in groups]
            doc[f"{x} / {y} (time)"] = {"median": float(np.median(ratios)), "ci95": bootstrap(ratios)}
    ratio_of_ratios = [(g["b/full"] / g["b/steps"]) / (g["a/full"] / g["a/steps"]) for g in groups]
    doc["(b full/steps) / (a full/steps)"] = {
        "median": float(np.median(ratio_of_ratios)),
        "ci95": bootstrap(ratio_of_ratios),
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
