"""Sweeps (simulate and measure, local and on a Dask LocalCluster) and recommend()."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.simulate import ceiling_tokens_per_second
from mtp_explorer.analysis.sweep import COLUMNS
from mtp_explorer.core import drafters
from mtp_explorer.core.schema import PHASES

PROMPTS = ["def fib(n):", "import os", "class Stack:", "x = [1, 2, 3]\nx = [1, 2"]
N_MAX = [0, 1, 2, 4]
P_MIN = [0.0, 0.5, 0.8]
TOKENS = 48
TOKEN_COLUMNS = [
    "prompt",
    "drafter",
    "n_max",
    "p_min",
    "n_min",
    "n_tokens",
    "n_steps",
    "n_drafted",
    "n_accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "tokens_digest",
]


@pytest.fixture(scope="module")
def session(model_mixed, model_synthetic_draft):
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=4, draft_model=model_synthetic_draft) as s:
        yield s


@pytest.fixture(scope="module")
def cost(session):
    return session.record_oracle(PROMPTS[0], max_tokens=TOKENS, depth=4).fitted_cost


@pytest.fixture(scope="module")
def local_sim(session, cost):
    return mx.sweep(session, PROMPTS, n_max=N_MAX, p_min=P_MIN, max_tokens=TOKENS, cost=cost, progress=False)


def test_simulate_sweep_shape_and_values(session, cost, local_sim):
    df = local_sim
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == len(PROMPTS) * len(N_MAX) * len(P_MIN)
    assert set(df["mode"]) == {"simulate"}
    assert (df["n_tokens"] == TOKENS).all()
    # greedy: the same tokens for every setting of a prompt
    assert (df.groupby("prompt")["tokens_digest"].nunique() == 1).all()
    # oracles recorded before and given to the sweep: replayed as they are, nothing recorded; the same greedy
    # outputs and counts as the sweep that recorded its own (times are compared below on one recording only)
    oracles = [session.record_oracle(p, max_tokens=TOKENS, depth=4, probe=False) for p in PROMPTS]
    record = session.record_oracle
    session.record_oracle = None  # a recording would fail
    try:
        replayed = mx.sweep(
            session, PROMPTS, n_max=N_MAX, p_min=P_MIN, max_tokens=TOKENS, cost=cost, progress=False, oracles=oracles
        )
    finally:
        session.record_oracle = record
    pd.testing.assert_frame_equal(replayed[TOKEN_COLUMNS], df[TOKEN_COLUMNS])
    # each row is the simulator's answer for that oracle and setting (both sides from the same recording)
    o = oracles[1].with_cost(cost)
    for n_max, p_min in ((2, 0.5), (4, 0.0), (0, 0.8)):
        sim = mx.simulate(o, n_max, p_min)
        row = replayed[(replayed.prompt == PROMPTS[1]) & (replayed.n_max == n_max) & (replayed.p_min == p_min)].iloc[0]
        s = sim.summary()
        assert (row.n_steps, row.n_drafted, row.n_accepted) == (s["n_steps"], s["n_drafted"], s["n_accepted"])
        # the sweep sums each step's phase times as they are, the simulated trace stores each rounded to the ns
        ns = row.n_tokens / row.tokens_per_second * 1e9
        assert abs(ns - s["n_tokens"] / s["tokens_per_second"] * 1e9) <= 0.5 * len(PHASES) * s["n_steps"]
        assert row.seconds == pytest.approx(ns / 1e9, rel=1e-12)
        assert row.ceiling_tokens_per_second == pytest.approx(sim.ceiling_tokens_per_second(), rel=1e-12)
        assert row.plain_tokens_per_second == pytest.approx(ceiling_tokens_per_second(o, 0), rel=1e-12)
    plain = df[df.n_max == 0]
    assert (plain.n_drafted == 0).all() and (plain.n_steps == TOKENS).all()
    assert (df.ceiling_tokens_per_second > 0).all() and (df.plain_tokens_per_second > 0).all()


def test_measure_sweep_agrees_with_simulation(session, cost, local_sim):
    df = mx.sweep(
        session,
        PROMPTS[:2],
        n_max=[0, 2, 4],
        p_min=[0.0, 0.8],
        mode="measure",
        max_tokens=TOKENS,
        progress=False,
        cost=cost,
    )
    assert list(df.columns) == list(COLUMNS) and len(df) == 2 * 3 * 2
    assert set(df["mode"]) == {"measure"}
    assert (df.tokens_per_second > 0).all()
    sim = local_sim.set_index(["prompt", "n_max", "p_min"])
    for row in df.itertuples():
        expect = sim.loc[(row.prompt, row.n_max, row.p_min)]
        # greedy output and, exactly, the accepted counts the simulator predicted
        assert row.tokens_digest == expect.tokens_digest
        assert (row.n_steps, row.n_drafted, row.n_accepted) == (expect.n_steps, expect.n_drafted, expect.n_accepted)
        # measured tokens/s beside the same cost model's ceiling the simulated sweep shows
        assert row.ceiling_tokens_per_second == pytest.approx(expect.ceiling_tokens_per_second, rel=1e-12)
        assert expect.repeats == 0 and math.isnan(expect.tokens_per_second_spread)
        assert expect.speedup == pytest.approx(expect.tokens_per_second / expect.plain_tokens_per_second, rel=1e-12)
    assert (df.repeats == 1).all() and df.tokens_per_second_spread.isna().all() and (df.speedup > 0).all()


def test_a_measured_sweep_alternates_with_its_baseline_and_gives_its_spread(session, cost, monkeypatch):
    """Each setting's runs alternate with plain runs (setting, plain, plain, setting, ...); tokens/s and the speedup
    are the medians, with their run-to-run spread; a recommendation says when its margin is within that spread."""
    ran, generate = [], session.generate

    def logged(prompt, settings=None, **kw):
        ran.append(settings.n_max)
        return generate(prompt, settings, **kw)

    monkeypatch.setattr(session, "generate", logged)
    df = mx.sweep(
        session,
        PROMPTS[:1],
        n_max=[2, 3],
        p_min=[0.0],
        mode="measure",
        max_tokens=TOKENS,
        repeats=3,
        progress=False,
        cost=cost,
    )
    assert ran == [2, 0, 0, 2, 2, 0] + [3, 0, 0, 3, 3, 0]
    assert (df.repeats == 3).all() and (df.tokens_per_second_spread >= 0).all() and (df.speedup_spread >= 0).all()
    assert np.isfinite(df[["tokens_per_second", "plain_tokens_per_second", "speedup"]].to_numpy()).all()
    rec = mx.recommend(df)
    assert rec.spread == pytest.approx(df.tokens_per_second_spread.max())
    assert bool(rec.note) == (rec.margin_over_runner_up <= rec.spread)
    assert not rec.note or "within the runs' spread" in rec.note
    simulated = mx.recommend(
        mx.sweep(session, PROMPTS[:1], n_max=[2, 3], p_min=[0.0], max_tokens=TOKENS, progress=False, cost=cost)
    )
    assert math.isnan(simulated.spread) and simulated.note == ""


def test_recommend(local_sim):
    rec = mx.recommend(local_sim)
    t = rec.table
    assert t["tokens_per_second"].is_monotonic_decreasing
    best = t.iloc[0]
    assert (rec.n_max, rec.p_min) == (best.n_max, best.p_min)
    # tokens/s over the prompts: total tokens over total time, by hand
    rows = local_sim[(local_sim.n_max == rec.n_max) & (local_sim.p_min == rec.p_min)]
    by_hand = rows.n_tokens.sum() / (rows.n_tokens / rows.tokens_per_second).sum()
    assert rec.tokens_per_second == pytest.approx(by_hand)
    assert rec.margin_over_runner_up == pytest.approx(rec.tokens_per_second / t.iloc[1].tokens_per_second - 1)
    assert rec.margin_over_runner_up >= 0
    plain_rows = local_sim[local_sim.n_max == 0]
    plain = (
        plain_rows.groupby("p_min")
        .apply(lambda r: r.n_tokens.sum() / (r.n_tokens / r.tokens_per_second).sum(), include_groups=False)
        .max()
    )
    assert rec.plain_tokens_per_second == pytest.approx(plain)
    assert rec.margin_over_plain == pytest.approx(rec.tokens_per_second / plain - 1)
    assert set(rec.to_dict()) >= {"n_max", "p_min", "tokens_per_second", "margin_over_runner_up", "margin_over_plain"}
    # a hand-made sweep: the best and the margins are what they must be
    df = pd.DataFrame(
        [
            {
                "prompt": "a",
                "drafter": "draft-mtp",
                "n_max": n,
                "p_min": 0.0,
                "n_min": 0,
                "n_tokens": 100,
                "tokens_per_second": tps,
                "plain_tokens_per_second": 100.0,
                "acceptance_rate": 0.5,
            }
            for n, tps in ((0, 100.0), (1, 150.0), (2, 120.0))
        ]
    )
    rec = mx.recommend(df)
    assert (rec.n_max, rec.tokens_per_second) == (1, 150.0)
    assert rec.margin_over_runner_up == pytest.approx(150 / 120 - 1)
    assert rec.margin_over_plain == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mx.recommend(df.iloc[0:0])


def test_sweep_validation(session):
    with pytest.raises(ValueError, match="mode"):
        mx.sweep(session, PROMPTS, mode="guess", progress=False)
    with pytest.raises(ValueError, match="capacity"):
        mx.sweep(session, PROMPTS, n_max=[5], progress=False)
    with pytest.raises(ValueError, match="prompts"):
        mx.sweep(session, [], progress=False)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "guess"}, "mode must be one of"),
        ({"n_max": [5]}, "n_max=5 exceeds this session's capacity of 4"),
        ({"n_max": []}, "at least one value"),
        ({"p_min": [1.5]}, r"p_min must be a finite number in \[0, 1\]"),
        ({"p_min": ["high"]}, "sequences of numbers"),
        ({"n_min": -1}, "n_min must be >= 0"),
        ({"repeats": 0}, "repeats must be >= 1"),
        ({"drafter": "beam"}, "drafter must be one of"),
        ({"drafter": ()}, "no drafter"),
        ({"ngram_q": 3}, "unknown drafter option"),
        ({"ngram_n": 0}, "--spec-ngram-simple-size-n"),
    ],
)
def test_sweep_parameter_errors(session, kwargs, match):
    """Bad input is a ParameterError (a ValueError) naming the problem, raised before anything runs."""
    with pytest.raises(mx.ParameterError, match=match):
        mx.sweep(session, PROMPTS, progress=False, **kwargs)


def test_sweep_replays_given_oracles_and_checks_them(session):
    """oracles=: one per prompt, replayed as recorded (no cost given: the first one's cost model prices them all);
    oracles that cannot replay the sweep are a ParameterError naming why."""
    a, b = (session.record_oracle(p, max_tokens=16, depth=2, probe=False) for p in PROMPTS[:2])
    kw = dict(n_max=[0, 2], p_min=[0.0], max_tokens=16, progress=False)
    df = mx.sweep(session, PROMPTS[:2], oracles=[a, b], **kw)
    assert list(df.prompt.unique()) == PROMPTS[:2] and len(df) == 4
    pd.testing.assert_frame_equal(df, mx.sweep(session, PROMPTS[:2], oracles=[a, b], cost=a.cost, **kw))
    for given, match in (
        ([a], "1 oracles for 2 prompts"),
        ([b, a], "recorded for the prompt"),
        ([a, "x"], "not an OracleTrace"),
    ):
        with pytest.raises(mx.ParameterError, match=match):
            mx.sweep(session, PROMPTS[:2], oracles=given, **kw)
    with pytest.raises(mx.ParameterError, match="max_tokens=16, the sweep asks for max_tokens=8"):
        mx.sweep(session, PROMPTS[0], oracles=a, **(kw | {"max_tokens": 8}))
    with pytest.raises(mx.ParameterError, match="depth 2, the sweep asks for n_max=4"):
        mx.sweep(session, PROMPTS[0], oracles=a, **(kw | {"n_max": [4]}))
    with pytest.raises(mx.ParameterError, match="other drafter options"):
        mx.sweep(session, PROMPTS[0], oracles=a, ngram_n=2, **kw)
    with pytest.raises(mx.ParameterError, match="simulate mode"):
        mx.sweep(session, PROMPTS[0], oracles=a, mode="measure", **kw)
    with pytest.raises(mx.ParameterError, match="give no client"):
        mx.sweep(session, PROMPTS[0], oracles=a, client=object(), **kw)


def test_recommend_parameter_errors(local_sim):
    with pytest.raises(mx.ParameterError, match="empty sweep"):
        mx.recommend(local_sim.iloc[0:0])
    with pytest.raises(mx.ParameterError, match="lacks the columns"):
        mx.recommend(local_sim.drop(columns=["tokens_per_second"]))
    with pytest.raises(mx.ParameterError, match="lacks the columns"):
        mx.recommend([1, 2, 3])


def test_drafter_options_reach_the_oracles_and_the_runs(session, cost):
    """The drafters' options (here the n-gram sizes) are keyword arguments of sweep, as of Session.generate."""
    seen = []
    record = session.record_oracle

    def spy(*args, **kwargs):
        seen.append({k: v for k, v in kwargs.items() if k.startswith("ngram_simple")})
        return record(*args, **kwargs)

    session.record_oracle = spy
    try:
        df = mx.sweep(
            session,
            PROMPTS[3:],
            n_max=[2],
            p_min=[0.0],
            max_tokens=TOKENS,
            cost=cost,
            progress=False,
            drafter="ngram-simple",
            ngram_n=2,
            ngram_m=4,
        )
        default = mx.sweep(
            session,
            PROMPTS[3:],
            n_max=[2],
            p_min=[0.0],
            max_tokens=TOKENS,
            cost=cost,
            progress=False,
            drafter="ngram-simple",
            ngram_n=None,
        )
    finally:
        session.record_oracle = record
    # by llama.cpp's names (ngram_n / ngram_m are their earlier aliases); None: the default
    assert seen == [
        {"ngram_simple_size_n": 2, "ngram_simple_size_m": 4},
        {"ngram_simple_size_n": 12, "ngram_simple_size_m": 48},
    ]
    o = session.record_oracle(PROMPTS[3], max_tokens=TOKENS, depth=2, probe=False, ngram_n=2, ngram_m=4)
    assert df.n_accepted.iloc[0] == mx.simulate(o.with_cost(cost), 2, drafter="ngram-simple").summary()["n_accepted"]
    assert len(default) == 1


@pytest.fixture(scope="module")
def dask_client():
    import distributed

    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_dask_sweep_equals_local(session, cost, local_sim, dask_client):
    df = mx.sweep(
        session, PROMPTS, n_max=N_MAX, p_min=P_MIN, max_tokens=TOKENS, cost=cost, client=dask_client, progress=False
    )
    pd.testing.assert_frame_equal(df, local_sim)
    # both workers took part (each opened its own session from the model path)
    ran = dask_client.run(lambda: len(__import__("mtp_explorer.analysis.sweep", fromlist=["x"])._WORKER_SESSIONS))
    assert sorted(ran.values()) == [1, 1]


def test_dask_measure_sweep_matches_local_tokens(session, dask_client):
    kw = dict(n_max=[0, 3], p_min=[0.0, 0.7], mode="measure", max_tokens=TOKENS, progress=False)
    local = mx.sweep(session, PROMPTS, **kw)
    remote = mx.sweep(session, PROMPTS, client=dask_client, **kw)
    pd.testing.assert_frame_equal(remote[TOKEN_COLUMNS], local[TOKEN_COLUMNS])
    assert (remote.tokens_per_second > 0).all() and not math.isnan(remote.tokens_per_second.sum())
    # simulate mode without a given cost model: measured here once and sent to the workers
    a = mx.sweep(session, PROMPTS[:2], n_max=[1, 2], p_min=[0.0], max_tokens=TOKENS, client=dask_client, progress=False)
    assert list(a.columns) == list(COLUMNS) and len(a) == 4
    assert np.isfinite(a.tokens_per_second).all()


def test_several_drafters_share_one_oracle_per_prompt(session, cost, local_sim, monkeypatch):
    calls = []
    record = session.record_oracle

    def counted(*args, **kwargs):
        calls.append(args[0] if args else kwargs["prompt"])
        return record(*args, **kwargs)

    monkeypatch.setattr(session, "record_oracle", counted)
    # every choice this session runs (its draft model is not a head)
    modes = [m for m in mx.DRAFTER_MODES if drafters.MODES[m].runs_with(session.info.has_mtp, session.draft_kind)]
    assert session.drafter_modes == tuple(modes)
    df = mx.sweep(
        session, PROMPTS, n_max=N_MAX, p_min=P_MIN, max_tokens=TOKENS, cost=cost, progress=False, drafter=modes
    )
    assert calls == PROMPTS  # one recording per prompt for all three drafters
    assert list(df.columns) == list(COLUMNS) and len(df) == len(modes) * len(local_sim)
    # each drafter's rows are what a sweep of that drafter alone gives
    mtp = df[df.drafter == "draft-mtp"].reset_index(drop=True)
    pd.testing.assert_frame_equal(mtp, local_sim.reset_index(drop=True))
    ranked = mx.recommend(df).drafters  # recommend ranks the drafters by each one's best setting
    assert list(ranked["drafter"]) == list(dict.fromkeys(mx.recommend(df).table["drafter"]))
    assert set(ranked["drafter"]) == set(modes) and ranked["vs_best"].iloc[0] == 1.0
    assert ranked["tokens_per_second"].is_monotonic_decreasing and (ranked["vs_best"] <= 1.0).all()
    for r in ranked.itertuples():  # each row is the best of that drafter's settings
        assert r.tokens_per_second == mx.recommend(df[df.drafter == r.drafter]).tokens_per_second
    monkeypatch.setattr(session, "record_oracle", record)
    for d in ("ngram-simple", "ngram-simple,draft-mtp"):
        alone = mx.sweep(
            session, PROMPTS[:2], n_max=N_MAX, p_min=P_MIN, max_tokens=TOKENS, cost=cost, progress=False, drafter=d
        )
        pd.testing.assert_frame_equal(df[(df.drafter == d) & df.prompt.isin(PROMPTS[:2])].reset_index(drop=True), alone)
    # in measure mode too, every drafter's rows come from real runs of that drafter
    m = mx.sweep(
        session,
        PROMPTS[:1],
        n_max=[2],
        p_min=[0.0],
        mode="measure",
        max_tokens=TOKENS,
        progress=False,
        drafter=("mtp", "ngram"),
    )  # short spellings: the table says llama.cpp's names
    assert list(m.drafter) == ["draft-mtp", "ngram-simple"] and m.tokens_digest.nunique() == 1
    with pytest.raises(ValueError, match="drafter"):
        mx.sweep(session, PROMPTS, drafter=("mtp", "beam"), progress=False)
    with pytest.raises(ValueError, match="twice"):
        mx.sweep(session, PROMPTS, drafter=("mtp", "draft-mtp"), progress=False)  # one drafter, two spellings
    with pytest.raises(ValueError, match="no drafter"):
        mx.sweep(session, PROMPTS, drafter=(), progress=False)
