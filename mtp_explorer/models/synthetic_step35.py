"""SYNTHETIC random-weight ``step35`` (Step-3.5 / Step-3.7-Flash) models with **three chained MTP heads**.

These models are **not trained**: the weights are random, drawn from a fixed seed.  They exist to exercise
llama.cpp's *chained-head* MTP mode (``chain_heads`` in ``common/speculative.cpp``'s ``draft-mtp`` driver:
``n_layer_nextn > 1`` and no shared memory): draft step ``i`` runs MTP head ``i`` (the draft context selects it
with ``llama_set_nextn_layer_offset(ctx_dft, i)``), each head a full decoder block of its own with its own KV,
and ``n_max`` is clamped to the number of heads.

Architecture (llama.cpp ``src/models/step35.cpp``, ``LLM_ARCH_STEP35``)
---------------------------------------------------------------------
``n_embd=64``, ``n_vocab=384`` (the byte-BPE vocabulary of :mod:`.synthetic`), 2 trunk layers -- layer 0 a dense
sliding-window layer (``leading_dense_block_count=1``), layer 1 a full-attention MoE layer -- and 3 NextN/MTP
blocks (``block_count=5``, ``nextn_predict_layers=3``), full-attention MoE blocks as the converter pads Step-3.5's
``layer_types`` for them.  Attention: 4 query heads, 2 KV heads, ``head_dim=16``, per-head Q/K RMS norm and the
head-wise output gate ``attn_gate`` (Step-3.5's ``g_proj``); RoPE on all 16 dims in sliding-window layers and on 8
in full-attention ones (llama.cpp halves ``rope.dimension_count`` for them; Step-3.5's ``partial_rotary_factors``
1.0 / 0.5); sliding window 128 (an ISWA KV cache).  MoE: 4 routed experts (``expert_feed_forward_length=32``), 2
used, sigmoid gating with an ``exp_probs_b`` selection bias, normalised weights, and a shared expert
(``expert_shared_feed_forward_length=32``).  Each MTP block has ``nextn.eh_proj`` / ``enorm`` / ``hnorm`` and a
``shared_head_norm``; ``shared_head_head`` and ``embed_tokens`` are left out (llama.cpp then uses ``output`` and
``token_embd``).  Step-3.5-Flash has the same layout at 45 trunk layers and 3 MTP heads.

Knobs (the trick of :mod:`.synthetic` and :mod:`.synthetic_glm4moe`)
--------------------------------------------------------------------
``context_mix``
    Scale of every trunk output projection (``attn_output``, ``ffn_down``, ``ffn_down_exps``, ``ffn_down_shexp``)
    times :data:`CONTEXT_SCALE`.  At ``0`` the residual stream is the token embedding alone, so the trunk's logits
    are a function ``f(token)`` of the current token.
``mtp_fidelity`` / ``head_fidelity``
    MTP block ``k``'s ``nextn.eh_proj`` is ``φ_k * [I | 0] + (1 - φ_k) * R`` (``R`` random), ``[I | 0]`` selecting
    the embedding half of ``concat(enorm(embed(token)), hnorm(h))``; its own output projections are near zero and
    its ``shared_head_norm`` equals ``output_norm``, so at ``φ_k = 1`` head ``k``'s logits for its input token equal
    the trunk's ``f(token)``.  ``head_fidelity`` gives one ``φ_k`` per head (acceptance by depth is then a property
    of each head, as with trained chained heads); by default every head has ``mtp_fidelity``.

The acceptance the knobs give, measured with llama.cpp's ``llama-speculative-simple``, is in ``SYNTHETIC.md``
beside this module.  The output head lets only printable-ASCII tokens win the argmax and is untied from the
embedding.  Files are about 1.2 MB (F32) and are written in well under a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from .gguf_qwen35 import ByteBPEVocab, Shapes, dense_ffn_shapes, nextn_shapes, transformer_keys, write_f32_gguf
from .synthetic import Knobs, synthetic_vocab, write_synthetic
from .synthetic_glm4moe import biased_moe_shapes, scaled_moe_tensors

ARCH = "step35"

#: Factor between ``context_mix`` and the scale applied to the trunk's output projections.
CONTEXT_SCALE = 0.5

__all__ = [
    "ARCH",
    "CONTEXT_SCALE",
    "Step35Config",
    "step35_config",
    "step35_expected_tensor_shapes",
    "step35_keys",
    "synthetic_step35_tensors",
    "write_step35_gguf",
    "write_synthetic_step35",
]


@dataclass(frozen=True)
class Step35Config:
    """Hyper-parameters of a ``step35`` model; ``n_layer`` counts trunk layers, ``nextn_predict_layers`` the chained
    MTP heads.  ``swa_layers`` marks the sliding-window trunk layers (the MTP blocks are full attention)."""

    n_vocab: int = 384
    n_embd: int = 64
    n_layer: int = 2
    n_layer_dense_lead: int = 1
    n_ff: int = 128  #: dense FFN width (leading dense layers)
    n_ff_exp: int = 32
    n_ff_shexp: int = 32
    n_expert: int = 4
    n_expert_used: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    swa_layers: tuple[int, ...] = (0,)
    n_swa: int = 128
    rope_freq_base: float = 5_000_000.0
    rope_freq_base_swa: float = 10_000.0
    rms_eps: float = 1e-5
    n_ctx_train: int = 4096
    nextn_predict_layers: int = 3

    def __post_init__(self) -> None:
        if self.nextn_predict_layers < 1:
            raise ParameterError("a step35 MTP model needs nextn_predict_layers >= 1 (3 for Step-3.5's chained heads)")
        if not 0 <= self.n_layer_dense_lead <= self.n_layer:
            raise ParameterError("n_layer_dense_lead must be in [0, n_layer]")
        if self.n_expert < 1 or not 1 <= self.n_expert_used <= self.n_expert:
            raise ParameterError("need n_expert >= 1 and 1 <= n_expert_used <= n_expert")
        if self.n_head % self.n_head_kv:
            raise ParameterError("n_head must be a multiple of n_head_kv")
        if self.head_dim % 4:
            raise ParameterError("head_dim must be a multiple of 4 (full-attention layers rotate head_dim / 2)")
        if not set(self.swa_layers) <= set(range(self.n_layer)) or len(self.swa_layers) == self.n_layer:
            raise ParameterError("swa_layers must be trunk layers, and at least one trunk layer must be full attention")

    @property
    def block_count(self) -> int:
        """GGUF ``block_count``: trunk layers plus the MTP heads."""
        return self.n_layer + self.nextn_predict_layers

    def is_moe(self, il: int) -> bool:
        """Whether block ``il`` has a MoE FFN (every block from ``n_layer_dense_lead`` on, MTP heads included)."""
        return il >= self.n_layer_dense_lead


def step35_config(**overrides) -> Step35Config:
    """The synthetic model's architecture (see the module docstring); fields may be overridden."""
    return Step35Config(**overrides)


