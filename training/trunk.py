"""Demo model, step 2: train a deeper trunk in stretches that each end in a committed checkpoint.

    python -m training.trunk --prepare                       # tokens of the corpus -> ~/.cache/mtp-explorer/trunk-v2
    python -m training.trunk --max-minutes 40                # one stretch on the CPU (resumes from the checkpoint)
    python -m training.trunk --device cuda --max-minutes 8   # the same on a GPU

The first stretch grows the shipped 4-layer model to ``--layers`` layers (:mod:`training.grow`: the grown
model starts exactly where the shipped one is); every later stretch resumes from the weights-only F16
checkpoint ``training/checkpoints/trunk-v2.safetensors`` with a short learning-rate warm-up (the
optimiser's moments start again from zero).  A stretch plans its steps from its time budget (it times its
first steps), runs a warm-up and a cosine decay over them, evaluates on the held-out files, and writes the
checkpoint every few minutes and at the end.  The log ``training/logs/trunk-v2.jsonl`` is appended to.

Loss per step (nats/token): the trunk's next-token CE, plus ``mtp_weight`` times step 1's chained MTP
objective at depths 1..``depth`` (``training.mtp_head``: 0.25 x CE of the data + 1.0 x CE against the
trunk's distribution, averaged over depths), plus ``ul_weight`` times an unlikelihood term against loops:
where the last ``ul_ngram`` tokens occurred earlier in the window and the token that followed them then is
not the next token now, ``-log(1 - p(that token))``.  With ``--continuations`` (the model's own greedy
continuations, written by ``--make-continuations``), plus ``ul_seq_weight`` times the sequence-level
unlikelihood of Welleck et al. (2019) on them: at every generated position whose last ``ul_ngram`` tokens
occurred earlier in the row and whose ``ul_seq_run`` positions before it all copied what followed theirs (a
loop: 21% of the generated positions of the averaged trunk, 0.5% of the corpus's), ``-log(1 - p(the token that
followed them then))``.  (Every repeated 4-gram instead, 52% of the generated positions, raised the held-out
CE from 2.59 to 2.87 in 50 steps: code repeats short n-grams.)

    python -m training.trunk --make-continuations /tmp/cont.npz      # 512 greedy continuations, llama.cpp
    python -m training.trunk --continuations /tmp/cont.npz --ul-seq-weight 1.0 --max-minutes 30

Corpus: the standard library (held-out files unchanged) plus the pinned numpy and pandas sources
(``training.corpus.PACKAGES``), deduplicated, tokenized with the shipped model's own tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from training.jsonlog import JsonLog
from training.model import DemoModel, ModelConfig

ROOT = Path(__file__).resolve().parent
CHECKPOINT = ROOT / "checkpoints" / "trunk-v2.safetensors"
LOG = ROOT / "logs" / "trunk-v2.jsonl"
DATA = (
    Path(os.environ.get("MTP_EXPLORER_TRAIN_DIR") or Path.home() / ".cache" / "mtp-explorer")
    / "trunk-v2"
    / "tokens.npz"
)
CORPUS_PACKAGES = ("numpy", "pandas")


@dataclass
class TrunkConfig:
    """Optimisation settings of one stretch."""

    seed: int = 2024
    layers: int = 12  #: trunk layers after growth
    batch_size: int = 32
    seq_len: int = 512
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100  #: the first stretch
    resume_warmup_steps: int = 30  #: a resumed stretch (fresh optimiser moments)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_weight: float = 0.5
    depth: int = 4
    chain_rows: int = 64
    ce_weight: float = 0.25
    distill_weight: float = 1.0
    ul_weight: float = 0.5
    ul_ngram: int = 4
    ul_seq_weight: float = 1.0  #: the sequence-level unlikelihood's weight, where --continuations are given
    ul_seq_batch: int = 8  #: continuations per step
    ul_seq_run: int = 16  #: the sequence-level term scores a position once this many before it copied (0: every one)
    dropout: float = 0.1  #: dropout on each trunk layer's MLP output while training (the corpus is small)
    eval_every: int = 200
    eval_batches: int = 8
    log_every: int = 20
    checkpoint_minutes: float = 2.0


# ---------------------------------------------------------------------------------------------- data


def prepare(path: Path = DATA) -> Path:
    """Tokenize the corpus with the shipped model's tokenizer: ``train`` (every training file),
    ``heldout_stdlib`` and ``heldout_packages`` as uint16 streams, and the corpus description."""
    from training.corpus import describe, load_corpus, split_corpus
    from training.export import DEFAULT_OUT as SHIPPED
    from training.tokenizer import encode_files, tokenizer_from_vocab, vocab_from_gguf

    tok = tokenizer_from_vocab(vocab_from_gguf(SHIPPED))
    files = load_corpus(packages=CORPUS_PACKAGES)
    train, held = split_corpus(files)
    held_pkg = [f for f in held if f.relpath.split("/", 1)[0] in CORPUS_PACKAGES]
    held_std = [f for f in held if f not in held_pkg]
    arrays = {
        name: np.asarray(encode_files(tok, [f.text for f in part]), dtype=np.uint16)
        for name, part in (("train", train), ("heldout_stdlib", held_std), ("heldout_packages", held_pkg))
    }
    info = describe(files, CORPUS_PACKAGES)
    info.update({f"{k}_tokens": int(len(v)) for k, v in arrays.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, corpus=np.array(json.dumps(info)), **arrays)
    os.replace(tmp, path)
    return path


def load_data(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The token streams (int64) and the corpus description written by :func:`prepare`."""
    z = np.load(path)
    return {k: z[k].astype(np.int64) for k in z.files if k != "corpus"}, json.loads(str(z["corpus"]))


