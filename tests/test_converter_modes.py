"""llama.cpp's own converter agrees with our writers of the other MTP modes (SYNTHETIC models).

Chained heads: the SYNTHETIC ``step35`` model with 3 MTP heads (:mod:`mtp_explorer.devtools.synthetic_step35`) is
written back as a Hugging Face ``Step3p5ForCausalLM`` checkpoint (:mod:`mtp_explorer.devtools.step35_hf`: the MTP
blocks appended as ``model.layers.2..4``) and converted with ``convert_hf_to_gguf.py`` from the llama-cpp-python
0.3.36 sdist (``--outtype f32``; a missing sdist fails, never skips).  The converted file has the written file's
tensors bit for bit, its metadata but for what names the file, our ``mtp_explorer.*`` knobs and two keys that only
one side writes and llama.cpp reads alike, and llama-speculative-simple drafts with it exactly as with ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp_explorer.core.errors import ConverterError
from mtp_explorer.devtools.hf_export import INHERENT_KEYS, convert_with_llama_cpp, diff_gguf, find_converter
from mtp_explorer.devtools.reference import run_reference_spec
from mtp_explorer.devtools.step35_hf import export_step35_checkpoint
from mtp_explorer.devtools.synthetic_step35 import write_synthetic_step35

PROMPTS = ("def f(x):", "import os\n", "class A:\n    pass\n")
#: the SYNTHETIC file's knobs (our metadata only)
KNOBS = ("mtp_explorer.synthetic", "mtp_explorer.seed", "mtp_explorer.context_mix", "mtp_explorer.mtp_fidelity",
         "mtp_explorer.head_fidelity")
#: keys only one side writes: llama.cpp's rope dimension count defaults to the head dim (16, what ours writes), and
#: it never reads moe_every_n_layers (the converter writes Step-3.5's moe_every_n_layer)
STEP35_ONE_SIDED = ["step35.moe_every_n_layers: only in converted.gguf = ('UINT32', 1)",
                    "step35.rope.dimension_count: only in synthetic-step35.gguf = ('UINT32', 16)"]


@pytest.fixture(scope="module")
def converter() -> Path:
    try:
        return find_converter()
    except ConverterError as exc:
        pytest.fail(str(exc), pytrace=False)


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
        assert {p + "eh_proj.weight", p + "enorm.weight", p + "hnorm.weight",
                p + "transformer.shared_head.norm.weight", p + "self_attn.g_proj.weight",
                p + "moe.gate_proj.weight", p + "moe.router_bias", p + "share_expert.down_proj.weight"} <= set(sd)
    assert not any(k.startswith("model.layers.5.") for k in sd)
    assert "model.layers.0.mlp.gate_proj.weight" in sd and "lm_head.weight" in sd


def test_step35_converted_tensors_equal_the_written_file(step35):
    diff = diff_gguf(step35["src"], step35["converted"], ignore_keys=INHERENT_KEYS + KNOBS)
    assert diff.tensors == [], str(diff)  # names, shapes, types (F32) and bytes
    assert diff.metadata == STEP35_ONE_SIDED, str(diff)


def test_step35_converted_file_drafts_as_the_written_file(step35, reference_binary):
    """llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max 3 (the three chained heads): the same text
    and drafted/accepted totals with the converted file as with ours."""
    args = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]
    n_drafted = n_accept = 0
    for prompt in PROMPTS:
        runs = [run_reference_spec(reference_binary, step35[k], prompt, args, max_tokens=48, n_ctx=1024, threads=1)
                for k in ("src", "converted")]
        assert [(r.text, r.n_predict, r.n_drafted, r.n_accept) for r in runs[1:]] == \
            [(runs[0].text, runs[0].n_predict, runs[0].n_drafted, runs[0].n_accept)], prompt
        n_drafted, n_accept = n_drafted + runs[0].n_drafted, n_accept + runs[0].n_accept
    assert 0 < n_accept < n_drafted
