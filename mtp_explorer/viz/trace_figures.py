"""Figures of a generation's trace: one function per figure, each ``plots.<name>(trace, ...) -> go.Figure``.

They need no widgets (the Explorer shows the same figures live) and export with :func:`export`.
Step-indexed figures mark the steps where ``n_max``, ``p_min`` or ``n_min`` changed (``set_params``
during a run); aggregate figures split their bars by settings segment when settings changed. The numbers
(acceptance by depth, step times, speedup, settings segments) come from :mod:`mtp_explorer.core.metrics`,
the look from :mod:`mtp_explorer.viz.style`. Each figure checks its input first (:mod:`mtp_explorer.viz.inputs`):
anything but a :class:`~mtp_explorer.core.trace.Trace` is a ``TypeError``.

:data:`FIGURES` holds these per-trace figures by name. The what-if figures (built from oracle traces,
calibrations and sweep tables) are in :mod:`mtp_explorer.viz.whatif_figures`; :mod:`mtp_explorer.plots`
exports both.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core import metrics
from ..core.drafters import DRAFTER_SPECS
from ..core.errors import MtpExplorerError
from ..core.metrics import SettingsChange, SettingsSegment, settings_changes, settings_segments
from ..core.metrics import trace_speedup as speedup
from ..core.schema import STOP_REASONS
from ..core.trace import Trace, drafter_name
from .inputs import FIGURE, OPTIONAL_TRACE, TRACE, takes
from .style import (
    CHANGE_COLOR,
    DEPTH_COLORS,
    MUTED,
    ORIGIN_COLORS,
    ORIGIN_LABELS,
    PHASE_COLORS,
    PHASE_LABELS,
    PHASE_ORDER,
    PRIMARY,
    SLOT_COLORS,
    SLOT_STATES,
    base_layout,
    drafter_label,
    empty,
    run_label,
)

__all__ = [
    "ORIGIN_COLORS",
    "ORIGIN_LABELS",
    "PHASE_COLORS",
    "PHASE_LABELS",
    "ExportError",
    "SettingsChange",
    "SettingsSegment",
    "settings_changes",
    "settings_segments",
    "step_seconds",
    "speedup",
    "token_timeline",
    "acceptance_by_depth",
    "accepted_length_histogram",
    "hidden_norms",
    "rs_slots",
    "throughput",
    "slot_states",
    "export",
    "FIGURES",
]

Piece = Callable[[int], str]


class ExportError(MtpExplorerError, RuntimeError):
    """A figure could not be exported (e.g. PNG without kaleido)."""


# -- settings changes ------------------------------------------------------------------------------
def _mark_changes(
    fig: go.Figure,
    changes: Sequence[SettingsChange],
    x_of: Callable[[SettingsChange], float],
    row: int | None = None,
    col: int | None = None,
) -> None:
    """Dashed vertical lines at the settings changes, labelled with what changed."""
    for ch in changes:
        kw = {"row": row, "col": col} if row is not None else {}
        fig.add_vline(
            x=x_of(ch),
            line_dash="dash",
            line_color=CHANGE_COLOR,
            line_width=1,
            annotation_text=ch.label,
            annotation_position="top left",
            annotation_font_size=10,
            annotation_font_color=CHANGE_COLOR,
            **kw,
        )


def _step_ticks(n_steps: int) -> dict:
    """A step axis's ticks: whole steps only (1, 2, 5, 10, 20, ... apart, at most about ten ticks)."""
    dtick, steps = 1, (2, 2.5, 2)  # 1, 2, 5, 10, 20, 50, ...
    i = 0
    while n_steps / dtick > 10:
        dtick, i = round(dtick * steps[i % 3]), i + 1
    return {"tickmode": "linear", "tick0": 0, "dtick": dtick}


def _segment_color(k: int, n_segments: int, single: str) -> str:
    """Bars of settings segment ``k``: ``single`` when the settings never changed, else one colour each."""
    return DEPTH_COLORS[k % len(DEPTH_COLORS)] if n_segments > 1 else single


