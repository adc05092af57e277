"""The child process of :func:`mtp_explorer.core.cpu_kernels.check_extra_buffers`: small SYNTHETIC models (random
weights) decoded with llama.cpp's extra CPU buffer types.

    python -m mtp_explorer.models.cpu_probe      # exit 0: they ran and computed alike

A Q8_0 model decodes one row at a time and in verify batches (the AMX kernels stop the process where they fail);
then an F16 model decodes four sequences in one batch, which must give each sequence's tokens alone (where the AMX
buffer's F16 kernels fail, they do not). Exit ``cpu_kernels.WRONG_RESULTS`` with a line on stderr says the second
failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from ..core.cpu_kernels import PROBE_DIR, WRONG_RESULTS
from ..core.session import Session
from .synthetic import write_synthetic_qwen35

PROMPTS = ("abc", "hello world", "xyz xyz", "the cat")


def main() -> None:
    threads = min(2, os.cpu_count() or 1)  # worker threads too: AMX needs a tile permission in each
    # in the parent's folder (PROBE_DIR): where the AMX kernels stop this process, nothing here could remove it
    with contextlib.ExitStack() as stack:
        tmp = os.environ.get(PROBE_DIR) or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mtp-explorer-cpu-probe-")
        )
        # n_embd 64: every matrix splits into Q8_0 blocks and AMX tiles; 4 layers hold an attention layer
        q8 = write_synthetic_qwen35(Path(tmp) / "probe-q8_0.gguf", n_embd=64, n_layer=4, dtype="q8_0")
        with Session.open(q8, n_ctx=256, threads=threads, repack=True, telemetry="off") as s:
            s.generate("probe the kernels", max_tokens=12, n_max=3)
        f16 = write_synthetic_qwen35(Path(tmp) / "probe-f16.gguf", n_embd=64, n_layer=4, dtype="f16", context_mix=1.0)
        with Session.open(f16, n_ctx=1024, threads=threads, repack=True, telemetry="off", n_parallel=4) as s:
            alone = [s.generate(p, max_tokens=16, n_max=0).tokens for p in PROMPTS]
            together = [t.tokens for t in s.generate_parallel(list(PROMPTS), max_tokens=16, n_max=0).traces]
    differ = sum(a != b for a, b in zip(alone, together))
    if differ:
        print(
            f"llama.cpp's extra CPU buffer types gave {differ} of {len(PROMPTS)} sequences decoded in one batch "
            "other tokens than each alone (F16)",
            file=sys.stderr,
        )
        sys.exit(WRONG_RESULTS)


if __name__ == "__main__":
    main()
