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
    """Four panels, one colour per drafter (the look-ups but the best one left out), each drafter named by its
    llama.cpp ``--spec-type`` value (its draft model or head file in the hover text); a legend under the figure names
    the colours and the hollow markers of the predicted tokens/s."""
    best = cmp.best_lookup
    rows = cmp.frame[(~cmp.frame["lookup"]) | (cmp.frame["drafter"] == best)]
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "acceptance by draft position",
            "tokens accepted per step",
            "drafting time per step",
            "tokens/s: measured (bars), predicted (hollow)",
        ),
        vertical_spacing=0.26,
        horizontal_spacing=0.12,
    )
    for i, r in enumerate(rows.itertuples()):
        color = drafter_color(r.drafter, i)
        name = r.drafter  # llama.cpp's --spec-type value: the bars' labels and the legend
        full = f"{name}: {r.label}" + (f" ({r.head})" if r.head else "")  # in the hover text
        depth = list(range(1, len(r.acceptance_by_depth) + 1))
        fig.add_trace(
            go.Scatter(
                x=depth,
                y=r.acceptance_by_depth,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line={"color": color},
                customdata=[full] * len(depth),
                hovertemplate="%{customdata}<br>position %{x}: %{y:.2f}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        for col, row_, value, fmt, unit in (
            (2, 1, r.accepted_per_step, ".2f", "tokens per step"),
            (1, 2, r.draft_ms_per_step, ".3f", "ms per step"),
        ):
            fig.add_trace(
                go.Bar(
                    x=[name],
                    y=[value],
                    marker_color=color,
                    legendgroup=name,
                    showlegend=False,
                    customdata=[full],
                    hovertemplate=f"%{{customdata}}: %{{y:{fmt}}} {unit}<extra></extra>",
                ),
                row=row_,
                col=col,
            )
        fig.add_trace(
            go.Bar(
                x=[name],
                y=[r.tokens_per_second],
                marker_color=color,
                legendgroup=name,
                showlegend=False,
                customdata=[full],
                hovertemplate="%{customdata}: %{y:.0f} tokens/s measured<extra></extra>",
            ),
            row=2,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                x=[name],
                y=[r.predicted_tokens_per_second],
                mode="markers",
                legendgroup="predicted",
                name=f"predicted from {cmp.costs_label}",
                showlegend=i == 0,
                customdata=[full],
                marker={"symbol": "circle-open", "size": 12, "color": MEASURED, "line": {"width": 2}},
                hovertemplate="%{customdata}: %{y:.0f} tokens/s predicted<extra></extra>",
            ),
            row=2,
            col=2,
        )
    if len(rows):
        plain = float(rows["tokens_per_second"].iloc[0] / rows["speedup"].iloc[0])
        fig.add_hline(
            y=plain,
            line={"color": PLAIN, "dash": "dash"},
            annotation_text="plain decoding",
            annotation_yshift=3,
            annotation_bgcolor="rgba(255,255,255,0.85)",
            row=2,
            col=2,
        )
    fig.update_yaxes(range=[0, 1.05], title_text="accepted / drafted", row=1, col=1)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="tokens per step", row=1, col=2)
    fig.update_yaxes(title_text="ms per step", row=2, col=1)
    fig.update_yaxes(title_text="tokens / s", row=2, col=2)
    for row_, col in ((1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(tickangle=-30, row=row_, col=col)
    base_layout(fig, f"Drafters for one target at n_max={cmp.n_max}", 700)
    return fig.update_layout(margin={"b": 110}, legend={"y": -0.16})
