"""SYNTHETIC gemma4 target with its gemma4-assistant MTP head file (llama.cpp's shared-memory draft-mtp mode): the
files, model_info of each and of the pair, llama.cpp's reference drafting and accepting with -md, the synth command,
and the engine's shared-memory mode against llama-speculative-simple."""

from __future__ import annotations

import gguf
import pytest

import mtp_explorer as mx
from mtp_explorer.cli import main
from mtp_explorer.devtools.reference import run_reference_spec
from mtp_explorer.models.synthetic_gemma4 import (
    gemma4_assistant_config,
    gemma4_config,
    gemma4_expected_tensor_shapes,
    write_synthetic_gemma4,
)

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic_gemma4")
    return {
        "perfect": write_synthetic_gemma4(d / "perfect.gguf"),
        "partial": write_synthetic_gemma4(d / "partial.gguf", context_mix=0.5),
        "random": write_synthetic_gemma4(d / "random.gguf", mtp_fidelity=0.0),
    }


def _metadata(path):
    reader = gguf.GGUFReader(str(path))
    md = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return md, {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}


def _reference(binary, pair, n_max=3, max_tokens=32):
    target, head = pair
    return run_reference_spec(
        binary,
        target,
        PROMPT,
        ["-md", str(head), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)],
        max_tokens=max_tokens,
        n_ctx=512,
        threads=1,
    )


# -- the files ----------------------------------------------------------------------------------------
def test_write_is_small_deterministic_and_names_the_head_file(tmp_path):
    a, a_head = write_synthetic_gemma4(tmp_path / "a.gguf", seed=3, context_mix=0.5)
    assert a_head == tmp_path / "mtp-a.gguf"  # as llama.cpp's converter names a draft-only file
    assert a.stat().st_size < 1024 * 1024 and a_head.stat().st_size < 512 * 1024
    b, b_head = write_synthetic_gemma4(tmp_path / "b.gguf", tmp_path / "b-head.gguf", seed=3, context_mix=0.5)
    c, c_head = write_synthetic_gemma4(tmp_path / "c.gguf", seed=4, context_mix=0.5)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert a_head.read_bytes() == b_head.read_bytes() != c_head.read_bytes()


def test_metadata_and_tensors(files):
    target, head = files["partial"]
    md, found = _metadata(target)
    assert md["general.architecture"] == "gemma4" and "gemma4.nextn_predict_layers" not in md
    assert md["gemma4.attention.sliding_window_pattern"] == [True, True, True, False]
    assert (md["gemma4.attention.key_length"], md["gemma4.attention.key_length_swa"]) == (32, 16)
    assert md["mtp_explorer.synthetic"] is True and "SYNTHETIC" in md["general.description"]
    assert set(found) <= set(gemma4_expected_tensor_shapes(gemma4_config()))
    md, found = _metadata(head)
    assert md["general.architecture"] == "gemma4-assistant"
    assert md["gemma4-assistant.block_count"] == md["gemma4-assistant.nextn_predict_layers"] == 2
    assert (md["gemma4-assistant.embedding_length"], md["gemma4-assistant.embedding_length_out"]) == (32, 64)
    assert set(found) == set(gemma4_expected_tensor_shapes(gemma4_assistant_config(gemma4_config())))
    assert "blk.0.attn_k.weight" not in found  # the head's keys and values are the target's
    assert found["nextn.pre_projection.weight"] == (32, 128)


def test_model_info_of_the_target_the_head_and_the_pair(files, tmp_path):
    target, head = files["perfect"]
    t = mx.model_info(target)
    assert (t.arch, t.has_mtp, t.mtp_mode, t.n_mtp_heads, t.is_mtp_head_file) == ("gemma4", False, None, 0, False)
    h = mx.model_info(head)
    assert (h.arch, h.n_layer, h.n_layer_nextn, h.has_mtp) == ("gemma4-assistant", 0, 2, True)
    assert (h.mtp_mode, h.n_mtp_heads, h.is_mtp_head_file, h.n_embd, h.n_embd_out) == ("shared_memory", 1, True, 32, 64)
    pair = mx.model_info(target, head=head)
    assert (pair.arch, pair.mtp_mode, pair.n_mtp_heads, pair.mtp_head) == ("gemma4", "shared_memory", 1, str(head))
    # a head that does not fit its target
    wide, wide_head = write_synthetic_gemma4(tmp_path / "wide.gguf", n_embd=48)
    with pytest.raises(mx.ModelLoadError, match="width 48 .* target's are 64 wide"):
        mx.model_info(target, head=wide_head)
    with pytest.raises(mx.ModelLoadError, match="not an MTP head file"):
        mx.model_info(target, head=wide)
    with pytest.raises(mx.ModelLoadError, match="itself an MTP head file"):
        mx.model_info(head, head=head)


# -- llama.cpp's reference --------------------------------------------------------------------------------
@pytest.mark.reference
def test_reference_drafts_and_accepts_with_the_head_file(files, reference_binary):
    perfect = _reference(reference_binary, files["perfect"])
    assert perfect.n_drafted > 0 and perfect.n_accept == perfect.n_drafted
    deeper = _reference(reference_binary, files["perfect"], n_max=5)  # one head drafts at every depth: no cap
    assert deeper.n_drafted > perfect.n_drafted and deeper.n_accept == deeper.n_drafted
    partial = _reference(reference_binary, files["partial"])
    assert 0 < partial.n_accept < partial.n_drafted
    random = _reference(reference_binary, files["random"])
    assert random.n_drafted > 0 and random.n_accept == 0
    # greedy: the head changes the drafts, never the text (the reference stops past -n by up to a draft's length)
    short, long = sorted((perfect.text, random.text), key=len)
    assert len(short) > 20 and long.startswith(short)


