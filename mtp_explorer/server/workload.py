"""A workload for a server sweep: the requests sent to every configuration (``/completion`` prompts or chat
messages, each with a budget and a category) and how they arrive (all at once, or Poisson at a rate)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..core.checks import check_int
from ..core.errors import FormatError, MtpExplorerError, ParameterError
from .client import Completion, ServerClient

ALL = "all"  #: the category of the rows over every request


@dataclasses.dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: a ``/completion`` prompt, or chat ``messages`` (``[{"role": ..., "content": ...},
    ...]`` for ``/v1/chat/completions``, with ``prompt`` ""), its ``n_predict`` and a category to break results by."""

    prompt: str
    n_predict: int = 128
    category: str = ALL
    messages: tuple[dict, ...] | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (not self.prompt):
            raise ParameterError("a workload request has a prompt or chat messages, one of the two")
        if self.messages is not None:
            ok = self.messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in self.messages
            )
            if not ok:
                raise ParameterError(f"chat messages are role/content objects, got {self.messages!r:.200}")
            object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))
        check_int("n_predict", self.n_predict, 1, None)

    def send(self, client: ServerClient) -> Completion:
        """Send it (greedy, no prompt cache)."""
        if self.messages is not None:
            return client.chat(self.messages, self.n_predict)
        return client.complete(self.prompt, self.n_predict)

    def server_tokens(self, client: ServerClient) -> list[int]:
        """The prompt's token ids as the server decodes them (a chat's after its template)."""
        text = self.prompt if self.messages is None else client.apply_template(self.messages)
        return client.tokenize(text)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The requests a sweep sends to every configuration: all at once (``rate=None``) or arriving as a Poisson
    process of ``rate`` requests per second (the same arrival times for every configuration: ``seed``)."""

    requests: tuple[WorkloadRequest, ...]
    rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.requests:
            raise ParameterError("a workload needs at least one request")
        if self.rate is not None and not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ParameterError(f"rate must be requests per second > 0 (or None: all at once), got {self.rate!r}")

    @classmethod
    def from_prompts(
        cls,
        prompts: Iterable[str],
        n_predict: int = 128,
        *,
        categories: Sequence[str] | None = None,
        rate: float | None = None,
    ) -> Workload:
        """A workload of ``prompts`` (with a category each, if given)."""
        prompts = list(prompts)
        cats = [ALL] * len(prompts) if categories is None else list(categories)
        if len(cats) != len(prompts):
            raise ParameterError(f"{len(cats)} categories for {len(prompts)} prompts")
        return cls(tuple(WorkloadRequest(p, int(n_predict), c) for p, c in zip(prompts, cats)), rate)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, n_predict: int = 128, *, rate: float | None = None) -> Workload:
        """A JSONL file of requests, one object per line: a ``/completion`` request (``prompt``, optionally
        ``n_predict``) or a chat request (``messages``, optionally ``max_tokens``), each optionally with a
        ``category``."""
        requests = []
        for i, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                budget = int(doc.get("n_predict", doc.get("max_tokens", n_predict)))
                if "messages" in doc:
                    req = WorkloadRequest("", budget, str(doc.get("category", ALL)), tuple(doc["messages"]))
                else:
                    req = WorkloadRequest(str(doc["prompt"]), budget, str(doc.get("category", ALL)))
                requests.append(req)
            except (ValueError, KeyError, TypeError, MtpExplorerError) as exc:
                raise FormatError(
                    f"{path}:{i}: not a /completion request with a prompt nor a chat request with messages ({exc})"
                ) from None
        return cls(tuple(requests), rate)

    def arrivals(self) -> list[float]:
        """Each request's send time in seconds from the start."""
        if self.rate is None:
            return [0.0] * len(self.requests)
        rng = random.Random(self.seed)
        return list(itertools.accumulate(rng.expovariate(self.rate) for _ in self.requests))

    @property
    def categories(self) -> list[str]:
        return sorted({r.category for r in self.requests})
