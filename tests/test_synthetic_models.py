"""Synthetic qwen35+MTP GGUF files: metadata as configured, loadable by llama.cpp, knobs work."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_explorer.models.gguf_qwen35 import Qwen35Config, expected_tensor_shapes, read_qwen35_metadata
from mtp_explorer.models.synthetic import synthetic_config, synthetic_vocab, write_synthetic_qwen35
from training import llama_ref

PROMPTS = ["def main():\n    return 1\n", "import os\n", "class A:\n    pass\n"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    return {
        "perfect": write_synthetic_qwen35(d / "perfect.gguf", context_mix=0.0, mtp_fidelity=1.0),
        "partial": write_synthetic_qwen35(d / "partial.gguf", context_mix=0.6, mtp_fidelity=1.0),
        "random": write_synthetic_qwen35(d / "random.gguf", context_mix=0.0, mtp_fidelity=0.0),
        "f16": write_synthetic_qwen35(d / "f16.gguf", context_mix=0.0, mtp_fidelity=1.0, dtype="f16"),
    }


def test_write_is_small(tmp_path):
    path = write_synthetic_qwen35(tmp_path / "m.gguf", seed=3, context_mix=0.5, mtp_fidelity=0.7)
    assert path.stat().st_size < 2 * 1024 * 1024


def test_deterministic(tmp_path):
    a = write_synthetic_qwen35(tmp_path / "a.gguf", seed=7).read_bytes()
    b = write_synthetic_qwen35(tmp_path / "b.gguf", seed=7).read_bytes()
    c = write_synthetic_qwen35(tmp_path / "c.gguf", seed=8).read_bytes()
    assert a == b and a != c


def test_metadata(files):
    cfg = synthetic_config()
    md = read_qwen35_metadata(files["partial"])
    assert md["general.architecture"] == "qwen35"
    assert md["qwen35.block_count"] == cfg.n_layer + 1
    assert md["qwen35.nextn_predict_layers"] == 1
    assert md["qwen35.embedding_length"] == cfg.n_embd
    assert md["qwen35.feed_forward_length"] == cfg.n_ff
    assert md["qwen35.attention.head_count"] == cfg.n_head
    assert md["qwen35.attention.head_count_kv"] == cfg.n_head_kv
    assert md["qwen35.attention.key_length"] == cfg.head_dim
    assert md["qwen35.full_attention_interval"] == 4
    assert md["qwen35.ssm.inner_size"] == cfg.ssm_inner_size
    assert md["qwen35.ssm.state_size"] == cfg.ssm_state_size
    assert md["qwen35.ssm.group_count"] == cfg.ssm_group_count
    assert md["qwen35.ssm.time_step_rank"] == cfg.ssm_time_step_rank
    assert md["qwen35.ssm.conv_kernel"] == cfg.ssm_conv_kernel
    assert md["qwen35.rope.dimension_count"] == cfg.n_rot
    assert list(md["qwen35.rope.dimension_sections"]) == list(cfg.sections)
    assert sum(cfg.sections) == cfg.n_rot // 2
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert md["tokenizer.ggml.pre"] == "gpt-2"
    assert md["tokenizer.ggml.tokens.count"] == cfg.n_vocab
    assert md["tokenizer.ggml.eos_token_id"] == cfg.n_vocab - 1
    assert md["mtp_explorer.synthetic"] is True
    assert md["mtp_explorer.context_mix"] == pytest.approx(0.6)
    assert md["mtp_explorer.mtp_fidelity"] == pytest.approx(1.0)


def test_tensor_names_and_shapes(files):
    import gguf

    cfg = synthetic_config()
    reader = gguf.GGUFReader(str(files["f16"]))
    found = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    types = {t.name: t.tensor_type for t in reader.tensors}
    for name, (shape, required) in expected_tensor_shapes(cfg).items():
        if required:
            assert found[name] == shape, name
    assert "blk.4.nextn.eh_proj.weight" in found
    assert types["blk.0.ssm_a"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.F16


def test_config_validation():
    with pytest.raises(ValueError):
        Qwen35Config(n_vocab=300, n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=3, head_dim=16)
    with pytest.raises(ValueError):
        Qwen35Config(
            n_vocab=300, n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, nextn_predict_layers=2
        )
    assert len(synthetic_vocab(300).tokens) == 300


def _acceptance(path) -> float:
    with llama_ref.LlamaMTP(path) as m:
        assert m.n_nextn == 1
        accs = []
        for text in PROMPTS:
            _, stats = m.speculative_greedy(m.tokenize(text), 48, 1)
            accs.append(stats.acceptance)
    return float(np.mean(accs))


def test_llama_cpp_loads_and_decodes(files):
    for key in ("perfect", "f16"):
        with llama_ref.LlamaMTP(files[key]) as m:
            assert m.n_vocab == synthetic_config().n_vocab
            prompt = m.tokenize("def main():\n")
            assert m.detokenize(prompt) == "def main():\n"
            gen = m.greedy(prompt, 32)
            assert len(gen) == 32
            assert len(set(gen)) > 4  # no immediate one-token loop
            text = m.detokenize(gen)
            assert all(c == "\n" or 32 <= ord(c) < 127 for c in text)


def test_mtp_reproduces_trunk_at_zero_context(files):
    """context_mix=0: the MTP row (x_t, h_{t-1}) has the same argmax as the trunk at t."""
    with llama_ref.LlamaMTP(files["perfect"]) as m:
        toks = m.tokenize("for index, line in enumerate(open(path)):\n    print(line)\n")
        logits, h = m.sequence_states(toks)
        rows_h = np.concatenate([np.zeros((1, m.n_embd), np.float32), h[:-1]])
        mtp_logits, _ = m.mtp(toks, rows_h, 0)
        assert (mtp_logits.argmax(-1)[1:] == logits.argmax(-1)[1:]).all()


def test_acceptance_knobs(files):
    assert _acceptance(files["perfect"]) > 0.99
    assert _acceptance(files["f16"]) > 0.99
    assert 0.2 < _acceptance(files["partial"]) < 0.95
    assert _acceptance(files["random"]) < 0.1
