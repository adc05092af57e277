"""The explorer's prediction of a server sweep, from one recording of its workload.

:func:`predict_sweep` records one oracle per request of a :class:`~mtp_explorer.server.sweep.Workload` with a session
on the same model, measures (or takes) this machine's batch cost model, and for every configuration of the sweep's
grid replays each request as a llama-server slot runs it (:func:`~mtp_explorer.simulate` with ``server_slot=True``)
and schedules them on ``n_parallel`` slots (:func:`~mtp_explorer.predict_parallel`). The draft counters it predicts
are those the server reports for each request on a fresh slot: this engine runs each request as the slot runs it
(:func:`slot_run_counters`: the prompt in the server's batches, so its greedy path is the server's also past a
near-tie that the recording, its prompt decoded otherwise, resolves the other way), else the recording is replayed
(:func:`request_counters`: :func:`server_counters`, or with ngram-simple in the chain :func:`server_lookup_counters`);
both size ngram-simple's drafts and restore checkpoints as llama-server does. A drafter whose state a server keeps from
one request to the next (:attr:`~mtp_explorer.core.drafters.DrafterSpec.server_carry`) is predicted from each request's
own prompt, its rows say so in ``prediction_note``, and each request that ran after another on its slot says so in
``slot_carry``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.batch import predict_parallel, profile_batch_costs
from ..analysis.replay import ngram_simple_draft
from ..analysis.server_slot import server_lookup_steps
from ..analysis.simulate import simulate
from ..core import drafters
from ..core.errors import ParameterError
from ..core.settings import DraftSettings
from .grid import configurations
from .overhead import profile_server_overhead
from .workload import ALL

if TYPE_CHECKING:
    from ..analysis.batch import BatchCostModel
    from ..analysis.oracle import OracleTrace
    from ..core.session import Session
    from ..core.trace import Trace
    from .sweep import ServerSweep
    from .workload import Workload

#: The columns :func:`predict_sweep` adds to a sweep's frame.
PREDICTED_COLUMNS = (
    "predicted_tokens_per_second",
    "predicted_acceptance",
    "predicted_n_drafted",
    "predicted_n_accepted",
    "tokens_per_second_error",
    "acceptance_error",
    "beyond_spread",
    "prediction_note",
)


def server_counters(trace: Trace) -> dict[str, int]:
    """The counters llama-server reports for a greedy request that ran as ``trace`` (``n_predict``, ``draft_n``,
    ``draft_n_accepted``): at a step that stops at an end-of-generation token, the server's drafters have drafted
    on past it to the step's cap (``n_max`` cut to the budget left minus one), which the trace does not count."""
    counters = {
        "n_predict": len(trace.tokens),
        "draft_n": int(trace.n_drafted.sum()),
        "draft_n_accepted": int(trace.n_accepted.sum()),
    }
    generated, budget = 0, int(trace.settings["max_tokens"])
    for st in trace.steps:
        if st.stop_reason == "eos":
            counters["draft_n"] += min(st.n_max, budget - generated - 1) - st.n_drafted
        generated += st.n_accepted + 1
    return counters


def server_lookup_counters(oracle: OracleTrace, settings: DraftSettings) -> dict[str, int] | None:
    """The counters llama-server 0.3.36 reports (as :func:`server_counters`) for a greedy request drafted by a chain
    with ngram-simple, replayed as the server runs it where it differs from this engine
    (:func:`~mtp_explorer.analysis.server_slot.server_lookup_steps`: the look-up's draft not cut by ``n_max``, the
    speculative checkpoint's replay on a recurrent target); ``None`` where ``settings`` drafts with no look-up,
    another look-up, or a policy other than llama.cpp's ``first``: those take :func:`server_counters` of a
    :func:`~mtp_explorer.simulate` replay."""
    steps = server_lookup_steps(oracle, settings)
    return None if steps is None else steps.counters


def request_counters(oracle: OracleTrace, settings: DraftSettings) -> dict[str, int]:
    """The counters llama-server reports for one greedy request run alone on a slot (:func:`server_lookup_counters`
    where the server sizes a look-up's draft otherwise than this engine, else :func:`server_counters` of the
    :func:`~mtp_explorer.simulate` replay as a server slot)."""

    counters = server_lookup_counters(oracle, settings)
    return counters if counters is not None else server_counters(simulate(oracle, settings, server_slot=True))


