"""What-if for N sequences: a batch cost model, and several requests' simulated steps scheduled on N slots.

Under greedy decoding each request's steps do not depend on the others in its batch (up to floating-point
near-ties), so one oracle per request (:meth:`Session.record_oracle <mtp_explorer.Session.record_oracle>`) and
:func:`~mtp_explorer.simulate` give every request's steps at any ``n_max`` / ``p_min``. What batching changes is
the time of a step, which :class:`BatchCostModel` prices from the step's shape:

- ``verify``: the target batch: a cost per ubatch of one row and per ubatch of several (llama.cpp computes a single
  row on its matrix-vector path, much cheaper on a CPU), per row, per thousand row-positions (``attention``: the sum
  over the sequences of rows times position), and ``fresh`` when the batch's shape differs from the previous step's
  (llama.cpp rebuilds the compute graph; an unchanged shape reuses it). ``rows`` is every active sequence's draft
  plus one; the ubatches are llama.cpp's: with one KV stream per sequence (``-np N`` without ``--kv-unified``) a
  ubatch takes the same number of rows from each sequence (``split_equal``), so drafts of different lengths cost
  one more ubatch per distinct length (:func:`ubatch_rows`);
- ``draft``: the drafting phase: a cost when any sequence drafts, per MTP decode of one row and of several (one
  decode per depth, a row per sequence still drafting), per decode row, and per sequence asked;
- ``catchup``: the MTP head's catch-up of the verified rows, priced as the verify batch (its own ubatches, rows);
- ``sample``: accept / rollback, ``a + b * active + c * rows``; ``prefill``: ``a + b * prompt tokens`` per request.

:func:`profile_batch_costs` fits it (ns: non-negative least squares on the median time of each step shape) to the
steps of real parallel runs on this machine;
:func:`predict_parallel` schedules the simulated steps of N requests on the slots as the engine does (arrivals,
waiting for a free slot) and prices each step; :func:`recommend_parallel` searches ``n_max`` / ``p_min`` for each
batch size (vLLM's ``num_speculative_tokens`` per batch size) and marks where speculation stops paying.
``draft-simple`` (a draft model's per-sequence decodes) is outside this model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import drafters, metrics
from ..core.checks import check_int
from ..core.errors import ParameterError, ServerOverheadMissing
from ..core.parallel import request_settings
from ..core.schema import PHASES
from ..core.settings import DraftSettings, resolve_each
from .server_slot import server_lookup_steps
from .simulate import simulate

if TYPE_CHECKING:
    from ..core.parallel import ParallelTrace
    from ..core.session import Session
    from .oracle import OracleTrace

BATCH_COSTS_FORMAT = "mtp-explorer-batch-costs/1"
#: llama-server's overheads inside its loop (:attr:`BatchCostModel.server`), each by the count of a scheduled workload
#: it is charged per (``server_counts`` of :func:`predict_parallel`'s result)
SERVER_TERMS = {
    "request_ns": "requests",
    "step_ns": "steps",
    "draft_step_ns": "drafting_steps",
    "draft_slot_ns": "drafting_slot_steps",
    "row_ns": "rows",
}

#: Each phase's regressors (:func:`step_features` computes them), in coefficient order.
FEATURES: dict[str, tuple[str, ...]] = {
    "verify": ("ubatch_single", "ubatch_multi", "fresh", "rows", "attention"),
    "draft": ("drafting_any", "decode_single", "decode_multi", "decode_rows", "drafting"),
    "catchup": ("catchup_single", "catchup_multi", "catchup_rows"),
    "sample": ("one", "active", "rows"),
}
assert set(FEATURES) == set(PHASES), "one regression per timed phase"
#: Features that vary continuously (pooled by their median over the steps of one shape).
CONTINUOUS = frozenset({"attention"})

#: Prompts the profile runs when none are given: code and prose.
PROFILE_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):\n",
    "import json\n\n\nclass Config:\n",
    "The history of the printing press begins",
    "Dear team,\n\nThank you all for your work this quarter.",
    "for i in range(10):\n",
    "# Copyright (c)",
    "SELECT name, count(*) FROM",
    "Once upon a time, in a small village,",
)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What prices one engine step: its sequences' rows and positions, and its draft decodes."""

    rows: Sequence[int]  #: each active sequence's verify rows (its draft + 1)
    pos: Sequence[int]  #: each one's position at the step
    drafting: Sequence[bool]  #: each one asked its drafters (n_max > 0)
    mtp: Sequence[bool]  #: each one's MTP head drafts (so catches up)
    draft_rows: Sequence[int]  #: rows of each MTP draft decode
    fresh: bool = True  #: its verify batch's shape differs from the previous step's (graph rebuilt)


