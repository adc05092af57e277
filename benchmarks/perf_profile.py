"""Where a generation's time goes, per telemetry level: ``perf record`` samples by library and symbol (JSON on stdout).

    .venv/bin/python benchmarks/perf_profile.py --scale              # SYNTHETIC 0.4 B Q8_0 model, off and full
    .venv/bin/python benchmarks/perf_profile.py --threads 2 --levels off steps full --ext build/profile/ext
    .venv/bin/python benchmarks/perf_profile.py --scale --spec-type ngram-mod,draft-mtp --prompts code

Each level runs in a child process under ``perf record`` (Debian's ``linux-perf``). Sampling starts disabled
(``--delay=-1``). The child loads the model and runs one warm-up generation. It then enables sampling through perf's
control fifo, runs ``--repeats`` generations of ``--tokens`` tokens and disables it again. So the samples hold the
generations alone, without the load and Python's start-up.

For each level the output gives the share of samples per library and the symbols above ``--min-share``. It also
gives each library's samples per generated token, which is the figure to compare between levels: the levels
generate the same tokens. ``vs_off`` is a level's samples per token over "off"'s, per library.

``--ext`` loads the extension built with its symbols (``make profile-build``), so that the engine's own functions
are named; the installed one is stripped, and its samples show only as addresses in ``_native``.
Sampling is statistical: a library with a few hundred samples moves by several percent between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, machine, pick_model  # noqa: E402
from engine import KIND_PROMPTS, lookup_limits, reference_rs_seq  # noqa: E402
from scale_model import write_scale_model  # noqa: E402

from mtp_explorer.core import drafters  # noqa: E402

LEVELS = ("off", "steps", "full")
PROMPT = "def fibonacci(n):"

# The child: load, warm up, then generate under sampling, which it switches on and off through perf's control fifo.
CHILD = r"""
import importlib.util, json, os, sys
if os.environ.get("MTP_EXPLORER_PROFILE_EXT"):  # --ext: the extension with symbols, in place of the installed one
    spec = importlib.util.spec_from_file_location("mtp_explorer._native", os.environ["MTP_EXPLORER_PROFILE_EXT"])
    sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[spec.name])
import mtp_explorer as mx
run = json.loads(sys.argv[1])  # path, level, threads, n_max, tokens, repeats, prompts, drafter, options, open
ctl, ack = os.environ["PERF_CTL_FIFO"], os.environ["PERF_ACK_FIFO"]

def perf(command):
    with open(ctl, "w") as f:
        f.write(command + "\n")
    with open(ack) as f:
        f.readline()

def generate(s, prompt):
    return s.generate(prompt, max_tokens=run["tokens"], n_max=run["n_max"], **run["drafter"], **run["options"])

with mx.Session.open(run["path"], n_ctx=1024, threads=run["threads"], telemetry=run["level"], **run["open"]) as s:
    generate(s, run["prompts"][0])
    perf("enable")
    made = [len(generate(s, p).tokens) for _ in range(run["repeats"]) for p in run["prompts"]]
    perf("disable")
