"""An EAGLE-3 draft head for the bundled target, trained here, exported for llama.cpp's ``draft-eagle3``.

    python -m training.eagle3 --max-minutes 30 --no-export   # train (resumes from --out, default
                                                             # ~/.cache/mtp-explorer/eagle3; log training/logs/)
    python -m training.eagle3 --export-only --install        # checkpoint -> training/eagle3-head.pt -> llama.cpp's
                                                             # converter -> mtp_explorer/models/pystdlib-eagle3.gguf
    python -m training.eagle3 --convert-shipped --gguf X.gguf  # training/eagle3-head.pt -> X.gguf (same bytes)
    python -m training.eagle3 --measure > training/logs/eagle3-measure.json   # draft-eagle3 vs draft-mtp acceptance
    python -m training.eagle3 --random --out /tmp/e3         # an untrained head (layout / loading check)

The head computes exactly what llama.cpp 0.3.36's ``eagle3`` graph computes (``src/models/eagle3.cpp``), with
llama.cpp's ``common/speculative.cpp`` pairing of rows (``draft-eagle3``):

    f_p   = concat(L_a[p], L_b[p], L_c[p])       the target's layer INPUTS (pre-norm residual stream entering layer
                                                 il, HF ``hidden_states[il]``; id == n_layer is qwen35's
                                                 post-norm ``h_nextn``) at position p, ids = target_layer_ids
    g_p   = fc(f_p)                              encoder graph (no norm before or after fc)
    row p = (token x_{p+1}, g_p) at position p:  e = input_layernorm(tok_embd[x_{p+1}]),  n = hidden_norm(g_p)
          a = attn(concat(e, n)) (RoPE NORM in llama.cpp = HF rotate_half + the converter's q/k permutation)
          u = g_p + o_proj(a);  h = u + mlp(post_attention_layernorm(u))      -> h: the pre-norm state
          logits = output(norm(h))              predicts x_{p+2}
    draft step d >= 2: (previous draft token, previous h) at the next position; it attends to the real rows
          0..p (KV of the verified rows; the seed row at p is real) and to the chain's earlier draft rows.

``tok_embd`` and ``output`` are the TARGET's (frozen, borrowed by llama.cpp through ``ctx_other`` when the GGUF
has none), which needs the head's hidden size == the target's (256).  RMS norms are llama-style (``w * x̂``, not
qwen35's ``(1 + w) * x̂``).

Target layer ids ``[2, 3, 4]``: the inputs of layers 2 and 3 (outputs of the second and third gated-delta-net
layers) and id 4 = n_layer, which llama.cpp serves from the target's ``h_nextn`` (qwen35 sets it to the trunk's final
state *after* ``output_norm``, the same row draft-mtp reads; :class:`Target` takes the same post-norm state).  The
EAGLE-3 convention (low/mid/high layer inputs, llama.cpp's default ``[2, n//2, n-3]``) gives ``[2, 2, 1]`` for a
4-layer trunk, a repeated id; the obvious layer-input choice ``[1, 2, 3]`` (the outputs of the three gated-delta-net
layers) leaves out the trunk's only full-attention layer, which a one-layer head must then redo.  In an A/B of 4
minutes each from the same seed and batches (``training/logs/eagle3-L123.jsonl`` and the first 97 steps of
``training/logs/eagle3-L234.jsonl``) ``[2, 3, 4]`` was ahead at every logged step (held-out top-1 agreement with the
target at step 50: 0.230 / 0.168 / 0.152 at depths 1-3 against 0.187 / 0.148 / 0.136; training loss at step 80
11.00 against 11.55), so the shipped head uses it.  Both paths were checked in llama.cpp (the PyTorch head drafts
what llama.cpp drafts, :func:`first_draft`).

Training is self-distillation on teacher-forced windows of the training split (:mod:`training.corpus`, never the
held-out files): the frozen target (:func:`training.export.model_from_gguf` of the bundled GGUF, F32) gives the
layer inputs and its next-token distribution; the head's depth-``d`` row for chain start ``p`` is trained with the
cross-entropy against the target's distribution at position ``p + d`` (its argmax is what greedy acceptance
checks), weight ``0.8 ** (d - 1)``, depths 1..3 unrolled as llama.cpp chains them (train-time test).

Export: the head as a SpecForge-layout Hugging Face checkpoint (``LlamaForCausalLMEagle3``, ``midlayer.*``,
no ``lm_head`` / ``embed_tokens`` / ``d2t``), converted by llama.cpp's own ``convert_hf_to_gguf.py
--target-model-dir`` (the target exported by :func:`mtp_explorer.devtools.hf_export.export_hf_checkpoint`) to an
F16 GGUF.  The shipped head weights, ``training/eagle3-head.pt`` (matrices F16, norms F32: the exact values the
F16 GGUF holds), are converted again by ``tests/test_eagle3_head.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from training.draft import DraftRounds, draft_rounds
from training.jsonlog import JsonLog
from training.train import batch_at, lr_at  # the trunk's schedule and batches, on this TrainConfig

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "mtp_explorer" / "models"
TARGET = MODELS / "pystdlib-qwen35-mtp.gguf"
LOG_DIR = Path(__file__).resolve().parent / "logs"
LOG_NAME = "eagle3.jsonl"
TRAIN_DIR = Path(os.environ.get("MTP_EXPLORER_TRAIN_DIR") or Path.home() / ".cache" / "mtp-explorer")


def head_files(kind: str) -> tuple[str, Path, Path, Path]:
    """A draft head's name, its shipped GGUF (``mx.draft_heads()``), its weights file beside this module (converted
    again by the tests) and its default training folder (checkpoints, token cache)."""
    name = f"pystdlib-{kind}"
    return name, MODELS / f"{name}.gguf", Path(__file__).resolve().parent / f"{kind}-head.pt", TRAIN_DIR / kind


HEAD_NAME, SHIPPED_GGUF, SHIPPED_HEAD, DEFAULT_OUT = head_files("eagle3")
REFERENCE = ROOT / "build" / "reference" / "bin" / "llama-speculative-simple"
LICENSE = "PSF-2.0 (training data); model weights released with the mtp-explorer project"


@dataclass
class HeadConfig:
    """Architecture of the EAGLE-3 head (one Llama decoder layer over 2H inputs)."""

    hidden_size: int = 256  #: must equal the target's: tok_embd / output are borrowed from it
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    vocab_size: int = 4096
    target_hidden_size: int = 256
    target_layer_ids: list[int] = field(default_factory=lambda: [2, 3, 4])
    max_position_embeddings: int = 4096
    bos_token_id: int = 4095
    eos_token_id: int = 4095

    def to_dict(self) -> dict:
        return asdict(self)

    def hf_config(self) -> dict:
        """``config.json`` of the SpecForge-style checkpoint that llama.cpp's converter reads as EAGLE-3."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.target_layer_ids),
            "norm_before_residual": False,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "float32",
        }


