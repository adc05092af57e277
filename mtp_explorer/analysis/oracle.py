"""Oracle traces: one greedy generation that answers every what-if.

Under greedy decoding the generated tokens do not depend on ``n_max``, ``p_min``, ``n_min`` or the
drafter, and the draft the engine proposes at a position depends only on the tokens before it
(the MTP head is always caught up on the verified rows; the n-gram look-up reads the history). So
one recording that keeps, for every position, the greedy token, the MTP draft chain of length
``depth`` (drafted with ``p_min = 0``: any ``p_min`` cut is a prefix of it) and the n-gram draft,
lets :func:`mtp_explorer.analysis.simulate` replay any policy with ``n_max <= depth`` without the model.

:func:`record_oracle` (``Session.record_oracle``) records it natively: plain decoding, one token per step, and at every
position every drafter's draft (in per-drafter columns, indexed by the drafter: its replay in
:mod:`~mtp_explorer.analysis.replay` reads its slice), and timing probes of every operation a speculative step is
made of, from which :class:`CostModel` fits this machine's cost model: target verify of ``k``
tokens (``k = 1 .. depth + 1``), MTP draft calls of ``m`` decodes, MTP catch-up of ``k`` rows, the
sample phase and the n-gram look-up, each a robust line in the position (attention reads a KV cache
that grows with it), plus what a verify costs extra when llama.cpp must build its compute graph
anew (the previous target batch had another size) and when the MTP head ran since the last target
decode (cold caches). Robust fits (medians, Theil-Sen lines) keep the spikes of other processes on
a shared machine out of the model.

The probes: at even positions a verify batch of ``k = 2 .. depth + 1`` tokens (round robin) is
decoded twice (new graph after the MTP chain, then reused at once), caught up on the MTP context,
argmaxed, and rolled back the way the engine does (``k - 1`` tokens, within the ``n_rs_seq``
snapshot slots: hence ``depth <= capacity``); at odd positions the plain step's token is decoded
once more after the chain. A probe's whole batch must then leave the target memory, which the
snapshot slots cannot do (llama.cpp's gated delta-net keeps snapshots of the states *inside* a
batch, not of the state before it), so the target's recurrent state is saved before the probe and
restored after it (``llama_state_seq_*_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) and
the batch's KV cells removed. The tests check that the recorded tokens equal plain decoding.
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import drafters, hooks
from ..core.drafters import DRAFTER_SPECS, DrafterMode, DrafterSpec
from ..core.errors import FormatError
from ..core.options import is_full_telemetry
from ..core.schema import (
    MODEL_FIELDS,
    ORACLE_COLUMNS,
    Column,
    Dims,
    check_columns,
    check_fields,
    columns_from_json,
    columns_to_json,
    read_document,
    reading,
)
from ..core.settings import Limits
from .batch_shift import BatchShift, measure

if TYPE_CHECKING:
    from ..core.handle import Prompt
    from ..core.session import Session
    from .replay import DrafterReplay

ORACLE_FORMAT = "mtp-explorer-oracle/2"
#: Formats this version cannot read: their columns were laid out per drafter and quantity (``/1``).
_OLD_FORMATS = ("mtp-explorer-oracle/1",)

#: An oracle recording's columns: the engine's (:data:`~mtp_explorer.core.schema.ORACLE_COLUMNS`) and
#: ``token_eog`` (the greedy token ends the generation), which the session adds.
ORACLE_SCHEMA: tuple[Column, ...] = ORACLE_COLUMNS + (Column("token_eog", np.dtype(bool), ""),)

#: A saved oracle's fields and their kinds (:func:`~mtp_explorer.core.schema.check_fields`).
SAVED_FIELDS: dict[str, str] = {
    "prompt": "str",
    "prompt_tokens": "int[]",
    "tokens": "int[]",
    "pieces": "str[]",
    "text": "str",
    "columns": "dict",
    "finish_reason": "str",
    "settings": "dict",
    "model": "dict",
    "wall_seconds": "float",
    "cost_model": "dict?",
    "batch_shift": "dict?",
}
#: The settings an oracle reads, and their kinds.
SAVED_SETTINGS: dict[str, str] = {
    "depth": "int",
    "max_tokens": "int",
    "has_mtp": "bool",
    "has_draft_model": "bool|str",
    "telemetry": "any",
}
#: The deepest recording a saved oracle may claim (a session's capacity is far below).
_MAX_DEPTH = 1024
#: The kinds of the cost model's saved fields (by their annotation; others are floats), and the fewest rows of its
#: tables (``None``: one pair).
_COST_KINDS = {"np.ndarray": "float[][]|float[]", "dict[str, Any]": "dict", "bool": "bool"}
_COST_ROWS = dict(verify=2, catchup=2, draft=1, model_draft=1, ngram=None, model_follow=None)


def _line(x: np.ndarray, y: np.ndarray, max_points: int = 160) -> tuple[float, float, int]:
    """Robust straight line y = a + b x (Theil-Sen: the median of pairwise slopes, then the median
    intercept), so that noise spikes on a shared machine do not bend it. Returns (a, b, n)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y) & (y > 0)
    x, y = x[ok], y[ok]
    n = int(x.size)
    if n == 0:
        return math.nan, 0.0, 0
    if n > max_points:
        idx = np.linspace(0, n - 1, max_points).round().astype(int)
        xs, ys = x[idx], y[idx]
    else:
        xs, ys = x, y
    dx = xs[None, :] - xs[:, None]
    dy = ys[None, :] - ys[:, None]
    upper = np.triu(np.ones_like(dx, dtype=bool), 1) & (dx != 0)
    b = float(np.median(dy[upper] / dx[upper])) if upper.any() else 0.0
    a = float(np.median(y - b * x))
    return a, b, n