def ubatch_rows(rows: Sequence[int]) -> list[int]:
    """The rows of each ubatch llama.cpp's ``split_equal`` makes of a batch with these rows per sequence (one KV
    stream each): each takes the fewest rows any sequence has left from every sequence with rows left."""
    out, done = [], 0
    for level in sorted({r for r in rows if r > 0}):
        out.append(sum(1 for r in rows if r >= level) * (level - done))
        done = level
    return out


def ubatches(rows: Sequence[int]) -> int:
    """How many ubatches :func:`ubatch_rows` makes."""
    return len(ubatch_rows(rows))


def _single_multi(batches: Sequence[int]) -> tuple[float, float]:
    """Computations of one row (llama.cpp's matrix-vector path) and of several."""
    single = sum(1 for b in batches if b == 1)
    return float(single), float(len([b for b in batches if b > 0]) - single)


def step_features(shape: StepShape) -> dict[str, float]:
    """The regressors of :data:`FEATURES` for one step."""
    rows = np.asarray(shape.rows, dtype=float)
    mtp_rows = [int(r) for r, m in zip(shape.rows, shape.mtp) if m]
    catchup_rows = float(sum(mtp_rows))
    verify_single, verify_multi = _single_multi(ubatch_rows(shape.rows))
    catchup_single, catchup_multi = _single_multi(ubatch_rows(mtp_rows))
    decode_single, decode_multi = _single_multi(shape.draft_rows)
    return {
        "one": 1.0,
        "fresh": float(shape.fresh),
        "rows": float(rows.sum()),
        "active": float(len(rows)),
        "ubatch_single": verify_single,
        "ubatch_multi": verify_multi,
        "catchup_single": catchup_single,
        "catchup_multi": catchup_multi,
        "decode_single": decode_single,
        "decode_multi": decode_multi,
        "attention": float((rows * np.asarray(shape.pos, dtype=float)).sum()) / 1000.0,
        "drafting_any": float(any(shape.drafting)),
        "drafting": float(sum(shape.drafting)),
        "decode_rows": float(sum(shape.draft_rows)),
        "catchup_rows": catchup_rows,
    }


