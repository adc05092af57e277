"""llama.cpp's own converter agrees with our writers of the other MTP modes (SYNTHETIC models).

Chained heads: the SYNTHETIC ``step35`` model with 3 MTP heads (:mod:`mtp_explorer.models.synthetic_step35`) is
written back as a Hugging Face ``Step3p5ForCausalLM`` checkpoint (:mod:`mtp_explorer.devtools.step35_hf`: the MTP
blocks appended as ``model.layers.2..4``) and converted with ``convert_hf_to_gguf.py`` from the llama-cpp-python
0.3.36 sdist (``--outtype f32``; a missing sdist fails, never skips).  The converted file has the written file's
tensors bit for bit, its metadata but for what names the file, our ``mtp_explorer.*`` knobs and two keys that only
one side writes and llama.cpp reads alike, and llama-speculative-simple drafts with it exactly as with ours.

Shared-memory head: the SYNTHETIC ``gemma4`` target and its ``gemma4-assistant`` head file
(:mod:`mtp_explorer.models.synthetic_gemma4`) are written back as ``Gemma4ForCausalLM`` and
``Gemma4AssistantForCausalLM`` checkpoints (:mod:`mtp_explorer.devtools.gemma4_hf`) and converted one by one.  Tensors
are equal bit for bit and hyperparameters but one that llama.cpp ignores; the vocabulary is llama.cpp's ``gemma4``
one with our ids (the converter writes no other for Gemma 4), which always starts a prompt with BOS, so drafting
matches ours once our target adds its BOS too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest

from mtp_explorer.core.errors import ConverterError
from mtp_explorer.devtools.gemma4_hf import export_gemma4_checkpoint
from mtp_explorer.devtools.hf_export import INHERENT_KEYS, convert_with_llama_cpp, diff_gguf, find_converter
from mtp_explorer.devtools.reference import run_reference_spec
from mtp_explorer.devtools.step35_hf import export_step35_checkpoint
from mtp_explorer.models.synthetic_gemma4 import write_synthetic_gemma4
from mtp_explorer.models.synthetic_step35 import write_synthetic_step35

pytestmark = [pytest.mark.reference, pytest.mark.train]

PROMPTS = ("def f(x):", "import os\n", "class A:\n    pass\n")
#: the SYNTHETIC file's knobs (our metadata only)
KNOBS = (
    "mtp_explorer.synthetic",
    "mtp_explorer.seed",
    "mtp_explorer.context_mix",
    "mtp_explorer.mtp_fidelity",
    "mtp_explorer.head_fidelity",
)
#: keys only one side writes: llama.cpp's rope dimension count defaults to the head dim (16, what ours writes), and
#: it never reads moe_every_n_layers (the converter writes Step-3.5's moe_every_n_layer)
STEP35_ONE_SIDED = [
    "step35.moe_every_n_layers: only in converted.gguf = ('UINT32', 1)",
    "step35.rope.dimension_count: only in synthetic-step35.gguf = ('UINT32', 16)",
]


@pytest.fixture(scope="module")
def converter() -> Path:
    try:
        return find_converter()
    except ConverterError as exc:
        pytest.fail(str(exc), pytrace=False)


def _assert_same_drafting(binary: Path, ours: tuple[Path, Path | None], theirs: tuple[Path, Path | None]) -> None:
    """llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max 3 (with -md HEAD where a pair has a head file)
    prints the same text and drafted/accepted totals for both (target, head) pairs on every prompt, with some drafts
    accepted and some rejected."""
    totals = []
    for prompt in PROMPTS:
        runs = []
        for target, head in (ours, theirs):
            args = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"] + (["-md", str(head)] if head else [])
            r = run_reference_spec(binary, target, prompt, args, max_tokens=48, n_ctx=1024, threads=1)
            runs.append((r.text, r.n_predict, r.n_drafted, r.n_accept))
        assert runs[1] == runs[0], prompt
        totals.append(runs[0][2:])
    n_drafted, n_accept = map(sum, zip(*totals))
    assert 0 < n_accept < n_drafted


@pytest.fixture(scope="module")
def step35(tmp_path_factory, converter) -> dict[str, Path]:
    """SYNTHETIC step35 (heads of falling fidelity, some context), its checkpoint and its conversion."""
    d = tmp_path_factory.mktemp("step35_roundtrip")
    src = write_synthetic_step35(d / "synthetic-step35.gguf", head_fidelity=(0.9, 0.6, 0.3), context_mix=0.25)
    hf = export_step35_checkpoint(src, d / "hf")
    out = convert_with_llama_cpp(hf, d / "converted.gguf", converter=converter, outtype="f32", config_json=True)
    return {"src": src, "hf": hf, "converted": out}


def test_step35_checkpoint_appends_the_mtp_blocks_as_layers(step35):
    from safetensors.numpy import load_file

    config = json.loads((step35["hf"] / "config.json").read_text())
    assert config["architectures"] == ["Step3p5ForCausalLM"]
    assert (config["num_hidden_layers"], config["num_nextn_predict_layers"]) == (2, 3)
    assert config["layer_types"] == ["sliding_attention"] + ["full_attention"] * 4
    sd = load_file(str(step35["hf"] / "model.safetensors"))
    for il in (2, 3, 4):  # one full decoder block and its NextN wiring per head, past the trunk's 2 layers
        p = f"model.layers.{il}."
        assert {
            p + "eh_proj.weight",
            p + "enorm.weight",
            p + "hnorm.weight",
            p + "transformer.shared_head.norm.weight",
            p + "self_attn.g_proj.weight",
            p + "moe.gate_proj.weight",
            p + "moe.router_bias",
            p + "share_expert.down_proj.weight",
        } <= set(sd)
    assert not any(k.startswith("model.layers.5.") for k in sd)
    assert "model.layers.0.mlp.gate_proj.weight" in sd and "lm_head.weight" in sd


def test_step35_converted_tensors_equal_the_written_file(step35):
    diff = diff_gguf(step35["src"], step35["converted"], ignore_keys=INHERENT_KEYS + KNOBS)
    assert diff.tensors == [], str(diff)  # names, shapes, types (F32) and bytes
    assert diff.metadata == STEP35_ONE_SIDED, str(diff)


def test_step35_converted_file_drafts_as_the_written_file(step35, reference_binary):
    """llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max 3 (the three chained heads): the same text
    and drafted/accepted totals with the converted file as with ours."""
    _assert_same_drafting(reference_binary, (step35["src"], None), (step35["converted"], None))


# -- the shared-memory head: gemma4 target + gemma4-assistant head file ----------------------------------------
#: keys that legitimately differ: the converter writes every Gemma 4 file with llama.cpp's ``gemma4`` vocabulary
#: (SentencePiece-style BPE, same ids; llama.cpp always adds its BOS), never our ``gpt2`` one
GEMMA4_TOKENIZER = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory, converter) -> dict[str, Path]:
    """SYNTHETIC gemma4 target (some context) and its assistant head, their checkpoints and their conversions."""
    d = tmp_path_factory.mktemp("gemma4_roundtrip")
    target, head = write_synthetic_gemma4(d / "synthetic-gemma4.gguf", mtp_fidelity=0.6, context_mix=0.25)
    files = {"src": target, "src_head": head}
    for key, src in (("", target), ("_head", head)):
        files["hf" + key] = export_gemma4_checkpoint(src, d / f"hf{key}")
        files["converted" + key] = convert_with_llama_cpp(
            files["hf" + key], d / f"converted{key}.gguf", converter=converter, outtype="f32"
        )
    return files


def test_gemma4_checkpoints_are_a_causal_lm_and_its_assistant(gemma4):
    from safetensors.numpy import load_file

    target = json.loads((gemma4["hf"] / "config.json").read_text())
    head = json.loads((gemma4["hf_head"] / "config.json").read_text())
    assert target["architectures"] == ["Gemma4ForCausalLM"] and head["architectures"] == ["Gemma4AssistantForCausalLM"]
    assert head["backbone_hidden_size"] == target["hidden_size"] == 64 and head["text_config"]["hidden_size"] == 32
    assert head["text_config"]["num_kv_shared_layers"] == head["text_config"]["num_hidden_layers"] == 2
    sd = load_file(str(gemma4["hf_head"] / "model.safetensors"))
    assert {
        "pre_projection.weight",
        "post_projection.weight",
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.layer_scalar",
    } <= set(sd)
    assert not any("k_proj" in k or "v_proj" in k for k in sd)  # its keys and values are the target's
    assert "rope_freqs.weight" not in sd  # the converter generates it


@pytest.mark.parametrize("key", ["", "_head"])
def test_gemma4_converted_tensors_equal_the_written_files(gemma4, key):
    """Every tensor bit for bit (rope_freqs, which the converter generates, too); every hyperparameter but the head's
    shared_kv_layers (the converter writes num_kv_shared_layers = 2, ours 0: llama.cpp's gemma4-assistant reads it
    and never uses it); the vocabulary's keys differ as GEMMA4_TOKENIZER says."""
    diff = diff_gguf(
        gemma4["src" + key], gemma4["converted" + key], ignore_keys=INHERENT_KEYS + KNOBS + GEMMA4_TOKENIZER
    )
    assert diff.tensors == [], str(diff)
    expected = ["gemma4-assistant.attention.shared_kv_layers: ('UINT32', 0) != ('UINT32', 2)"] if key else []
    assert diff.metadata == expected, str(diff)


