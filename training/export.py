"""Export a training checkpoint to a ``qwen35`` GGUF with its MTP block.

    python -m training.export                                   # shipped file (F16)
    python -m training.export --dtype f32 --out /tmp/model-f32.gguf
    python -m training.export --checkpoint path/to/last.pt --tokenizer path/to/tokenizer.json
    python -m training.export --rewrite mtp_explorer/models/pystdlib-qwen35-mtp.gguf   # same tensors, current metadata

The Hugging Face -> llama.cpp transforms are the ones llama.cpp's own converter applies to
Qwen3.5 checkpoints (``conversion/qwen.py``); the table of tensors and transforms, used in both
directions, is :mod:`mtp_explorer.devtools.qwen35_hf` (the demo model's trunk is a
``Qwen3_5ForCausalLM`` under ``trunk.``, its MTP block the ``mtp.*`` tensors of Qwen3.5 checkpoints).
:mod:`mtp_explorer.devtools.hf_export` writes the shipped file back as a Hugging Face checkpoint and
converts that with llama.cpp's ``convert_hf_to_gguf.py``, which gives the same tensors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mtp_explorer.devtools.qwen35_hf import gguf_to_hf, hf_to_gguf
from mtp_explorer.models.gguf_qwen35 import write_qwen35_gguf

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHECKPOINT = ROOT / "training" / "checkpoints" / "last.pt"
DEFAULT_TOKENIZER = ROOT / "training" / "checkpoints" / "tokenizer.json"
SHIPPED_NAME = "pystdlib-qwen35-mtp.gguf"
DEFAULT_OUT = ROOT / "mtp_explorer" / "models" / SHIPPED_NAME
#: where DemoModel keeps the Qwen3_5ForCausalLM trunk's decoder (a checkpoint of that class has "model.")
TRUNK_PREFIX = "trunk.model."


def convert_state_dict(sd: dict[str, np.ndarray], mc) -> dict[str, np.ndarray]:
    """Map a :class:`training.model.DemoModel` state dict to llama.cpp tensors (GGUF names)."""
    return hf_to_gguf(sd, mc.gguf_config(n_ctx_train=mc.max_position_embeddings), trunk_prefix=TRUNK_PREFIX)


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
    sd = gguf_to_hf(t, mc.gguf_config(n_ctx_train=mc.max_position_embeddings), trunk_prefix=TRUNK_PREFIX)
    sd["trunk.lm_head.weight"] = t.get("output.weight", t["token_embd.weight"])
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
    return write_qwen35_gguf(
        out,
        mc.gguf_config(n_ctx_train=mc.max_position_embeddings),
        convert_state_dict(sd, mc),
        vocab,
        dtype=dtype,
        extra_metadata=metadata or None,
    )


def export(
    checkpoint: str | Path = DEFAULT_CHECKPOINT,
    tokenizer: str | Path = DEFAULT_TOKENIZER,
    out: str | Path = DEFAULT_OUT,
    dtype: str = "f16",
) -> Path:
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


def rewrite(src: str | Path, out: str | Path) -> Path:
    """Write the GGUF ``src`` (made by :func:`export`) again through the current writer: the same tensors bit
    for bit (F16 stays F16: it is widened to F32 and narrowed back exactly), the same name, description,
    licence and ``mtp_explorer.*`` metadata, plus whatever metadata the writer adds now. ``out`` may be ``src``."""
    import gguf

    from mtp_explorer.devtools.qwen35_hf import config_from_metadata
    from mtp_explorer.models.gguf_qwen35 import read_qwen35_metadata
    from training.tokenizer import vocab_from_gguf

    meta = read_qwen35_metadata(src)
    reader = gguf.GGUFReader(str(src))
    types = {t.tensor_type.name for t in reader.tensors}
    if not types <= {"F16", "F32"}:
        raise ValueError(f"{src}: only F16/F32 files can be rewritten, not {sorted(types)}")
    tensors = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    vocab = vocab_from_gguf(src)
    extra = {k: v for k, v in meta.items() if k.startswith("mtp_explorer.")}
    del reader  # the file is memory-mapped; out may be src, so write beside it and replace
    out = Path(out)
    tmp = write_qwen35_gguf(
        out.with_name(out.name + ".tmp"),
        config_from_metadata(meta),
        tensors,
        vocab,
        dtype="f16" if "F16" in types else "f32",
        name=str(meta["general.name"]),
        description=meta.get("general.description"),
        license=meta.get("general.license"),
        extra_metadata=extra,
    )
    return tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--tokenizer", type=Path, default=None, help="default: tokenizer.json beside the checkpoint")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    p.add_argument(
        "--rewrite",
        type=Path,
        default=None,
        metavar="GGUF",
        help="instead of exporting a checkpoint, write this GGUF (made here) again with the current "
        "writer: same tensors, current metadata (see rewrite())",
    )
    args = p.parse_args(argv)
    if args.rewrite is not None:
        path = rewrite(args.rewrite, args.out)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
        return 0
    tok = args.tokenizer or args.checkpoint.parent / "tokenizer.json"
    path = export(args.checkpoint, tok, args.out, args.dtype)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
