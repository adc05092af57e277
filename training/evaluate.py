"""Measure the shipped demo model and write the numbers into ``mtp_explorer/models/MODEL.md``.

    python -m training.evaluate                      # prints JSON, rewrites MODEL.md
    python -m training.evaluate --no-card --json out.json

Everything is measured on the GGUF file through llama.cpp (llama-cpp-python's low-level API,
see ``training/llama_ref.py``), so no torch is needed:

* greedy MTP acceptance at ``n_max`` 1..4 over 50 held-out prompts (64 new tokens each),
  simulating llama.cpp's draft-mtp loop: accepted / drafted, mean accepted drafts per round,
  and acceptance by depth at ``n_max=4``;
* a fingerprint of the plain greedy continuations (equal for two files with the same trunk);
* held-out next-token cross-entropy of the trunk and of the MTP head (nats/token) over the
  whole held-out split in windows of 256 tokens, plus the teacher-forced agreement of the
  MTP's top-1 with the trunk's top-1;
* three greedy sample completions;
* with ``--baseline``, the same numbers of another file (the model before its MTP head was
  fine-tuned) beside these, as the card's before/after table;
* with ``--write-prompts``, the demo prompts (:func:`choose_demo_prompts`) into
  ``mtp_explorer/models/prompts.json``;
* when the project's engine is importable, the acceptance numbers once more through
  ``mtp_explorer.Session`` on the same prompts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

from training.corpus import describe, load_corpus, split_corpus
from training.llama_ref import LlamaMTP, SpecStats

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "mtp_explorer" / "models" / "pystdlib-qwen35-mtp.gguf"
DEFAULT_CARD = ROOT / "mtp_explorer" / "models" / "MODEL.md"
DEFAULT_LOG = ROOT / "training" / "logs" / "train.jsonl"
HEAD_LOG = ROOT / "training" / "logs" / "mtp_head.jsonl"
DEFAULT_PROMPTS_FILE = ROOT / "mtp_explorer" / "models" / "prompts.json"
N_MAXES = (1, 2, 3, 4)

N_PROMPTS = 50
N_NEW = 64
PROMPT_LINES = 12
PROMPT_MAX_TOKENS = 192
WINDOW = 256
SAMPLE_PROMPTS = (
    "import sys\n\n\ndef main(args=None):\n    if args is None:\n        args = sys.argv[1:]\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __eq__(self, other):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
)
SAMPLE_NEW = 64
LOOP_TAIL = 32
LOOP_MAX_PERIOD = 16
N_DEMO_PROMPTS = 6
DEMO_NEW = 128  #: tokens of the continuation a demo prompt is judged by (the quickstart's max_tokens)
DEMO_MIN_DISTINCT = 0.75  #: at least this fraction of the continuation's lines distinct
DEMO_LOOP_PERIOD = 40  #: a demo continuation must not end in a loop of up to this many tokens
DEMO_RULE = (
    "snippets of held-out files starting at a def/class line, 8-14 lines ending before a non-blank line, at most "
    "a third comment or docstring lines; of those (8 per file, seed 1), one per file whose greedy continuation "
    "of 128 tokens does not end in a loop (period <= 40 tokens), has at least 75% distinct lines and is code by the "
    "same rule, most "
    "accepted drafts per round at "
    "n_max=4 first"
)
DEMO_PROMPT_LINES = (8, 14)  #: a demo prompt's length in lines (min, max)


def heldout_prompts(n: int = N_PROMPTS, seed: int = 0) -> list[str]:
    """``n`` deterministic prompts: ``PROMPT_LINES`` lines of held-out files ending before a non-blank line."""
    _, held = split_corpus(load_corpus())
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    files = [f for f in held if f.text.count("\n") > 3 * PROMPT_LINES]
    i = 0
    while len(prompts) < n:
        f = files[i % len(files)]
        i += 1
        lines = f.text.splitlines(keepends=True)
        for _ in range(20):
            end = int(rng.integers(PROMPT_LINES, len(lines) - 1))
            if lines[end].strip():
                break
        prompts.append("".join(lines[end - PROMPT_LINES : end]))
    return prompts


def ends_in_loop(tokens: list[int], tail: int = LOOP_TAIL, max_period: int = LOOP_MAX_PERIOD) -> bool:
    """Whether the last ``tail`` tokens repeat with a period of at most ``max_period`` tokens."""
    t = tokens[-tail:]
    if len(t) < tail:
        return False
    return any(all(t[i] == t[i - p] for i in range(p, len(t))) for p in range(1, max_period + 1))


def acceptance(m: LlamaMTP, prompts: list[str], n_max: int) -> tuple[SpecStats, list[float], list[list[int]]]:
    """Draft statistics, per-prompt acceptance, and the greedy continuations."""
    total = SpecStats(
        n_max=n_max, by_depth_drafted=[0] * n_max, by_depth_tried=[0] * n_max, by_depth_accepted=[0] * n_max
    )
    per_prompt = []
    gens = []
    for text in prompts:
        ids = m.tokenize(text)[-PROMPT_MAX_TOKENS:]
        gen, st = m.speculative_greedy(ids, N_NEW, n_max)
        total.merge(st)
        per_prompt.append(st.acceptance)
        gens.append(gen)
    return total, per_prompt, gens


def is_code(text: str) -> bool:
    """Whether at most a third of the non-blank lines are comments or docstring text, and no licence text."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    in_doc = False
    prose = 0
    for ln in lines:
        quotes = ln.count('"""') + ln.count("'''")
        if in_doc or ln.startswith("#") or quotes:
            prose += 1
        if quotes % 2:
            in_doc = not in_doc
    return bool(lines) and prose * 3 <= len(lines) and "icense" not in text


