"""llama-server beside the engine: a real llama-server built from the same 0.3.36 sources (``make server``) on the
bundled model, started and stopped by the tests; parity of its texts and draft totals with ours (N = 1 and 2
concurrent requests); the ServerMonitor against it; and the error paths against a server that is down, or a
SYNTHETIC stand-in (Python's http.server) that answers garbage, HTTP errors or nothing."""

from __future__ import annotations

import http.server
import threading
import time
import warnings

import psutil
import pytest

import mtp_explorer as mx
from mtp_explorer.devtools.reference import (
    compare_with_server,
    explain_server_mismatch,
    replay_server,
    replay_server_parallel,
    rerun_server_batch,
)
from mtp_explorer.server import LlamaServer, Reading, ServerClient, ServerMonitor, SpecMetrics, free_port, parse_metrics

PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
)
N_PREDICT = 48
N_MAX = 3


@pytest.fixture(scope="module")
def server(bundled_model, server_binary):
    """A real llama-server, two slots, draft-mtp at n_max 3; stopped after the module, leaving no process."""
    srv = LlamaServer(
        bundled_model, n_parallel=2, n_ctx=4096, threads=1, spec_type="draft-mtp", n_max=N_MAX, binary=server_binary
    )
    with srv:
        pid = srv.process.pid
        yield srv
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def session(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=2048, threads=1) as s:
        yield s


@pytest.mark.parametrize("n_parallel", [1, 2])
@pytest.mark.server
def test_requests_on_fresh_slots_match_our_replay(bundled_model, server_binary, session, n_parallel):
    """N concurrent requests, each the first of its slot (a fresh server per batch: a reused slot's draft totals
    depend on what it served before in llama-server 0.3.36, see benchmarks/server.py): each text and draft_n /
    draft_n_accepted equal our single-sequence replay of its slot (the first token sampled from the prompt, then
    drafts cut to the budget left minus one). A divergence would have to be a floating-point near-tie between batch
    shapes (the server batches the slots' rows), found and reported with its margin."""
    ties = []
    for batch in (PROMPTS[i : i + n_parallel] for i in range(0, len(PROMPTS), n_parallel)):
        with LlamaServer(
            bundled_model,
            n_parallel=n_parallel,
            n_ctx=2048 * n_parallel,
            threads=1,
            spec_type="draft-mtp",
            n_max=N_MAX,
            binary=server_binary,
        ) as srv:
            answers = srv.client().complete_many(batch, N_PREDICT)
        for prompt, done in zip(batch, answers):
            ours = replay_server(session, prompt, n_predict=N_PREDICT, n_max=N_MAX)
            result = compare_with_server(done, ours)
            assert done.draft_n > 0 and 0 < done.draft_n_accepted <= done.draft_n
            if result["match"]:
                continue
            why = explain_server_mismatch(session, prompt, done, ours, max_rows=n_parallel * (N_MAX + 1))
            assert n_parallel > 1 and why["kind"] == "tie", (n_parallel, prompt, result, why)
            assert "batch-variant kernel" in why["explanation"], why
            ties.append(f"-np {n_parallel} {prompt!r}: {why['cause']} near-tie, margin {why['margin']:.4f}")
    assert len(ties) <= len(PROMPTS) // 4, ties
    if ties:
        warnings.warn(
            "llama-server batches differed from single-sequence runs at floating-point near-ties:\n" + "\n".join(ties),
            stacklevel=1,
        )


#: llama-server 0.3.36 samples drafts on the backend by default (--spec-draft-backend-sampling); with two slots
#: drafting draft-eagle3 together that mixes them up (a request's draft candidates carry the probabilities of its
#: run alone but other token ids, and its totals change from run to run; measured in benchmarks/server.py). With
#: --no-spec-draft-backend-sampling each slot drafts as it does alone, as our engine does.
HEAD_SERVER_ARGS = {"draft-eagle3": ["--no-spec-draft-backend-sampling"], "draft-dflash": [], "draft-dspark": []}


