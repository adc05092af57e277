"""mtp_explorer.plots: every figure built from real traces of SYNTHETIC models, checked against the
trace's own numbers; HTML export; the kaleido error."""

from __future__ import annotations

import sys

import numpy as np
import plotly.graph_objects as go
import pytest
from conftest import SHORT_NGRAM

import mtp_explorer as mx
from mtp_explorer import plots
from mtp_explorer.core.drafters import MODES
from mtp_explorer.core.schema import PHASES
from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe
from mtp_explorer.ui.figure_sync import changed_properties, sync_figure
from mtp_explorer.viz import trace_figures, whatif_figures
from mtp_explorer.widgets import LiveTrace

PROMPT = "def fib(n):"
CHANGE_AT = 10  # set_params after this step: the change applies from step CHANGE_AT + 1


@pytest.fixture(scope="module")
def session(model_mixed, model_synthetic_draft):
    with mx.Session.open(
        model_mixed, n_ctx=1024, n_rs_seq=8, topk=5, threads=1, draft_model=model_synthetic_draft
    ) as s:
        yield s


@pytest.fixture(scope="module")
def changed(session) -> mx.Trace:
    """A trace whose settings change mid-run: n_max 3 -> 5, p_min 0 -> 0.3."""
    for step in session.stream(PROMPT, max_tokens=120, n_max=3, p_min=0.0):
        if step.step == CHANGE_AT:
            session.set_params(n_max=5, p_min=0.3)
    return session.last_trace


@pytest.fixture(scope="module")
def steady(session) -> mx.Trace:
    return session.generate(PROMPT, max_tokens=120, n_max=4, p_min=0.0)


@pytest.fixture(scope="module")
def plain(session) -> mx.Trace:
    return session.generate(PROMPT, max_tokens=120, n_max=0)


def _trace(fig: go.Figure, name: str):
    (trace,) = [t for t in fig.data if t.name == name]
    return trace


def test_settings_changes_and_segments(changed, steady):
    (ch,) = plots.settings_changes(changed)
    assert ch.step == CHANGE_AT + 1
    assert ch.before == {"n_max": 3, "p_min": 0.0, "n_min": 0}
    assert ch.after["n_max"] == 5 and ch.after["p_min"] == pytest.approx(0.3)
    assert ch.label == "n_max 3→5, p_min 0.00→0.30"
    segs = plots.settings_segments(changed)
    assert [(s.start, s.stop) for s in segs] == [(0, CHANGE_AT + 1), (CHANGE_AT + 1, changed.n_steps)]
    assert plots.settings_changes(steady) == []
    assert len(plots.settings_segments(steady)) == 1


def test_token_timeline_marks_every_token(session, changed):
    fig = plots.token_timeline(changed, session.piece)
    c = changed.columns
    accepted, correction, plain_, rejected = (
        _trace(fig, plots.ORIGIN_LABELS[k]) for k in ("accepted", "correction", "plain", "rejected")
    )
    origin = changed.token_origin
    assert len(accepted.x) == (origin == "accepted").sum() == int(c["n_accepted"].sum())
    assert len(correction.x) == (origin == "correction").sum()
    assert len(plain_.x) == (origin == "plain").sum()
    assert len(rejected.x) == int(c["rollback"].sum()) > 0
    assert all(t.startswith("<s>") and t.endswith("</s>") for t in rejected.text)
    assert all("draft confidence" in h and "top-k" in h for h in accepted.hovertext)
    assert all("target wanted" in h for h in rejected.hovertext)
    # read in order (line, column), the non-rejected cells spell the generated text
    cells = sorted((y, b, t) for bar in (accepted, correction, plain_) for y, b, t in zip(bar.y, bar.base, bar.text))
    shown = "".join(t for _, _, t in cells).replace("\u00a0", " ")
    expected = "".join(trace_figures._escape(trace_figures._visible(p)) for p in changed.pieces).replace("\u00a0", " ")
    assert shown == expected
    # no two cells overlap on a line
    spans = sorted(
        (y, b, b + w) for bar in (accepted, correction, plain_, rejected) for y, b, w in zip(bar.y, bar.base, bar.x)
    )
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))
    marks = fig.data[-1]
    assert marks.name == "settings changed" and len(marks.x) == 1
    assert marks.hovertext[0] == f"step {CHANGE_AT + 1}: n_max 3→5, p_min 0.00→0.30"
    assert f"{len(changed.tokens)} tokens in {changed.n_steps} steps" in fig.layout.title.text


