"""Session API: stream, live set_params, cancel from another thread, close, busy, memory."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import psutil
import pytest
from conftest import check_accounting, page_faults_of_second_generation

import mtp_explorer as mx
from mtp_explorer.core.cpu_kernels import with_no_repack
from mtp_explorer.devtools.reference import reference_env


def test_stream_yields_each_step_and_keeps_trace(session_mixed):
    steps = list(session_mixed.stream("def fib(n):", max_tokens=30, n_max=3))
    t = session_mixed.last_trace
    assert [s.step for s in steps] == list(range(t.n_steps))
    assert [tok for s in steps for tok in s.tokens] == t.tokens
    assert t.tokens == session_mixed.generate("def fib(n):", max_tokens=30, n_max=3).tokens
    check_accounting(t)


def test_set_params_applies_at_next_step(session_mixed):
    base = session_mixed.generate("while True:", max_tokens=80, n_max=0)
    stream = session_mixed.stream("while True:", max_tokens=80, n_max=1, p_min=0.0)
    seen = []
    for step in stream:
        seen.append(step)
        if step.step == 4:
            session_mixed.set_params(n_max=5, p_min=0.2)
    t = session_mixed.last_trace
    assert t.tokens == base.tokens
    assert (t.n_max[:5] == 1).all() and (t.n_max[5:] == 5).all()
    assert t.p_min[5:] == pytest.approx(0.2)
    assert t.n_drafted[5:].max() > 1
    assert session_mixed.params == {"n_max": 5, "p_min": pytest.approx(0.2), "n_min": 0}
    check_accounting(t)


def test_cancel_from_another_thread(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=4096) as s:
        result = {}
        worker = threading.Thread(
            target=lambda: result.setdefault("t", s.generate("import os", max_tokens=4000, n_max=3))
        )
        worker.start()
        while s.engine.n_rows < 3:
            time.sleep(0.001)
        s.cancel()
        worker.join(timeout=30)
        assert not worker.is_alive()
        t = result["t"]
        assert t.finish_reason == "cancelled" and 0 < len(t.tokens) < 4000
        check_accounting(t)
        again = s.generate("import os", max_tokens=20, n_max=3)  # still usable
        assert again.finish_reason == "budget" and len(again.tokens) == 20


def test_stream_cancel_stops_within_one_step(session_mixed):
    n = 0
    for _step in session_mixed.stream("class Stack:", max_tokens=500, n_max=2):
        n += 1
        if n == 3:
            session_mixed.cancel()
    t = session_mixed.last_trace
    assert t.finish_reason == "cancelled" and t.n_steps == 3


def test_busy_session_refuses_a_second_generation(session_mixed):
    stream = session_mixed.stream("import os", max_tokens=50, n_max=2)
    next(stream)
    with pytest.raises(mx.SessionBusyError):
        session_mixed.generate("import os", max_tokens=5)
    stream.close()
    assert len(session_mixed.generate("import os", max_tokens=5).tokens) == 5


def test_generation_releases_the_gil(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=4096) as s:
        ticks = 0
        done = threading.Event()

        def gen():
            s.generate("import os", max_tokens=1500, n_max=0)
            done.set()

        worker = threading.Thread(target=gen)
        worker.start()
        while not done.is_set():
            ticks += 1  # runs only if the native loop does not hold the GIL
            time.sleep(0.0005)
        worker.join()
        assert ticks > 10


def test_close_and_context_manager(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=256) as s:
        assert not s.closed
        assert s.capacity == 8 and s.n_ctx == 256
    assert s.closed
    for call in (
        lambda: s.generate("x", max_tokens=2),
        lambda: s.tokenize("x"),
        lambda: s.set_params(n_max=1),
        lambda: list(s.stream("x", max_tokens=2)),
    ):
        with pytest.raises(mx.SessionClosedError):
            call()
    s.close()  # idempotent


def test_a_dropped_session_is_freed_at_once(model_mixed):
    """Its collaborators (parallel generation, probes) hold it weakly: dropping the last reference frees the session
    and closes its engine without waiting for the cycle collector, after each kind of call."""
    s = mx.Session.open(model_mixed, n_ctx=256, n_parallel=2)
    engine = s.engine
    s.generate("def fib(n):", max_tokens=4, n_max=2)
    s.generate_parallel(["a", "b"], max_tokens=4, n_max=2)
    s.layer_inputs("def", [0])
    s.set_params(n_max=1)
    ref = weakref.ref(s)
    gc.disable()
    try:
        del s
        assert ref() is None
        assert engine.closed
    finally:
        gc.enable()


@pytest.mark.slow  # out of make test-fast (its 3-minute budget)
def test_open_generate_close_cycles_do_not_leak(model_mixed):
    proc = psutil.Process()

    def cycle():
        with mx.Session.open(model_mixed, n_ctx=512) as s:
            s.generate("def fib(n):", max_tokens=16, n_max=3)

    for _ in range(10):
        cycle()
    before = proc.memory_info().rss
    for _ in range(100):
        cycle()
    growth = proc.memory_info().rss - before
    assert growth < 50 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MiB over 100 cycles"


def test_a_generation_starts_from_empty_memories(bundled_model):
    """A generation after others in the same session is the one a fresh session makes, bit for bit (its tokens, its
    drafts' probabilities, its hidden-state norms), on the hybrid recurrent bundled model with snapshot slots: a
    generation's end and begin empty the memories by their cells only (their buffers keep old rows, masked, and a
    recurrent cell taken anew starts from llama.cpp's zeroed state), and no K/V row or recurrent state of the runs
    before it may reach it (a longer run first leaves KV cells and snapshot slots past where the second writes), nor
    a look-up generation between them, whose target context does not hand its MTP head the nextn rows."""
    long_prompt = "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n"
    prompt = "def fibonacci(n):"
    columns = (
        "drafted",
        "n_accepted",
        "correction",
        "rs_slot",
        "draft_prob",
        "topk_probs",
        "h_norm_target",
        "h_norm_draft",
        "draft_target_cos",
    )

    def run(s):
        t = s.generate(prompt, max_tokens=48, n_max=3)
        return {c: t.columns[c] for c in columns} | {"tokens": np.asarray(t.tokens)}

    with mx.Session.open(bundled_model, threads=1, n_rs_seq=3) as s:
        fresh = run(s)
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=3) as s:
        s.generate(long_prompt, max_tokens=96, n_max=3)
        s.generate(long_prompt, max_tokens=32, n_max=0)
        s.generate(
            long_prompt,
            max_tokens=32,
            n_max=3,
            drafter="ngram-simple",  # the target without nextn rows
            ngram_simple_size_n=2,
            ngram_simple_size_m=3,
        )
        after = run(s)
    for c, values in fresh.items():
        assert np.array_equal(values, after[c], equal_nan=values.dtype.kind == "f"), c


def test_without_the_mtp_head_the_target_keeps_no_nextn_rows(bundled_model):
    """A generation whose drafters do not read the MTP head's rows turns the target's off, as llama.cpp's target gets
    them only with draft-mtp in the chain: llama.cpp keeps n_batch of them in its output buffer (2 MB here, 512
    pages), reallocated and cleared whenever a decode has more outputs than any before (here up to 9 rows, after 2).
    With them, this second generation faulted in 886 pages."""
    first = dict(prompt="def fibonacci(n):", max_tokens=16, n_max=1, drafter="ngram-cache")
    second = dict(prompt="import os\nimport sys\n", max_tokens=64, n_max=8, drafter="ngram-cache")
    assert page_faults_of_second_generation(bundled_model, first, second) < 512 // 2


OUTPUT_RESERVE = r"""
import sys, mtp_explorer as mx
with mx.Session.open(sys.argv[1], n_ctx=1024, threads=1, n_rs_seq=3, n_parallel=int(sys.argv[2])) as s:
    spec = s.generate("def fibonacci(n):", max_tokens=24, n_max=3)
    plain = s.generate("def fibonacci(n):", max_tokens=24, n_max=0)
    oracle = s.record_oracle("def fibonacci(n):", max_tokens=24, depth=3)
    print(list(spec.tokens) == list(plain.tokens), len(oracle.tokens) > 0, flush=True)
"""
RESERVE = re.compile(r"n_outputs_max\s+= (\d+).*?compute buffer size =\s+([\d.]+) MiB", re.S)


@pytest.mark.reference
def test_contexts_reserve_the_outputs_llama_cpp_reserves(bundled_model, reference_binary):
    """llama-server and llama-speculative-simple give a draft context n_parallel outputs a decode and the target
    n_parallel x (n_max + 1) (common_speculative_get_output_limits); llama.cpp's default, n_batch, reserves n_ubatch
    rows of logits in each compute buffer (0.5 GB a context at a 248 k vocabulary). The MTP context reserves what the
    reference's does (the same compute buffer); the target at least 64 rows, the batch-shape probe's widest batch."""
    ours = {}
    for n_parallel in (1, 2):
        run = subprocess.run(
            [sys.executable, "-c", OUTPUT_RESERVE, str(bundled_model), str(n_parallel)],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"MTP_EXPLORER_VERBOSE": "1"},
        )
        assert run.stdout.split() == ["True", "True"]
        ours[n_parallel] = [(int(n), float(mib)) for n, mib in RESERVE.findall(run.stderr)]
    ref = subprocess.run(
        with_no_repack(
            [
                str(reference_binary),
                "-m",
                str(bundled_model),
                "-p",
                "def fibonacci(n):",
                "-n",
                "8",
                "-c",
                "1024",
                "-t",
                "1",
                "--temp",
                "0",
                "--spec-type",
                "draft-mtp",
                "--spec-draft-n-max",
                "3",
                "-lv",
                "4",
            ]
        ),
        capture_output=True,
        text=True,
        check=True,
        env=reference_env(reference_binary),
    )
    reference = [(int(n), float(mib)) for n, mib in RESERVE.findall(ref.stderr)]
    assert [n for n, _ in reference] == [4, 1]  # the target's n_max + 1, the MTP context's 1
    assert [n for n, _ in ours[1]] == [64, 1] and [n for n, _ in ours[2]] == [64, 2]
    assert ours[1][1] == reference[1]  # the MTP context: the reference's compute buffer
    assert reference[0][1] <= ours[1][0][1] < reference[0][1] + 1  # the target: 60 rows of logits more


DRAFT_RESERVE = r"""
import sys, mtp_explorer as mx
from mtp_explorer.models import MODELS_DIR
with mx.Session.open(sys.argv[1], n_ctx=1024, threads=1, n_rs_seq=3, n_parallel=int(sys.argv[2]),
                     draft_model=MODELS_DIR / sys.argv[3]) as s:
    print(len(s.generate("def fibonacci(n):", max_tokens=24, n_max=3, drafter=sys.argv[4]).tokens), flush=True)
"""


@pytest.mark.parametrize(
    "head, spec, outputs",
    [
        ("pystdlib-draft.gguf", "draft-simple", "n_parallel"),
        ("pystdlib-eagle3.gguf", "draft-eagle3", "n_batch"),
        ("pystdlib-dflash.gguf", "draft-dflash", "n_batch"),
    ],
)
@pytest.mark.reference
def test_draft_contexts_reserve_what_llama_cpp_reserves(bundled_model, reference_binary, head, spec, outputs):
    """A draft model's context reserves n_parallel outputs a decode, as llama.cpp's (common_base_params_to_speculative;
    before, llama.cpp's default of n_batch: 8.50 MiB of compute buffer for the bundled draft model, the reference's
    4.26); EAGLE-3 and DFlash heads keep n_batch, which libllama gives the architectures it runs as encoders. Each is
    the reference's context: the same limit and compute buffer."""
    ours = {}
    for n_parallel in (1, 2):
        run = subprocess.run(
            [sys.executable, "-c", DRAFT_RESERVE, str(bundled_model), str(n_parallel), head, spec],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"MTP_EXPLORER_VERBOSE": "1"},
        )
        assert run.stdout.split() == ["24"]
        ours[n_parallel] = [(int(n), float(mib)) for n, mib in RESERVE.findall(run.stderr)]
    ref = subprocess.run(
        with_no_repack(
            [
                str(reference_binary),
                "-m",
                str(bundled_model),
                "-md",
                str(mx.default_model_path().parent / head),
                "-p",
                "def fibonacci(n):",
                "-n",
                "8",
                "-c",
                "1024",
                "-t",
                "1",
                "--temp",
                "0",
                "--spec-type",
                spec,
                "--spec-draft-n-max",
                "3",
                "-lv",
                "4",
            ]
        ),
        capture_output=True,
        text=True,
        check=True,
        env=reference_env(reference_binary),
    )
    reference = [(int(n), float(mib)) for n, mib in RESERVE.findall(ref.stderr)]
    assert len(reference) == 2 and len(ours[1]) == 3  # target and draft; ours: target, MTP and draft
    assert ours[1][2] == reference[1]  # the draft context: the reference's
    assert ours[2][2][0] == (2 if outputs == "n_parallel" else 1024)
