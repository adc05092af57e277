"""The check of llama.cpp's extra CPU buffer types (mtp_explorer.core.cpu_kernels): on a machine whose AMX kernels
stop the process (llama.cpp 0.3.36, PR #26954), a quantized model opens with -nr instead of crashing, a warning says
why, repack=True is refused, and llama.cpp's own tools get -nr too. The probe's verdicts are checked with children
that end as a crashing probe does; the real check is run on this machine, whichever kind it is."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.core import cpu_kernels as ck
from mtp_explorer.models.gguf_qwen35 import read_qwen35_metadata
from mtp_explorer.models.synthetic import write_synthetic_qwen35

BROKEN = ck.ExtraBufferCheck(
    False, "SYNTHETIC: the AMX kernels stopped the probe with SIGSEGV", probed=True, signal="SIGSEGV"
)
FINE = ck.ExtraBufferCheck(True, "SYNTHETIC: the probe ran", probed=True)


@pytest.fixture
def fresh_check(monkeypatch, tmp_path):
    """The check's memory and disk cache emptied (a private cache directory), and emptied again afterwards."""
    monkeypatch.setenv("MTP_EXPLORER_CACHE", str(tmp_path / "cache"))
    ck._checked.cache_clear()
    yield
    ck._checked.cache_clear()


def _with_check(monkeypatch, check: ck.ExtraBufferCheck) -> None:
    monkeypatch.setattr(ck, "check_extra_buffers", lambda **_: check)


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    """A SYNTHETIC random-weight qwen35 + MTP model with Q8_0 matrices, written by the project's writer."""
    return write_synthetic_qwen35(tmp_path_factory.mktemp("q8") / "synthetic-q8_0.gguf", n_embd=64, dtype="q8_0")


def test_the_writer_stores_matrices_as_q8_0_and_llama_cpp_decodes_them(q8_model, tmp_path):
    info = mx.model_info(q8_model)
    assert info.file_type == "Q8_0" and "Q8_0" in info.tensor_types and "F32" in info.tensor_types
    assert "F16" not in info.tensor_types  # every matrix of this model splits into blocks of 32
    f16 = write_synthetic_qwen35(tmp_path / "synthetic-f16.gguf", n_embd=64, dtype="f16")
    assert read_qwen35_metadata(q8_model)["general.file_type"] == 7  # llama.cpp's MOSTLY_Q8_0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mx.CpuKernelWarning)
        got = {}
        for name, path in (("q8_0", q8_model), ("f16", f16)):
            with mx.Session.open(path, n_ctx=256, threads=1) as s:
                got[name] = s.generate("abc", max_tokens=16, n_max=0).tokens
    # Q8_0 rounds each weight by at most half a step of its block's scale: the greedy text starts alike
    assert np.array_equal(got["q8_0"][:4], got["f16"][:4])
    with pytest.raises(mx.ParameterError, match="dtype must be one of"):
        write_synthetic_qwen35(tmp_path / "x.gguf", dtype="q4_0")


@pytest.mark.parametrize(
    "code, usable, signal",
    [
        ("pass", True, None),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", False, "SIGSEGV"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", False, "SIGILL"),
        ("import sys; print('no model', file=sys.stderr); sys.exit(4)", False, None),
        ("import sys; print('2 of 4 sequences differ', file=sys.stderr); sys.exit(3)", False, None),
    ],
)
def test_the_probe_reads_how_its_child_ended(code, usable, signal):
    got = ck.probe(command=[sys.executable, "-c", code])
    assert (got.usable, got.signal, got.probed) == (usable, signal, True)
    if signal:
        assert signal in got.reason and "PR #26954" in got.reason
    if code.endswith("exit(4)"):
        assert "exited with 4: no model" in got.reason
    if code.endswith(f"exit({ck.WRONG_RESULTS})"):  # the kernels ran and computed other tokens
        assert got.reason.startswith("2 of 4 sequences differ on this CPU")


