"""The per-step and per-position column schemas, read once from the native engine.

The engine declares every telemetry column (name, dtype, width) in one table (``native_ext/telemetry.h``)
and every oracle column in another (``native_ext/oracle.h``); ``native.TRACE_COLUMNS`` and
``native.ORACLE_COLUMNS`` export them. Everything in Python that holds columns derives from these:
:class:`~mtp_explorer.core.trace.Trace` and its :class:`~mtp_explorer.core.trace.Step` records, the
Explorer's live trace, the simulator's traces and the JSON codec. The names the enum columns index
(``STOP_REASONS``, ``DRAFTERS``, ``FINISH_REASONS``) come from the engine too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from . import native
from .errors import FormatError

STOP_REASONS: tuple[str, ...] = tuple(native.STOP_REASONS)
"""Why drafting stopped in a step, indexed by the ``stop_reason`` column (``exhausted``: the drafter had no
(more) tokens to propose, e.g. the n-gram look-up found no match)."""

DRAFTERS: tuple[str, ...] = tuple(native.DRAFTERS)
"""The engine's drafters, indexed by the ``drafter`` column (-1: no draft was verified)."""

FINISH_REASONS: tuple[str, ...] = tuple(native.FINISH_REASONS)
"""Why a generation ended."""

CHAIN_POLICIES: tuple[str, ...] = tuple(native.CHAIN_POLICIES)
"""How a chain of drafters picks the draft it verifies."""

PHASES: tuple[str, ...] = tuple(
    c[len("t_") : -len("_ns")]
    for c, _, w in native.TRACE_COLUMNS
    if c.startswith("t_") and c.endswith("_ns") and w == ""
)
"""The timed phases of a step, in the engine's order (a ``t_<phase>_ns`` column each)."""

#: Columns whose integer values index a name table (shown as names in :class:`Step` records).
ENUM_COLUMNS: Mapping[str, tuple[str, ...]] = {"stop_reason": STOP_REASONS, "drafter": DRAFTERS}

#: Columns whose -1 means "none" (``None`` in :class:`Step` records).
OPTIONAL_COLUMNS: frozenset[str] = frozenset({"rs_slot", "replay_agreed"})

#: Depth-indexed columns about the step's batch rather than the verified draft (``draft_rows``: rows of each MTP
#: draft decode, every sequence's): their real entries run up to the padding, not to ``n_drafted``.
BATCH_DEPTH_COLUMNS: frozenset[str] = frozenset({"draft_rows"})


@dataclasses.dataclass(frozen=True)
class Dims:
    """The widths of a trace's indexed columns."""

    depth: int  #: D: the session's n_max capacity
    topk: int  #: K: alternatives recorded per draft depth
    sources: int = len(DRAFTERS)  #: S: the engine's drafters


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its name, numpy dtype and width kind: ``""`` (a scalar per row) or a product of the
    :class:`Dims` sizes, ``depth``, ``depth+1``, ``depth*topk``, ``sources`` (one per drafter, indexed by
    :data:`DRAFTERS`), ``sources*depth``, ``sources*depth*topk``; oracle columns also ``tail`` (a column of its
    own length)."""

    name: str
    dtype: np.dtype
    width: str

    def inner_shape(self, dims: Dims) -> tuple[int, ...]:
        """The shape of one row."""
        if self.width in ("", "tail"):
            return ()
        sizes = {"depth": dims.depth, "depth+1": dims.depth + 1, "topk": dims.topk, "sources": dims.sources}
        return tuple(sizes[axis] for axis in self.width.split("*"))

    @property
    def fill(self) -> float | int:
        """The padding value: -1 for integers, NaN for floats."""
        return math.nan if self.dtype.kind == "f" else -1

    @property
    def per_source(self) -> bool:
        """Indexed by drafter first (its index in :data:`DRAFTERS`)."""
        return self.width.split("*")[0] == "sources"

    @property
    def per_depth(self) -> bool:
        """Indexed by draft depth (padded past the drafted tokens), after the drafter where it is also
        :attr:`per_source`."""
        return any(axis.startswith("depth") for axis in self.width.split("*"))

    def empty(self, n_rows: int, dims: Dims) -> np.ndarray:
        return np.full((n_rows, *self.inner_shape(dims)), self.fill, dtype=self.dtype)


def _read(table) -> tuple[Column, ...]:
    columns = tuple(Column(str(name), np.dtype(dtype), str(width)) for name, dtype, width in table)
    for c in columns:  # every width kind the engine uses is one this module can shape
        try:
            c.inner_shape(Dims(depth=1, topk=1))
        except KeyError:
            raise ImportError(f"column {c.name!r} has a width kind {c.width!r} this package does not know") from None
    return columns


TRACE_COLUMNS: tuple[Column, ...] = _read(native.TRACE_COLUMNS)
"""The per-step columns of a trace, in the engine's order."""