@dataclasses.dataclass
class CostModel:
    """This machine's per-operation times in nanoseconds, fitted from an oracle's probes.

    Times that depend on the position ``pos`` (n_past) of the step, because attention reads a KV
    cache that grows with it, are robust lines ``a + b * pos`` (rows ``[a, b]``):
    ``verify[k]``, a target decode of ``k`` tokens when llama.cpp reuses the compute graph of the
    previous target batch (same size) and the caches are warm from it; ``catchup[k]``, the MTP
    catch-up of ``k`` rows; ``draft[m]``, an MTP draft call of ``m`` decodes; ``ngram``, one look-up of a
    drafter without a model (the n-gram look-up; fitted from the draft calls of the drafters that need no MTP
    head). A verify costs ``fresh_ns`` more when the previous target batch had another size (the
    graph is built anew); ``cold_ns`` more when the MTP head ran since the last target decode (its
    data evicted the target's from the caches: every drafting step), and ``warm_ns`` more (usually
    less) when nothing but target decodes ran, as in plain decoding and the n-gram mode (measured
    on a plain tail decoded after the generation). A draft model (``draft-simple``) costs ``model_draft[m]``
    per draft call of ``m`` decodes and ``model_follow`` (a line in ``pos``) per step, its decode of the
    verified batch (measured on the plain steps' single rows; taken as flat in the batch size, which a
    model small enough to draft with is on these batch sizes). The sample phase costs
    ``sample_ns + sample_row_ns * (rows - 1) + rollback_ns * [rollback > 0]``, with ``sample_ns``
    measured with the MTP head's bookkeeping (drafting steps) and ``sample_plain_ns`` without.
    The ``verify``, ``catchup``, ``draft`` and ``model_draft`` lines are non-decreasing in the size at every position
    the oracle measured: more rows or decodes are never priced below fewer (``samples["verify_pooled"]``, ...: how
    many sizes the fit had to pool to make them so).
    """

    verify: np.ndarray  # [depth + 2, 2]: index k = batch size (0 unused)
    catchup: np.ndarray  # [depth + 2, 2]: index k = rows
    draft: np.ndarray  # [depth + 1, 2]: index m = MTP decodes in the call (0: none)
    ngram: np.ndarray  # [2]: one look-up (a drafter without a model)
    fresh_ns: float
    cold_ns: float
    warm_ns: float
    sample_ns: float
    sample_plain_ns: float
    sample_row_ns: float
    rollback_ns: float
    samples: dict[str, Any]  # how many measurements each number rests on (``lookup``: the look-up line)
    telemetry: bool = True
    model_draft: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((1, 2)))  # [depth + 1, 2]
    model_follow: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2))  # [2]

    @property
    def depth(self) -> int:
        return len(self.draft) - 1

    @staticmethod
    def _at(table: np.ndarray, idx, pos):
        row = table[idx]
        return row[..., 0] + row[..., 1] * pos

    # -- one operation ---------------------------------------------------------------------------
    def verify_ns(self, k, pos, fresh=True, cold=False):
        """A target decode of ``k`` tokens (``fresh``: its graph built anew; ``cold``: the MTP head ran since)."""
        k = np.clip(np.asarray(k), 1, len(self.verify) - 1)
        return (
            self._at(self.verify, k, pos)
            + np.where(fresh, self.fresh_ns, 0.0)
            + np.where(cold, self.cold_ns, self.warm_ns)
        )

    def catchup_ns(self, k, pos):
        """The MTP head's catch-up on ``k`` verified rows."""
        return self._at(self.catchup, np.clip(np.asarray(k), 1, len(self.catchup) - 1), pos)

    def head_draft_ns(self, decodes, pos):
        """An MTP draft call of ``decodes`` decodes."""
        return self._at(self.draft, np.clip(np.asarray(decodes), 0, self.depth), pos)

    def model_draft_ns(self, decodes, pos):
        """A draft model's draft call of ``decodes`` decodes."""
        return self._at(self.model_draft, np.clip(np.asarray(decodes), 0, len(self.model_draft) - 1), pos)

    def model_follow_ns(self, pos):
        """A draft model's decode of the step's verify batch."""
        return self.model_follow[0] + self.model_follow[1] * np.asarray(pos, dtype=np.float64)

    def lookup_ns(self, pos):
        """One look-up of a drafter without a model (the n-gram look-up)."""
        return self.ngram[0] + self.ngram[1] * pos

    # -- one step --------------------------------------------------------------------------------
    def phase_ns(self, head, k, draft, rows_sampled, rollback, pos=0.0, fresh=True, follow=0.0) -> dict[str, Any]:
        """Predicted phase times of steps whose draft phase takes ``draft`` (numpy arrays broadcast together).

        ``head``: the MTP head follows the generation (catch-up, cold caches, its bookkeeping); ``k``: verified
        rows; ``rows_sampled``: target rows argmaxed; ``rollback``: rejected drafts; ``pos``: n_past at the step;
        ``fresh``: the previous step verified another number of tokens; ``follow``: a draft model's decode of the
        verified rows (counted with the catch-up, as the engine counts it). Keys: the phases, in the engine's order.
        """
        k = np.asarray(k)
        pos = np.asarray(pos, dtype=np.float64)
        head = np.asarray(head, dtype=bool)
        return {
            "catchup": np.where(head, self.catchup_ns(k, pos), 0.0) + follow,
            "draft": draft,
            "verify": self.verify_ns(k, pos, fresh, head),
            "sample": (
                np.where(head, self.sample_ns, self.sample_plain_ns)
                + self.sample_row_ns * (np.asarray(rows_sampled) - 1)
                + np.where(np.asarray(rollback) > 0, self.rollback_ns, 0.0)
            ),
        }

    def step_ns(
        self,
        mode: DrafterMode | str,
        drafting,
        n_cap_pos,
        k,
        decodes,
        rows_sampled,
        rollback,
        ngram_asked=None,
        pos=0.0,
        fresh=True,
    ):
        """Predicted phase times of steps of a ``drafter=`` mode (numpy arrays broadcast together).

        ``drafting``: n_max > 0 (the MTP head drafts if the mode uses it); ``n_cap_pos``: the draft cap was > 0;
        ``k``: verified rows (drafts + 1); ``decodes``: MTP decodes of the draft call; ``rows_sampled``: target
        rows argmaxed; ``rollback``: rejected drafts; ``ngram_asked``: the look-up was asked (priced if the mode
        has a drafter without the MTP head); ``pos``: n_past at the step; ``fresh``: the previous step verified
        another number of tokens. Returns ``(catchup, draft, verify, sample)``. (The simulator prices each
        drafter's draft call with its replay and calls :meth:`phase_ns`.)
        """
        mode = drafters.mode(mode)
        pos = np.asarray(pos, dtype=np.float64)
        drafting = np.asarray(drafting, dtype=bool)
        head = drafting & mode.needs_mtp
        drawing = drafting & np.asarray(n_cap_pos, bool)
        draft = np.where(head & drawing, self.head_draft_ns(decodes, pos), 0.0)
        follow = 0.0
        if mode.needs_draft_model:
            draft = draft + np.where(drawing, self.model_draft_ns(decodes, pos), 0.0)
            follow = self.model_follow_ns(pos)
        if ngram_asked is not None and any(d.is_lookup for d in mode.drafters):
            draft = draft + np.where(np.asarray(ngram_asked, bool), self.lookup_ns(pos), 0.0)
        return tuple(self.phase_ns(head, k, draft, rows_sampled, rollback, pos, fresh, follow).values())

    def ceiling_step_ns(self, n_max: int, mode: DrafterMode | str = drafters.DEFAULT_MODE, pos: float = 0.0) -> float:
        """Time of a step at ``pos`` that drafts ``n_max`` tokens and has all of them accepted (every
        step alike, so the verify graph is reused)."""
        if n_max <= 0:
            parts = self.step_ns(mode, False, False, 1, 0, 1, 0, pos=pos, fresh=False)
        else:
            parts = self.step_ns(mode, True, True, n_max + 1, n_max, n_max + 1, 0, True, pos=pos, fresh=False)
        return float(sum(np.asarray(p) for p in parts))

    # -- (de)serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        """The model :meth:`to_dict` wrote; anything else is a :class:`FormatError`."""
        fields = dataclasses.fields(cls)
        if isinstance(d, dict):
            d = {k: v.tolist() if isinstance(v, np.ndarray | np.generic) else v for k, v in d.items()}
        check_fields(
            d,
            {f.name: _COST_KINDS.get(f.type, "float") for f in fields},  # type: ignore[arg-type]
            "cost model",
            optional=[
                f.name
                for f in fields
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            ],
        )
        d = dict(d)
        for f in fields:
            if f.type == "np.ndarray" and f.name in d:
                rows, table = _COST_ROWS[f.name], np.asarray(d[f.name], dtype=np.float64)
                bad = (
                    table.shape != (2,)
                    if rows is None
                    else (table.ndim != 2 or table.shape[1] != 2 or len(table) < rows)
                )
                if bad:
                    raise FormatError(f"a corrupt cost model: its {f.name} has the shape {table.shape}")
                d[f.name] = table
        return cls(**d)

    @classmethod
    def from_columns(cls, c: dict[str, np.ndarray], depth: int, telemetry: bool = True) -> CostModel:
        """Fit the model from an oracle's timing columns (see :mod:`mtp_explorer.analysis.oracle`)."""
        samples: dict[str, Any] = {}
        pos = c["pos"].astype(np.float64)
        verify, catchup, cold_ns, fresh_ns, warm_ns = _fit_target(c, pos, depth, samples)
        draft = _fit_draft(c, pos, depth, samples, _head_drafter(), "draft")
        model_draft = _fit_draft(c, pos, depth, samples, _draft_model_drafter(c), "model_draft")
        follow_pts = c.get("t_follow_ns", np.zeros(0)).astype(np.float64)
        a, b, n = _line(pos[: follow_pts.size], follow_pts)
        samples["model_follow"] = n
        ngram = _fit_lookup(c, pos, samples)
        many = c["probe_k"] >= 2
        row = (c["probe_argmax_ns"][many] / c["probe_k"][many]).astype(np.float64)
        samples["sample"] = int(c["t_sample_ns"].size)
        return cls(
            verify=verify,
            catchup=catchup,
            draft=draft,
            ngram=ngram,
            fresh_ns=fresh_ns,
            cold_ns=cold_ns,
            warm_ns=warm_ns,
            sample_ns=_med(c["t_sample_ns"].astype(np.float64)),
            sample_plain_ns=_med(c["t_argmax_ns"].astype(np.float64)),
            sample_row_ns=_med(row),
            rollback_ns=_med(c["probe_rollback_ns"][many].astype(np.float64)),
            samples=samples,
            telemetry=telemetry,
            model_draft=model_draft,
            model_follow=np.array([a, b]) if n >= 2 else np.zeros(2),
        )


