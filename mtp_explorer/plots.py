"""Figures of a generation's trace: one function per figure, each ``plots.<name>(trace, ...) -> go.Figure``.

They need no widgets (the Explorer shows the same figures live) and export with :func:`export`.
Step-indexed figures mark the steps where ``n_max``, ``p_min`` or ``n_min`` changed (``set_params``
during a run); aggregate figures split their bars by settings segment when settings changed.

The what-if figures of :mod:`mtp_explorer.whatif_plots` (built from oracle traces, calibrations and
sweep/simulator tables rather than one trace) are re-exported here, so every figure is found in
``plots``: :func:`reliability_diagram`, :func:`sweep_heatmap`, :func:`speedup_ceiling`,
:func:`predicted_vs_measured`, :func:`drafter_comparison`, and the Explorer's what-if figures
:func:`predicted_acceptance_by_depth` and :func:`predicted_speed_by_n_max`. They are not in :data:`FIGURES`,
which holds the per-trace figures only.
"""

from __future__ import annotations

import dataclasses
import html
import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .errors import MtpExplorerError
from .trace import PHASES, STOP_REASONS, Trace, drafter_name
from .whatif_plots import (  # re-exported (whatif_plots imports calibration/oracle, never this module)
    drafter_comparison,
    predicted_acceptance_by_depth,
    predicted_speed_by_n_max,
    predicted_vs_measured,
    reliability_diagram,
    speedup_ceiling,
    sweep_heatmap,
)

__all__ = [
    "ORIGIN_COLORS", "ExportError", "SettingsChange", "settings_changes", "settings_segments",
    "token_timeline", "acceptance_by_depth", "accepted_length_histogram", "hidden_norms", "rs_slots",
    "throughput", "export", "FIGURES", "slot_states", "step_seconds", "speedup",
    # what-if figures, from whatif_plots
    "reliability_diagram", "sweep_heatmap", "speedup_ceiling", "predicted_vs_measured", "drafter_comparison",
    "predicted_acceptance_by_depth", "predicted_speed_by_n_max",
]

SETTINGS: tuple[str, ...] = ("n_max", "p_min", "n_min")

#: Background colours of tokens in the timeline, by origin (``Trace.token_origin``) plus rejected drafts.
ORIGIN_COLORS: dict[str, str] = {
    "accepted": "#b7e4c7",    # a verified draft
    "correction": "#ffd8a8",  # the target's token after a draft (correction, or bonus after a full accept)
    "plain": "#e9ecef",       # the target's token in a step without a draft
    "rejected": "#f5c2c7",    # a draft the target disagreed with (rolled back)
}
ORIGIN_LABELS: dict[str, str] = {
    "accepted": "accepted draft",
    "correction": "target correction / bonus",
    "plain": "plain (no draft)",
    "rejected": "rejected draft",
}
PHASE_COLORS: dict[str, str] = {"draft": "#4c78a8", "verify": "#f58518", "catchup": "#54a24b", "sample": "#b279a2"}
PHASE_LABELS: dict[str, str] = {"draft": "draft", "verify": "verify", "catchup": "catch-up", "sample": "sample"}
CHANGE_COLOR = "#d62728"
DEPTH_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
SLOT_STATES = ("not written", "written (snapshot)", "restored (rollback)")
SLOT_COLORS = ("#f1f3f5", "#a5d8ff", "#e8590c")

Piece = Callable[[int], str]


class ExportError(MtpExplorerError, RuntimeError):
    """A figure could not be exported (e.g. PNG without kaleido)."""


