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
    assert cli._parser().parse_args(["run"]).prompt == []  # _run then takes mx.demo_prompt()


def test_the_default_prompt_fits_the_session():
    """The first demo prompt that fits, else the longest tail of whole lines of the first, else the first."""
    first = mx.demo_prompts()[0].text
    length = len  # characters stand in for tokens here
    assert mx.demo_prompt_within(length, 10_000) == first
    fits = [p.text for p in mx.demo_prompts() if len(p.text) <= 400]
    if fits and len(first) > 400:
        assert mx.demo_prompt_within(length, 400) == fits[0]
    tail = mx.demo_prompt_within(length, 60)
    assert len(tail) <= 60 and first.endswith(tail) and tail.endswith("\n") and tail.strip()
    assert mx.demo_prompt_within(length, 0) == first


def test_the_explorer_on_a_small_context_starts_from_a_prompt_that_fits(model_mixed):
    from mtp_explorer.widgets import Explorer

    with mx.Session.open(model_mixed, n_ctx=256, threads=1) as s:  # SYNTHETIC model: another tokenizer
        ex = Explorer(s, max_tokens=8)
        prompt = ex.controls.prompt.value
        texts = [p.text for p in mx.demo_prompts()]
        assert (prompt in texts or texts[0].endswith(prompt)) and len(s.tokenize(prompt)) <= s.n_ctx_seq - 8
        ex.run()
        assert ex.wait(60) and ex.error == "" and ex.finish_reason == "budget", ex.error
