"""Parity with llama.cpp's own MTP driver: for greedy decoding, the same prompt, n_max, p_min,
n_min and budget, our generated text and totals of drafted/accepted tokens must equal what
``llama-speculative-simple --spec-type draft-mtp`` (built from the same 0.3.36 sources) prints.

    make reference      # builds build/reference/bin/llama-speculative-simple from the sdist
    .venv/bin/python benchmarks/parity.py --binary build/reference/bin/llama-speculative-simple [--model PATH]

Prints JSON with one record per case and an overall verdict; exits 1 on any mismatch. One known
difference is accounted for, not hidden: our engine stops drafting at an end-of-generation token,
the reference drafts on past it (nothing after it can be accepted). With p_min == 0 the reference's
extra drafts are exactly the cap minus our draft length, so its totals are still checked exactly;
with p_min > 0 such cases compare text and accepted totals and are counted as
"unverifiable_drafted_total".
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import mtp_explorer as mx
from mtp_explorer.reference import compare, replay_reference_budget, run_reference

from _common import emit, machine, pick_model

PROMPTS = [
    "def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):",
    "for i in range(10):", "    return self._value", "# Copyright", "with open(path) as f:",
    "if __name__ == '__main__':",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.environ.get("LLAMA_SPECULATIVE_SIMPLE"))
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if not args.binary:
        ap.error("give --binary or set LLAMA_SPECULATIVE_SIMPLE")
    path, origin = pick_model(args.model)
    cases = []
    with mx.Session.open(path, n_ctx=1024, threads=2) as s:
        for prompt, n_max, p_min, n_min in itertools.product(PROMPTS, (1, 2, 3, 5), (0.0, 0.5), (0,)):
            ref = run_reference(args.binary, path, prompt, max_tokens=args.tokens, n_max=n_max, p_min=p_min,
                                n_min=n_min, n_ctx=1024, threads=2)
            ours = replay_reference_budget(s, prompt, max_tokens=args.tokens, n_max=n_max, p_min=p_min, n_min=n_min)
            case = {"prompt": prompt, "n_max": n_max, "p_min": p_min, "n_min": n_min} | compare(ref, ours, p_min)
            cases.append(case)
    ok = all(c["match"] for c in cases)
    emit({"model": str(path), "model_origin": origin, "binary": args.binary, "tokens": args.tokens,
          "machine": machine(), "cases": len(cases), "matches": sum(c["match"] for c in cases),
          "explained_by_eos_rule": sum(c["explained_by_eos_rule"] for c in cases),
          "unverifiable_drafted_total": sum(c["unverifiable_drafted_total"] for c in cases),
          "all_match": ok, "mismatches": [c for c in cases if not c["match"]]})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
