"""Traces: what one generation did, step by step, as columnar numpy arrays.

One row per verify step. Depth-indexed columns have the session's capacity as their width and are
padded with -1 (ids) or NaN (floats) past ``n_drafted`` (``target_tokens`` and ``h_norm_target``
have one more entry: the verified position of the token preceding the draft).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import drafters, metrics
from .errors import FormatError
from .schema import (
    DRAFTERS,
    ENUM_COLUMNS,
    MODEL_FIELDS,
    OPTIONAL_COLUMNS,
    PHASES,
    TRACE_COLUMN_NAMES,
    TRACE_COLUMNS,
    Column,
    check_columns,
    check_fields,
    columns_from_json,
    columns_to_json,
    read_document,
    reading,
    row_value,
)
from .settings import DraftSettings, normalise_recorded

COLUMNS: tuple[str, ...] = TRACE_COLUMN_NAMES
"""The per-step column names, in the engine's order (:data:`~mtp_explorer.core.schema.TRACE_COLUMNS`)."""

#: A saved trace's fields and their kinds (:func:`~mtp_explorer.core.schema.check_fields`).
SAVED_FIELDS: dict[str, str] = {
    "prompt": "str",
    "prompt_tokens": "int[]",
    "tokens": "int[]",
    "text": "str",
    "pieces": "str[]",
    "columns": "dict",
    "finish_reason": "str",
    "settings": "dict",
    "model": "dict",
    "t_prefill_ns": "int",
    "totals": "dict?",
}


def _field_type(c: Column) -> Any:
    item = float if c.dtype.kind == "f" else int
    if c.name in ENUM_COLUMNS:
        return str | None
    if c.name in OPTIONAL_COLUMNS:
        return int | None
    if c.width == "depth*topk":
        return list[list[item]]  # type: ignore[valid-type]
    return list[item] if c.width else item  # type: ignore[valid-type]


class _StepMethods:
    """What a :class:`Step` record adds to its fields."""

    if TYPE_CHECKING:  # fields of every Step (the trace columns), declared for the type checker
        drafted: list[int]
        n_accepted: int
        correction: int

    @property
    def tokens(self) -> list[int]:
        """Tokens this step emitted: the accepted drafts, then the target's correction (or bonus) token."""
        return self.drafted[: self.n_accepted] + [self.correction]

    @classmethod
    def from_columns(cls, cols: dict[str, np.ndarray], i: int) -> Step:
        """Row ``i`` of trace columns as a record."""
        n = int(cols["n_drafted"][i])
        return cls(**{c.name: row_value(c, cols, i, n) for c in TRACE_COLUMNS})  # type: ignore[return-value]


