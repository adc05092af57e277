"""What a GGUF model file holds, read from its metadata without loading the weights."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

import numpy as np

from .errors import InputTypeError, ModelLoadError, ModelNotFoundError
from .gguf_header import HeaderReader
from .paths import default_model_path

GGUF_MAGIC = b"GGUF"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """Facts about a model file. ``n_layer`` counts trunk layers; ``n_layer_nextn`` the MTP blocks."""

    path: str
    name: str
    arch: str
    n_layer: int
    n_layer_nextn: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_params: int
    size: int
    has_mtp: bool
    is_recurrent: bool
    rs_slot_bytes: int
    """Bytes of recurrent state in one rollback snapshot slot (0 for non-recurrent models)."""
    file_type: str = "F32"
    """The file's quantization as ``llama-quantize`` names it (``"F16"``, ``"Q8_0"``, ``"Q4_K_M"``, ...): GGUF
    ``general.file_type``, or, where a file lacks that key, llama.cpp's guess from its most common tensor type
    with ``" (guessed)"`` appended."""
    tensor_types: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)
    """Number of tensors of each ggml type (``{"Q8_0": 40, "F32": 30}``), most common first."""
    n_expert: int = 0
    """Routed experts per MoE block (GGUF ``<arch>.expert_count``; 0 for dense models)."""
    n_expert_used: int = 0
    """Experts each token is routed to (``<arch>.expert_used_count``; the largest where it is per layer)."""
    n_ff_exp: int = 0
    """Width of one routed expert (``<arch>.expert_feed_forward_length``; the largest where it is per layer)."""
    n_embd_head_k: int = 0
    """Width of one attention key head (``<arch>.attention.key_length``, else ``n_embd / head_count``); a
    quantized K cache needs it to be a multiple of the cache type's block."""
    moe_layers: tuple[int, ...] = ()
    """Indices of the blocks with a MoE FFN (a router tensor ``blk.N.ffn_gate_inp``), MTP blocks included
    (they are numbered from ``n_layer``)."""
    mtp_mode: str | None = None
    """How llama.cpp's ``draft-mtp`` driver runs this model's MTP (:data:`MTP_MODES`), by llama.cpp's rule
    (``common/speculative.cpp``): ``"single"`` (one NextN block: qwen35, qwen35moe, glm4moe), ``"chained"`` (more
    than one NextN block and no shared memory: step35's heads, one per draft step), ``"shared_memory"`` (a separate
    head file that reads its target's KV cache: a ``gemma4-assistant`` file, or a target paired with one by
    ``model_info(target, head=...)``); ``None``: no MTP (a ``gemma4`` target alone has no head until its head file
    is given)."""
    n_mtp_heads: int = 0
    """MTP heads a draft round can use: 1 for ``"single"`` and ``"shared_memory"`` (an assistant runs all its
    ``n_layer_nextn`` layers in one graph at every draft step), ``n_layer_nextn`` for ``"chained"``, 0 without MTP."""
    is_mtp_head_file: bool = False
    """The file is a separate MTP head (llama.cpp's ``-md`` with ``--spec-type draft-mtp``): it has no trunk
    (``n_layer`` 0) and runs only against a target's context."""
    n_embd_out: int = 0
    """Width of the hidden state the model exchanges with the MTP driver (``<arch>.embedding_length_out``, else
    ``n_embd``): a head file's must equal its target's ``n_embd``."""
    mtp_head: str | None = None
    """The head file this information pairs the model with (``model_info(path, head=...)``), else ``None``."""
    n_layer_attention: int | None = None
    """Trunk layers with attention in a hybrid recurrent model (``<arch>.attention.recurrent_layers``, else
    ``full_attention_interval``); ``None`` for other models."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def experts_label(self) -> str:
        """Which blocks route to experts, in words: ``"MoE 8 experts (2 used) in blocks 0-3, MTP block 4"``;
        ``"dense"`` when none do."""
        if not self.moe_layers:
            return "dense"
        trunk = [i for i in self.moe_layers if i < self.n_layer]
        mtp = [i for i in self.moe_layers if i >= self.n_layer]
        parts = ([f"blocks {_ranges(trunk)}"] if trunk else []) + ([f"MTP block {_ranges(mtp)}"] if mtp else [])
        return f"MoE {self.n_expert} experts ({self.n_expert_used} used) in " + ", ".join(parts)


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    out: list[str] = []
    start = prev = None
    for i in indices + [None]:
        if start is not None and (i is None or i != prev + 1):  # type: ignore[operator]
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ", ".join(out)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, expected {GGUF_MAGIC!r})")


def _reader(path: Path):
    from gguf import GGUFReader

    reader: HeaderReader | GGUFReader
    try:
        try:  # the header alone, fast also for a 262 k-token vocabulary; anything unusual goes to GGUFReader
            reader = HeaderReader(path)
        except Exception:
            reader = GGUFReader(path)
    except Exception as exc:  # the gguf package raises assorted errors on damaged files
        raise ModelLoadError(f"{path} is truncated or corrupt: {exc}") from exc
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelLoadError(f"{path} is truncated: tensor {t.name} ends past the end of the file")
    return reader


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


# llama.h's llama_ftype (0.3.36), by the names llama-quantize takes: the gguf package's LlamaFileType less its
# ALL_/MOSTLY_ prefix, plus the values that package does not know yet.
_FTYPE_GUESSED = 1024
_FTYPE_EXTRA = {41: "Q2_0"}
# llama_model_loader's guess where general.file_type is missing: the most common tensor type decides.
_GUESS = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q2_K": "Q2_K",
    "Q3_K": "Q3_K_M",
    "Q4_K": "Q4_K_M",
    "Q5_K": "Q5_K_M",
    "Q6_K": "Q6_K",
    "TQ1_0": "TQ1_0",
    "TQ2_0": "TQ2_0",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "IQ3_S": "IQ3_S",
    "NVFP4": "NVFP4",
    "Q1_0": "Q1_0",
    "Q2_0": "Q2_0",
}


def file_type_name(ftype: int) -> str:
    """llama.cpp's ``llama_ftype`` value as ``llama-quantize`` names it (``7`` -> ``"Q8_0"``)."""
    from gguf import LlamaFileType

    ftype = int(ftype)
    guessed = bool(ftype & _FTYPE_GUESSED)
    base = ftype & ~_FTYPE_GUESSED
    try:
        name = LlamaFileType(base).name.removeprefix("ALL_").removeprefix("MOSTLY_")
    except ValueError:
        name = _FTYPE_EXTRA.get(base, f"unknown ({base})")
    return name + (" (guessed)" if guessed else "")


