"""Cost profiles: measured once on this machine, saved, loaded, and used as ``costs=`` to price oracles
recorded anywhere; a profile of another model (vocabulary, layers) or too shallow is refused; a profile is the cost
model of the oracles it recorded, pooled, and prices as they do."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.analysis.consistency import cost_consistency
from mtp_explorer.analysis.profile import COSTS_FORMAT, DEFAULT_PROMPTS, pooled_columns
from mtp_explorer.analysis.simulate import ceiling_tokens_per_second
from mtp_explorer.cli import main
from mtp_explorer.models.synthetic import write_synthetic_qwen35

PROMPT = "class Stack:"  # not one of the profile's prompts
DEPTH = 4
OPEN = {"n_ctx": 512, "threads": 1, "n_rs_seq": DEPTH, "clock": "cpu"}


@pytest.fixture(scope="module")
def session(model_mixed):
    with mx.Session.open(model_mixed, **OPEN) as s:
        s.generate(PROMPT, max_tokens=32, n_max=2)  # warm-up
        yield s


@pytest.fixture(scope="module")
def profile(session):
    return mx.profile_costs(session, progress=False)


@pytest.fixture(scope="module")
def oracle(session):
    return session.record_oracle(PROMPT, max_tokens=96, depth=DEPTH)


def _scaled(profile: mx.CostProfile, factor: float) -> mx.CostProfile:
    """The profile of a machine ``factor`` times as slow at everything."""
    cost = mx.CostModel.from_dict(
        {
            k: (np.asarray(v) * factor if k not in ("samples", "telemetry") else v)
            for k, v in profile.cost.to_dict().items()
        }
    )
    return dataclasses.replace(profile, cost=cost)


# -- what a profile holds, saved and loaded ---------------------------------------------------------
def test_profile_records_what_it_was_measured_for_and_on(session, profile):
    assert profile.depth == DEPTH == profile.measured["depth"]
    assert profile.measured["prompts"] == list(DEFAULT_PROMPTS) and profile.measured["n_oracles"] == len(
        DEFAULT_PROMPTS
    )
    assert profile.measured["n_positions"] == len(DEFAULT_PROMPTS) * 128
    info = session.info
    assert {k: profile.model[k] for k in ("arch", "n_vocab", "n_layer", "n_layer_nextn", "n_embd", "file_type")} == {
        "arch": info.arch,
        "n_vocab": info.n_vocab,
        "n_layer": info.n_layer,
        "n_layer_nextn": info.n_layer_nextn,
        "n_embd": info.n_embd,
        "file_type": info.file_type,
    }
    assert profile.model["file"] == "mixed.gguf" and profile.model["size"] == info.size
    assert profile.options == session.open_kwargs  # every open option, whatever Session.open takes
    assert profile.options["threads"] == 1 and profile.session["threads"] == session.threads
    assert profile.machine["cpu_count"] and profile.machine["hostname"] and profile.machine["llama_cpp_python"]
    s = profile.summary()
    assert s["plain_tokens_per_second"] > 0 and set(s["ceiling_tokens_per_second"]) == set(range(1, DEPTH + 1))
    # the fit pools every oracle's measurements
    assert profile.cost.samples["verify"][1] > 128


def test_profile_round_trip(tmp_path, profile, oracle):
    path = profile.save(tmp_path / "costs.json")
    assert json.loads(path.read_text())["format"] == COSTS_FORMAT
    again = mx.CostProfile.load(path)
    assert again.to_dict() == json.loads(json.dumps(profile.to_dict()))
    for name in ("verify", "catchup", "draft", "ngram"):
        np.testing.assert_array_equal(getattr(again.cost, name), getattr(profile.cost, name))
    a = mx.simulate(oracle, 3, costs=profile)
    b = mx.simulate(oracle, 3, costs=again)
    c = mx.simulate(oracle, 3, costs=str(path))
    assert a.predicted_tokens_per_second == b.predicted_tokens_per_second == c.predicted_tokens_per_second
    assert np.array_equal(a.columns["t_verify_ns"], c.columns["t_verify_ns"])


def test_progress_reports_each_recording(session):
    calls = []
    mx.profile_costs(
        session, ["def f(x):"], max_tokens=16, depth=2, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(1, 2), (2, 2)]  # the warm-up, then the prompt


@pytest.mark.parametrize(
    "mangle, match",
    [
        (lambda d: "{not json", "invalid JSON"),
        (lambda d: json.dumps([1, 2]), "JSON object"),
        (lambda d: json.dumps(d | {"format": "mtp-explorer-oracle/2"}), "format"),
        (lambda d: json.dumps({k: v for k, v in d.items() if k != "model"}), "lacks"),
        (lambda d: json.dumps(d | {"model": "qwen"}), "'model' is not a dict"),
        (lambda d: json.dumps(d | {"cost": d["cost"] | {"verify": [[0, 0]]}}), r"verify has the shape \(1, 2\)"),
        (lambda d: json.dumps(d | {"cost": d["cost"] | {"bogus": 1}}), "malformed"),
        (lambda d: json.dumps(d | {"cost": d["cost"] | {"fresh_ns": "fast"}}), "fresh_ns"),
    ],
)
def test_malformed_profiles_are_parameter_errors(tmp_path, profile, oracle, mangle, match):
    path = tmp_path / "bad.json"
    path.write_text(mangle(profile.to_dict()))
    with pytest.raises(mx.ParameterError, match=match):
        mx.CostProfile.load(path)
    with pytest.raises(mx.ParameterError, match=match):
        mx.simulate(oracle, 2, costs=str(path))


def test_missing_profile_and_wrong_costs_are_parameter_errors(tmp_path, oracle):
    with pytest.raises(mx.ParameterError, match="cannot read the cost profile"):
        mx.simulate(oracle, 2, costs=tmp_path / "missing.json")
    with pytest.raises(mx.ParameterError, match="costs must be"):
        mx.simulate(oracle, 2, costs=42)


# -- another model, another depth -----------------------------------------------------------------
def test_a_profile_of_another_model_is_a_parameter_error(models_dir, profile, session):
    wide = write_synthetic_qwen35(models_dir / "vocab512.gguf", n_vocab=512, context_mix=0.6)
    deep = write_synthetic_qwen35(models_dir / "layers6.gguf", n_layer=6, context_mix=0.6)
    with pytest.raises(mx.ParameterError, match=r"n_vocab 384 \(profile\) vs 512"):
        mx.CostProfile.load(profile.save(models_dir / "costs.json"), model=wide)
    with mx.Session.open(deep, n_ctx=512, threads=1, n_rs_seq=DEPTH) as other:
        o = other.record_oracle(PROMPT, max_tokens=24, depth=DEPTH, probe=False)
        for call in (
            lambda: mx.simulate(o, 0, costs=profile),
            lambda: mx.simulate_grid(o, [0], [0.0], costs=profile),
            lambda: ceiling_tokens_per_second(o, 0, costs=profile),
            lambda: cost_consistency(o, other.generate(PROMPT, max_tokens=8, n_max=1), costs=profile),
            lambda: mx.sweep(other, PROMPT, [0], [0.0], max_tokens=8, costs=profile, progress=False),
        ):
            with pytest.raises(mx.ParameterError, match=r"n_layer 4 \(profile\) vs 6"):
                call()
    # no MTP head: another number of MTP layers
    no_head = {**session.info.to_dict(), "n_layer_nextn": 0, "has_mtp": False}
    with pytest.raises(mx.ParameterError, match=r"n_layer_nextn 1 \(profile\) vs 0"):
        profile.check_model(no_head)
    # the same model as another file type prices, with a warning
    half = write_synthetic_qwen35(models_dir / "mixed_f16.gguf", context_mix=0.6, dtype="f16")
    with pytest.warns(UserWarning, match="file_type 'F32' .profile. vs 'F16'"):
        profile.check_model(mx.model_info(half).to_dict())


def test_an_oracle_deeper_than_the_profile_is_a_parameter_error(session, profile, oracle):
    shallow = mx.profile_costs(session, ["def f(x):"], max_tokens=16, depth=2, progress=False)
    assert shallow.depth == 2
    with pytest.raises(mx.ParameterError, match="depth 4 but the cost profile was measured to depth 2"):
        mx.simulate(oracle, 1, costs=shallow)
    shallow_oracle = session.record_oracle(PROMPT, max_tokens=24, depth=2, probe=False)
    assert mx.simulate(shallow_oracle, 2, costs=profile).n_steps > 0  # deeper profiles serve shallower oracles
    with pytest.raises(mx.ParameterError, match="depth"):
        mx.sweep(session, PROMPT, [0, 3], [0.0], max_tokens=8, costs=shallow, progress=False)


# -- predicting ---------------------------------------------------------------------------------------
def test_costs_price_the_oracles_steps_with_the_profiles_machine(profile, oracle):
    """The steps come from the oracle, the times from the profile: a machine twice as slow at everything
    predicts half the tokens/s, step for step."""
    slow = _scaled(profile, 2.0)
    for n_max in (0, 2, 4):
        here, there = mx.simulate(oracle, n_max, costs=profile), mx.simulate(oracle, n_max, costs=slow)
        assert np.array_equal(here.columns["n_accepted"], there.columns["n_accepted"])
        # twice the time, up to the traces' whole-nanosecond phase times (half a ns per phase and step each)
        ns = [sum(int(t.columns[f"t_{ph}_ns"].sum()) for ph in mx.core.schema.PHASES) for t in (here, there)]
        assert abs(ns[1] - 2 * ns[0]) <= 1.5 * len(mx.core.schema.PHASES) * here.n_steps
        own = mx.simulate(oracle, n_max)
        assert np.array_equal(own.columns["n_accepted"], here.columns["n_accepted"])
    grid = mx.simulate_grid([oracle, oracle], [0, 2], [0.0, 0.5], costs=slow)
    ref = mx.simulate_grid([oracle, oracle], [0, 2], [0.0, 0.5], costs=profile)
    np.testing.assert_allclose(grid["tokens_per_second"] * 2, ref["tokens_per_second"], rtol=1e-4)
    np.testing.assert_allclose(grid["plain_tokens_per_second"] * 2, ref["plain_tokens_per_second"], rtol=1e-4)
    assert ceiling_tokens_per_second(oracle, 2, costs=slow) == pytest.approx(
        ceiling_tokens_per_second(oracle, 2, costs=profile) / 2, rel=1e-4
    )
    assert oracle.cost_model is None  # the oracle itself is untouched


def test_sweep_with_costs(tmp_path, session, profile):
    path = profile.save(tmp_path / "costs.json")
    prompts = [PROMPT, "import os"]
    df = mx.sweep(session, prompts, [0, 2], [0.0, 0.5], max_tokens=48, costs=path, progress=False)
    assert len(df) == 8 and (df["tokens_per_second"] > 0).all()
    # the times compared below come from one recording: the sweep replays these oracles, priced by the profile
    oracles = [session.record_oracle(p, max_tokens=48, depth=2, probe=False) for p in prompts]
    replayed = mx.sweep(
        session, prompts, [0, 2], [0.0, 0.5], max_tokens=48, costs=path, progress=False, oracles=oracles
    )
    counts = ["prompt", "n_max", "p_min", "n_tokens", "n_steps", "n_drafted", "n_accepted", "tokens_digest"]
    assert replayed[counts].equals(df[counts])  # the same greedy outputs and counts as the sweep that recorded its own
    row = replayed[(replayed["prompt"] == PROMPT) & (replayed["n_max"] == 2) & (replayed["p_min"] == 0.0)].iloc[0]
    s = mx.simulate(oracles[0], 2, costs=profile).summary()
    assert (row["n_steps"], row["n_accepted"]) == (s["n_steps"], s["n_accepted"])
    # the sweep sums the steps' phase times as they are, the simulated trace stores each rounded to the ns
    ns = row["seconds"] * 1e9
    assert abs(ns - s["n_tokens"] / s["tokens_per_second"] * 1e9) <= 0.5 * len(mx.core.schema.PHASES) * s["n_steps"]
    slow = mx.sweep(
        session, PROMPT, [0, 2], [0.0], max_tokens=48, costs=_scaled(profile, 2.0), progress=False, oracles=oracles[0]
    )
    np.testing.assert_allclose(
        slow["tokens_per_second"] * 2,
        replayed[replayed["prompt"] == PROMPT].query("p_min == 0.0")["tokens_per_second"].to_numpy(),
        rtol=1e-4,
    )
    with pytest.raises(mx.ParameterError, match="not both"):
        mx.sweep(session, PROMPT, [0], [0.0], max_tokens=8, cost=profile.cost, costs=profile, progress=False)


def test_a_profile_prices_like_the_cost_model_of_its_own_recordings(session):
    """A profile's cost model is the one fitted on the oracles it recorded, pooled (the warm-up left out); a profile
    measured on one prompt prices that prompt's oracle as the oracle's own cost model does, step for step. Both sides
    come from the same recordings; how near a profile measured on other prompts comes to this machine's real runs
    (measured times, which drift with the load of a shared machine) is a measurement: benchmarks/simulate.py."""
    from mtp_explorer.core.options import is_full_telemetry

    seen = []
    record = session.record_oracle

    def spy(*args, **kwargs):
        seen.append(record(*args, **kwargs))
        return seen[-1]

    session.record_oracle = spy
    try:
        pooled = mx.profile_costs(session, [PROMPT, "import os"], max_tokens=32, progress=False)
        single = mx.profile_costs(session, [PROMPT], max_tokens=32, progress=False)
    finally:
        session.record_oracle = record
    assert [(o.prompt, o.max_tokens) for o in seen] == [
        (PROMPT, 16),
        (PROMPT, 32),
        ("import os", 32),
        (PROMPT, 16),
        (PROMPT, 32),
    ]
    full = is_full_telemetry(session.telemetry)
    assert pooled.cost.to_dict() == mx.CostModel.from_columns(pooled_columns(seen[1:3]), DEPTH, full).to_dict()
    own = seen[4]
    assert single.cost.to_dict() == own.fitted_cost.to_dict() and own.cost_model is None
    for n_max in (0, 1, 3):
        a, b = mx.simulate(own, n_max, costs=single), mx.simulate(own, n_max)
        for ph in mx.core.schema.PHASES:
            np.testing.assert_array_equal(a.columns[f"t_{ph}_ns"], b.columns[f"t_{ph}_ns"])
        assert a.predicted_tokens_per_second == b.predicted_tokens_per_second


def test_pooled_columns_need_one_depth(session, oracle):
    other = session.record_oracle(PROMPT, max_tokens=8, depth=2, probe=False)
    with pytest.raises(mx.ParameterError, match="one depth"):
        pooled_columns([oracle, other])
    pooled = pooled_columns([oracle, oracle])
    assert pooled["pos"].shape[0] == 2 * oracle.n_positions


# -- the command ---------------------------------------------------------------------------------------
def test_cli_profile_writes_a_profile(tmp_path, model_mixed, capsys, oracle):
    out = tmp_path / "costs.json"
    rc = main(
        [
            "profile",
            str(model_mixed),
            "-o",
            str(out),
            "--threads",
            "1",
            "--max-tokens",
            "32",
            "--n-rs-seq",
            str(DEPTH),
            "--n-ctx",
            "512",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "plain tokens/s" in printed and str(out.name) in printed
    loaded = mx.CostProfile.load(out, model=model_mixed)
    assert loaded.depth == DEPTH and loaded.options["threads"] == 1 and loaded.measured["max_tokens"] == 32
    assert mx.simulate(oracle, 2, costs=out).predicted_tokens_per_second > 0
    assert main(["profile", str(model_mixed), "-o", str(tmp_path / "x.json"), "--depth", "9", "--n-rs-seq", "4"]) == 2
    assert "exceeds the session's capacity" in capsys.readouterr().out