print(json.dumps({"tokens": sum(made)}))
"""

REPORT_LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.+?)\s*$")


def record(path: Path, level: str, args, work: Path) -> tuple[Path, int]:
    """perf.data of one level's generations, and the tokens they made."""
    ctl, ack, data = work / f"{level}.ctl", work / f"{level}.ack", work / f"{level}.data"
    for fifo in (ctl, ack):
        if fifo.exists():
            fifo.unlink()
        os.mkfifo(fifo)
    env = os.environ | {"PERF_CTL_FIFO": str(ctl), "PERF_ACK_FIFO": str(ack)}
    if args.ext:
        found = sorted(Path(args.ext).glob("_native*.so"))
        if not found:
            raise SystemExit(f"no _native*.so in {args.ext} (make profile-build)")
        env["MTP_EXPLORER_PROFILE_EXT"] = str(found[0])
    child = {
        "path": str(path),
        "level": level,
        "threads": args.threads,
        "n_max": args.n_max,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "prompts": KIND_PROMPTS[args.prompts] if args.prompts else [PROMPT],
        **spec_settings(args.spec_type, args.n_max),
    }
    cmd = [
        "perf",
        "record",
        "-q",
        "-F",
        str(args.frequency),
        "--delay=-1",
        f"--control=fifo:{ctl},{ack}",
        "-o",
        str(data),
        "--",
        sys.executable,
        "-c",
        CHILD,
        json.dumps(child),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"perf record failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return data, json.loads(run.stdout.strip().splitlines()[-1])["tokens"]


def spec_settings(spec: str | None, n_max: int) -> dict:
    """The child's drafter, its options and the session's slots, as ``benchmarks/engine.py``'s drafters section runs
    ``--spec-type spec`` beside the reference (:func:`lookup_limits`, :func:`reference_rs_seq`); ``None``: the
    session's default drafter and slots."""
    if spec is None:
        return {"drafter": {}, "options": {}, "open": {}}
    return {
        "drafter": {"drafter": spec},
        "options": lookup_limits(drafters.mode(spec), n_max),
        "open": {"n_rs_seq": reference_rs_seq(spec, n_max), "capacity": n_max},
    }


def samples(data: Path) -> dict[tuple[str, str], int]:
    """Samples per (library, symbol) in ``data`` (``perf report``, no call chains)."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "-n", "--sort", "dso,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_report(out)


def parse_report(text: str) -> dict[tuple[str, str], int]:
    """Samples per (library, symbol) of ``perf report --stdio -n --sort dso,sym``'s text; a library's addresses
    without a symbol count together as "(no symbol)"."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for line in text.splitlines():
        m = REPORT_LINE.match(line)
        if m:
            symbol = "(no symbol)" if m.group(4).startswith("0x") else m.group(4)
            counts[(m.group(3), symbol)] += int(m.group(2))
    return dict(counts)


def summarise(counts: dict[tuple[str, str], int], tokens: int, min_share: float) -> dict:
    """Shares and samples per token by library, and the symbols with at least ``min_share`` of the samples."""
    total = sum(counts.values())
    by_lib: dict[str, int] = defaultdict(int)
    for (lib, _), n in counts.items():
        by_lib[lib] += n
    libs = sorted(by_lib.items(), key=lambda kv: -kv[1])
    symbols = [
        {"library": lib, "symbol": sym, "share": n / total}
        for (lib, sym), n in sorted(counts.items(), key=lambda kv: -kv[1])
        if n / total >= min_share
    ]
    return {
        "tokens": tokens,
        "samples": total,
        "samples_per_token": total / tokens,
        "libraries": {lib: {"share": n / total, "samples_per_token": n / tokens} for lib, n in libs},
        "symbols": symbols,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="default: the bundled model")
    ap.add_argument("--scale", action="store_true", help="the SYNTHETIC 0.4 B Q8_0 model of scale_model.py")
    ap.add_argument("--levels", nargs="+", choices=LEVELS, default=["off", "full"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument(
        "--spec-type",
        help="a drafter or chain, with the drafters section's options and slots "
        "(benchmarks/engine.py); default: the session's draft-mtp",
    )
    ap.add_argument(
        "--prompts",
        choices=sorted(KIND_PROMPTS),
        help="the drafters section's prompts of this kind, each generated --repeats times; default: one code prompt",
    )
    ap.add_argument("--repeats", type=int, default=6, help="generations sampled per level, after one warm-up")
    ap.add_argument("--frequency", type=int, default=1999, help="perf record -F")
    ap.add_argument("--min-share", type=float, default=0.005, help="list symbols with at least this share")
    ap.add_argument("--ext", help="a directory with the extension built with its symbols (make profile-build)")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Debian: apt install linux-perf)")
    if args.scale:
        path, origin = write_scale_model(log=lambda msg: print(msg, file=sys.stderr)), "SYNTHETIC scale model"
    else:
        path, origin = pick_model(args.model)
    levels = {}
    with tempfile.TemporaryDirectory(prefix="mtp-explorer-profile-") as tmp:
        for level in args.levels:
            data, tokens = record(Path(path), level, args, Path(tmp))
            levels[level] = summarise(samples(data), tokens, args.min_share)
    if "off" in levels:
        base = levels["off"]["libraries"]
        for got in levels.values():
            got["vs_off"] = {
                lib: v["samples_per_token"] / base[lib]["samples_per_token"]
                for lib, v in got["libraries"].items()
                if lib in base
            }
            got["samples_per_token_vs_off"] = got["samples_per_token"] / levels["off"]["samples_per_token"]
    emit(
        {
            "model": str(path),
            "model_origin": origin,
            "machine": machine(),
            "threads": args.threads,
            "n_max": args.n_max,
            "spec_type": args.spec_type,
            "prompts": args.prompts,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "frequency": args.frequency,
            "symbols_from": args.ext or "the installed extension (stripped)",
            "levels": levels,
        }
    )


if __name__ == "__main__":
    main()