def step35_expected_tensor_shapes(cfg: Step35Config) -> Shapes:
    """Every tensor name llama.cpp loads for ``cfg`` -> (numpy shape, required); numpy shapes are ggml's ``ne``
    reversed.  "Required" here means written by the writer (Q/K norms and the attention gate are optional to
    llama.cpp but part of Step-3.5)."""
    e, hd = cfg.n_embd, cfg.head_dim
    q_dim, kv_dim = cfg.n_head * hd, cfg.n_head_kv * hd
    shapes: Shapes = {
        "token_embd.weight": ((cfg.n_vocab, e), True),
        "output_norm.weight": ((e,), True),
        "output.weight": ((cfg.n_vocab, e), False),
    }
    for il in range(cfg.block_count):
        p = f"blk.{il}."
        shapes |= {
            p + "attn_norm.weight": ((e,), True),
            p + "attn_q.weight": ((q_dim, e), True),
            p + "attn_k.weight": ((kv_dim, e), True),
            p + "attn_v.weight": ((kv_dim, e), True),
            p + "attn_q_norm.weight": ((hd,), True),
            p + "attn_k_norm.weight": ((hd,), True),
            p + "attn_output.weight": ((e, q_dim), True),
            p + "attn_gate.weight": ((cfg.n_head, e), True),
            p + "ffn_norm.weight": ((e,), True),
        }
        shapes |= (
            biased_moe_shapes(p, e, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp)
            if cfg.is_moe(il)
            else dense_ffn_shapes(cfg, p)
        )
        if il >= cfg.n_layer:
            shapes |= nextn_shapes(p, e, cfg.n_vocab)
    return shapes


