"""The documentation: the site builds with `mkdocs build --strict`, every relative link of the Markdown resolves, the
API reference covers every public name, and README.md stays short with a Python example that runs."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

import mtp_explorer as mx

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
API_PAGE = DOCS / "api.md"
README_MAX_LINES = 200
# every Markdown file the site or GitHub shows: the README, the docs pages, the model card and training/README.md
MARKDOWN = [
    README,
    *sorted(DOCS.rglob("*.md")),
    ROOT / "mtp_explorer" / "models" / "MODEL.md",
    ROOT / "training" / "README.md",
]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def links_of(text: str) -> list[tuple[int, str]]:
    """The link targets of Markdown text (outside code blocks and code spans), with their line numbers."""
    out = []
    for number, line in _prose_lines(text):
        # a code span inside a link's text stays a link: drop the spans' contents, keep the brackets around them
        for match in LINK.finditer(CODE_SPAN.sub("``", line)):
            out.append((number, match.group(1)))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return links_of(path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """The anchor of a heading as mkdocs' toc extension (Python-Markdown's slugify) makes it; GitHub's agrees for the
    plain ASCII headings these pages have."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {
        slug(m.group(2)) for _, line in _prose_lines(path.read_text(encoding="utf-8")) if (m := HEADING.match(line))
    }


def test_the_link_and_anchor_helpers():
    page = '# Title\n\n```sh\n[not](a-link.md)\n```\nSee [`code`](x.md#part) and ![img](y.png "t") and `[no](z.md)`.\n'
    assert links_of(page) == [(6, "x.md#part"), (6, "y.png")]
    assert slug("MTP modes: `mtp_mode` and `n_mtp_heads`") == "mtp-modes-mtp_mode-and-n_mtp_heads"
    assert slug("Draft model: `pystdlib-draft.gguf`") == "draft-model-pystdlib-draftgguf"
    assert slug("Placement: GPU offload, attention, KV cache") == "placement-gpu-offload-attention-kv-cache"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert path.exists(), f"{path} is missing"
    broken = []
    for number, target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # another site: not checked here (mkdocs checks none either)
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if dest.parent == DOCS / "tutorials" and dest.suffix == ".md":
            # a tutorial page, which the site generates from its notebook (docs/_hooks/notebooks.py)
            dest = ROOT / "notebooks" / dest.with_suffix(".ipynb").name
            anchor = ""
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{where} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def test_the_docs_pages_link_to_each_other():
    """Every page under docs/ is reached from the README (through the docs' own links)."""
    seen, todo = set(), [README]
    while todo:
        page = todo.pop()
        for _, target in links(page):
            file_part = target.partition("#")[0]
            if SCHEME.match(target) or not file_part.endswith(".md"):
                continue
            dest = (page.parent / file_part).resolve()
            if dest.exists() and DOCS in dest.parents and dest not in seen:
                seen.add(dest)
                todo.append(dest)
    pages = {p.resolve() for p in DOCS.rglob("*.md")}
    assert pages - seen == set(), sorted(str(p.relative_to(ROOT)) for p in pages - seen)


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def api_directives() -> list[str]:
    return re.findall(r"^:::\s+(\S+)\s*$", API_PAGE.read_text(encoding="utf-8"), re.M)


