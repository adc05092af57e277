"""Instructions per generated token, ours against llama-speculative-simple, counted by callgrind (JSON on stdout).

    make bench-instructions                                   # builds build/profile, then the default cases
    .venv/bin/python benchmarks/instructions.py --lib build/profile/bin --ext build/profile/ext \
        --case draft-mtp:1 ngram-simple:3

The wall clock on a shared 2-core machine moves by 3-5% between runs, more than the differences this measures; an
instruction count does not. Both sides run under ``valgrind --tool=callgrind`` at 1 thread on the same libllama (an
AVX2 build of the 0.3.36 sources with symbols: valgrind 3.19 stops on AVX-512, so the project's native builds cannot
be counted), greedy, on the same prompt and model. Each side runs twice, to ``--tokens`` LOW and HIGH tokens;
the difference of the two totals over the difference of the tokens is the cost of one token without the load and
the start. Ours runs with the reference's recurrent snapshot slots (``n_rs_seq`` = ``n_max`` for a chain with
draft-mtp; none, so checkpoints, for a chain of look-ups or draft-simple: ``benchmarks/engine.py``'s
``reference_rs_seq``), telemetry ``off``, and under the reference's budget rule for ``-n``
(``devtools.reference.draft_cap_rule``), so both generate the same tokens with the same drafts; each run's ``drafted``
and ``tokens`` show it (``same_work``). A case that drafts with a
model file (draft-simple, draft-eagle3, ...) takes it from ``--draft-model`` (the reference's ``-md``).

Each run also reports its ``llama_process`` calls, the target's and the drafters' (``decodes``: the HIGH run's
less the LOW run's). ``same_decodes`` false means the two windows hold different decodes, so their difference is
not the engines': llama.cpp's drafters draft ``n_max`` and the base then truncates the draft to the budget left, so
a run of the reference that ends on a truncated draft decodes more than it keeps, where ours drafts only what it
keeps; if the LOW run ends so and the HIGH run does not, the reference's window holds a draft decode fewer.

With ``--ext`` (the extension built with its symbols: make profile-build) ours also reports
``ours_engine_per_token``, the instructions inside ``Engine::step`` alone, and ``engine_ratio``. Python's start-up
executes tens of millions of instructions more or less as the process's memory layout falls (the same command
with another build of the extension, or another ``-n``, moved it by 17-27 M), which the whole-process difference
of two runs then spreads over the tokens between them; the native loop's count does not move.

``--numpy-printf`` runs the reference with the library numpy loads into every Python process preloaded
(``numpy_printf_preload``): its printf hooks make each ``ggml_format_name`` of a graph build cost 1.6 times as much,
which ours pays and the reference, a C++ program, does not. With it both engines run on the same glibc path.

``--no-repack`` (``-nr``) runs both sides without llama.cpp's extra buffer types, as the wall-clock benchmarks run on
a CPU whose AMX kernels fail (docs/guide/placement.md, "AMX machines"): a Q4_K file then runs the kernels it runs there.

``ratio`` is reference / ours: above 1, ours does less work per token. Instructions are not time (a memory-bound
copy costs more time per instruction than a matrix kernel), but both sides run the same kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, machine  # noqa: E402
from engine import lookup_limits, reference_rs_seq  # noqa: E402
from scale_model import write_scale_model  # noqa: E402

from mtp_explorer.core import drafters  # noqa: E402

PROMPT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
    "def fibonacci"
)
DEFAULT_CASES = ("draft-mtp:1", "draft-mtp:3", "ngram-simple:3", "ngram-mod,draft-mtp:3")

# Ours in a child process that loads the extension against ``--lib``'s libllama (LLAMA_CPP_LIB_PATH), under the
# reference's budget rule for ``-n tokens`` (devtools.reference.draft_cap_rule): it drafts at most the tokens left
# but the last, a full draft once none are left, and stops once it has more than ``tokens``: the native step loop
# with telemetry off (devtools.reference.generate_reference_budget; replay_reference_budget's Session.stream would
# build a Step record per step, about 1% of a scale step's instructions).
OURS = r"""
import importlib.util, json, os, sys
if os.environ.get("MTP_EXPLORER_PROFILE_EXT"):  # --ext: the extension with symbols, in place of the installed one
    spec = importlib.util.spec_from_file_location("mtp_explorer._native", os.environ["MTP_EXPLORER_PROFILE_EXT"])
    sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[spec.name])