# -- token pieces --------------------------------------------------------------------------------
def _piece_lookup(trace: Trace, piece: Piece | None) -> Piece:
    """Token id -> text: ``piece`` (e.g. ``Session.piece``) when given, else the pieces the trace holds."""
    known = dict(zip(trace.tokens, trace.pieces))
    cache: dict[int, str] = {}

    def lookup(tok: int) -> str:
        tok = int(tok)
        if tok in cache:
            return cache[tok]
        if piece is not None:
            try:
                text = piece(tok)
            except Exception:
                text = known.get(tok, f"⟨{tok}⟩")
        else:
            text = known.get(tok, f"⟨{tok}⟩")
        cache[tok] = text
        return text

    return lookup


def _visible(text: str) -> str:
    """A token's text as shown in the timeline: newlines and tabs as symbols, spaces kept."""
    return text.replace("\r", "").replace("\n", "↵").replace("\t", "⇥") or "∅"


def _escape(text: str) -> str:
    """Plotly text is HTML-like: escape it and keep runs of spaces."""
    return html.escape(text, quote=False).replace(" ", "\u00a0")


def _alternatives(trace: Trace, i: int, j: int, lookup: Piece) -> str:
    ids = trace.columns["topk_ids"][i, j]
    probs = trace.columns["topk_probs"][i, j]
    parts = [f"{_escape(repr(lookup(t)))} {p:.2f}" for t, p in zip(ids, probs) if t >= 0 and not math.isnan(p)]
    return "<br>".join(parts) if parts else "(not recorded)"


def _confidence(trace: Trace, i: int, j: int, lookup: Piece, drafter: str | None) -> str:
    """The hover lines on a draft token's confidence: its value with the top-k alternatives, or why there is
    none (a drafter without confidence, per the registry, or telemetry off)."""
    p = float(trace.columns["draft_prob"][i, j])
    if math.isnan(p):
        spec = DRAFTER_SPECS.get(drafter) if drafter is not None else None
        if spec is not None and not spec.has_confidence:
            return f"no confidence ({spec.label} drafts have none)"
        return "no confidence recorded"
    return f"draft confidence {p:.3f}<br>top-k:<br>{_alternatives(trace, i, j, lookup)}"


# -- 1. token timeline -----------------------------------------------------------------------------
@dataclasses.dataclass
class _Cell:
    kind: str  # accepted | correction | plain | rejected
    text: str  # visible text
    hover: str
    step: int
    newline: bool  # the token ends a line
    line: int = 0
    col: int = 0


def _timeline_cells(trace: Trace, lookup: Piece) -> list[_Cell]:
    c = trace.columns
    cells: list[_Cell] = []
    g = 0  # index into the generated tokens
    for i in range(trace.n_steps):
        step = int(c["step"][i])
        n_d, n_a = int(c["n_drafted"][i]), int(c["n_accepted"][i])
        head = f"step {step} · pos {int(c['pos'][i]) + 1}"
        name = drafter_name(c, i)
        who = drafter_label(name)
        for j in range(n_a):
            text = trace.pieces[g]
            cells.append(
                _Cell(
                    "accepted",
                    _visible(text),
                    (
                        f"<b>{_escape(repr(text))}</b> accepted {who} draft<br>{head} · depth {j + 1}<br>"
                        f"{_confidence(trace, i, j, lookup, name)}"
                    ),
                    step,
                    "\n" in text,
                )
            )
            g += 1
        for j in range(n_a, n_d):
            tok = int(c["drafted"][i, j])
            text = lookup(tok)
            target = int(c["target_tokens"][i, j])
            cells.append(
                _Cell(
                    "rejected",
                    _visible(text),
                    (
                        f"<b>{_escape(repr(text))}</b> rejected {who} draft (rolled back)<br>{head} · depth {j + 1}<br>"
                        f"target wanted {_escape(repr(lookup(target)))}<br>"
                        f"{_confidence(trace, i, j, lookup, name)}"
                    ),
                    step,
                    False,
                )
            )
        text = trace.pieces[g]
        replayed = int(c["replayed"][i]) if "replayed" in c else 0  # (traces saved before the column)
        if replayed:
            kind, what = (
                "plain",
                (
                    f"target token after the last step's {replayed} tokens were verified again from "
                    f"its checkpoint ({int(c['replay_agreed'][i])} sampled alike)"
                ),
            )
        elif n_d == 0:
            kind, what = "plain", "target token (no draft)"
        elif n_a == n_d:
            kind, what = "correction", f"bonus token after {n_d} accepted drafts"
        else:
            kind, what = "correction", f"target correction at depth {n_a + 1}"
        stop = STOP_REASONS[int(c["stop_reason"][i])]
        cells.append(
            _Cell(
                kind,
                _visible(text),
                (
                    f"<b>{_escape(repr(text))}</b> {what}<br>{head}<br>"
                    f"drafted {n_d}, accepted {n_a}, rollback {int(c['rollback'][i])}<br>"
                    f"drafting stopped by {stop}"
                ),
                step,
                "\n" in text,
            )
        )
        g += 1
    return cells


