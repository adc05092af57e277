"""A DFlash draft head (``training/dflash.py``) in the layout llama.cpp's ``draft-dflash`` reads, for the bundled
target.  The head here is SYNTHETIC (random weights, :func:`training.dflash.random_head`): these tests check the
layout, the conversion and that the PyTorch head computes what llama.cpp's ``dflash`` graph computes, not the
quality of a trained head.

* llama.cpp's own ``convert_hf_to_gguf.py --target-model-dir`` turns the ``DFlashDraftModel`` checkpoint into a
  ``dflash`` GGUF with the target's hidden size and vocabulary, ``target_layers`` = the HF ids + 1 (layer inputs),
  ``block_size``, the mask token, no token embeddings or output head of its own (borrowed from the target), at most
  3 MB;
* the teacher-forced training path (:meth:`DFlashDraftModel.window`, many anchors per window) gives the same block
  logits as the inference path (:func:`training.dflash.first_draft`, one prompt);
* the real ``llama-speculative-simple --spec-type draft-dflash`` run loads it, drafts, and prints the target's plain
  greedy text, and its first block draft after a prompt has the PyTorch head's tokens and, within 0.01, its
  top-10-renormalised probabilities.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from training import dflash as D

pytestmark = pytest.mark.train

PROMPTS = ("def fib(n):", "class Point:\n    def __init__(self, x, y):\n", "import os\n\n\ndef walk(top):\n")
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def head():
    torch.set_num_threads(1)
    return D.random_head(seed=0)


@pytest.fixture(scope="module")
def head_gguf(head, tmp_path_factory):
    work = tmp_path_factory.mktemp("dflash")
    h, _ = D.load_head(D.save_head(work / "head.pt", head, {"synthetic": True}))  # the F16-rounded matrices
    return D.convert_head(h, work / "random-dflash.gguf", work, name="SYNTHETIC-random-dflash"), h


@pytest.fixture(scope="module")
def target(head):
    return D.make_target(head.cfg)


def _field(reader, key):
    return reader.fields[key].contents()


def test_file_is_a_dflash_head_for_the_target(head_gguf, bundled_model):
    path, head = head_gguf
    assert path.stat().st_size <= 3_000_000
    r, t = gguf.GGUFReader(str(path)), gguf.GGUFReader(str(bundled_model))
    assert _field(r, "general.architecture") == "dflash"
    assert list(_field(r, "dflash.target_layers")) == [i + 1 for i in head.cfg.target_layer_ids] == [1, 2, 3]
    n_layer = _field(t, "qwen35.block_count") - _field(t, "qwen35.nextn_predict_layers")
    assert all(1 <= i < n_layer for i in _field(r, "dflash.target_layers"))  # layer inputs llama.cpp extracts
    assert _field(r, "dflash.block_size") == head.cfg.block_size == 4
    assert _field(r, "dflash.embedding_length") == _field(t, "qwen35.embedding_length")
    assert _field(r, "dflash.block_count") == head.cfg.num_hidden_layers
    assert _field(r, "tokenizer.ggml.mask_token_id") == head.cfg.mask_token_id
    assert "dflash.attention.causal" not in r.fields  # non-causal block attention
    names = {x.name for x in r.tensors}
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight"} <= names
    assert not names & {"token_embd.weight", "output.weight", "d2t"}
    assert list(_field(r, "tokenizer.ggml.tokens")) == list(_field(t, "tokenizer.ggml.tokens"))
    assert {x.tensor_type.name for x in r.tensors if len(x.shape) >= 2} == {"F16"}


def test_training_windows_compute_what_the_drafter_computes(head, target):
    """Block logits of anchors in a teacher-forced window == a fresh first draft on the window's prefix."""
    from training.llama_ref import LlamaMTP

    with LlamaMTP(D.TARGET, n_ctx=256, n_threads=1) as m:
        ids = m.tokenize("import os\n\n\ndef walk(top):\n    for name in os.listdir(top):\n")
    x = torch.tensor([ids])
    s = head.cfg.block_size
    anchors = torch.tensor([[1, 5, len(ids) - s + 1]])
    with torch.no_grad():
        feats, _, _ = target(x)
        h = head.window(feats, x, anchors, target.embed)
        for j, a in enumerate(anchors[0].tolist()):
            logits = head.logits(h[0, j, 1:], target.lm_head)
            ours = [(int(r.argmax()), float(torch.softmax(torch.topk(r, 10).values, -1)[0])) for r in logits]
            fresh = D.first_draft(head, target, ids[: a + 1], s - 1)
            assert [t for t, _ in ours] == [t for t, _ in fresh]
            assert np.allclose([p for _, p in ours], [p for _, p in fresh], atol=1e-5)
            # the block does not see context rows at or after its anchor
            h2 = head.window(feats[:, :a], x[:, : a + 1], torch.tensor([[a]]), target.embed)
            # float32 rounding of other matrix shapes moves it by up to 2e-5 on an AVX-512 CPU; a leak would be O(1)
            assert torch.allclose(h2[0, 0], h[0, j], atol=1e-4)


