"""llama-server beside the engine: start and stop a real one (:class:`LlamaServer`), talk to it
(:class:`ServerClient`: ``/health``, ``/completion``, ``/metrics``), watch one anywhere (:class:`ServerMonitor`) and
measure a grid of its settings on a workload (:func:`server_sweep`)."""

from __future__ import annotations

from .client import Completion, ServerClient, SpecMetrics, parse_metrics
from .grid import GRID_FLAGS
from .monitor import Reading, ServerMonitor, WindowRates
from .overhead import fit_server_overhead, profile_server_overhead
from .predict import PREDICTED_COLUMNS, server_counters
from .process import LlamaServer, free_port, server_binary
from .sweep import ServerSweep, server_sweep
from .workload import Workload, WorkloadRequest

__all__ = [
    "Completion",
    "LlamaServer",
    "Reading",
    "ServerClient",
    "ServerMonitor",
    "SpecMetrics",
    "free_port",
    "parse_metrics",
    "server_binary",
    "WindowRates",
    "GRID_FLAGS",
    "ServerSweep",
    "Workload",
    "WorkloadRequest",
    "server_sweep",
    "PREDICTED_COLUMNS",
    "server_counters",
    "profile_server_overhead",
    "fit_server_overhead",
]
