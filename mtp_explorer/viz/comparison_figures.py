"""The figure of :func:`~mtp_explorer.compare_drafters`: ``drafters_side_by_side(cmp)`` puts every drafter of one target
side by side (the best look-up only): acceptance by draft position, tokens accepted per step, drafting time per step,
and tokens/s measured beside the simulator's prediction, plain decoding marked."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis.drafter_comparison import DrafterComparison
from .inputs import instance, takes
from .style import MEASURED, PLAIN, base_layout, drafter_color

__all__ = ["drafters_side_by_side"]

COMPARISON = instance("a DrafterComparison (compare_drafters)", DrafterComparison)


@takes(COMPARISON)
def drafters_side_by_side(cmp: DrafterComparison) -> go.Figure:
    """Four panels, one colour per drafter (the look-ups but the best one left out)."""
    best = cmp.best_lookup
    rows = cmp.frame[(~cmp.frame["lookup"]) | (cmp.frame["drafter"] == best)]
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "acceptance by draft position", "tokens accepted per step", "drafting ms per step",
        f"tokens/s: measured (solid) and predicted from {cmp.costs_label} (hollow)"), vertical_spacing=0.18)
    for i, r in enumerate(rows.itertuples()):
        color = drafter_color(r.drafter, i)
        name = r.label + (f" ({r.head})" if r.head else "")
        depth = list(range(1, len(r.acceptance_by_depth) + 1))
        fig.add_trace(go.Scatter(x=depth, y=r.acceptance_by_depth, mode="lines+markers", name=name, legendgroup=name,
                                 line={"color": color}), row=1, col=1)
        for col, row_, value, fmt in ((2, 1, r.accepted_per_step, ".2f"), (1, 2, r.draft_ms_per_step, ".3f")):
            fig.add_trace(go.Bar(x=[name], y=[value], marker_color=color, legendgroup=name, showlegend=False,
                                 hovertemplate=f"%{{x}}: %{{y:{fmt}}}<extra></extra>"), row=row_, col=col)
        fig.add_trace(go.Bar(x=[name], y=[r.tokens_per_second], marker_color=color, legendgroup=name,
                             showlegend=False, hovertemplate="%{x}: %{y:.0f} tokens/s measured<extra></extra>"),
                      row=2, col=2)
        fig.add_trace(go.Scatter(x=[name], y=[r.predicted_tokens_per_second], mode="markers", legendgroup=name,
                                 showlegend=False, marker={"symbol": "circle-open", "size": 12, "color": MEASURED},
                                 hovertemplate="%{x}: %{y:.0f} tokens/s predicted<extra></extra>"), row=2, col=2)
    if len(rows):
        plain = float(rows["tokens_per_second"].iloc[0] / rows["speedup"].iloc[0])
        fig.add_hline(y=plain, line={"color": PLAIN, "dash": "dash"}, annotation_text="plain decoding",
                      row=2, col=2)
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=1)
    return base_layout(fig, f"Drafters for one target at n_max={cmp.n_max}", 640)
