"""Engine throughput: plain vs MTP, the telemetry levels ("full", "steps") against "off", Python streaming overhead, and
(with LLAMA_SPECULATIVE_SIMPLE set to a llama-speculative-simple binary) the reference beside ours.

    .venv/bin/python benchmarks/engine.py [--model PATH] [--tokens 256] [--repeats 3] [--threads N]
                                          [--only throughput telemetry stream reference memory drafters]
    .venv/bin/python benchmarks/engine.py --scale      # on the SYNTHETIC 0.4 B Q8_0 model (scale_model.py)

``--scale`` writes (once, into the temporary directory) a SYNTHETIC random-weight model shaped like a small
real Qwen3.5 (see ``benchmarks/scale_model.py``), quantized to Q8_0 by ``llama-quantize``, and runs every
section on it with fewer tokens and rounds; it adds ``memory``: load time, peak RSS against the file size
(anonymous against file-backed pages, with llama.cpp's default mmap and with ``load_mode="none"``), and the
recurrent state memory llama.cpp allocates per ``n_rs_seq`` snapshot slot. ``drafters`` measures every
``--spec-type`` the engine runs (and two chains) on code-like and prose-like prompts, beside the reference, ours in a
new process each round as each reference run is one (``ours_process.py``); ``modes``
draft-mtp's chained-heads and shared-memory modes on SYNTHETIC models beside the reference. With ``--scale`` the
same model's Q4_K_M copy (``--scale-copies``: llama-quantize types, each written like the Q8_0 file) then goes
through every section but memory and modes, under ``quantized_copies``.

Prints JSON. Timings are medians over repeats of decode time (prompt processing excluded). A telemetry
level's overhead is the median over triples of back-to-back runs (off, steps, full) in rotating order of its
time over "off"'s (see :func:`telemetry_overhead`), on a shared machine far steadier than comparing two medians.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _common import emit, machine, pick_model, write_mode_models
from ours_process import OursProcess
from scale_model import write_scale_model

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.devtools.reference import compare_with_reference, generate_reference_budget, run_reference

SECTIONS = ("throughput", "telemetry", "stream", "reference", "memory", "drafters", "modes")
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):"]


def decode_seconds(s: mx.Session, prompt: str, tokens: int, n_max: int, **kwargs) -> tuple[float, mx.Trace]:
    t0 = time.perf_counter_ns()
    trace = s.generate(prompt, max_tokens=tokens, n_max=n_max, **kwargs)
    wall = time.perf_counter_ns() - t0
    return (wall - trace.t_prefill_ns) / 1e9, trace


def budget_seconds(s: mx.Session, prompt: str, tokens: int, n_max: int, **kwargs):
    """As :func:`decode_seconds`, on the reference's work (:func:`generate_reference_budget`), its budget rule's Python
    between the steps left out (``BudgetRun.t_harness_ns``: :meth:`Session.generate` runs the steps back to back)."""
    t0 = time.perf_counter_ns()
    run = generate_reference_budget(s, prompt, max_tokens=tokens, n_max=n_max, **kwargs)
    return (time.perf_counter_ns() - t0 - run.trace.t_prefill_ns - run.t_harness_ns) / 1e9, run


def tokens_per_second(s, tokens, n_max, repeats) -> tuple[float, list[mx.Trace]]:
    rates, traces = [], []
    for prompt in PROMPTS:
        per_prompt = []
        for _ in range(repeats):
            secs, trace = decode_seconds(s, prompt, tokens, n_max)
            per_prompt.append(len(trace.tokens) / secs)
        rates.append(statistics.median(per_prompt))
        traces.append(trace)
    return statistics.mean(rates), traces


def phase_seconds(trace: mx.Trace) -> float:
    """The engine's summed phase times (from the trace's totals: kept at every telemetry level)."""
    t = trace.totals
    return sum(int(t[k]) for k in ("t_catchup_ns", "t_draft_ns", "t_verify_ns", "t_sample_ns")) / 1e9


LEVELS = ("off", "steps", "full")


def telemetry_overhead(s: mx.Session, tokens: int, rounds: int, n_max: int = 3) -> dict:
    """Each telemetry level against "off", in triples: each triple runs the same prompt at the three levels back
    to back, the order rotated every round, so drift and whatever else the machine runs hit every level alike.
    A level's overhead is the median of its time ratios to "off" in the same triple, on the decode wall time
    (what a user waits for) and on the engine's summed phase times."""
    wall = {lv: [] for lv in LEVELS[1:]}
    phases = {lv: [] for lv in LEVELS[1:]}
    rates = {lv: [] for lv in LEVELS}
    for r in range(rounds):
        order = LEVELS[r % 3 :] + LEVELS[: r % 3]
        for prompt in PROMPTS:
            got = {}
            for level in order:
                s.telemetry = level
                secs, t = decode_seconds(s, prompt, tokens, n_max)
                got[level] = (secs, phase_seconds(t), len(t.tokens))
                rates[level].append(got[level][2] / secs)
            for level in LEVELS[1:]:
                wall[level].append(got[level][0] / got["off"][0])
                phases[level].append(got[level][1] / got["off"][1])
    s.telemetry = "full"
    out = {
        "n_max": n_max,
        "triples": len(wall["full"]),
        "tokens_per_second": {lv: statistics.median(v) for lv, v in rates.items()},
        "targets": {"full": 0.02, "steps": 0.005},
    }
    for level in LEVELS[1:]:
        out[level] = {
            "overhead": statistics.median(wall[level]) - 1,
            "overhead_95ci": [x - 1 for x in median_95ci(wall[level])],
            "overhead_phase_time": statistics.median(phases[level]) - 1,
        }
    return out