def test_token_timeline_hover_shows_alternatives_with_probabilities(session, steady):
    fig = plots.token_timeline(steady, session.piece)
    accepted = _trace(fig, plots.ORIGIN_LABELS["accepted"])
    i = int(np.argmax(steady.columns["n_accepted"] > 0))  # first step with an accepted draft
    hover = accepted.hovertext[0]
    p = float(steady.columns["draft_prob"][i, 0])
    assert f"draft confidence {p:.3f}" in hover
    top = int(steady.columns["topk_ids"][i, 0, 0])
    assert repr(session.piece(top)).replace(" ", "\u00a0") in hover.replace("&#x27;", "'")
    assert f"{float(steady.columns['topk_probs'][i, 0, 0]):.2f}" in hover


def test_token_timeline_hover_names_the_drafter(session, steady):
    accepted = _trace(plots.token_timeline(steady, session.piece), plots.ORIGIN_LABELS["accepted"])
    assert all("accepted MTP draft" in h for h in accepted.hovertext)
    t = session.generate(
        "x = [1, 2, 3]\nx = [1, 2, 3]\nx = [1, 2", max_tokens=32, n_max=4, drafter="ngram-simple", **SHORT_NGRAM
    )
    assert (t.columns["n_accepted"] > 0).any(), "the repeated prompt should get n-gram drafts accepted"
    fig = plots.token_timeline(t, session.piece)
    accepted = _trace(fig, plots.ORIGIN_LABELS["accepted"])
    assert accepted.hovertext and all("accepted n-gram draft" in h for h in accepted.hovertext)
    # an n-gram draft has no confidence: the hover says so instead of printing nan
    assert all("no confidence" in h and "nan" not in h for h in accepted.hovertext)


def test_token_timeline_without_piece_names_unknown_ids(changed):
    fig = plots.token_timeline(changed)
    rejected = _trace(fig, plots.ORIGIN_LABELS["rejected"])
    known = set(changed.pieces)
    texts = [t[3:-4] for t in rejected.text]
    assert any(t.startswith("⟨") for t in texts) or all(t in known for t in texts)


def test_acceptance_by_depth_matches_summary(steady, changed):
    fig = plots.acceptance_by_depth(steady)
    (bar,) = fig.data
    by_depth = steady.summary()["acceptance_by_depth"]
    max_depth = int(steady.columns["n_drafted"].max())
    assert list(bar.x) == list(range(1, max_depth + 1))
    np.testing.assert_allclose(np.array(bar.y, dtype=float), by_depth[:max_depth])
    assert not fig.layout.showlegend
    fig2 = plots.acceptance_by_depth(changed)
    assert len(fig2.data) == 2 and fig2.layout.barmode == "group"
    assert "n_max=3" in fig2.data[0].name and "n_max=5" in fig2.data[1].name


def test_accepted_length_histogram_counts_steps(steady, changed):
    (bar,) = plots.accepted_length_histogram(steady).data
    assert sum(bar.y) == steady.n_steps
    assert list(bar.y) == [int((steady.columns["n_accepted"] == k).sum()) for k in bar.x]
    fig = plots.accepted_length_histogram(changed)
    assert [sum(b.y) for b in fig.data] == [CHANGE_AT + 1, changed.n_steps - CHANGE_AT - 1]
    mean = changed.summary()["mean_accepted_length"]
    assert f"mean {mean:.2f}" in fig.layout.title.text


def test_hidden_norms_points_by_position_and_depth(changed):
    fig = plots.hidden_norms(changed)
    c = changed.columns
    kept, dropped, *drafts, cos = fig.data
    assert len(kept.x) == int((c["n_accepted"] + 1).sum())
    assert len(dropped.x) == int(c["rollback"].sum())
    assert sum(len(d.x) for d in drafts) == len(cos.y) == int(c["n_drafted"].sum())
    # the colour key: one legend entry per depth, each its own colour
    assert [d.name for d in drafts] == [f"MTP draft rows, depth {k}" for k in range(1, int(c["n_drafted"].max()) + 1)]
    assert len({d.marker.color for d in drafts}) == len(drafts) and all(d.showlegend is not False for d in drafts)
    assert list(kept.x) == sorted(kept.x) and len(set(kept.x)) == len(kept.x)  # one kept row per position
    assert max(cos.x) == int(c["n_drafted"].max())
    assert all(-1.0 - 1e-5 <= v <= 1.0 + 1e-5 for v in cos.y)
    assert kept.x[0] == int(c["pos"][0])
    vlines = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert len(vlines) == 1 and vlines[0].x0 == int(c["pos"][CHANGE_AT + 1])


