"""DraftSettings: one checked value for a generation's drafting settings, taken by every call that drafts or predicts,
recorded by traces and given back by them."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.core.settings import FIELDS, Limits

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


@pytest.fixture(scope="module")
def session_np2(bundled_model):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=2, n_parallel=2) as s:
        yield s


def test_defaults_are_llama_cpps_and_values_are_normalised():
    s = mx.DraftSettings()
    assert (s.n_max, s.p_min, s.n_min, s.drafter, s.chain_policy, s.max_tokens, s.temperature, s.seed) == (
        3,
        0.0,
        0,
        "draft-mtp",
        "first",
        128,
        0.0,
        None,
    )
    assert s.options["ngram_simple_size_n"] == 12 and s.options["ngram_mod_n_match"] == 24  # llama.cpp's defaults
    chain = mx.DraftSettings(drafter="draft-mtp,ngram-mod", options={"ngram_n": 4})
    assert chain.drafter == "ngram-mod,draft-mtp" and chain.spec_type == "ngram-mod,draft-mtp"  # llama.cpp's order
    assert chain.options["ngram_simple_size_n"] == 4  # an alias stored under the option's name
    assert mx.DraftSettings(drafter="chain").chain_policy == "best"
    assert mx.DraftSettings(drafter=["ngram-simple", "draft-mtp"], chain_policy="best").chain_policy == "best"


def test_short_spellings_are_input_aliases_of_llama_cpps_names():
    """``mtp``, ``ngram`` and ``chain`` are taken and kept as llama.cpp's ``--spec-type`` values (with ``chain``'s
    policy): one value, one hash, one record for both spellings; an earlier version's record of a short spelling
    comes back under the llama.cpp name."""
    for short, name, policy in (
        ("mtp", "draft-mtp", "first"),
        ("ngram", "ngram-simple", "first"),
        ("chain", "ngram-simple,draft-mtp", "best"),
    ):
        a, b = mx.DraftSettings(drafter=short), mx.DraftSettings(drafter=name, chain_policy=policy)
        assert a == b and hash(a) == hash(b) and (a.drafter, a.chain_policy) == (name, policy)
        assert a.to_dict()["drafter"] == name and f"drafter={name!r}" in repr(a)
        assert mx.DraftSettings.from_dict({"drafter": short}) == b  # an earlier trace's record
        assert mx.DraftSettings(drafter="draft-mtp").replace(drafter=short) == b
    assert mx.DraftSettings(drafter="mtp") == mx.DraftSettings(drafter="draft-mtp")
    assert drafters.drafter("mtp") is drafters.drafter("draft-mtp") is drafters.DRAFTER_SPECS["draft-mtp"]  # input only
    with pytest.raises(mx.ParameterError, match="unknown drafter 'chain'"):  # a chain is no one drafter
        drafters.drafter("chain")
    assert mx.DraftSettings(drafter=["mtp", "ngram"]).drafter == "ngram-simple,draft-mtp"  # short spellings too
    assert mx.DraftSettings(drafter="chain", chain_policy="first") == mx.DraftSettings(drafter="ngram-simple,draft-mtp")
    assert set(mx.DRAFTER_MODES).isdisjoint({"mtp", "ngram", "chain"})  # the public list: llama.cpp's names
    assert mx.DRAFTER_MODES[0] == "draft-mtp" and {"ngram-simple", "ngram-simple,draft-mtp"} <= set(mx.DRAFTER_MODES)


def test_it_is_a_frozen_hashable_picklable_value():
    s = mx.DraftSettings(n_max=2, drafter="ngram-mod", options={"ngram_mod_n_match": 5})
    with pytest.raises(AttributeError):
        s.n_max = 4
    assert s == mx.DraftSettings(n_max=2, drafter="ngram-mod", options={"ngram_mod_n_match": 5})
    assert len({s, mx.DraftSettings(n_max=2, drafter="ngram-mod", options={"ngram_mod_n_match": 5})}) == 1
    assert pickle.loads(pickle.dumps(s)) == s
    assert mx.DraftSettings.from_dict(s.to_dict()) == s
    assert (
        set(FIELDS) <= set(s.to_dict()) and "ngram_mod_n_match=5" not in repr(s) and "'ngram_mod_n_match': 5" in repr(s)
    )


def test_replace_changes_fields_and_options_and_checks_again():
    s = mx.DraftSettings(n_max=4, n_min=3)
    assert s.replace(n_max=2).n_min == 2  # an n_max below n_min lowers it, as set_params does
    assert s.replace(ngram_simple_size_n=5).options["ngram_simple_size_n"] == 5
    assert mx.DraftSettings(drafter="chain").replace(drafter="ngram-mod,draft-mtp").chain_policy == "first"
    with pytest.raises(mx.ParameterError, match="n_min=5 is larger than n_max=4"):
        s.replace(n_min=5)
    with pytest.raises(mx.ParameterError, match="unknown drafter option"):
        s.replace(ngram_q=3)
    with pytest.raises(mx.ParameterError, match="two names"):
        s.replace(ngram_n=3, ngram_simple_size_n=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_max": -1}, "n_max must be >= 0"),
        ({"n_max": 2.5}, "n_max must be an integer"),
        ({"n_max": True}, "n_max must be an integer"),
        ({"p_min": 1.5}, r"p_min must be a finite number in \[0, 1\]"),
        ({"p_min": float("nan")}, r"p_min must be a finite number in \[0, 1\]"),
        ({"n_max": 2, "n_min": 3}, "n_min=3 is larger than n_max=2"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"temperature": -0.5}, "temperature must be a finite number"),
        ({"seed": 2**32}, "seed must be"),
        ({"drafter": "beam"}, "drafter must be one of"),
        ({"chain_policy": "longest"}, "chain_policy must be one of"),
        ({"options": {"ngram_simple_size_n": 0}}, "--spec-ngram-simple-size-n"),
    ],
)
def test_bad_settings_are_parameter_errors(kwargs, match):
    with pytest.raises(mx.ParameterError, match=match):
        mx.DraftSettings(**kwargs)


def test_limits_say_where_settings_cannot_run():
    limits = Limits(capacity=4, has_mtp=False, model="tiny")
    assert mx.DraftSettings(n_max=4, drafter="ngram-simple").check(limits).n_max == 4
    with pytest.raises(mx.ParameterError, match="n_max=5 exceeds this session's capacity of 4 .* n_rs_seq=5"):
        mx.DraftSettings(n_max=5, drafter="ngram-simple").check(limits)
    with pytest.raises(mx.MtpUnavailableError, match="tiny has no MTP layers"):
        mx.DraftSettings(n_max=2).check(limits)
    assert mx.DraftSettings(n_max=0).refusal(limits) is None  # plain decoding needs no head
    assert isinstance(mx.DraftSettings(n_max=1, drafter="draft-simple").refusal(limits), mx.ParameterError)


def test_refusals_name_llama_cpps_values_only():
    """What a refusal offers instead are llama.cpp's --spec-type values, never a short spelling."""
    import re

    for limits, drafter in (
        (Limits(capacity=4, has_mtp=True), "draft-eagle3"),
        (Limits(capacity=4, has_mtp=False), "mtp"),
        (Limits(capacity=4, has_mtp=True, has_draft_model="eagle3_head"), "draft-dflash"),
    ):
        message = str(mx.DraftSettings(n_max=2, drafter=drafter).refusal(limits))
        named = re.findall(r"'([a-z0-9,-]+)'", message.split("drafter=", 1)[1])
        offered = re.findall(r"'([a-z0-9,-]+)'", message.rsplit("drafter=", 1)[1])
        assert named[0] == mx.DraftSettings(drafter=drafter).drafter and offered, message
        assert set(offered) <= set(mx.DRAFTER_MODES), message
        assert not {"mtp", "ngram", "chain"} & set(re.findall(r"'([^']*)'", message)), message
    message = str(mx.DraftSettings(n_max=2, drafter="draft-eagle3").refusal(Limits(capacity=4, has_mtp=True)))
    assert "drafter='draft-eagle3'" in message and "'draft-mtp', 'ngram-simple'" in message


