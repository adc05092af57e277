"""The tiny draft model shipped beside the bundled model (mtp_explorer/models/pystdlib-draft.gguf, made by
``python -m training.draft``) works as llama.cpp's ``draft-simple`` draft for it.

* the file is small and llama.cpp accepts its vocabulary as the target's (``common_speculative_are_compatible``);
* it loads in llama.cpp (llama-cpp-python) and computes what its PyTorch twin computes: the ``Qwen3ForCausalLM``
  rebuilt from the GGUF (``training.draft.model_from_gguf``, F16 weights widened exactly), run in F32, against
  llama.cpp with an F32 KV cache (max |logit difference| <= 2e-2, measured 5.2e-3) and with its default F16 cache
  (>= 99% equal top-1 tokens, measured 100%; max difference 8.4e-3);
* the real ``llama-speculative-simple -md pystdlib-draft.gguf --spec-type draft-simple`` run gives the target's
  plain greedy text, and the draft's tokens are really accepted (counted from the debug log: see
  ``training.draft.draft_rounds`` for why the binary's own ``accept`` line says 100% for this target).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import heldout_sequences

from training import draft as D
from training.tokenizer import vocab_from_gguf

pytestmark = pytest.mark.train

SEQ = 128
N_SEQ = 4
PROMPTS = ("def fib(n):", "class Point:\n    def __init__(self, x, y):\n", "import os\n\n\ndef walk(top):\n")


@pytest.fixture(scope="module")
def draft_path():
    assert D.DEFAULT_GGUF.is_file(), f"{D.DEFAULT_GGUF} is missing (python -m training.draft makes it)"
    return D.DEFAULT_GGUF


@pytest.fixture(scope="module")
def sequences(bundled_model):
    """Held-out token sequences, tokenized by llama.cpp with the target's vocabulary."""
    from training.llama_ref import LlamaMTP

    with LlamaMTP(bundled_model, n_ctx=SEQ) as m:
        return heldout_sequences(m, SEQ, N_SEQ)


def _llama_logits(path, seqs, *, f32_cache: bool) -> list[np.ndarray]:
    import llama_cpp

    kw = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_cache else {}
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=SEQ, n_batch=SEQ, n_threads=1, logits_all=True, verbose=False, **kw
    )
    out = []
    try:
        for ids in seqs:
            llm.reset()
            llm.eval(ids)
            out.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
    finally:
        llm.close()
    return out


def test_file_is_small(draft_path):
    assert draft_path.stat().st_size < 5_000_000


def test_vocabulary_is_the_targets(draft_path, bundled_model):
    tgt, dft = vocab_from_gguf(bundled_model), vocab_from_gguf(draft_path)
    assert dft.tokens == tgt.tokens
    assert dft.token_types == tgt.token_types
    assert dft.merges == tgt.merges
    assert (dft.eos_id, dft.pre) == (tgt.eos_id, tgt.pre)
    assert D.compatibility_problems(bundled_model, draft_path) == []


def test_compatibility_check_finds_a_different_vocabulary(draft_path, model_mixed):
    """The check is not vacuous: the synthetic models have another vocabulary."""
    assert D.compatibility_problems(model_mixed, draft_path)


@pytest.fixture(scope="module")
def twin(draft_path):
    torch.set_num_threads(1)
    return D.model_from_gguf(draft_path)


@torch.no_grad()
def _twin_logits(model, ids) -> np.ndarray:
    return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def test_logits_match_pytorch_twin(draft_path, twin, sequences):
    worst = 0.0
    for ids, logits in zip(sequences, _llama_logits(draft_path, sequences, f32_cache=True)):
        worst = max(worst, float(np.abs(_twin_logits(twin, ids) - logits).max()))
    assert worst <= 2e-2, worst


def test_greedy_next_token_agrees_with_pytorch_twin(draft_path, twin, sequences):
    agree = n = 0
    for ids, logits in zip(sequences, _llama_logits(draft_path, sequences, f32_cache=False)):
        agree += int((_twin_logits(twin, ids).argmax(-1) == logits.argmax(-1)).sum())
        n += len(ids)
    assert agree / n >= 0.99, agree / n