# -- settings changes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SettingsChange:
    """The settings in force changed at ``step`` (the first step run with the new values)."""

    step: int
    before: dict
    after: dict

    @property
    def label(self) -> str:
        parts = [f"{k} {_fmt_setting(k, self.before[k])}→{_fmt_setting(k, self.after[k])}"
                 for k in SETTINGS if self.before[k] != self.after[k]]
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class SettingsSegment:
    """Consecutive steps ``start <= step < stop`` run with the same settings."""

    start: int
    stop: int
    settings: dict

    @property
    def label(self) -> str:
        s = ", ".join(f"{k}={_fmt_setting(k, self.settings[k])}" for k in SETTINGS)
        return f"steps {self.start}–{self.stop - 1}: {s}"


def _fmt_setting(name: str, value) -> str:
    return f"{value:.2f}" if name == "p_min" else str(int(value))


def _settings_at(trace: Trace, i: int) -> dict:
    c = trace.columns
    return {"n_max": int(c["n_max"][i]), "p_min": round(float(c["p_min"][i]), 6), "n_min": int(c["n_min"][i])}


def settings_changes(trace: Trace) -> list[SettingsChange]:
    """Every step where ``n_max``, ``p_min`` or ``n_min`` differ from the step before."""
    out = []
    for i in range(1, trace.n_steps):
        before, after = _settings_at(trace, i - 1), _settings_at(trace, i)
        if before != after:
            out.append(SettingsChange(step=int(trace.columns["step"][i]), before=before, after=after))
    return out


def settings_segments(trace: Trace) -> list[SettingsSegment]:
    """The trace cut into runs of steps with the same settings (one segment if they never changed)."""
    if trace.n_steps == 0:
        return []
    bounds = [0] + [i for i in range(1, trace.n_steps) if _settings_at(trace, i) != _settings_at(trace, i - 1)]
    bounds.append(trace.n_steps)
    return [SettingsSegment(a, b, _settings_at(trace, a)) for a, b in zip(bounds[:-1], bounds[1:])]


def _mark_changes(fig: go.Figure, changes: Sequence[SettingsChange], x_of: Callable[[SettingsChange], float],
                  row: int | None = None, col: int | None = None) -> None:
    """Dashed vertical lines at the settings changes, labelled with what changed."""
    for ch in changes:
        kw = {"row": row, "col": col} if row is not None else {}
        fig.add_vline(x=x_of(ch), line_dash="dash", line_color=CHANGE_COLOR, line_width=1,
                      annotation_text=ch.label, annotation_position="top left",
                      annotation_font_size=10, annotation_font_color=CHANGE_COLOR, **kw)


def _empty(fig: go.Figure, text: str, **kw) -> go.Figure:
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"size": 13, "color": "#666"}, **kw)
    return fig


def _base_layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    """Title, height and the common look; the legend sits below the x-axis titles."""
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=height, template="plotly_white",
                      margin={"l": 55, "r": 20, "t": 70, "b": 90},
                      legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0})
    return fig


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


_DRAFTER_LABELS = {"mtp": "MTP", "ngram": "n-gram"}


def _confidence(trace: Trace, i: int, j: int, lookup: Piece) -> str:
    """The hover lines on a draft token's confidence: the MTP head's, with its top-k, or none (n-gram)."""
    p = float(trace.columns["draft_prob"][i, j])
    if math.isnan(p):
        return "no confidence (n-gram look-up: proposed what followed the matched n-gram)"
    return f"draft confidence {p:.3f}<br>top-k:<br>{_alternatives(trace, i, j, lookup)}"


