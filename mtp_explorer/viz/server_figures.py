"""Figures of a watched llama-server (:class:`~mtp_explorer.server.ServerMonitor`): the quantities the package
shows for its own traces, as the server counts them. ``plots.server_acceptance(monitor)``: acceptance by draft
position (as :func:`~mtp_explorer.viz.trace_figures.acceptance_by_depth`), and per request sent through the
monitor its tokens/s and drafted tokens. ``plots.server_rates(monitor)``: the same counters over time, one point per
interval between two polls, with the rates over the last window. ``plots.server_predictions(sweep)``: a server
sweep's measured tokens/s and acceptance against the explorer's prediction of each configuration."""

from __future__ import annotations

import datetime
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..server.grid import SPECULATIVE_KEYS
from ..server.monitor import ServerMonitor
from ..server.sweep import ServerSweep
from ..server.workload import ALL
from .inputs import Kind, instance, takes
from .style import GUIDE, HIGHLIGHT, MUTED, PRIMARY, base_layout, empty

__all__ = ["server_acceptance", "server_rates", "server_predictions"]

MONITOR = instance("a ServerMonitor", ServerMonitor)
PREDICTED_SWEEP = Kind(
    "a ServerSweep with predictions (ServerSweep.with_predictions)",
    lambda v: (
        None
        if isinstance(v, ServerSweep) and "predicted_tokens_per_second" in v.frame
        else "a ServerSweep without predictions"
        if isinstance(v, ServerSweep)
        else type(v).__name__
    ),
)

#: px between a y axis and its tick labels where both axes start at 0: the two 0 labels would touch at the corner
ZERO_CLEARANCE = 8


