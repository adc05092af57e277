"""llama.cpp's ngram-mod drafter (common/ngram-mod.cpp, common_speculative_impl_ngram_mod): the engine's drafter
and the simulator's replay (the same drafter walked along the recorded path: its hash table filled in llama.cpp's
chunks, reset after five low-acceptance steps) agree exactly, alone and chained with the MTP head under both chain
policies."""

from __future__ import annotations

import pytest
from conftest import check_replay_exact, page_faults_of_second_generation

import mtp_explorer as mx
from mtp_explorer.core import drafters

PROMPTS = [
    "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2",
    "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    "def fibonacci(n):",
    "a b c d e f g a b c d e f g a b c",
]
SMALL = {"ngram_mod_n_match": 2, "ngram_mod_n_min": 1, "ngram_mod_n_max": 6}


def test_replay_equals_the_engine(session_mixed):
    """Every step of real runs equals the simulator's replay, the table's resets included."""
    resets = 0
    modes = ["ngram-mod", *(drafters.mode("ngram-mod,draft-mtp", p) for p in ("first", "best"))]
    for n_match in (2,):
        options = SMALL | {"ngram_mod_n_match": n_match}
        for prompt in PROMPTS:
            o = session_mixed.record_oracle(prompt, max_tokens=100, depth=6, **options)
            for drafter in modes:
                for n_max in (2, 6):
                    check_replay_exact(session_mixed, o, prompt, drafter, n_max, 100, **options)
                    walked = o.replay("ngram-mod").state.walk.n_resets
                    engine = {r["name"]: r["n_resets"] for r in session_mixed.drafter_stats()}
                    assert walked == engine["ngram-mod"]  # the real run's last generation is this setting's
                    resets += walked
    assert resets > 0  # the low-acceptance reset is exercised


def test_defaults_and_bad_options(session_mixed):
    values = drafters.option_values()
    assert (values["ngram_mod_n_match"], values["ngram_mod_n_min"], values["ngram_mod_n_max"]) == (24, 48, 64)
    for bad in (
        {"ngram_mod_n_match": 0},
        {"ngram_mod_n_match": 1025},
        {"ngram_mod_n_min": -1},
        {"ngram_mod_n_max": 2000},
    ):
        with pytest.raises(mx.ParameterError, match="--spec-ngram-mod-n-"):
            session_mixed.generate("x", max_tokens=4, n_max=2, drafter="ngram-mod", **bad)
    # llama.cpp's defaults need 24 tokens of context before a draft: none in a short generation
    t = session_mixed.generate(PROMPTS[0], max_tokens=24, n_max=4, drafter="ngram-mod")
    assert t.n_drafted.sum() == 0


TABLE_PAGES = 4 * 1024 * 1024 * 4 // 4096  # llama.cpp's 4 Mi int32 entries, in 4 KiB pages


def test_a_generation_reuses_the_last_generations_table(bundled_model):
    """The next generation takes the 16 MB table the last one released (4096 pages), where it used to fault in a new
    one while the last generation's drafters still held theirs; a new process, so that the pool starts empty."""
    settings = dict(prompt="def fibonacci(n):", max_tokens=8, n_max=2, drafter="ngram-mod", ngram_mod_n_match=2)
    assert page_faults_of_second_generation(bundled_model, settings, settings) < TABLE_PAGES // 4
