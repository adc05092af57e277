"""The Explorer widget without a browser: runs stream in a background thread and fill the figures;
Step, live settings, Stop, Run again, errors; the live trace equals the final one; the what-if mode
(an oracle recorded once, predictions that follow the sliders, beside the measured run); the drafter
selector (mtp / ngram / chain: the next Run's drafter, the prediction's at once; models without MTP)."""

from __future__ import annotations

import dataclasses
import html
import math
import re
import threading
import time
import warnings

import ipywidgets
import numpy as np
import pytest
from conftest import SHORT_NGRAM

import mtp_explorer as mx
from mtp_explorer import plots, widgets
from mtp_explorer.core import drafters
from mtp_explorer.core.drafters import mode, option_values
from mtp_explorer.ui import whatif as whatif_controller
from mtp_explorer.ui.whatif_panel import speed_curve
from mtp_explorer.widgets import LIVE_COLUMNS, Explorer, LiveTrace

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPT = "def fib(n):"
#: The drafter options of a default Explorer, as its oracle keys hold them.
OPTIONS = tuple(sorted(option_values().items()))


@pytest.fixture(scope="module")
def session(model_mixed, model_synthetic_draft):
    with mx.Session.open(model_mixed, n_ctx=4096, n_rs_seq=8, threads=1, draft_model=model_synthetic_draft) as s:
        yield s


def _wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _timeline_tokens(ex: Explorer) -> int:
    fig = ex.figures["token_timeline"]
    return sum(
        len(t.x) for t in fig.data if t.name in (plots.ORIGIN_LABELS[k] for k in ("accepted", "correction", "plain"))
    )


def test_controls_follow_the_session(session):
    ex = Explorer(session, n_max=3)
    c = ex.controls
    assert (c.n_max.min, c.n_max.max, c.n_max.value) == (1, session.capacity, 3)
    assert (c.p_min.min, c.p_min.max, c.p_min.step) == (0.0, 1.0, 0.05)
    assert c.n_min.max == 3
    c.n_max.value = 5
    assert c.n_min.max == 5  # n_min never above n_max
    assert ex.state == "idle" and c.stop.disabled and not c.run.disabled
    assert c.stop.button_style == ""  # disabled, it looks disabled: red only while it can stop something
    assert set(ex.figures) == set(plots.FIGURES)
    # the title's llama.cpp shorthand (fa auto · KV f16/f16) with its plain words in hover text
    title = ex.children[0].value
    assert "flash attention" in title and "KV cache stores keys as" in title and 'title="' in title
    assert c.prompt.value == mx.demo_prompt()  # the bundled model's first demo prompt, a held-out snippet


def test_run_fills_the_figures_and_caches_the_baseline(session, monkeypatch):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=3)
    gate = threading.Event()
    stream = session.stream

    def gated(*args, **kwargs):
        assert gate.wait(30)
        yield from stream(*args, **kwargs)

    monkeypatch.setattr(session, "stream", gated)
    ex.run()
    # the kernel is not blocked: run() returned while the generation still waits on the gate
    assert ex.state == "running" and ex._thread.is_alive() and not gate.is_set()
    assert not ex.controls.stop.disabled and ex.controls.stop.button_style == "danger"
    gate.set()
    assert ex.wait(60)
    assert ex.state == "idle" and ex.error == "" and ex.finish_reason == "budget"
    expected = session.generate(PROMPT, max_tokens=64, n_max=3)
    assert ex.trace.tokens == expected.tokens
    assert ex.n_tokens == 64 and ex.n_steps == expected.n_steps
    assert ex.progress.bar.value == 64 and "64/64 tokens" in ex.progress.label.value
    assert _timeline_tokens(ex) == 64
    assert list(ex.figures["acceptance_by_depth"].data[0].y) == pytest.approx(
        list(plots.acceptance_by_depth(ex.trace).data[0].y), nan_ok=True
    )
    assert sum(ex.figures["accepted_length_histogram"].data[0].y) == ex.n_steps
    assert np.array(ex.figures["rs_slots"].data[0].z).shape == (session.capacity + 1, ex.n_steps)
    base = ex.baseline
    assert base is not None and base.tokens == ex.trace.tokens and base.columns["n_max"].max() == 0
    assert "speedup" in ex.figures["throughput"].layout.title.text
    ex.controls.n_max.value = 2
    ex.run()
    assert ex.wait(60)
    assert ex.baseline is base and len(ex.baselines) == 1  # same prompt: the cached baseline
    assert ex.trace.columns["n_max"].max() == 2


def test_step_advances_one_verify_step(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=3)
    ex.step()
    assert ex.wait(30)
    assert ex.state == "stepping" and ex.n_steps == 1
    first = ex.trace.steps[0]
    assert _timeline_tokens(ex) == len(first.tokens)
    ex.step()
    assert ex.wait(30)
    assert ex.n_steps == 2 and ex.trace.n_steps == 2
    # while stepping, the suspended generation holds the session
    with pytest.raises(mx.SessionBusyError):
        session.generate(PROMPT, max_tokens=4)
    while ex.state == "stepping":
        ex.step()
        assert ex.wait(30)
    assert ex.finish_reason == "budget"
    assert ex.trace.tokens == session.generate(PROMPT, max_tokens=24, n_max=3).tokens


def test_slider_during_a_run_reaches_the_session_and_is_marked(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=3000, n_max=2, p_min=0.0)
    ex.run()
    _wait_for(lambda: ex.n_steps >= 5)
    assert ex.state == "running"
    ex.controls.n_max.value = 5
    ex.controls.p_min.value = 0.25
    assert session.params["n_max"] == 5 and session.params["p_min"] == pytest.approx(0.25)
    changed_at = ex.n_steps
    _wait_for(lambda: ex.n_steps >= changed_at + 20)
    ex.stop()
    assert ex.wait(30)
    t = ex.trace
    assert t.finish_reason == "cancelled"
    changes = plots.settings_changes(t)
    assert changes and changes[0].before["n_max"] == 2 and changes[-1].after["n_max"] == 5
    assert t.columns["n_max"][-1] == 5 and t.columns["p_min"][-1] == pytest.approx(0.25)
    marks = ex.figures["token_timeline"].data[-1]
    assert len(marks.x) == len(changes)
    assert any(s.line.dash == "dash" for s in ex.figures["throughput"].layout.shapes)


def test_slider_when_idle_only_sets_the_next_run(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=16, n_max=3)
    session.set_params(n_max=3, p_min=0.0, n_min=0)
    ex.controls.n_max.value = 1
    assert session.params["n_max"] == 3
    ex.run()
    assert ex.wait(30)
    assert (ex.trace.columns["n_max"] == 1).all()


