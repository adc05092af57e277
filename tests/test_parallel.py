"""n_parallel sequences: requests sharing the engine's steps, each generating what it would alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.parallel_check import check_parallel

PROMPTS = ["def fib(n):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(10):"]

#: columns that must not depend on the other sequences in the batch
OWN_COLUMNS = (
    "step",
    "pos",
    "n_max",
    "p_min",
    "n_min",
    "drafted",
    "n_drafted",
    "n_accepted",
    "target_tokens",
    "stop_reason",
    "correction",
    "rollback",
    "rs_slot",
    "drafter",
    "candidate_len",
)


@pytest.fixture(scope="module")
def session_np4(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=2048, threads=2, n_parallel=4) as s:
        yield s


def check_batch_columns(result: mx.ParallelTrace) -> None:
    """The batch columns agree with the sequences' rows: verify_rows is every active sequence's draft plus one,
    n_active the number of rows at the step, the phase times the same for all of them."""
    df = result.to_pandas()
    for step, rows in df.groupby("batch_step"):
        assert rows["n_active"].nunique() == 1 and rows["n_active"].iloc[0] == len(rows), step
        assert rows["verify_rows"].iloc[0] == int((rows["n_drafted"] + 1).sum()), step
        for phase in mx.core.schema.PHASES:
            assert rows[f"t_{phase}_ns"].nunique() == 1, (step, phase)
        drafting = int((rows["n_max"] > 0).sum())
        draft_rows = rows["draft_rows"].iloc[0]
        if draft_rows:  # the first MTP decode has a row for every sequence drafting with the MTP head
            assert draft_rows[0] == drafting and all(a >= b for a, b in zip(draft_rows, draft_rows[1:])), step
    assert list(result.batch_steps()["batch_step"]) == sorted(df["batch_step"].unique())


def check_against_alone(session, result: mx.ParallelTrace) -> None:
    """Every request equals its greedy generation alone, up to reported floating-point ties."""
    for check in check_parallel(session, result):
        assert not check.unexplained, check.to_dict()
        if not check.same_tokens:
            assert check.ties and check.ties[0]["cause"] == "target_argmax", check.to_dict()


def test_requests_in_one_batch_equal_each_alone(session_np4):
    s = session_np4
    alone = [s.generate(p, max_tokens=48, n_max=3) for p in PROMPTS]
    result = s.generate_parallel(PROMPTS, max_tokens=48, n_max=3)
    assert len(result) == 4 and [r.slot for r in result.requests] == [0, 1, 2, 3]
    for a, t in zip(alone, result.traces):
        assert t.tokens == a.tokens and t.text == a.text
        for name in OWN_COLUMNS:
            np.testing.assert_array_equal(t.columns[name], a.columns[name], err_msg=name)
        assert t.finish_reason == a.finish_reason
    check_batch_columns(result)
    assert result.to_pandas()["n_active"].max() == 4
    check_against_alone(s, result)


def test_summary_aggregates_the_requests(session_np4):
    result = session_np4.generate_parallel(PROMPTS[:3], max_tokens=32, n_max=2)
    sm = result.summary()
    assert sm["n_requests"] == 3 and sm["n_tokens"] == sum(len(t.tokens) for t in result.traces) == 96
    steps = result.batch_steps()
    seconds = steps[[f"t_{p}_ns" for p in mx.core.schema.PHASES]].to_numpy().sum() / 1e9
    assert sm["decode_tokens_per_second"] == pytest.approx(96 / seconds)
    assert sm["mean_verify_rows"] == pytest.approx(steps["verify_rows"].mean())
    assert len(sm["requests"]) == 3 and all(r["latency_seconds"] > 0 for r in sm["requests"])
    n_d = sum(int(t.columns["n_drafted"].sum()) for t in result.traces)
    n_a = sum(int(t.columns["n_accepted"].sum()) for t in result.traces)
    assert sm["acceptance_rate"] == pytest.approx(n_a / n_d)
    assert sm["rs_memory_bytes"] == session_np4.info.rs_slot_bytes * session_np4.capacity * 4 > 0
    df = result.to_pandas()
    assert list(df.columns[:2]) == ["seq", "slot"] and sorted(df["seq"].unique()) == [0, 1, 2]
    assert len(df) == sum(t.n_steps for t in result.traces)


def test_per_request_settings(session_np4):
    s = session_np4
    result = s.generate_parallel(PROMPTS[:2], max_tokens=40, params=[{"n_max": 0}, {"n_max": 4, "p_min": 0.3}])
    plain, spec = result.traces
    assert (plain.columns["n_drafted"] == 0).all() and (plain.columns["n_max"] == 0).all()
    assert spec.columns["n_drafted"].max() > 0 and (spec.columns["n_max"] == 4).all()
    assert np.allclose(spec.columns["p_min"], 0.3)
    assert plain.tokens == s.generate(PROMPTS[0], max_tokens=40, n_max=0).tokens
    assert spec.tokens == s.generate(PROMPTS[1], max_tokens=40, n_max=4, p_min=0.3).tokens
    short = s.generate_parallel(PROMPTS[:2], max_tokens=40, params=[None, {"max_tokens": 5}])
    assert [len(t.tokens) for t in short.traces] == [40, 5]
    check_batch_columns(result)


def test_requests_arrive_and_wait_for_a_free_sequence(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=2, n_parallel=2) as s:
        alone = [s.generate(p, max_tokens=24, n_max=3) for p in PROMPTS[:3]]
        result = s.generate_parallel(PROMPTS[:3], max_tokens=24, n_max=3, arrivals=[0, 4, 0])
        joining = s.generate_parallel(PROMPTS[:2], max_tokens=24, n_max=3, arrivals=[0, 3])
    first, late, third = result.requests
    assert (first.admitted_step, third.admitted_step, third.slot) == (0, 0, 1)  # both slots taken at step 0
    # the late request arrived at step 4 with no free sequence: it took the first one freed
    freed = min(first.finished_step, third.finished_step)
    assert late.arrival == 4 < freed and late.admitted_step == freed + 1
    assert late.slot == (first if first.finished_step <= third.finished_step else third).slot
    assert [t.tokens for t in result.traces] == [a.tokens for a in alone]
    assert result.batch_steps()["n_active"].max() == 2
    check_batch_columns(result)
    # a free sequence: the request joins the running batch at its arrival step
    assert [r.admitted_step for r in joining.requests] == [0, 3]
    assert list(joining.batch_steps()["n_active"][:5]) == [1, 1, 1, 2, 2]
    assert [t.tokens for t in joining.traces] == [a.tokens for a in alone[:2]]
    check_batch_columns(joining)


def test_one_sequence_behaves_as_a_single_generation(session_mixed):
    single = session_mixed.generate("import os\n", max_tokens=30, n_max=3)
    result = session_mixed.generate_parallel(["import os\n"], max_tokens=30, n_max=3)
    (t,) = result.traces
    assert t.tokens == single.tokens
    for name in single.columns:
        if not name.startswith("t_") and name not in ("h_norm_target", "h_norm_draft", "draft_target_cos"):
            np.testing.assert_array_equal(t.columns[name], single.columns[name], err_msg=name)
    assert (single.columns["n_active"] == 1).all() and (single.columns["batch_step"] == single.columns["step"]).all()
    assert (single.columns["verify_rows"] == single.columns["n_drafted"] + 1).all()


def test_chains_and_lookups_in_parallel(session_np4):
    s = session_np4
    for drafter in ("ngram-simple", "ngram-simple,draft-mtp", "ngram-mod"):
        alone = [s.generate(p, max_tokens=32, n_max=4, drafter=drafter) for p in PROMPTS]
        result = s.generate_parallel(PROMPTS, max_tokens=32, n_max=4, drafter=drafter)
        assert [t.tokens for t in result.traces] == [a.tokens for a in alone], drafter
        for a, t in zip(alone, result.traces):
            np.testing.assert_array_equal(t.columns["drafter"], a.columns["drafter"], err_msg=drafter)
        stats = s.drafter_stats()
        assert stats and stats[0]["n_call_begin"] == 1


def test_draft_model_in_parallel(model_mixed, model_synthetic_draft):
    with mx.Session.open(model_mixed, n_ctx=1024, threads=2, n_parallel=2, draft_model=model_synthetic_draft) as s:
        alone = [s.generate(p, max_tokens=24, n_max=3, drafter="draft-simple") for p in PROMPTS[:2]]
        result = s.generate_parallel(PROMPTS[:2], max_tokens=24, n_max=3, drafter="draft-simple")
        assert [t.tokens for t in result.traces] == [a.tokens for a in alone]
        for a, t in zip(alone, result.traces):
            np.testing.assert_array_equal(t.columns["n_accepted"], a.columns["n_accepted"])


def test_stream_parallel_yields_every_row(session_np4):
    batches = list(session_np4.stream_parallel(PROMPTS[:3], max_tokens=20, n_max=2))
    result = session_np4.last_parallel_trace
    assert sum(len(b) for b in batches) == sum(t.n_steps for t in result.traces)
    for batch in batches:
        assert len({row.step.batch_step for row in batch}) == 1
        assert len(batch) == batch[0].step.n_active
        assert [row.slot for row in batch] == [result.requests[row.seq].slot for row in batch]
    tokens = [[] for _ in range(3)]
    for batch in batches:
        for i, _slot, step in batch:
            tokens[i] += step.tokens
    assert tokens == [t.tokens for t in result.traces]


def test_bad_input(session_np4, bundled_model):
    s = session_np4
    with pytest.raises(mx.ParameterError, match="n_parallel=4"):
        s.generate_parallel(PROMPTS + ["x = 1"], max_tokens=8)
    with pytest.raises(mx.ParameterError, match="request 1: the prompt is empty"):
        s.generate_parallel(["a = 1", ""], max_tokens=8)
    with pytest.raises(mx.ParameterError, match="request 0: n_max=9 exceeds this session.s capacity of 8"):
        s.generate_parallel(["a = 1", "b = 2"], max_tokens=8, params=[{"n_max": 9}, None])
    with pytest.raises(mx.ParameterError, match="unknown setting"):
        s.generate_parallel(["a = 1"], params=[{"temperature": 1.0}])
    with pytest.raises(mx.ParameterError, match="2 entries for 1 prompts"):
        s.generate_parallel(["a = 1"], arrivals=[0, 1])
    with pytest.raises(mx.ParameterError, match="arrivals"):
        s.generate_parallel(["a = 1"], arrivals=[-1])
    with pytest.raises(mx.ParameterError, match="no prompts"):
        s.generate_parallel([])
    with pytest.raises(mx.ContextOverflowError, match="sequence's context of 512"):
        s.generate_parallel(["a = 1", "b = 2"], max_tokens=600)
    with pytest.raises(mx.ParameterError, match="n_parallel"):
        mx.Session.open(bundled_model, n_parallel=0)
    # nothing ran: the session still generates
    assert s.generate_parallel(["a = 1"], max_tokens=4).traces[0].tokens == s.generate("a = 1", max_tokens=4).tokens


def test_cancel_stops_every_sequence(session_np4):
    s = session_np4
    started = threading.Event()
    out = {}

    def run():
        out["gen"] = s.stream_parallel(PROMPTS, max_tokens=400, n_max=3)
        for i, _ in enumerate(out["gen"]):
            if i == 2:
                started.set()

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60)
    s.cancel()
    worker.join(60)
    assert not worker.is_alive()
    result = s.last_parallel_trace
    assert {t.finish_reason for t in result.traces} == {"cancelled"}
    assert all(0 < len(t.tokens) < 400 for t in result.traces)
    again = s.generate_parallel(PROMPTS[:2], max_tokens=16, n_max=3)
    assert [t.tokens for t in again.traces] == [s.generate(p, max_tokens=16, n_max=3).tokens for p in PROMPTS[:2]]


def test_figures_of_a_parallel_run(session_np4):
    import pandas as pd

    from mtp_explorer import plots

    result = session_np4.generate_parallel(PROMPTS[:3], max_tokens=16, n_max=3, arrivals=[0, 0, 0])
    fig = plots.slot_timeline(result)
    marks = [t for t in fig.data if t.mode == "markers"]
    assert len(marks) == 3 and sum(len(t.x) for t in marks) == sum(t.n_steps for t in result.traces)
    for info, t in zip(result.requests, marks):
        assert set(t.y) == {info.slot}
    bars = plots.batch_rows(result)
    assert list(bars.data[0].y) == list(result.batch_steps()["verify_rows"])
    frame = pd.DataFrame(
        {
            "n_parallel": [1, 2, 4],
            "n_max": [3, 2, 1],
            "p_min": [0.0, 0.0, 0.5],
            "goodput": [300.0, 500.0, 600.0],
            "plain_tokens_per_second": [200.0, 400.0, 700.0],
        }
    )
    cross = plots.parallel_crossover(frame, measured=frame)
    assert any("N=4" in (a.text or "") for a in cross.layout.annotations)
    assert "every N" in plots.parallel_crossover(frame.iloc[:2]).layout.title.text
    with pytest.raises(TypeError, match="ParallelTrace"):
        plots.slot_timeline(result.traces[0])


def test_explorer_slots_tab(session_np4, session_mixed):
    from mtp_explorer.widgets import Explorer, SlotsView

    assert Explorer(session_mixed).slots_view is None  # one sequence: no slots tab
    ex = Explorer(session_np4)
    view = ex.slots_view
    assert isinstance(view, SlotsView) and view.n_slider.max == 4
    assert ex.children[1].get_title(1) == "slots"
    view.n_slider.value, view.n_max_slider.value, view.max_tokens = 3, 2, 24
    result = view.run()
    assert view.n_requests == 3 and len(result.traces) == 3 and view.state == "idle"
    assert "3 requests on 4 slots" in view.status
    marks = [t for t in view.timeline.data if t.mode == "markers"]
    assert sum(len(t.x) for t in marks) == sum(t.n_steps for t in result.traces)
    assert list(view.rows.data[0].y) == list(result.batch_steps()["verify_rows"])
    view.max_tokens = 12
    df = view.measure()
    assert list(df["n_parallel"]) == [1, 2, 4] and len(view.crossover.data) == 2
    assert ("stops paying" in view.status) == (df.attrs["crossover"] is not None)
    assert (df["repeats"] >= 1).all() and (df["goodput_spread"] >= 0).all() and (df["speedup_spread"] >= 0).all()
    assert df.attrs["crossover_within_spread"] in ((None,) if df.attrs["crossover"] is None else (True, False))
    assert "run-to-run spread up to" in view.status
    view.run_button.click()  # the button runs it in the background
    view.wait(60)
    assert view.state == "idle" and "3 requests" in view.status
    view.prompts = [""]  # a bad prompt: the button's error goes to the status line, the view stays usable
    view.run_button.click()
    view.wait(60)
    assert view.state == "idle" and "prompt is empty" in view.status
    with pytest.raises(mx.ParameterError, match="prompt is empty"):
        view.run()  # called directly, it raises
    ex.close()


def test_live_parallel_equals_the_result(session_np4):
    from mtp_explorer.widgets import LiveParallel

    live = LiveParallel(session_np4, 3)
    for rows in session_np4.stream_parallel(PROMPTS[:3], max_tokens=16, n_max=3):
        live.add(rows)
    final, partial = session_np4.last_parallel_trace, live.result()
    assert [t.tokens for t in partial.traces] == [t.tokens for t in final.traces]
    assert [r.slot for r in partial.requests] == [r.slot for r in final.requests]
    for a, b in zip(partial.traces, final.traces):
        for name in ("batch_step", "n_drafted", "verify_rows", "draft_rows"):
            np.testing.assert_array_equal(a.columns[name], b.columns[name], err_msg=name)


def test_latency_counts_only_the_steps_a_request_was_in(session_np4):
    """A request arriving after an idle stretch: its latency is its prefill and the time of the steps it ran in."""
    result = session_np4.generate_parallel(PROMPTS[:2], max_tokens=8, n_max=2, arrivals=[0, 40])
    first, late = result.requests
    assert first.finished_step < late.arrival == late.admitted_step
    sm = result.summary()["requests"][1]
    steps = result.batch_steps()
    own = steps[(steps["batch_step"] >= late.admitted_step) & (steps["batch_step"] <= late.finished_step)]
    seconds = own[[f"t_{p}_ns" for p in mx.core.schema.PHASES]].to_numpy().sum() / 1e9
    assert sm["latency_seconds"] == pytest.approx(seconds + late.t_prefill_ns / 1e9)
