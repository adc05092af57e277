"""mtp-explorer: see and tune multi-token-prediction (MTP) speculative decoding as llama.cpp runs it.

>>> import mtp_explorer as mx
>>> with mx.Session.open() as s:                      # the bundled demo model
...     t = s.generate("def fib(n):", max_tokens=64, n_max=3)
>>> t.summary()["acceptance_rate"]
"""

from __future__ import annotations

from .errors import (
    ContextOverflowError,
    LibraryError,
    ModelLoadError,
    ModelNotFoundError,
    MtpExplorerError,
    MtpUnavailableError,
    ParameterError,
    SessionBusyError,
    SessionClosedError,
)
from .info import ModelInfo, model_info
from .models import default_model_path
from .session import Session
from .trace import DRAFTER_MODES, DRAFTERS, FINISH_REASONS, STOP_REASONS, Step, Trace
from .oracle import CostModel, OracleTrace
from .simulate import SimTrace, compare, cost_consistency, simulate, simulate_grid
from .sweep import Recommendation, recommend, sweep
from .calibration import Calibration, best_p_min, calibrate

__version__ = "0.1.0"

__all__ = [
    "ContextOverflowError", "LibraryError", "ModelInfo", "ModelLoadError", "ModelNotFoundError",
    "MtpExplorerError", "MtpUnavailableError", "ParameterError", "Session", "SessionBusyError",
    "SessionClosedError", "Step", "STOP_REASONS", "FINISH_REASONS", "Trace", "default_model_path",
    "model_info", "DRAFTERS", "DRAFTER_MODES", "CostModel", "OracleTrace", "SimTrace", "compare", "cost_consistency",
    "simulate", "simulate_grid", "Recommendation", "recommend", "sweep", "Calibration", "best_p_min", "calibrate",
]


def __getattr__(name: str):
    """``mtp_explorer.Explorer`` without importing ipywidgets and plotly on ``import mtp_explorer``."""
    if name == "Explorer":
        from .widgets import Explorer

        return Explorer
    raise AttributeError(f"module 'mtp_explorer' has no attribute {name!r}")