# -- 1. token timeline -----------------------------------------------------------------------------
@dataclasses.dataclass
class _Cell:
    kind: str          # accepted | correction | plain | rejected
    text: str          # visible text
    hover: str
    step: int
    newline: bool      # the token ends a line
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
        who = _DRAFTER_LABELS.get(drafter_name(c, i), "")
        for j in range(n_a):
            text = trace.pieces[g]
            cells.append(_Cell("accepted", _visible(text), (
                f"<b>{_escape(repr(text))}</b> accepted {who} draft<br>{head} · depth {j + 1}<br>"
                f"{_confidence(trace, i, j, lookup)}"), step, "\n" in text))
            g += 1
        for j in range(n_a, n_d):
            tok = int(c["drafted"][i, j])
            text = lookup(tok)
            target = int(c["target_tokens"][i, j])
            cells.append(_Cell("rejected", _visible(text), (
                f"<b>{_escape(repr(text))}</b> rejected {who} draft (rolled back)<br>{head} · depth {j + 1}<br>"
                f"target wanted {_escape(repr(lookup(target)))}<br>"
                f"{_confidence(trace, i, j, lookup)}"), step, False))
        text = trace.pieces[g]
        if n_d == 0:
            kind, what = "plain", "target token (no draft)"
        elif n_a == n_d:
            kind, what = "correction", f"bonus token after {n_d} accepted drafts"
        else:
            kind, what = "correction", f"target correction at depth {n_a + 1}"
        stop = STOP_REASONS[int(c["stop_reason"][i])]
        cells.append(_Cell(kind, _visible(text), (
            f"<b>{_escape(repr(text))}</b> {what}<br>{head}<br>"
            f"drafted {n_d}, accepted {n_a}, rollback {int(c['rollback'][i])}<br>"
            f"drafting stopped by {stop}"), step, "\n" in text))
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


