"""A DSpark draft head for the bundled target, trained here, for llama.cpp's ``draft-dspark`` (and SYNTHETIC
random-weight ones for layout checks).

    python -m training.dspark --out /tmp/dspark-train --max-minutes 40 --threads 1 --no-export   # train (resumes)
    python -m training.dspark --out /tmp/dspark-train --export-only --install   # -> training/dspark-head.pt and
                                                            # mtp_explorer/models/pystdlib-dspark.gguf
    python -m training.dspark --measure [--gguf X.gguf] [--prompts 20]   # draft-dspark vs draft-mtp (JSON)
    python -m training.dspark --random --gguf /tmp/dspark/dspark-conf.gguf                   # with a confidence head
    python -m training.dspark --random --gguf /tmp/dspark/dspark-noconf.gguf --no-confidence  # without
    python -m training.dspark --check-first-draft --gguf X.gguf [--head H.pt] [--no-confidence]  # llama.cpp vs PyTorch

DSpark is DFlash (see :mod:`training.dflash`: same backbone, same KV injection of the target's layer inputs, same
borrowed ``tok_embd`` / ``output``) plus, in llama.cpp 0.3.36 (``src/models/dflash.cpp``
``build_dspark_markov_head``; ``common/speculative.cpp`` ``common_speculative_impl_draft_dflash`` with
``is_dspark``):

* an **anchor-first block** (``sample_from_anchor``): ``draft()`` decodes ``[id_last, <mask> x (n_max-1)]`` at
  ``pos0 .. pos0+n_max-1`` and reads slots ``0 .. n_max-1`` (slot 0 drafts the token after ``id_last``);
  ``n_max`` is clamped to ``block_size`` (DFlash: ``block_size - 1``);
* a **Markov head** (vanilla): ``logits_i = base_i + markov_w2 @ markov_w1[prev_i]`` with ``prev_0 = id_last``
  and ``prev_i = argmax(logits_{i-1})`` (the in-graph chain is greedy);
* an optional **confidence head**: ``conf_i = sigmoid(proj . [norm(h_i); markov_w1[prev_i]] + b)`` (``norm(h_i)``
  is the draft's post-norm state, ``t_embd``), returned through ``llama_get_embeddings_nextn`` (broadcast to
  ``n_embd``-wide rows); ``--spec-draft-p-min`` stops the draft at the first slot with ``conf_i < p_min``.
  Without a confidence head, ``p_min > 0`` throws ("DSpark draft has no confidence head").

Training (:func:`anchor_block_losses`) is :func:`training.dflash.train`'s self-distillation with the anchor-first
alignment: for an anchor a of a teacher-forced window (context rows ``0 .. a-1``, block ``[x_a, M, M, M]`` at
``a .. a+3``), slot i (0..3) predicts the token at ``a + i + 1``, so its biased logits
``base_i + markov(x_{a+i})`` (the Markov head fed the window's own token, which is the draft's argmax whenever the
draft is still right) are trained with the cross-entropy against the target's distribution at position ``a + i``,
weight ``decay ** i``.  The confidence head is trained alongside with a binary cross-entropy on whether the slot's
argmax equals the target's (on detached features: it learns to predict the acceptance of a slot whose prefix was
accepted, and does not move the drafts).  The backbone starts from the shipped DFlash head
(``training/dflash-head.pt``, :func:`init_from_dflash`): the block input is the same (DFlash at ``n_max`` 3 decodes
``[id_last, M, M, M]`` at ``pos0 .. pos0+3`` too), only which row predicts which token moves by one (DFlash's row
``i + 1`` predicts the token that DSpark's row ``i`` does), so the context encoder (``fc``, ``hidden_norm``, the
injected K/V) carries over and the block layers re-learn the shift.

The shipped head (``training/logs/dspark-train.jsonl``: 1,500 steps, 38 min on one CPU thread; held-out top-1
agreement by slot 0.632 / 0.349 / 0.273 / 0.217) accepts, in llama-speculative-simple on the demo prompts, 0.775 at
``n_max`` 1 and 0.462 at 3 (1.36 per round; the DFlash head 1.16), and on 20 held-out prompts 0.773 and 0.461
(the model card has the table).

The checkpoint is a ``DSparkDraftModel`` Hugging Face checkpoint (llama.cpp's ``conversion/qwen.py``
``DSparkModel``): the DFlash tensors plus ``markov_head.markov_w1.weight`` [V, R], ``markov_head.markov_w2.weight``
[V, R] and optionally ``confidence_head.proj.{weight [1, H+R], bias [1]}``; ``config.json`` with
``sample_from_anchor``, ``markov_head_type: "vanilla"``, ``draft_vocab_size`` = V (no ``d2t``) and the DFlash
``dflash_config``.  The converter writes arch ``dflash`` with ``dflash.sample_from_anchor`` and
``dflash.has_confidence_head`` and tensors ``markov_w1.weight``, ``markov_w2.weight``, ``conf_proj.{weight,bias}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from training import dflash as D
from training import eagle3 as E

TARGET = E.TARGET
LICENSE = E.LICENSE
HEAD_NAME, SHIPPED_GGUF, SHIPPED_HEAD, DEFAULT_OUT = E.head_files("dspark")
LOG_DIR = E.LOG_DIR


#: The trained head's Markov rank: the DFlash backbone in F16 is 2.89 MB, and each unit of rank costs 16 KB
#: (``markov_w1`` and ``markov_w2``, 4096 x 2 bytes each), so 6 keeps the shipped file under 3 MB.
TRAINED_MARKOV_RANK = 6


@dataclass
class DSparkTrainConfig(D.TrainConfig):
    """:class:`training.dflash.TrainConfig` for fine-tuning from the DFlash head (shorter warm-up, lower rate)."""

    steps: int = 1900  #: about 1.2 s a step on one CPU thread
    lr: float = 1.5e-3
    warmup_steps: int = 30
    conf_weight: float = 1.0  #: weight of the confidence head's binary cross-entropy


@dataclass
class DSparkConfig(D.HeadConfig):
    """The DFlash backbone of :class:`training.dflash.HeadConfig` plus the DSpark heads."""

    markov_rank: int = 32
    confidence_head: bool = True
    sample_from_anchor: bool = True

    def hf_config(self) -> dict:
        """``config.json`` that llama.cpp's ``DSparkModel`` reads (conversion/qwen.py)."""
        cfg = super().hf_config()
        cfg["architectures"] = ["DSparkDraftModel"]
        cfg.update(
            {
                "sample_from_anchor": self.sample_from_anchor,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "markov_head_type": "vanilla",
                "markov_rank": self.markov_rank,
                "draft_vocab_size": self.vocab_size,
                "has_confidence_head": self.confidence_head,
            }
        )
        return cfg


