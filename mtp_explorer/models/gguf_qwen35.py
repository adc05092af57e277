"""Writing ``qwen35`` GGUF files (hybrid gated-delta-net trunk + one NextN/MTP block).

The files produced here load in llama.cpp as vendored by ``llama-cpp-python==0.3.36``
with ``llama_model_params.load_mtp = True``; the MTP block is then usable through a
context created with ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``.  Only ``numpy`` and
``gguf`` (0.19.0) are needed.

Tensor convention
-----------------
:func:`write_qwen35_gguf` takes tensors **already in llama.cpp's convention**, keyed by
their GGUF names.  A numpy array's shape is the reverse of ggml's ``ne``: a ggml
tensor ``{n_embd, n_vocab}`` is a numpy array of shape ``(n_vocab, n_embd)``, i.e. a
matrix weight has the PyTorch ``nn.Linear`` layout ``(out_features, in_features)``.
The conventions that differ from a Hugging Face Qwen3.5 checkpoint (and that an
exporter has to apply itself) are:

* RMS-norm weights are the *multiplier itself* (HF stores ``w`` and applies ``1 + w``;
  llama.cpp wants ``1 + w``), except ``ssm_norm`` (the gated norm of the linear
  attention), which HF already stores as a plain multiplier.
* ``blk.N.ssm_a`` is ``-exp(A_log)``; ``blk.N.ssm_dt.bias`` is HF's ``dt_bias``.
* ``blk.N.ssm_conv1d.weight`` has shape ``(conv_dim, conv_kernel)`` (HF's
  ``(conv_dim, 1, kernel)`` squeezed).
* When ``ssm_group_count < ssm_time_step_rank`` (fewer key heads than value heads), the
  value heads must be in llama.cpp's *tiled* order, not HF's grouped order.
* The full-attention ``attn_q`` projection produces, per head, ``head_dim`` query values
  followed by ``head_dim`` gate values (the same interleave as HF's ``q_proj``).

Expected tensors (``L`` = trunk layer index, ``M = n_layer`` = the MTP block index)::

    token_embd.weight        (n_vocab, n_embd)
    output_norm.weight       (n_embd,)
    output.weight            (n_vocab, n_embd)       optional: tied to token_embd if absent
    # every trunk layer L and the MTP block M
    blk.L.attn_norm.weight             (n_embd,)
    blk.L.post_attention_norm.weight   (n_embd,)
    blk.L.ffn_gate.weight / ffn_up.weight  (n_ff, n_embd)
    blk.L.ffn_down.weight              (n_embd, n_ff)
    # full-attention layers ((L + 1) % full_attention_interval == 0) and the MTP block
    blk.L.attn_q.weight      (2 * n_head * head_dim, n_embd)
    blk.L.attn_k.weight / attn_v.weight  (n_head_kv * head_dim, n_embd)
    blk.L.attn_output.weight (n_embd, n_head * head_dim)
    blk.L.attn_q_norm.weight / attn_k_norm.weight  (head_dim,)
    # gated-delta-net (recurrent) layers
    blk.L.attn_qkv.weight    (2 * key_dim + value_dim, n_embd)
    blk.L.attn_gate.weight   (value_dim, n_embd)                  # "z"
    blk.L.ssm_conv1d.weight  (2 * key_dim + value_dim, conv_kernel)
    blk.L.ssm_dt.bias        (n_v_heads,)
    blk.L.ssm_a              (n_v_heads,)
    blk.L.ssm_beta.weight / ssm_alpha.weight  (n_v_heads, n_embd)
    blk.L.ssm_norm.weight    (head_v_dim,)
    blk.L.ssm_out.weight     (n_embd, value_dim)
    # NextN block only
    blk.M.nextn.eh_proj.weight           (n_embd, 2 * n_embd)   input = concat(enorm(emb), hnorm(h))
    blk.M.nextn.enorm.weight / hnorm.weight  (n_embd,)
    blk.M.nextn.shared_head_norm.weight  (n_embd,)              optional: output_norm if absent
    blk.M.nextn.shared_head_head.weight  (n_vocab, n_embd)      optional: output if absent
    blk.M.nextn.embed_tokens.weight      (n_vocab, n_embd)      optional: token_embd if absent

with ``key_dim = ssm_state_size * ssm_group_count``, ``value_dim = ssm_state_size *
ssm_time_step_rank`` (= ``ssm_inner_size``) and ``n_v_heads = ssm_time_step_rank``.

The ``qwen35moe`` architecture (Qwen3.5/3.6 MoE) has the same layout with a mixture-of-experts FFN in
place of ``ffn_gate`` / ``ffn_up`` / ``ffn_down`` in every block, the MTP block included:
:func:`hybrid_tensor_shapes` takes the FFN as a parameter and :func:`write_hybrid_gguf` writes either
architecture (see :mod:`.synthetic_qwen35moe`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import ParameterError

if TYPE_CHECKING:
    import gguf

__all__ = [
    "Qwen35Config",
    "ByteBPEVocab",
    "bytes_to_unicode",
    "train_byte_bpe",
    "expected_tensor_shapes",
    "write_qwen35_gguf",
    "read_qwen35_metadata",
    "tensor_names",
    "PRE_TOKENIZER_REGEX",
    "ARCH",
    "dense_ffn_shapes",
    "nextn_shapes",
    "hybrid_tensor_shapes",
    "hybrid_keys",
    "write_hybrid_gguf",
    "write_f32_gguf",
]

ARCH = "qwen35"

#: ``tokenizer.ggml.pre`` names accepted by llama.cpp 0.3.36 that we use, with the
#: pre-tokenizer regex llama-vocab.cpp maps them to.  Both have a hand-written splitter
#: in llama.cpp's unicode.cpp (exact, no std::regex fallback).
PRE_TOKENIZER_REGEX: dict[str, str] = {
    # LLAMA_VOCAB_PRE_TYPE_GPT2; note llama.cpp enables clean_spaces for it, so
    # llama_detokenize() drops the space in " ." / " ," / " ?" / " !" (token_to_piece does not).
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    # LLAMA_VOCAB_PRE_TYPE_QWEN2 (clean_spaces off): single digits, newline runs grouped.
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}


@dataclass(frozen=True)
class Qwen35Config:
    """Hyper-parameters of a ``qwen35`` model with ``nextn_predict_layers`` MTP blocks.

    ``n_layer`` counts trunk layers only; the GGUF ``block_count`` is
    ``n_layer + nextn_predict_layers``.  Layer ``i`` of the trunk is full attention when
    ``(i + 1) % full_attention_interval == 0`` and a gated-delta-net layer otherwise.
    """

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16  #: head_k_dim == head_v_dim of the linear attention
    ssm_group_count: int = 2  #: number of key heads of the linear attention
    ssm_time_step_rank: int = 2  #: number of value heads of the linear attention
    rope_dim: int = 0  #: rotary dimensions per head (n_rot); 0 means head_dim // 4
    rope_freq_base: float = 10_000_000.0
    rope_sections: tuple[int, int, int, int] | None = None  #: None: derived from rope_dim
    rms_eps: float = 1e-6
    n_ctx_train: int = 4096
    nextn_predict_layers: int = 1

    def __post_init__(self) -> None:
        if self.nextn_predict_layers != 1:
            raise ParameterError("llama.cpp 0.3.36 supports exactly one qwen35 MTP block")
        if self.n_head % self.n_head_kv:
            raise ParameterError("n_head must be a multiple of n_head_kv")
        if self.ssm_time_step_rank % self.ssm_group_count:
            raise ParameterError("ssm_time_step_rank (value heads) must be a multiple of ssm_group_count")
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ParameterError("rope_dim must be even and at most head_dim")
        if sum(self.sections) != self.n_rot // 2:
            raise ParameterError("rope_sections must sum to rope_dim / 2")

    @property
    def n_rot(self) -> int:
        """Rotary dimensions per head."""
        return self.rope_dim or self.head_dim // 4

    @property
    def sections(self) -> tuple[int, int, int, int]:
        """Interleaved M-RoPE sections; the default covers every rotary pair with the text position."""
        if self.rope_sections is not None:
            return tuple(self.rope_sections)  # type: ignore[return-value]
        pairs = self.n_rot // 2
        return (-(-pairs // 3), -(-(pairs - 1) // 3), -(-(pairs - 2) // 3), 0)

    @property
    def ssm_inner_size(self) -> int:
        """``value_dim`` of the linear attention (``ssm_state_size * ssm_time_step_rank``)."""
        return self.ssm_state_size * self.ssm_time_step_rank

    @property
    def block_count(self) -> int:
        """GGUF ``block_count``: trunk layers plus MTP blocks."""
        return self.n_layer + self.nextn_predict_layers

    def is_recurrent(self, il: int) -> bool:
        """Whether trunk layer ``il`` is a gated-delta-net layer (MTP blocks are not)."""
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0


@dataclass
class ByteBPEVocab:
    """A byte-level BPE vocabulary as llama.cpp's ``gpt2`` tokenizer model reads it.

    ``tokens`` are in GPT-2's byte-to-unicode alphabet (see :func:`bytes_to_unicode`);
    ``merges`` are ``"left right"`` strings in rank order; ``token_types`` holds
    ``gguf.TokenType`` values (1 normal, 3 control).  ``pre`` is the
    ``tokenizer.ggml.pre`` name (see :data:`PRE_TOKENIZER_REGEX`).
    """

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    eos_id: int
    bos_id: int | None = None
    pre: str = "gpt-2"
    add_bos: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.token_types):
            raise ParameterError("tokens and token_types differ in length")
        if not self.merges:
            raise ParameterError("llama.cpp rejects a gpt2 tokenizer without merges")
        if self.pre not in PRE_TOKENIZER_REGEX:
            raise ParameterError(f"unsupported pre-tokenizer {self.pre!r}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (used by llama.cpp)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_SIMPLE_PRETOKEN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def train_byte_bpe(text: str, n_merges: int, *, eos_token: str = "<|endoftext|>") -> ByteBPEVocab:
    """Train a tiny byte-level BPE (pure Python; meant for small texts and synthetic models).

    The vocabulary is the 256 byte tokens, then one token per merge, then ``eos_token``
    (a control token).  Pre-tokenization approximates GPT-2's regex with Python's ``re``;
    only the choice of merges depends on it, and llama.cpp applies whatever merges it is
    given, so the result is always a consistent tokenizer with ``pre = "gpt-2"``.
    """
    byte_map = bytes_to_unicode()
    words = Counter(_SIMPLE_PRETOKEN.findall(text))
    seqs: dict[tuple[str, ...], int] = {}
    for word, count in words.items():
        key = tuple(byte_map[b] for b in word.encode("utf-8"))
        seqs[key] = seqs.get(key, 0) + count
    tokens = [byte_map[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for seq, count in seqs.items():
            for a, b in zip(seq, seq[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        merges.append(f"{a} {b}")
        if merged not in known:
            tokens.append(merged)
            known.add(merged)
        new_seqs: dict[tuple[str, ...], int] = {}
        for seq, count in seqs.items():
            out: list[str] = []
            i = 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            key = tuple(out)
            new_seqs[key] = new_seqs.get(key, 0) + count
        seqs = new_seqs
    if not merges:
        raise ParameterError("text too short to learn a single merge")
    types = [1] * len(tokens)
    tokens.append(eos_token)
    types.append(3)
    eos = len(tokens) - 1
    return ByteBPEVocab(tokens=tokens, merges=merges, token_types=types, eos_id=eos, bos_id=eos, pre="gpt-2")


Shapes = dict[str, tuple[tuple[int, ...], bool]]


def dense_ffn_shapes(cfg: Qwen35Config, p: str) -> Shapes:
    """The dense SwiGLU FFN of block prefix ``p`` (``"blk.N."``): gate, up, down."""
    e, ff = cfg.n_embd, cfg.n_ff
    return {
        p + "ffn_gate.weight": ((ff, e), True),
        p + "ffn_up.weight": ((ff, e), True),
        p + "ffn_down.weight": ((e, ff), True),
    }


def expected_tensor_shapes(cfg: Qwen35Config) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Every tensor name llama.cpp loads for ``cfg`` -> (numpy shape, required)."""
    return hybrid_tensor_shapes(cfg, dense_ffn_shapes)


