"""Cost profiles: a machine's cost model measured once, saved, and used to predict anywhere.

An :class:`~mtp_explorer.analysis.oracle.OracleTrace` carries two things: what the drafters would propose and
the target accept (the same on every machine, under greedy decoding), and the cost model of the machine that
recorded it. A :class:`CostProfile` is the second part on its own, measured with :func:`profile_costs` (or
``mtp-explorer profile MODEL -o costs.json``) on the machine whose speed you want to know, and saved as JSON.
Pass it as ``costs=`` to :func:`~mtp_explorer.simulate`, :func:`~mtp_explorer.simulate_grid`,
:func:`~mtp_explorer.sweep` or :func:`~mtp_explorer.cost_consistency` to price the oracle's steps with that
machine's times: record acceptance on a laptop, predict tokens/s on a GPU server.

A profile holds the :class:`CostModel` pooled over oracles recorded (with their timing probes) on a few
built-in code-like and prose-like prompts, and what it was measured for and on: the model's identity
(architecture, vocabulary, layers, width, experts, file type, a fingerprint of the metadata), the session
options (threads, context, and whatever else :meth:`Session.open <mtp_explorer.Session.open>` took), the
machine and the llama-cpp-python version. It serves oracles of the same model (architecture, vocabulary and
layers equal, else a :class:`~mtp_explorer.ParameterError` naming the fields that differ; another file type
of the same model only warns) recorded to a depth up to the profile's. The cost model is linear in the
position (n_past): positions far beyond the measured ones (``measured["max_pos"]``) are extrapolated.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import socket
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..core.checks import check_int
from ..core.errors import ParameterError
from ..core.info import model_info
from ..core.options import is_full_telemetry
from ..core.session import Session
from ..core.version import __version__
from .oracle import CostModel, OracleTrace

COSTS_FORMAT = "mtp-explorer-costs/1"

#: Model facts that must be equal for a profile to price an oracle (another value: another compute graph).
IDENTITY_KEYS = ("arch", "n_vocab", "n_layer", "n_layer_nextn", "n_embd", "n_expert", "n_expert_used")
#: Model facts that may differ with a warning (the same model in another quantization prices differently).
SOFT_KEYS = ("file_type", "fingerprint")
#: The metadata the fingerprint is taken of (everything :func:`~mtp_explorer.model_info` reads but the path).
_FINGERPRINT_KEYS = IDENTITY_KEYS + (
    "n_ctx_train",
    "n_params",
    "has_mtp",
    "is_recurrent",
    "file_type",
    "tensor_types",
    "n_ff_exp",
    "moe_layers",
)

#: Prompts a profile is measured on when none are given: code and prose, so that the positions and the
#: tokens resemble what oracles are recorded on.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):\n",
    'import json\n\n\nclass Config:\n    """Settings read from a file."""\n',
    "The history of the printing press begins",
    "Dear team,\n\nThank you all for your work this quarter.",
)

Costs = Union["CostProfile", CostModel, str, os.PathLike]
"""What ``costs=`` takes: a :class:`CostProfile`, the path of a saved one, or a bare :class:`CostModel`."""


def model_identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of a model (:meth:`ModelInfo.to_dict <mtp_explorer.ModelInfo.to_dict>` or an oracle's ``model``)
    a profile records: identity, file type, file name and size, and a fingerprint of the metadata."""
    facts = {k: model.get(k) for k in IDENTITY_KEYS + ("has_mtp", "is_recurrent", "file_type", "n_params")}
    path = model.get("path")
    facts |= {
        "name": model.get("name"),
        "file": Path(path).name if path else None,
        "size": model.get("size"),
        "fingerprint": _fingerprint(model),
    }
    return facts


def _fingerprint(model: Mapping[str, Any]) -> str:
    doc = json.dumps({k: model.get(k) for k in _FINGERPRINT_KEYS}, sort_keys=True, default=list)
    return hashlib.sha1(doc.encode()).hexdigest()[:16]