def test_gemma4_converted_vocabulary_has_our_ids(gemma4):
    from mtp_explorer.models.gguf_qwen35 import bytes_to_unicode

    ours = gguf.GGUFReader(str(gemma4["src"])).fields["tokenizer.ggml.tokens"].contents()
    theirs = gguf.GGUFReader(str(gemma4["converted"])).fields["tokenizer.ggml.tokens"].contents()
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    assert len(ours) == len(theirs) == 384 and ours[-1] == theirs[-1] == "<|endoftext|>"
    for a, b in zip(ours[:-1], theirs[:-1]):
        raw = bytes(byte_of[c] for c in a)
        assert (bytes([int(b[3:5], 16)]) if b.startswith("<0x") else b.replace("\u2581", " ").encode()) == raw


def test_gemma4_converted_pair_drafts_as_the_written_pair(gemma4, reference_binary, tmp_path):
    """llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max 3 -md HEAD: the converted target and head
    give the same text and drafted/accepted totals as ours, once our target also starts with its BOS (llama.cpp
    always adds a gemma4 vocabulary's BOS; the model mixes context in, so one more token changes what follows)."""
    ours = Path(shutil.copy(gemma4["src"], tmp_path / "synthetic-gemma4-bos.gguf"))
    reader = gguf.GGUFReader(str(ours), "r+")  # the same tensors and keys, with add_bos_token set in place
    field = reader.fields["tokenizer.ggml.add_bos_token"]
    field.parts[field.data[0]][0] = 1
    reader.data.flush()
    del reader, field
    _assert_same_drafting(reference_binary, (ours, gemma4["src_head"]), (gemma4["converted"], gemma4["converted_head"]))
