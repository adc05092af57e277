"""Parsing llama-speculative-simple's output, and the replay of its budget rule.

tests/data/speculative_simple.* is real output of `llama-speculative-simple --spec-type draft-mtp -n 40
--spec-draft-n-max 3 --temp 0 -p "def fib(n):"` (built from the 0.3.36 sources) on the synthetic
model write_synthetic_qwen35(context_mix=0.5, mtp_fidelity=1.0); stderr is cut to its summary lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mtp_explorer as mx
from mtp_explorer.devtools.synthetic import write_synthetic_qwen35
from mtp_explorer.devtools.reference import parse_reference_output, replay_reference_budget

DATA = Path(__file__).parent / "data"


def test_parse_reference_output():
    run = parse_reference_output((DATA / "speculative_simple.stdout").read_text(),
                                 (DATA / "speculative_simple.stderr").read_text(), "def fib(n):")
    assert (run.n_predict, run.n_drafted, run.n_accept) == (43, 48, 26)
    assert run.text.startswith(" when$Zin") and not run.text.endswith("\n")
    assert run.tokens_per_second > 0
    with pytest.raises(ValueError, match="lacks"):
        parse_reference_output("def fib(n): x\n\n\n\n", "", "def fib(n):")
    with pytest.raises(ValueError, match="unexpected end"):
        parse_reference_output("\n\ndef fib(n): cut", (DATA / "speculative_simple.stderr").read_text(), "def fib(n):")


def test_replay_matches_recorded_reference(tmp_path):
    """Our engine under the reference's budget rule reproduces the recorded run exactly."""
    path = write_synthetic_qwen35(tmp_path / "m.gguf", context_mix=0.5, mtp_fidelity=1.0)
    ref = parse_reference_output((DATA / "speculative_simple.stdout").read_text(),
                                 (DATA / "speculative_simple.stderr").read_text(), "def fib(n):")
    with mx.Session.open(path, n_ctx=1024) as s:
        t = replay_reference_budget(s, "def fib(n):", max_tokens=40, n_max=3)
    assert "".join(t.pieces) == ref.text
    assert (len(t.tokens), int(t.n_drafted.sum()), int(t.n_accepted.sum())) == (ref.n_predict, ref.n_drafted, ref.n_accept)
