"""The look every figure shares: colours, labels and layout helpers.

Per-trace figures (:mod:`~mtp_explorer.viz.trace_figures`) and what-if figures
(:mod:`~mtp_explorer.viz.whatif_figures`) take their colours, names and layout from here. Drafter labels come
from the drafter registry (:mod:`mtp_explorer.core.drafters`), phase names from the engine's schema
(:data:`~mtp_explorer.core.schema.PHASES`); the colour tables below are keyed by those names.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from ..core.drafters import DEFAULT_MODE, DRAFTER_MODES, DRAFTER_SPECS, MODE_ALIASES, MODES, mode
from ..core.errors import ParameterError
from ..core.schema import PHASES

# -- palettes --------------------------------------------------------------------------------------
#: A categorical palette (plotly's D3): one colour per series, cycled.
PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)

#: One colour per draft depth (or settings segment), cycled.
DEPTH_COLORS: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")

#: The marks of settings changes (``set_params`` during a run).
CHANGE_COLOR = "#d62728"
#: The main series of a single-series figure, and its companions.
PRIMARY = "#4c78a8"
MEASURED = "#e45756"  #: measured runs shown beside predictions
HIGHLIGHT = "#f58518"  #: the current setting
CEILING = "#aec7e8"  #: the bound with every draft accepted
PLAIN = "#d62728"  #: plain decoding (n_max = 0) reference lines
MUTED = "#868e96"  #: secondary reference lines
GUIDE = "#999"  #: diagonals and other guides

# -- token origins -----------------------------------------------------------------------------------
#: Background colours of tokens in the timeline, by origin (``Trace.token_origin``) plus rejected drafts.
ORIGIN_COLORS: dict[str, str] = {
    "accepted": "#b7e4c7",  # a verified draft
    "correction": "#ffd8a8",  # the target's token after a draft (correction, or bonus after a full accept)
    "plain": "#e9ecef",  # the target's token in a step without a draft
    "rejected": "#f5c2c7",  # a draft the target disagreed with (rolled back)
}
ORIGIN_LABELS: dict[str, str] = {
    "accepted": "accepted draft",
    "correction": "target correction / bonus",
    "plain": "plain (no draft)",
    "rejected": "rejected draft",
}

# -- phases ----------------------------------------------------------------------------------------
_PHASE_STYLE: dict[str, tuple[str, str]] = {  # phase -> (colour, label), in the order bars stack
    "draft": ("#4c78a8", "draft"),
    "verify": ("#f58518", "verify"),
    "catchup": ("#54a24b", "catch-up"),
    "sample": ("#b279a2", "sample"),
}
#: The engine's phases (:data:`~mtp_explorer.core.schema.PHASES`) in the order the time bars stack them.
PHASE_ORDER: tuple[str, ...] = tuple(
    sorted(PHASES, key=lambda p: list(_PHASE_STYLE).index(p) if p in _PHASE_STYLE else len(_PHASE_STYLE))
)
PHASE_COLORS: dict[str, str] = {
    p: _PHASE_STYLE.get(p, (PALETTE[i % len(PALETTE)], ""))[0] for i, p in enumerate(PHASE_ORDER)
}
PHASE_LABELS: dict[str, str] = {p: _PHASE_STYLE.get(p, ("", p))[1] for p in PHASE_ORDER}

# -- recurrent snapshot slots ------------------------------------------------------------------------
SLOT_STATES: tuple[str, ...] = ("not written", "written (snapshot)", "restored (rollback)")
SLOT_COLORS: tuple[str, ...] = ("#f1f3f5", "#a5d8ff", "#e8590c")

# -- drafters --------------------------------------------------------------------------------------
#: The drafters' colours: the palette, then darker tones (D3's category20b), so that no two listed choices share one.
DRAFTER_PALETTE: tuple[str, ...] = PALETTE + (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#5254a3",
    "#8ca252",
    "#bd9e39",
    "#ad494a",
    "#a55194",
)

#: One colour per ``drafter=`` choice (:data:`~mtp_explorer.core.drafters.DRAFTER_MODES`), in registry order, the same
#: in every figure (defined here only). The short spellings take the colour of the choice they name.
DRAFTER_COLORS: dict[str, str] = {
    name: DRAFTER_PALETTE[i % len(DRAFTER_PALETTE)] for i, name in enumerate(DRAFTER_MODES)
}
DRAFTER_COLORS |= {a: DRAFTER_COLORS[v] for a, (v, _) in MODE_ALIASES.items() if a not in DRAFTER_COLORS}


def drafter_label(name: str | None, policy: str | None = None) -> str:
    """How views name a drafter: the label of the ``drafter=`` choice of that name (llama.cpp's ``--spec-type``
    value, or a short spelling; under ``policy`` where given), else the engine drafter's label; ``""`` for ``None``
    (no draft)."""
    if name is None:
        return ""
    if name in MODES and policy in (None, MODES[name].policy):
        return MODES[name].label
    if name in DRAFTER_SPECS:  # a drafter that is not a listed choice on its own
        return DRAFTER_SPECS[name].label
    try:
        return mode(name, policy).label or str(name)
    except ParameterError:
        return str(name)


def drafter_color(name: str, index: int = 0) -> str:
    """A drafter's colour; names outside the registry take the palette's ``index``-th colour."""
    return DRAFTER_COLORS.get(name, PALETTE[index % len(PALETTE)])


def drafter_order(name: str) -> int:
    """Sort key: the registry's order of the ``drafter=`` choices, unknown names last."""
    return DRAFTER_MODES.index(name) if name in DRAFTER_MODES else len(DRAFTER_MODES)