class _MarkovHead(nn.Module):
    def __init__(self, c: DSparkConfig) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(c.vocab_size, c.markov_rank)  # weight [V, R]: previous-token embedding
        self.markov_w2 = nn.Linear(c.markov_rank, c.vocab_size, bias=False)  # weight [V, R]: bias projection


class _ConfidenceHead(nn.Module):
    def __init__(self, c: DSparkConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(c.hidden_size + c.markov_rank, 1, bias=True)


class DSparkDraftModel(D.DFlashDraftModel):
    """DFlash backbone + ``markov_head`` (+ ``confidence_head``), named as the HF checkpoint names them."""

    def __init__(self, c: DSparkConfig) -> None:
        super().__init__(c)
        self.markov_head = _MarkovHead(c)
        self.confidence_head = _ConfidenceHead(c) if c.confidence_head else None

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_head.markov_w2(self.markov_head.markov_w1(prev))

    def confidence(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """sigmoid(proj . [norm(h); markov_w1[prev]] + b), or None without a confidence head."""
        if self.confidence_head is None:
            return None
        feat = torch.cat([self.norm(h), self.markov_head.markov_w1(prev)], dim=-1)
        return torch.sigmoid(self.confidence_head.proj(feat)).squeeze(-1)


def random_dspark_head(
    seed: int = 0, *, confidence_head: bool = True, cfg: DSparkConfig | None = None
) -> DSparkDraftModel:
    """A SYNTHETIC untrained head: the backbone as :func:`training.dflash.random_head` (matrices std
    1.5/sqrt(fan_in), norms 1 + N(0, 0.1)), ``markov_w1`` N(0, 1), ``markov_w2`` std 1.5/sqrt(R) (Markov biases of
    std about 1.5 on logits of std about 5-10), the confidence projection std 1/sqrt(H+R) and bias 0 (confidences
    spread around 0.5).  Matrices are rounded to F16 so that the F16 GGUF holds exactly these weights."""
    torch.manual_seed(seed)
    c = cfg or DSparkConfig(confidence_head=confidence_head)
    head = DSparkDraftModel(c)
    with torch.no_grad():
        for name, v in head.named_parameters():
            if name.startswith("markov_head.markov_w1"):
                v.normal_(std=1.0)
            elif name.startswith("markov_head.markov_w2"):
                v.normal_(std=1.5 / c.markov_rank**0.5)
            elif name == "confidence_head.proj.weight":
                v.normal_(std=1.0 / v.shape[1] ** 0.5)
            elif name == "confidence_head.proj.bias":
                v.zero_()
            elif v.ndim == 1:
                v.add_(0.1 * torch.randn_like(v))
            else:
                v.normal_(std=1.5 / v.shape[1] ** 0.5)
            if v.ndim >= 2:
                v.copy_(v.half().float())
    return head.eval()


# ----------------------------------------------------------------------------------------------- training


def anchor_block_losses(
    head: DSparkDraftModel,
    target: E.Target,
    x: torch.Tensor,
    n_anchors: int,
    decay: float,
    rng: np.random.Generator | None = None,
    conf_weight: float = 1.0,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], dict]:
    """(weighted loss, per-slot CE against the target's distribution, per-slot top-1 agreement with its argmax,
    {confidence BCE, mean confidence, agreement of the slots the confidence passes at 0.5}).

    Anchor-first: slot i of the block anchored at a (``[x_a, M, ...]`` at ``a ..``) predicts x_{a+i+1}, the target's
    distribution at position a+i, with the Markov bias of the token before it, x_{a+i}."""
    c = head.cfg
    s = c.block_size
    b, t = x.shape
    feats, _, tlog = target(x)
    anchors = D.pick_anchors(b, t - s, n_anchors, rng).to(x.device)  # a + s - 1 <= t - 1
    h = head.window(feats, x, anchors, target.embed)  # (B, A, S, H)
    at = anchors[..., None] + torch.arange(s, device=x.device)  # (B, A, S): the position whose next token slot i drafts
    prev = torch.gather(x, 1, at.view(b, -1)).view_as(at)
    logits = head.logits(h, target.lm_head) + head.markov_bias(prev)  # (B, A, S, V)
    tl = torch.gather(tlog, 1, at.view(b, -1, 1).expand(-1, -1, tlog.shape[-1])).view_as(logits)
    logp = torch.log_softmax(logits, dim=-1)
    ce = -(torch.softmax(tl, -1) * logp).sum(-1)  # (B, A, S)
    hit = (logits.argmax(-1) == tl.argmax(-1)).float()
    losses = [ce[..., i].mean() for i in range(s)]
    agree = [hit[..., i].mean().detach() for i in range(s)]
    loss = sum(decay**i * l for i, l in enumerate(losses))
    extra: dict = {}
    if head.confidence_head is not None:
        feat = torch.cat([head.norm(h), head.markov_head.markov_w1(prev)], dim=-1).detach()
        z = head.confidence_head.proj(feat).squeeze(-1)
        bce = F.binary_cross_entropy_with_logits(z, hit)
        loss = loss + conf_weight * bce
        passed = torch.sigmoid(z) >= 0.5
        extra = {
            "conf_bce": bce.detach(),
            "conf_mean": torch.sigmoid(z).mean().detach(),
            "conf_pass_rate": passed.float().mean().detach(),
            "agreement_where_conf_passes": (hit * passed).sum().detach() / passed.sum().clamp(min=1),
        }
    return loss, losses, agree, extra


def load_dflash(path: Path = D.SHIPPED_HEAD) -> tuple[D.DFlashDraftModel, dict]:
    """A DFlash head from its weights file (``training/dflash-head.pt``, :func:`training.dflash.save_head`) or from a
    :func:`training.dflash.train` checkpoint (``last.pt``: what a GPU run without export leaves)."""
    obj = torch.load(path, map_location="cpu", weights_only=False)
    if "head" not in obj:
        return D.load_head(path)
    head = D.DFlashDraftModel(D.HeadConfig(**obj["head_config"]))
    head.load_state_dict(obj["head"])
    return head.eval(), {"steps": obj["step"]}


def init_from_dflash(head: DSparkDraftModel, path: Path = D.SHIPPED_HEAD) -> dict:
    """The backbone from a DFlash head's weights (``training/dflash-head.pt``, or a DFlash training checkpoint); the
    Markov head starts with no bias (``markov_w1`` N(0, 1), ``markov_w2`` 0) and the confidence head at 0.5 (zero
    projection and bias)."""
    dflash, meta = load_dflash(path)
    if dflash.cfg.to_dict() != {k: v for k, v in head.cfg.to_dict().items() if k in dflash.cfg.to_dict()}:
        raise ValueError(f"{path}: its backbone {dflash.cfg.to_dict()} is not this head's")
    missing, unexpected = head.load_state_dict(dflash.state_dict(), strict=False)
    if unexpected or any(not k.startswith(("markov_head.", "confidence_head.")) for k in missing):
        raise ValueError(f"{path}: unexpected {unexpected}, missing {missing}")
    with torch.no_grad():
        head.markov_head.markov_w1.weight.normal_(std=1.0)
        head.markov_head.markov_w2.weight.zero_()
        if head.confidence_head is not None:
            head.confidence_head.proj.weight.zero_()
            head.confidence_head.proj.bias.zero_()
    return {"backbone_from": path.name, "backbone_steps": meta.get("steps")}


def train(
    out: Path,
    *,
    max_minutes: float | None,
    fresh: bool,
    threads: int,
    log_path: Path,
    steps: int | None = None,
    init_from: Path | None = D.SHIPPED_HEAD,
    layer_ids: list[int] | None = None,
    target: Path = TARGET,
    device: str = "cpu",
    overrides: dict | None = None,
    tokens: Path | None = None,
) -> Path:
    """Train (or resume) a DSpark head into ``out/last.pt`` with :func:`training.dflash.train`'s loop (``target``,
    ``device``, ``overrides`` as there).  ``layer_ids`` (HF ids) default to those of an ``init_from`` head other than
    the shipped one (trained for the shipped 4-layer target), else to the config's."""
    if layer_ids is None and init_from is not None and Path(init_from).resolve() != D.SHIPPED_HEAD.resolve():
        layer_ids = load_dflash(init_from)[0].cfg.target_layer_ids
    return D.train(
        out,
        max_minutes=max_minutes,
        fresh=fresh,
        threads=threads,
        log_path=log_path,
        steps=steps,
        layer_ids=layer_ids,
        target=target,
        device=device,
        overrides=overrides,
        tokens=tokens,
        head_cls=DSparkDraftModel,
        config_cls=functools.partial(DSparkConfig, markov_rank=TRAINED_MARKOV_RANK),
        train_config_cls=DSparkTrainConfig,
        losses=anchor_block_losses,
        init=None if init_from is None else (lambda head: init_from_dflash(head, init_from)),
    )


def load_head(path: Path = SHIPPED_HEAD) -> tuple[DSparkDraftModel, dict]:
    return D.load_head(path, DSparkDraftModel, DSparkConfig)


def describe_training(meta: dict) -> str | None:
    if not meta:
        return None
    return (
        f"mtp-explorer DSpark draft head for pystdlib-qwen35-mtp: target layer inputs {meta.get('layer_ids')}, "
        f"block {meta.get('block_size')} (anchor-first), vanilla Markov head rank {meta.get('markov_rank')}, "
        f"confidence head; {meta.get('steps')} steps ({meta.get('minutes', 0):.0f} min on CPU) of "
        f"self-distillation on the Python standard library from the DFlash head's backbone; borrows the target's "
        f"token embeddings and output head"
    )


# ----------------------------------------------------------------------------------------------- export


def write_head_hf(head: DSparkDraftModel, hf_dir: Path, target_dir: Path, *, name: str, description: str) -> Path:
    """The head as a ``DSparkDraftModel`` checkpoint (F32 safetensors, ``config.json``, the target's tokenizer
    files, ``gguf-metadata.json`` for the converter's ``--metadata``)."""
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    (hf_dir / "config.json").write_text(json.dumps(head.cfg.hf_config(), indent=2) + "\n", encoding="utf-8")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target_dir / fn, hf_dir / fn)
    meta = {"general.name": name, "general.description": description}
    (hf_dir / "gguf-metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (hf_dir / "README.md").write_text(f'---\nlicense: "{LICENSE}"\n---\n\n# {name}\n', encoding="utf-8")
    return hf_dir


def convert_head(
    head: DSparkDraftModel, out_gguf: Path, work: Path, *, name: str, description: str, outtype: str = "f16"
) -> Path:
    """Head -> HF checkpoint -> llama.cpp's ``convert_hf_to_gguf.py --target-model-dir`` -> ``out_gguf``."""
    from mtp_explorer.devtools.hf_export import convert_with_llama_cpp

    target_dir = E.write_target_hf(work / "target-hf")
    hf_dir = write_head_hf(head, work / "dspark-hf", target_dir, name=name, description=description)
    out_gguf.parent.mkdir(parents=True, exist_ok=True)
    return convert_with_llama_cpp(
        hf_dir,
        out_gguf,
        outtype=outtype,
        extra_args=["--target-model-dir", str(target_dir), "--metadata", str(hf_dir / "gguf-metadata.json")],
    )


def synthetic_name(confidence_head: bool) -> str:
    return "SYNTHETIC-random-dspark" + ("" if confidence_head else "-noconf")


def random_dspark_head_gguf(out_gguf: Path, work: Path, *, seed: int = 0, confidence_head: bool = True) -> Path:
    """A random-init (SYNTHETIC) DSpark head for the bundled target, converted by llama.cpp's converter."""
    head = random_dspark_head(seed, confidence_head=confidence_head)
    desc = (
        f"SYNTHETIC untrained (random-init, seed {seed}) DSpark draft head for pystdlib-qwen35-mtp "
        f"(DFlash backbone, target layer inputs {head.cfg.llama_layer_ids}, block {head.cfg.block_size}, "
        f"anchor-first, vanilla Markov head rank {head.cfg.markov_rank}, "
        f"{'with' if confidence_head else 'without'} a confidence head): layout/loading check only, drafts are "
        f"noise"
    )
    return convert_head(head, Path(out_gguf), Path(work), name=synthetic_name(confidence_head), description=desc)


def gguf_summary(path: Path) -> dict:
    """``dflash.*`` metadata (and a few others) and the tensors (name, shape, type) of a head GGUF."""
    import gguf

    r = gguf.GGUFReader(str(path))

    def val(f):
        v = f.contents()
        return v if not isinstance(v, list) or len(v) <= 16 else f"[{len(v)} items]"

    keys = {
        k: val(f)
        for k, f in r.fields.items()
        if k.startswith("dflash.") or k in ("general.architecture", "general.name", "tokenizer.ggml.mask_token_id")
    }
    tensors = [f"{t.name} {[int(s) for s in t.shape]} {t.tensor_type.name}" for t in r.tensors]
    return {"keys": keys, "tensors": tensors}


# ----------------------------------------------------------------------------------------------- first draft


@torch.no_grad()
def first_draft(
    head: DSparkDraftModel, target: E.Target, ids: list[int], n: int, top_k: int = 10
) -> list[tuple[int, float, float | None]]:
    """What llama.cpp's draft-dspark drafts first after a prompt ``ids`` (anchor-first): the target decodes
    ``ids[:-1]`` (injected rows 0..N-2), then the block ``[ids[-1], M x (n-1)]`` at N-1..N-2+n, slots 0..n-1 with
    the Markov chain.  Per slot: (argmax token, its probability renormalised over the top ``top_k``, confidence or
    None)."""
    c = head.cfg
    x = torch.tensor([ids])
    feats, _, _ = target(x)
    n_tok = len(ids)
    ctx = head.context_kv(head.encode(feats[:, : n_tok - 1]), torch.arange(n_tok - 1))
    toks = torch.tensor([[[ids[-1]] + [c.mask_token_id] * (n - 1)]])
    pos = (n_tok - 1 + torch.arange(n)).view(1, 1, -1)
    h = head.blocks(F.embedding(toks, target.embed), pos, ctx, torch.ones(1, 1, n_tok - 1, dtype=torch.bool))[0, 0]
    base = head.logits(h, target.lm_head)
    prev = torch.tensor(ids[-1])
    out = []
    for i in range(n):
        col = base[i] + head.markov_bias(prev)
        conf = head.confidence(h[i], prev)
        top = torch.topk(col, top_k)
        out.append(
            (int(top.indices[0]), float(torch.softmax(top.values, -1)[0]), None if conf is None else float(conf))
        )
        prev = col.argmax()
    return out


_DRAFT_LINE = E._DRAFT_LINE


_CALLED = re.compile(r"called impl draft-dspark, hist size = \d+, call_count = (\d+)")


def logged_first_draft(log: str) -> list[tuple[int, float]] | None:
    """The first draft() call's top candidates (token, p) per slot, from llama-speculative-simple's ``-lv 5`` log
    (``[]`` when the first call drafted nothing: llama.cpp logs ``called impl`` only for non-empty drafts, with the
    call count); ``None`` when the log has no ``called impl`` line (its tail was lost)."""
    out: list[tuple[int, float]] = []
    for line in log.splitlines():
        if m := _CALLED.search(line):
            return out if m.group(1) == "1" else []
        if m := _DRAFT_LINE.search(line):
            out.append((int(m.group(2)), float(m.group(3))))
    return None


def spec_command(
    head_gguf: Path,
    prompt: str,
    *,
    n_max: int = 4,
    n_predict: int = 32,
    p_min: float | None = None,
    binary: Path | None = None,
    target: Path = TARGET,
    ctx: int = 1024,
    verbose: bool = False,
) -> list[str]:
    cmd = [
        str(binary or E.reference_binary()),
        "-m",
        str(target),
        "-md",
        str(head_gguf),
        "--spec-type",
        "draft-dspark",
        "--spec-draft-n-max",
        str(n_max),
        "-p",
        prompt,
        "-n",
        str(n_predict),
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        str(ctx),
        "--seed",
        "0",
    ]
    if p_min is not None:
        cmd += ["--spec-draft-p-min", str(p_min)]
    if verbose:
        cmd += ["-lv", "5"]
    return cmd


def run_first_draft(
    head_gguf: Path,
    prompt: str,
    n: int,
    *,
    p_min: float | None = None,
    binary: Path | None = None,
    target: Path = TARGET,
    attempts: int = 8,
) -> tuple[list[tuple[int, float]], str]:
    """llama.cpp's first block draft after ``prompt`` (``-lv 5`` log, ``-n 8`` so that ``n <= 4`` slots are not cut
    by the tokens left to generate), retried when the log lost its tail."""
    cmd = spec_command(
        head_gguf, prompt, n_max=n, n_predict=8, p_min=p_min, binary=binary, target=target, ctx=256, verbose=True
    )
    log = ""
    for _ in range(attempts):  # the debug log thread can lose its tail at exit
        with tempfile.TemporaryDirectory() as tmp:
            err = Path(tmp, "err")
            with err.open("wb") as fe:
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=fe, timeout=180, check=True)
            log = err.read_text(encoding="utf-8", errors="replace")
        got = logged_first_draft(log)
        if got is not None:
            return got, log
    return logged_first_draft(log) or [], log


