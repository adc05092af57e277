"""Checks of user input shared by the session and the analysis layer: each raises a
:class:`~mtp_explorer.core.errors.ParameterError` (or a subclass) naming the problem and the allowed values.
The drafting settings' rules live in :mod:`mtp_explorer.core.settings` alone."""

from __future__ import annotations

import numpy as np

from .errors import ParameterError


def check_int(name: str, value, lo: int, hi: int | None) -> int:
    """``value`` as an ``int`` if it is an integer (a numpy one too) within ``[lo, hi]`` (``hi=None``: no upper
    bound)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ParameterError(f"{name} must be {bound}, got {value}")
    return value


def check_bool(name: str, value, meaning: str = "") -> bool:
    """``value`` if it is a ``bool``; ``meaning`` (e.g. llama.cpp's flags) goes in the error."""
    if not isinstance(value, bool):
        raise ParameterError(f"{name} must be True or False{f' ({meaning})' if meaning else ''}, got {value!r}")
    return value