def _resolve(dotted: str):
    """The object a ``::: a.b.c`` directive names, imported the way mkdocstrings finds it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_the_api_reference_lists_every_public_name():
    directives = api_directives()
    assert len(directives) == len(set(directives)), "a name is documented twice"
    documented = {}
    for dotted in directives:
        assert dotted.startswith("mtp_explorer."), dotted
        documented.setdefault(dotted.rsplit(".", 1)[1], []).append(_resolve(dotted))
    missing = [name for name in mx.__all__ if not any(obj is getattr(mx, name) for obj in documented.get(name, []))]
    assert not missing, f"docs/api.md has no ::: directive for {missing}"
    extra = sorted(set(documented) - set(mx.__all__))
    assert not extra, f"docs/api.md documents names that are not in mtp_explorer.__all__: {extra}"


#: Every shell command README.md shows, and the test that runs it (`make lab` and `make test` as dry runs: they are what
#: the tests themselves run under; `python -m build`'s sdist and pip's wheel are built once, by the packaging tests).
README_COMMANDS = {
    "make lab": ("test_makefile.py", "test_make_lab_builds_then_opens_the_quickstart"),
    "make test": ("test_makefile.py", "test_make_test_lints_builds_the_docs_and_runs_every_test"),
    "make docs": ("test_docs.py", "test_the_site_builds_strict"),
    "pip install .": ("test_packaging.py", "test_the_wheel_installed_alone_runs_the_readme_commands"),
    "pip install": ("test_packaging.py", "test_the_wheel_installed_alone_runs_the_readme_commands"),
    "python -m build": ("test_packaging.py", "test_sdist_files"),
    "mtp-explorer run -n 128 --spec-draft-n-max 3": (
        "test_packaging.py",
        "test_the_wheel_installed_alone_runs_the_readme_commands",
    ),
}
COMMAND = re.compile(r"^(make|pip|python -m|mtp-explorer) ")


def readme_commands() -> list[str]:
    """The shell commands of README.md: the lines of its ``sh`` blocks and its code spans that start like one."""
    text = README.read_text(encoding="utf-8")
    lines = [
        line.split("#")[0].strip()
        for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
        for line in block.splitlines()
    ]
    spans = [m.group(0)[1:-1].strip() for _, line in _prose_lines(text) for m in CODE_SPAN.finditer(line)]
    return [c for c in lines + spans if COMMAND.match(c)]


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    assert {"make lab", "make test"} <= set(commands)
    missing = sorted(set(commands) - set(README_COMMANDS))
    assert not missing, f"README.md shows commands no test runs (add one to README_COMMANDS): {missing}"
    for command, (file, test) in README_COMMANDS.items():
        assert f"def {test}(" in (ROOT / "tests" / file).read_text(encoding="utf-8"), (command, file, test)


def readme_python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_the_readme_example_is_the_getting_started_one_and_cheap():
    blocks = readme_python_blocks()
    assert len(blocks) == 1, f"README.md should hold one Python example, it holds {len(blocks)}"
    code = blocks[0]
    assert len(code.strip().split("\n")) <= 20
    budgets = [int(n) for n in re.findall(r"max_tokens=(\d+)", code)]
    assert budgets and max(budgets) <= 32, f"keep the example cheap: max_tokens {budgets}"
    assert f"```python\n{code}```" in (DOCS / "index.md").read_text(encoding="utf-8"), (
        "docs/index.md's first session should be the README's example, word for word"
    )


def test_the_readme_example_runs(tmp_path):
    (code,) = readme_python_blocks()
    env = {k: v for k, v in os.environ.items() if k != "MTP_EXPLORER_MODEL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = proc.stdout.strip().split("\n")
    assert len(printed) >= 4, proc.stdout
    # the what-if lines: "n_max mean_accepted_length", each within [0, n_max]
    whatif = [line.split() for line in printed[-4:]]
    assert [int(n) for n, _ in whatif] == [1, 2, 3, 4], printed[-4:]
    assert all(0.0 <= float(mean) <= int(n) for n, mean in whatif), printed[-4:]


def _griffe_roles():
    spec = importlib.util.spec_from_file_location("griffe_sphinx_roles", DOCS / "_hooks" / "griffe_sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.docs
def test_the_docstrings_sphinx_roles_become_code():
    roles = _griffe_roles()
    assert roles.markdown_of("see :func:`~mtp_explorer.simulate` and :class:`Trace`") == "see `simulate` and `Trace`"
    assert roles.markdown_of(":meth:`mtp_explorer.Session.generate`") == "`mtp_explorer.Session.generate`"
    assert roles.markdown_of("it shows it::\n\n    code\n") == "it shows it:\n\n    code\n"


@pytest.mark.docs
def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs): no warning, every page, the API reference of every name."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        mkdocs = shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: `make` installs the docs extra (pip install -e '.[docs]')"
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("MTP_EXPLORER_DOCS_OUTPUTS", None)  # the notebooks may not have run yet: pages without outputs are fine
    proc = subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "WARNING" not in output, output[-6000:]
    for page in DOCS.rglob("*.md"):
        if "_hooks" in page.parts:
            continue
        rel = page.relative_to(DOCS).with_suffix("")
        built = site / (
            "index.html"
            if rel.name == "index" and rel.parent == Path(".")
            else rel.parent / "index.html"
            if rel.name == "index"
            else rel / "index.html"
        )
        assert built.exists(), f"{page.relative_to(ROOT)} was not built ({built})"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for dotted in api_directives():
        assert f'id="{dotted}"' in api, f"the API reference has no entry for {dotted}"
    assert ":func:`" not in api and ":class:`" not in api, "a Sphinx role was left in the API reference"
    # links to the repository's files outside docs/ point at the repository
    explorer = (site / "guide" / "explorer" / "index.html").read_text(encoding="utf-8")
    assert "/blob/HEAD/notebooks/01_quickstart.ipynb" in explorer
    # every tutorial is a page, which links to its notebook in the repository
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = (site / "tutorials" / notebook.stem / "index.html").read_text(encoding="utf-8")
        assert f"/blob/HEAD/notebooks/{notebook.name}" in page, notebook.name
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000


def _notebook_hook():
    spec = importlib.util.spec_from_file_location("notebooks_hook", DOCS / "_hooks" / "notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notebook(code: list[str], outputs: list[list[dict]] | None = None) -> dict:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# A title\n", "See [the next](02_next.ipynb)."]}]
    for i, src in enumerate(code):
        cells.append(
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "source": src,
                "outputs": outputs[i] if outputs else [],
            }
        )
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_a_notebook_page_shows_its_last_passing_run(tmp_path):
    """docs/_hooks/notebooks.py: the page of a notebook holds the outputs of its run when the run's code is the
    notebook's, and says it has none otherwise."""
    import json

    hook = _notebook_hook()
    figure = {"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}], "layout": {"title": {"text": "acceptance"}}}
    outputs = [
        [
            {"output_type": "stream", "name": "stdout", "text": ["10%\r50%\r100%\n", "\x1b[31mdone\x1b[0m\n"]},
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {hook.PLOTLY_MIME: figure, "text/plain": ["Figure"]},
            },
        ],
        [
            {
                "output_type": "execute_result",
                "execution_count": 2,
                "metadata": {},
                "data": {hook.WIDGET_MIME: {"model_id": "x"}, "text/plain": ["Explorer(...)"]},
            },
            {
                "output_type": "execute_result",
                "execution_count": 3,
                "metadata": {},
                "data": {"text/html": ["<table>\n", "\n", "<tr><td>1</td></tr>\n</table>"], "text/plain": ["1"]},
            },
        ],
    ]
    source, ran = tmp_path / "01_a.ipynb", tmp_path / "ran.ipynb"
    source.write_text(json.dumps(_notebook(["print(1)", "w"])))
    ran.write_text(json.dumps(_notebook(["print(1)", "w"], outputs)))
    page, with_outputs = hook.render(source, ran, prefix="../../")
    assert with_outputs
    assert page.startswith("# A title\n") and "[the next](02_next.md)" in page
    assert "````text\n100%\ndone\n````" in page  # a progress line in its last form, no colour codes
    assert '<script src="../../assets/plotly.min.js"></script>' in page and "acceptance" in page
    assert "Plotly.newPlot" in page and "A live widget" in page and "Explorer(...)" not in page
    assert "<table>\n<tr><td>1</td></tr>\n</table>" in page  # one raw HTML block: no blank line in it
    assert "](../../notebooks/01_a.ipynb)" in page

    ran.write_text(json.dumps(_notebook(["print(2)", "w"], outputs)))  # the notebook changed since that run
    page, with_outputs = hook.render(source, ran, prefix="../../")
    assert not with_outputs and "Shown without outputs" in page and "100%" not in page and "plotly.min.js" not in page
    page, with_outputs = hook.render(source, tmp_path / "missing.ipynb", prefix="../../")
    assert not with_outputs and "Shown without outputs" in page
