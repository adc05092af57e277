"""generate_reference_budget: llama-speculative-simple's budget rule on the native step loop, so that the benchmarks
time the reference's own work (the same tokens and drafts) at any telemetry level, "off" included."""

from __future__ import annotations

import time

import pytest

import mtp_explorer as mx
from mtp_explorer.devtools.reference import (
    generate_reference_budget,
    replay_reference_budget,
    run_reference_spec,
    spec_type_args,
)

CODE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def fibonacci"
)
OPTIONS = {
    "ngram-simple": {"ngram_simple_size_n": 2, "ngram_simple_size_m": 3},
    "ngram-mod,draft-mtp": {"ngram_mod_n_match": 2, "ngram_mod_n_min": 1, "ngram_mod_n_max": 3},
}


@pytest.mark.parametrize("spec, n_rs_seq", [("draft-mtp", 3), ("ngram-mod,draft-mtp", 3), ("ngram-simple", 0)])
@pytest.mark.parametrize("telemetry", ["off", "full"])
@pytest.mark.reference
def test_the_native_budget_run_does_the_references_work(bundled_model, reference_binary, spec, n_rs_seq, telemetry):
    """Text and n_predict / n_drafted / n_accept as the reference prints them, past ``-n`` as it goes, with snapshot
    slots (draft-mtp in the chain) and without (ngram-simple: the checkpoint rule)."""
    options = OPTIONS.get(spec, {})
    ref = run_reference_spec(
        reference_binary, bundled_model, CODE, spec_type_args(spec, 3, options), max_tokens=48, n_ctx=1024, threads=1
    )
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, n_rs_seq=n_rs_seq, capacity=3, telemetry=telemetry) as s:
        assert s.checkpoints == (n_rs_seq == 0)
        run = generate_reference_budget(s, CODE, max_tokens=48, n_max=3, drafter=spec, **options)
    assert (len(run.trace.tokens), run.n_drafted, run.n_accepted) == (ref.n_predict, ref.n_drafted, ref.n_accept)
    assert ref.n_predict > 48 or spec == "ngram-simple"  # the reference's last draft went past -n
    assert "".join(run.trace.pieces) == ref.text


def test_it_generates_what_the_stream_replay_generates(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, n_rs_seq=3, capacity=3) as s:
        native = generate_reference_budget(s, CODE, max_tokens=40, n_max=3)
        streamed = replay_reference_budget(s, CODE, max_tokens=40, n_max=3)
    assert list(native.trace.tokens) == list(streamed.tokens)
    assert (native.n_drafted, native.n_accepted) == (int(streamed.n_drafted.sum()), int(streamed.n_accepted.sum()))
    assert native.trace.columns.keys() == streamed.columns.keys()


def test_the_python_between_the_steps_is_measured_apart(bundled_model):
    """BudgetRun.t_harness_ns: the budget rule's Python between the engine's steps, which a benchmark leaves out
    (Session.generate runs the steps back to back) — part of the call's time, none of the engine's."""
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, n_rs_seq=3, capacity=3, telemetry="off") as s:
        t0 = time.perf_counter_ns()
        run = generate_reference_budget(s, CODE, max_tokens=40, n_max=3)
        wall = time.perf_counter_ns() - t0
    phases = sum(int(run.trace.totals[k]) for k in ("t_catchup_ns", "t_draft_ns", "t_verify_ns", "t_sample_ns"))
    assert 0 < run.t_harness_ns < wall - run.trace.t_prefill_ns - phases
