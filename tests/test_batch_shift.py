"""The batch-shape shift (Session.batch_shift): measured on the session's own target context, cached per file,
machine and placement, carried by oracles, and used by mx.compare as its tie tolerance and by simulate to mark
the positions a real run may leave the predicted text at."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis import batch_shift as bs

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)


@pytest.fixture(scope="module")
def session(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=512, threads=1, n_rs_seq=4) as s:
        yield s


def test_the_shift_is_measured_for_every_verify_batch(session):
    shift = session.batch_shift(refresh=True)
    assert shift.ks == (2, 3, 4, 5)  # every n_max + 1 the session's capacity allows
    # segments of KV lengths from 0 and from 256 on (llama.cpp pads the KV cache to 256 cells)
    assert shift.starts == tuple(bs.segment_starts(512)) == (0, 256)
    assert shift.n_positions == 512 and shift.model == Path(session.info.path).name
    assert [len(w) for w in shift.segment_shift] == [2] * 4
    assert shift.margin_shift == tuple(max(w) for w in shift.segment_shift)
    assert all(0.0 <= m < 0.5 for m in shift.margin_shift), shift
    assert all(m <= 2 * lg + 1e-6 for m, lg in zip(shift.margin_shift, shift.logit_shift))
    assert shift.shift() == max(shift.margin_shift) and shift.shift(3) == max(shift.margin_shift[:2])
    assert shift.tolerance() == bs.SAFETY * shift.shift()
    assert shift.machine["placement"]["repack"] is mx.check_extra_buffers().usable  # llama.cpp's default where it runs
    assert shift.machine["threads"] == 1
    assert shift.file_id == bs.file_id(session.info.path)


def test_the_probe_leaves_the_session_as_it_was(session):
    before = session.generate("def fib(n):", max_tokens=24, n_max=3)
    session.batch_shift(refresh=True)
    after = session.generate("def fib(n):", max_tokens=24, n_max=3)
    assert after.tokens == before.tokens and list(after.n_accepted) == list(before.n_accepted)


def test_the_shift_is_cached_per_file_machine_and_placement(session, monkeypatch, bundled_model):
    first = session.batch_shift([2, 3])
    calls = []
    real = session.engine.probe_batch_shift
    monkeypatch.setattr(session, "_engine", _Spy(session.engine, calls))
    again = session.batch_shift([2, 3])
    assert again == first and calls == []  # read from the cache
    wider = session.batch_shift([2, 3, 11])
    assert calls == [[11]] and wider.ks == (2, 3, 11)  # only the batch size it lacked is measured
    session.batch_shift([2, 3], refresh=True)
    assert calls[-1] == [2, 3]
    assert real is not None
    files = list(bs.cache_dir().glob("*.json"))
    assert files and all(set(json.loads(f.read_text())) == {"smallest_margin", "per_k"} for f in files)
    # another placement is another entry
    with mx.Session.open(bundled_model, n_ctx=512, threads=1, n_rs_seq=4, flash_attn="off") as other:
        assert other.placement["flash_attn"] == "off" != session.placement["flash_attn"]
        shift = other.batch_shift([2])
    assert shift.machine["placement"]["flash_attn"] == "off"
    assert len(list(bs.cache_dir().glob("*.json"))) == len(files) + 1


class _Spy:
    """The engine, with probe_batch_shift calls recorded (their batch sizes)."""

    def __init__(self, engine, calls):
        self._engine, self._calls = engine, calls

    def probe_batch_shift(self, tokens, ks):
        self._calls.append(list(ks))
        return self._engine.probe_batch_shift(tokens, ks)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_a_corrupt_cache_entry_is_measured_again(session):
    session.batch_shift([2])
    for f in bs.cache_dir().glob("*.json"):
        f.write_text("{not json")
    assert session.batch_shift([2]).ks == (2,)


def test_bad_batch_sizes_and_records_are_clear_errors(session, bundled_model):
    with pytest.raises(mx.ParameterError, match="batch sizes"):
        session.batch_shift([1])
    with pytest.raises(mx.ParameterError, match="batch sizes"):
        session.batch_shift([600])
    # past the outputs the target reserves (libllama would abort the process): a clear error, then the session works
    with pytest.raises(mx.ParameterError, match=r"the target's 64 outputs\) = 64, got 65"):
        session.batch_shift([65])
    assert session.batch_shift([64]).ks == (64,)
    with pytest.raises(mx.ParameterError, match="batch sizes"):
        session.batch_shift([])
    with pytest.raises(mx.ParameterError, match="max_position must be >= 2"):
        session.batch_shift(max_position=1)
    with pytest.raises(mx.ParameterError, match="the prompt is empty"):
        session.batch_shift(text="")
    own_text = bs.PROBE_TEXT[:300]
    own = session.batch_shift([2, 3], text=own_text)
    n_own = len(session.tokenize(own_text))
    assert own.ks == (2, 3) and own.starts == (0,) and own.n_positions == n_own
    with pytest.raises(mx.ParameterError, match="the probe's tokens"):
        session.batch_shift([20], text="def f(x):")
    with pytest.raises(mx.ParameterError, match="not an mtp-explorer batch-shift"):
        bs.BatchShift.from_dict({"ks": [2]})
    good = session.batch_shift([2]).to_dict()
    with pytest.raises(mx.FormatError, match=r"corrupt batch-shift record: missing field\(s\) \['ks'\]"):
        bs.BatchShift.from_dict({k: v for k, v in good.items() if k != "ks"})
    with pytest.raises(mx.ParameterError, match="no batch of at most 2 rows"):
        session.batch_shift([3]).shift(2)
    s = mx.Session.open(bundled_model, n_ctx=256, threads=1)
    s.close()
    with pytest.raises(mx.SessionClosedError):
        s.batch_shift()


def test_oracles_carry_the_shift_through_json(session):
    oracle = session.record_oracle("def fib(n):", max_tokens=16, depth=3, probe=False)
    assert oracle.batch_shift is not None and oracle.batch_shift.ks == (2, 3, 4)
    back = mx.OracleTrace.from_json(oracle.to_json())
    assert back.batch_shift == oracle.batch_shift
    bare = session.record_oracle("def fib(n):", max_tokens=16, depth=3, probe=False, batch_shift=False)
    assert bare.batch_shift is None and mx.OracleTrace.from_json(bare.to_json()).batch_shift is None


def _uniform(shift: bs.BatchShift, value: float) -> bs.BatchShift:
    """``shift`` as if every batch size and segment had moved the margin by ``value`` (a made-up measurement)."""
    return dataclasses.replace(
        shift,
        margin_shift=(value,) * len(shift.ks),
        segment_shift=tuple((value,) * len(shift.starts) for _ in shift.ks),
    )


def _diverged(session, prompt: str, at: int, **kw):
    """A real trace of ``prompt`` whose token at ``at`` is replaced (a divergence the test makes)."""
    t = session.generate(prompt, max_tokens=24, n_max=3, **kw)
    bad = mx.Trace.from_json(t.to_json())
    bad.tokens[at] = (bad.tokens[at] + 1) % 100
    return bad


def test_compare_judges_a_divergence_by_the_measured_shift(session):
    """A divergence at a position whose one-row margin is within the measured tolerance is a batch-variant tie,
    explained with the shift; with a shift measured smaller than the margin, the same divergence is unexplained."""
    oracle = session.record_oracle("def fib(n):", max_tokens=24, depth=3, probe=False)
    margins = oracle.columns["target_margin"][:24]
    at = int(np.argmin(margins))
    bad = _diverged(session, "def fib(n):", at)
    wide = _uniform(oracle.batch_shift, 2 * float(margins[at]) + 0.01)
    oracle.batch_shift = wide
    cmp = mx.compare(oracle, bad)
    (m,) = [m for m in cmp.mismatches if m["cause"] == "target_argmax"]
    assert m["kind"] == "tie" and m["position"] == at and m["tolerance"] == wide.tolerance()
    assert m["explanation"].startswith("the target's token differs: batch-variant kernel, shift <= ")
    narrow = _uniform(wide, float(margins[at]) / 4)
    oracle.batch_shift = narrow
    (m,) = [m for m in mx.compare(oracle, bad).mismatches if m["cause"] == "target_argmax"]
    assert m["kind"] == "unexplained" and "report it as a bug" in m["explanation"]
    # an explicit tolerance still wins
    assert mx.compare(oracle, bad, tol_logit=1e9).mismatches[0]["kind"] == "tie"
    # a run without drafts decoded one row at a time, the oracle's own shape: no batch to blame
    oracle.batch_shift = wide
    plain = mx.Trace.from_json(session.generate("def fib(n):", max_tokens=24, n_max=0).to_json())
    plain.tokens[at] = (plain.tokens[at] + 1) % 100
    (m,) = [m for m in mx.compare(oracle, plain).mismatches if m["cause"] == "target_argmax"]
    assert m["kind"] == "unexplained" and m["tolerance"] == 0.0 and "one-row decodes only" in m["explanation"]


def test_the_tolerance_follows_the_batch_size():
    shift = bs.BatchShift(
        model="m.gguf",
        file_id="x",
        machine={},
        n_positions=64,
        ks=(2, 3, 4, 5),
        margin_shift=(0.0, 0.0, 0.08, 0.07),
        logit_shift=(0.0, 0.0, 0.1, 0.1),
        n_flips=(0, 0, 1, 0),
        smallest_margin=0.01,
        starts=(0, 240),
        segment_shift=((0.0, 0.0), (0.0, 0.0), (0.02, 0.08), (0.01, 0.07)),
    )
    assert shift.shift(1) == 0.0 and shift.shift(3) == 0.0 and shift.shift(4) == shift.shift(9) == shift.shift() == 0.08
    assert shift.tolerance(5) == bs.SAFETY * 0.08
    assert shift.explain(0.1, 4).startswith("batch-variant kernel, shift <= 0.08")
    assert "report it as a bug" in shift.explain(0.1, 3) and "batches of 2, 3 rows" in shift.explain(0.1, 3)
    # the kernels change with the KV length: a segment's shift counts from where it starts on
    assert shift.shift(5, 100) == 0.02 and shift.shift(5, 240) == shift.shift(5, 4000) == 0.08
    assert shift.shift(5, 0) == 0.02
    np.testing.assert_allclose(
        shift.tolerances(5, np.array([0, 239, 240, 900])), bs.SAFETY * np.array([0.02, 0.02, 0.08, 0.08])
    )
    assert "up to KV length 100" in shift.explain(0.05, 5, 100) and shift.explain(0.05, 5, 100).startswith("unexpl")
    assert shift.explain(0.05, 5, 300).startswith("batch-variant kernel")
    assert bs.BatchShift.from_dict(shift.to_dict()) == shift
    assert bs.segment_starts(5000) == [0, 256, 512, 1024, 2048, 4096]
    assert bs.segment_starts(256) == [0] and bs.segment_starts(257) == [0, 256]


def test_simulate_marks_the_uncertain_positions_and_gives_ranges(session):
    oracle = session.record_oracle("import os\n\n\ndef list_files(path):", max_tokens=48, depth=3, probe=False)
    margins = np.asarray(oracle.columns["target_margin"])
    sim = mx.simulate(oracle, n_max=3)
    u = sim.uncertainty()
    assert u["tolerance"] == oracle.batch_shift.tolerance(4)  # verify batches of n_max + 1 rows, the largest
    per_position = oracle.batch_shift.tolerances(4, oracle.columns["pos"])  # at each position's KV length
    assert u["uncertain_positions"] == np.flatnonzero(margins[:48] < per_position[:48]).tolist()
    point = int(sim.n_accepted.sum())
    lo, hi = u["n_accepted_range"]
    assert lo <= point <= hi
    tps_lo, tps_hi = u["tokens_per_second_range"]
    assert tps_lo <= sim.summary()["tokens_per_second"] <= tps_hi
    # every position uncertain: the prediction is a wide range, starting at the first position
    oracle.batch_shift = _uniform(oracle.batch_shift, 1e6)
    u = mx.simulate(oracle, n_max=3).uncertainty()
    assert u["first_uncertain"] == 0 and len(u["uncertain_positions"]) == 48
    assert u["n_accepted_range"][0] == 0 and u["n_accepted_range"][1] >= point
    grid = mx.simulate_grid(oracle, n_max=[1, 3], p_min=[0.0])
    assert (grid["n_uncertain"] == 48).all() and (grid["first_uncertain"] == 0).all()
    assert (grid["tokens_per_second_low"] <= grid["tokens_per_second"]).all()
    assert (grid["tokens_per_second"] <= grid["tokens_per_second_high"]).all()
    # not measured: nothing marked, the range is the point
    oracle.batch_shift = None
    u = mx.simulate(oracle, n_max=3).uncertainty()
    assert u["uncertain_positions"] == [] and u["n_accepted_range"] == (point, point) and np.isnan(u["tolerance"])
