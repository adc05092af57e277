"""Faults from outside the package: a llama-server killed (SIGKILL) in the middle of a sweep's configuration, or
the sweep interrupted (SIGINT); a model file removed or truncated while a session holds it; a trace or oracle JSON
from an untrusted source (truncated, of wrong types, of mismatched or huge arrays, with NaN, unknown keys or what
would execute code elsewhere). Each is a clear error of the package's hierarchy (or a failed sweep row), never a
crash, a hang, a process left behind or code run."""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.batch_shift import BatchShift
from mtp_explorer.analysis.oracle import OracleTrace
from mtp_explorer.server import LlamaServer, Workload

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPT = "def fibonacci(n):"


# -- llama-server killed or interrupted during a sweep -------------------------------------------------------------
STAND_IN = '''#!{python}
"""SYNTHETIC llama-server: answers every /completion after --spec-draft-n-max tenths of a second, and reports the
requests it is serving as llama-server's requests_processing gauge."""
import http.server, json, sys, threading, time
argv = sys.argv
port = int(argv[argv.index("--port") + 1])
delay = int(argv[argv.index("--spec-draft-n-max") + 1]) / 10
busy, served, lock = [0], [0], threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, body, kind="application/json", code=200):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(json.dumps({{"status": "ok"}}))
        n = served[0]
        lines = ["llamacpp:spec_decode_num_drafts_total %d" % (4 * n),
                 "llamacpp:spec_decode_num_draft_tokens_total %d" % (8 * n),
                 "llamacpp:spec_decode_num_accepted_tokens_total %d" % (6 * n),
                 "llamacpp:tokens_predicted_total %d" % (10 * n),
                 "llamacpp:tokens_predicted_seconds_total %f" % (0.1 * n),
                 "llamacpp:requests_processing %d" % busy[0]]
        self.reply("\\n".join(lines) + "\\n", "text/plain")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/completion":
            return self.reply("{{}}", code=404)
        with lock:
            busy[0] += 1
        time.sleep(delay)
        with lock:
            busy[0] -= 1
            served[0] += 1
        self.reply(json.dumps({{"content": "x", "stop_type": "limit", "timings": {{
            "predicted_n": 10, "predicted_ms": 100.0, "predicted_per_second": 100.0, "prompt_n": 3,
            "prompt_ms": 1.0, "draft_n": 8, "draft_n_accepted": 6}}}}))


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture()
def stand_in(tmp_path) -> tuple[Path, Path]:
    """A SYNTHETIC llama-server (a Python script) and a model file it does not read."""
    binary = tmp_path / "llama-server"
    binary.write_text(textwrap.dedent(STAND_IN).format(python=sys.executable))
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return binary, model


def _servers_left() -> list[psutil.Process]:
    """llama-servers (real or stand-in) this test process started that still run (not zombies); the suite's other
    children (a fixture's server, workers) are not the sweep's."""
    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any("llama-server" in a for a in p.cmdline()[:2]):
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def _child(pid: int) -> bool:
    """Whether ``pid`` is still a child of this process: running, or a zombie nobody reaped."""
    return pid in [p.pid for p in psutil.Process().children(recursive=True)]


def _when_busy(server: LlamaServer, act, timeout: float = 60.0) -> threading.Thread:
    """A thread that calls ``act(process)`` once ``server`` serves a request (its requests_processing gauge), with
    the server's Popen (whose send_signal never reaches a reaped process's reused pid)."""
    proc, client = server.process, server.client(timeout=5.0)

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.metrics().requests_processing >= 1:
                    act(proc)
                    return
            except mx.ServerError:
                pass
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _kill_second_server(killed: list[int]):
    """An ``on_server_started`` hook that SIGKILLs the sweep's second server once a request is in flight."""
    started = []

    def hook(server: LlamaServer, config: dict) -> None:
        started.append(config)
        if len(started) == 2:

            def kill(proc: subprocess.Popen) -> None:
                killed.append(proc.pid)
                proc.send_signal(signal.SIGKILL)

            _when_busy(server, kill)

    return hook


def _check_killed_sweep(sweep, killed: list[int], n_requests: int) -> None:
    status = list(sweep.frame["status"])
    assert len(killed) == 1 and len(status) == 3, (killed, status)
    assert status[0] == "ok" and status[2] == "ok", status  # the sweep went on with a new server
    assert status[1].startswith("crashed (killed by SIGKILL) during the workload"), status[1]
    row = sweep.frame.iloc[1]
    assert row["n_requests"] == n_requests and math.isnan(row["tokens_per_second"])
    assert not sweep.requests.iloc[n_requests : 2 * n_requests]["ok"].any()
    assert sweep.requests.iloc[2 * n_requests :]["ok"].all()
    assert list(sweep.best()["n_max"]) in ([1], [3])  # the killed configuration is never recommended
    assert not _child(killed[0]) and not _servers_left()  # the killed server reaped, the others stopped


def test_a_server_killed_mid_configuration_is_that_rows_failure(stand_in):
    """SIGKILL while a request is in flight: that row failed with the signal named, its process reaped, and the
    next configuration ran on a new server (a SYNTHETIC stand-in: always runs)."""
    binary, model = stand_in
    killed: list[int] = []
    sweep = mx.server_sweep(
        model,
        ["a", "b"],
        {"n_max": [1, 5, 3]},
        n_predict=8,
        binary=binary,
        timeout_s=30,
        progress=False,
        on_server_started=_kill_second_server(killed),
    )
    _check_killed_sweep(sweep, killed, 2)
    assert "2 of 2 requests failed" in sweep.frame.iloc[1]["status"]


@pytest.mark.server
def test_a_real_llama_server_killed_mid_configuration(bundled_model, server_binary):
    """The same with llama-server on the bundled model."""
    killed: list[int] = []
    workload = Workload.from_prompts([PROMPT, "import os\n"], n_predict=256)  # ~0.6 s each, one after the other
    sweep = mx.server_sweep(
        bundled_model,
        workload,
        {"spec_type": "draft-mtp", "n_max": [1, 2, 3], "n_parallel": 1},
        n_ctx=1024,
        threads=1,
        binary=server_binary,
        timeout_s=60,
        progress=False,
        on_server_started=_kill_second_server(killed),
    )
    _check_killed_sweep(sweep, killed, 2)


def _interrupted_sweep(model, workload, grid, **kw) -> tuple[float, list[int]]:
    """Run a sweep that a SIGINT to this process interrupts while its first server serves a request; the seconds
    from the signal to the KeyboardInterrupt, and the server's pid."""
    sent, pids = [], []

    def interrupt(proc: subprocess.Popen) -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    def hook(server: LlamaServer, config: dict) -> None:
        pids.append(server.process.pid)
        _when_busy(server, interrupt)

    # SIGINT delivered to Python's own handler, as in a kernel (an earlier test of the suite may have left it blocked
    # or handled otherwise)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # the suite's process may have it blocked
    try:
        with pytest.raises(KeyboardInterrupt):
            mx.server_sweep(model, workload, grid, progress=False, on_server_started=hook, **kw)
            time.sleep(5)  # not reached: the interrupt comes while the server serves
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)
    assert len(sent) == 1 and len(pids) == 1
    return time.monotonic() - sent[0], pids


def test_an_interrupted_sweep_stops_its_server_and_propagates(stand_in):
    """SIGINT while a request is in flight: KeyboardInterrupt at once, no server left (before the fix it waited for
    the requests to end, here 60 s)."""
    binary, model = stand_in
    request_s = 600 / 10  # the stand-in serves a request in n_max / 10 s
    seconds, pids = _interrupted_sweep(
        model, ["a", "b"], {"n_max": [600, 1]}, n_predict=8, binary=binary, timeout_s=120
    )
    assert seconds < request_s / 2, seconds  # not waiting for the request in flight, however busy the machine
    assert not _child(pids[0]) and not _servers_left()


@pytest.mark.server
def test_an_interrupted_sweep_stops_a_real_llama_server(bundled_model, server_binary):
    """The same with llama-server generating 2000 tokens."""
    workload = Workload.from_prompts([PROMPT], n_predict=2000)
    seconds, pids = _interrupted_sweep(
        bundled_model,
        workload,
        {"spec_type": "draft-mtp", "n_max": [2, 3]},
        n_ctx=4096,
        threads=1,
        binary=server_binary,
        timeout_s=120,
    )
    # killed at once: a busy llama-server would outlast stop()'s grace after SIGTERM
    grace = inspect.signature(LlamaServer.stop).parameters["timeout"].default
    assert seconds < grace, seconds
    assert not _child(pids[0]) and not _servers_left()


# -- a model file removed or truncated under a session ---------------------------------------------------------------
def _calls_after(tmp_path: Path, change: str, load_mode: str = "auto") -> dict[str, list]:
    """What each call of a session on a copy of the bundled model does after ``change`` (Python run on ``path``
    once the session generated): ``["ok", value]`` or ``[exception type, message]``. In a fresh interpreter: a
    mapped file's pages past a truncation stop the process with SIGBUS when read."""
    from conftest import run_isolated

    proc = run_isolated(f"""
        import json, os, shutil
        import mtp_explorer as mx
        path = {str(tmp_path / "model.gguf")!r}
        shutil.copy(mx.default_model_path(), path)
        out = {{}}
        with mx.Session.open(path, n_ctx=1024, threads=1, n_parallel=2, load_mode={load_mode!r}) as s:
            first = s.generate({PROMPT!r}, max_tokens=8).text
            {change}
            calls = {{
                "generate": lambda: s.generate({PROMPT!r}, max_tokens=8).text == first,
                "stream": lambda: len(list(s.stream({PROMPT!r}, max_tokens=8))) > 0,
                "record_oracle": lambda: s.record_oracle({PROMPT!r}, max_tokens=8, depth=2, probe=False,
                                                         batch_shift=False).n_positions,
                "generate_parallel": lambda: len(s.generate_parallel([{PROMPT!r}, "import os"], max_tokens=4).traces),
                "info": lambda: s.info.name,
                "tokenize": lambda: len(s.tokenize("x = 1")),
                "model_info": lambda: mx.model_info(path).name,
            }}
            for name, call in calls.items():
                try:
                    out[name] = ["ok", call()]
                except Exception as exc:
                    out[name] = [type(exc).__name__, str(exc)]
        print("RESULT", json.dumps(out))
    """)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def test_a_model_file_removed_under_a_session_changes_nothing(tmp_path):
    """Linux keeps a removed file's data while it is mapped: the session goes on with the weights it opened (the
    same text); only a new look at the path (model_info) finds no file."""
    out = _calls_after(tmp_path, "os.remove(path)")
    assert out.pop("generate") == ["ok", True]
    assert out.pop("model_info")[0] == "ModelNotFoundError"
    assert all(status == "ok" for status, _ in out.values()), out


@pytest.mark.parametrize(
    "change, what",
    [
        ("os.truncate(path, os.path.getsize(path) // 2)", "truncated from"),
        ("os.truncate(path, 0)", "truncated from"),
        (
            "f = open(path, 'r+b'); f.seek(os.path.getsize(path) // 2); f.write(b'\\xff' * 65536); f.close()",
            "rewritten in place",
        ),
    ],
)
def test_a_model_file_truncated_or_rewritten_under_a_session_is_a_clear_error(tmp_path, change, what):
    """Before the fix a truncated file stopped the process with SIGBUS at the next generation, and one rewritten in
    place gave another text: every call that reads the weights now raises ModelFileChangedError first; what the
    session keeps in memory (its facts, the vocabulary) still answers."""
    out = _calls_after(tmp_path, change)
    for name in ("generate", "stream", "record_oracle", "generate_parallel"):
        kind, message = out[name]
        assert kind == "ModelFileChangedError" and what in message and "load_mode='none'" in message, (name, out)
    assert out["info"] == ["ok", "pystdlib-qwen35-mtp"] and out["tokenize"][0] == "ok"
    assert issubclass(mx.ModelFileChangedError, mx.ModelLoadError)
    if "truncate" in change:
        assert out["model_info"][0] == "ModelLoadError"


def test_a_session_that_copied_its_weights_ignores_the_file(tmp_path):
    """load_mode='none' reads the weights into memory: the file truncated under it changes nothing."""
    out = _calls_after(tmp_path, "os.truncate(path, 0)", load_mode="none")
    assert out.pop("generate") == ["ok", True] and out.pop("model_info")[0] == "ModelLoadError"
    assert all(status == "ok" for status, _ in out.values()), out


# -- a trace or an oracle JSON from an untrusted source -------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(bundled_model) -> dict[str, str]:
    """A trace and an oracle (with a cost model and a batch-shift record) as their to_json wrote them."""
    import dataclasses

    with mx.Session.open(bundled_model, n_ctx=512, threads=1) as s:
        trace = s.generate(PROMPT, max_tokens=12, n_max=2)
        oracle = s.record_oracle(PROMPT, max_tokens=12, depth=2, probe=False, batch_shift=False)
    shift = BatchShift(
        model="m.gguf",
        file_id="abc",
        machine={"cpu": "x"},
        n_positions=8,
        ks=(2, 3),
        margin_shift=(0.1, 0.2),
        logit_shift=(0.3, 0.4),
        n_flips=(0, 1),
        smallest_margin=0.05,
        starts=(0, 4),
        segment_shift=((0.1, 0.05), (0.2, 0.1)),
    )
    oracle = dataclasses.replace(oracle, cost_model=oracle.fitted_cost, batch_shift=shift)
    return {"trace": trace.to_json(), "oracle": oracle.to_json()}


LOADERS = {"trace": mx.Trace.from_json, "oracle": OracleTrace.from_json}

#: Audit events that would mean a loader runs or unpickles something (sys.addaudithook; only while _load runs).
_FORBIDDEN_EVENTS = {
    "exec",
    "compile",
    "pickle.find_class",
    "marshal.loads",
    "os.system",
    "subprocess.Popen",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "ctypes.dlopen",
    "builtins.input",
}
_audit = threading.local()


def _audit_hook(event: str, args: tuple) -> None:
    if getattr(_audit, "events", None) is not None and event in _FORBIDDEN_EVENTS:
        _audit.events.append(event)


def _load(kind: str, text: str | bytes):
    """``kind``'s loader on ``text``: what it returns, else the FormatError it raises (any other exception fails the
    test, as does anything it executes or unpickles)."""
    if not getattr(_load, "hooked", False):  # an audit hook stays for the process's life: one, added when needed
        sys.addaudithook(_audit_hook)
        _load.hooked = True
    _audit.events = []
    try:
        return LOADERS[kind](text)
    except mx.FormatError as exc:
        return exc
    finally:
        events, _audit.events = _audit.events, None
        assert not events, events


def _rejected(kind: str, doc_or_text) -> mx.FormatError:
    text = doc_or_text if isinstance(doc_or_text, (str, bytes)) else json.dumps(doc_or_text)
    got = _load(kind, text)
    assert isinstance(got, mx.FormatError), f"accepted: {text[:300]!r}"
    return got


def test_the_saved_documents_load_back(saved):
    assert isinstance(_load("trace", saved["trace"]), mx.Trace)
    oracle = _load("oracle", saved["oracle"])
    assert isinstance(oracle, OracleTrace) and oracle.batch_shift.ks == (2, 3) and oracle.cost_model is not None


@pytest.mark.parametrize("kind", LOADERS)
def test_truncated_documents_are_format_errors(saved, kind):
    text = saved[kind]
    for cut in sorted({0, 1, 2, 10, 100, len(text) // 3, len(text) // 2, len(text) - 2, len(text) - 1}):
        _rejected(kind, text[:cut])
    for junk in ("", "null", "[]", "7", '"trace"', "{", "\x00\xff", b"\xff\xfe\x00{", "{}" * 3):
        _rejected(kind, junk)


#: Values of every JSON kind, to put where another kind belongs.
_VALUES = [None, True, 7, 2.5, "s", [], [None], [1.5], ["s"], [True], [[1]], {}, {"k": 1}]


def _same_kind(a, b) -> bool:
    """Whether ``b`` is of ``a``'s JSON kind, recursively for lists (empty lists match any list)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return isinstance(a, float) or isinstance(b, int)  # an int stands for a float, not a float for an int
    if isinstance(a, list) and isinstance(b, list):
        return not a or not b or all(_same_kind(a[0], x) for x in b)
    return type(a) is type(b)


def _paths(kind: str, doc: dict) -> list[tuple]:
    """The places whose values are typed: every field, and the fields within the documents inside."""
    top = [(k,) for k in doc]
    columns = [("columns", c, f) for c in list(doc["columns"])[::9] for f in ("dtype", "shape", "data")]
    cells = [("columns", c, "data", 0) for c in list(doc["columns"])[::4] if doc["columns"][c]["data"]]
    model = [("model", k) for k in ("name", "rs_slot_bytes", "n_mtp_heads", "mtp_mode")]
    settings = [("settings", k) for k in ("n_max", "max_tokens", "temperature", "drafter")]
    if kind == "oracle":
        settings = [("settings", k) for k in ("depth", "max_tokens", "has_mtp")]
        settings += [("cost_model", k) for k in doc["cost_model"]] + [("batch_shift", k) for k in doc["batch_shift"]]
    return top + columns + cells + model + settings


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _set(doc, path, value):
    _get(doc, path[:-1])[path[-1]] = value


def _wrong_types(kind: str, text: str) -> list[tuple[tuple, object]]:
    doc = json.loads(text)
    out = []
    for path in _paths(kind, doc):
        original = _get(doc, path)
        for value in _VALUES:
            if _same_kind(original, value) or (
                value is None
                and path
                in {("totals",), ("cost_model",), ("batch_shift",), ("model", "n_mtp_heads"), ("model", "mtp_mode")}
            ):
                continue
            if path == ("settings", "drafter") and value is None:
                continue  # settings' own default
            if path[0] == "columns" and path[-1] == 0 and value is None and doc["columns"][path[1]]["dtype"][0] == "f":
                continue  # null is a float column's NaN
            out.append((path, value))
    return out


@pytest.mark.parametrize("kind", LOADERS)
def test_wrong_types_in_every_field_are_format_errors(saved, kind):
    cases = _wrong_types(kind, saved[kind])
    assert len(cases) > 200
    for path, value in cases:
        doc = json.loads(saved[kind])
        _set(doc, path, value)
        got = _load(kind, json.dumps(doc))
        assert isinstance(got, mx.FormatError), (path, value)


def _mismatches(kind: str, doc: dict) -> list:
    """Edits that leave every value of its kind but make lengths or shapes disagree."""

    def edit(fn):
        d = json.loads(json.dumps(doc))
        fn(d)
        return d

    def drop_row(d, name):
        col = d["columns"][name]
        col["data"].pop()
        col["shape"][0] -= 1

    out = [
        edit(lambda d: drop_row(d, "n_drafted" if kind == "trace" else "pos")),  # one column a row short
        edit(lambda d: d["columns"]["n_accepted" if kind == "trace" else "pos"]["shape"].__setitem__(0, 1)),
        edit(lambda d: d["columns"]["drafted" if kind == "trace" else "draft"]["shape"].pop()),
        edit(lambda d: d["columns"]["drafted" if kind == "trace" else "draft"]["data"][0].append(-1)),
        edit(lambda d: d["pieces"].pop()),
        edit(lambda d: d["columns"].pop("t_verify_ns" if kind == "trace" else "token")),
        edit(lambda d: d["columns"].__setitem__("extra", {"dtype": "int32", "shape": [0], "data": []})),
    ]
    if kind == "trace":
        out += [
            edit(lambda d: d["columns"]["n_accepted"]["data"].__setitem__(0, 99)),  # more than drafted
            edit(lambda d: d["columns"]["drafter"]["data"].__setitem__(0, 99)),  # no such drafter
            edit(lambda d: d["totals"].pop("n_steps")),
        ]
    else:
        out += [
            edit(lambda d: (d["tokens"].pop(), d["pieces"].pop())),  # fewer tokens than positions
            edit(lambda d: d["settings"].__setitem__("depth", 5)),  # not the columns' depth
            edit(lambda d: d["settings"].__setitem__("depth", 10**9)),
            edit(lambda d: d["cost_model"]["verify"].__setitem__(0, [1.0, 2.0, 3.0])),
            edit(lambda d: d["cost_model"].__setitem__("ngram", [1.0, 2.0, 3.0])),
            edit(lambda d: d["batch_shift"]["ks"].append(4)),
            edit(lambda d: d["batch_shift"]["segment_shift"][0].pop()),
        ]
    return out


@pytest.mark.parametrize("kind", LOADERS)
def test_mismatched_lengths_are_format_errors(saved, kind):
    for doc in _mismatches(kind, json.loads(saved[kind])):
        _rejected(kind, doc)


@pytest.mark.parametrize("kind", LOADERS)
def test_a_huge_declared_array_allocates_nothing(saved, kind):
    """Sizes and types that would take gigabytes (or a numpy object array) are refused before any array is made:
    before the fix a column of a dozen rows declared ``"U100000000"`` (400 MB a row) was built, then refused."""
    column = "n_drafted" if kind == "trace" else "pos"
    cases = [
        {"shape": [10**12]},
        {"shape": [2**40, 2**40]},
        {"shape": [1, 1, 1, 1, 1]},
        {"shape": [-1]},
        {"shape": [2**64]},
        {"dtype": "U10000000"},
        {"dtype": "S20000000"},
        {"dtype": "V40000000"},
        {"dtype": "(10000000,)f8"},
        {"dtype": "O"},
        {"dtype": "object"},
        {"dtype": "int32," * 100},
    ]
    tracemalloc.start()
    try:
        for case in cases:
            doc = json.loads(saved[kind])
            doc["columns"][column].update(case)
            _rejected(kind, doc)
            doc = json.loads(saved[kind])
            doc["columns"]["extra"] = {"dtype": "float64", "shape": [1], "data": [0.0]} | case
            _rejected(kind, doc)
        _rejected(kind, "[" * 100_000 + "]" * 100_000)  # nesting past the recursion limit
        _rejected(kind, '{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_nan_and_infinity_are_format_errors(saved, kind, token):
    """The package never writes them (to_json refuses NaN; a float column's NaN is null)."""
    float_col = "t_verify_ns" if kind == "trace" else "target_margin"
    places = [("columns", float_col, "data", 0), ("columns", "n_drafted" if kind == "trace" else "pos", "data", 0)]
    places += (
        [("t_prefill_ns",)]
        if kind == "trace"
        else [("wall_seconds",), ("cost_model", "sample_ns"), ("batch_shift", "smallest_margin")]
    )
    for path in places:
        d = json.loads(saved[kind])
        _set(d, path, "@@@")
        _rejected(kind, json.dumps(d).replace('"@@@"', token))


@pytest.mark.parametrize("kind", LOADERS)
def test_unknown_keys_are_format_errors(saved, kind):
    for path in [(), ("columns", "n_drafted" if kind == "trace" else "pos")] + (
        [("cost_model",), ("batch_shift",)] if kind == "oracle" else []
    ):
        for key in ("evil", "__class__", "py/object", "__reduce__"):
            doc = json.loads(saved[kind])
            _get(doc, path)[key] = "os.system"
            _rejected(kind, doc)


@pytest.mark.parametrize("kind", LOADERS)
def test_nothing_in_a_document_is_executed(saved, kind, tmp_path):
    """What would run code in a careless loader (an object column, a pickle, Python source, a class path) is a
    FormatError where it takes a field's place, and plain data where it is a string's content."""
    import base64
    import pickle

    marker = tmp_path / "ran"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"

    class Evil:
        def __reduce__(self):
            return (eval, (payload,))

    pickled = base64.b64encode(pickle.dumps(Evil())).decode()
    column = "n_drafted" if kind == "trace" else "pos"
    for spec in (
        {"dtype": "O", "shape": [1], "data": [payload]},
        {"dtype": "object", "shape": [1], "data": [pickled]},
        {"dtype": "int32", "shape": [1], "data": [payload]},
        {"py/reduce": [{"py/function": "os.system"}]},
    ):
        doc = json.loads(saved[kind])
        doc["columns"][column] = spec
        _rejected(kind, doc)
    for field, value in (
        ("format", pickled),
        ("settings", payload),
        ("model", payload),
        ("tokens", [payload]),
        ("finish_reason", {"__reduce__": payload}),
    ):
        doc = json.loads(saved[kind])
        doc[field] = value
        _rejected(kind, doc)
    doc = json.loads(saved[kind])
    doc["prompt"], doc["model"]["name"] = pickled, payload  # strings stay strings
    doc["model"]["py/object"] = "os.system"  # the model's facts are an open record: an odd key is data
    loaded = _load(kind, json.dumps(doc))
    assert not isinstance(loaded, Exception) and loaded.prompt == pickled and loaded.model["name"] == payload
    assert loaded.model["py/object"] == "os.system" and not marker.exists()


def _mutate(text: bytes, rng: random.Random) -> bytes:
    """A random byte-level corruption: bytes flipped, cut, repeated or inserted (JSON punctuation, big numbers,
    NaN)."""
    data = bytearray(text)
    for _ in range(rng.choice([1, 1, 2, 4])):
        i = rng.randrange(len(data))
        op = rng.randrange(5)
        if op == 0:
            data[i] = rng.randrange(256)
        elif op == 1:
            del data[i : i + rng.randrange(1, 64)]
        elif op == 2:
            j = rng.randrange(len(data))
            data[i:i] = data[j : j + rng.randrange(1, 64)]
        elif op == 3:
            data[i:i] = rng.choice(
                [
                    b'"',
                    b",",
                    b"[",
                    b"]",
                    b"{",
                    b"}",
                    b":",
                    b"-",
                    b"null",
                    b"true",
                    b"NaN",
                    b"1e999",
                    b"9" * 40,
                    b"0.5",
                    b'"x"',
                    b"[[[[",
                    b"\\u0000",
                ]
            )
        else:
            while i < len(data) and not chr(data[i]).isdigit():
                i += 1
            data[i : i + 1] = str(rng.choice([0, 1, 2, 3, 9, 255, 65536, 2**31, 2**63, -1])).encode()
    return bytes(data)


@pytest.mark.parametrize("kind", LOADERS)
def test_random_corruptions_load_or_are_format_errors(saved, kind):
    """Seeded byte-level mutations of a valid document: each is a FormatError, or loads into an object whose views
    work (a corruption within the data's ranges, e.g. another timing)."""
    rng = random.Random(20240601)
    text = saved[kind].encode()
    outcomes = {"loaded": 0, "rejected": 0}
    for _ in range(400):
        mutated = _mutate(text, rng)
        got = _load(kind, mutated.decode("latin-1") if rng.random() < 0.5 else mutated)
        if isinstance(got, mx.FormatError):
            outcomes["rejected"] += 1
            continue
        outcomes["loaded"] += 1
        if kind == "trace":
            got.summary(), got.steps, got.to_json(), got.draft_settings
        else:
            got.summary(), got.to_json()
    assert outcomes["rejected"] > 100 and outcomes["loaded"] > 10, outcomes
