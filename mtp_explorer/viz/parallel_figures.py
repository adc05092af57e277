"""Figures of parallel generation (``n_parallel`` sequences, llama-server's slots): ``slot_timeline(result)`` (each
slot's requests and the tokens each step emitted for them, side by side), ``batch_rows(result)`` (the target batch's
rows and the active sequences per step) and ``parallel_crossover(frame)`` (aggregate tokens/s against the batch
size for plain and speculative decoding, the batch size where speculation stops paying marked)."""

from __future__ import annotations

import math

import plotly.colors
import plotly.graph_objects as go

from ..core.parallel import ParallelTrace
from .inputs import instance, table, takes
from .style import MEASURED, MUTED, PLAIN, PRIMARY, base_layout, empty

__all__ = ["slot_timeline", "batch_rows", "parallel_crossover"]

REQUEST_COLORS: tuple[str, ...] = tuple(plotly.colors.qualitative.Plotly)  #: one colour per request, in turn
PARALLEL = instance("a ParallelTrace (Session.generate_parallel)", ParallelTrace)
CROSSOVER_TABLE = table(
    "a recommend_parallel or measure_crossover DataFrame", ("n_parallel", "goodput", "plain_tokens_per_second")
)


@takes(PARALLEL)
def slot_timeline(result: ParallelTrace) -> go.Figure:
    """One row per slot (sequence); at each engine step a mark for the request the slot ran, its size the tokens
    the step emitted for it (accepted drafts plus the target's token); a request's arrival, when it had to wait
    for a free slot, is a hollow mark."""
    fig = go.Figure()
    for info, trace in zip(result.requests, result.traces):
        c = trace.columns
        color = REQUEST_COLORS[info.index % len(REQUEST_COLORS)]
        tokens = c["n_accepted"] + 1
        fig.add_trace(
            go.Scatter(
                x=c["batch_step"],
                y=[info.slot] * trace.n_steps,
                mode="markers",
                name=f"request {info.index}",
                marker={"size": 4 + 3 * tokens, "color": color, "line": {"width": 0}},
                customdata=list(zip(tokens.tolist(), c["n_drafted"].tolist(), c["pos"].tolist())),
                hovertemplate=(
                    f"request {info.index}, step %{{x}}: %{{customdata[0]}} tokens "
                    "(%{customdata[1]} drafted), position %{customdata[2]}<extra></extra>"
                ),
            )
        )
        if info.admitted_step > info.arrival:
            fig.add_trace(
                go.Scatter(
                    x=[info.arrival, info.admitted_step],
                    y=[info.slot - 0.25] * 2,
                    mode="lines+markers",
                    line={"color": color, "dash": "dot", "width": 1},
                    showlegend=False,
                    marker={"symbol": "circle-open", "size": 8, "color": color},
                    hovertemplate=f"request {info.index} waited from step {info.arrival} to {info.admitted_step}"
                    "<extra></extra>",
                )
            )
    n_slots = result.settings["n_parallel"]
    base_layout(fig, f"slots: {len(result.traces)} requests on n_parallel={n_slots}", height=140 + 40 * n_slots)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="slot", dtick=1, range=[-0.6, n_slots - 0.4], autorange="reversed")
    if not any(t.n_steps for t in result.traces):
        empty(fig, "no steps")
    return fig


@takes(PARALLEL)
def batch_rows(result: ParallelTrace) -> go.Figure:
    """Per engine step: the rows of the target batch (every active sequence's draft plus one) and the active
    sequences."""
    steps = result.batch_steps()
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=steps["batch_step"],
            y=steps["verify_rows"],
            name="verify rows",
            marker_color=PRIMARY,
            hovertemplate="step %{x}: %{y} rows<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=steps["batch_step"],
            y=steps["n_active"],
            name="active sequences",
            mode="lines",
            line={"color": MUTED, "shape": "hv"},
            hovertemplate="step %{x}: %{y} active<extra></extra>",
        )
    )
    mean = float(steps["verify_rows"].mean()) if len(steps) else float("nan")
    base_layout(fig, "target batch per step" + ("" if math.isnan(mean) else f" (mean {mean:.1f} rows)"), height=300)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="rows / sequences", rangemode="tozero")
    if not len(steps):
        empty(fig, "no steps")
    return fig


@takes(CROSSOVER_TABLE)
def parallel_crossover(frame, measured=None) -> go.Figure:
    """Aggregate tokens/s against the batch size: speculative decoding at its best setting (``goodput``) and plain
    decoding, from :func:`~mtp_explorer.recommend_parallel` (``measured``: optional rows with the same columns from
    real runs, drawn as points); the first batch size where speculation is slower than plain decoding is marked."""
    fig = go.Figure()
    n = list(frame["n_parallel"])
    labels = (
        [f"n_max={k}, p_min={p:g}" for k, p in zip(frame["n_max"], frame["p_min"])]
        if {"n_max", "p_min"} <= set(frame.columns)
        else [""] * len(n)
    )
    fig.add_trace(
        go.Scatter(
            x=n,
            y=frame["goodput"],
            mode="lines+markers",
            name="speculative (best setting)",
            line={"color": PRIMARY},
            text=labels,
            hovertemplate="N=%{x}: %{y:.0f} tok/s %{text}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=n,
            y=frame["plain_tokens_per_second"],
            mode="lines+markers",
            name="plain",
            line={"color": PLAIN, "dash": "dash"},
            hovertemplate="N=%{x}: %{y:.0f} tok/s plain<extra></extra>",
        )
    )
    if measured is not None and len(measured):
        fig.add_trace(
            go.Scatter(
                x=list(measured["n_parallel"]),
                y=list(measured["goodput"]),
                mode="markers",
                name="speculative, measured",
                marker={"color": MEASURED, "symbol": "x", "size": 9},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=list(measured["n_parallel"]),
                y=list(measured["plain_tokens_per_second"]),
                mode="markers",
                name="plain, measured",
                marker={"color": MEASURED, "symbol": "circle-open", "size": 9},
            )
        )
    below = [k for k, g, p in zip(n, frame["goodput"], frame["plain_tokens_per_second"]) if g < p]
    title = "aggregate tokens/s against the batch size"
    if below:
        fig.add_vline(
            x=below[0],
            line={"color": PLAIN, "width": 1, "dash": "dot"},
            annotation_text=f"speculation stops paying: N={below[0]}",
            annotation_position="top left",
        )
    else:
        title += " (speculation pays at every N shown)"
    base_layout(fig, title, height=340)
    fig.update_xaxes(title_text="n_parallel (requests at once)", type="log", tickvals=n, ticktext=[str(k) for k in n])
    fig.update_yaxes(title_text="tokens/s (all requests)", rangemode="tozero")
    return fig
