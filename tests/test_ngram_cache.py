"""llama.cpp's ngram-cache drafter (common/ngram-cache.cpp, common_speculative_impl_ngram_cache): greedy output equals
plain decoding, the simulator's replay of its caches (the context cache grown in llama.cpp's chunks, the dynamic and
static cache files) equals the engine step by step, its statistics are llama.cpp's, bad cache files are parameter
errors, a static cache of the model's own text raises acceptance, and the Python writer of static caches writes
byte for byte what llama.cpp's llama-lookup-create writes (in the libstdc++ map order llama.cpp's files keep)."""

from __future__ import annotations

import struct
import subprocess
import warnings
from pathlib import Path

import pytest
from conftest import check_accounting, check_drafter_stats, check_replay_exact

import mtp_explorer as mx
from mtp_explorer import _native
from mtp_explorer.analysis import ngram_cache
from mtp_explorer.core import drafters

PROMPTS = [
    "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2",
    "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    "def fibonacci(n):",
    "a b c d e f g a b c d e f g a b c",
]
CORPUS_PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n", "for i in range(10):", "a b c d e f g"]
SPEC = "ngram-cache"
CHAIN = "ngram-cache,draft-mtp"


@pytest.fixture(scope="module")
def session(model_mixed):
    """The mixed model on one thread (these tests time nothing; one thread keeps them fast on a busy machine)."""
    with mx.Session.open(model_mixed, n_ctx=1024, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def corpus(session, tmp_path_factory) -> Path:
    """Text the model generates greedily from CORPUS_PROMPTS (prompts included), as a file."""
    text = "".join(p + session.generate(p, max_tokens=160, n_max=0).text for p in CORPUS_PROMPTS)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def caches(session, corpus) -> dict[str, str]:
    """Cache files of the corpus: a static one (its 2-grams, as llama-lookup-create) and a dynamic one (1- to 4-grams,
    as llama.cpp's context cache holds them)."""
    tokens = session.tokenize(corpus.read_text())
    dynamic: dict = {}
    ngram_cache.update(dynamic, ngram_cache.LLAMA_NGRAM_MIN, ngram_cache.LLAMA_NGRAM_MAX, tokens, len(tokens))
    ngram_cache.save(dynamic, corpus.with_name("dynamic.bin"))
    return {
        "lookup_cache_static": ngram_cache.write_static_cache(tokens, corpus.with_name("static.bin")),
        "lookup_cache_dynamic": str(corpus.with_name("dynamic.bin")),
    }


@pytest.mark.reference
def test_static_cache_writer_is_llama_lookup_create_s(session, model_mixed, tmp_path, lookup_create):
    """write_static_cache writes byte for byte what llama-lookup-create writes for the same text (so the emulated
    libstdc++ map order is the real one, over several rehashes of the map and of its parts), and load() reads it."""
    text = tmp_path / "text.txt"  # varied text (the synthetic model's own output repeats itself)
    text.write_text((Path(mx.__file__).parent / "core" / "drafters.py").read_text())
    ref, ours = tmp_path / "reference.bin", tmp_path / "ours.bin"
    subprocess.run(
        [str(lookup_create), "-m", str(model_mixed), "-f", str(text), "-lcs", str(ref), "-t", "1"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    tokens = session.tokenize(text.read_text().removesuffix("\n"))  # llama.cpp's -f drops one final newline
    ngram_cache.write_static_cache(tokens, ours)
    assert ours.read_bytes() == ref.read_bytes()
    expected: dict = {}
    ngram_cache.update(expected, 2, 2, tokens, len(tokens))
    assert ngram_cache.load(ref) == expected
    assert len(expected) > ngram_cache.BUCKET_COUNTS[6]  # the map rehashed 7 times (13, ..., 1109 buckets)
    assert max(len(part) for part in expected.values()) > ngram_cache.BUCKET_COUNTS[1]  # a part rehashed twice


def test_speculative_equals_plain(session, caches):
    """Greedy output with ngram-cache (alone, with cache files, chained with the MTP head) is plain decoding's; a
    divergence must be a floating-point near-tie of the target's top-2 logits, reported with its margin."""
    ties, runs = [], 0
    for prompt in PROMPTS:
        oracle = session.record_oracle(prompt, max_tokens=64, depth=6, probe=False)
        base = session.generate(prompt, max_tokens=64, n_max=0)
        assert oracle.tokens == base.tokens
        for drafter, files in ((SPEC, {}), (SPEC, caches), (CHAIN, caches)):
            for n_max in (1, 3, 6):
                t = session.generate(prompt, max_tokens=64, n_max=n_max, drafter=drafter, **files)
                check_accounting(t)
                runs += 1
                if t.tokens == base.tokens:
                    continue
                at = next(i for i, (a, b) in enumerate(zip(t.tokens, base.tokens)) if a != b)
                found = [m for m in mx.compare(oracle, t).ties if m["cause"] == "target_argmax"]
                assert found and found[0]["position"] == at, (prompt, drafter, n_max)
                ties.append(
                    f"{drafter} n_max={n_max} {prompt!r}: diverged at token {at}, one-row top-2 margin "
                    f"{found[0]['margin']:.4f}"
                )
    assert len(ties) <= runs // 4, ties
    if ties:
        warnings.warn(
            f"{len(ties)} of {runs} runs diverged at a floating-point near-tie:\n" + "\n".join(ties), stacklevel=1
        )


def test_replay_equals_the_engine(session, caches):
    """Every step of real runs equals the simulator's replay: alone and chained under both policies, with no cache
    file, a static one, and both."""
    modes = [SPEC, CHAIN, drafters.mode(CHAIN, "best")]
    won = 0
    for files in ({}, {"lookup_cache_static": caches["lookup_cache_static"]}, caches):
        for prompt in PROMPTS:
            o = session.record_oracle(prompt, max_tokens=64, depth=6, probe=False, **files)
            for drafter in modes:
                for n_max in (2, 6):
                    t = check_replay_exact(session, o, prompt, drafter, n_max, 64, **files)
                    won += int((t.drafter == mx.DRAFTERS.index(SPEC)).sum())
    assert won > 0


def test_statistics_are_llama_cpp_s(session, caches):
    for drafter in (SPEC, CHAIN):
        t = session.generate(PROMPTS[1], max_tokens=64, n_max=4, drafter=drafter, **caches)
        check_accounting(t)
        check_drafter_stats(session, t, drafter)
        assert (t.drafter == mx.DRAFTERS.index(SPEC)).any()


def test_static_cache_raises_acceptance(session, caches):
    """A static cache of text the model generates lets ngram-cache draft (and be accepted) where the context alone
    has little to offer."""
    totals = {}
    for name, files in (("context", {}), ("static", {"lookup_cache_static": caches["lookup_cache_static"]})):
        runs = [session.generate(p, max_tokens=96, n_max=4, drafter=SPEC, **files) for p in CORPUS_PROMPTS]
        totals[name] = sum(int(t.n_accepted.sum()) for t in runs), sum(int(t.n_drafted.sum()) for t in runs)
    (acc_context, _), (acc_static, drafted_static) = totals["context"], totals["static"]
    assert acc_static > 2 * acc_context + 50, totals
    assert acc_static / drafted_static > 0.5, totals


def _record(ngram, pairs) -> bytes:
    return struct.pack("<4ii", *ngram, len(pairs)) + b"".join(struct.pack("<ii", t, c) for t, c in pairs)


def test_bad_cache_files_are_parameter_errors(session, tmp_path):
    """A missing, unreadable or malformed cache file is a ParameterError naming it (llama.cpp aborts), in the engine
    and in the replay's loader alike; so is a token outside the model's vocabulary (engine) and a value that is
    not a file name."""
    good = _record((1, 2, -1, -1), [(3, 2), (4, 1)])
    bad = {
        "missing.bin": None,
        "truncated.bin": good[:-3],
        "partial.bin": good + b"\x01\x00\x00",
        "no-tokens.bin": _record((1, 2, -1, -1), []),
        "zero-count.bin": _record((1, 2, -1, -1), [(3, 0)]),
    }
    for name, data in bad.items():
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        for option in ("lookup_cache_static", "lookup_cache_dynamic"):
            with pytest.raises(mx.ParameterError, match=name):
                session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, **{option: str(path)})
        with pytest.raises(mx.ParameterError, match=name):
            ngram_cache.load(path)
    with pytest.raises(mx.ParameterError, match="missing.bin .* does not exist"):
        session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=tmp_path / "missing.bin")
    vocab = tmp_path / "vocab.bin"
    vocab.write_bytes(good + _record((1, 2, 3, -1), [(10**6, 1)]))
    with pytest.raises(mx.ParameterError, match="vocab.bin.*outside the model's vocabulary"):
        session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=str(vocab))
    with pytest.raises(mx.ParameterError, match="is not a file"):
        session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=str(tmp_path))
    with pytest.raises(mx.ParameterError, match="--lookup-cache-static"):
        session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=3)
    # the session stays usable, and a good file works; a file changed since it was read is read again
    ok = tmp_path / "ok.bin"
    ok.write_bytes(good)
    for _ in range(2):
        assert len(session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=ok).tokens) == 4
    ok.write_bytes(good[:-3])
    with pytest.raises(mx.ParameterError, match=r"ok\.bin .* is malformed"):
        session.generate("x", max_tokens=4, n_max=2, drafter=SPEC, lookup_cache_static=ok)