def hybrid_tensor_shapes(cfg: Qwen35Config, ffn: Callable[[Qwen35Config, str], Shapes]) -> Shapes:
    """The tensors of the Qwen3.5 hybrid layout (gated-delta-net + full-attention trunk, one NextN block)
    with the FFN of every block (trunk and MTP) given by ``ffn(cfg, prefix)``: dense for ``qwen35``,
    routed + shared experts for ``qwen35moe``."""
    e, v = cfg.n_embd, cfg.n_vocab
    hd = cfg.head_dim
    key_dim = cfg.ssm_state_size * cfg.ssm_group_count
    value_dim = cfg.ssm_inner_size
    conv_dim = 2 * key_dim + value_dim
    nv = cfg.ssm_time_step_rank
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((v, e), True),
        "output_norm.weight": ((e,), True),
        "output.weight": ((v, e), False),
    }

    def attention(p: str) -> None:
        shapes[p + "attn_q.weight"] = ((2 * cfg.n_head * hd, e), True)
        shapes[p + "attn_k.weight"] = ((cfg.n_head_kv * hd, e), True)
        shapes[p + "attn_v.weight"] = ((cfg.n_head_kv * hd, e), True)
        shapes[p + "attn_output.weight"] = ((e, cfg.n_head * hd), True)
        shapes[p + "attn_q_norm.weight"] = ((hd,), True)
        shapes[p + "attn_k_norm.weight"] = ((hd,), True)

    def common(p: str) -> None:
        shapes[p + "attn_norm.weight"] = ((e,), True)
        shapes[p + "post_attention_norm.weight"] = ((e,), True)
        shapes.update(ffn(cfg, p))

    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        common(p)
        if cfg.is_recurrent(il):
            shapes[p + "attn_qkv.weight"] = ((conv_dim, e), True)
            shapes[p + "attn_gate.weight"] = ((value_dim, e), True)
            shapes[p + "ssm_conv1d.weight"] = ((conv_dim, cfg.ssm_conv_kernel), True)
            shapes[p + "ssm_dt.bias"] = ((nv,), True)
            shapes[p + "ssm_a"] = ((nv,), True)
            shapes[p + "ssm_beta.weight"] = ((nv, e), True)
            shapes[p + "ssm_alpha.weight"] = ((nv, e), True)
            shapes[p + "ssm_norm.weight"] = ((cfg.ssm_state_size,), True)
            shapes[p + "ssm_out.weight"] = ((e, value_dim), True)
        else:
            attention(p)
    for il in range(cfg.n_layer, cfg.block_count):
        p = f"blk.{il}."
        common(p)
        attention(p)
        shapes.update(nextn_shapes(p, e, v))
    return shapes


