"""Shared helpers of the benchmark scripts: model choice and JSON output."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import mtp_explorer as mx

#: The prompt categories of the recommendation and schedule benchmarks: code, and prose.
CATEGORIES = {
    "code": [
        "def fibonacci(n):\n",
        "import json\n\n\nclass Config:\n",
        "for i in range(10):\n",
        "SELECT name, count(*) FROM",
    ],
    "prose": [
        "The history of the printing press begins",
        "Dear team,\n\nThank you all for your work this quarter.",
        "Once upon a time, in a small village,",
        "# Copyright (c)",
    ],
}


def pick_model(path: str | None) -> tuple[Path, str]:
    """The model to measure: the given path, else the bundled model, else a SYNTHETIC one (labelled)."""
    if path:
        return Path(path), "given"
    try:
        return mx.default_model_path(), "bundled"
    except mx.ModelNotFoundError:
        from mtp_explorer.models.synthetic import write_synthetic_qwen35

        out = Path(tempfile.gettempdir()) / "mtp-explorer-bench-synthetic.gguf"
        write_synthetic_qwen35(out, context_mix=0.6, mtp_fidelity=1.0)
        return out, "synthetic (random weights, context_mix=0.6, mtp_fidelity=1.0)"


def machine() -> dict:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


#: The SYNTHETIC models of llama.cpp's other two draft-mtp modes the benchmarks measure: chained heads whose fidelity
#: falls head by head (step35) and a shared-memory head file (gemma4 + its gemma4-assistant head).
STEP35_KNOBS = {"context_mix": 0.25, "head_fidelity": (0.9, 0.6, 0.3)}
GEMMA4_KNOBS = {"context_mix": 0.5}


def write_mode_models(folder: Path) -> list[tuple[Path, Path | None, str]]:
    """(target, head file or None, description) of each SYNTHETIC draft-mtp mode model, written into ``folder``."""
    from mtp_explorer.models.synthetic_gemma4 import write_synthetic_gemma4
    from mtp_explorer.models.synthetic_step35 import write_synthetic_step35

    step35 = write_synthetic_step35(folder / "step35.gguf", **STEP35_KNOBS)
    gemma4, head = write_synthetic_gemma4(folder / "gemma4.gguf", folder / "gemma4-head.gguf", **GEMMA4_KNOBS)
    return [
        (step35, None, f"synthetic step35 (random weights, 3 chained MTP heads, {STEP35_KNOBS})"),
        (gemma4, head, f"synthetic gemma4 + gemma4-assistant head (random weights, shared memory, {GEMMA4_KNOBS})"),
    ]
