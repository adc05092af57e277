"""draft-dflash in the engine: a DFlash block drafter (a ``dflash`` GGUF given as ``Session.open(path,
draft_model=...)``, llama.cpp's ``-md``) drafts for the bundled model from the inputs of its layers.

The head here is SYNTHETIC (random weights, ``training.dflash.random_head``, converted by llama.cpp's own converter):
its drafts are almost never accepted, so these tests check that the engine drafts what llama.cpp drafts (every
block's tokens and top-10-renormalised probabilities, from the reference's debug log), its totals and text, the
session's refusals, the block clamp and the simulator's replay, not a trained head's quality.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from conftest import check_accounting, check_replay_exact

import mtp_explorer as mx
from mtp_explorer.core import drafters

PROMPTS = ("def fib(n):", "class Stack:\n    def __init__(self):\n", "import os\nimport sys\n")
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    import torch

    from training import dflash as D

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("dflash-engine")
    h, _ = D.load_head(D.save_head(work / "head.pt", D.random_head(seed=0), {"synthetic": True}))
    return D.convert_head(h, work / "random-dflash.gguf", work, name="SYNTHETIC-random-dflash")


@pytest.fixture(scope="module")
def session(bundled_model, head):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=head) as s:
        yield s


@pytest.mark.train
def test_the_session_knows_its_head(session):
    assert session.draft_kind == "dflash_head"
    assert drafters.available_modes(True, "dflash_head")[-1] == "draft-dflash"
    for other in ("draft-simple", "draft-eagle3"):
        with pytest.raises(mx.ParameterError, match="the draft model this session has is a DFlash head"):
            session.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter=other)


@pytest.mark.train
def test_greedy_output_is_plain_and_the_block_is_clamped(session):
    for prompt in PROMPTS:
        plain = session.generate(prompt, max_tokens=MAX_TOKENS, n_max=0)
        # the head's block has 4 slots: n_max 8 drafts at most 3 tokens, as llama.cpp clamps it
        t = session.generate(prompt, max_tokens=MAX_TOKENS, n_max=8, drafter="draft-dflash")
        check_accounting(t)
        assert t.tokens == plain.tokens  # nothing is accepted from this random head: every token is the target's
        assert t.n_drafted.max() == session.engine.draft_block_limit == 3
    (stats,) = session.drafter_stats()
    assert stats["name"] == "draft-dflash" and stats["n_gen_tokens"] == int(t.n_drafted.sum())


def _reference_blocks(log: str) -> list[list[tuple[int, float]]]:
    """Each round's block from llama-speculative-simple's debug log: (token, probability) of every slot."""
    rounds, cur = [], []
    for line in log.splitlines():
        m = re.search(r"draft candidate\s+0, pos\s+\d+:\s+(\d+) \(\s*([\d.]+)\)", line)
        if m:
            cur.append((int(m.group(1)), float(m.group(2))))
        elif re.search(r"accepted \d+/\d+ draft tokens", line):
            rounds.append(cur)
            cur = []
    return rounds


@pytest.mark.parametrize("p_min", [0.0, 0.25])
@pytest.mark.reference
@pytest.mark.train
def test_drafts_what_llama_cpp_drafts(reference_binary, bundled_model, head, p_min):
    """Every round: the same block tokens and probabilities (within 0.0015, the log's 3 decimals) as
    ``llama-speculative-simple --spec-type draft-dflash -md HEAD -lv 5``, and the same text and totals."""
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        replay_reference_budget,
        run_reference_spec,
        spec_type_args,
    )

    prompt, n_max = PROMPTS[0], 3
    flags = spec_type_args("draft-dflash", n_max, {}) + ["-md", str(head), "--spec-draft-p-min", str(p_min), "-lv", "5"]
    ref = run_reference_spec(reference_binary, bundled_model, prompt, flags, max_tokens=48, n_ctx=1024, threads=1)
    blocks = _reference_blocks(ref.log)
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=head) as s:
        ours = replay_reference_budget(s, prompt, max_tokens=48, n_max=n_max, p_min=p_min, drafter="draft-dflash")
    result = compare_with_reference(ref, ours, p_min)
    assert result["match"], result
    assert len(blocks) == ours.n_steps
    for i, block in enumerate(blocks):
        n = int(ours.n_drafted[i])
        got = [(int(a), float(p)) for a, p in zip(ours.topk_ids[i, :n, 0], ours.topk_probs[i, :n, 0])]
        assert [a for a, _ in got] == [a for a, _ in block[:n]], (i, got, block)
        assert all(abs(p - q) <= 0.0015 for (_, p), (_, q) in zip(got, block)), (i, got, block)
    assert ours.n_drafted.sum() > 0


@pytest.mark.train
def test_simulator_replays_the_block_and_says_where_it_cannot(session):
    prompt = PROMPTS[1]
    oracle = session.record_oracle(prompt, max_tokens=MAX_TOKENS, depth=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mx.ReplayApproximate)
        check_replay_exact(session, oracle, prompt, "draft-dflash", 3, MAX_TOKENS)
    # a block of 2 slots drafts other tokens than the recorded block of 3 (non-causal attention): said, not hidden
    with pytest.warns(mx.ReplayApproximate, match="mask slots"):
        mx.simulate(oracle, 2, drafter="draft-dflash")
    from test_replay import check_walk_equals_the_vectorised_path

    check_walk_equals_the_vectorised_path(oracle, "draft-dflash", ((3, 0.0, 0), (3, 0.3, 2)))


@pytest.mark.train
def test_parallel_requests_equal_each_alone(bundled_model, head):
    """Two sequences at once (a third arriving later): each request's text and drafts are those it has alone."""
    with mx.Session.open(bundled_model, n_ctx=2048, threads=1, draft_model=head) as s:
        alone = [s.generate(p, max_tokens=32, n_max=3, drafter="draft-dflash") for p in PROMPTS]
    with mx.Session.open(bundled_model, n_ctx=2048, threads=1, draft_model=head, n_parallel=2) as s:
        result = s.generate_parallel(list(PROMPTS), max_tokens=32, n_max=3, drafter="draft-dflash", arrivals=[0, 0, 4])
    for a, t in zip(alone, result.traces):
        assert t.tokens == a.tokens and np.array_equal(t.drafted, a.drafted)


def check_shipped_head(reference_binary, bundled_model, head_spec: str, spec: str, p_min: float) -> None:
    """The head that ships for ``head_spec`` (mx.draft_heads()) run as ``spec`` (alone, or after ngram-simple): text
    and drafted/accepted totals equal llama-speculative-simple's, with drafts accepted."""
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        replay_reference_budget,
        run_reference_spec,
        spec_type_args,
    )

    head = next(h.head_path for h in mx.draft_heads() if h.spec_type == head_spec)
    prompt, options = "class Stack:\n    def __init__(self):", {}
    if "ngram" in spec:
        options = {"ngram_simple_size_n": 2, "ngram_simple_size_m": 3}
    flags = spec_type_args(spec, 3, options) + ["-md", str(head), "--spec-draft-p-min", str(p_min)]
    ref = run_reference_spec(reference_binary, bundled_model, prompt, flags, max_tokens=64, n_ctx=1024, threads=1)
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=head) as s:
        ours = replay_reference_budget(s, prompt, max_tokens=64, n_max=3, p_min=p_min, drafter=spec, **options)
    result = compare_with_reference(ref, ours, p_min)
    assert result["match"], result
    assert result["ours"]["n_accept"] > 0


@pytest.mark.parametrize("spec, p_min", [("draft-dflash", 0.0), ("ngram-simple,draft-dflash", 0.5)])
@pytest.mark.reference
def test_the_shipped_head_matches_the_reference(reference_binary, bundled_model, spec, p_min):
    """The trained head: :func:`check_shipped_head` (benchmarks/parity.py --spec-type draft-dflash runs 48 such
    cases)."""
    check_shipped_head(reference_binary, bundled_model, "draft-dflash", spec, p_min)