@dataclass
class TrainConfig:
    seed: int = 3141
    steps: int = 700  #: schedule length (the shipped head: 638 of 700, stopped by the time budget)
    batch_size: int = 8
    seq_len: int = 256
    depth: int = 3  #: train-time-test unroll
    depth_decay: float = 0.8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 32
    log_every: int = 10
    checkpoint_minutes: float = 4.0


# ----------------------------------------------------------------------------------------------- the head


class RMSNorm(nn.Module):
    """llama.cpp's ``build_norm(LLM_NORM_RMS)`` with a plain weight: ``w * x / sqrt(mean(x^2) + eps)``."""

    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attn(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attn(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)


KV = tuple[torch.Tensor, torch.Tensor]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Eagle3Head(nn.Module):
    """The trainable tensors, named as SpecForge checkpoints name them (``fc``, ``midlayer.*``, ``norm``)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.cfg = c
        self.fc = nn.Linear(len(c.target_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for integer positions ``pos`` (any shape), last dim head_dim (HF layout)."""
        f = pos.to(torch.float32)[..., None] * self.inv_freq
        f = torch.cat([f, f], dim=-1)
        return f.cos(), f.sin()

    def qkv(
        self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q (B, nh, N, D), k and v (B, nkv, N, D) for rows (token embedding, g) at positions ``pos`` (B, N)."""
        c, m = self.cfg, self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], dim=-1)
        b, n, _ = x.shape
        q = m.self_attn.q_proj(x).view(b, n, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = self.rope(pos)
        cos, sin = cos[:, None], sin[:, None]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def finish(self, g: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The pre-norm state h from the attention output (B, nh, N, D) and the rows' g (residual: raw g)."""
        m = self.midlayer
        b, _, n, _ = attn.shape
        u = g + m.self_attn.o_proj(attn.transpose(1, 2).reshape(b, n, -1))
        return u + m.mlp(m.post_attention_layernorm(u))

    def _expand(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.cfg.num_attention_heads // self.cfg.num_key_value_heads, dim=1)

    def real_rows(self, emb: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """Rows 0..N-1 (token embedding of x_{p+1}, g_p) at positions p, causal: (h (B, N, H), their (k, v))."""
        b, n, _ = emb.shape
        pos = torch.arange(n, device=emb.device).expand(b, n)
        q, k, v = self.qkv(emb, g, pos)
        o = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v), is_causal=True)
        return self.finish(g, o), (k, v)

    def chain_rows(
        self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, real: KV, chain: list[KV], starts: torch.Tensor
    ) -> tuple[torch.Tensor, KV]:
        """One draft row per chain ``i`` (start ``starts[i]``): attends to real rows 0..starts[i], to row ``i`` of
        each earlier draft depth (``chain``) and to itself (llama.cpp's draft KV during one draft() call)."""
        q, k, v = self.qkv(emb, g, pos)
        scale = self.cfg.head_dim**-0.5
        rk, rv = self._expand(real[0]), self._expand(real[1])
        t = rk.shape[2]
        s_real = torch.matmul(q, rk.transpose(-1, -2)) * scale  # (B, h, n, T)
        future = torch.arange(t, device=q.device)[None, :] > starts[:, None]
        s_real = s_real.masked_fill(future, float("-inf"))
        own = [(self._expand(ck), self._expand(cv)) for ck, cv in chain] + [(self._expand(k), self._expand(v))]
        s_own = [(q * ok).sum(-1, keepdim=True) * scale for ok, _ in own]
        p = torch.softmax(torch.cat([s_real, *s_own], dim=-1), dim=-1)
        o = torch.matmul(p[..., :t], rv)
        for j, (_, ov) in enumerate(own):
            o = o + p[..., t + j : t + j + 1] * ov
        return self.finish(g, o), (k, v)

    def logits(self, h: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), lm_head)

    def unroll(self, emb: torch.Tensor, feats: torch.Tensor, depth: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Pre-norm states of draft depths 1..``depth`` on a teacher-forced window of T tokens.

        ``emb`` (B, T, H): target embeddings of x_0..x_{T-1}; ``feats`` (B, T, 3Ht): target features f_0..f_{T-1}.
        Depth 1: rows p = 0..T-2 (token x_{p+1}, g_p), predicting x_{p+2}.  Depth d >= 2: chains p = 0..T-1-depth
        (``starts``), token x_{p+d} with the depth d-1 state of the chain at position p+d-1, predicting x_{p+d+1}.
        """
        b, t, _ = emb.shape
        g = self.fc(feats[:, : t - 1])
        h1, real = self.real_rows(emb[:, 1:], g)
        outs = [h1]
        starts = torch.arange(0, t - depth, device=emb.device)
        prev, chain = h1[:, starts], []
        for d in range(2, depth + 1):
            pos = (starts + d - 1).expand(b, -1)
            prev, kv = self.chain_rows(emb[:, starts + d], prev, pos, real, chain, starts)
            chain.append(kv)
            outs.append(prev)
        return outs, starts


# ----------------------------------------------------------------------------------------------- the target


def is_checkpoint(target: Path | str) -> bool:
    """Whether ``target`` is a :mod:`training.trunk` weights-only checkpoint (``*.safetensors``), not a GGUF."""
    return Path(target).suffix == ".safetensors"


def target_model(target: Path | str = TARGET):
    """The :class:`training.model.DemoModel` (F32, eval) of a qwen35 GGUF (:func:`training.export.model_from_gguf`:
    needs ``gguf`` and ``mtp_explorer``) or of a :mod:`training.trunk` checkpoint (:func:`training.trunk.load`:
    torch alone)."""
    if is_checkpoint(target):
        from training.trunk import load

        return load(Path(target))[0].eval()
    from training.export import model_from_gguf

    return model_from_gguf(target).eval()


def check_default_layer_ids(
    target: Path | str, n_layer: int, default: list[int], option: str = "--layer-ids", trained_for: int = 4
) -> None:
    """The default layer ids were chosen for the shipped ``trained_for``-layer trunk: refuse them on another."""
    if n_layer != trained_for:
        raise SystemExit(
            f"{Path(target).name} has {n_layer} layers; the default layer ids {default} were chosen for the "
            f"shipped {trained_for}-layer target: give {option} for this one"
        )


class Target:
    """The frozen target in PyTorch (F32): features at the head's layer ids and next-token logits.  ``target``: a
    qwen35 GGUF (default: the bundled one) or a :mod:`training.trunk` checkpoint (``*.safetensors``)."""

    def __init__(
        self,
        gguf: Path = TARGET,
        layer_ids: list[int] | tuple[int, ...] = (2, 3, 4),
        device: torch.device | str = "cpu",
        *,
        final_state: bool = True,
    ) -> None:
        self.model = target_model(gguf).to(device)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.path = Path(gguf)
        self.layer_ids = list(layer_ids)
        self.n_layer = self.model.cfg.num_hidden_layers
        hi = self.n_layer if final_state else self.n_layer - 1  # id n_layer: the final post-norm state
        if any(i < 0 or i > hi for i in self.layer_ids):
            raise ValueError(
                f"layer ids {self.layer_ids} outside 0..{hi} for {self.path.name} ({self.n_layer} layers; "
                + ("id n_layer is the final post-norm state)" if final_state else "layer inputs only)")
            )
        self.embed = self.model.trunk.model.embed_tokens.weight
        self.lm_head = self.model.trunk.lm_head.weight
        self._captured: dict[int, torch.Tensor] = {}
        for il, layer in enumerate(self.model.trunk.model.layers):
            layer.register_forward_pre_hook(self._hook(il), with_kwargs=True)

    def _hook(self, il: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self._captured[il] = x

        return hook

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features (B, T, 3Ht) in the order of the ids, token embeddings (B, T, H), logits (B, T, V))."""
        self._captured.clear()
        h = self.model.trunk_hidden(x)  # post-norm, llama.cpp's qwen35 h_nextn (id == n_layer)
        feats = torch.cat([h if i == self.n_layer else self._captured[i] for i in self.layer_ids], dim=-1)
        return feats, F.embedding(x, self.embed), self.model.logits(h)


@torch.no_grad()
def first_draft(head: Eagle3Head, target: Target, ids: list[int], n: int, top_k: int = 10) -> list[tuple[int, float]]:
    """What llama.cpp's draft-eagle3 drafts first after a prompt ``ids``: llama-speculative-simple decodes
    ``ids[:-1]`` with the target (the decoder writes rows 0..N-3, the row of position N-2 is deferred), then the
    seed row ``(ids[-1], g_{N-2})`` at N-2 and ``n - 1`` chained rows (greedy token, previous pre-norm state).
    Per draft: (argmax token, its probability renormalised over the top ``top_k``, as the drafter's log prints)."""
    x = torch.tensor([ids])
    feats, emb, _ = target(x)
    n_tok = len(ids)
    g = head.fc(feats[:, : n_tok - 1])
    h, real = head.real_rows(emb[:, 1:], g)  # rows 0..N-2, the last being the seed row
    out: list[tuple[int, float]] = []
    starts = torch.tensor([n_tok - 2])
    prev, chain = h[:, -1:], []
    for d in range(1, n + 1):
        if d > 1:
            tok = F.embedding(torch.tensor([[out[-1][0]]]), target.embed)
            prev, kv = head.chain_rows(tok, prev, (starts + d - 1).view(1, 1), real, chain, starts)
            chain.append(kv)
        logits = head.logits(prev[0, -1], target.lm_head)
        top = torch.topk(logits, top_k)
        out.append((int(top.indices[0]), float(torch.softmax(top.values, -1)[0])))
    return out


_DRAFT_LINE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+) \(\s*([\d.]+)\)")


def logged_first_draft(log: str, spec: str = "draft-eagle3") -> list[tuple[int, float]]:
    """The first draft() call's top candidates (token, p) per position, from llama-speculative-simple's ``-lv 5`` log
    of ``--spec-type spec``."""
    out: list[tuple[int, float]] = []
    for line in log.splitlines():
        if f"called impl {spec}" in line and out:
            break
        if m := _DRAFT_LINE.search(line):
            out.append((int(m.group(2)), float(m.group(3))))
    return out


# ----------------------------------------------------------------------------------------------- training


def depth_losses(
    head: Eagle3Head, target: Target, x: torch.Tensor, depth: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per depth: (CE against the target's distribution, top-1 agreement with the target's argmax)."""
    feats, emb, tlog = target(x)
    t = x.shape[1]
    outs, starts = head.unroll(emb, feats, depth)
    tprob = torch.softmax(tlog, dim=-1)
    targ = tlog.argmax(-1)
    losses, agree = [], []
    for d, h in enumerate(outs, start=1):
        # depth 1, row p predicts x_{p+2}: the target's distribution at position p+1 (rows 0..T-3 have one);
        # depth d, chain p predicts x_{p+d+1}: the target's distribution at position p+d
        at = torch.arange(1, t - 1, device=x.device) if d == 1 else starts + d
        if d == 1:
            h = h[:, : t - 2]
        logits = head.logits(h, target.lm_head)
        logp = torch.log_softmax(logits, dim=-1)
        losses.append(-(tprob[:, at] * logp).sum(-1).mean())
        agree.append((logits.argmax(-1) == targ[:, at]).float().mean().detach())
    return losses, agree


def heldout_windows(tokens: np.ndarray, cfg: TrainConfig) -> list[torch.Tensor]:
    n = cfg.eval_windows
    stride = max(1, (len(tokens) - cfg.seq_len) // n)
    rows = np.stack([tokens[i * stride : i * stride + cfg.seq_len] for i in range(n)]).astype(np.int64)
    return list(torch.from_numpy(rows).split(cfg.batch_size))


@torch.no_grad()
def evaluate(head: Eagle3Head, target: Target, windows: list[torch.Tensor], depth: int) -> dict:
    head.eval()
    ce, ag = np.zeros(depth), np.zeros(depth)
    for x in windows:
        l, a = depth_losses(head, target, x.to(target.embed.device), depth)
        ce += [float(v) for v in l]
        ag += [float(v) for v in a]
    head.train()
    n = len(windows)
    return {
        "soft_ce_by_depth": [round(float(v) / n, 4) for v in ce],
        "agreement_by_depth": [round(float(v) / n, 4) for v in ag],
    }


def corpus_tokens(out: Path, target: Path = TARGET, tokens: Path | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(training stream, held-out stream, corpus record) with the target's tokenizer; cached in ``out``.

    A :mod:`training.trunk` checkpoint target has no vocabulary of its own (it keeps the shipped model's tokenizer):
    its corpus is the one it was trained on, the token file of ``python -m training.trunk --prepare`` (``tokens``,
    default :data:`training.trunk.DATA`: ``train``, and ``heldout_stdlib`` as the held-out stream), read with numpy
    alone."""
    if is_checkpoint(target):
        from training.trunk import DATA, load_data

        tokens = Path(tokens or DATA)
        if not tokens.exists():
            raise SystemExit(
                f"{tokens} is missing: write it with python -m training.trunk --prepare [--data PATH] (on a "
                f"machine with the package) and carry it (--tokens PATH)"
            )
        data, info = load_data(tokens)
        return data["train"], data["heldout_stdlib"], {**info, "tokens_file": str(tokens)}
    from training.corpus import describe, load_corpus, split_corpus
    from training.tokenizer import encode_files, tokenizer_from_vocab, vocab_from_gguf

    cache = out / "tokens.npz"
    files = load_corpus()
    info = describe(files)
    if cache.exists():
        z = np.load(cache)
        if str(z["fingerprint"]) == str(info.get("fingerprint")):
            return z["train"], z["heldout"], info
    tok = tokenizer_from_vocab(vocab_from_gguf(target))
    train, held = split_corpus(files)
    arrays = {
        "train": np.asarray(encode_files(tok, [f.text for f in train]), dtype=np.int32),
        "heldout": np.asarray(encode_files(tok, [f.text for f in held]), dtype=np.int32),
        "fingerprint": np.asarray(str(info.get("fingerprint"))),
    }
    out.mkdir(parents=True, exist_ok=True)
    np.savez(cache.with_suffix(".tmp.npz"), **arrays)
    os.replace(cache.with_suffix(".tmp.npz"), cache)
    return arrays["train"], arrays["heldout"], info


class _Stop:
    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:  # pragma: no cover - signal handler
        self.requested = True


def save_checkpoint(
    path: Path, head: Eagle3Head, opt, step: int, hc: HeadConfig, tc: TrainConfig, elapsed: float, best: dict | None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "head": to_cpu(head.state_dict()),
            "optimizer": to_cpu(opt.state_dict()),
            "step": step,
            "elapsed_seconds": elapsed,
            "head_config": hc.to_dict(),
            "train_config": asdict(tc),
            "best": best,
        },
        tmp,
    )
    os.replace(tmp, path)


def to_cpu(obj):
    """``obj`` (a state dict, nested dicts / lists) with every tensor on the CPU (a checkpoint written on a GPU
    loads anywhere)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def train(
    out: Path,
    *,
    max_minutes: float | None,
    fresh: bool,
    threads: int,
    layer_ids: list[int] | None,
    log_path: Path,
    steps: int | None = None,
    target: Path = TARGET,
    device: str = "cpu",
    overrides: dict | None = None,
    tokens: Path | None = None,
) -> Path:
    """Train (or resume) into ``out/last.pt`` against ``target`` (GGUF or trunk checkpoint; ``tokens``: its token
    file, :func:`corpus_tokens`) on ``device`` (F32 on both); returns the checkpoint path."""
    device = torch.device(device)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    ck_path = out / "last.pt"
    if fresh:
        ck_path.unlink(missing_ok=True)
    ck = torch.load(ck_path, map_location="cpu", weights_only=False) if ck_path.exists() else None
    hc = HeadConfig(**ck["head_config"]) if ck else HeadConfig(**({"target_layer_ids": layer_ids} if layer_ids else {}))
    if ck and layer_ids and list(layer_ids) != hc.target_layer_ids:
        raise SystemExit(f"{ck_path} was trained with layer ids {hc.target_layer_ids}; use --fresh")
    tc = TrainConfig(**ck["train_config"]) if ck else TrainConfig()
    if steps is not None:
        tc.steps = steps
    for k, v in (overrides or {}).items():
        setattr(tc, k, v)
    log = JsonLog(log_path)
    train_tokens, held_tokens, info = corpus_tokens(out, target, tokens)
    target_path, target = target, Target(target, hc.target_layer_ids, device)
    if not ck and not layer_ids:
        check_default_layer_ids(target_path, target.n_layer, hc.target_layer_ids)
    if target.embed.shape[1] != hc.hidden_size:
        raise SystemExit(f"{target_path.name}: hidden size {target.embed.shape[1]}, the head's {hc.hidden_size}")
    torch.manual_seed(tc.seed)
    head = Eagle3Head(hc).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=tc.lr, betas=(0.9, 0.95), weight_decay=tc.weight_decay)
    step, elapsed_before, best = 0, 0.0, None
    if ck:
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["optimizer"])
        step, elapsed_before, best = ck["step"], ck["elapsed_seconds"], ck.get("best")
        log({"event": "resumed", "step": step, "elapsed_seconds": round(elapsed_before, 1)})
    else:
        log(
            {
                "event": "start",
                "head_config": hc.to_dict(),
                "train_config": asdict(tc),
                "corpus": info,
                "params": sum(p.numel() for p in head.parameters()),
                "torch": torch.__version__,
                "threads": threads,
                "target": target_path.name,
                "device": str(device),
            }
        )
    held = heldout_windows(held_tokens, tc)
    stop = _Stop()
    t0 = t_ck = t_log = time.time()
    n_tok = 0
    head.train()
    while step < tc.steps:
        lr = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(train_tokens, step, tc).to(device)
        losses, agree = depth_losses(head, target, x, tc.depth)
        loss = sum(tc.depth_decay**i * l for i, l in enumerate(losses))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(head.parameters(), tc.grad_clip)
        opt.step()
        step += 1
        n_tok += x.numel()
        now = time.time()
        if step % tc.log_every == 0:
            log(
                {
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "soft_ce": [round(l.item(), 4) for l in losses],
                    "agreement": [round(float(a), 4) for a in agree],
                    "lr": round(lr, 6),
                    "grad_norm": round(float(gnorm), 3),
                    "tok_per_s": round(n_tok / max(1e-9, now - t_log)),
                    "elapsed_seconds": round(elapsed_before + now - t0, 1),
                }
            )
            t_log, n_tok = now, 0
        if step % tc.eval_every == 0 or step == tc.steps:
            ev = evaluate(head, target, held, tc.depth)
            best = {"step": step, **ev}
            log({"step": step, "eval_heldout": ev})
        done = step == tc.steps
        paused = (max_minutes is not None and (now - t0) / 60 >= max_minutes) or stop.requested
        if done or paused or (now - t_ck) / 60 >= tc.checkpoint_minutes:
            save_checkpoint(ck_path, head, opt, step, hc, tc, elapsed_before + time.time() - t0, best)
            t_ck = time.time()
        if paused and not done:
            log({"event": "paused", "step": step, "elapsed_seconds": round(elapsed_before + time.time() - t0, 1)})
            break
    else:
        log({"event": "finished", "step": step, "elapsed_seconds": round(elapsed_before + time.time() - t0, 1)})
    return ck_path


# ----------------------------------------------------------------------------------------------- export


def head_weights(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The shipped form of the head's weights: matrices rounded to F16 (what the F16 GGUF stores), norms F32."""
    return {
        k: (v.detach().to(torch.float16) if v.ndim >= 2 else v.detach().float()).contiguous().clone()
        for k, v in state_dict.items()
    }


def save_head(path: Path, head: Eagle3Head, meta: dict | None = None) -> Path:
    """The head weights alone (``training/eagle3-head.pt``): ``{"head_config", "weights", "meta"}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.loads(json.dumps(meta or {}, default=float))  # plain data: the file loads with weights_only=True
    torch.save({"head_config": head.cfg.to_dict(), "weights": head_weights(head.state_dict()), "meta": meta}, path)
    return path


def load_head(path: Path = SHIPPED_HEAD) -> tuple[Eagle3Head, dict]:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    head = Eagle3Head(HeadConfig(**obj["head_config"]))
    head.load_state_dict({k: v.float() for k, v in obj["weights"].items()})
    return head.eval(), obj.get("meta", {})


def write_target_hf(target_dir: Path, target: Path = TARGET) -> Path:
    """The target as a Hugging Face checkpoint (config + tokenizer; the converter's ``--target-model-dir``)."""
    from mtp_explorer.devtools.hf_export import export_hf_checkpoint

    return export_hf_checkpoint(target, target_dir)


def write_head_hf(head: Eagle3Head, hf_dir: Path, target_dir: Path, description: str | None = None) -> Path:
    """The head as a SpecForge-layout checkpoint: ``config.json``, ``model.safetensors`` (F32: ``fc.weight``,
    ``midlayer.*``, ``norm.weight``), plus the target's tokenizer files (the converter reads the vocabulary from
    ``--target-model-dir``; the copies let :func:`convert_with_llama_cpp` register the pre-tokenizer hash)."""
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    (hf_dir / "config.json").write_text(json.dumps(head.cfg.hf_config(), indent=2) + "\n", encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target_dir / name, hf_dir / name)
    meta = {
        "general.name": HEAD_NAME,
        "general.description": description
        or (
            f"mtp-explorer EAGLE-3 draft head for pystdlib-qwen35-mtp (target layer inputs "
            f"{head.cfg.target_layer_ids}); borrows the target's token embeddings and output head"
        ),
    }
    (hf_dir / "gguf-metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (hf_dir / "README.md").write_text(
        f'---\nlicense: "{LICENSE}"\n---\n\n# {HEAD_NAME}\n\nSee mtp_explorer/models/MODEL.md.\n', encoding="utf-8"
    )
    return hf_dir


def convert_head(
    head: Eagle3Head,
    out_gguf: Path,
    work: Path,
    *,
    outtype: str = "f16",
    description: str | None = None,
    target: Path = TARGET,
) -> Path:
    """Head -> HF checkpoint -> llama.cpp's ``convert_hf_to_gguf.py --target-model-dir`` (``target``, a GGUF,
    exported) -> ``out_gguf``."""
    from mtp_explorer.devtools.hf_export import convert_with_llama_cpp

    target_dir = write_target_hf(work / "target-hf", target)
    hf_dir = write_head_hf(head, work / "eagle3-hf", target_dir, description)
    return convert_with_llama_cpp(
        hf_dir,
        out_gguf,
        outtype=outtype,
        extra_args=["--target-model-dir", str(target_dir), "--metadata", str(hf_dir / "gguf-metadata.json")],
    )


def describe_training(meta: dict) -> str | None:
    if not meta:
        return None
    return (
        f"mtp-explorer EAGLE-3 draft head for pystdlib-qwen35-mtp: target layer inputs {meta.get('layer_ids')}, "
        f"{meta.get('steps')} steps ({meta.get('minutes', 0):.0f} min on CPU) of self-distillation on the Python "
        f"standard library; borrows the target's token embeddings and output head"
    )


# ----------------------------------------------------------------------------------------------- measuring


#: A run's draft rounds as the target first verified them, with the acceptance by depth (training.draft's parser).
Rounds = DraftRounds
parse_rounds = draft_rounds


def reference_binary() -> Path:
    return Path(os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or REFERENCE)


def spec_args(spec: str, head: Path | None, n_max: int) -> list[str]:
    args = ["--spec-type", spec, "--spec-draft-n-max", str(n_max)]
    return (["-md", str(head)] if head is not None else []) + args


def run_spec(
    prompt: str,
    spec: str,
    *,
    head: Path | None = None,
    n_max: int = 3,
    max_tokens: int = 64,
    target: Path = TARGET,
    threads: int = 1,
    attempts: int = 8,
    binary: Path | None = None,
) -> Rounds | None:
    """One greedy llama-speculative-simple run (``--spec-type spec``, ``-md head`` if given) with its debug log;
    ``None`` when the log lost its tail ``attempts`` times (llama.cpp's log thread is not joined at exit)."""
    from training.draft import run_reference_rounds

    return run_reference_rounds(
        target,
        prompt,
        spec_args(spec, head, n_max),
        parse_rounds,
        max_tokens=max_tokens,
        threads=threads,
        attempts=attempts,
        binary=binary or reference_binary(),
    )


def measure(
    head: Path = SHIPPED_GGUF,
    *,
    spec: str = "draft-eagle3",
    prompts: list[str] | None = None,
    n_maxes=(1, 3),
    max_tokens: int = 64,
    target: Path = TARGET,
) -> dict:
    """A head's ``--spec-type spec`` (``head`` as ``-md``; draft-eagle3, draft-dflash) vs draft-mtp acceptance on the
    demo prompts (held-out snippets), by depth."""
    import mtp_explorer as mx
    from training.draft import greedy_pieces
    from training.llama_ref import LlamaMTP

    prompts = prompts or [p.text for p in mx.demo_prompts()]
    with LlamaMTP(target, n_ctx=1024, n_threads=1) as m:
        plain = [greedy_pieces(m, p, max_tokens + 8) for p in prompts]
    t0 = time.time()
    res: dict = {
        "head": head.name,
        "target": target.name,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "runs": [],
    }
    for spec_type, h in ((spec, head), ("draft-mtp", None)):
        for n in n_maxes:
            tot = Rounds()
            complete = equal = 0
            for i, p in enumerate(prompts):
                r = run_spec(p, spec_type, head=h, n_max=n, max_tokens=max_tokens, target=target)
                if r is None:
                    continue
                complete += 1
                equal += plain[i].startswith(r.text)
                for a in ("drafted", "accepted", "rounds", "generated", "reported_drafted", "reported_accepted"):
                    setattr(tot, a, getattr(tot, a) + getattr(r, a))
                for j in range(len(r.by_depth)):
                    while len(tot.by_depth) <= j:
                        tot.by_depth.append(0)
                        tot.drafted_at.append(0)
                    tot.by_depth[j] += r.by_depth[j]
                    tot.drafted_at[j] += r.drafted_at[j]
            res["runs"].append(
                {
                    "spec": spec_type,
                    "n_max": n,
                    "prompts_with_complete_logs": complete,
                    "texts_equal_to_plain_greedy": f"{equal}/{complete}",
                    "drafted": tot.drafted,
                    "accepted": tot.accepted,
                    "rounds": tot.rounds,
                    "acceptance": round(tot.accepted / max(1, tot.drafted), 4),
                    "accepted_per_round": round(tot.accepted / max(1, tot.rounds), 3),
                    "p_draft_d_accepted": [round(a / max(1, tot.rounds), 3) for a in tot.by_depth],
                    "p_draft_d_given_previous": [
                        round(tot.by_depth[j] / max(1, tot.by_depth[j - 1] if j else tot.rounds), 3)
                        for j in range(len(tot.by_depth))
                    ],
                    "binary_totals": {"n_drafted": tot.reported_drafted, "n_accept": tot.reported_accepted},
                }
            )
    exe = reference_binary()
    res["command"] = (
        f"{exe.relative_to(ROOT) if exe.is_relative_to(ROOT) else exe} -m {target.name} "
        f"[-md {head.name} --spec-type {spec} | --spec-type draft-mtp] --spec-draft-n-max N "
        f"-p PROMPT -n {max_tokens} -c 1024 -t 1 --temp 0 --seed 0 -lv 5"
    )
    res["seconds"] = round(time.time() - t0, 1)
    return res


def measure_on(head: Path, spec: str, n_maxes=(1, 3), n_prompts: int = 0, target: Path = TARGET) -> dict:
    """:func:`measure` on the demo prompts, or on ``n_prompts`` held-out prompts of :mod:`training.evaluate`, with the
    prompt set named (the ``--measure`` of the head scripts), against ``target`` (a GGUF)."""
    prompts = None
    if n_prompts:
        from training.evaluate import heldout_prompts

        prompts = heldout_prompts(n_prompts)
    res = measure(head, spec=spec, n_maxes=n_maxes, prompts=prompts, target=target)
    res["prompt_set"] = f"training.evaluate.heldout_prompts({n_prompts})" if n_prompts else "mx.demo_prompts()"
    return res


# ----------------------------------------------------------------------------------------------- command line


def add_train_overrides(p: argparse.ArgumentParser) -> None:
    """``--batch-size``, ``--seq-len``, ``--eval-windows``: TrainConfig overrides (default: the config's)."""
    p.add_argument("--batch-size", type=int, default=None, help="override TrainConfig.batch_size")
    p.add_argument("--seq-len", type=int, default=None, help="override TrainConfig.seq_len")
    p.add_argument("--eval-windows", type=int, default=None, help="override TrainConfig.eval_windows")


def train_overrides(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("batch_size", "seq_len", "eval_windows") if getattr(args, k) is not None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoints, token cache, HF exports")
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time (checkpointed)")
    p.add_argument("--steps", type=int, default=None, help="override the schedule length (fresh runs)")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--layer-ids",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="target layer ids (layer inputs; n_layer = the final post-norm state), default 2,3,4 (fresh runs;"
        " the shipped 4-layer target's: another target needs its own)",
    )
    p.add_argument(
        "--target",
        type=Path,
        default=TARGET,
        help="frozen target to train against: a qwen35 GGUF (default: the bundled model) or a training.trunk "
        "checkpoint (*.safetensors, torch alone; tokens from training.trunk --prepare's file)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: target, head and batches (F32 on both)")
    add_train_overrides(p)
    p.add_argument(
        "--tokens",
        type=Path,
        default=None,
        help="with a checkpoint --target: training.trunk --prepare's token file (default its --data default)",
    )
    p.add_argument("--log", type=Path, default=LOG_DIR / LOG_NAME)
    p.add_argument("--export-only", action="store_true", help="export the checkpoint in --out without training")
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--random", action="store_true", help="export an untrained head (layout check)")
    p.add_argument("--gguf", type=Path, default=None, help="output GGUF (default: --out/pystdlib-eagle3.gguf)")
    p.add_argument("--head", type=Path, default=None, help="head weights file to write (default --out/eagle3-head.pt)")
    p.add_argument("--install", action="store_true", help="write training/eagle3-head.pt and the shipped GGUF")
    p.add_argument("--convert-shipped", action="store_true", help="convert training/eagle3-head.pt to --gguf")
    p.add_argument(
        "--measure", action="store_true", help="measure --gguf (default: the shipped head) against --target, JSON"
    )
    p.add_argument("--n-max", type=lambda s: [int(v) for v in s.split(",")], default=[1, 3])
    p.add_argument(
        "--prompts",
        type=int,
        default=0,
        help="--measure on N held-out prompts of training.evaluate (default: the 6 demo prompts)",
    )
    args = p.parse_args(argv)
    if is_checkpoint(args.target) and not args.no_export:
        p.error("a checkpoint --target trains only (add --no-export); export converts against the bundled GGUF")
    torch.set_num_threads(args.threads)
    out = args.out
    if args.measure:
        if is_checkpoint(args.target):
            p.error("--measure runs llama.cpp: give a GGUF --target")
        print(
            json.dumps(
                measure_on(args.gguf or SHIPPED_GGUF, "draft-eagle3", args.n_max, args.prompts, args.target), indent=2
            )
        )
        return 0
    if args.convert_shipped:
        head, meta = load_head(SHIPPED_HEAD)
        gguf = args.gguf or out / f"{HEAD_NAME}.gguf"
        with tempfile.TemporaryDirectory() as tmp:
            convert_head(head, gguf, Path(tmp), description=describe_training(meta))
        print(f"wrote {gguf} ({gguf.stat().st_size / 1e6:.2f} MB)")
        return 0
    if args.random:
        torch.manual_seed(0)
        head = Eagle3Head(HeadConfig(**({"target_layer_ids": args.layer_ids} if args.layer_ids else {})))
        meta = {}
    else:
        if not args.export_only:
            train(
                out,
                max_minutes=args.max_minutes,
                fresh=args.fresh,
                threads=args.threads,
                layer_ids=args.layer_ids,
                log_path=args.log,
                steps=args.steps,
                target=args.target,
                device=args.device,
                overrides=train_overrides(args),
                tokens=args.tokens,
            )
        if args.no_export:
            return 0
        ck = torch.load(out / "last.pt", map_location="cpu", weights_only=False)
        head = Eagle3Head(HeadConfig(**ck["head_config"]))
        head.load_state_dict(ck["head"])
        meta = {
            "steps": ck["step"],
            "minutes": round(ck["elapsed_seconds"] / 60, 1),
            "layer_ids": head.cfg.target_layer_ids,
            "eval_heldout": ck.get("best"),
            "train_config": ck["train_config"],
        }
    head_path = SHIPPED_HEAD if args.install else (args.head or out / "eagle3-head.pt")
    save_head(head_path, head, meta)
    head, meta = load_head(head_path)  # export exactly what was saved (F16-rounded matrices)
    gguf = SHIPPED_GGUF if args.install else (args.gguf or out / f"{HEAD_NAME}.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        convert_head(head, gguf, Path(tmp), description=describe_training(meta), target=args.target)
    print(
        f"wrote {head_path} ({head_path.stat().st_size / 1e6:.2f} MB) and {gguf} ({gguf.stat().st_size / 1e6:.2f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
