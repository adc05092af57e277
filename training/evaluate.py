"""Measure the shipped demo model and write the numbers into ``mtp_explorer/models/MODEL.md``.

    python -m training.evaluate                      # prints JSON, rewrites MODEL.md
    python -m training.evaluate --no-card --json out.json

Everything is measured on the GGUF file through llama.cpp (llama-cpp-python's low-level API,
see ``training/llama_ref.py``), so no torch is needed:

* greedy MTP acceptance at ``n_max=1`` and acceptance by depth at ``n_max=4`` over 50
  held-out prompts (64 new tokens each), simulating llama.cpp's draft-mtp loop;
* held-out next-token cross-entropy of the trunk and of the MTP head (nats/token) over the
  whole held-out split in windows of 256 tokens, plus the teacher-forced agreement of the
  MTP's top-1 with the trunk's top-1;
* three greedy sample completions;
* when the project's engine is importable, the acceptance numbers once more through
  ``mtp_explorer.Session`` on the same prompts.
"""

from __future__ import annotations

import argparse
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

N_PROMPTS = 50
N_NEW = 64
PROMPT_LINES = 12
PROMPT_MAX_TOKENS = 192
WINDOW = 256
SAMPLE_PROMPTS = (
    "import sys\n\n\ndef main(args=None):\n    if args is None:\n        args = sys.argv[1:]\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def __eq__(self, other):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
)
SAMPLE_NEW = 64
LOOP_TAIL = 32
LOOP_MAX_PERIOD = 16


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


def acceptance(m: LlamaMTP, prompts: list[str], n_max: int) -> tuple[SpecStats, list[float], float]:
    """Draft statistics, per-prompt acceptance, and the fraction of continuations ending in a loop."""
    total = SpecStats(n_max=n_max, by_depth_drafted=[0] * n_max, by_depth_tried=[0] * n_max,
                      by_depth_accepted=[0] * n_max)
    per_prompt = []
    loops = 0
    for text in prompts:
        ids = m.tokenize(text)[-PROMPT_MAX_TOKENS:]
        gen, st = m.speculative_greedy(ids, N_NEW, n_max)
        total.merge(st)
        per_prompt.append(st.acceptance)
        loops += ends_in_loop(gen)
    return total, per_prompt, loops / len(prompts)


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
                out[f"acceptance_n_max_{n_max}_by_depth"] = [round(o / r, 4) if r else None for o, r in zip(ok, reached)]
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


def gguf_summary(path: Path) -> dict[str, object]:
    """Architecture numbers and parameter counts read from the GGUF."""
    import gguf

    r = gguf.GGUFReader(str(path))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.") and not k.startswith("tokenizer.ggml.")}
    n_params = sum(int(np.prod(t.shape)) for t in r.tensors)
    nl = int(f["qwen35.block_count"]) - int(f["qwen35.nextn_predict_layers"])
    mtp_params = sum(int(np.prod(t.shape)) for t in r.tensors if t.name.startswith(f"blk.{nl}."))
    return {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "file_type": "F16 (matrices), F32 (norms, SSM vectors, conv)" if int(f.get("general.file_type", 0)) == 1 else "F32",
        "n_params": n_params,
        "n_params_mtp": mtp_params,
        "n_params_embedding": int(np.prod([t for t in r.tensors if t.name == "token_embd.weight"][0].shape)),
        "n_vocab": len(r.fields["tokenizer.ggml.tokens"].data),
        "tokenizer_pre": r.fields["tokenizer.ggml.pre"].contents(),
        "metadata": {k: v for k, v in f.items() if k.startswith("qwen35.")},
        "training_steps": f.get("mtp_explorer.training_steps"),
        "training_seconds": f.get("mtp_explorer.training_seconds"),
    }