# every --spec-type the engine runs (the registry's drafters), alone and in the llama.cpp chains the registry lists
# (its modes under llama.cpp's first policy), with llama.cpp's default options
SPEC_TYPES = tuple(
    dict.fromkeys(
        [d.name for d in drafters.DRAFTER_SPECS.values()]
        + [m.spec_types for m in drafters.MODES.values() if m.is_chain and m.policy == "first"]
    )
)
KIND_PROMPTS = {
    "code": PROMPTS,
    "prose": [
        "The cat sat on the mat. The dog sat on the rug. The cat sat on the",
        "Please read the instructions carefully before you begin. Please read the",
        "Once upon a time there was a little house in the woods, and in the house there lived",
    ],
}


def alternating_pairs(
    repeats: int, ours: Callable[[], float], ref: Callable[[], float] | None = None, start: int = 0
) -> list[tuple]:
    """``repeats`` back-to-back (ours, reference) tokens/s pairs, the order alternating so that load drift hits
    both alike (``ref=None``: ours alone, the reference entry None); ``start``: the pair the alternation counts
    from (odd: the reference first)."""
    pairs = []
    for r in range(start, start + repeats):
        pair = {"ref": None}
        for side in ("ours", "ref") if r % 2 == 0 else ("ref", "ours"):
            if side == "ours":
                pair["ours"] = ours()
            elif ref is not None:
                pair["ref"] = ref()
        pairs.append((pair["ours"], pair["ref"]))
    return pairs


def interleaved_pairs(
    levels,
    repeats: int,
    ours_round: Callable[[], contextlib.AbstractContextManager[Callable[[str], float]]],
    ref: Callable[[], float] | None = None,
) -> dict[str, list[tuple]]:
    """:func:`alternating_pairs` at each telemetry level of ``levels``, the levels taking turns pair by pair (their
    order rotating each round), so that drift over a section hits every level alike: where one level's pairs all
    ran before another's, drift read as a difference between the levels. Each pair times ours with the function
    ``ours_round()`` gives (telemetry level -> tokens/s): a new process each pair (:class:`~ours_process.OursProcess`),
    so that ours' timed run is its process's first at these settings, as the reference's is. A later one is faster:
    llama.cpp grows its output buffer at a process's first decode with more outputs than any before (a new buffer,
    faulted in and cleared: 2 MB on the bundled model with the MTP head's rows, where a second run read 2-3% faster)."""
    pairs: dict[str, list[tuple]] = {level: [] for level in levels}
    for r in range(repeats):
        for i in range(len(levels)):
            level = levels[(r + i) % len(levels)]
            with ours_round() as ours:
                pairs[level] += alternating_pairs(1, functools.partial(ours, level), ref, start=r)
    return pairs


