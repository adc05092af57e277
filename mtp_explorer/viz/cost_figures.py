"""The figure of a cost model: ``verify_cost(source)`` shows what a target verify of ``k`` rows costs against a one-row
decode, the number that decides whether a drafter can pay on a machine (a look-up's drafts are nearly free, a model's
or a head's are not, and every drafter's verify is priced here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..analysis.oracle import CostModel, OracleTrace
from ..analysis.profile import CostProfile
from ..core.errors import ParameterError
from .inputs import one_or_labelled, takes
from .style import GUIDE, PALETTE, base_layout

__all__ = ["verify_cost"]

SOURCES = one_or_labelled("an OracleTrace, a CostProfile or a CostModel", OracleTrace, CostProfile, CostModel)


def _cost_at(source: Any, pos: float | None) -> tuple[CostModel, float]:
    """The cost model of ``source`` and the position it is read at: ``pos`` if given, else the oracle's median
    position, the profile's mean measured position, or 0 for a bare cost model."""
    if isinstance(source, OracleTrace):
        at = float(np.median(source.columns["pos"])) if pos is None else pos
        return source.cost, at
    if isinstance(source, CostProfile):
        return source.cost, float(source.measured.get("mean_pos", 0.0)) if pos is None else pos
    return source, 0.0 if pos is None else pos


@takes(SOURCES)
def verify_cost(source: Any, *, pos: float | None = None) -> go.Figure:
    """Bars: a target decode of ``k`` rows (one token plus ``k - 1`` drafts) in multiples of a one-row decode, at
    position ``pos`` (default: the recording's median position, a profile's mean measured one); a grey line: the
    tokens such a step yields when every draft is accepted. Where a bar stands above what its step can yield, even
    perfect drafts of that length lose; the hover text gives each bar's time and the share of drafts a step must
    accept to break even (drafting itself taken as free). ``source``: an oracle recorded with timing probes, a cost
    profile (:func:`~mtp_explorer.profile_costs`, :meth:`CostProfile.load`) or a cost model, or a dict of labels to
    them to compare machines or settings side by side."""
    if pos is not None and not (isinstance(pos, (int, float)) and np.isfinite(pos) and pos >= 0):
        raise ParameterError(f"pos must be a position >= 0, got {pos!r}")
    sources = dict(source) if isinstance(source, Mapping) else {"": source}
    fig = go.Figure()
    top = 1
    for i, (label, src) in enumerate(sources.items()):
        cost, at = _cost_at(src, pos)
        rows = np.arange(1, len(cost.verify))
        ms = np.asarray(cost.verify_ns(rows, at, fresh=False), dtype=float) / 1e6
        ratio = ms / ms[0]
        # a step of k rows yields 1 + accepted tokens: it breaks even at (ratio - 1) of its k - 1 drafts accepted
        need = [
            "no drafts"
            if k == 1
            else f"{min(r - 1, k - 1) / (k - 1):.0%} of its {k - 1} drafts accepted"
            + (" (never: above what it yields)" if r > k else "")
            for k, r in zip(rows, ratio, strict=True)
        ]
        name = label or "verify"
        fig.add_trace(
            go.Bar(
                x=rows,
                y=ratio,
                name=name,
                marker_color=PALETTE[i % len(PALETTE)],
                text=[f"{r:.1f}x" for r in ratio],
                textposition="outside",
                cliponaxis=False,
                customdata=np.column_stack([ms, need]),
                hovertemplate=f"{name}<br>%{{x}} rows: %{{customdata[0]:.2f}} ms, %{{y:.2f}}x one row (pos {at:.0f})"
                "<br>breaks even at %{customdata[1]}<extra></extra>",
            )
        )
        top = max(top, float(ratio.max()), int(rows[-1]))
    rows = np.arange(1, top + 1)
    fig.add_trace(
        go.Scatter(
            x=rows,
            y=rows,
            mode="lines+markers",
            name="tokens a step yields, every draft accepted",
            line={"color": GUIDE, "dash": "dash"},
            marker={"size": 5},
            hovertemplate="%{x} rows: at most %{y} tokens<extra></extra>",
        )
    )
    title = "Verify cost by batch rows, in one-row decodes"
    if len(sources) == 1:
        title += f" (position {_cost_at(next(iter(sources.values())), pos)[1]:.0f})"
    base_layout(fig, title, 440)
    last = max(len(_cost_at(s, pos)[0].verify) - 1 for s in sources.values())
    fig.update_xaxes(title="rows in the target decode (1 token + drafts)", dtick=1, range=[0.4, last + 0.6])
    fig.update_yaxes(title="x one-row decode", rangemode="tozero", range=[0, max(top, last) * 1.12])
    fig.update_layout(barmode="group", bargap=0.25)
    return fig
