"""Fine-tune the MTP block of the shipped demo model for chained drafting; the trunk stays as it is.

    python -m training.mtp_head --max-minutes 40            # train (resumes from <out>/last.pt), then write the GGUF
    python -m training.mtp_head --install                   # ... and replace the shipped file with it
    python -m training.mtp_head --export-only --install     # write the GGUF of the last checkpoint, no training
    python -m training.mtp_head --steps 4 --out /tmp/smoke  # a smoke run

Starting point: the ``nextn`` block of ``mtp_explorer/models/pystdlib-qwen35-mtp.gguf`` (through the
PyTorch twin, :func:`training.export.model_from_gguf`), trained on the training split of
:mod:`training.corpus` with the file's own tokenizer.  Only the MTP block's parameters are trained; the
trunk, the embedding and the LM head it shares are frozen.

**Chained.**  At draft depth 1 the head reads the trunk's hidden state; at depth ``d >= 2`` llama.cpp's
draft-mtp loop feeds it its own depth ``d - 1`` output state (``h_nextn`` of the MTP context), at the
next position, with the real rows of the round and the earlier draft rows in its KV cache.
:meth:`training.model.DemoModel.mtp_chain` computes exactly that (``tests/test_model_parity.py``
checks it against llama.cpp), and every depth ``1..depth`` is trained.

**Loss** per depth: ``ce_weight`` x the cross-entropy of the data's next token, plus
``distill_weight`` x the cross-entropy against the trunk's own next-token distribution at the same
position (greedy acceptance is agreement with the trunk's top token), averaged over the depths.

**Its own text.**  With ``--continuations`` (the trunk's own greedy continuations, written by
``python -m training.trunk --make-continuations``), each step also trains on ``continuation_batch`` of them,
weighted ``continuation_weight``: greedy acceptance is measured on such text, whose statistics (repeats, the
trunk's habits) the corpus windows do not have.  The last ``continuation_heldout`` rows are never trained on;
the evaluation reports the agreement on them beside the corpus's.

**Budget.**  ``--max-minutes`` is a hard wall-clock budget: the run stops, checkpoints, and writes
the GGUF of what it has.  Checkpoints (``<out>/last.pt``: the MTP block, the optimiser, the step)
live outside the work tree (default ``$MTP_EXPLORER_TRAIN_DIR`` or ``~/.cache/mtp-explorer/mtp-head``)
and a new run resumes from them.  SIGTERM/SIGINT stop it the same way.

**Output.**  :func:`write_head` copies the source GGUF and overwrites the data of the ``nextn`` tensors
in place (same names, shapes and types), so every other byte of the file, metadata included, is the
source's (``tests/test_mtp_head.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from training.corpus import load_corpus, split_corpus
from training.export import DEFAULT_OUT as SHIPPED
from training.export import convert_state_dict, model_from_gguf
from training.jsonlog import JsonLog
from training.model import DemoModel
from training.train import batch_at, heldout_batches, lr_at  # they read HeadConfig's fields of the same names

DEFAULT_DIR = Path(os.environ.get("MTP_EXPLORER_TRAIN_DIR") or Path.home() / ".cache" / "mtp-explorer") / "mtp-head"
LOG = Path(__file__).resolve().parent / "logs" / "mtp_head.jsonl"


@dataclass
class HeadConfig:
    """Optimisation settings of the MTP-head fine-tune."""

    seed: int = 4321
    steps: int = 1500
    batch_size: int = 16
    seq_len: int = 256
    depth: int = 4  #: chained draft depths trained (1..depth)
    chain_rows: int = 64  #: draft rounds per sequence trained at depths >= 2, drawn per step
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ce_weight: float = 0.25  #: cross-entropy of the data's next token
    distill_weight: float = 1.0  #: cross-entropy against the trunk's next-token distribution
    eval_every: int = 100
    eval_batches: int = 4
    log_every: int = 10
    checkpoint_minutes: float = 5.0
    continuation_batch: int = 8  #: the trunk's own continuations per step, where --continuations are given
    continuation_weight: float = 1.0  #: their loss's weight against the corpus batch's (1.0)
    continuation_heldout: int = 32  #: the last rows of --continuations, kept for the evaluation


def chain_starts(step: int, cfg: HeadConfig, length: int | None = None) -> torch.Tensor:
    """The draft rounds of ``step`` trained at depths >= 2: ``chain_rows`` distinct starts in ``1..T-depth-1``
    (``T``: ``length``, default ``seq_len``)."""
    rng = np.random.default_rng([cfg.seed, step, 1])
    pool = np.arange(1, (cfg.seq_len if length is None else length) - cfg.depth)
    return torch.from_numpy(np.sort(rng.choice(pool, size=min(cfg.chain_rows, len(pool)), replace=False)))


def depth_terms(
    model: DemoModel, x: torch.Tensor, depth: int, starts: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per draft depth 1..``depth``: (CE of the data's token, CE against the trunk's distribution, top-1
    agreement with the trunk; :meth:`DemoModel.mtp_terms`).  The trunk runs without gradients."""
    with torch.no_grad():
        h = model.trunk_hidden(x)
        teacher = model.logits(h)
    return model.mtp_terms(x, h, teacher, depth, starts)


