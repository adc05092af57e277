"""Export a training checkpoint to a ``qwen35`` GGUF with its MTP block.

    python -m training.export                                   # shipped file (F16)
    python -m training.export --dtype f32 --out /tmp/model-f32.gguf
    python -m training.export --checkpoint path/to/last.pt --tokenizer path/to/tokenizer.json

The Hugging Face -> llama.cpp transforms are the ones llama.cpp's own converter applies to
Qwen3.5 checkpoints (``conversion/qwen.py``):

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
  decoder layer becomes the full-attention tensors of ``blk.N`` (``N`` = trunk layers);
* embeddings are tied: no ``output.weight`` (llama.cpp then uses ``token_embd`` for the head,
  for the MTP head too, and for the MTP block's token embedding).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mtp_explorer.devtools.gguf_qwen35 import write_qwen35_gguf

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHECKPOINT = ROOT / "training" / "checkpoints" / "last.pt"
DEFAULT_TOKENIZER = ROOT / "training" / "checkpoints" / "tokenizer.json"
SHIPPED_NAME = "pystdlib-qwen35-mtp.gguf"
DEFAULT_OUT = ROOT / "mtp_explorer" / "models" / SHIPPED_NAME


def _reorder_v_heads(t: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int, inverse: bool = False) -> np.ndarray:
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


# (HF name under a layer prefix, GGUF name under blk.N., transform); transforms: "copy"; "norm"
# (zero-centred RMS norm, stored as 1 + w); ("v", axis, head_dim): value heads reordered along
# axis; "qkv" / "conv": the V part of the rows reordered (the conv kernel also squeezed);
# "A_log": ssm_a = -exp(A_log), value heads reordered.
_LAYER = (
    ("input_layernorm.weight", "attn_norm.weight", "norm"),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", "norm"),
    ("mlp.gate_proj.weight", "ffn_gate.weight", "copy"),
    ("mlp.up_proj.weight", "ffn_up.weight", "copy"),
    ("mlp.down_proj.weight", "ffn_down.weight", "copy"),
)
_LINEAR_ATTENTION = (
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
_FULL_ATTENTION = (
    ("self_attn.q_proj.weight", "attn_q.weight", "copy"),
    ("self_attn.k_proj.weight", "attn_k.weight", "copy"),
    ("self_attn.v_proj.weight", "attn_v.weight", "copy"),
    ("self_attn.o_proj.weight", "attn_output.weight", "copy"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", "norm"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", "norm"),
)
# outside the layers: (HF name, GGUF name, transform); {m} is the MTP block's index
_GLOBAL = (
    ("trunk.model.embed_tokens.weight", "token_embd.weight", "copy"),
    ("trunk.model.norm.weight", "output_norm.weight", "norm"),
    ("mtp.fc.weight", "blk.{m}.nextn.eh_proj.weight", "copy"),
    ("mtp.pre_fc_norm_embedding.weight", "blk.{m}.nextn.enorm.weight", "norm"),
    ("mtp.pre_fc_norm_hidden.weight", "blk.{m}.nextn.hnorm.weight", "norm"),
    ("mtp.norm.weight", "blk.{m}.nextn.shared_head_norm.weight", "norm"),
)


class _Transforms:
    """The HF -> llama.cpp value transforms of one model (``forward``) and their inverses."""

    def __init__(self, mc) -> None:
        self.nk, self.nv, self.dk = mc.linear_num_key_heads, mc.linear_num_value_heads, mc.linear_key_head_dim
        self.key_dim = self.nk * self.dk

    def _v(self, x: np.ndarray, axis: int, hd, inverse: bool) -> np.ndarray:
        return _reorder_v_heads(x, axis, self.nk, self.nv, self.dk if hd == "dk" else hd, inverse=inverse)

    def _v_rows(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        kd = self.key_dim
        return np.concatenate([x[: 2 * kd], self._v(x[2 * kd :], 0, "dk", inverse)], axis=0)

    def forward(self, kind, x: np.ndarray) -> np.ndarray:
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

    def inverse(self, kind, x: np.ndarray) -> np.ndarray:
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


def _layers(mc):
    """(HF prefix, GGUF prefix, tensor table) of every decoder layer, the MTP block's last."""
    n = mc.num_hidden_layers
    for il in range(n):
        attention = _LINEAR_ATTENTION if mc.layer_types[il] == "linear_attention" else _FULL_ATTENTION
        yield f"trunk.model.layers.{il}.", f"blk.{il}.", _LAYER + attention
    yield "mtp.layers.0.", f"blk.{n}.", _LAYER + _FULL_ATTENTION