def _layout_cells(cells: list[_Cell], width_chars: int) -> int:
    """Place cells in lines of ``width_chars`` columns; returns the number of lines."""
    line = col = 0
    for cell in cells:
        w = max(1, len(cell.text))
        if col > 0 and col + w > width_chars:
            line, col = line + 1, 0
        cell.line, cell.col = line, col
        col += w
        if cell.newline:
            line, col = line + 1, 0
    return max((cell.line for cell in cells), default=-1) + 1


@takes(TRACE)
def token_timeline(trace: Trace, piece: Piece | None = None, *, width_chars: int = 80) -> go.Figure:
    """The generated text, token by token, coloured by origin.

    Accepted drafts, target corrections (or bonus tokens) and plain tokens are the text itself; each
    step's rejected drafts are shown struck through just before the correction that replaced them.
    Hover: step, depth, the drafter, draft confidence and the draft's top-k alternatives with probabilities.
    ``piece`` turns token ids that are not in the generated text (rejected drafts, alternatives) into
    text, e.g. ``session.piece``; without it they show as ``⟨id⟩``. A red triangle marks the first
    token of each step where the settings changed.
    """
    lookup = _piece_lookup(trace, piece)
    cells = _timeline_cells(trace, lookup)
    n_lines = _layout_cells(cells, width_chars)
    fig = go.Figure()
    for kind in ("accepted", "correction", "plain", "rejected"):
        sel = [c for c in cells if c.kind == kind]
        text = [_escape(c.text) for c in sel]
        if kind == "rejected":
            text = [f"<s>{t}</s>" for t in text]
        fig.add_trace(
            go.Bar(
                name=ORIGIN_LABELS[kind],
                orientation="h",
                y=[c.line for c in sel],
                base=[c.col for c in sel],
                x=[max(1, len(c.text)) for c in sel],
                text=text,
                hovertext=[c.hover for c in sel],
                hovertemplate="%{hovertext}<extra></extra>",
                customdata=[c.step for c in sel],
                marker={"color": ORIGIN_COLORS[kind], "line": {"color": "white", "width": 1}},
                textposition="inside",
                insidetextanchor="middle",
                constraintext="none",
                textangle=0,
                textfont={"family": "monospace", "size": 12, "color": "#777" if kind == "rejected" else "#111"},
                width=0.8,
                showlegend=True,
            )
        )
    changes = settings_changes(trace)
    first_cell = {}
    for c in cells:
        first_cell.setdefault(c.step, c)
    marks = [(first_cell[ch.step], ch) for ch in changes if ch.step in first_cell]
    fig.add_trace(
        go.Scatter(
            name="settings changed",
            x=[c.col + 0.2 for c, _ in marks],
            y=[c.line - 0.5 for c, _ in marks],
            mode="markers",
            marker={"symbol": "triangle-down", "size": 9, "color": CHANGE_COLOR},
            hovertext=[f"step {ch.step}: {ch.label}" for _, ch in marks],
            hovertemplate="%{hovertext}<extra></extra>",
            showlegend=bool(marks),
        )
    )
    s = trace.summary()
    title = (
        f"token timeline — {s['n_tokens']} tokens in {s['n_steps']} steps, "
        f"{s['n_accepted']}/{s['n_drafted']} drafts accepted"
    )
    base_layout(fig, title, height=140 + 24 * max(n_lines, 1))
    fig.update_layout(
        barmode="overlay",
        bargap=0.1,
        hoverlabel={"font_family": "monospace", "align": "left"},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 11}},
        margin={"l": 20, "r": 20, "t": 70, "b": 20},
        uniformtext={"minsize": 9, "mode": "show"},
    )
    fig.update_xaxes(range=[0, width_chars], showgrid=False, showticklabels=False, zeroline=False, fixedrange=True)
    fig.update_yaxes(range=[max(n_lines, 1) - 0.5, -0.7], showgrid=False, showticklabels=False, zeroline=False)
    if not cells:
        empty(fig, "no tokens yet")
    return fig