def _file_type(path: Path, reader, tensor_types: Counter) -> str:
    ftype = _field(reader, "general.file_type")
    if ftype is not None:
        if isinstance(ftype, bool) or not isinstance(ftype, (int, np.integer)):
            # llama.cpp refuses such a file too (a key of the wrong type)
            raise ModelLoadError(f"{path}: general.file_type is not an integer: {ftype!r}")
        return file_type_name(int(ftype))
    # as llama_model_loader: the type with the most tensors (on a tie, here the first in file order)
    top = max(tensor_types.items(), key=lambda kv: kv[1], default=("F32", 0))[0]
    return _GUESS.get(top, "F32") + " (guessed)"


MTP_MODES: tuple[str, ...] = ("single", "chained", "shared_memory")
"""llama.cpp 0.3.36's three ``draft-mtp`` modes ("One MTP draft driver, three modes" in ``common/speculative.cpp``)."""

#: Architectures whose files are MTP heads that share their target's memory: llama.cpp keeps
#: ``llama_context_params.ctx_other`` for them only, and its driver's ``is_mem_shared`` is
#: ``llama_get_ctx_other(ctx_dft) == ctx_tgt``.
SHARED_MEMORY_HEAD_ARCHS: dict[str, str] = {"gemma4-assistant": "gemma4"}
"""Head architecture -> the target architecture its converter pairs it with."""


def mtp_mode_of(arch: str, n_layer_nextn: int) -> tuple[str | None, int]:
    """``(mtp_mode, n_mtp_heads)`` of a model file, by llama.cpp's rule: a shared-memory head file's is
    ``"shared_memory"`` (one head); else ``n_mtp_layers = n_layer_nextn`` and ``chain_heads = n_mtp_layers > 1``."""
    if arch in SHARED_MEMORY_HEAD_ARCHS:
        return "shared_memory", 1
    if n_layer_nextn <= 0:
        return None, 0
    return ("chained", n_layer_nextn) if n_layer_nextn > 1 else ("single", 1)


def model_path(path: str | os.PathLike | None, what: str = "path") -> Path:
    """``path`` as a Path (``None``: the bundled demo model, as :meth:`Session.open <mtp_explorer.Session.open>` takes
    it); anything else is an :class:`InputTypeError`."""
    if path is None:
        return default_model_path()
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"{what} must be a file path (str or os.PathLike), got {type(path).__name__}")
    return Path(path)


def model_info(path: str | os.PathLike | None, head: str | os.PathLike | None = None) -> ModelInfo:
    """Read a GGUF file's metadata (``path`` ``None``: the bundled demo model's). Raises :class:`ModelLoadError` for
    missing, foreign or damaged files, :class:`InputTypeError` for a ``path`` that is no path.

    ``head`` pairs the model with a separate MTP head file (llama.cpp's ``-md``): the result is the target's
    information with the pair's ``mtp_mode`` and ``n_mtp_heads`` and ``mtp_head`` set; a head that does not fit the
    target (not a head file, another width or vocabulary) is a :class:`ModelLoadError` naming the mismatch."""
    info = _file_info(model_path(path))
    if head is None:
        return info
    return pair_with_head(info, _file_info(model_path(head, "head")))


