"""The Hugging Face Qwen3.5 <-> llama.cpp ``qwen35`` tensor mapping, in both directions.

One table serves the exporter of the bundled model (``training/export.py``: a training checkpoint ->
GGUF), its inverse (GGUF -> the PyTorch model of the parity tests) and the Hugging Face checkpoint
writer (:mod:`.hf_export`: GGUF -> ``Qwen3_5ForCausalLM`` + ``mtp.*`` safetensors).

The Hugging Face -> llama.cpp transforms are the ones llama.cpp's own converter applies to Qwen3.5
checkpoints (``conversion/qwen.py``: ``Qwen3NextModel``, ``_LinearAttentionVReorderBase``,
``_QwenMtpMixin``):

* zero-centred RMS norms (``Qwen3_5RMSNorm``: ``x * (1 + w)``) are written as ``1 + w``; the
  gated norm of the linear attention (``linear_attn.norm``) is a plain multiplier and is
  written as is;
* ``A_log`` becomes ``ssm_a = -exp(A_log)``; ``dt_bias`` is ``ssm_dt.bias``;
* the depthwise conv kernel ``(C, 1, K)`` is squeezed to ``(C, K)``;
* with fewer key heads than value heads, value heads are reordered from HF's grouped order
  to llama.cpp's tiled order (rows of ``in_proj_qkv``'s V part, ``in_proj_z``, ``in_proj_a``,
  ``in_proj_b``, ``A_log``, ``dt_bias``, the V channels of ``conv1d``, columns of ``out_proj``);
* the MTP block's ``fc`` / ``pre_fc_norm_embedding`` / ``pre_fc_norm_hidden`` / ``norm``
  become ``blk.N.nextn.eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head_norm`` and its
  decoder layer ``mtp.layers.0`` becomes the full-attention tensors of ``blk.N`` (``N`` = trunk layers);
* embeddings are tied: no ``output.weight`` (llama.cpp then uses ``token_embd`` for the head,
  for the MTP head too, and for the MTP block's token embedding).

Names on the Hugging Face side are relative to a *trunk prefix*: ``"model."`` in a
``Qwen3_5ForCausalLM`` checkpoint, ``"trunk.model."`` in the training code's ``DemoModel``; the
MTP block is ``mtp.*`` in both, as Qwen3.5 checkpoints name it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from ..models.gguf_qwen35 import Qwen35Config

__all__ = [
    "HF_TRUNK_PREFIX",
    "reorder_v_heads",
    "ValueTransforms",
    "layer_tables",
    "hf_to_gguf",
    "gguf_to_hf",
    "config_from_metadata",
]

#: the trunk prefix of a ``Qwen3_5ForCausalLM`` checkpoint
HF_TRUNK_PREFIX = "model."

#: a transform: "copy"; "norm" (zero-centred RMS norm, stored as 1 + w); ("v", axis, head_dim): value heads
#: reordered along axis ("dk": the linear attention's head dim); "qkv" / "conv": the V part of the rows
#: reordered (the conv kernel also squeezed); "A_log": ssm_a = -exp(A_log), value heads reordered.
Transform = str | tuple

# (HF name under a layer prefix, GGUF name under blk.N., transform)
LAYER = (
    ("input_layernorm.weight", "attn_norm.weight", "norm"),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", "norm"),
    ("mlp.gate_proj.weight", "ffn_gate.weight", "copy"),
    ("mlp.up_proj.weight", "ffn_up.weight", "copy"),
    ("mlp.down_proj.weight", "ffn_down.weight", "copy"),
)
LINEAR_ATTENTION = (
    ("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", "qkv"),
    ("linear_attn.in_proj_z.weight", "attn_gate.weight", ("v", 0, "dk")),
    ("linear_attn.in_proj_b.weight", "ssm_beta.weight", ("v", 0, 1)),
    ("linear_attn.in_proj_a.weight", "ssm_alpha.weight", ("v", 0, 1)),
    ("linear_attn.conv1d.weight", "ssm_conv1d.weight", "conv"),
    ("linear_attn.dt_bias", "ssm_dt.bias", ("v", 0, 1)),
    ("linear_attn.A_log", "ssm_a", "A_log"),
    ("linear_attn.norm.weight", "ssm_norm.weight", "copy"),
    ("linear_attn.out_proj.weight", "ssm_out.weight", ("v", 1, "dk")),
)
FULL_ATTENTION = (
    ("self_attn.q_proj.weight", "attn_q.weight", "copy"),
    ("self_attn.k_proj.weight", "attn_k.weight", "copy"),
    ("self_attn.v_proj.weight", "attn_v.weight", "copy"),
    ("self_attn.o_proj.weight", "attn_output.weight", "copy"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", "norm"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", "norm"),
)
# outside the layers: (HF name, GGUF name, transform); {t} is the trunk prefix, {m} the MTP block's index
GLOBAL = (
    ("{t}embed_tokens.weight", "token_embd.weight", "copy"),
    ("{t}norm.weight", "output_norm.weight", "norm"),
    ("mtp.fc.weight", "blk.{m}.nextn.eh_proj.weight", "copy"),
    ("mtp.pre_fc_norm_embedding.weight", "blk.{m}.nextn.enorm.weight", "norm"),
    ("mtp.pre_fc_norm_hidden.weight", "blk.{m}.nextn.hnorm.weight", "norm"),
    ("mtp.norm.weight", "blk.{m}.nextn.shared_head_norm.weight", "norm"),
)


def reorder_v_heads(t: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int, inverse: bool = False) -> np.ndarray:
    """Grouped (by key head) -> tiled value-head order along ``axis``; ``inverse`` undoes it.

    A no-op when ``n_k == n_v``.
    """
    if n_k == n_v:
        return t
    per = n_v // n_k
    t = np.moveaxis(t, axis, 0)
    shape = t.shape
    outer = (per, n_k) if inverse else (n_k, per)
    t = t.reshape(*outer, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(t, 0, axis)


class ValueTransforms:
    """The HF -> llama.cpp value transforms of one model (:meth:`forward`) and their inverses (:meth:`inverse`)."""

    def __init__(self, cfg: Qwen35Config) -> None:
        self.nk, self.nv, self.dk = cfg.ssm_group_count, cfg.ssm_time_step_rank, cfg.ssm_state_size
        self.key_dim = self.nk * self.dk

    def _v(self, x: np.ndarray, axis: int, hd, inverse: bool) -> np.ndarray:
        return reorder_v_heads(x, axis, self.nk, self.nv, self.dk if hd == "dk" else hd, inverse=inverse)

    def _v_rows(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        kd = self.key_dim
        return np.concatenate([x[: 2 * kd], self._v(x[2 * kd :], 0, "dk", inverse)], axis=0)

    def forward(self, kind: Transform, x: np.ndarray) -> np.ndarray:
        """The llama.cpp tensor for the Hugging Face tensor ``x``."""
        if kind == "copy":
            return x
        if kind == "norm":
            return (1.0 + x.astype(np.float64)).astype(np.float32)
        if kind == "qkv":
            return self._v_rows(x, False)
        if kind == "conv":
            return self._v_rows(x.reshape(x.shape[0], -1), False)
        if kind == "A_log":
            return -np.exp(self._v(x.astype(np.float64), 0, 1, False)).astype(np.float32)
        return self._v(x, kind[1], kind[2], False)

    def inverse(self, kind: Transform, x: np.ndarray) -> np.ndarray:
        """The Hugging Face tensor for the llama.cpp tensor ``x``."""
        if kind == "copy":
            return x
        if kind == "norm":
            return (x.astype(np.float64) - 1.0).astype(np.float32)
        if kind == "qkv":
            return self._v_rows(x, True)
        if kind == "conv":
            x = self._v_rows(x, True)
            return x.reshape(x.shape[0], 1, x.shape[1])
        if kind == "A_log":
            return np.log(-self._v(x, 0, 1, True).astype(np.float64)).astype(np.float32)
        return self._v(x, kind[1], kind[2], True)


def layer_tables(cfg: Qwen35Config, trunk_prefix: str = HF_TRUNK_PREFIX) -> Iterator[tuple[str, str, tuple]]:
    """(HF prefix, GGUF prefix, tensor table) of every decoder layer, the MTP block's (``mtp.layers.0.``) last."""
    for il in range(cfg.n_layer):
        attention = LINEAR_ATTENTION if cfg.is_recurrent(il) else FULL_ATTENTION
        yield f"{trunk_prefix}layers.{il}.", f"blk.{il}.", LAYER + attention
    yield "mtp.layers.0.", f"blk.{cfg.n_layer}.", LAYER + FULL_ATTENTION


