"""The n-gram prompt-lookup drafter (llama.cpp's ngram-simple) and the chain mode: the look-up's
semantics against a line-by-line Python port of common_ngram_simple_draft, greedy equivalence for
every drafter and mode, the chain's choice, and the telemetry."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHORT_NGRAM, check_accounting
from test_greedy_equivalence import PROMPTS

import mtp_explorer as mx
from mtp_explorer.analysis.replay import ngram_simple_draft as ngram_simple_draft_engine

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

# their slices of the oracle's draft columns
MTP, NGRAM = mx.DRAFTERS.index("draft-mtp"), mx.DRAFTERS.index("ngram-simple")

REPETITIVE = [
    "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2",
    "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
]


@pytest.fixture(scope="module")
def session(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=1024, threads=1) as s:
        yield s


def ngram_simple_draft(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp 0.3.36 common/ngram-map.cpp common_ngram_simple_draft, ported line by line."""
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = tokens[cur_len - size_n + 1 : cur_len] + [sampled]
    match_pos = 0
    for j in range(cur_len - size_n - 1, 0, -1):
        if tokens[j : j + len(pattern)] == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    if copy_max < size_n:
        return []
    return tokens[match_pos + size_n : match_pos + size_n + copy_max]


def test_the_uncut_lookup_is_the_ports():
    """The extension's ngram_simple_draft (what the server predictions read past the recorded depth) equals the port on
    random repetitive histories, uncut, and refuses sizes below 1."""
    rng = np.random.default_rng(0)
    found = 0
    for _ in range(300):
        tokens = rng.integers(0, 4, size=int(rng.integers(0, 40))).tolist()
        sampled, size_n, size_m = int(rng.integers(0, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        want = ngram_simple_draft(tokens, sampled, size_n, size_m)
        assert ngram_simple_draft_engine(tokens, sampled, size_n, size_m) == want
        found += bool(want)
    assert found > 50
    with pytest.raises(mx.ParameterError):
        ngram_simple_draft_engine([1, 2, 3], 1, 0, 3)


@pytest.mark.parametrize("size_n,size_m", [(1, 4), (2, 8), (3, 8), (4, 3)])
def test_lookup_matches_llama_cpp_semantics(session, size_n, size_m):
    """At every position of a generation, the engine's n-gram draft equals the port's, cut to the
    step's cap."""
    checked = with_draft = 0
    for prompt in REPETITIVE + PROMPTS[:3]:
        o = session.record_oracle(prompt, max_tokens=60, depth=6, ngram_n=size_n, ngram_m=size_m, probe=False)
        c = o.columns
        history = list(o.prompt_tokens)
        for g in range(o.n_positions):
            cur = history[:-1]
            sampled = history[-1]
            assert len(cur) == c["pos"][g]
            want = ngram_simple_draft(cur, sampled, size_n, size_m)[: int(c["cap"][g])]
            got = c["draft"][g, NGRAM, : c["draft_len"][g, NGRAM]].tolist()
            assert got == want, (prompt, g)
            checked += 1
            with_draft += bool(want)
            history.append(int(c["token"][g]))
    assert checked > 300
    if size_m >= size_n:
        assert with_draft > 20
    else:  # llama.cpp drops continuations shorter than the n-gram: m < n never drafts
        assert with_draft == 0


def test_greedy_equivalence_for_every_drafter(session):
    for prompt in PROMPTS + REPETITIVE:
        base = session.generate(prompt, max_tokens=40, n_max=0)
        for drafter in ("ngram-simple", "chain"):
            for n_max in (1, 2, 3, 5, 8):
                for p_min in (0.0, 0.3, 0.9):
                    t = session.generate(
                        prompt, max_tokens=40, n_max=n_max, p_min=p_min, drafter=drafter, **SHORT_NGRAM
                    )
                    assert t.tokens == base.tokens, (prompt, drafter, n_max, p_min)
                    check_accounting(t)
                    src = t.columns["drafter"]
                    assert ((src >= 0) == (t.n_drafted > 0)).all()
                    if drafter == "ngram-simple":
                        assert (src != 0).all()
                        assert np.isnan(t.draft_prob).all() and (t.topk_ids == -1).all()
                    mtp_rows = src == 0
                    probs = t.draft_prob[mtp_rows][t.drafted[mtp_rows] >= 0]
                    assert (probs >= p_min).all()
    # sampling: the n-gram drafter keeps the output distribution too (same seed, same tokens)
    plain = session.generate(REPETITIVE[0], max_tokens=40, n_max=0, temperature=0.8, seed=3)
    for drafter in ("ngram-simple", "chain"):
        t = session.generate(
            REPETITIVE[0], max_tokens=40, n_max=4, temperature=0.8, seed=3, drafter=drafter, **SHORT_NGRAM
        )
        assert t.tokens == plain.tokens


def test_ngram_telemetry_and_stop_reasons(session):
    t = session.generate(REPETITIVE[1], max_tokens=64, n_max=4, drafter="ngram-simple", **SHORT_NGRAM)
    check_accounting(t)
    reasons = {s.stop_reason for s in t.steps}
    assert "exhausted" in reasons  # no match at first
    assert t.summary()["steps_by_drafter"]["ngram-simple"] > 0
    for s in t.steps:
        if s.stop_reason == "exhausted":
            assert s.n_drafted < 4
        if s.drafter == "ngram-simple":
            assert s.n_drafted > 0 and not np.isnan(s.expected_accepted)
            assert np.isnan(s.draft_prob).all()
    assert (t.rollback == t.n_drafted - t.n_accepted).all()
    # n-gram drafts are usually right on repetitive text
    assert t.summary()["acceptance_rate"] > 0.5
    # the n-gram sizes
    with pytest.raises(mx.ParameterError):
        session.generate("a", max_tokens=4, n_max=2, drafter="ngram-simple", ngram_n=0)
    with pytest.raises(mx.ParameterError, match="drafter"):
        session.generate("a", max_tokens=4, n_max=2, drafter="eagle")


def test_chain_verifies_the_highest_expected_accepted_length(session):
    won = {0: 0, 1: 0}
    for prompt in REPETITIVE:
        t = session.generate(prompt, max_tokens=64, n_max=5, p_min=0.0, drafter="chain", **SHORT_NGRAM)
        check_accounting(t)
        c = t.columns
        for i in range(t.n_steps):
            lens, exp = c["candidate_len"][i], c["candidate_expected"][i]
            src = int(c["drafter"][i])
            if src < 0:
                assert c["n_drafted"][i] == 0
                continue
            won[src] += 1
            assert c["expected_accepted"][i] == exp[src]
            other = 1 - src
            if lens[other] > 0:
                # the winner's expectation is at least the other's; MTP wins ties
                assert exp[src] > exp[other] or (exp[src] == exp[other] and src == 0)
            # MTP's expectation: the sum of prefix products of its confidences
            if src == 0:
                p = c["draft_prob"][i, : c["n_drafted"][i]].astype(np.float64)
                assert exp[0] == pytest.approx(np.cumprod(p).sum(), rel=1e-5)
    assert won[0] > 0 and won[1] > 0


def test_ngram_runs_without_mtp_layers(model_no_mtp):
    with mx.Session.open(model_no_mtp, n_ctx=512, threads=1) as s:
        base = s.generate(REPETITIVE[0], max_tokens=48, n_max=0)
        t = s.generate(REPETITIVE[0], max_tokens=48, n_max=4, drafter="ngram-simple", **SHORT_NGRAM)
        assert t.tokens == base.tokens
        check_accounting(t)
        assert (t.n_drafted > 0).any()
        for drafter in ("draft-mtp", "chain"):
            with pytest.raises(mx.MtpUnavailableError, match="ngram-simple"):
                s.generate(REPETITIVE[0], max_tokens=8, n_max=2, drafter=drafter)
        o = s.record_oracle(REPETITIVE[0], max_tokens=48, depth=4, **SHORT_NGRAM)
        assert o.tokens == base.tokens and (o.columns["draft_len"][:, MTP] <= 0).all()
        sim = mx.simulate(o, 4, drafter="ngram-simple")
        assert sim.tokens == t.tokens and np.array_equal(sim.n_accepted, t.n_accepted)
        with pytest.raises(ValueError, match="MTP"):
            mx.simulate(o, 2)


def test_ngram_on_non_recurrent_model(models_dir):
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe

    path = write_synthetic_glm4moe(models_dir / "glm_ngram.gguf")
    with mx.Session.open(path, n_ctx=512, threads=1) as s:
        for prompt in REPETITIVE:
            base = s.generate(prompt, max_tokens=40, n_max=0)
            for drafter in ("ngram-simple", "chain"):
                t = s.generate(prompt, max_tokens=40, n_max=4, drafter=drafter, **SHORT_NGRAM)
                assert t.tokens == base.tokens
                check_accounting(t)
