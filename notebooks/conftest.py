"""The tutorials as nbval runs them (`make test`, `make docs`): a notebook whose every cell passed is written, with the
outputs of that run, to build/notebooks/ under the rootdir, where the documentation site renders it
(docs/_hooks/notebooks.py).

notebooks/__init__.py makes this module notebooks.conftest: a second module named plain conftest would shadow
tests/conftest.py, which the tests import from.

A notebook with a failed or skipped cell is not written (and an earlier copy of it is removed), so that the site
never shows the outputs of a run that did not pass.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import nbformat
import pytest

#: where the notebooks' runs go, under the rootdir
EXECUTED = Path("build") / "notebooks"

_passed: dict[Path, int] = defaultdict(int)
_failed: set[Path] = set()


def _is_cell(item: pytest.Item) -> bool:
    """An nbval cell item: it runs one code cell and keeps what the kernel sent back."""
    return hasattr(item, "cell") and hasattr(item, "test_outputs")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if not _is_cell(item):
        return
    report = outcome.get_result()
    path = Path(str(item.path))
    if report.failed or report.skipped:
        _failed.add(path)
    elif report.when == "call":
        item.cell["outputs"] = list(item.test_outputs or [])
        _passed[path] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    notebooks: dict[Path, tuple[object, int]] = {}
    for item in session.items:
        if _is_cell(item):
            path = Path(str(item.path))
            parent, n = notebooks.get(path, (item.parent, 0))
            notebooks[path] = (parent, n + 1)
    out = session.config.rootpath / EXECUTED
    for path, (parent, n_cells) in notebooks.items():
        target = out / path.name
        if path in _failed or _passed[path] != n_cells:
            target.unlink(missing_ok=True)
            continue
        out.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        nbformat.write(parent.nb, str(tmp))  # type: ignore[attr-defined]
        tmp.replace(target)