def test_replay_of_a_recording_whose_cache_file_is_gone(session, tmp_path):
    path = tmp_path / "gone.bin"
    ngram_cache.write_static_cache(session.tokenize(PROMPTS[0]), path)
    o = session.record_oracle(PROMPTS[0], max_tokens=8, depth=3, probe=False, lookup_cache_static=str(path))
    path.unlink()
    with pytest.raises(mx.ParameterError, match="gone.bin"):
        mx.simulate(o, 3, drafter=SPEC)


def test_defaults_are_llama_cpp_s():
    """No cache files by default (common_params_speculative_ngram_cache), llama.cpp's flags, and its constants."""
    spec = drafters.drafter(SPEC)
    assert [(o.name, o.flag, o.default, o.is_path) for o in spec.options] == [
        ("lookup_cache_static", "--lookup-cache-static", "", True),
        ("lookup_cache_dynamic", "--lookup-cache-dynamic", "", True),
    ]
    assert (spec.name, spec.has_confidence, spec.needs_mtp) == ("ngram-cache", False, False)
    assert spec.fixed_draft_len == 8  # llama.cpp's create_state_ngram_cache n_draft
    assert (ngram_cache.LLAMA_NGRAM_MIN, ngram_cache.LLAMA_NGRAM_MAX, ngram_cache.LLAMA_NGRAM_STATIC) == (1, 4, 2)
    assert drafters.option_values({"lookup_cache_static": Path("/x/y.bin")})["lookup_cache_static"] == "/x/y.bin"


