"""Quantized copies of a GGUF model, made with llama.cpp's own ``llama-quantize``.

The tool is built from the same llama-cpp-python 0.3.36 sources as the engine's libllama, beside the
reference driver (``make quantize`` puts it in ``build/reference/bin``; ``make test`` builds it). Set
``MTP_EXPLORER_QUANTIZE`` to use another binary.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import ParameterError, ToolError
from .tool import run_tool

ENV_VAR = "MTP_EXPLORER_QUANTIZE"
DEFAULT_BINARY = Path(__file__).resolve().parents[2] / "build" / "reference" / "bin" / "llama-quantize"


class QuantizeError(ToolError):
    """llama-quantize failed, timed out or wrote nothing."""


def find_quantize(binary: str | Path | None = None) -> Path:
    """The ``llama-quantize`` to run: ``binary`` if given, else ``$MTP_EXPLORER_QUANTIZE``, else the one
    ``make quantize`` builds. Raises :class:`FileNotFoundError` saying how to get it."""
    if binary is not None:
        path, origin = Path(binary), "the binary given"
    elif os.environ.get(ENV_VAR):
        path, origin = Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    else:
        path, origin = DEFAULT_BINARY, "the default location"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"llama-quantize not found at {path} ({origin}). Build it with `make quantize` (llama.cpp's tool from "
            f"the same llama-cpp-python 0.3.36 sources, into build/reference/bin), or set {ENV_VAR} to its path."
        )
    return path


def quantize(
    src: str | Path,
    dst: str | Path,
    type: str,
    *,
    binary: str | Path | None = None,
    threads: int = 2,
    args: tuple[str, ...] = (),
    timeout: float = 300,
) -> Path:
    """Write ``dst``, ``src`` quantized to ``type`` (a llama-quantize type name: ``"Q8_0"``, ``"Q4_K_M"``, ...)
    by running ``llama-quantize [args] src dst type threads``. Raises :class:`QuantizeError` with the tool's
    output when it fails or runs past ``timeout`` seconds."""
    exe = find_quantize(binary)
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"model file not found: {src}")
    if dst.resolve() == src.resolve():
        raise ParameterError(f"llama-quantize would overwrite its input: {src}")
    return run_tool([exe, *args, src, dst, type, int(threads)], dst, QuantizeError, timeout=timeout, tail=4000)
