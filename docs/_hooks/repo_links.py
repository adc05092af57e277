"""An mkdocs hook: relative links to the repository's files outside docs/ point at the repository.

The docs link to notebooks, source files and the model card with paths relative to the page (``../../notebooks/
01_quickstart.ipynb``), so that the same Markdown works on GitHub. mkdocs knows only the files under docs/; this
rewrites each such link to the file's page under ``repo_url`` and makes a link to a file that does not exist a
warning (``mkdocs build --strict`` fails on it).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) and [text](target "title"); a target with a scheme or an anchor alone is left alone
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    page_dir = Path(page.file.abs_src_path).resolve().parent
    repo = (config.get("repo_url") or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("/"):
            return match.group(0)
        path = (page_dir / target).resolve()
        try:
            path.relative_to(docs_dir)
            return match.group(0)  # a page of the site: mkdocs checks it
        except ValueError:
            pass
        try:
            rel = path.relative_to(root)
        except ValueError:
            log.warning("%s: link %r leaves the repository", page.file.src_uri, target)
            return match.group(0)
        if not path.exists():
            log.warning("%s: link %r names no file of the repository", page.file.src_uri, target)
            return match.group(0)
        kind = "tree" if path.is_dir() else "blob"
        return f"{match.group(1)}{repo}/{kind}/HEAD/{rel.as_posix()}{match.group(3) or ''}{match.group(4) or ''})"

    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(rewrite, line))
    return "\n".join(out)
