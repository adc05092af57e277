"""Watching a llama-server that this package's engine never touches (a production server on a GPU box): its
speculative counters from ``/metrics`` and the ``timings`` of the requests sent through the monitor, as the
quantities the package shows for its own traces (acceptance by draft position, mean accepted length,
tokens/s, drafts per request), cumulative or over a recent window (:meth:`ServerMonitor.window`), and as a time
series of the polls (:meth:`ServerMonitor.series`) kept in a ring buffer."""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..core.errors import ParameterError, ServerError
from .client import Completion, ServerClient, SpecMetrics

#: The monitor's states: no reading yet, the last reading worked, the last reading failed.
STATES = ("unknown", "connected", "disconnected")


@dataclasses.dataclass(frozen=True)
class Reading:
    """One poll of the server: when, whether it answered, and its counters (None when it did not)."""

    time: float  #: ``time.time()`` of the poll
    metrics: SpecMetrics | None
    error: str = ""  #: why it did not answer ('' when it did)

    @property
    def connected(self) -> bool:
        return self.metrics is not None


@dataclasses.dataclass(frozen=True)
class WindowRates:
    """The server's rates between two polls (over a window, or one interval of the series): ``seconds`` of wall
    time; generated tokens, drafted and accepted draft tokens per second of it (all slots together); acceptance
    rate, mean accepted length and acceptance by draft position of the drafts verified in it; the slots busy at its
    end. NaN where nothing was drafted (or no time passed)."""

    start: float  #: ``time.time()`` of the earlier poll
    seconds: float
    tokens_per_second: float
    drafted_per_second: float
    accepted_per_second: float
    acceptance_rate: float
    mean_accepted_length: float
    acceptance_by_position: list[float]
    requests_processing: int

    @classmethod
    def between(cls, a: Reading, b: Reading) -> WindowRates:
        """From the connected readings ``a`` (earlier) and ``b``."""
        grown, secs = b.metrics.since(a.metrics), b.time - a.time
        per_s = (lambda n: n / secs) if secs > 0 else (lambda n: math.nan)
        return cls(
            start=a.time,
            seconds=secs,
            tokens_per_second=per_s(grown.tokens_predicted),
            drafted_per_second=per_s(grown.draft_tokens),
            accepted_per_second=per_s(grown.accepted_tokens),
            acceptance_rate=grown.acceptance_rate,
            mean_accepted_length=grown.mean_accepted_length,
            acceptance_by_position=grown.acceptance_by_position,
            requests_processing=b.metrics.requests_processing,
        )


def _restarted(a: SpecMetrics, b: SpecMetrics) -> bool:
    """A counter went down from ``a`` to ``b``: the server restarted in between (its counters start again at 0)."""
    return b.tokens_predicted < a.tokens_predicted or b.draft_tokens < a.draft_tokens or b.drafts < a.drafts