def batch_at(tokens: np.ndarray, step: int, cfg: TrunkConfig) -> torch.Tensor:
    """Step ``step``'s batch: random windows, drawn from ``default_rng([seed, step])`` (no loader state)."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(tokens) - cfg.seq_len, size=cfg.batch_size)
    return torch.from_numpy(np.stack([tokens[s : s + cfg.seq_len] for s in starts]))


def heldout(tokens: np.ndarray, cfg: TrunkConfig) -> list[torch.Tensor]:
    """Fixed, evenly spaced held-out windows."""
    n = cfg.eval_batches * cfg.batch_size
    stride = max(1, (len(tokens) - cfg.seq_len) // n)
    rows = np.stack([tokens[i * stride : i * stride + cfg.seq_len] for i in range(n)])
    return list(torch.from_numpy(rows).split(cfg.batch_size))


def chain_starts(step: int, cfg: TrunkConfig) -> torch.Tensor:
    """The draft rounds trained at depths >= 2 in step ``step``."""
    rng = np.random.default_rng([cfg.seed, step, 1])
    pool = np.arange(1, cfg.seq_len - cfg.depth)
    return torch.from_numpy(np.sort(rng.choice(pool, size=min(cfg.chain_rows, len(pool)), replace=False)))


# ---------------------------------------------------------------------------------------------- losses


def repeat_candidates(x: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """For each position ``t`` of ``x`` (B, T): the token that followed the latest earlier occurrence of the
    n-gram ``x[t-n+1..t]`` in the same row, or -1 where there is none."""
    b, t = x.shape
    key = torch.zeros_like(x)
    for i in range(n):
        key = key * vocab + torch.roll(x, shifts=i, dims=1)
    pos = torch.arange(t, device=x.device).expand(b, t)
    row = torch.arange(b, device=x.device)[:, None].expand(b, t)
    key = key + row * vocab**n
    key = torch.where(pos >= n - 1, key, -1 - (row * t + pos))  # too early for an n-gram: unique keys
    flat = key.reshape(-1)
    sorted_key, order = torch.sort(flat, stable=True)  # equal keys stay in position order
    same = torch.zeros_like(flat, dtype=torch.bool)
    same[1:] = sorted_key[1:] == sorted_key[:-1]
    prev = torch.full_like(flat, -1)
    prev[1:] = torch.where(same[1:], order[:-1], -1)
    earlier = torch.full_like(flat, -1)
    earlier[order] = prev  # flat index of the latest earlier end of the same n-gram
    xf = x.reshape(-1)
    cand = torch.where(earlier >= 0, xf[(earlier + 1).clamp(max=xf.numel() - 1)], -1)
    return cand.view(b, t)


def unlikelihood(logits: torch.Tensor, x: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
    """Mean ``-log(1 - p(c))`` over the positions whose repeat candidate ``c`` is not the next token, and the
    share of positions that have one."""
    v = logits.shape[-1]
    cand = repeat_candidates(x, n, v)[:, :-1]
    wrong = (cand >= 0) & (cand != x[:, 1:])
    if not bool(wrong.any()):
        return logits.new_zeros(()), 0.0
    return _unlikely(logits, cand, wrong), float(wrong.float().mean())


def _unlikely(logits: torch.Tensor, cand: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Mean ``-log(1 - p(cand))`` over the positions ``where`` (of ``logits[:, :-1]``)."""
    lg = logits[:, :-1][where].float()
    logp = lg.gather(-1, cand[where][:, None]).squeeze(-1) - torch.logsumexp(lg, dim=-1)
    return -torch.log1p(-logp.exp().clamp(max=1 - 1e-6)).mean()


