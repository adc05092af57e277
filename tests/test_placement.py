"""Placement options (llama.cpp's -ngl, -mg, -fa, -ctk/-ctv, -lm, -tb): validated, applied to both
contexts, echoed in ``session.placement`` and ``trace.settings``, and taken by the CLI."""

from __future__ import annotations

import json

import pytest

import mtp_explorer as mx
from mtp_explorer.cli import _parser, main, session_kwargs
from mtp_explorer.core.options import FLASH_ATTN_VALUES, KV_CACHE_TYPES, LOAD_MODES, SessionOptions

PLACEMENT_KEYS = (
    "n_gpu_layers",
    "main_gpu",
    "flash_attn",
    "type_k",
    "type_v",
    "load_mode",
    "threads_batch",
    "repack",
    "devices",
    "gpu_offload",
)


def test_llama_cpp_names_and_defaults():
    assert FLASH_ATTN_VALUES == ("auto", "off", "on")
    assert KV_CACHE_TYPES[:4] == ("f32", "f16", "bf16", "q8_0") and "q4_0" in KV_CACHE_TYPES
    assert LOAD_MODES[:3] == ("auto", "none", "mmap")
    o = SessionOptions()
    assert (o.n_gpu_layers, o.main_gpu, o.flash_attn, o.type_k, o.type_v, o.load_mode, o.threads_batch) == (
        -1,
        0,
        "auto",
        "f16",
        "f16",
        "auto",
        None,
    )
    assert SessionOptions(n_gpu_layers="all").n_gpu_layers == -2
    assert SessionOptions(n_gpu_layers="auto").n_gpu_layers == -1
    assert SessionOptions(flash_attn=True).flash_attn == "on"
    assert SessionOptions(flash_attn=False).flash_attn == "off"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"type_k": "q9_9"}, "type_k must be one of 'f32'"),
        ({"type_v": "F16"}, "type_v must be one of"),
        ({"flash_attn": "yes"}, "flash_attn must be one of 'auto', 'off', 'on'"),
        ({"load_mode": "fast"}, "load_mode must be one of 'auto', 'none', 'mmap'"),
        ({"n_gpu_layers": "most"}, "'auto' (-1) or 'all' (-2)"),
        ({"n_gpu_layers": -3}, "n_gpu_layers must be >= -2"),
        ({"n_gpu_layers": 1.5}, "n_gpu_layers must be an integer"),
        ({"main_gpu": -1}, "main_gpu must be >= 0"),
        ({"threads_batch": 0}, "threads_batch must be >= 1"),
        ({"repack": "no"}, "repack must be True or False (llama.cpp's --repack / --no-repack)"),
        ({"type_v": "q8_0", "flash_attn": "off"}, "needs flash attention"),
    ],
)
def test_bad_placement_is_a_parameter_error(kwargs, message):
    with pytest.raises(mx.ParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SessionOptions(**kwargs)


def test_main_gpu_beyond_the_devices_is_a_parameter_error(model_mixed):
    n_gpu = sum(not d.startswith("CPU") for d in mx._native.backend_devices())
    with pytest.raises(mx.ParameterError, match=f"main_gpu={n_gpu + 1} but this build of llama.cpp sees"):
        mx.Session.open(model_mixed, n_ctx=256, main_gpu=n_gpu + 1)


def test_use_mmap_is_load_mode(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=256, use_mmap=False) as s:
        assert s.placement["load_mode"] == "none"
    with mx.Session.open(model_mixed, n_ctx=256, use_mmap=True) as s:
        assert s.placement["load_mode"] == "mmap"
    with pytest.raises(mx.ParameterError, match="use_mmap or load_mode"):
        mx.Session.open(model_mixed, use_mmap=True, load_mode="none")


def test_quantized_k_cache_needs_whole_blocks(model_mixed):
    assert mx.model_info(model_mixed).n_embd_head_k == 16
    with pytest.raises(
        mx.ParameterError, match="blocks of 32 values, which do not divide this model's key heads of 16"
    ):
        mx.Session.open(model_mixed, n_ctx=256, type_k="q8_0")
    with mx.Session.open(model_mixed, n_ctx=256, type_k="q8_0", flash_attn="off") as s:  # llama.cpp allows it
        assert len(s.generate("a", max_tokens=4).tokens) == 4


def test_placement_is_applied_and_echoed(bundled_model):
    """A quantized KV cache with flash attention on: the session opens, generates, and every trace says so."""
    with mx.Session.open(
        bundled_model,
        n_ctx=256,
        threads=1,
        threads_batch=2,
        flash_attn="on",
        type_k="q8_0",
        type_v="q8_0",
        n_gpu_layers="all",
        repack=False,
    ) as s:
        p = s.placement
        assert {k: p[k] for k in PLACEMENT_KEYS[:8]} == {
            "n_gpu_layers": -2,
            "main_gpu": 0,
            "flash_attn": "on",
            "type_k": "q8_0",
            "type_v": "q8_0",
            "load_mode": "auto",
            "threads_batch": 2,
            "repack": False,
        }
        assert "CPU" in p["devices"] and isinstance(p["gpu_offload"], bool)
        trace = s.generate("def fib(n):", max_tokens=12, n_max=2)
        assert len(trace.tokens) == 12
        assert {k: trace.settings[k] for k in PLACEMENT_KEYS} == p
        oracle = s.record_oracle("def fib(n):", max_tokens=8, depth=2)
        assert oracle.settings["type_k"] == "q8_0"
        again = mx.Trace.from_json(trace.to_json())
        assert again.settings["devices"] == p["devices"]
        # a Dask worker re-opens the model with the same placement
        with mx.Session.open(bundled_model, **s.open_kwargs) as twin:
            assert twin.placement == p


def test_default_placement_resolves_threads_batch(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=256, threads=2) as s:
        assert s.placement["threads_batch"] == 2 and s.placement["flash_attn"] == "auto"


def test_cli_takes_llama_cpp_flags():
    args = _parser().parse_args(
        [
            "run",
            "x",
            "-ngl",
            "all",
            "-mg",
            "0",
            "-fa",
            "on",
            "-ctk",
            "q8_0",
            "-ctv",
            "q4_0",
            "-lm",
            "none",
            "-t",
            "1",
            "-tb",
            "2",
            "-c",
            "512",
            "-md",
            "small.gguf",
            "-nr",
        ]
    )
    assert session_kwargs(args) == {
        "n_ctx": 512,
        "threads": 1,
        "threads_batch": 2,
        "n_rs_seq": 8,
        "capacity": None,
        "n_gpu_layers": "all",
        "main_gpu": 0,
        "flash_attn": "on",
        "type_k": "q8_0",
        "type_v": "q4_0",
        "load_mode": "none",
        "repack": False,
        "draft_model": "small.gguf",
    }
    assert _parser().parse_args(["run", "-ngl", "12"]).n_gpu_layers == 12
    slotless = session_kwargs(_parser().parse_args(["run", "--n-rs-seq", "0", "--capacity", "4"]))
    assert (slotless["n_rs_seq"], slotless["capacity"]) == (0, 4)
    for argv, repack in ((["run"], None), (["run", "--no-repack"], False), (["run", "--repack"], True)):
        assert _parser().parse_args(argv).repack is repack, argv


def test_cli_bad_flag_values(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "-ctk", "q9"])
    assert "invalid choice: 'q9'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "-ngl", "many"])
    assert "expected a number of layers, 'auto' or 'all'" in capsys.readouterr().err