ORACLE_COLUMNS: tuple[Column, ...] = _read(native.ORACLE_COLUMNS)
"""The per-position columns of an oracle recording, in the engine's order."""

TRACE_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in TRACE_COLUMNS)
TRACE_SCHEMA: Mapping[str, Column] = {c.name: c for c in TRACE_COLUMNS}


def dims_of(columns: Mapping[str, np.ndarray]) -> Dims:
    """The widths of a trace's columns."""
    topk = columns["topk_ids"]
    return Dims(depth=int(topk.shape[1]), topk=int(topk.shape[2]), sources=int(columns["candidate_len"].shape[1]))


def empty_columns(n_rows: int, dims: Dims, schema: Iterable[Column] = TRACE_COLUMNS) -> dict[str, np.ndarray]:
    """Every column of ``schema`` with ``n_rows`` rows, padded (-1 / NaN)."""
    return {c.name: c.empty(n_rows, dims) for c in schema}


def check_columns(
    columns: Mapping[str, np.ndarray], schema: Iterable[Column] = TRACE_COLUMNS, dims: Dims | None = None
) -> None:
    """Raise ``ValueError`` unless ``columns`` has exactly the schema's columns with its dtypes and widths."""
    schema = tuple(schema)
    names = [c.name for c in schema]
    if set(columns) != set(names):
        missing, extra = sorted(set(names) - set(columns)), sorted(set(columns) - set(names))
        raise FormatError(f"columns differ from the schema: missing {missing}, unexpected {extra}")
    dims = dims or dims_of(columns)
    rows = {int(columns[c.name].shape[0]) for c in schema if c.width != "tail"}
    if len(rows) > 1:
        raise FormatError(f"columns have different row counts: {sorted(rows)}")
    for c in schema:
        arr = columns[c.name]
        if arr.dtype != c.dtype or tuple(arr.shape[1:]) != c.inner_shape(dims):
            raise FormatError(
                f"column {c.name!r}: {arr.dtype}{list(arr.shape[1:])}, "
                f"the schema says {c.dtype}{list(c.inner_shape(dims))}"
            )


def concat_columns(parts: Iterable[Mapping[str, np.ndarray]], dims: Dims) -> dict[str, np.ndarray]:
    """Rows of several column chunks, in order (no chunk: zero rows)."""
    parts = list(parts)
    if not parts:
        return empty_columns(0, dims)
    return {c.name: np.concatenate([p[c.name] for p in parts]) for c in TRACE_COLUMNS}


# -- one row as a record ---------------------------------------------------------------------------
def row_value(column: Column, cols: Mapping[str, np.ndarray], i: int, n_drafted: int) -> Any:
    """Row ``i`` of a column as a plain Python value: depth-indexed columns cut to the real entries
    (``n_drafted``, one more for ``depth+1``), enum columns as names, optional ones ``None`` for -1."""
    value = cols[column.name][i]
    if column.name in BATCH_DEPTH_COLUMNS:
        return value[value >= 0].tolist()
    if column.width == "depth" or column.width == "depth*topk":
        return value[:n_drafted].tolist()
    if column.width == "depth+1":
        return value[: n_drafted + 1].tolist()
    if column.width:
        return value.tolist()
    value = value.item()
    if column.name in ENUM_COLUMNS:
        return ENUM_COLUMNS[column.name][value] if value >= 0 else None
    if column.name in OPTIONAL_COLUMNS:
        return None if value < 0 else value
    return value