def test_draft_rounds_counts_first_verifications():
    log = "\n".join(
        [
            "D accepted 2/2 draft tokens, the last target token is: (5)",
            "D partial acceptance: 1 < 3, restoring checkpoint",
            "D accepted 2/2 draft tokens, the last target token is: (7)",  # the re-verification: not a draft round
            "D accepted 0/0 draft tokens, the last target token is: (8)",  # no draft: not a round
            "D partial acceptance: 0 < 3, restoring checkpoint",
            "D accepted 1/1 draft tokens, the last target token is: (9)",
        ]
    )
    r = D.draft_rounds(log)
    assert (r.drafted, r.accepted, r.rounds, r.partial) == (8, 3, 3, 2)


@pytest.mark.reference
def test_speculative_simple_gives_the_plain_greedy_text(draft_path, bundled_model, reference_binary):
    from training.llama_ref import LlamaMTP

    with LlamaMTP(bundled_model, n_ctx=1024, n_threads=1) as m:
        plain = [D.greedy_pieces(m, p, 72) for p in PROMPTS]
    drafted = accepted = 0
    for prompt, text in zip(PROMPTS, plain):
        r = D.run_draft_simple(draft_path, bundled_model, prompt, 3, max_tokens=64)
        assert r is not None, "the reference binary lost the end of its log 8 times"
        assert r.generated >= 64
        assert r.text and text.startswith(r.text), (prompt, r.text, text)
        drafted, accepted = drafted + r.drafted, accepted + r.accepted
    assert drafted > 0 and accepted / drafted > 0.2, (accepted, drafted)


@pytest.mark.reference
def test_rounds_match_independent_simulation(draft_path, bundled_model, reference_binary):
    """The draft rounds read from the binary's log are what a simulation with llama-cpp-python predicts."""
    from training.llama_ref import LlamaMTP

    prompt, n_max = PROMPTS[1], 3
    with LlamaMTP(bundled_model, n_ctx=1024, n_threads=1) as m:
        ids = m.tokenize(prompt)
        plain = m.greedy(ids, 64 + 2 * n_max + 2)
    dg = D.DraftGreedy(draft_path)
    try:
        sim = D.simulate_draft_simple(dg, ids, plain, n_max, 64)
    finally:
        dg.close()
    r = D.run_draft_simple(draft_path, bundled_model, prompt, n_max, max_tokens=64)
    assert r is not None, "the reference binary lost the end of its log 8 times"
    assert (r.drafted, r.accepted, r.rounds, r.generated) == (sim.drafted, sim.accepted, sim.rounds, sim.generated)
    # the binary's own totals count a partially accepted round as its re-verification: A + 1 drafted, A + 1 accepted
    assert r.reported_drafted == r.reported_accepted == r.accepted + r.partial


def test_the_continuation_loss_is_taken_on_the_targets_new_tokens_only(twin, tmp_path):
    """Fine-tuning on a target's continuations (``--continuations``) trains the draft on the target's greedy choices:
    the loss covers the new tokens alone, each predicted from the row before it; the last rows are held out, the
    steps' draws are reproducible, and the held-out top-1 agreement is the share of new tokens the draft predicts."""
    rng = np.random.default_rng(0)
    rows = rng.integers(5, 4000, size=(D.CONTINUATION_HELDOUT + 6, 12)).astype(np.uint16)
    np.savez(tmp_path / "c.npz", rows=rows, start=np.int64(8), source=np.str_("test"))
    trained, held, start = D.continuation_rows(tmp_path / "c.npz")
    assert start == 8 and len(trained) == 6 and np.array_equal(held, rows[-D.CONTINUATION_HELDOUT :])
    assert torch.equal(D.continuations_at(trained, 3, 7), D.continuations_at(trained, 3, 7))
    assert D.continuations_at(trained, 3, 7).shape == (D.CONTINUATION_BATCH, 12)
    x = torch.from_numpy(trained[:2])
    with torch.no_grad():
        logits = twin(input_ids=x).logits.float()
        loss = D.continuation_ce(twin, x, start)
        by_hand = torch.nn.functional.cross_entropy(logits[:, 7:11].reshape(-1, logits.shape[-1]), x[:, 8:].reshape(-1))
        assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
        whole = D.next_token_ce(twin, x)
        assert whole.item() != pytest.approx(loss.item(), rel=1e-3)  # the prompt's tokens are not targets
        fake = x.clone()  # a "target" whose every new token is the draft's greedy choice: full agreement
        for t in range(start, fake.shape[1]):
            fake[:, t] = twin(input_ids=fake[:, :t]).logits[:, -1].argmax(-1)
    assert D.continuation_top1(twin, fake.numpy(), start) == pytest.approx(1.0)
    assert D.continuation_top1(twin, x.numpy(), start) < 0.5  # random tokens: hardly ever its choice