def token_timeline(trace: Trace, piece: Piece | None = None, *, width_chars: int = 80) -> go.Figure:
    """The generated text, token by token, coloured by origin.

    Accepted drafts, target corrections (or bonus tokens) and plain tokens are the text itself; each
    step's rejected drafts are shown struck through just before the correction that replaced them.
    Hover: step, depth, draft confidence and the draft's top-k alternatives with probabilities.
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
        fig.add_trace(go.Bar(
            name=ORIGIN_LABELS[kind], orientation="h",
            y=[c.line for c in sel], base=[c.col for c in sel], x=[max(1, len(c.text)) for c in sel],
            text=text, hovertext=[c.hover for c in sel], hovertemplate="%{hovertext}<extra></extra>",
            customdata=[c.step for c in sel],
            marker={"color": ORIGIN_COLORS[kind], "line": {"color": "white", "width": 1}},
            textposition="inside", insidetextanchor="middle", constraintext="none", textangle=0,
            textfont={"family": "monospace", "size": 12, "color": "#777" if kind == "rejected" else "#111"},
            width=0.8, showlegend=True,
        ))
    changes = settings_changes(trace)
    first_cell = {}
    for c in cells:
        first_cell.setdefault(c.step, c)
    marks = [(first_cell[ch.step], ch) for ch in changes if ch.step in first_cell]
    fig.add_trace(go.Scatter(
        name="settings changed", x=[c.col + 0.2 for c, _ in marks], y=[c.line - 0.5 for c, _ in marks],
        mode="markers", marker={"symbol": "triangle-down", "size": 9, "color": CHANGE_COLOR},
        hovertext=[f"step {ch.step}: {ch.label}" for _, ch in marks], hovertemplate="%{hovertext}<extra></extra>",
        showlegend=bool(marks),
    ))
    s = trace.summary()
    title = (f"token timeline — {s['n_tokens']} tokens in {s['n_steps']} steps, "
             f"{s['n_accepted']}/{s['n_drafted']} drafts accepted")
    _base_layout(fig, title, height=140 + 24 * max(n_lines, 1))
    fig.update_layout(barmode="overlay", bargap=0.1, hoverlabel={"font_family": "monospace", "align": "left"},
                      legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 11}},
                      margin={"l": 20, "r": 20, "t": 70, "b": 20}, uniformtext={"minsize": 9, "mode": "show"})
    fig.update_xaxes(range=[0, width_chars], showgrid=False, showticklabels=False, zeroline=False, fixedrange=True)
    fig.update_yaxes(range=[max(n_lines, 1) - 0.5, -0.7], showgrid=False, showticklabels=False,
                     zeroline=False)
    if not cells:
        _empty(fig, "no tokens yet")
    return fig


# -- 2. acceptance ---------------------------------------------------------------------------------
def _acceptance(n_drafted: np.ndarray, n_accepted: np.ndarray, depth: int) -> tuple[list, list, list]:
    """Per depth 1..depth: acceptance rate, steps that reached it, steps that accepted it."""
    rate, reached, accepted = [], [], []
    for d in range(1, depth + 1):
        r = n_drafted >= d
        a = int((n_accepted[r] >= d).sum())
        reached.append(int(r.sum()))
        accepted.append(a)
        rate.append(a / int(r.sum()) if r.any() else math.nan)
    return rate, reached, accepted


def acceptance_by_depth(trace: Trace) -> go.Figure:
    """Bars: the fraction of steps that drafted depth *d* in which the target accepted it (one group per
    settings segment when the settings changed during the run)."""
    fig = go.Figure()
    c = trace.columns
    segments = settings_segments(trace)
    max_depth = int(c["n_drafted"].max()) if trace.n_steps else 0
    for k, seg in enumerate(segments):
        sl = slice(seg.start, seg.stop)
        rate, reached, accepted = _acceptance(c["n_drafted"][sl], c["n_accepted"][sl], max_depth)
        fig.add_trace(go.Bar(
            name=seg.label if len(segments) > 1 else "acceptance",
            x=list(range(1, max_depth + 1)), y=rate,
            customdata=np.column_stack([reached, accepted]) if max_depth else None,
            hovertemplate="depth %{x}: %{y:.2f}<br>accepted in %{customdata[1]} of %{customdata[0]} steps"
                          "<extra></extra>",
            marker_color=DEPTH_COLORS[k % len(DEPTH_COLORS)] if len(segments) > 1 else "#4c78a8",
            text=[("" if math.isnan(v) else f"{v:.2f}") for v in rate], textposition="outside",
        ))
    s = trace.summary()
    rate_all = s["acceptance_rate"]
    title = "acceptance by depth" + ("" if math.isnan(rate_all) else f" — overall {rate_all:.2f}")
    _base_layout(fig, title, height=340)
    fig.update_layout(barmode="group", showlegend=len(segments) > 1)
    fig.update_xaxes(title="draft depth", dtick=1)
    fig.update_yaxes(title="accepted / reached", range=[0, 1.1])
    if max_depth == 0:
        _empty(fig, "no drafts" if trace.n_steps else "no steps yet")
    return fig


def accepted_length_histogram(trace: Trace) -> go.Figure:
    """Bars: how many steps accepted 0, 1, 2, ... drafts (one group per settings segment)."""
    fig = go.Figure()
    c = trace.columns
    segments = settings_segments(trace)
    top = int(c["n_max"].max()) if trace.n_steps else 0
    x = list(range(0, top + 1))
    for k, seg in enumerate(segments):
        counts = np.bincount(c["n_accepted"][seg.start:seg.stop], minlength=top + 1)[: top + 1]
        n = seg.stop - seg.start
        fig.add_trace(go.Bar(
            name=seg.label if len(segments) > 1 else "steps", x=x, y=counts.tolist(),
            customdata=(counts / n).tolist(),
            hovertemplate="%{x} accepted: %{y} steps (%{customdata:.0%})<extra></extra>",
            marker_color=DEPTH_COLORS[k % len(DEPTH_COLORS)] if len(segments) > 1 else "#54a24b",
        ))
    mean = trace.summary()["mean_accepted_length"]
    title = "accepted length per step" + ("" if math.isnan(mean) else f" — mean {mean:.2f}")
    _base_layout(fig, title, height=340)
    fig.update_layout(barmode="group", showlegend=len(segments) > 1)
    fig.update_xaxes(title="accepted drafts in a step", dtick=1)
    fig.update_yaxes(title="steps")
    if trace.n_steps == 0:
        _empty(fig, "no steps yet")
    return fig


# -- 3. hidden-state norms -------------------------------------------------------------------------
def hidden_norms(trace: Trace) -> go.Figure:
    """Left: the L2 norm of the pre-norm residual stream by position, for the target rows kept after
    verification, the target rows removed by rollback, and the MTP draft rows (colour: depth).
    Right: cosine between each MTP draft hidden state and the target's at the same position, by depth.

    Target row *i* of a step sits at position ``pos + i``; MTP draft row *j* (depth *j + 1*) is decoded
    at position ``pos + j`` and compared with target row *j*.
    """
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.08,
                        subplot_titles=("pre-norm residual norm by position", "draft vs target cosine by depth"))
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
    fig.add_trace(go.Scatter(name="target rows (kept)", x=kept_x, y=kept_y, mode="lines+markers",
                             line={"color": "#4c78a8", "width": 1}, marker={"size": 4},
                             hovertemplate="pos %{x}: %{y:.2f}<extra>target</extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(name="target rows (rolled back)", x=drop_x, y=drop_y, mode="markers",
                             marker={"size": 5, "color": "#adb5bd", "symbol": "x"},
                             hovertemplate="pos %{x}: %{y:.2f}<extra>rolled back</extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(name="MTP draft rows (colour: depth)", x=dr_x, y=dr_y, mode="markers",
                             customdata=dr_d,
                             marker={"size": 6, "symbol": "diamond",
                                     "color": [DEPTH_COLORS[(d - 1) % len(DEPTH_COLORS)] for d in dr_d]},
                             hovertemplate="pos %{x}, depth %{customdata}: %{y:.2f}<extra>draft</extra>"),
                  row=1, col=1)
    fig.add_trace(go.Box(name="cosine", x=cos_d, y=cos_v, boxpoints="outliers", marker_color="#9467bd",
                         showlegend=False, hovertemplate="depth %{x}: %{y:.3f}<extra></extra>"), row=1, col=2)
    step_pos = {int(s): int(p) for s, p in zip(c["step"], c["pos"])}
    _mark_changes(fig, settings_changes(trace), lambda ch: step_pos[ch.step], row=1, col=1)
    _base_layout(fig, "hidden states: pre-norm residual norms and draft drift", height=400)
    fig.update_xaxes(title_text="position", row=1, col=1)
    fig.update_yaxes(title_text="‖h‖ (pre-norm)", row=1, col=1)
    fig.update_xaxes(title_text="draft depth", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="cosine", row=1, col=2)
    if not kept_x and not dr_x:
        _empty(fig, "no hidden-state telemetry" + ("" if trace.n_steps else " yet"))
    return fig


# -- 4. recurrent snapshot slots -------------------------------------------------------------------
def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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


def rs_slots(trace: Trace) -> go.Figure:
    """Heatmap steps × recurrent snapshot slots: slots each verify batch wrote and the slot its rollback
    restored, with the bytes each slot holds (``summary()['rs_slot_bytes']``); bars: restores per slot."""
    s = trace.summary()
    slot_bytes = s["rs_slot_bytes"]
    depth = trace.depth
    if not trace.model.get("is_recurrent", False):
        fig = _base_layout(go.Figure(), "recurrent snapshot slots", height=240)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return _empty(fig, "not a recurrent model: rollback is plain KV removal, no snapshot slots")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.78, 0.22], shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=("slot use per step", "restores per slot"))
    z = slot_states(trace)
    c = trace.columns
    hover = np.empty(z.shape, dtype=object)
    for k in range(depth + 1):
        for i in range(trace.n_steps):
            what = SLOT_STATES[z[k, i]]
            extra = f" (rollback of {k})" if z[k, i] == 2 else ""
            hover[k, i] = f"step {int(c['step'][i])} · slot {k}: {what}{extra}<br>{_bytes(slot_bytes)} per slot"
    scale = [[0.0, SLOT_COLORS[0]], [0.333, SLOT_COLORS[0]], [0.333, SLOT_COLORS[1]], [0.667, SLOT_COLORS[1]],
             [0.667, SLOT_COLORS[2]], [1.0, SLOT_COLORS[2]]]
    fig.add_trace(go.Heatmap(
        z=z, x=c["step"].tolist(), y=list(range(depth + 1)), zmin=-0.5, zmax=2.5, colorscale=scale,
        hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", xgap=1, ygap=1,
        colorbar={"tickvals": [0, 1, 2], "ticktext": list(SLOT_STATES), "len": 0.8, "x": 1.02},
    ), row=1, col=1)
    restores = np.bincount(c["rs_slot"][c["rs_slot"] >= 0], minlength=depth + 1)[: depth + 1]
    fig.add_trace(go.Bar(
        x=restores.tolist(), y=list(range(depth + 1)), orientation="h", marker_color=SLOT_COLORS[2],
        customdata=[_bytes(slot_bytes * k) for k in range(depth + 1)], showlegend=False,
        hovertemplate="slot %{y}: restored %{x}×<br>saves re-decoding %{y} tokens<extra></extra>",
    ), row=1, col=2)
    _mark_changes(fig, settings_changes(trace), lambda ch: ch.step - 0.5, row=1, col=1)
    title = (f"recurrent snapshot slots — {_bytes(slot_bytes)} per slot; n_rs_seq={depth} snapshots cost "
             f"{_bytes(slot_bytes * depth)} beyond the live state")
    _base_layout(fig, title, height=max(260, 120 + 22 * (depth + 1)))
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="slot (tokens back)", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="restores", row=1, col=2)
    if trace.n_steps == 0:
        _empty(fig, "no steps yet")
    return fig


# -- 5. throughput ---------------------------------------------------------------------------------
def _rolling_sum(x: np.ndarray, window: int) -> np.ndarray:
    cs = np.concatenate([[0.0], np.cumsum(x, dtype=np.float64)])
    idx = np.arange(1, len(x) + 1)
    return cs[idx] - cs[np.maximum(idx - window, 0)]


def step_seconds(trace: Trace) -> np.ndarray:
    """Wall time of each step: the sum of its phases (catch-up, draft, verify, sample)."""
    c = trace.columns
    return sum(c[f"t_{p}_ns"].astype(np.float64) for p in PHASES) / 1e9 if trace.n_steps else np.zeros(0)


def throughput(trace: Trace, baseline: Trace | None = None, *, window: int = 8) -> go.Figure:
    """Tokens/s over the steps (rolling over ``window`` steps), accepted length per step, and the time per
    token split into draft / verify / catch-up / sample; with a plain (``n_max=0``) ``baseline`` trace,
    its tokens/s and the speedup."""
    fig = make_subplots(rows=1, cols=3, column_widths=[0.38, 0.32, 0.30], horizontal_spacing=0.08,
                        subplot_titles=(f"tokens/s (rolling {window} steps)", "accepted length per step",
                                        "time per token"))
    s = trace.summary()
    c = trace.columns
    steps = c["step"].tolist()
    if trace.n_steps:
        emitted = (c["n_accepted"] + 1).astype(np.float64)
        secs = step_seconds(trace)
        t = _rolling_sum(secs, window)
        tps = np.divide(_rolling_sum(emitted, window), t, out=np.full_like(t, np.nan), where=t > 0)
        fig.add_trace(go.Scatter(name="MTP tokens/s", x=steps, y=tps.tolist(), mode="lines",
                                 line={"color": "#4c78a8"}, hovertemplate="step %{x}: %{y:.0f} tok/s<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(name="accepted drafts", x=steps, y=c["n_accepted"].tolist(), marker_color="#b7e4c7",
                             hovertemplate="step %{x}: %{y} accepted<extra></extra>"), row=1, col=2)
        mean_len = _rolling_sum(c["n_accepted"].astype(np.float64), window) / np.minimum(
            np.arange(1, trace.n_steps + 1), window)
        fig.add_trace(go.Scatter(name=f"mean (rolling {window})", x=steps, y=mean_len.tolist(), mode="lines",
                                 line={"color": "#2b8a3e"}, hovertemplate="step %{x}: %{y:.2f}<extra></extra>"),
                      row=1, col=2)
        fig.add_trace(go.Scatter(name="drafted", x=steps, y=c["n_drafted"].tolist(), mode="markers",
                                 marker={"symbol": "line-ew-open", "size": 10, "color": "#495057"},
                                 hovertemplate="step %{x}: %{y} drafted<extra></extra>"), row=1, col=2)
    runs = [("MTP", trace, s)]
    speedup = math.nan
    if baseline is not None:
        b = baseline.summary()
        runs.append(("plain", baseline, b))
        if b["tokens_per_second"] and not math.isnan(b["tokens_per_second"]):
            speedup = s["tokens_per_second"] / b["tokens_per_second"]
            fig.add_hline(y=b["tokens_per_second"], line_dash="dot", line_color="#868e96", row=1, col=1,
                          annotation_text=f"plain {b['tokens_per_second']:.0f} tok/s",
                          annotation_position="bottom right", annotation_font_size=10)
    for phase in ("draft", "verify", "catchup", "sample"):
        ms = [r[2]["phase_seconds"][phase] * 1e3 / r[2]["n_tokens"] if r[2]["n_tokens"] else 0.0 for r in runs]
        fig.add_trace(go.Bar(name=PHASE_LABELS[phase], x=[r[0] for r in runs], y=ms,
                             marker_color=PHASE_COLORS[phase],
                             hovertemplate=f"%{{x}} {PHASE_LABELS[phase]}: %{{y:.3f}} ms/token<extra></extra>"),
                      row=1, col=3)
    changes = settings_changes(trace)
    _mark_changes(fig, changes, lambda ch: ch.step - 0.5, row=1, col=1)
    _mark_changes(fig, changes, lambda ch: ch.step - 0.5, row=1, col=2)
    parts = [f"MTP {s['tokens_per_second']:.0f} tok/s" if not math.isnan(s["tokens_per_second"]) else "MTP –",
             f"mean accepted length {s['mean_accepted_length']:.2f}" if not math.isnan(s["mean_accepted_length"])
             else ""]
    if baseline is not None:
        parts.append(f"plain {runs[1][2]['tokens_per_second']:.0f} tok/s → speedup {speedup:.2f}×")
    _base_layout(fig, "throughput — " + " · ".join(p for p in parts if p), height=400)
    fig.update_layout(barmode="stack", bargap=0.15)
    step_range = [-0.5, max(trace.n_steps, 1) - 0.5]
    fig.update_xaxes(title_text="step", range=step_range, row=1, col=1)
    fig.update_xaxes(title_text="step", range=step_range, row=1, col=2)
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="drafts", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="ms per token", row=1, col=3)
    if trace.n_steps == 0:
        _empty(fig, "no steps yet")
    return fig


def speedup(trace: Trace, baseline: Trace) -> float:
    """Decode tokens/s of ``trace`` over that of the plain ``baseline`` (NaN if either is unknown)."""
    a, b = trace.summary()["tokens_per_second"], baseline.summary()["tokens_per_second"]
    return a / b if b and not math.isnan(b) else math.nan


#: Every figure by name (``throughput`` also takes the baseline).
FIGURES: dict[str, Callable[..., go.Figure]] = {
    "token_timeline": token_timeline,
    "acceptance_by_depth": acceptance_by_depth,
    "accepted_length_histogram": accepted_length_histogram,
    "hidden_norms": hidden_norms,
    "rs_slots": rs_slots,
    "throughput": throughput,
}


# -- export ----------------------------------------------------------------------------------------
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
