"""Parsing llama-speculative-simple's output, and the replay of its budget rule.

tests/data/speculative_simple.* is real output of `llama-speculative-simple --spec-type draft-mtp -n 40
--spec-draft-n-max 3 --temp 0 -p "def fib(n):"` (built from the 0.3.36 sources) on the synthetic
model write_synthetic_qwen35(context_mix=0.5, mtp_fidelity=1.0); stderr is cut to its summary lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mtp_explorer as mx
from mtp_explorer.devtools.reference import parse_reference_output, replay_reference_budget
from mtp_explorer.models.synthetic import write_synthetic_qwen35

DATA = Path(__file__).parent / "data"


def test_parse_reference_output():
    run = parse_reference_output(
        (DATA / "speculative_simple.stdout").read_text(),
        (DATA / "speculative_simple.stderr").read_text(),
        "def fib(n):",
    )
    assert (run.n_predict, run.n_drafted, run.n_accept) == (43, 48, 26)
    assert run.text.startswith(" when$Zin") and not run.text.endswith("\n")
    assert run.tokens_per_second > 0
    with pytest.raises(mx.ToolError, match="lacks"):
        parse_reference_output("def fib(n): x\n\n\n\n", "", "def fib(n):")
    with pytest.raises(mx.ToolError, match="unexpected end"):
        parse_reference_output("\n\ndef fib(n): cut", (DATA / "speculative_simple.stderr").read_text(), "def fib(n):")


# The closing lines of a real run (the SYNTHETIC scale model, -n 96, --spec-draft-n-max 1): the target context's perf
# counters come after "target:"; a draft model's context prints its own under "draft:" (here a made-up pair).
PERF_TAIL = """
draft:

common_perf_print: prompt eval time =      11.00 ms /    20 tokens (    0.55 ms per token,  1818.18 tokens per second)
common_perf_print:        eval time =      22.00 ms /    40 runs   (    0.55 ms per token,  1818.18 tokens per second)

target:

common_perf_print:    sampling time =       5.51 ms
common_perf_print:    samplers time =       2.62 ms /    98 tokens
common_perf_print:        load time =     133.48 ms
common_perf_print: prompt eval time =    3907.91 ms /   114 tokens (   34.28 ms per token,    29.17 tokens per second)
common_perf_print:        eval time =      12.50 ms /     1 runs   (   12.50 ms per token,    80.00 tokens per second)
common_perf_print:       total time =    4753.70 ms /   115 tokens
"""


def test_target_decode_seconds_are_the_target_contexts_perf_counters():
    """The target's decode time is its context's prompt eval and eval time (not the draft context's, printed
    before it); a log cut to the summary (the recorded one) has none."""
    stderr = (DATA / "speculative_simple.stderr").read_text()
    stdout = (DATA / "speculative_simple.stdout").read_text()
    assert parse_reference_output(stdout, stderr, "def fib(n):").target_decode_seconds is None
    run = parse_reference_output(stdout, stderr + PERF_TAIL, "def fib(n):")
    assert run.target_decode_seconds == pytest.approx(3.92041)


@pytest.mark.reference
def test_an_incomplete_reference_log_is_run_again(tmp_path):
    """llama-speculative-simple sometimes exits 0 with the tail of its log lost: the run is repeated (a stand-in that
    prints a cut log on its first call and the recorded one after), and a log that stays incomplete is a ToolError."""
    from mtp_explorer.devtools.reference import run_reference_spec

    calls = tmp_path / "calls"
    stand_in = tmp_path / "llama-speculative-simple"
    stand_in.write_text(f"""#!/bin/sh
echo x >> {calls}
if [ "$(wc -l < {calls})" -lt 2 ]; then printf 'def fib(n): cut'; exit 0; fi
cat {DATA / "speculative_simple.stdout"}; cat {DATA / "speculative_simple.stderr"} >&2
""")
    stand_in.chmod(0o755)
    run = run_reference_spec(stand_in, tmp_path / "m.gguf", "def fib(n):", [], max_tokens=40)
    assert (run.n_predict, run.n_drafted, run.n_accept) == (43, 48, 26) and len(calls.read_text().split()) == 2
    always_cut = tmp_path / "always-cut"
    always_cut.write_text("#!/bin/sh\nprintf 'def fib(n): cut'\n")
    always_cut.chmod(0o755)
    with pytest.raises(mx.ToolError, match="incomplete output 2 times"):
        run_reference_spec(always_cut, tmp_path / "m.gguf", "def fib(n):", [], max_tokens=40, attempts=2)


def test_replay_matches_recorded_reference(tmp_path):
    """Our engine under the reference's budget rule reproduces the recorded run exactly."""
    path = write_synthetic_qwen35(tmp_path / "m.gguf", context_mix=0.5, mtp_fidelity=1.0)
    ref = parse_reference_output(
        (DATA / "speculative_simple.stdout").read_text(),
        (DATA / "speculative_simple.stderr").read_text(),
        "def fib(n):",
    )
    with mx.Session.open(path, n_ctx=1024) as s:
        t = replay_reference_budget(s, "def fib(n):", max_tokens=40, n_max=3)
    assert "".join(t.pieces) == ref.text
    assert (len(t.tokens), int(t.n_drafted.sum()), int(t.n_accepted.sum())) == (
        ref.n_predict,
        ref.n_drafted,
        ref.n_accept,
    )