def slot_run_counters(session: Session, prompt, settings: DraftSettings) -> dict[str, int] | None:
    """The counters llama-server reports for a greedy request on a fresh slot, from this engine running the request as
    the slot runs it (:attr:`~mtp_explorer.DraftSettings.server_slot`: the prompt in the server's batches, the first
    token sampled from the last before any draft), where :func:`request_counters` replays a recording whose prompt
    was decoded otherwise (all but its last token at once, then that token alone): a near-tie of the target after the
    prompt can make the recording's greedy path another than the server's. As :func:`server_lookup_counters`, each
    step drafts ngram-simple's look-up as long as the server does (the step's ``n_max``; ``None`` where the session's
    capacity cannot hold it: open it with a larger ``n_rs_seq``) and, on a recurrent target, a rejection deeper than
    the server's snapshot slots is followed by a plain step (the checkpoint replay's extra token). ``None`` also for a
    chain with another look-up or under another policy than llama.cpp's ``first``."""

    s = settings.replace(server_slot=True).check(session.limits)
    mode = s.mode
    lookups = [d for d in mode.drafters if d.is_lookup]
    if s.n_max == 0:
        return server_counters(session.generate(prompt, s))
    if any(d.name != drafters.NGRAM_SIMPLE for d in lookups) or (len(mode.drafters) > 1 and mode.policy != "first"):
        return None
    opts = drafters.option_values(s.options)
    size_n, size_m = int(opts["ngram_simple_size_n"]), int(opts["ngram_simple_size_m"])
    recurrent = bool(session.info.is_recurrent)
    n_rs = mode.n_rs_seq(s.n_max)
    tokens, generated, held = session.prompt_tokens(prompt), [], True
    for step in session.stream(prompt, s):
        if not held:
            continue
        generated += [int(t) for t in step.drafted[: step.n_accepted]] + [int(step.correction)]
        if recurrent and step.n_drafted - step.n_accepted > n_rs:
            n_max = 0  # the server's checkpoint replay emits one more token, drafting nothing
        else:
            looked = ngram_simple_draft(tokens + generated[:-1], generated[-1], size_n, size_m) if lookups else []
            n_max = min(len(looked), max(0, s.max_tokens - len(generated) - 1)) if looked else s.n_max
        if n_max > session.capacity:
            held = False
            session.cancel()
            continue
        session.set_params(n_max=n_max, p_min=s.p_min, n_min=min(s.n_min, n_max))
    return server_counters(session.last_trace) if held else None


def config_settings(config: Mapping[str, Any], n_predict: int) -> DraftSettings:
    """The drafting settings of one request on a server of configuration ``config`` (a sweep grid's keys; llama.cpp's
    defaults for those it does not set; ``spec_type`` ``"none"`` or None: no drafting)."""
    spec = config.get("spec_type")
    if spec in (None, "none"):
        return DraftSettings(n_max=0, max_tokens=n_predict)
    return DraftSettings(
        drafter=spec, max_tokens=n_predict, **{k: config[k] for k in ("n_max", "p_min", "n_min") if k in config}
    )


@dataclasses.dataclass(frozen=True)
class Recording:
    """What a prediction reads: one oracle per request of the workload, and the machine's batch costs."""

    oracles: tuple[OracleTrace, ...]
    costs: BatchCostModel
    #: per drafting configuration of the grid (:func:`drafting_key`), each request's counters from this engine run as a
    #: server slot (:func:`slot_run_counters`; None where it could not); empty: not run
    slot_runs: Mapping[tuple, list] = dataclasses.field(default_factory=dict)
    #: per drafting configuration this session cannot run (:func:`drafting_key`), why: not predicted
    refused: Mapping[tuple, str] = dataclasses.field(default_factory=dict)


def drafting_key(config: Mapping[str, Any]) -> tuple:
    """What of a configuration decides a request's drafts (not ``n_parallel`` nor the placement flags)."""
    return tuple(config.get(k) for k in ("spec_type", "n_max", "p_min", "n_min"))