def batch_loss(
    model: DemoModel, x: torch.Tensor, step: int, cfg: HeadConfig
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Step ``step``'s loss on the batch ``x`` (see the module docstring), with its CE and agreement per depth."""
    ce, soft, agree = depth_terms(model, x, cfg.depth, chain_starts(step, cfg, x.shape[1]))
    loss = sum(cfg.ce_weight * c + cfg.distill_weight * s for c, s in zip(ce, soft)) / cfg.depth
    return loss, ce, agree


@torch.no_grad()
def evaluate(model: DemoModel, batches: list[torch.Tensor], depth: int) -> dict[str, list[float]]:
    """Held-out MTP CE and teacher-forced top-1 agreement with the trunk, per draft depth (agreement at
    depth d is the proxy of acceptance given that drafts 1..d-1 were accepted)."""
    ce = np.zeros(depth)
    agree = np.zeros(depth)
    for x in batches:
        c, _, a = depth_terms(model, x, depth)
        ce += [float(v) for v in c]
        agree += [float(v) for v in a]
    n = len(batches)
    return {"mtp_ce_by_depth": [round(v / n, 4) for v in ce], "agreement_by_depth": [round(v / n, 4) for v in agree]}


def continuation_split(rows: np.ndarray, cfg: HeadConfig) -> tuple[np.ndarray, np.ndarray]:
    """(trained, held-out) rows of the trunk's continuations: the last ``continuation_heldout`` are held out."""
    if len(rows) <= cfg.continuation_heldout:
        raise ValueError(f"{len(rows)} continuations: more than continuation_heldout={cfg.continuation_heldout} needed")
    return rows[: -cfg.continuation_heldout], rows[-cfg.continuation_heldout :]


def continuations_at(rows: np.ndarray, step: int, cfg: HeadConfig) -> torch.Tensor:
    """Step ``step``'s continuations (``continuation_batch`` rows, drawn from ``default_rng([seed, step, 3])``)."""
    rng = np.random.default_rng([cfg.seed, step, 3])
    return torch.from_numpy(rows[rng.integers(0, len(rows), size=cfg.continuation_batch)].astype(np.int64))


def corpus_tokens(gguf: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) token streams of the corpus with the GGUF's own tokenizer, cached in ``out``."""
    cache = out / "tokens.npz"
    if cache.exists():
        z = np.load(cache)
        return z["train"], z["heldout"]
    from training.tokenizer import encode_files, tokenizer_from_vocab, vocab_from_gguf

    tok = tokenizer_from_vocab(vocab_from_gguf(gguf))
    train, held = split_corpus(load_corpus())
    arrays = {
        "train": np.asarray(encode_files(tok, [f.text for f in train]), dtype=np.int32),
        "heldout": np.asarray(encode_files(tok, [f.text for f in held]), dtype=np.int32),
    }
    out.mkdir(parents=True, exist_ok=True)
    np.savez(cache.with_suffix(".tmp.npz"), **arrays)
    os.replace(cache.with_suffix(".tmp.npz"), cache)
    return arrays["train"], arrays["heldout"]


def nextn_prefix(model: DemoModel) -> str:
    """GGUF name prefix of the MTP block's tensors (``blk.<n_layer>.``: llama.cpp's nextn layer)."""
    return f"blk.{model.cfg.num_hidden_layers}."


def write_head(model: DemoModel, src: Path, dst: Path) -> list[str]:
    """Copy ``src`` to ``dst`` with the ``nextn`` tensors' data replaced by ``model``'s MTP block.

    Names, shapes and types stay the source's, so every other byte of the file is unchanged.  Returns
    the names of the tensors written.  ``dst`` may be ``src`` (written beside it, then replaced)."""
    import gguf

    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    tensors = convert_state_dict(sd, model.cfg)
    prefix = nextn_prefix(model)
    patches: list[tuple[int, bytes]] = []
    names: list[str] = []
    reader = gguf.GGUFReader(str(src))
    for t in reader.tensors:
        if not t.name.startswith(prefix):
            continue
        new = tensors[t.name]
        dtype = {"F16": np.float16, "F32": np.float32}.get(t.tensor_type.name)
        if dtype is None:
            raise ValueError(f"{src}: {t.name} is {t.tensor_type.name}; only F16/F32 heads can be written")
        new = np.ascontiguousarray(new.astype(dtype))
        if new.shape != t.data.shape or new.nbytes != t.n_bytes:
            raise ValueError(f"{t.name}: shape {new.shape} does not fit the file's {t.data.shape}")
        patches.append((int(t.data_offset), new.tobytes()))
        names.append(t.name)
    del reader
    if not patches:
        raise ValueError(f"{src} has no tensors named {prefix}*: no MTP block")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "r+b") as f:
        for offset, data in patches:
            f.seek(offset)
            f.write(data)
    os.replace(tmp, dst)
    return names


