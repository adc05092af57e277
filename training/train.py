"""Train the bundled demo model from scratch (trunk next-token loss + MTP loss, jointly).

    python -m training.train                       # full run, CPU, resumes if a checkpoint exists
    python -m training.train --max-minutes 30      # stop (with a checkpoint) after 30 minutes
    python -m training.train --resume              # insist on resuming
    python -m training.train --steps 40 --out /tmp/smoke   # a smoke run

Everything is deterministic given the seed: the tokenizer is trained on the training split,
the batch of step ``s`` is drawn from ``numpy.random.default_rng([seed, s])`` (so resuming
needs no data-loader state), and the model is initialised from ``torch.manual_seed(seed)``.
Checkpoints (``<out>/checkpoints/last.pt``, not committed) are written every
``--checkpoint-minutes`` and at the end; the log is appended to ``<out>/logs/train.jsonl``
(one JSON object per line, also printed to stdout; a run from scratch starts a new log).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from training.corpus import describe, load_corpus, split_corpus
from training.jsonlog import JsonLog
from training.model import DemoModel, ModelConfig
from training.tokenizer import TokenizerConfig, encode_files, load_tokenizer, save_tokenizer, train_tokenizer

DEFAULT_OUT = Path(__file__).resolve().parent


@dataclass
class TrainConfig:
    """Optimisation settings (the model architecture is :class:`ModelConfig`)."""

    seed: int = 1234
    steps: int = 2400
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    mtp_loss_weight: float = 1.0
    bf16_autocast: bool = True  #: bfloat16 autocast for matmuls (weights and optimiser stay F32)
    eval_every: int = 250
    eval_batches: int = 8
    log_every: int = 10
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr`` at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_at(tokens: np.ndarray, step: int, cfg: TrainConfig) -> torch.Tensor:
    """The training batch of ``step``: random windows of ``seq_len`` tokens."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(tokens) - cfg.seq_len, size=cfg.batch_size)
    return torch.from_numpy(np.stack([tokens[s : s + cfg.seq_len] for s in starts]).astype(np.int64))


