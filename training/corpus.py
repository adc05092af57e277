"""The training corpus: the Python standard library's own ``.py`` sources (PSF licence), and for the
grown trunk (``training/trunk.py``) the sources of pinned third-party packages (:data:`PACKAGES`).

Selection (decided once, documented in the model card): every ``*.py`` file under
``sysconfig.get_paths()["stdlib"]`` except files below a directory named
``site-packages``, ``dist-packages``, ``test``, ``tests`` or ``idle_test`` (third-party
code and the test suites), ``encodings`` (generated codec tables) and ``pydoc_data``
(generated documentation text).  Files that are not valid UTF-8 are skipped.

Package files are selected by the same rules under the package's own directory and named
``<package>/<path inside it>``, so the standard library's names, and its held-out split, are unchanged.

Split: whole files; a file is held out for evaluation when the first byte of
``sha256(relative posix path)`` is below :data:`HELDOUT_THRESHOLD` (~5% of files).  The
split therefore depends on file names only, never on their order or contents.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "pydoc_data"})
HELDOUT_THRESHOLD = 13  # of 256 -> ~5.1% of files
#: third-party sources of the step-2 corpus: import name -> (pinned version, licence); pinned in pyproject's train extra
PACKAGES: dict[str, tuple[str, str]] = {"numpy": ("2.4.6", "BSD-3-Clause"), "pandas": ("3.1.1", "BSD-3-Clause")}


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its path relative to the stdlib root and its text."""

    relpath: str
    text: str

    @property
    def heldout(self) -> bool:
        """Whether this file belongs to the held-out (evaluation) split."""
        return is_heldout(self.relpath)


def stdlib_root() -> Path:
    """The corpus root: ``$MTP_EXPLORER_CORPUS_ROOT`` if set, else the running interpreter's stdlib."""
    override = os.environ.get("MTP_EXPLORER_CORPUS_ROOT")
    return Path(override) if override else Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """Deterministic held-out membership of a file, from its relative path alone."""
    return hashlib.sha256(relpath.encode("utf-8")).digest()[0] < HELDOUT_THRESHOLD


def package_root(name: str) -> Path:
    """The installed package ``name``'s directory, checked against its pinned version in :data:`PACKAGES`."""
    import importlib.metadata
    import importlib.util

    if name not in PACKAGES:
        raise ValueError(f"{name!r} is not a corpus package (known: {sorted(PACKAGES)})")
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {name!r} is not installed (pip install -e .[train])")
    version = importlib.metadata.version(name)
    if version != PACKAGES[name][0]:
        raise ValueError(
            f"{name} {version} is installed; the corpus pins {PACKAGES[name][0]} (pip install -e .[train])"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _select(root: Path, prefix: str = "") -> list[SourceFile]:
    files: list[SourceFile] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(SourceFile(prefix + rel.as_posix(), text))
    return files


def load_corpus(root: Path | None = None, packages: tuple[str, ...] = ()) -> list[SourceFile]:
    """All selected files of the standard library, then of each of ``packages``, each part sorted by relative path.

    A package file whose text is already in the corpus (an empty ``__init__.py``, a vendored copy) is left out."""
    files = _select(root or stdlib_root())
    seen = {hashlib.sha256(f.text.encode("utf-8")).digest() for f in files}
    for name in packages:
        for f in _select(package_root(name), prefix=name + "/"):
            digest = hashlib.sha256(f.text.encode("utf-8")).digest()
            if digest not in seen:
                seen.add(digest)
                files.append(f)
    return files


def split_corpus(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, held-out) lists, each sorted by relative path."""
    train = [f for f in files if not f.heldout]
    held = [f for f in files if f.heldout]
    return train, held


def corpus_fingerprint(files: list[SourceFile]) -> str:
    """sha256 over the relative paths and contents, to tell whether two corpora are the same."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.relpath.encode("utf-8") + b"\0" + f.text.encode("utf-8") + b"\0")
    return h.hexdigest()


def describe(files: list[SourceFile], packages: tuple[str, ...] = ()) -> dict[str, object]:
    """Summary of the corpus for logs and the model card."""
    train, held = split_corpus(files)
    extra = {
        "packages": {
            n: {
                "version": PACKAGES[n][0],
                "licence": PACKAGES[n][1],
                "n_files": sum(f.relpath.startswith(n + "/") for f in files),
            }
            for n in packages
        }
    }
    return {
        **(extra if packages else {}),
        "python": sys.version.split()[0],
        "stdlib_root": str(stdlib_root()),
        "n_files": len(files),
        "n_train_files": len(train),
        "n_heldout_files": len(held),
        "train_bytes": sum(len(f.text.encode("utf-8")) for f in train),
        "heldout_bytes": sum(len(f.text.encode("utf-8")) for f in held),
        "fingerprint": corpus_fingerprint(files),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
    }
