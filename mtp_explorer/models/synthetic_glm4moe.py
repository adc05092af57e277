"""SYNTHETIC random-weight ``glm4moe`` (GLM-4.5/4.6 MoE family) + MTP models for tests.

These models are **not trained**: the weights are random, drawn from a fixed seed.  They
exist to exercise MTP speculative decoding on an architecture **without recurrent layers**
(plain attention KV cache, so rejected drafts are undone by ``llama_memory_seq_rm`` alone,
no recurrent-state snapshot slots).

Architecture (llama.cpp ``src/models/glm4-moe.cpp``, ``LLM_ARCH_GLM4_MOE``)
---------------------------------------------------------------------------
``n_embd=64``, ``n_vocab=384`` (the byte-BPE vocabulary of :mod:`.synthetic`), 2 trunk
layers -- layer 0 dense (``leading_dense_block_count=1``), layer 1 MoE -- and one NextN/MTP
block (``block_count=3``, ``nextn_predict_layers=1``).  Attention: 4 query heads, 2 KV heads,
``head_dim=16``, Q/K/V biases (as in GLM-4.5), no Q/K norm, NEOX RoPE on 8 of 16 dims
(GLM's ``partial_rotary_factor=0.5``).  MoE: 4 routed experts (``expert_feed_forward_length
=32``), 2 used, 1 shared expert, sigmoid gating with an ``exp_probs_b`` selection bias,
normalised top-k weights.  The MTP block is always an MoE block in this arch (its graph
asserts ``ffn_gate_inp``), with ``nextn.eh_proj`` / ``enorm`` / ``hnorm`` and a
``shared_head_norm``; ``shared_head_head`` and ``embed_tokens`` are left out (llama.cpp then
uses ``output`` and ``token_embd``).

Knobs (the same trick as :mod:`.synthetic`)
-------------------------------------------
``context_mix``
    Scale of every trunk output projection (``attn_output``, ``ffn_down``,
    ``ffn_down_exps``, ``ffn_down_shexp``) times :data:`CONTEXT_SCALE`.  At ``0`` the residual
    stream is the token embedding alone, so the trunk's logits are a pure function
    ``f(token)`` of the current token; larger values let attention and the FFNs change it.
``mtp_fidelity``
    The MTP block's ``nextn.eh_proj`` is ``mtp_fidelity * [I | 0] + (1 - mtp_fidelity) * R``
    (``R`` random), ``[I | 0]`` selecting the embedding half of
    ``concat(enorm(embed(token)), hnorm(h))`` -- the order ``graph_mtp`` uses.  The MTP
    block's own ``attn_output`` / expert ``ffn_down`` projections are near zero and its
    ``shared_head_norm`` equals ``output_norm``, so with fidelity 1 the MTP logits for a
    draft token equal the trunk's ``f(token)``.

The acceptance these knobs give, measured with the engine, is in ``SYNTHETIC.md`` beside this module.
``context_mix=0.5, mtp_fidelity=1`` gives a mix of fully accepted and partially rejected
steps (at ``n_max=3``: 39 of 61 steps fully accepted, 21 with a rollback); the exact rate
depends on the seed (seeds 0-3 at ``n_max=3, p_min=0.5``: 0.94, 0.60, 0.85, 0.61).  The
output head lets only printable-ASCII tokens win the argmax (other rows are zero, EOS
included) and is untied from the embedding.  Files are ~0.74 MB (F32) and are written in
~0.1 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from .gguf_qwen35 import ByteBPEVocab, Shapes, dense_ffn_shapes, nextn_shapes, transformer_keys, write_f32_gguf
from .synthetic import Knobs, finish_mtp_head, synthetic_vocab, trunk_tensors, write_synthetic

ARCH = "glm4moe"

#: Factor between ``context_mix`` and the scale applied to the trunk's output projections.
CONTEXT_SCALE = 0.5

__all__ = [
    "ARCH",
    "CONTEXT_SCALE",
    "Glm4MoeConfig",
    "glm4moe_config",
    "glm4moe_expected_tensor_shapes",
    "synthetic_glm4moe_tensors",
    "write_glm4moe_gguf",
    "write_synthetic_glm4moe",
]


@dataclass(frozen=True)
class Glm4MoeConfig:
    """Hyper-parameters of a ``glm4moe`` model; ``n_layer`` counts trunk layers only."""

    n_vocab: int = 384
    n_embd: int = 64
    n_layer: int = 2
    n_layer_dense_lead: int = 1
    n_ff: int = 128  #: dense FFN width (leading dense layers)
    n_ff_exp: int = 32  #: width of one routed expert; the shared expert is n_ff_exp * n_expert_shared
    n_expert: int = 4
    n_expert_used: int = 2
    n_expert_shared: int = 1
    expert_weights_scale: float = 1.0
    expert_weights_norm: bool = True
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    rope_dim: int = 8
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-5
    n_ctx_train: int = 4096
    nextn_predict_layers: int = 1

    def __post_init__(self) -> None:
        if self.nextn_predict_layers != 1:
            raise ParameterError("llama.cpp 0.3.36's glm4moe MTP graph supports exactly one NextN block")
        if not 0 <= self.n_layer_dense_lead <= self.n_layer:
            raise ParameterError("n_layer_dense_lead must be in [0, n_layer]")
        if self.n_expert < 1 or not 1 <= self.n_expert_used <= self.n_expert:
            raise ParameterError("need n_expert >= 1 and 1 <= n_expert_used <= n_expert")
        if self.n_expert_shared < 1:
            raise ParameterError("the glm4moe MTP graph needs a shared expert (n_expert_shared >= 1)")
        if self.n_head % self.n_head_kv:
            raise ParameterError("n_head must be a multiple of n_head_kv")
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ParameterError("rope_dim must be even and in (0, head_dim]")

    @property
    def block_count(self) -> int:
        """GGUF ``block_count``: trunk layers plus the NextN block."""
        return self.n_layer + self.nextn_predict_layers

    def is_moe(self, il: int) -> bool:
        """Whether block ``il`` has a MoE FFN (every block from ``n_layer_dense_lead`` on, MTP included)."""
        return il >= self.n_layer_dense_lead


def glm4moe_config(**overrides) -> Glm4MoeConfig:
    """The synthetic model's architecture (see the module docstring); fields may be overridden."""
    return Glm4MoeConfig(**overrides)


