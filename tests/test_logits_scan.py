"""The engine's scans of a row of logits (native_ext/logits_scan.h): the greedy token of a verify row and a draft
decode's candidates equal numpy's on rows of every length around the scan's chunks, with ties, infinities and the
vocabulary sizes users bring."""

from __future__ import annotations

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer import _native

SIZES = (1, 2, 9, 10, 15, 16, 17, 63, 64, 65, 127, 129, 1000, 16384, 151936, 248320)


def rows(n_vocab: int, rng: np.random.Generator):
    """Normal logits, the same rounded (many equal values), one value throughout, and -inf but a few."""
    normal = rng.normal(0.0, 3.0, n_vocab).astype(np.float32)
    sparse = np.full(n_vocab, -np.inf, dtype=np.float32)
    sparse[rng.choice(n_vocab, size=min(3, n_vocab), replace=False)] = rng.normal(size=min(3, n_vocab))
    return {
        "normal": normal,
        "rounded": np.round(normal),
        "constant": np.full(n_vocab, 1.5, dtype=np.float32),
        "mostly -inf": sparse,
    }


@pytest.mark.parametrize("n_vocab", SIZES)
def test_the_scans_equal_numpys(n_vocab):
    rng = np.random.default_rng(n_vocab)
    for name, logits in rows(n_vocab, rng).items():
        assert _native.argmax(logits) == int(np.argmax(logits)), name  # the first of the largest
        k = min(10, n_vocab)
        want = np.lexsort((np.arange(n_vocab), -logits))[:k]  # largest first, equal ones by increasing id
        assert _native.top_logits(logits, k) == list(want), name


def test_the_largest_logit_is_found_wherever_it_lies():
    base = np.zeros(4096, dtype=np.float32)
    for at in range(0, 4096, 37):
        row = base.copy()
        second = (at * 7 + 3) % 4096  # never `at`: 6 * at + 3 is odd
        row[at], row[second] = 1.0, 0.5
        assert _native.argmax(row) == at
        assert _native.top_logits(row, 2) == [at, second]


def test_a_bad_k_is_refused():
    with pytest.raises(mx.ParameterError, match="k must be between 1 and the row's 4 logits"):
        _native.top_logits(np.zeros(4, dtype=np.float32), 5)
    with pytest.raises(mx.ParameterError):
        _native.top_logits(np.zeros(4, dtype=np.float32), 0)