def test_stop_cancels_and_run_again_starts_cleanly(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=3000, n_max=3)
    ex.run()
    _wait_for(lambda: ex.n_steps >= 3)
    ex.stop()
    assert ex.wait(30)
    assert ex.finish_reason == "cancelled" and ex.state == "idle"
    assert ex.baseline is None and ex.baselines == {}  # no baseline for a cancelled run
    assert 0 < ex.n_tokens < 3000
    ex.controls.max_tokens.value = 32
    ex.run()
    assert ex.wait(60)
    assert ex.finish_reason == "budget" and ex.n_tokens == 32 and ex.error == ""
    assert ex.trace.tokens == session.generate(PROMPT, max_tokens=32, n_max=3).tokens


def test_stop_while_stepping(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=100, n_max=3)
    ex.step()
    assert ex.wait(30)
    ex.stop()
    assert ex.wait(30)
    assert ex.state == "idle" and ex.finish_reason == "cancelled"
    assert session.generate(PROMPT, max_tokens=8).finish_reason == "budget"  # the session is usable


def test_run_while_stepping_starts_a_new_generation(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=30, n_max=3)
    ex.step()
    assert ex.wait(30)
    ex.run()
    assert ex.wait(60)
    assert ex.finish_reason == "budget" and ex.n_tokens == 30


def test_errors_show_as_a_message(session):
    ex = Explorer(session, prompt="", max_tokens=16)
    ex.run()
    assert ex.wait(30)
    assert ex.state == "idle"
    assert ex.error == "ParameterError: the prompt is empty"
    assert "the prompt is empty" in ex.error_area.value and "Traceback" not in ex.error_area.value
    with mx.Session.open(session.path, n_ctx=256, threads=1) as small:
        ex_small = Explorer(small, prompt="def f(x): " * 100, max_tokens=16)  # longer than the context
        ex_small.run()
        assert ex_small.wait(30)
        assert ex_small.error.startswith("ContextOverflowError: the prompt has")
    ex.controls.prompt.value = PROMPT
    ex.run()
    assert ex.wait(30)
    assert ex.error == "" and ex.error_area.value == "" and ex.finish_reason == "budget"


def test_redraws_are_throttled(session, monkeypatch):
    ex = Explorer(session, prompt=PROMPT, max_tokens=2500, n_max=2)
    calls = []
    render = ex.views.render
    monkeypatch.setattr(ex.views, "render", lambda *a, **k: (calls.append(time.monotonic()), render(*a, **k)))
    t0 = time.monotonic()
    ex.run()
    assert ex.wait(120)
    elapsed = time.monotonic() - t0
    assert ex.n_steps > 200
    assert len(calls) <= elapsed / 0.1 + 4  # at most ~10 redraws/s (+ start, end, baseline)
    gaps = np.diff(calls[1:-2])
    assert len(gaps) == 0 or gaps.min() >= 0.1 - 0.01


def _assert_same_columns(partial: mx.Trace, final: mx.Trace) -> None:
    """Every column of the finished trace, with its dtype, shape and values."""
    assert (
        set(partial.columns)
        == set(final.columns)
        == set(LIVE_COLUMNS)
        == set(mx.Trace.from_json(final.to_json()).columns)
    )
    for name in LIVE_COLUMNS:
        col = final.columns[name]
        assert partial.columns[name].dtype == col.dtype, name
        np.testing.assert_array_equal(partial.columns[name], col, err_msg=name)


def test_live_trace_equals_the_final_trace(session):
    live = LiveTrace(PROMPT, {}, session.info.to_dict(), session.capacity, session.piece)
    for i, step in enumerate(session.stream(PROMPT, max_tokens=60, n_max=4, p_min=0.1)):
        live.add(step)
        if i % 7 == 0:
            live.columns()  # built in pieces while the generation streams
    final, partial = session.last_trace, live.trace()
    assert partial.tokens == final.tokens and partial.pieces == final.pieces
    _assert_same_columns(partial, final)


# every listed choice this session (MTP and a draft model) runs: all but the EAGLE-3 head's (tests/test_draft_eagle3.py)
@pytest.mark.parametrize("drafter", [m for m in mx.DRAFTER_MODES if drafters.MODES[m].runs_with(True, "draft_model")])
def test_live_trace_holds_every_column_of_every_drafter(session, drafter):
    """The live trace is built from the schema: all columns, those of the chain's candidates included."""
    live = LiveTrace.of(session, PROMPT)
    assert live.trace().columns.keys() == set(LIVE_COLUMNS) and live.trace().n_steps == 0
    prompt = "x = [1, 2, 3]\nx = [1, 2, 3]\nx = [1, 2"
    for step in session.stream(prompt, max_tokens=40, n_max=4, p_min=0.1, drafter=drafter):
        live.add(step)
    final = session.last_trace
    assert final.settings["drafter"] == drafter
    _assert_same_columns(live.trace(), final)


def _whatif_trace(ex: Explorer, figure: str, name: str):
    return next(t for t in ex.whatif_panel.figure(figure).data if t.name == name)


def _numbers(values) -> list[float]:
    """A shown figure's values, JSON's nulls (plotly's NaN, a gap) as NaN."""
    return [math.nan if v is None else v for v in values]


