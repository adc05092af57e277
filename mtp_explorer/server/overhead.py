"""What a llama-server request costs beyond this engine's work, measured once on a real server.

A request's time on a server is the engine's (its prompt's prefill, its decode steps) plus what the server adds, in
two kinds. Inside the server's loop, which serves one slot's work after another's: per request the slot's set-up, per
step the loop's own bookkeeping. Outside it, in the HTTP threads and the client: the exchange, tokenization and the
answer's encoding, which for a request waiting in the queue happen while other requests are served.

:func:`profile_server_overhead` sends requests one at a time to a real ``-np 1`` llama-server, plain and drafting, of
several lengths, and predicts each one alone with the batch cost model (:func:`~mtp_explorer.predict_parallel` with
``server_slot=True``). The server's own time of a request (its answer's ``timings``: ``prompt_ms + predicted_ms``) minus
that prediction is fit as ``request_ns + step_ns * steps + draft_step_ns * drafting steps`` (non-negative least squares
over the requests): the loop's overhead. The client's wall time minus the server's own is ``outside_ns`` (the median
over the requests). The result is stored in :attr:`BatchCostModel.server <mtp_explorer.BatchCostModel.server>`:
server-slot predictions add the loop's overhead to every request, to every step (``step_ns``) and to every step that
drafts (``draft_step_ns``: the server drafts its slots together, in one call per step), and ``outside_ns`` once to a
workload's wall time and to each request's latency.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.batch import PROFILE_PROMPTS, BatchCostModel, nnls, predict_parallel
from ..core.checks import check_int
from ..core.drafters import DEFAULT_MODE
from ..core.errors import ParameterError
from ..core.settings import DraftSettings
from .process import LlamaServer

if TYPE_CHECKING:
    from ..core.session import Session


@dataclasses.dataclass(frozen=True)
class OverheadSample:
    """One request's measurement: the client's wall seconds, the server's own seconds (its answer's ``timings``), the
    prediction of the engine's work alone, its steps."""

    wall_s: float
    server_s: float
    predicted_s: float
    steps: int
    spec_type: str
    n_predict: int


def fit_server_overhead(samples: Sequence[OverheadSample]) -> dict[str, Any]:
    """The loop's ``request_ns``, ``step_ns`` (every step) and ``draft_step_ns`` (more for a step that drafts: the
    server's draft, its checkpoint and its bookkeeping beyond this engine's), non-negative, fit to
    ``server - predicted = request + step * steps + draft_step * drafting steps`` over the samples (at least 4, with
    two step counts or more; ``draft_step_ns`` is 0 unless plain and drafting samples are both there),
    ``outside_ns`` the median of ``wall - server`` (not below 0), and how well (``median_abs_residual_ns``,
    ``samples``)."""
    if len(samples) < 4 or len({s.steps for s in samples}) < 2:
        raise ParameterError("fitting the server's overheads needs 4 requests or more, of at least two step counts")
    drafting = np.array([s.spec_type != "none" for s in samples], dtype=float)
    steps = np.array([s.steps for s in samples], dtype=float)
    both = 0 < drafting.sum() < len(samples)
    X = np.stack([np.ones_like(steps), steps] + ([steps * drafting] if both else []), 1)
    y = np.array([(s.server_s - s.predicted_s) * 1e9 for s in samples])
    beta = nnls(X, y)
    residual = y - X @ beta
    outside_ns = max(0.0, float(np.median([(s.wall_s - s.server_s) * 1e9 for s in samples])))
    return {
        "request_ns": float(beta[0]),
        "step_ns": float(beta[1]),
        "draft_step_ns": float(beta[2]) if both else 0.0,
        "outside_ns": outside_ns,
        "measured": {
            "samples": len(samples),
            "median_abs_residual_ns": float(np.median(np.abs(residual))),
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
    spec_types: Sequence[str] = ("none", DEFAULT_MODE),
    n_max: int = 3,
    progress: Callable[[int, int], None] | None = None,
) -> BatchCostModel:
    """``costs`` with :attr:`~mtp_explorer.BatchCostModel.server` measured on a real llama-server (``binary``: see
    :func:`~mtp_explorer.server.server_binary`) serving ``session``'s model with its threads: each prompt alone,
    for each of ``spec_types`` (``"none"``: plain) and ``n_predict``, ``repeats`` rounds (after a warm-up request),
    against the prediction of the same request from one recording per prompt (:func:`fit_server_overhead`).
    ``progress(done, total)`` is called after each request."""
    check_int("repeats", repeats, 1, None)
    check_int("n_max", n_max, 1, session.capacity)
    lengths = [check_int("n_predict", n, 2, None) for n in n_predict]
    if len(set(lengths)) < 2:
        raise ParameterError(
            "give two request lengths or more (n_predict): the fit tells per-request costs from per-step ones by them"
        )
    bare = dataclasses.replace(costs, server=None)
    samples: list[OverheadSample] = []
    total, done = len(spec_types) * len(prompts) * len(lengths) * repeats, 0
    for spec in spec_types:
        drafting = spec not in (None, "none")
        with LlamaServer(
            session.path,
            n_parallel=1,
            n_ctx=session.n_ctx,
            threads=session.threads,
            spec_type=spec if drafting else None,
            n_max=n_max,
            binary=binary,
        ) as server:
            client = server.client()
            tokens = [client.tokenize(p) for p in prompts]
            oracles = [
                session.record_oracle(t, max_tokens=max(lengths), depth=n_max, probe=False, batch_shift=False)
                for t in tokens
            ]
            client.complete(prompts[0], 8)  # warm-up: the server's first request pays for its buffers
            for _ in range(repeats):
                for prompt, oracle in zip(prompts, oracles):
                    for n in lengths:
                        settings = (
                            DraftSettings(drafter=spec, n_max=n_max, max_tokens=n)
                            if drafting
                            else DraftSettings(n_max=0, max_tokens=n)
                        )
                        predicted = predict_parallel(
                            [oracle], bare, settings, n_parallel=1, server_slot=True, warn=False
                        )
                        t0 = time.perf_counter()
                        answer = client.complete(prompt, n)
                        wall = time.perf_counter() - t0
                        samples.append(
                            OverheadSample(
                                wall,
                                (answer.prompt_ms + answer.predicted_ms) / 1e3,
                                predicted["requests"][0]["latency_seconds"],
                                predicted["n_steps"],
                                spec if drafting else "none",
                                n,
                            )
                        )
                        done += 1
                        if progress is not None:
                            progress(done, total)
    fit = fit_server_overhead(samples)
    fit["measured"] |= {
        "threads": session.threads,
        "n_max": n_max,
        "n_predict": lengths,
        "repeats": repeats,
        "spec_types": list(spec_types),
        "prompts": len(prompts),
        "server": str(server.binary),
    }
    return dataclasses.replace(costs, server=fit)