def nextn_shapes(p: str, n_embd: int, n_vocab: int) -> Shapes:
    """The NextN wiring of MTP block prefix ``p`` that every llama.cpp MTP architecture with ``nextn.*`` tensors
    shares: ``eh_proj`` over ``concat(enorm(embed(token)), hnorm(h))`` and the optional shared head (norm, output,
    token embedding; llama.cpp falls back to ``output_norm``, ``output`` and ``token_embd``)."""
    e, v = n_embd, n_vocab
    return {
        p + "nextn.eh_proj.weight": ((e, 2 * e), True),
        p + "nextn.enorm.weight": ((e,), True),
        p + "nextn.hnorm.weight": ((e,), True),
        p + "nextn.shared_head_norm.weight": ((e,), False),
        p + "nextn.shared_head_head.weight": ((v, e), False),
        p + "nextn.embed_tokens.weight": ((v, e), False),
    }


def add_tokenizer(w: gguf.GGUFWriter, vocab: ByteBPEVocab) -> None:
    """Write a byte-level BPE vocabulary as llama.cpp's ``gpt2`` tokenizer model."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(vocab.eos_id)
    if vocab.bos_id is not None:
        w.add_bos_token_id(vocab.bos_id)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(False)


def add_metadata(w: gguf.GGUFWriter, metadata: Mapping[str, str | int | float | bool]) -> None:
    """Write extra key/value pairs, typed by their Python type."""
    for key, value in metadata.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int) and value >= 0:
            w.add_uint32(key, value)
        elif isinstance(value, int):
            w.add_int32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, str(value))


def _keep_f32(name: str, arr: np.ndarray) -> bool:
    # 1-D tensors (norms, ssm_a, dt bias, the shared-expert gate), the conv kernel and the MoE router
    # stay F32, as convert_hf_to_gguf does.
    return arr.ndim <= 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight"))


def check_tensors(
    tensors: Mapping[str, np.ndarray],
    shapes: Mapping[str, tuple[tuple[int, ...], bool]],
    vocab: ByteBPEVocab,
    n_vocab: int,
) -> None:
    """Raise ``ValueError`` for a vocabulary of the wrong size, unknown tensor names, missing required
    tensors and shapes other than ``shapes`` (name -> (shape, required))."""
    if len(vocab.tokens) != n_vocab:
        raise ParameterError(f"vocab has {len(vocab.tokens)} tokens, config says n_vocab={n_vocab}")
    unknown = sorted(set(tensors) - set(shapes))
    if unknown:
        raise ParameterError(f"unknown tensors: {unknown[:8]}")
    for tname, (shape, required) in shapes.items():
        if tname not in tensors:
            if required:
                raise ParameterError(f"missing tensor {tname} {shape}")
        elif tuple(tensors[tname].shape) != shape:
            raise ParameterError(f"{tname}: shape {tuple(tensors[tname].shape)} != expected {shape}")


def open_writer(
    path: str | Path, arch: str, *, name: str, description: str | None, license: str | None, file_type
) -> tuple[gguf.GGUFWriter, Path]:
    """A GGUF writer for ``arch`` at ``path`` (folders created) with the general keys written."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    if description:
        w.add_description(description)
    if license:
        w.add_license(license)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return w, path


