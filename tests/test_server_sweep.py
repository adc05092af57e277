"""mx.server_sweep: a grid of llama-server's own settings measured on a workload, one real server per
configuration on loopback, stopped whatever happens; its results, recommendation, command line and preset; and the
faults of a SYNTHETIC misbehaving server (a Python stand-in for the binary) that crashes, hangs or answers garbage."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import textwrap
import time
import warnings

import psutil
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.batch import SERVER_TERMS
from mtp_explorer.server import GRID_FLAGS, ServerSweep, Workload, WorkloadRequest
from mtp_explorer.server.grid import configurations
from mtp_explorer.server.overhead import OverheadSample, fit_server_overhead, profile_server_overhead
from mtp_explorer.server.predict import config_settings, record, request_counters, slot_run_counters

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = ("def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):")


def _children() -> set[psutil.Process]:
    """The processes this test process started that still run (the suite's other children included)."""
    me = psutil.Process()
    return {p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


def _servers_left(before: set[psutil.Process]) -> list[psutil.Process]:
    """llama-server processes (or stand-ins) started since ``before`` (:func:`_children`) that still run."""
    return sorted(_children() - before, key=lambda p: p.pid)


@pytest.mark.server
def test_a_sweep_of_the_bundled_model_on_a_real_server(bundled_model, server_binary, tmp_path):
    workload = Workload.from_prompts(PROMPTS, n_predict=24, categories=["code", "code", "prose"])
    grid = {"spec_type": ["none", "draft-mtp"], "n_max": [3], "n_parallel": [1, 2]}
    before = _children()
    sweep = mx.server_sweep(
        bundled_model, workload, grid, threads=1, n_ctx=2048, binary=server_binary, timeout_s=120, progress=False
    )
    f = sweep.frame
    assert len(f) == 4 * 3  # 4 configurations x (all, code, prose)
    assert set(f["status"]) == {"ok"} and not _servers_left(before)
    everything = f[f["category"] == "all"]
    assert (everything["n_requests"] == 3).all() and (everything["tokens_per_second"] > 0).all()
    plain, spec = everything[everything["spec_type"] == "none"], everything[everything["spec_type"] == "draft-mtp"]
    assert plain["acceptance"].isna().all() and (spec["acceptance"].between(0, 1)).all()
    assert (spec["mean_accepted_length"] > 0).all()
    assert (everything["latency_p95"] >= everything["latency_p50"]).all()
    assert (everything["ttft_p50"] <= everything["latency_p50"]).all()
    assert list(f[f["category"] != "all"]["n_requests"].unique()) in ([2, 1], [1, 2])
    row = spec[spec["n_parallel"] == 2].iloc[0]
    assert "--spec-type draft-mtp" in sweep.command(row) and "--spec-draft-n-max 3" in sweep.command(row)
    assert "--parallel 2" in sweep.command(row) and "--spec-type" not in plain.iloc[0]["command"]
    assert "--spec-draft" not in plain.iloc[0]["command"]  # plain decoding: no speculative setting to pass
    assert "spec-draft" not in sweep.preset(plain.iloc[0]) and "parallel" in sweep.preset(plain.iloc[0])
    preset = sweep.preset(row)
    assert preset.startswith("[mtp-explorer]\nmodel = ") and "spec-type = draft-mtp" in preset
    assert "spec-draft-n-max = 3" in preset and "parallel = 2" in preset
    best = sweep.best("throughput")
    assert sorted(best["n_parallel"]) == [1, 2] and (best["status"] == "ok").all()
    assert set(sweep.best("p95_latency")["n_parallel"]) == {1, 2}
    assert sweep.best("goodput", latency_bound=0.0).empty  # no configuration answers in no time
    back = ServerSweep.load(sweep.save(tmp_path / "sweep.json"))
    assert back.grid == sweep.grid and back.workload == workload
    assert back.frame[["spec_type", "n_parallel", "status"]].equals(f[["spec_type", "n_parallel", "status"]])
    assert back.frame["tokens_per_second"].tolist() == pytest.approx(f["tokens_per_second"].tolist(), nan_ok=True)


@pytest.mark.server
def test_the_explorer_predicts_a_sweep_from_one_recording(bundled_model, server_binary, tmp_path):
    """Greedy counters predicted from one recording are the server's for single requests (-np 1), a chat request
    included (the server's template and tokens); tokens/s is predicted for every row, with its error against the
    median of three runs and whether it lies outside their range."""
    chat = WorkloadRequest("", 24, "chat", ({"role": "user", "content": "Write a function that reverses a list."},))
    workload = Workload(
        Workload.from_prompts(PROMPTS[:2], n_predict=24, categories=["code", "prose"]).requests + (chat,)
    )
    grid = {"spec_type": ["none", "draft-mtp", "ngram-mod,draft-mtp"], "n_max": [3], "n_parallel": [1, 2]}
    sweep = mx.server_sweep(
        bundled_model,
        workload,
        grid,
        threads=1,
        n_ctx=2048,
        binary=server_binary,
        timeout_s=120,
        repeats=3,
        progress=False,
    )
    f = sweep.frame
    assert (f["repeats"] == 3).all() and (f["tokens_per_second_spread"] >= 0).all()
    assert len(sweep.requests) == 6 * 3 * 3 and sweep.requests["ok"].all()
    assert len(sweep.prompt_tokens) == 3 and len(sweep.prompt_tokens[2]) > 10  # the chat's prompt, templated
    with mx.Session.open(bundled_model, n_parallel=2, n_ctx=2048, threads=1) as session:
        with pytest.raises(mx.ParameterError, match="open the session with n_parallel=4"):
            dataclasses.replace(sweep, grid={**sweep.grid, "n_parallel": [4]}).with_predictions(session)
        with pytest.raises(mx.ParameterError, match="all at once"):
            dataclasses.replace(sweep, workload=Workload(workload.requests, rate=1.0)).with_predictions(session)
        with pytest.raises(mx.ParameterError, match="no server tokens"):
            dataclasses.replace(sweep, prompt_tokens=None).with_predictions(session)
        with pytest.raises(mx.ParameterError, match="the sweep served"):
            dataclasses.replace(sweep, model=str(tmp_path / "other.gguf")).with_predictions(session)
        predicted = sweep.with_predictions(session, binary=server_binary, progress=False)
    p, r = predicted.frame, predicted.requests
    assert set(mx.server.PREDICTED_COLUMNS) <= set(p.columns) and len(p) == len(f)
    single = r[(r["spec_type"] == "draft-mtp") & (r["n_parallel"] == 1)]
    assert (single["draft_n"] > 0).all()
    for _, runs in single.groupby("request"):  # the prediction is one of the server's own outcomes, nearly always all
        measured = set(zip(runs["tokens_predicted"], runs["draft_n"], runs["draft_n_accepted"]))
        assert (
            runs.iloc[0]["predicted_tokens"],
            runs.iloc[0]["predicted_draft_n"],
            runs.iloc[0]["predicted_draft_n_accepted"],
        ) in measured
    assert single["counts_match"].mean() >= 2 / 3
    assert (p["predicted_tokens_per_second"] > 0).all() and p["tokens_per_second_error"].notna().all()
    assert set(p["beyond_spread"]) <= {True, False}
    assert p[p["spec_type"] == "none"]["predicted_acceptance"].isna().all()
    chain = p[p["spec_type"] == "ngram-mod,draft-mtp"]["prediction_note"]
    assert chain.str.contains("ngram-mod: its n-gram pool").all()  # the server keeps it across requests
    assert chain.str.contains("not by --spec-draft-n-max").all()  # nor does it cut the look-up's drafts to n_max
    assert p[p["spec_type"] != "none"]["prediction_note"].str.contains("draft-mtp: each slot's pending hidden").all()
    assert (p[p["spec_type"] == "none"]["prediction_note"] == "").all()
    # -np 1: every request but the first its slot served ran after another, whose hidden row the MTP head carries
    one = r[(r["n_parallel"] == 1) & r["spec_type"].ne("none")]
    for _, run in one.groupby(["spec_type", "repeat"]):  # one slot: the requests one after another
        after = run["served_after"].tolist()
        assert after.count(-1) == 1 and len(set(after)) == len(after), after
        assert run["id_slot"].tolist() == [0, 0, -1]  # a chat answer does not name its slot
    assert one["slot_carry"].tolist() == (one["served_after"] >= 0).tolist()
    assert not r[r["spec_type"] == "none"]["slot_carry"].any()
    back = ServerSweep.load(predicted.save(tmp_path / "p.json"))
    assert back.frame["predicted_n_accepted"].tolist() == p["predicted_n_accepted"].tolist()
    assert back.frame["prediction_note"].tolist() == p["prediction_note"].tolist()
    assert back.requests["counts_match"].tolist() == r["counts_match"].tolist()
    assert back.prompt_tokens == sweep.prompt_tokens and back.workload.requests[2].messages == chat.messages
    fig = mx.plots.server_predictions(predicted)
    assert len(fig.data) == 4 and "median |tokens/s error|" in fig.layout.title.text
    with pytest.raises(mx.InputTypeError, match="without predictions"):
        mx.plots.server_predictions(sweep)


@pytest.mark.server
def test_predictions_of_a_sweep_with_rows_that_did_not_run_or_cannot_be_replayed(bundled_model, server_binary):
    """with_predictions predicts every row that ran and leaves the others' predictions empty, with the reason: a
    configuration that failed on the server, and one the session cannot run (draft-eagle3 without a draft model)."""
    workload = Workload.from_prompts(PROMPTS[:1], n_predict=8)
    grid = {"spec_type": ["none", "draft-mtp", "draft-eagle3"], "n_max": [3]}
    sweep = mx.server_sweep(
        bundled_model, workload, grid, threads=1, n_ctx=1024, binary=server_binary, timeout_s=120, progress=False
    )
    frame = sweep.frame.copy()
    frame.loc[frame["spec_type"] == "draft-mtp", "status"] = "failed to start: SYNTHETIC failure"
    broken = dataclasses.replace(sweep, frame=frame)
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1) as session:
        p = broken.with_predictions(session, binary=server_binary, progress=False).frame.set_index("spec_type")
    assert p.loc["none", "predicted_tokens_per_second"] > 0 and p.loc["none", "prediction_note"] == ""
    assert math.isnan(p.loc["draft-mtp", "predicted_tokens_per_second"])
    assert p.loc["draft-mtp", "prediction_note"] == (
        "not predicted: it failed on the server (failed to start: SYNTHETIC failure)"
    )
    assert math.isnan(p.loc["draft-eagle3", "predicted_tokens_per_second"])
    assert p.loc["draft-eagle3", "prediction_note"].startswith("not predicted: ")
    assert "draft model" in p.loc["draft-eagle3", "prediction_note"]
    assert p["tokens_per_second_error"].notna().tolist() == [True, False, False]


@pytest.mark.server
def test_the_server_overheads_are_measured_saved_and_priced(bundled_model, server_binary, tmp_path):
    """What a llama-server request costs beyond the engine's work: fit (on SYNTHETIC samples, exactly), measured on a
    real server, saved with the batch cost model, and added by every server-slot prediction (the loop's overhead per
    request and step, the work outside the loop once per workload and per request's latency); a model without them
    (or saved before them) warns."""
    true = {"request_ns": 2e6, "step_ns": 1e5, "draft_step_ns": 3e4, "draft_slot_ns": 4e5, "row_ns": 2e4}
    shapes = [  # (spec_type, n_parallel, requests, steps, drafting steps, drafting slot-steps, rows)
        ("none", 1, 1, 10, 0, 0, 10),
        ("none", 1, 1, 40, 0, 0, 40),
        ("none", 1, 4, 100, 0, 0, 100),
        ("none", 2, 4, 60, 0, 0, 120),
        ("draft-mtp", 1, 1, 10, 9, 9, 30),
        ("draft-mtp", 1, 1, 30, 29, 29, 100),
        ("draft-mtp", 1, 4, 80, 76, 76, 250),
        ("draft-mtp", 2, 4, 40, 39, 70, 200),
        ("ngram-simple,draft-mtp", 2, 4, 50, 45, 80, 230),
    ]

    def sample(spec, n_parallel, *counted, predicted_s=0.1):
        counts = dict(zip(SERVER_TERMS.values(), counted))
        loop = sum(true[term] * counts[count] for term, count in SERVER_TERMS.items()) / 1e9
        return OverheadSample(predicted_s + loop + 5e-3, predicted_s, counts, spec, 32, n_parallel)

    samples = [sample(*shape, predicted_s=0.05 * (i + 1)) for i, shape in enumerate(shapes)]
    fit = fit_server_overhead(samples)
    assert {term: fit[term] for term in true} == pytest.approx(true) and fit["outside_ns"] == pytest.approx(5e6)
    assert fit["measured"]["median_abs_residual"] == pytest.approx(0, abs=1e-9) and fit["measured"]["not_fit"] == []
    # without a workload drafting on two slots at once the per-slot term cannot be told from the per-step one
    one_slot = fit_server_overhead([x for x in samples if x.n_parallel == 1 or x.spec_type == "none"])
    assert one_slot["measured"]["not_fit"] == ["draft_slot_ns"] and one_slot["draft_slot_ns"] == 0
    plain = fit_server_overhead([x for x in samples if x.spec_type == "none"])  # no drafting sample
    assert plain["measured"]["not_fit"] == ["draft_step_ns", "draft_slot_ns"]
    assert plain["request_ns"] == pytest.approx(2e6) and plain["outside_ns"] == pytest.approx(5e6)
    with pytest.raises(mx.ParameterError, match="two request counts"):
        fit_server_overhead([x for x in samples if x.counts["requests"] == 4])
    with mx.Session.open(bundled_model, n_ctx=2048, threads=1) as session:
        costs = mx.profile_batch_costs(session, n_parallel=[1], n_max=[0, 3], max_tokens=24, repeats=1)
        assert costs.server is None
        with pytest.raises(mx.ParameterError, match="two request lengths"):
            profile_server_overhead(session, costs, binary=server_binary, n_predict=(8, 8))
        before = _children()
        with pytest.raises(mx.ParameterError, match="two prompts"):
            profile_server_overhead(session, costs, binary=server_binary, prompts=PROMPTS[:1])
        with pytest.raises(mx.ParameterError, match="seconds"):
            profile_server_overhead(session, costs, binary=server_binary, seconds=-1)
        small = {"binary": server_binary, "prompts": PROMPTS[:2], "n_predict": (8, 32), "repeats": 1}
        measured = profile_server_overhead(session, costs, seconds=0, n_parallel=(1, 2), **small)
        assert not _servers_left(before)
        server = measured.server
        assert all(server[term] >= 0 for term in SERVER_TERMS) and server["outside_ns"] >= 0
        # per drafter and length: two requests alone and together on one slot, together on two; one round each
        assert server["measured"]["samples"] == 2 * 2 * (3 + 1) and server["measured"]["n_parallel"] == [1, 2]
        assert server["measured"]["rounds"] == [1, 1, 1, 1]
        # rounds added until each server's workloads have lasted `seconds`: every round whole
        longer = profile_server_overhead(
            session, costs, seconds=0.3, n_parallel=(1,), spec_types=("none",) * 2, **small
        ).server["measured"]
        assert all(r >= 1 for r in longer["rounds"]) and longer["samples"] == 2 * 3 * sum(longer["rounds"])
        assert server["measured"]["spec_types"] == ["none", "draft-mtp"] and costs.server is None
        assert mx.BatchCostModel.load(measured.save(tmp_path / "costs.json")).server == server
        old = json.loads(costs.to_json())
        del old["server"]
        with pytest.warns(mx.ServerOverheadMissing, match="saved before"):
            assert mx.BatchCostModel.from_json(json.dumps(old)).server is None
        oracle = session.record_oracle(PROMPTS[0], max_tokens=24, depth=3, probe=False, batch_shift=False)
        with pytest.warns(mx.ServerOverheadMissing, match="without a llama-server"):
            bare = mx.predict_parallel([oracle], costs, n_parallel=1, n_max=3, server_slot=True)
        priced_costs = dataclasses.replace(costs, server={"request_ns": 1e6, "step_ns": 2e4, "outside_ns": 3e6})
        queued = {"n_parallel": 1, "n_max": 3, "server_slot": True, "arrivals": [0, 0, 0]}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            priced = mx.predict_parallel([oracle], priced_costs, n_parallel=1, n_max=3, server_slot=True)
            engine = mx.predict_parallel([oracle], priced_costs, n_parallel=1, n_max=3)  # not a server: none added
            unpriced = mx.predict_parallel([oracle], costs, n_parallel=1, n_max=3)
            three = mx.predict_parallel([oracle] * 3, priced_costs, **queued)
            bare_three = mx.predict_parallel([oracle] * 3, costs, warn=False, **queued)
            drafting_costs = dataclasses.replace(costs, server={"draft_step_ns": 7e4})  # per step that drafts
            drafted = mx.predict_parallel([oracle], drafting_costs, n_parallel=1, n_max=3, server_slot=True)
            plain = mx.predict_parallel([oracle], drafting_costs, n_parallel=1, n_max=0, server_slot=True)
            bare_plain = mx.predict_parallel([oracle], costs, n_parallel=1, n_max=0, server_slot=True, warn=False)
            two_slots = {"n_parallel": 2, "n_max": 3, "server_slot": True, "arrivals": [0, 0, 0]}
            every = mx.predict_parallel([oracle] * 3, dataclasses.replace(costs, server=fit), **two_slots)
            bare_every = mx.predict_parallel([oracle] * 3, costs, warn=False, **two_slots)
    added = 1e-3 + 2e-5 * bare["n_steps"] + 3e-3

    def seconds(p):
        return p["n_tokens"] / p["tokens_per_second"]

    assert seconds(priced) - seconds(bare) == pytest.approx(added, rel=1e-9)
    assert priced["requests"][0]["latency_seconds"] - bare["requests"][0]["latency_seconds"] == pytest.approx(
        added, rel=1e-9
    )
    # three requests queued on one slot: the loop's overhead three times, the work outside the loop once
    loop = 3 * 1e-3 + 2e-5 * bare_three["n_steps"]
    assert seconds(three) - seconds(bare_three) == pytest.approx(loop + 3e-3, rel=1e-9)
    assert priced["summed_request_tokens_per_second"] < bare["summed_request_tokens_per_second"]
    assert seconds(engine) == seconds(unpriced)
    # every step of a greedy draft-mtp run at p_min 0 drafts, but the last one where the budget leaves no room
    drafting_steps = (seconds(drafted) - seconds(bare)) / 7e-5
    assert drafting_steps == pytest.approx(round(drafting_steps), abs=1e-6)
    assert bare["n_steps"] - 1 <= round(drafting_steps) <= bare["n_steps"]
    assert seconds(plain) == pytest.approx(seconds(bare_plain), rel=1e-12)  # plain decoding drafts nothing
    # every term by the count it is charged by: three requests drafting on two slots
    counts = every["server_counts"]
    assert counts == bare_every["server_counts"] and counts["requests"] == 3 and counts["steps"] == every["n_steps"]
    assert counts["drafting_steps"] < counts["drafting_slot_steps"] < 2 * counts["drafting_steps"]
    assert counts["rows"] > counts["drafting_slot_steps"] + counts["steps"]
    added = sum(true[term] * counts[count] for term, count in SERVER_TERMS.items()) / 1e9 + 5e-3
    assert every["seconds"] - bare_every["seconds"] == pytest.approx(added, rel=1e-9)
    assert seconds(every) == pytest.approx(every["seconds"], rel=1e-12)


@pytest.mark.server
def test_the_server_sweeps_costs_are_measured_with_the_servers_snapshot_slots(bundled_model, server_binary):
    """llama-server gives a recurrent target as many snapshot slots as --spec-draft-n-max; more of them make every
    step dearer, so a prediction measures its batch costs on a session with the server's number (a second one of
    the model where the caller's holds another), and leaves the caller's session as it was."""
    workload = Workload.from_prompts([PROMPTS[0]], n_predict=8)
    grid = {"spec_type": ["draft-mtp"], "n_max": [2], "n_parallel": [1]}
    with mx.Session.open(bundled_model, n_ctx=2048, threads=1, n_rs_seq=8) as session:
        recording = record(session, workload, grid, binary=server_binary)
        assert recording.costs.measured["session"]["n_rs_seq"] == 2
        assert recording.costs.server["draft_step_ns"] >= 0 and recording.costs.server["step_ns"] >= 0
        assert session.open_kwargs["n_rs_seq"] == 8 and session.capacity == 8
        session.generate(PROMPTS[0], max_tokens=4, n_max=8)  # still open, still its own
        with session.reopened(n_rs_seq=3) as like:
            assert like.capacity == 3 and like.n_ctx == session.n_ctx and like.threads == session.threads
            assert like.open_kwargs == session.open_kwargs | {"n_rs_seq": 3, "capacity": 3}


@pytest.mark.server
def test_single_greedy_requests_get_the_predicted_counters(bundled_model, server_binary):
    """Greedy acceptance predicted for single requests (-np 1, one request per server: its slot served nothing
    before) is the measured one exactly, draft_n and draft_n_accepted of each request: draft-mtp, and ngram-simple
    alone and before draft-mtp, whose look-up drafts past n_max on this prompt (the server cuts a look-up's draft by
    the budget alone, and on this recurrent target restores a checkpoint after a rejection deeper than its snapshot
    slots: predict.server_lookup_counters)."""
    workload = Workload.from_prompts([mx.demo_prompts()[1].text], n_predict=48)
    grid = {"spec_type": ["draft-mtp", "ngram-simple,draft-mtp", "ngram-simple"], "n_max": [2, 3], "n_parallel": [1]}
    sweep = mx.server_sweep(
        bundled_model, workload, grid, threads=1, n_ctx=4096, binary=server_binary, timeout_s=120, progress=False
    )
    with mx.Session.open(bundled_model, n_ctx=4096, threads=1, n_rs_seq=48) as session:  # the look-ups' lengths
        predicted = sweep.with_predictions(session, binary=server_binary, progress=False)
        prompt = workload.requests[0].prompt
        oracle = session.record_oracle(prompt, max_tokens=48, depth=3, probe=False, batch_shift=False)
        for config in configurations(grid):  # the engine run as a slot and the recording's replay agree here
            settings = config_settings(config, 48)
            assert slot_run_counters(session, prompt, settings) == request_counters(oracle, settings), config
    r, f = predicted.requests, predicted.frame
    assert len(r) == 6 and r["ok"].all() and not r["slot_carry"].any() and (r["served_after"] == -1).all()
    cols = ["spec_type", "n_max", "draft_n", "predicted_draft_n", "draft_n_accepted", "predicted_draft_n_accepted"]
    assert r["counts_match"].all(), r[cols]
    assert f["predicted_acceptance"].tolist() == f["acceptance"].tolist()
    lookup = r[r["spec_type"] == "ngram-simple"]
    assert (lookup["draft_n"] > lookup["draft_n_accepted"]).all()  # rejected look-ups: checkpoint replays
    chain = r[r["spec_type"] == "ngram-simple,draft-mtp"].set_index("n_max")["draft_n"]
    alone = r[r["spec_type"] == "draft-mtp"].set_index("n_max")["draft_n"]
    assert (chain > alone).all()  # the look-up's drafts, longer than n_max, verified whole
    assert (
        "the prediction follows it (ngram-simple: its counters, verify sizes"
        in f[f["spec_type"] == "ngram-simple"]["prediction_note"].iloc[0]
    )


def released(server, n: int, timeout: float = 120.0) -> str:
    """The server's log once it holds ``n`` slot releases: llama.cpp's log thread writes a request's lines before its
    slot's "stop processing" line, in order, some time after the response."""
    deadline = time.monotonic() + timeout
    while server.log.count("stop processing") < n:
        assert time.monotonic() < deadline, f"no {n} slot releases in llama-server's log after {timeout:.0f} s"
        time.sleep(0.05)
    return server.log


@pytest.mark.server
def test_a_slot_carries_the_mtp_heads_hidden_row_into_its_next_request(bundled_model, server_binary):
    """What ``slot_carry`` marks, on the real server: llama-server's draft-mtp head pairs a request's first prompt token
    with the last hidden row of the request its slot served before (common_speculative_impl_draft_mtp::pending_h,
    zeros on a fresh slot), so the head's drafts differ from the same request's on a fresh slot, the same way on
    every fresh server (deterministic, not run-to-run), though the target's tokens do not (cache_prompt is off: the
    prompt is decoded from position 0 either way)."""
    first, then = "import os\n\n\ndef list_files(path):", "def fib(n):"

    def drafts(before: str | None) -> tuple[str, list[str]]:
        with mx.LlamaServer(
            bundled_model,
            n_parallel=1,
            n_ctx=4096,
            threads=1,
            spec_type=None,
            binary=server_binary,
            args=["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "-lv", "5"],
        ) as server:
            client = server.client()
            if before is not None:
                client.complete(before, 48)
                released(server, 1)  # llama.cpp's log thread has written the earlier request's lines
            mark = len(server.log)
            done = client.complete(then, 48)
            log = released(server, 2 if before is not None else 1)[mark:]
        lines = [line.split("draft candidate")[1] for line in log.splitlines() if "draft candidate" in line]
        return done.text, lines[:6]  # the head's first two drafts (3 candidates each)

    fresh_text, fresh = drafts(None)
    runs = [drafts(first) for _ in range(2)]
    assert runs[0] == runs[1]  # the same on two fresh servers
    text, carried = runs[0]
    assert text == fresh_text and carried and fresh
    assert carried[0] != fresh[0]  # the head's first draft: other probabilities


@pytest.mark.server
def test_llama_server_does_not_cut_a_lookup_draft_to_n_max(bundled_model, server_binary):
    """What the prediction's note says of look-ups (predict.SERVER_LOOKUP_CAP), on the real server: ngram-simple
    drafts past --spec-draft-n-max, up to the budget left."""
    prompt = mx.demo_prompts()[1].text
    for n_max in (1, 3):
        with mx.LlamaServer(
            bundled_model,
            n_parallel=1,
            n_ctx=4096,
            threads=1,
            spec_type=None,
            binary=server_binary,
            args=["--spec-type", "ngram-simple", "--spec-draft-n-max", str(n_max)],
        ) as server:
            client = server.client()
            before = client.metrics()
            done = client.complete(prompt, 32)
            grown = client.metrics().since(before)
        assert grown.drafts >= 1 and done.draft_n > n_max * grown.drafts, (n_max, done, grown)


def test_a_server_slot_replay_is_the_engine_run_as_the_server_runs_it(bundled_model):
    """simulate(server_slot=True) takes the steps our engine takes when it runs a request as a llama-server slot
    (devtools.reference.replay_server): no draft before the first token, then the policy."""
    from mtp_explorer.devtools.reference import replay_server

    s = mx.Session.open(bundled_model, n_ctx=2048, threads=1)
    for prompt in PROMPTS:
        oracle = s.record_oracle(prompt, max_tokens=24, depth=3, probe=False, batch_shift=False)
        for drafter, n_max in (("draft-mtp", 3), ("draft-mtp", 1), ("ngram-mod,draft-mtp", 2)):
            sim = mx.simulate(oracle, n_max, drafter=drafter, server_slot=True)
            real = replay_server(s, prompt, n_predict=24, n_max=n_max, drafter=drafter)
            assert sim.n_max[0] == 0 and sim.n_drafted[0] == 0 and sim.settings["server_slot"]
            assert sim.n_drafted.tolist() == real.n_drafted.tolist(), (prompt, drafter, n_max)
            assert sim.n_accepted.tolist() == real.n_accepted.tolist(), (prompt, drafter, n_max)
            assert mx.server.server_counters(sim) == mx.server.server_counters(real)
    assert not mx.simulate(oracle, 3).settings["server_slot"]
    assert mx.simulate(oracle, mx.DraftSettings(n_max=3, max_tokens=24, server_slot=True)).settings["server_slot"]
    s.close()


STAND_IN = '''#!{python}
"""SYNTHETIC llama-server: its --spec-type names its fault (crash, hang, garbage); anything else serves."""
import http.server, json, os, sys, time
argv = sys.argv
port = int(argv[argv.index("--port") + 1])
fault = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else "none"
served = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, json.dumps({{"status": "ok"}}))
        if self.path == "/metrics":
            if fault == "garbage":
                return self.reply(200, "garbage!!", "text/plain")
            n = served[0]
            lines = ["llamacpp:spec_decode_num_drafts_total %d" % (4 * n),
                     "llamacpp:spec_decode_num_draft_tokens_total %d" % (8 * n),
                     "llamacpp:spec_decode_num_accepted_tokens_total %d" % (6 * n),
                     'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} %d' % (4 * n),
                     'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} %d' % (2 * n),
                     "llamacpp:tokens_predicted_total %d" % (10 * n),
                     "llamacpp:tokens_predicted_seconds_total %f" % (0.1 * n)]
            return self.reply(200, "\\n".join(lines) + "\\n", "text/plain")
        self.reply(404, "{{}}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if fault == "crash":
            os._exit(3)
        if fault == "hang":
            time.sleep(3600)
        served[0] += 1
        self.reply(200, json.dumps({{"content": "x", "stop_type": "limit", "timings": {{
            "predicted_n": 10, "predicted_ms": 100.0, "predicted_per_second": 100.0, "prompt_n": 3,
            "prompt_ms": 1.0, "draft_n": 8, "draft_n_accepted": 6}}}}))


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def test_a_sweep_records_each_faulty_configuration_and_goes_on(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text(textwrap.dedent(STAND_IN).format(python=sys.executable))
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")  # the stand-in does not read it
    grid = {"spec_type": ["draft-mtp", "crash", "hang", "garbage", "draft-mtp"], "n_parallel": [2]}
    before = _children()
    sweep = mx.server_sweep(model, ["a", "b"], grid, n_predict=8, binary=binary, timeout_s=5, progress=False)
    status = list(sweep.frame["status"])
    assert status[0] == "ok" and status[4] == "ok"  # the sweep went on past the faults
    assert status[1].startswith("crashed (exit code 3)") or "requests failed" in status[1], status[1]
    assert status[2] == "timed out after 5 s"
    assert status[3].startswith("bad /metrics")
    ok = sweep.frame.iloc[0]
    assert ok["acceptance"] == 0.75 and ok["mean_accepted_length"] == 1.5 and ok["n_requests"] == 2
    assert math.isnan(sweep.frame.iloc[2]["tokens_per_second"])
    assert not _servers_left(before)
    assert list(sweep.best()["spec_type"]) == ["draft-mtp"]  # failures are never recommended


def test_bad_sweeps_are_parameter_errors(tmp_path):
    with pytest.raises(mx.ParameterError, match="unknown grid key"):
        configurations({"ngl": [1]})
    with pytest.raises(mx.ParameterError, match="a server sweep cannot run one"):
        configurations({"schedule": ["heuristic"], "n_max": [4]})
    with pytest.raises(mx.ParameterError, match="no values"):
        configurations({"n_max": []})
    assert configurations({"n_max": [1, 2], "spec_type": "draft-mtp"}) == [
        {"n_max": 1, "spec_type": "draft-mtp"},
        {"n_max": 2, "spec_type": "draft-mtp"},
    ]
    # plain decoding is measured once per concurrency, not once per n_max it does not use
    assert configurations({"spec_type": ["none", "draft-mtp"], "n_max": [2, 3], "n_parallel": [1, 2]}) == [
        {"spec_type": "none", "n_max": 2, "n_parallel": 1},
        {"spec_type": "none", "n_max": 2, "n_parallel": 2},
        {"spec_type": "draft-mtp", "n_max": 2, "n_parallel": 1},
        {"spec_type": "draft-mtp", "n_max": 2, "n_parallel": 2},
        {"spec_type": "draft-mtp", "n_max": 3, "n_parallel": 1},
        {"spec_type": "draft-mtp", "n_max": 3, "n_parallel": 2},
    ]
    assert set(GRID_FLAGS) >= {"spec_type", "n_max", "n_min", "p_min", "n_parallel"}
    with pytest.raises(mx.ParameterError, match="at least one request"):
        Workload(())
    with pytest.raises(mx.ParameterError, match="rate"):
        Workload.from_prompts(["a"], rate=0)
    path = tmp_path / "w.jsonl"
    path.write_text(
        json.dumps({"prompt": "a", "category": "code"}) + "\n\n" + json.dumps({"prompt": "b", "n_predict": 4}) + "\n"
    )
    w = Workload.from_jsonl(path, n_predict=16, rate=2.0)
    assert [(r.prompt, r.n_predict, r.category) for r in w.requests] == [("a", 16, "code"), ("b", 4, "all")]
    arrivals = w.arrivals()
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals == w.arrivals()  # seeded: the same each time
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}) + "\n")
    (req,) = Workload.from_jsonl(path).requests
    assert (req.prompt, req.n_predict, req.messages) == ("", 5, ({"role": "user", "content": "hi"},))
    for bad in ('{"messages": []}', '{"messages": [{"role": "user"}]}', '{"prompt": "a", "n_predict": 0}'):
        path.write_text(bad + "\n")
        with pytest.raises(mx.FormatError, match="w.jsonl:1"):
            Workload.from_jsonl(path)
    with pytest.raises(mx.ParameterError, match="a prompt or chat messages"):
        WorkloadRequest("a", 4, messages=({"role": "user", "content": "b"},))
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(mx.FormatError, match="w.jsonl:1"):
        Workload.from_jsonl(path)
    with pytest.raises(mx.FormatError, match="not an mtp-explorer server sweep"):
        (tmp_path / "x.json").write_text("{}")
        ServerSweep.load(tmp_path / "x.json")
    with pytest.raises(mx.ParameterError, match="goal"):
        ServerSweep(frame=None, model="m", grid={}, workload=w).best("fastest")


def test_a_server_prediction_prices_the_lookups_the_server_drafts(bundled_model):
    """llama-server drafts an ngram-simple look-up past n_max (test above): the server-slot prediction's steps are the
    server's (analysis.server_slot.server_lookup_steps), so its tokens are the predicted counters' and its verified
    rows the walk's, longer than n_max + 1 where a look-up is; the engine's own prediction cuts them to n_max."""
    from mtp_explorer.analysis.server_slot import server_lookup_steps
    from mtp_explorer.server.predict import server_lookup_counters

    with mx.Session.open(bundled_model, n_ctx=2048, threads=1) as s:
        oracle = s.record_oracle(mx.demo_prompts()[1].text, max_tokens=48, depth=3, probe=False, batch_shift=False)
        costs = mx.profile_batch_costs(s, n_parallel=[1], n_max=[0, 2], max_tokens=16, repeats=1)
    for drafter in ("ngram-simple", "ngram-simple,draft-mtp"):
        settings = mx.DraftSettings(drafter=drafter, n_max=2, max_tokens=48)
        steps = server_lookup_steps(oracle, settings)
        assert steps is not None and steps.rows.max() > 2 + 1, drafter  # a look-up longer than n_max
        assert steps.counters == server_lookup_counters(oracle, settings)
        assert int(steps.tokens.sum()) == steps.counters["n_predict"]
        kw = {"n_parallel": 1, "arrivals": [0], "warn": False}
        server = mx.predict_parallel([oracle], costs, settings, server_slot=True, **kw)
        engine = mx.predict_parallel([oracle], costs, settings, **kw)
        assert server["n_tokens"] == steps.counters["n_predict"] and server["n_steps"] == len(steps.rows)
        assert server["server_counts"]["rows"] == int(steps.rows.sum())
        assert engine["mean_verify_rows"] <= 2 + 1 < max(steps.rows)
    assert server_lookup_steps(oracle, mx.DraftSettings(drafter="draft-mtp", n_max=2, max_tokens=48)) is None
