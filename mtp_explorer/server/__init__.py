"""llama-server beside the engine: start and stop a real one (:class:`LlamaServer`), talk to it
(:class:`ServerClient`: ``/health``, ``/completion``, ``/metrics``) and watch one anywhere (:class:`ServerMonitor`)."""

from __future__ import annotations

from .client import Completion, ServerClient, SpecMetrics, parse_metrics
from .monitor import Reading, ServerMonitor, WindowRates
from .process import LlamaServer, free_port, server_binary

__all__ = ["Completion", "LlamaServer", "Reading", "ServerClient", "ServerMonitor", "SpecMetrics", "free_port",
           "parse_metrics", "server_binary", "WindowRates"]
