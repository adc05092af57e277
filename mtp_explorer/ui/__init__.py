"""The widget layer: the JupyterLab Explorer and its parts.

- :mod:`.explorer`: :class:`Explorer`, which wires the parts below to the views;
- :mod:`.controls`: :class:`Controls` (read as a :class:`RunRequest`), :class:`ProgressView`, :class:`ErrorArea`;
- :mod:`.runner`: :class:`GenerationRunner`, generations in a background thread and the baseline cache;
- :mod:`.live`: :class:`LiveTrace`, the trace of a streaming generation, built from the column schema;
- :mod:`.views`: the view registry (:data:`VIEWS`, :func:`register_view`) and :class:`LiveViews`;
- :mod:`.whatif`: :class:`WhatIfController`, oracles and predictions;
- :mod:`.whatif_panel`: :class:`WhatIfPanel`, the typed numbers :class:`WhatIf` and their computations;
- :mod:`.server_view`: :class:`ServerView`, a watched llama-server (the Explorer's "llama-server" tab);
- :mod:`.slots_view`: :class:`SlotsView`, requests on a session's ``n_parallel`` sequences (the "slots" tab);
- :mod:`.figure_sync`: :func:`sync_figure`, a figure into a ``FigureWidget`` in one update.
"""

from __future__ import annotations

from .controls import Controls, ErrorArea, ProgressView, RunRequest, readable_error
from .explorer import Explorer
from .figure_sync import sync_figure
from .live import LIVE_COLUMNS, LiveTrace
from .runner import MIN_REDRAW_INTERVAL, STATES, GenerationRunner
from .server_view import ServerView
from .slots_view import LiveParallel, SlotsView
from .views import VIEWS, LiveViews, View, register_view, unregister_view
from .whatif import WhatIfController
from .whatif_panel import WHATIF_NAMES, MeasuredRun, WhatIf, WhatIfPanel, whatif_table

__all__ = [
    "Explorer",
    "Controls",
    "ProgressView",
    "ErrorArea",
    "RunRequest",
    "readable_error",
    "GenerationRunner",
    "STATES",
    "MIN_REDRAW_INTERVAL",
    "LiveTrace",
    "LIVE_COLUMNS",
    "View",
    "VIEWS",
    "register_view",
    "unregister_view",
    "LiveViews",
    "WhatIfController",
    "WhatIfPanel",
    "WhatIf",
    "MeasuredRun",
    "WHATIF_NAMES",
    "whatif_table",
    "sync_figure",
    "ServerView",
    "SlotsView",
    "LiveParallel",
]
