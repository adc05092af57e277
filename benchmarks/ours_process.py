"""Ours in a child process of its own, as each run of the reference is one (``engine.py``'s drafters section).

A process draws its memory layout once, and the draw moves its speed by 1-3%: the reference's runs sample it, each
in a new process, while ours in the benchmark's own process drew once for a whole row. So a row's ours / reference
moved by up to 4% between runs of the same benchmark (the SYNTHETIC 0.4 B model's draft-mtp at ``n_max`` 1: 0.969
in one run, 0.997 in the next; 1.037 then 0.992), where the row's interval said ±0.5-2%. An :class:`OursProcess`
holds one session opened with a session's ``open_kwargs``, and the drafters section starts a new one every round.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The child: the session, a warm-up, then one timed generation (engine.budget_seconds: the reference's work) per line
# of stdin, answered on stdout.
WORKER = r"""
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import mtp_explorer as mx
from engine import budget_seconds, warm_up
warnings.simplefilter("ignore", mx.CpuKernelWarning)  # the benchmark's own session has said it
path, kwargs, spec = sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
with mx.Session.open(path, **kwargs) as s:
    warm_up(s, 1, spec)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        r = json.loads(line)
        s.telemetry = r["telemetry"]
        secs, run = budget_seconds(s, r["prompt"], r["tokens"], r["n_max"], **r["options"])
        print(json.dumps({"tokens_per_second": len(run.trace.tokens) / secs, "drafted": run.n_drafted,
                          "accepted": run.n_accepted, "seconds": secs, "totals": run.trace.totals}), flush=True)
"""


class OursProcess:
    """A session of ``path`` opened with ``open_kwargs`` (a session's ``open_kwargs``) in a child process, warmed up
    by ``engine.warm_up`` with drafter ``spec`` at ``n_max`` 1, which times generations on the reference's work:
    :meth:`run`. A context manager; :meth:`close` ends the child.

    The warm-up drafts one token a step, so that ours' first timed run grows llama.cpp's output buffer at its first
    verify of more rows, as the reference's run does in its timed loop (at ``n_max`` 1, ours' has grown already)."""

    def __init__(self, path: str | Path, open_kwargs: dict, spec: str | None):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(Path(__file__).resolve().parent),
                str(path),
                json.dumps(open_kwargs),
                json.dumps(spec),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ours' process ended with status {self.proc.wait()} (its stderr is above)")
        return json.loads(line)

    def run(self, prompt: str, tokens: int, n_max: int, telemetry: str, **options) -> dict:
        """One generation at ``telemetry``: ``tokens_per_second`` and ``seconds`` (decode, the prompt excluded),
        ``drafted`` and ``accepted`` (the reference's counting), and the trace's ``totals``."""
        self.proc.stdin.write(
            json.dumps({"prompt": prompt, "tokens": tokens, "n_max": n_max, "telemetry": telemetry, "options": options})
            + "\n"
        )
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> OursProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
