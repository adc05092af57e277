"""The bundled model's demo prompts: real multi-line code from held-out files, the default everywhere."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

import mtp_explorer as mx
from mtp_explorer import cli
from training.corpus import is_heldout
from training.evaluate import is_code


def test_demo_prompts_are_multi_line_code_from_held_out_files():
    prompts = mx.demo_prompts()
    assert len(prompts) >= 4
    assert len({p.relpath for p in prompts}) == len(prompts)
    for p in prompts:
        assert is_heldout(p.relpath), p.relpath
        assert 8 <= p.text.count("\n") == p.last - p.first + 1, p.source
        assert p.text.lstrip().startswith(("def ", "class ")) and is_code(p.text), p.source
    assert mx.demo_prompt() == prompts[0].text


def test_demo_prompts_are_the_files_lines():
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in mx.demo_prompts():
        path = root / p.relpath
        if not path.exists():
            pytest.fail(f"{p.relpath} is not in this interpreter's standard library")
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        assert "".join(lines[p.first - 1 : p.last]) == p.text, p.source


def test_the_cli_defaults_to_the_demo_prompt():
    assert cli._parser().parse_args(["run"]).prompt is None  # _run then takes mx.demo_prompt()