def pair_with_head(target: ModelInfo, head: ModelInfo) -> ModelInfo:
    """``target``'s information paired with the head file ``head`` (see :func:`model_info`)."""
    problems = []
    if not head.is_mtp_head_file:
        problems.append(
            f"{head.path} is a {head.arch} model, not an MTP head file ({', '.join(SHARED_MEMORY_HEAD_ARCHS)})"
        )
    if target.is_mtp_head_file:
        problems.append(f"{target.path} is itself an MTP head file, not a target")
    if not problems:
        if head.n_embd_out != target.n_embd:
            problems.append(
                f"the head exchanges hidden states of width {head.n_embd_out} "
                f"(embedding_length_out) and the target's are {target.n_embd} wide"
            )
        if head.n_vocab != target.n_vocab:
            problems.append(f"the head has {head.n_vocab} tokens and the target {target.n_vocab}")
        expected = SHARED_MEMORY_HEAD_ARCHS[head.arch]
        if target.arch != expected:
            problems.append(f"a {head.arch} head runs against a {expected} target, not {target.arch}")
    if problems:
        raise ModelLoadError(f"the MTP head {head.path} does not fit the target {target.path}: " + "; ".join(problems))
    return dataclasses.replace(
        target, has_mtp=True, mtp_mode=head.mtp_mode, n_mtp_heads=head.n_mtp_heads, mtp_head=head.path
    )


def _file_info(path: Path) -> ModelInfo:
    _check_file(path)
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path} has no general.architecture key")
    block_count = int(_field(reader, f"{arch}.block_count", 0))
    n_nextn = int(_field(reader, f"{arch}.nextn_predict_layers", 0))
    tokens = _field(reader, "tokenizer.ggml.tokens", [])
    n_params = int(sum(int(np.prod(t.shape)) for t in reader.tensors))
    tensor_types = Counter(t.tensor_type.name for t in reader.tensors)
    d_conv = _field(reader, f"{arch}.ssm.conv_kernel")
    is_recurrent = d_conv is not None
    rs_slot_bytes = 0
    n_layer_attention = None
    if is_recurrent:
        d_inner = int(_field(reader, f"{arch}.ssm.inner_size"))
        d_state = int(_field(reader, f"{arch}.ssm.state_size"))
        n_group = int(_field(reader, f"{arch}.ssm.group_count", 1))
        interval = int(_field(reader, f"{arch}.full_attention_interval", 0) or 0)
        n_trunk = block_count - n_nextn
        n_recurrent = n_trunk - (n_trunk // interval if interval else 0)
        layers = _field(reader, f"{arch}.attention.recurrent_layers")
        if layers is not None:
            n_layer_attention = sum(not bool(r) for r in list(layers)[:n_trunk])
        elif interval:
            n_layer_attention = n_trunk // interval
        # llama_hparams::n_embd_r / n_embd_s, f32 states
        n_embd_r = (int(d_conv) - 1) * (d_inner + 2 * n_group * d_state)
        n_embd_s = d_state * d_inner
        rs_slot_bytes = n_recurrent * 4 * (n_embd_r + n_embd_s)
    mtp_mode, n_mtp_heads = mtp_mode_of(arch, n_nextn)
    n_embd = int(_field(reader, f"{arch}.embedding_length", 0))
    return ModelInfo(
        path=str(path),
        name=str(_field(reader, "general.name", path.stem)),
        arch=arch,
        n_layer=block_count - n_nextn,
        n_layer_nextn=n_nextn,
        n_embd=n_embd,
        n_vocab=len(tokens),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 0)),
        n_params=n_params,
        size=path.stat().st_size,
        has_mtp=n_nextn > 0,
        is_recurrent=is_recurrent,
        rs_slot_bytes=rs_slot_bytes,
        file_type=_file_type(path, reader, tensor_types),
        tensor_types=dict(tensor_types.most_common()),
        n_expert=int(_field(reader, f"{arch}.expert_count", 0) or 0),
        n_expert_used=_largest(_field(reader, f"{arch}.expert_used_count", 0)),
        n_ff_exp=_largest(_field(reader, f"{arch}.expert_feed_forward_length", 0)),
        moe_layers=_moe_layers(reader),
        n_embd_head_k=_head_k(reader, arch),
        mtp_mode=mtp_mode,
        n_mtp_heads=n_mtp_heads,
        is_mtp_head_file=arch in SHARED_MEMORY_HEAD_ARCHS,
        n_layer_attention=n_layer_attention,
        n_embd_out=int(_field(reader, f"{arch}.embedding_length_out", 0) or n_embd),
    )


def _head_k(reader, arch: str) -> int:
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        return int(key_length)
    n_head = _largest(_field(reader, f"{arch}.attention.head_count", 0))
    return int(_field(reader, f"{arch}.embedding_length", 0)) // n_head if n_head else 0


def _largest(value) -> int:
    """A per-model or per-layer (array) count as one number: the largest."""
    if isinstance(value, (list, tuple)):
        return int(max(value, default=0))
    return int(value or 0)


def _moe_layers(reader) -> tuple[int, ...]:
    found = set()
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] == "ffn_gate_inp" and parts[1].isdigit():
            found.add(int(parts[1]))
    return tuple(sorted(found))