@pytest.mark.parametrize("n_parallel", [1, 2])
@pytest.mark.parametrize("spec_type", sorted(HEAD_SERVER_ARGS))
@pytest.mark.reference
@pytest.mark.server
def test_draft_heads_match_the_server(server_binary, spec_type, n_parallel):
    """The shipped EAGLE-3, DFlash and DSpark heads (-md) on llama-server with 1 and 2 slots: each request's text and
    draft_n / draft_n_accepted equal our replay of it as a server slot (the prompt in the server's batches, the
    first token sampled from them before any draft; llama.cpp's EAGLE-3 reads its deferred boundary row across
    those batches, which a replay that decodes the prompt as llama-speculative-simple does gets wrong)."""
    head = next(h for h in mx.draft_heads() if h.spec_type == spec_type)
    with mx.Session.open(
        head.target_path, draft_model=head.head_path, n_ctx=2048 * n_parallel, threads=1, n_parallel=n_parallel
    ) as s:
        for batch in (list(PROMPTS[i : i + n_parallel]) for i in range(0, len(PROMPTS), n_parallel)):
            with LlamaServer(
                head.target_path,
                n_parallel=n_parallel,
                n_ctx=2048 * n_parallel,
                threads=1,
                spec_type=spec_type,
                n_max=N_MAX,
                draft_model=head.head_path,
                args=HEAD_SERVER_ARGS[spec_type],
                binary=server_binary,
            ) as srv:
                answers = srv.client().complete_many(batch, N_PREDICT)
            ours = replay_server_parallel(s, batch, n_predict=N_PREDICT, n_max=N_MAX, drafter=spec_type)
            for prompt, done, trace in zip(batch, answers, ours.traces):
                result = compare_with_server(done, trace)
                assert result["match"], (spec_type, n_parallel, prompt, result)
                assert done.draft_n_accepted > 0


@pytest.mark.server
def test_a_draft_model_matches_the_server_through_its_checkpoint_replay(bundled_model, server_binary):
    """draft-simple on the hybrid bundled target: the target gets no snapshot slots for it, so after a partial
    acceptance llama-server restores a checkpoint and verifies the accepted tokens and the correction again with the
    token after them (spec_is_replay); replay_server steps plainly there, and each request's text and draft counters
    equal the server's (without that, 1 of 8 did)."""
    draft = mx.draft_model_path()
    with mx.Session.open(bundled_model, draft_model=draft, n_ctx=2048, threads=1) as s:
        for prompt in PROMPTS:
            with LlamaServer(
                bundled_model,
                n_parallel=1,
                n_ctx=2048,
                threads=1,
                spec_type="draft-simple",
                n_max=N_MAX,
                draft_model=draft,
                binary=server_binary,
            ) as srv:
                done = srv.client().complete(prompt, N_PREDICT)
            ours = replay_server(s, prompt, n_predict=N_PREDICT, n_max=N_MAX, drafter="draft-simple")
            result = compare_with_server(done, ours)
            assert result["match"] and done.draft_n_accepted > 0, (prompt, result)
            assert (ours.n_drafted[1:][ours.n_accepted[:-1] < ours.n_drafted[:-1]] == 0).all()


def test_a_server_slot_decodes_the_prompt_in_the_servers_batches(bundled_model, session):
    """server_slot=True: the first step decodes the prompt's last batch (its last 4 tokens on this hybrid model,
    where llama-server checkpoints before them; the whole of a shorter prompt) and samples the first token before
    any draft; the tokens are those of the default run, which decodes all but the last prompt token first."""
    for prompt in ("def fibonacci(n):", "x ="):
        n_prompt = len(session.tokenize(prompt))
        slot = session.generate(prompt, max_tokens=16, n_max=3, server_slot=True)
        plain = session.generate(prompt, max_tokens=16, n_max=3)
        first = slot.to_pandas().iloc[0]
        assert first["verify_rows"] == (4 if n_prompt > 4 else n_prompt), (prompt, n_prompt)
        assert first["n_drafted"] == 0 and first["n_max"] == 0 and slot.n_drafted[1:].sum() > 0
        assert slot.tokens == plain.tokens
        assert slot.draft_settings.server_slot and not plain.draft_settings.server_slot
    with mx.Session.open(mx.models.draft_model_path(), threads=1) as target:  # qwen3: no checkpoints, one batch
        prompt = "def fibonacci(n):\n    return"
        slot = target.generate(prompt, max_tokens=16, drafter="ngram-simple", server_slot=True)
        assert slot.to_pandas().iloc[0]["verify_rows"] == len(target.tokenize(prompt))
    with pytest.raises(mx.ParameterError, match="server_slot"):
        mx.DraftSettings(server_slot="yes")