def hf_to_gguf(
    sd: Mapping[str, np.ndarray], cfg: Qwen35Config, trunk_prefix: str = HF_TRUNK_PREFIX
) -> dict[str, np.ndarray]:
    """llama.cpp tensors (GGUF names, F32, :func:`~mtp_explorer.models.gguf_qwen35.write_qwen35_gguf`'s convention) from
    a Hugging Face state dict of a Qwen3.5 trunk (under ``trunk_prefix``) and its ``mtp.*`` block."""
    tf = ValueTransforms(cfg)
    out: dict[str, np.ndarray] = {}
    for hf, gg, kind in GLOBAL:
        out[gg.format(m=cfg.n_layer)] = tf.forward(kind, sd[hf.format(t=trunk_prefix)])
    for hf_prefix, gg_prefix, table in layer_tables(cfg, trunk_prefix):
        for hf, gg, kind in table:
            out[gg_prefix + gg] = tf.forward(kind, sd[hf_prefix + hf])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def gguf_to_hf(
    tensors: Mapping[str, np.ndarray], cfg: Qwen35Config, trunk_prefix: str = HF_TRUNK_PREFIX
) -> dict[str, np.ndarray]:
    """The inverse of :func:`hf_to_gguf`: a Hugging Face state dict (F32) from llama.cpp tensors.

    A file without ``blk.N.nextn.shared_head_norm.weight`` gets ``output_norm`` for ``mtp.norm``
    (llama.cpp's fallback); the LM head is not included (embeddings are tied: it is ``embed_tokens``,
    or ``output.weight`` where a file has one).
    """
    tf = ValueTransforms(cfg)
    sd: dict[str, np.ndarray] = {}
    for hf, gg, kind in GLOBAL:
        gg = gg.format(m=cfg.n_layer)
        if gg.endswith("shared_head_norm.weight") and gg not in tensors:
            gg = "output_norm.weight"
        sd[hf.format(t=trunk_prefix)] = tf.inverse(kind, np.asarray(tensors[gg], dtype=np.float32))
    for hf_prefix, gg_prefix, table in layer_tables(cfg, trunk_prefix):
        for hf, gg, kind in table:
            sd[hf_prefix + hf] = tf.inverse(kind, np.asarray(tensors[gg_prefix + gg], dtype=np.float32))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def config_from_metadata(meta: Mapping[str, object], arch: str = "qwen35") -> Qwen35Config:
    """The :class:`~mtp_explorer.models.gguf_qwen35.Qwen35Config` of a GGUF file from its metadata
    (:func:`~mtp_explorer.models.gguf_qwen35.read_qwen35_metadata`)."""

    def k(name: str):
        return meta[f"{arch}.{name}"]

    n_next = int(k("nextn_predict_layers"))
    return Qwen35Config(
        n_vocab=int(meta["tokenizer.ggml.tokens.count"]),
        n_embd=int(k("embedding_length")),
        n_layer=int(k("block_count")) - n_next,
        n_ff=int(k("feed_forward_length")),
        n_head=int(k("attention.head_count")),
        n_head_kv=int(k("attention.head_count_kv")),
        head_dim=int(k("attention.key_length")),
        full_attention_interval=int(k("full_attention_interval")),
        ssm_conv_kernel=int(k("ssm.conv_kernel")),
        ssm_state_size=int(k("ssm.state_size")),
        ssm_group_count=int(k("ssm.group_count")),
        ssm_time_step_rank=int(k("ssm.time_step_rank")),
        rope_dim=int(k("rope.dimension_count")),
        rope_freq_base=float(k("rope.freq_base")),
        rope_sections=tuple(int(s) for s in k("rope.dimension_sections")),  # type: ignore[arg-type]
        rms_eps=float(k("attention.layer_norm_rms_epsilon")),
        n_ctx_train=int(k("context_length")),
        nextn_predict_layers=n_next,
    )
