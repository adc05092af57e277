"""The command line of the Hugging Face exporters: a GGUF (``qwen35``: the bundled model; ``step35``; ``gemma4`` and
``gemma4-assistant``) as a Hugging Face checkpoint, optionally converted back with llama.cpp's converter and compared.

    python -m mtp_explorer.devtools.export_checkpoint --out-dir /tmp/hf            # the bundled model -> HF checkpoint
    python -m mtp_explorer.devtools.export_checkpoint --out-dir /tmp/hf --convert /tmp/converted.gguf

See :mod:`.hf_export` (qwen35), :mod:`.step35_hf` and :mod:`.gemma4_hf`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.paths import default_model_path
from ..models.gguf_qwen35 import read_qwen35_metadata
from .gemma4_hf import export_gemma4_checkpoint
from .hf_export import INHERENT_KEYS, convert_with_llama_cpp, diff_gguf, export_hf_checkpoint
from .step35_hf import export_step35_checkpoint


def main(argv: list[str] | None = None) -> int:
    """Command line: export a GGUF as a Hugging Face checkpoint, optionally convert it back and list the differences."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="source GGUF: qwen35, step35, gemma4 or gemma4-assistant (default: the bundled model)",
    )
    p.add_argument("--out-dir", type=Path, required=True, help="where to write the Hugging Face checkpoint")
    p.add_argument(
        "--convert",
        type=Path,
        default=None,
        metavar="OUT.gguf",
        help="also convert the checkpoint with llama.cpp's convert_hf_to_gguf.py and compare",
    )
    p.add_argument("--converter", type=Path, default=None, help="convert_hf_to_gguf.py (default: the sdist's)")
    p.add_argument("--outtype", default="f16", choices=("f32", "f16", "bf16", "q8_0"))
    args = p.parse_args(argv)
    src = args.gguf or default_model_path()
    arch = read_qwen35_metadata(src).get("general.architecture")
    if arch == "step35":
        export = export_step35_checkpoint
    elif arch in ("gemma4", "gemma4-assistant"):
        export = export_gemma4_checkpoint
    else:
        export = export_hf_checkpoint
    out = export(src, args.out_dir)
    print(f"wrote {out}: {', '.join(sorted(f.name for f in out.iterdir()))}")
    if args.convert:
        converted = convert_with_llama_cpp(
            out, args.convert, converter=args.converter, outtype=args.outtype, config_json=arch == "step35"
        )
        print(f"converted to {converted} ({converted.stat().st_size / 1e6:.1f} MB); differences from {src.name}:")
        print(diff_gguf(src, converted, ignore_keys=INHERENT_KEYS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
