"""A SYNTHETIC benchmark model at a small real model's scale, written at run time (never committed).

Shape: Qwen3.5's hybrid layout at 0.4 B parameters: n_embd 1024, 16 trunk layers (a gated full-attention
layer every fourth, gated delta nets between), 8 query heads of 256 over 2 KV heads, linear attention with
16 key and 16 value heads of 128, an FFN of 3.5 x n_embd, a 16,384-token byte-level BPE vocabulary, one MTP
block. The weights are random (see ``mtp_explorer.models.synthetic``): the MTP head's acceptance is set by
construction through ``context_mix``, not learnt. The file is written as F16 and quantized to Q8_0 by
llama.cpp's own ``llama-quantize`` (``make quantize``), the way users' files are made.

    .venv/bin/python benchmarks/scale_model.py [--out DIR]     # prints the path and model facts
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from mtp_explorer.devtools.quantize import quantize
from mtp_explorer.models.gguf_qwen35 import Qwen35Config, write_qwen35_gguf
from mtp_explorer.models.synthetic import Knobs, synthetic_tensors, synthetic_vocab, write_synthetic

SCALE_CONFIG = Qwen35Config(
    n_vocab=16_384,
    n_embd=1024,
    n_layer=16,
    n_ff=3584,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    full_attention_interval=4,
    ssm_conv_kernel=4,
    ssm_state_size=128,
    ssm_group_count=16,
    ssm_time_step_rank=16,
    rope_dim=64,
    rope_freq_base=10_000_000.0,
    n_ctx_train=32_768,
)
SCALE_KNOBS = Knobs(seed=0, context_mix=0.1, mtp_fidelity=1.0)  # greedy acceptance ~0.85 at n_max=1
VERSION = 1  # bump when the recipe changes: cached files of another version are rewritten


def scale_model_path(out_dir: str | Path | None = None, file_type: str = "Q8_0") -> Path:
    out_dir = Path(out_dir) if out_dir else Path(tempfile.gettempdir()) / "mtp-explorer-scale"
    return out_dir / f"synthetic-qwen35-0.4b-v{VERSION}-{file_type}.gguf"


def write_scale_model(out_dir: str | Path | None = None, file_type: str = "Q8_0", *, log=print) -> Path:
    """The benchmark model's path, written (F16, then ``llama-quantize`` to ``file_type``) unless a file of
    this recipe's version is already there."""
    dst = scale_model_path(out_dir, file_type)
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    f16 = dst.with_name(dst.stem + ".f16.tmp.gguf")
    t0 = time.perf_counter()
    vocab = synthetic_vocab(SCALE_CONFIG.n_vocab)
    tensors = synthetic_tensors(SCALE_CONFIG, vocab, SCALE_KNOBS)
    write_synthetic(
        write_qwen35_gguf,
        f16,
        SCALE_CONFIG,
        vocab,
        tensors,
        SCALE_KNOBS,
        "qwen35",
        name="mtp-explorer-synthetic-scale",
        dtype="f16",
    )
    del tensors
    log(f"wrote {f16} ({f16.stat().st_size / 2**20:.0f} MiB F16) in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    try:
        quantize(f16, dst, file_type, timeout=1800)
    finally:
        f16.unlink(missing_ok=True)
    log(f"quantized to {file_type}: {dst} ({dst.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s")
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory (default: the system's temporary directory)")
    ap.add_argument("--type", default="Q8_0", help="llama-quantize type (default: Q8_0)")
    args = ap.parse_args()
    import mtp_explorer as mx

    path = write_scale_model(args.out, args.type)
    info = mx.model_info(path)
    print(
        json.dumps(
            {
                "path": str(path),
                "n_params": info.n_params,
                "size": info.size,
                "file_type": info.file_type,
                "rs_slot_bytes": info.rs_slot_bytes,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