def run_label(settings: dict) -> str:
    """The label of a speculative run in throughput views: its drafter's (the default drafter's when
    the settings do not say)."""
    return drafter_label(settings.get("drafter") or DEFAULT_MODE, settings.get("chain_policy"))


# -- layout ----------------------------------------------------------------------------------------
def _template() -> go.layout.Template:
    """plotly's ``plotly_white``, with the defaults of the trace types the package draws only: assigning the whole of
    it (defaults for 24 trace types) costs a figure about 30 ms, this about 10 (a what-if move builds two figures)."""
    white = pio.templates["plotly_white"]
    drawn = ("scatter", "bar", "box", "heatmap")
    return go.layout.Template(layout=white.layout, data={k: white.data[k] for k in drawn})


#: The figures' look: plotly's ``plotly_white`` for the trace types the package draws.
TEMPLATE = _template()


def base_layout(fig: go.Figure, title: str, height: int, *, legend: str = "below") -> go.Figure:
    """Title, height and the common look (``plotly_white``); no width: a figure takes its container's (plotly's
    ``autosize``), and its axes make room for their tick labels and titles (``automargin``). ``legend="below"``: a
    horizontal legend under the x-axis titles (every figure of :mod:`mtp_explorer.plots`); ``"right"``: a vertical
    legend beside the plot."""
    if legend == "below":
        fig.update_layout(
            title={"text": title, "font": {"size": 14}},
            height=height,
            template=TEMPLATE,
            autosize=True,
            margin={"l": 55, "r": 20, "t": 70, "b": 90},
            legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0},
        )
    elif legend == "right":
        fig.update_layout(
            title={"text": title},
            height=height,
            template=TEMPLATE,
            autosize=True,
            margin={"l": 60, "r": 20, "t": 60, "b": 50},
            legend={"orientation": "v"},
        )
    else:
        raise ParameterError(f"legend must be 'below' or 'right', got {legend!r}")
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def empty(fig: go.Figure, text: str, **kw) -> go.Figure:
    """A grey note in the middle of a figure that has nothing (yet) to show."""
    fig.add_annotation(
        text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 13, "color": "#666"}, **kw
    )
    return fig


def marker_outline(symbol: str, size: int, color: str) -> dict:
    """A marker with a thin black outline (stars, diamonds: single points that must stand out)."""
    return {"symbol": symbol, "size": size, "color": color, "line": {"color": "black", "width": 1}}
