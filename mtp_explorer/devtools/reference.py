"""llama.cpp's own MTP driver, ``llama-speculative-simple --spec-type draft-mtp``, run beside ours.

Used to check parity: for greedy decoding the generated tokens and the totals of drafted and
accepted tokens must match. llama-speculative-simple has its own budget rule, replayed here with
:func:`replay_reference_budget`: it drafts at most ``n - n_predict - 1`` tokens but truncates only
when that number is positive (a draft at the very end is verified whole), and it stops once
*more* than ``n`` tokens were produced. Our engine never exceeds ``max_tokens``, so the replay drives
it step by step through :meth:`Session.set_params` with that rule.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from ..analysis.batch_shift import measure_batches
from ..core import drafters, native
from ..core.cpu_kernels import with_no_repack
from ..core.errors import ToolError
from ..core.info import model_info
from ..core.session import Session
from ..core.settings import resolve
from ..core.trace import Trace
from ..server import LlamaServer
from ..server.predict import server_counters


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """What llama-speculative-simple printed."""

    text: str
    """The generated pieces as printed (token_to_piece, no detokenizer clean-up)."""
    n_predict: int
    n_drafted: int
    n_accept: int
    decode_seconds: float
    tokens_per_second: float
    target_decode_seconds: float | None = None
    """The time its target context spent in its decodes, prompt and verify steps (llama.cpp's perf counters of that
    context, printed under "target:": prompt eval and eval time); ``None`` where it printed none."""
    log: str = dataclasses.field(default="", repr=False)
    """Everything it printed (stdout, then stderr): with ``-lv 5``, its debug log of every draft."""


_STAT = {
    "n_predict": re.compile(r"n_predict\s*=\s*(\d+)"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s"),
}
_TARGET_EVAL = re.compile(r"(?:prompt eval|\beval) time =\s+([\d.]+) ms")


def target_decode_seconds(log: str) -> float | None:
    """The target context's decode time from llama-speculative-simple's closing perf print (its prompt eval and eval
    time, after "target:"), or ``None`` where the log has no such lines."""
    at = log.rfind("target:")
    times = _TARGET_EVAL.findall(log[at:]) if at >= 0 else []
    return sum(float(ms) for ms in times) / 1e3 if len(times) == 2 else None


def parse_reference_output(stdout: str, stderr: str, prompt_text: str) -> ReferenceRun:
    """Read the generated text and the totals from llama-speculative-simple's output."""
    log = stdout + "\n" + stderr
    found = {k: rx.search(log) for k, rx in _STAT.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise ToolError(f"llama-speculative-simple output lacks {missing}:\n{log[-2000:]}")
    start = stdout.find(prompt_text)
    if start < 0:
        raise ToolError("the prompt was not echoed in llama-speculative-simple's output")
    body = stdout[start + len(prompt_text) :]
    tail = "\n\n\n\n"  # the example prints "\n\n" after the loop and again before it exits
    if not body.endswith(tail):
        raise ToolError("unexpected end of llama-speculative-simple's output")
    text = body[: -len(tail)]
    return ReferenceRun(
        text=text,
        n_predict=int(found["n_predict"].group(1)),
        n_drafted=int(found["n_drafted"].group(1)),
        n_accept=int(found["n_accept"].group(1)),
        decode_seconds=float(found["decoded"].group(2)),
        tokens_per_second=float(found["decoded"].group(3)),
        target_decode_seconds=target_decode_seconds(log),
        log=log,
    )


def run_reference(
    binary: str | Path,
    model: str | Path,
    prompt: str,
    *,
    max_tokens: int,
    n_max: int,
    p_min: float = 0.0,
    n_min: int = 0,
    n_ctx: int = 4096,
    threads: int = 2,
    timeout: float = 300,
    attempts: int = 8,
    head: str | Path | None = None,
) -> ReferenceRun:
    """Run llama-speculative-simple greedily with MTP drafting (``head``: a shared-memory MTP head file, ``-md``)
    and parse what it printed."""
    spec = [
        "--spec-type",
        drafters.DEFAULT_MODE,
        "--spec-draft-n-max",
        str(n_max),
        "--spec-draft-n-min",
        str(n_min),
        "--spec-draft-p-min",
        str(p_min),
    ] + ([] if head is None else ["-md", str(head)])
    return run_reference_spec(
        binary,
        model,
        prompt,
        spec,
        max_tokens=max_tokens,
        n_ctx=n_ctx,
        threads=threads,
        timeout=timeout,
        attempts=attempts,
    )


def spec_type_args(spec: str, n_max: int, options: dict[str, int | str]) -> list[str]:
    """llama-speculative-simple's arguments for ``--spec-type spec`` with our drafter ``options`` (each under its
    llama.cpp flag from the registry; a file option naming no file is left out) and ``n_max`` as the draft models'
    ``--spec-draft-n-max``."""
    flags = {o.name: o.flag for o in drafters.all_options()}
    args = ["--spec-type", spec, "--spec-draft-n-max", str(n_max)]
    for name, value in options.items():
        if value != "":
            args += [flags[name], str(value)]
    return args


def reference_n_max(spec: str, n_max: int) -> int:
    """The n_max our engine runs ``--spec-type spec`` at so as to verify the drafts llama-speculative-simple verifies:
    it verifies a look-up's whole draft (``--spec-draft-n-max`` limits the draft models only), so where a drafter's
    length is fixed in llama.cpp (:attr:`DrafterSpec.fixed_draft_len`, ngram-cache's 8) that length, for every drafter
    of the chain (the reference's --spec-draft-n-max too); else ``n_max`` (a look-up's own length option is then set
    to it)."""
    return max((d.fixed_draft_len for d in drafters.mode(spec).drafters), default=0) or n_max


FLUSH_LOG = "libflush-common-log.so"
"""Beside the reference binary (the Makefile builds it): preloaded, it prints llama.cpp's log to its end at exit."""


def reference_env(binary: str | Path) -> dict[str, str] | None:
    """The environment to run ``binary`` in: with :data:`FLUSH_LOG` preloaded where it lies beside it (llama.cpp's
    logger, leaked on purpose, loses a program's last lines when the program exits before its printing thread ran,
    as on a loaded machine); ``None`` (this process's) otherwise."""
    flush = Path(binary).resolve().parent / FLUSH_LOG
    if not flush.is_file():
        return None
    preload = " ".join(p for p in (str(flush), os.environ.get("LD_PRELOAD", "")) if p)
    return os.environ | {"LD_PRELOAD": preload}


def run_reference_spec(
    binary: str | Path,
    model: str | Path,
    prompt: str,
    spec_args: list[str],
    *,
    max_tokens: int,
    n_ctx: int = 4096,
    threads: int = 2,
    timeout: float = 300,
    attempts: int = 8,
) -> ReferenceRun:
    """Run llama-speculative-simple greedily with the drafting options ``spec_args`` (``--spec-type ...``)
    and parse what it printed. Where llama.cpp's extra CPU buffer types stop the process, it runs with ``-nr``, as
    the sessions do (:func:`~mtp_explorer.check_extra_buffers`)."""
    cmd = with_no_repack(
        [
            str(binary),
            "-m",
            str(model),
            "-p",
            prompt,
            "-n",
            str(max_tokens),
            "-c",
            str(n_ctx),
            "-t",
            str(threads),
            "--temp",
            "0",
            "--seed",
            "0",
            *spec_args,
        ]
    )
    # llama.cpp's log is written by a worker thread that loses its tail when the program exits before it ran
    # (reference_env preloads a library that waits for it); the run is deterministic, so one that printed an
    # incomplete log all the same is repeated until the output is complete.
    env = reference_env(binary)
    error: Exception | None = None
    for _ in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            with out.open("w") as fo, err.open("w") as fe:
                proc = subprocess.run(cmd, stdout=fo, stderr=fe, timeout=timeout, env=env)
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if proc.returncode != 0:
            raise ToolError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
        try:
            return parse_reference_output(stdout, stderr, prompt)
        except ToolError as exc:  # an incomplete log: run it again
            error = exc
    raise ToolError(f"llama-speculative-simple printed incomplete output {attempts} times") from error


def draft_cap_rule(session: Session, prompt: str, max_tokens: int, limit: int):
    """llama-speculative-simple's draft cap after ``n_predict`` generated tokens, as a function of
    ``n_predict``: ``limit`` cut to the budget left (``max_tokens - n_predict - 1``) and the context,
    but only when that is positive (otherwise ``limit`` as is)."""
    n_prompt = len(session.tokenize(prompt))

    def n_max_for(n_predict: int) -> int:
        n_past = n_prompt - 1 + n_predict
        cap = min(session.n_ctx - n_past - 2, max_tokens - n_predict - 1)
        return min(limit, cap) if cap > 0 else limit

    return n_max_for


def replay_reference_budget(
    session: Session,
    prompt: str,
    *,
    max_tokens: int,
    n_max: int,
    p_min: float = 0.0,
    n_min: int = 0,
    drafter: str | None = None,
    checkpoints: bool = False,
    **options: int | str,
) -> Trace:
    """Greedy generation with our engine under llama-speculative-simple's budget rule (see module doc).

    ``drafter`` (default: the MTP head) and ``options`` as :meth:`Session.generate` takes them (a ``--spec-type``
    chain runs under llama.cpp's ``first`` policy). Exact for ``n_min == 0``; with ``n_min > 0`` the reference
    applies n_min before its budget truncation, which a shorter n_max cannot reproduce at the very last steps.

    ``checkpoints`` replays the reference's checkpoint rule too, which it follows when its target context cannot
    remove part of a sequence (a recurrent model without ``draft-mtp`` in the chain, so without snapshot slots):
    after a partial acceptance it restores the target state and verifies the accepted tokens and the correction
    again as its next draft, which also yields the token after them (the bonus) before its budget is checked.
    Here that bonus is one plain step (``n_max=0``) forced after each partial acceptance, so the next draft starts
    at the same position as the reference's; :func:`reference_totals` counts the steps as the reference does.
    """
    n_max_for = draft_cap_rule(session, prompt, max_tokens, n_max)
    n_predict = 0
    chosen = {} if drafter is None else {"drafter": drafter}
    stream = session.stream(
        prompt,
        max_tokens=max_tokens + n_max + 2,
        n_max=n_max_for(0),
        p_min=p_min,
        n_min=min(n_min, n_max_for(0)),
        **chosen,
        **options,
    )
    for step in stream:
        n_predict += step.n_accepted + 1
        partial = checkpoints and step.n_accepted < step.n_drafted
        if session.is_eog(step.correction) or (n_predict > max_tokens and not partial):
            session.cancel()
            continue
        nxt = 0 if partial else n_max_for(n_predict)
        session.set_params(n_max=nxt, p_min=p_min, n_min=min(n_min, nxt))
    return session.last_trace


@dataclasses.dataclass(frozen=True)
class BudgetRun:
    """A generation under the reference's budget rule (:func:`generate_reference_budget`)."""

    trace: Trace
    n_drafted: int
    """Drafted tokens as llama-speculative-simple counts them (a checkpoint replay counts its accepted tokens
    and the bonus as drafted and accepted, the partial step before it not at all)."""
    n_accepted: int
    t_harness_ns: int = 0
    """Time spent in Python between the engine's steps, applying the budget rule. :meth:`Session.generate` does not
    pay it, because its native loop runs the steps back to back (``Engine::run``). A timing of ours against the
    reference subtracts it, as the reference's timing leaves out its own set-up."""


def generate_reference_budget(
    session: Session, prompt: str, *, max_tokens: int, n_max: int, drafter: str | None = None, **options: int | str
) -> BudgetRun:
    """:func:`replay_reference_budget`'s generation (greedy, ``p_min`` and ``n_min`` 0) driven by the native step
    loop instead of :meth:`Session.stream`: no :class:`Step` is built per step and any telemetry level works,
    ``"off"`` included. So the same tokens with the same drafts as the reference can be timed without the
    stream's Python work per step; the Python left between the steps is measured (``BudgetRun.t_harness_ns``).
    The checkpoint rule follows ``session.checkpoints``."""
    n_max_for = draft_cap_rule(session, prompt, max_tokens, n_max)
    chosen = {} if drafter is None else {"drafter": drafter}
    settings = resolve(None, dict(max_tokens=max_tokens + n_max + 2, n_max=n_max_for(0), **chosen, **options))
    drafted = accepted = harness_ns = 0
    before = (0, 0)
    with session.stepping(prompt, settings) as engine:
        while True:
            more = engine.step()
            t0 = time.perf_counter_ns()
            totals = engine.request_state(0)["totals"]
            step_drafted, step_accepted = totals["n_drafted"] - before[0], totals["n_accepted"] - before[1]
            before = (totals["n_drafted"], totals["n_accepted"])
            partial = session.checkpoints and step_accepted < step_drafted
            if partial:  # not counted; its replay counts accepted + 1 as both
                step_drafted = step_accepted = step_accepted + 1
            drafted += step_drafted
            accepted += step_accepted
            if more:
                if engine.n_generated > max_tokens and not partial:  # the reference counts a partial step at its replay
                    engine.cancel()
                else:
                    engine.set_params(native.DraftParams(n_max_for(engine.n_generated), 0.0, 0))
            harness_ns += time.perf_counter_ns() - t0
            if not more:
                break
    return BudgetRun(session.last_trace, drafted, accepted, harness_ns)  # type: ignore[arg-type]


def reference_checkpoints(target: str | Path, spec) -> bool:
    """Whether llama-speculative-simple follows its checkpoint rule for ``--spec-type spec`` on ``target``: on a
    recurrent target whose context gets no snapshot slots, i.e. when no drafter of the chain is one llama.cpp gives
    them for (:attr:`DrafterSpec.gets_snapshot_slots <mtp_explorer.core.drafters.DrafterSpec.gets_snapshot_slots>`)."""
    mode = drafters.mode(spec)
    return bool(model_info(target).is_recurrent) and not mode.gets_snapshot_slots


def reference_totals(trace: Trace, *, checkpoints: bool) -> dict:
    """The n_predict/n_drafted/n_accept totals the reference prints for the run ``trace`` replays: with
    ``checkpoints``, a partially accepted draft is not counted, and its re-verification counts the accepted tokens
    and the correction as drafted and accepted (the forced plain step after it, the bonus, counts nothing). Not
    modelled: a partial acceptance whose correction ends the generation (the reference's re-verification then
    counts one token past it): such a case shows as a mismatch, n_predict one short."""
    drafted = accepted = 0
    for st in trace.steps:
        if checkpoints and st.n_accepted < st.n_drafted:
            drafted += st.n_accepted + 1
            accepted += st.n_accepted + 1
        else:
            drafted += st.n_drafted
            accepted += st.n_accepted
    return {"n_predict": len(trace.tokens), "n_drafted": drafted, "n_accept": accepted}


def compare_with_reference(ref: ReferenceRun, ours: Trace, p_min: float, *, checkpoints: bool = False) -> dict:
    """Parity of one run: text and drafted/accepted totals, with our end-of-generation rule and (``checkpoints``)
    the reference's checkpoint rule accounted for (:func:`reference_totals`).

    We stop drafting at an end-of-generation token; the reference's model drafters draft on past it. With
    ``p_min == 0`` they always draft to the cap, so the drafted total is still known exactly; with
    ``p_min > 0`` such runs compare text and accepted totals only (``unverifiable_drafted_total``).
    """
    totals = {
        "n_predict": len(ours.tokens),
        "n_drafted": int(ours.n_drafted.sum()),
        "n_accept": int(ours.n_accepted.sum()),
    }
    reference = {"n_predict": ref.n_predict, "n_drafted": ref.n_drafted, "n_accept": ref.n_accept}
    eos_steps = [st for st in ours.steps if st.stop_reason == "eos"]
    expected = reference_totals(ours, checkpoints=checkpoints)
    unverifiable = bool(eos_steps) and p_min > 0
    if eos_steps and not unverifiable:
        expected["n_drafted"] += sum(st.n_max - st.n_drafted for st in eos_steps)
    text_equal = "".join(ours.pieces) == ref.text
    if unverifiable:
        match = (
            text_equal
            and reference["n_predict"] == expected["n_predict"]
            and reference["n_accept"] == expected["n_accept"]
        )
    else:
        match = text_equal and reference == expected
    return {
        "reference": reference,
        "ours": totals,
        "expected_reference": expected,
        "text_equal": text_equal,
        "checkpoint_rule": checkpoints,
        "re_verified_steps": sum(st.n_accepted < st.n_drafted for st in ours.steps) if checkpoints else 0,
        "eos_stopped_steps": len(eos_steps),
        "explained_by_eos_rule": bool(eos_steps) and match and not unverifiable,
        "unverifiable_drafted_total": unverifiable,
        "match": match,
    }


# -- llama-server ------------------------------------------------------------------------------------------
def replay_server(
    session: Session,
    prompt: str,
    *,
    n_predict: int,
    n_max: int,
    p_min: float = 0.0,
    drafter: str | None = None,
    **options: int,
) -> Trace:
    """Greedy generation with our engine as llama-server's slot runs one request (``server_slot=True``): the prompt
    in the server's prompt batches and the first token sampled from them before any draft, every later draft cut to
    the budget left minus one (``n_remaining - 1``, the engine's own rule) and drafting stops when that is 0.

    On a recurrent target without snapshot slots for the drafter (:func:`reference_checkpoints`), the server restores
    a checkpoint after a partial acceptance and verifies the accepted tokens and the correction again with the token
    after them, drafting nothing (``spec_is_replay``): one plain step here, which emits that token."""
    settings = _slot_settings(n_predict, n_max, p_min, drafter, options)
    if not reference_checkpoints(session.path, drafter or drafters.DEFAULT_MODE):
        return session.generate(prompt, **settings)
    for step in session.stream(prompt, **settings):
        partial = step.n_accepted < step.n_drafted
        session.set_params(n_max=0 if partial else n_max, p_min=p_min, n_min=0)
    return session.last_trace


def replay_server_parallel(
    session: Session,
    prompts: list[str],
    *,
    n_predict: int,
    n_max: int,
    p_min: float = 0.0,
    drafter: str | None = None,
    **options: int,
):
    """:func:`replay_server` for a batch: the prompts as concurrent requests on the session's ``n_parallel``
    sequences (a ``ParallelTrace``), every slot's first token sampled from its prompt before any draft, as the server
    runs ``-np N`` slots that start together."""
    return session.generate_parallel(prompts, **_slot_settings(n_predict, n_max, p_min, drafter, options))


def _slot_settings(n_predict: int, n_max: int, p_min: float, drafter: str | None, options: dict) -> dict:
    """A request's settings as a server slot runs it."""
    return (
        {"max_tokens": n_predict, "n_max": n_max, "p_min": p_min, "server_slot": True}
        | ({} if drafter is None else {"drafter": drafter})
        | options
    )


def rerun_server_batch(
    model,
    prompts: list[str],
    index: int,
    ours: Trace,
    *,
    n_predict: int,
    n_max: int,
    threads: int,
    reruns: int = 3,
    binary=None,
) -> list[dict]:
    """The same batch on ``reruns`` fresh ``llama-server -np len(prompts)`` processes: whether request ``index`` then
    matches our run (:func:`compare_with_server`). Our engine gives a request the same output every run; llama-server
    0.3.36 on a hybrid recurrent model does not always (measured: with 4 slots and 2 threads, the first request got
    another text in 1 run of 6, always the same other text), so a request that differs beyond a near-tie is checked
    against the server's own run-to-run variation before it counts as a failure."""
    out = []
    for _ in range(reruns):
        with LlamaServer(
            model, n_parallel=len(prompts), n_ctx=2048 * len(prompts), threads=threads, n_max=n_max, binary=binary
        ) as srv:
            done = srv.client().complete_many(list(prompts), n_predict)[index]
        r = compare_with_server(done, ours)
        out.append({"match": r["match"], "text_equal": r["text_equal"], "server": r["server"]})
    return out


def compare_with_server(done, ours: Trace, p_min: float = 0.0) -> dict:
    """Parity of one llama-server request (a :class:`~mtp_explorer.server.Completion`) with our replay of it
    (:func:`replay_server`): the text, the generated tokens and ``draft_n`` / ``draft_n_accepted``. Our
    end-of-generation rule is accounted for as in :func:`compare_with_reference` (the server's model drafters draft on
    past an end-of-generation token; with ``p_min > 0`` such a run's drafted total is not verifiable)."""
    totals = {
        "n_predict": len(ours.tokens),
        "draft_n": int(ours.n_drafted.sum()),
        "draft_n_accepted": int(ours.n_accepted.sum()),
    }
    server = {"n_predict": done.tokens_predicted, "draft_n": done.draft_n, "draft_n_accepted": done.draft_n_accepted}
    eos_steps = [st for st in ours.steps if st.stop_reason == "eos"]
    unverifiable = bool(eos_steps) and p_min > 0
    expected = dict(totals) if unverifiable else server_counters(ours)
    text_equal = "".join(ours.pieces) == done.text
    if unverifiable:
        match = text_equal and all(server[k] == expected[k] for k in ("n_predict", "draft_n_accepted"))
    else:
        match = text_equal and server == expected
    return {
        "server": server,
        "ours": totals,
        "expected_server": expected,
        "text_equal": text_equal,
        "eos_stopped_steps": len(eos_steps),
        "unverifiable_drafted_total": unverifiable,
        "match": match,
    }


def server_batch_shift(session: Session, max_rows: int | None = None):
    """The session's measured batch-shape shift for every verify batch of one slot and for a server batch of
    ``max_rows`` rows (its slots' verify rows together, at most ``BATCH_SHIFT_ROWS_MAX``; default: one slot's
    largest)."""
    return measure_batches(session, session.capacity, max_rows or session.capacity + 1)


def explain_server_mismatch(
    session: Session, prompt: str, done, ours: Trace, *, tol_logit: float | None = None, max_rows: int | None = None
) -> dict:
    """Why a request of a batch of several (the server batches the slots' rows together, so its matrix products run
    in other shapes than a single sequence's) differs from our replay: a ``tie`` when the first differing token is
    one whose one-row target top-2 margin is below ``tol_logit`` (``cause: target_argmax``), or, with the same text,
    when a draft on our path had a top-2 margin below ``tol_logit`` (``cause: draft_argmax``: a near-tie of the MTP
    head can change which drafts are accepted, not the text); else ``unexplained``. Reads an oracle of the prompt.
    ``tol_logit`` defaults to the session's measured :meth:`~mtp_explorer.Session.batch_shift` tolerance for
    batches of up to ``max_rows`` rows (the server's slots times ``n_max + 1``; default ``capacity + 1``); the
    result's ``explanation`` says which."""
    shift = server_batch_shift(session, max_rows) if tol_logit is None else None
    oracle = session.record_oracle(
        prompt, max_tokens=len(ours.tokens), depth=max(1, int(ours.n_drafted.max())), probe=False, batch_shift=False
    )
    pos = oracle.columns["pos"]
    text, acc = done.text, ""
    for i, piece in enumerate(ours.pieces):
        if not text.startswith(acc + piece):
            margin = float(oracle.columns["target_margin"][i])
            tol = tol_logit if shift is None else shift.tolerance(None, int(pos[i]))
            return _explained(
                {
                    "kind": "tie" if margin < tol else "unexplained",
                    "cause": "target_argmax",
                    "position": i,
                    "margin": margin,
                },
                shift,
                tol,
                int(pos[i]),
            )
        acc += piece
    if acc != text:
        return {"kind": "unexplained", "cause": "text_length", "position": len(ours.pieces), "margin": float("nan")}
    head = next(s for s in drafters.DRAFTER_SPECS.values() if s.needs_mtp).index
    margins = oracle.columns["draft_margin"][:, head, :]
    starts = [sum(int(a) + 1 for a in ours.n_accepted[:k]) for k in range(ours.n_steps)]
    on_path = [
        float(margins[g, j])
        for g, n in zip(starts, ours.n_drafted.tolist())
        for j in range(min(int(n), margins.shape[1]))
        if g < len(margins) and math.isfinite(margins[g, j])
    ]
    smallest = min(on_path, default=float("inf"))
    tol = tol_logit if shift is None else shift.tolerance(None, int(pos[-1]))
    return _explained(
        {
            "kind": "tie" if smallest < tol else "unexplained",
            "cause": "draft_argmax",
            "position": None,
            "margin": smallest,
        },
        shift,
        tol,
        int(pos[-1]),
    )


def _explained(why: dict, shift, tol_logit: float, kv: int) -> dict:
    """``why`` with the tolerance it was judged by and a sentence (the measured shift's where there is one)."""
    margin = why["margin"]
    if shift is not None and math.isfinite(margin):
        text = shift.explain(margin, None, kv)
    else:
        text = f"{why['kind']} ({why['cause']}): margin {margin:.3g}, tolerance {tol_logit:.3g}"
    return why | {"tolerance": tol_logit, "explanation": text}