def _plain(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


def _med(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else 0.0


def _table(points: list[tuple[np.ndarray, np.ndarray] | None], name: str, samples: dict) -> np.ndarray:
    """Robust lines per size; sizes without measurements (short generations, probe=False) linear in the size
    between the measured ones, flat beyond them. Records the sample counts under ``name``."""
    out = np.full((len(points), 2), np.nan)
    counts = [0] * len(points)
    for i, pt in enumerate(points):
        if pt is not None:
            a, b, n = _line(*pt)
            if n >= 2:
                out[i], counts[i] = (a, b), n
    known = ~np.isnan(out[:, 0])
    idx = np.arange(len(points))
    if known.any():
        for j in (0, 1):
            out[:, j] = np.interp(idx, idx[known], out[known, j])
    else:
        out[:] = 0.0
    samples[name] = counts
    return out


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to ``y`` in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, wt in zip(y.tolist(), w.tolist()):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(n, m) for m, _, n in blocks]) if blocks else np.zeros(0)


def _non_decreasing(table: np.ndarray, counts: list[int], pos: np.ndarray, name: str, samples: dict) -> np.ndarray:
    """``table``'s lines (sizes 1 and up) made non-decreasing in the size at every position the oracle measured:
    an operation on more rows or decodes is never priced below one on fewer, which a few noisy samples per size
    otherwise do (the lines' values at the lowest and highest position, fit by pool adjacent violators weighted by
    each size's samples, give the new lines). Records under ``samples[name + "_pooled"]`` how many sizes moved."""
    out = table.copy()
    if len(table) < 3 or pos.size == 0:
        samples[name + "_pooled"] = 0
        return out
    lo, hi = float(pos.min()), float(pos.max())
    w = np.maximum(np.asarray(counts[1:], dtype=np.float64), 1e-3)  # sizes interpolated between measured ones follow
    ends = [_pava(table[1:, 0] + table[1:, 1] * x, w) for x in (lo, hi)]
    if hi > lo:
        out[1:, 1] = (ends[1] - ends[0]) / (hi - lo)
    out[1:, 0] = ends[0] - out[1:, 1] * lo
    moved = ~np.isclose(out[1:], table[1:], rtol=1e-9, atol=1e-6).all(axis=1)
    samples[name + "_pooled"] = int(moved.sum())
    return out


