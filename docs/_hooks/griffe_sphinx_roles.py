"""A griffe extension for the API reference: the docstrings' Sphinx roles as Markdown code.

The package's docstrings use Sphinx's cross-reference roles (:func:`~mtp_explorer.simulate`, :class:`Trace`,
:data:`FIGURES`). mkdocstrings renders docstrings as Markdown, where a role would show as ``:func:`` before the
name; this turns each role into an inline code span of the name it shows (``~`` keeps the last dotted part, as in
Sphinx). Sphinx's ``::`` before a literal block becomes ``:``.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|exc|obj|const|term|ref):`(~?)([^`<]+?)(?:\s*<[^>]+>)?`")
LITERAL_BLOCK = re.compile(r"(\S)::\n")


def _code(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown_of(text: str) -> str:
    """The docstring with its Sphinx roles turned into code spans."""
    return LITERAL_BLOCK.sub(r"\1:\n", ROLE.sub(_code, text))


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring as it is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
