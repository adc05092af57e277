"""Greedy MTP acceptance of the SYNTHETIC models of llama.cpp's two other draft-mtp modes, measured with llama.cpp's
own driver (the engine does not run these modes yet): ``step35`` (3 chained heads) and ``gemma4`` with its
``gemma4-assistant`` head file (shared memory, ``-md``). For each knob setting it writes the model, runs
``llama-speculative-simple --spec-type draft-mtp`` (``-t 1 -c 512 --temp 0 -n 48``) on four prompts at ``n_max`` 1, 3
and 5, and prints the pooled acceptance (accepted / drafted) as the rows of ``mtp_explorer/models/SYNTHETIC.md``.

    .venv/bin/python benchmarks/synthetic_modes.py [--binary build/reference/bin/llama-speculative-simple]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from mtp_explorer.devtools.reference import run_reference_spec
from mtp_explorer.models.synthetic_gemma4 import write_synthetic_gemma4
from mtp_explorer.models.synthetic_step35 import write_synthetic_step35

PROMPTS = ["def f(x):", "import os\n", "class A:\n    pass\n", "for i in range(10):"]
N_MAX = (1, 3, 5)
KNOBS = [
    {},
    {"context_mix": 0.25},
    {"context_mix": 0.5},
    {"context_mix": 1.0},
    {"context_mix": 2.0},
    {"mtp_fidelity": 0.75},
    {"mtp_fidelity": 0.5},
    {"mtp_fidelity": 0.0},
]
STEP35_ONLY = [{"head_fidelity": (1.0, 0.75, 0.5)}, {"head_fidelity": (1.0, 0.0, 0.0)}]


def acceptance(binary: Path, target: Path, head: Path | None, n_max: int) -> tuple[int, int]:
    """Pooled (accepted, drafted) over :data:`PROMPTS`."""
    spec = (["-md", str(head)] if head else []) + ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
    runs = [run_reference_spec(binary, target, p, spec, max_tokens=48, n_ctx=512, threads=1) for p in PROMPTS]
    return sum(r.n_accept for r in runs), sum(r.n_drafted for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=Path("build/reference/bin/llama-speculative-simple"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for arch, knobs_list in (("step35", KNOBS + STEP35_ONLY), ("gemma4", KNOBS)):
            print(f"## {arch}")
            for knobs in knobs_list:
                if arch == "step35":
                    target, head = write_synthetic_step35(Path(tmp, "m.gguf"), **knobs), None
                else:
                    target, head = write_synthetic_gemma4(Path(tmp, "m.gguf"), **knobs)
                cells = []
                for n_max in N_MAX:
                    accepted, drafted = acceptance(args.binary, target, head, n_max)
                    cells.append(f"{accepted / drafted:.2f} ({accepted}/{drafted})")
                label = ", ".join(f"{k} {v}" for k, v in knobs.items()) or "mix 0, fidelity 1"
                print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