def _fit_target(c: dict[str, np.ndarray], pos: np.ndarray, N: int, samples: dict):
    """The verify and catch-up tables and the cold / fresh / warm corrections."""
    va = c["verify_after"]
    t_verify = c["t_verify_ns"].astype(np.float64)
    probe_k = c["probe_k"]
    p1 = c["probe_verify_ns"].astype(np.float64)
    p2 = c["probe_verify_reuse_ns"].astype(np.float64)
    hot_reused_1 = va == 1
    verify_pts = [None, (pos[hot_reused_1], t_verify[hot_reused_1])]
    catch = [None, (pos, c["t_catchup_ns"].astype(np.float64))]
    for k in range(2, N + 2):
        sel = probe_k == k
        verify_pts.append((pos[sel], p2[sel]) if sel.any() else None)
        catch.append((pos[sel], c["probe_catchup_ns"][sel]) if sel.any() else None)
    verify = _non_decreasing(_table(verify_pts, "verify", samples), samples["verify"], pos, "verify", samples)
    catchup = _non_decreasing(_table(catch, "catchup", samples), samples["catchup"], pos, "catchup", samples)
    verify[0] = catchup[0] = 0.0
    # the same decode after the MTP chain minus right after a target decode: cold caches;
    # a k >= 2 batch after the chain (new graph, cold) minus again at once (reused, warm)
    # (both are extra costs: a median below zero is the noise of a busy machine, and counts as none)
    one = probe_k == 1
    cold_ns = max(0.0, _med(p1[one] - t_verify[one]))
    many = probe_k >= 2
    fresh_ns = max(0.0, _med(p1[many] - p2[many]) - cold_ns)
    samples["cold"] = int(one.sum())
    samples["fresh"] = int(many.sum())
    # plain decodes in a row (the tail after the generation) against the single-token line
    tail_pos = c.get("tail_pos", np.zeros(0)).astype(np.float64)
    tail = c.get("tail_verify_ns", np.zeros(0)).astype(np.float64)
    warm_ns = _med(tail - (verify[1, 0] + verify[1, 1] * tail_pos)) if tail.size else 0.0
    samples["warm"] = int(tail.size)
    return verify, catchup, cold_ns, fresh_ns, warm_ns


