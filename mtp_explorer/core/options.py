"""How a session is opened: its options, checked once, and the engine's options struct built from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import _native
from .checks import check_int
from .errors import ParameterError

DEFAULT_N_RS_SEQ = 8
MAX_TOPK = _native.DRAFT_N_CANDIDATES
CLOCKS = ("wall", "cpu")


@dataclasses.dataclass(frozen=True)
class SessionOptions:
    """The options of :meth:`Session.open <mtp_explorer.Session.open>` (see its docstring), checked.

    ``n_ctx`` is padded to a multiple of 256 as llama.cpp pads the context, so the batch is sized alike.
    """

    n_ctx: int = 4096
    threads: int | None = None
    seed: int = 0
    n_rs_seq: int = DEFAULT_N_RS_SEQ
    topk: int = 5
    telemetry: bool = True
    clock: str = "wall"

    def __post_init__(self) -> None:
        check_int("n_ctx", self.n_ctx, 8, None)
        object.__setattr__(self, "n_ctx", -(-self.n_ctx // 256) * 256)
        check_int("n_rs_seq", self.n_rs_seq, 1, 64)
        check_int("topk", self.topk, 1, MAX_TOPK)
        check_int("seed", self.seed, 0, 2**32 - 1)
        if self.threads is not None:
            check_int("threads", self.threads, 1, None)
        if self.clock not in CLOCKS:
            raise ParameterError(f"clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.clock == "cpu" and self.threads != 1:
            raise ParameterError("clock='cpu' needs threads=1 (llama.cpp then computes on the calling thread)")

    def to_native(self, path: str) -> "_native.EngineOptions":
        return _native.EngineOptions(path=path, n_ctx=self.n_ctx, n_threads=self.threads or 0,
                                     n_rs_seq=self.n_rs_seq, topk=self.topk, telemetry=bool(self.telemetry),
                                     cpu_clock=self.clock == "cpu")

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that re-open a session like this one (a Dask worker uses them)."""
        return dataclasses.asdict(self)