def expected_length(draft: list[tuple[int, float, float | None]], p_min: float | None) -> int:
    """How many slots llama.cpp keeps: up to the first confidence under ``p_min`` (all without ``p_min``)."""
    if not p_min:
        return len(draft)
    return next((i for i, (_, _, c) in enumerate(draft) if c < p_min), len(draft))


def run_totals(cmd: list[str], timeout: float = 300, attempts: int = 8) -> dict:
    """Run llama-speculative-simple; its return code, the totals lines it printed and its generated text. A run that
    exits 0 without its summary (0.3.36 sometimes loses the tail of its log, as mtp_explorer.devtools.reference
    notes) is run again, up to ``attempts`` times."""
    for _ in range(attempts):
        p = subprocess.run(cmd, capture_output=True, timeout=timeout)
        err = p.stderr.decode("utf-8", "replace")
        totals = {}
        for key in ("n_draft", "n_predict", "n_drafted", "n_accept", "accept"):
            m = re.search(rf"\b{key}\s*=\s*([\d.]+%?)", err)
            if m:
                totals[key] = m.group(1)
        if p.returncode != 0 or "n_accept" in totals:
            break
    return {
        "rc": p.returncode,
        "totals": totals,
        "text": p.stdout.decode("utf-8", "replace"),
        "stderr_tail": err[-1500:],
    }