def sequence_unlikelihood(
    logits: torch.Tensor, x: torch.Tensor, n: int, start: int, run: int = 0
) -> tuple[torch.Tensor, float]:
    """Mean ``-log(1 - p(c))`` over the positions predicting a token of ``x[:, start:]`` (the generated part) whose
    repeat candidate ``c`` exists, copied or not, and the share of those positions that have one; ``run`` > 0: only
    where the ``run`` positions before it all copied theirs (inside a loop: code repeats short n-grams anyway)."""
    v = logits.shape[-1]
    cand = repeat_candidates(x, n, v)[:, :-1]
    generated = torch.arange(x.shape[1] - 1, device=x.device)[None] >= start - 1
    hit = (cand >= 0) & generated
    if run:
        copied = ((cand >= 0) & (cand == x[:, 1:])).float()
        hit &= F.pad(copied, (run, 0))[:, :-1].unfold(1, run, 1).amin(-1) > 0
    if not bool(hit.any()):
        return logits.new_zeros(()), 0.0
    return _unlikely(logits, cand, hit), float(hit.sum()) / float(generated.expand_as(hit).sum())


def losses(
    model: DemoModel,
    x: torch.Tensor,
    cfg: TrunkConfig,
    starts: torch.Tensor,
    cont: tuple[torch.Tensor, int] | None = None,
) -> dict[str, torch.Tensor]:
    """The step's loss terms (see the module docstring); ``cont``: a batch of the model's own continuations and
    where their generated part starts."""
    h = model.trunk_hidden(x)
    logits = model.logits(h)
    v = logits.shape[-1]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), x[:, 1:].reshape(-1))
    mtp_ce, soft, agree = model.mtp_terms(x, h, logits.detach(), cfg.depth, starts)
    mtp = sum(cfg.ce_weight * c + cfg.distill_weight * s for c, s in zip(mtp_ce, soft)) / cfg.depth
    ul, ul_share = unlikelihood(logits, x, cfg.ul_ngram) if cfg.ul_weight else (ce.new_zeros(()), 0.0)
    terms = {
        "ce": ce,
        "mtp": mtp,
        "ul": ul,
        "ul_share": torch.tensor(ul_share),
        "mtp_ce": torch.stack([c.detach() for c in mtp_ce]),
        "agreement": torch.stack(agree),
    }
    loss = ce + cfg.mtp_weight * mtp + cfg.ul_weight * ul
    if cont is not None:
        rows, start = cont
        ul_seq, seq_share = sequence_unlikelihood(
            model.logits(model.trunk_hidden(rows)), rows, cfg.ul_ngram, start, cfg.ul_seq_run
        )
        terms |= {"ul_seq": ul_seq, "ul_seq_share": torch.tensor(seq_share)}
        loss = loss + cfg.ul_seq_weight * ul_seq
    return {"loss": loss, **terms}