# -- 2. acceptance ---------------------------------------------------------------------------------
@takes(TRACE)
def acceptance_by_depth(trace: Trace) -> go.Figure:
    """Bars: the fraction of steps that drafted depth *d* in which the target accepted it (one group per
    settings segment when the settings changed during the run)."""
    fig = go.Figure()
    c = trace.columns
    segments = settings_segments(trace)
    max_depth = int(c["n_drafted"].max()) if trace.n_steps else 0
    for k, seg in enumerate(segments):
        sl = slice(seg.start, seg.stop)
        acc = metrics.acceptance_by_depth(c["n_drafted"][sl], c["n_accepted"][sl], max_depth)
        rate = acc.rate
        fig.add_trace(
            go.Bar(
                name=seg.label if len(segments) > 1 else "acceptance",
                x=list(range(1, max_depth + 1)),
                y=rate,
                customdata=np.column_stack([acc.reached, acc.accepted]) if max_depth else None,
                hovertemplate="depth %{x}: %{y:.2f}<br>accepted in %{customdata[1]} of %{customdata[0]} steps"
                "<extra></extra>",
                marker_color=_segment_color(k, len(segments), PRIMARY),
                text=[("" if math.isnan(v) else f"{v:.2f}") for v in rate],
                textposition="outside",
            )
        )
    rate_all = trace.summary()["acceptance_rate"]
    title = "acceptance by depth" + ("" if math.isnan(rate_all) else f" — overall {rate_all:.2f}")
    base_layout(fig, title, height=340)
    fig.update_layout(barmode="group", showlegend=len(segments) > 1)
    fig.update_xaxes(title="draft depth", dtick=1)
    if trace.model.get("mtp_mode") == "chained":  # head i drafts depth i: its acceptance is the bar at depth i
        heads = range(1, min(max_depth, int(trace.model.get("n_mtp_heads", 0))) + 1)
        fig.update_xaxes(
            title="draft depth (chained MTP heads: head i drafts depth i)",
            tickvals=list(heads),
            ticktext=[f"{d}<br>head {d}" for d in heads],
        )
    fig.update_yaxes(title="accepted / reached", range=[0, 1.1])
    if max_depth == 0:
        empty(fig, "no drafts" if trace.n_steps else "no steps yet")
    return fig


@takes(TRACE)
def accepted_length_histogram(trace: Trace) -> go.Figure:
    """Bars: how many steps accepted 0, 1, 2, ... drafts (one group per settings segment)."""
    fig = go.Figure()
    c = trace.columns
    segments = settings_segments(trace)
    top = int(c["n_max"].max()) if trace.n_steps else 0
    x = list(range(0, top + 1))
    for k, seg in enumerate(segments):
        counts = np.bincount(c["n_accepted"][seg.start : seg.stop], minlength=top + 1)[: top + 1]
        n = seg.stop - seg.start
        fig.add_trace(
            go.Bar(
                name=seg.label if len(segments) > 1 else "steps",
                x=x,
                y=counts.tolist(),
                customdata=(counts / n).tolist(),
                hovertemplate="%{x} accepted: %{y} steps (%{customdata:.0%})<extra></extra>",
                marker_color=_segment_color(k, len(segments), "#54a24b"),
            )
        )
    mean = trace.summary()["mean_accepted_length"]
    title = "accepted length per step" + ("" if math.isnan(mean) else f" — mean {mean:.2f}")
    base_layout(fig, title, height=340)
    fig.update_layout(barmode="group", showlegend=len(segments) > 1)
    fig.update_xaxes(title="accepted drafts in a step", dtick=1)
    fig.update_yaxes(title="steps")
    if trace.n_steps == 0:
        empty(fig, "no steps yet")
    return fig


