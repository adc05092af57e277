"""SYNTHETIC random-weight ``qwen35moe`` (Qwen3.5/3.6 MoE, e.g. Qwen3.6-35B-A3B) + MTP models for tests.

These models are **not trained**: the weights are random, drawn from a fixed seed.  They have the
architecture of Qwen3.6-35B-A3B at toy scale: a **hybrid recurrent** trunk (gated-delta-net layers
with one full-attention layer every four, so rejected drafts are undone with recurrent-state
snapshot slots) whose every FFN -- the NextN/MTP block's included -- is a mixture of experts.

Architecture (llama.cpp ``src/models/qwen35moe.cpp``, ``LLM_ARCH_QWEN35MOE``)
---------------------------------------------------------------------------
``n_embd=64``, ``n_vocab=384`` (the byte-BPE vocabulary of :mod:`.synthetic`), 4 trunk layers --
0-2 gated-delta-net, 3 full attention (``full_attention_interval=4``) -- and one NextN/MTP block
(``block_count=5``, ``nextn_predict_layers=1``), a full-attention block with a MoE FFN.
Full attention: 4 query heads (each with its output gate, as in Qwen3.5), 1 KV head,
``head_dim=16``, Q/K RMS norm, interleaved M-RoPE on 4 of 16 dims (``partial_rotary_factor=0.25``).
Gated delta net: 2 key heads, 4 value heads (``ssm_group_count=2``, ``ssm_time_step_rank=4``,
value heads in llama.cpp's tiled order), head dim 16, conv kernel 4.  MoE in every block:
8 routed experts (``expert_feed_forward_length=16``), 2 used, softmax routing with normalised
top-k weights, and one shared expert (``expert_shared_feed_forward_length=16``) gated by
``sigmoid(ffn_gate_inp_shexp . x)``.  Qwen3.6-35B-A3B has the same layout with ``n_embd=2048``,
40 layers, 16/2 attention heads of 256, 16/32 linear-attention heads of 128, 256 experts of 512
with 8 used and a shared expert of 512 (the ratios are kept where the toy scale allows).

Knobs (the same trick as :mod:`.synthetic` and :mod:`.synthetic_glm4moe`)
-------------------------------------------------------------------------
``context_mix``
    Scale of every trunk output projection (``attn_output``, ``ssm_out``, ``ffn_down_exps``,
    ``ffn_down_shexp``) times :data:`CONTEXT_SCALE`.  At ``0`` the residual stream is the token
    embedding alone, so the trunk's logits are a pure function ``f(token)`` of the current token;
    larger values let attention, the recurrent state and the experts change it.
``mtp_fidelity``
    The MTP block's ``nextn.eh_proj`` is ``mtp_fidelity * [I | 0] + (1 - mtp_fidelity) * R``
    (``R`` random), ``[I | 0]`` selecting the embedding half of ``concat(enorm(embed(token)),
    hnorm(h))`` -- the order ``graph_mtp`` uses.  The MTP block's own ``attn_output`` and expert
    ``ffn_down`` projections are near zero and its ``shared_head_norm`` equals ``output_norm``, so
    with fidelity 1 the MTP logits for a draft token equal the trunk's ``f(token)``.

The acceptance these knobs give, measured with the engine, is in ``SYNTHETIC.md`` beside this module.
``context_mix=0.5, mtp_fidelity=1`` gives a mix of fully accepted and partially rejected steps
(at ``n_max=3``: 32 steps fully accepted, 36 with a rollback, each rollback restoring the
recurrent snapshot slot of its length); the exact rate depends on the seed (seeds 0-3 at
``n_max=3, p_min=0.5``: 0.73, 0.98, 0.82, 0.98).

The output head lets only printable-ASCII tokens win the argmax (other rows are zero, EOS
included) and is untied from the embedding.  The model has 280,392 parameters; files are 1.1 MB
(F32) or 0.6 MB (``dtype="f16"``) and are written in well under a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from .gguf_qwen35 import ByteBPEVocab, Qwen35Config, Shapes, hybrid_keys, hybrid_tensor_shapes, write_hybrid_gguf
from .synthetic import (
    Knobs,
    _qwen35_init,
    finish_mtp_head,
    gated_delta_net_params,
    synthetic_vocab,
    trunk_tensors,
    write_synthetic,
)

ARCH = "qwen35moe"

#: Factor between ``context_mix`` and the scale applied to the trunk's output projections.
CONTEXT_SCALE = 0.25

__all__ = [
    "ARCH",
    "CONTEXT_SCALE",
    "Qwen35MoeConfig",
    "qwen35moe_config",
    "qwen35moe_expected_tensor_shapes",
    "synthetic_qwen35moe_tensors",
    "write_qwen35moe_gguf",
    "write_synthetic_qwen35moe",
]


@dataclass(frozen=True)
class Qwen35MoeConfig(Qwen35Config):
    """Hyper-parameters of a ``qwen35moe`` model: those of :class:`~.gguf_qwen35.Qwen35Config` (``n_ff``
    is only written as ``feed_forward_length``; llama.cpp falls back to it when the expert widths are
    absent) plus the experts.  Every block, the MTP block included, has a MoE FFN."""

    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 16  #: width of one routed expert
    n_ff_shexp: int = 16  #: width of the shared expert

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_expert < 1 or not 1 <= self.n_expert_used <= self.n_expert:
            raise ParameterError("need n_expert >= 1 and 1 <= n_expert_used <= n_expert")
        if self.n_ff_exp < 1 or self.n_ff_shexp < 1:
            raise ParameterError("expert widths must be positive")

    def is_moe(self, il: int) -> bool:
        """Whether block ``il`` has a MoE FFN: every block of a ``qwen35moe`` model."""
        return 0 <= il < self.block_count


def qwen35moe_config(**overrides) -> Qwen35MoeConfig:
    """The synthetic model's architecture (see the module docstring); fields may be overridden."""
    fields = dict(
        n_vocab=384,
        n_embd=64,
        n_layer=4,
        n_ff=16,
        n_head=4,
        n_head_kv=1,
        head_dim=16,
        full_attention_interval=4,
        ssm_conv_kernel=4,
        ssm_state_size=16,
        ssm_group_count=2,
        ssm_time_step_rank=4,
        rope_dim=4,
        rope_freq_base=10_000_000.0,
        rms_eps=1e-6,
        n_ctx_train=4096,
        nextn_predict_layers=1,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=16,
        n_ff_shexp=16,
    )
    return Qwen35MoeConfig(**(fields | overrides))


