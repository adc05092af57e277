"""Bad input gives a precise Python exception: never a crash, a hang or lost state.
Cases that could take the interpreter down run in a subprocess."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from conftest import run_isolated

import mtp_explorer as mx


def _open_isolated(path, expect: str) -> None:
    proc = run_isolated(f"""
        import mtp_explorer as mx
        try:
            mx.Session.open({str(path)!r}, n_ctx=256)
        except mx.{expect} as exc:
            print("RAISED", type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"RAISED {expect}" in proc.stdout or "RAISED" in proc.stdout and expect in proc.stdout, proc.stdout
    return proc.stdout


def test_missing_file(tmp_path):
    with pytest.raises(mx.ModelNotFoundError, match="not found") as info:
        mx.Session.open(tmp_path / "nope.gguf")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(mx.ModelNotFoundError):
        mx.model_info(tmp_path / "nope.gguf")


def test_directory_and_not_a_gguf(tmp_path):
    with pytest.raises(mx.ModelLoadError, match="not a file"):
        mx.model_info(tmp_path)
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    with pytest.raises(mx.ModelLoadError, match="not a GGUF"):
        mx.model_info(bogus)
    out = _open_isolated(bogus, "ModelLoadError")
    assert "not a GGUF" in out


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.98])
def test_truncated_gguf(tmp_path, model_mixed, fraction):
    data = model_mixed.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(mx.ModelLoadError, match="truncated"):
        mx.model_info(cut)
    _open_isolated(cut, "ModelLoadError")


def test_a_hybrid_model_without_attention_is_refused_before_llama_cpp_aborts(tmp_path):
    """SYNTHETIC 2-layer qwen35: both trunk layers recurrent (full_attention_interval 4). llama.cpp 0.3.36 aborts the
    process at its first decode (GGML_ASSERT(buffer) in set_input_k_idxs); the session refuses it first."""
    from mtp_explorer.models.synthetic import write_synthetic_qwen35

    path = write_synthetic_qwen35(tmp_path / "no-attention.gguf", n_layer=2)
    assert mx.model_info(path).n_layer_attention == 0
    out = _open_isolated(path, "ModelLoadError")
    assert "no attention layer" in out
    assert mx.model_info(write_synthetic_qwen35(tmp_path / "one.gguf", n_layer=4)).n_layer_attention == 1


def test_model_without_mtp_layers(model_no_mtp):
    info = mx.model_info(model_no_mtp)
    assert not info.has_mtp and info.n_layer_nextn == 0
    with mx.Session.open(model_no_mtp, n_ctx=256) as s:
        with pytest.raises(mx.MtpUnavailableError, match=r"n_max=0") as err:
            s.generate("def f():", max_tokens=8, n_max=3)
        assert info.name in str(err.value)
        with pytest.raises(mx.MtpUnavailableError):
            s.set_params(n_max=2)
        t = s.generate("def f():", max_tokens=8, n_max=0)  # plain decoding still works
        assert len(t.tokens) == 8 and t.n_drafted.sum() == 0


def test_library_without_nextn_api(model_mixed):
    from mtp_explorer import _native
    from mtp_explorer.core.handle import check_nextn_api

    ggml_base = _native.libllama_path().replace("libllama", "libggml-base")
    assert _native.missing_nextn_symbols(ggml_base) == [
        "llama_set_embeddings_nextn",
        "llama_get_embeddings_nextn_ith",
        "llama_model_n_layer_nextn",
        "llama_n_rs_seq",
        "llama_set_embeddings_layer_inp",
        "llama_get_embeddings_layer_inp",
        "llama_get_embeddings_nextn",
        "llama_model_target_layer_ids",
        "llama_model_target_layer_ids_n",
        "llama_set_nextn_layer_offset",
        "llama_get_ctx_other",
    ]
    with pytest.raises(mx.LibraryError, match="llama_set_embeddings_nextn"):
        check_nextn_api(ggml_base)
    check_nextn_api()  # the installed libllama has it
    proc = run_isolated(f"""
        import mtp_explorer as mx
        import mtp_explorer.core.handle as handle
        handle._libllama_path = lambda: {ggml_base!r}
        try:
            mx.Session.open({str(model_mixed)!r})
        except mx.LibraryError as exc:
            print("RAISED", exc)
    """)
    assert proc.returncode == 0 and "RAISED" in proc.stdout and "nextn API" in proc.stdout, proc.stdout + proc.stderr