def record(
    session: Session,
    workload: Workload,
    grid: Mapping[str, Sequence[Any]],
    *,
    prompt_tokens: Sequence[Sequence[int]] | None = None,
    costs: BatchCostModel | None = None,
    progress: Callable[[str], None] | None = None,
    ran: Sequence[Mapping[str, Any]] | None = None,
    binary: str | os.PathLike | None = None,
) -> Recording:
    """Record ``workload`` with ``session`` as deep as the grid drafts (each request's ``prompt_tokens`` where the
    server's are known, else its prompt as the session tokenizes it), run each request as a server slot for each
    configuration in ``ran`` (default: the grid's; a drafting configuration the session refuses is kept in
    :attr:`Recording.refused` with the reason), and measure its batch costs (unless given) for the grid's
    ``n_parallel`` and ``n_max``, with the overheads of a real llama-server (``binary``:
    :func:`~mtp_explorer.server.profile_server_overhead`). The batch costs are measured with llama-server's snapshot
    slots (``n_rs_seq``: the grid's largest ``n_max``), on a second session of the model opened for the measurement
    where ``session`` holds another number of them (see :func:`~mtp_explorer.profile_batch_costs`)."""

    if workload.rate is not None:
        raise ParameterError(
            f"the prediction schedules requests sent all at once; this workload arrives at {workload.rate:g} requests/s"
        )
    n_max = [int(k) for k in grid.get("n_max", [DraftSettings().n_max])]
    n_parallel = sorted({int(n) for n in grid.get("n_parallel", [1])})
    if max(n_max) > session.capacity:
        raise ParameterError(
            f"the grid drafts up to n_max={max(n_max)}, deeper than the session's capacity "
            f"{session.capacity}: open it with n_rs_seq={max(n_max)}"
        )
    if n_parallel[-1] > session.n_parallel:
        raise ParameterError(
            f"the grid runs up to n_parallel={n_parallel[-1]} slots: open the session with "
            f"n_parallel={n_parallel[-1]} to measure its batch costs"
        )
    if prompt_tokens is None and any(req.messages is not None for req in workload.requests):
        raise ParameterError(
            "a chat request's prompt is the server's template applied to its messages: this sweep "
            "has no server tokens to predict it from (no server started)"
        )
    oracles = []
    for i, req in enumerate(workload.requests):
        if progress is not None:
            progress(f"recording request {i + 1} of {len(workload.requests)}")
        prompt = req.prompt if prompt_tokens is None else list(prompt_tokens[i])
        oracles.append(
            session.record_oracle(prompt, max_tokens=req.n_predict, depth=max(n_max), probe=False, batch_shift=False)
        )

    if progress is not None:
        progress("running each request as a server slot")
    slot_runs: dict[tuple, list] = {}
    refused: dict[tuple, str] = {}
    for config in configurations(grid) if ran is None else ran:
        key = drafting_key(config)
        if key in slot_runs or key in refused:
            continue
        try:
            slot_runs[key] = [
                slot_run_counters(
                    session,
                    req.prompt if prompt_tokens is None else list(prompt_tokens[i]),
                    config_settings(config, req.n_predict),
                )
                for i, req in enumerate(workload.requests)
            ]
        except ParameterError as exc:
            refused[key] = str(exc)
    if costs is None:
        drafting = drafters.DEFAULT_MODE if session.info.has_mtp else drafters.NGRAM_SIMPLE
        if progress is not None:
            progress("measuring batch costs")
        # on a session with llama-server's snapshot slots: more of them make every step dearer
        slots = drafters.mode(drafting).n_rs_seq(max(n_max))
        same = not session.info.is_recurrent or session.open_kwargs.get("n_rs_seq") == slots
        like = session if same else session.reopened(n_rs_seq=slots)
        try:
            costs = profile_batch_costs(like, n_parallel=n_parallel, n_max=sorted({0, *n_max}), drafter=drafting)
        finally:
            if like is not session:
                like.close()
        if progress is not None:
            progress("measuring the server's overheads")
        costs = profile_server_overhead(
            session, costs, binary=binary, n_max=max(n_max), spec_types=("none", drafting), n_parallel=n_parallel
        )
    return Recording(tuple(oracles), costs, slot_runs, refused)


#: How llama-server 0.3.36 sizes a look-up's draft, unlike llama-speculative-simple and this engine (measured: on
#: the bundled model, ngram-simple drafted 16 tokens in one draft at --spec-draft-n-max 1, 2 and 3 alike).
SERVER_LOOKUP_CAP = (
    "llama-server 0.3.36 cuts a look-up's draft only by the budget and context "
    "(server_slot::get_n_draft_max), not by --spec-draft-n-max: {names} draft up to their own "
    "length; the prediction cuts them to n_max as llama-speculative-simple does, so where they draft "
    "its counters and verify sizes are not the server's"
)
#: The same for ngram-simple, whose server counters, verify sizes and tokens/s are predicted as the server sizes its
#: drafts (:func:`~mtp_explorer.analysis.server_slot.server_lookup_steps`).
SERVER_LOOKUP_CAP_COUNTED = (
    "llama-server 0.3.36 cuts a look-up's draft only by the budget and context "
    "(server_slot::get_n_draft_max), not by --spec-draft-n-max: the prediction follows it ({names}: "
    "its counters, verify sizes and speculative-checkpoint replays), not this engine's cut to n_max"
)


