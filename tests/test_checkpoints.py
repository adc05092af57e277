"""Sessions without snapshot slots (``n_rs_seq=0``): a recurrent target rolls back by checkpoint, as llama.cpp does
for a chain of look-ups (llama-speculative-simple's ``use_ckpt_tgt``, llama-server's speculative checkpoints).

A partial acceptance restores the target's state saved before the verify, and the next step verifies the accepted
tokens and the correction again, drafting nothing; it emits the token after them. The trace records that replay
(``replayed``, ``replay_agreed``), and the run does the reference's work, which these tests compare with the
reference itself and with the emulation of that rule on a session with slots.
"""

from __future__ import annotations

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.devtools.reference import (
    compare_with_reference,
    reference_checkpoints,
    replay_reference_budget,
    run_reference_spec,
    spec_type_args,
)
from mtp_explorer.models.synthetic import write_synthetic_qwen35

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

CODE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def fibonacci"
)
IMPORTS = "import os\nimport sys\n\nimport os"


def replay_rows(t: mx.Trace) -> np.ndarray:
    return np.flatnonzero(t.columns["replayed"] > 0)


def test_a_partial_acceptance_is_verified_again_after_the_checkpoint(bundled_model):
    """Every partially accepted step is followed by a replay row: no draft, n_max 0, the step's accepted tokens and
    correction verified again (all agreed on this F16 model), and the same text and counts as the rule emulated on a
    session with slots (the parity harness's emulation)."""
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, capacity=4) as s:
        assert s.checkpoints and s.capacity == 4
        t = s.generate(CODE, max_tokens=96, n_max=4, drafter="ngram-simple", ngram_simple_size_n=2)
    c = t.columns
    partial = np.flatnonzero(c["n_accepted"] < c["n_drafted"])
    assert len(partial) >= 2
    np.testing.assert_array_equal(replay_rows(t), partial + 1)
    r = partial + 1
    np.testing.assert_array_equal(c["replayed"][r], c["n_accepted"][partial] + 1)
    np.testing.assert_array_equal(c["replay_agreed"][r], c["replayed"][r])
    assert (c["n_drafted"][r] == 0).all() and (c["n_max"][r] == 0).all()
    assert (c["rs_slot"] == -1).all() and (c["verify_rows"][r] == c["replayed"][r] + 1).all()
    timeline = mx.plots.token_timeline(t)
    hovers = [h for tr in timeline.data if tr.hovertext is not None for h in tr.hovertext if "from its checkpoint" in h]
    assert len(hovers) == len(partial)
    with mx.Session.open(bundled_model, threads=1) as slots:
        for st in slots.stream(CODE, max_tokens=96, n_max=4, drafter="ngram-simple", ngram_simple_size_n=2):
            slots.set_params(n_max=0 if st.n_accepted < st.n_drafted else 4)
        emulated = slots.last_trace
    assert emulated.tokens == t.tokens
    np.testing.assert_array_equal(emulated.n_drafted, t.n_drafted)
    np.testing.assert_array_equal(emulated.n_accepted, t.n_accepted)


# (--spec-type, prompt): look-up chains on a recurrent target, where llama-speculative-simple restores checkpoints
LOOKUP_CASES = [
    ("ngram-simple", CODE),
    ("ngram-mod", IMPORTS),
    ("ngram-simple,ngram-map-k", CODE),
    # ngram-map-k sizes its next draft from a key's last acceptance, which llama.cpp sets at the replay (the replayed
    # tokens, all accepted), not at the partial acceptance: told the latter, this run drafted 2 tokens more
    ("ngram-map-k", "    return self._value"),
]


@pytest.mark.parametrize("spec, prompt", LOOKUP_CASES)
@pytest.mark.reference
def test_lookups_on_checkpoints_match_the_reference(tmp_path, reference_binary, spec, prompt):
    """Text and drafted/accepted totals equal llama-speculative-simple's on a SYNTHETIC qwen35 target, the session
    doing the reference's rollback (no slots) rather than emulating it."""
    from mtp_explorer.core import drafters

    path = write_synthetic_qwen35(tmp_path / "m.gguf", context_mix=0.6, mtp_fidelity=1.0)
    assert reference_checkpoints(path, spec)
    n_max = 3
    names = {o.name for o in drafters.mode(spec).options}
    options = {
        k: v
        for k, v in {
            "ngram_simple_size_n": 2,
            "ngram_simple_size_m": n_max,
            "ngram_mod_n_match": 2,
            "ngram_mod_n_min": 1,
            "ngram_mod_n_max": n_max,
            "ngram_map_k_size_n": 2,
            "ngram_map_k_size_m": n_max,
        }.items()
        if k in names
    }
    ref = run_reference_spec(
        reference_binary, path, prompt, spec_type_args(spec, n_max, options), max_tokens=64, n_ctx=1024, threads=1
    )
    with mx.Session.open(path, n_ctx=1024, threads=1, n_rs_seq=0, capacity=n_max) as s:
        ours = replay_reference_budget(s, prompt, max_tokens=64, n_max=n_max, drafter=spec, checkpoints=True, **options)
    result = compare_with_reference(ref, ours, 0.0, checkpoints=True)
    assert result["match"], result
    assert result["re_verified_steps"] > 0 and len(replay_rows(ours)) == result["re_verified_steps"]


