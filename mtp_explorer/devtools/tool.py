"""Running one of llama.cpp's tools (``llama-quantize``, ``convert_hf_to_gguf.py``) that writes one file."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_tool(
    cmd: Sequence[str],
    out: Path,
    error: type[Exception],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    tail: int = 6000,
) -> Path:
    """Run ``cmd``, which writes ``out`` (removed first); ``out`` once it exists. A non-zero exit, a missing
    ``out`` or a run past ``timeout`` seconds raises ``error`` with the command and the tail of its output."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [str(c) for c in cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise error(f"{' '.join(cmd)} ran past {timeout} s:\n{_tail(exc.stdout, exc.stderr, tail)}") from exc
    if proc.returncode != 0 or not out.is_file():
        raise error(
            f"{' '.join(cmd)} exited with {proc.returncode}"
            f"{'' if out.is_file() else ' and wrote nothing'}:\n{_tail(proc.stdout, proc.stderr, tail)}"
        )
    return out


def _tail(stdout, stderr, n: int) -> str:
    def text(x) -> str:
        return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")

    return (text(stdout) + "\n" + text(stderr)).strip()[-n:]
