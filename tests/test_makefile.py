"""The Makefile's LLAMA_CMAKE_ARGS (GPU builds), checked with `make -n` in a scratch directory: the arguments reach
pip's CMAKE_ARGS (a source build, not the cached CPU wheel) and the reference tools' configure, and a change of
value makes both rebuild. No GPU and no build needed."""

from __future__ import annotations

import subprocess
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _dry_run(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["make", "-n", "-f", str(MAKEFILE), "test", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_llama_cmake_args_reach_pip_and_the_reference_build(tmp_path):
    for name in ("pyproject.toml", "CMakeLists.txt"):  # the prerequisites make checks the time of
        (tmp_path / name).touch()
    cuda = _dry_run(tmp_path, "LLAMA_CMAKE_ARGS=-DGGML_CUDA=on")
    pip = next(line for line in cuda.splitlines() if "pip install" in line and "llama-cpp-python==" in line)
    assert pip.startswith('CMAKE_ARGS="-DGGML_CUDA=on"') and "--no-binary llama-cpp-python" in pip
    assert "--force-reinstall" in pip and "--no-deps" not in pip
    configure = cuda[cuda.index("cmake -S"):].split("\n\n")[0]
    assert "-DGGML_CUDA=on" in configure
    assert (tmp_path / "build" / ".llama-cmake-args").read_text().strip() == "-DGGML_CUDA=on"
    # back to the default: the stamp changes, so llama-cpp-python is installed again (the cached CPU wheel)
    plain = _dry_run(tmp_path)
    pip = next(line for line in plain.splitlines() if "pip install" in line and "llama-cpp-python==" in line)
    assert pip.startswith('CMAKE_ARGS=""') and "--no-binary" not in pip
    assert (tmp_path / "build" / ".llama-cmake-args").read_text().strip() == ""
