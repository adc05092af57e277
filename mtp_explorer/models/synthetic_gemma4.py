"""SYNTHETIC random-weight ``gemma4`` targets and their ``gemma4-assistant`` MTP head files.

These models are **not trained**: the weights are random, drawn from a fixed seed.  They exist to exercise
llama.cpp's *shared-memory* MTP mode (``is_mem_shared`` in ``common/speculative.cpp``'s ``draft-mtp`` driver):
the head is a separate GGUF (``gemma4-assistant``, loaded with ``-md``) whose draft context is created with
``llama_context_params.ctx_other = ctx_tgt``; its attention has queries only and reads the keys and values of the
target's last sliding-window and last full-attention layers from the **target's** KV cache
(``llama_kv_cache_iswa`` with a ``share`` callback), so the driver skips the head's catch-up decode, and every
draft step of one round sits at the same position.  llama.cpp tells the mode from
``llama_get_ctx_other(ctx_dft) == ctx_tgt``.

Target (llama.cpp ``src/models/gemma4.cpp``, ``LLM_ARCH_GEMMA4``)
----------------------------------------------------------------
``n_embd=64``, ``n_vocab=384`` (the byte-BPE vocabulary of :mod:`.synthetic`), 4 layers: 3 sliding-window layers
(head dim 16, RoPE on all of it) and a full-attention layer (head dim 32, "proportional" RoPE: the ``rope_freqs``
tensor leaves 3/4 of the pairs unrotated, as llama.cpp's converter writes Gemma 4's); 4 query heads, 2 KV heads,
Q/K RMS norms and an unscaled V norm, attention scale 1, post-attention and post-FFN norms, a GELU FFN, the
embedding scaled by ``sqrt(n_embd)``, final logit soft-capping 30.  No per-layer embeddings, no shared-KV layers,
no MoE.  The file has no MTP layers (``has_mtp`` false): the head comes with its own file.

Assistant head (``src/models/gemma4-assistant.cpp``, ``LLM_ARCH_GEMMA4_ASSISTANT``)
-----------------------------------------------------------------------------------
``n_embd=32`` (narrower than the target, which llama.cpp requires: ``embedding_length_out=64`` carries the target
width), 2 layers (``block_count = nextn_predict_layers = 2``: a sliding-window and a full-attention layer, matching
the target's last two), the target's head counts and head dims.  Input ``nextn.pre_projection`` over
``concat(target_token_embd(token) * sqrt(64), h)``, output through its own tied ``token_embd`` and
``nextn.post_projection`` back to the target width for the next draft step.

Knobs (the trick of :mod:`.synthetic`, adapted to Gemma's post-norms)
--------------------------------------------------------------------
``context_mix``
    The weight of every target layer's ``post_attention_norm`` and ``post_ffw_norm`` is ``CONTEXT_SCALE *
    context_mix`` (the post-norms renormalise, so the output projections cannot be scaled instead).  At ``0`` the
    residual stream is the scaled embedding alone and the target's logits are a function ``f(token)``.
``mtp_fidelity``
    The head's ``pre_projection`` is ``φ [I | 0] + (1 - φ) R`` (``R`` random), ``[I | 0]`` passing the first 32
    dimensions of the target's token embedding through.  The target's embeddings live in those 32 dimensions, the
    head's own post-norms are near zero and its output matrix is the target's head restricted to them (times
    ``sqrt(64 / 32)``), so at ``φ = 1`` the head's logits for a token equal the target's ``f(token)``.

The acceptance the knobs give, measured with llama.cpp's ``llama-speculative-simple -md``, is in ``SYNTHETIC.md``
beside this module.  The output heads let only printable-ASCII tokens win the argmax.  Target files are about 0.85
MB, head files about 0.2 MB (F32).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from .gguf_qwen35 import ByteBPEVocab, Shapes, transformer_keys, write_f32_gguf
from .synthetic import Knobs, mtp_input_projection, random_tensors, synthetic_vocab, trunk_tensors, write_synthetic

ARCH = "gemma4"
HEAD_ARCH = "gemma4-assistant"

#: Factor between ``context_mix`` and the weight of the target's post-attention and post-FFN norms.
CONTEXT_SCALE = 1.0

__all__ = [
    "ARCH",
    "CONTEXT_SCALE",
    "HEAD_ARCH",
    "Gemma4Config",
    "gemma4_config",
    "gemma4_assistant_config",
    "gemma4_expected_tensor_shapes",
    "gemma4_keys",
    "synthetic_gemma4_tensors",
    "synthetic_gemma4_assistant_tensors",
    "write_gemma4_gguf",
    "write_synthetic_gemma4",
]


@dataclass(frozen=True)
class Gemma4Config:
    """Hyper-parameters of a ``gemma4`` target (``n_embd_out == 0``) or of a ``gemma4-assistant`` head
    (``n_embd_out`` = the target's width; every one of its ``n_layer`` layers is an MTP layer).  ``head_dim`` is the
    full-attention layers' head dim, ``head_dim_swa`` the sliding-window layers'; ``swa_layers`` lists the latter."""

    n_vocab: int = 384
    n_embd: int = 64
    n_layer: int = 4
    n_ff: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    head_dim_swa: int = 16
    swa_layers: tuple[int, ...] = (0, 1, 2)
    n_swa: int = 128
    rope_freq_base: float = 1_000_000.0
    rope_freq_base_swa: float = 10_000.0
    rope_partial_full: float = 0.25  #: rotated share of a full-attention head ("proportional" RoPE)
    rms_eps: float = 1e-6
    n_ctx_train: int = 4096
    final_logit_softcapping: float = 30.0
    n_embd_out: int = 0

    def __post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ParameterError("n_head must be a multiple of n_head_kv")
        if not set(self.swa_layers) <= set(range(self.n_layer)):
            raise ParameterError("swa_layers must be layers of the model")
        if self.n_layer < 2 or self.n_layer - 2 not in self.swa_layers or self.n_layer - 1 in self.swa_layers:
            # an assistant reads the KV of the target's layer n_layer - 2 (sliding) and n_layer - 1 (full)
            raise ParameterError("gemma4 layouts here end with a sliding-window layer and a full-attention layer")
        if self.n_embd_out and self.n_embd_out == self.n_embd:
            raise ParameterError("llama.cpp requires a gemma4 assistant narrower (or wider) than its target")

    @property
    def is_assistant(self) -> bool:
        return self.n_embd_out > 0

    @property
    def block_count(self) -> int:
        return self.n_layer

    @property
    def nextn_predict_layers(self) -> int:
        """An assistant's layers are all MTP layers; a target has none."""
        return self.n_layer if self.is_assistant else 0

    def head_dim_of(self, il: int) -> int:
        return self.head_dim_swa if il in self.swa_layers else self.head_dim


def gemma4_config(**overrides) -> Gemma4Config:
    """The synthetic target's architecture (see the module docstring); fields may be overridden."""
    return Gemma4Config(**overrides)


def gemma4_assistant_config(
    target: Gemma4Config, *, n_embd: int = 32, n_layer: int = 2, n_ff: int = 64
) -> Gemma4Config:
    """The assistant head of ``target``: its own width, layers and FFN; the target's vocabulary, head counts, head
    dims, window and RoPE (its attention reads the target's keys and values)."""
    return dataclasses.replace(
        target,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_embd_out=target.n_embd,
        swa_layers=tuple(range(n_layer - 1)),
    )


def gemma4_expected_tensor_shapes(cfg: Gemma4Config) -> Shapes:
    """Every tensor name llama.cpp loads for ``cfg`` (target or assistant) -> (numpy shape, required); numpy shapes
    are ggml's ``ne`` reversed."""
    e, v = cfg.n_embd, cfg.n_vocab
    shapes: Shapes = {
        "token_embd.weight": ((v, e), True),
        "rope_freqs.weight": ((cfg.head_dim // 2,), True),
        "output_norm.weight": ((e,), True),
    }
    if cfg.is_assistant:
        shapes |= {
            "nextn.pre_projection.weight": ((e, 2 * cfg.n_embd_out), True),
            "nextn.post_projection.weight": ((cfg.n_embd_out, e), True),
        }
    else:
        shapes["output.weight"] = ((v, e), False)
    for il in range(cfg.n_layer):
        p, hd = f"blk.{il}.", cfg.head_dim_of(il)
        q_dim, kv_dim = cfg.n_head * hd, cfg.n_head_kv * hd
        shapes |= {p + "attn_norm.weight": ((e,), True), p + "attn_q.weight": ((q_dim, e), True)}
        if not cfg.is_assistant:  # the assistant's keys and values are the target's
            shapes |= {
                p + "attn_k.weight": ((kv_dim, e), True),
                p + "attn_v.weight": ((kv_dim, e), True),
                p + "attn_k_norm.weight": ((hd,), True),
            }
        shapes |= {
            p + "attn_q_norm.weight": ((hd,), True),
            p + "attn_output.weight": ((e, q_dim), True),
            p + "post_attention_norm.weight": ((e,), True),
            p + "ffn_norm.weight": ((e,), True),
            p + "ffn_gate.weight": ((cfg.n_ff, e), True),
            p + "ffn_up.weight": ((cfg.n_ff, e), True),
            p + "ffn_down.weight": ((e, cfg.n_ff), True),
            p + "post_ffw_norm.weight": ((e,), True),
            p + "layer_output_scale.weight": ((1,), True),
        }
    return shapes


def gemma4_keys(cfg: Gemma4Config) -> dict[str, object]:
    """The hyperparameters (``add_<key>`` names of the GGUF writer) as llama.cpp's converter writes them for
    ``Gemma4ForCausalLM`` / ``Gemma4AssistantForCausalLM`` (``conversion/gemma.py``)."""
    keys = transformer_keys(cfg, rope_dim=cfg.head_dim) | {
        "layer_norm_rms_eps": cfg.rms_eps,
        "rope_freq_base_swa": cfg.rope_freq_base_swa,
        "sliding_window": cfg.n_swa,
        "sliding_window_pattern": [il in cfg.swa_layers for il in range(cfg.n_layer)],
        "key_length_swa": cfg.head_dim_swa,
        "value_length_swa": cfg.head_dim_swa,
        "rope_dimension_count_swa": cfg.head_dim_swa,
        "shared_kv_layers": 0,
        "embedding_length_per_layer_input": 0,
    }
    if cfg.is_assistant:
        return keys | {"embedding_length_out": cfg.n_embd_out, "nextn_predict_layers": cfg.nextn_predict_layers}
    return keys | {"final_logit_softcapping": cfg.final_logit_softcapping}


def _gemma4_init(cfg: Gemma4Config):
    def init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if name == "rope_freqs.weight":  # "proportional" RoPE: unrotated pairs get an infinite wavelength
            n_rot = int(cfg.head_dim * cfg.rope_partial_full / 2)
            return np.array([1.0] * n_rot + [1e30] * (shape[0] - n_rot), dtype=np.float32)
        if name.endswith(("norm.weight", "layer_output_scale.weight")):
            return np.ones(shape, dtype=np.float32)
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    return init


def _set_post_norms(out: dict[str, np.ndarray], cfg: Gemma4Config, weight: float) -> None:
    for il in range(cfg.n_layer):
        for suffix in ("post_attention_norm.weight", "post_ffw_norm.weight"):
            out[f"blk.{il}.{suffix}"] = np.full(cfg.n_embd, weight, dtype=np.float32)


def synthetic_gemma4_tensors(
    cfg: Gemma4Config, vocab: ByteBPEVocab, knobs: Knobs = Knobs(), n_embd_head: int = 32
) -> dict[str, np.ndarray]:
    """Random target tensors (llama.cpp convention); the token embeddings live in their first ``n_embd_head``
    dimensions (the assistant's width), see the module docstring."""
    keep = lambda name: name == "output.weight"  # noqa: E731
    out, _ = trunk_tensors(cfg, vocab, knobs, gemma4_expected_tensor_shapes(cfg), keep, _gemma4_init(cfg))
    out["token_embd.weight"][:, n_embd_head:] = 0.0
    _set_post_norms(out, cfg, CONTEXT_SCALE * knobs.context_mix)
    return out


def synthetic_gemma4_assistant_tensors(
    head: Gemma4Config, target: Mapping[str, np.ndarray], knobs: Knobs = Knobs()
) -> dict[str, np.ndarray]:
    """Random assistant tensors for the target tensors ``target``: its output matrix is the target's restricted to
    the head's dimensions, its input projection set by ``knobs.mtp_fidelity`` (see the module docstring)."""
    rng = np.random.default_rng([knobs.seed, 1])
    out = random_tensors(gemma4_expected_tensor_shapes(head), lambda name: False, _gemma4_init(head), rng)
    out["token_embd.weight"] = (
        np.sqrt(head.n_embd_out / head.n_embd) * target["output.weight"][:, : head.n_embd]
    ).astype(np.float32)
    out["nextn.pre_projection.weight"] = mtp_input_projection(
        rng, head.n_embd_out, knobs.mtp_fidelity, n_out=head.n_embd
    )
    _set_post_norms(out, head, 1e-3)
    return out


def write_gemma4_gguf(
    path: str | Path,
    cfg: Gemma4Config,
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    name: str = "gemma4",
    description: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write an F32 ``gemma4`` target or ``gemma4-assistant`` head GGUF (by ``cfg.is_assistant``); returns the
    path."""
    return write_f32_gguf(
        path,
        HEAD_ARCH if cfg.is_assistant else ARCH,
        cfg,
        gemma4_expected_tensor_shapes(cfg),
        gemma4_keys(cfg),
        tensors,
        vocab,
        name=name,
        description=description,
        extra_metadata=extra_metadata,
    )


def write_synthetic_gemma4(path: str | Path, head_path: str | Path | None = None, **settings) -> tuple[Path, Path]:
    """Write a SYNTHETIC (random-weight, untrained) ``gemma4`` target at ``path`` and its ``gemma4-assistant`` MTP head
    at ``head_path`` (default: ``mtp-<name>`` beside it, as llama.cpp's converter names draft-only files); returns
    ``(target, head)``.

    ``settings`` are the fields of :class:`~.synthetic.Knobs` (``seed``, ``context_mix``, ``mtp_fidelity``,
    ``logit_scale``) and of :func:`gemma4_config`.  ``context_mix=0`` with ``mtp_fidelity=1`` gives 100% greedy
    acceptance.  Both files carry the knobs under ``mtp_explorer.*`` metadata keys.
    """
    path = Path(path)
    head_path = Path(head_path) if head_path is not None else path.with_name(f"mtp-{path.name}")
    knob_names = {f.name for f in dataclasses.fields(Knobs)}
    knobs = Knobs(**{k: v for k, v in settings.items() if k in knob_names})
    cfg = gemma4_config(**{k: v for k, v in settings.items() if k not in knob_names})
    head = gemma4_assistant_config(cfg)
    vocab = synthetic_vocab(cfg.n_vocab)
    tensors = synthetic_gemma4_tensors(cfg, vocab, knobs, n_embd_head=head.n_embd)
    target = write_synthetic(write_gemma4_gguf, path, cfg, vocab, tensors, knobs, ARCH)
    head_tensors = synthetic_gemma4_assistant_tensors(head, tensors, knobs)
    return target, write_synthetic(write_gemma4_gguf, head_path, head, vocab, head_tensors, knobs, HEAD_ARCH)