def test_a_session_takes_settings_or_keywords_and_its_trace_gives_them_back(session_mixed):
    s = session_mixed
    settings = mx.DraftSettings(n_max=2, max_tokens=24, drafter="ngram-simple,draft-mtp", options={"ngram_n": 3})
    t = s.generate(PROMPT, settings)
    assert t.draft_settings == settings.replace(seed=s.seed)  # the seed the run used
    assert mx.Trace.from_json(t.to_json()).draft_settings == t.draft_settings
    same = s.generate(PROMPT, max_tokens=24, n_max=2, drafter="ngram-simple,draft-mtp", ngram_simple_size_n=3)
    assert same.tokens == t.tokens and same.draft_settings == t.draft_settings
    shorter = s.generate(PROMPT, settings, max_tokens=8, n_max=1)  # keywords change the settings given
    assert (
        len(shorter.tokens) == 8
        and shorter.draft_settings.n_max == 1
        and shorter.draft_settings.drafter == "ngram-simple,draft-mtp"
    )
    assert all(st.n_drafted <= 1 for st in s.stream(PROMPT, settings.replace(n_max=1, max_tokens=6)))
    with pytest.raises(mx.InputTypeError, match="settings must be a DraftSettings"):
        s.generate(PROMPT, {"n_max": 2})
    with pytest.raises(mx.ParameterError, match="exceeds this session's capacity"):
        s.generate(PROMPT, settings.replace(n_max=s.capacity + 1))


