"""What a llama-server workload costs beyond this engine's work, measured once on a real server.

A request's time on a server is the engine's (its prompt's prefill, its decode steps) plus what the server adds, in
two kinds. Inside the server's loop, which serves one slot's work after another's: per request the slot's set-up, per
step the loop's own bookkeeping, and per step that drafts, per slot that drafts and per verified row the server's own
drafting and sampling (it samples every verified row of every slot through its sampler chain). Outside it, in the
HTTP threads and the client: the exchange, tokenization and the answer's encoding, which for a request waiting in the
queue happen while other requests are served.

:func:`profile_server_overhead` sends workloads as a sweep sends them to real llama-servers, plain and drafting, of
several lengths: on a one-slot server each prompt alone and all of them at once (queued), on servers of more slots
all of them at once; and predicts each workload with the batch cost model (:func:`~mtp_explorer.predict_parallel`
with ``server_slot=True``). The client's wall time of a workload minus that prediction is fit as ``outside_ns``
once plus each term of :data:`~mtp_explorer.analysis.batch.SERVER_TERMS` times the
count the prediction charges it by (non-negative least squares; a term whose count the workloads cannot tell apart
from the others' is left at 0). The result is stored in :attr:`BatchCostModel.server
<mtp_explorer.BatchCostModel.server>`, which every server-slot prediction adds.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.batch import PROFILE_PROMPTS, SERVER_TERMS, BatchCostModel, nnls, predict_parallel
from ..core.checks import check_int
from ..core.drafters import DEFAULT_MODE
from ..core.errors import ParameterError
from ..core.settings import DraftSettings
from .process import LlamaServer

if TYPE_CHECKING:
    from ..core.session import Session


@dataclasses.dataclass(frozen=True)
class OverheadSample:
    """One workload's measurement: its requests sent at once to a server of ``n_parallel`` slots, the client's wall
    seconds until the last answer, the prediction of the engine's work alone, and the counts that prediction charges
    the server's terms by (``server_counts`` of :func:`~mtp_explorer.predict_parallel`)."""

    wall_s: float
    predicted_s: float
    counts: Mapping[str, int]
    spec_type: str
    n_predict: int
    n_parallel: int = 1


def fit_server_overhead(samples: Sequence[OverheadSample]) -> dict[str, Any]:
    """``outside_ns`` and each term of :data:`~mtp_explorer.analysis.batch.SERVER_TERMS`, non-negative, fit to
    ``wall - predicted = outside + sum(term * count)`` over the samples, each sample's equation divided by the root of
    its ``predicted_s`` (a workload's wall time varies about as the root of its length). A term whose
    counts are a combination of the columns before it (e.g. ``draft_slot_ns`` without a workload drafting on two
    slots at once, every drafting term without a plain workload) is left at 0 and named in
    ``measured["not_fit"]``. At least 4 samples, of two request counts or more (single and queued requests: the
    workload's ``outside_ns`` and the per-request term are told apart by them); with how well
    (``median_abs_residual``, relative, and ``median_wall_over_predicted``) in ``measured``."""
    counts_of = list(SERVER_TERMS.values())
    if len(samples) < 4 or len({s.counts["requests"] for s in samples}) < 2:
        raise ParameterError(
            "fitting the server's overheads needs 4 workloads or more, of at least two request counts "
            "(requests sent alone and several at once)"
        )
    predicted = np.array([s.predicted_s for s in samples])
    weight = np.sqrt(predicted)  # a workload's wall time varies about as the root of its length
    columns = [np.ones(len(samples))] + [np.array([float(s.counts[c]) for s in samples]) for c in counts_of]
    kept: list[int] = []
    for i, col in enumerate(columns):
        trial = np.stack([columns[j] for j in kept] + [col], 1)
        if np.linalg.matrix_rank(trial / weight[:, None]) == len(kept) + 1:
            kept.append(i)
    if 0 not in kept or 1 not in kept:
        raise ParameterError("the workloads cannot tell the work outside the loop from the per-request overhead")
    X = np.stack([columns[j] for j in kept], 1) / weight[:, None]
    y = np.array([(s.wall_s - s.predicted_s) * 1e9 for s in samples]) / weight
    beta = nnls(X, y)
    value = dict(zip(kept, (float(b) for b in beta)))
    residual = (y - X @ beta) * weight / 1e9 / predicted
    names = list(SERVER_TERMS)
    return {
        "outside_ns": value[0],
        **{name: value.get(i + 1, 0.0) for i, name in enumerate(names)},
        "measured": {
            "samples": len(samples),
            "not_fit": [name for i, name in enumerate(names) if i + 1 not in kept],
            "median_abs_residual": float(np.median(np.abs(residual))),
            "median_wall_over_predicted": float(np.median([s.wall_s / s.predicted_s for s in samples])),
        },
    }