# -- the synth command ------------------------------------------------------------------------------------
def test_synth_prints_the_target_then_the_head(tmp_path, capsys):
    assert main(["synth", "--arch", "gemma4", "--out", str(tmp_path), "--context-mix", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(tmp_path / "synthetic-gemma4.gguf"), str(tmp_path / "mtp-synthetic-gemma4.gguf")]
    assert mx.model_info(lines[0], head=lines[1]).mtp_mode == "shared_memory"


# -- the engine -------------------------------------------------------------------------------------------
PROMPTS = ("def f(x):", "import os\n", "class A:\n    pass\n")


@pytest.mark.parametrize("n_max", [1, 3, 5])
@pytest.mark.reference
def test_the_shared_memory_head_matches_llama_speculative_simple(files, reference_binary, n_max):
    """Session.open(target, draft_model=head): the head is the target's MTP head (draft-mtp), its context created
    over the target's (ctx_other), drafting every depth at the position after the target's last, with no catch-up of
    its own: text and drafted/accepted totals equal llama-speculative-simple -md HEAD --spec-type draft-mtp's."""
    from mtp_explorer.devtools.reference import compare_with_reference, replay_reference_budget, spec_type_args

    target, head = files["partial"]
    with mx.Session.open(target, draft_model=head, n_ctx=1024, threads=1) as s:
        assert (s.info.has_mtp, s.info.mtp_mode, s.has_draft_model, s.draft_kind) == (
            True,
            "shared_memory",
            False,
            "nothing",
        )
        for prompt in PROMPTS:
            ours = replay_reference_budget(s, prompt, max_tokens=48, n_max=n_max)
            ref = run_reference_spec(
                reference_binary,
                target,
                prompt,
                [*spec_type_args("draft-mtp", n_max, {}), "-md", str(head)],
                max_tokens=48,
                n_ctx=1024,
                threads=1,
            )
            result = compare_with_reference(ref, ours, 0.0)
            assert result["match"], (n_max, prompt, result)


def test_the_shared_memory_head_keeps_greedy_output_and_replays_exactly(files):
    """Greedy speculative output equals plain output, alone and with two sequences drafting together; the oracle
    records the head's proposals and simulate replays n_max 1..5 exactly."""
    target, head = files["partial"]
    with mx.Session.open(target, draft_model=head, n_ctx=1024, threads=1, n_parallel=2) as s:
        alone = []
        for prompt in PROMPTS[:2]:
            plain = s.generate(prompt, max_tokens=40, n_max=0)
            alone.append(s.generate(prompt, max_tokens=40, n_max=3))
            assert alone[-1].tokens == plain.tokens and alone[-1].n_accepted.sum() > 0
        together = s.generate_parallel(list(PROMPTS[:2]), max_tokens=40, n_max=3)
        for a, t in zip(alone, together.traces):
            assert t.tokens == a.tokens and t.n_drafted.tolist() == a.n_drafted.tolist()
        note = mx.plots.rs_slots(alone[0]).layout.annotations[0].text
        assert "shared-memory MTP head" in note and "write none of their own" in note
        oracle = s.record_oracle(PROMPT, max_tokens=40, depth=5, probe=False, batch_shift=False)
        for n_max in (1, 3, 5):
            sim, real = mx.simulate(oracle, n_max), s.generate(PROMPT, max_tokens=40, n_max=n_max)
            assert sim.n_drafted.tolist() == real.n_drafted.tolist(), n_max
            assert sim.n_accepted.tolist() == real.n_accepted.tolist(), n_max


@pytest.mark.server
def test_the_shared_memory_head_matches_llama_server_with_two_slots(files, server_binary):
    """llama-server -np 2 -md HEAD --spec-type draft-mtp: each request's text and draft counters equal our two
    sequences run as its slots (replay_server_parallel)."""
    from mtp_explorer.devtools.reference import compare_with_server, replay_server_parallel
    from mtp_explorer.server import LlamaServer

    target, head = files["partial"]
    batch = list(PROMPTS[:2])
    with LlamaServer(
        target,
        n_parallel=2,
        n_ctx=2048,
        threads=1,
        spec_type="draft-mtp",
        n_max=3,
        draft_model=head,
        binary=server_binary,
    ) as srv:
        answers = srv.client().complete_many(batch, 48)
    with mx.Session.open(target, draft_model=head, n_ctx=2048, threads=1, n_parallel=2) as s:
        ours = replay_server_parallel(s, batch, n_predict=48, n_max=3)
    for prompt, done, trace in zip(batch, answers, ours.traces):
        result = compare_with_server(done, trace)
        assert result["match"] and done.draft_n_accepted > 0, (prompt, result)


def test_a_head_file_alone_or_one_that_does_not_fit_is_refused(files, tmp_path):
    target, head = files["perfect"]
    with pytest.raises(mx.ParameterError, match="MTP head file: it runs only against its target"):
        mx.Session.open(head, n_ctx=256, threads=1)
    _, wide_head = write_synthetic_gemma4(tmp_path / "wide.gguf", n_embd=48)
    with pytest.raises(mx.ModelLoadError, match="width 48"):
        mx.Session.open(target, draft_model=wide_head, n_ctx=256, threads=1)


def test_the_target_alone_decodes_without_mtp(files):
    target, _ = files["partial"]
    with mx.Session.open(target, n_ctx=256, threads=1) as s:
        assert s.info.mtp_mode is None
        plain = s.generate(PROMPT, max_tokens=16, n_max=0)
        assert len(plain.tokens) == 16 and all(c == "\n" or 32 <= ord(c) < 127 for c in plain.text)
        with pytest.raises(mx.MtpUnavailableError, match="no MTP layers"):
            s.generate(PROMPT, max_tokens=16, n_max=3, drafter="draft-mtp")