def test_cli_run_echoes_placement(model_mixed, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "run",
                "def f(x):",
                "-m",
                str(model_mixed),
                "-n",
                "6",
                "-c",
                "256",
                "-fa",
                "off",
                "-ctk",
                "q8_0",
                "-lm",
                "none",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    settings = json.loads(out.read_text())["settings"]
    assert (settings["flash_attn"], settings["type_k"], settings["type_v"], settings["load_mode"]) == (
        "off",
        "q8_0",
        "f16",
        "none",
    )
    capsys.readouterr()
    assert main(["run", "x", "-m", str(model_mixed), "-n", "2", "-ctk", "q8_0"]) == 2
    assert "stores blocks of 32 values" in capsys.readouterr().out


def test_the_extension_exports_its_module_init_alone():
    """libllama loads beside the extension: a C++ symbol the extension exported (a toolchain's static libstdc++,
    nanobind, a template instance) would take libllama's calls to it. On the device's CUDA build, with its GCC's
    static libstdc++, libllama's model load called the extension's ``basic_ostream::_M_insert`` and crashed (SIGSEGV
    in ``llama_model::print_info``)."""
    import shutil
    import subprocess

    from mtp_explorer import _native

    nm = shutil.which("nm")
    assert nm is not None, "binutils' nm is needed (it comes with the compiler the extension is built with)"
    out = subprocess.run([nm, "-D", "--defined-only", _native.__file__], capture_output=True, text=True, check=True)
    assert [line.split()[-1] for line in out.stdout.splitlines() if line.strip()] == ["PyInit__native"]


def test_libllama_is_loaded_before_the_extension_by_any_import():
    """Any first import of the package (here a submodule that uses the extension) loads libllama through
    llama-cpp-python before the extension: libllama then binds its symbols in its own scope, and the extension's log
    callback, set as it loads and again as a session opens, is the one libllama calls (a load failure carries
    llama.cpp's last lines), also after llama-cpp-python code set its own."""
    from conftest import run_isolated

    got = run_isolated("""
        import sys
        order = []

        class Record:
            def find_spec(self, name, path=None, target=None):
                if name in ("llama_cpp", "mtp_explorer._native"):
                    order.append(name)
                return None

        sys.meta_path.insert(0, Record())
        import mtp_explorer.core.drafters
        from mtp_explorer import _native
        import mtp_explorer as mx
        import ctypes, llama_cpp

        @llama_cpp.llama_log_callback
        def silent(level, text, user_data):  # llama-cpp-python code taking llama.cpp's logger (training.llama_ref)
            return None

        llama_cpp.llama_log_set(silent, ctypes.c_void_p(0))
        with mx.Session.open(mx.default_model_path()) as s:
            pass
        print(order, len(_native.take_log()) > 0)
    """)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[0] == "['llama_cpp', 'mtp_explorer._native'] True"
