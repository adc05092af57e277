"""SIGINT (JupyterLab's "Interrupt the kernel") stops every long call within one engine step (a long prompt's decode
within one of its graph nodes): KeyboardInterrupt comes, what the call made is kept where it makes a trace, and the same
session generates again. Each call runs in a process of its own (tests/interrupt_child.py) that signals itself a moment
into the call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

CHILD = Path(__file__).with_name("interrupt_child.py")
SLACK = 0.5  # seconds beyond the call's longest step or prefill (the bound: one step plus 0.5 s)
TRACED = {"generate", "stream"}
PARALLEL = {"generate_parallel", "stream_parallel"}
CALLS = [
    "prefill",
    "generate",
    "stream",
    "generate_parallel",
    "stream_parallel",
    "record_oracle",
    "profile_costs",
    "profile_batch_costs",
    "measure_crossover",
    "sweep",
]


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    # every call would decode for ten seconds or more if the signal were ignored; the timeout catches a hang
    done = subprocess.run([sys.executable, str(CHILD), *CALLS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["call"]: r for r in rows}


@pytest.mark.parametrize("call", CALLS)
def test_sigint_stops_the_call_within_a_step_and_the_session_goes_on(results, call):
    for r in results[call]["early"] + [results[call]]:  # any attempt whose signal landed in a prompt, and the last
        assert r["interrupted"], f"{call} ran to its end: the signal was not honoured"
        assert r["latency"] <= r["longest_step"] + SLACK, r
        assert r["again"] == {"n_tokens": 8, "finish_reason": "budget"}
    for r in results[call]["late_tries"]:  # "prefill" only: the whole call ended before its signal, and kept it all
        assert not r["interrupted"] and r["partial"]["finish_reason"] == "budget", r


@pytest.mark.parametrize("call", sorted(TRACED))
def test_an_interrupted_generation_keeps_what_it_made(results, call):
    partial = results[call]["partial"]
    assert partial["finish_reason"] == "cancelled" and 0 < partial["n_tokens"] < 7000
    for r in results[call]["early"]:  # a signal before its first token (a loaded machine): cancelled, nothing made
        assert r["partial"] in (None, {"finish_reason": "cancelled", "n_tokens": 0}), r


@pytest.mark.parametrize("call", sorted(PARALLEL))
def test_an_interrupted_parallel_generation_keeps_each_request(results, call):
    partial = results[call]["partial_parallel"]
    assert len(partial) == 2
    assert all(p["finish_reason"] == "cancelled" and 0 < p["n_tokens"] < 3500 for p in partial)
    for r in results[call]["early"]:  # a signal before the first tokens (a loaded machine): each request cancelled
        assert r["partial_parallel"] is None or (  # None: the signal came before the requests began
            len(r["partial_parallel"]) == 2 and all(p["finish_reason"] == "cancelled" for p in r["partial_parallel"])
        ), r