def _note(settings: DraftSettings) -> str:
    """What the prediction of ``settings`` on a server does not replay, or replays otherwise than this engine runs it
    (empty: nothing)."""
    if settings.n_max == 0:
        return ""
    notes = []
    carried = [f"{s.name}: {s.server_carry}" for s in settings.mode.drafters if s.server_carry]
    if carried:
        notes.append(
            "the server keeps drafter state across requests, the prediction starts each request afresh ("
            + "; ".join(carried)
            + ")"
        )
    lookups = [s.name for s in settings.mode.drafters if s.is_lookup]
    if lookups:
        counted = all(name == drafters.NGRAM_SIMPLE for name in lookups) and (
            len(settings.mode.drafters) == 1 or settings.mode.policy == "first"
        )
        notes.append((SERVER_LOOKUP_CAP_COUNTED if counted else SERVER_LOOKUP_CAP).format(names=", ".join(lookups)))
    return "; ".join(notes)


@dataclasses.dataclass(frozen=True)
class ConfigPrediction:
    """One configuration's prediction: per category (``"all"`` and each of the workload's) tokens/s (the category's
    tokens over the predicted time of the whole workload), counters, acceptance and a note; and each request's
    server counters (:func:`server_counters`; empty where nothing could be predicted)."""

    by_category: dict[str, dict[str, Any]]
    per_request: list[dict[str, int]]


#: The columns :func:`predict_sweep` adds to a sweep's per-request frame.
#: ``slot_carry``: the request ran on a slot that had served another request before it (``served_after``), with a
#: drafter whose state the server keeps from one request to the next (``DrafterSpec.server_carry``), which the
#: prediction (each request on a fresh slot) does not replay.
PREDICTED_REQUEST_COLUMNS = (
    "predicted_tokens",
    "predicted_draft_n",
    "predicted_draft_n_accepted",
    "counts_match",
    "slot_carry",
)


def predict_config(recording: Recording, workload: Workload, config: Mapping[str, Any]) -> ConfigPrediction:
    """One configuration's prediction (:class:`ConfigPrediction`)."""

    each = [config_settings(config, req.n_predict) for req in workload.requests]
    try:
        if drafting_key(config) in recording.refused:
            raise ParameterError(recording.refused[drafting_key(config)])
        ran = recording.slot_runs.get(drafting_key(config)) or [None] * len(each)
        counters = [c if c is not None else request_counters(o, s) for c, o, s in zip(ran, recording.oracles, each)]
        timed = predict_parallel(
            recording.oracles,
            recording.costs,
            each,
            n_parallel=int(config.get("n_parallel", 1)),
            arrivals=[0] * len(each),
            server_slot=True,
        )
    except ParameterError as exc:
        return ConfigPrediction(
            {cat: {"prediction_note": f"not predicted: {exc}"} for cat in [ALL, *workload.categories]}, []
        )
    seconds = timed["n_tokens"] / timed["tokens_per_second"]
    out = {}
    for cat in [ALL, *workload.categories]:
        mine = [c for c, req in zip(counters, workload.requests) if cat == ALL or req.category == cat]
        drafted, accepted = sum(c["draft_n"] for c in mine), sum(c["draft_n_accepted"] for c in mine)
        out[cat] = {
            "predicted_tokens_per_second": sum(c["n_predict"] for c in mine) / seconds,
            "predicted_acceptance": accepted / drafted if drafted else math.nan,
            "predicted_n_drafted": drafted,
            "predicted_n_accepted": accepted,
            "prediction_note": _note(each[0]),
        }
    return ConfigPrediction(out, counters)


def _errors(row: Mapping[str, Any]) -> dict[str, Any]:
    """Predicted against measured: relative tokens/s error, acceptance difference, and whether the tokens/s
    prediction lies outside the server's own run-to-run range about its median (NaN: one run, no range)."""
    pred, meas = row.get("predicted_tokens_per_second", math.nan), row["tokens_per_second"]
    ok = row["status"] == "ok" and meas > 0 and not math.isnan(pred)
    spread = row.get("tokens_per_second_spread", math.nan) if row.get("repeats", 1) > 1 else math.nan
    return {
        "tokens_per_second_error": pred / meas - 1 if ok else math.nan,
        "acceptance_error": row.get("predicted_acceptance", math.nan) - row["acceptance"],
        "beyond_spread": abs(pred - meas) > spread * meas / 2 if ok and not math.isnan(spread) else math.nan,
    }