def machine_facts() -> dict[str, Any]:
    """The machine a profile is measured on."""
    try:
        import llama_cpp

        llama_version = getattr(llama_cpp, "__version__", None)
    except ImportError:  # pragma: no cover - a dependency
        llama_version = None
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_version,
        "mtp_explorer": __version__,
    }


@dataclasses.dataclass
class CostProfile:
    """A cost model measured on one machine for one model, with what it was measured for and on.

    ``cost``: the :class:`CostModel` (per-operation times in ns); ``model``: the model's facts
    (:func:`model_identity`); ``options``: the session's open options (``threads``, ``n_ctx``, ...);
    ``session``: the session's effective settings (threads llama.cpp used, padded context, capacity, clock);
    ``machine``: :func:`machine_facts`; ``measured``: the prompts, ``max_tokens``, ``depth``, positions and
    seconds of the measurement; ``created``: an ISO 8601 time stamp. :meth:`save` / :meth:`load` as JSON.
    """

    cost: CostModel
    model: dict[str, Any]
    options: dict[str, Any]
    session: dict[str, Any]
    machine: dict[str, Any]
    measured: dict[str, Any]
    created: str

    @property
    def depth(self) -> int:
        """The deepest oracle this profile can price (the verify and draft sizes it measured)."""
        return self.cost.depth

    # -- checks ----------------------------------------------------------------------------------
    def differences(self, model: Mapping[str, Any], keys: Sequence[str] = IDENTITY_KEYS) -> dict[str, tuple]:
        """The facts of ``model`` (a model's facts, e.g. an oracle's ``model``) that differ from the profile's:
        ``{key: (profile's, model's)}``. Facts one side does not record (older files) are not compared."""
        other = model_identity(model)
        return {
            k: (self.model.get(k), other.get(k))
            for k in keys
            if self.model.get(k) is not None and other.get(k) is not None and self.model.get(k) != other.get(k)
        }

    def check_model(self, model: Mapping[str, Any], what: str = "the model") -> None:
        """A :class:`ParameterError` naming the differing fields if ``model`` is not the profile's model; a
        warning if only its file type (or other metadata) differs."""
        hard = self.differences(model)
        if hard:
            listed = ", ".join(f"{k} {a!r} (profile) vs {b!r} ({what})" for k, (a, b) in hard.items())
            raise ParameterError(
                f"this cost profile was measured for another model ({self.model.get('name')!r}, "
                f"{self.model.get('file')}): {listed}; measure one for this model "
                "(mtp_explorer.profile_costs or `mtp-explorer profile MODEL`)"
            )
        soft = self.differences(model, SOFT_KEYS)
        if soft:
            listed = ", ".join(f"{k} {a!r} (profile) vs {b!r} ({what})" for k, (a, b) in soft.items())
            warnings.warn(f"the cost profile was measured on another file of this model: {listed}", stacklevel=3)

    def check_depth(self, depth: int, what: str = "the oracle") -> None:
        if depth > self.depth:
            raise ParameterError(
                f"{what} has depth {depth} but the cost profile was measured to depth {self.depth}; "
                f"measure a profile with depth >= {depth}"
            )

    def apply(self, oracle: OracleTrace) -> OracleTrace:
        """``oracle`` pricing its steps with this profile (checked: same model, depth within the profile's)."""
        if not isinstance(oracle, OracleTrace):
            raise ParameterError(f"expected an OracleTrace (Session.record_oracle), got {type(oracle).__name__}")
        self.check_model(oracle.model, "the oracle")
        self.check_depth(oracle.depth)
        return _with_cost(oracle, self.cost)

    # -- numbers ---------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The headline numbers: plain decoding and every-draft-accepted tokens/s at the mean measured
        position, per ``n_max`` up to the depth (the MTP head's; plain only for a model without one)."""
        pos = float(self.measured.get("mean_pos", 0.0))
        plain = 1e9 / self.cost.ceiling_step_ns(0, pos=pos)
        ceiling = {}
        if self.model.get("has_mtp"):
            ceiling = {n: (n + 1) * 1e9 / self.cost.ceiling_step_ns(n, pos=pos) for n in range(1, self.depth + 1)}
        return {
            "model": self.model.get("name"),
            "file": self.model.get("file"),
            "depth": self.depth,
            "threads": self.session.get("threads"),
            "hostname": self.machine.get("hostname"),
            "devices": self.session.get("devices"),
            "n_gpu_layers": self.session.get("n_gpu_layers"),
            "positions": self.measured.get("n_positions"),
            "mean_pos": pos,
            "plain_tokens_per_second": plain,
            "ceiling_tokens_per_second": ceiling,
            "verify_ms": {k: float(self.cost.verify_ns(k, pos, fresh=False)) / 1e6 for k in range(1, self.depth + 2)},
            "seconds": self.measured.get("seconds"),
            "created": self.created,
        }

    # -- (de)serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"format": COSTS_FORMAT} | doc | {"cost": self.cost.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False, default=_jsonable)

    @classmethod
    def from_dict(cls, doc: Any) -> CostProfile:
        """A profile from :meth:`to_dict`'s output; a :class:`ParameterError` naming what is wrong otherwise."""
        if not isinstance(doc, dict):
            raise ParameterError(f"not a cost profile: expected a JSON object, got {type(doc).__name__}")
        fmt = doc.get("format")
        if fmt != COSTS_FORMAT:
            raise ParameterError(f"not a cost profile of this version: format {fmt!r}, expected {COSTS_FORMAT!r}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in doc]
        if missing:
            raise ParameterError(f"the cost profile lacks {missing}")
        for name in names[1:]:
            want = str if name == "created" else dict
            if not isinstance(doc[name], want):
                raise ParameterError(f"the cost profile's {name!r} is not a {want.__name__}")
        return cls(cost=_cost_model(doc["cost"]), **{n: doc[n] for n in names[1:]})

    @classmethod
    def from_json(cls, text: str) -> CostProfile:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ParameterError(f"not a cost profile: invalid JSON ({exc})") from None
        return cls.from_dict(doc)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the profile as JSON; returns the path."""
        path = Path(path)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, model: Any = None) -> CostProfile:
        """Read a profile saved by :meth:`save`. With ``model`` (a GGUF path, a :class:`~mtp_explorer.ModelInfo`,
        a session, an oracle or a model-facts dict), check it was measured for that model. A missing or
        malformed file, or another model, is a :class:`ParameterError`."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ParameterError(f"cannot read the cost profile {path}: {exc}") from None
        try:
            profile = cls.from_json(text)
        except ParameterError as exc:
            raise ParameterError(f"{path}: {exc}") from None
        if model is not None:
            profile.check_model(_model_facts(model), "the given model")
        return profile


def _jsonable(value: Any) -> Any:
    """Values of options JSON does not know (tuples are lists already): numpy scalars, enums, paths."""
    if isinstance(value, np.generic):
        return value.item()
    return getattr(value, "name", None) or str(value)


def _cost_model(doc: Any) -> CostModel:
    """The profile's cost model, its tables checked (shapes that fit one depth, finite numbers)."""
    if not isinstance(doc, dict):
        raise ParameterError("the cost profile's 'cost' is not a JSON object")
    try:
        cost = CostModel.from_dict(doc)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"the cost profile's cost model is malformed: {exc}") from None
    depth = len(cost.draft) - 1
    # the tables in CostModel's order: verify, catch-up (k = 0 .. depth + 1), draft (m = 0 .. depth), look-up, the
    # draft model's draft (m = 0 .. depth; one zero row in a profile measured without a draft model) and follow
    tables = [f.name for f in dataclasses.fields(CostModel) if f.type == "np.ndarray"]
    shapes = [(depth + 2, 2), (depth + 2, 2), (depth + 1, 2), (2,), (depth + 1, 2), (2,)]
    for name, shape in zip(tables, shapes, strict=True):
        table = getattr(cost, name)
        if name == "model_draft" and table.shape == (1, 2):
            shape = (1, 2)
        if depth < 1 or table.shape != shape:
            raise ParameterError(f"the cost profile's cost table {name!r} has shape {table.shape}, expected {shape}")
        if not np.isfinite(table).all():
            raise ParameterError(f"the cost profile's cost table {name!r} holds non-finite numbers")
    for f in dataclasses.fields(CostModel):
        if f.name.endswith("_ns"):
            value = getattr(cost, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ParameterError(f"the cost profile's {f.name} is not a finite number: {value!r}")
    return cost


def _model_facts(model: Any) -> Mapping[str, Any]:
    """A model's facts from a GGUF path, a ModelInfo, a session, an oracle or a dict."""
    if isinstance(model, Mapping):
        return model
    if isinstance(model, OracleTrace):
        return model.model
    info = getattr(model, "info", model)  # a session
    if hasattr(info, "to_dict"):
        return info.to_dict()
    if isinstance(model, (str, os.PathLike)):
        return model_info(model).to_dict()
    raise ParameterError(f"cannot tell which model {type(model).__name__} is")


# -- costs= ----------------------------------------------------------------------------------------
def _with_cost(oracle: OracleTrace, cost: CostModel) -> OracleTrace:
    """``oracle.with_cost(cost)``, sharing the drafters' replays (they do not depend on the cost)."""
    out = oracle.with_cost(cost)
    out.__dict__["_replays"] = oracle.__dict__.setdefault("_replays", {})
    return out


def resolve_costs(costs: Costs | None) -> CostProfile | CostModel | None:
    """``costs=`` as a profile or a cost model: a path is loaded (:meth:`CostProfile.load`)."""
    if costs is None or isinstance(costs, (CostProfile, CostModel)):
        return costs
    if isinstance(costs, (str, os.PathLike)):
        return CostProfile.load(costs)
    raise ParameterError(
        f"costs must be a CostProfile, the path of a saved one or a CostModel, got {type(costs).__name__}"
    )


def check_costs(costs: CostProfile | CostModel, model: Mapping[str, Any], depth: int, what: str) -> CostModel:
    """The cost model of ``costs`` for a model (its facts) and a depth; a :class:`ParameterError` if it cannot
    price them."""
    if isinstance(costs, CostProfile):
        costs.check_model(model, what)
        costs.check_depth(depth, what)
        return costs.cost
    if depth > costs.depth:
        raise ParameterError(f"{what} has depth {depth} but the cost model was fitted to depth {costs.depth}")
    return costs


def with_costs(oracle: OracleTrace, costs: Costs | None) -> OracleTrace:
    """``oracle`` priced with ``costs`` (``None``: as it is). See :func:`resolve_costs`."""
    costs = resolve_costs(costs)
    if costs is None or not isinstance(oracle, OracleTrace):
        return oracle
    return _with_cost(oracle, check_costs(costs, oracle.model, oracle.depth, "the oracle"))


# -- measuring --------------------------------------------------------------------------------------
def profile_costs(
    model: Session | str | os.PathLike | None = None,
    prompts: Sequence[Any] | None = None,
    *,
    max_tokens: int = 128,
    depth: int | None = None,
    progress: bool | Callable[[int, int], None] = True,
    **open_kwargs: Any,
) -> CostProfile:
    """Measure this machine's cost profile for a model: one oracle with timing probes per prompt (default:
    :data:`DEFAULT_PROMPTS`, code and prose), after a short warm-up, and one :class:`CostModel` fitted on
    all their measurements pooled.

    ``model``: an open :class:`~mtp_explorer.Session` (its options are the profile's), or a GGUF path (``None``:
    the bundled demo model) opened with ``open_kwargs`` (``threads=``, ``n_ctx=``, ... as
    :meth:`Session.open <mtp_explorer.Session.open>`) for the measurement. ``depth``: the deepest oracle the
    profile will price (default: the session's capacity). ``progress``: a progress bar (``True``), none
    (``False``) or a callable ``progress(done, total)`` called after each oracle. Save the result with
    :meth:`CostProfile.save`; use it as ``costs=`` in :func:`~mtp_explorer.simulate` and friends.
    """
    if isinstance(model, Session):
        if open_kwargs:
            raise ParameterError(f"options {sorted(open_kwargs)} apply to a model path, not to an open session")
        return _measure(model, prompts, max_tokens, depth, progress)
    with Session.open(model, **open_kwargs) as session:
        return _measure(session, prompts, max_tokens, depth, progress)


def _measure(session: Session, prompts, max_tokens: int, depth: int | None, progress) -> CostProfile:
    prompts = list(DEFAULT_PROMPTS if prompts is None else ([prompts] if isinstance(prompts, str) else prompts))
    if not prompts:
        raise ParameterError("no prompts to measure the cost profile on")
    check_int("max_tokens", max_tokens, 8, None)
    depth = session.capacity if depth is None else check_int("depth", depth, 1, None)
    if depth > session.capacity:
        raise ParameterError(
            f"depth={depth} exceeds the session's capacity of {session.capacity}; open it with n_rs_seq={depth} or more"
        )
    report = _reporter(progress, len(prompts) + 1)
    t0 = time.perf_counter()
    oracles = []
    try:
        session.record_oracle(prompts[0], max_tokens=min(16, max_tokens), depth=depth)  # warm-up, not fitted
        report()
        for prompt in prompts:
            oracles.append(session.record_oracle(prompt, max_tokens=max_tokens, depth=depth))
            report()
    finally:
        report(close=True)
    columns = pooled_columns(oracles)
    cost = CostModel.from_columns(columns, depth, is_full_telemetry(session.telemetry))
    pos = columns["pos"].astype(np.float64)
    options = getattr(session, "options", None)
    return CostProfile(
        cost=cost,
        model=model_identity(session.info.to_dict()),
        options=options.as_kwargs() if hasattr(options, "as_kwargs") else dict(session.open_kwargs),  # type: ignore[union-attr]
        session={
            "n_ctx": session.n_ctx,
            "threads": session.threads,
            "capacity": session.capacity,
            "telemetry": session.telemetry,
            "clock": session.clock,
        }
        | _placement(session),
        machine=machine_facts(),
        measured={
            "prompts": [p if isinstance(p, str) else session.detokenize(p) for p in prompts],
            "max_tokens": max_tokens,
            "depth": depth,
            "n_oracles": len(oracles),
            "n_positions": int(pos.size),
            "min_pos": float(pos.min()),
            "max_pos": float(pos.max()),
            "mean_pos": float(pos.mean()),
            "seconds": time.perf_counter() - t0,
        },
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def _placement(session: Session) -> dict[str, Any]:
    """Where the session's model computes (GPU layers, flash attention, KV cache types, backend devices), as
    JSON values."""
    return json.loads(json.dumps(dict(getattr(session, "placement", {})), default=_jsonable))


def pooled_columns(oracles: Sequence[OracleTrace]) -> dict[str, np.ndarray]:
    """The timing columns of several oracles of one depth as one recording's (rows appended), for
    :meth:`CostModel.from_columns`: its robust fits then rest on every oracle's measurements."""
    if not oracles or len({o.depth for o in oracles}) != 1:
        raise ParameterError("pooling needs oracles of one depth")
    return {k: np.concatenate([o.columns[k] for o in oracles]) for k in oracles[0].columns}


def _reporter(progress: bool | Callable[[int, int], None], total: int) -> Callable[..., None]:
    """``report()`` after each recording, ``report(close=True)`` at the end."""
    if callable(progress):
        done = [0]

        def call(close: bool = False) -> None:
            if not close:
                done[0] += 1
                progress(done[0], total)

        return call
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="cost profile", unit="oracle", disable=not progress, leave=False)
    return lambda close=False: bar.close() if close else bar.update(1)
