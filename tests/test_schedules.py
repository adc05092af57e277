"""Draft-length schedules replayed on oracles of SYNTHETIC models (``simulate(..., schedule=...)``,
:mod:`mtp_explorer.analysis.schedules`) and the bound no schedule passes (:func:`mtp_explorer.hindsight_best`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import SHORT_NGRAM

import mtp_explorer as mx
from mtp_explorer.analysis.schedules import Heuristic, StepOutcome, Window
from mtp_explorer.core import drafters
from mtp_explorer.core.schema import PHASES

PROMPTS = ["def fib(n):", "import os", "class Stack:\n    def push(self, x):"]
#: a drafter of each kind a schedule replays: the MTP head, a look-up, a draft model
DRAFTERS = ["draft-mtp", "ngram-simple", "draft-simple"]
DEPTH = 5
COMPARED = ("n_drafted", "n_accepted", "drafter", "drafted", "stop_reason", "candidate_len", "n_max")


@pytest.fixture(scope="module")
def session(model_mixed, model_synthetic_draft):
    with mx.Session.open(model_mixed, n_ctx=1024, n_rs_seq=DEPTH, threads=1, draft_model=model_synthetic_draft) as s:
        yield s


@pytest.fixture(scope="module")
def oracles(session):
    return [
        session.record_oracle(p, max_tokens=64, depth=DEPTH, probe=True, batch_shift=False, **SHORT_NGRAM)
        for p in PROMPTS
    ]


def _p_min(drafter: str, p_min: float) -> float:
    return p_min if drafters.mode(drafter).drafters[0].has_confidence else 0.0


def test_the_heuristic_rule():
    """Hugging Face's rule: +2 after a step whose drafts were all accepted, -1 after a rejection, within [1, n_max];
    a step that drafted nothing leaves the length."""
    rule = Heuristic(5)
    seen = [rule.length()]
    for drafted, accepted in [(5, 5), (5, 2), (4, 4), (5, 0), (4, 1), (3, 0), (2, 0), (1, 0), (0, 0), (1, 1)]:
        rule.observe(StepOutcome(seen[-1], drafted, accepted))
        seen.append(rule.length())
    assert seen == [5, 5, 4, 5, 4, 3, 2, 1, 1, 1, 3]


def test_the_window_rule():
    """The deepest depth whose acceptance over the window's drafting steps is at least one half, one deeper when every
    depth drafted passed; n_max before any step drafted."""
    rule = Window(6, window=3)
    assert rule.length() == 6
    rule.observe(StepOutcome(6, 0, 0))  # drafted nothing: not in the window
    assert rule.length() == 6
    rule.observe(StepOutcome(6, 4, 4))  # depths 1..4 all passed: one deeper
    assert rule.length() == 5
    rule.observe(StepOutcome(5, 5, 1))  # depth 1: 2/2, 2..4: 1/2, 5: 0/1
    assert rule.length() == 4
    rule.observe(StepOutcome(4, 4, 0))  # depth 1: 2/3, depth 2: 1/3
    assert rule.length() == 1
    for _ in range(3):  # the early steps leave the window
        rule.observe(StepOutcome(1, 1, 1))
    assert rule.length() == 2


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_a_constant_schedule_is_the_fixed_setting(oracles, drafter):
    """A rule that always asks for k replays as n_max = k does, step for step, to the predicted ns."""
    for oracle in oracles:
        for k in range(1, DEPTH + 1):
            fixed = mx.simulate(oracle, k, _p_min(drafter, 0.3), drafter=drafter)
            ruled = mx.simulate(
                oracle, DEPTH, _p_min(drafter, 0.3), drafter=drafter, schedule=lambda history, n_max, k=k: k
            )
            assert ruled.tokens == fixed.tokens
            for name in COMPARED + tuple(f"t_{p}_ns" for p in PHASES):
                assert np.array_equal(ruled.columns[name], fixed.columns[name]), (drafter, k, name)
            assert ruled.settings["schedule"] == "custom"


def test_a_schedule_records_each_steps_length(oracles):
    trace = mx.simulate(oracles[0], DEPTH, drafter="draft-mtp", schedule="heuristic")
    lengths = trace.columns["n_max"]
    assert trace.settings["schedule"] == "heuristic" and lengths[0] == DEPTH
    assert ((lengths >= 1) & (lengths <= DEPTH)).all() and (trace.columns["n_drafted"] <= lengths).all()
    served = mx.simulate(oracles[0], DEPTH, drafter="draft-mtp", schedule="window", window=4, server_slot=True)
    assert served.columns["n_max"][0] == 0 and served.settings["window"] == 4  # a slot's first token: no draft


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_hindsight_is_reached_by_replaying_its_lengths(oracles, drafter):
    """The bound is a schedule: its lengths, replayed as a rule, give its steps and its tokens/s."""
    for oracle in oracles:
        best = mx.hindsight_best(oracle, DEPTH, drafter=drafter)
        lengths = best.lengths.tolist()
        trace = mx.simulate(oracle, DEPTH, drafter=drafter, schedule=lambda history, n_max: lengths[len(history)])
        assert np.array_equal(trace.sim["g"], best.positions)
        assert len(trace.tokens) == best.n_tokens
        assert trace.predicted_tokens_per_second == pytest.approx(best.tokens_per_second, rel=1e-12)


def _random_costs(cost: mx.CostModel, rng: np.random.Generator) -> mx.CostModel:
    """SYNTHETIC cost models around a measured one: every table and overhead scaled at random."""

    def scaled(table: np.ndarray) -> np.ndarray:
        return table * rng.uniform(0.3, 3.0, size=table.shape[:1] + (1,) * (table.ndim - 1))

    return dataclasses.replace(
        cost,
        verify=scaled(cost.verify),
        catchup=scaled(cost.catchup),
        draft=scaled(cost.draft),
        model_draft=scaled(cost.model_draft),
        fresh_ns=float(rng.uniform(0, 3)) * max(cost.fresh_ns, 1e4),
        cold_ns=float(rng.uniform(-1, 3)) * max(abs(cost.cold_ns), 1e4),
        warm_ns=float(rng.uniform(-1, 3)) * max(abs(cost.warm_ns), 1e4),
    )


def test_no_schedule_beats_hindsight(oracles):
    """Over random cost models, drafters, n_max and p_min: every fixed n_max up to the bound's, the named schedules and
    random rules are predicted no faster than hindsight_best."""
    rng = np.random.default_rng(56)
    for draw in range(24):
        oracle = oracles[draw % len(oracles)]
        drafter = DRAFTERS[draw % len(DRAFTERS)]
        n_max = int(rng.integers(1, DEPTH + 1))
        p_min = _p_min(drafter, float(rng.choice([0.0, 0.3, 0.7])))
        costs = _random_costs(oracle.cost, rng)
        bound = mx.hindsight_best(oracle, n_max, p_min, drafter=drafter, costs=costs).tokens_per_second
        picks = rng.integers(0, n_max + 1, size=oracle.n_positions).tolist()
        schedules = [
            *(lambda history, n, k=k: k for k in range(1, n_max + 1)),
            "heuristic",
            "window",
            lambda history, n: picks[len(history)],
        ]
        for schedule in schedules:
            tps = mx.simulate(oracle, n_max, p_min, drafter=drafter, costs=costs, schedule=schedule)
            assert tps.predicted_tokens_per_second <= bound * (1 + 1e-12), (draw, drafter, n_max, schedule)


def test_schedules_refuse_what_they_cannot_replay(oracles):
    oracle = oracles[0]
    with pytest.raises(mx.ParameterError, match="single drafter without state"):
        mx.simulate(oracle, 3, drafter="ngram-simple,draft-mtp", schedule="heuristic")
    with pytest.raises(mx.ParameterError, match="single drafter without state"):
        mx.hindsight_best(oracle, 3, drafter="ngram-map-k")
    with pytest.raises(mx.ParameterError, match="schedule must be one of"):
        mx.simulate(oracle, 3, schedule="adaptive")
    with pytest.raises(mx.ParameterError, match="window"):
        mx.simulate(oracle, 3, schedule="window", window=0)
    with pytest.raises(mx.ParameterError, match="checkpoints"):
        mx.simulate(oracle, 3, drafter="ngram-simple", schedule="heuristic", checkpoints=True)
    with pytest.raises(mx.ParameterError, match=r"within \[0, n_max=3\], got 4"):
        mx.simulate(oracle, 3, schedule=lambda history, n_max: n_max + 1)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_engine_runs_the_schedules_as_replayed(session, oracles, drafter):
    """A greedy run under each named schedule drafts, accepts and caps every step as the replay of its settings says,
    and records the schedule in its settings."""
    for prompt, oracle in zip(PROMPTS, oracles):
        for schedule in ("heuristic", "window"):
            real = session.generate(
                prompt, max_tokens=64, n_max=DEPTH, drafter=drafter, schedule=schedule, window=3, **SHORT_NGRAM
            )
            assert real.draft_settings.schedule == schedule and real.draft_settings.window == 3
            sim = mx.simulate(oracle, real.draft_settings)
            assert sim.tokens == real.tokens, (prompt, drafter, schedule)
            for name in ("n_max", "n_drafted", "n_accepted", "drafter"):
                assert np.array_equal(sim.columns[name], real.columns[name]), (prompt, drafter, schedule, name)


def test_a_generation_takes_the_named_schedules_only(session):
    with pytest.raises(mx.ParameterError, match="runs in the what-if only"):
        session.generate("def f():", max_tokens=8, schedule=lambda history, n_max: 1)
    with pytest.raises(mx.ParameterError, match="schedule must be one of"):
        mx.DraftSettings(schedule="adaptive")
    with pytest.raises(mx.ParameterError, match="window"):
        mx.DraftSettings(schedule="window", window=0)
    assert mx.DraftSettings().schedule == "fixed" and mx.DraftSettings.from_dict({}).window == 8


def test_a_head_drafter_runs_the_schedules_as_replayed():
    """The bundled EAGLE-3 head (draft-eagle3) under each named schedule: the run equals the replay."""
    (head,) = [h for h in mx.draft_heads() if h.spec_type == "draft-eagle3"]
    prompt = mx.demo_prompts()[2].text
    with mx.Session.open(head.target_path, n_ctx=2048, threads=1, draft_model=head.head_path) as s:
        oracle = s.record_oracle(prompt, max_tokens=64, depth=4, probe=False, batch_shift=False)
        for schedule in ("heuristic", "window"):
            real = s.generate(prompt, max_tokens=64, n_max=4, drafter="draft-eagle3", schedule=schedule)
            sim = mx.simulate(oracle, real.draft_settings)
            assert sim.tokens == real.tokens, schedule
            for name in ("n_max", "n_drafted", "n_accepted"):
                assert np.array_equal(sim.columns[name], real.columns[name]), (schedule, name)


def test_schedule_advice_and_recommend_say_whether_a_schedule_pays(session, oracles):
    """Every fixed n_max, each named schedule and the bound over the workload; the advice's gain is its best schedule
    over its best fixed setting, the headroom the bound's, never below any row; recommend carries it with the sweep's
    oracles."""
    advice = mx.schedule_advice(oracles, DEPTH, drafter="draft-mtp")
    table = advice.table.set_index("setting")
    fixed = table[table.index.str.startswith("fixed")]
    assert list(fixed["n_max"]) == list(range(1, DEPTH + 1))
    assert advice.best_fixed_tokens_per_second == fixed["tokens_per_second"].max()
    best = max(table.loc[f"{s} (n_max {DEPTH})", "tokens_per_second"] for s in ("heuristic", "window"))
    assert advice.gain == pytest.approx(best / advice.best_fixed_tokens_per_second - 1)
    assert (table["tokens_per_second"] <= advice.bound_tokens_per_second * (1 + 1e-12)).all()
    assert advice.headroom >= max(advice.gain, 0.0) - 1e-12 and "could gain at most" in advice.note
    sims = [mx.simulate(o, advice.best_fixed_n_max) for o in oracles]  # the totals are over the workload
    total = sum(len(s.tokens) for s in sims) / sum(len(s.tokens) / s.predicted_tokens_per_second for s in sims)
    assert advice.best_fixed_tokens_per_second == pytest.approx(total)
    grid = {"n_max": [1, 2, 3], "p_min": [0.0], "max_tokens": 64, "progress": False, **SHORT_NGRAM}
    df = mx.sweep(session, PROMPTS, oracles=oracles, **grid)
    rec = mx.recommend(df, oracles)
    if rec.n_max > 0:  # draft-mtp, the sweep's drafter
        assert rec.schedules is not None and rec.schedules.table["n_max"].max() == 3
        assert rec.to_dict()["schedules"]["note"] == rec.schedules.note
    else:  # plain decoding recommended: no drafter to schedule
        assert rec.schedules is None
    assert mx.recommend(df).schedules is None
    with pytest.raises(mx.ParameterError, match="oracle traces"):
        mx.schedule_advice([])
