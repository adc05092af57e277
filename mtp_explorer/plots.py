"""Every figure of mtp-explorer, each a function returning a plotly figure.

Per-trace figures (``token_timeline(trace)``, ``acceptance_by_depth(trace)``, ...; :data:`FIGURES`) come from
:mod:`mtp_explorer.viz.trace_figures`; the what-if figures (``reliability_diagram``, ``sweep_heatmap``, ...)
from :mod:`mtp_explorer.viz.whatif_figures`; a watched llama-server's (``server_acceptance(monitor)``) from
:mod:`mtp_explorer.viz.server_figures`; parallel generation's (``slot_timeline(result)``, ``batch_rows(result)``,
``parallel_crossover(frame)``) from :mod:`mtp_explorer.viz.parallel_figures`; the drafters of one target side by
side (``drafters_side_by_side(cmp)``) from :mod:`mtp_explorer.viz.comparison_figures`; a cost model's verify cost by
batch rows (``verify_cost(oracle)``) from :mod:`mtp_explorer.viz.cost_figures`; each step's draft cap under a
schedule (``draft_lengths(trace)``) from :mod:`mtp_explorer.viz.schedule_figures`. ``export(fig, "x.html")``
writes one to a file. The numbers the figures show (``settings_changes``, ``settings_segments``, ``step_seconds``,
``speedup``) come from :mod:`mtp_explorer.core.metrics` and are exported here too. A figure given the wrong kind
of input raises a ``TypeError`` naming what it takes.
"""

from __future__ import annotations

from .viz.comparison_figures import *  # noqa: F401,F403
from .viz.comparison_figures import __all__ as _comparison_all
from .viz.cost_figures import *  # noqa: F401,F403
from .viz.cost_figures import __all__ as _cost_all
from .viz.parallel_figures import *  # noqa: F401,F403
from .viz.parallel_figures import __all__ as _parallel_all
from .viz.schedule_figures import *  # noqa: F401,F403
from .viz.schedule_figures import __all__ as _schedule_all
from .viz.server_figures import *  # noqa: F401,F403
from .viz.server_figures import __all__ as _server_all
from .viz.trace_figures import *  # noqa: F401,F403
from .viz.trace_figures import __all__ as _trace_all
from .viz.whatif_figures import *  # noqa: F401,F403
from .viz.whatif_figures import __all__ as _whatif_all

__all__ = [
    *_trace_all,
    *(n for n in _whatif_all if n not in _trace_all),
    *_server_all,
    *_parallel_all,
    *_comparison_all,
    *_cost_all,
    *_schedule_all,
]