@pytest.mark.reference
def test_speculative_simple_runs_the_head_and_gives_the_plain_greedy_text(head_gguf, bundled_model, reference_binary):
    from training.draft import greedy_pieces
    from training.llama_ref import LlamaMTP

    path, _ = head_gguf
    with LlamaMTP(bundled_model, n_ctx=1024, n_threads=1) as m:
        plain = [greedy_pieces(m, p, MAX_TOKENS + 8) for p in PROMPTS]
    for prompt, text in zip(PROMPTS, plain):
        r = D.E.run_spec(
            prompt,
            "draft-dflash",
            head=path,
            n_max=3,
            max_tokens=MAX_TOKENS,
            target=bundled_model,
            binary=reference_binary,
        )
        assert r is not None, "the reference binary lost the end of its log 8 times"
        assert r.generated >= MAX_TOKENS and r.drafted > 0
        assert r.text and text.startswith(r.text), (prompt, r.text, text)


@pytest.mark.reference
def test_llama_cpp_drafts_what_the_pytorch_head_drafts(head_gguf, bundled_model, reference_binary, target):
    from training.llama_ref import LlamaMTP

    path, head = head_gguf
    with LlamaMTP(bundled_model, n_ctx=256, n_threads=1) as m:
        ids = [m.tokenize(p) for p in PROMPTS]
    n = head.cfg.block_size - 1
    for prompt, x in zip(PROMPTS, ids):
        logged, _ = D.run_first_draft(path, prompt, n, binary=reference_binary, target=bundled_model)
        assert len(logged) == n, (prompt, logged)
        ours = D.first_draft(head, target, x, n)
        assert [t for t, _ in logged] == [t for t, _ in ours], (prompt, logged, ours)
        assert np.allclose([p for _, p in logged], [p for _, p in ours], atol=1e-2), (prompt, logged, ours)


def test_the_shipped_head_converts_again_and_drafts_for_its_target():
    """The shipped head (``mtp_explorer/models/pystdlib-dflash.gguf``, listed by ``mx.draft_heads()``, at most 3 MB)
    is what llama.cpp's converter makes of the shipped weights (``training/dflash-head.pt``, the GGUF's F16 values),
    byte for byte; the engine drafts with it and its first slot is accepted often (a trained head, not a random one)."""
    import tempfile
    from pathlib import Path

    import mtp_explorer as mx

    assert D.SHIPPED_GGUF.stat().st_size <= 3_000_000 and D.SHIPPED_HEAD.stat().st_size <= 3_000_000
    heads = {h.spec_type: h for h in mx.draft_heads()}
    assert heads["draft-dflash"].head_path == D.SHIPPED_GGUF
    head, meta = D.load_head(D.SHIPPED_HEAD)
    with tempfile.TemporaryDirectory() as tmp:
        again = D.convert_head(head, Path(tmp) / "again.gguf", Path(tmp), description=D.describe_training(meta))
        assert again.read_bytes() == D.SHIPPED_GGUF.read_bytes()
    with mx.Session.open(heads["draft-dflash"].target_path, n_ctx=1024, threads=1, draft_model=D.SHIPPED_GGUF) as s:
        traces = [s.generate(p, max_tokens=48, n_max=1, drafter="draft-dflash") for p in PROMPTS]
    drafted = sum(int(t.n_drafted.sum()) for t in traces)
    assert drafted > 0 and sum(int(t.n_accepted.sum()) for t in traces) / drafted > 0.5