def test_rs_slots_heatmap(changed):
    fig = plots.rs_slots(changed)
    heat, bars = fig.data
    z = np.array(heat.z)
    c = changed.columns
    assert z.shape == (changed.depth + 1, changed.n_steps)
    written = (z >= 1).sum(axis=0)
    np.testing.assert_array_equal(written, c["n_drafted"] + 1)
    rolled = np.flatnonzero(c["rollback"] > 0)
    assert (z[c["rollback"][rolled], rolled] == 2).all()
    assert (z == 2).sum() == len(rolled)
    assert sum(bars.x) == len(rolled)
    slot_bytes = changed.summary()["rs_slot_bytes"]
    assert slot_bytes > 0 and f"{slot_bytes / 1024:.1f} KiB per slot" in fig.layout.title.text
    assert len([s for s in fig.layout.shapes if s.line.dash == "dash"]) == 1


def test_step_axes_tick_whole_steps(session, changed):
    """After a few steps the step axes read 0, 1, 2 (not -0.5, 0.5, 1.5); a long run gets round steps apart."""
    short = session.generate(PROMPT, max_tokens=6, n_max=1)
    assert 1 <= short.n_steps <= 6
    for fig, axes in ((plots.rs_slots(short), ("xaxis",)), (plots.throughput(short), ("xaxis", "xaxis2"))):
        for axis in axes:
            ax = fig.layout[axis]
            assert (ax.tickmode, ax.tick0, ax.dtick) == ("linear", 0, 1), axis
    assert plots.rs_slots(changed).layout.xaxis.dtick in (1, 2, 5, 10, 20, 50)


def test_rs_slots_on_a_non_recurrent_model(tmp_path):
    path = write_synthetic_glm4moe(tmp_path / "glm.gguf", context_mix=0.5)
    with mx.Session.open(path, n_ctx=256, threads=1) as s:
        t = s.generate("def f(x):", max_tokens=20, n_max=3)
    assert not t.model["is_recurrent"]
    fig = plots.rs_slots(t)
    assert len(fig.data) == 0
    assert "not a recurrent model" in fig.layout.annotations[0].text
    assert (plots.slot_states(t) == 0).all()


def test_throughput_with_and_without_baseline(changed, plain):
    fig = plots.throughput(changed, plain)
    s, b = changed.summary(), plain.summary()
    speedup = s["tokens_per_second"] / b["tokens_per_second"]
    assert f"speedup {speedup:.2f}×" in fig.layout.title.text
    assert plots.speedup(changed, plain) == pytest.approx(speedup)
    phases = [t for t in fig.data if t.name in plots.PHASE_LABELS.values()]
    assert [t.name for t in phases] == ["draft", "verify", "catch-up", "sample"]
    assert all(list(t.x) == ["MTP", "plain"] for t in phases)
    ms_total = sum(t.y[0] for t in phases)
    assert ms_total == pytest.approx(sum(s["phase_seconds"].values()) * 1e3 / s["n_tokens"])
    # plain decoding is a legend entry of the tokens/s panel, no label on its line
    line = _trace(fig, f"plain {b['tokens_per_second']:.0f} tok/s")
    assert set(line.y) == {b["tokens_per_second"]} and line.line.dash == "dot"
    assert not any(a.text.startswith("plain ") for a in fig.layout.annotations)
    # one legend under each panel, holding that panel's traces only
    legends = {t.legend or "legend": set() for t in fig.data}
    for t in fig.data:
        legends[t.legend or "legend"].add(t.xaxis)
    assert legends == {"legend": {"x"}, "legend2": {"x2"}, "legend3": {"x3"}}
    assert fig.layout.legend.x < fig.layout.legend2.x < fig.layout.legend3.x
    tps = _trace(fig, "MTP tokens/s")
    assert len(tps.y) == changed.n_steps and all(v > 0 for v in tps.y)
    dashed = [sh for sh in fig.layout.shapes if sh.line.dash == "dash"]
    assert len(dashed) == 2  # the change, in both step-indexed panels
    alone = plots.throughput(changed)
    assert "speedup" not in alone.layout.title.text
    assert all(list(t.x) == ["MTP"] for t in alone.data if t.name in plots.PHASE_LABELS.values())


