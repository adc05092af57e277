"""The invariant everything relies on: greedy speculative output equals greedy plain output,
for every n_max and p_min, and the per-step accounting adds up."""

from __future__ import annotations

import pytest
from conftest import check_accounting

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = [
    "def fib(n):",
    "import os",
    "class Stack:",
    "for i in range(10):",
    "return x + y",
    "# comment",
    "while True:",
    "print('hello')",
    "x = [1, 2, 3]",
    "if a == b:",
    "try:\n    pass",
    "lambda x: x",
    "with open(f) as fh:",
    "def __init__(self):",
    "yield from it",
    "raise ValueError",
    "assert len(s) > 0",
    "from typing import Any",
    "@property",
    "async def main():",
]
N_MAX = (1, 2, 3, 5, 8)
P_MIN = (0.0, 0.3, 0.9)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_equals_plain(session_mixed, prompt):
    base = session_mixed.generate(prompt, max_tokens=40, n_max=0)
    check_accounting(base)
    assert base.n_drafted.sum() == 0 and len(base.tokens) == base.n_steps == 40
    for n_max in N_MAX:
        for p_min in P_MIN:
            t = session_mixed.generate(prompt, max_tokens=40, n_max=n_max, p_min=p_min)
            assert t.tokens == base.tokens, (n_max, p_min)
            assert t.text == base.text
            check_accounting(t)
            drafted = t.draft_prob[t.drafted >= 0]
            assert (drafted >= p_min).all()


def test_acceptance_regimes(model_full, model_mixed, model_zero):
    import mtp_explorer as mx

    results = {}
    for name, path in (("full", model_full), ("mixed", model_mixed), ("zero", model_zero)):
        with mx.Session.open(path, n_ctx=512) as s:
            base = s.generate("def fib(n):", max_tokens=64, n_max=0)
            t = s.generate("def fib(n):", max_tokens=64, n_max=4)
            assert t.tokens == base.tokens
            check_accounting(t)
            results[name] = t
    full, mixed, zero = results["full"], results["mixed"], results["zero"]
    assert full.summary()["acceptance_rate"] == 1.0
    assert (full.rollback == 0).all()
    assert zero.summary()["acceptance_rate"] < 0.05
    assert ((zero.n_accepted == 0) & (zero.n_drafted > 0)).any()
    # the mixed model shows all three: full acceptance, partial acceptance with rollback, zero acceptance
    drafting = mixed.n_drafted > 0
    assert ((mixed.n_accepted == mixed.n_drafted) & drafting).any()
    assert ((mixed.n_accepted > 0) & (mixed.n_accepted < mixed.n_drafted)).any()
    assert ((mixed.n_accepted == 0) & drafting).any()
    assert 0.2 < mixed.summary()["acceptance_rate"] < 0.95


def test_n_min_drops_short_drafts(session_mixed):
    base = session_mixed.generate("class Stack:", max_tokens=48, n_max=0)
    t = session_mixed.generate("class Stack:", max_tokens=48, n_max=4, p_min=0.5, n_min=2)
    assert t.tokens == base.tokens
    check_accounting(t)
    assert ((t.n_drafted == 0) | (t.n_drafted >= 2)).all()


def test_p_min_stops_drafting(session_mixed):
    t = session_mixed.generate("import os", max_tokens=48, n_max=8, p_min=0.6)
    reasons = [s.stop_reason for s in t.steps]
    assert "p_min" in reasons
    for s in t.steps:
        if s.stop_reason == "p_min":
            assert s.n_drafted < 8
        if s.stop_reason == "n_max":
            assert s.n_drafted == 8


def test_budget_is_exact_and_caps_drafts(session_mixed):
    for budget in (1, 2, 5, 17):
        t = session_mixed.generate("def fib(n):", max_tokens=budget, n_max=5)
        assert len(t.tokens) == budget
        assert t.finish_reason == "budget"
        assert t.steps[-1].stop_reason in ("budget", "n_max", "p_min")
        check_accounting(t)


def test_temperature_sampling_is_repeatable_and_matches_plain(session_mixed):
    a = session_mixed.generate("for i in range(10):", max_tokens=48, n_max=3, temperature=0.9, seed=7)
    b = session_mixed.generate("for i in range(10):", max_tokens=48, n_max=3, temperature=0.9, seed=7)
    plain = session_mixed.generate("for i in range(10):", max_tokens=48, n_max=0, temperature=0.9, seed=7)
    other = session_mixed.generate("for i in range(10):", max_tokens=48, n_max=0, temperature=0.9, seed=8)
    greedy = session_mixed.generate("for i in range(10):", max_tokens=48, n_max=0)
    assert a.tokens == b.tokens
    # each emitted token is one draw from the target's distribution: same seed, same tokens as plain sampling
    assert a.tokens == plain.tokens
    assert other.tokens != plain.tokens
    assert plain.tokens != greedy.tokens
    check_accounting(a)


#: every drafter and chain, as llama.cpp's --spec-type values, with small look-up sizes so that the n-gram
#: drafters find matches in these short prompts
SPEC_TYPES = (
    "ngram-simple",
    "ngram-simple,draft-mtp",
    "ngram-mod",
    "ngram-mod,draft-mtp",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-simple,ngram-map-k,draft-mtp",
)
SMALL_OPTIONS = {
    "ngram_simple_size_n": 2,
    "ngram_simple_size_m": 6,
    "ngram_mod_n_match": 2,
    "ngram_mod_n_min": 1,
    "ngram_mod_n_max": 6,
    "ngram_map_k_size_n": 2,
    "ngram_map_k_size_m": 6,
    "ngram_map_k4v_size_n": 2,
    "ngram_map_k4v_size_m": 4,
}
REPETITIVE = ["x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2", "for i in range(3):\n    print(i)\nfor i in range(3):\n"]


@pytest.mark.parametrize("spec", SPEC_TYPES)
def test_every_drafter_and_chain_equals_plain(session_mixed, spec):
    from mtp_explorer.core import drafters

    options = {k: v for k, v in SMALL_OPTIONS.items() if k in {o.name for o in drafters.all_options()}}
    for prompt in PROMPTS[:4] + REPETITIVE:
        base = session_mixed.generate(prompt, max_tokens=40, n_max=0)
        for n_max in (1, 3, 6):
            for policy in ("first", "best"):
                t = session_mixed.generate(
                    prompt, max_tokens=40, n_max=n_max, drafter=spec, chain_policy=policy, **options
                )
                assert t.tokens == base.tokens, (prompt, n_max, policy)
                check_accounting(t)