def test_whatif_follows_the_sliders_and_equals_the_run(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=3)
    assert ex.oracle is None and ex.prediction is None and ex.whatif is None
    assert not ex.whatif_panel.showing and "no oracle" in ex.whatif_panel.status
    ex.record_oracle()
    assert ex.wait(60)
    assert ex.state == "idle" and ex.error == ""
    o = ex.oracle
    assert isinstance(o, mx.OracleTrace) and ex.oracles == {(PROMPT, 64, OPTIONS): o}
    assert o.prompt == PROMPT and o.max_tokens == 64 and o.depth == session.capacity
    assert ex.whatif_panel.showing and ex.prediction.policy["n_max"] == 3
    assert "oracle: 64 tokens" in ex.whatif_panel.status
    plain = mx.simulate(o, 0).predicted_tokens_per_second
    seen = set()
    c = ex.controls
    for n_max, p_min, n_min in ((2, 0.3, 1), (5, 0.0, 0), (4, 0.6, 2)):
        c.n_max.value, c.p_min.value, c.n_min.value = n_max, p_min, n_min
        expected = mx.simulate(o, n_max, p_min, n_min)
        es = expected.summary()
        assert ex.prediction.policy == expected.policy
        np.testing.assert_array_equal(ex.prediction.n_accepted, expected.n_accepted)
        w = ex.whatif
        assert (w.n_max, w.p_min, w.n_min) == (n_max, pytest.approx(p_min), n_min)
        for key in ("acceptance_rate", "mean_accepted_length", "tokens_per_second"):
            assert getattr(w, key) == pytest.approx(es[key], nan_ok=True), key
        assert w.acceptance_by_depth == pytest.approx(es["acceptance_by_depth"][:n_max], nan_ok=True)
        assert w.ceiling_tokens_per_second == pytest.approx(expected.ceiling_tokens_per_second())
        assert w.plain_tokens_per_second == pytest.approx(plain)
        assert w.speedup == pytest.approx(es["tokens_per_second"] / plain)
        assert w.measured is None and "No measured run" in w.note
        table = ex.whatif_panel.table
        for text in (
            f"{es['acceptance_rate']:.3f}",
            f"{es['mean_accepted_length']:.2f}",
            f"{es['tokens_per_second']:.0f}",
            f"{w.speedup:.2f}×",
            f"{w.ceiling_tokens_per_second:.0f}",
        ):
            assert text in table, text
        assert f"n_max={n_max}, p_min={p_min:.2f}, n_min={n_min}" in ex.whatif_panel.status
        bars = _whatif_trace(ex, "predicted_acceptance_by_depth", "predicted")
        assert list(bars.x) == list(range(1, n_max + 1))
        assert _numbers(bars.y) == pytest.approx(es["acceptance_by_depth"][:n_max], nan_ok=True)
        star = _whatif_trace(ex, "predicted_speed_by_n_max", "this setting")
        assert list(star.x) == [n_max] and star.y[0] == pytest.approx(es["tokens_per_second"])
        curve = _whatif_trace(ex, "predicted_speed_by_n_max", "predicted")
        assert list(curve.x) == list(range(1, o.depth + 1))
        assert curve.y[0] == pytest.approx(mx.simulate(o, 1, p_min, min(n_min, 1)).predicted_tokens_per_second)
        seen.add(round(w.tokens_per_second, 6))
        u = expected.uncertainty()
        assert w.uncertain_positions == u["uncertain_positions"] and w.tie_tolerance == u["tolerance"]
        assert w.tokens_per_second_range == pytest.approx(u["tokens_per_second_range"])
    assert len(seen) == 3  # the prediction moved with the sliders
    # a file whose batch shift covers every margin: the table gives tokens/s as a range, the note says why
    o.batch_shift = dataclasses.replace(
        o.batch_shift,
        margin_shift=(1e6,) * len(o.batch_shift.ks),
        segment_shift=tuple((1e6,) * len(o.batch_shift.starts) for _ in o.batch_shift.ks),
    )
    ex.update_prediction()
    w = ex.whatif
    assert len(w.uncertain_positions) == 64 and w.tokens_per_second_range[0] < w.tokens_per_second
    # in plain words, the technical terms in hover text
    table = ex.whatif_panel.table
    assert "tokens/s range (near-ties)" in table and "batch-shape" not in re.sub(r'title="[^"]*"', "", table)
    assert "top-2 margin within the measured batch-shape tolerance" in table  # the hover text
    assert "64 near-tie(s), the first at token 0" in w.note and "batch-shape" not in w.note

    # a greedy Run with the same settings accepts exactly the predicted counts
    ex.run()
    assert ex.wait(60)
    t, pred = ex.trace, ex.prediction
    cmp = mx.compare(o, t)
    assert not cmp.unexplained, cmp.unexplained[:2]
    if cmp.exact:
        np.testing.assert_array_equal(t.n_accepted, pred.n_accepted)
        np.testing.assert_array_equal(t.n_drafted, pred.n_drafted)
        assert t.tokens == pred.tokens
    else:
        warnings.warn(f"floating-point argmax ties between the run and the oracle: {cmp.ties[:2]}")
    ts, w = t.summary(), ex.whatif
    m = w.measured
    assert m.same_settings is True and (m.n_max, m.p_min, m.n_min) == (4, pytest.approx(0.6), 2)
    assert m.acceptance_rate == pytest.approx(ts["acceptance_rate"])
    assert m.tokens_per_second == pytest.approx(ts["tokens_per_second"])
    assert m.tokens_per_second_ratio == pytest.approx(ts["tokens_per_second"] / w.tokens_per_second)
    assert m.speedup == pytest.approx(plots.speedup(t, ex.baseline))
    if cmp.exact:
        assert m.acceptance_rate == pytest.approx(w.acceptance_rate)
        assert m.mean_accepted_length == pytest.approx(w.mean_accepted_length)
    table = ex.whatif_panel.table
    assert "measured / predicted" in table and f"{ts['tokens_per_second']:.0f}" in table
    assert f"{m.tokens_per_second_ratio:.3f}" in table
    measured_bars = _whatif_trace(ex, "predicted_acceptance_by_depth", "measured")
    assert _numbers(measured_bars.y) == pytest.approx(ts["acceptance_by_depth"][:4], nan_ok=True)
    point = _whatif_trace(ex, "predicted_speed_by_n_max", "measured")
    assert list(point.x) == [4] and point.y[0] == pytest.approx(ts["tokens_per_second"])

    # another setting: the measured run's settings are named, no ratio
    c.n_max.value = 3
    m = ex.whatif.measured
    assert m.same_settings is False and ex.whatif.n_max == 3
    assert "The measured run used n_max=4, p_min=0.60, n_min=2" in ex.whatif.note
    assert "n_max=4, p_min=0.60, n_min=2" in ex.whatif_panel.table
    assert "measured / predicted" not in ex.whatif_panel.table
    assert not [d for d in ex.whatif_panel.figure("predicted_acceptance_by_depth").data if d.name == "measured"]