CXX_SOURCE = "#include <string>\nstd::string answer() { return std::to_string(42); }\n"


@pytest.mark.parametrize("static", [True, False], ids=["static-libstdc++", "shared-libstdc++"])
def test_a_library_with_its_own_cxx_runtime_is_refused(tmp_path, model_mixed, static):
    """A build whose libraries each hold a copy of libstdc++ (the device machines' default g++: a session crashed as it
    opened) is refused with a LibraryError naming the library; a shared runtime passes, as the installed build does."""
    from mtp_explorer import _native
    from mtp_explorer.core.runtime import check_shared_cxx_runtime, native_libraries, needed_libraries

    (tmp_path / "answer.cpp").write_text(CXX_SOURCE)
    lib = tmp_path / "libanswer.so"
    subprocess.run(
        [
            "g++",
            "-shared",
            "-fPIC",
            *(["-static-libstdc++"] if static else []),
            "-o",
            str(lib),
            str(tmp_path / "answer.cpp"),
        ],
        check=True,
    )
    assert ("libstdc++.so.6" in needed_libraries(lib)) is not static
    installed = native_libraries(_native.__file__, _native.libllama_path())
    assert {p.name.split(".")[0] for p in installed} >= {
        "_native",
        "libllama",
        "libggml",
        "libggml-base",
        "libggml-cpu",
    }
    check_shared_cxx_runtime(installed)
    if not static:
        check_shared_cxx_runtime([lib])
        return
    with pytest.raises(mx.LibraryError, match=f"{lib} links the C\\+\\+ runtime statically"):
        check_shared_cxx_runtime(installed + [lib])
    assert needed_libraries(tmp_path / "answer.cpp") is None  # not an ELF file: nothing to check
    proc = run_isolated(f"""
        import mtp_explorer as mx
        import mtp_explorer.core.handle as handle
        handle.native_libraries = lambda *paths: [{str(lib)!r}]
        try:
            mx.Session.open({str(model_mixed)!r})
        except mx.LibraryError as exc:
            print("RAISED", exc)
    """)
    assert proc.returncode == 0 and "RAISED" in proc.stdout and "statically" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_max": -1}, "n_max must be >= 0"),
        ({"n_max": 9}, r"n_max=9 exceeds this session's capacity of 8"),
        ({"n_max": 2.5}, "n_max must be an integer"),
        ({"p_min": -0.1}, r"p_min must be a finite number in \[0, 1\]"),
        ({"p_min": 1.5}, r"p_min must be a finite number in \[0, 1\]"),
        ({"p_min": math.nan}, r"p_min must be a finite number in \[0, 1\]"),
        ({"p_min": "0.5"}, r"p_min must be a finite number"),
        ({"n_max": 2, "n_min": 3}, "n_min=3 is larger than n_max=2"),
        ({"n_min": -1}, "n_min must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"temperature": -1.0}, "temperature must be a finite number"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"seed": -3}, "seed must be"),
    ],
)
def test_bad_parameters(session_mixed, kwargs, match):
    with pytest.raises(mx.ParameterError, match=match):
        session_mixed.generate("def f():", **{"max_tokens": 4} | kwargs)
    assert len(session_mixed.generate("def f():", max_tokens=4).tokens) == 4  # nothing lost


def test_bad_set_params(session_mixed):
    with pytest.raises(mx.ParameterError, match="capacity of 8"):
        session_mixed.set_params(n_max=100)
    with pytest.raises(mx.ParameterError):
        session_mixed.set_params(p_min=2.0)
    with pytest.raises(mx.ParameterError):
        session_mixed.set_params(n_max=1, n_min=2)


def test_capacity_follows_n_rs_seq(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=256, n_rs_seq=12) as s:
        assert s.capacity == 12
        t = s.generate("import os", max_tokens=30, n_max=12)
        assert t.drafted.shape[1] == 12
    for bad in (-1, 65):  # (0: no slots, checkpoints: tests/test_checkpoints.py)
        with pytest.raises(mx.ParameterError, match="n_rs_seq"):
            mx.Session.open(model_mixed, n_rs_seq=bad)
    for bad in (0, 65):
        with pytest.raises(mx.ParameterError, match="capacity"):
            mx.Session.open(model_mixed, capacity=bad)
    with pytest.raises(mx.ParameterError, match="topk"):
        mx.Session.open(model_mixed, topk=11)
    with pytest.raises(mx.ParameterError, match="n_ctx"):
        mx.Session.open(model_mixed, n_ctx=0)