@takes(MONITOR)
def server_acceptance(monitor: ServerMonitor) -> go.Figure:
    """Left: the server's acceptance by draft position (accepted at that position / verified drafts, cumulative
    since it started); right: tokens/s and drafted tokens of each request sent through the monitor."""
    s = monitor.summary()
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        specs=[[{}, {"secondary_y": True}]],
        subplot_titles=("acceptance by draft position", "requests sent through the monitor"),
    )
    by_pos = s["acceptance_by_position"]
    fig.add_trace(
        go.Bar(
            x=list(range(1, len(by_pos) + 1)),
            y=by_pos,
            marker_color=PRIMARY,
            name="acceptance",
            text=[("" if math.isnan(v) else f"{v:.2f}") for v in by_pos],
            textposition="outside",
            hovertemplate="position %{x}: %{y:.2f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    reqs = monitor.completions
    x = list(range(1, len(reqs) + 1))
    fig.add_trace(
        go.Bar(
            x=x,
            y=[c.predicted_per_second for c in reqs],
            marker_color=PRIMARY,
            name="tokens/s",
            hovertemplate="request %{x}: %{y:.0f} tok/s<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[c.draft_n for c in reqs],
            mode="markers",
            marker_color=MUTED,
            name="drafted tokens",
            hovertemplate="request %{x}: %{y} drafted<extra></extra>",
        ),
        row=1,
        col=2,
        secondary_y=True,
    )
    state = (
        s["state"]
        if s["state"] != "connected"
        else (
            f"mean accepted length {s['mean_accepted_length']:.2f}, {s['tokens_per_second']:.0f} tok/s"
            if not math.isnan(s["mean_accepted_length"])
            else "connected, no drafts yet"
        )
    )
    base_layout(fig, f"llama-server {monitor.url} — {state}", height=340)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="accepted / verified drafts", range=[0, 1.1], row=1, col=1)
    fig.update_xaxes(title_text="request", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="drafted", rangemode="tozero", row=1, col=2, secondary_y=True)
    if s["state"] == "disconnected":
        empty(fig, "disconnected: " + (monitor.readings[-1].error[:80] if monitor.readings else ""))
    elif not by_pos and not reqs:
        empty(fig, "no drafts yet")
    return fig


@takes(MONITOR)
def server_rates(monitor: ServerMonitor, window: float = 60.0) -> go.Figure:
    """The server over time, one point per interval between two polls: generated, drafted and accepted tokens
    per second (all slots together), and the acceptance rate of the drafts verified in the interval (right
    axis, 0 to 1), against the seconds since the first poll; the title gives the rates over the last ``window``
    seconds. llama-server adds a request's tokens to its counters when the request ends, so the rates come in steps
    at the ends of requests."""
    frame = monitor.series()
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    # seconds since the first interval began (readable at any span, from milliseconds to hours), with the clock time
    # in the hover text
    t0 = float(frame["start"].iloc[0]) if len(frame) else 0.0
    ends = frame["start"] + frame["seconds"]
    x = (ends - t0).tolist()
    clock = [datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3] for t in ends]
    for name, color, dash in (
        ("tokens_per_second", PRIMARY, None),
        ("drafted_per_second", MUTED, "dot"),
        ("accepted_per_second", PRIMARY, "dash"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=frame[name],
                mode="lines+markers",
                name=name.replace("_", " "),
                line={"color": color, "dash": dash},
                marker={"size": 4},
                customdata=clock,
                hovertemplate="%{customdata}: %{y:.1f}<extra>" + name.replace("_", " ") + "</extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=frame["acceptance_rate"],
            mode="lines+markers",
            name="acceptance rate",
            line={"color": HIGHLIGHT},
            marker={"size": 6},
            customdata=clock,
            connectgaps=True,
            hovertemplate="%{customdata}: %{y:.2f}<extra>acceptance</extra>",
        ),
        secondary_y=True,
    )
    w = monitor.window(window)
    title = (
        f"llama-server over time — last {window:g} s: {w.tokens_per_second:.0f} tok/s, acceptance "
        f"{w.acceptance_rate:.2f}, {w.requests_processing} slots busy"
        if w is not None and not math.isnan(w.tokens_per_second)
        else "llama-server over time"
    )
    base_layout(fig, title, height=340)
    fig.update_xaxes(title_text="seconds since the first poll", rangemode="tozero")
    fig.update_yaxes(
        title_text="tokens per second", rangemode="tozero", ticklabelstandoff=ZERO_CLEARANCE, secondary_y=False
    )
    fig.update_yaxes(
        title_text="acceptance rate",
        range=[0, 1.05],
        tickmode="linear",
        tick0=0,
        dtick=0.25,
        showgrid=False,
        secondary_y=True,
    )
    if frame.empty:
        empty(
            fig,
            "fewer than two answered polls yet"
            if monitor.state != "disconnected"
            else "disconnected: " + monitor.readings[-1].error[:80],
        )
    return fig


def _plain(row) -> bool:
    return row.get("spec_type") in (None, "none")


def _label(row, keys) -> str:
    """A configuration in full (hover text): its grid values, plain decoding's without the drafting ones."""
    return " ".join(f"{k}={row[k]}" for k in keys if not (_plain(row) and k in SPECULATIVE_KEYS - {"spec_type"}))


#: The short names of the grid keys on the points of :func:`server_predictions` (the hover text has the full ones).
_SHORT = {
    "n_max": "n",
    "n_min": "n_min ",
    "p_min": "p ",
    "n_parallel": "np ",
    "n_gpu_layers": "ngl ",
    "flash_attn": "fa ",
    "type_k": "K ",
}


def _short_label(row, keys) -> str:
    """A configuration in a few characters, for the point's own label: ``draft-mtp n3 np 2``, ``plain np 1``."""
    parts = []
    for k in keys:
        if k == "spec_type":
            parts.append("plain" if _plain(row) else str(row[k]))
        elif not (_plain(row) and k in SPECULATIVE_KEYS):
            parts.append(f"{_SHORT.get(k, k + ' ')}{row[k]}")
    return " ".join(parts)


def _placed_labels(xs, ys, labels: list[str], hi: float) -> tuple[list[str], list[str]]:
    """Point labels that stay inside the plot and apart: points at the same place (to 1% of the axis) share one label,
    their names stacked; a label leans left near the right edge and right near the left one."""
    texts: list[str] = []
    positions: list[str] = []
    seen: dict[tuple, int] = {}
    for x, y, label in zip(xs, ys, labels):
        key = (round(float(x) / hi, 2), round(float(y) / hi, 2)) if hi > 0 else (x, y)
        if key in seen:
            texts[seen[key]] += "<br>" + label
            texts.append("")
        else:
            seen[key] = len(texts)
            texts.append(label)
        share = float(x) / hi if hi > 0 else 0.5
        positions.append("top left" if share > 0.7 else "top right" if share < 0.2 else "top center")
    return texts, positions