def profile_server_overhead(
    session: Session,
    costs: BatchCostModel,
    *,
    binary: str | os.PathLike | None = None,
    prompts: Sequence[str] = PROFILE_PROMPTS[:4],
    n_predict: Sequence[int] = (32, 128),
    repeats: int = 2,
    seconds: float = 5.0,
    spec_types: Sequence[str] = ("none", DEFAULT_MODE),
    n_max: int = 3,
    n_parallel: Sequence[int] = (1, 2, 4),
    progress: Callable[[int, int], None] | None = None,
) -> BatchCostModel:
    """``costs`` with :attr:`~mtp_explorer.BatchCostModel.server` measured on real llama-servers (``binary``: see
    :func:`~mtp_explorer.server.server_binary`) serving ``session``'s model with its threads, one per each of
    ``spec_types`` (``"none"``: plain) and ``n_parallel`` (and one slot, always): rounds (after a warm-up request) of
    every prompt alone (on one slot) and of all of them at once, for each ``n_predict``, against the prediction of the
    same workload from one recording per prompt (:func:`fit_server_overhead`). Each server serves ``repeats`` rounds
    or more, until its workloads have lasted ``seconds`` (on a fast model a round lasts a fraction of a second, and the
    server's jitter is of the order of the terms fit: on the bundled model the per-row term moved between 0 and 41 µs
    from one fit of 2–3 rounds to the next, and between 13 and 26 µs in six fits of 10 s each).
    ``progress(done, total)`` is called after each workload (``total`` grows with the rounds added);
    ``measured["rounds"]`` says how many rounds each server served."""
    check_int("repeats", repeats, 1, None)
    if not seconds >= 0:
        raise ParameterError(f"seconds must be 0 or more (got {seconds!r})")
    check_int("n_max", n_max, 1, session.capacity)
    lengths = [check_int("n_predict", n, 2, None) for n in n_predict]
    slots = sorted({1} | {check_int("n_parallel", p, 1, None) for p in n_parallel})
    if len(set(lengths)) < 2:
        raise ParameterError(
            "give two request lengths or more (n_predict): the fit tells per-request costs from per-step ones by them"
        )
    if len(prompts) < 2:
        raise ParameterError(
            "give two prompts or more: the fit tells the work outside the loop from per-request "
            "costs by requests sent alone and together"
        )
    bare = dataclasses.replace(costs, server=None)
    samples: list[OverheadSample] = []
    per_round = {p: (len(prompts) * (p == 1) + 1) * len(lengths) for p in slots}
    total, done = len(spec_types) * sum(per_round.values()) * repeats, 0
    rounds: list[int] = []
    oracles: list[Any] | None = None
    for spec in spec_types:
        drafting = spec not in (None, "none")
        for P in slots:
            with LlamaServer(
                session.path,
                n_parallel=P,
                n_ctx=session.n_ctx,
                threads=session.threads,
                spec_type=spec if drafting else None,
                n_max=n_max,
                binary=binary,
            ) as server:
                client = server.client()
                if oracles is None:
                    oracles = [
                        session.record_oracle(
                            client.tokenize(p), max_tokens=max(lengths), depth=n_max, probe=False, batch_shift=False
                        )
                        for p in prompts
                    ]
                client.complete(prompts[0], 8)  # warm-up: the server's first request pays for its buffers
                groups = ([[i] for i in range(len(prompts))] if P == 1 else []) + [list(range(len(prompts)))]
                predictions = {
                    (n, tuple(group)): predict_parallel(
                        [oracles[i] for i in group],
                        bare,
                        DraftSettings(drafter=spec, n_max=n_max, max_tokens=n)
                        if drafting
                        else DraftSettings(n_max=0, max_tokens=n),
                        n_parallel=P,
                        arrivals=[0] * len(group),
                        server_slot=True,
                        warn=False,
                    )
                    for n in lengths
                    for group in groups
                }
                served, lasted = 0, 0.0
                while served < repeats or lasted < seconds:
                    if served >= repeats:
                        total += per_round[P]
                    served += 1
                    for n in lengths:
                        for group in groups:
                            predicted = predictions[n, tuple(group)]
                            t0 = time.perf_counter()
                            client.complete_many([prompts[i] for i in group], n)
                            wall = time.perf_counter() - t0
                            lasted += wall
                            samples.append(
                                OverheadSample(
                                    wall,
                                    predicted["seconds"],
                                    predicted["server_counts"],
                                    spec if drafting else "none",
                                    n,
                                    P,
                                )
                            )
                            done += 1
                            if progress is not None:
                                progress(done, total)
                rounds.append(served)
    fit = fit_server_overhead(samples)
    fit["measured"] |= {
        "threads": session.threads,
        "n_max": n_max,
        "n_predict": lengths,
        "n_parallel": slots,
        "repeats": repeats,
        "seconds": seconds,
        "rounds": rounds,
        "spec_types": list(spec_types),
        "prompts": len(prompts),
        "server": str(server.binary),
    }
    return dataclasses.replace(costs, server=fit)