def save_checkpoint(
    path: Path,
    model: DemoModel,
    opt: torch.optim.Optimizer,
    step: int,
    cfg: HeadConfig,
    elapsed: float,
    source_sha: str,
) -> None:
    """Atomically write the MTP block, the optimiser state and the progress."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "mtp": model.mtp.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "config": asdict(cfg),
            "elapsed_seconds": elapsed,
            "source_sha256": source_sha,
        },
        tmp,
    )
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Stop:
    """Set by SIGTERM/SIGINT: the loop checkpoints and ends at the next step."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:  # pragma: no cover - signal handler
        self.requested = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=SHIPPED, help="the model whose MTP block is trained (its start)")
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="checkpoints, token cache and the written GGUF")
    p.add_argument("--max-minutes", type=float, default=None, help="hard wall-clock budget of this run")
    p.add_argument("--steps", type=int, default=None, help=f"total optimiser steps (default {HeadConfig.steps})")
    p.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {HeadConfig.lr:g})")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    p.add_argument("--export-only", action="store_true", help="write the GGUF of the last checkpoint, no training")
    p.add_argument("--install", action="store_true", help="replace --gguf with the written file at the end")
    p.add_argument("--log", type=Path, default=LOG, help="JSON lines log (appended)")
    p.add_argument(
        "--continuations",
        type=Path,
        default=None,
        help="the trunk's own greedy continuations (training.trunk --make-continuations): trained on beside the corpus",
    )
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # the gated delta rule's decays give denormals, ~100x slower on x86
    t_start = time.time()
    stop = _Stop()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ck_path = out / "last.pt"
    log = JsonLog(args.log)

    cfg = HeadConfig()
    source_sha = file_sha256(args.gguf)
    model = model_from_gguf(args.gguf)
    for prm in model.trunk.parameters():
        prm.requires_grad_(False)
    opt = torch.optim.AdamW(
        model.mtp.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=cfg.weight_decay
    )
    step, elapsed_before = 0, 0.0
    if ck_path.exists() and not args.fresh:
        ck = torch.load(ck_path, map_location="cpu", weights_only=False)
        if ck["source_sha256"] != source_sha:
            print(f"{ck_path} was trained from another file than {args.gguf}; use --fresh", file=sys.stderr)
            return 2
        cfg = HeadConfig(**ck["config"])
        model.mtp.load_state_dict(ck["mtp"])
        opt.load_state_dict(ck["optimizer"])
        step, elapsed_before = ck["step"], ck["elapsed_seconds"]
        log({"event": "resumed", "step": step, "elapsed_seconds": round(elapsed_before, 1)})
    elif args.export_only:
        print(f"no checkpoint at {ck_path}", file=sys.stderr)
        return 2
    if args.steps is not None:
        cfg.steps = args.steps
    if args.lr is not None:
        cfg.lr = args.lr

    if not args.export_only and step < cfg.steps:
        train_tokens, held_tokens = corpus_tokens(args.gguf, out)
        held = heldout_batches(held_tokens, cfg)
        cont, cont_held = None, []
        if args.continuations is not None:
            cont, held_rows = continuation_split(np.load(args.continuations)["rows"], cfg)
            cont_held = [torch.from_numpy(held_rows.astype(np.int64))]

        def evaluation() -> dict:
            result = evaluate(model.eval(), held, cfg.depth)
            if cont_held:
                result["continuation_agreement_by_depth"] = evaluate(model, cont_held, cfg.depth)["agreement_by_depth"]
            return result

        if step == 0:
            log(
                {
                    "event": "start",
                    "config": asdict(cfg),
                    "source": str(args.gguf),
                    "source_sha256": source_sha,
                    "train_tokens": int(len(train_tokens)),
                    "heldout_tokens": int(len(held_tokens)),
                    "mtp_params": sum(x.numel() for x in model.mtp.parameters()),
                    "threads": args.threads,
                    "torch": torch.__version__,
                    "continuations": None if cont is None else {"path": str(args.continuations), "rows": len(cont)},
                    "eval": evaluation(),
                }
            )
        model.train()
        t_loop, t_ck, t_log, tokens_since = time.time(), time.time(), time.time(), 0
        while step < cfg.steps:
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            x = batch_at(train_tokens, step, cfg)
            loss, ce, agree = batch_loss(model, x, step, cfg)
            if cont is not None:
                loss_c, _, _ = batch_loss(model, continuations_at(cont, step, cfg), step, cfg)
                loss = (loss + cfg.continuation_weight * loss_c) / (1 + cfg.continuation_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.mtp.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            tokens_since += x.numel()
            now = time.time()
            if step % cfg.log_every == 0 or step == cfg.steps:
                log(
                    {
                        "step": step,
                        "loss": round(loss.item(), 4),
                        "mtp_ce": [round(c.item(), 4) for c in ce],
                        "agreement": [round(a.item(), 4) for a in agree],
                        "lr": round(lr, 7),
                        "grad_norm": round(float(gnorm), 3),
                        "tok_per_s": round(tokens_since / max(1e-9, now - t_log)),
                        "elapsed_seconds": round(elapsed_before + now - t_loop, 1),
                    }
                )
                t_log, tokens_since = now, 0
            if step % cfg.eval_every == 0 or step == cfg.steps:
                log({"step": step, "eval": evaluation()})
                model.train()
            out_of_time = args.max_minutes is not None and (time.time() - t_start) / 60 >= args.max_minutes
            if step >= cfg.steps or out_of_time or stop.requested or (now - t_ck) / 60 >= cfg.checkpoint_minutes:
                save_checkpoint(ck_path, model, opt, step, cfg, elapsed_before + time.time() - t_loop, source_sha)
                t_ck = time.time()
            if out_of_time or stop.requested:
                log({"event": "paused", "step": step, "reason": "max-minutes" if out_of_time else "signal"})
                break
        else:
            log({"event": "finished", "step": step, "elapsed_seconds": round(elapsed_before + time.time() - t_loop, 1)})
    written = write_head(model.eval(), args.gguf, out / args.gguf.name)
    log({"event": "written", "path": str(out / args.gguf.name), "step": step, "tensors": len(written)})
    if args.install:
        shutil.copyfile(out / args.gguf.name, args.gguf)
        log({"event": "installed", "path": str(args.gguf)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