@dataclasses.dataclass
class BatchCostModel:
    """Per-phase linear step costs (ns) of batched steps on one machine (see the module docstring)."""

    coef: dict[str, list[float]]  #: phase -> coefficients of FEATURES[phase]
    prefill: list[float]  #: a, b: prefill ns = a + b * prompt tokens
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)  #: what it was fit on, and how well
    #: what a request on a llama-server costs beyond this engine's prefill and steps: inside the server's loop the
    #: terms of :data:`SERVER_TERMS` (``request_ns`` per request, the slot's set-up; ``step_ns`` per decode step, the
    #: loop's own work; ``draft_step_ns`` more per step that drafts; ``draft_slot_ns`` more per slot that drafts at a
    #: step; ``row_ns`` per verified row, which the server samples one by one); outside it ``outside_ns`` (HTTP,
    #: tokenization, the answer: overlapping other requests' work, so paid once per workload, and by each request's
    #: latency); and ``measured`` (how); measured on a real server by
    #: :func:`~mtp_explorer.server.profile_server_overhead` (None: not measured; a server-slot prediction then warns
    #: that it leaves them out; a term a model was saved without is 0)
    server: dict[str, Any] | None = None

    def step_ns(self, shape: StepShape) -> dict[str, float]:
        """Each phase's predicted time of a step (ns; the coefficients are not negative)."""
        f = step_features(shape)
        return {p: float(np.dot(self.coef[p], [f[k] for k in FEATURES[p]])) for p in PHASES}

    def prefill_ns(self, n_prompt: int) -> float:
        return self.prefill[0] + self.prefill[1] * n_prompt

    def server_ns(self, what: str) -> float:
        """The llama-server path's overhead ``what`` (a term of :data:`SERVER_TERMS` or ``"outside_ns"``; 0 where not
        measured)."""
        return float(self.server.get(what, 0.0)) if self.server else 0.0

    # -- saving ----------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": BATCH_COSTS_FORMAT,
                "coef": self.coef,
                "prefill": self.prefill,
                "measured": self.measured,
                "server": self.server,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> BatchCostModel:
        doc = json.loads(text)
        if doc.get("format") != BATCH_COSTS_FORMAT:
            raise ParameterError(
                f"not a batch cost model (format {doc.get('format')!r}, expected {BATCH_COSTS_FORMAT!r})"
            )
        if "server" not in doc:
            warnings.warn(
                "a batch cost model saved before llama-server's overheads were part of it: its server-slot "
                "predictions leave them out (measure them with mx.server.profile_server_overhead)",
                ServerOverheadMissing,
                stacklevel=2,
            )
        return cls(coef=doc["coef"], prefill=doc["prefill"], measured=doc.get("measured", {}), server=doc.get("server"))

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> BatchCostModel:
        return cls.from_json(Path(path).read_text())


# -- measuring -------------------------------------------------------------------------------------------
def _step_shape(
    rows: list[int],
    pos: list[int],
    drafting: list[bool],
    uses_mtp: bool,
    draft_rows: list[int],
    previous: list[int] | None,
) -> StepShape:
    """A step's shape from its sequences' rows, positions and drafting, after a step whose rows were ``previous``."""
    return StepShape(
        rows=rows,
        pos=pos,
        drafting=drafting,
        mtp=[d and uses_mtp for d in drafting],
        draft_rows=draft_rows,
        fresh=rows != previous,
    )


def batch_shapes(result: ParallelTrace) -> list[tuple[StepShape, dict[str, int]]]:
    """Every engine step of a parallel run: its shape and its measured phase times (ns)."""
    uses_mtp = any(s.needs_mtp for s in drafters.mode(result.settings["drafter"]).drafters)
    by_step: dict[int, list] = {}
    for t in result.traces:
        c = t.columns
        for i in range(t.n_steps):
            by_step.setdefault(int(c["batch_step"][i]), []).append((c, i))
    out, previous = [], None
    for step in sorted(by_step):
        rows = by_step[step]
        c0, i0 = rows[0]
        verify = [int(c["n_drafted"][i]) + 1 for c, i in rows]
        shape = _step_shape(
            verify,
            [int(c["pos"][i]) for c, i in rows],
            [bool(c["n_max"][i] > 0) for c, i in rows],
            uses_mtp,
            [int(v) for v in c0["draft_rows"][i0] if v >= 0],
            previous,
        )
        previous = verify
        out.append((shape, {p: int(c0[f"t_{p}_ns"][i0]) for p in PHASES}))
    return out


