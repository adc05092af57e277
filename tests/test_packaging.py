"""Packaging: the wheel and the sdist that `pip install .` and `python -m build` make.

The wheel is built here without build isolation (this environment's scikit-build-core, nanobind and llama-cpp-python;
pip's isolated build installs the same pins from pyproject.toml's [build-system]) into build/packaging, a build folder
of its own that later runs reuse (the first run compiles the extension: about two minutes on 2 cores). It must carry
the extension, the bundled models and prompts, every file of the package, and nothing of mtp_explorer/devtools (the
runtime imports none of it: `mtp-explorer synth` writes with mtp_explorer.models, the CPU kernel probe is
mtp_explorer.models.cpu_probe). The sdist must hold what a build needs, and `twine check` must pass on both.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtp_explorer"
DEVTOOLS = PACKAGE / "devtools"
MODELS = ["MODEL.md", "prompts.json", "__init__.py", *sorted(p.name for p in (PACKAGE / "models").glob("*.gguf"))]
# what the runtime runs that once lived in mtp_explorer/devtools: `mtp-explorer synth` (the SYNTHETIC writers) and the
# CPU kernel probe (python -m mtp_explorer.models.cpu_probe)
RUNTIME_MODULES = [
    "models/cpu_probe.py",
    "models/gguf_qwen35.py",
    "models/synth.py",
    "models/synthetic.py",
    "models/synthetic_gemma4.py",
    "models/synthetic_glm4moe.py",
    "models/synthetic_qwen35moe.py",
    "models/synthetic_step35.py",
    "models/SYNTHETIC.md",
]
BUILD_TIMEOUT = 900


def _run(*cmd: str, timeout: float = BUILD_TIMEOUT) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--progress-bar",
        "off",
        "--config-settings=build-dir=build/packaging/{wheel_tag}",
        "-w",
        str(out),
        str(ROOT),
    )
    (whl,) = out.glob("mtp_explorer-*.whl")
    return whl


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    pytest.importorskip("build", reason="the test extra installs build (`make`)")
    out = tmp_path_factory.mktemp("sdist")
    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(ROOT), timeout=300)
    (tgz,) = out.glob("mtp_explorer-*.tar.gz")
    return tgz


def _package_files() -> set[str]:
    """The package's files as the wheel holds them (mtp_explorer/...), without caches and built objects."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and not {"__pycache__", ".ipynb_checkpoints"} & set(p.parts) and p.suffix not in {".pyc", ".so"}
    }


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _devtools_imports(path: Path, text: str | None = None) -> set[str]:
    """The mtp_explorer.devtools modules ``path`` (or ``text`` as that module) imports (at any depth: lazy imports
    count) or names as a string (``python -m mtp_explorer.devtools.quantize``)."""
    tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text)
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module[:-1]
    found: set[str] = set()

    def add(full: list[str]) -> None:
        if full[:2] == ["mtp_explorer", "devtools"] and len(full) > 2:
            found.add(full[2])

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            full = base + (node.module.split(".") if node.module else [])
            add(full)
            if full == ["mtp_explorer", "devtools"]:  # from . import x / from mtp_explorer.devtools import x
                for alias in node.names:
                    if (DEVTOOLS / f"{alias.name}.py").exists():
                        found.add(alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"mtp_explorer\.devtools\.(\w+)", node.value)
            if m:
                found.add(m.group(1))
    return found


def runtime_devtools_imports() -> dict[str, set[str]]:
    """The devtools modules each module of the package outside mtp_explorer/devtools imports (none may)."""
    found = {
        p.relative_to(ROOT).as_posix(): _devtools_imports(p)
        for p in sorted(PACKAGE.rglob("*.py"))
        if DEVTOOLS not in p.parents
    }
    return {path: names for path, names in found.items() if names}


def test_the_runtime_imports_no_development_tool():
    """The wheel leaves out all of mtp_explorer/devtools (pyproject.toml's wheel.exclude), so no runtime module may
    import one, lazily or by name (`python -m ...`)."""
    assert runtime_devtools_imports() == {}
    for name in RUNTIME_MODULES:
        assert (PACKAGE / name).is_file(), name


def test_the_import_finder_sees_lazy_and_named_imports():
    """The check above would see a development tool imported lazily, relatively or named as a module to run."""
    text = (
        "def f():\n    from ..devtools import reference\n    from ..devtools.quantize import quantize\n"
        "CMD = 'mtp_explorer.devtools.hf_export'\n"
    )
    assert _devtools_imports(PACKAGE / "core" / "example.py", text) == {"reference", "quantize", "hf_export"}