def predict_sweep(
    sweep: ServerSweep,
    session: Session,
    *,
    costs: BatchCostModel | None = None,
    binary: str | os.PathLike | None = None,
    progress: bool = True,
):
    """The sweep's frame with :data:`PREDICTED_COLUMNS` added, and its per-request frame with
    :data:`PREDICTED_REQUEST_COLUMNS` (None without one): what the explorer predicts for each row from one
    recording of the workload with ``session`` (the sweep's model; ``n_parallel`` and capacity enough for the grid)
    and ``costs`` (default: measured now, :func:`~mtp_explorer.profile_batch_costs` and the overheads of the
    llama-server ``binary`` (default: :func:`~mtp_explorer.server.server_binary`'s),
    :func:`~mtp_explorer.server.profile_server_overhead`). Flags the prediction does not
    model (``n_gpu_layers``, ``flash_attn``, ``type_k``) are the session's own."""
    from tqdm.auto import tqdm

    if Path(session.path).resolve() != Path(sweep.model).resolve():
        raise ParameterError(f"the sweep served {sweep.model}, the session runs {session.path}")
    keys = list(sweep.grid)
    failed = _failed(sweep.frame, keys)
    ran = [c for c in configurations(sweep.grid) if tuple(c[k] for k in keys) not in failed]
    bar = tqdm(
        total=len(sweep.workload.requests) + (3 if costs is None else 1),
        desc="predicting the sweep",
        disable=not progress,
        leave=False,
    )
    try:
        recording = record(
            session,
            sweep.workload,
            sweep.grid,
            prompt_tokens=sweep.prompt_tokens,
            costs=costs,
            progress=lambda what: (bar.set_postfix_str(what), bar.update(1)),
            ran=ran,
            binary=binary,
        )
    finally:
        bar.close()
    predicted = {tuple(c[k] for k in keys): predict_config(recording, sweep.workload, c) for c in ran}
    for values, status in failed.items():
        predicted[values] = ConfigPrediction(
            {
                cat: {"prediction_note": f"not predicted: it failed on the server ({status})"}
                for cat in sweep.frame["category"].unique()
            },
            [],
        )
    rows = []
    for row in sweep.frame.to_dict(orient="records"):
        row |= predicted[tuple(row[k] for k in keys)].by_category.get(row["category"], {})
        rows.append(row | _errors(row))
    frame = _with_columns(rows, PREDICTED_COLUMNS)
    frame["prediction_note"] = frame["prediction_note"].fillna("").astype(str)
    return frame, _requests(sweep.requests, predicted, keys)


def _failed(frame, keys: Sequence[str]) -> dict[tuple, str]:
    """The configurations of a sweep's frame that did not run (their values of ``keys``), with the server's status."""
    rows = frame[frame["status"] != "ok"]
    return {tuple(row[k] for k in keys): str(row["status"]) for row in rows.to_dict(orient="records")}


def _requests(requests, predicted: Mapping[tuple, ConfigPrediction], keys: list[str]):
    """The per-request frame with each request's predicted server counters, and whether they are the measured ones."""

    if requests is None:
        return None
    rows = []
    for row in requests.to_dict(orient="records"):
        mine = predicted[tuple(row[k] for k in keys)].per_request
        spec = row.get("spec_type")
        carries = spec not in (None, "none") and any(s.server_carry for s in drafters.mode(spec).drafters)
        row["slot_carry"] = bool(carries and row.get("served_after", -1) >= 0)
        if mine:
            c = mine[row["request"]]
            row |= {
                "predicted_tokens": c["n_predict"],
                "predicted_draft_n": c["draft_n"],
                "predicted_draft_n_accepted": c["draft_n_accepted"],
                "counts_match": bool(row["ok"])
                and (c["n_predict"], c["draft_n"], c["draft_n_accepted"])
                == (row["tokens_predicted"], row["draft_n"], row["draft_n_accepted"]),
            }
        rows.append(row)
    return _with_columns(rows, PREDICTED_REQUEST_COLUMNS)


def _with_columns(rows: list[dict], columns: Sequence[str]):
    import pandas as pd

    frame = pd.DataFrame(rows)
    for col in columns:
        if col not in frame:
            frame[col] = math.nan
    return frame