def _fit_draft(
    c: dict[str, np.ndarray], pos: np.ndarray, N: int, samples: dict, spec: DrafterSpec, name: str
) -> np.ndarray:
    """The draft-call table of a drafter with a model (``spec``: the MTP head, a draft model): its chain's
    cumulative decode times plus the call's fixed tail. Records the sample counts under ``name``."""
    s = spec.index
    cum = c["t_draft_cum_ns"][:, s].astype(np.float64)
    total = c["t_draft_ns"][:, s].astype(np.float64)
    lens = c["draft_len"][:, s]
    has = lens > 0
    tail_ns = _med(total[has] - cum[has, lens[has] - 1]) if has.any() else 0.0
    drafts: list[tuple[np.ndarray, np.ndarray] | None] = [None]
    for m in range(1, N + 1):
        sel = lens >= m
        drafts.append((pos[sel], cum[sel, m - 1] + tail_ns) if sel.any() else None)
    draft = _non_decreasing(_table(drafts, name, samples), samples[name], pos, name, samples)
    draft[0] = 0.0
    if not has.any():
        draft[:] = 0.0
    return draft


def _fit_lookup(c: dict[str, np.ndarray], pos: np.ndarray, samples: dict) -> np.ndarray:
    """The look-up line: the draft calls of the drafters without a model, wherever they were asked (cap > 0)."""
    asked = c["cap"] > 0
    specs = [s for s in DRAFTER_SPECS.values() if s.is_lookup]
    x = np.concatenate([pos[asked]] * len(specs))
    y = np.concatenate([c["t_draft_ns"][asked, s.index].astype(np.float64) for s in specs])
    a, b, n = _line(x, y)
    samples["lookup"] = n
    return np.array([a, b]) if n >= 2 else np.zeros(2)


