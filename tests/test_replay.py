"""The simulator's drafter replays (mtp_explorer.analysis.replay): one per registry drafter, each reading only
its own oracle columns; their proposals, expected accepted lengths and the chain policies by hand; the
sequential walk equals the vectorised path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis import simulate as sim
from mtp_explorer.analysis import walk
from mtp_explorer.analysis.replay import (
    STOP,
    DrafterReplay,
    MtpReplay,
    NgramSimpleReplay,
    PrefixProducts,
    RunningAcceptance,
)
from mtp_explorer.core import drafters, schema

# their slices of the per-drafter columns
MTP, NGRAM = mx.DRAFTERS.index("draft-mtp"), mx.DRAFTERS.index("ngram-simple")
PROMPT = "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"  # repeats itself: the n-gram look-up finds matches
DEPTH = 6


@pytest.fixture(scope="module")
def oracle(model_mixed, model_synthetic_draft):
    with mx.Session.open(model_mixed, n_ctx=512, threads=1, n_rs_seq=DEPTH, draft_model=model_synthetic_draft) as s:
        return s.record_oracle(PROMPT, max_tokens=64, depth=DEPTH)


def _spec_of(cls: type) -> drafters.DrafterSpec:
    return next(s for s in drafters.DRAFTER_SPECS.values() if s.load_replay() is cls)


def test_every_drafter_has_a_replay_of_its_own_columns(oracle):
    oracle_columns = {c.name for c in schema.ORACLE_COLUMNS}
    for spec in drafters.DRAFTER_SPECS.values():
        replay = oracle.replay(spec)
        assert isinstance(replay, DrafterReplay) and replay.spec is spec
        assert oracle.replay(spec.name) is replay  # built once per recording
        assert set(replay.columns) <= oracle_columns, spec.name
        assert replay.tokens.shape == (oracle.n_positions, DEPTH)
        assert np.array_equal(replay.tokens, oracle.columns["draft"][:, spec.index])  # its slice
        assert (replay.match_len <= replay.length).all() and (replay.length <= oracle.columns["cap"]).all()
        assert (replay.confidence is not None) == spec.has_confidence
    assert MtpReplay.follows_target and not NgramSimpleReplay.follows_target  # the MTP head catches up, a look-up not
    assert np.array_equal(oracle.match_len, oracle.replay(_spec_of(MtpReplay)).match_len)


def test_every_chain_policy_has_a_replay():
    assert set(schema.CHAIN_POLICIES) <= set(walk.CHAIN_POLICY_REPLAYS)
    for mode in drafters.MODES.values():
        walk._choose(mode)
    with pytest.raises(mx.ParameterError, match="chain policy 'coin'"):
        walk._choose(dataclasses.replace(drafters.mode("ngram-simple,draft-mtp"), policy="coin"))


def test_best_policy_by_hand():
    def best(usable, expected):  # the choice at one position
        return walk.CHAIN_POLICY_REPLAYS["best"]([[u] for u in usable], [[e] for e in expected])(0)

    assert best([True, True], [1.0, 2.0]) == 1
    assert best([True, True], [1.5, 1.5]) == 0  # the earlier drafter on a tie (MTP, as the engine)
    assert best([True, True], [0.0, 0.0]) == 0
    assert best([True, False], [0.1, 9.0]) == 0  # an unusable draft never wins
    assert best([False, True], [9.0, 0.1]) == 1
    assert best([False, False], [1.0, 2.0]) == 0  # none usable: the first drafter's (empty) draft
    assert best([True, True, True], [1.0, 3.0, 3.0]) == 1


def test_mtp_candidate_by_hand(oracle):
    replay = oracle.replay(_spec_of(MtpReplay))
    c = oracle.columns
    n_max, p_min, n_min = 4, 0.5, 2
    cap, reason = walk.draft_caps(oracle, n_max, oracle.max_tokens)
    cand = replay.candidate(cap, reason, p_min, n_min, True)
    asked = np.broadcast_to(cand.asked, cand.n_raw.shape)  # asked wherever the head runs, even at a cap of 0
    for g in range(oracle.n_positions):
        L = int(c["draft_len"][g, MTP])
        probs = c["draft_prob"][g, MTP, :L]
        below = [j for j in range(L) if probs[j] < np.float32(p_min)]
        n = min(below[0] if below else L, int(cap[g]))
        assert cand.n_raw[g] == n, g
        assert cand.stop[g] == (STOP["p_min"] if below and below[0] < min(L, cap[g]) else reason[g]), g
        assert cand.dropped[g] == (n < n_min) and asked[g]
        assert cand.decodes[g] == (n + 1 if below and below[0] < min(L, cap[g]) else n)
    assert (cand.usable == (cand.n_raw >= n_min) & (cand.n_raw > 0)).all()
    off = replay.candidate(cap, reason, p_min, n_min, False)  # n_max = 0: the head does not draft
    assert not off.asked.any() and (off.n_raw == 0).all() and (off.decodes == 0).all()
    full = replay.full(cap, True)
    assert np.array_equal(full.n_raw, cap) and np.array_equal(full.decodes, cap) and full.asked.all()


def test_ngram_candidate_by_hand(oracle):
    replay = oracle.replay(_spec_of(NgramSimpleReplay))
    c = oracle.columns
    cap, reason = walk.draft_caps(oracle, 3, oracle.max_tokens)
    cand = replay.candidate(cap, reason, 0.9, 1, True)  # p_min does not apply to it
    ngram_len, ngram_eos = c["draft_len"][:, NGRAM], c["draft_eos"][:, NGRAM]
    assert np.array_equal(cand.n_raw, np.where(cap > 0, np.minimum(ngram_len, cap), 0))
    assert np.array_equal(cand.asked, cap > 0) and (cand.decodes == 0).all()
    exhausted = (cap > 0) & (ngram_len < cap) & ~ngram_eos.astype(bool)
    assert (cand.stop[exhausted] == STOP["exhausted"]).all() and exhausted.any()
    assert (cand.usable == (cand.n_raw > 0)).any()


def test_expectations_by_hand(oracle):
    replay = oracle.replay(_spec_of(MtpReplay))
    prob = oracle.columns["draft_prob"][:, MTP].astype(np.float64)
    e = replay.expectation()
    assert isinstance(e, PrefixProducts)
    for g in (0, 5, 17):
        for n in range(int(oracle.columns["draft_len"][g, MTP]) + 1):
            assert e.expected(g, n) == pytest.approx(np.cumprod(prob[g, :n]).sum(), rel=1e-12)
    # the running acceptance: (accepted + 1) / (tested + 2) per depth, multiplied along the draft
    r = RunningAcceptance()
    assert r.expected(0, 2) == pytest.approx(0.5 + 0.25)
    r.observe(0, n_proposed=3, n_match=1, n_emitted=2)  # depth 1 tested and accepted, depth 2 tested, rejected
    assert (r.tested, r.accepted) == ([1, 1], [1, 0])
    assert r.expected(0, 3) == pytest.approx(2 / 3 + 2 / 3 * 1 / 3 + 2 / 3 * 1 / 3 * 1 / 2)
    r.observe(0, n_proposed=1, n_match=0, n_emitted=5)  # only as far as it proposed
    assert (r.tested, r.accepted) == ([2, 1], [1, 0])


def check_walk_equals_the_vectorised_path(oracle, drafter, settings=((1, 0.0, 0), (4, 0.3, 2), (DEPTH, 0.0, 0))):
    """The sequential walk (compare's aligned prediction, the chain's replay) steps exactly like the vectorised
    path of a single drafter."""
    for n_max, p_min, n_min in settings:
        policy = walk.check_policy(oracle, n_max, p_min, n_min, drafter, oracle.max_tokens)
        fast = walk.run_policy(oracle, policy)
        walked = walk.run_policy(oracle, policy, start_steps=fast.g.tolist())
        for f in dataclasses.fields(fast):
            a, b = getattr(fast, f.name), getattr(walked, f.name)
            if f.name == "proposals":
                for pa, pb in zip(a, b):
                    assert all(np.array_equal(getattr(pa, x.name), getattr(pb, x.name)) for x in dataclasses.fields(pa))
            else:
                assert np.array_equal(a, b, equal_nan=np.asarray(a).dtype.kind == "f"), (drafter, n_max, f.name)


# the drafters of this oracle's session (MTP and a draft model); the heads': tests/test_draft_eagle3.py, _dflash.py
@pytest.mark.parametrize(
    "drafter", [m for m, mode in drafters.MODES.items() if not mode.is_chain and mode.runs_with(True, "draft_model")]
)
def test_walk_equals_the_vectorised_path(oracle, drafter):
    check_walk_equals_the_vectorised_path(oracle, drafter)


def test_a_mode_reads_only_its_drafters_columns(oracle):
    """Scrambling the drafts of a drafter outside the mode (its slice of the per-drafter columns, and any
    column of its own) changes nothing of its replay."""
    rng = np.random.default_rng(0)
    fixed = oracle.with_cost(oracle.cost)
    per_source = {c.name for c in schema.ORACLE_COLUMNS if c.per_source}
    for name, mode in drafters.MODES.items():
        if mode.is_chain or not mode.runs_with(oracle.has_mtp, oracle.has_draft_model):
            continue
        others = [s for s in drafters.DRAFTER_SPECS.values() if s not in mode.drafters]
        cols = {k: v.copy() for k, v in fixed.columns.items()}
        for spec in others:
            for col in fixed.replay(spec).columns:
                if col in per_source:
                    cols[col][:, spec.index] = rng.permutation(cols[col][:, spec.index])
                elif col not in {c for d in mode.drafters for c in fixed.replay(d).columns}:
                    cols[col] = rng.permutation(cols[col])
        assert not np.array_equal(cols["draft"], fixed.columns["draft"]), name  # something was scrambled
        scrambled = dataclasses.replace(fixed, columns=cols)
        a, b = sim.simulate(fixed, 4, 0.3, drafter=name), sim.simulate(scrambled, 4, 0.3, drafter=name)
        for col in a.columns:
            assert np.array_equal(a.columns[col], b.columns[col], equal_nan=a.columns[col].dtype.kind == "f"), (
                name,
                col,
            )


def test_candidate_columns_are_indexed_by_drafter(oracle):
    for name, mode in drafters.MODES.items():
        if not mode.runs_with(oracle.has_mtp, oracle.has_draft_model):
            with pytest.raises(mx.ParameterError, match="draft model"):
                sim.simulate(oracle, 3, 0.0, drafter=name)
            continue
        t = sim.simulate(oracle, 3, 0.0, drafter=name)
        for spec in drafters.DRAFTER_SPECS.values():
            asked = t.candidate_len[:, spec.index] >= 0
            assert asked.any() == (spec in mode.drafters), (name, spec.name)
            assert np.array_equal(np.isnan(t.candidate_expected[:, spec.index]), ~asked)
        won = t.drafter[t.drafter >= 0]
        assert set(won.tolist()) <= {s.index for s in mode.drafters}
        chosen = t.drafter >= 0
        assert np.array_equal(
            t.expected_accepted[chosen], t.candidate_expected[np.flatnonzero(chosen), t.drafter[chosen]]
        )
