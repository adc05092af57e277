"""``mx.compare_drafters``: every drafter of the bundled model side by side (its MTP head, the look-ups, the shipped
draft model and EAGLE-3 head, each head in a session of its own), and its figure."""

from __future__ import annotations

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer import plots
from mtp_explorer.analysis.drafter_comparison import LOOKUP_MODES
from mtp_explorer.core import drafters

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = ("def fib(n):", "class Stack:\n    def __init__(self):\n")


@pytest.fixture(scope="module")
def cmp():
    return mx.compare_drafters(PROMPTS, max_tokens=32, n_max=3, threads=2)


def test_every_drafter_of_the_target_is_compared(cmp):
    f = cmp.frame
    heads = {drafters.mode(h.spec_type).name: h.head_path.name for h in mx.draft_heads()}
    assert set(f["drafter"]) >= {"draft-mtp", *heads} | set(LOOKUP_MODES)
    for name, head in heads.items():  # each head ran with its own file
        assert f.loc[f["drafter"] == name, "head"].item() == head
    assert len(cmp.traces["plain"]) == len(PROMPTS)
    for r in f.itertuples():
        traces = cmp.traces[r.drafter]
        assert len(traces) == len(PROMPTS) and all(t.settings["drafter"] == r.drafter for t in traces)
        assert r.n_tokens == sum(len(t.tokens) for t in traces) and r.tokens_per_second > 0
        assert r.predicted_tokens_per_second > 0 and r.speedup > 0
        assert len(r.acceptance_by_depth) == 3
        drafted = sum(int(t.n_drafted.sum()) for t in traces)
        if drafted:  # acceptance at position 1 counts every draft's first token
            first = sum(int((t.n_accepted > 0).sum()) for t in traces) / sum(
                int((t.n_drafted > 0).sum()) for t in traces
            )
            assert r.acceptance_by_depth[0] == pytest.approx(first)
    # the model drafters decode to draft (each drafted token carries the model's confidence); the look-ups do not
    # (none): told by what the runs drafted, not by their times, which other drafters' runs do not share
    for r in f.itertuples():
        probs = [t.draft_prob[s, :n] for t in cmp.traces[r.drafter] for s, n in enumerate(t.n_drafted) if n]
        probs = np.concatenate(probs) if probs else np.empty(0)
        assert np.isnan(probs).all() if r.lookup else probs.size and np.isfinite(probs).all(), r.drafter
        # each row's draft time per step is its own runs' (one recording)
        traces = cmp.traces[r.drafter]
        draft_s = sum(t.summary()["phase_seconds"]["draft"] for t in traces)
        assert r.draft_ms_per_step == pytest.approx(1e3 * draft_s / sum(t.n_steps for t in traces), rel=1e-12)
    assert cmp.best_lookup in set(f.loc[f["lookup"], "drafter"])


def test_the_figure_shows_the_model_drafters_and_the_best_lookup(cmp):
    fig = plots.drafters_side_by_side(cmp)
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    named = {t.name for t in shown if t.legendgroup != "predicted"}
    names = set(cmp.frame.loc[~cmp.frame["lookup"], "drafter"]) | {cmp.best_lookup}
    assert named == names  # llama.cpp's names, short: the labels and head files are in the hover text
    # the hollow predicted markers have their legend entry; every drafter its own colour
    assert [t.name for t in shown if t.legendgroup == "predicted"] == [f"predicted from {cmp.costs_label}"]
    lines = [t for t in shown if t.legendgroup != "predicted"]
    assert len({t.line.color for t in lines}) == len(lines)
    with pytest.raises(mx.InputTypeError, match="DrafterComparison"):
        plots.drafters_side_by_side(cmp.frame)


def test_bad_input_is_a_parameter_error():
    with pytest.raises(mx.ParameterError, match="at least one prompt"):
        mx.compare_drafters([])