def median_95ci(values: list[float], seed: int = 0) -> list[float]:
    """95% bootstrap interval of the median of ``values``: how precisely this machine's noise lets a median tell."""
    v = np.asarray(values, dtype=float)
    boot = np.median(np.random.default_rng(seed).choice(v, size=(2000, len(v))), axis=1)
    return [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def pairs_summary(pairs: list[tuple]) -> dict:
    """Medians of the pairs' tokens/s and of their ratios (ours / reference), the ratio's with its 95% interval."""
    with_ref = [(o, r) for o, r in pairs if r is not None]
    doc = {"ours_tokens_per_second": statistics.median(o for o, _ in pairs), "pairs": len(pairs)}
    if with_ref:
        ratios = [o / r for o, r in with_ref]
        doc |= {
            "reference_tokens_per_second": statistics.median(r for _, r in with_ref),
            "ratio": statistics.median(ratios),
            "ratio_95ci": median_95ci(ratios),
        }
    return doc


def lookup_limits(mode, n_max: int) -> dict[str, int]:
    """The look-ups' length options at ``n_max`` (llama-speculative-simple verifies a look-up's whole draft, where the
    engine cuts it to n_max: so both sides draft alike), ngram-mod's n_min at most that, and ngram-simple's key no
    longer than its continuation (llama.cpp drops a continuation shorter than the key: with the default key of 12 it
    would never draft, :class:`mtp_explorer.NeverDrafts`); the other options keep llama.cpp's defaults."""
    names = {o.name for o in mode.options}
    limits = {
        "ngram_simple_size_m": n_max,
        "ngram_mod_n_max": n_max,
        "ngram_mod_n_min": n_max,
        "ngram_map_k_size_m": n_max,
        "ngram_map_k4v_size_m": n_max,
        "ngram_simple_size_n": min(n_max, drafters.option_values()["ngram_simple_size_n"]),
    }
    return {k: v for k, v in limits.items() if k in names}


def drafters_section(
    s: mx.Session,
    binary: str | None,
    path,
    tokens: int,
    repeats: int,
    n_maxes=(3,),
    levels=("full", "off"),
    draft_model_only: bool = False,
    spec_types=None,
) -> dict:
    """Tokens/s of every drafter and chain (llama.cpp's default options but the look-ups' lengths:
    :func:`lookup_limits`) on code-like and prose-like prompts at each n_max of ``n_maxes`` and telemetry level of
    ``levels``, beside llama-speculative-simple's on the same settings when ``binary`` is given
    (:func:`interleaved_pairs`; the session's snapshot slots as the reference's where it has any: :func:`at_capacity`;
    ours does the reference's work, its budget rule included: :func:`generate_reference_budget`). A chain
    with a drafter whose length llama.cpp fixes (ngram-cache's 8) runs at that n_max, as the reference verifies it
    (:func:`~mtp_explorer.devtools.reference.reference_n_max`); draft-simple where the session has a draft model (the
    reference gets it as ``-md``); ``draft_model_only``: only the drafters with a model file (a second session's head);
    ``spec_types``: only these ``--spec-type`` values (default: :data:`SPEC_TYPES`)."""
    from mtp_explorer.devtools.reference import reference_n_max, run_reference_spec, spec_type_args

    doc: dict = {"n_max": list(n_maxes), "telemetry": list(levels)}  # each entry names its draft model or head
    for spec in spec_types or SPEC_TYPES:
        mode = drafters.mode(spec)
        if not mode.runs_with(s.info.has_mtp, s.has_draft_model and s.draft_kind) or (
            draft_model_only and not mode.needs_draft_model
        ):
            continue
        extra = ["-md", str(s.draft_info.path)] if mode.needs_draft_model else []
        for spec_n_max in dict.fromkeys(reference_n_max(spec, n) for n in n_maxes):
            options = lookup_limits(mode, spec_n_max)
            kwargs = capacity_kwargs(s, spec_n_max, spec)
            for kind, prompts in KIND_PROMPTS.items():
                entry: dict = {
                    "n_max": spec_n_max,
                    "n_rs_seq": kwargs["n_rs_seq"],
                    "options": options,
                    "draft_model": extra[1] if extra else None,
                }
                counts = {"drafted": 0, "accepted": 0}

                @contextlib.contextmanager
                def ours_round(prompt: str):  # a process of its own; the reference's work: its budget rule
                    with OursProcess(s.path, kwargs, spec) as proc:

                        def ours(level: str) -> float:
                            got = proc.run(prompt, tokens, spec_n_max, level, drafter=spec, **options)
                            counts["drafted"] += got["drafted"]
                            counts["accepted"] += got["accepted"]
                            return got["tokens_per_second"]

                        yield ours

                def ref(prompt: str) -> float:
                    return run_reference_spec(
                        binary,
                        path,
                        prompt,
                        spec_type_args(spec, spec_n_max, options) + extra,
                        max_tokens=tokens,
                        n_ctx=2048,
                        threads=s.threads,
                    ).tokens_per_second

                pairs: dict[str, list[tuple]] = {level: [] for level in levels}
                for prompt in prompts:
                    got = interleaved_pairs(
                        levels,
                        repeats,
                        functools.partial(ours_round, prompt),
                        functools.partial(ref, prompt) if binary else None,
                    )
                    for level in levels:
                        pairs[level] += got[level]
                entry |= {level: pairs_summary(pairs[level]) for level in levels}
                # every level runs the same drafts: the counts of one level's runs
                entry |= {
                    "acceptance_rate": counts["accepted"] / counts["drafted"] if counts["drafted"] else None,
                    "drafted": counts["drafted"] // len(levels),
                }
                key = f"{spec} / {kind}" if len(n_maxes) == 1 else f"{spec} / {kind} / n_max {spec_n_max}"
                doc[key] = entry
    return doc


def reference_rs_seq(spec: str | None, n_max: int) -> int:
    """The snapshot slots llama-speculative-simple gives a recurrent target for ``--spec-type spec`` at ``n_max``
    (``None``: draft-mtp): ``n_max`` where a drafter of the chain gets them (common's ``need_n_rs_seq``), else 0 for a
    chain of look-ups or draft-simple, which then restores checkpoints (ours too, opened with ``n_rs_seq=0``)."""
    return n_max if drafters.mode(spec or drafters.DEFAULT_MODE).gets_snapshot_slots else 0


def capacity_kwargs(s: mx.Session, n_max: int, spec: str | None = None) -> dict:
    """The options that open a session like ``s``, on a recurrent model with the reference's snapshot slots for ``spec``
    (:func:`reference_rs_seq`) and capacity ``n_max`` (:func:`at_capacity`)."""
    if not s.info.is_recurrent:
        return dict(s.open_kwargs)
    return s.open_kwargs | {"n_rs_seq": reference_rs_seq(spec, n_max), "capacity": n_max}


@contextlib.contextmanager
def at_capacity(s: mx.Session, n_max: int, spec: str | None = None):
    """``s``, or (when its slots differ on a recurrent model) a session like it with :func:`capacity_kwargs`.
    llama-speculative-simple gives its target context ``--spec-draft-n-max`` slots for a draft-mtp chain, and llama.cpp
    copies every layer's convolution state into each slot at every decode, so the default capacity of 8 costs ours
    work the reference does not do at a smaller n_max (0.7% more instructions per token at n_max 3 on the scale
    model); a look-up chain's reference has no slots at all and restores checkpoints: the comparison runs both alike."""
    kwargs = capacity_kwargs(s, n_max, spec)
    if kwargs == s.open_kwargs:
        yield s
        return
    with mx.Session.open(s.path, **kwargs) as t:
        warm_up(t, n_max, spec)
        yield t


def warm_up(s: mx.Session, n_max: int, spec: str | None = None) -> None:
    """A 16-token generation at ``n_max`` (2 at most) with ``spec``'s drafter, before a new session is timed."""
    s.generate(PROMPTS[0], max_tokens=16, n_max=min(2, n_max), **({"drafter": spec} if spec else {}))


TIMED_LEVELS = ("full", "off")


def reference_section(s: mx.Session, binary: str, path, tokens: int, repeats: int, head=None) -> dict:
    """Ours against llama-speculative-simple on the same settings (snapshot slots included: :func:`at_capacity`),
    in :func:`alternating_pairs` per prompt and repeat, at each telemetry level of :data:`TIMED_LEVELS`; the ratio
    is the median of the pairs' ratios (``head``: the target's shared-memory MTP head file).

    The same work on both sides at every level: ours runs the reference's budget rule on the native step loop
    (:func:`generate_reference_budget`: its last step drafts the full n_max and so decodes past ``tokens``, as the
    reference's does), and with telemetry on its text and totals are checked against the reference's
    (``ours_tokens`` and ``reference_tokens`` say how many each side decoded)."""
    ref = {}
    for n_max in (1, 2, 3, 4):
        with at_capacity(s, n_max) as sc:
            parity, entry = [], {"n_rs_seq": sc.open_kwargs["n_rs_seq"]}
            for level in TIMED_LEVELS:
                pairs, counts = [], {"ours_tokens": 0, "reference_tokens": 0}
                for prompt in PROMPTS:

                    def reference() -> float:
                        run = run_reference(
                            binary,
                            path,
                            prompt,
                            max_tokens=tokens,
                            n_max=n_max,
                            n_ctx=2048,
                            threads=sc.threads,
                            head=head,
                        )
                        counts["reference_tokens"] += run.n_predict
                        if level != "off":
                            parity.append(compare_with_reference(run, sc.last_trace, 0.0)["match"])
                        return run.tokens_per_second

                    def ours() -> float:
                        sc.telemetry = level
                        secs, run = budget_seconds(sc, prompt, tokens, n_max)
                        trace = run.trace
                        counts["ours_tokens"] += len(trace.tokens)
                        return len(trace.tokens) / secs

                    pairs += alternating_pairs(repeats, ours, reference)  # ours first: the trace checked
                entry[level] = pairs_summary(pairs) | {
                    "ours_tokens": counts["ours_tokens"] // repeats,
                    "reference_tokens": counts["reference_tokens"] // repeats,
                }
            sc.telemetry = "full"
            ref[n_max] = entry | {"parity_of_totals_and_text": all(parity)}
    return {"binary": binary, "target_ratio": 1.0, "by_n_max": ref}


def modes_section(binary: str, tokens: int, repeats: int, threads: int | None) -> dict:
    """The other two modes of llama.cpp's draft-mtp driver on SYNTHETIC models (``_common.write_mode_models``):
    chained heads and a shared-memory head file, each as :func:`reference_section` (ours against the reference at
    n_max 1-4, with the parity of text and totals)."""
    doc = {}
    with tempfile.TemporaryDirectory(prefix="mtp-explorer-modes-") as tmp:
        for model, head, label in write_mode_models(Path(tmp)):
            with mx.Session.open(model, n_ctx=2048, threads=threads, draft_model=head) as s:
                s.generate(PROMPTS[0], max_tokens=16, n_max=2)  # warm-up
                doc[s.info.mtp_mode] = {"model": label} | reference_section(
                    s, binary, model, tokens, repeats, head=head
                )
    return doc


_MEMORY_PROBE = r"""
import json, sys, time
import mtp_explorer as mx
from mtp_explorer import _native

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "RssAnon", "RssFile")}

path, load_mode, n_rs_seq, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
before = status()
_native.take_log()
t0 = time.perf_counter()
s = mx.Session.open(path, n_ctx=1024, load_mode=load_mode, n_rs_seq=n_rs_seq, threads=threads)
load = time.perf_counter() - t0
rs = [l for l in _native.take_log() if "RS buffer size" in l]
s.generate("def fibonacci(n):", max_tokens=16, n_max=min(3, n_rs_seq))
print(json.dumps({"load_seconds": load, "before": before, "after": status(),
                  "rs_buffer_mib": float(rs[0].split("=")[1].split()[0]) if rs else None}))
"""


def memory_section(path, threads: int) -> dict:
    """Load time and memory of a fresh process per setting (peak RSS is per process)."""
    import json
    import subprocess
    import sys

    def probe(load_mode: str, n_rs_seq: int) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, str(path), load_mode, str(n_rs_seq), str(threads)],
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    size = os.path.getsize(path)
    doc: dict = {"file_bytes": size, "slot_bytes_from_metadata": mx.model_info(path).rs_slot_bytes}
    for mode in ("auto", "none"):
        m = probe(mode, 8)
        anon = m["after"]["RssAnon"] - m["before"]["RssAnon"]
        doc[f"load_mode_{mode}"] = {
            "load_seconds": m["load_seconds"],
            "peak_rss_bytes": m["after"]["VmHWM"],
            "anon_growth_bytes": anon,
            "file_backed_bytes": m["after"]["RssFile"],
            "anon_growth_over_file_size": anon / size,
        }
    rs = {n: probe("auto", n)["rs_buffer_mib"] for n in (1, 2, 4, 8)}
    doc["rs_buffer_mib_by_n_rs_seq"] = rs
    doc["rs_slot_mib_measured"] = (rs[8] - rs[1]) / 7
    return doc


