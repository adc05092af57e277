"""The Explorer widget without a browser: runs stream in a background thread and fill the figures;
Step, live settings, Stop, Run again, errors; the live trace equals the final one."""

from __future__ import annotations

import time

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer import plots
from mtp_explorer.widgets import LIVE_COLUMNS, Explorer, LiveTrace

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def session(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=4096, n_rs_seq=8, threads=1) as s:
        yield s


def _wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _timeline_tokens(ex: Explorer) -> int:
    fig = ex.figures["token_timeline"]
    return sum(len(t.x) for t in fig.data if t.name in (plots.ORIGIN_LABELS[k] for k in
                                                        ("accepted", "correction", "plain")))


def test_controls_follow_the_session(session):
    ex = Explorer(session, n_max=3)
    c = ex.controls
    assert (c.n_max.min, c.n_max.max, c.n_max.value) == (1, session.capacity, 3)
    assert (c.p_min.min, c.p_min.max, c.p_min.step) == (0.0, 1.0, 0.01)
    assert c.n_min.max == 3
    c.n_max.value = 5
    assert c.n_min.max == 5  # n_min never above n_max
    assert ex.state == "idle" and c.stop.disabled and not c.run.disabled
    assert set(ex.figures) == set(plots.FIGURES)


def test_run_fills_the_figures_and_caches_the_baseline(session):
    ex = Explorer(session, prompt=PROMPT, max_tokens=64, n_max=3)
    t0 = time.monotonic()
    ex.run()
    assert time.monotonic() - t0 < 1.0  # the kernel is not blocked
    assert ex.wait(60)
    assert ex.state == "idle" and ex.error == "" and ex.finish_reason == "budget"
    expected = session.generate(PROMPT, max_tokens=64, n_max=3)
    assert ex.trace.tokens == expected.tokens
    assert ex.n_tokens == 64 and ex.n_steps == expected.n_steps
    assert ex.progress.bar.value == 64 and "64/64 tokens" in ex.progress.label.value
    assert _timeline_tokens(ex) == 64
    assert list(ex.figures["acceptance_by_depth"].data[0].y) == pytest.approx(
        list(plots.acceptance_by_depth(ex.trace).data[0].y), nan_ok=True)
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


def test_live_trace_equals_the_final_trace(session):
    live = LiveTrace(PROMPT, {}, session.info.to_dict(), session.capacity, session.piece)
    for step in session.stream(PROMPT, max_tokens=60, n_max=4, p_min=0.1):
        live.add(step)
    final, partial = session.last_trace, live.trace()
    assert partial.tokens == final.tokens and partial.pieces == final.pieces
    assert set(partial.columns) == set(LIVE_COLUMNS) <= set(final.columns)
    for name in LIVE_COLUMNS:
        col = final.columns[name]
        assert partial.columns[name].dtype == col.dtype, name
        np.testing.assert_array_equal(partial.columns[name], col, err_msg=name)


def test_explorer_is_exposed_lazily():
    import subprocess
    import sys

    code = ("import sys, mtp_explorer as mx; assert 'ipywidgets' not in sys.modules; "
            "from mtp_explorer.widgets import Explorer; assert mx.Explorer is Explorer; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    import mtp_explorer as mx

    with pytest.raises(AttributeError):
        mx.NoSuchThing
