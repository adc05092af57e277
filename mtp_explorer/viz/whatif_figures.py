"""Figures of the what-if analysis: reliability diagram per depth, sweep heatmaps, speedup ceiling,
predicted vs measured, drafters compared, and the Explorer's predicted acceptance and speed. Each function
returns a ``plotly.graph_objects.Figure``; each checks its input first (:mod:`mtp_explorer.viz.inputs`) and
raises a ``TypeError`` naming what it takes. The look comes from :mod:`mtp_explorer.viz.style`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ..analysis.calibration import Calibration, calibrate
from ..analysis.oracle import OracleTrace
from ..core.drafters import mode_name
from .inputs import (
    CALIBRATION_SOURCE,
    CEILING_TABLE,
    COMPARISON_ROWS,
    DRAFTER_TABLE,
    OPTIONAL_TRACE,
    SIM_TRACE,
    SPEED_POINT,
    SPEED_ROWS,
    SWEEP_TABLE,
    takes,
)
from .style import (
    CEILING,
    GUIDE,
    HIGHLIGHT,
    MEASURED,
    PALETTE,
    PLAIN,
    PRIMARY,
    base_layout,
    drafter_color,
    drafter_label,
    drafter_order,
    empty,
    marker_outline,
)

__all__ = [
    "reliability_diagram",
    "sweep_heatmap",
    "speedup_ceiling",
    "predicted_vs_measured",
    "drafter_comparison",
    "predicted_acceptance_by_depth",
    "predicted_speed_by_n_max",
]


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    # the legend under the plot: beside it, it took a half-width figure's room and was cut
    return base_layout(fig, title, height + 40, legend="below")


def _plain_line(fig: go.Figure, plain: float) -> None:
    """The plain-decoding reference line, when known."""
    if math.isfinite(plain):
        # the label above the line, on a white ground: the dotted line ran through it
        fig.add_hline(
            y=plain,
            line=dict(color=PLAIN, dash="dot"),
            annotation_text=f"plain {plain:.0f} tok/s",
            annotation_position="top right",
            annotation_yshift=3,
            annotation_bgcolor="rgba(255,255,255,0.85)",
        )


@takes(CALIBRATION_SOURCE)
def reliability_diagram(
    source: Calibration | OracleTrace | Sequence, *, n_bins: int = 10, depths: Sequence[int] | None = None
) -> go.Figure:
    """Draft confidence (x) against conditional acceptance (y), one line per depth, marker area by
    the number of draft tokens in the bin; the diagonal is perfect calibration. The legend gives
    each depth's expected calibration error, the title the best ``p_min`` the simulator found.
    ``source``: a :class:`Calibration`, or what :func:`mtp_explorer.calibrate` takes."""
    cal = source if isinstance(source, Calibration) else calibrate(source, n_bins=n_bins)
    t = cal.table
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[0, 1], y=[0, 1], mode="lines", name="calibrated", line=dict(color=GUIDE, dash="dash"), hoverinfo="skip"
        )
    )
    if t.empty:
        empty(fig, "no draft tokens")
    total = float(t["count"].max()) if not t.empty else 1.0
    for d, grp in t.groupby("depth"):
        if depths is not None and int(d) not in depths:
            continue
        color = PALETTE[(int(d) - 1) % len(PALETTE)]
        fig.add_trace(
            go.Scatter(
                x=grp["confidence"],
                y=grp["acceptance"],
                mode="lines+markers",
                name=f"depth {int(d)} (ECE {cal.ece_by_depth[int(d)]:.3f})",
                marker=dict(size=6 + 18 * np.sqrt(grp["count"] / total), color=color),
                line=dict(color=color),
                customdata=np.stack([grp["count"], grp["lo"], grp["hi"]], axis=1),
                hovertemplate=(
                    "depth " + str(int(d)) + "<br>confidence %{x:.3f}<br>acceptance %{y:.3f}"
                    "<br>bin [%{customdata[1]:.1f}, %{customdata[2]:.1f})<br>%{customdata[0]} tokens"
                    "<extra></extra>"
                ),
            )
        )
    title = f"Draft confidence vs acceptance (ECE {cal.ece:.3f})"
    if cal.best_setting:
        b = cal.best_setting
        title += f" · simulator's best: n_max={b['n_max']}, p_min={b['p_min']:.2f}"
    fig.update_xaxes(title="draft confidence (top-10 renormalised)", range=[0, 1.02])
    fig.update_yaxes(title="accepted, given the tokens before it were", range=[0, 1.02])
    return _layout(fig, title)


def _aggregate(df, value: str):
    d = df.copy()
    d["_sec"] = d["n_tokens"] / d["tokens_per_second"]
    keys = ["n_max", "p_min"]
    if value == "tokens_per_second":
        agg = d.groupby(keys, as_index=False).agg(n_tokens=("n_tokens", "sum"), seconds=("_sec", "sum"))
        agg[value] = agg["n_tokens"] / agg["seconds"]
    else:
        agg = d.groupby(keys, as_index=False)[value].mean()
    return agg


@takes(SWEEP_TABLE)
def sweep_heatmap(df, value: str = "tokens_per_second", *, drafter: str | None = None) -> go.Figure:
    """A sweep (see :func:`mtp_explorer.analysis.sweep`) as an ``n_max`` × ``p_min`` heatmap of ``value``
    over its prompts (tokens/s: total tokens / total seconds; other columns: mean); the best cell
    is marked."""
    if drafter is not None:  # a short spelling ("mtp") picks the rows of its llama.cpp name
        df = df[df["drafter"] == (drafter if drafter in set(df["drafter"]) else mode_name(drafter))]
    agg = _aggregate(df, value)
    n_max = sorted(agg["n_max"].unique())
    p_min = sorted(agg["p_min"].unique())
    z = np.full((len(n_max), len(p_min)), np.nan)
    for r in agg.itertuples(index=False):
        z[n_max.index(r.n_max), p_min.index(r.p_min)] = getattr(r, value)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"{p:.2f}" for p in p_min],
            y=[str(n) for n in n_max],
            colorscale="Viridis",
            colorbar=dict(title=value.replace("_", " ")),
            hovertemplate="n_max %{y}<br>p_min %{x}<br>" + value + " %{z:.4g}<extra></extra>",
        )
    )
    if np.isfinite(z).any():
        i, j = np.unravel_index(np.nanargmax(z), z.shape)
        fig.add_trace(
            go.Scatter(
                x=[f"{p_min[j]:.2f}"],
                y=[str(n_max[i])],
                mode="markers+text",
                text=["best"],
                textposition="top center",
                marker=marker_outline("star", 16, "white"),
                showlegend=False,
                hoverinfo="skip",
            )
        )
    # a simulate_grid table has no mode column: it is simulated
    mode = ", ".join(sorted(df["mode"].unique())) if "mode" in df and len(df) else "simulate"
    fig.update_xaxes(title="p_min", type="category")
    fig.update_yaxes(title="n_max", type="category")
    n = df["prompt"].nunique()
    return _layout(fig, f"{value.replace('_', ' ')} by setting ({mode}, {n} prompt{'' if n == 1 else 's'})")


@takes(CEILING_TABLE)
def speedup_ceiling(df, *, p_min: float | None = None) -> go.Figure:
    """For each ``n_max``: the tokens/s reached (at ``p_min``, default the best per ``n_max``) beside
    the ceiling with every draft accepted, from the measured cost model, and plain decoding."""
    d = df.copy()
    d["_sec"] = d["n_tokens"] / d["tokens_per_second"]
    d["_csec"] = d["n_tokens"] / d["ceiling_tokens_per_second"]
    d["_psec"] = d["n_tokens"] / d["plain_tokens_per_second"]
    agg = d.groupby(["n_max", "p_min"], as_index=False).agg(
        n=("n_tokens", "sum"), s=("_sec", "sum"), c=("_csec", "sum"), p=("_psec", "sum")
    )
    agg["actual"] = agg["n"] / agg["s"]
    agg["ceiling"] = agg["n"] / agg["c"]
    agg["plain"] = agg["n"] / agg["p"]
    if p_min is not None:
        pick = agg[np.isclose(agg["p_min"], p_min)]
    else:
        pick = agg.sort_values("actual", ascending=False).groupby("n_max", as_index=False).head(1)
    pick = pick.sort_values("n_max")
    x = [str(n) for n in pick["n_max"]]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=pick["actual"],
            name="reached",
            marker_color=PALETTE[0],
            customdata=np.stack([pick["p_min"]], axis=1),
            hovertemplate="n_max %{x}, p_min %{customdata[0]:.2f}<br>%{y:.0f} tok/s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=pick["ceiling"],
            name="every draft accepted",
            marker_color=CEILING,
            hovertemplate="n_max %{x}<br>ceiling %{y:.0f} tok/s<extra></extra>",
        )
    )
    _plain_line(fig, float(pick["plain"].median()) if len(pick) else math.nan)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="n_max", type="category")
    fig.update_yaxes(title="tokens / s")
    return _layout(fig, "Speedup ceiling: reached vs every draft accepted")


@takes(COMPARISON_ROWS)
def predicted_vs_measured(rows: Sequence[dict]) -> go.Figure:
    """Predicted against measured tokens/s, one marker per setting (``rows``: dicts with ``label``,
    ``predicted`` and ``measured``), with the ±10% band."""
    pred = np.array([r["predicted"] for r in rows], dtype=float)
    meas = np.array([r["measured"] for r in rows], dtype=float)
    lo = float(np.nanmin(np.concatenate([pred, meas]))) * 0.8 if len(rows) else 0
    hi = float(np.nanmax(np.concatenate([pred, meas]))) * 1.2 if len(rows) else 1
    fig = go.Figure()
    xs = np.array([lo, hi])
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line=dict(color=GUIDE), name="equal"))
    fig.add_trace(
        go.Scatter(
            x=np.r_[xs, xs[::-1]],
            y=np.r_[xs * 1.1, xs[::-1] * 0.9],
            fill="toself",
            line=dict(width=0),
            fillcolor="rgba(150,150,150,0.2)",
            name="±10%",
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=meas,
            y=pred,
            mode="markers+text",
            text=[r["label"] for r in rows],
            textposition="top center",
            name="settings",
        )
    )
    fig.update_xaxes(title="measured tokens/s")
    fig.update_yaxes(title="predicted tokens/s")
    return _layout(fig, "Simulator: predicted vs measured")


@takes(DRAFTER_TABLE)
def drafter_comparison(df, *, by: str = "prompt", value: str = "tokens_per_second") -> go.Figure:
    """Drafters side by side: ``value`` (tokens/s: total tokens / total seconds; other columns:
    mean) per drafter for each group of ``by`` (e.g. a prompt, or a ``kind`` column such as
    code-like / prose-like), from sweeps over several drafters (``mx.sweep(..., drafter=mx.DRAFTER_MODES)``
    or concatenated ``simulate_grid`` tables); each drafter at its best setting per group, in the
    registry's order and colours."""
    d = df.copy()
    d["_sec"] = d["n_tokens"] / d["tokens_per_second"]
    keys = [by, "drafter", "n_max", "p_min"]
    agg = d.groupby(keys, as_index=False).agg(
        n_tokens=("n_tokens", "sum"), seconds=("_sec", "sum"), acceptance_rate=("acceptance_rate", "mean")
    )
    agg["tokens_per_second"] = agg["n_tokens"] / agg["seconds"]
    best = agg.sort_values("tokens_per_second", ascending=False).groupby([by, "drafter"], as_index=False).head(1)
    groups = list(dict.fromkeys(df[by]))
    fig = go.Figure()
    for i, drafter in enumerate(sorted(best["drafter"].unique(), key=drafter_order)):
        rows = best[best["drafter"] == drafter].set_index(by).reindex(groups)
        label = drafter_label(drafter)
        fig.add_trace(
            go.Bar(
                x=[str(g) for g in groups],
                y=rows[value],
                name=label,
                marker_color=drafter_color(drafter, i),
                customdata=np.stack([rows["n_max"], rows["p_min"], rows["acceptance_rate"]], axis=1),
                hovertemplate=(
                    label + "<br>%{x}<br>" + value + " %{y:.4g}<br>n_max %{customdata[0]}, "
                    "p_min %{customdata[1]:.2f}<br>acceptance %{customdata[2]:.2f}<extra></extra>"
                ),
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title=by)
    fig.update_yaxes(title=value.replace("_", " "))
    return _layout(fig, f"Drafters compared ({value.replace('_', ' ')}, best setting each)")


@takes(SIM_TRACE, measured=OPTIONAL_TRACE)
def predicted_acceptance_by_depth(prediction, measured=None) -> go.Figure:
    """Bars: the predicted fraction of the steps drafting depth *d* in which the target accepts it
    (``prediction``: a :class:`~mtp_explorer.analysis.simulate.SimTrace`), up to its ``n_max``; diamonds: the
    same fraction in a measured run (a :class:`~mtp_explorer.core.trace.Trace`), when given."""
    n_max = int(prediction.policy["n_max"])
    s = prediction.summary()
    depths = list(range(1, n_max + 1))
    rate = [float(v) for v in s["acceptance_by_depth"][:n_max]]
    fig = go.Figure(
        go.Bar(
            x=depths,
            y=rate,
            name="predicted",
            marker_color=PRIMARY,
            text=[("" if math.isnan(v) else f"{v:.2f}") for v in rate],
            textposition="outside",
            hovertemplate="depth %{x}: predicted %{y:.3f}<extra></extra>",
        )
    )
    if measured is not None:
        m = [float(v) for v in measured.summary()["acceptance_by_depth"][:n_max]]
        m += [math.nan] * (n_max - len(m))
        fig.add_trace(
            go.Scatter(
                x=depths,
                y=m,
                mode="markers",
                name="measured",
                marker=marker_outline("diamond", 11, MEASURED),
                hovertemplate="depth %{x}: measured %{y:.3f}<extra></extra>",
            )
        )
    rate_all = s["acceptance_rate"]
    title = "predicted acceptance by depth" + ("" if math.isnan(rate_all) else f" — overall {rate_all:.2f}")
    fig.update_xaxes(title="draft depth", dtick=1)
    fig.update_yaxes(title="accepted / reached", range=[0, 1.1])
    _layout(fig, title, height=340)
    fig.update_layout(showlegend=measured is not None)
    return fig


def dip_notes(rows: Sequence[dict]) -> list[tuple[int, str]]:
    """Why the predicted tokens/s dips at an ``n_max`` (below both neighbours): its tokens per step and milliseconds
    per step against the lower ``n_max``'s (tokens/s is their ratio), for rows that carry them (:func:`speed_curve
    <mtp_explorer.ui.whatif_panel.speed_curve>`). Pairs of (row index, text)."""
    notes = []
    for i in range(1, len(rows) - 1):
        left, here, right = (float(rows[j]["tokens_per_second"]) for j in (i - 1, i, i + 1))
        if not here < min(left, right):
            continue
        a, b = rows[i - 1], rows[i]
        if not all(
            math.isfinite(float(r.get(k, math.nan))) for r in (a, b) for k in ("tokens_per_step", "ms_per_step")
        ):
            continue
        why = "fewer tokens per step" if b["tokens_per_step"] < a["tokens_per_step"] else "dearer steps"
        notes.append(
            (
                i,
                f"dip: {why}<br>{b['tokens_per_step']:.2f} tok at {b['ms_per_step']:.2f} ms/step<br>"
                f"(n_max {a['n_max']}: {a['tokens_per_step']:.2f} at {a['ms_per_step']:.2f})",
            )
        )
    return notes


@takes(SPEED_ROWS, measured=SPEED_POINT)
def predicted_speed_by_n_max(
    rows: Sequence[dict], *, n_max: int, plain: float, p_min: float, n_min: int, measured: dict | None = None
) -> go.Figure:
    """Predicted tokens/s against ``n_max`` at one ``p_min`` / ``n_min`` (``rows``: dicts with ``n_max``,
    ``tokens_per_second`` and ``ceiling_tokens_per_second``), the ceiling with every draft accepted,
    plain decoding (``plain`` tokens/s), the setting ``n_max`` marked with a star and, when given, a
    measured run (``measured``: ``n_max`` and ``tokens_per_second``) with a diamond."""
    x = [int(r["n_max"]) for r in rows]
    y = [float(r["tokens_per_second"]) for r in rows]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[float(r["ceiling_tokens_per_second"]) for r in rows],
            mode="lines",
            name="every draft accepted",
            line=dict(color=CEILING, dash="dash"),
            hovertemplate="n_max %{x}<br>ceiling %{y:.0f} tok/s<extra></extra>",
        )
    )
    per_step = [[float(r.get("tokens_per_step", math.nan)), float(r.get("ms_per_step", math.nan))] for r in rows]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            name="predicted",
            line=dict(color=PALETTE[0]),
            customdata=per_step,
            hovertemplate="n_max %{x}<br>predicted %{y:.0f} tok/s<br>%{customdata[0]:.2f} tokens "
            "per step at %{customdata[1]:.2f} ms per step<extra></extra>",
        )
    )
    for i, text in dip_notes(rows):
        # a short mark above the dip, the reason in its hover text: a note of three lines under the point ran
        # into the n_max tick labels of a half-width figure
        fig.add_annotation(
            x=x[i],
            y=y[i],
            text=text.split("<br>")[0],
            hovertext=text,
            showarrow=True,
            arrowhead=2,
            ax=0,
            ay=-28,
            font=dict(size=10),
            align="center",
        )
    cur = [r for r in rows if int(r["n_max"]) == n_max]
    if cur:
        fig.add_trace(
            go.Scatter(
                x=[n_max],
                y=[float(cur[0]["tokens_per_second"])],
                mode="markers",
                name="this setting",
                marker=marker_outline("star", 16, HIGHLIGHT),
                hovertemplate="n_max %{x} (this setting)<br>predicted %{y:.0f} tok/s<extra></extra>",
            )
        )
    if measured is not None:
        fig.add_trace(
            go.Scatter(
                x=[int(measured["n_max"])],
                y=[float(measured["tokens_per_second"])],
                mode="markers",
                name="measured",
                marker=marker_outline("diamond", 12, MEASURED),
                hovertemplate="n_max %{x}<br>measured %{y:.0f} tok/s<extra></extra>",
            )
        )
    _plain_line(fig, plain)
    fig.update_xaxes(title="n_max", dtick=1)
    fig.update_yaxes(title="tokens / s", rangemode="tozero")
    return _layout(fig, f"predicted tokens/s by n_max<br><sup>at p_min {p_min:.2f}, n_min {n_min}</sup>", height=340)