def heldout_batches(tokens: np.ndarray, cfg: TrainConfig) -> list[torch.Tensor]:
    """Fixed, evenly spaced held-out windows for periodic evaluation."""
    n = cfg.eval_batches * cfg.batch_size
    stride = max(1, (len(tokens) - cfg.seq_len) // n)
    rows = [tokens[i * stride : i * stride + cfg.seq_len] for i in range(n)]
    arr = torch.from_numpy(np.stack(rows).astype(np.int64))
    return list(arr.split(cfg.batch_size))


@torch.no_grad()
def evaluate_windows(model: DemoModel, batches: list[torch.Tensor], device: torch.device) -> dict[str, float]:
    """Held-out trunk CE, MTP CE, and the teacher-forced agreement of MTP top-1 with trunk top-1."""
    model.eval()
    ce_t = ce_m = agree = 0.0
    n = 0
    for x in batches:
        x = x.to(device)
        tl, ml = model(x)
        tgt = x[:, 1:]
        v = tl.shape[-1]
        ce_t += torch.nn.functional.cross_entropy(tl[:, :-1].reshape(-1, v).float(), tgt.reshape(-1)).item()
        ce_m += torch.nn.functional.cross_entropy(ml[:, 1:-1].reshape(-1, v).float(), tgt[:, 1:].reshape(-1)).item()
        agree += (ml[:, 1:].argmax(-1) == tl[:, 1:].argmax(-1)).float().mean().item()
        n += 1
    model.train()
    return {"heldout_ce": ce_t / n, "heldout_mtp_ce": ce_m / n, "heldout_mtp_agreement": agree / n}


def prepare_data(out: Path, cfg: TrainConfig, log) -> tuple[np.ndarray, np.ndarray, dict]:
    """Tokenizer (trained once, then reused from ``<out>/checkpoints``) and token streams."""
    files = load_corpus()
    info = describe(files)
    train_files, held_files = split_corpus(files)
    tok_path = out / "checkpoints" / "tokenizer.json"
    if tok_path.exists():
        tok = load_tokenizer(tok_path)
    else:
        t0 = time.time()
        tok = train_tokenizer((f.text for f in train_files), cfg.tokenizer)
        save_tokenizer(tok, tok_path)
        log({"event": "tokenizer_trained", "seconds": round(time.time() - t0, 1), "vocab": tok.get_vocab_size()})
    train_tokens = np.asarray(encode_files(tok, [f.text for f in train_files]), dtype=np.int32)
    held_tokens = np.asarray(encode_files(tok, [f.text for f in held_files]), dtype=np.int32)
    info.update({"train_tokens": int(len(train_tokens)), "heldout_tokens": int(len(held_tokens))})
    return train_tokens, held_tokens, info


def save_checkpoint(
    path: Path,
    model: DemoModel,
    opt: torch.optim.Optimizer,
    step: int,
    cfg: TrainConfig,
    elapsed: float,
    corpus: dict | None = None,
) -> None:
    """Atomically write model + optimiser state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": opt.state_dict(),
            "step": step,
            "train_config": asdict(cfg),
            "model_config": cfg.model.to_dict(),
            "elapsed_seconds": elapsed,
            "corpus": corpus,
        },
        tmp,
    )
    os.replace(tmp, path)


def load_model(checkpoint: str | Path, device: str = "cpu") -> tuple[DemoModel, dict]:
    """Rebuild the model from a checkpoint; returns (model in eval mode, checkpoint dict)."""
    ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
    mc = dict(ck["model_config"])
    model = DemoModel(ModelConfig(**mc))
    model.load_state_dict(ck["model"])
    model.to(device).eval()
    return model, ck


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory holding checkpoints/ and logs/")
    p.add_argument("--resume", action="store_true", help="fail unless a checkpoint exists to resume from")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint and start over")
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time (checkpointed)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1 is fastest for this small model on a shared 2-core machine: "
        "the many small ops pay OpenMP barriers that stall when another process holds a core)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--steps", type=int, default=None, help="override the number of optimiser steps")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    # The gated delta rule's exp(cumulative decay) produces fp32 denormals; computing with them is
    # ~100x slower on x86 CPUs.  Flushing them to zero changes nothing measurable.
    torch.set_flush_denormal(True)
    device = torch.device(args.device)
    out: Path = args.out
    ck_path = out / "checkpoints" / "last.pt"
    (out / "logs").mkdir(parents=True, exist_ok=True)

    cfg = TrainConfig()
    if args.steps is not None:
        cfg.steps = args.steps
    resume = ck_path.exists() and not args.fresh
    if args.resume and not resume:
        print(f"no checkpoint at {ck_path}", file=sys.stderr)
        return 2
    if args.fresh and ck_path.exists():
        ck_path.unlink()
        (out / "checkpoints" / "tokenizer.json").unlink(missing_ok=True)
    # A new run starts a new log; a resumed run appends to it.
    log = JsonLog(out / "logs" / "train.jsonl", append=resume)

    train_tokens, held_tokens, info = prepare_data(out, cfg, log)
    torch.manual_seed(cfg.seed)
    model = DemoModel(cfg.model).to(device)
    decay = [p_ for n, p_ in model.named_parameters() if p_.ndim >= 2]
    no_decay = [p_ for n, p_ in model.named_parameters() if p_.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
    )
    step = 0
    elapsed_before = 0.0
    if resume:
        ck = torch.load(ck_path, map_location="cpu", weights_only=False)
        if ck["model_config"] != cfg.model.to_dict():
            print("checkpoint has a different model config; use --fresh", file=sys.stderr)
            return 2
        cfg.steps = ck["train_config"]["steps"] if args.steps is None else cfg.steps
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step = ck["step"]
        elapsed_before = ck["elapsed_seconds"]
        if step >= cfg.steps:
            print(f"{ck_path} is already trained for {step} steps; use --fresh to start over", file=sys.stderr)
            return 0
        log({"event": "resumed", "step": step, "elapsed_seconds": round(elapsed_before, 1)})
    else:
        log(
            {
                "event": "start",
                "train_config": asdict(cfg),
                "corpus": info,
                "params": model.n_params(),
                "torch": torch.__version__,
                "threads": args.threads,
                "device": str(device),
            }
        )

    held = heldout_batches(held_tokens, cfg)
    t_start = time.time()
    t_ck = t_start
    t_log = t_start
    tokens_since = 0
    model.train()
    while step < cfg.steps:
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(train_tokens, step, cfg).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            ce_t, (ce_m,), _ = model.losses(x)  # depth 1, CE against the data
        loss = ce_t + cfg.mtp_loss_weight * ce_m
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        tokens_since += x.numel()
        now = time.time()
        if step % cfg.log_every == 0 or step == cfg.steps:
            log(
                {
                    "step": step,
                    "ce": round(ce_t.item(), 4),
                    "mtp_ce": round(ce_m.item(), 4),
                    "lr": round(lr, 6),
                    "grad_norm": round(float(gnorm), 3),
                    "tok_per_s": round(tokens_since / max(1e-9, now - t_log)),
                    "elapsed_seconds": round(elapsed_before + now - t_start, 1),
                }
            )
            t_log = now
            tokens_since = 0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            log({"step": step, "eval": evaluate_windows(model, held, device)})
        done = step >= cfg.steps
        out_of_time = args.max_minutes is not None and (now - t_start) / 60 >= args.max_minutes
        if done or out_of_time or (now - t_ck) / 60 >= args.checkpoint_minutes:
            save_checkpoint(ck_path, model, opt, step, cfg, elapsed_before + time.time() - t_start, info)
            t_ck = time.time()
            if out_of_time and not done:
                log({"event": "paused", "step": step, "reason": "max-minutes"})
                return 0
    log({"event": "finished", "step": step, "elapsed_seconds": round(elapsed_before + time.time() - t_start, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