def test_measure_puts_a_median_and_its_spread_beside_the_prediction(session):
    """Measure runs the controls' setting several times, each beside a plain run (setting first, then the other way
    round), in the background; the table shows the median with its spread and the note judges the prediction by it.
    Without an oracle it is refused with a message; Stop ends it."""
    ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=2)
    ex.measure_setting(repeats=2)
    assert "record one first" in ex.error and ex.state == "idle"
    ex.record_oracle()
    assert ex.wait(60) and ex.error == ""
    ran, generate = [], session.generate

    def logged(prompt, settings=None, **kw):
        ran.append(settings.n_max)
        return generate(prompt, settings, **kw)

    session.generate = logged
    try:
        ex.measure_setting(repeats=3)
        assert ex.wait(120) and ex.error == ""
    finally:
        del session.generate
    assert ran == [2, 0, 0, 2, 2, 0]
    r = ex.whatif.repeated
    assert (r.n_max, r.p_min, r.n_min, r.repeats) == (2, 0.0, 0, 3) and r.spread >= 0 and r.speedup > 0
    table = ex.whatif_panel.table
    assert "median of 3 (spread)" in table and f"{r.tokens_per_second:.0f} ({r.spread:.1%})" in table
    assert "Measured 3 times, each beside a plain run" in ex.whatif.note
    off = ex.whatif.tokens_per_second / r.tokens_per_second - 1
    assert (" within half that spread" in ex.whatif.note) == (abs(off) <= r.spread / 2)
    ex.controls.n_max.value = 3  # another setting: not measured yet
    assert ex.whatif.repeated is None and "median of" not in ex.whatif_panel.table
    ex.controls.n_max.value = 2
    assert ex.whatif.repeated == r
    stops = []

    def stopping(prompt, settings=None, **kw):  # Stop pressed during the first run
        stops.append(settings.n_max)
        ex.stop()
        return generate(prompt, settings, **kw)

    session.generate = stopping
    try:
        ex.controls.n_max.value = 1
        ex.measure_setting(repeats=3)
        assert ex.wait(60)
    finally:
        del session.generate
    assert len(stops) == 1 and ex.whatif.repeated is None and ex.state == "idle" and ex.error == ""


def test_recording_runs_in_the_background_and_stops(session, monkeypatch):
    ex = Explorer(session, prompt=PROMPT, max_tokens=32)
    gate = threading.Event()
    record = session.record_oracle

    def gated(*args, **kwargs):
        assert gate.wait(30)
        return record(*args, **kwargs)

    monkeypatch.setattr(session, "record_oracle", gated)
    ex.record_oracle()
    # the kernel is not blocked: the call returned while the recording still waits on the gate
    assert not gate.is_set() and ex._thread is not None and ex._thread.is_alive()
    assert ex.state == "busy" and ex.controls.run.disabled and ex.whatif_panel.record.disabled
    assert not ex.controls.stop.disabled
    assert ex.progress.label.value.startswith("recording oracle · 32 tokens")
    assert "recording the oracle" in ex.whatif_panel.status
    ex.run()  # refused while recording
    assert ex.state == "busy" and ex.n_steps == 0
    gate.set()
    assert ex.wait(30)
    assert ex.state == "idle" and ex.error == "" and ex.oracle is not None and ex.oracle.max_tokens == 32
    assert not ex.whatif_panel.record.disabled and not ex.controls.run.disabled
    assert "recording" not in ex.progress.label.value
    # Stop during a recording: nothing is kept, no error
    ex.controls.max_tokens.value = 40
    gate.clear()
    ex.record_oracle()
    ex.stop()
    gate.set()
    assert ex.wait(30)
    assert ex.state == "idle" and ex.error == "" and ex.oracle is None and (PROMPT, 40, OPTIONS) not in ex.oracles
    assert list(ex.oracles) == [(PROMPT, 32, OPTIONS)]
    assert "cancelled" in ex.whatif_panel.status
    assert session.generate(PROMPT, max_tokens=8).finish_reason == "budget"  # the session is usable


def test_recording_is_refused_at_temperature_or_without_mtp(session, model_no_mtp):
    ex = Explorer(session, prompt=PROMPT, max_tokens=16, temperature=0.7)
    ex.record_oracle()
    assert ex.state == "idle" and ex.wait(1)
    assert ex.error.startswith("ParameterError: the oracle records greedy decoding")
    assert "temperature" in ex.error_area.value
    assert ex.oracle is None and ex.oracles == {} and ex.prediction is None and not ex.whatif_panel.showing
    ex.controls.temperature.value = 0.0
    ex.record_oracle()
    assert ex.wait(30)
    assert ex.error == "" and ex.oracle is not None and ex.whatif_panel.showing
    ex.controls.temperature.value = 0.7  # the prediction stays, with a note
    assert "greedy decoding (temperature 0)" in ex.whatif.note
    assert "temperature 0" in ex.whatif_panel.table
    with mx.Session.open(model_no_mtp, n_ctx=512, threads=1) as plain:
        ex_plain = Explorer(plain, prompt=PROMPT, max_tokens=16, drafter="mtp")  # ngram records: see below
        ex_plain.record_oracle()
        assert ex_plain.state == "idle" and ex_plain.wait(1)
        assert ex_plain.error.startswith("MtpUnavailableError:") and "no MTP layers" in ex_plain.error
        assert ex_plain.oracle is None and ex_plain.oracles == {}


def test_the_whatif_frame_of_every_setting_a_slider_moves_to_is_prepared_and_is_the_one_the_kernel_shows(session):
    """The browser switches to the frame of a new n_max, p_min or n_min by itself (the sliders' values are linked to
    the view's in the browser): every n_max, every p_min of the slider's steps and every n_min around the shown
    setting has its frame, prepared in the background, equal to what the kernel shows when the slider gets there; a
    move prepares the frames around the new setting, a change of the drafter prepares them all again."""
    from mtp_explorer.ui.controls import P_MIN_STEP
    from mtp_explorer.ui.whatif_view import Key

    ex = Explorer(session, prompt=PROMPT, max_tokens=32, n_max=3, p_min=0.0, n_min=0)
    ex.record_oracle()
    assert ex.wait(60)
    ctl, view = ex.whatif_controller, ex.whatif_panel.view
    assert ctl.wait_prepared(120)
    top = min(session.capacity, ex.oracle.depth)
    p_mins = [round(i * P_MIN_STEP, 4) for i in range(round(1 / P_MIN_STEP) + 1)]
    around = {Key(n, 0.0, 0) for n in range(1, top + 1)} | {Key(3, p, 0) for p in p_mins}
    around |= {Key(3, 0.0, m) for m in range(4)}
    assert view.key == Key(3, 0.0, 0) and set(ctl.prepared) == around
    assert set(view.frames) == {k.text for k in around}
    held = dict(view.frames)
    for n, p, m in ((1, 0.0, 0), (top, 0.0, 0), (3, 0.75, 0), (3, 0.0, 2), (3, 0.0, 0)):
        ex.controls.n_max.value, ex.controls.p_min.value, ex.controls.n_min.value = n, p, m
        assert view.key == Key(n, p, m) and view.shown == held[Key(n, p, m).text]
        assert f"n_max={n}, p_min={p:.2f}, n_min={m}" in ex.whatif_panel.status
        assert ex.prediction.policy["n_max"] == n and ex.prediction.policy["n_min"] == m
    for key in (Key(1, 0.0, 0), Key(3, 0.75, 0), Key(3, 0.0, 2)):  # the same frames made from scratch
        ex.controls.n_max.value, ex.controls.p_min.value, ex.controls.n_min.value = key
        ex.update_prediction()
        assert view.shown == held[key.text]
    # a move prepares the frames around the new setting: every n_max at p_min 0.75, every n_min at n_max 5
    ex.controls.n_max.value, ex.controls.p_min.value, ex.controls.n_min.value = 3, 0.75, 0
    assert ctl.wait_prepared(120) and {Key(n, 0.75, 0) for n in range(1, top + 1)} <= set(ctl.prepared)
    assert "at p_min 0.75" in ex.whatif_panel.figure("predicted_speed_by_n_max").layout.title.text
    assert all(
        view.frames[Key(n, 0.75, 0).text]["figures"][1] != held[Key(n, 0.0, 0).text]["figures"][1]
        for n in range(1, top + 1)
    )
    ex.controls.n_max.value = top
    assert ctl.wait_prepared(120) and {Key(top, 0.75, m) for m in range(top + 1)} <= set(ctl.prepared)
    assert len(view.frames) == len(
        {Key(n, 0.75, 0) for n in range(1, top + 1)}
        | {Key(top, p, 0) for p in p_mins}
        | {Key(top, 0.75, m) for m in range(top + 1)}
    )  # only those around it are sent
    ex.controls.drafter.value = "ngram-simple"  # no confidence: p_min does not apply, its moves are not prepared
    assert ctl.wait_prepared(120)
    assert set(ctl.prepared) == {Key(n, 0.75, 0) for n in range(1, top + 1)} | {
        Key(top, 0.75, m) for m in range(top + 1)
    }
    ex.controls.n_max.value = 2
    ex.controls.prompt.value = "import os"  # no oracle: nothing to predict, no frames, none prepared after
    assert view.frames == {} and not ex.whatif_panel.showing and "no oracle" in ex.whatif_panel.status
    assert ctl.wait_prepared(120) and view.frames == {} and ctl.prepared == []


