"""Traces: what one generation did, step by step, as columnar numpy arrays.

One row per verify step. Depth-indexed columns have the session's capacity as their width and are
padded with -1 (ids) or NaN (floats) past ``n_drafted`` (``target_tokens`` and ``h_norm_target``
have one more entry: the verified position of the token preceding the draft).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterator

import numpy as np

STOP_REASONS: tuple[str, ...] = ("n_max", "p_min", "eos", "budget", "context", "exhausted")
"""Why drafting stopped in a step, indexed by the ``stop_reason`` column (``exhausted``: the drafter
had no (more) tokens to propose, e.g. the n-gram look-up found no match)."""

DRAFTERS: tuple[str, ...] = ("mtp", "ngram")
"""Whose draft a step verified, indexed by the ``drafter`` column (-1: no draft)."""

DRAFTER_MODES: tuple[str, ...] = ("mtp", "ngram", "chain")
"""The ``drafter=`` choices of :meth:`Session.generate`: one drafter, or ``chain`` (every drafter is
asked each step and the draft with the highest expected accepted length is verified)."""

FINISH_REASONS: tuple[str, ...] = ("budget", "eos", "context", "cancelled")
"""Why a generation ended."""

PHASES: tuple[str, ...] = ("catchup", "draft", "verify", "sample")

COLUMNS: tuple[str, ...] = (
    "step", "pos", "n_max", "p_min", "n_min",
    "drafted", "n_drafted", "n_accepted", "draft_prob", "topk_ids", "topk_probs",
    "target_tokens", "stop_reason", "correction", "rollback", "rs_slot",
    "h_norm_target", "h_norm_draft", "draft_target_cos",
    "t_catchup_ns", "t_draft_ns", "t_verify_ns", "t_sample_ns",
    "drafter", "expected_accepted", "candidate_len", "candidate_expected",
)


@dataclasses.dataclass(frozen=True)
class Step:
    """One draft + verify step. Lists hold only the real entries (no padding)."""

    step: int
    pos: int
    n_max: int
    p_min: float
    n_min: int
    drafted: list[int]
    n_accepted: int
    draft_prob: list[float]
    topk_ids: list[list[int]]
    topk_probs: list[list[float]]
    target_tokens: list[int]
    stop_reason: str
    correction: int
    rollback: int
    rs_slot: int | None
    h_norm_target: list[float]
    h_norm_draft: list[float]
    draft_target_cos: list[float]
    t_catchup_ns: int
    t_draft_ns: int
    t_verify_ns: int
    t_sample_ns: int
    drafter: str | None = None
    expected_accepted: float = math.nan

    @property
    def n_drafted(self) -> int:
        return len(self.drafted)

    @property
    def tokens(self) -> list[int]:
        """Tokens this step emitted: the accepted drafts, then the target's correction (or bonus) token."""
        return self.drafted[: self.n_accepted] + [self.correction]

    @classmethod
    def from_columns(cls, cols: dict[str, np.ndarray], i: int) -> "Step":
        n = int(cols["n_drafted"][i])
        rs_slot = int(cols["rs_slot"][i])
        return cls(
            step=int(cols["step"][i]),
            pos=int(cols["pos"][i]),
            n_max=int(cols["n_max"][i]),
            p_min=float(cols["p_min"][i]),
            n_min=int(cols["n_min"][i]),
            drafted=cols["drafted"][i, :n].tolist(),
            n_accepted=int(cols["n_accepted"][i]),
            draft_prob=cols["draft_prob"][i, :n].tolist(),
            topk_ids=cols["topk_ids"][i, :n].tolist(),
            topk_probs=cols["topk_probs"][i, :n].tolist(),
            target_tokens=cols["target_tokens"][i, : n + 1].tolist(),
            stop_reason=STOP_REASONS[int(cols["stop_reason"][i])],
            correction=int(cols["correction"][i]),
            rollback=int(cols["rollback"][i]),
            rs_slot=None if rs_slot < 0 else rs_slot,
            h_norm_target=cols["h_norm_target"][i, : n + 1].tolist(),
            h_norm_draft=cols["h_norm_draft"][i, :n].tolist(),
            draft_target_cos=cols["draft_target_cos"][i, :n].tolist(),
            t_catchup_ns=int(cols["t_catchup_ns"][i]),
            t_draft_ns=int(cols["t_draft_ns"][i]),
            t_verify_ns=int(cols["t_verify_ns"][i]),
            t_sample_ns=int(cols["t_sample_ns"][i]),
            drafter=drafter_name(cols, i),
            expected_accepted=float(cols["expected_accepted"][i]) if "expected_accepted" in cols else math.nan,
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
        """Acceptance, throughput and time split of the generation (prompt processing excluded)."""
        c = self.columns
        n_drafted = int(c["n_drafted"].sum())
        n_accepted = int(c["n_accepted"].sum())
        depth = self.depth
        by_depth = []
        for d in range(1, depth + 1):
            reached = c["n_drafted"] >= d
            by_depth.append(float((c["n_accepted"][reached] >= d).mean()) if reached.any() else math.nan)
        phase_seconds = {p: float(c[f"t_{p}_ns"].sum()) / 1e9 for p in PHASES}
        total = sum(phase_seconds.values())
        return {
            "acceptance_rate": n_accepted / n_drafted if n_drafted else math.nan,
            "mean_accepted_length": float(c["n_accepted"].mean()) if self.n_steps else math.nan,
            "acceptance_by_depth": by_depth,
            "tokens_per_second": len(self.tokens) / total if total > 0 else math.nan,
            "n_steps": self.n_steps,
            "n_tokens": len(self.tokens),
            "n_drafted": n_drafted,
            "n_accepted": n_accepted,
            "phase_seconds": phase_seconds,
            "prefill_seconds": self.t_prefill_ns / 1e9,
            "rs_slot_bytes": int(self.model.get("rs_slot_bytes", 0)),
            "finish_reason": self.finish_reason,
            "steps_by_drafter": self.steps_by_drafter(),
        }

    def steps_by_drafter(self) -> dict[str, int]:
        """Verified drafts per drafter (``none``: steps without a draft)."""
        c = self.columns
        if "drafter" in c:
            d = c["drafter"]
        else:
            d = np.where(c["n_drafted"] > 0, 0, -1)
        out = {name: int((d == i).sum()) for i, name in enumerate(DRAFTERS)}
        out["none"] = int((d < 0).sum())
        return out

    def to_pandas(self):
        """One row per step; depth-indexed columns become lists without padding."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(s) | {"n_drafted": s.n_drafted} for s in self.steps])

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "columns"}
        doc["columns"] = columns_to_json(self.columns)
        doc["format"] = "mtp-explorer-trace/1"
        return json.dumps(doc, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        doc = json.loads(text)
        if doc.pop("format", None) != "mtp-explorer-trace/1":
            raise ValueError("not an mtp-explorer trace")
        return cls(columns=columns_from_json(doc.pop("columns")), **doc)


def columns_to_json(columns: dict[str, np.ndarray]) -> dict[str, dict]:
    """Numpy columns as JSON-ready dicts (dtype, shape, data; NaN as null)."""
    out = {}
    for name, arr in columns.items():
        data = arr.tolist()
        if arr.dtype.kind == "f":
            data = _nan_to_none(data)
        out[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}
    return out


def columns_from_json(specs: dict[str, dict]) -> dict[str, np.ndarray]:
    """The inverse of :func:`columns_to_json`."""
    out = {}
    for name, spec in specs.items():
        data = spec["data"]
        if np.dtype(spec["dtype"]).kind == "f":
            data = _none_to_nan(data)
        out[name] = np.array(data, dtype=spec["dtype"]).reshape(spec["shape"])
    return out


def drafter_name(cols: dict[str, np.ndarray], i: int) -> str | None:
    """Whose draft step ``i`` verified (``None``: no draft; traces without the column: MTP)."""
    if "drafter" in cols:
        d = int(cols["drafter"][i])
        return DRAFTERS[d] if d >= 0 else None
    return DRAFTERS[0] if int(cols["n_drafted"][i]) > 0 else None


def _nan_to_none(x):
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _none_to_nan(x):
    if isinstance(x, list):
        return [_none_to_nan(v) for v in x]
    return math.nan if x is None else x
