"""A ``step35`` GGUF (the SYNTHETIC chained-head model of :mod:`mtp_explorer.models.synthetic_step35`) as a Hugging Face
``Step3p5ForCausalLM`` checkpoint, for a round trip through llama.cpp's own converter.

    python -m mtp_explorer.devtools.export_checkpoint --gguf synthetic-step35.gguf --out-dir /tmp/hf \\
        --convert /tmp/c.gguf --outtype f32

:func:`export_step35_checkpoint` writes what a Step-3.5 checkpoint holds, in the layout that ``convert_hf_to_gguf.py``
reads (``conversion/step3.py``: ``Step35Model``, registered for ``Step3p5ForCausalLM``; the names are the inverse of
its renaming and of ``gguf-py``'s tensor map for ``MODEL_ARCH.STEP35``):

* ``config.json``: ``num_attention_groups`` (KV heads), ``rope_theta`` as ``[full, sliding]`` (the converter reads
  a list's first two entries as ``rope.freq_base`` and ``rope.freq_base_swa``: right for Step-3.5-Flash, whose
  per-layer list starts with a full-attention layer and a sliding-window one; our layer 0 is the sliding-window
  layer, so a per-layer list would be read the wrong way round), ``layer_types`` and ``partial_rotary_factors``
  over every block, the MTP blocks included (1.0 for sliding-window layers, 0.5 for full attention, which the
  converter asserts), ``moe_layers_enum`` (its smallest entry is ``leading_dense_block_count``), the MoE sizes
  (``moe_num_experts``, ``moe_top_k``, ``moe_intermediate_size``, ``share_expert_dim``), sigmoid routing with
  normalised weights, and ``num_nextn_predict_layers``;
* ``model.safetensors`` (F32): the trunk under ``model.layers.{i}.`` and the MTP blocks **appended** as
  ``model.layers.{n_layer + k}.`` (full decoder blocks, plus ``eh_proj`` / ``enorm`` / ``hnorm`` and the shared
  head under ``transformer.shared_head.``, which the converter strips); attention ``self_attn.{q,k,v,o}_proj``,
  ``q_norm`` / ``k_norm`` and the head-wise gate ``g_proj``; dense FFN ``mlp.*``; MoE ``moe.gate`` (router),
  ``moe.router_bias`` (selection bias), stacked experts ``moe.{gate,up,down}_proj`` and ``share_expert.*``;
  ``lm_head`` (untied).  Every tensor whose name ends in ``norm.weight`` is stored zero-centred (the GGUF value
  minus 1): the converter adds 1 to each of them.  In F32 the round trip is exact: ``x - 1`` of a norm weight near
  1 is exact in float32, and so is adding 1 back;
* the tokenizer files of :class:`.hf_export.GGUFTokenizer` (the GGUF's byte-level BPE).

The converter must read ``config.json`` as is (``convert_with_llama_cpp(..., config_json=True)``): the project's
transformers knows ``step3p5`` in another form (see :mod:`._convert_launcher`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from ..models.synthetic_step35 import ARCH, Step35Config
from .hf_export import (
    GGUFTokenizer,
    _f32_literal,
    _read_gguf,
    float_tensors,
    hf_tensor_name,
    read_gguf_for_export,
    write_checkpoint,
)

__all__ = [
    "step35_config_from_metadata",
    "step35_hf_config",
    "step35_hf_name",
    "step35_gguf_to_hf",
    "export_step35_checkpoint",
]

# (HF name under model.layers.{i}., GGUF name under blk.{i}.)
_BLOCK = (
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("self_attn.g_proj.weight", "attn_gate.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
    ("moe.gate.weight", "ffn_gate_inp.weight"),
    ("moe.router_bias", "exp_probs_b.bias"),
    ("moe.gate_proj.weight", "ffn_gate_exps.weight"),
    ("moe.up_proj.weight", "ffn_up_exps.weight"),
    ("moe.down_proj.weight", "ffn_down_exps.weight"),
    ("share_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
    ("share_expert.up_proj.weight", "ffn_up_shexp.weight"),
    ("share_expert.down_proj.weight", "ffn_down_shexp.weight"),
)
# the NextN wiring of an appended MTP block (same prefix)
_NEXTN = (
    ("eh_proj.weight", "nextn.eh_proj.weight"),
    ("enorm.weight", "nextn.enorm.weight"),
    ("hnorm.weight", "nextn.hnorm.weight"),
    ("transformer.shared_head.norm.weight", "nextn.shared_head_norm.weight"),
    ("transformer.shared_head.output.weight", "nextn.shared_head_head.weight"),
    ("embed_tokens.weight", "nextn.embed_tokens.weight"),
)
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _uniform(value, what: str) -> int:
    values = set(value) if isinstance(value, (list, tuple)) else {value}
    if len(values) != 1:
        raise ParameterError(f"{what} differs between blocks ({sorted(values)}): not a step35 model this exports")
    return int(values.pop())


def step35_config_from_metadata(meta: Mapping[str, object]) -> Step35Config:
    """The :class:`~mtp_explorer.models.synthetic_step35.Step35Config` of a ``step35`` GGUF from its metadata
    (:func:`~mtp_explorer.models.gguf_qwen35.read_qwen35_metadata`)."""

    def k(name: str):
        return meta[f"{ARCH}.{name}"]

    n_next = int(k("nextn_predict_layers"))
    n_layer = int(k("block_count")) - n_next
    pattern = list(k("attention.sliding_window_pattern"))  # type: ignore[call-overload]
    return Step35Config(
        n_vocab=int(meta["tokenizer.ggml.tokens.count"]),
        n_embd=int(k("embedding_length")),
        n_layer=n_layer,
        n_layer_dense_lead=int(k("leading_dense_block_count")),
        n_ff=int(k("feed_forward_length")),
        n_ff_exp=int(k("expert_feed_forward_length")),
        n_ff_shexp=int(k("expert_shared_feed_forward_length")),
        n_expert=int(k("expert_count")),
        n_expert_used=int(k("expert_used_count")),
        n_head=_uniform(k("attention.head_count"), "head_count"),
        n_head_kv=_uniform(k("attention.head_count_kv"), "head_count_kv"),
        head_dim=int(k("attention.key_length")),
        swa_layers=tuple(il for il in range(n_layer) if pattern[il]),
        n_swa=int(k("attention.sliding_window")),
        rope_freq_base=float(k("rope.freq_base")),
        rope_freq_base_swa=float(k("rope.freq_base_swa")),
        rms_eps=float(k("attention.layer_norm_rms_epsilon")),
        n_ctx_train=int(k("context_length")),
        nextn_predict_layers=n_next,
    )


def step35_hf_config(cfg: Step35Config, *, eos_id: int, bos_id: int | None) -> dict:
    """``config.json`` of a ``Step3p5ForCausalLM`` with ``cfg``'s hyperparameters and its chained MTP blocks."""
    sliding = [il in cfg.swa_layers for il in range(cfg.block_count)]
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "vocab_size": cfg.n_vocab,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.n_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_attention_groups": cfg.n_head_kv,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.n_ctx_train,
        "rms_norm_eps": _f32_literal(cfg.rms_eps),
        "rope_theta": [_f32_literal(cfg.rope_freq_base), _f32_literal(cfg.rope_freq_base_swa)],
        "sliding_window": cfg.n_swa,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "partial_rotary_factors": [1.0 if s else 0.5 for s in sliding],
        "moe_layers_enum": ",".join(str(il) for il in range(cfg.block_count) if cfg.is_moe(il)),
        "moe_every_n_layer": 1,
        "moe_num_experts": cfg.n_expert,
        "moe_top_k": cfg.n_expert_used,
        "moe_intermediate_size": cfg.n_ff_exp,
        "share_expert_dim": cfg.n_ff_shexp,
        "moe_router_activation": "sigmoid",
        "norm_expert_weight": True,
        "num_nextn_predict_layers": cfg.nextn_predict_layers,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def step35_hf_name(name: str, cfg: Step35Config) -> str:
    """The checkpoint name of the GGUF tensor ``name`` (MTP blocks appended after the trunk's layers)."""

    def table(il: int):
        return () if il >= cfg.block_count else _BLOCK + _NEXTN if il >= cfg.n_layer else _BLOCK

    return hf_tensor_name(name, _GLOBAL, table, arch="Step3p5ForCausalLM")