# -- 3. hidden-state norms -------------------------------------------------------------------------
@takes(TRACE)
def hidden_norms(trace: Trace) -> go.Figure:
    """Left: the L2 norm of the pre-norm residual stream by position, for the target rows kept after
    verification, the target rows removed by rollback, and the MTP draft rows (one colour and legend entry per depth).
    Right: cosine between each MTP draft hidden state and the target's at the same position, by depth.

    Target row *i* of a step sits at position ``pos + i``; MTP draft row *j* (depth *j + 1*) is decoded
    at position ``pos + j`` and compared with target row *j*.
    """
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.64, 0.36],
        horizontal_spacing=0.08,
        subplot_titles=("pre-norm residual norm by position", "draft vs target cosine by depth"),
    )
    c = trace.columns
    kept_x, kept_y, drop_x, drop_y, dr_x, dr_y, dr_d, cos_d, cos_v = [], [], [], [], [], [], [], [], []
    for i in range(trace.n_steps):
        pos, n_d, n_a = int(c["pos"][i]), int(c["n_drafted"][i]), int(c["n_accepted"][i])
        for r in range(n_d + 1):
            v = float(c["h_norm_target"][i, r])
            if math.isnan(v):
                continue
            (kept_x if r <= n_a else drop_x).append(pos + r)
            (kept_y if r <= n_a else drop_y).append(v)
        for j in range(n_d):
            v = float(c["h_norm_draft"][i, j])
            if not math.isnan(v):
                dr_x.append(pos + j)
                dr_y.append(v)
                dr_d.append(j + 1)
            cv = float(c["draft_target_cos"][i, j])
            if not math.isnan(cv):
                cos_d.append(j + 1)
                cos_v.append(cv)
    fig.add_trace(
        go.Scatter(
            name="target rows (kept)",
            x=kept_x,
            y=kept_y,
            mode="lines+markers",
            line={"color": PRIMARY, "width": 1},
            marker={"size": 4},
            hovertemplate="pos %{x}: %{y:.2f}<extra>target</extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            name="target rows (rolled back)",
            x=drop_x,
            y=drop_y,
            mode="markers",
            marker={"size": 5, "color": "#adb5bd", "symbol": "x"},
            hovertemplate="pos %{x}: %{y:.2f}<extra>rolled back</extra>",
        ),
        row=1,
        col=1,
    )
    for depth in sorted(set(dr_d)):  # one legend entry per depth: its colour's key
        at = [k for k, d in enumerate(dr_d) if d == depth]
        fig.add_trace(
            go.Scatter(
                name=f"MTP draft rows, depth {depth}",
                x=[dr_x[k] for k in at],
                y=[dr_y[k] for k in at],
                mode="markers",
                legendgroup="drafts",
                marker={"size": 6, "symbol": "diamond", "color": DEPTH_COLORS[(depth - 1) % len(DEPTH_COLORS)]},
                hovertemplate=f"pos %{{x}}, depth {depth}: %{{y:.2f}}<extra>draft</extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Box(
            name="cosine",
            x=cos_d,
            y=cos_v,
            boxpoints="outliers",
            marker_color="#9467bd",
            showlegend=False,
            hovertemplate="depth %{x}: %{y:.3f}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    step_pos = {int(s): int(p) for s, p in zip(c["step"], c["pos"])}
    _mark_changes(fig, settings_changes(trace), lambda ch: step_pos[ch.step], row=1, col=1)
    base_layout(fig, "hidden states: pre-norm residual norms and draft drift", height=400)
    fig.update_xaxes(title_text="position", row=1, col=1)
    fig.update_yaxes(title_text="‖h‖ (pre-norm)", row=1, col=1)
    fig.update_xaxes(title_text="draft depth", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="cosine", row=1, col=2)
    if not kept_x and not dr_x:
        empty(fig, "no hidden-state telemetry" + ("" if trace.n_steps else " yet"))
    return fig


# -- 4. recurrent snapshot slots -------------------------------------------------------------------
def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@takes(TRACE)
def slot_states(trace: Trace) -> np.ndarray:
    """``[slot, step]`` matrix: 0 not written, 1 written, 2 restored by the step's rollback.

    Slot *k* (0..``n_rs_seq``) holds the recurrent state *k* tokens before the end of the verify
    batch; a batch of ``n_drafted + 1`` tokens writes slots ``0..n_drafted`` and a rollback of *r*
    rejected drafts restores slot *r*. Non-recurrent models have no slots (all zeros).
    """
    c = trace.columns
    depth = trace.depth
    z = np.zeros((depth + 1, trace.n_steps), dtype=np.int8)
    if not trace.model.get("is_recurrent", False):
        return z
    for i in range(trace.n_steps):
        z[: min(int(c["n_drafted"][i]), depth) + 1, i] = 1
        slot = int(c["rs_slot"][i])
        if slot >= 0:
            z[slot, i] = 2
    return z


#: What a draft-mtp mode does to memory, beside the target's rollback (``model["mtp_mode"]``).
_MEMORY_NOTES = {
    "shared_memory": "<br>shared-memory MTP head: its drafts read the target's KV cache (at the position after the"
    " target's last) and write none of their own",
    "chained": "<br>chained MTP heads: each head keeps its own layer's rows in the MTP memory and rebuilds them over"
    " the draft at its depth",
}


@takes(TRACE)
def rs_slots(trace: Trace) -> go.Figure:
    """Heatmap steps × recurrent snapshot slots: slots each verify batch wrote and the slot its rollback
    restored, with the bytes each slot holds (``summary()['rs_slot_bytes']``); bars: restores per slot."""
    slot_bytes = trace.summary()["rs_slot_bytes"]
    depth = trace.depth
    if not trace.model.get("is_recurrent", False):
        fig = base_layout(go.Figure(), "recurrent snapshot slots", height=240)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return empty(
            fig,
            "not a recurrent model: rollback is plain KV removal, no snapshot slots"
            + _MEMORY_NOTES.get(trace.model.get("mtp_mode"), ""),
        )
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.78, 0.22],
        shared_yaxes=True,
        horizontal_spacing=0.03,
        subplot_titles=("slot use per step", "restores per slot"),
    )
    z = slot_states(trace)
    c = trace.columns
    hover = np.empty(z.shape, dtype=object)
    for k in range(depth + 1):
        for i in range(trace.n_steps):
            what = SLOT_STATES[z[k, i]]
            extra = f" (rollback of {k})" if z[k, i] == 2 else ""
            hover[k, i] = f"step {int(c['step'][i])} · slot {k}: {what}{extra}<br>{_bytes(slot_bytes)} per slot"
    scale = [
        [0.0, SLOT_COLORS[0]],
        [0.333, SLOT_COLORS[0]],
        [0.333, SLOT_COLORS[1]],
        [0.667, SLOT_COLORS[1]],
        [0.667, SLOT_COLORS[2]],
        [1.0, SLOT_COLORS[2]],
    ]
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=c["step"].tolist(),
            y=list(range(depth + 1)),
            zmin=-0.5,
            zmax=2.5,
            colorscale=scale,
            hovertext=hover,
            hovertemplate="%{hovertext}<extra></extra>",
            xgap=1,
            ygap=1,
            colorbar={"tickvals": [0, 1, 2], "ticktext": list(SLOT_STATES), "len": 0.8, "x": 1.02},
        ),
        row=1,
        col=1,
    )
    restores = np.bincount(c["rs_slot"][c["rs_slot"] >= 0], minlength=depth + 1)[: depth + 1]
    fig.add_trace(
        go.Bar(
            x=restores.tolist(),
            y=list(range(depth + 1)),
            orientation="h",
            marker_color=SLOT_COLORS[2],
            customdata=[_bytes(slot_bytes * k) for k in range(depth + 1)],
            showlegend=False,
            hovertemplate="slot %{y}: restored %{x}×<br>saves re-decoding %{y} tokens<extra></extra>",
        ),
        row=1,
        col=2,
    )
    _mark_changes(fig, settings_changes(trace), lambda ch: ch.step - 0.5, row=1, col=1)
    title = (
        f"recurrent snapshot slots — {_bytes(slot_bytes)} per slot; n_rs_seq={depth} snapshots cost "
        f"{_bytes(slot_bytes * depth)} beyond the live state"
    )
    base_layout(fig, title, height=max(260, 120 + 22 * (depth + 1)))
    fig.update_xaxes(title_text="step", row=1, col=1, **_step_ticks(trace.n_steps))
    fig.update_yaxes(title_text="slot (tokens back)", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="restores", row=1, col=2)
    if trace.n_steps == 0:
        empty(fig, "no steps yet")
    return fig