def distinct_lines(text: str) -> float:
    """The fraction of ``text``'s non-blank lines that are distinct (1.0: no line repeats)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return len(set(lines)) / len(lines) if lines else 0.0


def demo_candidates(per_file: int = 8, seed: int = 1) -> list[dict[str, object]]:
    """Snippets of held-out files that read as code: each starts at a ``def``/``class`` line, has
    :data:`DEMO_PROMPT_LINES` lines, ends before a non-blank line and passes :func:`is_code`; at most
    ``per_file`` per file, drawn with ``seed``."""
    _, held = split_corpus(load_corpus())
    rng = np.random.default_rng(seed)
    lo, hi = DEMO_PROMPT_LINES
    out: list[dict[str, object]] = []
    for f in held:
        lines = f.text.splitlines(keepends=True)
        found = []
        for i, ln in enumerate(lines):
            if not re.match(r"\s*(def|class) ", ln):
                continue
            for end in range(i + hi, i + lo - 1, -1):  # the longest snippet that ends before a non-blank line
                if end < len(lines) and lines[end].strip() and lines[end - 1].strip():
                    text = "".join(lines[i:end])
                    if is_code(text):
                        found.append({"text": text, "relpath": f.relpath, "first": i + 1, "last": end})
                    break
        if found:
            picks = rng.choice(len(found), size=min(per_file, len(found)), replace=False)
            out += [found[int(k)] for k in sorted(picks)]
    return out


def choose_demo_prompts(m: LlamaMTP, n: int = N_DEMO_PROMPTS) -> list[dict[str, object]]:
    """The demo prompts: of :func:`demo_candidates`, those whose greedy continuation of :data:`DEMO_NEW` tokens
    (the quickstart's) does not end in a loop, repeats few lines (:func:`distinct_lines`) and reads as code
    (:func:`is_code`), with the most accepted drafts
    per round at ``n_max=4``, one per file."""
    scored = []
    for c in demo_candidates():
        gen, st = m.speculative_greedy(m.tokenize(c["text"]), DEMO_NEW, 4)
        text = m.detokenize(gen)
        loops = ends_in_loop(gen, tail=2 * DEMO_LOOP_PERIOD, max_period=DEMO_LOOP_PERIOD)
        if not loops and distinct_lines(text) >= DEMO_MIN_DISTINCT and is_code(text) and st.drafts:
            scored.append({**c, "mean_accepted_per_round_n_max_4": round(st.accepted / st.drafts, 3)})
    scored.sort(key=lambda c: -c["mean_accepted_per_round_n_max_4"])
    chosen: list[dict[str, object]] = []
    for c in scored:
        if c["relpath"] not in {x["relpath"] for x in chosen}:
            chosen.append(c)
    return chosen[:n]


def write_demo_prompts(prompts: list[dict[str, object]], gguf_path: Path, path: Path = DEFAULT_PROMPTS_FILE) -> Path:
    """``prompts.json``: the chosen prompts, the model they were chosen with, and the rule."""
    doc = {"model": gguf_path.name, "rule": DEMO_RULE, "prompts": prompts}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def greedy_fingerprint(gens: list[list[int]]) -> str:
    """sha256 of the plain greedy continuations (token ids), to tell whether two trunks decode alike."""
    return hashlib.sha256(json.dumps(gens).encode("ascii")).hexdigest()


def engine_acceptance(gguf_path: Path, prompt_ids: list[list[int]], threads: int) -> dict[str, object] | None:
    """The same acceptance numbers measured with the project's engine (``mtp_explorer.Session``).

    Returns ``None`` when the engine is not available (e.g. its extension is not built).
    """
    try:
        from mtp_explorer import Session
    except Exception:  # noqa: BLE001 - the engine is optional here
        return None
    out: dict[str, object] = {}
    with Session.open(gguf_path, n_ctx=1024, threads=threads, n_rs_seq=8) as s:
        for n_max in (1, 4):
            drafted = accepted = rounds = 0
            reached = [0] * n_max
            ok = [0] * n_max
            for ids in prompt_ids:
                tr = s.generate(ids, max_tokens=N_NEW, n_max=n_max, temperature=0.0)
                c = tr.columns
                drafted += int(c["n_drafted"].sum())
                accepted += int(c["n_accepted"].sum())
                rounds += int((c["n_drafted"] > 0).sum())
                for d in range(n_max):
                    reached[d] += int((c["n_drafted"] >= d + 1).sum())
                    ok[d] += int(((c["n_drafted"] >= d + 1) & (c["n_accepted"] >= d + 1)).sum())
            out[f"acceptance_n_max_{n_max}"] = round(accepted / drafted, 4) if drafted else None
            out[f"n_max_{n_max}_drafted"] = drafted
            if n_max > 1:
                out[f"acceptance_n_max_{n_max}_by_depth"] = [
                    round(o / r, 4) if r else None for o, r in zip(ok, reached)
                ]
                out[f"mean_accepted_per_round_n_max_{n_max}"] = round(accepted / rounds, 4) if rounds else None
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    mx = x.max(-1, keepdims=True)
    return x - mx - np.log(np.exp(x - mx).sum(-1, keepdims=True))


def heldout_losses(m: LlamaMTP, tokens: list[int]) -> dict[str, float]:
    """Trunk and MTP cross-entropy (nats/token) and MTP/trunk top-1 agreement on held-out windows."""
    ce_t = ce_m = 0.0
    n_t = n_m = 0
    agree = 0
    zero = np.zeros((1, m.n_embd), dtype=np.float32)
    for s in range(0, len(tokens) - WINDOW, WINDOW):
        w = tokens[s : s + WINDOW]
        logits, h = m.sequence_states(w)
        lp = _log_softmax(logits[:-1])
        ce_t -= lp[np.arange(WINDOW - 1), w[1:]].sum()
        n_t += WINDOW - 1
        mlog, _ = m.mtp(w, np.concatenate([zero, h[:-1]]), 0)
        # row k >= 1 (token x_k, hidden h_{k-1}) predicts x_{k+1}
        mlp = _log_softmax(mlog[1:-1])
        ce_m -= mlp[np.arange(WINDOW - 2), w[2:]].sum()
        n_m += WINDOW - 2
        agree += int((mlog[1:].argmax(-1) == logits[1:].argmax(-1)).sum())
    return {
        "heldout_ce": ce_t / n_t,
        "heldout_ppl": math.exp(ce_t / n_t),
        "heldout_mtp_ce": ce_m / n_m,
        "heldout_mtp_top1_agreement": agree / (len(range(0, len(tokens) - WINDOW, WINDOW)) * (WINDOW - 1)),
        "heldout_tokens_scored": n_t,
    }


def training_summary(log_path: Path) -> dict[str, object]:
    """Final losses, evaluation and wall time from ``train.jsonl`` (empty if absent)."""
    if not log_path.exists():
        return {}
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "ce" in r]
    evals = [r for r in rows if "eval" in r]
    start = next((r for r in rows if r.get("event") == "start"), {})
    fin = next((r for r in reversed(rows) if r.get("event") == "finished"), {})
    out: dict[str, object] = {}
    if start:
        out["train_config"] = start.get("train_config")
        out["params"] = start.get("params")
        out["torch"] = start.get("torch")
        out["threads"] = start.get("threads")
    if steps:
        last = steps[-1]
        out.update({"steps": last["step"], "final_train_ce": last["ce"], "final_train_mtp_ce": last["mtp_ce"]})
        out["mean_tok_per_s"] = round(float(np.mean([r["tok_per_s"] for r in steps])))
    if evals:
        out["final_eval"] = evals[-1]["eval"]
    if fin:
        out["wall_seconds"] = fin["elapsed_seconds"]
    elif steps:
        out["wall_seconds"] = steps[-1]["elapsed_seconds"]
    return out


def head_summary(log_path: Path = HEAD_LOG) -> dict[str, object]:
    """The MTP-head fine-tune (``training.mtp_head``): its settings, steps, wall time and held-out evaluation."""
    if not log_path.exists():
        return {}
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    starts = [r for r in rows if r.get("event") == "start"]
    if not starts:
        return {}
    rows = rows[rows.index(starts[-1]) :]  # the last run from scratch, with its resumptions
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval" in r and "step" in r]
    out: dict[str, object] = {
        "config": starts[-1]["config"],
        "threads": starts[-1].get("threads"),
        "torch": starts[-1].get("torch"),
        "eval_before": starts[-1].get("eval"),
    }
    if steps:
        out.update(
            {
                "steps": steps[-1]["step"],
                "wall_seconds": steps[-1]["elapsed_seconds"],
                "mean_tok_per_s": round(float(np.mean([r["tok_per_s"] for r in steps]))),
            }
        )
    if evals:
        out["eval_after"] = evals[-1]["eval"]
    return out


def gguf_summary(path: Path) -> dict[str, object]:
    """Architecture numbers and parameter counts read from the GGUF."""
    import gguf

    r = gguf.GGUFReader(str(path))
    f = {
        k: v.contents()
        for k, v in r.fields.items()
        if not k.startswith("GGUF.") and not k.startswith("tokenizer.ggml.")
    }
    n_params = sum(int(np.prod(t.shape)) for t in r.tensors)
    nl = int(f["qwen35.block_count"]) - int(f["qwen35.nextn_predict_layers"])
    mtp_params = sum(int(np.prod(t.shape)) for t in r.tensors if t.name.startswith(f"blk.{nl}."))
    return {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "file_type": "F16 (matrices), F32 (norms, SSM vectors, conv)"
        if int(f.get("general.file_type", 0)) == 1
        else "F32",
        "n_params": n_params,
        "n_params_mtp": mtp_params,
        "n_params_embedding": int(np.prod([t for t in r.tensors if t.name == "token_embd.weight"][0].shape)),
        "n_vocab": len(r.fields["tokenizer.ggml.tokens"].data),
        "tokenizer_pre": r.fields["tokenizer.ggml.pre"].contents(),
        "metadata": {k: v for k, v in f.items() if k.startswith("qwen35.")},
        "training_steps": f.get("mtp_explorer.training_steps"),
        "training_seconds": f.get("mtp_explorer.training_seconds"),
    }


def evaluate(
    gguf_path: Path,
    n_prompts: int = N_PROMPTS,
    threads: int = 2,
    baseline: dict | None = None,
    write_prompts: bool = False,
    train_log: Path | None = DEFAULT_LOG,
    head_log: Path | None = HEAD_LOG,
) -> dict[str, object]:
    """All the numbers of the model card, as a JSON-able dict (``baseline``: another file's, for the
    before/after table; ``write_prompts``: also choose the demo prompts and write ``prompts.json``;
    ``train_log`` / ``head_log``: the logs of the runs that made the file, summarised into ``training`` and
    ``mtp_head``, or ``None`` where the file was made otherwise)."""
    t0 = time.time()
    files = load_corpus()
    _, held = split_corpus(files)
    prompts = heldout_prompts(n_prompts)
    with LlamaMTP(gguf_path, n_threads=threads, n_ctx=1024) as m:
        held_tokens: list[int] = []
        for f in held:
            held_tokens.extend(m.tokenize(f.text))
            held_tokens.append(int(m.tokenize("<|endoftext|>", parse_special=True)[0]))
        prompt_ids = [m.tokenize(p)[-PROMPT_MAX_TOKENS:] for p in prompts]
        runs = {n: acceptance(m, prompts, n) for n in N_MAXES}
        s1, per1, gens = runs[1]
        s4 = runs[4][0]
        loop_fraction = sum(ends_in_loop(g) for g in gens) / len(gens)
        losses = heldout_losses(m, held_tokens)
        samples = []
        for p in SAMPLE_PROMPTS:
            gen = m.greedy(m.tokenize(p), SAMPLE_NEW)
            _, st = m.speculative_greedy(m.tokenize(p), SAMPLE_NEW, 3)
            samples.append(
                {"prompt": p, "completion": m.detokenize(gen), "acceptance_n_max_3": round(st.acceptance, 3)}
            )
        if write_prompts:
            write_demo_prompts(choose_demo_prompts(m), gguf_path)
    try:
        engine = engine_acceptance(gguf_path, prompt_ids, threads)
    except Exception as exc:  # noqa: BLE001 - report, do not fail the evaluation
        engine = {"error": repr(exc)}
    return {
        "model": gguf_summary(gguf_path),
        "corpus": describe(files),
        "training": training_summary(train_log) if train_log else None,
        "mtp_head": head_summary(head_log) if head_log else None,
        "acceptance_n_max_1": round(s1.acceptance, 4),
        "acceptance_n_max_1_prompt_mean": round(float(np.mean(per1)), 4),
        "acceptance_n_max_1_prompt_min": round(float(np.min(per1)), 4),
        "n_max_1_drafted": s1.drafted,
        "greedy_loop_fraction": round(loop_fraction, 4),
        "greedy_sha256": greedy_fingerprint(gens),
        **{f"acceptance_n_max_{n}": round(runs[n][0].acceptance, 4) for n in N_MAXES if n > 1},
        **{
            f"mean_accepted_per_round_n_max_{n}": round(runs[n][0].accepted / runs[n][0].drafts, 4)
            if runs[n][0].drafts
            else 0.0
            for n in N_MAXES
        },
        "acceptance_n_max_4_by_depth": [None if v is None else round(v, 4) for v in s4.cumulative_by_depth()],
        "acceptance_n_max_4_by_depth_conditional": [
            None if v is None else round(v, 4) for v in s4.conditional_by_depth()
        ],
        "acceptance_n_max_4_by_depth_counts": {
            "drafted": s4.by_depth_drafted,
            "reached": s4.by_depth_tried,
            "accepted": s4.by_depth_accepted,
        },
        "n_prompts": n_prompts,
        "n_new_tokens": N_NEW,
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in losses.items()},
        "samples": samples,
        "engine": engine,
        "eval_seconds": round(time.time() - t0, 1),
        **({"baseline": {k: v for k, v in baseline.items() if k != "baseline"}} if baseline else {}),
    }


CARD_BEGIN = "<!-- BEGIN MEASURED (written by python -m training.evaluate) -->"
CARD_END = "<!-- END MEASURED -->"


def layer_pattern(meta: dict) -> str:
    """The trunk's layer types in order, a repeated group written once with its count (from the GGUF's
    ``recurrent_layers``, the nextn layers left out)."""
    n_trunk = int(meta["qwen35.block_count"]) - int(meta["qwen35.nextn_predict_layers"])
    kinds = [
        "gated delta net" if r else "gated full attention" for r in meta["qwen35.attention.recurrent_layers"][:n_trunk]
    ]
    size = next(k for k in range(1, n_trunk + 1) if kinds == kinds[:k] * (n_trunk // k))  # n_trunk at the latest
    group = ", ".join(kinds[:size])
    return group if size == n_trunk else f"{n_trunk // size} × ({group})"


def render_measured(r: dict) -> str:
    """The measured section of the model card."""
    md = r["model"]
    tr = r.get("training") or {}
    meta = md["metadata"]
    depth = r["acceptance_n_max_4_by_depth"]
    lines = [
        CARD_BEGIN,
        "",
        "## Architecture",
        "",
        "| | |",
        "| --- | --- |",
        f"| llama.cpp architecture | `qwen35` ({int(meta['qwen35.block_count']) - 1} trunk layers + "
        f"{meta['qwen35.nextn_predict_layers']} NextN/MTP block) |",
        f"| layers | {layer_pattern(meta)} (`full_attention_interval` {meta['qwen35.full_attention_interval']}) |",
        f"| hidden size / FFN | {meta['qwen35.embedding_length']} / {meta['qwen35.feed_forward_length']} (SwiGLU) |",
        f"| attention | {meta['qwen35.attention.head_count']} query heads, "
        f"{meta['qwen35.attention.head_count_kv']} KV heads, "
        f"head dim {meta['qwen35.attention.key_length']}, output gate, QK RMS-norm, RoPE on "
        f"{meta['qwen35.rope.dimension_count']} dims (base {meta['qwen35.rope.freq_base']:g}) |",
        f"| gated delta net | {meta['qwen35.ssm.group_count']} key heads, "
        f"{meta['qwen35.ssm.time_step_rank']} value heads, "
        f"head dim {meta['qwen35.ssm.state_size']}, conv kernel {meta['qwen35.ssm.conv_kernel']} |",
        "| MTP block | `concat(enorm(embed(x_{t+1})), hnorm(h_t))` → `eh_proj` → one gated full-attention layer → "
        "`shared_head_norm` → tied LM head |",
        f"| vocabulary | {md['n_vocab']} byte-level BPE tokens (pre-tokenizer `{md['tokenizer_pre']}`), "
        "`<|endoftext|>` = EOS |",
        f"| parameters | {md['n_params']:,} (of which MTP block {md['n_params_mtp']:,}, "
        f"tied embedding {md['n_params_embedding']:,}) |",
        f"| file | `{md['file']}`, {md['file_bytes'] / 1e6:.1f} MB, {md['file_type']} |",
        "",
        "## Training",
        "",
    ]
    if tr:
        tc = tr.get("train_config") or {}
        lines += [
            f"- {tr.get('steps')} AdamW steps of {tc.get('batch_size')} × {tc.get('seq_len')} tokens "
            f"(lr {tc.get('lr')}, {tc.get('warmup_steps')} warm-up steps, cosine to {tc.get('min_lr_ratio')}×, "
            f"weight decay {tc.get('weight_decay')}, seed {tc.get('seed')}), loss = trunk CE + "
            f"{tc.get('mtp_loss_weight')} × MTP CE.",
            f"- Wall time {float(tr.get('wall_seconds', 0)) / 60:.0f} min on 2 shared CPU cores "
            f"(torch {tr.get('torch')}, torch threads: {tr.get('threads')}, bf16 autocast, "
            f"mean {tr.get('mean_tok_per_s')} tokens/s).",
            f"- Final training loss: trunk CE {tr.get('final_train_ce')}, MTP CE {tr.get('final_train_mtp_ce')} "
            "(nats/token, last logged batch). The full log is `training/logs/train.jsonl`.",
            "",
        ]
    hd = r.get("mtp_head") or {}
    if hd.get("steps"):
        hc = hd["config"]
        lines += [
            f"- MTP block fine-tuned for chained drafting (`python -m training.mtp_head`, trunk frozen): {hd['steps']} "
            f"AdamW steps of {hc['batch_size']} × {hc['seq_len']} tokens, draft depths 1..{hc['depth']} chained as "
            f"llama.cpp chains them ({hc['chain_rows']} draft rounds per sequence at depths ≥ 2), loss per depth = "
            f"{hc['ce_weight']} × CE of the data + {hc['distill_weight']} × CE against the trunk's distribution "
            f"(lr {hc['lr']}, {hc['warmup_steps']} warm-up steps, cosine to {hc['min_lr_ratio']}×, seed {hc['seed']}).",
            f"- Wall time {float(hd['wall_seconds']) / 60:.0f} min on this machine's CPU (torch {hd.get('torch')}, "
            f"{hd.get('threads')} thread, mean {hd.get('mean_tok_per_s')} tokens/s). "
            "Log: `training/logs/mtp_head.jsonl`.",
            "",
        ]
    lines += [
        "## Measured quality",
        "",
        *render_comparison(r),
        "Measured on this GGUF through llama.cpp (llama-cpp-python 0.3.36), greedy decoding, "
        f"{r['n_prompts']} held-out prompts of {PROMPT_LINES} source lines, {r['n_new_tokens']} new tokens each:",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| MTP acceptance, `n_max=1` (accepted / drafted) | **{r['acceptance_n_max_1']:.3f}** "
        f"({r['n_max_1_drafted']} drafts; per-prompt mean {r['acceptance_n_max_1_prompt_mean']:.3f}, "
        f"min {r['acceptance_n_max_1_prompt_min']:.3f}) |",
        f"| MTP acceptance, `n_max=4` (accepted / drafted) | {r['acceptance_n_max_4']:.3f} |",
        "| acceptance by depth at `n_max=4`: P(drafts 1..d all accepted) | "
        + ", ".join(f"d{i + 1}: {d:.3f}" for i, d in enumerate(depth) if d is not None)
        + " |",
        "| acceptance by depth at `n_max=4`: P(draft d accepted \\| drafts 1..d-1 accepted) | "
        + ", ".join(
            f"d{i + 1}: {d:.3f}" for i, d in enumerate(r["acceptance_n_max_4_by_depth_conditional"]) if d is not None
        )
        + " |",
        f"| mean tokens accepted per draft round at `n_max=4` | {r['mean_accepted_per_round_n_max_4']:.3f} |",
        f"| held-out next-token cross-entropy (trunk) | {r['heldout_ce']:.4f} nats/token "
        f"(perplexity {r['heldout_ppl']:.2f}) |",
        f"| held-out MTP cross-entropy (token t+2 from h_t and x_{{t+1}}) | {r['heldout_mtp_ce']:.4f} nats/token |",
        f"| held-out teacher-forced MTP/trunk top-1 agreement | {r['heldout_mtp_top1_agreement']:.3f} |",
        f"| held-out tokens scored | {r['heldout_tokens_scored']:,} |",
        f"| greedy continuations whose last {LOOP_TAIL} tokens repeat with a period ≤ {LOOP_MAX_PERIOD} tokens | "
        f"{r['greedy_loop_fraction']:.2f} |",
    ]
    eng = r.get("engine") or {}
    if eng.get("acceptance_n_max_1") is not None:
        lines += [
            f"| same prompts through the project's engine (`mtp_explorer.Session`): acceptance `n_max=1` | "
            f"{eng['acceptance_n_max_1']:.3f} ({eng['n_max_1_drafted']} drafts) |",
            f"| engine: acceptance `n_max=4` / by depth | {eng['acceptance_n_max_4']:.3f} / "
            + ", ".join(f"d{i + 1}: {d:.3f}" for i, d in enumerate(eng["acceptance_n_max_4_by_depth"]) if d is not None)
            + " |",
        ]
    lines += [
        "",
        "Produced by `python -m training.evaluate` "
        f"(took {r['eval_seconds']:.0f} s). Acceptance is simulated exactly as llama.cpp's draft-mtp loop feeds the "
        "MTP context (`training/llama_ref.py`).",
        "",
        "Greedy decoding of a model this small often falls into repetition loops (see the loop row), and a loop is "
        "easy to draft, which raises the greedy acceptance; the teacher-forced agreement on real held-out code is the "
        "figure without that effect.",
        "",
        *render_demo_prompts(),
        f"## Sample completions (greedy, {SAMPLE_NEW} tokens, not selected for quality)",
        "",
    ]
    for s in r["samples"]:
        lines += [
            f"Prompt `{s['prompt'].splitlines()[0]}` … (acceptance at `n_max=3`: {s['acceptance_n_max_3']:.2f})",
            "",
            "```python",
            (s["prompt"] + s["completion"]).replace("```", "` ` `").rstrip(),
            "```",
            "",
        ]
    lines.append(CARD_END)
    return "\n".join(lines)


def render_demo_prompts(path: Path = DEFAULT_PROMPTS_FILE) -> list[str]:
    """The demo prompts' section (``mx.demo_prompts()``: the Explorer's, the CLI's and the notebooks' prompts)."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text(encoding="utf-8"))
    lines = [
        "## Demo prompts",
        "",
        f"`mx.demo_prompts()` (`prompts.json`, chosen by `python -m training.evaluate --write-prompts` with "
        f"`{doc['model']}`): {doc['rule']}. The first is the default of the Explorer, the CLI and the quickstart.",
        "",
        "| file (held out) | lines | accepted drafts per round at `n_max=4` |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{p['relpath']}` | {p['first']}–{p['last']} | {p['mean_accepted_per_round_n_max_4']:.2f} |"
        for p in doc["prompts"]
    ]
    return lines + [""]


