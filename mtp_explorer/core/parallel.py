"""Parallel generation: several requests sharing the engine's steps, as llama-server's slots share a batch.

A session opened with ``n_parallel=N`` (llama.cpp's ``-np``) has N sequences in one target context and one MTP
context for all of them. :meth:`~mtp_explorer.Session.generate_parallel` runs a list of requests on them: every step
drafts for all active sequences (the MTP head's decodes batched depth by depth across them) and verifies all
their drafts in one target batch. Requests arrive at their ``arrivals`` step, wait for a free sequence when all
are busy and leave it when they finish (continuous batching).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import metrics, native
from .checks import check_int
from .errors import ParameterError
from .handle import EngineHandle, Prompt, check_streamable, finishing_on_interrupt
from .schema import PHASES
from .settings import DraftSettings, resolve_each
from .trace import Step, Trace

#: The per-request settings ``params`` may override, and what each defaults to.
REQUEST_KEYS: tuple[str, ...] = ("n_max", "p_min", "n_min", "max_tokens")

#: The columns shared by the sequences of one engine step (the same in each sequence's row).
BATCH_COLUMNS: tuple[str, ...] = ("batch_step", "n_active", "verify_rows") + tuple(f"t_{p}_ns" for p in PHASES)


class ParallelStep(NamedTuple):
    """One sequence's row of an engine step: :meth:`~mtp_explorer.Session.stream_parallel` yields a list of them per
    step."""

    seq: int  #: the request's index
    slot: int  #: the sequence (server slot) it runs on
    step: Step


@dataclasses.dataclass
class RequestInfo:
    """Where one request of a parallel generation ran: its slot and its arrival, admission and finish steps."""

    index: int
    slot: int  #: the sequence (server slot) it took; -1: it never got one (cancelled while waiting)
    arrival: int  #: the engine step it arrived at
    admitted_step: int  #: the step it took its slot at (it waited while all slots were busy)
    finished_step: int  #: the step it finished at (-1: cancelled before admission)
    n_prompt: int
    t_prefill_ns: int


@dataclasses.dataclass
class ParallelTrace:
    """The requests of one parallel generation: a :class:`~mtp_explorer.Trace` per request and where each ran."""

    traces: list[Trace]
    requests: list[RequestInfo]
    settings: dict[str, Any]

    def __len__(self) -> int:
        return len(self.traces)

    def batch_steps(self):
        """One row per engine step (a pandas DataFrame): its index, active sequences, verify-batch rows, phase
        times and the tokens it emitted over all sequences."""
        import pandas as pd

        frames = []
        for t in self.traces:
            c = t.columns
            frames.append(pd.DataFrame({name: c[name] for name in BATCH_COLUMNS} | {"tokens": c["n_accepted"] + 1}))
        if not frames or not any(len(f) for f in frames):
            return pd.DataFrame(columns=list(BATCH_COLUMNS) + ["tokens"])
        rows = pd.concat(frames)
        agg = {name: "first" for name in BATCH_COLUMNS if name != "batch_step"} | {"tokens": "sum"}
        return rows.groupby("batch_step", as_index=False).agg(agg).sort_values("batch_step", ignore_index=True)

    def to_pandas(self):
        """Every request's steps in long format: the :meth:`Trace.to_pandas` columns with ``seq`` (the request's
        index) and ``slot`` (the sequence it ran on) first."""
        import pandas as pd

        frames = []
        for info, t in zip(self.requests, self.traces):
            df = t.to_pandas()
            df.insert(0, "slot", info.slot)
            df.insert(0, "seq", info.index)
            frames.append(df)
        return pd.concat(frames, ignore_index=True)

    def summary(self) -> dict[str, Any]:
        """Aggregate throughput: ``tokens_per_second`` (every request's tokens over the steps' and prefills' time),
        ``decode_tokens_per_second`` (steps only) and ``summed_request_tokens_per_second`` (each request's tokens
        over the steps it was in, summed: llama-server's ``predicted_per_second`` summed over requests); per request
        acceptance, latency (admission to finish, its prefill included) and tokens/s; acceptance by depth over all
        requests; the mean target-batch rows and active sequences per step; the recurrent snapshot memory of all
        slots."""
        steps = self.batch_steps()
        step_s = steps[[f"t_{p}_ns" for p in PHASES]].sum(axis=1).to_numpy() / 1e9 if len(steps) else np.zeros(0)
        ends = np.cumsum(step_s)
        spans = {int(b): (e - s, e) for b, s, e in zip(steps["batch_step"], step_s, ends)}  # step -> (start, end)
        prefill_s = sum(r.t_prefill_ns for r in self.requests) / 1e9
        n_tokens = sum(len(t.tokens) for t in self.traces)
        n_d = np.concatenate([t.columns["n_drafted"] for t in self.traces])
        n_a = np.concatenate([t.columns["n_accepted"] for t in self.traces])
        each = [t.summary() for t in self.traces]
        depth = self.traces[0].depth if self.traces else 0
        model = self.traces[0].model if self.traces else {}
        return {
            "n_parallel": self.settings["n_parallel"],
            "n_requests": len(self.traces),
            "n_tokens": n_tokens,
            "n_steps": len(steps),
            "tokens_per_second": metrics.tokens_per_second(n_tokens, float(step_s.sum()) + prefill_s),
            "decode_tokens_per_second": metrics.tokens_per_second(n_tokens, float(step_s.sum())),
            "summed_request_tokens_per_second": float(sum(s["tokens_per_second"] for s in each)),
            "acceptance_rate": metrics.acceptance_rate(n_d, n_a),
            "acceptance_by_depth": metrics.acceptance_by_depth(n_d, n_a, depth).rate,
            "mean_verify_rows": float(steps["verify_rows"].mean()) if len(steps) else float("nan"),
            "mean_active": float(steps["n_active"].mean()) if len(steps) else float("nan"),
            "rs_memory_bytes": (
                int(model.get("rs_slot_bytes", 0)) * self.settings["capacity"] * self.settings["n_parallel"]
            ),
            "requests": [
                self._request_summary(info, t, s, spans) for info, t, s in zip(self.requests, self.traces, each)
            ],
        }

    @staticmethod
    def _request_summary(
        info: RequestInfo, t: Trace, s: Mapping[str, Any], spans: Mapping[int, tuple[float, float]]
    ) -> dict[str, Any]:
        """``s``: the trace's summary; ``spans``: each engine step's start and end (seconds of step time,
        cumulative)."""
        nan = (float("nan"), float("nan"))
        latency = (
            spans.get(info.finished_step, nan)[1] - spans.get(info.admitted_step, nan)[0] + info.t_prefill_ns / 1e9
        )
        return {
            "seq": info.index,
            "slot": info.slot,
            "arrival": info.arrival,
            "admitted_step": info.admitted_step,
            "finished_step": info.finished_step,
            "n_tokens": s["n_tokens"],
            "acceptance_rate": s["acceptance_rate"],
            "mean_accepted_length": s["mean_accepted_length"],
            "latency_seconds": latency,
            "tokens_per_second": s["tokens_per_second"],
            "n_max": t.settings["n_max"],
            "p_min": t.settings["p_min"],
            "finish_reason": t.finish_reason,
        }


class ParallelGeneration:
    """The requests of a :class:`~mtp_explorer.Session`'s parallel generations on its handle's ``n_parallel``
    sequences: what :meth:`~mtp_explorer.Session.generate_parallel` and
    :meth:`~mtp_explorer.Session.stream_parallel` run. ``on_begin`` is told the settings each generation drafts with
    (its first request's)."""

    def __init__(self, handle: EngineHandle, on_begin: Callable[[DraftSettings], None]) -> None:
        self.handle = handle
        self.on_begin = on_begin
        self.last_trace: ParallelTrace | None = None
        """The last generation's result, as far as it went."""
        self._prompts: list[tuple[Prompt, list[int]]] = []
        self._settings: list[dict[str, Any]] = []
        self._drafter = ""

    def generate(
        self,
        prompts: Sequence[Prompt],
        settings: DraftSettings | Sequence[DraftSettings] | None,
        arrivals: Sequence[int] | None,
        params: Sequence[Mapping[str, Any] | None] | None,
        keywords: dict[str, Any],
    ) -> ParallelTrace:
        """Run the requests to the end; an interrupt finishes them as cancelled, kept in :attr:`last_trace`."""
        with self.handle.hold() as engine:
            self._begin(engine, prompts, settings, arrivals, params, keywords)
            with finishing_on_interrupt(engine, self._finish):
                engine.run()
            return self._finish()

    def stream(
        self,
        prompts: Sequence[Prompt],
        settings: DraftSettings | Sequence[DraftSettings] | None,
        arrivals: Sequence[int] | None,
        params: Sequence[Mapping[str, Any] | None] | None,
        keywords: dict[str, Any],
    ) -> Iterator[list[ParallelStep]]:
        """Run the requests, yielding each engine step's rows."""
        check_streamable(self.handle)
        with self.handle.hold() as engine:
            self._begin(engine, prompts, settings, arrivals, params, keywords)
            seen = [0] * engine.n_requests
            with finishing_on_interrupt(engine, self._finish):
                while True:
                    self.handle.model_files.check()  # a stream may pause between steps
                    more = engine.step()
                    fresh = _fresh_rows(engine, seen)
                    if fresh:
                        yield fresh
                    if not more:
                        break
            self._finish()

    # -- internals -------------------------------------------------------------------------------
    def _begin(self, engine: native.Engine, prompts, settings, arrivals, params, keywords) -> None:
        handle = self.handle
        prompts = list(prompts)
        if not prompts:
            raise ParameterError("no prompts: give at least one")
        arrivals = _check_arrivals(arrivals, len(prompts), handle.n_parallel)
        each = request_settings(params, resolve_each(settings, len(prompts), keywords))
        shared = isinstance(settings, DraftSettings) or settings is None
        requests, self._prompts, self._settings = [], [], []
        for i, (prompt, s) in enumerate(zip(prompts, each)):
            try:
                tokens = handle.prompt_tokens(prompt)
                s.check(handle.limits)
                if (s.mode, s.options) != (each[0].mode, each[0].options):
                    raise ParameterError(
                        f"its drafter {s.drafter!r} (or its options) differs from request 0's "
                        f"{each[0].drafter!r}: one drafter serves a parallel generation, as "
                        "llama-server's --spec-type serves every slot"
                    )
            except ParameterError as e:
                raise type(e)(f"request {i}: {e}") from None
            base = handle.seed if s.seed is None else s.seed
            seed = (base + i) % 2**32 if shared or s.seed is None else s.seed
            self._prompts.append((prompt, tokens))
            self._settings.append(
                s.replace(seed=seed).to_dict() | {"arrival": arrivals[i]} | handle.recorded_settings()
            )
            requests.append(native.Request(tokens, s.native_config(seed), s.native_params(), arrivals[i]))
        each[0].warn_unused(stacklevel=5)
        self._drafter = each[0].mode.name
        self.on_begin(each[0])
        engine.begin_requests(requests)

    def _finish(self) -> ParallelTrace:
        handle, engine = self.handle, self.handle.engine
        traces, infos = [], []
        for i, ((prompt, tokens), settings) in enumerate(zip(self._prompts, self._settings)):
            state = engine.request_state(i)
            traces.append(
                Trace(
                    columns=dict(engine.columns(0, i)),
                    settings=settings,
                    t_prefill_ns=state["t_prefill_ns"],
                    totals=dict(state["totals"]),
                    **handle.output(prompt, tokens, i),
                )
            )
            infos.append(
                RequestInfo(
                    index=i,
                    slot=state["slot"],
                    arrival=state["arrival"],
                    admitted_step=state["admitted_step"],
                    finished_step=state["finished_step"],
                    n_prompt=state["n_prompt"],
                    t_prefill_ns=state["t_prefill_ns"],
                )
            )
        result = ParallelTrace(
            traces=traces,
            requests=infos,
            settings={
                "n_parallel": handle.n_parallel,
                "capacity": handle.capacity,
                "n_ctx": handle.n_ctx,
                "drafter": self._drafter,
            },
        )
        self.last_trace = result
        return result


def _fresh_rows(engine: native.Engine, seen: list[int]) -> list[ParallelStep]:
    """The rows each request made since ``seen`` (updated), as :class:`ParallelStep` s."""
    out = []
    for i in range(len(seen)):
        state = engine.request_state(i)
        n = state["n_rows"]
        if n > seen[i]:
            cols = engine.columns(seen[i], i)
            out += [ParallelStep(i, state["slot"], Step.from_columns(cols, k)) for k in range(n - seen[i])]
            seen[i] = n
    return out


def _check_arrivals(arrivals: Sequence[int] | None, n: int, n_parallel: int) -> list[int]:
    """Each request's arrival step, checked (``None``: all at step 0, at most ``n_parallel`` of them)."""
    if arrivals is None:
        if n > n_parallel:
            raise ParameterError(
                f"{n} prompts at once, but the session has n_parallel={n_parallel} "
                "sequences: open it with a larger n_parallel, or give arrivals (the step each "
                "request arrives at; requests then wait for a free sequence)"
            )
        return [0] * n
    arrivals = list(arrivals)
    if len(arrivals) != n:
        raise ParameterError(f"arrivals has {len(arrivals)} entries for {n} prompts")
    return [check_int(f"arrivals[{i}]", a, 0, None) for i, a in enumerate(arrivals)]


def request_settings(
    params: Sequence[Mapping[str, Any] | None] | None, settings: Sequence[DraftSettings]
) -> list[DraftSettings]:
    """Each request's settings: its entry of ``settings``, overridden by its entry of ``params`` (keys of
    :data:`REQUEST_KEYS`, llama-server's per-request settings; an ``n_max`` given without ``n_min`` lowers ``n_min``
    to it). A wrong length or an unknown key is a :class:`ParameterError`."""
    n = len(settings)
    params = [None] * n if params is None else list(params)
    if len(params) != n:
        raise ParameterError(f"params has {len(params)} entries for {n} prompts")
    out = []
    for i, (p, s) in enumerate(zip(params, settings)):
        p = dict(p or {})
        unknown = sorted(set(p) - set(REQUEST_KEYS))
        if unknown:
            raise ParameterError(
                f"params[{i}]: unknown setting(s) {unknown}; per-request settings are {list(REQUEST_KEYS)}"
            )
        try:
            out.append(s.replace(**p) if p else s)
        except ParameterError as e:
            raise type(e)(f"request {i}: {e}") from None
    return out