def fit_batch_costs(results: Iterable[ParallelTrace]) -> BatchCostModel:
    """Every phase's coefficients, fit to the steps of parallel runs: steps of the same shape (every feature but the
    continuous ``attention``) are pooled into their median time and median features (a run's outliers do not pull
    the fit), and the medians fit by non-negative least squares of the relative
    error, weighted by how many steps each holds (no cost is negative). The prefill is fit to the runs' requests."""
    results = list(results)
    samples = [s for r in results for s in batch_shapes(r)]
    if len(samples) < 8:
        raise ParameterError(f"{len(samples)} steps are too few to fit a batch cost model (at least 8)")
    features = [step_features(shape) for shape, _ in samples]
    coef, fit = {}, {}
    for phase, names in FEATURES.items():
        X = np.array([[f[k] for k in names] for f in features])
        y = np.array([t[phase] for _, t in samples], dtype=float)
        discrete = [j for j, k in enumerate(names) if k not in CONTINUOUS]
        groups: dict[tuple, list[int]] = {}
        for i, x in enumerate(X[:, discrete]):
            groups.setdefault(tuple(x), []).append(i)
        Xg = np.array([np.median(X[rows], axis=0) for rows in groups.values()])
        yg = np.array([np.median(y[rows]) for rows in groups.values()])
        # relative errors (a 1-row step's as much as a 64-row one's), weighted by the steps each shape holds
        w = np.sqrt([len(rows) for rows in groups.values()]) / np.maximum(yg, 1.0)
        beta = nnls(Xg * w[:, None], yg * w)
        coef[phase] = [float(b) for b in beta]
        resid = y - X @ beta
        fit[phase] = {
            "median_abs_error_ns": float(np.median(np.abs(resid))),
            "mean_ns": float(y.mean()),
            "shapes": len(groups),
        }
    n_prompt = np.array([q.n_prompt for r in results for q in r.requests], dtype=float)
    t_prefill = np.array([q.t_prefill_ns for r in results for q in r.requests], dtype=float)
    prefill = nnls(np.stack([np.ones_like(n_prompt), n_prompt], 1), t_prefill)
    verify_rows = [sum(shape.rows) for shape, _ in samples]
    measured = {
        "steps": len(samples),
        "runs": len(results),
        "max_verify_rows": max(verify_rows),
        "max_active": max(len(shape.rows) for shape, _ in samples),
        "fit": fit,
        "n_parallel": max(r.settings["n_parallel"] for r in results),
    }
    return BatchCostModel(coef=coef, prefill=[float(p) for p in prefill], measured=measured)


def nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best least-squares solution over the subsets of columns
    whose solution has no negative coefficient (exact; 2^columns solves)."""
    n = X.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y**2))
    for mask in range(1, 2**n):
        cols = [j for j in range(n) if mask >> j & 1]
        sol = np.linalg.lstsq(X[:, cols], y, rcond=None)[0]
        if (sol < 0).any():
            continue
        err = float(np.sum((y - X[:, cols] @ sol) ** 2))
        if err < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = sol
    return best


def profile_batch_costs(
    session: Session,
    prompts: Sequence[str] = PROFILE_PROMPTS,
    *,
    n_parallel: Sequence[int] | None = None,
    n_max: Sequence[int] = (0, 1, 2, 3),
    max_tokens: int = 128,
    repeats: int = 3,
    drafter: str = drafters.DEFAULT_MODE,
    progress: Any = None,
) -> BatchCostModel:
    """Measure this machine's batch costs: ``repeats`` parallel runs of ``prompts`` for every batch size in
    ``n_parallel`` (default: 1, 2, 4, ... up to the session's ``n_parallel``) and every ``n_max``, after one warm-up
    run, fit by :func:`fit_batch_costs`. ``progress(done, total)`` is called after each run.

    A step's cost grows with its position, and the fit holds over the positions it saw: runs of 64 tokens (twice)
    priced eight queued 128-token requests 16% below their measured speed, runs of 128 (three times) within 3%
    (bundled model, 2 threads, ``-np`` 4, plain and draft-mtp at ``n_max`` 3). Measure at least as long as the runs to
    be predicted.

    The costs are the session's: its snapshot slots (``n_rs_seq``) make every step dearer the more it holds (measured
    on the bundled model at 2 threads, plain decoding: 1,173 tokens/s at 3 slots, 1,119 at 8, 793 at 64), so measure
    with the ``n_rs_seq`` of the runs to be predicted (llama-server's is ``--spec-draft-n-max`` for a head drafter,
    0 for plain decoding and the look-ups)."""
    sizes = list(n_parallel) if n_parallel is not None else _powers_of_two(session.n_parallel)
    for n in sizes:
        check_int("n_parallel", n, 1, session.n_parallel)
    check_int("repeats", repeats, 1, None)
    session.generate_parallel(list(prompts[: max(sizes)]), max_tokens=16, n_max=max(n_max), drafter=drafter)
    runs: list[Any] = []
    total = len(sizes) * len(n_max) * repeats
    for _ in range(repeats):
        for n in sizes:
            for k in n_max:
                batch = [prompts[(len(runs) + j) % len(prompts)] for j in range(n)]
                runs.append(session.generate_parallel(batch, max_tokens=max_tokens, n_max=k, drafter=drafter))
                if progress is not None:
                    progress(len(runs), total)
    model = fit_batch_costs(runs)
    model.measured |= {
        "session": {
            "threads": session.threads,
            "n_ctx": session.n_ctx,
            "clock": session.clock,
            "n_rs_seq": session.open_kwargs.get("n_rs_seq"),
        },
        "model": session.info.name,
        "n_max": list(n_max),
        "sizes": sizes,
    }
    return model


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


# -- predicting ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Run:
    """One request's simulated steps, consumed step by step as the schedule runs it."""

    index: int
    arrival: int
    n_prompt: int
    rows: np.ndarray
    pos: np.ndarray
    tokens: np.ndarray
    draft_decodes: np.ndarray
    drafting: np.ndarray
    next: int = 0
    admitted: int = -1
    finished: int = -1
    seconds: float = 0.0


