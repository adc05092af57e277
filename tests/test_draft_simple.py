"""draft-simple: a separate draft model (``Session.open(path, draft_model=...)``, llama.cpp's ``-md``).

The bundled model is drafted for by the bundled draft model (a 0.9 M-parameter qwen3 with its tokenizer); the
engine keeps the draft model's context in step with the target's (every target batch decoded on it, every
rejected position dropped), as llama-speculative-simple drives ``common_speculative_impl_draft_simple``.
Parity of the text and the drafted/accepted totals with the real binary is in ``tests/test_reference.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import SHORT_NGRAM, check_accounting, check_replay_exact, run_isolated

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.models import draft_model_path

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "for i in range(10):\n",
)
SPECS = ("draft-simple", "ngram-simple,draft-simple", "draft-simple,draft-mtp")
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def session(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=draft_model_path()) as s:
        yield s


@pytest.fixture(scope="module")
def oracles(session):
    return {p: session.record_oracle(p, max_tokens=MAX_TOKENS, depth=5, **SHORT_NGRAM) for p in PROMPTS}


def test_the_session_has_the_draft_model(session):
    assert session.has_draft_model and session.draft_info.arch == "qwen3"
    assert session.draft_info.n_params < session.info.n_params
    assert "draft-simple" in drafters.available_modes(True, True)
    assert "draft-simple" not in drafters.available_modes(True, False)
    t = session.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter="draft-simple")
    assert t.settings["draft_model"] == session.draft_info.name and t.settings["drafter"] == "draft-simple"


def test_greedy_output_equals_plain_except_at_reported_near_ties(session, oracles):
    """Every spec type with a draft model, n_max 1-5, p_min 0 and 0.5: the plain greedy tokens; a divergence must be a
    target near-tie, found and reported with its logit margin; draft-token differences (the draft model's context was
    filled by verify batches here, by single rows in the oracle) must be draft near-ties."""
    ties, runs = [], 0
    for prompt, oracle in oracles.items():
        for spec in SPECS:
            for n_max in (1, 3, 5):
                for p_min in (0.0, 0.5):
                    t = session.generate(
                        prompt, max_tokens=MAX_TOKENS, n_max=n_max, p_min=p_min, drafter=spec, **SHORT_NGRAM
                    )
                    runs += 1
                    check_accounting(t)
                    cmp = mx.compare(oracle, t)  # the tolerance measured for the file
                    assert cmp.n_compared > 0 and not cmp.unexplained, (prompt, spec, n_max, p_min, cmp.unexplained[:2])
                    if t.tokens != oracle.tokens:
                        at = next(i for i, (a, b) in enumerate(zip(t.tokens, oracle.tokens)) if a != b)
                        found = [m for m in cmp.ties if m["cause"] == "target_argmax"]
                        assert found and found[0]["position"] == at, (prompt, spec, n_max)
                        ties.append(f"{spec} n_max={n_max} {prompt!r}: token {at}, margin {found[0]['margin']:.4f}")
    assert len(ties) <= runs // 4, ties
    if ties:
        warnings.warn(
            f"{len(ties)} of {runs} draft-model runs diverged from plain decoding at a floating-point "
            "near-tie:\n" + "\n".join(ties),
            stacklevel=1,
        )


def test_drafts_carry_confidence_and_top_k(session):
    t = session.generate(PROMPTS[1], max_tokens=MAX_TOKENS, n_max=4, p_min=0.3, drafter="draft-simple")
    rows = t.drafter == mx.DRAFTERS.index("draft-simple")
    assert rows.sum() > 0 and t.n_drafted[rows].sum() > 0
    for i in np.flatnonzero(rows):
        n = int(t.n_drafted[i])
        prob, top = t.draft_prob[i, :n], t.topk_ids[i, :n]
        assert (prob >= 0.3).all() and (prob <= 1.0).all()
        assert (top[:, 0] == t.drafted[i, :n]).all()  # the drafted token is the top candidate
        probs = t.topk_probs[i, :n]
        assert np.allclose(probs[:, 0], prob) and (np.diff(probs, axis=1) <= 1e-7).all()
        assert np.isnan(t.h_norm_draft[i, :n]).all()  # no MTP hidden state
    assert "p_min" in {s.stop_reason for s in t.steps}


def test_statistics_count_as_llama_cpp(session):
    t = session.generate(PROMPTS[2], max_tokens=MAX_TOKENS, n_max=3, drafter="draft-simple")
    (stats,) = session.drafter_stats()
    assert stats["name"] == "draft-simple"
    assert stats["n_gen_drafts"] == int((t.n_drafted > 0).sum())
    assert stats["n_gen_tokens"] == int(t.n_drafted.sum()) and stats["n_acc_tokens"] == int(t.n_accepted.sum())
    assert stats["acc_by_pos"][0] == int((t.n_accepted > 0).sum())
    # its times: drafting, and following the target (the draft model's decodes of the verify batches)
    assert stats["t_draft_ns"] > 0 and stats["t_accept_ns"] > 0 and stats["t_begin_ns"] >= 0
    s = t.summary()
    phases = s["phase_seconds"]  # the prompt's decode on the draft model is in the prefill
    assert stats["t_accept_ns"] / 1e9 <= phases["catchup"] + phases["sample"] + s["prefill_seconds"] + 1e-3


@pytest.mark.parametrize("spec", ["draft-simple", "ngram-simple,draft-simple"])
def test_simulator_replays_the_draft_model_exactly(session, oracles, spec):
    prompt = PROMPTS[3]
    for n_max in (1, 3, 5):
        check_replay_exact(session, oracles[prompt], prompt, spec, n_max, MAX_TOKENS, **SHORT_NGRAM)


def test_simulator_prices_the_draft_model(oracles):
    oracle = oracles[PROMPTS[0]]
    cost = oracle.cost
    assert oracle.has_draft_model
    assert cost.samples["model_follow"] > 0 and cost.model_follow[0] + cost.model_follow[1] * 100 > 0
    assert (cost.model_draft_ns(np.arange(1, 4), 50.0) > 0).all()
    plain = mx.simulate(oracle, 0).summary()["tokens_per_second"]
    spec = mx.simulate(oracle, 3, drafter="draft-simple").summary()
    assert 0 < spec["tokens_per_second"] and 0 < plain
    # the draft model's decodes of the verify batches are priced in the catch-up phase, as the engine times them
    assert spec["phase_seconds"]["catchup"] > 0


def test_a_session_without_a_draft_model_refuses_draft_simple(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=256, threads=1) as s:
        assert not s.has_draft_model
        with pytest.raises(mx.ParameterError, match="draft_model="):
            s.generate("x = 1", max_tokens=4, n_max=2, drafter="draft-simple")
        assert len(s.generate("x = 1", max_tokens=4, n_max=0, drafter="draft-simple").tokens) == 4
        oracle = s.record_oracle("x = 1", max_tokens=4, depth=2, probe=False)
        with pytest.raises(mx.ParameterError, match="draft model"):
            mx.simulate(oracle, 2, drafter="draft-simple")


def test_an_incompatible_draft_model_is_a_parameter_error(bundled_model, model_mixed, model_synthetic_draft):
    with pytest.raises(mx.ParameterError, match="cannot draft for this model: it has 384 tokens"):
        mx.Session.open(bundled_model, n_ctx=256, draft_model=model_synthetic_draft)
    with pytest.raises(mx.ParameterError, match="is recurrent"):
        mx.Session.open(model_synthetic_draft, n_ctx=256, draft_model=model_mixed)
    with pytest.raises(mx.ModelNotFoundError):
        mx.Session.open(bundled_model, n_ctx=256, draft_model="/nonexistent/draft.gguf")


def test_cli_takes_the_draft_model(bundled_model, tmp_path):
    out = tmp_path / "t.json"
    proc = run_isolated(f"""
        import sys
        from mtp_explorer.cli import main
        sys.exit(main(["run", "def f(x):", "-m", {str(bundled_model)!r}, "-md", {str(draft_model_path())!r},
                       "--spec-type", "draft-simple", "-n", "12", "--n-max", "3", "-t", "1", "--json", {str(out)!r}]))
    """)
    assert proc.returncode == 0, proc.stderr
    import json

    doc = json.loads(out.read_text())
    assert doc["settings"]["drafter"] == "draft-simple" and doc["settings"]["draft_model"] == "pystdlib-draft"


def test_calibration_and_sweep_take_the_draft_model(session, oracles):
    cal = mx.calibrate(list(oracles.values()), n_bins=5, p_min=[0.0, 0.5], drafter="draft-simple")
    assert 0.0 <= cal.ece <= 1.0 and cal.table["count"].sum() > 0
    sweep = mx.sweep(
        session,
        list(PROMPTS[:2]),
        n_max=[0, 2],
        p_min=[0.0, 0.5],
        mode="simulate",
        max_tokens=MAX_TOKENS,
        drafter=("mtp", "draft-simple"),
        progress=False,
    )
    assert set(sweep["drafter"]) == {"draft-mtp", "draft-simple"}  # "mtp": llama.cpp's name in the table
    assert (sweep.groupby("prompt")["tokens_digest"].nunique() == 1).all()