def test_the_whatif_views_module_is_small_and_plotly_js_comes_as_a_trait():
    """anywidget drops a model's updates for good when its module takes over 2 s to load, which a module with plotly.js
    inlined (3.5 MB) did on a busy machine: the module is the view alone, plotly.js a trait the view runs."""
    from mtp_explorer.ui.whatif_view import WhatIfView

    view = WhatIfView()
    assert len(str(view._esm)) < 20_000 and "window.Plotly" in str(view._esm)
    assert len(view._plotly_js) > 1_000_000 and "Plotly" in view._plotly_js[:5000]
    assert "_plotly_js" in view.keys


def test_a_new_prompt_or_max_tokens_invalidates_the_oracle(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=2)
    ex.record_oracle()
    assert ex.wait(30)
    o = ex.oracle
    assert o is not None and ex.whatif_panel.showing
    panel = ex.whatif_panel
    on_page = list(panel.children)
    ex.controls.prompt.value = "import os"
    assert ex.oracle is None and ex.prediction is None and ex.whatif is None
    assert not ex.whatif_panel.showing and "no oracle" in ex.whatif_panel.status
    # the view stays on the page, without frames (the browser folds its charts away) and with the message
    assert list(panel.children) == on_page and panel.view.frames == {} and panel.table == ""
    ex.controls.n_max.value = 3  # nothing to predict, no error
    assert ex.error == "" and ex.prediction is None
    with pytest.raises(mx.MtpExplorerError, match="no oracle"):
        ex.predict()
    ex.run()  # a run of another prompt
    assert ex.wait(60)
    ex.controls.prompt.value = PROMPT  # back: the recorded oracle again
    assert ex.oracle is o and ex.prediction.policy["n_max"] == 3 and ex.whatif_panel.showing
    assert list(panel.children) == on_page and panel.view.shown is not None and panel.view.message == ""
    assert ex.whatif.measured is None  # the run was of another prompt
    ex.controls.max_tokens.value = 25
    assert ex.oracle is None and ex.prediction is None
    ex.record_oracle()
    assert ex.wait(30)
    assert ex.oracle is not o and ex.oracle.max_tokens == 25 and len(ex.oracles) == 2


def test_a_failing_prediction_shows_an_error(session, monkeypatch):
    ex = Explorer(session, prompt=PROMPT, max_tokens=16, n_max=2)
    ex.record_oracle()
    assert ex.wait(30)
    good = ex.prediction

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(whatif_controller, "simulate", broken)
    ex.controls.p_min.value = 0.5  # raises nothing into the caller
    assert ex.error == "ValueError (unexpected): boom" and "boom" in ex.error_area.value
    assert ex.prediction is good  # the last prediction stays
    monkeypatch.undo()
    ex.controls.p_min.value = 0.4
    assert ex.error == "" and ex.prediction.policy["p_min"] == pytest.approx(0.4)


