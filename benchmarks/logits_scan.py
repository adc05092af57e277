"""The engine's scans of one row of logits against llama.cpp's CPU samplers on the same row, per vocabulary size.

Each verify row's greedy token (``_native.argmax``) and each draft decode's 10 candidates (``_native.top_logits``,
llama.cpp's draft sampler keeps 10) are the engine's own work on the CPU every step: at a 248 k vocabulary a row is
1 MB. The reference is llama.cpp's sampler API on the same row, run through llama-cpp-python: the row written into a
``llama_token_data_array`` (as ``common_sampler`` does for every row it samples; not timed) and then ``greedy`` or
``top_k(10)`` applied (timed). The rows are SYNTHETIC (normal logits, sd 3). Prints JSON: the medians in microseconds
and reference / ours.

    .venv/bin/python benchmarks/logits_scan.py [--sizes 16384 151936 248320] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import llama_cpp as lc
import numpy as np
from _common import emit, machine

from mtp_explorer import _native

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def median_us(fn, repeats: int, before=None) -> float:
    """The median time of ``fn()`` in microseconds, ``before()`` run untimed ahead of each call."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


class LlamaSampler:
    """One llama.cpp sampler applied to a row's ``llama_token_data_array``: :meth:`fill` writes the row into it (what
    ``common_sampler`` does in C++ before every sampling; here numpy's, so it is not timed), :meth:`apply` samples."""

    def __init__(self, sampler, row: np.ndarray):
        self.sampler, self.row = sampler, row
        self.cand = np.zeros(len(row), dtype=TOKEN_DATA)
        self.array = lc.llama_token_data_array(
            data=self.cand.ctypes.data_as(lc.llama_token_data_p), size=len(row), selected=-1, sorted=False
        )

    def fill(self) -> None:
        self.cand["id"] = np.arange(len(self.row))
        self.cand["logit"] = self.row
        self.cand["p"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = len(self.row), -1, False

    def apply(self) -> None:
        lc.llama_sampler_apply(self.sampler, ctypes.byref(self.array))

    def close(self) -> None:
        lc.llama_sampler_free(self.sampler)


def measure(n_vocab: int, repeats: int) -> dict:
    row = np.random.default_rng(n_vocab).normal(0.0, 3.0, n_vocab).astype(np.float32)
    greedy = LlamaSampler(lc.llama_sampler_init_greedy(), row)
    top_k = LlamaSampler(lc.llama_sampler_init_top_k(10), row)
    try:
        for s in (greedy, top_k):
            s.fill()
            s.apply()
        assert greedy.cand["id"][greedy.array.selected] == _native.argmax(row) == int(np.argmax(row))
        assert list(top_k.cand["id"][:10]) == _native.top_logits(row, 10)
        got = {
            "greedy_us": (
                median_us(lambda: _native.argmax(row), repeats),
                median_us(greedy.apply, repeats, before=greedy.fill),
            ),
            "top10_us": (
                median_us(lambda: _native.top_logits(row, 10), repeats),
                median_us(top_k.apply, repeats, before=top_k.fill),
            ),
        }
    finally:
        greedy.close()
        top_k.close()
    return {"n_vocab": n_vocab} | {
        name: {"ours": round(ours, 2), "reference": round(ref, 2), "reference_over_ours": round(ref / ours, 2)}
        for name, (ours, ref) in got.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 151936, 248320])
    ap.add_argument("--repeats", type=int, default=2000)
    args = ap.parse_args()
    emit(
        {
            "benchmark": "logits_scan",
            "machine": machine(),
            "rows": "SYNTHETIC normal logits (sd 3)",
            "results": [measure(n, args.repeats) for n in args.sizes],
        }
    )


if __name__ == "__main__":
    main()
