"""Measured sweeps of llama-server's own settings: for every configuration of a grid over its flags, a real
llama-server on loopback serves the user's workload at that concurrency, then stops.

:func:`server_sweep` starts one :class:`~mtp_explorer.server.LlamaServer` per configuration, sends the
:class:`Workload` (all requests at once, or at Poisson arrival times), reads the timings of every answer and the
speculative counters of ``/metrics``, and stops the server, whatever happened. A server that fails to start,
crashes or is killed, hangs past ``timeout_s`` or answers garbage is that configuration's failure (its ``status``),
and the sweep goes on. The result, a :class:`ServerSweep`, holds one row per configuration and category.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core import metrics
from ..core.checks import check_int
from ..core.errors import FormatError, ParameterError, ServerError
from .client import Completion, ServerClient, SpecMetrics
from .grid import GRID_FLAGS, command_line, configurations, grid_lists, passed_settings, server_flags
from .predict import predict_sweep
from .process import LlamaServer
from .workload import ALL, Workload, WorkloadRequest

#: What the best configuration can be chosen for (:meth:`ServerSweep.best`).
GOALS = ("throughput", "p95_latency", "goodput")
FORMAT = "mtp-explorer-server-sweep-1"


@dataclasses.dataclass(frozen=True)
class _Answer:
    """One request's answer (or failure) with its wall-clock latency and when it came back (seconds from the
    workload's start)."""

    request: WorkloadRequest
    completion: Completion | None
    latency: float
    error: str = ""
    finished: float = math.nan


@dataclasses.dataclass
class _ConfigRun:
    """One run of a configuration: its status, answers, counters grown, wall seconds of the workload, command line,
    and (when asked for) every request's prompt as the server's token ids."""

    command: str
    status: str = "ok"
    answers: list[_Answer] = dataclasses.field(default_factory=list)
    grown: SpecMetrics | None = None
    wall: float = math.nan
    prompt_tokens: list[list[int]] | None = None


def _run_config(
    model,
    config: Mapping[str, Any],
    workload: Workload,
    *,
    draft_model,
    n_ctx: int,
    threads: int,
    binary,
    timeout_s: float,
    want_tokens: bool,
    on_server_started: Callable[[LlamaServer, dict[str, Any]], Any] | None = None,
) -> _ConfigRun:
    run = _ConfigRun(
        "llama-server " + " ".join(command_line(model, config, draft_model=draft_model, n_ctx=n_ctx, threads=threads))
    )
    server = LlamaServer(
        model,
        n_parallel=int(config.get("n_parallel", 1)),
        n_ctx=n_ctx,
        threads=threads,
        spec_type=None,
        args=server_flags(config, draft_model),
        binary=binary,
        startup_timeout=timeout_s,
    )
    try:
        try:
            server.start()
        except ServerError as exc:
            run.status = f"failed to start: {_first_line(exc)}"
            return run
        if on_server_started is not None:
            on_server_started(server, dict(config))
        client = ServerClient(server.url, timeout=timeout_s)
        if want_tokens:
            try:
                run.prompt_tokens = [req.server_tokens(client) for req in workload.requests]
            except ServerError:
                run.prompt_tokens = None
        before = _metrics(client)
        if _exited(server, 0.0):
            run.status = f"crashed ({_exit_reason(server.process.returncode)}) before the workload"
            return run
        run.answers, run.wall, timed_out = _send(client, workload, timeout_s, server)
        failed = [a for a in run.answers if a.completion is None]
        # a killed server's connections close before its exit status is there to read: wait a moment for it
        crashed = not timed_out and _exited(server, 1.0 if failed else 0.0)
        after = None if timed_out or crashed or failed else _metrics(client)
        crashed = crashed or (isinstance(after, str) and _exited(server, 1.0))  # died before its counters were read
        if timed_out:
            run.status = f"timed out after {timeout_s:g} s"
        elif crashed:
            run.status = f"crashed ({_exit_reason(server.process.returncode)}) during the workload"
            if failed:
                run.status += f": {len(failed)} of {len(run.answers)} requests failed"
        elif failed:
            run.status = f"{len(failed)} of {len(run.answers)} requests failed: {failed[0].error}"
        elif isinstance(before, str) or isinstance(after, str):
            run.status = f"bad /metrics: {before if isinstance(before, str) else after}"
        else:
            run.grown = after.since(before)
        return run
    finally:
        server.stop()


