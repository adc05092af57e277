"""Calibration of the draft confidence (reliability per depth, ECE, best p_min) and the what-if
figures (reliability diagram, sweep heatmap, speedup ceiling)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

import mtp_explorer as mx
from mtp_explorer import plots
from mtp_explorer.analysis.calibration import draft_outcomes, expected_calibration_error, reliability

PROMPTS = ["def fib(n):", "import os", "class Stack:"]


@pytest.fixture(scope="module")
def oracles(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=6) as s:
        return [s.record_oracle(p, max_tokens=64, depth=6) for p in PROMPTS]


def test_reliability_and_ece_by_hand():
    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, 20000)
    depth = np.where(rng.uniform(size=conf.size) < 0.5, 1, 2)
    calibrated = rng.uniform(size=conf.size) < conf  # P(accept) = confidence
    table = reliability(depth, conf, calibrated, n_bins=10)
    assert set(table["depth"]) == {1, 2} and table["count"].sum() == conf.size
    assert expected_calibration_error(table) < 0.02
    overconfident = rng.uniform(size=conf.size) < conf * 0.5  # accepted half as often as claimed
    t2 = reliability(depth, conf, overconfident, n_bins=10)
    ece = expected_calibration_error(t2)
    assert ece == pytest.approx(np.mean(conf * 0.5), abs=0.02)
    # the ECE is the count-weighted gap, recomputed from the table
    gap = (t2["count"] * (t2["acceptance"] - t2["confidence"]).abs()).sum() / t2["count"].sum()
    assert ece == pytest.approx(gap)


def test_draft_outcomes_from_oracles_and_traces(model_mixed, oracles):
    o = oracles[0]
    depth, conf, acc = draft_outcomes(o)
    chain_len = o.columns["draft_len"][:, mx.DRAFTERS.index("draft-mtp")]
    # depth 1 is tested at every position with a chain; deeper only after accepted predecessors
    assert (depth == 1).sum() == int((chain_len > 0).sum())
    assert (depth == 2).sum() == int(((chain_len > 1) & (o.match_len >= 1)).sum())
    assert acc[depth == 1].sum() == int((o.match_len >= 1).sum())
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=6) as s:
        t = s.generate(PROMPTS[0], max_tokens=64, n_max=6)
    d2, c2, a2 = draft_outcomes(t)
    assert (d2 == 1).sum() == int((t.n_drafted > 0).sum())
    assert a2.sum() == int(t.n_accepted.sum())


def test_calibrate_and_best_p_min(oracles):
    cal = mx.calibrate(oracles, n_bins=10, p_min=(0.0, 0.2, 0.4, 0.6, 0.8))
    assert set(cal.ece_by_depth) == set(range(1, 7))
    assert 0 <= cal.ece <= 1 and all(0 <= v <= 1 for v in cal.ece_by_depth.values())
    assert set(cal.best_p_min) == set(range(1, 7))
    # the best p_min is the simulator's argmax over the same grid
    df = mx.simulate_grid(oracles, [3], [0.0, 0.2, 0.4, 0.6, 0.8])
    df["sec"] = df.n_tokens / df.tokens_per_second
    agg = df.groupby("p_min").apply(lambda r: r.n_tokens.sum() / r.sec.sum(), include_groups=False)
    assert cal.best_p_min[3] == agg.idxmax()
    assert cal.best_setting["tokens_per_second"] >= agg.max() - 1e-9
    assert cal.to_dict()["ece"] == cal.ece
    # a model whose drafts are always right: every bin accepts everything
    perfect = reliability(np.ones(5, int), np.full(5, 0.9), np.ones(5, bool))
    assert perfect["acceptance"].tolist() == [1.0]


def test_calibration_is_for_drafters_with_a_confidence(model_mixed, oracles):
    from mtp_explorer.analysis.calibration import best_p_min, confident_drafters
    from mtp_explorer.core import drafters

    for name, mode in drafters.MODES.items():
        if mode.has_confidence:
            assert all(d.has_confidence for d in confident_drafters(name))
        else:
            for call in (
                lambda: mx.calibrate(oracles, drafter=name),
                lambda: best_p_min(oracles, drafter=name),
                lambda: draft_outcomes(oracles, drafter=name),
            ):
                with pytest.raises(mx.ParameterError, match="no confidence to calibrate"):
                    call()
    # a chain calibrates the confidence of its drafters that have one, on the drafts they verified
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=6) as s:
        t = s.generate("x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2", max_tokens=48, n_max=4, drafter="chain")
    d, c, a = draft_outcomes(t, drafter="chain")
    confident = np.isin(t.drafter, [spec.index for spec in confident_drafters("chain")])
    assert (d == 1).sum() == int((confident & (t.n_drafted > 0)).sum())
    assert np.isfinite(c).all()


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda o: mx.calibrate([]), "nothing to calibrate"),
        (lambda o: mx.calibrate(o, n_bins=0), "n_bins must be a positive integer"),
        (lambda o: mx.calibrate([o[0], "trace.json"]), "expected oracle traces or traces, got str"),
        (lambda o: mx.best_p_min([]), "one or more oracle traces"),
        (lambda o: mx.best_p_min(o, p_min=[1.5]), r"p_min must be a finite number in \[0, 1\]"),
        (lambda o: mx.best_p_min(o, n_max=[7]), "n_max=7 exceeds the oracle.s capacity of 6"),
        (lambda o: mx.calibrate(o, drafter="beam"), "drafter must be one of"),
    ],
)
def test_calibration_parameter_errors(oracles, call, match):
    with pytest.raises(mx.ParameterError, match=match):
        call(oracles)


def test_figures(oracles):
    cal = mx.calibrate(oracles, p_min=(0.0, 0.5))
    fig = plots.reliability_diagram(cal)
    assert isinstance(fig, go.Figure)
    names = [tr.name for tr in fig.data]
    assert names[0] == "calibrated" and len(names) == 1 + len(cal.ece_by_depth)
    assert "ECE" in names[1] and "p_min" in fig.layout.title.text

    df = mx.simulate_grid(oracles, [0, 1, 2, 4], [0.0, 0.3, 0.6])
    df["mode"] = "simulate"
    heat = plots.sweep_heatmap(df)
    z = np.asarray(heat.data[0].z, dtype=float)
    assert z.shape == (4, 3) and np.isfinite(z).all()
    best = heat.data[1]
    i, j = np.unravel_index(np.argmax(z), z.shape)
    assert best.y[0] == str([0, 1, 2, 4][i]) and best.x[0] == f"{[0.0, 0.3, 0.6][j]:.2f}"

    ceil = plots.speedup_ceiling(df)
    reached = np.asarray(ceil.data[0].y, dtype=float)
    bound = np.asarray(ceil.data[1].y, dtype=float)
    assert len(reached) == 4 and (bound >= reached * 0.999).all()

    pv = plots.predicted_vs_measured([{"label": "a", "predicted": 100.0, "measured": 95.0}])
    assert isinstance(pv, go.Figure) and len(pv.data) == 3

    both = [
        mx.simulate_grid(oracles, [1, 3], [0.0, 0.5], drafter=d)
        for d in ("draft-mtp", "ngram-simple", "ngram-simple,draft-mtp")
    ]
    import pandas as pd

    cmp = plots.drafter_comparison(pd.concat(both))
    from mtp_explorer.core import drafters

    assert [tr.name for tr in cmp.data] == [
        drafters.mode(d).label for d in ("draft-mtp", "ngram-simple", "ngram-simple,draft-mtp")
    ]  # registry labels
    for tr, d in zip(cmp.data, both):
        d["sec"] = d.n_tokens / d.tokens_per_second
        per = d.groupby(["prompt", "n_max", "p_min"]).apply(
            lambda r: r.n_tokens.sum() / r.sec.sum(), include_groups=False
        )
        best = per.groupby(level=0).max()
        assert np.allclose(np.asarray(tr.y, dtype=float), best.reindex(PROMPTS).to_numpy())


def test_ceiling_is_reached_or_beaten_when_every_draft_is_accepted(model_full):
    """With every draft accepted the prediction drafts n_max at every step; the ceiling is the fastest run keeping
    every draft at any draft lengths up to n_max, so it is that run's speed or above (never below, up to the trace's
    whole-nanosecond timing columns: half a ns per phase and step)."""
    with mx.Session.open(model_full, n_ctx=512, threads=1, n_rs_seq=4) as s:
        o = s.record_oracle("def fib(n):", max_tokens=60, depth=4)
    for n_max in (1, 2, 4):
        for max_tokens in (60, 57):  # 57: the last step's draft is cut by the budget
            sim = mx.simulate(o, n_max, 0.0, max_tokens=max_tokens)
            assert sim.summary()["acceptance_rate"] == 1.0
            s = sim.summary()
            ns, ceiling_ns = (
                s["n_tokens"] / tps * 1e9 for tps in (s["tokens_per_second"], sim.ceiling_tokens_per_second())
            )
            assert ceiling_ns <= ns + 0.5 * len(mx.core.schema.PHASES) * s["n_steps"], (n_max, max_tokens)


def test_ceiling_bounds_every_prediction(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=4) as s:
        o = s.record_oracle("def fib(n):", max_tokens=60, depth=4)
    df = mx.simulate_grid(o, [0, 1, 2, 3, 4], [0.0, 0.5, 0.9])
    assert (df.tokens_per_second <= df.ceiling_tokens_per_second * (1 + 1e-12)).all()
    plain = df[df.n_max == 0]
    assert np.allclose(plain.tokens_per_second, plain.ceiling_tokens_per_second, rtol=1e-12)
    assert np.allclose(df.plain_tokens_per_second, plain.tokens_per_second.iloc[0], rtol=1e-12)
