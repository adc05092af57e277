"""draft-eagle3 in the engine: the shipped EAGLE-3 head (``mtp_explorer/models/pystdlib-eagle3.gguf``, given as
``Session.open(path, draft_model=...)``, llama.cpp's ``-md``) drafts for the bundled model from three of its layers.

* the session knows its draft model is an EAGLE-3 head (``draft_kind``), runs ``draft-eagle3`` and refuses
  ``draft-simple`` with it (and ``draft-eagle3`` with a plain draft model) with a ParameterError;
* a head whose target does not match (hidden size, layers the target cannot give) is refused when the session opens;
* greedy output is the plain greedy output except at reported near-ties, and drafts are accepted;
* text and drafted/accepted totals equal ``llama-speculative-simple -md HEAD --spec-type draft-eagle3`` (llama.cpp
  gives the recurrent target snapshot slots for draft-eagle3, as for draft-mtp: no checkpoint rule);
* the simulator replays real runs exactly from one oracle recording.
"""

from __future__ import annotations

import warnings

import gguf
import numpy as np
import pytest
from conftest import check_accounting, check_replay_exact

import mtp_explorer as mx
from mtp_explorer.core import drafters
from mtp_explorer.models import draft_model_path

pytestmark = pytest.mark.slow  # out of make test-fast (its 3-minute budget)

PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
)
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def head():
    return next(h.head_path for h in mx.draft_heads() if h.spec_type == "draft-eagle3")


@pytest.fixture(scope="module")
def session(bundled_model, head):
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=head) as s:
        yield s


@pytest.fixture(scope="module")
def oracles(session):
    return {p: session.record_oracle(p, max_tokens=MAX_TOKENS, depth=4) for p in PROMPTS}


def test_the_session_knows_its_head(session):
    assert session.has_draft_model and session.draft_kind == "eagle3_head"
    assert "draft-eagle3" in session.drafter_modes and "draft-simple" not in session.drafter_modes
    assert "draft-eagle3" in drafters.available_modes(True, "eagle3_head")
    assert "draft-simple" not in drafters.available_modes(True, "eagle3_head")
    assert "draft-eagle3" not in drafters.available_modes(True, True)
    t = session.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter="draft-eagle3")
    assert t.settings["drafter"] == "draft-eagle3" and t.draft_settings.drafter == "draft-eagle3"


def test_the_wrong_drafter_for_the_draft_model_is_refused(session, bundled_model):
    with pytest.raises(
        mx.ParameterError,
        match=r"drafts with a draft model that drafts alone \(Session.open\(path, "
        r"draft_model=...\)\), and the draft model this session has is a "
        "EAGLE-3 head",
    ):
        session.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter="draft-simple")
    with mx.Session.open(bundled_model, n_ctx=512, threads=1, draft_model=draft_model_path()) as s:
        assert s.draft_kind == "draft_model"
        with pytest.raises(mx.ParameterError, match="EAGLE-3"):
            s.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter="draft-eagle3")
    with mx.Session.open(bundled_model, n_ctx=512, threads=1) as s:
        assert s.draft_kind == "nothing"
        with pytest.raises(mx.ParameterError, match="draft model"):
            s.generate(PROMPTS[0], max_tokens=8, n_max=2, drafter="draft-eagle3")
    # the engine's own backstop says the same where Python's check is passed by
    settings = mx.DraftSettings(n_max=2, drafter="draft-simple", max_tokens=4)
    with pytest.raises(
        mx.ParameterError, match="needs a draft model of kind draft_model, and this session's is a eagle3_head"
    ):
        session.engine.begin(session.tokenize(PROMPTS[0]), settings.native_config(0), settings.native_params())


