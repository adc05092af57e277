"""Telemetry columns: shapes, padding, value ranges, summary, pandas and JSON round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.core.options import TELEMETRY_LEVELS
from mtp_explorer.core.trace import COLUMNS


@pytest.fixture(scope="module")
def trace(session_mixed) -> mx.Trace:
    return session_mixed.generate("def fib(n):", max_tokens=60, n_max=4, p_min=0.1)


def test_column_shapes_and_padding(trace, session_mixed):
    n, D, K = trace.n_steps, session_mixed.capacity, 5
    c = trace.columns
    assert set(c) == set(COLUMNS)
    for name in ("drafted", "draft_prob", "h_norm_draft", "draft_target_cos"):
        assert c[name].shape == (n, D), name
    for name in ("target_tokens", "h_norm_target"):
        assert c[name].shape == (n, D + 1), name
    assert c["topk_ids"].shape == c["topk_probs"].shape == (n, D, K)
    for name in ("step", "pos", "n_drafted", "n_accepted", "stop_reason", "rollback", "rs_slot", "t_verify_ns"):
        assert c[name].shape == (n,), name
    assert (c["step"] == np.arange(n)).all()
    depth = np.arange(D)[None, :]
    real = depth < c["n_drafted"][:, None]
    assert ((c["drafted"] >= 0) == real).all()
    assert np.isnan(c["draft_prob"][~real]).all() and not np.isnan(c["draft_prob"][real]).any()
    assert (c["topk_ids"][~real] == -1).all()
    real_t = np.arange(D + 1)[None, :] <= c["n_drafted"][:, None]
    assert ((c["target_tokens"] >= 0) == real_t).all()
    assert not np.isnan(c["h_norm_target"][real_t]).any() and np.isnan(c["h_norm_target"][~real_t]).all()


def test_values(trace):
    c = trace.columns
    real = c["drafted"] >= 0
    probs = c["draft_prob"][real]
    assert ((probs > 0) & (probs <= 1)).all()
    # the drafted token is the top-1 alternative, alternatives sorted by probability
    assert (c["topk_ids"][..., 0][real] == c["drafted"][real]).all()
    tp = c["topk_probs"][real]
    assert (np.diff(tp, axis=-1) <= 1e-7).all() and (tp.sum(axis=-1) <= 1 + 1e-5).all()
    assert np.allclose(tp[:, 0], probs)
    cos = c["draft_target_cos"][real]
    assert ((cos >= -1.0001) & (cos <= 1.0001)).all()
    # pre-norm residual norms vary (the post-norm h_nextn would be near constant)
    h = c["h_norm_target"][~np.isnan(c["h_norm_target"])]
    assert h.std() > 0.01 * h.mean() > 0
    assert (c["h_norm_draft"][real] > 0).all()
    assert (c["t_verify_ns"] > 0).all() and (c["t_draft_ns"][c["n_drafted"] > 0] > 0).all()
    pos = c["pos"]
    assert pos[0] == len(trace.prompt_tokens) - 1
    assert (np.diff(pos) == c["n_accepted"][:-1] + 1).all()
    assert set(np.unique(c["stop_reason"])) <= set(range(len(mx.STOP_REASONS)))


def test_summary(trace, session_mixed):
    s = trace.summary()
    assert s["n_steps"] == trace.n_steps and s["n_tokens"] == len(trace.tokens) == 60
    assert s["n_drafted"] == trace.n_drafted.sum() and s["n_accepted"] == trace.n_accepted.sum()
    assert math.isclose(s["acceptance_rate"], s["n_accepted"] / s["n_drafted"])
    assert math.isclose(s["mean_accepted_length"], trace.n_accepted.mean())
    assert s["acceptance_by_head"] == [s["acceptance_rate"]]  # one MTP head drafts every depth
    assert len(s["acceptance_by_depth"]) == session_mixed.capacity
    assert s["acceptance_by_depth"][0] >= s["acceptance_by_depth"][3] >= 0
    assert all(math.isnan(v) for v in s["acceptance_by_depth"][4:])
    assert set(s["phase_seconds"]) == {"catchup", "draft", "verify", "sample"}
    assert s["tokens_per_second"] > 0
    assert s["rs_slot_bytes"] == session_mixed.info.rs_slot_bytes > 0
    assert s["finish_reason"] == "budget"


def test_cost_breakdown_splits_the_time_per_step(trace, session_mixed):
    from mtp_explorer.core.metrics import cost_breakdown

    c = cost_breakdown(trace)
    s = trace.summary()
    per_step = sum(c[f"{p}_ms_per_step"] for p in s["phase_seconds"])
    assert per_step * trace.n_steps == pytest.approx(1e3 * sum(s["phase_seconds"].values()))
    assert c["tokens_per_step"] * trace.n_steps == len(trace.tokens)
    assert c["verify_rows_per_step"] == 1 + c["draft_tokens_per_step"] == 1 + s["n_drafted"] / trace.n_steps
    assert c["ms_per_token"] == pytest.approx(per_step / c["tokens_per_step"])
    plain = cost_breakdown(session_mixed.generate("def f(x):", max_tokens=8, n_max=0))
    assert plain["tokens_per_step"] == plain["verify_rows_per_step"] == 1 and math.isnan(plain["ms_per_draft_token"])


def test_steps_and_pandas(trace):
    steps = trace.steps
    assert len(steps) == trace.n_steps
    assert all(isinstance(s, mx.Step) for s in steps)
    df = trace.to_pandas()
    assert len(df) == trace.n_steps
    assert list(df["n_accepted"]) == trace.n_accepted.tolist()
    assert df["drafted"].map(len).tolist() == trace.n_drafted.tolist()
    assert trace.token_origin.tolist().count("accepted") == trace.n_accepted.sum()


def test_json_round_trip(trace):
    text = trace.to_json()
    json.loads(text)  # strict JSON: no NaN literals
    back = mx.Trace.from_json(text)
    assert back.tokens == trace.tokens and back.text == trace.text and back.pieces == trace.pieces
    assert back.settings == trace.settings and back.finish_reason == trace.finish_reason
    for name, arr in trace.columns.items():
        assert back.columns[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(back.columns[name], arr, err_msg=name)
    assert json.dumps(back.summary()) == json.dumps(trace.summary())  # NaN-aware comparison
    with pytest.raises(ValueError):
        mx.Trace.from_json(json.dumps({"format": "something else"}))


def test_telemetry_levels_record_less_and_generate_the_same(session_mixed):
    """ "full" records every column, "steps" the rows without per-depth detail, "off" only the totals; the
    tokens, the per-step counts and the totals are the same at every level."""
    s = session_mixed
    assert s.telemetry == "full" and TELEMETRY_LEVELS == ("off", "steps", "full")
    runs = {}
    try:
        for level in ("full", "steps", False, "off", True):
            s.telemetry = level
            runs[level] = s.generate("import os", max_tokens=40, n_max=3)
            assert runs[level].settings["telemetry"] == {False: "steps", True: "full"}.get(level, level)
    finally:
        s.telemetry = "full"
    full, steps, off = runs["full"], runs["steps"], runs["off"]
    assert all(t.tokens == full.tokens for t in runs.values())
    np.testing.assert_array_equal(steps.n_accepted, full.n_accepted)
    np.testing.assert_array_equal(steps.drafted, full.drafted)
    assert np.isnan(steps.h_norm_target).all() and (steps.topk_ids == -1).all()
    assert not np.isnan(full.h_norm_target).all() and (full.topk_ids >= 0).any()
    np.testing.assert_array_equal(runs[False].n_accepted, steps.n_accepted)  # False is "steps"
    assert off.n_steps == 0 and off.totals["n_steps"] == full.n_steps
    for t in (full, steps):
        assert t.totals["n_steps"] == t.n_steps and t.totals["n_drafted"] == int(t.n_drafted.sum())
        assert t.totals["n_accepted"] == int(t.n_accepted.sum())
        assert t.totals["t_verify_ns"] == int(t.t_verify_ns.sum())
    a, b = off.summary(), full.summary()
    assert {k: a[k] for k in ("n_steps", "n_drafted", "n_accepted", "n_tokens", "acceptance_rate")} == {
        k: b[k] for k in ("n_steps", "n_drafted", "n_accepted", "n_tokens", "acceptance_rate")
    }
    assert a["mean_accepted_length"] == pytest.approx(b["mean_accepted_length"]) and a["tokens_per_second"] > 0
    assert mx.Trace.from_json(off.to_json()).summary()["n_accepted"] == a["n_accepted"]
    with pytest.raises(mx.ParameterError, match="telemetry must be one of"):
        s.telemetry = "some"
    with pytest.raises(mx.ParameterError, match="telemetry must be one of"):
        mx.Session.open(s.path, telemetry="verbose")
    s.telemetry = "off"
    try:
        with pytest.raises(mx.ParameterError, match="telemetry='off' records none"):
            next(s.stream("import os", max_tokens=8))
    finally:
        s.telemetry = "full"


def test_the_explorer_records_full_telemetry_only_for_views_that_draw_it(session_mixed):
    from mtp_explorer.widgets import Explorer

    try:
        Explorer(session_mixed, views=["acceptance_by_depth", "throughput"])
        assert session_mixed.telemetry == "steps"
        Explorer(session_mixed, views=["acceptance_by_depth", "hidden_norms"])
        assert session_mixed.telemetry == "full"
    finally:
        session_mixed.telemetry = "full"
