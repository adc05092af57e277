"""Binder: binder/requirements.txt pins exactly what pyproject.toml pins, and binder/postBuild builds the
project in a fresh virtual environment (from a copy of this checkout; pip's wheel cache is reused, so
llama-cpp-python is not rebuilt when its wheel is cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
try:
    from packaging.requirements import Requirement
except ModuleNotFoundError:
    from pip._vendor.packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
LAB_EXTRA = "lab"


def _pins(lines) -> dict[str, str]:
    """{normalised name: specifier} of requirement strings (comments and blank lines skipped)."""
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            name = req.name.lower().replace("_", "-")
            # the same pin may appear twice (llama-cpp-python: a runtime dependency and a build requirement)
            assert out.get(name, str(req.specifier)) == str(req.specifier), f"{name} pinned twice, differently"
            out[name] = str(req.specifier)
    return out


def pyproject_pins(path: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Runtime dependencies, the ``lab`` extra and the build-system requirements of pyproject.toml."""
    doc = tomllib.loads(path.read_text())
    extras = doc["project"].get("optional-dependencies", {})
    assert LAB_EXTRA in extras, f"pyproject.toml has no [project.optional-dependencies] {LAB_EXTRA}"
    return _pins(doc["project"]["dependencies"] + extras[LAB_EXTRA] + doc["build-system"]["requires"])


def binder_pins() -> dict[str, str]:
    return _pins((BINDER / "requirements.txt").read_text().splitlines())


def test_binder_pins_agree_with_pyproject():
    ours, theirs = binder_pins(), pyproject_pins()
    assert ours == theirs, (
        f"only in binder/requirements.txt: {sorted(set(ours.items()) - set(theirs.items()))}; "
        f"only in pyproject.toml: {sorted(set(theirs.items()) - set(ours.items()))}"
    )
    for name in ("llama-cpp-python", "jupyterlab", "ipywidgets", "plotly"):
        assert ours[name].startswith("=="), f"{name} must be pinned exactly"


def test_binder_files():
    post = BINDER / "postBuild"
    assert post.read_text().startswith("#!/usr/bin/env bash\n")
    assert os.access(post, os.X_OK), "binder/postBuild must be executable (git keeps the mode)"
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    readme = (ROOT / "README.md").read_text()
    assert "mybinder.org/v2/" in readme and "labpath=notebooks%2F01_quickstart.ipynb" in readme
    assert (ROOT / "notebooks" / "01_quickstart.ipynb").exists()


def _checkout_copy(dest: Path) -> Path:
    """The files git tracks or would track (untracked, not ignored), as a fresh checkout has them."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.slow
def test_postbuild_in_a_fresh_virtualenv(tmp_path):
    repo = _checkout_copy(tmp_path / "repo")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MTP_EXPLORER_MODEL")}
    env.update(PYTHON=str(py), PATH=f"{env_dir / 'bin'}:{env['PATH']}")
    proc = subprocess.run(["bash", "binder/postBuild"], cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ready" in proc.stdout

    # the environment runs what the notebooks run: a session, a generation, a figure, the Explorer
    smoke = textwrap.dedent(f"""
        import mtp_explorer as mx
        from mtp_explorer import plots
        from mtp_explorer.widgets import Explorer
        from mtp_explorer.models.synthetic import write_synthetic_qwen35
        path = write_synthetic_qwen35({str(tmp_path / "m.gguf")!r}, context_mix=0.6, mtp_fidelity=1.0)
        assert mx.__file__.startswith({str(repo)!r}), mx.__file__
        with mx.Session.open(path, n_ctx=256, threads=1) as s:
            t = s.generate("def f(x):", max_tokens=16, n_max=3)
            plots.token_timeline(t, s.piece)
            ex = Explorer(s, max_tokens=8)
            ex.run(); assert ex.wait(60) and ex.finish_reason == "budget", ex.error
        print("smoke ok", len(t.tokens))
    """)
    run = subprocess.run([str(py), "-c", smoke], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "smoke ok 16" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    labext = subprocess.run(
        [str(env_dir / "bin" / "jupyter"), "labextension", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    listing = labext.stdout + labext.stderr
    for ext in ("jupyterlab-plotly", "@jupyter-widgets/jupyterlab-manager", "anywidget"):
        assert f"{ext} v" in listing and "enabled" in listing, listing
    versions = subprocess.run([str(py), "-m", "pip", "freeze"], env=env, capture_output=True, text=True).stdout
    for name, spec in binder_pins().items():
        if spec.startswith("=="):
            assert f"{name}{spec}".lower() in versions.lower().replace("_", "-"), name
