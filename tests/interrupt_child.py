"""Run by tests/test_interrupts.py in a process of its own: each long call named on the command line is started,
SIGINT is sent to this process once the call has run for a moment (what JupyterLab's "Interrupt the kernel"
sends), and one JSON line per call says whether KeyboardInterrupt came, how long after the signal, how long
the engine's longest step of that call (or of a short oracle recording, whichever is longer) took, what the call kept,
and whether the same session generated again."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import mtp_explorer as mx
from mtp_explorer.core.schema import PHASES

LONG = 7000  # tokens: ten seconds or more of decoding if the interrupt were ignored
DELAY = 1.0  # seconds into the call when the signal is sent: past its prefill, in its steps (at least: see main)
PREFILL_SHARE = 0.5  # the "prefill" call's signal: this share into its long prompt's decode, as measured warm
PREFILLS = 5  # ... and at least this many times the warm-up's prefill, so that on a loaded machine too
KEEPING = {"generate", "stream", "generate_parallel", "stream_parallel"}  # the calls that keep a partial trace
ATTEMPTS = 3  # tries of a call whose signal landed in a prompt's decode, each with twice the delay


def _long_prompt(s: mx.Session) -> str:
    """A prompt of 4000 tokens: a decode long enough to be interrupted in (see PREFILL_SHARE)."""
    return s.detokenize(s.tokenize((mx.demo_prompt(0) + mx.demo_prompt(1)) * 20)[:4000])


def _calls(s: mx.Session) -> dict:
    prompt = mx.demo_prompt()
    many = [mx.demo_prompt(i) for i in range(2)]
    long = _long_prompt(s)
    return {
        "prefill": lambda: s.generate(long, max_tokens=64, n_max=3),
        "generate": lambda: s.generate(prompt, max_tokens=LONG, n_max=3),
        "stream": lambda: [None for _ in s.stream(prompt, max_tokens=LONG, n_max=3)],
        "generate_parallel": lambda: s.generate_parallel(many, max_tokens=LONG // 2, n_max=3),
        "stream_parallel": lambda: [None for _ in s.stream_parallel(many, max_tokens=LONG // 2, n_max=3)],
        "record_oracle": lambda: s.record_oracle(prompt, max_tokens=LONG, depth=3),
        "profile_costs": lambda: mx.profile_costs(s, [prompt], max_tokens=LONG, progress=False),
        "profile_batch_costs": lambda: mx.profile_batch_costs(s, many, max_tokens=LONG // 2, repeats=1),
        "measure_crossover": lambda: mx.measure_crossover(s, many, max_tokens=LONG // 2, repeats=1),
        "sweep": lambda: mx.sweep(
            s, [prompt], n_max=[0, 3], p_min=[0.0], mode="measure", max_tokens=LONG, progress=False
        ),
    }


def _longest_step_seconds(s: mx.Session) -> float:
    """The longest engine step (or prefill) of the call's last generation (0 where it kept no trace)."""
    traces = []
    if s.last_trace is not None:
        traces.append(s.last_trace)
    if getattr(s, "last_parallel_trace", None) is not None:
        traces += list(s.last_parallel_trace.traces)
    longest = 0.0
    for t in traces:
        if t.n_steps:
            step_ns = sum(t.columns[f"t_{p}_ns"].astype(float) for p in PHASES)
            longest = max(longest, float(step_ns.max()) * 1e-9, t.t_prefill_ns * 1e-9)
    return longest


def _longest_oracle_step_seconds(s: mx.Session) -> float:
    """The longest position of a short oracle recording (its decode, every drafter's draft and its timing probes):
    what one step of record_oracle, profile_costs and a sweep's recording takes here and now."""
    o = s.record_oracle(mx.demo_prompt(), max_tokens=32, depth=3, batch_shift=False)
    n = o.columns["t_verify_ns"].shape[0]
    per_row = sum(
        v.reshape(n, -1).sum(axis=1).astype(float)
        for k, v in o.columns.items()
        if k.endswith("_ns") and v.shape[:1] == (n,)
    )
    return float(per_row.max()) * 1e-9