def _legend_per_column(fig: go.Figure, n_cols: int) -> None:
    """One legend under each subplot of a one-row figure, listing that subplot's traces only."""
    for col in range(1, n_cols + 1):
        key = "legend" if col == 1 else f"legend{col}"
        axis = "xaxis" if col == 1 else f"xaxis{col}"
        fig.update_layout(
            {
                key: {
                    "orientation": "v",
                    "x": fig.layout[axis].domain[0],
                    "xanchor": "left",
                    "y": -0.2,
                    "yanchor": "top",
                    "font": {"size": 11},
                }
            }
        )
        fig.update_traces(legend=key, col=col)


# -- 5. throughput ---------------------------------------------------------------------------------
def _rolling_sum(x: np.ndarray, window: int) -> np.ndarray:
    cs = np.concatenate([[0.0], np.cumsum(x, dtype=np.float64)])
    idx = np.arange(1, len(x) + 1)
    return cs[idx] - cs[np.maximum(idx - window, 0)]


@takes(TRACE)
def step_seconds(trace: Trace) -> np.ndarray:
    """Wall time of each step of ``trace``: the sum of its phases
    (:func:`mtp_explorer.core.metrics.step_seconds` of its columns)."""
    return metrics.step_seconds(trace.columns)


@takes(TRACE, baseline=OPTIONAL_TRACE)
def throughput(trace: Trace, baseline: Trace | None = None, *, window: int = 8) -> go.Figure:
    """Tokens/s over the steps (rolling over ``window`` steps), accepted length per step, and the time per
    token split into the engine's phases (draft / verify / catch-up / sample); with a plain (``n_max=0``)
    ``baseline`` trace, its tokens/s and the speedup."""
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.38, 0.32, 0.30],
        horizontal_spacing=0.08,
        subplot_titles=(f"tokens/s (rolling {window} steps)", "accepted length per step", "time per token"),
    )
    s = trace.summary()
    c = trace.columns
    steps = c["step"].tolist()
    label = run_label(trace.settings)
    if trace.n_steps:
        emitted = (c["n_accepted"] + 1).astype(np.float64)
        t = _rolling_sum(metrics.step_seconds(c), window)
        tps = np.divide(_rolling_sum(emitted, window), t, out=np.full_like(t, np.nan), where=t > 0)
        fig.add_trace(
            go.Scatter(
                name=f"{label} tokens/s",
                x=steps,
                y=tps.tolist(),
                mode="lines",
                line={"color": PRIMARY},
                hovertemplate="step %{x}: %{y:.0f} tok/s<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                name="accepted drafts",
                x=steps,
                y=c["n_accepted"].tolist(),
                marker_color=ORIGIN_COLORS["accepted"],
                hovertemplate="step %{x}: %{y} accepted<extra></extra>",
            ),
            row=1,
            col=2,
        )
        mean_len = _rolling_sum(c["n_accepted"].astype(np.float64), window) / np.minimum(
            np.arange(1, trace.n_steps + 1), window
        )
        fig.add_trace(
            go.Scatter(
                name=f"mean (rolling {window})",
                x=steps,
                y=mean_len.tolist(),
                mode="lines",
                line={"color": "#2b8a3e"},
                hovertemplate="step %{x}: %{y:.2f}<extra></extra>",
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                name="drafted",
                x=steps,
                y=c["n_drafted"].tolist(),
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 10, "color": "#495057"},
                hovertemplate="step %{x}: %{y} drafted<extra></extra>",
            ),
            row=1,
            col=2,
        )
    runs = [(label, s)]
    gain = math.nan
    if baseline is not None:
        b = baseline.summary()
        runs.append(("plain", b))
        gain = metrics.speedup(s["tokens_per_second"], b["tokens_per_second"])
        if b["tokens_per_second"] and not math.isnan(b["tokens_per_second"]):
            # a legend entry, not a label on the line: a label there runs into the line and the curve
            fig.add_trace(
                go.Scatter(
                    name=f"plain {b['tokens_per_second']:.0f} tok/s",
                    mode="lines",
                    x=[-0.5, max(trace.n_steps, 1) - 0.5],
                    y=[b["tokens_per_second"]] * 2,
                    line={"color": MUTED, "dash": "dot"},
                    hovertemplate="plain decoding: %{y:.0f} tok/s<extra></extra>",
                ),
                row=1,
                col=1,
            )
    for phase in PHASE_ORDER:
        ms = [r["phase_seconds"][phase] * 1e3 / r["n_tokens"] if r["n_tokens"] else 0.0 for _, r in runs]
        fig.add_trace(
            go.Bar(
                name=PHASE_LABELS[phase],
                x=[name for name, _ in runs],
                y=ms,
                marker_color=PHASE_COLORS[phase],
                hovertemplate=f"%{{x}} {PHASE_LABELS[phase]}: %{{y:.3f}} ms/token<extra></extra>",
            ),
            row=1,
            col=3,
        )
    changes = settings_changes(trace)
    _mark_changes(fig, changes, lambda ch: ch.step - 0.5, row=1, col=1)
    _mark_changes(fig, changes, lambda ch: ch.step - 0.5, row=1, col=2)
    parts = [
        f"{label} {s['tokens_per_second']:.0f} tok/s" if not math.isnan(s["tokens_per_second"]) else f"{label} –",
        f"mean accepted length {s['mean_accepted_length']:.2f}" if not math.isnan(s["mean_accepted_length"]) else "",
    ]
    if baseline is not None:
        parts.append(f"plain {runs[1][1]['tokens_per_second']:.0f} tok/s → speedup {gain:.2f}×")
    base_layout(fig, "throughput — " + " · ".join(p for p in parts if p), height=470)
    fig.update_layout(barmode="stack", bargap=0.15, margin={"b": 150})
    _legend_per_column(fig, 3)
    step_range = [-0.5, max(trace.n_steps, 1) - 0.5]
    fig.update_xaxes(title_text="step", range=step_range, row=1, col=1, **_step_ticks(trace.n_steps))
    fig.update_xaxes(title_text="step", range=step_range, row=1, col=2, **_step_ticks(trace.n_steps))
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="drafts", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="run", row=1, col=3)
    fig.update_yaxes(title_text="ms per token", row=1, col=3)
    if trace.n_steps == 0:
        empty(fig, "no steps yet")
    return fig