@pytest.mark.server
def test_a_batch_of_slots_matches_our_parallel_replay(bundled_model, server_binary):
    """-np 4: four concurrent requests on a fresh server against the same four as one batch of our engine's four
    sequences (one target batch per step, the MTP drafts of all four decoded together): each text and draft_n /
    draft_n_accepted equal, or a reported near-tie. llama-server itself varies from run to run here (the first
    request gets another text in about 1 run of 6, always the same other one; ours never varies), so a request that
    differs beyond a near-tie must match in one of three fresh server runs of the same batch, and is reported."""
    with LlamaServer(
        bundled_model, n_parallel=4, n_ctx=2048 * 4, threads=1, spec_type="draft-mtp", n_max=N_MAX, binary=server_binary
    ) as srv:
        answers = srv.client().complete_many(list(PROMPTS), N_PREDICT)
    with mx.Session.open(bundled_model, n_ctx=2048 * 4, threads=1, n_parallel=4) as s:
        ours = replay_server_parallel(s, list(PROMPTS), n_predict=N_PREDICT, n_max=N_MAX)
        assert ours.to_pandas()["n_active"].max() == 4
        ties, varied = [], []
        for j, (prompt, done, trace) in enumerate(zip(PROMPTS, answers, ours.traces)):
            result = compare_with_server(done, trace)
            if result["match"]:
                continue
            why = explain_server_mismatch(s, prompt, done, trace, max_rows=4 * (N_MAX + 1))
            if why["kind"] == "tie":
                ties.append(f"{prompt!r}: {why['cause']} near-tie, margin {why['margin']:.4f}")
                continue
            reruns = rerun_server_batch(
                bundled_model,
                list(PROMPTS),
                j,
                trace,
                n_predict=N_PREDICT,
                n_max=N_MAX,
                threads=1,
                binary=server_binary,
            )
            assert any(r["match"] for r in reruns), (prompt, result, why, reruns)
            varied.append(
                f"{prompt!r}: the server's text differed (margin {why['margin']:.3f}); "
                f"{sum(r['match'] for r in reruns)} of {len(reruns)} fresh server runs equal ours"
            )
    assert len(ties) + len(varied) <= 1, ties + varied
    if ties or varied:
        warnings.warn("a batch differed from the server's:\n" + "\n".join(ties + varied), stacklevel=1)


@pytest.mark.server
def test_monitor_reads_the_servers_counters(server):
    monitor = ServerMonitor(server.url)
    assert monitor.state == "unknown"
    before = monitor.poll().metrics
    assert monitor.state == "connected" and before is not None
    answers = monitor.complete_many(PROMPTS[:2], N_PREDICT)
    after = monitor.poll().metrics
    grown = after.since(before)
    # the counters grew by what the two requests report
    assert grown.draft_tokens == sum(a.draft_n for a in answers)
    assert grown.accepted_tokens == sum(a.draft_n_accepted for a in answers)
    assert grown.tokens_predicted == sum(a.tokens_predicted for a in answers)
    assert len(after.accepted_per_pos) == N_MAX and sum(grown.accepted_per_pos) == grown.accepted_tokens
    by_pos = grown.acceptance_by_position
    assert all(0.0 <= a <= 1.0 for a in by_pos) and by_pos == sorted(by_pos, reverse=True)
    s = monitor.summary()
    assert s["state"] == "connected" and s["requests"] == 2 and s["tokens_per_second"] > 0
    assert s["drafted_per_request"] == sum(a.draft_n for a in answers) / 2
    frame = monitor.requests_frame()
    assert list(frame["prompt"]) == list(PROMPTS[:2]) and (frame["draft_n"] > 0).all()


