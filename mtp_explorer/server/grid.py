"""The grid of a server sweep: its keys (llama.cpp's option names) and llama-server's flags for them, the
configurations a grid spans, and one configuration's llama-server command line."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.cpu_kernels import with_no_repack
from ..core.errors import ParameterError

#: The grid's keys (llama.cpp's option names without dashes) and llama-server's long flags for them.
GRID_FLAGS: Mapping[str, str] = {
    "spec_type": "--spec-type",
    "n_max": "--spec-draft-n-max",
    "n_min": "--spec-draft-n-min",
    "p_min": "--spec-draft-p-min",
    "n_parallel": "--parallel",
    "n_gpu_layers": "--n-gpu-layers",
    "flash_attn": "--flash-attn",
    "type_k": "--cache-type-k",
}
#: The grid's keys that set speculative decoding: a plain configuration (``spec_type`` none) passes none of them.
SPECULATIVE_KEYS = frozenset({"spec_type", "n_max", "n_min", "p_min"})


def configurations(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the grid's order (a key of :data:`GRID_FLAGS` each); plain decoding
    (``spec_type`` none) once per combination of the other keys, with the first value of each speculative key (it
    passes none of them to llama-server: :data:`SPECULATIVE_KEYS`)."""
    unknown = sorted(set(grid) - set(GRID_FLAGS))
    if {"schedule", "window"} & set(unknown):
        raise ParameterError(
            "llama-server drafts with a fixed --spec-draft-n-max: a draft-length schedule is the explorer's own (the "
            "engine and the what-if run it, llama.cpp 0.3.36 does not), so a server sweep cannot run one; sweep n_max"
        )
    if unknown:
        raise ParameterError(f"unknown grid key(s) {unknown}; the grid takes {sorted(GRID_FLAGS)}")
    lists = grid_lists(grid)
    for key, vals in lists.items():
        if not vals:
            raise ParameterError(f"the grid's {key} has no values")
    out, seen = [], set()
    for combo in itertools.product(*lists.values()):
        config = dict(zip(lists, combo))
        if is_plain(config):
            key = tuple(sorted((k, str(v)) for k, v in passed_settings(config).items()))
            if key in seen:
                continue
            seen.add(key)
        out.append(config)
    return out


def grid_lists(grid: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The grid with every value a list (a single value stands for a list of one)."""
    return {k: [v] if isinstance(v, (str, int, float)) else list(v) for k, v in grid.items()}


def is_plain(config: Mapping[str, Any]) -> bool:
    """A configuration whose grid says plain decoding (``spec_type`` none; a grid without ``spec_type`` says
    nothing)."""
    return "spec_type" in config and config["spec_type"] in (None, "none")


def passed_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a configuration that llama-server is given: a plain one's without the speculative ones."""
    return {k: v for k, v in config.items() if not (is_plain(config) and k in SPECULATIVE_KEYS)}


def server_flags(config: Mapping[str, Any], draft_model: str | os.PathLike | None) -> list[str]:
    """A configuration's llama-server flags besides the slots (``--parallel``)."""
    argv = []
    for key, value in passed_settings(config).items():
        if key != "n_parallel":
            argv += [GRID_FLAGS[key], str(value)]
    return argv + ([] if draft_model is None else ["-md", str(draft_model)])


def command_line(
    model: str | os.PathLike,
    config: Mapping[str, Any],
    *,
    draft_model: str | os.PathLike | None = None,
    n_ctx: int = 4096,
    threads: int = 2,
) -> list[str]:
    """The llama-server arguments of one configuration (after the binary; without host and port; ``-nr`` where
    llama.cpp's extra CPU buffer types stop the process: :func:`~mtp_explorer.check_extra_buffers`)."""
    return with_no_repack(
        [
            "-m",
            str(model),
            "--parallel",
            str(config.get("n_parallel", 1)),
            "-c",
            str(n_ctx),
            "-t",
            str(threads),
            "--metrics",
            "--no-webui",
            *server_flags(config, draft_model),
        ]
    )