def predict_parallel(
    oracles: Sequence[OracleTrace],
    costs: BatchCostModel,
    settings: DraftSettings | Sequence[DraftSettings] | None = None,
    *,
    n_parallel: int,
    arrivals: Sequence[int] | None = None,
    params: Sequence[Mapping[str, Any] | None] | None = None,
    server_slot: bool = False,
    warn: bool = True,
    **keywords: Any,
) -> dict[str, Any]:
    """Aggregate tokens/s and per-request latency of the oracles' prompts as requests on ``n_parallel`` slots
    (``settings``, ``keywords``, ``arrivals`` and ``params`` as :meth:`Session.generate_parallel
    <mtp_explorer.Session.generate_parallel>`; without ``max_tokens`` or ``settings``, each oracle's budget), without
    running the batch: each request's steps simulated from its oracle (``server_slot``: as a llama-server slot runs
    it, :func:`~mtp_explorer.simulate`, and a chain with ngram-simple as the server sizes its look-ups,
    :func:`~mtp_explorer.analysis.server_slot.server_lookup_steps`), scheduled as the engine schedules them, each
    step priced by ``costs``.
    ``server_slot`` also adds the server's overheads (:attr:`BatchCostModel.server`): its loop's per request where it
    is admitted, per step, per step that drafts, per slot that drafts and per verified row (:data:`SERVER_TERMS`; the
    counts they were charged by in ``server_counts``); the work outside its loop once to the workload's time
    (``seconds``; it overlaps other requests' work) and to each request's latency; a model without them warns
    (:class:`~mtp_explorer.ServerOverheadMissing`) unless ``warn`` is False."""
    check_int("n_parallel", n_parallel, 1, None)
    oracles = list(oracles)
    budget = keywords.pop("max_tokens", None)
    each = resolve_each(settings, len(oracles), keywords)
    if budget is not None or settings is None:
        each = [s.replace(max_tokens=o.max_tokens if budget is None else budget) for s, o in zip(each, oracles)]
    if each and each[0].mode.needs_draft_model:
        raise ParameterError(
            "the batch cost model prices the MTP head and the look-ups; a draft model's "
            "per-sequence decodes (draft-simple) are outside it"
        )
    if arrivals is None and len(oracles) > n_parallel:
        raise ParameterError(f"{len(oracles)} requests at once on n_parallel={n_parallel} sequences: give arrivals")
    arrivals = [0] * len(oracles) if arrivals is None else [check_int("arrival", a, 0, None) for a in arrivals]
    if not oracles or len(arrivals) != len(oracles) or (params is not None and len(params) != len(oracles)):
        raise ParameterError("give one oracle per request, and as many arrivals and params as oracles")
    each = request_settings(params, each)
    mode = each[0].mode
    runs = []
    for i, (o, a, s) in enumerate(zip(oracles, arrivals, each)):
        looked = server_lookup_steps(o, s) if server_slot else None
        if looked is not None:  # the server sizes a look-up's draft otherwise than this engine
            runs.append(
                _Run(
                    index=i,
                    arrival=a,
                    n_prompt=len(o.prompt_tokens),
                    rows=looked.rows,
                    pos=looked.pos,
                    tokens=looked.tokens,
                    draft_decodes=looked.draft_decodes,
                    drafting=looked.drafting,
                )
            )
            continue
        c = simulate(o, s, server_slot=server_slot).columns
        runs.append(
            _Run(
                index=i,
                arrival=a,
                n_prompt=len(o.prompt_tokens),
                rows=c["n_drafted"] + 1,
                pos=c["pos"],
                tokens=c["n_accepted"] + 1,
                draft_decodes=(c["draft_rows"] >= 0).sum(axis=1),
                drafting=c["n_max"] > 0,
            )
        )
    if server_slot and costs.server is None and warn:
        warnings.warn(
            "the batch cost model was measured without a llama-server: the prediction leaves out what a "
            "server request costs beyond the engine's prefill and steps (HTTP, tokenization, slot set-up); "
            "measure it with mx.server.profile_server_overhead",
            ServerOverheadMissing,
            stacklevel=2,
        )
    return _schedule(runs, costs, n_parallel, uses_mtp=mode.needs_mtp, server=server_slot)