def test_a_trace_names_its_drafter_as_llama_cpp_does(session_mixed):
    """A run asked with a short spelling records llama.cpp's name (and ``chain``'s policy); a trace an earlier version
    saved with a short spelling reads back under llama.cpp's name."""
    import json

    s = session_mixed
    for short, name, policy in (("mtp", "draft-mtp", "first"), ("chain", "ngram-simple,draft-mtp", "best")):
        t = s.generate(PROMPT, max_tokens=8, n_max=2, drafter=short)
        assert (t.settings["drafter"], t.settings["chain_policy"]) == (name, policy)
        assert t.draft_settings == mx.DraftSettings(
            n_max=2, max_tokens=8, drafter=name, chain_policy=policy, seed=s.seed
        )
        doc = json.loads(t.to_json())
        doc["settings"]["drafter"] = short  # as an earlier version saved it
        if short == "mtp":
            del doc["settings"]["chain_policy"]
        old = mx.Trace.from_json(json.dumps(doc))
        assert (old.settings["drafter"], old.settings["chain_policy"]) == (name, policy)
        assert old.draft_settings == t.draft_settings


def test_set_params_takes_settings(session_mixed):
    s = session_mixed
    seen = []
    for i, step in enumerate(s.stream(PROMPT, max_tokens=30, n_max=3)):
        if i == 0:
            s.set_params(mx.DraftSettings(n_max=1, p_min=0.25))
        seen.append(step.n_max)
    assert seen[0] == 3 and set(seen[2:]) == {1} and s.params == {"n_max": 1, "p_min": 0.25, "n_min": 0}
    with pytest.raises(mx.ParameterError, match="n_max, p_min and n_min only"):
        s.set_params(drafter="ngram-simple")


def test_parallel_requests_take_one_settings_each(session_np2):
    s = session_np2
    each = [mx.DraftSettings(n_max=0, max_tokens=12), mx.DraftSettings(n_max=3, p_min=0.2, max_tokens=20)]
    result = s.generate_parallel(["import os\n", "class A:\n"], each)
    assert [t.draft_settings.replace(seed=None) for t in result.traces] == each
    assert [len(t.tokens) for t in result.traces] == [12, 20] and result.traces[0].n_drafted.sum() == 0
    with pytest.raises(mx.ParameterError, match="request 1: .*one drafter serves a parallel generation"):
        s.generate_parallel(["a = 1", "b = 2"], [mx.DraftSettings(), mx.DraftSettings(drafter="ngram-simple")])
    with pytest.raises(mx.ParameterError, match="settings has 1 entries for 2 prompts"):
        s.generate_parallel(["a = 1", "b = 2"], [mx.DraftSettings()])


def test_what_if_calls_take_settings(session_mixed):
    s = session_mixed
    t = s.generate(PROMPT, max_tokens=32, n_max=3)
    oracle = s.record_oracle(PROMPT, max_tokens=32, depth=4, probe=False, batch_shift=False)
    sim = mx.simulate(oracle, t.draft_settings)  # a trace's settings replay as they ran
    assert sim.summary()["n_accepted"] == t.summary()["n_accepted"]
    assert mx.simulate(oracle, 3).summary()["n_accepted"] == sim.summary()["n_accepted"]
    df = mx.sweep(s, [PROMPT], n_max=[0, 2], p_min=[0.0], max_tokens=32, progress=False)
    rec = mx.recommend(df)
    assert rec.settings == mx.DraftSettings(n_max=rec.n_max, p_min=rec.p_min, n_min=rec.n_min, drafter=rec.drafter)
    cal = mx.calibrate(oracle, p_min=[0.0, 0.5])
    assert cal.settings.n_max == cal.best_setting["n_max"] and cal.settings.drafter == "draft-mtp"


def test_the_cli_checks_its_settings_before_loading_a_model(tmp_path):
    missing = tmp_path / "absent.gguf"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtp_explorer.cli",
            "run",
            "-m",
            str(missing),
            "--spec-draft-n-max",
            "2",
            "--spec-draft-n-min",
            "3",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "n_min=3 is larger than n_max=2" in out.stdout + out.stderr
