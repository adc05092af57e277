"""Where mtp-explorer keeps what it measured once per machine (batch-shape shifts, the CPU kernel check)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$MTP_EXPLORER_CACHE``, default ``~/.cache/mtp-explorer``."""
    return Path(os.environ.get("MTP_EXPLORER_CACHE", Path.home() / ".cache" / "mtp-explorer"))


def write_json(path: Path, doc: Any) -> None:
    """Written whole to a temporary file, then renamed: a concurrent reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, allow_nan=False))
    os.replace(tmp, path)