def test_explorer_is_exposed_lazily():
    import subprocess
    import sys

    code = (
        "import sys, mtp_explorer as mx; assert 'ipywidgets' not in sys.modules; "
        "from mtp_explorer.widgets import Explorer; assert mx.Explorer is Explorer; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    import mtp_explorer as mx

    with pytest.raises(AttributeError):
        getattr(mx, "NoSuchThing")  # noqa: B009 (the attribute lookup is what is tested)


# -- the drafter selector --------------------------------------------------------------------------
def test_drafter_selector_sets_the_next_run(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=3, **SHORT_NGRAM)
    c = ex.controls
    d = c.drafter
    # llama.cpp's --spec-type values, in full, for every listed choice this session runs; the chain policy beside them
    assert isinstance(d, ipywidgets.Combobox) and d.description == "--spec-type" and not d.ensure_option
    runnable = [m for m in drafters.spec_type_choices() if drafters.mode(m).runs_with(True, session.draft_kind)]
    assert list(d.options) == runnable and "ngram-simple,ngram-map-k,draft-mtp" in d.options
    assert "draft-simple" in d.options and not {"draft-eagle3", "draft-dflash", "draft-dspark"} & set(d.options)
    # the others are shown apart, struck through, each with why this session cannot run it
    assert "not available in this session" in c.unavailable.value
    for name in ("draft-eagle3", "draft-dflash", "draft-dspark"):
        assert f"<s><code>{name}</code></s> (needs draft_model= of a" in c.unavailable.value
    assert "draft-mtp" not in c.unavailable.value and "draft-simple" not in c.unavailable.value
    assert d.value == "draft-mtp" and c.chain_policy.value == "first" and c.chain_policy.disabled
    assert "next Run" in c.drafter_note.value and "MTP" in c.drafter_note.value
    assert c.request().drafter == "draft-mtp" and c.request().settings.drafter == "draft-mtp"
    shown = lambda: {n for n, f in c.option_fields.items() if f.layout.display != "none"}  # noqa: E731
    assert shown() == set()  # the MTP head has no options
    d.value = "ngram-mod,draft-mtp"
    assert shown() == {o.name for o in drafters.DRAFTER_SPECS["ngram-mod"].options}
    assert all(c.option_fields[n].description.startswith("--spec-ngram-mod-") for n in shown())
    assert not c.chain_policy.disabled and c.request().settings.chain_policy == "first"
    c.chain_policy.value = "best"
    assert c.request().settings == mx.DraftSettings(
        drafter="ngram-mod,draft-mtp",
        chain_policy="best",
        n_max=3,
        max_tokens=64,
        seed=c.request().seed,
        options=dict(c.request().options),
    )
    d.value = "chain"  # a short spelling: shown as llama.cpp's value, its own policy with it
    assert d.value == "ngram-simple,draft-mtp" and c.chain_policy.value == "best"
    assert c.request().settings.mode == drafters.mode("chain") and c.request().settings.chain_policy == "best"
    d.value = "ngram-simple,no-such-drafter"  # typed: the note says why it is none, no option shows
    assert "mtpx-drafter-error" in c.drafter_note.value and "no-such-drafter" in c.drafter_note.value
    assert shown() == set() and c.mode is None
    d.value = "draft-mtp"
    ex.run()
    assert ex.wait(60)
    mtp_tokens = ex.trace.tokens
    assert ex.trace.settings["drafter"] == "draft-mtp" and ex.trace.steps_by_drafter()["ngram-simple"] == 0
    d.value = "ngram"  # a short spelling: the control shows llama.cpp's name, and the run records it
    assert d.value == "ngram-simple" and ex.controls.request().drafter == "ngram-simple"
    assert ex.controls.request().stream_kwargs()["settings"].drafter == "ngram-simple"
    assert {n for n, f in c.option_fields.items() if f.layout.display != "none"} == {
        "ngram_simple_size_n",
        "ngram_simple_size_m",
    }
    ex.run()
    assert ex.wait(60)
    t = ex.trace
    assert ex.error == "" and ex.finish_reason == "budget"
    assert t.settings["drafter"] == "ngram-simple"
    assert t.tokens == mtp_tokens  # greedy: the drafter changes the speed, never the text
    by = t.steps_by_drafter()
    assert by["draft-mtp"] == 0 and by["ngram-simple"] > 0
    assert ex.baseline is not None and len(ex.baselines) == 1  # the plain baseline does not depend on it
    d.value = "chain"
    ex.step()
    assert ex.wait(30)
    assert ex.state == "stepping" and ex.trace.settings["drafter"] == "ngram-simple,draft-mtp"
    assert ex.trace.settings["chain_policy"] == "best"
    ex.stop()
    assert ex.wait(30)


def test_drafter_change_during_a_run_applies_to_the_next_run(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=3000, n_max=3)
    ex.run()
    _wait_for(lambda: ex.n_steps >= 5)
    assert ex.state == "running"
    ex.controls.drafter.value = "ngram"  # the running generation keeps MTP
    changed_at = ex.n_steps
    _wait_for(lambda: ex.n_steps >= changed_at + 20)
    ex.stop()
    assert ex.wait(30)
    t = ex.trace
    assert ex.error == "" and t.finish_reason == "cancelled" and t.settings["drafter"] == "draft-mtp"
    assert t.steps_by_drafter()["ngram-simple"] == 0 and t.steps_by_drafter()["draft-mtp"] > 20
    ex.controls.max_tokens.value = 32
    ex.run()
    assert ex.wait(60)
    assert ex.trace.settings["drafter"] == "ngram-simple" and ex.trace.steps_by_drafter()["draft-mtp"] == 0


def test_whatif_follows_the_drafter(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=3, p_min=0.3, n_min=1)
    ex.record_oracle()
    assert ex.wait(60)
    o, c = ex.oracle, ex.controls
    assert o is not None and ex.whatif.drafter == "draft-mtp" and ex.prediction.policy["drafter"] == "draft-mtp"
    seen = {}
    for drafter in ("ngram-simple", "chain", "draft-mtp", "ngram"):  # a short spelling stands for llama.cpp's name
        c.drafter.value = drafter
        value = drafters.mode(drafter).name
        expected = mx.simulate(o, 3, 0.3, 1, drafter=drafter)
        es = expected.summary()
        w = ex.whatif
        assert ex.prediction.policy == expected.policy and w.drafter == value
        np.testing.assert_array_equal(ex.prediction.n_accepted, expected.n_accepted)
        for key in ("acceptance_rate", "mean_accepted_length", "tokens_per_second"):
            assert getattr(w, key) == pytest.approx(es[key], nan_ok=True), (drafter, key)
        assert w.acceptance_by_depth == pytest.approx(es["acceptance_by_depth"][:3], nan_ok=True)
        assert w.ceiling_tokens_per_second == pytest.approx(expected.ceiling_tokens_per_second())
        plain = mx.simulate(o, 0, drafter=drafter).predicted_tokens_per_second
        assert w.plain_tokens_per_second == pytest.approx(plain)
        assert w.speedup == pytest.approx(es["tokens_per_second"] / plain)
        assert ("p_min does not apply" in w.note) == (value == "ngram-simple")
        assert f"predicting the {value} drafter, n_max=3, p_min=0.30, n_min=1" in ex.whatif_panel.status
        assert f"<td>drafter</td><td>{value}</td>" in ex.whatif_panel.table
        assert f"{es['tokens_per_second']:.0f}" in ex.whatif_panel.table
        curve = _whatif_trace(ex, "predicted_speed_by_n_max", "predicted")
        assert _numbers(curve.y) == pytest.approx([r["tokens_per_second"] for r in speed_curve(o, 0.3, 1, drafter)])
        assert curve.y[2] == pytest.approx(es["tokens_per_second"])
        for name in widgets.WHATIF_NAMES:
            assert ex.whatif_panel.figure(name).layout.title.text.startswith(f"{value} · ")
        seen[value] = w.tokens_per_second
    assert len({round(v, 6) for v in seen.values()}) == 3  # the prediction moved with the drafter
    # a prediction of any drafter on demand
    assert ex.predict(drafter="chain").policy["drafter"] == "ngram-simple,draft-mtp"
    # the n-gram drafter has no confidence: p_min changes nothing
    tps = ex.whatif.tokens_per_second
    c.p_min.value = 0.8
    assert ex.whatif.drafter == "ngram-simple" and ex.whatif.tokens_per_second == pytest.approx(tps)


def test_a_measured_ngram_run_shows_only_with_the_ngram_drafter(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=4, p_min=0.0, n_min=0)
    ex.record_oracle()
    assert ex.wait(60)
    o = ex.oracle
    ex.controls.drafter.value = "ngram"
    ex.run()
    assert ex.wait(60)
    t = ex.trace
    assert t.settings["drafter"] == "ngram-simple" and ex.error == ""
    m = ex.whatif.measured
    assert m is not None and m.drafter == "ngram-simple" and m.same_settings is True
    ts = t.summary()
    assert m.tokens_per_second == pytest.approx(ts["tokens_per_second"])
    assert "measured / predicted" in ex.whatif_panel.table
    assert "<td>drafter</td><td>ngram-simple</td><td>ngram-simple</td>" in ex.whatif_panel.table
    cmp = mx.compare(o, t)
    assert not cmp.unexplained, cmp.unexplained[:2]
    if cmp.exact:
        np.testing.assert_array_equal(t.n_accepted, ex.prediction.n_accepted)
        assert m.acceptance_rate == pytest.approx(ex.whatif.acceptance_rate, nan_ok=True)
    # p_min does not apply to the n-gram drafter: still the same settings
    ex.controls.p_min.value = 0.5
    assert ex.whatif.measured.same_settings is True
    # another drafter: the ngram run is not its measurement
    for drafter in ("draft-mtp", "chain"):
        ex.controls.drafter.value = drafter
        name = drafters.mode(drafter).name
        assert ex.whatif.drafter == name and ex.whatif.measured is None, drafter
        assert f"with the {name} drafter" in ex.whatif.note
        assert "measured" not in ex.whatif_panel.table.split("</tr>")[0]
        assert not [d for d in ex.whatif_panel.figure("predicted_acceptance_by_depth").data if d.name == "measured"]
    ex.controls.drafter.value = "ngram"
    assert ex.whatif.measured is not None and ex.whatif.measured.drafter == "ngram-simple"
    # and an MTP run is measured for mtp only
    ex.controls.drafter.value = "mtp"
    ex.controls.p_min.value = 0.0
    ex.run()
    assert ex.wait(60)
    assert ex.whatif.measured.drafter == "draft-mtp" and ex.whatif.measured.same_settings is True
    ex.controls.drafter.value = "ngram"
    assert ex.whatif.measured is None


def test_a_model_without_mtp_drafts_with_ngram(model_no_mtp):
    with mx.Session.open(model_no_mtp, n_ctx=512, threads=1) as plain:
        assert not plain.info.has_mtp
        ex = Explorer(plain, prompt=PROMPT, max_tokens=48, n_max=3)
        d = ex.controls.drafter
        assert d.value == "ngram-simple" and "no MTP layers" in ex.children[0].value
        for choice in d.options:  # what it offers runs here
            d.value = choice
            assert not mode(choice).needs_mtp and "no MTP layers" not in ex.controls.drafter_note.value, choice
        assert (
            "draft-mtp" not in d.options
            and "<s><code>draft-mtp</code></s> (needs a model with MTP layers)" in ex.controls.unavailable.value
        )
        d.value = "draft-mtp"  # typed all the same: the note says why it cannot run
        assert "no MTP layers" in ex.controls.drafter_note.value
        d.value = "ngram"
        ex.run()
        assert ex.wait(60)
        assert ex.error == "" and ex.finish_reason == "budget" and ex.trace.settings["drafter"] == "ngram-simple"
        assert ex.trace.steps_by_drafter()["draft-mtp"] == 0 and ex.baseline is not None
        # mtp or chain: the session's error in the error area, nothing raised, the session usable
        for drafter, action in (("mtp", ex.run), ("chain", ex.step)):
            d.value = drafter
            action()
            assert ex.wait(30)
            assert ex.state == "idle", drafter
            assert ex.error.startswith("MtpUnavailableError:") and "no MTP layers" in ex.error, ex.error
            assert "no MTP layers" in ex.error_area.value and "Traceback" not in ex.error_area.value
        # the what-if mode: an oracle of n-gram drafts, recorded with the ngram drafter selected
        d.value = "ngram"
        ex.record_oracle()
        assert ex.wait(60)
        assert ex.error == "" and ex.oracle is not None and not ex.oracle.has_mtp
        expected = mx.simulate(ex.oracle, 3, 0.0, 0, drafter="ngram")
        assert ex.prediction.policy == expected.policy and ex.whatif.drafter == "ngram-simple"
        assert ex.whatif.tokens_per_second == pytest.approx(expected.summary()["tokens_per_second"])
        ex.run()
        assert ex.wait(60)
        assert ex.whatif.measured is not None and ex.whatif.measured.drafter == "ngram-simple"
        # mtp cannot be predicted from it: said in the panel, not an error
        d.value = "mtp"
        assert ex.prediction is None and ex.whatif is None and ex.error == ""
        assert "no MTP layers" in ex.whatif_panel.status and not ex.whatif_panel.showing
        with pytest.raises(mx.MtpUnavailableError):
            ex.predict()
        d.value = "ngram"
        assert ex.prediction is not None and ex.whatif_panel.showing


# -- the refactored parts: lazy facades, typed traits, the view registry, the what-if numbers, options --
def test_plots_and_widgets_are_reachable_right_after_import():
    import subprocess
    import sys

    code = (
        "import sys, mtp_explorer as mx\n"
        "assert not {'plotly', 'ipywidgets'} & set(sys.modules), 'import mtp_explorer loads no figures/widgets'\n"
        "assert callable(mx.plots.token_timeline) and callable(mx.plots.sweep_heatmap)\n"
        "assert isinstance(mx.widgets.Explorer, type) and mx.Explorer is mx.widgets.Explorer\n"
        "assert 'plotly' in sys.modules and 'ipywidgets' in sys.modules\n"
        "print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_traits_are_typed_and_documented(session):
    import traitlets as T

    for cls in (Explorer, widgets.GenerationRunner, widgets.WhatIfController):
        own = {name: t for name, t in cls.class_traits().items() if name in cls.__dict__}
        assert own, cls
        for name, trait in own.items():
            assert trait.help, f"{cls.__name__}.{name} has no help="
            assert not isinstance(trait, T.Any), f"{cls.__name__}.{name} is untyped"
    assert tuple(Explorer.class_traits()["state"].values) == widgets.STATES
    ex = Explorer(session, max_tokens=8)
    with pytest.raises(T.TraitError):
        ex.state = "sleeping"
    with pytest.raises(T.TraitError):
        ex.trace = "not a trace"


def test_whatif_holds_the_typed_numbers(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=2)
    ctl = ex.whatif_controller
    assert ctl.numbers is None and ex.whatif is None
    ex.record_oracle()
    assert ex.wait(30) and ex.error == ""
    w = ctl.numbers
    assert isinstance(w, widgets.WhatIf) and w.measured is None
    assert ex.whatif is w and (w.drafter, w.n_max) == ("draft-mtp", 2)
    ex.run()
    assert ex.wait(60)
    m = ctl.numbers.measured
    assert isinstance(m, widgets.MeasuredRun) and m.same_settings
    assert ex.whatif is ctl.numbers and ex.whatif.measured is m
    assert ex.prediction is ctl.prediction and ex.oracle is ctl.oracle


def test_a_registered_view_is_shown_by_every_new_explorer(session):
    import plotly.graph_objects as go

    names = tuple(widgets.VIEWS)
    assert names == tuple(plots.FIGURES)  # the per-trace figures, in the Explorer's order
    seen = []

    @widgets.register_view(width="half")
    def drafted_per_step(trace, baseline):
        seen.append(baseline)
        return go.Figure(go.Bar(y=trace.columns["n_drafted"].tolist()), layout={"title": {"text": "drafted"}})

    try:
        with pytest.raises(ValueError, match="registered already"):
            widgets.register_view(drafted_per_step)
        ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=3)
        assert ex.views.names == (*names, "drafted_per_step")
        assert ex.views.half == ("acceptance_by_depth", "accepted_length_histogram", "drafted_per_step")
        ex.run()
        assert ex.wait(60)
        fig = ex.figures["drafted_per_step"]
        assert list(fig.data[0].y) == ex.trace.columns["n_drafted"].tolist()
        # no fixed width: the figure follows its half of the row (plotly's autosize and responsive config)
        assert fig.layout.width is None and fig.layout.autosize and fig._config["responsive"]
        assert seen[-1] is ex.baseline is not None  # it takes the baseline: redrawn when the baseline arrives
        fixed = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=3, width=800)  # or a fixed width
        fixed.run()
        assert fixed.wait(60) and fixed.figures["drafted_per_step"].layout.width == 800 // 2
        only = Explorer(session, views=["token_timeline", "drafted_per_step"])
        assert set(only.figures) == {"token_timeline", "drafted_per_step"}
    finally:
        widgets.unregister_view("drafted_per_step")
    assert tuple(widgets.VIEWS) == names
    with pytest.raises(ValueError, match="width"):
        widgets.View("x", plots.rs_slots, width="wide")