def test_every_figure_builds_from_an_empty_and_a_json_trace(session, changed, plain):
    empty = LiveTrace("", {}, session.info.to_dict(), session.capacity, session.piece).trace()
    loaded = mx.Trace.from_json(changed.to_json())
    for name, make in plots.FIGURES.items():
        for trace in (empty, loaded):
            fig = make(trace, plain) if name == "throughput" else make(trace)
            assert isinstance(fig, go.Figure) and fig.layout.title.text
    assert "no tokens yet" in plots.token_timeline(empty).layout.annotations[0].text
    # every axis that shows tick labels says what it measures (and in which unit); no figure has a fixed width
    for name, make in plots.FIGURES.items():
        fig = make(changed, plain) if name == "throughput" else make(changed)
        axes = [k for k in fig.layout if k.startswith(("xaxis", "yaxis"))]
        untitled = [
            k
            for k in axes
            if fig.layout[k].visible is not False
            and fig.layout[k].showticklabels is not False
            and not fig.layout[k].title.text
        ]
        assert not untitled, (name, untitled)
        assert fig.layout.width is None and all(fig.layout[k].automargin for k in axes), name


def test_export_html(tmp_path, steady):
    fig = plots.acceptance_by_depth(steady)
    out = plots.export(fig, tmp_path / "figs" / "acceptance.html")
    text = out.read_text()
    assert out.suffix == ".html" and "acceptance by depth" in text and "Plotly.newPlot" in text
    assert len(text) > 1_000_000  # plotly.js inside: opens offline
    small = plots.export(fig, tmp_path / "small", include_plotlyjs="cdn")
    assert small.name == "small.html" and small.stat().st_size < 200_000