def _schedule(
    runs: list[_Run], costs: BatchCostModel, n_parallel: int, uses_mtp: bool, server: bool = False
) -> dict[str, Any]:
    over = {term: (costs.server_ns(term) / 1e9 if server else 0.0) for term in SERVER_TERMS}
    request_s = over["request_ns"]
    outside_s = costs.server_ns("outside_ns") / 1e9 if server else 0.0
    counts = dict.fromkeys(SERVER_TERMS.values(), 0)
    counts["requests"] = len(runs)
    slots: list[_Run | None] = [None] * n_parallel
    step, total_s, steps, rows_per_step, previous = 0, 0.0, 0, [], None
    prefill_s = 0.0
    while any(r.finished < 0 for r in runs):
        for r in runs:  # admission: arrived requests in order, into free slots in order
            if r.admitted < 0 and r.arrival <= step and None in slots:
                slots[slots.index(None)] = r
                r.admitted = step
                r.seconds += costs.prefill_ns(r.n_prompt) / 1e9 + request_s
                prefill_s += costs.prefill_ns(r.n_prompt) / 1e9 + request_s
        active = [r for r in slots if r is not None]
        if not active:
            step = max(step + 1, min(r.arrival for r in runs if r.admitted < 0))
            continue
        k = [r.next for r in active]
        decodes = [int(r.draft_decodes[i]) for r, i in zip(active, k)]
        verify = [int(r.rows[i]) for r, i in zip(active, k)]
        shape = _step_shape(
            verify,
            [int(r.pos[i]) for r, i in zip(active, k)],
            [bool(r.drafting[i]) for r, i in zip(active, k)],
            uses_mtp,
            [sum(d > j for d in decodes) for j in range(max(decodes, default=0))],
            previous,
        )
        previous = verify
        step_counts = {
            "steps": 1,
            "drafting_steps": int(any(shape.drafting)),
            "drafting_slot_steps": sum(shape.drafting),
            "rows": sum(shape.rows),
        }
        seconds = sum(costs.step_ns(shape).values()) / 1e9
        for term, count in SERVER_TERMS.items():
            if count in step_counts:
                seconds += over[term] * step_counts[count]
                counts[count] += step_counts[count]
        total_s += seconds
        steps += 1
        rows_per_step.append(step_counts["rows"])
        for r in active:
            r.seconds += seconds
            r.next += 1
            if r.next >= len(r.rows):
                r.finished = step
                slots[slots.index(r)] = None
        step += 1
    n_tokens = int(sum(r.tokens.sum() for r in runs))
    decode_s = {r.index: r.seconds - costs.prefill_ns(r.n_prompt) / 1e9 - request_s for r in runs}
    return {
        "n_parallel": n_parallel,
        "n_requests": len(runs),
        "n_tokens": n_tokens,
        "n_steps": steps,
        "tokens_per_second": (
            n_tokens / (total_s + prefill_s + outside_s) if total_s + prefill_s > 0 else float("nan")
        ),
        "seconds": total_s + prefill_s + outside_s,
        "server_counts": counts,
        "decode_tokens_per_second": n_tokens / total_s if total_s > 0 else float("nan"),
        "summed_request_tokens_per_second": float(
            sum(r.tokens.sum() / decode_s[r.index] for r in runs if decode_s[r.index] > 0)
        ),
        "mean_verify_rows": float(np.mean(rows_per_step)) if rows_per_step else float("nan"),
        "requests": [
            {
                "seq": r.index,
                "admitted_step": r.admitted,
                "finished_step": r.finished,
                "n_tokens": int(r.tokens.sum()),
                "latency_seconds": r.seconds + outside_s,
            }
            for r in runs
        ],
    }


def recommend_parallel(
    oracles: Sequence[OracleTrace],
    costs: BatchCostModel,
    *,
    n_parallel: Sequence[int] = (1, 2, 4, 8),
    n_max: Sequence[int] | None = None,
    p_min: Sequence[float] = (0.0, 0.3, 0.5, 0.7, 0.9),
    drafter: str = drafters.DEFAULT_MODE,
    max_tokens: int | None = None,
):
    """For each batch size N (N requests at once, the oracles' prompts in turn), the ``n_max`` / ``p_min`` with the
    highest predicted goodput (accepted drafts plus the target's own token, per second, over all requests), beside
    plain decoding's; ``speedup`` below 1 means speculation does not pay at that N (``crossover`` in the frame's
    ``attrs``: the smallest such N, or None). A pandas DataFrame, one row per N."""
    import pandas as pd

    oracles = list(oracles)
    depth = min(o.depth for o in oracles)
    grid_n = list(n_max) if n_max is not None else list(range(1, depth + 1))
    rows = []
    for N in n_parallel:
        batch = [oracles[j % len(oracles)] for j in range(N)]
        plain = predict_parallel(batch, costs, n_parallel=N, n_max=0, max_tokens=max_tokens)
        best = None
        for k in grid_n:
            for p in p_min:
                pred = predict_parallel(
                    batch, costs, n_parallel=N, n_max=k, p_min=p, drafter=drafter, max_tokens=max_tokens
                )
                if best is None or pred["decode_tokens_per_second"] > best[2]["decode_tokens_per_second"]:
                    best = (k, p, pred)
        k, p, pred = best  # type: ignore[misc]
        rows.append(
            {
                "n_parallel": N,
                "n_max": k,
                "p_min": p,
                "goodput": pred["decode_tokens_per_second"],
                "plain_tokens_per_second": plain["decode_tokens_per_second"],
                "speedup": pred["decode_tokens_per_second"] / plain["decode_tokens_per_second"],
                "mean_verify_rows": pred["mean_verify_rows"],
                "latency_seconds": float(np.mean([r["latency_seconds"] for r in pred["requests"]])),
            }
        )
    return _with_crossover(pd.DataFrame(rows))


