"""What each figure function takes, checked before it draws.

A figure given the wrong kind of input (a :class:`~mtp_explorer.core.trace.Trace` where a sweep table is
expected, a sweep table where a trace is) raises a :class:`TypeError` that names what it takes and what it
got, instead of failing deep inside pandas or numpy. Figures declare their inputs with :func:`takes`::

    @takes(SWEEP_TABLE)
    def sweep_heatmap(df, value="tokens_per_second"): ...

    sweep_heatmap(trace)   # TypeError: sweep_heatmap takes a sweep/simulate_grid DataFrame (...), got Trace
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from plotly.basedatatypes import BaseFigure

from ..analysis.calibration import Calibration
from ..analysis.oracle import OracleTrace
from ..analysis.simulate import SimTrace
from ..core.errors import InputTypeError
from ..core.trace import Trace

__all__ = [
    "Kind",
    "takes",
    "TRACE",
    "OPTIONAL_TRACE",
    "SIM_TRACE",
    "FIGURE",
    "CALIBRATION_SOURCE",
    "SWEEP_TABLE",
    "CEILING_TABLE",
    "DRAFTER_TABLE",
    "COMPARISON_ROWS",
    "SPEED_ROWS",
    "SPEED_POINT",
    "one_or_labelled",
]


def type_name(value: Any) -> str:
    """How an error message names what it got."""
    return "None" if value is None else type(value).__name__


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of input: what it is called in messages (``what``) and ``problem``, which returns why a
    value is not one (``None``: it is)."""

    what: str
    problem: Callable[[Any], str | None]

    def or_none(self) -> Kind:
        """The same kind, or ``None``."""
        return Kind(f"{self.what}, or None", lambda v: None if v is None else self.problem(v))

    def check(self, value: Any, function: str, parameter: str | None = None) -> None:
        """Raise :class:`TypeError` unless ``value`` is of this kind."""
        problem = self.problem(value)
        if problem is None:
            return
        if parameter is None:
            raise InputTypeError(f"{function} takes {self.what}, got {problem}")
        raise InputTypeError(f"{function}: {parameter} must be {self.what}, got {problem}")


def instance(what: str, *types: type) -> Kind:
    """Instances of ``types``."""
    return Kind(what, lambda v: None if isinstance(v, types) else type_name(v))


def one_or_labelled(what: str, *types: type) -> Kind:
    """An instance of ``types``, or a non-empty dict of labels (strings) to such instances (one trace or bar group
    each)."""

    def problem(value: Any) -> str | None:
        if isinstance(value, types):
            return None
        if not isinstance(value, Mapping) or not value:
            return "an empty dict" if isinstance(value, Mapping) else type_name(value)
        for label, item in value.items():
            if not isinstance(label, str) or not isinstance(item, types):
                return f"a dict whose item {label!r} is a {type_name(item)}"
        return None

    return Kind(f"{what}, or a dict of labels to them", problem)


def table(what: str, columns: Iterable[str]) -> Kind:
    """A pandas DataFrame with (at least) ``columns``."""
    columns = tuple(columns)

    def problem(value: Any) -> str | None:
        if type(value).__name__ != "DataFrame" or not hasattr(value, "columns"):
            return type_name(value)
        missing = [c for c in columns if c not in value.columns]
        return f"a DataFrame without the column(s) {missing}" if missing else None

    return Kind(f"{what} (columns {', '.join(columns)})", problem)


def records(what: str, keys: Iterable[str]) -> Kind:
    """A sequence of mappings, each with ``keys``."""
    keys = tuple(keys)

    def problem(value: Any) -> str | None:
        if (
            not isinstance(value, Sequence)
            or isinstance(value, (str, bytes, Mapping))
            or type(value).__name__ == "DataFrame"
        ):
            return type_name(value)
        for i, row in enumerate(value):
            if not isinstance(row, Mapping):
                return f"a {type_name(value)} whose item {i} is a {type_name(row)}"
            missing = [k for k in keys if k not in row]
            if missing:
                return f"a {type_name(value)} whose item {i} lacks {missing}"
        return None

    return Kind(f"{what} (each with {', '.join(keys)})", problem)


def mapping(what: str, keys: Iterable[str]) -> Kind:
    """A mapping with ``keys``."""
    keys = tuple(keys)

    def problem(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return type_name(value)
        missing = [k for k in keys if k not in value]
        return f"a {type_name(value)} without {missing}" if missing else None

    return Kind(f"{what} (with {', '.join(keys)})", problem)


def _calibration_source(value: Any) -> str | None:
    if isinstance(value, (Calibration, OracleTrace, Trace)):
        return None
    if (
        isinstance(value, (str, bytes, Mapping))
        or not isinstance(value, Iterable)
        or type(value).__name__ == "DataFrame"
    ):
        return type_name(value)
    items = list(value) if isinstance(value, Sequence) else None
    if items is None:  # an iterator: calibrate() consumes it; its items are checked there
        return None
    bad = [type_name(v) for v in items if not isinstance(v, (OracleTrace, Trace))]
    return f"a {type_name(value)} holding {bad[0]}" if bad else None


# -- the kinds the figures take ----------------------------------------------------------------------
TRACE = instance("a Trace (Session.generate, Trace.from_json, mx.simulate)", Trace)
OPTIONAL_TRACE = TRACE.or_none()
SIM_TRACE = instance("a SimTrace (mx.simulate of an oracle trace)", SimTrace)
FIGURE = instance("a plotly Figure", BaseFigure)
CALIBRATION_SOURCE = Kind(
    "a Calibration (mx.calibrate), an OracleTrace, a Trace, or a sequence of them", _calibration_source
)
SWEEP_TABLE = table("a sweep/simulate_grid DataFrame", ("prompt", "n_max", "p_min", "n_tokens", "tokens_per_second"))
CEILING_TABLE = table(
    "a sweep/simulate_grid DataFrame",
    ("n_max", "p_min", "n_tokens", "tokens_per_second", "ceiling_tokens_per_second", "plain_tokens_per_second"),
)
DRAFTER_TABLE = table(
    "a sweep/simulate_grid DataFrame over drafters",
    ("drafter", "n_max", "p_min", "n_tokens", "tokens_per_second", "acceptance_rate"),
)
COMPARISON_ROWS = records("a sequence of dicts", ("label", "predicted", "measured"))
SPEED_ROWS = records("a sequence of dicts", ("n_max", "tokens_per_second", "ceiling_tokens_per_second"))
SPEED_POINT = mapping("a dict", ("n_max", "tokens_per_second")).or_none()


def takes(*positional: Kind, **named: Kind) -> Callable[[Callable], Callable]:
    """Declare the kinds of a function's inputs: ``positional`` for its first parameters in order,
    ``named`` by parameter name. The wrapped function checks them (:meth:`Kind.check`) before it runs;
    ``fn.takes`` holds the declaration (parameter name -> :class:`Kind`)."""

    def wrap(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters)
        kinds = dict(zip(params, positional)) | named
        where = {name: params.index(name) for name in kinds}
        first = params[0] if params else None

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            for name, kind in kinds.items():
                i = where[name]
                if i < len(args):
                    value = args[i]
                elif name in kwargs:
                    value = kwargs[name]
                else:
                    continue  # left to its default (or to Python's missing-argument error)
                kind.check(value, fn.__name__, None if name == first else name)
            return fn(*args, **kwargs)

        checked.takes = kinds
        return checked

    return wrap