if TYPE_CHECKING:

    class Step(_StepMethods):
        """One draft + verify step: a field per trace column (see :data:`COLUMNS`). Depth-indexed fields hold only the
        real entries (no padding); ``stop_reason`` and ``drafter`` are names (``drafter`` ``None``: no draft),
        ``rs_slot`` is ``None`` without a rollback."""

        def __init__(self, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

else:
    Step = dataclasses.make_dataclass(
        "Step",
        [(c.name, _field_type(c)) for c in TRACE_COLUMNS],
        bases=(_StepMethods,),
        frozen=True,
        namespace={
            "__doc__": "One draft + verify step: a field per trace column (see :data:`COLUMNS`). Depth-indexed "
            "fields hold only the real entries (no padding); ``stop_reason`` and ``drafter`` are names "
            "(``drafter`` ``None``: no draft), ``rs_slot`` is ``None`` without a rollback.",
            "__module__": __name__,
        },
    )


@dataclasses.dataclass
class Trace:
    """A generation's output and per-step telemetry."""

    prompt: str
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    pieces: list[str]
    columns: dict[str, np.ndarray]
    finish_reason: str
    settings: dict[str, Any]
    model: dict[str, Any]
    t_prefill_ns: int = 0
    totals: dict[str, int] | None = None
    """The generation's totals over its steps (``n_steps``, ``n_drafted``, ``n_accepted`` and each phase's
    ``t_<phase>_ns``), kept at every telemetry level: with ``telemetry="off"`` the only record of its steps."""

    # -- views -----------------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        return int(self.columns["step"].shape[0])

    def __len__(self) -> int:
        return self.n_steps

    @property
    def steps(self) -> list[Step]:
        return [Step.from_columns(self.columns, i) for i in range(self.n_steps)]

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getattr__(self, name: str) -> np.ndarray:
        columns = self.__dict__.get("columns")
        if columns is not None and name in columns:
            return columns[name]
        raise AttributeError(name)

    @property
    def draft_settings(self) -> DraftSettings:
        """The drafting settings this generation was asked for (from :attr:`settings`: also after
        :meth:`from_json`); ``set_params`` during the run changed the per-step ``n_max``/``p_min``/``n_min``
        columns, not these."""
        return DraftSettings.from_dict(self.settings)

    @property
    def depth(self) -> int:
        """Width of the depth-indexed columns (the session's n_max capacity)."""
        return int(self.columns["drafted"].shape[1])

    @property
    def token_origin(self) -> np.ndarray:
        """Per generated token: 'accepted' (a verified draft), 'correction' (the target's token after
        a draft), or 'plain' (the target's token in a step without a draft)."""
        out = []
        for n_d, n_a in zip(self.columns["n_drafted"], self.columns["n_accepted"]):
            out += ["accepted"] * int(n_a) + ["correction" if n_d > 0 else "plain"]
        return np.array(out, dtype=object)

    # -- numbers ---------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Acceptance, throughput and time split of the generation (prompt processing excluded). A trace recorded
        with ``telemetry="off"`` has no rows: its summary comes from :attr:`totals` (per-depth acceptance and
        steps by drafter unknown)."""
        if self.n_steps == 0 and self.totals and self.totals.get("n_steps"):
            return self._summary_of_totals()
        c = self.columns
        phases = metrics.phase_seconds(c)
        return {
            "acceptance_rate": metrics.acceptance_rate(c["n_drafted"], c["n_accepted"]),
            "mean_accepted_length": metrics.mean_accepted_length(c["n_accepted"]),
            "acceptance_by_depth": metrics.acceptance_by_depth(c["n_drafted"], c["n_accepted"], self.depth).rate,
            "acceptance_by_head": self.acceptance_by_head(),
            "tokens_per_second": metrics.tokens_per_second(len(self.tokens), sum(phases.values())),
            "n_steps": self.n_steps,
            "n_tokens": len(self.tokens),
            "n_drafted": int(c["n_drafted"].sum()),
            "n_accepted": int(c["n_accepted"].sum()),
            "phase_seconds": phases,
            "prefill_seconds": self.t_prefill_ns / 1e9,
            "rs_slot_bytes": int(self.model.get("rs_slot_bytes", 0)),
            "finish_reason": self.finish_reason,
            "steps_by_drafter": self.steps_by_drafter(),
        }

    def _summary_of_totals(self) -> dict[str, Any]:
        t = cast("dict[str, int]", self.totals)  # called only where the totals are kept
        phases = {p: t[f"t_{p}_ns"] / 1e9 for p in PHASES}
        return {
            "acceptance_rate": metrics.accepted_per_drafted(t["n_accepted"], t["n_drafted"]),
            "mean_accepted_length": t["n_accepted"] / t["n_steps"],
            "acceptance_by_depth": np.full(self.depth, np.nan),
            "acceptance_by_head": [math.nan] * int(self.model.get("n_mtp_heads", 0) or 0),
            "tokens_per_second": metrics.tokens_per_second(len(self.tokens), sum(phases.values())),
            "n_steps": int(t["n_steps"]),
            "n_tokens": len(self.tokens),
            "n_drafted": int(t["n_drafted"]),
            "n_accepted": int(t["n_accepted"]),
            "phase_seconds": phases,
            "prefill_seconds": self.t_prefill_ns / 1e9,
            "rs_slot_bytes": int(self.model.get("rs_slot_bytes", 0)),
            "finish_reason": self.finish_reason,
            "steps_by_drafter": {},
        }

    def acceptance_by_head(self) -> list[float]:
        """Per MTP head of the model (``model["n_mtp_heads"]``), the acceptance of the tokens it drafted: with chained
        heads (``model["mtp_mode"] == "chained"``) head i drafts depth i; one head drafts every depth."""
        c = self.columns
        return metrics.acceptance_by_head(
            c["n_drafted"],
            c["n_accepted"],
            c["drafter"] == DRAFTERS.index(drafters.DRAFT_MTP),
            int(self.model.get("n_mtp_heads", 0) or 0),
            self.model.get("mtp_mode") == "chained",
        )

    def steps_by_drafter(self) -> dict[str, int]:
        """Verified drafts per drafter (``none``: steps without a draft)."""
        return metrics.steps_by_drafter(self.columns["drafter"], DRAFTERS)

    def to_pandas(self):
        """One row per step; depth-indexed columns become lists without padding."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(s) for s in self.steps], columns=list(COLUMNS))

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "columns"}
        doc["columns"] = columns_to_json(self.columns)
        doc["format"] = "mtp-explorer-trace/1"
        return json.dumps(doc, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """The trace :meth:`to_json` wrote; anything else, or a corrupt one, is a :class:`FormatError`."""
        doc = read_document(text, "trace")
        if doc.pop("format", None) != "mtp-explorer-trace/1":
            raise FormatError("not an mtp-explorer trace")
        check_fields(doc, SAVED_FIELDS, "trace", optional=("t_prefill_ns", "totals"))
        check_fields(doc["model"], MODEL_FIELDS, "trace's model", optional=MODEL_FIELDS, exact=False)
        if len(doc["pieces"]) != len(doc["tokens"]):
            raise FormatError(f"a corrupt trace: {len(doc['pieces'])} pieces of {len(doc['tokens'])} tokens")
        totals = doc.get("totals")
        if totals is not None and not (
            set(totals) >= {"n_steps", "n_drafted", "n_accepted"} | {f"t_{p}_ns" for p in PHASES}
            and all(type(v) is int for v in totals.values())
        ):
            raise FormatError("a corrupt trace: its totals are not the step counts and phase times")
        with reading("trace"):
            columns = columns_from_json(doc.pop("columns"), TRACE_COLUMNS)
            check_columns(columns)
            check_steps(columns)
            DraftSettings.from_dict(doc["settings"])  # the settings it records are drafting settings
            doc["settings"] = normalise_recorded(doc["settings"])  # an earlier version's "mtp": "draft-mtp"
            return cls(columns=columns, **doc)


def check_steps(columns: dict[str, np.ndarray]) -> None:
    """A :class:`FormatError` unless every row's names (``drafter``, ``stop_reason``) are indices of their tables and
    ``0 <= n_accepted <= n_drafted <= depth``."""
    for name, names in ENUM_COLUMNS.items():
        values = columns[name]
        if values.size and not (-1 <= values.min() and values.max() < len(names)):
            raise FormatError(f"a corrupt trace: {name} indices outside [-1, {len(names)})")
    n_drafted, n_accepted = columns["n_drafted"], columns["n_accepted"]
    if ((n_accepted < 0) | (n_accepted > n_drafted) | (n_drafted > columns["drafted"].shape[1])).any():
        raise FormatError("a corrupt trace: n_accepted / n_drafted outside 0 <= n_accepted <= n_drafted <= depth")


def drafter_name(cols: dict[str, np.ndarray], i: int) -> str | None:
    """Whose draft step ``i`` verified (``None``: no draft)."""
    d = int(cols["drafter"][i])
    return DRAFTERS[d] if d >= 0 else None
