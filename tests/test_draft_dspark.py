"""draft-dspark in the engine: a DSpark block drafter (a ``dflash`` GGUF written by llama.cpp's DSpark converter:
DFlash with a Markov head and, optionally, a confidence head) drafts for the bundled model.

The heads here are SYNTHETIC (random weights, ``training.dspark.random_dspark_head_gguf``, converted by llama.cpp's
own converter, with and without a confidence head): these tests check that the engine drafts what llama.cpp drafts
(every block's tokens, from the reference's debug log), its totals and text, the anchor-first block clamp, the
confidence head as what p_min is compared with, and the refusal of p_min without one (llama.cpp aborts there).
The last test runs the trained head that ships (``mx.draft_heads()``) against the reference, with drafts accepted.
"""

from __future__ import annotations

import pytest
from conftest import check_accounting
from test_draft_dflash import _reference_blocks, check_shipped_head

import mtp_explorer as mx

PROMPT = "def fib(n):"


@pytest.fixture(scope="module", params=[True, False], ids=["confidence-head", "no-confidence-head"])
def head(request, tmp_path_factory):
    import torch

    from training import dspark

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("dspark-engine")
    return dspark.random_dspark_head_gguf(work / "dspark.gguf", work, confidence_head=request.param), request.param


@pytest.mark.train
def test_the_session_knows_its_head_and_clamps_to_the_block(bundled_model, head):
    path, _ = head
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=path) as s:
        assert s.draft_kind == "dspark_head"
        plain = s.generate(PROMPT, max_tokens=32, n_max=0)
        t = s.generate(PROMPT, max_tokens=32, n_max=8, drafter="draft-dspark")
        check_accounting(t)
        assert t.tokens == plain.tokens
        # anchor-first: the whole block of 4 drafts (llama.cpp clamps n_max to block_size, not block_size - 1)
        assert t.n_drafted.max() == s.engine.draft_block_limit == 4
        with pytest.raises(mx.ParameterError, match="DSpark head"):
            s.generate(PROMPT, max_tokens=8, n_max=2, drafter="draft-dflash")


@pytest.mark.parametrize("p_min", [0.0, 0.3])
@pytest.mark.reference
@pytest.mark.train
def test_drafts_what_llama_cpp_drafts(reference_binary, bundled_model, head, p_min):
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        replay_reference_budget,
        run_reference_spec,
        spec_type_args,
    )

    path, confidence = head
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=path) as s:
        if p_min > 0 and not confidence:  # llama.cpp throws (the process aborts); here a ParameterError says why
            with pytest.raises(mx.ParameterError, match="no confidence head"):
                s.generate(PROMPT, max_tokens=8, n_max=4, p_min=p_min, drafter="draft-dspark")
            return
        ours = replay_reference_budget(s, PROMPT, max_tokens=48, n_max=4, p_min=p_min, drafter="draft-dspark")
    flags = spec_type_args("draft-dspark", 4, {}) + ["-md", str(path), "--spec-draft-p-min", str(p_min), "-lv", "5"]
    ref = run_reference_spec(reference_binary, bundled_model, PROMPT, flags, max_tokens=48, n_ctx=1024, threads=1)
    result = compare_with_reference(ref, ours, p_min)
    assert result["match"], result
    blocks = _reference_blocks(ref.log)
    assert len(blocks) == ours.n_steps and ours.n_drafted.sum() > 0
    for i, block in enumerate(blocks):
        n = int(ours.n_drafted[i])
        assert ours.drafted[i, :n].tolist() == [a for a, _ in block[:n]], (i, block)
    if p_min > 0:  # the confidence head, not the token's probability, cut the drafts
        drafted = ours.n_drafted > 0
        assert (ours.draft_prob[drafted][:, 0] >= p_min).all() and ours.n_drafted.sum() < 4 * ours.n_steps


@pytest.mark.train
def test_simulator_replays_the_block(bundled_model, head):
    from conftest import check_replay_exact

    path, _ = head
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=path) as s:
        oracle = s.record_oracle(PROMPT, max_tokens=32, depth=4)
        check_replay_exact(s, oracle, PROMPT, "draft-dspark", 4, 32)
        with pytest.warns(mx.ReplayApproximate, match="mask slots"):
            mx.simulate(oracle, 2, drafter="draft-dspark")


@pytest.mark.parametrize(
    "spec, p_min", [("draft-dspark", 0.0), ("draft-dspark", 0.5), ("ngram-simple,draft-dspark", 0.5)]
)
@pytest.mark.reference
def test_the_shipped_head_matches_the_reference(reference_binary, bundled_model, spec, p_min):
    """The trained head: text and drafted/accepted totals equal llama-speculative-simple's, with drafts accepted, at
    p_min 0 and at 0.5, where its confidence head decides (:func:`check_shipped_head`; benchmarks/parity.py
    --spec-type draft-dspark runs 48 such cases)."""
    check_shipped_head(reference_binary, bundled_model, "draft-dspark", spec, p_min)