def _same_file(a, b) -> bool:
    """``a`` and ``b`` name the same file (``None`` names none)."""
    return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()


def session_sections(path, args, draft, binary: str | None) -> dict:
    """The sections measured on one session of ``path`` (throughput, telemetry, stream, drafters, reference; with
    ``draft``, the draft model or head file of draft-simple), and the drafters of the other heads for this target."""
    out: dict = {}
    with mx.Session.open(path, n_ctx=2048, threads=args.threads, draft_model=draft) as s:
        s.generate(PROMPTS[0], max_tokens=16, n_max=2)  # warm-up
        out["threads"] = s.threads
        if "throughput" in args.only:
            plain, _ = tokens_per_second(s, args.tokens, 0, args.repeats)
            out["plain_tokens_per_second"] = plain
            out["mtp"] = {}
            for n_max in (1, 2, 3, 4):
                rate, traces = tokens_per_second(s, args.tokens, n_max, args.repeats)
                acc = sum(int(t.n_accepted.sum()) for t in traces) / max(1, sum(int(t.n_drafted.sum()) for t in traces))
                out["mtp"][n_max] = {
                    "tokens_per_second": rate,
                    "speedup_over_plain": rate / plain,
                    "acceptance_rate": acc,
                }

        if "telemetry" in args.only:
            out["telemetry"] = telemetry_overhead(s, args.tokens, args.telemetry_rounds)

        # Python streaming: per-step cost of yielding a Step versus the native loop
        native, streamed, steps = [], [], 0
        for _ in range(args.repeats if "stream" in args.only else 0):
            for prompt in PROMPTS:
                secs, t = decode_seconds(s, prompt, args.tokens, 3)
                native.append(secs)
                t0 = time.perf_counter_ns()
                for _step in s.stream(prompt, max_tokens=args.tokens, n_max=3):
                    pass
                streamed.append((time.perf_counter_ns() - t0 - s.last_trace.t_prefill_ns) / 1e9)
                steps = s.last_trace.n_steps
        if native:
            out["stream"] = {
                "steps_per_generation": steps,
                "native_seconds": statistics.median(native),
                "stream_seconds": statistics.median(streamed),
                "overhead_per_step_us": (statistics.median(streamed) - statistics.median(native)) / steps * 1e6,
            }

        if "drafters" in args.only:
            out["drafters"] = drafters_section(
                s, binary, path, args.tokens, args.repeats, args.drafter_n_max, spec_types=args.spec_type
            )
        if binary and "reference" in args.only:
            out["reference"] = reference_section(s, binary, path, args.tokens, args.repeats)
    heads = [
        h.head_path for h in mx.draft_heads() if _same_file(h.target_path, path) and not _same_file(h.head_path, draft)
    ]
    for head in heads if "drafters" in args.only else ():  # the other heads for this target (draft-eagle3's)
        with mx.Session.open(path, n_ctx=2048, threads=args.threads, draft_model=head) as s:
            s.generate(PROMPTS[0], max_tokens=16, n_max=0)  # warm-up
            out["drafters"] |= drafters_section(
                s,
                binary,
                path,
                args.tokens,
                args.repeats,
                args.drafter_n_max,
                draft_model_only=True,
                spec_types=args.spec_type,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--draft-model",
        "-md",
        default=None,
        help="draft model for draft-simple (default: the bundled one with the bundled model, else none)",
    )
    ap.add_argument(
        "--telemetry-rounds",
        type=int,
        default=20,
        help="rounds of off/steps/full triples over the prompts for the telemetry overhead (default 20)",
    )
    ap.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="run only these sections (default: all)"
    )
    ap.add_argument(
        "--drafter-n-max",
        nargs="+",
        type=int,
        default=[3],
        metavar="N",
        help="the drafters section's n_max values (default: 3; 1 2 3 4 for the whole grid)",
    )
    ap.add_argument(
        "--spec-type",
        nargs="+",
        choices=SPEC_TYPES,
        default=None,
        metavar="SPEC",
        help="the drafters section's --spec-type values (default: every drafter and chain)",
    )
    ap.add_argument(
        "--scale",
        action="store_true",
        help="measure the SYNTHETIC 0.4 B-parameter Q8_0 model of scale_model.py (64 tokens, 2 repeats, "
        "4 telemetry rounds unless given), then its quantized copies (--scale-copies)",
    )
    ap.add_argument(
        "--scale-copies",
        nargs="*",
        default=["Q4_K_M"],
        metavar="TYPE",
        help="with --scale: the llama-quantize types of the scale model's copies also measured, every "
        "section but memory and modes (default: Q4_K_M; none: no copy)",
    )
    args = ap.parse_args()
    if args.scale and args.model:  # --scale measures its own files: a --model beside it would go unmeasured
        ap.error("--model and --scale exclude each other (--scale measures the scale model and --scale-copies)")
    if args.scale:
        args.model = str(write_scale_model(log=lambda msg: print(msg, file=sys.stderr)))
        given = set(sys.argv)
        args.tokens = args.tokens if "--tokens" in given else 64
        args.repeats = args.repeats if "--repeats" in given else 2
        args.telemetry_rounds = args.telemetry_rounds if "--telemetry-rounds" in given else 4
    path, origin = pick_model(args.model)
    out: dict = {
        "model": str(path),
        "model_origin": "SYNTHETIC scale model (random weights)" if args.scale else origin,
        "model_info": {k: v for k, v in mx.model_info(path).to_dict().items() if k != "tensor_types"},
        "tokens": args.tokens,
        "machine": machine(),
    }
    if "memory" in args.only:
        out["memory"] = memory_section(path, args.threads or 2)

    draft = args.draft_model or (mx.draft_model_path() if origin == "bundled" and not args.scale else None)
    binary = os.environ.get("LLAMA_SPECULATIVE_SIMPLE")
    out |= session_sections(path, args, draft, binary)
    if "modes" in args.only and binary and not args.scale:
        out["modes"] = modes_section(binary, args.tokens, args.repeats, args.threads)
    for file_type in args.scale_copies if args.scale else ():  # the same model quantized otherwise (Q4_K_M)
        copy = write_scale_model(file_type=file_type, log=lambda msg: print(msg, file=sys.stderr))
        out.setdefault("quantized_copies", {})[file_type] = {
            "model": str(copy),
            "model_info": {k: v for k, v in mx.model_info(copy).to_dict().items() if k != "tensor_types"},
        } | session_sections(copy, args, None, binary)
    emit(out)


if __name__ == "__main__":
    main()