def _rewrite_head(src, dst, tensors=None, **fields):
    """A copy of the head GGUF with metadata fields replaced (key -> (value, GGUFValueType)) and tensors replaced
    (name -> array in numpy's order)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch="eagle3")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = fields.get(key, (field.contents(), field.types[0]))
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value[0], gguf.GGUFValueType.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value[0], value[1])
    for t in r.tensors:
        if tensors and t.name in tensors:
            w.add_tensor(t.name, tensors[t.name])
            continue
        w.add_tensor(
            t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])), raw_dtype=t.tensor_type
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


#: SYNTHETIC: a head trained for a target of hidden size 512 (its fc reads 3 x 512 features; random weights)
_OTHER_FC = np.random.default_rng(0).standard_normal((256, 3 * 512)).astype(np.float16)


@pytest.mark.parametrize(
    "fields, tensors, error, match",
    [
        (
            {"eagle3.target_hidden_size": (512, gguf.GGUFValueType.UINT32)},
            {"fc.weight": _OTHER_FC},
            mx.ParameterError,
            "hidden size 512",
        ),
        (
            {"eagle3.target_layers": ([2, 3, 9], None)},
            None,
            mx.ParameterError,
            "layer 9, beyond this target's 4 layers",
        ),
        # llama.cpp refuses this file itself when it loads it, and says why
        ({"eagle3.target_layers": ([1, 2], None)}, None, mx.ModelLoadError, "EAGLE3 requires exactly 3 entries"),
    ],
)
def test_a_head_for_another_target_is_refused(tmp_path, bundled_model, head, fields, tensors, error, match):
    bad = _rewrite_head(head, tmp_path / "bad-eagle3.gguf", tensors, **fields)
    with pytest.raises(error, match=match):
        mx.Session.open(bundled_model, n_ctx=512, threads=1, draft_model=bad)


def test_greedy_output_equals_plain_except_at_reported_near_ties(session, oracles):
    runs, ties = 0, []
    for prompt, oracle in oracles.items():
        for n_max in (1, 3, 4):
            for p_min in (0.0, 0.5):
                t = session.generate(prompt, max_tokens=MAX_TOKENS, n_max=n_max, p_min=p_min, drafter="draft-eagle3")
                runs += 1
                check_accounting(t)
                cmp = mx.compare(oracle, t)
                assert cmp.n_compared > 0 and not cmp.unexplained, (prompt, n_max, p_min, cmp.unexplained[:2])
                ties += [t] if t.tokens != oracle.tokens else []
                if p_min > 0:
                    rows = t.n_drafted > 0
                    assert (t.draft_prob[rows][:, 0] >= p_min).all()
    assert len(ties) <= runs // 4
    total = sum(
        int(t.n_accepted.sum())
        for t in [session.generate(p, max_tokens=MAX_TOKENS, n_max=3, drafter="draft-eagle3") for p in PROMPTS]
    )
    assert total > 0  # the head drafts usefully: its drafts are accepted


def test_statistics_count_as_llama_cpp(session):
    t = session.generate(PROMPTS[1], max_tokens=MAX_TOKENS, n_max=3, drafter="draft-eagle3")
    (stats,) = session.drafter_stats()
    assert stats["name"] == "draft-eagle3"
    assert stats["n_gen_tokens"] == int(t.n_drafted.sum()) and stats["n_acc_tokens"] == int(t.n_accepted.sum())
    assert stats["t_draft_ns"] > 0 and stats["t_accept_ns"] > 0  # drafting, and following the target's batches


@pytest.mark.parametrize("n_max", [1, 2, 4])
def test_simulator_replays_the_head_exactly(session, oracles, n_max):
    prompt = PROMPTS[2]
    check_replay_exact(session, oracles[prompt], prompt, "draft-eagle3", n_max, MAX_TOKENS)


@pytest.mark.parametrize(
    "spec, p_min, prompt",
    [
        ("draft-eagle3", 0.0, "class Stack:\n    def __init__(self):"),
        ("draft-eagle3", 0.5, "def fibonacci(n):"),
        ("draft-eagle3", 0.0, "import os\nimport sys\n"),
        # the look-up drafts some steps: llama.cpp's bridge row (below)
        ("ngram-simple,draft-eagle3", 0.5, "class Stack:\n    def __init__(self):"),
    ],
)
@pytest.mark.reference
def test_matches_the_reference(reference_binary, bundled_model, head, spec, p_min, prompt):
    """Text and drafted/accepted totals equal ``llama-speculative-simple --spec-type SPEC -md HEAD``. In the chain,
    after each step the look-up drafted, llama.cpp decodes the head's deferred row with the newest g (see
    native_ext/eagle3_drafter.cpp); with the deferred g this case drafts 35 tokens where the reference drafts 37."""
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        reference_checkpoints,
        replay_reference_budget,
        run_reference_spec,
        spec_type_args,
    )

    n_max = 3
    assert not reference_checkpoints(bundled_model, spec) and reference_checkpoints(bundled_model, "draft-simple")
    options = {"ngram_simple_size_n": 2, "ngram_simple_size_m": 3} if "ngram" in spec else {}
    flags = spec_type_args(spec, n_max, options) + ["-md", str(head), "--spec-draft-p-min", str(p_min)]
    ref = run_reference_spec(reference_binary, bundled_model, prompt, flags, max_tokens=64, n_ctx=1024, threads=1)
    with mx.Session.open(bundled_model, n_ctx=1024, threads=1, draft_model=head) as s:
        ours = replay_reference_budget(s, prompt, max_tokens=64, n_max=n_max, p_min=p_min, drafter=spec, **options)
    result = compare_with_reference(ref, ours, p_min)
    assert result["match"], result
    assert result["ours"]["n_drafted"] > 0 and result["ours"]["n_accept"] > 0


def test_the_live_trace_holds_every_column(session):
    """The Explorer's live trace of a streamed draft-eagle3 run has every column of the finished trace."""
    from mtp_explorer.widgets import LiveTrace

    live = LiveTrace.of(session, PROMPTS[0])
    for step in session.stream(PROMPTS[0], max_tokens=32, n_max=3, p_min=0.1, drafter="draft-eagle3"):
        live.add(step)
    final = session.last_trace
    got = live.trace()
    assert got.tokens == final.tokens and final.n_drafted.sum() > 0
    for name, column in final.columns.items():
        assert np.array_equal(got.columns[name], column, equal_nan=True), name