def _row(label: str, before, after, fmt: str = "{:.3f}") -> str:
    show = lambda v: "–" if v is None else fmt.format(v)
    return f"| {label} | {show(before)} | **{show(after)}** |"


def render_comparison(r: dict) -> list[str]:
    """The before/after table (empty without a baseline)."""
    b = r.get("baseline")
    if not b:
        return []
    cb, ca = b["acceptance_n_max_4_by_depth_conditional"], r["acceptance_n_max_4_by_depth_conditional"]
    same = b.get("greedy_sha256") == r["greedy_sha256"]
    lines = [
        "### Before and after the MTP-head fine-tune",
        "",
        "Before: the file as it was before `python -m training.mtp_head` (commit bc26ce3; its numbers, measured by the "
        "same command, are `training/logs/evaluate-before-mtp-head.json`). After: this file. Same prompts.",
        "",
        "| metric | before | after |",
        "| --- | --- | --- |",
        *[
            _row(
                f"acceptance of draft {d + 1} given draft{'s 1..' if d > 1 else ' '}{d} accepted (`n_max=4`)"
                if d
                else "acceptance of draft 1 (`n_max=4`)",
                cb[d],
                ca[d],
            )
            for d in range(4)
        ],
        _row("acceptance at `n_max=1`", b["acceptance_n_max_1"], r["acceptance_n_max_1"]),
        *[
            _row(
                f"mean accepted drafts per round at `n_max={n}`",
                b.get(f"mean_accepted_per_round_n_max_{n}"),
                r[f"mean_accepted_per_round_n_max_{n}"],
            )
            for n in (2, 3, 4)
        ],
        _row("held-out MTP cross-entropy (nats/token, depth 1)", b["heldout_mtp_ce"], r["heldout_mtp_ce"], "{:.4f}"),
        _row(
            "held-out teacher-forced MTP/trunk top-1 agreement",
            b["heldout_mtp_top1_agreement"],
            r["heldout_mtp_top1_agreement"],
        ),
        _row("greedy continuations ending in a loop", b["greedy_loop_fraction"], r["greedy_loop_fraction"], "{:.2f}"),
        _row("held-out trunk cross-entropy (nats/token)", b["heldout_ce"], r["heldout_ce"], "{:.4f}"),
        f"| plain greedy continuations of the {r['n_prompts']} prompts | `{b.get('greedy_sha256', '')[:12]}` | "
        f"`{r['greedy_sha256'][:12]}` ({'token-identical' if same else 'DIFFERENT'}) |",
        "",
    ]
    return lines