def _exited(server: LlamaServer, wait_s: float) -> bool:
    """Whether the server's process has exited (waiting at most ``wait_s`` seconds for it); its status is then
    collected (``server.process.returncode``)."""
    try:
        server.process.wait(timeout=wait_s) if wait_s > 0 else server.process.poll()
    except subprocess.TimeoutExpired:
        pass
    return server.process.returncode is not None


def _exit_reason(returncode: int) -> str:
    """A process's exit status in words: ``exit code 3``, ``killed by SIGKILL``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _metrics(client: ServerClient) -> SpecMetrics | str:
    try:
        return client.metrics()
    except ServerError as exc:
        return _first_line(exc)


def _send(
    client: ServerClient, workload: Workload, timeout_s: float, server: LlamaServer
) -> tuple[list[_Answer], float, bool]:
    """Every request at its arrival time, each on its own connection: the answers in the workload's order, the
    wall seconds from the start to the last answer, and whether ``timeout_s`` passed first (the server is then
    killed, which ends the requests still waiting)."""
    arrivals = workload.arrivals()
    start = time.monotonic()
    fired, stopping = threading.Event(), threading.Event()

    def expire() -> None:
        fired.set()
        proc = server.process
        if proc is not None:
            proc.kill()

    deadline = threading.Timer(timeout_s, expire)
    deadline.daemon = True
    deadline.start()

    def one(req: WorkloadRequest, at: float) -> _Answer:
        if stopping.wait(max(0.0, start + at - time.monotonic())):
            return _Answer(req, None, 0.0, "not sent: the sweep was interrupted")
        t0 = time.monotonic()
        try:
            done = req.send(client)
            now = time.monotonic()
            return _Answer(req, done, now - t0, finished=now - start)
        except ServerError as exc:
            return _Answer(req, None, time.monotonic() - t0, _first_line(exc))

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(workload.requests))
    try:
        answers = list(pool.map(one, workload.requests, arrivals))
    except BaseException:
        # an interrupt: kill the server first, which ends the requests the pool waits for (a busy llama-server
        # outlasts the 10 s stop() gives SIGTERM; its half-done work is discarded either way)
        stopping.set()
        proc = server.process
        if proc is not None:
            proc.kill()
        server.stop()
        raise
    finally:
        deadline.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
    return answers, time.monotonic() - start, fired.is_set()


def _percentile(values: Sequence[float], q: float) -> float:
    """numpy's (linear) percentile, NaN for no values."""
    return float(np.percentile(values, 100 * q)) if values else math.nan


def _rows(config: Mapping[str, Any], run: _ConfigRun, categories: list[str]) -> list[dict[str, Any]]:
    """One run's rows: one over every request, and one per category when there are several."""
    answers, grown, wall = run.answers, run.grown, run.wall
    rows = []
    for cat in [ALL] + categories if categories != [ALL] else [ALL]:
        mine = [a for a in answers if cat == ALL or a.request.category == cat]
        done = [a.completion for a in mine if a.completion is not None]
        drafted = sum(c.draft_n for c in done)
        accepted = sum(c.draft_n_accepted for c in done)
        latencies = [a.latency for a in mine if a.completion is not None]
        ttft = [a.latency - a.completion.predicted_ms / 1e3 for a in mine if a.completion is not None]
        rows.append(
            dict(config)
            | {
                "category": cat,
                "status": run.status,
                "n_requests": len(mine),
                "n_tokens": sum(c.tokens_predicted for c in done),
                "n_drafted": drafted,
                "n_accepted": accepted,
                "tokens_per_second": sum(c.tokens_predicted for c in done) / wall if done and wall > 0 else math.nan,
                "request_tokens_per_second": _percentile([c.predicted_per_second for c in done], 0.5),
                "acceptance": accepted / drafted if drafted else math.nan,
                "mean_accepted_length": (grown.mean_accepted_length if grown is not None and cat == ALL else math.nan),
                "latency_p50": _percentile(latencies, 0.5),
                "latency_p95": _percentile(latencies, 0.95),
                "ttft_p50": _percentile(ttft, 0.5),
                "ttft_p95": _percentile(ttft, 0.95),
                "wall_seconds": wall,
                "command": run.command,
            }
        )
    return rows