@pytest.mark.slow  # builds the wheel (the extension: about a minute the first time)
def test_wheel_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # the extension, built and installed by CMake
    assert any(re.fullmatch(r"mtp_explorer/_native\.[\w.-]+\.(so|pyd)", n) for n in names), sorted(names)
    # the bundled models, their prompts and card
    for name in MODELS:
        assert f"mtp_explorer/models/{name}" in names, name
    # every file of the package but the development tools, the modules the runtime runs among them
    devtools = sorted(n for n in names if n.startswith("mtp_explorer/devtools/"))
    assert not devtools, devtools
    for name in RUNTIME_MODULES:
        assert f"mtp_explorer/{name}" in names, name
    missing = {f for f in _package_files() if not f.startswith("mtp_explorer/devtools/")} - names
    assert not missing, sorted(missing)
    # nothing of the checkout outside the package
    dist_info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info/"
    assert {n.split("/")[0] + "/" for n in names} <= {"mtp_explorer/", dist_info}, sorted(names)
    meta = zipfile.ZipFile(wheel).read(dist_info + "METADATA").decode()
    assert "Requires-Dist: llama-cpp-python==0.3.36" in meta
    entry_points = zipfile.ZipFile(wheel).read(dist_info + "entry_points.txt").decode()
    assert "mtp-explorer = mtp_explorer.cli:main" in entry_points


@pytest.mark.slow  # builds the wheel (the extension: about a minute the first time)
def test_the_wheel_installed_alone_runs_the_readme_commands(wheel, tmp_path):
    """README.md's `pip install .` (the wheel built above, as pip builds it for `pip install .`, then installed) and its
    `mtp-explorer run -n 128 --spec-draft-n-max 3`, run outside the checkout with the package imported from the
    installed wheel alone (its dependencies from this environment, llama_cpp beside it as in site-packages)."""
    site = tmp_path / "site"
    _run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel))
    purelib = Path(sysconfig.get_paths()["purelib"])
    (site / "llama_cpp").symlink_to(purelib / "llama_cpp", target_is_directory=True)
    # -S: no .pth files, so not the checkout's editable install; PYTHONPATH: the wheel's files first
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MTP_EXPLORER_MODEL"}}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(purelib)])
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-S", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    code = (
        "import mtp_explorer as mx; print(mx.__file__); "
        "print(mx.Session.open(None).generate(mx.demo_prompt(), max_tokens=16, n_max=3).summary()['n_tokens'])"
    )
    where, n_tokens = run("-c", code).split()
    assert Path(where).is_relative_to(site) and n_tokens == "16"
    # the console script is mtp_explorer.cli:main (test_wheel_files checks the entry point)
    out = run("-m", "mtp_explorer.cli", "run", "-n", "128", "--spec-draft-n-max", "3")
    assert out.strip(), out


@pytest.mark.slow  # builds the wheel (the extension: about a minute the first time)
def test_wheel_extension_finds_libllama_beside_it(wheel, tmp_path):
    """The extension's rpath is the llama_cpp package beside mtp_explorer in site-packages alone: no folder of the
    machine (or of pip's temporary build environment) that built it."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    with zipfile.ZipFile(wheel) as z:
        (ext,) = [n for n in z.namelist() if n.startswith("mtp_explorer/_native.")]
        path = Path(z.extract(ext, tmp_path))
    dynamic = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"\(RUNPATH\)\s+Library runpath: \[\$ORIGIN/\.\./llama_cpp/lib\]", dynamic), dynamic
    assert "Shared library: [libllama.so" in dynamic


def test_sdist_files(sdist):
    with tarfile.open(sdist) as tar:
        top = sdist.name[: -len(".tar.gz")]
        names = {n[len(top) + 1 :] for n in tar.getnames() if n.startswith(top + "/")}
    for name in ("pyproject.toml", "CMakeLists.txt", "README.md", "PKG-INFO", "native_ext/_native.map"):
        assert name in names, name
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "native_ext").iterdir() if p.is_file()}
    assert sources and not sources - names, sorted(sources - names)
    # the whole package, development tools included (an editable install from the sdist needs them)
    missing = _package_files() - names
    assert not missing, sorted(missing)
    # no build output, virtual environment or training checkpoint
    assert not {n for n in names if n.split("/")[0] in {"build", ".venv", ".git"}}
    assert not {n for n in names if n.startswith("training/checkpoints/")}


@pytest.mark.slow  # builds the wheel (the extension: about a minute the first time)
def test_twine_check(wheel, sdist):
    pytest.importorskip("twine", reason="the test extra installs twine (`make`)")
    out = _run(sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist), timeout=120)
    assert out.count("PASSED") == 2, out
