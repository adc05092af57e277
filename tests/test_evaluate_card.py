"""The model card's measured section, rendered from committed evaluations."""

from __future__ import annotations

import json
from pathlib import Path

from training.evaluate import render_measured

LOGS = Path(__file__).resolve().parents[1] / "training" / "logs"


def test_the_card_tells_the_shipped_run_and_nothing_for_a_file_made_otherwise():
    shipped = render_measured(json.loads((LOGS / "evaluate.json").read_text()))
    assert "AdamW steps" in shipped and "fine-tuned for chained drafting" in shipped
    trunk = json.loads((LOGS / "evaluate-trunk-v2-average.json").read_text())
    assert trunk["training"] is None and trunk["mtp_head"] is None  # made by training.trunk, not train.py
    text = render_measured(trunk)
    assert "AdamW steps" not in text and "fine-tuned for chained drafting" not in text
    assert "13 trunk layers" not in text and "12 trunk layers" in text


def test_the_layer_row_follows_the_file():
    shipped = render_measured(json.loads((LOGS / "evaluate.json").read_text()))
    assert (
        "| layers | gated delta net, gated delta net, gated delta net, gated full attention "
        "(`full_attention_interval` 4) |"
    ) in shipped
    trunk = render_measured(json.loads((LOGS / "evaluate-trunk-v2-average.json").read_text()))
    assert (
        "| layers | 3 × (gated delta net, gated delta net, gated delta net, gated full attention) "
        "(`full_attention_interval` 4) |"
    ) in trunk