def set_row(column: Column, cols: dict[str, np.ndarray], i: int, value: Any) -> None:
    """The inverse of :func:`row_value`: write a record's value into padded row ``i``."""
    if column.per_depth or column.per_source:
        arr = np.asarray(value, dtype=column.dtype)
        if arr.size:  # an empty value (a step without a draft) leaves the padding
            cols[column.name][i][tuple(slice(0, n) for n in arr.shape)] = arr
        return
    if column.name in ENUM_COLUMNS:
        value = -1 if value is None else ENUM_COLUMNS[column.name].index(value)
    elif column.name in OPTIONAL_COLUMNS and value is None:
        value = -1
    cols[column.name][i] = value


# -- JSON ------------------------------------------------------------------------------------------
def columns_to_json(columns: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Numpy columns as JSON-ready dicts (dtype, shape, data; NaN as null)."""
    out = {}
    for name, arr in columns.items():
        data = arr.tolist()
        if arr.dtype.kind == "f":
            data = _nan_to_none(data)
        out[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}
    return out


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Any error while a saved ``what`` (a trace, an oracle...) is read becomes a :class:`FormatError` naming it."""
    try:
        yield
    except FormatError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise FormatError(f"a corrupt {what}: {type(exc).__name__}: {str(exc)[:300]}") from exc


def _finite(text: str) -> float:
    """A JSON number as a float: one too large for a float (``1e999``) is no number mtp-explorer writes."""
    value = float(text)
    if not math.isfinite(value):
        raise FormatError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise FormatError(f"{name} is not JSON mtp-explorer writes (it saves no NaN nor infinity)")


def read_document(text: str | bytes, what: str) -> dict[str, Any]:
    """A saved document's JSON object (a :class:`FormatError` if it is not JSON, holds NaN or infinities, or is
    not an object). Only JSON is parsed: nothing in the text is ever executed or unpickled."""
    with reading(what):
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    if not isinstance(doc, dict):
        raise FormatError(f"not an mtp-explorer {what}: a JSON {type(doc).__name__}, not an object")
    return doc


#: What :func:`check_fields` accepts of each kind (bool is not an int here, though Python's bool is one).
_KINDS: Mapping[str, Any] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "any": lambda v: True,
}


def _conforms(value: Any, kind: str) -> bool:
    if "|" in kind:
        return any(_conforms(value, k) for k in kind.split("|"))
    if kind.endswith("?"):
        return value is None or _conforms(value, kind[:-1])
    if kind.endswith("[]"):
        return isinstance(value, (list, tuple)) and all(_conforms(v, kind[:-2]) for v in value)
    return _KINDS[kind](value)


def check_fields(
    doc: Mapping[str, Any], kinds: Mapping[str, str], what: str, optional: Iterable[str] = (), exact: bool = True
) -> None:
    """A :class:`FormatError` unless the JSON object ``doc`` has the fields of ``kinds`` (those in ``optional`` may
    be absent; with ``exact``, no others), each of its kind: ``str``, ``int``, ``float`` (or an int), ``bool``,
    ``dict``, ``any``; ``k[]`` a list of ``k``; ``k?`` ``k`` or null; ``a|b`` either (``|`` binds last)."""
    if not isinstance(doc, dict):
        raise FormatError(f"a corrupt {what}: a JSON {type(doc).__name__}, not an object")
    unknown = sorted(set(doc) - set(kinds), key=str) if exact else []
    missing = sorted(set(kinds) - set(doc) - set(optional))
    if unknown or missing:
        raise FormatError(
            f"a corrupt {what}: "
            + "; ".join(
                ([f"unknown field(s) {[str(k)[:40] for k in unknown[:5]]}"] if unknown else [])
                + ([f"missing field(s) {missing}"] if missing else [])
            )
        )
    for name, kind in kinds.items():
        if name in doc and not _conforms(doc[name], kind):
            raise FormatError(f"a corrupt {what}: its {name!r} is not a {kind} ({type(doc[name]).__name__})")