def check_first_draft(
    head: DSparkDraftModel, head_gguf: Path, prompts=None, n: int | None = None, p_min: float | None = None
) -> dict:
    """PyTorch vs llama.cpp first block draft on ``prompts``: tokens equal, probabilities within 0.01 and, with
    ``p_min``, the draft cut where the PyTorch confidence first falls under it."""
    from training.llama_ref import LlamaMTP

    n = n or head.cfg.block_size
    prompts = prompts or [
        "def fib(n):",
        "class Point:\n    def __init__(self, x, y):\n",
        "import os\n\n\ndef walk(top):\n",
    ]
    target = D.make_target(head.cfg)
    with LlamaMTP(TARGET, n_ctx=256, n_threads=1) as m:
        ids = [m.tokenize(p) for p in prompts]
    res = {"head": str(head_gguf), "p_min": p_min, "prompts": []}
    ok = True
    for p, x in zip(prompts, ids):
        ours = first_draft(head, target, x, n)
        k = expected_length(ours, p_min)
        logged, _ = run_first_draft(head_gguf, p, n, p_min=p_min)
        same = len(logged) == k and [t for t, _ in logged] == [t for t, _, _ in ours[:k]]
        dp = max((abs(a[1] - b[1]) for a, b in zip(logged, ours)), default=0.0)
        ok &= same and dp <= 0.01
        res["prompts"].append(
            {
                "prompt": p,
                "llama_cpp": logged,
                "pytorch": [(t, round(q, 4), None if c is None else round(c, 4)) for t, q, c in ours],
                "expected_length": k,
                "same_tokens": same,
                "max_abs_dp": round(dp, 5),
            }
        )
    res["ok"] = bool(ok)
    return res