def served_after(answers: Sequence[_Answer], n_slots: int) -> list[int]:
    """Per answer, the request its slot served just before it in the run (its index; -1: the slot served nothing
    before, or which slot served it is unknown: a chat answer does not say, unless the server has one slot): a slot
    serves one request at a time, so in the order the answers came back. llama-server keeps a slot's state from one
    request to the next (its draft-mtp head's pending hidden row, common_speculative_impl_draft_mtp::pending_h)."""

    def slot(a: _Answer) -> int:
        return a.completion.id_slot if a.completion.id_slot >= 0 or n_slots != 1 else 0

    last: dict[int, int] = {}
    out = [-1] * len(answers)
    for i in sorted(
        (i for i, a in enumerate(answers) if a.completion is not None and slot(a) >= 0),
        key=lambda i: answers[i].finished,
    ):
        out[i] = last.get(slot(answers[i]), -1)
        last[slot(answers[i])] = i
    return out


def _request_rows(config: Mapping[str, Any], run: _ConfigRun, repeat: int) -> list[dict[str, Any]]:
    """One run's answers, one row per request (those that failed included, with NaN timings)."""
    rows = []
    after = served_after(run.answers, int(config.get("n_parallel", 1)))
    for i, a in enumerate(run.answers):
        c = a.completion
        rows.append(
            dict(config)
            | {
                "repeat": repeat,
                "request": i,
                "category": a.request.category,
                "ok": c is not None,
                "tokens_predicted": c.tokens_predicted if c else -1,
                "draft_n": c.draft_n if c else -1,
                "draft_n_accepted": c.draft_n_accepted if c else -1,
                "latency": a.latency,
                "ttft": a.latency - c.predicted_ms / 1e3 if c else math.nan,
                "predicted_per_second": c.predicted_per_second if c else math.nan,
                "text_digest": hashlib.sha1(c.text.encode()).hexdigest()[:12] if c else "",
                "id_slot": c.id_slot if c else -1,
                "finished": a.finished,
                "served_after": after[i],
            }
        )
    return rows


#: Columns of a configuration's row that are medians over its repeated runs (the others are its first run's).
TIMED = (
    "tokens_per_second",
    "request_tokens_per_second",
    "latency_p50",
    "latency_p95",
    "ttft_p50",
    "ttft_p95",
    "wall_seconds",
)