def test_export_png_without_kaleido_is_a_clear_error(tmp_path, steady, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido -> ImportError
    with pytest.raises(plots.ExportError, match="kaleido"):
        plots.export(plots.acceptance_by_depth(steady), tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()
    with pytest.raises(plots.ExportError, match="cannot export"):
        plots.export(plots.acceptance_by_depth(steady), tmp_path / "a.docx")


def test_nan_free_layout_numbers(changed):
    """Titles never show 'nan' for a trace with drafts."""
    for name, make in plots.FIGURES.items():
        fig = make(changed)
        assert "nan" not in fig.layout.title.text.lower(), name


def test_whatif_figures_are_reexported(session):
    """plots re-exports the what-if figures of viz.whatif_figures (the same functions), and each builds."""
    import pandas as pd

    names = (
        "reliability_diagram",
        "sweep_heatmap",
        "speedup_ceiling",
        "predicted_vs_measured",
        "drafter_comparison",
        "predicted_acceptance_by_depth",
        "predicted_speed_by_n_max",
    )
    for name in names:
        assert getattr(plots, name) is getattr(whatif_figures, name) and name in plots.__all__
        assert name not in plots.FIGURES  # FIGURES stays the per-trace figures the Explorer shows
    oracle = session.record_oracle(PROMPT, max_tokens=32, depth=3)
    grids = [mx.simulate_grid([oracle], [1, 2], [0.0, 0.5], drafter=d) for d in ("draft-mtp", "ngram-simple")]
    figs = [
        plots.reliability_diagram([oracle], n_bins=5),
        plots.sweep_heatmap(grids[0]),
        plots.speedup_ceiling(grids[0]),
        plots.predicted_vs_measured([{"label": "n_max=2", "predicted": 100.0, "measured": 90.0}]),
        plots.drafter_comparison(pd.concat(grids)),
        plots.predicted_acceptance_by_depth(mx.simulate(oracle, 2, 0.0)),
        plots.predicted_speed_by_n_max(
            [
                {"n_max": 1, "tokens_per_second": 90.0, "ceiling_tokens_per_second": 120.0},
                {"n_max": 2, "tokens_per_second": 95.0, "ceiling_tokens_per_second": 150.0},
            ],
            n_max=2,
            plain=80.0,
            p_min=0.0,
            n_min=0,
        ),
    ]
    for fig in figs:
        assert isinstance(fig, go.Figure) and fig.layout.title.text and fig.data
    assert "(simulate, 1 prompt)" in figs[1].layout.title.text  # a simulate_grid table has no mode column


def test_a_dip_in_the_predicted_speed_is_explained_on_the_figure():
    """A predicted tokens/s below both neighbours is annotated with its tokens per step and milliseconds per step
    against the lower n_max's (tokens/s is their ratio); a monotone curve or rows without them get no note."""
    from mtp_explorer.viz.whatif_figures import dip_notes

    def row(n, tok, ms):
        return {
            "n_max": n,
            "tokens_per_second": 1e3 * tok / ms,
            "ceiling_tokens_per_second": 1e4,
            "tokens_per_step": tok,
            "ms_per_step": ms,
        }

    rows = [row(1, 1.8, 2.0), row(2, 2.4, 2.2), row(3, 2.3, 2.4), row(4, 2.9, 2.5), row(5, 3.0, 3.0)]
    notes = dip_notes(rows)
    assert (
        [i for i, _ in notes] == [2]
        and "fewer tokens per step" in notes[0][1]
        and "(n_max 2: 2.40 at 2.20)" in notes[0][1]
    )
    dearer = [row(1, 2.0, 2.0), row(2, 2.1, 2.4), row(3, 2.6, 2.5)]
    assert "dearer steps" in dip_notes(dearer)[0][1]
    assert dip_notes([row(n, 1.0 + n, 2.0) for n in range(1, 6)]) == []
    bare = [
        {k: v for k, v in r.items() if k in ("n_max", "tokens_per_second", "ceiling_tokens_per_second")} for r in rows
    ]
    assert dip_notes(bare) == []
    fig = plots.predicted_speed_by_n_max(rows, n_max=2, plain=800.0, p_min=0.0, n_min=0)
    dips = [a for a in fig.layout.annotations if a.text.startswith("dip")]
    assert [a.x for a in dips] == [3] and dips[0].text == "dip: fewer tokens per step"
    assert dips[0].hovertext == notes[0][1] and dips[0].ay < 0  # the numbers on hover; the mark above the point
    curve = [t for t in fig.data if t.name == "predicted"][0]
    assert "tokens per step" in curve.hovertemplate and len(curve.customdata) == 5


def test_whatif_figures_live_in_their_own_module():
    """plots exports the seven figure modules; trace_figures holds the per-trace figures only."""
    from mtp_explorer.viz import comparison_figures, cost_figures, parallel_figures, schedule_figures, server_figures

    others = (
        *whatif_figures.__all__,
        *server_figures.__all__,
        *parallel_figures.__all__,
        *comparison_figures.__all__,
        *cost_figures.__all__,
        *schedule_figures.__all__,
    )
    for name in others:
        assert not hasattr(trace_figures, name), name
    assert set(plots.__all__) == set(trace_figures.__all__) | set(others)


def test_metrics_come_from_one_module(changed, plain):
    from mtp_explorer.core import metrics

    assert plots.settings_changes is metrics.settings_changes and plots.SettingsChange is metrics.SettingsChange
    assert plots.settings_segments is metrics.settings_segments and plots.SettingsSegment is metrics.SettingsSegment
    np.testing.assert_array_equal(plots.step_seconds(changed), metrics.step_seconds(changed.columns))
    assert plots.speedup(changed, plain) == metrics.trace_speedup(changed, plain)
    assert set(plots.PHASE_LABELS) == set(plots.PHASE_COLORS) == set(PHASES)  # the engine's phases, each drawn


def _wrong_inputs(session):
    """Per public figure: a call with the wrong kind of input, and the words the TypeError must hold."""
    import pandas as pd

    trace = session.generate(PROMPT, max_tokens=16, n_max=2)
    grid = mx.simulate_grid([session.record_oracle(PROMPT, max_tokens=16, depth=2)], [1, 2], [0.0])
    rows = [{"n_max": 1, "tokens_per_second": 1.0, "ceiling_tokens_per_second": 2.0}]
    return {
        "token_timeline": (lambda: plots.token_timeline(grid), "takes a Trace", "got DataFrame"),
        "acceptance_by_depth": (lambda: plots.acceptance_by_depth(trace.to_json()), "takes a Trace", "got str"),
        "accepted_length_histogram": (lambda: plots.accepted_length_histogram(None), "takes a Trace", "got None"),
        "hidden_norms": (lambda: plots.hidden_norms(trace.columns), "takes a Trace", "got dict"),
        "rs_slots": (lambda: plots.rs_slots([trace]), "takes a Trace", "got list"),
        "slot_states": (lambda: plots.slot_states(grid), "takes a Trace", "got DataFrame"),
        "throughput": (lambda: plots.throughput(trace, grid), "baseline must be a Trace", "got DataFrame"),
        "export": (lambda: plots.export(trace, "x.html"), "takes a plotly Figure", "got Trace"),
        "sweep_heatmap": (lambda: plots.sweep_heatmap(trace), "takes a sweep/simulate_grid DataFrame", "got Trace"),
        "speedup_ceiling": (
            lambda: plots.speedup_ceiling(grid.drop(columns="ceiling_tokens_per_second")),
            "takes a sweep/simulate_grid DataFrame",
            "without the column(s) ['ceiling_tokens_per_second']",
        ),
        "drafter_comparison": (
            lambda: plots.drafter_comparison(trace),
            "takes a sweep/simulate_grid DataFrame over drafters",
            "got Trace",
        ),
        "reliability_diagram": (lambda: plots.reliability_diagram(grid), "takes a Calibration", "got DataFrame"),
        "predicted_vs_measured": (
            lambda: plots.predicted_vs_measured(pd.DataFrame(rows)),
            "takes a sequence of dicts",
            "got DataFrame",
        ),
        "predicted_acceptance_by_depth": (
            lambda: plots.predicted_acceptance_by_depth(trace),
            "takes a SimTrace",
            "got Trace",
        ),
        "predicted_speed_by_n_max": (
            lambda: plots.predicted_speed_by_n_max([{"n_max": 1}], n_max=1, plain=1.0, p_min=0.0, n_min=0),
            "takes a sequence of dicts",
            "lacks ['tokens_per_second'",
        ),
        "server_acceptance": (
            lambda: plots.server_acceptance("http://127.0.0.1:8080"),
            "takes a ServerMonitor",
            "got str",
        ),
        "server_rates": (lambda: plots.server_rates(trace), "takes a ServerMonitor", "got Trace"),
        "server_predictions": (
            lambda: plots.server_predictions(trace),
            "takes a ServerSweep with predictions",
            "got Trace",
        ),
        "slot_timeline": (lambda: plots.slot_timeline(trace), "takes a ParallelTrace", "got Trace"),
        "batch_rows": (lambda: plots.batch_rows([trace]), "takes a ParallelTrace", "got list"),
        "parallel_crossover": (
            lambda: plots.parallel_crossover(grid),
            "takes a recommend_parallel or measure_crossover DataFrame",
            "without the column(s) ['n_parallel', 'goodput']",
        ),
        "drafters_side_by_side": (
            lambda: plots.drafters_side_by_side(grid),
            "takes a DrafterComparison",
            "got DataFrame",
        ),
        "draft_lengths": (lambda: plots.draft_lengths([trace]), "or a dict of labels to them", "got list"),
        "verify_cost": (
            lambda: plots.verify_cost({"here": grid}),
            "takes an OracleTrace",
            "item 'here' is a DataFrame",
        ),
    }


def test_a_figure_given_the_wrong_input_says_what_it_takes(session):
    cases = _wrong_inputs(session)
    public = {n for n in plots.__all__ if callable(getattr(plots, n)) and n[0].islower()} - {
        "settings_changes",
        "settings_segments",
        "step_seconds",
        "speedup",
    }
    assert public == set(cases)  # every public figure function is checked
    for name, (call, takes, got) in cases.items():
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(name) and takes in message and got in message, message
    with pytest.raises(TypeError, match=r"measured must be a dict .* got list"):
        plots.predicted_speed_by_n_max([], n_max=1, plain=1.0, p_min=0.0, n_min=0, measured=[1])


def test_drafter_labels_and_colours_come_from_the_registry(session):
    import pandas as pd

    from mtp_explorer.viz import style

    oracle = session.record_oracle(PROMPT, max_tokens=24, depth=2)
    # every choice this session's oracle can replay (its draft model is not a head)
    modes = [d for d in mx.DRAFTER_MODES if MODES[d].runs_with(oracle.has_mtp, oracle.has_draft_model)]
    df = pd.concat([mx.simulate_grid([oracle], [1, 2], [0.0], drafter=d) for d in reversed(modes)])
    fig = plots.drafter_comparison(df)
    assert [t.name for t in fig.data] == [MODES[d].label for d in modes]
    assert [t.marker.color for t in fig.data] == [style.DRAFTER_COLORS[d] for d in modes]
    # the token timeline names the drafter of each draft by its registry label
    t = session.generate(PROMPT, max_tokens=24, n_max=3, drafter="chain")
    fig = plots.token_timeline(t, session.piece)
    hovers = [h for name in ("accepted", "rejected") for h in (_trace(fig, plots.ORIGIN_LABELS[name]).hovertext or ())]
    labels = {MODES[n].label for n in mx.DRAFTERS}  # each drafter: its choice's label
    assert hovers and all(any(f"{lab} draft" in h for lab in labels) for h in hovers)


def test_server_predictions_label_every_point_by_its_configuration():
    """Each point says which configuration it is (plain decoding without the n_max it does not use); the axes say
    what they measure."""
    import pandas as pd

    rows = [
        {
            "spec_type": st,
            "n_max": n,
            "n_parallel": np_,
            "category": "all",
            "status": "ok",
            "tokens_per_second": 100.0 + i,
            "predicted_tokens_per_second": 101.0 + i,
            "tokens_per_second_error": 0.01,
            "tokens_per_second_spread": 0.02,
            "acceptance": None if st == "none" else 0.7,
            "predicted_acceptance": None if st == "none" else 0.72,
        }
        for i, (st, n, np_) in enumerate([("none", 2, 1), (MODES["draft-mtp"].name, 3, 2)])
    ]
    sweep = mx.ServerSweep(
        frame=pd.DataFrame(rows),
        model="m.gguf",
        grid={"spec_type": ["none", "draft-mtp"], "n_max": [2, 3], "n_parallel": [1, 2]},
        workload=mx.Workload.from_prompts(["a"], n_predict=4),
    )
    fig = plots.server_predictions(sweep)
    tps, acc = fig.data[0], fig.data[1]
    assert "text" in tps.mode and list(tps.text) == ["plain np 1", "draft-mtp n3 np 2"]
    assert list(acc.text) == ["draft-mtp n3 np 2"]
    assert tps.customdata[0][0] == "spec_type=none n_parallel=1"  # the hover text: in full
    assert fig.layout.xaxis.title.text == "predicted tokens/s" and fig.layout.yaxis.title.text == "measured tokens/s"


def test_drafter_colours_are_distinct_and_shared():
    """One colour per listed drafter, none shared, the same wherever a figure draws that drafter."""
    from mtp_explorer.core.drafters import DRAFTER_MODES
    from mtp_explorer.viz.style import DRAFTER_COLORS, drafter_color

    assert len({DRAFTER_COLORS[m] for m in DRAFTER_MODES}) == len(DRAFTER_MODES)
    assert all(drafter_color(m, 99) == DRAFTER_COLORS[m] for m in DRAFTER_MODES)


def test_server_prediction_labels_stay_inside_and_apart():
    """Points at one place share one label (names stacked); labels lean away from the plot's edges."""
    from mtp_explorer.viz.server_figures import _placed_labels

    text, where = _placed_labels([0.61, 0.612, 0.3], [0.61, 0.611, 0.5], ["np 1", "np 2", "plain"], 1.0)
    assert text == ["np 1<br>np 2", "", "plain"]
    text, where = _placed_labels([280, 150, 10], [200, 140, 5], ["a", "b", "c"], 300)
    assert text == ["a", "b", "c"] and where == ["top left", "top center", "top right"]


def test_verify_cost_shows_the_cost_models_verify_against_one_row(session):
    """The bars are the cost model's verify times at the oracle's median position over the one-row decode; the guide
    line is the most a step of that many rows yields; a dict of sources gives one bar group each."""
    oracle = session.record_oracle(PROMPT, max_tokens=24, depth=3, probe=True)
    fig = plots.verify_cost(oracle)
    bars = [t for t in fig.data if t.type == "bar"]
    (guide,) = [t for t in fig.data if t.type == "scatter"]
    pos = float(np.median(oracle.columns["pos"]))
    ms = oracle.cost.verify_ns(np.arange(1, 5), pos, fresh=False)
    assert list(bars[0].x) == [1, 2, 3, 4]
    np.testing.assert_allclose(bars[0].y, ms / ms[0])
    assert list(guide.y) == list(range(1, len(guide.y) + 1)) and len(guide.y) >= 4
    assert f"(position {pos:.0f})" in fig.layout.title.text
    two = plots.verify_cost({"recorded": oracle, "at position 0": oracle.cost}, pos=0)
    assert [t.name for t in two.data if t.type == "bar"] == ["recorded", "at position 0"]
    ms0 = oracle.cost.verify_ns(np.arange(1, 5), 0.0, fresh=False)
    np.testing.assert_allclose(two.data[1].y, ms0 / ms0[0])
    with pytest.raises(mx.ParameterError, match="pos must be"):
        plots.verify_cost(oracle, pos=-1)
    with pytest.raises(TypeError, match="an empty dict"):
        plots.verify_cost({})


def test_draft_lengths_draws_each_steps_cap_and_acceptance(session):
    """One line per run at each step's cap (the trace's n_max column) placed at the tokens generated before the step,
    its accepted drafts as dots; a schedule's run is labelled by its schedule."""
    oracle = session.record_oracle(PROMPT, max_tokens=48, depth=4, probe=False, batch_shift=False)
    fixed = mx.simulate(oracle, 4)
    ruled = mx.simulate(oracle, 4, schedule="heuristic")
    fig = plots.draft_lengths({"fixed": fixed, "heuristic": ruled})
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name.split(":")[0] for t in lines] == ["fixed", "heuristic"]
    np.testing.assert_array_equal(lines[1].y, ruled.columns["n_max"])
    assert list(lines[1].x) == [0, *np.cumsum(ruled.columns["n_accepted"] + 1)[:-1]]
    dots = [t for t in fig.data if t.mode == "markers"]
    np.testing.assert_array_equal(dots[1].y, ruled.columns["n_accepted"])
    assert plots.draft_lengths(ruled).data[0].name.startswith("heuristic (n_max 4)")


def _shown(widget: go.FigureWidget) -> tuple[list[dict], dict]:
    data = [{k: v for k, v in t.to_plotly_json().items() if k != "uid"} for t in widget.data]
    layout = widget.layout.to_plotly_json()
    layout.pop("template", None)
    return data, layout


def test_a_synced_widget_shows_the_figure_and_a_resync_sends_nothing():
    """sync_figure sends what changed only; the widget then shows the figure: a property the new figure lacks is
    cleared (not left stale), annotations it lacks are removed, traces of other kinds replace the old ones, and
    the visibility a legend click set stays."""
    widget = go.FigureWidget()
    first = go.Figure(go.Bar(x=[1, 2, 3], y=[0.5, 0.6, 0.7], text=["a", "b", "c"], name="predicted"))
    first.add_annotation(x=2, y=0.6, text="dip")
    second = go.Figure(go.Bar(x=[1, 2, 3], y=[0.5, 0.6, 0.9], name="predicted"))
    second.update_layout(title_text="n_max 3")
    sync_figure(widget, first)
    assert widget.data[0].text == ("a", "b", "c") and len(widget.layout.annotations) == 1
    widget.data[0].visible = "legendonly"  # what a click on its legend entry sets
    sync_figure(widget, second)
    data, layout = _shown(widget)
    assert data[0]["y"] == [0.5, 0.6, 0.9] and "text" not in data[0] and data[0]["visible"] == "legendonly"
    assert layout["annotations"] == [] and layout["title"]["text"] == "n_max 3"
    new = second.data[0].to_plotly_json()
    assert changed_properties(widget.data[0].to_plotly_json(), new) == {}  # a resync sends nothing
    assert changed_properties({"x": [1], "uid": "u"}, {"x": [2]}) == {"x": [2]}
    third = go.Figure([go.Scatter(x=[1, 2], y=[3, 4]), go.Scatter(x=[1], y=[5], mode="markers")])
    sync_figure(widget, third)
    assert [t.type for t in widget.data] == ["scatter", "scatter"] and widget.data[1].y == (5,)
