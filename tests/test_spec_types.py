"""llama.cpp's names for the drafters: ``drafter=`` takes ``--spec-type`` values (comma-separated chains, lists),
chains are asked in llama.cpp's order under its ``first`` policy by default (``best`` on request), options keep
their earlier names as aliases, ``p_min`` on a drafter without confidence is a warning, and the per-drafter
statistics are counted as ``common_speculative_print_stats`` counts them."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from conftest import check_drafter_stats

import mtp_explorer as mx
from mtp_explorer.analysis import simulate as sim
from mtp_explorer.analysis import walk
from mtp_explorer.core import drafters
from mtp_explorer.core.settings import NeverDrafts, PminNotApplicable

REPETITIVE = "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"


def test_spec_type_values_are_parsed_as_llama_cpp_parses_them():
    assert drafters.mode("draft-mtp") is drafters.MODES["draft-mtp"] is drafters.mode("mtp")  # a short spelling
    assert drafters.mode("ngram-simple") is drafters.MODES["ngram-simple"] is drafters.mode("ngram")
    chain = drafters.mode("draft-mtp,ngram-simple")
    # llama.cpp asks its drafters in its own order of preference, whatever order the value names them in
    assert chain.spec_types == "ngram-simple,draft-mtp" and chain.policy == "first"
    assert drafters.mode(["draft-mtp", "ngram-simple"]) == chain == drafters.mode("ngram-simple,draft-mtp,draft-mtp")
    best = drafters.mode("draft-mtp,ngram-simple", "best")
    assert best.policy == "best" and best.drafters == chain.drafters
    assert drafters.mode("chain").policy == "best" and drafters.mode("chain", "first").policy == "first"
    assert drafters.mode("chain") == best and drafters.mode("chain").name == "ngram-simple,draft-mtp"
    assert drafters.mode("chain", "first") is drafters.mode("ngram-simple,draft-mtp")
    assert best.label != chain.label  # the policy shows in the label, not in the name
    assert drafters.mode(["mtp", "ngram-mod"]) is drafters.MODES["ngram-mod,draft-mtp"]  # a short spelling in a chain
    # every listed choice and every name a message offers is llama.cpp's --spec-type value
    assert all(drafters.mode(n).spec_types == n for n in drafters.DRAFTER_MODES)
    assert drafters.DEFAULT_MODE == "draft-mtp" and drafters.default_mode(False) == "ngram-simple"
    assert not set(drafters.available_modes(True, "draft_model")) & set(drafters.MODE_ALIASES)
    assert all(drafters.mode_name(a) == v for a, (v, _) in drafters.MODE_ALIASES.items())
    for bad, match in (
        ("eagle", "unknown speculative type 'eagle'"),
        ("ngram-simple,", "unknown speculative type ''"),
        ("none", "n_max=0"),
        ([], "drafter must be one of"),
        (3, "drafter must be one of"),
    ):
        with pytest.raises(mx.ParameterError, match=match):
            drafters.mode(bad)
    with pytest.raises(mx.ParameterError, match="chain_policy"):
        drafters.mode("chain", "coin")


def test_options_have_llama_cpp_names_and_keep_their_aliases():
    assert drafters.option_values({"ngram_n": 2})["ngram_simple_size_n"] == 2
    assert drafters.option_values({"ngram_simple_size_m": 5})["ngram_simple_size_m"] == 5
    with pytest.raises(mx.ParameterError, match="another name"):
        drafters.option_values({"ngram_n": 2, "ngram_simple_size_n": 2})
    with pytest.raises(mx.ParameterError, match="--spec-ngram-simple-size-m"):
        drafters.option_values({"ngram_m": 0})
    for o in drafters.all_options():  # the file options keep llama.cpp's flags without --spec- (-lcs/-lcd)
        assert o.flag == ("--" if o.is_path else "--spec-") + o.name.replace("_", "-")


def test_first_policy_by_hand():
    def first(usable):
        return walk.CHAIN_POLICY_REPLAYS["first"]([[u] for u in usable], [[0.0] for _ in usable])(0)

    assert first([True, True]) == 0 and first([False, True]) == 1 and first([False, False]) == 0
    assert walk.CHAIN_POLICY_ASKS_ALL == {"first": False, "best": True}


def test_chain_policies_in_the_engine(session_mixed):
    """``first`` verifies the first usable draft and asks no drafter after it; ``best`` asks every drafter."""
    s = session_mixed
    ngram, mtp = mx.DRAFTERS.index(drafters.MODES["ngram-simple"].drafters[0].name), mx.DRAFTERS.index("draft-mtp")
    first = s.generate(REPETITIVE, max_tokens=48, n_max=4, drafter="ngram-simple,draft-mtp", ngram_simple_size_n=2)
    assert first.settings["chain_policy"] == "first" and first.settings["drafter"] == "ngram-simple,draft-mtp"
    won_by_ngram = first.drafter == ngram
    assert won_by_ngram.any() and (first.drafter == mtp).any()
    # where the look-up had a draft, the MTP head was not asked
    assert (first.candidate_len[won_by_ngram, mtp] == -1).all()
    best = s.generate(
        REPETITIVE,
        max_tokens=48,
        n_max=4,
        drafter=["ngram-simple", "draft-mtp"],
        chain_policy="best",
        ngram_simple_size_n=2,
    )
    assert best.settings["chain_policy"] == "best"
    assert (best.candidate_len[:, mtp] >= 0).all()  # every drafter every step
    assert first.tokens == best.tokens  # greedy: the policy changes the speed, never the text


def test_drafter_stats_are_llama_cpp_s(session_mixed):
    """n_gen_drafts / n_gen_tokens count verified drafts; every step's outcome goes to the drafter verified last
    (llama.cpp's impl_last), also at steps without a draft (n_call_accept)."""
    t = session_mixed.generate(
        REPETITIVE, max_tokens=48, n_max=4, drafter="ngram-simple,draft-mtp", ngram_simple_size_n=2
    )
    check_drafter_stats(session_mixed, t, "ngram-simple,draft-mtp")


def test_p_min_on_a_drafter_without_confidence_is_a_warning(session_mixed):
    with pytest.warns(PminNotApplicable, match="does not apply"):
        t = session_mixed.generate(REPETITIVE, max_tokens=8, n_max=2, p_min=0.5, drafter="ngram-simple")
    assert len(t.tokens) == 8


def test_ngram_simple_with_a_continuation_shorter_than_its_key_warns_and_drafts_nothing(session_mixed):
    """llama.cpp drops ngram-simple's continuation when it is shorter than the key (size_m < size_n): a warning,
    and the run decodes plainly; size_m == size_n drafts."""
    with pytest.warns(NeverDrafts, match="ngram_simple_size_m=3 < ngram_simple_size_n=4"):
        t = session_mixed.generate(
            REPETITIVE, max_tokens=48, n_max=3, drafter="ngram-simple", ngram_simple_size_n=4, ngram_simple_size_m=3
        )
    assert int(t.totals["n_drafted"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeverDrafts)
        t = session_mixed.generate(
            REPETITIVE, max_tokens=48, n_max=3, drafter="ngram-simple", ngram_simple_size_n=3, ngram_simple_size_m=3
        )
    assert int(t.totals["n_drafted"]) > 0


def test_ceiling_prices_only_the_drafters_a_policy_asks(session_mixed):
    """With every draft accepted, ``first`` verifies the first drafter's draft and asks no other: cheaper steps
    than ``best``, which asks every drafter (here the MTP head's decodes as well)."""
    o = session_mixed.record_oracle(REPETITIVE, max_tokens=32, depth=4, probe=True)
    # SYNTHETIC costs, positive round numbers: a loaded machine's fit can put the head's draft calls at nothing or
    # an intercept below zero, and then the comparison would be about noise, not about who is asked
    k, m = np.arange(len(o.cost.verify), dtype=float), np.arange(len(o.cost.draft), dtype=float)
    flat = np.zeros_like(k)
    costs = dataclasses.replace(
        o.cost,
        verify=np.stack([2e5 + 5e4 * k, flat], axis=1),
        catchup=np.stack([5e4 * k, flat], axis=1),
        draft=np.stack([1e5 * m, np.zeros_like(m)], axis=1),
        ngram=np.array([500.0, 0.0]),
        fresh_ns=3e5,
        cold_ns=4e4,
        warm_ns=2e4,
        sample_ns=3e3,
        sample_plain_ns=1e3,
        sample_row_ns=300.0,
        rollback_ns=3e3,
    )
    first, best = (
        sim.ceiling_tokens_per_second(o, 4, drafters.mode("ngram-simple,draft-mtp", p), costs=costs)
        for p in ("first", "best")
    )
    assert first > best
