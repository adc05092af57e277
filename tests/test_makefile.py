"""The Makefile, checked with `make -n` in a scratch directory (no GPU and no build needed): LLAMA_CMAKE_ARGS (GPU
builds) reach pip's CMAKE_ARGS (a source build, not the cached CPU wheel) and the reference tools' configure, and a
change of value makes both rebuild; README.md's `make lab`, `make test` and `make docs` run what they say (the build,
then JupyterLab on the quickstart; the lint, every test, then the strict docs build with the notebooks' outputs);
`make test-fast` leaves out the tests by pyproject.toml's markers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
#: What a test may need beyond the built extension: `make test-fast` leaves out the tests marked with any of these.
NEEDS = ("reference", "server", "browser", "train", "slow")


def _dry_run(cwd: Path, *args: str, target: str = "test") -> str:
    proc = subprocess.run(
        ["make", "-n", "-f", str(MAKEFILE), target, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_llama_cmake_args_reach_pip_and_the_reference_build(tmp_path):
    for name in ("pyproject.toml", "CMakeLists.txt"):  # the prerequisites make checks the time of
        (tmp_path / name).touch()
    cuda = _dry_run(tmp_path, "LLAMA_CMAKE_ARGS=-DGGML_CUDA=on")
    pip = next(line for line in cuda.splitlines() if "pip install" in line and "llama-cpp-python==" in line)
    assert pip.startswith('CMAKE_ARGS="-DGGML_CUDA=on"') and "--no-binary llama-cpp-python" in pip
    assert "--force-reinstall" in pip and "--no-deps" not in pip
    configure = cuda[cuda.index("cmake -S") :].split("\n\n")[0]
    assert "-DGGML_CUDA=on" in configure
    assert (tmp_path / "build" / ".llama-cmake-args").read_text().strip() == "-DGGML_CUDA=on"
    # back to the default: the stamp changes, so llama-cpp-python is installed again (the cached CPU wheel)
    plain = _dry_run(tmp_path)
    pip = next(line for line in plain.splitlines() if "pip install" in line and "llama-cpp-python==" in line)
    assert pip.startswith('CMAKE_ARGS=""') and "--no-binary" not in pip
    assert (tmp_path / "build" / ".llama-cmake-args").read_text().strip() == ""


def _scratch(tmp_path: Path) -> Path:
    for name in ("pyproject.toml", "CMakeLists.txt"):  # the prerequisites make checks the time of
        (tmp_path / name).touch()
    return tmp_path


def test_make_lab_builds_then_opens_the_quickstart(tmp_path):
    out = _dry_run(_scratch(tmp_path), target="lab")
    install = out.index("pip install --progress-bar off --no-build-isolation -e '.[test,lab,train,docs]'")
    assert out.index(".venv/bin/jupyter lab notebooks/01_quickstart.ipynb") > install


def test_make_test_lints_builds_the_docs_and_runs_every_test(tmp_path):
    out = _dry_run(_scratch(tmp_path))
    steps = [
        ".venv/bin/ruff check && .venv/bin/ruff format --check && .venv/bin/mypy",
        "-m pytest -q --durations=30 --nbval-lax tests notebooks",
        # last: the tutorials' pages show the outputs of the run above, and a missing one fails the build
        "MTP_EXPLORER_DOCS_OUTPUTS=required .venv/bin/mkdocs build --strict -d build/site",
    ]
    where = [out.find(step) for step in steps]
    assert -1 not in where and where == sorted(where), out[-2000:]
    (pytest_line,) = [line for line in out.splitlines() if "-m pytest" in line]
    assert ' -m "' not in pytest_line  # every test: no marker left out


def test_make_docs_builds_the_site_strict(tmp_path):
    assert ".venv/bin/mkdocs build --strict -d build/site" in _dry_run(_scratch(tmp_path), target="docs")


def test_make_docs_runs_the_notebooks_first(tmp_path):
    scratch = _scratch(tmp_path)
    (scratch / "notebooks").mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        (scratch / "notebooks" / name).touch()
    out = _dry_run(scratch, target="docs")
    assert "--nbval-lax -p no:cacheprovider notebooks/01_a.ipynb" in out
    assert out.index("notebooks/02_b.ipynb") < out.index("mkdocs build --strict")


def test_the_markers_are_registered(pytestconfig):
    registered = {marker.split(":")[0] for marker in pytestconfig.getini("markers")}
    assert set(NEEDS) <= registered


def test_make_test_fast_leaves_out_every_need(tmp_path):
    out = _dry_run(_scratch(tmp_path), target="test-fast")
    (command,) = [line for line in out.splitlines() if "-m pytest" in line]
    selection = re.search(r'-m "([^"]*)"', command).group(1)
    assert selection == " and ".join(f"not {need}" for need in NEEDS), selection
    assert command.split()[-1] == "tests" and "--nbval" not in command