def convert_state_dict(sd: dict[str, np.ndarray], mc) -> dict[str, np.ndarray]:
    """Map a :class:`training.model.DemoModel` state dict to llama.cpp tensors (GGUF names)."""
    tf = _Transforms(mc)
    out: dict[str, np.ndarray] = {}
    for hf, gg, kind in _GLOBAL:
        out[gg.format(m=mc.num_hidden_layers)] = tf.forward(kind, sd[hf])
    for hf_prefix, gg_prefix, table in _layers(mc):
        for hf, gg, kind in table:
            out[gg_prefix + gg] = tf.forward(kind, sd[hf_prefix + hf])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def state_dict_from_gguf(path: str | Path):
    """Inverse of the export: (:class:`ModelConfig`, PyTorch state dict) from a GGUF written here.

    F16 tensors are widened to F32, so a model rebuilt from a shipped F16 file computes in F32
    with exactly the stored values.
    """
    import gguf
    import torch

    from training.model import ModelConfig

    reader = gguf.GGUFReader(str(path))

    def field(key: str):
        return reader.fields[key].contents()

    arch = field("general.architecture")
    if arch != "qwen35":
        raise ValueError(f"not a qwen35 file: {arch}")
    n_all = int(field("qwen35.block_count"))
    n_layer = n_all - int(field("qwen35.nextn_predict_layers"))
    head_dim = int(field("qwen35.attention.key_length"))
    mc = ModelConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=int(field("qwen35.embedding_length")),
        intermediate_size=int(field("qwen35.feed_forward_length")),
        num_hidden_layers=n_layer,
        full_attention_interval=int(field("qwen35.full_attention_interval")),
        num_attention_heads=int(field("qwen35.attention.head_count")),
        num_key_value_heads=int(field("qwen35.attention.head_count_kv")),
        head_dim=head_dim,
        partial_rotary_factor=int(field("qwen35.rope.dimension_count")) / head_dim,
        rope_theta=float(field("qwen35.rope.freq_base")),
        linear_conv_kernel_dim=int(field("qwen35.ssm.conv_kernel")),
        linear_key_head_dim=int(field("qwen35.ssm.state_size")),
        linear_value_head_dim=int(field("qwen35.ssm.state_size")),
        linear_num_key_heads=int(field("qwen35.ssm.group_count")),
        linear_num_value_heads=int(field("qwen35.ssm.time_step_rank")),
        rms_norm_eps=float(field("qwen35.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(field("qwen35.context_length")),
        eos_token_id=int(field("tokenizer.ggml.eos_token_id")),
    )
    t = {x.name: np.array(x.data, dtype=np.float32) for x in reader.tensors}
    tf = _Transforms(mc)
    sd: dict[str, np.ndarray] = {}
    m = n_layer
    for hf, gg, kind in _GLOBAL:
        gg = gg.format(m=m)
        if gg.endswith("shared_head_norm.weight") and gg not in t:
            gg = "output_norm.weight"  # llama.cpp's fallback when the MTP block has no head norm
        sd[hf] = tf.inverse(kind, t[gg])
    sd["trunk.lm_head.weight"] = t.get("output.weight", t["token_embd.weight"])
    for hf_prefix, gg_prefix, table in _layers(mc):
        for hf, gg, kind in table:
            sd[hf_prefix + hf] = tf.inverse(kind, t[gg_prefix + gg])
    return mc, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def model_from_gguf(path: str | Path):
    """A :class:`training.model.DemoModel` (eval mode, F32) holding the weights of a GGUF file."""
    from training.model import DemoModel

    mc, sd = state_dict_from_gguf(path)
    model = DemoModel(mc)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "trunk.lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    return model.eval()


def export_model(model, vocab, out: str | Path, dtype: str = "f32", **metadata) -> Path:
    """Write a GGUF directly from an in-memory :class:`training.model.DemoModel`."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    mc = model.cfg
    return write_qwen35_gguf(out, mc.gguf_config(n_ctx_train=mc.max_position_embeddings),
                             convert_state_dict(sd, mc), vocab, dtype=dtype, extra_metadata=metadata or None)


def export(checkpoint: str | Path = DEFAULT_CHECKPOINT, tokenizer: str | Path = DEFAULT_TOKENIZER,
           out: str | Path = DEFAULT_OUT, dtype: str = "f16") -> Path:
    """Write the GGUF for ``checkpoint`` (+ its tokenizer); returns the path."""
    import torch

    from training.model import ModelConfig
    from training.tokenizer import load_tokenizer, to_gguf_vocab

    ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
    mc = ModelConfig(**ck["model_config"])
    sd = {k: v.float().numpy() for k, v in ck["model"].items()}
    tensors = convert_state_dict(sd, mc)
    vocab = to_gguf_vocab(load_tokenizer(tokenizer))
    tc = ck.get("train_config", {})
    corpus = ck.get("corpus") or _corpus_from_log(Path(checkpoint).parent.parent / "logs" / "train.jsonl")
    return write_qwen35_gguf(
        out,
        mc.gguf_config(n_ctx_train=mc.max_position_embeddings),
        tensors,
        vocab,
        dtype=dtype,
        name="pystdlib-qwen35-mtp",
        description=(
            "mtp-explorer demo model: a tiny qwen35 (gated delta net + gated attention) with one MTP "
            "block, trained from scratch on the Python standard library sources."
        ),
        license="PSF-2.0 (training data); model weights released with the mtp-explorer project",
        extra_metadata={
            "mtp_explorer.training_steps": int(ck["step"]),
            "mtp_explorer.training_seconds": float(ck.get("elapsed_seconds", 0.0)),
            "mtp_explorer.train_config": json.dumps(tc, sort_keys=True),
            **({"mtp_explorer.corpus": json.dumps(corpus, sort_keys=True)} if corpus else {}),
        },
    )


def _corpus_from_log(log: Path) -> dict | None:
    """The corpus record of the training run's ``start`` event, if the log is there."""
    if not log.exists():
        return None
    for line in log.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("event") == "start":
            return row.get("corpus")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--tokenizer", type=Path, default=None, help="default: tokenizer.json beside the checkpoint")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    args = p.parse_args(argv)
    tok = args.tokenizer or args.checkpoint.parent / "tokenizer.json"
    path = export(args.checkpoint, tok, args.out, args.dtype)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