def test_empty_and_invalid_prompts(session_mixed):
    with pytest.raises(mx.ParameterError, match="empty"):
        session_mixed.generate("", max_tokens=4)
    with pytest.raises(mx.ParameterError, match="empty"):
        session_mixed.generate([], max_tokens=4)
    with pytest.raises(mx.ParameterError, match="out of range"):
        session_mixed.generate([1, 2, 10**6], max_tokens=4)
    t = session_mixed.generate(session_mixed.tokenize("def f():"), max_tokens=4)
    assert t.prompt == "def f():"


def test_prompt_longer_than_context(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=256) as s:
        long_prompt = "x = 1\n" * 400
        with pytest.raises(mx.ContextOverflowError, match="context holds 256"):
            s.generate(long_prompt, max_tokens=4)
        assert isinstance(mx.ContextOverflowError("x"), ValueError)
        assert len(s.generate("x = 1", max_tokens=4).tokens) == 4


@pytest.mark.parametrize("n_max", [0, 3])
def test_budget_reaching_end_of_context_stops_cleanly(model_mixed, n_max):
    with mx.Session.open(model_mixed, n_ctx=256) as s:
        prompt = s.tokenize("def fib(n):")
        t = s.generate(prompt, max_tokens=10_000, n_max=n_max)
        assert t.finish_reason == "context"
        assert len(prompt) + len(t.tokens) == s.n_ctx + 1  # every position filled, plus the last token emitted
        if n_max:
            assert "context" in {st.stop_reason for st in t.steps}
        again = s.generate("def fib(n):", max_tokens=5, n_max=n_max)
        assert again.finish_reason == "budget"


def test_use_after_close_in_subprocess(model_mixed):
    proc = run_isolated(f"""
        import mtp_explorer as mx
        s = mx.Session.open({str(model_mixed)!r}, n_ctx=256)
        engine = s.engine
        s.close()
        for call in (lambda: s.generate("x", max_tokens=2), lambda: s.piece(1), lambda: s.n_ctx):
            try:
                call()
            except mx.SessionClosedError:
                print("closed-ok")
        try:
            engine.step()   # the native object itself refuses too, with the package's error
        except mx.SessionClosedError as exc:
            print("native-ok", str(exc))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("closed-ok") == 3 and "native-ok the session is closed" in proc.stdout


def test_small_n_ctx_is_padded_like_llama_cpp(model_mixed):
    """llama.cpp pads the context to a multiple of 256; prompts up to that size must work."""
    with mx.Session.open(model_mixed, n_ctx=64) as s:
        assert s.n_ctx == 256
        tokens = s.tokenize("x = 1\n" * 200)
        assert len(tokens) > 256
        t = s.generate(tokens[:200], max_tokens=8, n_max=3)
        assert len(t.tokens) == 8
        with pytest.raises(mx.ContextOverflowError):
            s.generate(tokens[:257], max_tokens=2)


def test_bad_documents_are_format_errors(model_mixed):
    """A corrupt or foreign trace / oracle JSON is the package's FormatError (a ValueError), never a bare one."""
    with mx.Session.open(model_mixed, n_ctx=256) as s:
        t = s.generate("def f(x):", max_tokens=6, n_max=2)
        o = s.record_oracle("def f(x):", max_tokens=6, depth=2, probe=False, batch_shift=False)
    doc = json.loads(t.to_json())
    doc["columns"]["n_accepted"]["data"] = doc["columns"]["n_accepted"]["data"][:-1]
    cases = {
        "not json": mx.Trace,
        "[1, 2]": mx.Trace,
        "{}": mx.Trace,
        json.dumps(doc): mx.Trace,
        json.dumps({"format": "mtp-explorer-trace/1"}): mx.Trace,
        "{}{": mx.OracleTrace,
        json.dumps({"format": "mtp-explorer-oracle/2", "columns": {}}): mx.OracleTrace,
    }
    for text, cls in cases.items():
        with pytest.raises(mx.FormatError) as info:
            cls.from_json(text)
        assert isinstance(info.value, ValueError) and isinstance(info.value, mx.MtpExplorerError), text
    assert mx.OracleTrace.from_json(o.to_json()).tokens == o.tokens


def test_bad_figure_input_is_an_input_type_error():
    from mtp_explorer import plots

    with pytest.raises(mx.InputTypeError) as info:
        plots.acceptance_by_depth(42)
    assert isinstance(info.value, TypeError) and isinstance(info.value, mx.ParameterError)
