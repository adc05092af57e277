"""SYNTHETIC random-weight ``qwen35`` + MTP models for tests and benchmarks.

These models are **not trained**: their weights are random, drawn from a fixed seed, and
built so that two knobs control how often the MTP head's draft agrees with the trunk:

``context_mix``
    Scale of every trunk layer's output projection (``attn_output``, ``ssm_out``,
    ``ffn_down``), times :data:`CONTEXT_SCALE`.  At ``0`` the residual stream is the token embedding alone, so the
    trunk's logits are a pure function ``f(token)`` of the current token (no context);
    larger values let attention / gated-delta-net state change the prediction.
``mtp_fidelity``
    How closely the MTP block reproduces ``f``: its ``nextn.eh_proj`` is
    ``mtp_fidelity * [I | 0] + (1 - mtp_fidelity) * R`` (``R`` random), where ``[I | 0]``
    selects the embedding half of ``concat(enorm(embed(token)), hnorm(h))`` -- the order
    llama.cpp's ``graph_mtp`` uses.  The MTP block's own attention / FFN output
    projections are near zero and ``shared_head_norm`` equals ``output_norm``, so with
    fidelity 1 the MTP logits for the draft token equal the trunk's ``f(token)``.

Hence ``context_mix=0, mtp_fidelity=1`` gives ~100% greedy acceptance, a moderate
``context_mix`` partial acceptance, and ``mtp_fidelity=0`` ~0%.  Measured greedy n_max=1
acceptance (seed 0, defaults, 64 new tokens, mean of 4 short prompts) with
``mtp_fidelity=1``: context_mix 0 -> 1.00, 0.2 -> 0.88, 0.4 -> 0.75, 0.6 -> 0.67,
0.8 -> 0.52, 1.0 -> 0.46; ``mtp_fidelity=0`` -> 0.00, ``0.5`` (context_mix 0) -> ~0.3.  The output head only
lets printable-ASCII tokens win the argmax (other rows are zero, EOS included), and it is
untied from the embedding, so greedy text is printable and does not lock into a
one-token loop at once.  Files are ~1 MB (F32) and written in well under a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from .gguf_qwen35 import (
    ByteBPEVocab,
    Qwen35Config,
    bytes_to_unicode,
    expected_tensor_shapes,
    train_byte_bpe,
    write_qwen35_gguf,
)

#: Factor between ``context_mix`` and the scale applied to the trunk's output projections.
CONTEXT_SCALE = 0.25

__all__ = [
    "CONTEXT_SCALE",
    "Knobs",
    "gated_delta_net_params",
    "random_tensors",
    "synthetic_config",
    "synthetic_vocab",
    "synthetic_tensors",
    "write_synthetic_qwen35",
]

_BPE_TEXT = '''
def tokenize(text, vocab):
    """Split the text into tokens and return their ids."""
    result = []
    for word in text.split():
        if word in vocab:
            result.append(vocab[word])
        else:
            result.extend(vocab.get(ch, 0) for ch in word)
    return result


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


import os
import sys
from pathlib import Path

for index, line in enumerate(open(path)):
    if not line.strip():
        continue
    print(index, line.rstrip())

The quick brown fox jumps over the lazy dog. The model predicts the next token, and the
draft head predicts the token after that. When the draft is accepted, the target model
saves one step; when it is rejected, the state is rolled back to the last accepted token.
'''


def synthetic_config(n_vocab: int = 384, n_embd: int = 64, n_layer: int = 4) -> Qwen35Config:
    """The architecture of a synthetic model (one full-attention layer every four)."""
    return Qwen35Config(
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=2 * n_embd,
        n_head=4,
        n_head_kv=2,
        head_dim=16,
        full_attention_interval=4,
        ssm_conv_kernel=4,
        ssm_state_size=16,
        ssm_group_count=2,
        ssm_time_step_rank=2,
        rope_dim=8,
        rope_freq_base=10_000.0,
        rms_eps=1e-6,
        n_ctx_train=4096,
        nextn_predict_layers=1,
    )


def synthetic_vocab(n_vocab: int) -> ByteBPEVocab:
    """256 byte tokens, ``n_vocab - 257`` BPE merges learnt from a fixed text, and an EOS."""
    n_merges = n_vocab - 257
    if n_merges < 1:
        raise ParameterError("n_vocab must be at least 258")
    vocab = train_byte_bpe(_BPE_TEXT, n_merges)
    if len(vocab.tokens) < n_vocab:
        # Not enough pairs in the fixed text: add merges of lowercase letter pairs.
        tokens, merges, types = vocab.tokens[:-1], list(vocab.merges), vocab.token_types[:-1]
        known = set(tokens)
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        # letter pairs, then (for large vocabularies) a pair and a letter: each merge's parts exist already
        candidates = [(a, b) for a in letters for b in letters]
        candidates += [(a + b, c) for a in letters for b in letters for c in letters]
        for a, b in candidates:
            if len(tokens) >= n_vocab - 1:
                break
            if a + b not in known and a in known and b in known:
                tokens.append(a + b)
                known.add(a + b)
                merges.append(f"{a} {b}")
                types.append(1)
        tokens.append(vocab.tokens[-1])
        types.append(3)
        vocab = ByteBPEVocab(
            tokens=tokens, merges=merges, token_types=types, eos_id=len(tokens) - 1, bos_id=len(tokens) - 1, pre="gpt-2"
        )
    if len(vocab.tokens) != n_vocab:
        raise ParameterError(f"could not build a vocabulary of {n_vocab} tokens")
    return vocab


def printable_mask(vocab: ByteBPEVocab) -> np.ndarray:
    """Normal tokens whose bytes are printable ASCII or newline (the only ones a synthetic head lets win)."""
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    mask = np.zeros(len(vocab.tokens), dtype=bool)
    for i, (tok, ttype) in enumerate(zip(vocab.tokens, vocab.token_types)):
        if ttype != 1:
            continue
        raw = bytes(inverse[c] for c in tok)
        mask[i] = all(32 <= b < 127 or b == 10 for b in raw)
    return mask


def embeddings_and_head(
    rng: np.random.Generator, vocab: ByteBPEVocab, n_vocab: int, n_embd: int, logit_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Random token embeddings and an output head that only lets printable tokens win."""
    embd = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    head = rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * (logit_scale / np.sqrt(n_embd))
    head[~printable_mask(vocab)] = 0.0
    return embd, head