def write_card(r: dict, card: Path = DEFAULT_CARD) -> Path:
    """Replace the measured section of the model card (the rest is kept)."""
    text = card.read_text(encoding="utf-8") if card.exists() else f"# Model card\n\n{CARD_BEGIN}\n{CARD_END}\n"
    pattern = re.compile(re.escape(CARD_BEGIN) + ".*?" + re.escape(CARD_END), re.S)
    new = render_measured(r)
    text = pattern.sub(lambda _: new, text) if pattern.search(text) else text.rstrip() + "\n\n" + new + "\n"
    card.write_text(text, encoding="utf-8")
    return card


def _log_path(value: str) -> Path | None:
    return None if value == "none" else Path(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--prompts", type=int, default=N_PROMPTS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--card", type=Path, default=DEFAULT_CARD)
    p.add_argument("--no-card", action="store_true", help="do not rewrite MODEL.md")
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="JSON",
        help="another file's evaluation (this command's --json), shown before/after in the card",
    )
    p.add_argument("--write-prompts", action="store_true", help="choose the demo prompts and write prompts.json")
    p.add_argument(
        "--train-log",
        type=_log_path,
        default=DEFAULT_LOG,
        help="the training log of --gguf's trunk, or 'none' (a file made otherwise, e.g. a "
        "training.trunk checkpoint's); default: the shipped model's",
    )
    p.add_argument(
        "--head-log",
        type=_log_path,
        default=HEAD_LOG,
        help="the training.mtp_head log of --gguf's MTP block, or 'none'; default: the shipped model's",
    )
    args = p.parse_args(argv)
    baseline = json.loads(args.baseline.read_text(encoding="utf-8")) if args.baseline else None
    r = evaluate(
        args.gguf,
        args.prompts,
        args.threads,
        baseline=baseline,
        write_prompts=args.write_prompts,
        train_log=args.train_log,
        head_log=args.head_log,
    )
    out = json.dumps(r, indent=2, default=str)
    print(out)
    if args.json:
        args.json.write_text(out + "\n", encoding="utf-8")
    if not args.no_card:
        write_card(r, args.card)
        print(f"updated {args.card}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