def test_drafter_options_are_controls_and_key_the_oracle(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=24, n_max=3, drafter="ngram", ngram_n=2)
    fields = ex.controls.option_fields
    assert set(fields) == {o for o, _ in OPTIONS} and fields["ngram_simple_size_n"].value == 2
    assert dict(ex.controls.request().options)["ngram_simple_size_n"] == 2
    ex.run()
    assert ex.wait(60) and ex.error == ""
    assert ex.trace.settings["ngram_simple_size_n"] == 2 and ex.trace.settings["drafter"] == "ngram-simple"
    ex.record_oracle()
    assert ex.wait(60) and ex.error == ""
    o = ex.oracle
    assert o.settings["ngram_simple_size_n"] == 2 and ex.whatif.measured is not None  # the run used the oracle's sizes
    fields["ngram_simple_size_n"].value = 3  # another oracle: none recorded yet
    assert ex.oracle is None and ex.whatif is None
    fields["ngram_simple_size_n"].value = 2
    assert ex.oracle is o and ex.whatif.drafter == "ngram-simple"
    with pytest.raises(mx.ParameterError, match="unknown drafter option"):
        Explorer(session, ngram_x=1)


def test_the_schedule_control_reaches_the_whatif_and_the_next_run(session):
    """The schedule dropdown: the what-if replays it (each step's length in the prediction's n_max column), the next
    Run runs it and equals the prediction (greedy), and a drafter it cannot replay is said in the error area."""
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=5)
    ex.record_oracle()
    assert ex.wait(60)
    c = ex.controls
    assert c.schedule.options == mx.core.settings.SCHEDULES and c.schedule.value == "fixed"
    c.schedule.value = "heuristic"
    expected = mx.simulate(ex.oracle, 5, schedule="heuristic")
    assert ex.prediction.settings["schedule"] == "heuristic"
    np.testing.assert_array_equal(ex.prediction.columns["n_max"], expected.columns["n_max"])
    ex.run()
    assert ex.wait(60)
    assert ex.trace.draft_settings.schedule == "heuristic"
    np.testing.assert_array_equal(ex.trace.columns["n_accepted"], expected.columns["n_accepted"])
    c.drafter.value = "ngram-simple,draft-mtp"
    assert "single drafter without state" in ex.error
    c.schedule.value = "fixed"
    assert ex.error == "" and ex.prediction.settings["schedule"] == "fixed"