# (--spec-type, model, prompt): llama.cpp's chains with draft-mtp on a recurrent model, the look-ups alone on a
# non-recurrent one (benchmarks/parity.py --spec-type chains runs 12 prompts each on more models). ngram-cache runs
# without cache files: llama-speculative-simple 0.3.36 does not take -lcs/-lcd (tests/test_ngram_cache.py checks them
# against the replay, and its writer against llama-lookup-create).
CHAIN_CASES = [
    ("ngram-mod,draft-mtp", "qwen35", "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"),
    (
        "ngram-simple,ngram-map-k,draft-mtp",
        "qwen35",
        "for i in range(3):\n    print(i)\nfor i in range(3):\n    print(",
    ),
    ("ngram-mod", "glm4moe", "a b c d e f g a b c d e f g a b c"),
    ("ngram-map-k4v", "glm4moe", "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"),
    ("ngram-cache", "glm4moe", "a b c d e f g a b c d e f g a b c"),
    ("ngram-cache,draft-mtp", "qwen35", "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"),
]
SMALL = {
    "ngram_simple_size_n": 2,
    "ngram_mod_n_match": 2,
    "ngram_mod_n_min": 1,
    "ngram_map_k_size_n": 2,
    "ngram_map_k4v_size_n": 2,
}


@pytest.mark.parametrize("spec, arch, prompt", CHAIN_CASES)
@pytest.mark.reference
def test_spec_types_match_the_reference(tmp_path, reference_binary, spec, arch, prompt):
    """Text and drafted/accepted totals equal llama-speculative-simple's for llama.cpp's chains and look-ups
    (its budget rule replayed; a chain verifies the first draft in llama.cpp's order)."""
    from mtp_explorer.core import drafters
    from mtp_explorer.devtools.reference import (
        compare_with_reference,
        reference_n_max,
        run_reference_spec,
        spec_type_args,
    )
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe

    n_max = reference_n_max(spec, 3)  # (8 with ngram-cache, whose draft length llama.cpp fixes)
    names = {o.name for o in drafters.mode(spec).options}
    limits = {
        "ngram_simple_size_m": n_max,
        "ngram_mod_n_max": n_max,
        "ngram_map_k_size_m": n_max,
        "ngram_map_k4v_size_m": n_max,
    }
    options = {k: v for k, v in (SMALL | limits).items() if k in names}
    path = (
        write_synthetic_qwen35(tmp_path / "m.gguf", context_mix=0.6, mtp_fidelity=1.0)
        if arch == "qwen35"
        else write_synthetic_glm4moe(tmp_path / "m.gguf")
    )
    ref = run_reference_spec(
        reference_binary, path, prompt, spec_type_args(spec, n_max, options), max_tokens=48, n_ctx=1024, threads=1
    )
    with mx.Session.open(path, n_ctx=1024, threads=1) as s:
        ours = replay_reference_budget(s, prompt, max_tokens=48, n_max=n_max, drafter=spec, **options)
    result = compare_with_reference(ref, ours, 0.0)
    assert result["match"], result
    assert result["ours"]["n_drafted"] > 0
    assert 0 < ref.target_decode_seconds  # its target context's perf counters, printed by every real run


# (target, p_min, prompt): draft-simple with -md on the bundled pair (a recurrent target, which the reference gives no
# snapshot slots: ours opened without them too, so it restores checkpoints as the reference does) and on a
# non-recurrent synthetic pair (benchmarks/parity.py --spec-type draft-simple runs 96 cases)
DRAFT_CASES = [
    ("bundled", 0.0, "class Stack:\n    def __init__(self):"),
    ("bundled", 0.5, "def fibonacci(n):"),
    ("glm4moe", 0.0, "for i in range(10):"),
    ("glm4moe", 0.5, "import os\nimport sys\n"),
]


@pytest.mark.parametrize("target, p_min, prompt", DRAFT_CASES)
@pytest.mark.reference
def test_draft_simple_matches_the_reference(tmp_path, reference_binary, bundled_model, target, p_min, prompt):
    """Text and drafted/accepted totals equal ``llama-speculative-simple --spec-type draft-simple -md DRAFT``."""
    from mtp_explorer.devtools.reference import compare_with_reference, run_reference_spec, spec_type_args
    from mtp_explorer.models import draft_model_path
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe

    n_max = 3
    if target == "bundled":
        path, draft = bundled_model, draft_model_path()
    else:
        path = write_synthetic_glm4moe(tmp_path / "target.gguf", context_mix=0.5)
        draft = write_synthetic_glm4moe(tmp_path / "draft.gguf", context_mix=0.0)
    checkpoints = bool(mx.model_info(path).is_recurrent)
    flags = spec_type_args("draft-simple", n_max, {}) + ["-md", str(draft), "--spec-draft-p-min", str(p_min)]
    ref = run_reference_spec(reference_binary, path, prompt, flags, max_tokens=48, n_ctx=1024, threads=1)
    slots = {"n_rs_seq": 0, "capacity": n_max} if checkpoints else {}
    with mx.Session.open(path, n_ctx=1024, threads=1, draft_model=draft, **slots) as s:
        assert s.checkpoints == checkpoints
        ours = replay_reference_budget(
            s, prompt, max_tokens=48, n_max=n_max, p_min=p_min, drafter="draft-simple", checkpoints=checkpoints
        )
    result = compare_with_reference(ref, ours, p_min, checkpoints=checkpoints)
    assert result["match"], result
    assert result["ours"]["n_drafted"] > 0 and result["ours"]["n_accept"] > 0
    if checkpoints:  # the rule was exercised, not vacuous, and the session replayed each partial acceptance itself
        assert result["re_verified_steps"] > 0
        assert int((ours.columns["replayed"] > 0).sum()) == result["re_verified_steps"]
