"""A DFlash draft head for the bundled target, trained here, exported for llama.cpp's ``draft-dflash``.

    python -m training.dflash --random --gguf /tmp/dflash/random-dflash.gguf   # SYNTHETIC untrained head (layout /
                                                                                # loading / engine-port check)
    python -m training.dflash --max-minutes 30 --no-export   # train (resumes from --out, default
                                                             # ~/.cache/mtp-explorer/dflash; log training/logs/)
    python -m training.dflash --export-only --gguf X.gguf    # checkpoint -> head .pt -> llama.cpp's converter -> X.gguf
    python -m training.dflash --check-first-draft --gguf X.gguf   # llama.cpp drafts what the PyTorch head drafts
    python -m training.dflash --measure --gguf X.gguf        # draft-dflash vs draft-mtp acceptance (JSON)

The head computes what llama.cpp 0.3.36's ``dflash`` graph computes (``src/models/dflash.cpp``, the plain DFlash
decoder: no SWA, no DSpark Markov head, no DFlash2 selector), driven as ``common/speculative.cpp``
(``common_speculative_impl_draft_dflash``) drives it:

* **KV injection** (``process()``, after every target decode, with the target's batch): for each target row at
  position p the draft gets ``f_p = concat(L_a[p], L_b[p], L_c[p])``, the target's layer INPUTS (pre-norm residual
  stream entering layer il = HF ``hidden_states[il]``) at the GGUF's ``dflash.target_layers``;
  ``g_p = hidden_norm(fc(f_p))`` and, in every draft layer l, ``K_l[p] = rope(k_norm(k_proj_l(g_p)), p)``,
  ``V_l[p] = v_proj_l(g_p)`` are written into the draft's KV cache at p (no attention, no attn_norm on g).
  Rows the target rejected are removed again by llama-speculative-simple's ``seq_rm``.
* **Block draft** (``draft()``, one decode): tokens ``[id_last, <mask> x n_max]`` at positions ``pos0 .. pos0+n_max``
  where ``pos0`` is ``id_last``'s position (the target has not decoded it yet, so the cache holds injected rows
  ``0 .. pos0-1``).  Each layer is a Qwen3 decoder layer on the token embeddings (the TARGET's ``tok_embd``,
  borrowed through ``ctx_other``): ``n = input_layernorm(h)``, q/k/v from n with per-head q_norm/k_norm, RoPE NeoX
  at the block positions, NON-causal attention over every cell of the sequence (the injected context rows and the
  whole block), ``h += o_proj(attn)``, ``h += mlp(post_attention_layernorm(h))``; ``logits = output(norm(h))`` with
  the TARGET's output matrix.  Slot i = 1..n_max is the draft of the token at ``pos0 + i``: greedy top-1 of the
  top-10-renormalised distribution, stopping at the first slot under ``--spec-draft-p-min`` (default 0: never).
  Slot 0's logits are never read.  ``n_max`` is clamped to ``block_size - 1``.
* The M-RoPE target makes the converter write degenerate sections ``[head_dim/2, 0, 0, 0]`` (rope type MROPE with
  positions ``{p, p, p, 0}``), which is exactly NeoX RoPE on all ``head_dim`` dims at position p.

RMS norms are llama-style (``w * x_hat``).  ``<mask>`` is ``<|endoftext|>`` (4095, the target's only special token,
``dflash_config.mask_token_id``): llama.cpp embeds it with the target's frozen ``tok_embd`` row (a head that shipped
its own mask embedding would need its own 4096 x 256 ``tok_embd`` and ``output``: 4 MB more in F16).

Target layer ids: HF ids ``[0, 1, 2]`` (layer OUTPUTS; the converter writes ``target_layers = [1, 2, 3]``, the
layer INPUTS llama.cpp extracts): the outputs of the trunk's three gated-delta-net layers, i.e. every state between
the embedding and the only full-attention layer (layer 3).  llama.cpp's DFlash reads only
``llama_get_embeddings_layer_inp`` (no ``h_nextn`` fallback, unlike draft-eagle3's id == n_layer), so the deepest
state it can get is the input of layer 3; layer input 0 is the token embedding, which carries nothing the head
cannot get itself.  DFlash's own recipe spreads the ids from shallow to deep, which for a 4-layer trunk is all of
them.

Training is self-distillation on teacher-forced windows of the training split (:mod:`training.corpus`, never the
held-out files): the frozen target (:class:`training.eagle3.Target`) gives the layer inputs and its next-token
distribution; for anchors a in a window (context rows ``0 .. a-1``, block ``[x_a, M, M, M]`` at ``a .. a+3``),
slot i is trained with the cross-entropy against the target's distribution at position ``a + i - 1`` (what greedy
verification checks slot i against), weight ``decay ** (i - 1)``.

First trained head (``training/logs/dflash-train.jsonl``: 1851 of 2200 steps, 38 min on one CPU thread, stopped by
``--max-minutes``; held-out top-1 agreement with the target by slot 0.611 / 0.282 / 0.171), measured with
llama-speculative-simple (greedy, ``-n 64``, every text equal to the plain greedy one) against draft-mtp:
demo prompts, n_max 1: 171/222 = 0.770 (draft-mtp 0.795); n_max 3: 213/540 = 0.394, 1.16 accepted per round,
by depth 0.781 / 0.306 / 0.077 (draft-mtp 0.62, 1.85, 0.78 / 0.60 / 0.47); 20 held-out prompts, n_max 1: 0.769
(draft-mtp 0.844), n_max 3: 0.424, 1.25 per round (draft-mtp 0.712, 2.10).  Slot 1 is nearly as good as the MTP
head; the later slots, drafted in parallel from masks, are much weaker.

Export: the head as a ``DFlashDraftModel`` Hugging Face checkpoint (``config.json`` with ``dflash_config``;
``model.safetensors`` with ``fc``, ``hidden_norm``, ``norm``, ``layers.N.*``; no ``embed_tokens`` / ``lm_head``),
converted by llama.cpp's own ``convert_hf_to_gguf.py --target-model-dir`` (the target exported by
:func:`training.eagle3.write_target_hf`) to an F16 GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from training import eagle3 as E
from training.eagle3 import JsonLog, RMSNorm, _Stop, corpus_tokens, heldout_windows, rotate_half
from training.train import batch_at, lr_at

ROOT = E.ROOT
TARGET = E.TARGET
HEAD_NAME, SHIPPED_GGUF, SHIPPED_HEAD, DEFAULT_OUT = E.head_files("dflash")
LOG_DIR = E.LOG_DIR
LICENSE = E.LICENSE


@dataclass
class HeadConfig:
    """Architecture of the DFlash head (Qwen3 decoder layers over the target's hidden size)."""

    hidden_size: int = 256  #: must equal the target's: tok_embd / output are borrowed from it
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    vocab_size: int = 4096
    target_hidden_size: int = 256
    target_layer_ids: list[int] = field(default_factory=lambda: [0, 1, 2])  #: HF ids: layer OUTPUTS
    block_size: int = 4
    mask_token_id: int = 4095
    max_position_embeddings: int = 4096
    bos_token_id: int = 4095
    eos_token_id: int = 4095

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def llama_layer_ids(self) -> list[int]:
        """The layer INPUTS llama.cpp extracts (the converter's ``[i + 1 for i in target_layer_ids]``)."""
        return [i + 1 for i in self.target_layer_ids]

    def hf_config(self) -> dict:
        """``config.json`` of the checkpoint that llama.cpp's converter reads as DFlash (conversion/qwen.py)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "num_hidden_layers": self.num_hidden_layers,
            "num_target_layers": 4,
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
            "tie_word_embeddings": False,
            "attention_bias": False,
            "use_sliding_window": False,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "block_size": self.block_size,
            },
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "float32",
        }


@dataclass
class TrainConfig:
    seed: int = 2718
    steps: int = 2200  #: schedule length (about 0.9-1.1 s a step on one CPU thread)
    batch_size: int = 8
    seq_len: int = 256
    anchors: int = 96  #: random anchors per window (of seq_len - block_size)
    slot_decay: float = 0.8
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


class _Attn(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)


class _MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attn(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)


class DFlashDraftModel(nn.Module):
    """The trainable tensors, named as the HF ``DFlashDraftModel`` checkpoints name them (without ``model.``)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.cfg = c
        self.fc = nn.Linear(len(c.target_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList([_Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    # --- pieces -------------------------------------------------------------------------------------------------

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """NeoX RoPE (HF rotate_half) of ``x`` (..., N, D) at integer positions ``pos`` (broadcast to (..., N))."""
        f = pos.to(torch.float32)[..., None] * self.inv_freq
        f = torch.cat([f, f], dim=-1)
        return x * f.cos() + rotate_half(x) * f.sin()

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """(..., N, n*D) -> (..., n, N, D)."""
        y = x.view(*x.shape[:-1], n, self.cfg.head_dim)
        return y.movedim(-2, -3)

    def _expand(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.cfg.num_attention_heads // self.cfg.num_key_value_heads, dim=-3)

    def encode(self, feats: torch.Tensor) -> torch.Tensor:
        """g = hidden_norm(fc(features)): the fused target rows (``inp_g_embeddings``)."""
        return self.hidden_norm(self.fc(feats))

    def context_kv(self, g: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the injected (K, V) of rows g (B, T, H) at positions ``pos`` (T,): (B, nkv, T, D) each."""
        c = self.cfg
        out = []
        for layer in self.layers:
            a = layer.self_attn
            k = self.rope(a.k_norm(self._heads(a.k_proj(g), c.num_key_value_heads)), pos)
            v = self._heads(a.v_proj(g), c.num_key_value_heads)
            out.append((k, v))
        return out

    def blocks(
        self, emb: torch.Tensor, pos: torch.Tensor, ctx: list[tuple[torch.Tensor, torch.Tensor]], visible: torch.Tensor
    ) -> torch.Tensor:
        """The pre-norm states of noise blocks.

        ``emb`` (B, A, S, H): token embeddings of A blocks of S tokens per batch row; ``pos`` (B, A, S) their
        positions; ``ctx`` per layer (K, V) (B, nkv, T, D) of the injected context rows; ``visible`` (B, A, T) bool:
        which context rows block a sees (llama.cpp: the rows the cache holds, positions < pos0).  Attention is
        non-causal: each block row sees its visible context rows and every row of its own block.
        """
        c = self.cfg
        b, na, s, _ = emb.shape
        scale = c.head_dim**-0.5
        h = emb
        neg = torch.zeros(visible.shape, dtype=emb.dtype, device=emb.device).masked_fill(
            ~visible, float("-inf")
        )  # (B, A, T)
        neg = neg[:, None, :, None, :]  # (B, 1, A, 1, T)
        for layer, (ck, cv) in zip(self.layers, ctx):
            a = layer.self_attn
            x = layer.input_layernorm(h)  # (B, A, S, H)
            q = self.rope(a.q_norm(self._heads(a.q_proj(x), c.num_attention_heads)), pos[:, :, None])  # (B,A,nh,S,D)
            k = self.rope(a.k_norm(self._heads(a.k_proj(x), c.num_key_value_heads)), pos[:, :, None])
            v = self._heads(a.v_proj(x), c.num_key_value_heads)
            k, v = self._expand(k), self._expand(v)  # (B, A, nh, S, D)
            q = q.transpose(1, 2)  # (B, nh, A, S, D)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            ckx, cvx = self._expand(ck), self._expand(cv)  # (B, nh, T, D)
            s_ctx = torch.einsum("bhasd,bhtd->bhast", q, ckx) * scale + neg
            s_own = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, nh, A, S, S)
            p = torch.softmax(torch.cat([s_ctx, s_own], dim=-1), dim=-1)
            t = ckx.shape[2]
            o = torch.einsum("bhast,bhtd->bhasd", p[..., :t], cvx) + torch.matmul(p[..., t:], v)
            o = o.permute(0, 2, 3, 1, 4).reshape(b, na, s, -1)  # (B, A, S, nh*D)
            h = h + a.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    def logits(self, h: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), lm_head)

    def window(self, feats: torch.Tensor, x: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """Teacher-forced blocks on a window: ``feats`` (B, T, F) target features of x_0..x_{T-1}, ``anchors``
        (B, A) positions a (>= 1): block ``[x_a, M, ...]`` at ``a .. a+S-1`` over context rows ``0 .. a-1``.
        Returns the pre-norm states (B, A, S, H)."""
        c = self.cfg
        b, t, _ = feats.shape
        s = c.block_size
        g = self.encode(feats)
        dev = feats.device
        ctx = self.context_kv(g, torch.arange(t, device=dev))
        toks = torch.full((*anchors.shape, s), c.mask_token_id, dtype=torch.long, device=dev)
        toks[..., 0] = torch.gather(x, 1, anchors)
        emb = F.embedding(toks, embed)
        pos = anchors[..., None] + torch.arange(s, device=dev)
        visible = torch.arange(t, device=dev)[None, None, :] < anchors[..., None]
        return self.blocks(emb, pos, ctx, visible)


# ----------------------------------------------------------------------------------------------- the target


def make_target(cfg: HeadConfig, gguf: Path = TARGET, device: torch.device | str = "cpu") -> E.Target:
    """The frozen target (a GGUF or a :mod:`training.trunk` checkpoint, see :class:`training.eagle3.Target`) giving
    the layer inputs llama.cpp extracts (``cfg.llama_layer_ids``)."""
    target = E.Target(gguf, [], device)
    hi = target.n_layer - 2  # llama.cpp's DFlash reads layer inputs only: the deepest is layer n_layer - 1's
    if any(i < 0 or i > hi for i in cfg.target_layer_ids):
        raise ValueError(
            f"layer ids {cfg.target_layer_ids} (HF ids: layer outputs; llama.cpp reads the inputs "
            f"{cfg.llama_layer_ids}) outside 0..{hi} for {target.path.name} ({target.n_layer} layers)"
        )
    target.layer_ids = cfg.llama_layer_ids
    return target


@torch.no_grad()
def first_draft(
    head: DFlashDraftModel, target: E.Target, ids: list[int], n: int, top_k: int = 10
) -> list[tuple[int, float]]:
    """What llama.cpp's draft-dflash drafts first after a prompt ``ids``: llama-speculative-simple decodes
    ``ids[:-1]`` with the target (injected rows 0..N-2), then the block ``[ids[-1], M x n]`` at N-1..N-1+n, slots
    1..n.  Per slot: (argmax token, its probability renormalised over the top ``top_k``, as the drafter logs it)."""
    c = head.cfg
    x = torch.tensor([ids])
    feats, _, _ = target(x)
    n_tok = len(ids)
    g = head.encode(feats[:, : n_tok - 1])
    ctx = head.context_kv(g, torch.arange(n_tok - 1))
    toks = torch.tensor([[[ids[-1]] + [c.mask_token_id] * n]])
    pos = (n_tok - 1 + torch.arange(n + 1)).view(1, 1, -1)
    h = head.blocks(F.embedding(toks, target.embed), pos, ctx, torch.ones(1, 1, n_tok - 1, dtype=torch.bool))
    logits = head.logits(h[0, 0, 1:], target.lm_head)
    out = []
    for row in logits:
        top = torch.topk(row, top_k)
        out.append((int(top.indices[0]), float(torch.softmax(top.values, -1)[0])))
    return out


def logged_first_draft(log: str) -> list[tuple[int, float]]:
    """The first draft() call's top candidates (token, p) per slot, from llama-speculative-simple's ``-lv 5`` log."""
    return E.logged_first_draft(log, "draft-dflash")


def run_first_draft(
    head_gguf: Path, prompt: str, n: int, *, binary: Path | None = None, target: Path = TARGET, attempts: int = 8
) -> tuple[list[tuple[int, float]], str]:
    """llama.cpp's first block draft after ``prompt`` (``-lv 5`` log), retried when the log lost its tail."""
    exe = binary or E.reference_binary()
    cmd = [
        str(exe),
        "-m",
        str(target),
        "-md",
        str(head_gguf),
        "--spec-type",
        "draft-dflash",
        "--spec-draft-n-max",
        str(n),
        "-p",
        prompt,
        "-n",
        "4",
        "-c",
        "256",
        "-t",
        "1",
        "--temp",
        "0",
        "--seed",
        "0",
        "-lv",
        "5",
    ]
    log = ""
    for _ in range(attempts):  # the debug log thread can lose its tail at exit (less often into files than pipes)
        with tempfile.TemporaryDirectory() as tmp:
            err = Path(tmp, "err")
            with err.open("wb") as fe:
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=fe, timeout=180, check=True)
            log = err.read_text(encoding="utf-8", errors="replace")
        got = logged_first_draft(log)
        if len(got) == n:
            return got, log
    return logged_first_draft(log), log


def check_first_draft(head: DFlashDraftModel, head_gguf: Path, prompts=None, n: int = 3) -> dict:
    """PyTorch vs llama.cpp first block draft on ``prompts``: tokens equal, probabilities within 0.01."""
    from training.llama_ref import LlamaMTP

    prompts = prompts or [
        "def fib(n):",
        "class Point:\n    def __init__(self, x, y):\n",
        "import os\n\n\ndef walk(top):\n",
    ]
    target = make_target(head.cfg)
    with LlamaMTP(TARGET, n_ctx=256, n_threads=1) as m:
        ids = [m.tokenize(p) for p in prompts]
    res = {"head": str(head_gguf), "prompts": []}
    ok = True
    for p, x in zip(prompts, ids):
        logged, _ = run_first_draft(head_gguf, p, n)
        ours = first_draft(head, target, x, n)
        same = [t for t, _ in logged] == [t for t, _ in ours]
        dp = max((abs(a[1] - b[1]) for a, b in zip(logged, ours)), default=float("nan"))
        ok &= same and len(logged) == n and dp <= 0.01
        res["prompts"].append(
            {
                "prompt": p,
                "llama_cpp": logged,
                "pytorch": [(t, round(q, 4)) for t, q in ours],
                "same_tokens": same,
                "max_abs_dp": round(dp, 5),
            }
        )
    res["ok"] = bool(ok)
    return res


# ----------------------------------------------------------------------------------------------- training


def pick_anchors(b: int, hi: int, n_anchors: int, rng: np.random.Generator | None = None) -> torch.Tensor:
    """(B, A) block anchors in ``1 .. hi``: evenly spaced for evaluation (``rng`` None), else ``n_anchors`` distinct
    random ones per row, sorted."""
    if rng is None:
        return torch.linspace(1, hi, n_anchors).round().long().expand(b, -1)
    return torch.from_numpy(
        np.stack([np.sort(rng.choice(np.arange(1, hi + 1), n_anchors, replace=False)) for _ in range(b)])
    ).long()


def block_losses(
    head: DFlashDraftModel,
    target: E.Target,
    x: torch.Tensor,
    n_anchors: int,
    decay: float,
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(weighted loss, per-slot CE against the target's distribution, per-slot top-1 agreement with its argmax).

    Slot i of the block anchored at a predicts x_{a+i}: the target's distribution at position a+i-1."""
    c = head.cfg
    s = c.block_size
    b, t = x.shape
    feats, _, tlog = target(x)
    anchors = pick_anchors(b, t - s + 1, n_anchors, rng).to(x.device)  # a + s - 2 <= t - 1
    h = head.window(feats, x, anchors, target.embed)  # (B, A, S, H)
    losses, agree = [], []
    for i in range(1, s):
        at = anchors + i - 1
        tl = torch.gather(tlog, 1, at[..., None].expand(-1, -1, tlog.shape[-1]))
        logits = head.logits(h[:, :, i], target.lm_head)
        logp = torch.log_softmax(logits, dim=-1)
        losses.append(-(torch.softmax(tl, -1) * logp).sum(-1).mean())
        agree.append((logits.argmax(-1) == tl.argmax(-1)).float().mean().detach())
    loss = sum(decay**i * l for i, l in enumerate(losses))
    return loss, losses, agree


@torch.no_grad()
def evaluate(
    head: DFlashDraftModel, target: E.Target, windows: list[torch.Tensor], tc: TrainConfig, losses=None
) -> dict:
    """Held-out per-slot CE and top-1 agreement of ``losses`` (default :func:`block_losses`; one that returns a
    fourth item, a dict of scalars, has their means reported too)."""
    head.eval()
    ce = ag = None
    extra: dict[str, float] = {}
    for x in windows:
        out = (losses or block_losses)(head, target, x.to(target.embed.device), tc.anchors, tc.slot_decay)
        l, a = np.array([float(v) for v in out[1]]), np.array([float(v) for v in out[2]])
        ce, ag = (l, a) if ce is None else (ce + l, ag + a)
        for k, v in (out[3] if len(out) > 3 else {}).items():
            extra[k] = extra.get(k, 0.0) + float(v)
    head.train()
    n = len(windows)
    return {
        "soft_ce_by_slot": [round(float(v) / n, 4) for v in ce],
        "agreement_by_slot": [round(float(v) / n, 4) for v in ag],
        **{k: round(v / n, 4) for k, v in extra.items()},
    }


def save_checkpoint(
    path: Path,
    head: DFlashDraftModel,
    opt,
    step: int,
    hc: HeadConfig,
    tc: TrainConfig,
    elapsed: float,
    best: dict | None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "head": E.to_cpu(head.state_dict()),
            "optimizer": E.to_cpu(opt.state_dict()),
            "step": step,
            "elapsed_seconds": elapsed,
            "head_config": hc.to_dict(),
            "train_config": asdict(tc),
            "best": best,
        },
        tmp,
    )
    os.replace(tmp, path)


def train(
    out: Path,
    *,
    max_minutes: float | None,
    fresh: bool,
    threads: int,
    log_path: Path,
    steps: int | None = None,
    head_cls=None,
    config_cls=None,
    train_config_cls=None,
    losses=None,
    init=None,
    layer_ids: list[int] | None = None,
    target: Path = TARGET,
    device: str = "cpu",
    overrides: dict | None = None,
    tokens: Path | None = None,
) -> Path:
    """Train (or resume) into ``out/last.pt``; returns the checkpoint path.

    ``target``: a qwen35 GGUF (default the bundled one) or a :mod:`training.trunk` checkpoint; ``layer_ids``: HF ids
    (layer outputs) of a fresh run (default the config's, only for a 4-layer target); ``device``: cpu or cuda (F32
    on both; checkpoints hold CPU tensors); ``overrides``: TrainConfig fields; ``tokens``: a checkpoint target's
    token file (:func:`training.eagle3.corpus_tokens`).

    The defaults train a DFlash head; :mod:`training.dspark` passes its head class (``head_cls(config)``), config
    classes, losses (as :func:`block_losses`, optionally with a fourth item: a dict of scalars to log) and ``init``
    (called on a fresh head before training, returns a JSON-able record of what it did)."""
    head_cls, config_cls = head_cls or DFlashDraftModel, config_cls or HeadConfig
    train_config_cls, losses = train_config_cls or TrainConfig, losses or block_losses
    device = torch.device(device)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    ck_path = out / "last.pt"
    if fresh:
        ck_path.unlink(missing_ok=True)
    ck = torch.load(ck_path, map_location="cpu", weights_only=False) if ck_path.exists() else None
    hc = (
        config_cls(**ck["head_config"])
        if ck
        else config_cls(**({"target_layer_ids": list(layer_ids)} if layer_ids else {}))
    )
    if ck and layer_ids and list(layer_ids) != hc.target_layer_ids:
        raise SystemExit(f"{ck_path} was trained with layer ids {hc.target_layer_ids}; use --fresh")
    tc = train_config_cls(**ck["train_config"]) if ck else train_config_cls()
    if steps is not None:
        tc.steps = steps
    for k, v in (overrides or {}).items():
        setattr(tc, k, v)
    log = JsonLog(log_path)
    train_tokens, held_tokens, info = corpus_tokens(out, target, tokens)
    target_path, target = target, make_target(hc, target, device)
    if not ck and not layer_ids:
        E.check_default_layer_ids(target_path, target.n_layer, hc.target_layer_ids)
    if target.embed.shape[1] != hc.hidden_size:
        raise SystemExit(f"{target_path.name}: hidden size {target.embed.shape[1]}, the head's {hc.hidden_size}")
    torch.manual_seed(tc.seed)
    head = head_cls(hc)
    init_record = init(head) if init is not None and not ck else None
    head.to(device)
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
                "llama_cpp_target_layers": hc.llama_layer_ids,
                "init": init_record,
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
        rng = np.random.default_rng([tc.seed, step, 1])
        loss, ce, agree, *more = losses(head, target, x, tc.anchors, tc.slot_decay, rng)
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
                    "soft_ce": [round(l.item(), 4) for l in ce],
                    **{k: round(float(v), 4) for k, v in (more[0] if more else {}).items()},
                    "agreement": [round(float(a), 4) for a in agree],
                    "lr": round(lr, 6),
                    "grad_norm": round(float(gnorm), 3),
                    "tok_per_s": round(n_tok / max(1e-9, now - t_log)),
                    "elapsed_seconds": round(elapsed_before + now - t0, 1),
                }
            )
            t_log, n_tok = now, 0
        if step % tc.eval_every == 0 or step == tc.steps:
            ev = evaluate(head, target, held, tc, losses)
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


head_weights = E.head_weights


def save_head(path: Path, head: DFlashDraftModel, meta: dict | None = None) -> Path:
    """The head weights alone: ``{"head_config", "weights", "meta"}`` (matrices F16, norms F32)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.loads(json.dumps(meta or {}, default=float))
    torch.save({"head_config": head.cfg.to_dict(), "weights": head_weights(head.state_dict()), "meta": meta}, path)
    return path


def load_head(path: Path, head_cls=None, config_cls=None) -> tuple[DFlashDraftModel, dict]:
    """A head saved by :func:`save_head` (``head_cls(config_cls(...))``, default a DFlash head) and its meta."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    head = (head_cls or DFlashDraftModel)((config_cls or HeadConfig)(**obj["head_config"]))
    head.load_state_dict({k: v.float() for k, v in obj["weights"].items()})
    return head.eval(), obj.get("meta", {})


def write_head_hf(
    head: DFlashDraftModel, hf_dir: Path, target_dir: Path, description: str | None = None, name: str = HEAD_NAME
) -> Path:
    """The head as a ``DFlashDraftModel`` checkpoint: ``config.json``, ``model.safetensors`` (F32: ``fc.weight``,
    ``hidden_norm.weight``, ``norm.weight``, ``layers.N.*``), plus the target's tokenizer files (the converter
    reads the vocabulary from ``--target-model-dir``; the copies let the pre-tokenizer hash be registered)."""
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    (hf_dir / "config.json").write_text(json.dumps(head.cfg.hf_config(), indent=2) + "\n", encoding="utf-8")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target_dir / fn, hf_dir / fn)
    meta = {
        "general.name": name,
        "general.description": description
        or (
            f"mtp-explorer DFlash draft head for pystdlib-qwen35-mtp (target layer inputs "
            f"{head.cfg.llama_layer_ids}, block {head.cfg.block_size}); borrows the target's token embeddings "
            f"and output head"
        ),
    }
    (hf_dir / "gguf-metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (hf_dir / "README.md").write_text(f'---\nlicense: "{LICENSE}"\n---\n\n# {name}\n', encoding="utf-8")
    return hf_dir


def convert_head(
    head: DFlashDraftModel,
    out_gguf: Path,
    work: Path,
    *,
    outtype: str = "f16",
    description: str | None = None,
    name: str = HEAD_NAME,
) -> Path:
    """Head -> HF checkpoint -> llama.cpp's ``convert_hf_to_gguf.py --target-model-dir`` -> ``out_gguf``."""
    from mtp_explorer.devtools.hf_export import convert_with_llama_cpp

    target_dir = E.write_target_hf(work / "target-hf")
    hf_dir = write_head_hf(head, work / "dflash-hf", target_dir, description, name)
    out_gguf.parent.mkdir(parents=True, exist_ok=True)
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
        f"mtp-explorer DFlash draft head for pystdlib-qwen35-mtp: target layer inputs {meta.get('layer_ids')}, "
        f"block {meta.get('block_size')}, {meta.get('steps')} steps ({meta.get('minutes', 0):.0f} min on CPU) of "
        f"self-distillation on the Python standard library; borrows the target's token embeddings and output head"
    )


def random_head(seed: int = 0, cfg: HeadConfig | None = None) -> DFlashDraftModel:
    """A SYNTHETIC untrained head: random weights large enough (std 1.5/sqrt(fan_in)) that the injected context
    and the block positions move the drafts (at the training init, std 0.02, every slot echoes ``<mask>``), and
    norms perturbed so that every tensor matters in a layout check."""
    torch.manual_seed(seed)
    head = DFlashDraftModel(cfg or HeadConfig())
    with torch.no_grad():
        for _, v in head.named_parameters():
            if v.ndim == 1:
                v.add_(0.1 * torch.randn_like(v))
            else:
                v.normal_(std=1.5 / v.shape[1] ** 0.5)
    return head.eval()


# ----------------------------------------------------------------------------------------------- measuring


def measure(
    head: Path, *, prompts: list[str] | None = None, n_maxes=(1, 3), max_tokens: int = 64, target: Path = TARGET
) -> dict:
    """draft-dflash (``head``) vs draft-mtp acceptance on the demo prompts (held-out snippets), by depth
    (:func:`training.eagle3.measure`)."""
    return E.measure(head, spec="draft-dflash", prompts=prompts, n_maxes=n_maxes, max_tokens=max_tokens, target=target)


# ----------------------------------------------------------------------------------------------- command line


def add_target_options(p: argparse.ArgumentParser, layer_ids_help: str) -> None:
    """``--target``, ``--device``, ``--layer-ids`` and the TrainConfig overrides of the DFlash / DSpark trainers."""
    p.add_argument(
        "--target",
        type=Path,
        default=TARGET,
        help="frozen target to train against: a qwen35 GGUF (default: the bundled model) or a training.trunk "
        "checkpoint (*.safetensors, torch alone; tokens from training.trunk --prepare's file)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: target, head and batches (F32 on both)")
    p.add_argument("--layer-ids", type=lambda s: [int(v) for v in s.split(",")], default=None, help=layer_ids_help)
    E.add_train_overrides(p)
    p.add_argument(
        "--tokens",
        type=Path,
        default=None,
        help="with a checkpoint --target: training.trunk --prepare's token file (default its --data default)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoints, token cache")
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time (checkpointed)")
    p.add_argument("--steps", type=int, default=None, help="override the schedule length")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log", type=Path, default=None, help="JSON log (default training/logs/dflash-<time>.jsonl)")
    p.add_argument("--export-only", action="store_true", help="export the checkpoint in --out without training")
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--random", action="store_true", help="export an untrained (SYNTHETIC) head: layout check")
    p.add_argument(
        "--gguf", type=Path, default=None, help="output / measured GGUF (default --out/pystdlib-dflash.gguf)"
    )
    p.add_argument("--head", type=Path, default=None, help="head weights file (default --out/dflash-head.pt)")
    p.add_argument(
        "--check-first-draft",
        action="store_true",
        help="compare llama.cpp's first block draft of --gguf with the PyTorch head of --head (JSON)",
    )
    p.add_argument("--measure", action="store_true", help="measure --gguf against draft-mtp (JSON)")
    p.add_argument("--n-max", type=lambda s: [int(v) for v in s.split(",")], default=[1, 3])
    p.add_argument(
        "--prompts",
        type=int,
        default=0,
        help="--measure on N held-out prompts of training.evaluate (default: the demo prompts)",
    )
    add_target_options(
        p,
        "HF layer ids (layer OUTPUTS; llama.cpp reads the inputs, +1), default 0,1,2 (fresh runs; "
        "the shipped 4-layer target's: another target needs its own, at most n_layer - 2)",
    )
    args = p.parse_args(argv)
    if E.is_checkpoint(args.target) and not args.no_export:
        p.error("a checkpoint --target trains only (add --no-export); export converts against the bundled GGUF")
    torch.set_num_threads(args.threads)
    out = args.out
    gguf = args.gguf or out / f"{HEAD_NAME}.gguf"
    head_path = args.head or out / ("dflash-random-head.pt" if args.random else "dflash-head.pt")
    if args.measure:
        print(json.dumps(E.measure_on(gguf, "draft-dflash", args.n_max, args.prompts), indent=2))
        return 0
    if args.check_first_draft:
        head, _ = load_head(head_path)
        print(json.dumps(check_first_draft(head, gguf, n=head.cfg.block_size - 1), indent=2))
        return 0
    name = HEAD_NAME
    if args.random:
        head = random_head()
        meta = {"synthetic": True}
        name = "SYNTHETIC-random-dflash"
        desc = (
            "SYNTHETIC untrained (random-init) DFlash draft head for pystdlib-qwen35-mtp: layout/loading check "
            "only, drafts are noise"
        )
    else:
        if not args.export_only:
            log = args.log or LOG_DIR / f"dflash-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
            train(
                out,
                max_minutes=args.max_minutes,
                fresh=args.fresh,
                threads=args.threads,
                log_path=log,
                steps=args.steps,
                layer_ids=args.layer_ids,
                target=args.target,
                device=args.device,
                overrides=E.train_overrides(args),
                tokens=args.tokens,
            )
        if args.no_export:
            return 0
        ck = torch.load(out / "last.pt", map_location="cpu", weights_only=False)
        head = DFlashDraftModel(HeadConfig(**ck["head_config"]))
        head.load_state_dict(ck["head"])
        meta = {
            "steps": ck["step"],
            "minutes": round(ck["elapsed_seconds"] / 60, 1),
            "layer_ids": head.cfg.llama_layer_ids,
            "block_size": head.cfg.block_size,
            "eval_heldout": ck.get("best"),
            "train_config": ck["train_config"],
        }
        desc = describe_training(meta)
    save_head(head_path, head, meta)
    head, meta = load_head(head_path)  # export exactly what was saved (F16-rounded matrices)
    with tempfile.TemporaryDirectory() as tmp:
        convert_head(head, gguf, Path(tmp), description=desc, name=name)
    print(
        f"wrote {head_path} ({head_path.stat().st_size / 1e6:.2f} MB) and {gguf} ({gguf.stat().st_size / 1e6:.2f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
