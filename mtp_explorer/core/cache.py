"""Where mtp-explorer keeps what it measured once per machine (batch-shape shifts, the CPU kernel check)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$MTP_EXPLORER_CACHE``, default ``~/.cache/mtp-explorer``."""
    return Path(os.environ.get("MTP_EXPLORER_CACHE", Path.home() / ".cache" / "mtp-explorer"))