def test_a_probe_that_dies_leaves_no_files(monkeypatch):
    """The child writes its models in the parent's folder, which the parent removes: where the AMX kernels stop the
    child, its own clean-up never ran (each check had left a folder with its Q8_0 model in the temporary directory)."""
    code = (
        "import os, pathlib, signal; d = pathlib.Path(os.environ['MTP_EXPLORER_PROBE_DIR']); "
        "(d / 'probe-q8_0.gguf').write_bytes(b'x' * 4096); print(d, flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    )
    folders = []
    real_run = ck.subprocess.run

    def run(*args, **kwargs):
        done = real_run(*args, **kwargs)
        folders.append(Path(done.stdout.strip()))
        assert (folders[-1] / "probe-q8_0.gguf").is_file()  # written while the parent's folder existed
        return done

    monkeypatch.setattr(ck.subprocess, "run", run)
    got = ck.probe(command=[sys.executable, "-c", code])
    assert got.signal == "SIGSEGV" and len(folders) == 1 and not folders[0].exists()


def test_a_probe_that_does_not_end_is_a_failed_check():
    got = ck.probe(timeout=1, command=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert not got.usable and "did not finish" in got.reason


def test_the_check_probes_once_per_machine_and_caches_the_verdict(monkeypatch, fresh_check):
    calls = []
    monkeypatch.setattr(ck, "cpu_flags", lambda: frozenset({"avx2", "amx_int8", "amx_tile"}))
    monkeypatch.setattr(ck, "probe", lambda: calls.append(1) or BROKEN)
    assert ck.check_extra_buffers() == BROKEN and ck.check_extra_buffers() == BROKEN
    ck._checked.cache_clear()  # a new process: read from the disk cache
    assert ck.check_extra_buffers() == BROKEN and calls == [1]
    [cached] = list((ck.cache_root() / "cpu-kernels").glob("*.json"))
    assert json.loads(cached.read_text())["signal"] == "SIGSEGV"
    assert ck.check_extra_buffers(refresh=True) == BROKEN and calls == [1, 1]


def test_a_cpu_without_amx_is_not_probed(monkeypatch, fresh_check):
    monkeypatch.setattr(ck, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(ck, "probe", lambda: pytest.fail("probed a CPU without AMX"))
    got = ck.check_extra_buffers()
    assert got.usable and not got.probed and "no AMX" in got.reason


def test_repack_resolves_by_the_check_and_the_models_weight_types(monkeypatch):
    _with_check(monkeypatch, BROKEN)
    assert ck.resolve_repack(False, ["Q8_0"]) is False
    assert ck.resolve_repack(None, ["BF16", "F32"]) is True  # nothing goes to the AMX buffer: llama.cpp's default
    assert ck.resolve_repack(True, ["F32"]) is True
    for types in (["Q4_K", "Q6_K", "F32"], ["F16", "F32"]):  # the AMX buffer takes F16 matrices too
        with pytest.warns(mx.CpuKernelWarning, match="SIGSEGV.*-nr"):
            assert ck.resolve_repack(None, types) is False
    with pytest.raises(mx.ParameterError, match="repack=True would stop this process: SYNTHETIC"):
        ck.resolve_repack(True, ["Q8_0"])
    assert ck.resolve_repack("no", ["Q8_0"]) == "no"  # left to the session's options, which refuse it
    _with_check(monkeypatch, FINE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ck.resolve_repack(None, ["Q8_0"]) is True and ck.resolve_repack(True, ["Q8_0"]) is True


@pytest.mark.server
def test_llama_cpp_tools_get_no_repack_where_the_sessions_do(monkeypatch, q8_model, tmp_path):
    from mtp_explorer.server.grid import command_line
    from mtp_explorer.server.process import LlamaServer

    f32 = write_synthetic_qwen35(tmp_path / "synthetic-f32.gguf", n_embd=64, dtype="f32")
    _with_check(monkeypatch, BROKEN)
    assert ck.no_repack_args(q8_model) == ["-nr"] and ck.no_repack_args(f32) == []
    assert ck.no_repack_args(f32, q8_model) == ["-nr"]  # a quantized draft model
    assert ck.no_repack_args(f32, tmp_path / "missing.gguf") == []  # the tool reports a missing file itself
    assert "-nr" in command_line(q8_model, {"n_parallel": 2}) and "-nr" not in command_line(f32, {})
    assert "-nr" in LlamaServer(q8_model, binary=sys.executable).argv_tail
    _with_check(monkeypatch, FINE)
    assert ck.no_repack_args(q8_model) == []


def test_a_quantized_model_opens_on_this_machine_whatever_its_amx(q8_model, tmp_path):
    """The real check on this machine: where the probe found the AMX kernels stop the process, the session runs
    with -nr and says why; elsewhere it runs llama.cpp's default. Either way it decodes."""
    check = mx.check_extra_buffers()
    assert check.probed == bool(ck.cpu_flags() & ck.AMX_FLAGS)
    if check.probed:  # the verdict is what the probe's own child does (its models in a folder this test removes)
        child = subprocess.run(
            [sys.executable, "-m", ck.PROBE_MODULE],
            capture_output=True,
            env=os.environ | {"MTP_EXPLORER_CPU_PROBE": "1", ck.PROBE_DIR: str(tmp_path)},
        )
        assert (child.returncode == 0) == check.usable, (child.returncode, check)
    expect = contextlib.nullcontext() if check.usable else pytest.warns(mx.CpuKernelWarning)
    with expect, mx.Session.open(q8_model, n_ctx=256, threads=1) as s:
        assert s.placement["repack"] is check.usable
        assert len(s.generate("abc", max_tokens=12, n_max=3).tokens) == 12
    if not check.usable:
        with pytest.raises(mx.ParameterError, match="would stop this process"):
            mx.Session.open(q8_model, n_ctx=256, threads=1, repack=True)