@pytest.mark.server
def test_monitor_windows_a_server_under_load(server):
    """Rates over a window and the time series of polls, read while two clients keep the server's slots busy."""
    monitor = ServerMonitor(server.url)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            monitor.complete_many(PROMPTS[:2], N_PREDICT)

    clients = threading.Thread(target=load, daemon=True)
    clients.start()

    def loaded() -> bool:  # 8 polls reached the server, and the load shows in its counters between them
        up = [r for r in monitor.readings if r.connected]
        return len(up) >= 8 and up[-1].metrics.since(up[0].metrics).accepted_tokens > 0

    try:  # polls until then, however long a busy machine takes to answer
        deadline = time.monotonic() + 120.0  # a guard against a server that never answers, not a speed bound
        while not loaded() and time.monotonic() < deadline:
            monitor.poll()
            time.sleep(0.25)
    finally:
        stop.set()
        clients.join(timeout=60)
    up = [r for r in monitor.readings if r.connected]
    assert len(up) >= 8
    w = monitor.window(up[-1].time - up[0].time + 1e-6)  # every poll (the span from the polls' own times)
    grown = up[-1].metrics.since(up[0].metrics)
    assert w.seconds == pytest.approx(up[-1].time - up[0].time)
    assert w.tokens_per_second == pytest.approx(grown.tokens_predicted / w.seconds) and w.tokens_per_second > 0
    assert 0 < w.accepted_per_second <= w.drafted_per_second and 0.0 <= w.acceptance_rate <= 1.0
    assert w.acceptance_rate == pytest.approx(grown.acceptance_rate)
    # a window that reaches back to the third-last poll only (its span taken from the polls' own times)
    short = monitor.window(up[-1].time - up[-3].time + 1e-6)
    assert short is not None and (short.start, short.seconds) == (up[-3].time, pytest.approx(up[-1].time - up[-3].time))
    assert short.start > w.start
    frame = monitor.series()
    assert len(frame) == len(up) - 1
    # the intervals add up to the window: tokens and seconds
    assert (frame["tokens_per_second"] * frame["seconds"]).sum() == pytest.approx(grown.tokens_predicted)
    assert frame["seconds"].sum() == pytest.approx(w.seconds)
    fig = mx.plots.server_rates(monitor, window=up[-1].time - up[0].time + 1e-6)
    assert [t.name for t in fig.data] == [
        "tokens per second",
        "drafted per second",
        "accepted per second",
        "acceptance rate",
    ]
    assert "tok/s" in fig.layout.title.text and len(fig.data[0].x) == len(frame)


def _reading(t: float, tokens: int, drafted: int, accepted: int, drafts: int) -> Reading:
    """A SYNTHETIC poll: counters as llama-server's /metrics would give them."""
    return Reading(
        t,
        SpecMetrics(
            drafts=drafts,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            accepted_per_pos=(accepted,),
            tokens_predicted=tokens,
            predicted_seconds=t / 2,
        ),
    )


def test_monitor_window_series_and_ring_buffer_on_synthetic_polls():
    monitor = ServerMonitor("http://127.0.0.1:9", capacity=5)
    assert monitor.window(10) is None and monitor.series().empty
    polls = [
        _reading(100, 0, 0, 0, 0),
        _reading(101, 50, 20, 10, 10),
        _reading(102, 90, 40, 30, 20),
        Reading(103, None, "unreachable"),
        _reading(104, 10, 4, 2, 2),  # restarted: counters start again
        _reading(106, 50, 14, 8, 6),
    ]
    monitor.readings.extend(polls)
    assert len(monitor.readings) == 5 and monitor.readings[0].time == 101  # the oldest poll left the ring
    frame = monitor.series()
    assert list(frame["start"]) == [101, 104]  # the interval across the restart is left out
    assert list(frame["tokens_per_second"]) == [40.0, 20.0]
    w = monitor.window(60)  # back to the restart only
    assert (w.start, w.seconds, w.tokens_per_second, w.acceptance_rate) == (104, 2, 20.0, 0.6)
    assert w.drafted_per_second == 5.0 and w.accepted_per_second == 3.0 and w.mean_accepted_length == 1.5
    # the chart: seconds since the first poll on x (not clock times a few ms apart), every interval a visible point,
    # the acceptance axis 0..1 in quarters
    fig = mx.plots.server_rates(monitor, window=60)
    assert list(fig.data[0].x) == [1.0, 5.0] and fig.layout.xaxis.title.text == "seconds since the first poll"
    rate = fig.data[-1]
    assert rate.name == "acceptance rate" and "markers" in rate.mode and list(rate.y) == [1.0, 0.6]
    assert (tuple(fig.layout.yaxis2.range), fig.layout.yaxis2.dtick) == ((0, 1.05), 0.25)
    with pytest.raises(mx.ParameterError, match="window"):
        monitor.window(0)
    with pytest.raises(mx.ParameterError, match="capacity"):
        ServerMonitor("http://127.0.0.1:9", capacity=1)


@pytest.mark.server
def test_a_server_that_fails_to_start_leaves_nothing_behind(tmp_path, server_binary):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    srv = LlamaServer(bad, binary=server_binary, startup_timeout=60)
    with pytest.raises(mx.ServerUnavailableError, match="exited"):
        srv.start()
    assert srv.process is None and not srv.running


@pytest.mark.server
def test_a_missing_binary_or_model_is_named(tmp_path, bundled_model):
    with pytest.raises(mx.ServerUnavailableError, match="no llama-server binary at"):
        LlamaServer(bundled_model, binary=tmp_path / "nope")
    with pytest.raises(mx.ServerUnavailableError, match="model file not found"):
        LlamaServer(tmp_path / "missing.gguf")