def mtp_input_projection(
    rng: np.random.Generator, n_embd: int, mtp_fidelity: float, n_out: int | None = None
) -> np.ndarray:
    """The MTP block's ``eh_proj`` (``n_out`` x ``2 * n_embd``, ``n_out`` default ``n_embd``): ``mtp_fidelity``
    blends "pass the token embedding (its first ``n_out`` dimensions) through" (1), which makes the head reproduce
    the trunk's token -> token function, with random (0)."""
    n_out = n_embd if n_out is None else n_out
    select = np.eye(n_out, 2 * n_embd)
    random_proj = rng.standard_normal((n_out, 2 * n_embd)) / np.sqrt(2 * n_embd)
    return (mtp_fidelity * select + (1.0 - mtp_fidelity) * random_proj).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """What sets a SYNTHETIC model's behaviour: its random seed, how much context its trunk mixes in,
    how faithfully its MTP head copies the trunk (acceptance), and the scale of its logits."""

    seed: int = 0
    context_mix: float = 0.0
    mtp_fidelity: float = 1.0
    logit_scale: float = 4.0

    def __post_init__(self) -> None:
        if self.context_mix < 0:
            raise ParameterError("context_mix must be >= 0")
        if not 0.0 <= self.mtp_fidelity <= 1.0:
            raise ParameterError("mtp_fidelity must be in [0, 1]")

    def metadata(self) -> dict[str, bool | int | float]:
        """The ``mtp_explorer.*`` GGUF keys a synthetic file records its knobs under."""
        return {
            "mtp_explorer.synthetic": True,
            "mtp_explorer.seed": int(self.seed),
            "mtp_explorer.context_mix": float(self.context_mix),
            "mtp_explorer.mtp_fidelity": float(self.mtp_fidelity),
        }


Init = Callable[[str, tuple[int, ...], np.random.Generator], np.ndarray]