@pytest.mark.reference
def test_sampling_restores_the_sampler_with_the_checkpoint(bundled_model):
    """At temperature > 0 the replay samples its rows again from the sampler state saved with the checkpoint, so it
    draws the tokens it drew before (llama-speculative-simple clones the sampler for that)."""
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, capacity=4) as s:
        t = s.generate(
            CODE, max_tokens=96, n_max=4, drafter="ngram-simple", ngram_simple_size_n=2, temperature=0.7, seed=3
        )
        again = s.generate(
            CODE, max_tokens=96, n_max=4, drafter="ngram-simple", ngram_simple_size_n=2, temperature=0.7, seed=3
        )
    r = replay_rows(t)
    assert len(r) > 0
    np.testing.assert_array_equal(t.columns["replay_agreed"][r], t.columns["replayed"][r])
    assert again.tokens == t.tokens


def test_what_a_session_without_slots_refuses(bundled_model, model_no_mtp):
    """draft-mtp, the model heads and the oracle need snapshot slots (draft-simple does not); a capacity over the slots
    is refused before loading; a non-recurrent target has no use for them and runs every drafter as before."""
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0) as s:
        assert s.capacity == 8
        assert s.drafter_modes == ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
        with pytest.raises(mx.ParameterError, match='"draft-mtp" needs the target.s snapshot slots'):
            s.generate("def f(x):", max_tokens=8, n_max=2)
        with pytest.raises(mx.ParameterError, match="snapshot slots"):
            s.generate("def f(x):", max_tokens=8, n_max=2, drafter="ngram-simple,draft-mtp")
        with pytest.raises(mx.ParameterError, match="snapshot slots"):
            s.record_oracle("def f(x):", max_tokens=8, depth=2)
        t = s.generate("def f(x):", max_tokens=8, n_max=2, drafter="ngram-mod")  # the session is still usable
        assert len(t.tokens) == 8 and t.settings["checkpoints"] is True
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, draft_model=mx.models.draft_model_path()) as s:
        assert "draft-simple" in s.drafter_modes
    head = next(h.head_path for h in mx.models.draft_heads() if h.spec_type == "draft-eagle3")
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, draft_model=head) as s:
        assert "draft-eagle3" not in s.drafter_modes
        with pytest.raises(mx.ParameterError, match="snapshot slots"):
            s.generate("def f(x):", max_tokens=8, n_max=2, drafter="draft-eagle3")
    with pytest.raises(mx.ParameterError, match="over the 2 snapshot slots"):
        mx.Session.open(bundled_model, n_rs_seq=2, capacity=3)
    with pytest.raises(mx.ParameterError, match="n_rs_seq"):
        mx.Session.open(bundled_model, n_rs_seq=-1)
    draft = mx.models.draft_model_path()  # qwen3: no recurrent layers
    assert not mx.model_info(draft).is_recurrent
    with mx.Session.open(draft, threads=1, n_rs_seq=0) as s:
        assert not s.checkpoints
        t = s.generate(CODE, max_tokens=32, n_max=3, drafter="ngram-simple", ngram_simple_size_n=2)
    assert (t.columns["replayed"] == 0).all() and (t.n_accepted < t.n_drafted).any()


SIM_CASES = [
    ("ngram-simple", 4, {"ngram_simple_size_n": 2}),
    ("ngram-mod", 4, {"ngram_mod_n_match": 2, "ngram_mod_n_min": 1}),  # a stateful drafter: its table replayed
    ("ngram-simple,ngram-map-k", 4, {"ngram_simple_size_n": 2, "ngram_map_k_size_n": 2}),
    ("ngram-cache", 8, {}),
    ("ngram-map-k", 4, {"ngram_map_k_size_n": 2}),  # its key statistics told at the replay, as llama.cpp tells them
]