# -- error paths --------------------------------------------------------------------------------------------
def test_parse_metrics():
    text = (
        "# HELP llamacpp:spec_decode_num_drafts_total x\nllamacpp:spec_decode_num_drafts_total 4\n"
        "llamacpp:spec_decode_num_draft_tokens_total 12\nllamacpp:spec_decode_num_accepted_tokens_total 7\n"
        "llamacpp:tokens_predicted_total 20\nllamacpp:tokens_predicted_seconds_total 0.25\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n'
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 4\n'
    )
    m = SpecMetrics.from_samples(parse_metrics(text))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.accepted_per_pos) == (4, 12, 7, (4, 2))
    assert m.acceptance_by_position == [1.0, 0.5] and m.tokens_per_second == 80.0
    assert m.since(m).drafts == 0 and m.since(m).accepted_per_pos == (0, 0)
    for bad in ("llamacpp:x{position=0} 1", "just words", "llamacpp:x one"):
        with pytest.raises(mx.ServerProtocolError):
            parse_metrics(bad)
    with pytest.raises(mx.ServerProtocolError, match="lack llamacpp:spec_decode_num_drafts_total"):
        SpecMetrics.from_samples(parse_metrics("llamacpp:tokens_predicted_total 3"))


class _Stand_in(http.server.BaseHTTPRequestHandler):
    """SYNTHETIC: a stand-in server answering each path with one failure mode."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/metrics":
            self._send(200, b"this is not prometheus\n")
        elif self.path == "/health":
            self._send(200, b"{not json")
        elif self.path == "/slow/metrics":
            time.sleep(3)
            self._send(200, b"")
        else:
            self._send(404, b"no")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(500, b'{"error": "boom"}') if self.path == "/completion" else self._send(200, b"{not json")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stand_in():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stand_in)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_monitor_of_a_server_that_is_down():
    monitor = ServerMonitor(f"http://127.0.0.1:{free_port()}", timeout=2)
    reading = monitor.poll()
    assert not reading.connected and "unreachable" in reading.error and monitor.state == "disconnected"
    assert monitor.summary()["state"] == "disconnected"
    with pytest.raises(mx.ServerUnavailableError):
        monitor.complete("x", 4)


def test_monitor_of_a_server_that_answers_garbage_or_nothing(stand_in):
    monitor = ServerMonitor(stand_in, timeout=1)
    reading = monitor.poll()
    assert not reading.connected and "malformed" in reading.error
    with pytest.raises(mx.ServerProtocolError, match="HTTP 500"):
        monitor.complete("x", 4)
    slow = ServerMonitor(stand_in + "/slow", timeout=0.5)
    assert not slow.poll().connected and slow.state == "disconnected"  # bounded by the timeout, no hang
    with pytest.raises(mx.ServerProtocolError, match="not JSON"):
        ServerClient(stand_in).health()
    with pytest.raises(mx.ServerProtocolError, match="HTTP 404"):
        ServerClient(stand_in + "/elsewhere").health()
    with pytest.raises(mx.ServerProtocolError, match="starts with http"):
        ServerMonitor("localhost:8080")


@pytest.mark.server
def test_explorer_tab_watches_the_server(server, session, stand_in):
    from mtp_explorer.widgets import Explorer, ServerView

    ex = Explorer(session, server=server.url)
    view = ex.server_view
    assert isinstance(view, ServerView) and view.state == "unknown"
    view.monitor.complete(PROMPTS[0], 16)
    view.refresh()
    assert view.state == "connected" and "connected" in view.status.value
    assert [t.name for t in view.figure.data] == ["acceptance", "tokens/s", "drafted tokens"]
    view.refresh()  # two answered polls: one interval of the series
    assert len(view.rates_figure.data[0].x) == 1 and "llama-server over time" in view.rates_figure.layout.title.text
    view.window_field.value = 5.0
    assert view.window == 5.0 and "last 5 s" in view.rates_figure.layout.title.text
    assert len(view.figure.data[1].y) == 1  # the request sent through the monitor
    # a server that answers garbage: the tab says disconnected, and says why
    down = ServerView(stand_in)
    down.refresh()
    assert down.state == "disconnected" and "malformed" in down.status.value
    down.interval = 0.2
    down.watching = True
    _wait = time.monotonic() + 60
    while len(down.monitor.readings) < 3 and time.monotonic() < _wait:
        time.sleep(0.1)
    down.watching = False
    assert len(down.monitor.readings) >= 3  # polling went on while disconnected
    down.close()
    ex.close()
