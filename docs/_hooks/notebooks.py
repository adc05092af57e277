"""An mkdocs hook: the tutorial notebooks as pages of the site, with the outputs of their last passing run.

``notebooks/NN_name.ipynb`` becomes the page ``tutorials/NN_name.md``: its Markdown cells as they are, its code in
fenced blocks, and the outputs that nbval recorded when the notebook last passed (notebooks/conftest.py writes them to
``build/notebooks/``): printed text, tables, plotly figures (drawn by the plotly.js that the installed plotly ships,
served once as ``assets/plotly.min.js``) and images. A live widget (the Explorer) has no static form: its place says
so. A notebook whose recorded run is missing, or whose code has changed since, is shown without outputs under a note
that says so; ``MTP_EXPLORER_DOCS_OUTPUTS=required`` (set by ``make docs`` and ``make test``, which run the notebooks
first) makes that a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.notebooks")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
PLOTLY_JS = "assets/plotly.min.js"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NOTEBOOK_LINK = re.compile(r"\]\((\d\d_[A-Za-z0-9_]+)\.ipynb(#[^)]*)?\)")


def _joined(value: str | list[str]) -> str:
    """A notebook's multi-line string, which nbformat stores as one string or a list of lines."""
    return "".join(value) if isinstance(value, list) else value


def _source(cell: dict[str, Any]) -> str:
    return _joined(cell.get("source", ""))


def _code(nb: dict[str, Any]) -> list[str]:
    return [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _stream_text(text: str) -> str:
    """The text as a terminal shows it: colour codes dropped, a line rewritten by a carriage return in its last form."""
    lines = [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", text).split("\n")]
    return "\n".join(lines).rstrip("\n")


def _fenced(text: str, lang: str = "text") -> str:
    return f"````{lang}\n{text}\n````"


def _raw_html(markup: str) -> str:
    """Markup as one raw HTML block: Markdown leaves it alone only while no blank line splits it."""
    body = "\n".join(line for line in markup.splitlines() if line.strip())
    return f'<div class="nb-output">\n{body}\n</div>'


def _plotly(figure: dict[str, Any]) -> str:
    import plotly.io as pio

    return _raw_html(pio.to_html(figure, full_html=False, include_plotlyjs=False, config={"responsive": True}))


def _output(out: dict[str, Any]) -> str | None:
    """One output as Markdown, or None for one that shows nothing."""
    kind = out.get("output_type")
    if kind == "stream":
        text = _stream_text(_joined(out.get("text", "")))
        return _fenced(text) if text.strip() else None
    if kind == "error":
        return _fenced(_stream_text("\n".join(out.get("traceback", []))))
    data = out.get("data", {})
    if WIDGET_MIME in data:
        return (
            '!!! info "A live widget"\n'
            "    This output is an interactive widget: it draws in JupyterLab (`make lab`). "
            "[The Explorer](../guide/explorer.md) shows what it looks like."
        )
    if PLOTLY_MIME in data:
        return _plotly(data[PLOTLY_MIME])
    if "text/html" in data:
        return _raw_html(_joined(data["text/html"]))
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            payload = "".join(data[mime]).replace("\n", "")
            return f'<img class="nb-output" alt="output" src="data:{mime};base64,{payload}">'
    if "image/svg+xml" in data:
        svg = base64.b64encode(_joined(data["image/svg+xml"]).encode()).decode()
        return f'<img class="nb-output" alt="output" src="data:image/svg+xml;base64,{svg}">'
    if "text/markdown" in data:
        return _joined(data["text/markdown"])
    if "text/plain" in data:
        return _fenced(html.unescape(_joined(data["text/plain"])))
    return None


def _markdown_cell(text: str) -> str:
    """A Markdown cell, its links to a sibling notebook turned into links to that notebook's page."""
    return NOTEBOOK_LINK.sub(lambda m: f"]({m.group(1)}.md{m.group(2) or ''})", text)


def render(source: Path, executed: Path | None, *, prefix: str) -> tuple[str, bool]:
    """The Markdown page of one notebook and whether it carries a passing run's outputs.

    ``executed`` is that run's copy; it is used only when its code equals the notebook's. ``prefix`` leads from the
    page to the site's root (for plotly.js)."""
    nb = _load(source)
    with_outputs = False
    if executed is not None and executed.exists():
        ran = _load(executed)
        if _code(ran) == _code(nb):
            nb, with_outputs = ran, True
    parts: list[str] = []
    uses_plotly = False
    for cell in nb["cells"]:
        text = _source(cell)
        if cell["cell_type"] == "markdown":
            parts.append(_markdown_cell(text))
        elif cell["cell_type"] == "code":
            parts.append(_fenced(text, "python"))
            for out in cell.get("outputs", []) if with_outputs else []:
                uses_plotly |= PLOTLY_MIME in out.get("data", {})
                md = _output(out)
                if md:
                    parts.append(md)
    if not with_outputs:
        parts.insert(
            1,
            '!!! note "Shown without outputs"\n'
            "    This page shows the notebook's code only: `make docs` runs the notebook first and shows what it "
            "prints and draws.",
        )
    # after the title (the first cell): mkdocs takes a page's title from a heading that opens it
    download = f"[Download the notebook](../../notebooks/{source.name}) and run it in JupyterLab (`make lab`)."
    parts.insert(1, download)
    if uses_plotly:
        parts.insert(1, f'<script src="{prefix}{PLOTLY_JS}"></script>')
    return "\n\n".join(parts) + "\n", with_outputs


def on_files(files, config, **kwargs):
    prefix = "../../" if config.get("use_directory_urls", True) else "../"
    required = os.environ.get("MTP_EXPLORER_DOCS_OUTPUTS") == "required"
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        page, with_outputs = render(source, EXECUTED / source.name, prefix=prefix)
        if not with_outputs:
            say = log.warning if required else log.info
            say("tutorials/%s.md: no passing run of %s with its current code in %s", source.stem, source.name, EXECUTED)
        files.append(File.generated(config, f"tutorials/{source.stem}.md", content=page))
    import plotly

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    files.append(File.generated(config, PLOTLY_JS, abs_src_path=str(js)))
    return files