@takes(PREDICTED_SWEEP)
def server_predictions(sweep: ServerSweep) -> go.Figure:
    """Each configuration of a sweep (over every request) as a point: measured against predicted tokens/s (left;
    error bars: the server's run-to-run range) and acceptance (right); on the diagonal the prediction is exact.
    Hover names the configuration and the relative error."""
    f = sweep.frame[(sweep.frame["category"] == ALL) & (sweep.frame["status"] == "ok")]
    keys = list(sweep.grid)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("tokens/s: measured against predicted", "acceptance: measured against predicted"),
    )
    records = f.to_dict(orient="records")
    labels = [_label(r, keys) for r in records]
    spread = f["tokens_per_second_spread"] if "tokens_per_second_spread" in f else f["tokens_per_second"] * 0
    values = [v for v in (*f["predicted_tokens_per_second"], *f["tokens_per_second"]) if not math.isnan(v)]
    top = max(values, default=1.0) * 1.1
    text, where = _placed_labels(
        f["predicted_tokens_per_second"].fillna(0),
        f["tokens_per_second"].fillna(0),
        [_short_label(r, keys) for r in records],
        top,
    )
    fig.add_trace(
        go.Scatter(
            x=f["predicted_tokens_per_second"],
            y=f["tokens_per_second"],
            mode="markers+text",
            name="tokens/s",
            marker={"color": PRIMARY, "size": 9},
            text=text,
            textposition=where,
            textfont={"size": 10},
            customdata=list(zip(labels, f["tokens_per_second_error"] * 100)),
            error_y={"type": "data", "array": (spread * f["tokens_per_second"] / 2).fillna(0), "color": MUTED},
            hovertemplate="%{customdata[0]}<br>predicted %{x:.1f}, measured %{y:.1f} tok/s "
            "(error %{customdata[1]:+.1f}%)<extra></extra>",
        ),
        row=1,
        col=1,
    )
    acc = f[f["acceptance"].notna() & f["predicted_acceptance"].notna()]
    acc_text, acc_where = _placed_labels(
        acc["predicted_acceptance"],
        acc["acceptance"],
        [_short_label(r, keys) for r in acc.to_dict(orient="records")],
        1.0,
    )
    fig.add_trace(
        go.Scatter(
            x=acc["predicted_acceptance"],
            y=acc["acceptance"],
            mode="markers+text",
            name="acceptance",
            marker={"color": HIGHLIGHT, "size": 9},
            textposition=acc_where,
            textfont={"size": 10},
            text=acc_text,
            customdata=[_label(r, keys) for r in acc.to_dict(orient="records")],
            hovertemplate="%{customdata}<br>predicted %{x:.3f}, measured %{y:.3f}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    for col, hi in ((1, top), (2, 1.0)):
        fig.add_trace(
            go.Scatter(
                x=[0, hi],
                y=[0, hi],
                mode="lines",
                line={"color": GUIDE, "dash": "dot"},
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=col,
        )
    err = f["tokens_per_second_error"].abs().median() if not f.empty else math.nan
    base_layout(
        fig,
        f"llama-server sweep: predicted against measured — median |tokens/s error| {err * 100:.1f}%"
        if not math.isnan(err)
        else "llama-server sweep: predicted against measured",
        height=360,
    )
    fig.update_xaxes(title_text="predicted tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="measured tokens/s", rangemode="tozero", ticklabelstandoff=ZERO_CLEARANCE, row=1, col=1)
    fig.update_xaxes(title_text="predicted acceptance (accepted / drafted)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(
        title_text="measured acceptance", rangemode="tozero", ticklabelstandoff=ZERO_CLEARANCE, row=1, col=2
    )
    if f.empty:
        empty(fig, "no configuration ran")
    return fig