def add_keys(w: gguf.GGUFWriter, keys: Mapping[str, object]) -> None:
    """Write hyperparameters by the name of the writer's ``add_<key>`` method."""
    for key, value in keys.items():
        getattr(w, f"add_{key}")(value)


def transformer_keys(cfg, *, rope_dim: int) -> dict[str, object]:
    """The hyperparameters every transformer architecture writes alike: context, widths, block count,
    heads and key/value lengths, rope base and dimensions (``cfg`` has the fields of :class:`Qwen35Config`)."""
    return {
        "context_length": cfg.n_ctx_train,
        "embedding_length": cfg.n_embd,
        "block_count": cfg.block_count,
        "feed_forward_length": cfg.n_ff,
        "head_count": cfg.n_head,
        "head_count_kv": cfg.n_head_kv,
        "key_length": cfg.head_dim,
        "value_length": cfg.head_dim,
        "rope_freq_base": cfg.rope_freq_base,
        "rope_dimension_count": rope_dim,
    }


@dataclass(frozen=True)
class Q8Tensor:
    """A matrix stored as Q8_0 blocks (``gguf.quants``' byte layout, what llama.cpp's ``llama-quantize`` writes)."""

    blocks: np.ndarray


# the dtypes the hybrid writers store matrices in; 1-D tensors and the conv kernel stay F32
WRITER_DTYPES = ("f32", "f16", "q8_0")