def _walk_draft(tmp_path, path, n_prompt, static=None, dynamic=None) -> list[int]:
    """The engine's ngram-cache drafter's first token after ``path`` (its context cache: the path; the caches given
    written to files as llama.cpp writes them), walked without a model."""
    options = {}
    for name, cache in (("lookup_cache_static", static), ("lookup_cache_dynamic", dynamic)):
        if cache is not None:
            ngram_cache.save(cache, tmp_path / f"{name}.bin")
            options[name] = str(tmp_path / f"{name}.bin")
    walk = _native.LookupWalk(SPEC, options, path, n_prompt, 100, [])
    tokens, _ = walk.propose(0, 1, 0, 0)
    return tokens


def test_draft_thresholds(tmp_path):
    """common_ngram_cache_draft's rules on hand-made caches (the engine's drafter, as the what-if walks it): the
    context cache's n-grams pass lax thresholds, the dynamic cache's strict ones, the static cache drafts alone where
    the others have nothing."""
    # only the 1-gram (6) matches: 7 and 8 once each, 50 % < 66 %: no draft; 7 twice, 8 once: 67 % >= 66 %
    assert _walk_draft(tmp_path, [6, 7, 6, 8, 1, 6], 6) == []
    assert _walk_draft(tmp_path, [6, 7, 6, 8, 6, 7, 1, 6], 8) == [7]
    # the dynamic cache's strict thresholds: a 3-gram needs 2 samples and 66 %
    assert _walk_draft(tmp_path, [9, 5, 6], 3, dynamic={(9, 5, 6, -1): {7: 1, 8: 1}}) == []
    assert _walk_draft(tmp_path, [9, 5, 6], 3, dynamic={(9, 5, 6, -1): {7: 2}}) == [7]
    # the static cache alone: at least 2 samples, at least 50 %
    assert _walk_draft(tmp_path, [1, 2], 2, static={(1, 2, -1, -1): {3: 1}}) == []
    assert _walk_draft(tmp_path, [1, 2], 2, static={(1, 2, -1, -1): {3: 2}}) == [3]
    with pytest.raises(mx.ParameterError, match="outside the model's vocabulary"):
        _walk_draft(tmp_path, [1, 2], 2, static={(1, 2, -1, -1): {300: 2}})


def test_walks_refuse_what_they_cannot_walk():
    for name, match in (("beam", "unknown drafter"), ("draft-mtp", "drafts with a model")):
        with pytest.raises(mx.ParameterError, match=match):
            _native.LookupWalk(name, {}, [1, 2, 3], 2, 100, [])
    walk = _native.LookupWalk("ngram-simple", {}, [1, 2, 3], 2, 100, [])
    assert walk.positions == 2 and walk.propose(1, 0, 0, 0) is None  # a cap of 0: it takes no part
    with pytest.raises(mx.ParameterError, match="outside the walk"):
        walk.propose(2, 3, 0, 0)