import mtp_explorer as mx
from mtp_explorer.devtools.reference import generate_reference_budget
path, spec, n_max, n_rs_seq, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
options, prompt, draft = json.loads(sys.argv[6]), sys.argv[7], sys.argv[8] or None
repack = False if sys.argv[9] == "-nr" else None
with mx.Session.open(path, n_ctx=2048, threads=1, n_rs_seq=n_rs_seq, capacity=n_max, telemetry="off",
                     draft_model=draft, repack=repack) as s:
    run = generate_reference_budget(s, prompt, max_tokens=tokens, n_max=n_max, drafter=spec, **options)
    print(json.dumps({"tokens": len(run.trace.tokens), "drafted": run.n_drafted, "accepted": run.n_accepted}))
"""


# The look-ups' key lengths: 2 tokens, as the parity tests use (llama.cpp's defaults, 12 for ngram-simple, rarely
# draft in a few dozen tokens, which would leave their drafting and rollback out of the count).
SHORT_KEYS = {"ngram_simple_size_n": 2, "ngram_mod_n_match": 2, "ngram_map_k_size_n": 2, "ngram_map_k4v_size_n": 2}


def lookup_options(spec: str, n_max: int) -> dict:
    """The look-ups' options at n_max (engine.py's :func:`lookup_limits`, ngram-mod's n_min 1 and the keys of
    :data:`SHORT_KEYS`), as the reference is given them (``--spec-ngram-*``)."""
    mode = drafters.mode(spec)
    names = {o.name for o in mode.options}
    short = SHORT_KEYS | {"ngram_mod_n_min": 1}
    return lookup_limits(mode, n_max) | {k: v for k, v in short.items() if k in names}


def callgrind(cmd: list[str], lib: Path, out: Path, env: dict | None = None) -> tuple[int, str]:
    """The instructions ``cmd`` executes under callgrind, and its stdout + stderr (Python with a fixed hash seed: a
    random one moves the start-up's count by millions from run to run; numpy's OpenBLAS without worker threads,
    whose idle spinning counted 16-23 M instructions a run, as the machine's load let them run; valgrind's fair
    scheduling, without which the reference's log thread, which prints its summary, rarely ran before the process
    exited: 8 runs of 8 without a summary on the Q4_K_M copy)."""
    env = (
        os.environ
        | {
            "LD_LIBRARY_PATH": str(lib),
            "LLAMA_CPP_LIB_PATH": str(lib),
            "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        | (env or {})
    )
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--fair-sched=yes", f"--callgrind-out-file={out}", *cmd],
        env=env,
        capture_output=True,
        text=True,
    )
    log = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed under callgrind ({run.returncode}):\n{log[-2000:]}")
    return int(re.search(r"Collected : (\d+)", log).group(1)), log


def numpy_printf_preload() -> str:
    """The library numpy brings into every Python process that makes glibc's printf family slower: the libquadmath
    its OpenBLAS needs, whose constructor registers printf hooks (``register_printf_specifier``, for ``%Q``), after
    which glibc formats every call on its positional path. llama.cpp formats a name for each tensor of each graph it
    builds (``ggml_format_name``), so ours pays it and the reference, a C++ program, does not."""
    import numpy

    found = sorted((Path(numpy.__file__).resolve().parent.parent / "numpy.libs").glob("libquadmath*.so*"))
    if not found:
        raise SystemExit("this numpy brings no libquadmath: --numpy-printf has nothing to preload")
    return str(found[0])


def reference(
    lib: Path,
    model: Path,
    spec: str,
    n_max: int,
    n: int,
    out: Path,
    prompt: str,
    draft: str,
    env: dict | None = None,
    no_repack: bool = False,
) -> dict:
    from mtp_explorer.devtools.reference import spec_type_args

    options = lookup_options(spec, n_max)
    cmd = [
        str(lib / "llama-speculative-simple"),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n),
        "-c",
        "2048",
        "-t",
        "1",
        "--temp",
        "0",
        "--seed",
        "0",
        "--spec-draft-p-min",
        "0",
        *spec_type_args(spec, n_max, options),
        *(["-md", draft] if draft else []),
        *(["-nr"] if no_repack else []),
    ]
    for _ in range(8):  # 0.3.36 sometimes exits 0 with the tail of its log lost: run it again
        instructions, log = callgrind(cmd, lib, out, env)
        found = [
            re.search(pattern, log)
            for pattern in (r"n_drafted\s*=\s*(\d+)", r"n_accept\s*=\s*(\d+)", r"decoded\s+(\d+) tokens")
        ]
        if all(found):
            break
    else:
        raise RuntimeError(f"llama-speculative-simple printed no summary 8 times:\n{log[-2000:]}")
    counts = {k: int(m.group(1)) for k, m in zip(("n_drafted", "n_accept"), found)}
    tokens = int(found[2].group(1))
    return {
        "instructions": instructions,
        "tokens": tokens,
        "drafted": counts["n_drafted"],
        "accepted": counts["n_accept"],
    } | decodes(out)


def ours(
    lib: Path,
    model: Path,
    spec: str,
    n_max: int,
    tokens: int,
    out: Path,
    prompt: str,
    draft: str,
    ext: Path | None,
    no_repack: bool = False,
) -> dict:
    cmd = [
        sys.executable,
        "-c",
        OURS,
        str(model),
        spec,
        str(n_max),
        str(reference_rs_seq(spec, n_max)),
        str(tokens),
        json.dumps(lookup_options(spec, n_max)),
        prompt,
        draft,
        "-nr" if no_repack else "",
    ]
    instructions, log = callgrind(cmd, lib, out, {"MTP_EXPLORER_PROFILE_EXT": str(ext)} if ext else None)
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    return {"instructions": instructions} | result | decodes(out)


# Who calls llama_process, read from a callgrind file's caller tree: the target's decodes (the reference's main,
# our engine's prefill and verify) and the drafters' (every other caller but the reference's set-up).
TARGET_CALLERS = ("speculative-simple.cpp:main", "Engine::decode_target(", "Engine::prefill(")
SETUP_CALLERS = ("common_init_from_params(", "common_context_can_seq_rm(", "(below main)")
CALLER = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+<\s+(\S.*?) \((\d+)x\)")


def decodes(cg: Path) -> dict:
    """The run's llama_process calls: the target's (``target``), the drafts' (``draft``, and the instructions they
    execute, ``draft_instructions``) and the drafters' others (``drafter``: catch-up, ...); and, for ours with symbols
    (``--ext``), the instructions inside ``Engine::step`` (``engine``: the native loop alone, without Python's start-up
    and the driver, whose counts move by tens of millions with the process's memory layout)."""
    out = subprocess.run(
        ["callgrind_annotate", "--tree=caller", "--inclusive=yes", "--threshold=100", str(cg)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = {"target": 0, "draft": 0, "drafter": 0, "draft_instructions": 0}
    block: list[str] = []
    for line in out.splitlines():
        if not line.strip():
            block = []
        elif "*  " in line and re.search(r":llama_process( \[|$)", line):  # listed twice: with its library, without
            if any(counts.values()):
                break
            for caller in block:
                m = CALLER.match(caller)
                if m and not any(c in m.group(2) for c in SETUP_CALLERS):
                    kind = (
                        "target"
                        if any(c in m.group(2) for c in TARGET_CALLERS)
                        else "draft"
                        if re.search(r"::draft(_together)?\(", m.group(2))
                        else "drafter"
                    )
                    counts[kind] += int(m.group(3))
                    if kind == "draft":
                        counts["draft_instructions"] += int(m.group(1).replace(",", ""))
        else:
            block.append(line)
    if counts["target"] == 0:  # no symbols (ours without --ext): its callers are addresses
        return {}
    engine = re.search(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+\*?\s*\S*:Engine::step\(\)( \[|$)", out, re.M)
    return counts | ({"engine": int(engine.group(1).replace(",", ""))} if engine else {})


def per_token(low: dict, high: dict, key: str = "instructions") -> float:
    return (high[key] - low[key]) / (high["tokens"] - low["tokens"])


def measure(
    lib: Path,
    model: Path,
    case: str,
    low: int,
    high: int,
    work: Path,
    prompt: str,
    draft_model: str | None,
    ext: Path | None = None,
    ref_env: dict | None = None,
    no_repack: bool = False,
) -> dict:
    """One case's instructions per token on both sides (``work`` keeps the callgrind files)."""
    spec, n_max = case.rsplit(":", 1)
    n_max = int(n_max)
    draft = draft_model if drafters.mode(spec).needs_draft_model else ""
    if draft is None:
        raise SystemExit(f"{spec} drafts with a model file: give it with --draft-model")
    runs: dict = {}
    for n in (low, high):
        name = f"{spec}-{n_max}-{n}"
        runs[n] = {
            "reference": reference(
                lib, model, spec, n_max, n, work / f"ref-{name}.cg", prompt, draft, ref_env, no_repack
            ),
            "ours": ours(lib, model, spec, n_max, n, work / f"ours-{name}.cg", prompt, draft, ext, no_repack),
        }
        print(f"{case} -n {n}: {json.dumps(runs[n])}", file=sys.stderr)
    ref_pt, ours_pt = (per_token(runs[low][side], runs[high][side]) for side in ("reference", "ours"))
    out = {
        "spec_type": spec,
        "n_max": n_max,
        "n_rs_seq": reference_rs_seq(spec, n_max),
        "draft_model": draft or None,
        "reference_per_token": ref_pt,
        "ours_per_token": ours_pt,
        "ratio": ref_pt / ours_pt,
        "same_work": all(
            r["reference"][k] == r["ours"][k] for r in runs.values() for k in ("tokens", "drafted", "accepted")
        ),
        "decodes": None,
        "runs": {str(n): r for n, r in runs.items()},
    }
    if not all("target" in runs[n][side] for n in (low, high) for side in ("reference", "ours")):
        return out  # ours without symbols (--ext): its decodes are not told apart
    window = {
        side: {k: runs[high][side][k] - runs[low][side][k] for k in ("target", "draft", "drafter")}
        for side in ("reference", "ours")
    }
    out |= {"decodes": window, "same_decodes": window["reference"] == window["ours"]}
    ref_w, ours_w = window["reference"], window["ours"]
    if (
        ref_w["draft"] != ours_w["draft"]
        and ref_w["draft"] > 0
        and all(ref_w[k] == ours_w[k] for k in ("target", "drafter"))
    ):
        # the reference's window completed with the draft decodes one run wasted on a truncated draft, each at the
        # window's mean draft decode
        ref = {n: runs[n]["reference"] for n in (low, high)}
        cost = (ref[high]["draft_instructions"] - ref[low]["draft_instructions"]) / ref_w["draft"]
        tokens = ref[high]["tokens"] - ref[low]["tokens"]
        out["reference_steady_per_token"] = ref_pt + (ours_w["draft"] - ref_w["draft"]) * cost / tokens
        out["steady_ratio"] = out["reference_steady_per_token"] / ours_pt
    if all("engine" in runs[n]["ours"] for n in (low, high)):
        out["ours_engine_per_token"] = per_token(runs[low]["ours"], runs[high]["ours"], "engine")
        out["engine_ratio"] = out.get("reference_steady_per_token", ref_pt) / out["ours_engine_per_token"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="the AVX2 profile build's bin directory (make profile-build)")
    ap.add_argument("--model", help="default: the SYNTHETIC 0.4 B Q8_0 scale model (benchmarks/scale_model.py)")
    ap.add_argument("--case", nargs="+", default=list(DEFAULT_CASES), metavar="SPEC:N_MAX")
    ap.add_argument("--tokens", nargs=2, type=int, default=[8, 24], metavar=("LOW", "HIGH"))
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument(
        "--draft-model",
        "-md",
        help="the draft model or head file of the cases that draft with one "
        "(draft-simple, draft-eagle3, draft-dflash, draft-dspark)",
    )
    ap.add_argument(
        "--ext",
        help="a directory with the extension built with its symbols (make profile-build: "
        "build/profile/ext), loaded by ours in place of the installed one",
    )
    ap.add_argument("--keep", help="a directory to keep the callgrind files in (callgrind_annotate reads them)")
    ap.add_argument(
        "--numpy-printf",
        action="store_true",
        help="run the reference with numpy's libquadmath preloaded, as ours runs: the engines alone, "
        "without the printf hooks a Python process with numpy has (numpy_printf_preload)",
    )
    ap.add_argument(
        "--no-repack",
        "-nr",
        action="store_true",
        help="both sides without extra buffer types (llama.cpp's -nr; ours repack=False), as the wall-clock "
        "benchmarks run on a CPU whose AMX kernels fail (docs/guide/placement.md, 'AMX machines')",
    )
    args = ap.parse_args()
    lib = Path(args.lib).resolve()
    ext = None
    if args.ext:
        found = sorted(Path(args.ext).glob("_native*.so"))
        if not found:
            raise SystemExit(f"no _native*.so in {args.ext}: make profile-build")
        ext = found[0].resolve()
    model = Path(args.model) if args.model else write_scale_model(log=lambda m: print(m, file=sys.stderr))
    ref_env = {"LD_PRELOAD": numpy_printf_preload()} if args.numpy_printf else None
    out = {
        "model": str(model),
        "prompt": args.prompt,
        "tokens": args.tokens,
        "machine": machine(),
        "reference_env": ref_env,
        "no_repack": args.no_repack,
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for case in args.case:
            out["cases"][case] = measure(
                lib, model, case, *args.tokens, work, args.prompt, args.draft_model, ext, ref_env, args.no_repack
            )
    emit(out)


if __name__ == "__main__":
    main()
