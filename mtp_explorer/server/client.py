"""HTTP access to a running llama-server: ``/health``, ``POST /completion`` and the Prometheus ``/metrics``, each with
a bounded timeout. Every failure is a :class:`~mtp_explorer.core.errors.ServerError`: unreachable (refused, timed
out) a :class:`ServerUnavailableError`, an HTTP error or a malformed answer a :class:`ServerProtocolError`."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ServerProtocolError, ServerUnavailableError

#: llama-server's metric names are prefixed with this (``tools/server``: ``llamacpp:<name>``).
PREFIX = "llamacpp:"
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _labels(text: str, where: str) -> str:
    """A sample's labels (``k="v",...``) as the key writes them; anything else is a :class:`ServerProtocolError`."""
    pairs, pos = [], 0
    for m in _LABEL.finditer(text):
        if m.start() != pos:
            break
        pairs.append(f'{m[1]}="{m[2]}"')
        pos = m.end()
    if pos != len(text) or not pairs:
        raise ServerProtocolError(f"malformed labels in {where}")
    return "{" + ",".join(pairs) + "}"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as ``{name or name{label="v",...}: value}`` (comments and blank lines skipped);
    a line that is not a sample is a :class:`ServerProtocolError`."""
    out: dict[str, float] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"metrics line {n}: {line[:120]!r}"
        m = _SAMPLE.match(line)
        if m is None:
            raise ServerProtocolError(f"malformed {where}")
        try:
            value = float(m["value"])
        except ValueError:
            raise ServerProtocolError(f"no number in {where}") from None
        out[m["name"] + (_labels(m["labels"], where) if m["labels"] is not None else "")] = value
    return out


@dataclasses.dataclass(frozen=True)
class SpecMetrics:
    """llama-server's speculative-decoding counters (``/metrics``, cumulative since it started, or the difference
    of two readings: :meth:`since`)."""

    drafts: int  #: ``spec_decode_num_drafts_total``: verification steps of a draft
    draft_tokens: int  #: ``spec_decode_num_draft_tokens_total``
    accepted_tokens: int  #: ``spec_decode_num_accepted_tokens_total``
    accepted_per_pos: tuple[int, ...]  #: ``spec_decode_num_accepted_tokens_per_pos_total{position=i}``
    tokens_predicted: int  #: ``tokens_predicted_total``
    predicted_seconds: float  #: ``tokens_predicted_seconds_total``
    requests_processing: int = 0  #: gauge: slots busy now

    @classmethod
    def from_samples(cls, samples: dict[str, float]) -> SpecMetrics:
        """From :func:`parse_metrics`' samples; a server without the counters (no ``--metrics``, an older build) is a
        :class:`ServerProtocolError`."""

        def counter(name: str) -> float:
            try:
                return samples[PREFIX + name]
            except KeyError:
                raise ServerProtocolError(f"the server's metrics lack {PREFIX + name}") from None

        per_pos: dict[int, int] = {}
        pat = re.compile(re.escape(PREFIX) + r'spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}')
        for key, value in samples.items():
            m = pat.fullmatch(key)
            if m:
                per_pos[int(m[1])] = int(value)
        return cls(
            drafts=int(counter("spec_decode_num_drafts_total")),
            draft_tokens=int(counter("spec_decode_num_draft_tokens_total")),
            accepted_tokens=int(counter("spec_decode_num_accepted_tokens_total")),
            accepted_per_pos=tuple(per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)),
            tokens_predicted=int(counter("tokens_predicted_total")),
            predicted_seconds=float(counter("tokens_predicted_seconds_total")),
            requests_processing=int(samples.get(PREFIX + "requests_processing", 0)),
        )

    def since(self, earlier: SpecMetrics) -> SpecMetrics:
        """The counters' growth from ``earlier`` to this reading."""
        n = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        pad = lambda t: tuple(t) + (0,) * (n - len(t))  # noqa: E731
        return SpecMetrics(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
            tuple(a - b for a, b in zip(pad(self.accepted_per_pos), pad(earlier.accepted_per_pos))),
            self.tokens_predicted - earlier.tokens_predicted,
            self.predicted_seconds - earlier.predicted_seconds,
            self.requests_processing,
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (NaN before any draft)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per verification of a draft (NaN before any)."""
        return self.accepted_tokens / self.drafts if self.drafts else math.nan

    @property
    def acceptance_by_position(self) -> list[float]:
        """Per draft position: the share of verified drafts whose token there was accepted."""
        return [a / self.drafts if self.drafts else math.nan for a in self.accepted_per_pos]

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of generation time, summed over the slots (the server's own clock)."""
        return self.tokens_predicted / self.predicted_seconds if self.predicted_seconds > 0 else math.nan


@dataclasses.dataclass(frozen=True)
class Completion:
    """One ``/completion`` answer: its text and ``timings``."""

    prompt: str
    text: str  #: ``content``
    tokens_predicted: int  #: ``timings.predicted_n``
    predicted_ms: float
    predicted_per_second: float
    prompt_n: int
    prompt_ms: float
    draft_n: int  #: ``timings.draft_n``: tokens drafted (0 without speculative decoding)
    draft_n_accepted: int  #: ``timings.draft_n_accepted``
    stop_type: str  #: ``eos``, ``limit``, ``word``, ...
    id_slot: int = -1  #: ``id_slot``: the slot that served it (-1: not said)

    @classmethod
    def from_json(cls, prompt: str, doc: Any) -> Completion:
        try:
            t = doc["timings"]
            return cls(
                prompt=prompt,
                text=str(doc["content"]),
                tokens_predicted=int(t["predicted_n"]),
                predicted_ms=float(t["predicted_ms"]),
                predicted_per_second=float(t["predicted_per_second"]),
                prompt_n=int(t["prompt_n"]),
                prompt_ms=float(t["prompt_ms"]),
                draft_n=int(t.get("draft_n", 0)),
                draft_n_accepted=int(t.get("draft_n_accepted", 0)),
                stop_type=str(doc.get("stop_type", "")),
                id_slot=int(doc.get("id_slot", -1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerProtocolError(f"malformed /completion answer ({exc!r}): {str(doc)[:300]}") from None

    @classmethod
    def from_chat_json(cls, prompt: str, doc: Any) -> Completion:
        """A ``/v1/chat/completions`` answer (its first choice's message, its ``timings``)."""
        try:
            choice = doc["choices"][0]
            flat = {
                "content": choice["message"]["content"] or "",
                "timings": doc["timings"],
                "stop_type": {"stop": "eos", "length": "limit"}.get(choice.get("finish_reason"), ""),
                "id_slot": doc.get("id_slot", -1),
            }
        except (KeyError, IndexError, TypeError) as exc:
            raise ServerProtocolError(f"malformed chat answer ({exc!r}): {str(doc)[:300]}") from None
        return cls.from_json(prompt, flat)

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else math.nan


class ServerClient:
    """Requests to the llama-server at ``url`` (``http://host:port``), each bounded by ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ServerProtocolError(f"a server URL starts with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)

    def _request(self, path: str, body: dict | None = None, timeout: float | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise ServerProtocolError(f"{self.url}{path} answered HTTP {exc.code}: {detail}") from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerUnavailableError(f"{self.url} is unreachable ({path}): {reason}") from None

    def _json(self, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        _, raw = self._request(path, body, timeout)
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerProtocolError(f"{self.url}{path} answered something that is not JSON: {raw[:200]!r}") from None

    def health(self, timeout: float | None = None) -> dict:
        """``GET /health`` (a :class:`ServerProtocolError` while the model still loads: HTTP 503)."""
        return self._json("/health", timeout=timeout)

    def metrics(self) -> SpecMetrics:
        """``GET /metrics``, the speculative counters read (the server must run with ``--metrics``)."""
        _, raw = self._request("/metrics")
        return SpecMetrics.from_samples(parse_metrics(raw.decode(errors="replace")))

    def complete(
        self, prompt: str, n_predict: int, *, temperature: float = 0.0, cache_prompt: bool = False, **params: Any
    ) -> Completion:
        """``POST /completion``, greedy and without prompt caching unless told otherwise; ``params`` are further
        request fields (``seed``, ...)."""
        body = {
            "prompt": prompt,
            "n_predict": int(n_predict),
            "temperature": temperature,
            "cache_prompt": cache_prompt,
        } | params
        return Completion.from_json(prompt, self._json("/completion", body))

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        n_predict: int,
        *,
        temperature: float = 0.0,
        cache_prompt: bool = False,
        **params: Any,
    ) -> Completion:
        """``POST /v1/chat/completions`` with ``messages`` (``[{"role": ..., "content": ...}, ...]``), greedy, at most
        ``n_predict`` tokens (``max_tokens``) and without prompt caching unless told otherwise."""
        body = {
            "messages": list(messages),
            "max_tokens": int(n_predict),
            "temperature": temperature,
            "cache_prompt": cache_prompt,
        } | params
        return Completion.from_chat_json(json.dumps(list(messages)), self._json("/v1/chat/completions", body))

    def apply_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """``POST /apply-template``: the prompt the server makes of chat ``messages`` with the model's template."""
        doc = self._json("/apply-template", {"messages": list(messages)})
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str):
            raise ServerProtocolError(f"malformed /apply-template answer: {str(doc)[:300]}")
        return doc["prompt"]

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """``POST /tokenize``: the token ids the server makes of ``text`` (special tokens parsed, as it does for a
        prompt; ``add_special``: with the model's BOS)."""
        doc = self._json("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})
        try:
            return [int(t) for t in doc["tokens"]]
        except (KeyError, TypeError, ValueError):
            raise ServerProtocolError(f"malformed /tokenize answer: {str(doc)[:300]}") from None

    def complete_many(self, prompts: Sequence[str], n_predict: int, **params: Any) -> list[Completion]:
        """The prompts sent at once (one connection each, so the server's slots take them together); the answers
        in the prompts' order."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
            futures = [pool.submit(self.complete, p, n_predict, **params) for p in prompts]
            return [f.result() for f in futures]