class ServerMonitor:
    """The speculative decoding of the llama-server at ``url`` (``http://host:port``, started with ``--metrics``).

    :meth:`poll` reads ``/metrics`` and never raises for a server that is down, unreachable or answers garbage: the
    reading then carries the error and :attr:`state` is ``"disconnected"``. :meth:`complete` sends a request
    through the monitor (a :class:`~mtp_explorer.core.errors.ServerError` if it fails) and keeps its timings.
    Every call is bounded by ``timeout`` seconds (``request_timeout`` for completions). The last ``capacity``
    readings are kept (a ring buffer: an hour of polls every second by default), which :meth:`window` and
    :meth:`series` read."""

    def __init__(self, url: str, *, timeout: float = 5.0, request_timeout: float = 300.0, capacity: int = 3600) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 2:
            raise ParameterError(f"capacity must be an integer >= 2 (readings kept), got {capacity!r}")
        self._probe = ServerClient(url, timeout=timeout)
        self._requests = ServerClient(url, timeout=request_timeout)
        self.url = self._probe.url
        self.readings: collections.deque[Reading] = collections.deque(maxlen=capacity)
        self.completions: list[Completion] = []
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------
    def poll(self) -> Reading:
        """Read the counters now (kept in :attr:`readings`)."""
        try:
            reading = Reading(time.time(), self._probe.metrics())
        except ServerError as exc:
            reading = Reading(time.time(), None, str(exc))
        with self._lock:
            self.readings.append(reading)
        return reading

    @property
    def state(self) -> str:
        """``unknown`` before the first poll, then ``connected`` or ``disconnected`` (the last poll's outcome)."""
        return STATES[0] if not self.readings else STATES[1] if self.readings[-1].connected else STATES[2]

    def window(self, seconds: float = 60.0) -> WindowRates | None:
        """The rates over the last ``seconds`` of polls: from the earliest connected reading in that window (or
        the first after a restart of the server) to the latest; ``None`` with fewer than two such readings."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ParameterError(f"the window must be a number of seconds > 0, got {seconds!r}")
        with self._lock:
            up = [r for r in self.readings if r.connected]
        if len(up) < 2:
            return None
        last, first = up[-1], len(up) - 1
        while (
            first > 0
            and up[first - 1].time >= last.time - seconds
            and not _restarted(up[first - 1].metrics, up[first].metrics)
        ):
            first -= 1
        return WindowRates.between(up[first], last) if first < len(up) - 1 else None

    def series(self):
        """One row per interval between consecutive connected polls (pandas): its start time, seconds and
        :class:`WindowRates` (intervals across a server restart are left out)."""
        import pandas as pd

        with self._lock:
            up = [r for r in self.readings if r.connected]
        rows = [
            dataclasses.asdict(WindowRates.between(a, b))
            for a, b in zip(up, up[1:])
            if not _restarted(a.metrics, b.metrics)
        ]
        cols = [f.name for f in dataclasses.fields(WindowRates)]
        return pd.DataFrame(rows, columns=cols)

    @property
    def last(self) -> SpecMetrics | None:
        """The counters of the last reading that worked (None before any)."""
        return next((r.metrics for r in reversed(self.readings) if r.connected), None)

    # -- requests --------------------------------------------------------------------------------
    def complete(self, prompt: str, n_predict: int = 128, **params: Any) -> Completion:
        """``POST /completion`` (greedy, no prompt cache unless ``params`` say otherwise); its timings are kept."""
        done = self._requests.complete(prompt, n_predict, **params)
        with self._lock:
            self.completions.append(done)
        return done

    def complete_many(self, prompts: Sequence[str], n_predict: int = 128, **params: Any) -> list[Completion]:
        """The prompts at once (the server's slots take them together); their timings are kept."""
        done = self._requests.complete_many(prompts, n_predict, **params)
        with self._lock:
            self.completions.extend(done)
        return done

    # -- what it shows ---------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The server's figures: from its counters (cumulative since it started) acceptance rate, mean accepted
        length, acceptance by draft position and tokens/s; from the requests sent through the monitor their count,
        drafted tokens per request and mean tokens/s per request."""
        m, reqs = self.last, self.completions
        per_request = [c.predicted_per_second for c in reqs if c.tokens_predicted > 0]
        return {
            "url": self.url,
            "state": self.state,
            "acceptance_rate": m.acceptance_rate if m else math.nan,
            "mean_accepted_length": m.mean_accepted_length if m else math.nan,
            "acceptance_by_position": m.acceptance_by_position if m else [],
            "tokens_per_second": m.tokens_per_second if m else math.nan,
            "drafts": m.drafts if m else 0,
            "requests": len(reqs),
            "drafted_per_request": sum(c.draft_n for c in reqs) / len(reqs) if reqs else math.nan,
            "request_tokens_per_second": sum(per_request) / len(per_request) if per_request else math.nan,
        }

    def requests_frame(self):
        """The requests sent through the monitor, one row each (pandas)."""
        import pandas as pd

        cols = [f.name for f in dataclasses.fields(Completion)]
        return pd.DataFrame([dataclasses.asdict(c) for c in self.completions], columns=cols)

    def __repr__(self) -> str:
        return f"<ServerMonitor {self.url} {self.state}, {len(self.completions)} requests>"