# ----------------------------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoints, token cache (training resumes from it)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time (checkpointed)")
    p.add_argument("--steps", type=int, default=None, help="override the schedule length")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--init-from",
        type=Path,
        default=D.SHIPPED_HEAD,
        help="DFlash head weights (or a training.dflash last.pt) to start the backbone from (fresh runs; "
        "default training/dflash-head.pt, trained against the bundled target)",
    )
    p.add_argument("--log", type=Path, default=None, help="JSON log (default training/logs/dspark-<time>.jsonl)")
    p.add_argument("--export-only", action="store_true", help="export the checkpoint in --out without training")
    p.add_argument("--no-export", action="store_true")
    p.add_argument(
        "--install",
        action="store_true",
        help="export to training/dspark-head.pt and mtp_explorer/models/pystdlib-dspark.gguf",
    )
    p.add_argument("--random", action="store_true", help="write a random-init (SYNTHETIC) DSpark head to --gguf")
    p.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="output / measured GGUF (default --out/pystdlib-dspark.gguf; --measure: the shipped head)",
    )
    p.add_argument("--head", type=Path, default=None, help="head weights file (default --out/dspark-head.pt)")
    p.add_argument("--no-confidence", action="store_true", help="--random: no confidence head")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="keep the HF checkpoints here (default: a temp dir)")
    p.add_argument("--p-min", type=float, default=None, help="--check-first-draft with --spec-draft-p-min")
    p.add_argument(
        "--check-first-draft",
        action="store_true",
        help="compare llama.cpp's first block draft of --gguf with the PyTorch head of --head (or the "
        "random head of --seed) (JSON)",
    )
    p.add_argument("--measure", action="store_true", help="measure --gguf against draft-mtp (JSON)")
    p.add_argument("--n-max", type=lambda s: [int(v) for v in s.split(",")], default=[1, 3])
    p.add_argument(
        "--prompts",
        type=int,
        default=0,
        help="--measure on N held-out prompts of training.evaluate (default: the demo prompts)",
    )
    D.add_target_options(
        p,
        "HF layer ids (layer OUTPUTS) of a fresh run, default those of --init-from (the shipped "
        "DFlash head's 0,1,2 are for the shipped 4-layer target only)",
    )
    args = p.parse_args(argv)
    if E.is_checkpoint(args.target) and not args.no_export:
        p.error("a checkpoint --target trains only (add --no-export); export converts against the bundled GGUF")
    torch.set_num_threads(args.threads)
    conf = not args.no_confidence
    if args.measure:
        print(json.dumps(E.measure_on(args.gguf or SHIPPED_GGUF, "draft-dspark", args.n_max, args.prompts), indent=2))
        return 0
    if args.check_first_draft:
        if args.gguf is None:
            p.error("--check-first-draft needs --gguf")
        head = load_head(args.head)[0] if args.head else random_dspark_head(args.seed, confidence_head=conf)
        print(json.dumps(check_first_draft(head, args.gguf, p_min=args.p_min)))
        return 0
    if args.random:
        if args.gguf is None:
            p.error("--random needs --gguf")
        if args.work is not None:
            out = random_dspark_head_gguf(args.gguf, args.work, seed=args.seed, confidence_head=conf)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                out = random_dspark_head_gguf(args.gguf, Path(tmp), seed=args.seed, confidence_head=conf)
        print(json.dumps({"gguf": str(out), "bytes": out.stat().st_size, **gguf_summary(out)}, indent=2, default=str))
        return 0
    if not args.export_only:
        log = args.log or LOG_DIR / f"dspark-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        train(
            args.out,
            max_minutes=args.max_minutes,
            fresh=args.fresh,
            threads=args.threads,
            log_path=log,
            steps=args.steps,
            init_from=args.init_from,
            layer_ids=args.layer_ids,
            target=args.target,
            device=args.device,
            overrides=E.train_overrides(args),
            tokens=args.tokens,
        )
    if args.no_export:
        return 0
    gguf = SHIPPED_GGUF if args.install else args.gguf or args.out / f"{HEAD_NAME}.gguf"
    head_path = SHIPPED_HEAD if args.install else args.head or args.out / "dspark-head.pt"
    ck = torch.load(args.out / "last.pt", map_location="cpu", weights_only=False)
    head = DSparkDraftModel(DSparkConfig(**ck["head_config"]))
    head.load_state_dict(ck["head"])
    meta = {
        "steps": ck["step"],
        "minutes": round(ck["elapsed_seconds"] / 60, 1),
        "layer_ids": head.cfg.llama_layer_ids,
        "block_size": head.cfg.block_size,
        "markov_rank": head.cfg.markov_rank,
        "eval_heldout": ck.get("best"),
        "train_config": ck["train_config"],
    }
    D.save_head(head_path, head, meta)
    head, meta = load_head(head_path)  # export exactly what was saved (F16-rounded matrices)
    with tempfile.TemporaryDirectory() as tmp:
        convert_head(head, gguf, Path(tmp), name=HEAD_NAME, description=describe_training(meta))
    print(
        f"wrote {head_path} ({head_path.stat().st_size / 1e6:.2f} MB) and {gguf} ({gguf.stat().st_size / 1e6:.2f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
