"""Divergences of greedy speculative from plain output on Q4_K_M files, each explained by the file's measured shift.

For each file (a Q4_K_M copy of the bundled model, made by llama.cpp's ``llama-quantize``; with ``--scale`` also
the SYNTHETIC 0.4 B model of ``benchmarks/scale_model.py`` as Q4_K_M) and each placement (llama.cpp's default
weight repacking, and ``-nr`` / ``repack=False``), it measures the batch-shape shift (``Session.batch_shift``),
runs every prompt greedily at ``n_max`` 1..4 beside its oracle (plain one-row decoding), and checks each run with
``mx.compare``: a run whose tokens differ from plain decoding is counted as a divergence, with the explanation
``compare`` gives it ("batch-variant kernel, shift <= X at this position", or unexplained: a bug to report).
It also times plain decoding and ``n_max`` 3 with and without repacking, as medians of alternating pairs
(``no_repack / repack`` ratios, measured in the same run).

    MTP_EXPLORER_QUANTIZE=build/reference/bin/llama-quantize .venv/bin/python benchmarks/divergence.py [--scale]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import emit, machine

import mtp_explorer as mx
from mtp_explorer.devtools.quantize import quantize

SHORT_PROMPTS = [
    "def fib(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    "with open(path) as f:",
    "try:\n    import json\nexcept ImportError:",
]
N_MAX = (1, 2, 3, 4)


def prompts() -> list[str]:
    return SHORT_PROMPTS + [p.text for p in mx.demo_prompts()]


def divergences(path: Path, repack: bool, tokens: int, threads: int) -> dict:
    """Every prompt at n_max 1..4 against its oracle; the divergences with compare()'s explanation."""
    runs, found = 0, []
    with mx.Session.open(path, n_ctx=2048, threads=threads, n_rs_seq=max(N_MAX), repack=repack) as s:
        t0 = time.perf_counter()
        shift = s.batch_shift(refresh=True)
        probe_s = time.perf_counter() - t0
        for prompt in prompts():
            oracle = s.record_oracle(prompt, max_tokens=tokens, depth=max(N_MAX), probe=False)
            for n in N_MAX:
                t = s.generate(prompt, max_tokens=tokens, n_max=n)
                runs += 1
                if t.tokens == oracle.tokens:
                    continue
                at = next(i for i, (a, b) in enumerate(zip(t.tokens, oracle.tokens)) if a != b)
                first = next((m for m in mx.compare(oracle, t).mismatches if m["cause"] == "target_argmax"), None)
                found.append(
                    {
                        "prompt": prompt[:40],
                        "n_max": n,
                        "position": at,
                        "kind": first["kind"] if first else "unexplained",
                        "margin": first["margin"] if first else None,
                        "explanation": first["explanation"] if first else "no target_argmax mismatch found",
                    }
                )
    return {
        "shift": shift.summary(),
        "probe_seconds": probe_s,
        "runs": runs,
        "diverged": len(found),
        "explained": sum(f["kind"] == "tie" for f in found),
        "unexplained": sum(f["kind"] != "tie" for f in found),
        "divergences": found,
    }


def speed(path: Path, tokens: int, threads: int, repeats: int) -> dict:
    """no_repack / repack tokens/s for plain decoding and n_max 3, medians of alternating pairs."""
    prompt = mx.demo_prompts()[0].text
    out = {}
    with (
        mx.Session.open(path, n_ctx=2048, threads=threads, repack=True) as on,
        mx.Session.open(path, n_ctx=2048, threads=threads, repack=False) as off,
    ):
        for n in (0, 3):

            def tps(s):
                return s.generate(prompt, max_tokens=tokens, n_max=n).summary()["tokens_per_second"]

            pairs = []
            for r in range(repeats):
                order = (on, off) if r % 2 == 0 else (off, on)
                got = {id(s): tps(s) for s in order}
                pairs.append((got[id(on)], got[id(off)]))
            out[f"n_max_{n}"] = {
                "repack_tokens_per_second": statistics.median(a for a, _ in pairs),
                "no_repack_tokens_per_second": statistics.median(b for _, b in pairs),
                "no_repack_over_repack": statistics.median(b / a for a, b in pairs),
                "pairs": repeats,
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="store_true", help="also the SYNTHETIC 0.4 B model as Q4_K_M (written once)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6, help="alternating pairs per speed figure")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mtp-explorer-divergence-"))
    files = {"bundled Q4_K_M": quantize(mx.default_model_path(), tmp / "bundled-Q4_K_M.gguf", "Q4_K_M", timeout=300)}
    if args.scale:
        from scale_model import write_scale_model

        files["SYNTHETIC 0.4B Q4_K_M"] = write_scale_model(file_type="Q4_K_M", log=lambda *_: None)
    doc = {"machine": machine(), "tokens": args.tokens, "n_max": list(N_MAX), "prompts": len(prompts()), "files": {}}
    for label, path in files.items():
        doc["files"][label] = {
            "repack": divergences(path, True, args.tokens, args.threads),
            "no_repack": divergences(path, False, args.tokens, args.threads),
            "speed": speed(path, args.tokens, args.threads, args.repeats),
        }
    emit(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