def main(names: list[str]) -> None:
    # what a Jupyter kernel has: SIGINT delivered and raising KeyboardInterrupt (the test suite's process, whose
    # signal mask a child inherits, has had SIGINT blocked by the time this test runs)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with mx.Session.open(None, n_ctx=16384, n_parallel=2) as s:
        calls = _calls(s)
        for _ in range(2):  # a context's first decodes allocate its buffers (a second at this n_ctx): not a step's time
            warm = s.generate_parallel([mx.demo_prompt(i) for i in range(2)], max_tokens=8, n_max=3)
        oracle_step = _longest_oracle_step_seconds(s)
        # the signal lands in the calls' steps, past their prompts' decode, however busy the machine is (a signal
        # during a prompt's decode leaves no partial trace to keep); the "prefill" call wants it in its prompt
        prefill = max(t.t_prefill_ns for t in warm.traces) * 1e-9
        delay = max(DELAY, PREFILLS * prefill)
        # the long prompt's decode as measured here and now: the "prefill" call's signal lands inside it (a fixed
        # second can come after the whole call on a quiet machine, or in its steps)
        long_prefill = s.generate(_long_prompt(s), max_tokens=1, n_max=0).t_prefill_ns * 1e-9
        for name in names:
            # a signal that lands in a prompt's decode (a busy machine can stretch one past the delay) leaves requests
            # with nothing generated: correct, but not the case under test; the call is then run again with twice the
            # delay, and the earlier attempts are reported too (their requests must each be cancelled and empty)
            # ("prefill" wants it in the prompt: a try whose call ended before the signal is run again with half the
            # delay, and reported under "late")
            early: list[dict] = []
            late: list[dict] = []
            for attempt in range(ATTEMPTS):
                if name == "prefill":
                    out = _interrupt(s, calls, name, PREFILL_SHARE * long_prefill / 2**attempt, oracle_step)
                else:
                    out = _interrupt(s, calls, name, delay * 2**attempt, oracle_step)
                if attempt == ATTEMPTS - 1:
                    break
                if name == "prefill" and out["late"]:
                    late.append(out)
                elif name != "prefill" and _landed_in_a_prompt(out):
                    early.append(out)
                else:
                    break
            out["early"], out["late_tries"] = early, late
            print(json.dumps(out), flush=True)


def _interrupt(s: mx.Session, calls: dict, name: str, delay: float, oracle_step: float) -> dict:
    """Start ``calls[name]``, send SIGINT ``delay`` seconds in, and report what came of it (one JSON-able record)."""
    s.last_trace = None
    s.last_parallel_trace = None
    sent: list[float] = []
    timer = threading.Timer(delay, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    out: dict = {"call": name, "interrupted": False, "late": False, "delay": delay}
    returned = False
    try:
        timer.start()
        calls[name]()
        returned = True
        timer.join()  # the signal still to come: it then lands here, after the call
    except KeyboardInterrupt:
        if returned:  # the call ran to its end before the signal
            out["late"] = True
        else:
            out["interrupted"] = True
            out["latency"] = time.perf_counter() - sent[0]
    timer.join()
    out["longest_step"] = max(_longest_step_seconds(s), oracle_step)
    t = s.last_trace
    out["partial"] = None if t is None else {"finish_reason": t.finish_reason, "n_tokens": len(t.tokens)}
    p = s.last_parallel_trace
    out["partial_parallel"] = (
        None if p is None else [{"finish_reason": r.finish_reason, "n_tokens": len(r.tokens)} for r in p.traces]
    )
    again = s.generate(mx.demo_prompt(1), max_tokens=8, n_max=3)
    out["again"] = {"n_tokens": len(again.tokens), "finish_reason": again.finish_reason}
    return out


def _landed_in_a_prompt(out: dict) -> bool:
    """Whether the signal came before a generation's first token (in its start or one of its prompts' decode)."""
    if out["call"] not in KEEPING:
        return False
    kept = ([out["partial"]] if out["partial"] else []) + (out["partial_parallel"] or [])
    return out["interrupted"] and (not kept or any(k["n_tokens"] == 0 for k in kept))


if __name__ == "__main__":
    main(sys.argv[1:])
