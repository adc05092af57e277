"""What a GGUF model file holds, read from its metadata without loading the weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .errors import ModelLoadError, ModelNotFoundError

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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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

    try:
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


def model_info(path: str | Path) -> ModelInfo:
    """Read a GGUF file's metadata. Raises :class:`ModelLoadError` for missing, foreign or damaged files."""
    path = Path(path)
    _check_file(path)
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path} has no general.architecture key")
    block_count = int(_field(reader, f"{arch}.block_count", 0))
    n_nextn = int(_field(reader, f"{arch}.nextn_predict_layers", 0))
    tokens = _field(reader, "tokenizer.ggml.tokens", [])
    n_params = int(sum(int(np.prod(t.shape)) for t in reader.tensors))
    d_conv = _field(reader, f"{arch}.ssm.conv_kernel")
    is_recurrent = d_conv is not None
    rs_slot_bytes = 0
    if is_recurrent:
        d_inner = int(_field(reader, f"{arch}.ssm.inner_size"))
        d_state = int(_field(reader, f"{arch}.ssm.state_size"))
        n_group = int(_field(reader, f"{arch}.ssm.group_count", 1))
        interval = int(_field(reader, f"{arch}.full_attention_interval", 0) or 0)
        n_trunk = block_count - n_nextn
        n_recurrent = n_trunk - (n_trunk // interval if interval else 0)
        # llama_hparams::n_embd_r / n_embd_s, f32 states
        n_embd_r = (int(d_conv) - 1) * (d_inner + 2 * n_group * d_state)
        n_embd_s = d_state * d_inner
        rs_slot_bytes = n_recurrent * 4 * (n_embd_r + n_embd_s)
    return ModelInfo(
        path=str(path),
        name=str(_field(reader, "general.name", path.stem)),
        arch=arch,
        n_layer=block_count - n_nextn,
        n_layer_nextn=n_nextn,
        n_embd=int(_field(reader, f"{arch}.embedding_length", 0)),
        n_vocab=len(tokens),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 0)),
        n_params=n_params,
        size=path.stat().st_size,
        has_mtp=n_nextn > 0,
        is_recurrent=is_recurrent,
        rs_slot_bytes=rs_slot_bytes,
    )