def _over_repeats(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A configuration's rows over its runs: the first failed run's rows if one failed; else the first run's counts
    with the median of every timed column, the run-to-run spread of ``tokens_per_second`` ((max - min) / median;
    NaN for one run) and whether the runs' counts differ (``counts_vary``: the server's own run-to-run variation)."""
    failed = [run for run in runs if run[0]["status"] != "ok"]
    if failed:
        return [row | {"repeats": len(runs), "tokens_per_second_spread": math.nan} for row in failed[0]]
    rows = []
    for i, first in enumerate(runs[0]):
        timed = {k: float(np.median([run[i][k] for run in runs])) for k in TIMED}
        tps = [run[i]["tokens_per_second"] for run in runs]
        spread = metrics.spread(tps)
        counts = {(run[i]["n_tokens"], run[i]["n_drafted"], run[i]["n_accepted"]) for run in runs}
        rows.append(
            first | timed | {"repeats": len(runs), "tokens_per_second_spread": spread, "counts_vary": len(counts) > 1}
        )
    return rows


@dataclasses.dataclass
class ServerSweep:
    """A sweep's results: :attr:`frame`, one row per configuration and category (the grid's keys, ``category``,
    ``status`` ("ok" or what failed), ``tokens_per_second`` (every request's tokens over the workload's wall time),
    ``request_tokens_per_second`` (median per request), ``n_tokens``, ``n_drafted`` and ``n_accepted`` (the answers'
    ``tokens_predicted``, ``draft_n`` and ``draft_n_accepted`` summed), ``acceptance``, ``mean_accepted_length``,
    ``latency_p50`` / ``_p95`` and ``ttft_p50`` / ``_p95`` in seconds, ``wall_seconds``, ``command``; with several
    ``repeats`` the timed columns are medians and ``tokens_per_second_spread`` the run-to-run spread), and what it
    ran. :meth:`with_predictions` adds the explorer's prediction of every row."""

    frame: Any
    model: str
    grid: dict[str, list[Any]]
    workload: Workload
    prompt_tokens: list[list[int]] | None = None  #: each request's prompt as the server decoded it (None: unknown)
    #: one row per configuration, run (``repeat``) and request: the grid's keys, ``request`` (its index in the
    #: workload), ``category``, ``ok``, the server's ``tokens_predicted`` / ``draft_n`` / ``draft_n_accepted`` (-1 for a
    #: failed request), ``latency`` / ``ttft`` in seconds, ``predicted_per_second``, ``text_digest``, ``id_slot`` (the
    #: slot that served it), ``finished`` (seconds from the workload's start to its answer) and ``served_after`` (the
    #: request its slot served just before it, -1 none: :func:`served_after`)
    requests: Any = None

    def best(self, goal: str = "throughput", *, latency_bound: float | None = None):
        """The best configuration per concurrency (``n_parallel``) over every request (a DataFrame): the highest
        ``tokens_per_second`` (``"throughput"``), the lowest ``latency_p95`` (``"p95_latency"``), or the highest
        tokens/s with ``latency_p95 <= latency_bound`` (``"goodput"``). Failed configurations are left out."""
        if goal not in GOALS:
            raise ParameterError(f"goal must be one of {GOALS}, got {goal!r}")
        if goal == "goodput" and latency_bound is None:
            raise ParameterError("goal='goodput' needs latency_bound (seconds of p95 latency)")
        f = self.frame[(self.frame["category"] == ALL) & (self.frame["status"] == "ok")]
        if goal == "goodput":
            f = f[f["latency_p95"] <= latency_bound]
        key, ascending = ("latency_p95", True) if goal == "p95_latency" else ("tokens_per_second", False)
        by = "n_parallel" if "n_parallel" in f else None
        f = f.sort_values(key, ascending=ascending, kind="stable")
        return (f.groupby(by, as_index=False).head(1) if by else f.head(1)).reset_index(drop=True)

    def with_predictions(self, session, *, costs=None, binary=None, progress: bool = True) -> ServerSweep:
        """This sweep with the explorer's prediction of every row beside the measurement
        (:data:`~mtp_explorer.server.predict.PREDICTED_COLUMNS`: ``predicted_tokens_per_second``,
        ``predicted_acceptance``, their errors, ...) and of every request's counters in :attr:`requests`
        (``predicted_draft_n``, ..., ``counts_match``), from one recording of the workload with ``session`` (on the
        sweep's model) and a batch cost model (``costs``, default measured now, with the overheads of the llama-server
        ``binary``): see :func:`~mtp_explorer.server.predict.predict_sweep`."""
        frame, requests = predict_sweep(self, session, costs=costs, binary=binary, progress=progress)
        return dataclasses.replace(self, frame=frame, requests=requests)

    def command(self, row: Mapping[str, Any]) -> str:
        """The llama-server command line of a row (its configuration)."""
        return str(row["command"])

    def preset(self, row: Mapping[str, Any], name: str = "mtp-explorer") -> str:
        """A row's configuration as a llama.cpp INI preset section (``docs/preset.md``): llama-server's long option
        names without dashes, and the model."""
        lines = [f"[{name}]", f"model = {self.model}"]
        for key, value in passed_settings({key: row[key] for key in self.grid}).items():
            lines.append(f"{GRID_FLAGS[key].lstrip('-')} = {value}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the sweep as JSON (:meth:`load` reads it back)."""
        doc = {
            "format": FORMAT,
            "model": self.model,
            "grid": self.grid,
            "workload": {
                "rate": self.workload.rate,
                "seed": self.workload.seed,
                "requests": [dataclasses.asdict(r) for r in self.workload.requests],
            },
            "prompt_tokens": self.prompt_tokens,
            "requests": None if self.requests is None else json.loads(self.requests.to_json(orient="records")),
            "frame": json.loads(self.frame.to_json(orient="records")),
        }
        path = Path(path)
        path.write_text(json.dumps(doc))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> ServerSweep:
        import pandas as pd

        try:
            doc = json.loads(Path(path).read_text())
        except ValueError:
            raise FormatError(f"{path} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise FormatError(f"{path} is not an mtp-explorer server sweep")
        try:
            requests = tuple(
                WorkloadRequest(**(r | {"messages": None if r.get("messages") is None else tuple(r["messages"])}))
                for r in doc["workload"]["requests"]
            )
            workload = Workload(requests, doc["workload"]["rate"], doc["workload"]["seed"])
            frame = pd.DataFrame(doc["frame"])
            frame = frame.astype({c: str for c in ("status", "command", "prediction_note") if c in frame})
            requests = None if doc.get("requests") is None else pd.DataFrame(doc["requests"])
            return cls(
                frame=frame,
                model=doc["model"],
                grid=doc["grid"],
                workload=workload,
                prompt_tokens=doc.get("prompt_tokens"),
                requests=requests,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"{path}: a corrupt server sweep ({exc!r})") from None


def server_sweep(
    model: str | os.PathLike,
    workload: Workload | Sequence[str],
    grid: Mapping[str, Sequence[Any]],
    *,
    n_predict: int = 128,
    draft_model: str | os.PathLike | None = None,
    timeout_s: float = 600.0,
    n_ctx: int = 4096,
    threads: int = 2,
    binary: str | os.PathLike | None = None,
    repeats: int = 1,
    progress: bool = True,
    on_server_started: Callable[[LlamaServer, dict[str, Any]], Any] | None = None,
) -> ServerSweep:
    """Every configuration of ``grid`` (llama.cpp's option names without dashes, :data:`GRID_FLAGS`, to lists of
    values) measured on a real llama-server serving ``workload`` (a :class:`Workload`, or prompts of ``n_predict``
    tokens each, all at once). Each configuration is bounded by ``timeout_s`` seconds (start-up and workload each);
    its server is stopped whatever happens, also when the sweep is interrupted (``KeyboardInterrupt`` goes on once
    no server of the sweep runs). A server that dies (a crash, a kill) is that configuration's ``status``, e.g.
    ``"crashed (killed by SIGKILL) during the workload: 2 of 2 requests failed"``, and the sweep goes on with a new
    server. ``repeats`` runs each configuration on that many fresh servers, round after round through the grid so that
    a drift of the machine's speed during the sweep shows in every configuration's spread rather than between
    configurations (the timed columns are then medians, with the run-to-run spread). ``on_server_started(server,
    config)`` is called with each :class:`LlamaServer` once it answers ``/health``, before the workload (to watch it,
    or to inject a fault); what it raises ends the sweep, its server stopped."""
    import pandas as pd
    from tqdm.auto import tqdm

    if not isinstance(workload, Workload):
        workload = Workload.from_prompts(workload, n_predict)
    configs = configurations(grid)
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ParameterError(f"timeout_s must be seconds > 0, got {timeout_s!r}")
    check_int("repeats", repeats, 1, None)
    rows, per_request, tokens = [], [], None
    bar = tqdm(total=len(configs) * repeats, desc="llama-server sweep", unit="run", disable=not progress, leave=False)
    runs: list[list[Any]] = [[] for _ in configs]
    try:
        for repeat in range(repeats):
            for config, config_runs in zip(configs, runs):
                bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in config.items()))
                run = _run_config(
                    model,
                    config,
                    workload,
                    draft_model=draft_model,
                    n_ctx=n_ctx,
                    threads=threads,
                    binary=binary,
                    timeout_s=timeout_s,
                    want_tokens=tokens is None,
                    on_server_started=on_server_started,
                )
                tokens = tokens or run.prompt_tokens
                config_runs.append(_rows(config, run, workload.categories))
                per_request += _request_rows(config, run, repeat)
                bar.update(1)
        for config_runs in runs:
            rows += _over_repeats(config_runs)
    finally:
        bar.close()
    return ServerSweep(
        frame=pd.DataFrame(rows),
        model=str(model),
        grid=grid_lists(grid),
        workload=workload,
        prompt_tokens=tokens,
        requests=pd.DataFrame(per_request),
    )
