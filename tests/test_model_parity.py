"""The exported GGUF computes what the PyTorch model computes (trunk and MTP head).

The chained drafts the training scores (``DemoModel.mtp_chain``) are checked against llama.cpp's
MTP context fed its own ``h_nextn``, as the draft-mtp loop feeds it.

The PyTorch model is rebuilt from the shipped GGUF (``training.export.model_from_gguf``, the
exact inverse of the exporter), so no training checkpoint is needed: an F32 re-export run with an
F32 KV cache must match llama.cpp to 2e-3 in every logit (measured: ~4e-5 trunk, ~2e-5 MTP), and
the shipped F16 file, run with llama.cpp's default settings (F16 KV cache), must agree on >= 99.5%
of top-1 tokens (measured: 99.9% trunk, 100% MTP).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import heldout_sequences

from training import llama_ref
from training.export import export_model, model_from_gguf
from training.tokenizer import vocab_from_gguf

pytestmark = pytest.mark.train

SEQ = 256
N_SEQ = 6
TOL_F32 = 2e-3


@pytest.fixture(scope="module")
def model_path(bundled_model) -> Path:
    return bundled_model


@pytest.fixture(scope="module")
def torch_model(model_path):
    torch.set_num_threads(2)
    return model_from_gguf(model_path)


@pytest.fixture(scope="module")
def sequences(model_path):
    """Held-out token sequences (tokenized by llama.cpp), from evenly spread held-out files."""
    with llama_ref.LlamaMTP(model_path, n_ctx=SEQ) as m:
        return heldout_sequences(m, SEQ, N_SEQ)


def _llama_outputs(path: Path, seqs, f32_cache: bool = False):
    out = []
    with llama_ref.LlamaMTP(path, n_ctx=SEQ, f32_cache=f32_cache) as m:
        for ids in seqs:
            logits, h = m.sequence_states(ids)
            h_prev = np.concatenate([np.zeros((1, m.n_embd), np.float32), h[:-1]])
            mtp_logits, _ = m.mtp(ids, h_prev, 0)
            out.append((logits, h, h_prev, mtp_logits))
    return out


@torch.no_grad()
def _torch_outputs(model, ids, h_prev):
    x = torch.tensor([ids])
    h = model.trunk_hidden(x)
    logits = model.logits(h)[0].numpy()
    mtp_logits = model.logits(model.mtp_hidden(x, torch.from_numpy(h_prev)[None]))[0].numpy()
    return logits, h[0].numpy(), mtp_logits


@pytest.fixture(scope="module")
def f32(tmp_path_factory, model_path, torch_model) -> Path:
    """The PyTorch model exported again with F32 weights."""
    return export_model(
        torch_model, vocab_from_gguf(model_path), tmp_path_factory.mktemp("f32") / "model-f32.gguf", dtype="f32"
    )


def test_f32_export_matches_pytorch(f32, torch_model, sequences):
    worst_trunk = worst_mtp = 0.0
    # F32 weights *and* an F32 KV cache: llama.cpp's default F16 cache alone moves logits by ~1e-2.
    for ids, (logits, h, h_prev, mtp_logits) in zip(sequences, _llama_outputs(f32, sequences, f32_cache=True)):
        t_logits, t_h, t_mtp = _torch_outputs(torch_model, ids, h_prev)
        worst_trunk = max(worst_trunk, float(np.abs(t_logits - logits).max()))
        # MTP head given the same hidden state (llama.cpp's h_nextn rows) and the same tokens
        worst_mtp = max(worst_mtp, float(np.abs(t_mtp - mtp_logits).max()))
        assert np.abs(t_h - h).max() < TOL_F32
    assert worst_trunk <= TOL_F32, worst_trunk
    assert worst_mtp <= TOL_F32, worst_mtp


def test_shipped_file_top1_agreement(model_path, torch_model, sequences):
    agree_t = agree_m = n = 0
    for ids, (logits, _, h_prev, mtp_logits) in zip(sequences, _llama_outputs(model_path, sequences)):
        t_logits, _, t_mtp = _torch_outputs(torch_model, ids, h_prev)
        agree_t += int((t_logits.argmax(-1) == logits.argmax(-1)).sum())
        agree_m += int((t_mtp.argmax(-1) == mtp_logits.argmax(-1)).sum())
        n += len(ids)
    assert agree_t / n >= 0.995, agree_t / n
    assert agree_m / n >= 0.995, agree_m / n


def test_chained_drafts_match_llama_cpp(f32, torch_model, sequences):
    """Depths 1..4 of a draft round: llama.cpp's MTP context with real rows 0..q-1, the first draft row, then each fed
    the previous row's ``h_nextn`` (tokens teacher-forced), equals ``mtp_chain`` at the same starts."""
    ids = sequences[0]
    starts = [1, 40, 127, 250]
    depth = 4
    worst = 0.0
    with llama_ref.LlamaMTP(f32, n_ctx=SEQ, f32_cache=True) as m:
        _, h = m.sequence_states(ids)
        h_prev = np.concatenate([np.zeros((1, m.n_embd), np.float32), h[:-1]])
        want = []
        for q in starts:
            m.mtp_seq_rm(0)
            # llama.cpp catches the MTP context up, then drafts from a batch of one row per sequence.
            # (A batch whose last row is its only output would hand back row 0's h_nextn: graph_mtp sets
            # t_h_nextn before selecting the output rows.)
            m.mtp(ids[:q], h_prev[:q], 0, outputs=[q - 1])
            lg, hq = m.mtp([ids[q]], h_prev[q : q + 1], q)
            rows = [lg[0]]
            for d in range(2, depth + 1):
                lg, hq = m.mtp([ids[q + d - 1]], hq, q + d - 1)
                rows.append(lg[0])
            want.append(rows)
    with torch.no_grad():
        outs, _ = torch_model.mtp_chain(
            torch.tensor([ids]), torch.from_numpy(h)[None], depth, starts=torch.tensor(starts)
        )
        got = [
            [torch_model.logits(outs[0][0, q]).numpy()]
            + [torch_model.logits(outs[d][0, i]).numpy() for d in range(1, depth)]
            for i, q in enumerate(starts)
        ]
    for rows_want, rows_got in zip(want, got):
        for a, b in zip(rows_want, rows_got):
            worst = max(worst, float(np.abs(a - b).max()))
    assert worst <= TOL_F32, worst