def evaluate(gguf_path: Path, n_prompts: int = N_PROMPTS, threads: int = 2) -> dict[str, object]:
    """All the numbers of the model card, as a JSON-able dict."""
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
        s1, per1, loop_fraction = acceptance(m, prompts, 1)
        s4, _, _ = acceptance(m, prompts, 4)
        losses = heldout_losses(m, held_tokens)
        samples = []
        for p in SAMPLE_PROMPTS:
            gen = m.greedy(m.tokenize(p), SAMPLE_NEW)
            _, st = m.speculative_greedy(m.tokenize(p), SAMPLE_NEW, 3)
            samples.append({"prompt": p, "completion": m.detokenize(gen), "acceptance_n_max_3": round(st.acceptance, 3)})
    try:
        engine = engine_acceptance(gguf_path, prompt_ids, threads)
    except Exception as exc:  # noqa: BLE001 - report, do not fail the evaluation
        engine = {"error": repr(exc)}
    return {
        "model": gguf_summary(gguf_path),
        "corpus": describe(files),
        "training": training_summary(DEFAULT_LOG),
        "acceptance_n_max_1": round(s1.acceptance, 4),
        "acceptance_n_max_1_prompt_mean": round(float(np.mean(per1)), 4),
        "acceptance_n_max_1_prompt_min": round(float(np.min(per1)), 4),
        "n_max_1_drafted": s1.drafted,
        "greedy_loop_fraction": round(loop_fraction, 4),
        "acceptance_n_max_4": round(s4.acceptance, 4),
        "acceptance_n_max_4_by_depth": [None if v is None else round(v, 4) for v in s4.cumulative_by_depth()],
        "acceptance_n_max_4_by_depth_conditional": [None if v is None else round(v, 4) for v in s4.conditional_by_depth()],
        "acceptance_n_max_4_by_depth_counts": {"drafted": s4.by_depth_drafted, "reached": s4.by_depth_tried,
                                               "accepted": s4.by_depth_accepted},
        "mean_accepted_per_round_n_max_4": round(s4.accepted / s4.drafts, 4) if s4.drafts else 0.0,
        "n_prompts": n_prompts,
        "n_new_tokens": N_NEW,
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in losses.items()},
        "samples": samples,
        "engine": engine,
        "eval_seconds": round(time.time() - t0, 1),
    }


CARD_BEGIN = "<!-- BEGIN MEASURED (written by python -m training.evaluate) -->"
CARD_END = "<!-- END MEASURED -->"


def render_measured(r: dict) -> str:
    """The measured section of the model card."""
    md = r["model"]
    tr = r.get("training", {})
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
        f"| layers | gated delta net, gated delta net, gated delta net, gated full attention "
        f"(`full_attention_interval` {meta['qwen35.full_attention_interval']}) |",
        f"| hidden size / FFN | {meta['qwen35.embedding_length']} / {meta['qwen35.feed_forward_length']} (SwiGLU) |",
        f"| attention | {meta['qwen35.attention.head_count']} query heads, {meta['qwen35.attention.head_count_kv']} KV heads, "
        f"head dim {meta['qwen35.attention.key_length']}, output gate, QK RMS-norm, RoPE on "
        f"{meta['qwen35.rope.dimension_count']} dims (base {meta['qwen35.rope.freq_base']:g}) |",
        f"| gated delta net | {meta['qwen35.ssm.group_count']} key heads, {meta['qwen35.ssm.time_step_rank']} value heads, "
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
    lines += [
        "## Measured quality",
        "",
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
        + ", ".join(f"d{i + 1}: {d:.3f}" for i, d in enumerate(depth) if d is not None) + " |",
        "| acceptance by depth at `n_max=4`: P(draft d accepted \\| drafts 1..d-1 accepted) | "
        + ", ".join(f"d{i + 1}: {d:.3f}" for i, d in enumerate(r["acceptance_n_max_4_by_depth_conditional"])
                    if d is not None) + " |",
        f"| mean tokens accepted per draft round at `n_max=4` | {r['mean_accepted_per_round_n_max_4']:.3f} |",
        f"| held-out next-token cross-entropy (trunk) | {r['heldout_ce']:.4f} nats/token (perplexity {r['heldout_ppl']:.2f}) |",
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
        "Greedy decoding of a model this small often falls into repetition loops (see the loop row), and a loop is easy to "
        "draft, which raises the greedy acceptance; the teacher-forced agreement on real held-out code is the "
        "figure without that effect.",
        "",
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


def write_card(r: dict, card: Path = DEFAULT_CARD) -> Path:
    """Replace the measured section of the model card (the rest is kept)."""
    text = card.read_text(encoding="utf-8") if card.exists() else f"# Model card\n\n{CARD_BEGIN}\n{CARD_END}\n"
    pattern = re.compile(re.escape(CARD_BEGIN) + ".*?" + re.escape(CARD_END), re.S)
    new = render_measured(r)
    text = pattern.sub(lambda _: new, text) if pattern.search(text) else text.rstrip() + "\n\n" + new + "\n"
    card.write_text(text, encoding="utf-8")
    return card


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--prompts", type=int, default=N_PROMPTS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--card", type=Path, default=DEFAULT_CARD)
    p.add_argument("--no-card", action="store_true", help="do not rewrite MODEL.md")
    args = p.parse_args(argv)
    r = evaluate(args.gguf, args.prompts, args.threads)
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
