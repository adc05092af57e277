"""mtp-explorer: see and tune multi-token-prediction (MTP) speculative decoding as llama.cpp runs it.

>>> import mtp_explorer as mx
>>> with mx.Session.open() as s:                      # the bundled demo model
...     t = s.generate(mx.demo_prompt(), max_tokens=64, n_max=3)   # a held-out snippet of real code
>>> t.summary()["acceptance_rate"]
"""

from __future__ import annotations

# llama-cpp-python loads libllama before the extension does: the process then holds one libllama (the wheel's
# libllama.so and libllama.so.0 are two files), and the extension's log callback, set when it loads, is the one
# libllama calls (ModelLoadError carries llama.cpp's last lines; sessions set it again as they open).
import llama_cpp  # noqa: F401

from .analysis.batch import BatchCostModel, measure_crossover, predict_parallel, profile_batch_costs, recommend_parallel
from .analysis.batch_shift import BatchShift
from .analysis.calibration import Calibration, best_p_min, calibrate
from .analysis.compare import compare
from .analysis.consistency import cost_consistency
from .analysis.drafter_comparison import DrafterComparison, compare_drafters
from .analysis.grid import simulate_grid
from .analysis.hindsight import Hindsight, ScheduleAdvice, hindsight_best, schedule_advice
from .analysis.oracle import CostModel, OracleTrace
from .analysis.parallel_check import check_parallel
from .analysis.profile import CostProfile, profile_costs
from .analysis.replay import ReplayApproximate
from .analysis.simulate import SimTrace, simulate
from .analysis.sweep import Recommendation, recommend, sweep
from .core.cpu_kernels import ExtraBufferCheck, check_extra_buffers
from .core.drafters import DRAFTER_MODES, DRAFTER_SPECS, DrafterMode, DrafterSpec
from .core.errors import (
    CancelledError,
    ContextOverflowError,
    CpuKernelWarning,
    DecodeError,
    EngineError,
    FormatError,
    InputTypeError,
    LibraryError,
    ModelFileChangedError,
    ModelLoadError,
    ModelNotFoundError,
    MtpExplorerError,
    MtpUnavailableError,
    ParameterError,
    RollbackError,
    ServerError,
    ServerOverheadMissing,
    ServerProtocolError,
    ServerUnavailableError,
    SessionBusyError,
    SessionClosedError,
    ToolError,
)
from .core.info import ModelInfo, model_info
from .core.parallel import ParallelStep, ParallelTrace, RequestInfo
from .core.schema import DRAFTERS, FINISH_REASONS, STOP_REASONS
from .core.session import Session
from .core.settings import DraftSettings, Limits, NeverDrafts, PminNotApplicable
from .core.trace import Step, Trace
from .core.version import __version__ as __version__
from .models import (
    DemoPrompt,
    DraftHead,
    default_model_path,
    demo_prompt,
    demo_prompt_within,
    demo_prompts,
    draft_heads,
    draft_model_path,
)
from .server import LlamaServer, ServerMonitor, ServerSweep, Workload, WorkloadRequest, server_sweep

__all__ = [
    # errors
    "MtpExplorerError",
    "CancelledError",
    "ContextOverflowError",
    "DecodeError",
    "EngineError",
    "FormatError",
    "InputTypeError",
    "LibraryError",
    "ToolError",
    "ModelLoadError",
    "ModelFileChangedError",
    "ModelNotFoundError",
    "MtpUnavailableError",
    "ParameterError",
    "RollbackError",
    "SessionBusyError",
    "SessionClosedError",
    "ServerError",
    "ServerProtocolError",
    "ServerUnavailableError",
    "CpuKernelWarning",
    "ServerOverheadMissing",
    # core
    "check_extra_buffers",
    "ExtraBufferCheck",
    "Session",
    "Step",
    "Trace",
    "ParallelTrace",
    "ParallelStep",
    "RequestInfo",
    "ModelInfo",
    "model_info",
    "default_model_path",
    "draft_model_path",
    "draft_heads",
    "DraftHead",
    "demo_prompt",
    "demo_prompts",
    "demo_prompt_within",
    "DemoPrompt",
    "STOP_REASONS",
    "FINISH_REASONS",
    "DRAFTERS",
    "DRAFTER_MODES",
    "DRAFTER_SPECS",
    "DrafterMode",
    "DrafterSpec",
    "DraftSettings",
    "Limits",
    "NeverDrafts",
    "PminNotApplicable",
    # analysis
    "BatchShift",
    "CostModel",
    "CostProfile",
    "profile_costs",
    "OracleTrace",
    "SimTrace",
    "compare",
    "cost_consistency",
    "simulate",
    "simulate_grid",
    "hindsight_best",
    "Hindsight",
    "schedule_advice",
    "ScheduleAdvice",
    "ReplayApproximate",
    "Recommendation",
    "recommend",
    "sweep",
    "Calibration",
    "best_p_min",
    "calibrate",
    "BatchCostModel",
    "profile_batch_costs",
    "predict_parallel",
    "recommend_parallel",
    "measure_crossover",
    "check_parallel",
    "compare_drafters",
    "DrafterComparison",
    # llama-server
    "LlamaServer",
    "ServerMonitor",
    "ServerSweep",
    "Workload",
    "WorkloadRequest",
    "server_sweep",
    # lazily imported
    "plots",
    "widgets",
    "Explorer",
]


_LAZY_MODULES = ("plots", "widgets")


def __getattr__(name: str):
    """``mx.plots``, ``mx.widgets`` and ``mx.Explorer``, imported on first use (``import mtp_explorer``
    loads neither plotly nor ipywidgets)."""
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name == "Explorer":
        return importlib.import_module(".widgets", __name__).Explorer
    raise AttributeError(f"module 'mtp_explorer' has no attribute {name!r}")