@dataclasses.dataclass
class OracleTrace:
    """A greedy generation with, at every position, the drafts the engine would propose there and
    the measured cost model. Replay policies with :func:`mtp_explorer.analysis.simulate`.

    Per-position columns (``T`` positions: position ``g`` is where the step starting after ``g``
    generated tokens begins): ``pos`` (n_past), ``token`` (the greedy token emitted there),
    ``token_eog``, ``target_margin`` (target top-1 minus top-2 logit), ``cap`` (draft cap there:
    min(depth, budget, context)); per drafter ``s`` (its :attr:`DrafterSpec.index
    <mtp_explorer.core.drafters.DrafterSpec.index>`, the ``S`` axis): ``draft`` [T, S, depth] (draft ids, -1
    padded), ``draft_len`` [T, S] (0 where it was not asked), ``draft_eos`` [T, S], ``draft_prob`` /
    ``draft_margin`` [T, S, depth] (confidences, top-1 minus top-2 draft logit; NaN for a drafter without a
    confidence), ``topk_ids`` / ``topk_probs`` [T, S, depth, K], ``t_draft_ns`` [T, S] (its whole draft call),
    ``t_draft_cum_ns`` [T, S, depth] (to the end of each model decode, -1 where not measured); and the other
    timing columns (``t_*_ns``, ``probe_*``) the :class:`CostModel` is fitted from. :meth:`replay` reads a
    drafter's drafts.
    """

    prompt: str
    prompt_tokens: list[int]
    tokens: list[int]
    pieces: list[str]
    text: str
    columns: dict[str, np.ndarray]
    finish_reason: str
    settings: dict[str, Any]
    model: dict[str, Any]
    wall_seconds: float = 0.0
    cost_model: CostModel | None = None
    """When set, used instead of the model fitted from this recording's own timings (e.g. one cost
    model for every prompt of a sweep)."""
    batch_shift: BatchShift | None = None
    """The model's measured batch-shape shift on the recording machine (:meth:`Session.batch_shift
    <mtp_explorer.Session.batch_shift>`): the tie tolerance of :func:`~mtp_explorer.compare` and the
    uncertain positions of :func:`~mtp_explorer.simulate`. ``None``: not measured."""

    @property
    def depth(self) -> int:
        return int(self.settings["depth"])

    @property
    def n_positions(self) -> int:
        return int(self.columns["pos"].shape[0])

    def __len__(self) -> int:
        return self.n_positions

    @property
    def max_tokens(self) -> int:
        return int(self.settings["max_tokens"])

    @property
    def has_mtp(self) -> bool:
        return bool(self.settings["has_mtp"])

    @property
    def has_draft_model(self) -> bool | str:
        """The recording session's draft model: its kind (``"draft_model"``: ``draft-simple`` was recorded,
        ``"eagle3_head"``: ``draft-eagle3``), ``True`` in a recording from before EAGLE-3 heads, else ``False``."""
        value = self.settings.get("has_draft_model", False)
        return value if isinstance(value, str) else bool(value)

    @property
    def limits(self) -> Limits:
        """What the oracle can replay: settings up to its depth and budget, with the drafters it recorded, greedy."""
        return Limits(
            capacity=self.depth,
            has_mtp=self.has_mtp,
            has_draft_model=self.has_draft_model,
            model=str(self.model.get("name", "the oracle's model")),
            where="the oracle",
            reason="the depth it recorded",
            fix="record the oracle with depth={n_max} or more",
            max_tokens=self.max_tokens,
            greedy=True,
        )

    @property
    def cost(self) -> CostModel:
        """The cost model: :attr:`cost_model` if set, else fitted from this recording's timings."""
        return self.cost_model if self.cost_model is not None else self.fitted_cost

    @cached_property
    def fitted_cost(self) -> CostModel:
        return CostModel.from_columns(self.columns, self.depth, is_full_telemetry(self.settings.get("telemetry")))

    def with_cost(self, cost: CostModel | None) -> OracleTrace:
        """The same recording predicting times with ``cost``."""
        return dataclasses.replace(self, cost_model=cost)

    @property
    def dims(self) -> Dims:
        """The widths of the per-depth columns."""
        return Dims(depth=self.depth, topk=int(self.columns["topk_ids"].shape[-1]))

    # -- the drafts -------------------------------------------------------------------------------
    def replay(self, spec: DrafterSpec | str) -> DrafterReplay:
        """The simulator's replay of a drafter (a registry record or its name) on this recording, built once."""
        spec = drafters.drafter(spec) if isinstance(spec, str) else spec
        cache = self.__dict__.setdefault("_replays", {})
        if spec.name not in cache:
            cache[spec.name] = spec.load_replay()(self, spec)
        return cache[spec.name]

    def accepted_prefix(self, tokens: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Per position: how many leading tokens of a draft (``tokens`` [T, depth], ``length`` [T]) the target
        accepts (the greedy path's tokens, not end-of-generation)."""
        return _match_len(tokens, length, self.accept_tokens)

    @property
    def match_len(self) -> np.ndarray:
        """Per position: how many leading tokens of the MTP head's draft the target accepts."""
        return self.replay(_head_drafter()).match_len

    @cached_property
    def accept_tokens(self) -> np.ndarray:
        """Per position: the token the target accepts there (the greedy path's), -2 at an end-of-generation token
        (never equal to a draft token)."""
        tok = np.asarray(self.columns["token"], dtype=np.int64).copy()
        tok[self.columns["token_eog"].astype(bool)] = -2  # never equal to a draft: not accepted
        return tok

    def uncertain(self, rows: int | None = None, tol_logit: float | None = None) -> np.ndarray:
        """Per position, whether a speculative run whose target batches have at most ``rows`` rows may emit another
        token there than this greedy recording: its one-row top-2 margin is below ``tol_logit`` (default:
        :attr:`batch_shift`'s tolerance at that position's KV length; all ``False`` where the shift was not
        measured)."""
        margin = np.asarray(self.columns["target_margin"], dtype=np.float64)
        if tol_logit is not None:
            return margin < float(tol_logit)
        if self.batch_shift is None:
            return np.zeros(self.n_positions, dtype=bool)
        return margin < self.batch_shift.tolerances(rows, self.columns["pos"])

    def summary(self) -> dict[str, Any]:
        cm = self.cost
        head = self.replay(_head_drafter())
        drafted = head.length > 0
        return {
            "n_positions": self.n_positions,
            "depth": self.depth,
            "finish_reason": self.finish_reason,
            "mtp_match_rate_depth1": float((head.match_len[drafted] >= 1).mean()) if drafted.any() else math.nan,
            "plain_tokens_per_second": 1e9 / cm.ceiling_step_ns(0, pos=float(np.mean(self.columns["pos"]))),
            "cost_model": cm.to_dict(),
            "record_seconds": self.wall_seconds,
        }

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("columns", "cost_model", "batch_shift")
        }
        doc["columns"] = columns_to_json(self.columns)
        doc["cost_model"] = self.cost_model.to_dict() if self.cost_model is not None else None
        doc["batch_shift"] = self.batch_shift.to_dict() if self.batch_shift is not None else None
        doc["format"] = ORACLE_FORMAT
        return json.dumps(doc, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> OracleTrace:
        """The recording :meth:`to_json` wrote; anything else, or a corrupt one, is a :class:`FormatError`."""
        doc = read_document(text, "oracle trace")
        fmt = doc.pop("format", None)
        if fmt in _OLD_FORMATS:
            raise FormatError(
                f"this oracle trace ({fmt}) was recorded by an older version of mtp-explorer, whose "
                "columns this version no longer reads; record it again (Session.record_oracle)"
            )
        if fmt != ORACLE_FORMAT:
            raise FormatError("not an mtp-explorer oracle trace")
        check_fields(doc, SAVED_FIELDS, "oracle trace", optional=("wall_seconds", "cost_model", "batch_shift"))
        check_fields(
            doc["settings"],
            SAVED_SETTINGS,
            "oracle trace's settings",
            exact=False,
            optional=("has_draft_model", "telemetry"),
        )
        check_fields(doc["model"], MODEL_FIELDS, "oracle trace's model", optional=MODEL_FIELDS, exact=False)
        if not 1 <= doc["settings"]["depth"] <= _MAX_DEPTH or doc["settings"]["max_tokens"] < 1:
            raise FormatError("a corrupt oracle trace: its depth or max_tokens is out of range")
        if len(doc["pieces"]) != len(doc["tokens"]):
            raise FormatError(f"a corrupt oracle trace: {len(doc['pieces'])} pieces of {len(doc['tokens'])} tokens")
        with reading("oracle trace"):
            cost = doc.pop("cost_model", None)
            shift = doc.pop("batch_shift", None)
            oracle = cls(
                columns=columns_from_json(doc.pop("columns"), ORACLE_SCHEMA),
                cost_model=CostModel.from_dict(cost) if cost else None,
                batch_shift=BatchShift.from_dict(shift) if shift else None,
                **doc,
            )
            check_columns(oracle.columns, ORACLE_SCHEMA, oracle.dims)
            if oracle.n_positions != len(oracle.tokens):
                raise FormatError(
                    f"a corrupt oracle trace: {oracle.n_positions} positions of {len(oracle.tokens)} tokens"
                )
            return oracle

    def __getstate__(self):
        # pickling (e.g. to Dask workers) carries the data, not the cached derived arrays
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state):
        self.__dict__.update(state)


def record_oracle(
    session: Session,
    prompt: Prompt,
    max_tokens: int = 128,
    depth: int | None = None,
    *,
    probe: bool = True,
    batch_shift: bool = True,
    **options: int | str,
) -> OracleTrace:
    """``session``'s oracle trace of ``prompt``, as :meth:`Session.record_oracle <mtp_explorer.Session.record_oracle>`
    describes it (the method runs this)."""
    depth = session.capacity if depth is None else depth
    raw = session.oracle_columns(prompt, max_tokens, depth, probe=probe, options=drafters.option_values(options))
    oracle = OracleTrace(columns=raw.columns, settings=raw.settings, wall_seconds=raw.wall_seconds, **raw.output)
    if batch_shift:
        oracle.batch_shift = measure(session, range(2, depth + 2))
    return oracle


hooks.provide("record_oracle", record_oracle)


def _head_drafter() -> DrafterSpec:
    """The drafter of the MTP head (whose draft :attr:`OracleTrace.match_len` describes)."""
    return next(s for s in DRAFTER_SPECS.values() if s.needs_mtp)


def _draft_model_drafter(c: dict[str, np.ndarray]) -> DrafterSpec:
    """The drafter of the recording's draft model (a draft model's or an EAGLE-3 head's: the one that drafted)."""
    specs = [s for s in DRAFTER_SPECS.values() if s.needs_draft_model]
    return next((s for s in specs if (c["draft_len"][:, s.index] > 0).any()), specs[0])


def _match_len(draft: np.ndarray, length: np.ndarray, accept_tokens: np.ndarray) -> np.ndarray:
    T, N = draft.shape
    idx = np.arange(T)[:, None] + np.arange(N)[None, :]
    target = np.where(idx < T, accept_tokens[np.minimum(idx, T - 1)], -3)
    ok = (draft == target) & (np.arange(N)[None, :] < length[:, None])
    # length of the all-true prefix per row
    return np.where(ok.all(axis=1), N, np.argmin(ok, axis=1)).astype(np.int32)
