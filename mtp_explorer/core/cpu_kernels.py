"""Whether llama.cpp's extra CPU buffer types run on this machine: the check behind ``repack=None``.

By default llama.cpp (``--repack``) puts a quantized model's CPU weights in an *extra buffer type* when the CPU has
kernels for it: the AMX buffer on a CPU with Intel AMX, else the repacked GEMMs (``CPU_REPACK``). The AMX kernels of
llama.cpp 0.3.36 stop the process on some AMX machines, in llama.cpp's own tools alike: the tile configuration is a
stack variable the compiler can leave invalid, and worker threads are not given the tile-data permission (llama.cpp
PR #26954). On such a machine every Q8_0 or Q4_K model dies with SIGSEGV or SIGILL at its first batch, and an F16
model decodes several sequences of one batch into other (degenerate) tokens than each alone.

:func:`check_extra_buffers` answers for this machine and this llama.cpp build. On a CPU without AMX it answers at once.
On one with AMX it decodes small SYNTHETIC Q8_0 and F16 models with the extra buffer types in a child process
(:mod:`mtp_explorer.models.cpu_probe`), once: the answer is cached per CPU, kernel and ``libggml-cpu`` under
``$MTP_EXPLORER_CACHE`` (default ``~/.cache/mtp-explorer``)/``cpu-kernels``.

:func:`resolve_repack` turns a session's ``repack`` option into what the engine runs: ``None`` is llama.cpp's default
where the check passes and ``-nr`` (no extra buffer types) where it does not, with a :class:`CpuKernelWarning`;
``True`` where the check fails is a :class:`~mtp_explorer.ParameterError`, not a crash. A model without weights of
:data:`AMX_TYPES` (an F32 or BF16 file) keeps llama.cpp's default without a check. :func:`with_no_repack` gives
llama.cpp's own tools (the reference, llama-server) the same placement.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from . import native  # noqa: F401  (loads llama.cpp's libraries)
from .cache import cache_root, write_json
from .errors import CpuKernelWarning, MtpExplorerError, ParameterError
from .info import model_info

FORMAT = 1
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
# the weight types llama.cpp 0.3.36's AMX buffer takes (ggml-cpu/amx/amx.cpp, supports_op: its quantized kernels and
# F16)
AMX_TYPES = frozenset({"F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"})
WRONG_RESULTS = 3  # the probe's exit (models.cpu_probe) when the kernels ran but computed other tokens
PROBE_MODULE = "mtp_explorer.models.cpu_probe"
PROBE_DIR = "MTP_EXPLORER_PROBE_DIR"  # the folder the probe writes its models in (the parent removes it)
PROBE_TIMEOUT = 180.0
_IN_PROBE = "MTP_EXPLORER_CPU_PROBE"  # set in the probe's child: it runs the kernels under test itself


@dataclasses.dataclass(frozen=True)
class ExtraBufferCheck:
    """Whether the extra CPU buffer types run here (``usable``), why (``reason``), and whether a child process decoded
    with them to find out (``probed``; ``signal``: the signal that stopped it, if one did)."""

    usable: bool
    reason: str
    probed: bool = False
    signal: str | None = None


def _cpuinfo(key: str) -> str | None:
    """The first ``key`` line's value in ``/proc/cpuinfo`` (``None`` where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (``/proc/cpuinfo``; empty elsewhere)."""
    return frozenset((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor name elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _ggml_cpu_library() -> str:
    """The ``libggml-cpu`` this process computes with, as path, size and modification time ("" if none is mapped)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return ""
    for line in maps:
        path = line.split()[-1] if line.split() else ""
        if "libggml-cpu" in Path(path).name:
            st = os.stat(path)
            return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    return ""


def _cache_path(flags: frozenset[str]) -> Path:
    key = json.dumps([FORMAT, cpu_model(), sorted(flags & AMX_FLAGS), platform.release(), _ggml_cpu_library()])
    return cache_root() / "cpu-kernels" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def probe(timeout: float = PROBE_TIMEOUT, command: list[str] | None = None) -> ExtraBufferCheck:
    """Decode the probe models with the extra buffer types in a child process (``command``, default
    :data:`PROBE_MODULE`'s) and read how it ended: exit 0 is usable; a signal, :data:`WRONG_RESULTS` (its last line
    on stderr says what differed), another exit or no end within ``timeout`` seconds is not."""
    cmd = command or [sys.executable, "-m", PROBE_MODULE]
    # the probe's models are written in a folder of this process's, removed however the child ends
    with tempfile.TemporaryDirectory(prefix="mtp-explorer-cpu-probe-") as tmp:
        try:
            run = subprocess.run(
                cmd, env=os.environ | {_IN_PROBE: "1", PROBE_DIR: tmp}, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            run = None
    if run is None:
        return ExtraBufferCheck(
            False,
            f"llama.cpp's extra CPU buffer types did not finish a small decode in "
            f"{timeout:.0f} s on this CPU ({cpu_model()})",
            probed=True,
        )
    if run.returncode == 0:
        return ExtraBufferCheck(
            True, f"llama.cpp's extra CPU buffer types decoded the probe on this CPU ({cpu_model()})", probed=True
        )
    if run.returncode < 0:
        name = signal.Signals(-run.returncode).name
        return ExtraBufferCheck(
            False,
            f"llama.cpp's AMX kernels stopped a small Q8_0 decode with {name} on this CPU "
            f"({cpu_model()}; llama.cpp PR #26954)",
            probed=True,
            signal=name,
        )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.returncode == WRONG_RESULTS and lines:
        return ExtraBufferCheck(False, f"{lines[-1]} on this CPU ({cpu_model()})", probed=True)
    tail = " | ".join(lines[-3:])
    return ExtraBufferCheck(
        False, f"the extra CPU buffer types' probe exited with {run.returncode}: {tail}", probed=True
    )


@functools.lru_cache(maxsize=1)
def _checked() -> ExtraBufferCheck:
    flags = cpu_flags()
    if not flags & AMX_FLAGS:
        return ExtraBufferCheck(True, "no AMX on this CPU: llama.cpp's repacked kernels are used as everywhere")
    if os.environ.get(_IN_PROBE):
        return ExtraBufferCheck(True, "inside the probe")
    path = _cache_path(flags)
    try:
        return ExtraBufferCheck(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    found = probe()
    write_json(path, dataclasses.asdict(found))
    return found


def check_extra_buffers(*, refresh: bool = False) -> ExtraBufferCheck:
    """Whether llama.cpp's extra CPU buffer types run on this machine (probed once per CPU, kernel and llama.cpp
    build; ``refresh=True`` probes again)."""
    if refresh:
        _checked.cache_clear()
        if cpu_flags() & AMX_FLAGS:
            _cache_path(cpu_flags()).unlink(missing_ok=True)
    return _checked()


def has_amx_types(tensor_types: Iterable[str]) -> bool:
    """Whether weights of these types (GGUF type names) would go to the AMX buffer (:data:`AMX_TYPES`)."""
    return any(t in AMX_TYPES for t in tensor_types)


def resolve_repack(repack: bool | None, tensor_types: Iterable[str]) -> bool:
    """The ``repack`` a session of a model with weights of ``tensor_types`` runs with: ``False`` as given; ``None``
    (default) llama.cpp's default, unless the model has weights for the AMX kernels and they stop the process here
    (then ``False``, with a :class:`CpuKernelWarning`); ``True`` as given, unless so (then a
    :class:`~mtp_explorer.ParameterError`)."""
    if repack is not None and repack is not True:
        return repack  # False, or a value the session's options refuse
    if not has_amx_types(tensor_types):
        return True
    check = check_extra_buffers()
    if check.usable:
        return True
    if repack is True:
        raise ParameterError(
            f"repack=True would stop this process: {check.reason}. Use repack=None (the default) "
            "or False (llama.cpp's -nr)"
        )
    warnings.warn(
        f"{check.reason}: running without extra buffer types (llama.cpp's -nr, repack=False)",
        CpuKernelWarning,
        stacklevel=3,
    )
    return False


def model_files(argv: Sequence[str]) -> list[str]:
    """The model files (``-m``, ``-md`` and their long names) among a llama.cpp tool's arguments."""
    flags = ("-m", "--model", "-md", "--model-draft")
    return [str(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in flags]


def no_repack_args(*models: str | os.PathLike | None) -> list[str]:
    """``["-nr"]`` for a llama.cpp tool run on ``models`` (``None`` entries and unreadable files ignored) where one
    has weights for the AMX buffer and its kernels fail here, else ``[]``."""
    if check_extra_buffers().usable:
        return []
    types: list[str] = []
    for m in models:
        try:
            types += [] if m is None else list(model_info(Path(m)).tensor_types)
        except (MtpExplorerError, OSError):  # a file the tool itself will refuse, with its own message
            continue
    return ["-nr"] if has_amx_types(types) else []


def with_no_repack(argv: Sequence[str]) -> list[str]:
    """A llama.cpp tool's arguments, with ``-nr`` added where a model file among them (:func:`model_files`) needs it
    here (:func:`no_repack_args`)."""
    return [*argv, *no_repack_args(*model_files(argv))]
