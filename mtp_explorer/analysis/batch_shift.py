"""The batch-shape shift of a model's logits, measured per file and machine: the tie tolerance of every greedy check.

Greedy speculative decoding emits what plain decoding emits, up to llama.cpp's kernels: a verify batch of
``n_max + 1`` rows runs other matrix-product kernels than a one-token decode (a GEMM instead of a GEMV; for
Q4_K, from 4 rows on, the repacked ``q4_K_8x8`` GEMM; a recurrent layer's chunked scan), and the KV rows a
batch writes differ by as much from one-row ones. The target's top-2 margin therefore moves a little, and
where the one-row margin is smaller than that move a speculative run may take the other token.

:meth:`Session.batch_shift <mtp_explorer.Session.batch_shift>` measures the move: a fixed probe text
(code and prose, :data:`PROBE_TEXT`, repeated to ``max_position`` tokens) is decoded on the session's own target
context once one row per decode, then for every ``k`` in ``k``-row batches, each pass from an empty context (so
that what batches write into the KV cache and the recurrent state accumulates as in a run), and each position's
logits compared; the shift is kept per segment of KV lengths (:func:`segment_starts`: the kernels change with
the KV length, e.g. past 256 cells), and a position is judged by the largest shift up to its segment. The
result, a :class:`BatchShift`, is cached per file (its content), machine (CPU model, devices, llama.cpp build),
placement (threads, offload, attention, KV cache types, ``repack``) and ``n_rs_seq`` under
``$MTP_EXPLORER_CACHE`` (default ``~/.cache/mtp-explorer``)/``batch-shift``. An oracle recording carries it, so
:func:`~mtp_explorer.compare`, :func:`~mtp_explorer.check_parallel` and the llama-server parity harness use it as their
tie tolerance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import hooks, native
from ..core.cache import cache_root, write_json
from ..core.checks import check_int
from ..core.cpu_kernels import cpu_model
from ..core.errors import FormatError, ParameterError
from ..core.schema import check_fields

if TYPE_CHECKING:
    from ..core.session import Session

#: what the probe decodes (tokenized by the model's own tokenizer, repeated as far as the probe's windows reach)
PROBE_TEXT = '''import os
import sys


def read_lines(path, encoding="utf-8"):
    """Return the lines of a text file without their line endings."""
    with open(path, encoding=encoding) as f:
        return [line.rstrip("\\n") for line in f]


class Counter(dict):
    def __missing__(self, key):
        return 0

    def update(self, items):
        for item in items:
            self[item] += 1


The verify batch holds the last accepted token and the drafts. When every draft is accepted the model
has produced several tokens for the price of one forward pass; when the first is rejected, one.
for i, name in enumerate(sorted(os.listdir("."))):
    if name.endswith(".py"):
        print(i, name, file=sys.stderr)


def merge(left, right, key=None):
    """Merge two sorted lists into one sorted list."""
    key = key or (lambda x: x)
    out, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        if key(right[j]) < key(left[i]):
            out.append(right[j])
            j += 1
        else:
            out.append(left[i])
            i += 1
    out.extend(left[i:])
    out.extend(right[j:])
    return out


A small model drafts, a large one checks. The drafts cost little, and the check of several tokens costs
about as much as the check of one, so the speed-up is the number of tokens accepted per check, less the
time the drafts took. Greedy decoding gives the same text either way.
'''
MAX_POSITION = 1024
"""How deep into the context the probe goes by default (at most the session's ``n_ctx_seq``)."""
SAFETY = 2.0
"""The tie tolerance is this many times the largest shift the probe saw: it sees a sample of positions."""
FORMAT = "mtp-explorer-batch-shift-2"


def segment_starts(limit: int) -> list[int]:
    """Where the probe's segments start: at 0 and at each power-of-two KV length from 256 on below ``limit``
    (llama.cpp pads the KV cache to 256 cells, and its attention kernels change with the length)."""
    starts, edge = [0], 256
    while edge < limit:
        starts.append(edge)
        edge *= 2
    return starts


#: A saved record's fields and their kinds (:func:`~mtp_explorer.core.schema.check_fields`).
_SAVED_FIELDS = {
    "model": "str",
    "file_id": "str",
    "machine": "dict",
    "n_positions": "int",
    "ks": "int[]",
    "margin_shift": "float[]",
    "logit_shift": "float[]",
    "n_flips": "int[]",
    "smallest_margin": "float",
    "starts": "int[]",
    "segment_shift": "float[][]",
}


@dataclasses.dataclass(frozen=True)
class BatchShift:
    """How far one model's target logits move between one-row decodes and ``k``-row batches on one machine.

    The probe decodes ``n_positions`` tokens from an empty context once a row at a time and once in ``k``-row
    batches per ``k`` (so that what batches write into the KV cache and the recurrent state accumulates as in a
    run). Per batch size ``k`` (``ks``): ``margin_shift`` (the largest change of a position's one-row top-1 minus
    top-2 logit), ``logit_shift`` (the largest change of any logit) and ``n_flips`` (positions whose argmax
    changed); ``segment_shift[i][s]`` is ``ks[i]``'s largest margin change among the positions from
    ``starts[s]`` to the next start (:func:`segment_starts`). ``smallest_margin`` is the smallest one-row top-2
    margin seen. ``model`` names the file, ``file_id`` its content, ``machine`` the machine and placement.
    """

    model: str
    file_id: str
    machine: dict[str, Any]
    n_positions: int
    ks: tuple[int, ...]
    margin_shift: tuple[float, ...]
    logit_shift: tuple[float, ...]
    n_flips: tuple[int, ...]
    smallest_margin: float
    starts: tuple[int, ...]
    segment_shift: tuple[tuple[float, ...], ...]

    def shift(self, k: int | None = None, position: int | None = None) -> float:
        """The largest top-2 margin shift measured for batches of at most ``k`` rows (``None``: any probed), at the
        KV lengths up to the end of the segment holding ``position`` (``None``: all probed). A one-row
        decode (``k`` 1) is the oracle's own shape: 0. A ``k`` above every probed size gets the largest measured
        (:meth:`rows` says which sizes that covers)."""
        if k is not None and k < 2:
            return 0.0
        picked = [i for i, kk in enumerate(self.ks) if k is None or kk <= k]
        if not picked:
            raise ParameterError(f"no batch of at most {k} rows was probed (probed: {list(self.ks)})")
        n_seg = len(self.starts) if position is None else max(1, sum(st <= position for st in self.starts))
        return float(max(max(self.segment_shift[i][:n_seg]) for i in picked))

    def tolerance(self, k: int | None = None, position: int | None = None) -> float:
        """The tie tolerance in logits for a run whose target batches had at most ``k`` rows, at the KV length
        ``position``: :data:`SAFETY` times :meth:`shift`."""
        return SAFETY * self.shift(k, position)

    def tolerances(self, k: int | None, positions: np.ndarray) -> np.ndarray:
        """:meth:`tolerance` at every KV length of ``positions``."""
        by_segment = [self.tolerance(k, st) for st in self.starts]
        idx = np.clip(np.searchsorted(np.asarray(self.starts), np.asarray(positions), side="right") - 1, 0, None)
        return np.asarray(by_segment)[idx]

    def rows(self, k: int | None = None) -> str:
        """The batch sizes :meth:`shift` covers, in words."""
        if k is not None and k < 2:
            return "one-row decodes only (no batch)"
        probed = [kk for kk in self.ks if k is None or kk <= k]
        return f"batches of {', '.join(map(str, probed))} rows"

    def explain(self, margin: float, k: int | None = None, position: int | None = None) -> str:
        """Why a divergence at a one-row top-2 margin ``margin``, in a run whose target batches had at most ``k``
        rows, at the KV length ``position``, is (or is not) the kernels' batch variance."""
        shift, tol = self.shift(k, position), self.tolerance(k, position)
        at = "" if position is None else f" up to KV length {position}"
        where = f"{self.rows(k)}{at} of {self.model} on this machine"
        if margin < tol:
            return (
                f"batch-variant kernel, shift <= {shift:.3g} at this position: its one-row top-2 margin "
                f"{margin:.3g} is within the tolerance {tol:.3g} ({SAFETY:g} x the shift measured for {where})"
            )
        return (
            f"unexplained: the one-row top-2 margin {margin:.3g} exceeds the tolerance {tol:.3g} ({SAFETY:g} x "
            f"the largest shift measured for {where}, {shift:.3g}); not a batch-shape tie: report it as a bug"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"format": FORMAT}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchShift:
        if not isinstance(d, dict):
            raise FormatError(f"not an mtp-explorer batch-shift record: a {type(d).__name__}")
        d = dict(d)
        if d.pop("format", None) != FORMAT:
            raise FormatError("not an mtp-explorer batch-shift record (or one of an older version: measure again)")
        check_fields(d, _SAVED_FIELDS, "batch-shift record")
        per_k = ("ks", "margin_shift", "logit_shift", "n_flips", "segment_shift")
        if len({len(d[f]) for f in per_k}) != 1 or any(len(w) != len(d["starts"]) for w in d["segment_shift"]):
            raise FormatError(
                f"a malformed batch-shift record: {', '.join(per_k)} of different lengths, or a "
                "segment_shift row not one per start"
            )
        try:
            return cls(
                **{
                    **d,
                    **{f: tuple(d[f]) for f in ("ks", "margin_shift", "logit_shift", "n_flips", "starts")},
                    "segment_shift": tuple(tuple(w) for w in d["segment_shift"]),
                }
            )
        except (KeyError, TypeError) as exc:
            raise FormatError(f"a malformed batch-shift record: {exc}") from exc

    def summary(self) -> dict[str, Any]:
        """One row per batch size, for a table."""
        return {
            "model": self.model,
            "n_positions": self.n_positions,
            "smallest_margin": self.smallest_margin,
            "tolerance": self.tolerance(),
            "repack": self.machine.get("placement", {}).get("repack"),
            "starts": list(self.starts),
            "per_k": [
                {"k": k, "margin_shift": m, "logit_shift": lg, "n_flips": f, "by_segment": list(ws)}
                for k, m, lg, f, ws in zip(
                    self.ks, self.margin_shift, self.logit_shift, self.n_flips, self.segment_shift
                )
            ],
        }


# -- identity ------------------------------------------------------------------------------------------
def file_id(path: str | os.PathLike) -> str:
    """A content fingerprint of a (possibly multi-GB) file: sha256 of its size and first and last MiB."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()


def machine_key(session: Session) -> dict[str, Any]:
    """What the kernels a session runs depend on: CPU, devices, llama.cpp build, threads, placement and the target
    context's shape (a recurrent layer with snapshot slots keeps each row's state: ``n_rs_seq``, the session's
    capacity, and ``checkpoints``, a session without slots)."""
    from importlib.metadata import version

    placement = {k: v for k, v in session.placement.items() if k not in ("devices", "gpu_offload")}
    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "devices": list(session.placement["devices"]),
        "llama_cpp_python": version("llama_cpp_python"),
        "threads": session.threads,
        "placement": placement,
        "n_rs_seq": session.capacity,
        "checkpoints": session.checkpoints,
        "n_parallel": session.n_parallel,
    }


def cache_dir() -> Path:
    return cache_root() / "batch-shift"


def _cache_path(fid: str, machine: dict[str, Any], tokens: Sequence[int]) -> Path:
    key = hashlib.sha256(json.dumps([FORMAT, fid, machine, list(tokens)], sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / f"{key}.json"


# -- measuring -----------------------------------------------------------------------------------------
def _summarise(raw: dict[str, np.ndarray], starts: list[int]) -> dict[int, list]:
    """Per probed k: [largest margin shift, largest logit shift, flips, per-segment largest margin shift] over the
    positions of whole batches."""
    out = {}
    segment = np.searchsorted(np.asarray(starts), raw["position"], side="right") - 1
    for ki, k in enumerate(raw["ks"].tolist()):
        ms, ls = raw["margin_shift"][ki], raw["logit_shift"][ki]
        whole = ~np.isnan(ms)
        by_segment = [float(ms[whole & (segment == s)].max(initial=0.0)) for s in range(len(starts))]
        out[int(k)] = [float(ms[whole].max()), float(ls[whole].max()), int(raw["flip"][ki][whole].sum()), by_segment]
    return out


def _probe_tokens(session: Session, text, limit: int) -> list[int]:
    """The probe's tokens: ``text``'s (default :data:`PROBE_TEXT` repeated to ``limit``), at most ``limit``."""
    if text is None:
        once = session.tokenize(PROBE_TEXT)
        tokens = (once * (limit // len(once) + 1))[:limit]
    else:
        tokens = session.tokenize(text) if isinstance(text, str) else [int(t) for t in text]
    return session.prompt_tokens(tokens[:limit])  # ids checked, not empty


def measure(
    session: Session,
    ks: Iterable[int] | None = None,
    *,
    text: str | Sequence[int] | None = None,
    max_position: int = MAX_POSITION,
    refresh: bool = False,
) -> BatchShift:
    """The session's batch-shape shift for batches of ``ks`` rows (default: 2 .. capacity + 1, every verify
    batch its ``n_max`` can make) over KV lengths 0 to ``max_position`` (at most ``n_ctx_seq``) of ``text`` (a
    string or token ids; default :data:`PROBE_TEXT`, repeated), from the cache where measured before
    (``refresh=True`` measures again)."""
    check_int("max_position", max_position, 2, None)
    ks = sorted({int(k) for k in (range(2, session.capacity + 2) if ks is None else ks)})
    tokens = _probe_tokens(session, text, min(max_position, session.n_ctx_seq))
    if not ks or ks[0] < 2 or ks[-1] > len(tokens):
        raise ParameterError(f"batch sizes must be between 2 and {len(tokens)} (the probe's tokens), got {ks}")
    starts = segment_starts(len(tokens))
    fid, machine = file_id(session.info.path), machine_key(session)
    path = _cache_path(fid, machine, tokens)
    cached = {} if refresh else _read_cache(path)
    missing = [k for k in ks if str(k) not in cached.get("per_k", {})]
    if missing:
        raw = session.probe_batch_shift(tokens, missing)
        per_k = cached.get("per_k", {}) | {str(k): v for k, v in _summarise(raw, starts).items()}
        cached = {"smallest_margin": float(np.min(raw["margin"])), "per_k": per_k}
        write_json(path, cached)
    rows = [cached["per_k"][str(k)] for k in ks]
    return BatchShift(
        model=Path(session.info.path).name,
        file_id=fid,
        machine=machine,
        n_positions=len(tokens),
        ks=tuple(ks),
        margin_shift=tuple(float(r[0]) for r in rows),
        logit_shift=tuple(float(r[1]) for r in rows),
        n_flips=tuple(int(r[2]) for r in rows),
        smallest_margin=float(cached["smallest_margin"]),
        starts=tuple(starts),
        segment_shift=tuple(tuple(float(x) for x in r[3]) for r in rows),
    )


hooks.provide("batch_shift", measure)


def measure_batches(session: Session, depth: int, rows: int) -> BatchShift:
    """The shift for every verify batch of one sequence drafting up to ``depth`` tokens, and for a batch of
    ``rows`` rows (several sequences' verify rows together, as parallel requests or server slots make; at most
    ``BATCH_SHIFT_ROWS_MAX``, 64, the outputs every target context reserves for the probe)."""
    return measure(session, {*range(2, depth + 2), max(2, min(rows, native.BATCH_SHIFT_ROWS_MAX))})


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again
    return doc if isinstance(doc, dict) and isinstance(doc.get("per_k"), dict) else {}


def tolerance_of(
    shift: BatchShift | None, tol_logit: float | None, default: float, k: int | None = None, position: int | None = None
) -> float:
    """The tie tolerance a check uses: ``tol_logit`` if given, else the measured shift's for batches of at most
    ``k`` rows at the KV length ``position``, else ``default``."""
    if tol_logit is not None:
        return float(tol_logit)
    return shift.tolerance(k, position) if shift is not None else default
