"""Every SYNTHETIC model the project can write, by architecture: what ``mtp-explorer synth`` runs.

Each writer takes an output folder and the knobs of :class:`~.synthetic.Knobs` and returns the files it wrote,
the target first, then the head file where the architecture's MTP mode needs one (``gemma4``'s assistant).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ParameterError
from .synthetic import write_synthetic_qwen35
from .synthetic_gemma4 import write_synthetic_gemma4
from .synthetic_glm4moe import write_synthetic_glm4moe
from .synthetic_qwen35moe import write_synthetic_qwen35moe
from .synthetic_step35 import write_synthetic_step35

__all__ = ["SYNTH_ARCHS", "write_synth"]


def _qwen35(out: Path, **knobs) -> list[Path]:
    return [write_synthetic_qwen35(out / "synthetic-qwen35.gguf", **knobs)]


def _qwen35moe(out: Path, **knobs) -> list[Path]:
    return [write_synthetic_qwen35moe(out / "synthetic-qwen35moe.gguf", **knobs)]


def _glm4moe(out: Path, **knobs) -> list[Path]:
    return [write_synthetic_glm4moe(out / "synthetic-glm4moe.gguf", **knobs)]


def _step35(out: Path, **knobs) -> list[Path]:
    return [write_synthetic_step35(out / "synthetic-step35.gguf", **knobs)]


def _gemma4(out: Path, **knobs) -> list[Path]:
    return list(write_synthetic_gemma4(out / "synthetic-gemma4.gguf", **knobs))


#: Architecture -> (its MTP mode, the writer). The files of each are described in its writer's module.
SYNTH_ARCHS: dict[str, tuple[str, Callable[..., list[Path]]]] = {
    "qwen35": ("single", _qwen35),
    "qwen35moe": ("single", _qwen35moe),
    "glm4moe": ("single", _glm4moe),
    "step35": ("chained", _step35),
    "gemma4": ("shared_memory", _gemma4),
}


def _writable_dir(out: str | os.PathLike) -> Path:
    """``out`` as a folder this process can write into (created with its parents if missing), else a
    :class:`ParameterError` saying why not."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ParameterError(f"cannot write the models into {out}: it is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParameterError(f"cannot create the folder {out}: {exc.strerror or exc}") from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise ParameterError(f"cannot write the models into {out}: permission denied")
    return out


def write_synth(arch: str, out: str | os.PathLike, **knobs) -> list[Path]:
    """Write the SYNTHETIC model of ``arch`` (one of :data:`SYNTH_ARCHS`) into the folder ``out`` with ``knobs``
    (``seed``, ``context_mix``, ``mtp_fidelity``, ...); returns the paths, the target first."""
    if arch not in SYNTH_ARCHS:
        raise ParameterError(
            f"unknown architecture {arch!r}: SYNTHETIC models are written for " + ", ".join(SYNTH_ARCHS)
        )
    folder = _writable_dir(out)
    try:
        return SYNTH_ARCHS[arch][1](folder, **knobs)
    except PermissionError as exc:
        raise ParameterError(f"cannot write the models into {folder}: {exc.strerror or exc}") from exc
