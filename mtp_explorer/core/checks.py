"""Checks of user input shared by the session and the analysis layer: each raises a
:class:`~mtp_explorer.core.errors.ParameterError` (or a subclass) naming the problem and the allowed values."""

from __future__ import annotations

import math

from .errors import MtpUnavailableError, ParameterError


def check_int(name: str, value, lo: int, hi: int | None) -> int:
    """``value`` if it is an integer within ``[lo, hi]`` (``hi=None``: no upper bound)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ParameterError(f"{name} must be {bound}, got {value}")
    return value


def check_probability(name: str, value) -> float:
    """``value`` as a float if it is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ParameterError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


class PminNotApplicable(UserWarning):
    """``p_min`` > 0 was given to a drafter (or chain) without a confidence: it does not apply (not an error, so a
    grid over drafters keeps working)."""


def check_draft_params(n_max, p_min, n_min, *, capacity: int, capacity_reason: str) -> None:
    """``n_max`` within the capacity, ``p_min`` a probability, ``0 <= n_min <= n_max``."""
    if not isinstance(n_max, int) or isinstance(n_max, bool) or n_max < 0:
        raise ParameterError(f"n_max must be a non-negative integer, got {n_max!r}")
    if n_max > capacity:
        raise ParameterError(f"n_max={n_max} exceeds this session's capacity of {capacity} ({capacity_reason}); "
                             f"open the session with n_rs_seq={n_max} or more")
    check_probability("p_min", p_min)
    if not isinstance(n_min, int) or isinstance(n_min, bool) or n_min < 0:
        raise ParameterError(f"n_min must be a non-negative integer, got {n_min!r}")
    if n_min > n_max:
        raise ParameterError(f"n_min={n_min} is larger than n_max={n_max}")


def check_drafters_available(n_max: int, mode, has_mtp: bool, has_draft_model: bool, model: str,
                             usable: tuple[str, ...]) -> None:
    """A drafting ``mode`` that needs an MTP head on a model without one is an :class:`MtpUnavailableError`; one
    that needs a draft model in a session opened without one, a :class:`ParameterError`."""
    if n_max > 0 and not has_mtp and mode.needs_mtp:
        raise MtpUnavailableError(
            f"{model} has no MTP layers, so it cannot draft with drafter={mode.name!r}; use n_max=0 for plain "
            f"decoding or drafter={', '.join(repr(m) for m in usable)}")
    if n_max > 0 and not has_draft_model and mode.needs_draft_model:
        raise ParameterError(
            f"drafter={mode.name!r} drafts with a draft model, and this session was opened without one: "
            f"Session.open(path, draft_model='small.gguf') (llama.cpp's -md), or use n_max=0 or "
            f"drafter={', '.join(repr(m) for m in usable)}")


def check_sampling(temperature, seed) -> tuple[float, int]:
    """``temperature`` a finite number >= 0 and ``seed`` a 32-bit unsigned integer."""
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature)
            or temperature < 0):
        raise ParameterError(f"temperature must be a finite number >= 0, got {temperature!r}")
    return float(temperature), check_int("seed", seed, 0, 2**32 - 1)
