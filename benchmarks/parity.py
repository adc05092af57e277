"""Parity with llama.cpp's own speculative driver, ``llama-speculative-simple`` (built from the same
0.3.36 sources): for greedy decoding, the same prompt, settings and budget, our generated text and
totals of drafted/accepted tokens must equal what it prints. Two drafters are checked
(``--spec-type``, default ``all``):

- ``draft-mtp``: our MTP drafter against ``--spec-type draft-mtp``, on ``--model`` (default: the
  bundled model), over prompts x n_max x p_min; and on a SYNTHETIC qwen35moe model (the
  Qwen3.6-35B-A3B architecture: hybrid recurrent trunk, MoE in every block and in the MTP block;
  written to a temporary folder) over a smaller grid (``MOE_PROMPTS`` x ``MOE_N_MAX`` x p_min), and on the
  other two modes of llama.cpp's draft-mtp driver: a SYNTHETIC step35 with 3 chained heads and a SYNTHETIC
  gemma4 with its shared-memory head file (``-md``), ``MOE_PROMPTS`` x ``N_MAX`` x p_min.
- ``ngram-simple``: our n-gram drafter (``drafter="ngram-simple"``, ``n_max = ngram_simple_size_m``) against
  ``--spec-type ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m M``, over
  prompts x (N, M) on four models: a SYNTHETIC non-recurrent glm4moe model, a SYNTHETIC qwen35
  model, the SYNTHETIC qwen35moe model (all written to a temporary folder) and ``--model``/the
  bundled model.
- ``draft-simple``: a separate draft model (``Session.open(draft_model=...)``) against ``--spec-type draft-simple -md
  DRAFT`` and ``ngram-simple,draft-simple``, 12 prompts x p_min {0, 0.5} on two target/draft pairs (see
  :func:`draft_simple_section`).
- ``draft-eagle3``, ``draft-dflash`` and ``draft-dspark``: the shipped EAGLE-3, DFlash and DSpark heads
  (``mx.draft_heads()``) as the bundled model's ``-md``, alone and after ngram-simple, 12 prompts x p_min {0, 0.5}
  (see :func:`head_section`; DSpark's p_min is compared with its confidence head).
- ``chains``: ``ngram-mod``, ``ngram-map-k``, ``ngram-map-k4v`` and llama.cpp's chains ``ngram-mod,draft-mtp``,
  ``ngram-simple,draft-mtp`` and ``ngram-simple,ngram-map-k,draft-mtp`` (``drafter="<the same --spec-type
  value>"``, llama.cpp's ``first`` policy), 12 prompts each (see :func:`chains_section`).

    make reference      # builds build/reference/bin/llama-speculative-simple from the sdist
    .venv/bin/python benchmarks/parity.py --binary build/reference/bin/llama-speculative-simple \\
        [--spec-type draft-mtp|ngram-simple|chains|draft-simple|draft-eagle3|draft-dflash|draft-dspark|all]
        [--model PATH] [--threads 2]

Prints JSON with one section per spec type (``"draft-mtp"``, ``"ngram-simple"``; each with
``models``, ``cases``, ``matches``, ``all_match`` and ``mismatches``, the failing case records; the
draft-mtp section also ``per_model`` counts and acceptance) and an overall ``all_match``; exits 1 on
any mismatch.

Known differences are accounted for, not hidden:

- our engine stops drafting at an end-of-generation token, the reference drafts on past it (nothing
  after it can be accepted). With p_min == 0 the reference's extra MTP drafts are exactly the cap
  minus our draft length, so its totals are still checked exactly; with p_min > 0 such cases
  compare text and accepted totals and are counted as "unverifiable_drafted_total".
- n-gram on a recurrent model (qwen35): the reference's target context then cannot remove part of
  a sequence, so after a partial acceptance it restores a checkpoint and verifies the accepted
  tokens and the correction again as its next draft, which also yields the token after them before
  its budget is checked (our engine restores a snapshot slot instead). The replay reproduces this
  (``checkpoint_rule: true``): a plain step is forced after each partial acceptance, and the
  expected totals (``expected_reference``) count the re-verification as the reference does;
  text and totals are then compared exactly. On the non-recurrent glm4moe model our totals are
  the reference's as they are.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import tempfile
from pathlib import Path

from _common import emit, machine, pick_model, write_mode_models

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.devtools.reference import (
    ReferenceRun,
    compare_with_reference,
    reference_checkpoints,
    reference_n_max,
    reference_totals,
    replay_reference_budget,
    run_reference,
    run_reference_spec,
    spec_type_args,
)

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    "    return self._value",
    "# Copyright",
    "with open(path) as f:",
    "if __name__ == '__main__':",
]
SPEC_TYPES = ("draft-mtp", "ngram-simple", "chains", "draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
HEAD_SPEC_TYPES = (
    "draft-eagle3",
    "draft-dflash",
    "draft-dspark",
)  #: checked with the head that ships for them (head_section)
N_MAX = (1, 2, 3, 5)
P_MIN = (0.0, 0.5)

# draft-mtp on the SYNTHETIC qwen35moe model: a smaller grid (the model is tiny; the reference is one
# process per case). context_mix 0.5 gives partial acceptance, so rollbacks restore snapshot slots.
MOE_PROMPTS = PROMPTS[:4]
MOE_N_MAX = (1, 2, 3, 4)
MOE_KNOBS = {"context_mix": 0.5, "mtp_fidelity": 1.0}

# n-gram: prompts that repeat themselves (so look-ups hit) and two that do not; (size_n, size_m) pairs.
NGRAM_PROMPTS = [
    "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2",
    "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    "def fibonacci(n):",
    "import os\nimport sys\n",
]
NGRAM_SIZES = ((2, 4), (3, 6), (1, 8))
N_CTX = 1024


# -- draft-mtp ---------------------------------------------------------------------------------------
def mtp_cases(
    binary: str, path: Path, label: str, tokens: int, threads: int, prompts, n_maxes, p_mins, head: Path | None = None
) -> list[dict]:
    """One record per prompt x n_max x p_min: the reference's and our text and totals (n_min 0); ``head``: a
    shared-memory MTP head file (``-md``)."""
    cases = []
    with mx.Session.open(path, n_ctx=N_CTX, threads=threads, draft_model=head) as s:
        for prompt, n_max, p_min, n_min in itertools.product(prompts, n_maxes, p_mins, (0,)):
            ref = run_reference(
                binary,
                path,
                prompt,
                max_tokens=tokens,
                n_max=n_max,
                p_min=p_min,
                n_min=n_min,
                n_ctx=N_CTX,
                threads=threads,
                head=head,
            )
            ours = replay_reference_budget(s, prompt, max_tokens=tokens, n_max=n_max, p_min=p_min, n_min=n_min)
            cases.append(
                {
                    "model": label,
                    "model_path": str(path),
                    "prompt": prompt,
                    "n_max": n_max,
                    "p_min": p_min,
                    "n_min": n_min,
                    "rollback_steps": int((ours.rollback > 0).sum()),
                }
                | compare_with_reference(ref, ours, p_min)
            )
    return cases


def _counts(cases: list[dict]) -> dict:
    drafted = sum(c["ours"]["n_drafted"] for c in cases)
    accepted = sum(c["ours"]["n_accept"] for c in cases)
    return {
        "cases": len(cases),
        "matches": sum(c["match"] for c in cases),
        "explained_by_eos_rule": sum(c["explained_by_eos_rule"] for c in cases),
        "unverifiable_drafted_total": sum(c["unverifiable_drafted_total"] for c in cases),
        "cases_with_rollback": sum(c["rollback_steps"] > 0 for c in cases),
        "acceptance_rate": accepted / drafted if drafted else None,
    }


def mtp_section(binary: str, picked: tuple[Path, str], tokens: int, threads: int, tmp: Path) -> dict:
    """The draft-mtp cases on ``picked`` and on SYNTHETIC models of llama.cpp's three draft-mtp modes: qwen35moe (one
    head), step35 (three chained heads, fidelities falling head by head) and gemma4 with its shared-memory head."""
    from mtp_explorer.models.synthetic_qwen35moe import write_synthetic_qwen35moe

    path, origin = picked
    moe = write_synthetic_qwen35moe(tmp / "qwen35moe.gguf", **MOE_KNOBS)
    runs = [
        (path, None, origin, PROMPTS, N_MAX, P_MIN),
        (
            moe,
            None,
            "synthetic qwen35moe (random weights, MoE + hybrid recurrent, "
            f"context_mix={MOE_KNOBS['context_mix']}, mtp_fidelity={MOE_KNOBS['mtp_fidelity']})",
            MOE_PROMPTS,
            MOE_N_MAX,
            P_MIN,
        ),
    ] + [(model, head, label, MOE_PROMPTS, N_MAX, P_MIN) for model, head, label in write_mode_models(tmp)]
    cases, described, per_model = [], [], {}
    for model_path, head, model_origin, prompts, n_maxes, p_mins in runs:
        info = mx.model_info(model_path) if head is None else mx.model_info(model_path, head=head)
        label = info.arch + (" (bundled)" if model_origin == "bundled" else "")
        described.append(
            {
                "model": str(model_path),
                "model_origin": model_origin,
                "arch": info.arch,
                "mtp_mode": info.mtp_mode,
                "n_mtp_heads": info.n_mtp_heads,
                "is_recurrent": info.is_recurrent,
                "n_expert": info.n_expert,
                "prompts": len(prompts),
                "n_max": list(n_maxes),
                "p_min": list(p_mins),
            }
        )
        mine = mtp_cases(binary, model_path, label, tokens, threads, prompts, n_maxes, p_mins, head)
        per_model[label] = _counts(mine) | {"all_match": all(c["match"] for c in mine)}
        cases += mine
    return (
        {"models": described, "per_model": per_model}
        | _counts(cases)
        | {"all_match": all(c["match"] for c in cases), "mismatches": [c for c in cases if not c["match"]]}
    )


# -- ngram-simple ------------------------------------------------------------------------------------
def run_reference_ngram(
    binary: str | Path,
    model: str | Path,
    prompt: str,
    *,
    max_tokens: int,
    size_n: int,
    size_m: int,
    n_ctx: int = N_CTX,
    threads: int = 2,
) -> ReferenceRun:
    """llama-speculative-simple, greedy, with ngram-simple drafting."""
    spec = [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        str(size_n),
        "--spec-ngram-simple-size-m",
        str(size_m),
    ]
    return run_reference_spec(binary, model, prompt, spec, max_tokens=max_tokens, n_ctx=n_ctx, threads=threads)


def as_the_reference(checkpoints: bool, capacity: int) -> dict:
    """``Session.open``'s rollback keywords for the reference's: no snapshot slots where it restores checkpoints (the
    session then does so too), else ``capacity`` slots."""
    return {"n_rs_seq": 0, "capacity": capacity} if checkpoints else {"n_rs_seq": capacity}


def compare_ngram(ref: ReferenceRun, ours: mx.Trace, *, checkpoints: bool) -> dict:
    """Text and the n_predict/n_drafted/n_accept totals (expected: :func:`reference_totals`)."""
    mine = {
        "n_predict": len(ours.tokens),
        "n_drafted": int(ours.n_drafted.sum()),
        "n_accept": int(ours.n_accepted.sum()),
    }
    expected = reference_totals(ours, checkpoints=checkpoints)
    reference = {"n_predict": ref.n_predict, "n_drafted": ref.n_drafted, "n_accept": ref.n_accept}
    text_equal = "".join(ours.pieces) == ref.text
    return {
        "reference": reference,
        "ours": mine,
        "expected_reference": expected,
        "text_equal": text_equal,
        "checkpoint_rule": checkpoints,
        "re_verified_steps": sum(st.n_accepted < st.n_drafted for st in ours.steps) if checkpoints else 0,
        "eos_stopped_steps": sum(st.stop_reason == "eos" for st in ours.steps),
        "match": text_equal and reference == expected,
    }


def ngram_section(binary: str, picked: tuple[Path, str], tokens: int, threads: int, tmp: Path) -> dict:
    from mtp_explorer.models.synthetic import write_synthetic_qwen35
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe
    from mtp_explorer.models.synthetic_qwen35moe import write_synthetic_qwen35moe

    models = [
        (write_synthetic_glm4moe(tmp / "glm4moe.gguf"), "synthetic glm4moe (random weights, KV rollback)"),
        (
            write_synthetic_qwen35(tmp / "qwen35.gguf", context_mix=0.6, mtp_fidelity=1.0),
            "synthetic qwen35 (random weights, context_mix=0.6, mtp_fidelity=1.0)",
        ),
        (
            write_synthetic_qwen35moe(tmp / "qwen35moe-ngram.gguf", **MOE_KNOBS),
            "synthetic qwen35moe (random weights, MoE + hybrid recurrent, "
            f"context_mix={MOE_KNOBS['context_mix']}, mtp_fidelity={MOE_KNOBS['mtp_fidelity']})",
        ),
        picked,
    ]
    cases, described = [], []
    for path, origin in models:
        info = mx.model_info(path)
        checkpoints = bool(info.is_recurrent)
        described.append(
            {
                "model": str(path),
                "model_origin": origin,
                "arch": info.arch,
                "is_recurrent": info.is_recurrent,
                "checkpoint_rule": checkpoints,
            }
        )
        with mx.Session.open(
            path, n_ctx=N_CTX, threads=threads, **as_the_reference(checkpoints, max(m for _, m in NGRAM_SIZES))
        ) as s:
            for prompt, (size_n, size_m) in itertools.product(NGRAM_PROMPTS, NGRAM_SIZES):
                ref = run_reference_ngram(
                    binary, path, prompt, max_tokens=tokens, size_n=size_n, size_m=size_m, threads=threads
                )
                ours = replay_reference_budget(
                    s,
                    prompt,
                    max_tokens=tokens,
                    n_max=size_m,
                    drafter="ngram-simple",
                    ngram_simple_size_n=size_n,
                    ngram_simple_size_m=size_m,
                    checkpoints=checkpoints,
                )
                cases.append(
                    {
                        "model": info.arch + (" (bundled)" if origin == "bundled" else ""),
                        "model_path": str(path),
                        "prompt": prompt,
                        "size_n": size_n,
                        "size_m": size_m,
                    }
                    | compare_ngram(ref, ours, checkpoints=checkpoints)
                )
    return {
        "models": described,
        "sizes": [list(p) for p in NGRAM_SIZES],
        "cases": len(cases),
        "matches": sum(c["match"] for c in cases),
        "cases_with_drafts": sum(c["ours"]["n_drafted"] > 0 for c in cases),
        "cases_with_re_verified_steps": sum(c["re_verified_steps"] > 0 for c in cases),
        "all_match": all(c["match"] for c in cases),
        "mismatches": [c for c in cases if not c["match"]],
    }


# -- more --spec-type values: the n-gram table and llama.cpp's chains --------------------------------
#: Checked besides draft-mtp and ngram-simple, each over CHAIN_PROMPTS (12) on the models below, n_max
#: CHAIN_N_MAX (the MTP head's --spec-draft-n-max; the look-ups' own limits, --spec-ngram-simple-size-m and
#: --spec-ngram-mod-n-max, set to the same; 8 with ngram-cache, see reference_n_max), p_min 0 and small look-up sizes
#: (SPEC_SMALL) so that the look-ups draft in these short prompts. A chain runs under llama.cpp's policy (the first
#: drafter, in its order, with a draft is verified).
#: ngram-cache runs without cache files: llama-speculative-simple 0.3.36 does not take -lcs/-lcd (llama.cpp registers
#: them for llama-lookup and llama-server only); tests/test_ngram_cache.py checks the static cache against the replay.
SPEC_CHAINS = (
    "ngram-mod",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod,draft-mtp",
    "ngram-simple,draft-mtp",
    "ngram-simple,ngram-map-k,draft-mtp",
    "ngram-cache",
    "ngram-cache,draft-mtp",
)
CHAIN_PROMPTS = NGRAM_PROMPTS + PROMPTS
CHAIN_N_MAX = 3
SPEC_SMALL = {
    "ngram_simple_size_n": 2,
    "ngram_mod_n_match": 2,
    "ngram_mod_n_min": 1,
    "ngram_map_k_size_n": 2,
    "ngram_map_k4v_size_n": 2,
    "ngram_map_k4v_min_hits": 1,
}


def spec_options(spec: str, n_max: int) -> dict[str, int]:
    """Our options for ``spec`` (keyword: value; llama.cpp's flag is ``--spec-`` + the keyword with dashes)."""
    names = {o.name for o in drafters.mode(spec).options}
    limits = {
        "ngram_simple_size_m": n_max,
        "ngram_mod_n_max": n_max,
        "ngram_map_k_size_m": n_max,
        "ngram_map_k4v_size_m": n_max,
    }
    return {k: v for k, v in (SPEC_SMALL | limits).items() if k in names}


def spec_cases(binary: str, spec: str, path: Path, label: str, tokens: int, threads: int) -> list[dict]:
    """One record per prompt: ``--spec-type spec`` against our engine with ``drafter=spec`` (budget rule replayed; where
    the reference restores checkpoints, a session without slots that does too)."""
    n_max = reference_n_max(spec, CHAIN_N_MAX)
    options = spec_options(spec, n_max)
    flags = spec_type_args(spec, n_max, options)
    checkpoints = reference_checkpoints(path, spec)
    cases = []
    with mx.Session.open(path, n_ctx=N_CTX, threads=threads, **as_the_reference(checkpoints, max(8, n_max))) as s:
        for prompt in CHAIN_PROMPTS:
            ref = run_reference_spec(binary, path, prompt, flags, max_tokens=tokens, n_ctx=N_CTX, threads=threads)
            ours = replay_reference_budget(
                s, prompt, max_tokens=tokens, n_max=n_max, drafter=spec, checkpoints=checkpoints, **options
            )
            won = {name: int((ours.drafter == mx.DRAFTERS.index(name)).sum()) for name in mx.DRAFTERS}
            cases.append(
                {
                    "model": label,
                    "model_path": str(path),
                    "prompt": prompt,
                    "spec_type": spec,
                    "n_max": n_max,
                    "options": options,
                    "steps_by_drafter": {k: v for k, v in won.items() if v},
                }
                | compare_with_reference(ref, ours, 0.0, checkpoints=checkpoints)
            )
    return cases


def chains_section(
    binary: str, picked: tuple[Path, str], tokens: int, threads: int, tmp: Path, specs: tuple[str, ...] = SPEC_CHAINS
) -> dict:
    """The look-up drafters alone on the non-recurrent glm4moe model and on the SYNTHETIC qwen35 model, where the
    reference restores checkpoints after a partial acceptance (and tells the stateful look-ups the re-verified tokens)
    and ours, opened without slots, does too; the chains with draft-mtp (the target then gets snapshot slots) on the
    SYNTHETIC qwen35 and qwen35moe models and ``--model``/the bundled model."""
    from mtp_explorer.models.synthetic import write_synthetic_qwen35
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe
    from mtp_explorer.models.synthetic_qwen35moe import write_synthetic_qwen35moe

    with_mtp = [
        (
            write_synthetic_qwen35(tmp / "qwen35-chain.gguf", context_mix=0.6, mtp_fidelity=1.0),
            "synthetic qwen35 (random weights, context_mix=0.6, mtp_fidelity=1.0)",
        ),
        (write_synthetic_qwen35moe(tmp / "qwen35moe-chain.gguf", **MOE_KNOBS), "synthetic qwen35moe"),
        picked,
    ]
    without = [(write_synthetic_glm4moe(tmp / "glm4moe-chain.gguf"), "synthetic glm4moe (random weights, KV rollback)")]
    out: dict = {"n_max": CHAIN_N_MAX, "prompts": len(CHAIN_PROMPTS), "small_options": SPEC_SMALL}
    for spec in specs:
        models = with_mtp if drafters.mode(spec).needs_mtp else without + with_mtp[:1]
        cases = []
        for path, origin in models:
            info = mx.model_info(path)
            label = info.arch + (" (bundled)" if origin == "bundled" else "")
            cases += spec_cases(binary, spec, path, label, tokens, threads)
        out[spec] = {
            "models": [str(p) for p, _ in models],
            "cases": len(cases),
            "matches": sum(c["match"] for c in cases),
            "cases_with_drafts": sum(c["ours"]["n_drafted"] > 0 for c in cases),
            "steps_by_drafter": dict(
                sum((collections.Counter(c["steps_by_drafter"]) for c in cases), collections.Counter())
            ),
            "drafted": sum(c["ours"]["n_drafted"] for c in cases),
            "accepted": sum(c["ours"]["n_accept"] for c in cases),
            "all_match": all(c["match"] for c in cases),
            "mismatches": [c for c in cases if not c["match"]],
        }
    out["all_match"] = all(out[spec]["all_match"] for spec in specs)
    return out


# -- draft-simple: a separate draft model (-md) -------------------------------------------------------
#: draft-simple alone and after a look-up, each over CHAIN_PROMPTS x DRAFT_P_MIN with n_max CHAIN_N_MAX, on two
#: target/draft pairs with a shared vocabulary (see :func:`draft_simple_section`).
DRAFT_SPECS = ("draft-simple", "ngram-simple,draft-simple")
DRAFT_P_MIN = (0.0, 0.5)


def draft_pairs(picked: tuple[Path, str], tmp: Path) -> list[tuple[Path, Path, str]]:
    """(target, draft model, label) pairs: a SYNTHETIC non-recurrent glm4moe target drafted for by a glm4moe of the
    same seed whose trunk mixes in no context (the target's token-to-token part: partial acceptance), and the
    bundled model (or ``--model``) with the bundled draft model (its tokenizer)."""
    from mtp_explorer.models import draft_model_path
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe

    target = write_synthetic_glm4moe(tmp / "glm4moe-target.gguf", context_mix=0.5)
    draft = write_synthetic_glm4moe(tmp / "glm4moe-draft.gguf", context_mix=0.0)
    return [
        (target, draft, "synthetic glm4moe (context_mix=0.5) drafted by glm4moe (context_mix=0)"),
        (picked[0], draft_model_path(), f"{picked[1]} model drafted by the bundled draft model"),
    ]


def draft_cases(binary: str, spec: str, target: Path, draft: Path, label: str, tokens: int, threads: int) -> list[dict]:
    """One record per prompt x p_min: ``--spec-type spec -md draft`` against ``drafter=spec`` in a session opened with
    ``draft_model=draft`` (budget rule replayed; on a recurrent target a session without slots, restoring checkpoints
    as the reference does)."""
    options = spec_options(spec, CHAIN_N_MAX)
    checkpoints = reference_checkpoints(target, spec)
    cases = []
    with mx.Session.open(
        target, n_ctx=N_CTX, threads=threads, draft_model=draft, **as_the_reference(checkpoints, CHAIN_N_MAX)
    ) as s:
        for prompt, p_min in itertools.product(CHAIN_PROMPTS, DRAFT_P_MIN):
            flags = spec_type_args(spec, CHAIN_N_MAX, options) + ["-md", str(draft), "--spec-draft-p-min", str(p_min)]
            ref = run_reference_spec(binary, target, prompt, flags, max_tokens=tokens, n_ctx=N_CTX, threads=threads)
            ours = replay_reference_budget(
                s,
                prompt,
                max_tokens=tokens,
                n_max=CHAIN_N_MAX,
                p_min=p_min,
                drafter=spec,
                checkpoints=checkpoints,
                **options,
            )
            cases.append(
                {"model": label, "prompt": prompt, "spec_type": spec, "p_min": p_min, "options": options}
                | compare_with_reference(ref, ours, p_min, checkpoints=checkpoints)
            )
    return cases


def draft_summary(cases: list[dict]) -> dict:
    """The counts of a model drafter's cases: matches, re-verified steps, acceptance, the mismatching records, and
    per p_min the cases, matches and our drafted/accepted totals."""
    by_p_min = {str(p): [c for c in cases if c["p_min"] == p] for p in sorted({c["p_min"] for c in cases})}
    return {
        "cases": len(cases),
        "matches": sum(c["match"] for c in cases),
        "by_p_min": {
            p: {
                "cases": len(cs),
                "matches": sum(c["match"] for c in cs),
                "drafted": sum(c["ours"]["n_drafted"] for c in cs),
                "accepted": sum(c["ours"]["n_accept"] for c in cs),
            }
            for p, cs in by_p_min.items()
        },
        "cases_with_re_verified_steps": sum(c["re_verified_steps"] > 0 for c in cases),
        "acceptance_rate": (
            sum(c["ours"]["n_accept"] for c in cases) / max(1, sum(c["ours"]["n_drafted"] for c in cases))
        ),
        "all_match": all(c["match"] for c in cases),
        "mismatches": [c for c in cases if not c["match"]],
    }


def draft_simple_section(binary: str, picked: tuple[Path, str], tokens: int, threads: int, tmp: Path) -> dict:
    """draft-simple (and a look-up chained before it) against the reference with ``-md``. On the recurrent bundled
    model the reference has no snapshot slots without draft-mtp, so it restores checkpoints, and so does ours, opened
    without them (the reference's printed acceptance is then 100% by construction: the re-verified tokens count as
    drafted and accepted)."""
    pairs = draft_pairs(picked, tmp)
    out: dict = {
        "n_max": CHAIN_N_MAX,
        "p_min": list(DRAFT_P_MIN),
        "prompts": len(CHAIN_PROMPTS),
        "pairs": [
            {
                "target": str(t),
                "draft_model": str(d),
                "label": lb,
                "checkpoint_rule": bool(mx.model_info(t).is_recurrent),
            }
            for t, d, lb in pairs
        ],
    }
    for spec in DRAFT_SPECS:
        out[spec] = draft_summary(
            [c for t, d, lb in pairs for c in draft_cases(binary, spec, t, d, lb, tokens, threads)]
        )
    out["all_match"] = all(out[spec]["all_match"] for spec in DRAFT_SPECS)
    return out


def head_section(binary: str, head_spec: str, picked: tuple[Path, str], tokens: int, threads: int) -> dict:
    """A head's --spec-type alone and after ngram-simple against the reference with ``-md HEAD``: the head that ships
    for it and its target (llama.cpp 0.3.36 shares one draft context between model drafters, so a head is not chained
    with draft-mtp or draft-simple; the target gets snapshot slots, so no checkpoint rule)."""
    head = next(h for h in mx.draft_heads() if h.spec_type == head_spec)
    label = f"{picked[1]} model drafted by the shipped {head.head_path.name}"
    specs = (head_spec, f"ngram-simple,{head_spec}")
    out: dict = {
        "n_max": CHAIN_N_MAX,
        "p_min": list(DRAFT_P_MIN),
        "prompts": len(CHAIN_PROMPTS),
        "target": str(head.target_path),
        "head": str(head.head_path),
    }
    for spec in specs:
        out[spec] = draft_summary(draft_cases(binary, spec, head.target_path, head.head_path, label, tokens, threads))
    out["all_match"] = all(out[spec]["all_match"] for spec in specs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.environ.get("LLAMA_SPECULATIVE_SIMPLE"))
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="for our sessions and the reference alike")
    ap.add_argument(
        "--spec-type",
        choices=(*SPEC_TYPES, "all"),
        default="all",
        help="which drafter to check against the reference (default: all)",
    )
    ap.add_argument(
        "--chain",
        action="append",
        choices=SPEC_CHAINS,
        metavar="SPEC",
        help="with --spec-type chains: check only this --spec-type value (repeatable; default: all of "
        + ", ".join(SPEC_CHAINS)
        + ")",
    )
    args = ap.parse_args()
    if not args.binary:
        ap.error("give --binary or set LLAMA_SPECULATIVE_SIMPLE")
    spec_types = SPEC_TYPES if args.spec_type == "all" else (args.spec_type,)
    path, origin = pick_model(args.model)
    doc = {
        "binary": args.binary,
        "tokens": args.tokens,
        "threads": args.threads,
        "machine": machine(),
        "spec_types": list(spec_types),
    }
    with tempfile.TemporaryDirectory(prefix="mtp-explorer-parity-") as tmp:
        if "draft-mtp" in spec_types:
            doc["draft-mtp"] = mtp_section(args.binary, (path, origin), args.tokens, args.threads, Path(tmp))
        if "ngram-simple" in spec_types:
            doc["ngram-simple"] = ngram_section(args.binary, (path, origin), args.tokens, args.threads, Path(tmp))
        if "chains" in spec_types:
            doc["chains"] = chains_section(
                args.binary, (path, origin), args.tokens, args.threads, Path(tmp), tuple(args.chain or SPEC_CHAINS)
            )
        if "draft-simple" in spec_types:
            doc["draft-simple"] = draft_simple_section(
                args.binary, (path, origin), args.tokens, args.threads, Path(tmp)
            )
        for head_spec in (t for t in HEAD_SPEC_TYPES if t in spec_types):
            doc[head_spec] = head_section(args.binary, head_spec, (path, origin), args.tokens, args.threads)
    doc["all_match"] = all(doc[t]["all_match"] for t in spec_types)
    emit(doc)
    return 0 if doc["all_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
