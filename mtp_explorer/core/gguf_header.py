"""A fast reader of a GGUF file's header: its metadata and tensor table, without the tensor data.

The ``gguf`` package's ``GGUFReader`` builds numpy views for every element of every metadata array, which takes tens of
seconds for a real model's 262,144-token vocabulary (Gemma 3: three such arrays). This reader reads the header with
``struct`` once, keeps a string array as its offsets (decoded only if asked) and a numeric array as one numpy array, and
gives :func:`~mtp_explorer.model_info` the same ``fields[key].contents()`` and ``tensors`` it read from ``GGUFReader``.
Anything it does not recognise raises, and :func:`~mtp_explorer.core.info.model_info` then asks ``GGUFReader``.
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _StringArray(list):
    """A GGUF string array read lazily: its length is known, its strings decoded on first access."""

    def __init__(self, buf, offsets: list[tuple[int, int]]):
        super().__init__()
        self._buf, self._offsets, self._decoded = buf, offsets, False

    def _decode(self) -> None:
        if not self._decoded:
            self._decoded = True
            super().extend(bytes(self._buf[a:b]).decode("utf-8", errors="replace") for a, b in self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    def __iter__(self):
        self._decode()
        return super().__iter__()

    def __getitem__(self, i):
        self._decode()
        return super().__getitem__(i)


@dataclasses.dataclass(frozen=True)
class Field:
    """One metadata value (``contents()`` as ``GGUFReader``'s fields give it)."""

    value: Any

    def contents(self) -> Any:
        return self.value


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One entry of the tensor table."""

    name: str
    shape: np.ndarray
    tensor_type: Any  #: a ``gguf.GGMLQuantizationType``
    data_offset: int
    n_bytes: int


class HeaderReader:
    """``fields`` and ``tensors`` of a GGUF file (version 2 or 3)."""

    def __init__(self, path: str | Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf, self._pos = buf, 0
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        self._pos = 24
        self.fields: dict[str, Field] = {}
        for _ in range(n_kv):
            key = self._string()
            if key in self.fields:
                raise ValueError(f"duplicate key {key}")
            self.fields[key] = Field(self._value(self._u32()))
        table = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._u32()
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            dims = np.array(struct.unpack_from(f"<{n_dims}Q", buf, self._pos), dtype=np.uint64)
            self._pos += 8 * n_dims
            ttype, offset = struct.unpack_from("<IQ", buf, self._pos)
            self._pos += 12
            table.append((name, dims, GGMLQuantizationType(ttype), offset))
        align = int(self.fields.get("general.alignment", Field(32)).value)
        start = -(-self._pos // align) * align
        self.tensors = []
        for name, dims, ttype, offset in table:
            block, size = GGML_QUANT_SIZES[ttype]
            n = int(np.prod(dims.astype(np.int64))) if len(dims) else 1
            self.tensors.append(Tensor(name, dims, ttype, start + int(offset), n // block * size))

    def _u32(self) -> int:
        (v,) = struct.unpack_from("<I", self._buf, self._pos)
        self._pos += 4
        return v

    def _span(self) -> tuple[int, int]:
        (n,) = struct.unpack_from("<Q", self._buf, self._pos)
        a = self._pos + 8
        if a + n > len(self._buf):
            raise ValueError("a string runs past the end of the file")
        self._pos = a + n
        return a, a + n

    def _string(self) -> str:
        a, b = self._span()
        return bytes(self._buf[a:b]).decode("utf-8")

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype in _SCALARS:
            (v,) = struct.unpack_from(_SCALARS[vtype], self._buf, self._pos)
            self._pos += struct.calcsize(_SCALARS[vtype])
            return v
        if vtype != _ARRAY:
            raise ValueError(f"unknown metadata type {vtype}")
        etype = self._u32()
        (count,) = struct.unpack_from("<Q", self._buf, self._pos)
        self._pos += 8
        if etype == _STRING:
            return _StringArray(self._buf, [self._span() for _ in range(count)])
        if etype not in _SCALARS:
            raise ValueError(f"unsupported array element type {etype}")
        dtype = np.dtype(_SCALARS[etype])
        if self._pos + count * dtype.itemsize > len(self._buf):
            raise ValueError("an array runs past the end of the file")
        arr = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
        self._pos += count * dtype.itemsize
        return arr.tolist()
