"""The figure of draft-length schedules: ``draft_lengths(traces)`` draws each step's draft cap along the generation
(a trace's ``n_max`` column: the schedule's length, or the fixed ``n_max``) beside the tokens the step accepted, for
one run or several side by side (a fixed setting, each schedule, the hindsight bound's replay)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..core.trace import Trace
from .inputs import one_or_labelled, takes
from .style import PALETTE, base_layout, empty

__all__ = ["draft_lengths"]


RUNS = one_or_labelled("a Trace (runs or mx.simulate replays)", Trace)


def _label(trace: Trace) -> str:
    schedule = trace.settings.get("schedule", "fixed")
    n_max = trace.settings.get("n_max")
    return f"{schedule} (n_max {n_max})" if schedule != "fixed" else f"fixed n_max {n_max}"


@takes(RUNS)
def draft_lengths(runs: Any) -> go.Figure:
    """Lines: each step's draft cap against the tokens generated before it (a schedule's length, or the fixed
    ``n_max``); markers: the drafts the step accepted (hover: drafted and accepted). ``runs``: a trace (a generation
    or a :func:`~mtp_explorer.simulate` replay), or a dict of labels to traces; the legend gives each run's tokens/s."""
    runs = dict(runs) if isinstance(runs, Mapping) else {_label(runs): runs}
    fig = go.Figure()
    top = 1
    for i, (label, trace) in enumerate(runs.items()):
        c = trace.columns
        color = PALETTE[i % len(PALETTE)]
        at = np.cumsum(np.concatenate([[0], c["n_accepted"][:-1] + 1])) if trace.n_steps else np.zeros(0)
        tps = trace.summary()["tokens_per_second"]
        name = f"{label}: {tps:.0f} tok/s" if np.isfinite(tps) else label
        fig.add_trace(
            go.Scatter(
                x=at,
                y=c["n_max"],
                mode="lines",
                line={"shape": "hv", "color": color, "width": 2},
                name=name,
                legendgroup=label,
                hovertemplate=f"{label}<br>token %{{x}}: cap %{{y}}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=at,
                y=c["n_accepted"],
                mode="markers",
                marker={"color": color, "size": 5, "opacity": 0.6},
                name=f"{label}: accepted",
                legendgroup=label,
                showlegend=False,
                customdata=np.column_stack([c["n_drafted"], c["n_accepted"]]) if trace.n_steps else None,
                hovertemplate=f"{label}<br>token %{{x}}: drafted %{{customdata[0]}}, accepted %{{customdata[1]}}"
                "<extra></extra>",
            )
        )
        top = max(top, int(c["n_max"].max()) if trace.n_steps else 0)
    base_layout(fig, "Draft cap per step (lines) and drafts accepted (dots)", 380)
    fig.update_xaxes(title="tokens generated before the step", rangemode="tozero")
    fig.update_yaxes(title="tokens", dtick=1, range=[-0.3, top + 0.5])
    if not any(t.n_steps for t in runs.values()):
        empty(fig, "no steps")
    return fig