def random_tensors(
    shapes: Mapping[str, tuple[tuple[int, ...], bool]],
    keep: Callable[[str], bool],
    init: Init,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """A random tensor (``init(name, shape, rng)``) for every required name of ``shapes`` and every optional
    one ``keep`` keeps, in the shapes' order (which fixes the random stream)."""
    return {name: init(name, shape, rng) for name, (shape, required) in shapes.items() if required or keep(name)}


def trunk_tensors(
    cfg,
    vocab: ByteBPEVocab,
    knobs: Knobs,
    shapes: Mapping[str, tuple[tuple[int, ...], bool]],
    keep: Callable[[str], bool],
    init: Init,
) -> tuple[dict[str, np.ndarray], np.random.Generator]:
    """The random tensors of ``shapes`` (:func:`random_tensors`) with the synthetic embedding and output head,
    and the random generator to draw the rest from (in this order: the files depend on it)."""
    rng = np.random.default_rng(knobs.seed)
    out = random_tensors(shapes, keep, init, rng)
    out["token_embd.weight"], out["output.weight"] = embeddings_and_head(
        rng, vocab, cfg.n_vocab, cfg.n_embd, knobs.logit_scale
    )
    return out, rng


def write_synthetic(
    writer: Callable[..., Path],
    path: str | Path,
    cfg,
    vocab: ByteBPEVocab,
    tensors: Mapping[str, np.ndarray],
    knobs: Knobs,
    arch: str,
    *,
    name: str | None = None,
    **options,
) -> Path:
    """Write a SYNTHETIC model with ``writer`` (an architecture's GGUF writer), labelled as such and with
    its knobs in the metadata."""
    return writer(
        path,
        cfg,
        tensors,
        vocab,
        name=name or f"mtp-explorer-synthetic-{arch}",
        description=f"SYNTHETIC random-weight {arch}+MTP model for tests; not trained.",
        extra_metadata=knobs.metadata(),
        **options,
    )


def finish_mtp_head(
    out: dict[str, np.ndarray], cfg, knobs: Knobs, rng: np.random.Generator, fidelities: tuple[float, ...] | None = None
) -> dict[str, np.ndarray]:
    """Make each MTP block (``blk.n_layer`` .. ``blk.block_count - 1``) copy the trunk by its fidelity (its input
    projection; ``fidelities`` one per block, default ``knobs.mtp_fidelity`` for every block) and share the trunk's
    output norm; returns ``out``."""
    blocks = range(cfg.n_layer, cfg.block_count)
    fidelities = fidelities if fidelities is not None else (knobs.mtp_fidelity,) * len(blocks)
    for il, fidelity in zip(blocks, fidelities, strict=True):
        m = f"blk.{il}."
        out[m + "nextn.eh_proj.weight"] = mtp_input_projection(rng, cfg.n_embd, fidelity)
        out[m + "nextn.shared_head_norm.weight"] = out["output_norm.weight"].copy()
    return out


def _qwen35_init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def gated_delta_net_params(out: dict[str, np.ndarray], cfg: Qwen35Config, p: str, rng: np.random.Generator) -> None:
    """Stable decay (``ssm_a`` in [-8, -1]), a fixed ``dt`` bias and a random conv kernel for the
    gated-delta-net layer of prefix ``p``, replacing the generic random values in ``out``."""
    nv = cfg.ssm_time_step_rank
    out[p + "ssm_a"] = -rng.uniform(1.0, 8.0, size=nv).astype(np.float32)
    out[p + "ssm_dt.bias"] = np.full(nv, 0.5, dtype=np.float32)
    out[p + "ssm_conv1d.weight"] = (
        rng.standard_normal((2 * cfg.ssm_state_size * cfg.ssm_group_count + cfg.ssm_inner_size, cfg.ssm_conv_kernel))
        / np.sqrt(cfg.ssm_conv_kernel)
    ).astype(np.float32)


def synthetic_tensors(cfg: Qwen35Config, vocab: ByteBPEVocab, knobs: Knobs = Knobs()) -> dict[str, np.ndarray]:
    """Random tensors (llama.cpp convention) for a synthetic model; see the module docstring."""
    context_mix = knobs.context_mix
    keep = lambda name: name == "output.weight" or name.endswith("shared_head_norm.weight")  # noqa: E731
    out, rng = trunk_tensors(cfg, vocab, knobs, expected_tensor_shapes(cfg), keep, _qwen35_init)

    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        if cfg.is_recurrent(il):
            gated_delta_net_params(out, cfg, p, rng)
            out[p + "ssm_out.weight"] *= CONTEXT_SCALE * context_mix
        else:
            out[p + "attn_output.weight"] *= CONTEXT_SCALE * context_mix
        out[p + "ffn_down.weight"] *= CONTEXT_SCALE * context_mix

    m = f"blk.{cfg.n_layer}."
    out[m + "attn_output.weight"] *= 1e-3
    out[m + "ffn_down.weight"] *= 1e-3
    return finish_mtp_head(out, cfg, knobs, rng)


def write_synthetic_qwen35(
    path: str | Path,
    *,
    n_vocab: int = 384,
    n_embd: int = 64,
    n_layer: int = 4,
    seed: int = 0,
    context_mix: float = 0.0,
    mtp_fidelity: float = 1.0,
    dtype: str = "f32",
) -> Path:
    """Write a SYNTHETIC (random-weight, untrained) ``qwen35`` + MTP GGUF for tests.

    ``context_mix`` (>= 0) scales the trunk's output projections (by ``CONTEXT_SCALE *
    context_mix``): 0 makes the next token a function of the current token only.  ``mtp_fidelity`` in [0, 1] blends the
    MTP input projection between "reproduce the trunk's token->token function" (1, ~100% greedy
    acceptance when ``context_mix=0``) and random (0, ~0% acceptance).  ``dtype`` is
    ``"f32"`` or ``"f16"``.  The knobs and the seed are stored under ``mtp_explorer.*``
    metadata keys.  Returns the path.
    """
    knobs = Knobs(seed=seed, context_mix=context_mix, mtp_fidelity=mtp_fidelity)
    cfg = synthetic_config(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer)
    vocab = synthetic_vocab(n_vocab)
    tensors = synthetic_tensors(cfg, vocab, knobs)
    return write_synthetic(
        write_qwen35_gguf, path, cfg, vocab, tensors, knobs, "qwen35", dtype=dtype, name="mtp-explorer-synthetic"
    )