def make_continuations(
    checkpoint: Path,
    data: Path,
    out: Path,
    n: int = 512,
    prompt_len: int = 64,
    n_new: int = 128,
    seed: int = 7,
    threads: int = 1,
) -> Path:
    """``n`` greedy continuations of ``n_new`` tokens by the checkpoint's model (through llama.cpp, its GGUF), each
    after a prompt of ``prompt_len`` tokens drawn from the training stream: ``rows`` (n, prompt_len + n_new) and
    ``start`` (= prompt_len), for :func:`sequence_unlikelihood`."""
    from training.llama_ref import LlamaMTP

    train = load_data(data)[0]["train"]
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(train) - prompt_len, size=n)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = export_gguf(checkpoint, Path(tmp) / "model.gguf")
        with LlamaMTP(gguf, n_ctx=prompt_len + n_new + 8, n_threads=threads, n_rs_seq=0) as m:
            rows = []
            for s0 in starts:
                prompt = [int(t) for t in train[s0 : s0 + prompt_len]]
                rows.append(prompt + m.greedy(prompt, n_new, stop_at_eos=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out, rows=np.asarray(rows, dtype=np.uint16), start=np.int64(prompt_len), source=np.array(checkpoint.name)
    )
    return out


def continuations_at(rows: np.ndarray, step: int, cfg: TrunkConfig) -> torch.Tensor:
    """Step ``step``'s continuations, drawn from ``default_rng([seed, step, 2])``."""
    rng = np.random.default_rng([cfg.seed, step, 2])
    return torch.from_numpy(rows[rng.integers(0, len(rows), size=cfg.ul_seq_batch)].astype(np.int64))


@torch.no_grad()
def evaluate(model: DemoModel, batches: list[torch.Tensor], cfg: TrunkConfig, device: torch.device) -> dict:
    """Held-out trunk CE, MTP CE and top-1 agreement with the trunk per depth (agreement at depth ``d`` is the
    proxy of acceptance there given depths ``1..d-1`` accepted)."""
    model.eval()
    ce, mtp_ce, agree = 0.0, np.zeros(cfg.depth), np.zeros(cfg.depth)
    for x in batches:
        x = x.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            h = model.trunk_hidden(x)
            logits = model.logits(h)
            c, _, a = model.mtp_terms(x, h, logits, cfg.depth)
        v = logits.shape[-1]
        ce += F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), x[:, 1:].reshape(-1)).item()
        mtp_ce += [float(t) for t in c]
        agree += [float(t) for t in a]
    model.train()
    n = len(batches)
    return {
        "ce": round(ce / n, 4),
        "mtp_ce": [round(t / n, 4) for t in mtp_ce],
        "agreement": [round(t / n, 4) for t in agree],
    }


# ---------------------------------------------------------------------------------------------- checkpoints


def save(model: DemoModel, path: Path, meta: dict) -> None:
    """Weights only (matrices F16; the small rest, norms, ``A_log``, ``dt_bias`` and the convolutions, F32), with the
    model config and the training totals as metadata; atomic."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", torch.float16 if v.ndim == 2 else torch.float32).contiguous()
        for k, v in model.state_dict().items()
        if k != "trunk.lm_head.weight"
    }  # tied to the embedding
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"model_config": json.dumps(model.cfg.to_dict()), "meta": json.dumps(meta)})
    os.replace(tmp, path)


def load(path: Path) -> tuple[DemoModel, dict]:
    """The model (F32) of a checkpoint written by :func:`save`, and its training totals."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        md = f.metadata()
        sd = {k: f.get_tensor(k).float() for k in f.keys()}
    model = DemoModel(ModelConfig(**json.loads(md["model_config"])))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if [k for k in missing if k != "trunk.lm_head.weight"] or unexpected:
        raise ValueError(f"{path}: state dict mismatch: missing={missing} unexpected={unexpected}")
    return model, json.loads(md["meta"])


def average(paths: list[Path]) -> tuple[DemoModel, dict]:
    """The element-wise mean of checkpoints of one model shape (a "soup" of stretches run from one start; a path
    given n times weighs n), with the first one's totals and the sources' names and totals under ``averaged``."""
    loaded = [load(p) for p in paths]
    model, meta = loaded[0]
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    for p, (m, _) in zip(paths[1:], loaded[1:]):
        if {k: v.shape for k, v in m.state_dict().items()} != shapes:
            raise ValueError(f"{p} does not have the shape of {paths[0]}")
    states = [m.state_dict() for m, _ in loaded]
    model.load_state_dict({k: sum(sd[k] for sd in states) / len(states) for k in shapes})
    return model, {**meta, "averaged": [{"checkpoint": p.name, **m} for p, (_, m) in zip(paths, loaded)]}


def export_gguf(checkpoint: Path, out: Path) -> Path:
    """The GGUF of a checkpoint (F16 matrices, F32 vectors), with the shipped model's tokenizer, which every
    checkpoint keeps, and its totals as ``mtp_explorer.trunk_meta``."""
    from training.export import DEFAULT_OUT as SHIPPED
    from training.export import export_model
    from training.tokenizer import vocab_from_gguf

    model, meta = load(checkpoint)
    return export_model(
        model, vocab_from_gguf(SHIPPED), out, dtype="f16", **{"mtp_explorer.trunk_meta": json.dumps(meta)}
    )


