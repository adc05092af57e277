"""Each request of a greedy parallel generation against its own single-sequence greedy truth.

Greedy speculative decoding emits what plain decoding emits, but llama.cpp's kernels are not batch-invariant:
a batch with other sequences' rows, or an MTP decode with several rows, can move a logit by a rounding error and
flip a near-tie. :func:`check_parallel` records each request's oracle (plain decoding alone on sequence 0, with
the target's logit margins) and compares the request's trace with it step by step: a divergence at a near-tie is
reported as a tie with its margin, anything else as unexplained. Never silent.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..core import drafters
from ..core.errors import ParameterError
from .batch_shift import measure_batches
from .compare import Comparison, compare

if TYPE_CHECKING:
    from ..core.parallel import ParallelTrace
    from ..core.session import Session


@dataclasses.dataclass
class RequestCheck:
    """One request's comparison with its single-sequence oracle."""

    seq: int
    comparison: Comparison
    same_tokens: bool  #: its tokens equal plain greedy decoding of its prompt alone

    @property
    def ties(self) -> list[dict]:
        return self.comparison.ties

    @property
    def unexplained(self) -> list[dict]:
        return self.comparison.unexplained

    def to_dict(self) -> dict:
        first = self.comparison.mismatches[0] if self.comparison.mismatches else None
        return {
            "seq": self.seq,
            "same_tokens": self.same_tokens,
            "exact": self.comparison.exact,
            "n_ties": len(self.ties),
            "n_unexplained": len(self.unexplained),
            "first_kind": first and first["kind"],
            "first_cause": first and first.get("cause"),
            "first_margin": first and first.get("margin"),
        }


def check_parallel(
    session: Session, result: ParallelTrace, *, tol_logit: float | None = None, tol_prob: float = 1e-4
) -> list[RequestCheck]:
    """Compare every greedy request of ``result`` (from ``session``) with its prompt decoded alone: one oracle
    per request (depth: the largest ``n_max`` it used), then :func:`~mtp_explorer.compare`. The tie tolerance
    (``tol_logit``, default: measured) is the session's :meth:`~mtp_explorer.Session.batch_shift` for batches up
    to every request's verify rows together, as the engine batches them."""
    depth_all = max((int(t.columns["n_max"].max()) for t in result.traces if t.n_steps), default=1)
    rows = len(result.traces) * (depth_all + 1)  # measure_batches caps it at the probe's widest batch
    shift = measure_batches(session, depth_all, rows) if tol_logit is None else None
    checks = []
    for info, trace in zip(result.requests, result.traces):
        if float(trace.settings.get("temperature", 0.0)) > 0:
            raise ParameterError(
                f"request {info.index} sampled with temperature > 0: only greedy requests have a truth"
            )
        depth = max(1, int(trace.columns["n_max"].max()) if trace.n_steps else 1)
        options = drafters.recorded_options(trace.settings)
        oracle = session.record_oracle(
            trace.prompt_tokens,
            max_tokens=len(trace.tokens) or 1,
            depth=depth,
            probe=False,
            batch_shift=False,
            **options,
        )
        oracle.batch_shift = shift
        cmp = compare(oracle, trace, tol_logit=tol_logit, tol_prob=tol_prob, batch_rows=rows)
        same = list(trace.tokens) == list(oracle.tokens)
        checks.append(RequestCheck(seq=info.index, comparison=cmp, same_tokens=same))
    return checks
