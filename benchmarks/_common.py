"""Shared helpers of the benchmark scripts: model choice and JSON output."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import mtp_explorer as mx


def pick_model(path: str | None) -> tuple[Path, str]:
    """The model to measure: the given path, else the bundled model, else a SYNTHETIC one (labelled)."""
    if path:
        return Path(path), "given"
    try:
        return mx.default_model_path(), "bundled"
    except mx.ModelNotFoundError:
        from mtp_explorer.devtools.synthetic import write_synthetic_qwen35

        out = Path(tempfile.gettempdir()) / "mtp-explorer-bench-synthetic.gguf"
        write_synthetic_qwen35(out, context_mix=0.6, mtp_fidelity=1.0)
        return out, "synthetic (random weights, context_mix=0.6, mtp_fidelity=1.0)"


def machine() -> dict:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