def glm4moe_expected_tensor_shapes(cfg: Glm4MoeConfig) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Every tensor name llama.cpp loads for ``cfg`` -> (numpy shape, required).

    Numpy shapes are ggml's ``ne`` reversed, i.e. ``(out_features, in_features)`` for
    matrices and ``(n_expert, out, in)`` for stacked expert weights.
    """
    e, v = cfg.n_embd, cfg.n_vocab
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    ne, fe = cfg.n_expert, cfg.n_ff_exp
    fs = cfg.n_ff_exp * cfg.n_expert_shared
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((v, e), True),
        "output_norm.weight": ((e,), True),
        "output.weight": ((v, e), False),
    }
    for il in range(cfg.block_count):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = ((e,), True)
        shapes[p + "attn_q.weight"] = ((q_dim, e), True)
        shapes[p + "attn_k.weight"] = ((kv_dim, e), True)
        shapes[p + "attn_v.weight"] = ((kv_dim, e), True)
        shapes[p + "attn_q.bias"] = ((q_dim,), False)
        shapes[p + "attn_k.bias"] = ((kv_dim,), False)
        shapes[p + "attn_v.bias"] = ((kv_dim,), False)
        shapes[p + "attn_output.weight"] = ((e, q_dim), True)
        shapes[p + "post_attention_norm.weight"] = ((e,), True)
        if cfg.is_moe(il):
            shapes.update(biased_moe_shapes(p, e, ne, fe, fs))
        else:
            shapes.update(dense_ffn_shapes(cfg, p))
        if il >= cfg.n_layer:
            shapes.update(nextn_shapes(p, e, v))
    return shapes


def biased_moe_shapes(p: str, n_embd: int, n_expert: int, n_ff_exp: int, n_ff_shexp: int) -> Shapes:
    """A DeepSeek-style MoE FFN of block prefix ``p``: router, expert-selection bias ``exp_probs_b``, stacked routed
    experts ``(n_expert, out, in)`` and one always-on shared expert of width ``n_ff_shexp`` (glm4moe, step35)."""
    e, ne, fe, fs = n_embd, n_expert, n_ff_exp, n_ff_shexp
    return {
        p + "ffn_gate_inp.weight": ((ne, e), True),
        p + "exp_probs_b.bias": ((ne,), True),
        p + "ffn_gate_exps.weight": ((ne, fe, e), True),
        p + "ffn_up_exps.weight": ((ne, fe, e), True),
        p + "ffn_down_exps.weight": ((ne, e, fe), True),
        p + "ffn_gate_shexp.weight": ((fs, e), True),
        p + "ffn_up_shexp.weight": ((fs, e), True),
        p + "ffn_down_shexp.weight": ((e, fs), True),
    }


def _glm4moe_init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def synthetic_glm4moe_tensors(cfg: Glm4MoeConfig, vocab: ByteBPEVocab, knobs: Knobs = Knobs()) -> dict[str, np.ndarray]:
    """Random tensors (llama.cpp convention) for a synthetic model; see the module docstring."""
    return scaled_moe_tensors(cfg, vocab, knobs, glm4moe_expected_tensor_shapes(cfg), CONTEXT_SCALE)


def scaled_moe_tensors(
    cfg,
    vocab: ByteBPEVocab,
    knobs: Knobs,
    shapes: Shapes,
    context_scale: float,
    fidelities: tuple[float, ...] | None = None,
) -> dict[str, np.ndarray]:
    """Random tensors of ``shapes`` with the knobs applied: every trunk block's output projections (attention, dense
    FFN, routed and shared experts) scaled by ``context_scale * knobs.context_mix``, the MTP blocks' by 1e-3, and each
    MTP block's input projection set by its fidelity (:func:`~.synthetic.finish_mtp_head`)."""
    keep = lambda name: name == "output.weight" or name.endswith(("shared_head_norm.weight", ".bias"))  # noqa: E731
    out, rng = trunk_tensors(cfg, vocab, knobs, shapes, keep, _glm4moe_init)

    down = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")
    for il in range(cfg.block_count):
        scale = context_scale * knobs.context_mix if il < cfg.n_layer else 1e-3
        for suffix in down:
            name = f"blk.{il}.{suffix}"
            if name in out:
                out[name] *= scale

    return finish_mtp_head(out, cfg, knobs, rng, fidelities)