#: Every per-trace figure by name (``throughput`` also takes the baseline).
FIGURES: dict[str, Callable[..., go.Figure]] = {
    "token_timeline": token_timeline,
    "acceptance_by_depth": acceptance_by_depth,
    "accepted_length_histogram": accepted_length_histogram,
    "hidden_norms": hidden_norms,
    "rs_slots": rs_slots,
    "throughput": throughput,
}


# -- export ----------------------------------------------------------------------------------------
@takes(FIGURE)
def export(fig: go.Figure, path: str | Path, *, include_plotlyjs: bool | str = True) -> Path:
    """Write ``fig`` to ``path``: ``.html`` always works (self-contained unless ``include_plotlyjs="cdn"``);
    ``.png``, ``.svg``, ``.pdf`` and ``.jpg`` need the ``kaleido`` package, else :class:`ExportError`."""
    path = Path(path)
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in ("", ".html", ".htm"):
        path = path.with_suffix(".html") if suffix == "" else path
        fig.write_html(path, include_plotlyjs=include_plotlyjs, full_html=True)
        return path
    if suffix not in (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp"):
        raise ExportError(f"cannot export to {suffix!r}: use .html, or .png/.svg/.pdf/.jpg with kaleido")
    try:
        import kaleido  # noqa: F401
    except ImportError as exc:
        raise ExportError(
            f"exporting {path.name} needs the kaleido package (pip install kaleido) and a Chrome/Chromium; "
            "HTML export (.html) works without it"
        ) from exc
    try:
        fig.write_image(path)
    except Exception as exc:  # kaleido present but cannot render (e.g. no browser)
        raise ExportError(f"kaleido could not render {path.name}: {exc}") from exc
    return path