def test_parallel_requests_equal_each_alone(bundled_model, head):
    """Two sequences at once (a third arriving later, as a server slot frees): each request's text is its greedy
    text alone, up to reported near-ties, and its drafts are the ones it drafts alone."""
    from mtp_explorer.analysis.parallel_check import check_parallel

    with mx.Session.open(bundled_model, n_ctx=2048, threads=1, draft_model=head, n_parallel=2) as s:
        result = s.generate_parallel(list(PROMPTS), max_tokens=40, n_max=3, drafter="draft-eagle3", arrivals=[0, 0, 5])
        assert [r.slot for r in result.requests][:2] == [0, 1]
        for check in check_parallel(s, result):
            assert not check.unexplained, check.to_dict()
    assert all(t.n_drafted.sum() > 0 and t.n_accepted.sum() > 0 for t in result.traces)


def test_the_replay_says_where_it_is_approximate(oracles):
    """Behind a look-up in a first-policy chain, the head's state depends on the steps the look-up takes (llama.cpp's
    bridge row): the simulator warns; alone, or chained under the best policy, it is exact and silent."""
    oracle = oracles[PROMPTS[0]]
    with pytest.warns(mx.ReplayApproximate, match="newest g"):
        mx.simulate(oracle, 3, drafter="ngram-simple,draft-eagle3")
    with warnings.catch_warnings():
        warnings.simplefilter("error", mx.ReplayApproximate)
        mx.simulate(oracle, 3, drafter="draft-eagle3")
        mx.simulate(oracle, 0, drafter="ngram-simple,draft-eagle3")
        mx.simulate(
            oracle,
            mx.DraftSettings(
                n_max=3, drafter="ngram-simple,draft-eagle3", chain_policy="best", max_tokens=oracle.max_tokens
            ),
        )


def test_walk_equals_the_vectorised_path(oracles):
    from test_replay import check_walk_equals_the_vectorised_path

    check_walk_equals_the_vectorised_path(oracles[PROMPTS[1]], "draft-eagle3", ((1, 0.0, 0), (3, 0.3, 2), (4, 0.0, 0)))
