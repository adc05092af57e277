"""llama.cpp's own converter agrees with our GGUF writer.

The bundled model is written back as a Hugging Face checkpoint (``Qwen3_5ForCausalLM`` + the ``mtp.*`` tensors of
Qwen3.5 checkpoints: :mod:`mtp_explorer.devtools.hf_export`) and converted with ``convert_hf_to_gguf.py`` from the
llama-cpp-python 0.3.36 sdist (``build/sdist``, which ``make test`` downloads; a missing sdist fails, never
skips). The converted file must have the shipped file's tensors bit for bit and its metadata (but for what names
the file: ``general.name``, description, licence, size label, our ``mtp_explorer.*`` keys), load with its MTP
layer, and decode to the same greedy tokens with the same MTP acceptance. A synthetic model with fewer key heads
than value heads checks the value-head reordering, which the bundled model (4 and 4) does not exercise.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.core.errors import ConverterError
from mtp_explorer.devtools.hf_export import (
    INHERENT_KEYS,
    SDIST_DIR,
    convert_with_llama_cpp,
    diff_gguf,
    export_hf_checkpoint,
    find_converter,
    pre_tokenizer_name,
)
from mtp_explorer.models.gguf_qwen35 import expected_tensor_shapes, write_qwen35_gguf
from mtp_explorer.models.synthetic import synthetic_config, synthetic_vocab

pytestmark = pytest.mark.train

PROMPTS = ["def fib(n):", "import os\n\n\ndef list_files(path):", "class Stack:\n    def __init__(self):"]
MAX_TOKENS = 48
N_MAX = 3
#: metadata only our exporter writes (the training run's record)
OURS = (
    "mtp_explorer.corpus",
    "mtp_explorer.train_config",
    "mtp_explorer.training_seconds",
    "mtp_explorer.training_steps",
)


@pytest.fixture(scope="module")
def converter() -> Path:
    """convert_hf_to_gguf.py from the sdist (its files extracted from the tarball if need be)."""
    try:
        return find_converter()
    except ConverterError as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


@pytest.fixture(scope="module")
def hf_dir(bundled_model, tmp_path_factory) -> Path:
    return export_hf_checkpoint(bundled_model, tmp_path_factory.mktemp("hf") / "pystdlib-qwen35-mtp")


@pytest.fixture(scope="module")
def converted(hf_dir, converter, tmp_path_factory) -> Path:
    return convert_with_llama_cpp(
        hf_dir, tmp_path_factory.mktemp("converted") / "converted-f16.gguf", converter=converter
    )


def test_checkpoint_is_a_qwen35_causal_lm_with_mtp_tensors(hf_dir):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    config = AutoConfig.from_pretrained(hf_dir)
    assert config.architectures == ["Qwen3_5ForCausalLM"] and config.mtp_num_hidden_layers == 1
    sd = load_file(str(hf_dir / "model.safetensors"))
    mtp = {k for k in sd if k.startswith("mtp.")}
    assert {
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    } <= mtp
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    # the trunk is exactly a Qwen3_5ForCausalLM (tied head); the MTP block is what transformers leaves out
    assert set(missing) <= {"lm_head.weight"} and set(unexpected) == mtp


def test_pre_tokenizer_is_recognised_by_its_regex(hf_dir):
    assert pre_tokenizer_name(hf_dir) == "qwen2"


def test_hf_tokenizer_tokenizes_as_llama_cpp(hf_dir, bundled_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    texts = PROMPTS + ["x = {'a': 1, \"b\": [2, 3]}  # ünïcödé\r\n\n\n\tpass 12345 ...!!", "   \n  \n"]
    with mx.Session.open(bundled_model, n_ctx=256, threads=1, telemetry=False) as s:
        for text in texts:
            assert tok.encode(text, add_special_tokens=False).ids == s.tokenize(text, add_special=False), text


def test_converted_tensors_and_metadata_equal_the_shipped_file(bundled_model, converted):
    diff = diff_gguf(bundled_model, converted, ignore_keys=INHERENT_KEYS + OURS)
    assert not diff, str(diff)


def test_our_writer_matches_the_converter_with_reordered_value_heads(tmp_path, converter):
    """fewer key heads than value heads: the writer's input is in llama.cpp's tiled order, the checkpoint's in
    HF's grouped order, and the converter's reordering must give back the writer's tensors"""
    cfg = dataclasses.replace(synthetic_config(n_vocab=320, n_embd=64), ssm_group_count=2, ssm_time_step_rank=4)
    rng = np.random.default_rng(7)
    tensors = {}
    for name, (shape, required) in expected_tensor_shapes(cfg).items():
        if required or name.endswith("shared_head_norm.weight"):
            x = rng.standard_normal(shape).astype(np.float32) * 0.1
            if name.endswith("norm.weight") and "ssm_norm" not in name:
                x += 1.0  # a multiplier near 1, as llama.cpp stores a zero-centred norm
            if name.endswith("ssm_a"):
                x = -np.exp(x)
            tensors[name] = x
    src = write_qwen35_gguf(tmp_path / "synthetic.gguf", cfg, tensors, synthetic_vocab(cfg.n_vocab), dtype="f16")
    hf = export_hf_checkpoint(src, tmp_path / "hf")
    assert pre_tokenizer_name(hf) == "gpt-2"
    out = convert_with_llama_cpp(hf, tmp_path / "converted.gguf", converter=converter)
    diff = diff_gguf(src, out, ignore_keys=INHERENT_KEYS)
    assert not diff, str(diff)


def test_converted_file_loads_with_its_mtp_layer(converted):
    with mx.Session.open(converted, n_ctx=512, threads=1) as s:
        assert s.info.has_mtp and s.info.n_layer_nextn == 1 and s.info.arch == "qwen35"
        t = s.generate(PROMPTS[0], max_tokens=16, n_max=N_MAX)
        assert t.summary()["n_drafted"] > 0


def test_same_greedy_tokens_and_acceptance_as_the_shipped_file(bundled_model, converted):
    results = {}
    for label, path in (("shipped", bundled_model), ("converted", converted)):
        with mx.Session.open(path, n_ctx=512, threads=1) as s:
            rows = []
            for prompt in PROMPTS:
                plain = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=0)
                spec = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=N_MAX)
                summary = spec.summary()
                rows.append((plain.tokens, spec.tokens, summary["n_drafted"], summary["n_accepted"]))
            results[label] = rows
    assert results["converted"] == results["shipped"]
    assert sum(r[2] for r in results["shipped"]) > 0 and sum(r[3] for r in results["shipped"]) > 0


def test_a_missing_converter_is_a_converter_error(tmp_path, hf_dir):
    with pytest.raises(ConverterError, match="make build/llama-cpp-headers"):
        find_converter(sdist_dir=tmp_path)
    with pytest.raises(ConverterError, match="not found"):
        convert_with_llama_cpp(hf_dir, tmp_path / "x.gguf", converter=tmp_path / "convert_hf_to_gguf.py")


def test_converter_files_are_extracted_from_the_sdist_tarball(tmp_path):
    tarball = SDIST_DIR / "llama_cpp_python-0.3.36.tar.gz"
    if not tarball.is_file():
        pytest.fail(f"{tarball} missing: `make build/llama-cpp-headers/src/llama-ext.h` downloads it", pytrace=False)
    os.symlink(tarball, tmp_path / tarball.name)
    script = find_converter(sdist_dir=tmp_path)
    assert script.is_file() and (script.parent / "conversion" / "qwen.py").is_file()
    assert (script.parent / "gguf-py" / "gguf" / "gguf_writer.py").is_file()
    assert not (script.parent / "src").exists()  # only what the converter needs
