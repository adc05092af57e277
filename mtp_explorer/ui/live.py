"""The trace of a generation while it streams: :class:`LiveTrace`.

Built from the engine's column schema (:mod:`mtp_explorer.core.schema`): every step's :class:`Step` record is
written into one padded row of every column (:func:`~mtp_explorer.core.schema.set_row`), so a live trace
holds exactly the columns of a finished one, with the same dtypes and widths.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.schema import TRACE_COLUMN_NAMES, TRACE_COLUMNS, Dims, concat_columns, empty_columns, set_row
from ..core.session import Session
from ..core.trace import Step, Trace

__all__ = ["LiveTrace", "LIVE_COLUMNS", "cached_piece"]

#: The per-step columns a live trace holds: all of a finished trace's (:data:`~mtp_explorer.core.schema.TRACE_COLUMNS`).
LIVE_COLUMNS: tuple[str, ...] = TRACE_COLUMN_NAMES


class LiveTrace:
    """Collects the ``Step``s of a streaming generation and builds the :class:`Trace` so far, with every
    column of a finished trace (same padding, dtypes and widths: ``depth`` is the session's capacity,
    ``topk`` the alternatives it records per depth; without ``topk`` it is the widest seen so far, at
    least 1). ``t_prefill_ns`` is unknown until the end and ``finish_reason`` is ``"running"``."""

    def __init__(
        self, prompt: str, settings: dict, model: dict, depth: int, piece: Callable[[int], str], topk: int | None = None
    ) -> None:
        self.prompt = prompt
        self.settings = settings
        self.model = model
        self.depth = depth
        self.topk = topk
        self.piece = piece
        self.steps: list[Step] = []
        self._columns: dict[str, np.ndarray] | None = None  # the rows so far, concatenated on demand
        self._pending: list[dict[str, np.ndarray]] = []  # rows added since

    @classmethod
    def of(
        cls, session: Session, prompt: str = "", settings: dict | None = None, piece: Callable[[int], str] | None = None
    ) -> LiveTrace:
        """An empty live trace of ``session`` (its model, capacity and top-k)."""
        return cls(
            prompt,
            dict(settings or {}),
            session.info.to_dict(),
            session.capacity,
            piece or session.piece,
            topk=session.open_kwargs.get("topk"),
        )

    def add(self, step: Step) -> None:
        if self.topk is None and self._widen(step):
            self._columns, self._pending = None, []  # rebuild every row at the new width
        self.steps.append(step)
        if self._columns is not None or self._pending:
            self._pending.append(self._row(step))

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def dims(self) -> Dims:
        return Dims(depth=self.depth, topk=self.topk or self._widest_topk())

    def columns(self) -> dict[str, np.ndarray]:
        """Every column of the rows so far."""
        if self._columns is None:
            self._columns = concat_columns([self._row(s) for s in self.steps], self.dims)
            self._pending = []
        elif self._pending:
            self._columns = concat_columns([self._columns, *self._pending], self.dims)
            self._pending = []
        return dict(self._columns)

    def trace(self) -> Trace:
        tokens = [t for s in self.steps for t in s.tokens]
        pieces = [self.piece(t) for t in tokens]
        return Trace(
            prompt=self.prompt,
            prompt_tokens=[],
            tokens=tokens,
            text="".join(pieces),
            pieces=pieces,
            columns=self.columns(),
            finish_reason="running",
            settings=self.settings,
            model=self.model,
        )

    # -- rows --------------------------------------------------------------------------------------
    def _row(self, step: Step) -> dict[str, np.ndarray]:
        row = empty_columns(1, self.dims)
        for column in TRACE_COLUMNS:
            value = getattr(step, column.name)
            if isinstance(value, list) and not value:
                continue  # nothing drafted: the padding stands (set_row cannot size an empty [depth, topk] value)
            set_row(column, row, 0, value)
        return row

    def _widest_topk(self) -> int:
        return max((len(alts) for s in self.steps for alts in s.topk_ids), default=1)

    def _widen(self, step: Step) -> bool:
        """Whether ``step`` has more alternatives per depth than the rows so far (only without ``topk``)."""
        return max((len(alts) for alts in step.topk_ids), default=1) > self._widest_topk()


def cached_piece(session: Session) -> Callable[[int], str]:
    """``session.piece`` with a cache (the views look the same tokens up at every redraw)."""
    cache: dict[int, str] = {}

    def piece(tok: int) -> str:
        tok = int(tok)
        if tok not in cache:
            cache[tok] = session.piece(tok)
        return cache[tok]

    return piece
