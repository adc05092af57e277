"""The EAGLE-3 draft head shipped beside the bundled model (mtp_explorer/models/pystdlib-eagle3.gguf, made by
``python -m training.eagle3``) works as llama.cpp's ``draft-eagle3`` draft for it.

* the file is an ``eagle3`` GGUF with 3 target layers, the target's hidden size and vocabulary, no token embeddings
  or output head of its own (llama.cpp borrows the target's), at most 3 MB;
* the real ``llama-speculative-simple -md pystdlib-eagle3.gguf --spec-type draft-eagle3`` run prints the target's
  plain greedy text (llama-cpp-python, no drafting) and its drafts are accepted (counted from the debug log, as
  ``training.draft.draft_rounds`` explains: the binary's own ``accept`` line is 100% for this recurrent target);
* llama.cpp's eagle3 graph computes what the PyTorch head computes: the first draft after a prompt (seed row plus
  two chained rows) has the same tokens and, within 0.01, the same top-10-renormalised probabilities;
* the shipped head weights (``training/eagle3-head.pt``) converted again by llama.cpp's ``convert_hf_to_gguf.py``
  give the shipped GGUF bit for bit: the matrices are stored F16 in the .pt (the values the F16 GGUF holds, so the
  converter's F32 -> F16 cast is exact), the norms F32 as in the GGUF.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from training import eagle3 as E

pytestmark = pytest.mark.train

PROMPTS = ("def fib(n):", "class Point:\n    def __init__(self, x, y):\n", "import os\n\n\ndef walk(top):\n")
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def head_path():
    assert E.SHIPPED_GGUF.is_file(), f"{E.SHIPPED_GGUF} is missing (python -m training.eagle3 --install makes it)"
    return E.SHIPPED_GGUF


def _field(reader, key):
    return reader.fields[key].contents()


def test_file_is_an_eagle3_head_for_the_target(head_path, bundled_model):
    assert head_path.stat().st_size <= 3_000_000
    r, t = gguf.GGUFReader(str(head_path)), gguf.GGUFReader(str(bundled_model))
    assert _field(r, "general.architecture") == "eagle3"
    layers = list(_field(r, "eagle3.target_layers"))
    n_layer = _field(t, "qwen35.block_count") - _field(t, "qwen35.nextn_predict_layers")
    # a layer input (0..n_layer-1) or n_layer: the target's final state (llama.cpp's h_nextn path)
    assert len(layers) == 3 and all(0 <= i <= n_layer for i in layers), layers
    n_embd = _field(t, "qwen35.embedding_length")
    assert _field(r, "eagle3.target_hidden_size") == n_embd == _field(r, "eagle3.embedding_length")
    assert _field(r, "eagle3.block_count") == 1
    names = {x.name for x in r.tensors}
    assert "fc.weight" in names and not names & {"token_embd.weight", "output.weight", "d2t"}
    assert list(_field(r, "tokenizer.ggml.tokens")) == list(_field(t, "tokenizer.ggml.tokens"))
    assert list(_field(r, "tokenizer.ggml.merges")) == list(_field(t, "tokenizer.ggml.merges"))
    assert _field(r, "tokenizer.ggml.pre") == _field(t, "tokenizer.ggml.pre")


def test_the_package_lists_the_head_with_its_target(head_path, bundled_model):
    import mtp_explorer as mx

    heads = {h.spec_type: h for h in mx.draft_heads()}
    assert heads["draft-eagle3"].head_path == head_path and heads["draft-eagle3"].target_path == bundled_model
    assert heads["draft-simple"].head_path == mx.draft_model_path()


def test_parse_rounds_by_depth():
    log = "\n".join(
        [
            "D accepted 3/3 draft tokens, the last target token is: (5)",
            "D partial acceptance: 1 < 3, restoring checkpoint",
            "D accepted 2/2 draft tokens, the last target token is: (7)",  # the re-verification: not a draft round
            "D accepted 0/0 draft tokens, the last target token is: (8)",  # no draft: not a round
            "D partial acceptance: 0 < 3, restoring checkpoint",
            "D accepted 1/1 draft tokens, the last target token is: (9)",
        ]
    )
    r = E.parse_rounds(log)
    assert (r.drafted, r.accepted, r.rounds) == (9, 4, 3)
    assert r.by_depth == [2, 1, 1] and r.drafted_at == [3, 3, 3]


@pytest.mark.reference
def test_speculative_simple_accepts_drafts_and_gives_the_plain_greedy_text(head_path, bundled_model, reference_binary):
    from training.draft import greedy_pieces
    from training.llama_ref import LlamaMTP

    with LlamaMTP(bundled_model, n_ctx=1024, n_threads=1) as m:
        plain = [greedy_pieces(m, p, MAX_TOKENS + 8) for p in PROMPTS]
    drafted = accepted = 0
    for prompt, text in zip(PROMPTS, plain):
        r = E.run_spec(
            prompt,
            "draft-eagle3",
            head=head_path,
            n_max=3,
            max_tokens=MAX_TOKENS,
            target=bundled_model,
            binary=reference_binary,
        )
        assert r is not None, "the reference binary lost the end of its log 8 times"
        assert r.generated >= MAX_TOKENS
        assert r.text and text.startswith(r.text), (prompt, r.text, text)
        drafted, accepted = drafted + r.drafted, accepted + r.accepted
    assert drafted > 0 and accepted > 0, (accepted, drafted)
    assert accepted / drafted > 0.2, (accepted, drafted)


@pytest.fixture(scope="module")
def twin():
    torch.set_num_threads(1)
    head, _ = E.load_head(E.SHIPPED_HEAD)
    return head, E.Target(E.TARGET, head.cfg.target_layer_ids)


@pytest.mark.reference
def test_llama_cpp_drafts_what_the_pytorch_head_drafts(head_path, bundled_model, reference_binary, twin):
    import subprocess

    from training.llama_ref import LlamaMTP

    head, target = twin
    with LlamaMTP(bundled_model, n_ctx=256, n_threads=1) as m:
        ids = [m.tokenize(p) for p in PROMPTS]
    for prompt, x in zip(PROMPTS, ids):
        cmd = [
            str(reference_binary),
            "-m",
            str(bundled_model),
            "-md",
            str(head_path),
            "--spec-type",
            "draft-eagle3",
            "--spec-draft-n-max",
            "3",
            "-p",
            prompt,
            "-n",
            "4",
            "-c",
            "256",
            "-t",
            "1",
            "--temp",
            "0",
            "--seed",
            "0",
            "-lv",
            "5",
        ]
        for _ in range(8):  # the debug log is written by a thread that can lose its tail at exit
            logged = E.logged_first_draft(
                subprocess.run(cmd, capture_output=True, timeout=120).stderr.decode("utf-8", errors="replace")
            )
            if len(logged) == 3:
                break
        ours = E.first_draft(head, target, x, 3)
        assert [t for t, _ in logged] == [t for t, _ in ours], (prompt, logged, ours)
        assert np.allclose([p for _, p in logged], [p for _, p in ours], atol=1e-2), (prompt, logged, ours)


def test_shipped_weights_convert_to_the_shipped_file(head_path, tmp_path):
    from mtp_explorer.devtools.hf_export import diff_gguf

    obj = torch.load(E.SHIPPED_HEAD, map_location="cpu", weights_only=True)
    assert E.SHIPPED_HEAD.stat().st_size <= 3_000_000
    assert {v.dtype for k, v in obj["weights"].items() if v.ndim >= 2} == {torch.float16}
    head, meta = E.load_head(E.SHIPPED_HEAD)
    out = E.convert_head(head, tmp_path / "again.gguf", tmp_path, description=E.describe_training(meta))
    diff = diff_gguf(head_path, out)
    assert not diff, str(diff)
    r = gguf.GGUFReader(str(out))
    assert {x.tensor_type.name for x in r.tensors if len(x.shape) >= 2} == {"F16"}