def start_model(checkpoint: Path, layers: int) -> tuple[DemoModel, dict]:
    """(model, totals so far): the checkpoint's, else the shipped model's; an untrained one (stretch 0)
    with fewer than ``layers`` layers is grown to ``layers`` (:func:`training.grow.grow`, deterministic)."""
    from training.grow import grow

    if checkpoint.exists():
        model, meta = load(checkpoint)
    else:
        from training.export import DEFAULT_OUT as SHIPPED
        from training.export import model_from_gguf

        model = model_from_gguf(SHIPPED)
        meta = {"steps": 0, "tokens": 0, "seconds": 0.0, "stretches": 0, "grown_from": SHIPPED.name}
    if model.cfg.num_hidden_layers < layers:
        if meta["stretches"]:
            raise ValueError(f"{checkpoint} is trained at {model.cfg.num_hidden_layers} layers; only stretch 0 grows")
        model, where = grow(model, layers)
        meta = {**meta, "old_layers_at": where}
    return model, meta


# ---------------------------------------------------------------------------------------------- the stretch


def lr_at(step: int, planned: int, warmup: int, cfg: TrunkConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr`` at ``planned``."""
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, planned - warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", action="store_true", help="tokenize the corpus into --data and stop")
    p.add_argument(
        "--average",
        type=Path,
        nargs="+",
        metavar="CHECKPOINT",
        help="write the element-wise mean of these checkpoints as --checkpoint and stop (a checkpoint given n "
        "times weighs n)",
    )
    p.add_argument(
        "--export",
        type=Path,
        metavar="GGUF",
        help="write --checkpoint as a qwen35 GGUF (F16 matrices) with the shipped model's vocabulary and stop",
    )
    p.add_argument(
        "--init-only",
        action="store_true",
        help="write the shipped model as --checkpoint (stretch 0: the first stretch grows it) and stop; "
        "a machine without the package's native extension (a GPU box) then trains with torch alone",
    )
    p.add_argument(
        "--make-continuations",
        type=Path,
        metavar="NPZ",
        help="write --n-continuations greedy continuations of --checkpoint's model (llama.cpp) here and stop",
    )
    p.add_argument("--n-continuations", type=int, default=512, help="how many (--make-continuations; default 512)")
    p.add_argument(
        "--continuations",
        type=Path,
        metavar="NPZ",
        help="train with the sequence-level unlikelihood on these continuations (ul_seq_weight)",
    )
    p.add_argument("--data", type=Path, default=DATA, help="token streams written by --prepare")
    p.add_argument("--checkpoint", type=Path, default=CHECKPOINT, help="weights-only F16 checkpoint (read and written)")
    p.add_argument("--log", type=Path, default=LOG, help="JSON lines log (appended)")
    p.add_argument(
        "--best",
        type=Path,
        default=None,
        help="also keep the weights of this stretch's lowest held-out stdlib CE here (written at each eval "
        "that improves on the stretch's start)",
    )
    p.add_argument("--max-minutes", type=float, required=False, help="wall-clock budget of this stretch")
    p.add_argument("--steps", type=int, default=None, help="steps of this stretch (default: planned from the budget)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    for name, value in asdict(TrunkConfig()).items():
        if name not in ("seed",):
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=None, help=f"default {value}")
    args = p.parse_args(argv)
    if args.prepare:
        print(prepare(args.data))
        return 0
    if args.average:
        model, meta = average(args.average)
        save(model, args.checkpoint, meta)
        print(args.checkpoint)
        return 0
    if args.export:
        print(export_gguf(args.checkpoint, args.export))
        return 0
    if args.make_continuations:
        print(
            make_continuations(
                args.checkpoint, args.data, args.make_continuations, n=args.n_continuations, threads=args.threads
            )
        )
        return 0
    if args.init_only:
        if args.checkpoint.exists():
            print(f"{args.checkpoint} exists", file=sys.stderr)
            return 2
        model, meta = start_model(args.checkpoint, 0)
        save(model, args.checkpoint, meta)
        print(args.checkpoint)
        return 0
    if args.max_minutes is None and args.steps is None:
        p.error("give --max-minutes or --steps")
    cfg = TrunkConfig(**{k: getattr(args, k) for k in asdict(TrunkConfig()) if getattr(args, k, None) is not None})

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # the gated delta rule's decays give denormals, ~100x slower on x86 CPUs
    device = torch.device(args.device)
    t_start = time.time()
    log = JsonLog(args.log)

    data, corpus = load_data(args.data)
    cont = dict(np.load(args.continuations)) if args.continuations else None  # read once, not at every step
    model, meta = start_model(args.checkpoint, cfg.layers)
    if model.cfg.num_hidden_layers != cfg.layers:
        print(f"{args.checkpoint} has {model.cfg.num_hidden_layers} layers, not {cfg.layers}", file=sys.stderr)
        return 2
    model.to(device).train()
    for layer in model.trunk.model.layers if cfg.dropout else ():
        layer.mlp.register_forward_hook(lambda m, i, o: F.dropout(o, cfg.dropout, m.training))
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    held = {name: heldout(data[name], cfg) for name in ("heldout_stdlib", "heldout_packages")}
    warmup = cfg.resume_warmup_steps if meta["stretches"] else cfg.warmup_steps
    stretch = meta["stretches"] + 1
    log(
        {
            "event": "stretch_start",
            "stretch": stretch,
            "config": asdict(cfg),
            "model_config": model.cfg.to_dict(),
            "params": model.n_params(),
            "totals": meta,
            "corpus": corpus,
            "device": str(device),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "budget_minutes": args.max_minutes,
            "continuations": None
            if cont is None
            else {
                "path": str(args.continuations),
                "rows": list(cont["rows"].shape),
                "start": int(cont["start"]),
                "source": str(cont["source"]),
            },
        }
    )
    first = {k: evaluate(model, b, cfg, device) for k, b in held.items()}
    log({"event": "eval", "stretch": stretch, "step": meta["steps"], "tokens": meta["tokens"], **first})
    best_ce = first["heldout_stdlib"]["ce"]

    budget = None if args.max_minutes is None else args.max_minutes * 60 - (time.time() - t_start)
    planned = args.steps or 10**9
    step, t_loop, t_ck, t_log, seen = 0, time.time(), time.time(), time.time(), 0
    base = meta["steps"]
    while step < planned:
        if args.steps is None and step == 10:
            t_plan = time.time()
        if args.steps is None and step == 30:  # plan the stretch from the time of steps 10..30 (after warm-up)
            per_step = (time.time() - t_plan) / 20
            planned = max(warmup + 1, int((budget - 60) / (per_step * 1.08)))  # leave time for evals and saves
            log({"event": "planned", "steps": planned, "seconds_per_step": round(per_step, 4)})
        lr = lr_at(step, planned if planned < 10**9 else 10**6, warmup, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(data["train"], base + step, cfg).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=True):
            own = (
                None
                if cont is None
                else (continuations_at(cont["rows"], base + step, cfg).to(device), int(cont["start"]))
            )
            terms = losses(model, x, cfg, chain_starts(base + step, cfg).to(device), own)
        opt.zero_grad(set_to_none=True)
        terms["loss"].backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        seen += x.numel()
        now = time.time()
        if step % cfg.log_every == 0 or step == planned:
            log(
                {
                    "step": base + step,
                    "lr": round(lr, 7),
                    "grad_norm": round(float(gnorm), 3),
                    **{
                        k: (round(float(v), 4) if v.ndim == 0 else [round(float(t), 4) for t in v])
                        for k, v in ((k, v.detach()) for k, v in terms.items())
                    },
                    "tok_per_s": round(cfg.batch_size * cfg.seq_len * cfg.log_every / max(1e-9, now - t_log)),
                }
            )
            t_log = now
        totals = {
            **meta,
            "steps": base + step,
            "tokens": meta["tokens"] + seen,
            "seconds": round(meta["seconds"] + now - t_loop, 1),
            "stretches": stretch,
        }
        if step % cfg.eval_every == 0 or step == planned:
            ev = {k: evaluate(model, b, cfg, device) for k, b in held.items()}
            log({"event": "eval", "stretch": stretch, "step": base + step, "tokens": totals["tokens"], **ev})
            if args.best is not None and ev["heldout_stdlib"]["ce"] < best_ce:
                best_ce = ev["heldout_stdlib"]["ce"]
                save(model, args.best, totals)
                log(
                    {
                        "event": "best",
                        "stretch": stretch,
                        "step": base + step,
                        "heldout_stdlib_ce": best_ce,
                        "path": str(args.best),
                    }
                )
        out_of_time = budget is not None and now - t_start >= args.max_minutes * 60 - 20
        if step == planned or out_of_time or (now - t_ck) / 60 >= cfg.checkpoint_minutes:
            save(model, args.checkpoint, totals)
            t_ck = time.time()
        if out_of_time:
            log({"event": "paused", "step": base + step, "reason": "max-minutes"})
            break
    log({"event": "stretch_end", "stretch": stretch, "totals": totals, "checkpoint": str(args.checkpoint)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
