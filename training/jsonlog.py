"""The training scripts' run logs: one JSON object per line, stamped with the time, flushed and echoed."""

from __future__ import annotations

import json
import time
from pathlib import Path


class JsonLog:
    """One JSON object per line, appended to a file (or starting it anew) and echoed to stdout."""

    def __init__(self, path: Path, append: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a" if append else "w", encoding="utf-8")

    def __call__(self, obj: dict) -> None:
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **obj})
        self.f.write(line + "\n")
        self.f.flush()
        print(line, flush=True)
