"""Work a :class:`~mtp_explorer.Session` method hands to a layer above core, which provides it as it is imported:
``Session.record_oracle`` is :func:`mtp_explorer.analysis.oracle.record_oracle`, ``Session.batch_shift`` is
:func:`mtp_explorer.analysis.batch_shift.measure`. Core names the work; it imports nothing above it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import MtpExplorerError

#: The work core hands over, and the module that provides each.
PROVIDERS = {
    "record_oracle": "mtp_explorer.analysis.oracle",
    "batch_shift": "mtp_explorer.analysis.batch_shift",
}
_PROVIDED: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` as the work ``name`` (one of :data:`PROVIDERS`), by its provider as it is imported."""
    if name not in PROVIDERS:
        raise ValueError(f"core hands over no work called {name!r} (known: {sorted(PROVIDERS)})")
    _PROVIDED[name] = fn


def provided() -> set[str]:
    """The names of the work provided so far."""
    return set(_PROVIDED)


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Run the work ``name`` with the arguments; an :class:`MtpExplorerError` if its provider was never imported
    (only ``mtp_explorer.core`` was: ``import mtp_explorer`` imports every provider)."""
    fn = _PROVIDED.get(name)
    if fn is None:
        raise MtpExplorerError(f"{name} is provided by {PROVIDERS[name]}, which is not imported: import mtp_explorer")
    return fn(*args, **kwargs)