#: The model facts a trace or an oracle reads from its ``model`` (where there), and their kinds.
MODEL_FIELDS: Mapping[str, str] = {
    "name": "str",
    "rs_slot_bytes": "int",
    "n_mtp_heads": "int?",
    "mtp_mode": "str?",
    "n_vocab": "int",
    "eog_tokens": "int[]",  # every end-of-generation token of the vocabulary (recorded since 2026-11-29)
}

#: The most axes a saved column has (rows, then at most sources x depth x topk).
_MAX_NDIM = 4


def columns_from_json(specs: Mapping[str, dict], schema: Iterable[Column] | None = None) -> dict[str, np.ndarray]:
    """The inverse of :func:`columns_to_json`, for documents from anywhere: every column's dtype (``schema``'s, where
    given; else a number or boolean type), shape and nested lists are checked against each other before its
    array is made, so a corrupt or hostile document is a :class:`FormatError` and allocates no more than its
    own data."""
    if type(specs) is not dict:
        raise FormatError(f"columns are a JSON object of columns, not a {type(specs).__name__}")
    want = None if schema is None else {c.name: c.dtype for c in schema}
    if want is not None and set(specs) != set(want):
        missing, extra = sorted(set(want) - set(specs)), sorted(set(specs) - set(want))
        raise FormatError(
            f"columns differ from the schema: missing {missing}, unexpected {[e[:40] for e in extra[:5]]}"
        )
    return {name: _column_from_json(name, spec, None if want is None else want[name]) for name, spec in specs.items()}


def _column_from_json(name: str, spec: Any, dtype: np.dtype | None) -> np.ndarray:
    """One column of :func:`columns_from_json` (of ``dtype`` where the schema says)."""
    where = f"column {name[:40]!r}"
    if type(spec) is not dict or set(spec) != {"dtype", "shape", "data"}:
        raise FormatError(f"{where} is not a {{dtype, shape, data}} object")
    if type(spec["dtype"]) is not str or len(spec["dtype"]) > 16:
        raise FormatError(f"{where}: its dtype is not a numpy type name")
    if dtype is None:
        dtype = np.dtype(spec["dtype"])
        if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
            raise FormatError(f"{where}: dtype {spec['dtype']!r} is not a number or boolean type")
    elif spec["dtype"] != str(dtype):
        raise FormatError(f"{where}: dtype {spec['dtype']!r}, the schema says {dtype}")
    shape = spec["shape"]
    if type(shape) is not list or not 1 <= len(shape) <= _MAX_NDIM or any(type(n) is not int or n < 0 for n in shape):
        raise FormatError(f"{where}: shape {str(shape)[:80]} is not a list of 1 to {_MAX_NDIM} sizes")
    flat = [spec["data"]]
    for size in shape:  # the nested lists, one axis at a time: their lengths must be the shape's
        inner = []
        for part in flat:
            if type(part) is not list or len(part) != size:
                raise FormatError(f"{where}: its data is not nested lists of its shape {shape}")
            inner.extend(part)
        flat = inner
    kinds = set(map(type, flat))
    allowed = {bool} if dtype.kind == "b" else {int, float, type(None)} if dtype.kind == "f" else {int}
    if not kinds <= allowed:
        raise FormatError(f"{where}: {sorted(k.__name__ for k in kinds - allowed)} in a {dtype} column")
    if dtype.kind in "iu" and flat:
        info = np.iinfo(dtype)
        if min(flat) < info.min or max(flat) > info.max:
            raise FormatError(f"{where}: a value out of {dtype}'s range")
    if dtype.kind == "f":
        flat = [math.nan if v is None else v for v in flat]
        if flat and max(map(abs, (v for v in flat if v == v)), default=0.0) > np.finfo(dtype).max:
            raise FormatError(f"{where}: a value out of {dtype}'s range")
    return np.array(flat, dtype=dtype).reshape(shape)


def _nan_to_none(x):
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x