def measure_crossover(
    session: Session,
    prompts: Sequence[str] = PROFILE_PROMPTS,
    *,
    n_parallel: Sequence[int] | None = None,
    n_max: int = 3,
    p_min: float = 0.0,
    max_tokens: int = 48,
    repeats: int = 3,
    drafter: str = drafters.DEFAULT_MODE,
    progress: Any = None,
):
    """Measured aggregate decode tokens/s of N requests at once (the prompts in turn), speculative at ``n_max`` /
    ``p_min`` and plain, for each batch size (default: 1, 2, 4, ... up to the session's ``n_parallel``): the medians
    of ``repeats`` runs each, alternating. A DataFrame with :func:`recommend_parallel`'s columns (``goodput``: the
    speculative runs'; ``speedup``: the median of each speculative run over the plain run beside it), ``repeats``,
    and the run-to-run spreads ((max - min) / median) ``goodput_spread`` and ``speedup_spread``; ``crossover`` in
    its ``attrs`` (the first batch size whose speedup is below 1) and ``crossover_within_spread`` (that speedup's
    distance below 1 is within its spread: the crossover is not told apart from no crossover)."""
    import statistics

    import pandas as pd

    sizes = list(n_parallel) if n_parallel is not None else _powers_of_two(session.n_parallel)
    for n in sizes:
        check_int("n_parallel", n, 1, session.n_parallel)
    check_int("repeats", repeats, 1, None)
    rows, done = [], 0
    for n in sizes:
        batch = [prompts[j % len(prompts)] for j in range(n)]
        spec: list[dict[str, Any]] = []
        plain: list[dict[str, Any]] = []
        for r in range(repeats):
            for k, out in ((n_max, spec), (0, plain)) if r % 2 == 0 else ((0, plain), (n_max, spec)):
                run = session.generate_parallel(
                    batch, max_tokens=max_tokens, n_max=k, p_min=p_min if k else 0.0, drafter=drafter
                )
                out.append(run.summary())
        done += 1
        if progress is not None:
            progress(done, len(sizes))
        goodput = statistics.median(s["decode_tokens_per_second"] for s in spec)
        plain_tps = statistics.median(s["decode_tokens_per_second"] for s in plain)
        ratios = [a["decode_tokens_per_second"] / b["decode_tokens_per_second"] for a, b in zip(spec, plain)]
        rows.append(
            {
                "n_parallel": n,
                "n_max": n_max,
                "p_min": p_min,
                "goodput": goodput,
                "plain_tokens_per_second": plain_tps,
                "speedup": statistics.median(ratios),
                "mean_verify_rows": statistics.median(s["mean_verify_rows"] for s in spec),
                "latency_seconds": statistics.median(
                    statistics.mean(q["latency_seconds"] for q in s["requests"]) for s in spec
                ),
                "repeats": repeats,
                "goodput_spread": metrics.spread([s["decode_tokens_per_second"] for s in spec]),
                "speedup_spread": metrics.spread(ratios),
            }
        )
    return _with_crossover(pd.DataFrame(rows))


def _with_crossover(df):
    """``df`` with ``attrs["crossover"]``: the first batch size whose speedup is below 1 (None: none), and, where
    ``df`` has a measured ``speedup_spread``, ``attrs["crossover_within_spread"]`` (None without a crossover)."""
    below = df[df["speedup"] < 1.0]
    df.attrs["crossover"] = int(below["n_parallel"].iloc[0]) if len(below) else None
    if "speedup_spread" in df:
        df.attrs["crossover_within_spread"] = (
            bool(1.0 - below["speedup"].iloc[0] <= below["speedup_spread"].iloc[0]) if len(below) else None
        )
    return df