def glm4moe_keys(cfg: Glm4MoeConfig) -> dict[str, object]:
    """The hyperparameters (``add_<key>`` names of the GGUF writer), as convert_hf_to_gguf writes them."""
    import gguf

    return transformer_keys(cfg, rope_dim=cfg.rope_dim) | {
        "layer_norm_rms_eps": cfg.rms_eps,
        "expert_count": cfg.n_expert,
        "expert_used_count": cfg.n_expert_used,
        "expert_shared_count": cfg.n_expert_shared,
        "expert_feed_forward_length": cfg.n_ff_exp,
        "leading_dense_block_count": cfg.n_layer_dense_lead,
        "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        "expert_weights_scale": cfg.expert_weights_scale,
        "expert_weights_norm": cfg.expert_weights_norm,
        "nextn_predict_layers": cfg.nextn_predict_layers,
    }


def write_glm4moe_gguf(
    path: str | Path,
    cfg: Glm4MoeConfig,
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    name: str = "glm4moe-mtp",
    description: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write an F32 ``glm4moe`` GGUF with one NextN block; returns the path.

    ``tensors`` maps GGUF names to arrays of the shapes of :func:`glm4moe_expected_tensor_shapes`
    (required ones must be present; unknown names are rejected).
    """
    return write_f32_gguf(
        path,
        ARCH,
        cfg,
        glm4moe_expected_tensor_shapes(cfg),
        glm4moe_keys(cfg),
        tensors,
        vocab,
        name=name,
        description=description,
        extra_metadata=extra_metadata,
    )


def write_synthetic_glm4moe(path: str | Path, **knobs: float) -> Path:
    """Write a SYNTHETIC (random-weight, untrained) ``glm4moe`` + MTP GGUF for tests; returns the path.

    A non-recurrent MTP model (dense lead layer + MoE layer + one MoE NextN block), see the
    module docstring for the architecture.  ``knobs`` are the fields of
    :class:`~.synthetic.Knobs` (``seed``, ``context_mix``, ``mtp_fidelity``, ``logit_scale``):
    ``context_mix`` (>= 0) scales the trunk's output projections by ``CONTEXT_SCALE * context_mix``
    (0: the next token is a function of the current token only, ~100% greedy acceptance with
    ``mtp_fidelity=1``; 0.5: partial acceptance, ~0.6-0.85 depending on ``n_max``); ``mtp_fidelity``
    in [0, 1] blends the MTP input projection between "reproduce the trunk's token->token function"
    (1) and random (0: ~0% acceptance).  The knobs are stored under ``mtp_explorer.*`` metadata keys.
    """
    knobs = Knobs(**knobs)
    cfg = glm4moe_config()
    vocab = synthetic_vocab(cfg.n_vocab)
    tensors = synthetic_glm4moe_tensors(cfg, vocab, knobs)
    return write_synthetic(write_glm4moe_gguf, path, cfg, vocab, tensors, knobs, "glm4moe")