def moe_ffn_shapes(cfg: Qwen35MoeConfig, p: str) -> Shapes:
    """The MoE FFN of block prefix ``p``: router, stacked routed experts ``(n_expert, out, in)``, the
    shared expert and its 1-D gate (llama.cpp's ``ffn_gate_inp_shexp`` is ``{n_embd}``)."""
    e, ne, fe, fs = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp
    return {
        p + "ffn_gate_inp.weight": ((ne, e), True),
        p + "ffn_gate_exps.weight": ((ne, fe, e), True),
        p + "ffn_up_exps.weight": ((ne, fe, e), True),
        p + "ffn_down_exps.weight": ((ne, e, fe), True),
        p + "ffn_gate_inp_shexp.weight": ((e,), True),
        p + "ffn_gate_shexp.weight": ((fs, e), True),
        p + "ffn_up_shexp.weight": ((fs, e), True),
        p + "ffn_down_shexp.weight": ((e, fs), True),
    }


def qwen35moe_expected_tensor_shapes(cfg: Qwen35MoeConfig) -> Shapes:
    """Every tensor name llama.cpp loads for ``cfg`` -> (numpy shape, required): the ``qwen35`` layout
    (see :mod:`.gguf_qwen35`) with :func:`moe_ffn_shapes` in place of the dense FFN in every block."""
    return hybrid_tensor_shapes(cfg, moe_ffn_shapes)


def qwen35moe_keys(cfg: Qwen35MoeConfig) -> dict[str, object]:
    """The hyperparameters: ``qwen35``'s plus the expert counts and widths (as convert_hf_to_gguf writes
    them for Qwen3_5MoeForCausalLM; llama.cpp uses softmax routing with normalised weights for this arch)."""
    return hybrid_keys(cfg) | {
        "expert_count": cfg.n_expert,
        "expert_used_count": cfg.n_expert_used,
        "expert_feed_forward_length": cfg.n_ff_exp,
        "expert_shared_feed_forward_length": cfg.n_ff_shexp,
    }