def step35_gguf_to_hf(tensors: Mapping[str, np.ndarray], cfg: Step35Config) -> dict[str, np.ndarray]:
    """A Hugging Face state dict (F32) from llama.cpp tensors: renamed (:func:`step35_hf_name`), norm weights stored
    zero-centred (``w - 1``, which the converter undoes)."""
    sd: dict[str, np.ndarray] = {}
    for name, x in tensors.items():
        hf = step35_hf_name(name, cfg)
        x = np.asarray(x, dtype=np.float32)
        sd[hf] = (x.astype(np.float64) - 1.0).astype(np.float32) if hf.endswith("norm.weight") else x
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}


def export_step35_checkpoint(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the ``step35`` + chained-MTP model in ``gguf_path`` (F32/F16) as a ``Step3p5ForCausalLM`` checkpoint in
    ``out_dir`` (created): ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``.
    Returns ``out_dir``. Raises :class:`ParameterError` for another architecture, a file without MTP blocks,
    quantized tensors or tensors with no Step-3.5 name."""
    gguf_path = Path(gguf_path)
    meta = read_gguf_for_export(gguf_path, ARCH)
    if not meta.get(f"{ARCH}.nextn_predict_layers"):
        raise ParameterError(f"{gguf_path} has no MTP (nextn) blocks")
    cfg = step35_config_from_metadata(meta)
    reader = _read_gguf(gguf_path)
    sd = step35_gguf_to_hf(float_tensors(reader, gguf_path), cfg)
    vocab = GGUFTokenizer.read(reader, meta, n_ctx=cfg.n_ctx_train)
    return write_checkpoint(out_dir, sd, step35_hf_config(cfg, eos_id=vocab.eos_id, bos_id=vocab.bos_id), vocab)