def step35_keys(cfg: Step35Config) -> dict[str, object]:
    """The hyperparameters (``add_<key>`` names of the GGUF writer) as llama.cpp's converter writes them for
    ``Step3p5ForCausalLM`` (``conversion/step3.py``), per-layer head counts and the sliding-window pattern over every
    block, the MTP heads included."""
    import gguf

    return transformer_keys(cfg, rope_dim=cfg.head_dim) | {
        "head_count": [cfg.n_head] * cfg.block_count,
        "head_count_kv": [cfg.n_head_kv] * cfg.block_count,
        "rope_freq_base_swa": cfg.rope_freq_base_swa,
        "sliding_window": cfg.n_swa,
        "sliding_window_pattern": [il in cfg.swa_layers for il in range(cfg.block_count)],
        "expert_count": cfg.n_expert,
        "expert_used_count": cfg.n_expert_used,
        "expert_feed_forward_length": cfg.n_ff_exp,
        "expert_shared_feed_forward_length": cfg.n_ff_shexp,
        "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        "expert_weights_norm": True,
        "leading_dense_block_count": cfg.n_layer_dense_lead,
        "layer_norm_rms_eps": cfg.rms_eps,
        "nextn_predict_layers": cfg.nextn_predict_layers,
    }


def synthetic_step35_tensors(
    cfg: Step35Config, vocab: ByteBPEVocab, knobs: Knobs = Knobs(), head_fidelity: tuple[float, ...] | None = None
) -> dict[str, np.ndarray]:
    """Random tensors (llama.cpp convention) for a synthetic model; see the module docstring."""
    return scaled_moe_tensors(cfg, vocab, knobs, step35_expected_tensor_shapes(cfg), CONTEXT_SCALE, head_fidelity)


def write_step35_gguf(
    path: str | Path,
    cfg: Step35Config,
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    name: str = "step35-mtp",
    description: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write an F32 ``step35`` GGUF with ``cfg.nextn_predict_layers`` MTP heads; returns the path."""
    return write_f32_gguf(
        path,
        ARCH,
        cfg,
        step35_expected_tensor_shapes(cfg),
        step35_keys(cfg),
        tensors,
        vocab,
        name=name,
        description=description,
        extra_metadata=extra_metadata,
    )


def write_synthetic_step35(path: str | Path, *, head_fidelity: tuple[float, ...] | None = None, **settings) -> Path:
    """Write a SYNTHETIC (random-weight, untrained) ``step35`` GGUF with chained MTP heads; returns the path.

    ``settings`` are the fields of :class:`~.synthetic.Knobs` (``seed``, ``context_mix``, ``mtp_fidelity``,
    ``logit_scale``) and of :func:`step35_config` (``nextn_predict_layers=3``, ...).  ``head_fidelity`` gives each MTP
    head its own fidelity in [0, 1] (one value per head; default: ``mtp_fidelity`` for every head).  With
    ``context_mix=0`` and fidelity 1 every head reproduces the trunk (100% greedy acceptance at every depth).  The
    knobs are stored under ``mtp_explorer.*`` metadata keys (``mtp_explorer.head_fidelity`` too when given).
    """
    knob_names = {f.name for f in dataclasses.fields(Knobs)}
    knobs = Knobs(**{k: v for k, v in settings.items() if k in knob_names})
    cfg = step35_config(**{k: v for k, v in settings.items() if k not in knob_names})
    if head_fidelity is not None:
        head_fidelity = tuple(float(f) for f in head_fidelity)
        if len(head_fidelity) != cfg.nextn_predict_layers or not all(0.0 <= f <= 1.0 for f in head_fidelity):
            raise ParameterError(
                f"head_fidelity needs {cfg.nextn_predict_layers} values in [0, 1] (one per MTP "
                f"head), got {head_fidelity}"
            )
    vocab = synthetic_vocab(cfg.n_vocab)
    tensors = synthetic_step35_tensors(cfg, vocab, knobs, head_fidelity)
    if head_fidelity is not None:
        vocab = dataclasses.replace(
            vocab, extra={**vocab.extra, "mtp_explorer.head_fidelity": ",".join(map(str, head_fidelity))}
        )
    return write_synthetic(write_step35_gguf, path, cfg, vocab, tensors, knobs, ARCH)