def stored_matrix(tname: str, arr: np.ndarray, dtype: str) -> np.ndarray | Q8Tensor:
    """``arr`` (F32) as ``dtype`` stores it: F32 kept for 1-D tensors and the conv kernel, F16, or Q8_0 blocks of 32
    along the rows (F16 for a matrix whose rows do not split into blocks, as llama-quantize falls back)."""
    import gguf

    if dtype == "f32" or _keep_f32(tname, arr):
        return arr
    if dtype == "q8_0" and arr.shape[-1] % 32 == 0:
        return Q8Tensor(gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0))
    return arr.astype(np.float16)


def finish_writer(
    w: gguf.GGUFWriter,
    vocab: ByteBPEVocab,
    metadata: Mapping[str, str | int | float | bool],
    arrays: Iterable[tuple[str, np.ndarray | Q8Tensor]],
) -> None:
    """Add the tokenizer, ``metadata`` and the tensors ``arrays`` (name, array or :class:`Q8Tensor`), then
    ``general.size_label`` from the parameter count (as llama.cpp's ``convert_hf_to_gguf.py`` does:
    ``gguf.size_label``), and write the file."""
    import gguf

    add_tokenizer(w, vocab)
    add_metadata(w, metadata)
    for tname, arr in arrays:
        if isinstance(arr, Q8Tensor):
            w.add_tensor(tname, arr.blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(tname, arr)
    total, shared, expert, expert_count = w.get_total_parameter_count()
    if total > 0:
        w.add_size_label(gguf.size_label(total, shared, expert, expert_count))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_f32_gguf(
    path: str | Path,
    arch: str,
    cfg,
    shapes: Mapping[str, tuple[tuple[int, ...], bool]],
    keys: Mapping[str, object],
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    name: str,
    description: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write an F32 GGUF of ``arch``: check ``tensors`` against ``shapes`` (``cfg.n_vocab`` tokens), write the
    hyperparameters ``keys`` (``add_<key>`` names, in order), the tokenizer, the metadata and the tensors in the order
    of ``shapes``; returns the path."""
    import gguf

    check_tensors(tensors, shapes, vocab, cfg.n_vocab)
    w, path = open_writer(
        path, arch, name=name, description=description, license=None, file_type=gguf.LlamaFileType.ALL_F32
    )
    add_keys(w, keys)
    finish_writer(
        w,
        vocab,
        {**vocab.extra, **(extra_metadata or {})},
        ((t, np.ascontiguousarray(tensors[t], dtype=np.float32)) for t in shapes if t in tensors),
    )
    return path


def write_qwen35_gguf(
    path: str | Path,
    cfg: Qwen35Config,
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    dtype: str = "f32",
    name: str = "qwen35-mtp",
    description: str | None = None,
    license: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write a ``qwen35`` GGUF with one MTP block; returns the path.

    ``tensors`` maps GGUF tensor names to arrays in llama.cpp's convention (see the module
    docstring); every required tensor of :func:`expected_tensor_shapes` must be present with
    exactly that shape, and unknown names are rejected.  ``dtype`` is ``"f32"``, ``"f16"`` or ``"q8_0"``
    (:data:`WRITER_DTYPES`): with ``"f16"``/``"q8_0"`` matrix weights are stored so and 1-D tensors and the conv kernel
    as F32 (:func:`stored_matrix`).
    ``extra_metadata`` adds string/number/bool keys (e.g. ``"mtp_explorer.synthetic"``).

    The metadata and tensor types are what llama.cpp's ``convert_hf_to_gguf.py`` writes for the same model
    converted from a Hugging Face checkpoint (``tests/test_converter.py`` checks it; the converter orders the
    tensors as its checkpoint does, and names the file from its directory).
    """
    return write_hybrid_gguf(
        path,
        ARCH,
        cfg,
        expected_tensor_shapes(cfg),
        hybrid_keys(cfg),
        tensors,
        vocab,
        dtype=dtype,
        name=name,
        description=description,
        license=license,
        extra_metadata=extra_metadata,
    )


def hybrid_keys(cfg: Qwen35Config) -> dict[str, object]:
    """The hyperparameters of the Qwen3.5 hybrid layout (``add_<key>`` names of the GGUF writer)."""
    return transformer_keys(cfg, rope_dim=cfg.n_rot) | {
        "rope_dimension_sections": list(cfg.sections),
        "layer_norm_rms_eps": cfg.rms_eps,
        "ssm_conv_kernel": cfg.ssm_conv_kernel,
        "ssm_inner_size": cfg.ssm_inner_size,
        "ssm_state_size": cfg.ssm_state_size,
        "ssm_time_step_rank": cfg.ssm_time_step_rank,
        "ssm_group_count": cfg.ssm_group_count,
        "full_attention_interval": cfg.full_attention_interval,
    }


def write_hybrid_gguf(
    path: str | Path,
    arch: str,
    cfg: Qwen35Config,
    shapes: Mapping[str, tuple[tuple[int, ...], bool]],
    keys: Mapping[str, object],
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    *,
    dtype: str = "f32",
    name: str,
    description: str | None = None,
    license: str | None = None,
    extra_metadata: Mapping[str, str | int | float | bool] | None = None,
) -> Path:
    """Write a GGUF of the Qwen3.5 hybrid family (``qwen35``, ``qwen35moe``): check ``tensors`` against
    ``shapes``, write the hyperparameters ``keys`` and ``nextn_predict_layers``, the tokenizer, the metadata
    and the tensors in the order of ``shapes`` (see :func:`write_qwen35_gguf` for ``dtype``)."""
    import gguf

    if dtype not in WRITER_DTYPES:
        raise ParameterError(f"dtype must be one of {WRITER_DTYPES}, got {dtype!r}")
    check_tensors(tensors, shapes, vocab, cfg.n_vocab)
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[dtype]
    w, path = open_writer(path, arch, name=name, description=description, license=license, file_type=file_type)

    add_keys(w, keys)
    w.add_nextn_predict_layers(cfg.nextn_predict_layers)
    # which blocks are gated-delta-net layers (the MTP block is not), as convert_hf_to_gguf writes it from the
    # checkpoint's layer_types; llama.cpp falls back to full_attention_interval without it
    w.add_array(f"{arch}.attention.recurrent_layers", [cfg.is_recurrent(il) for il in range(cfg.block_count)])

    def arrays():
        for tname in shapes:
            if tname in tensors:
                yield tname, stored_matrix(tname, np.ascontiguousarray(tensors[tname], dtype=np.float32), dtype)

    finish_writer(w, vocab, {**vocab.extra, **(extra_metadata or {})}, arrays())
    return path


def read_qwen35_metadata(path: str | Path) -> dict[str, object]:
    """The scalar/array metadata of a GGUF file as plain Python values (for tests and tools)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, object] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            out[key + ".count"] = len(fld.data)
            continue
        try:
            out[key] = fld.contents()
        except Exception:  # pragma: no cover - exotic field types
            continue
    return out


def tensor_names(cfg: Qwen35Config) -> Sequence[str]:
    """Names of the tensors llama.cpp may load for ``cfg``, in file order."""
    return list(expected_tensor_shapes(cfg))
