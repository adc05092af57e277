"""llama.cpp's ngram-map-k and ngram-map-k4v drafters (common/ngram-map.cpp): the engine's drafters and the
simulator's replay of their state (the hash map, the key statistics, each key's last accepted length) agree
exactly, alone and in chains under both chain policies."""

from __future__ import annotations

import pytest
from conftest import check_replay_exact

import mtp_explorer as mx
from mtp_explorer.core import drafters

PROMPTS = [
    "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2",
    "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    "a b c d e f g a b c d e f g a b c",
]
SMALL = {
    "ngram_map_k_size_n": 2,
    "ngram_map_k_size_m": 4,
    "ngram_map_k4v_size_n": 2,
    "ngram_map_k4v_size_m": 3,
    "ngram_map_k4v_min_hits": 2,
    "ngram_simple_size_n": 3,
}


def test_replay_equals_the_engine(session_mixed):
    modes = [
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-simple,ngram-map-k,draft-mtp",
        drafters.mode("ngram-map-k4v,draft-mtp", "best"),
    ]
    won = set()
    for prompt in PROMPTS:
        o = session_mixed.record_oracle(prompt, max_tokens=80, depth=6, **SMALL)
        for drafter in modes:
            for n_max in (2, 6):
                t = check_replay_exact(session_mixed, o, prompt, drafter, n_max, 80, **SMALL)
                won |= set(t.drafter.tolist())
    assert {mx.DRAFTERS.index(n) for n in ("ngram-map-k", "ngram-map-k4v")} <= won


def test_defaults_and_bad_options(session_mixed):
    values = drafters.option_values()
    for prefix in ("ngram_map_k", "ngram_map_k4v"):
        assert tuple(values[f"{prefix}_{k}"] for k in ("size_n", "size_m", "min_hits")) == (12, 48, 1)
    for bad in ({"ngram_map_k_size_n": 0}, {"ngram_map_k4v_size_m": 1025}, {"ngram_map_k4v_min_hits": 0}):
        with pytest.raises(mx.ParameterError, match="--spec-ngram-map-k"):
            session_mixed.generate("x", max_tokens=4, n_max=2, drafter="ngram-map-k4v", **bad)
