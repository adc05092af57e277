"""Resources held across many sessions and many generations in one process (prints JSON).

Two loops on the bundled model: ``--cycles`` times open a session, generate ``--tokens`` tokens and close it; then,
in one session, ``--generations`` generations. Before, during (every tenth of the loop) and after each loop it
counts this process's resident memory (RSS, MiB), open file descriptors, threads and the entries of its temporary
directory (set to a fresh folder for this run). ``tests/test_resources.py`` runs it at a reduced count.

    .venv/bin/python benchmarks/resources.py [--cycles 1000] [--generations 1000] [--tokens 16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def counts(tmp: Path) -> dict:
    return {
        "rss_mib": round(rss_mib(), 1),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "tmp_entries": len(os.listdir(tmp)),
    }


def loop(n: int, body, tmp: Path) -> dict:
    """``body()`` n times; the counts before, at every tenth and after."""
    before = counts(tmp)
    samples = []
    t0 = time.perf_counter()
    for i in range(n):
        body()
        if (i + 1) % max(1, n // 10) == 0:
            samples.append({"done": i + 1} | counts(tmp))
    after = counts(tmp)
    return {
        "n": n,
        "seconds": round(time.perf_counter() - t0, 1),
        "before": before,
        "samples": samples,
        "after": after,
        "rss_max_mib": max(s["rss_mib"] for s in samples + [after]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mtp-explorer-resources-"))
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    from _common import emit, machine

    import mtp_explorer as mx

    prompt = mx.demo_prompt()

    def cycle() -> None:
        with mx.Session.open(None, n_ctx=1024) as s:
            s.generate(prompt, max_tokens=args.tokens, n_max=3)

    cycle()  # the first session loads what every later one shares (libraries, the CPU-kernel probe's answer)
    doc = {
        "benchmark": "resources",
        "machine": machine(),
        "tokens": args.tokens,
        "open_generate_close": loop(args.cycles, cycle, tmp),
    }
    with mx.Session.open(None, n_ctx=1024) as s:
        doc["generations_in_one_session"] = loop(
            args.generations, lambda: s.generate(prompt, max_tokens=args.tokens, n_max=3), tmp
        )
    shutil.rmtree(tmp, ignore_errors=True)
    emit(doc)


if __name__ == "__main__":
    main()