def write_qwen35moe_gguf(
    path: str | Path,
    cfg: Qwen35MoeConfig,
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    name: str = "qwen35moe-mtp",
    **options,
) -> Path:
    """Write a ``qwen35moe`` GGUF with one MTP block; returns the path.

    ``tensors`` maps GGUF names to arrays in llama.cpp's convention (see :mod:`.gguf_qwen35`) with the
    shapes of :func:`qwen35moe_expected_tensor_shapes` (required ones present, unknown names rejected).
    ``options`` are those of :func:`~.gguf_qwen35.write_qwen35_gguf` (``dtype``, ``description``, ``license``,
    ``extra_metadata``); with ``dtype="f16"`` matrices and expert stacks are F16, 1-D tensors, the conv kernel
    and the router stay F32.
    """
    return write_hybrid_gguf(
        path,
        ARCH,
        cfg,
        qwen35moe_expected_tensor_shapes(cfg),
        qwen35moe_keys(cfg),
        tensors,
        vocab,
        name=name,
        **options,
    )


def _qwen35moe_init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("ffn_gate_inp_shexp.weight"):  # a 1-D projection, not a norm
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return _qwen35_init(name, shape, rng)


def synthetic_qwen35moe_tensors(
    cfg: Qwen35MoeConfig, vocab: ByteBPEVocab, knobs: Knobs = Knobs()
) -> dict[str, np.ndarray]:
    """Random tensors (llama.cpp convention) for a synthetic model; see the module docstring."""
    keep = lambda name: name == "output.weight" or name.endswith("shared_head_norm.weight")  # noqa: E731
    out, rng = trunk_tensors(cfg, vocab, knobs, qwen35moe_expected_tensor_shapes(cfg), keep, _qwen35moe_init)

    down = ("attn_output.weight", "ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")
    for il in range(cfg.block_count):
        p = f"blk.{il}."
        if cfg.is_recurrent(il):
            gated_delta_net_params(out, cfg, p, rng)
        scale = CONTEXT_SCALE * knobs.context_mix if il < cfg.n_layer else 1e-3
        for suffix in down:
            if p + suffix in out:
                out[p + suffix] *= scale

    return finish_mtp_head(out, cfg, knobs, rng)


def write_synthetic_qwen35moe(path: str | Path, *, dtype: str = "f32", **settings) -> Path:
    """Write a SYNTHETIC (random-weight, untrained) ``qwen35moe`` + MTP GGUF for tests; returns the path.

    A hybrid recurrent MoE model with the layout of Qwen3.6-35B-A3B (see the module docstring for the
    architecture).  ``settings`` are the fields of :class:`~.synthetic.Knobs` (``seed``, ``context_mix``,
    ``mtp_fidelity``, ``logit_scale``) and of :func:`qwen35moe_config` (``n_embd=..., n_layer=...,
    n_expert=...``).  ``context_mix`` (>= 0) scales the trunk's output projections by ``CONTEXT_SCALE *
    context_mix``: 0 makes the next token a function of the current token only (100% greedy acceptance with
    ``mtp_fidelity=1``).  ``mtp_fidelity`` in [0, 1] blends the MTP input projection between "reproduce the
    trunk's token->token function" (1) and random (0: ~0% acceptance).  ``dtype`` is ``"f32"`` or ``"f16"``.
    The knobs are stored under ``mtp_explorer.*`` metadata keys.
    """
    knob_names = {f.name for f in dataclasses.fields(Knobs)}
    knobs = Knobs(**{k: v for k, v in settings.items() if k in knob_names})
    cfg = qwen35moe_config(**{k: v for k, v in settings.items() if k not in knob_names})
    vocab = synthetic_vocab(cfg.n_vocab)
    tensors = synthetic_qwen35moe_tensors(cfg, vocab, knobs)
    return write_synthetic(write_qwen35moe_gguf, path, cfg, vocab, tensors, knobs, "qwen35moe", dtype=dtype)