@pytest.mark.parametrize("spec, n_max, options", SIM_CASES)
def test_the_simulator_replays_a_session_without_slots(bundled_model, spec, n_max, options):
    """``simulate(..., checkpoints=True)`` on an oracle recorded with slots gives the checkpoint session's steps
    exactly (replays included), and ``compare`` finds every step of that run where the oracle predicts it."""
    from mtp_explorer.analysis.compare import compare
    from mtp_explorer.analysis.simulate import simulate

    with mx.Session.open(bundled_model, threads=1, n_rs_seq=8) as s:
        oracle = s.record_oracle(CODE, max_tokens=96, depth=n_max, **options)
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, capacity=8) as s:
        t = s.generate(CODE, max_tokens=96, n_max=n_max, drafter=spec, **options)
    assert len(replay_rows(t)) > 0
    sim = simulate(oracle, n_max, drafter=spec, checkpoints=True)
    assert sim.tokens == t.tokens and sim.settings["checkpoints"]
    for name in (
        "pos",
        "n_max",
        "n_drafted",
        "n_accepted",
        "drafter",
        "drafted",
        "stop_reason",
        "candidate_len",
        "replayed",
        "replay_agreed",
        "rs_slot",
        "verify_rows",
    ):
        np.testing.assert_array_equal(sim.columns[name], t.columns[name], err_msg=name)
    assert compare(oracle, t).exact
    with_slots = simulate(oracle, n_max, drafter=spec)
    assert (with_slots.columns["replayed"] == 0).all()
    assert len(replay_rows(sim)) == int((sim.n_accepted < sim.n_drafted).sum())  # a replay after each partial step
    grid = mx.simulate_grid(oracle, [n_max], [0.0], drafter=spec, checkpoints=True)
    assert (int(grid["n_steps"][0]), int(grid["n_drafted"][0])) == (sim.n_steps, int(sim.n_drafted.sum()))
    # (a simulated trace stores each phase time rounded to the nanosecond; the grid sums them unrounded)
    assert grid["tokens_per_second"][0] == pytest.approx(sim.predicted_tokens_per_second, rel=1e-4)


def test_a_sweep_predicts_the_runs_without_slots(bundled_model):
    """``sweep(..., checkpoints=True)`` gives each look-up setting's run on a session without slots (its tokens,
    steps and totals); it refuses a session without slots (no oracle), measure mode and model drafters."""
    settings = {
        "n_max": [2, 4],
        "p_min": [0.0],
        "max_tokens": 64,
        "drafter": ["ngram-simple", "ngram-mod"],
        "ngram_simple_size_n": 2,
        "ngram_mod_n_match": 2,
        "ngram_mod_n_min": 1,
    }
    options = {k: v for k, v in settings.items() if k.startswith("ngram_")}
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=4) as s:
        df = mx.sweep(s, [CODE, IMPORTS], checkpoints=True, progress=False, **settings)
        with_slots = mx.sweep(s, [CODE], progress=False, **settings)
        with pytest.raises(mx.ParameterError, match="mode='simulate'"):
            mx.sweep(s, [CODE], mode="measure", checkpoints=True, progress=False, **settings)
        with pytest.raises(mx.ParameterError, match="no snapshot slots"):
            mx.sweep(s, [CODE], n_max=[2], checkpoints=True, drafter=["ngram-simple", "draft-mtp"], progress=False)
    assert len(df) == 8
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, capacity=4) as s:
        for row in df.itertuples():
            t = s.generate(row.prompt, max_tokens=64, n_max=row.n_max, drafter=row.drafter, **options)
            assert (row.n_tokens, row.n_steps) == (len(t.tokens), t.n_steps), row
            assert (row.n_drafted, row.n_accepted) == (int(t.n_drafted.sum()), int(t.n_accepted.sum())), row
        with pytest.raises(mx.ParameterError, match="n_rs_seq=0"):
            mx.sweep(s, [CODE], n_max=[2], drafter="ngram-simple", progress=False)
    replays = df.merge(with_slots, on=["prompt", "drafter", "n_max", "p_min"], suffixes=("", "_slots"))
    assert (replays["n_steps"] > replays["n_steps_slots"]).any()  # the replay steps the slots save


def test_draft_simple_runs_without_slots_and_is_simulated(bundled_model):
    """draft-simple, which llama.cpp gives no snapshot slots, runs on checkpoints: the draft model's context drops the
    replayed rows and decodes them again with the target's; ``simulate(..., checkpoints=True)`` gives that run's
    steps from an oracle recorded with slots, and a sweep predicts it."""
    from mtp_explorer.analysis.simulate import simulate

    draft = mx.models.draft_model_path()
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=3, draft_model=draft) as s:
        oracle = s.record_oracle(CODE, max_tokens=64, depth=3)
        df = mx.sweep(
            s, [CODE], n_max=[3], p_min=[0.0], max_tokens=64, drafter="draft-simple", checkpoints=True, progress=False
        )
    with mx.Session.open(bundled_model, threads=1, n_rs_seq=0, capacity=3, draft_model=draft) as s:
        t = s.generate(CODE, max_tokens=64, n_max=3, drafter="draft-simple")
    assert len(replay_rows(t)) > 0
    sim = simulate(oracle, 3, drafter="draft-simple", checkpoints=True)
    assert sim.tokens == t.tokens
    for name in ("pos", "n_drafted", "n_accepted", "drafted", "replayed", "replay_agreed"):
        np.testing.assert_array_equal(sim.columns[name], t.columns[name], err_msg=name)
    assert (int(df["n_steps"][0]), int(df["n_drafted"][0])) == (t.n_steps, int(t.n_drafted.sum()))