def test_the_schedules_panel_compares_fixed_schedules_and_the_bound(session):
    """The Schedules toggle: for this prompt and, once two prompts are recorded, for both together, the best fixed
    n_max, each schedule and the hindsight bound as ``mx.schedule_advice`` predicts them, each against the best fixed
    setting, with the advice in words; moving n_max keeps it (it compares up to the oracles' depth); off: nothing."""
    ex = Explorer(session, prompt=PROMPT, max_tokens=48, n_max=3)
    ex.record_oracle()
    assert ex.wait(60)
    view = ex.whatif_panel.schedules
    assert view.table.value == "" and view.toggle in ex.whatif_panel.children[0].children
    view.toggle.value = True
    advice = mx.schedule_advice(ex.oracle)
    text = view.table.value
    assert "this prompt" in text and "recorded prompts" not in text and ex.error == ""
    assert f"<td>{advice.best_fixed_tokens_per_second:.0f} tok/s (n_max {advice.best_fixed_n_max})</td>" in text
    others = advice.table[~advice.table["setting"].str.startswith("fixed")]
    assert list(others["setting"]) == ["heuristic (n_max 8)", "window (n_max 8)", "hindsight bound (n_max 8)"]
    for _, row in others.iterrows():
        cell = f"<td>{row['tokens_per_second']:.0f} tok/s ({row['vs_best_fixed']:.2f}×)"
        assert f"{row['setting']}</span></td>{cell}" in text
    assert html.escape(advice.note) in text
    ex.controls.n_max.value = 2
    assert view.table.value == text
    first = ex.oracle
    ex.controls.prompt.value = "import os"
    assert view.table.value == ""  # no oracle for this prompt yet
    ex.record_oracle()
    assert ex.wait(60)
    both = mx.schedule_advice([first, ex.oracle])
    text = view.table.value
    assert "this prompt" in text and "all 2 recorded prompts" in text
    assert f"<td>{both.best_fixed_tokens_per_second:.0f} tok/s (n_max {both.best_fixed_n_max})</td>" in text
    assert html.escape(both.note) in text
    view.toggle.value = False
    assert view.table.value == ""
