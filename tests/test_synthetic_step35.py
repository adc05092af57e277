"""SYNTHETIC step35 model with 3 chained MTP heads (llama.cpp's chained-head draft-mtp mode): the file, model_info,
llama.cpp's reference drafting and accepting with it (head by head), the synth command, and the engine's chained
mode against llama-speculative-simple."""

from __future__ import annotations

import gguf
import pytest

import mtp_explorer as mx
from mtp_explorer.cli import main
from mtp_explorer.devtools.reference import run_reference_spec
from mtp_explorer.models.synthetic_step35 import step35_config, step35_expected_tensor_shapes, write_synthetic_step35

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic_step35")
    return {
        "perfect": write_synthetic_step35(d / "perfect.gguf"),
        "partial": write_synthetic_step35(d / "partial.gguf", context_mix=0.5),
        "random": write_synthetic_step35(d / "random.gguf", mtp_fidelity=0.0),
        "first_head_only": write_synthetic_step35(d / "first.gguf", head_fidelity=(1.0, 0.0, 0.0)),
    }


def _reference(binary, model, n_max=3, max_tokens=32):
    return run_reference_spec(
        binary,
        model,
        PROMPT,
        ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)],
        max_tokens=max_tokens,
        n_ctx=512,
        threads=1,
    )


# -- the file -----------------------------------------------------------------------------------------
def test_write_is_small_and_deterministic(tmp_path):
    a = write_synthetic_step35(tmp_path / "a.gguf", seed=3, context_mix=0.5)
    assert a.stat().st_size < 2 * 1024 * 1024
    b = write_synthetic_step35(tmp_path / "b.gguf", seed=3, context_mix=0.5)
    c = write_synthetic_step35(tmp_path / "c.gguf", seed=4, context_mix=0.5)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_knob_and_config_validation(tmp_path):
    with pytest.raises(mx.ParameterError, match="head_fidelity needs 3 values"):
        write_synthetic_step35(tmp_path / "x.gguf", head_fidelity=(1.0, 0.5))
    with pytest.raises(mx.ParameterError, match="head_fidelity"):
        write_synthetic_step35(tmp_path / "x.gguf", head_fidelity=(1.0, 0.5, 1.5))
    with pytest.raises(mx.ParameterError):
        write_synthetic_step35(tmp_path / "x.gguf", mtp_fidelity=1.5)
    with pytest.raises(mx.ParameterError, match="full attention"):
        step35_config(swa_layers=(0, 1))


def test_metadata_and_tensors(files):
    cfg = step35_config()
    reader = gguf.GGUFReader(str(files["partial"]))
    md = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert md["general.architecture"] == "step35"
    assert md["step35.block_count"] == cfg.n_layer + 3 == 5
    assert md["step35.nextn_predict_layers"] == 3
    assert md["step35.attention.sliding_window_pattern"] == [True, False, False, False, False]
    assert md["mtp_explorer.synthetic"] is True and "SYNTHETIC" in md["general.description"]
    found = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    assert set(found) <= set(step35_expected_tensor_shapes(cfg))
    for head in (2, 3, 4):  # one full decoder block with its NextN wiring per head
        assert found[f"blk.{head}.nextn.eh_proj.weight"] == (cfg.n_embd, 2 * cfg.n_embd)
        assert f"blk.{head}.ffn_gate_inp.weight" in found and f"blk.{head}.attn_gate.weight" in found


def test_model_info_reports_chained_heads(files):
    info = mx.model_info(files["perfect"])
    assert (info.arch, info.n_layer, info.n_layer_nextn, info.has_mtp) == ("step35", 2, 3, True)
    assert (info.mtp_mode, info.n_mtp_heads, info.is_mtp_head_file) == ("chained", 3, False)
    assert info.moe_layers == (1, 2, 3, 4)


# -- llama.cpp's reference --------------------------------------------------------------------------------
@pytest.mark.reference
def test_reference_drafts_and_accepts_with_each_head(files, reference_binary):
    perfect = _reference(reference_binary, files["perfect"])
    assert perfect.n_drafted > 0 and perfect.n_accept == perfect.n_drafted
    # llama.cpp caps n_max at the number of chained heads: n_max 5 drafts as n_max 3
    capped = _reference(reference_binary, files["perfect"], n_max=5)
    assert (capped.text, capped.n_drafted, capped.n_accept) == (perfect.text, perfect.n_drafted, perfect.n_accept)
    partial = _reference(reference_binary, files["partial"])
    assert 0 < partial.n_accept < partial.n_drafted
    random = _reference(reference_binary, files["random"])
    assert random.n_drafted > 0 and random.n_accept == 0
    # depth i is drafted by head i: a perfect first head and random later ones accept about one token per draft
    first = _reference(reference_binary, files["first_head_only"])
    n_drafts = first.n_drafted // 3
    assert 0 < first.n_accept < first.n_drafted
    assert abs(first.n_accept - n_drafts) <= 2


# -- the synth command ------------------------------------------------------------------------------------
def test_synth_writes_the_model_and_prints_its_path(tmp_path, capsys):
    assert main(["synth", "--arch", "step35", "--out", str(tmp_path / "models")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(tmp_path / "models" / "synthetic-step35.gguf")]
    assert mx.model_info(lines[0]).mtp_mode == "chained"


def test_synth_errors(tmp_path, capsys):
    assert main(["synth", "--arch", "llama", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().out
    assert "unknown architecture 'llama'" in err and "qwen35, qwen35moe, glm4moe, step35, gemma4" in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "file").write_text("")
    assert main(["synth", "--arch", "step35", "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().out
    assert main(["synth", "--arch", "step35", "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot create the folder" in capsys.readouterr().out


# -- the engine -------------------------------------------------------------------------------------------
PROMPTS = ("def f(x):", "import os\n", "class A:\n    pass\n")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Heads that agree with the trunk less and less deep: acceptance by depth falls head by head."""
    return write_synthetic_step35(
        tmp_path_factory.mktemp("step35_mixed") / "mixed.gguf", head_fidelity=(0.9, 0.6, 0.3), context_mix=0.25
    )


@pytest.mark.parametrize("n_max", [1, 2, 3, 5])
@pytest.mark.reference
def test_chained_heads_match_llama_speculative_simple(reference_binary, mixed, n_max):
    """Head i drafts depth i (llama_set_nextn_layer_offset), each head rebuilding its layer's memory, as llama.cpp's
    draft-mtp driver in its chained mode: text and drafted/accepted totals equal llama-speculative-simple's, and
    n_max above the 3 heads drafts 3, as llama.cpp caps it."""
    from mtp_explorer.devtools.reference import compare_with_reference, replay_reference_budget, spec_type_args

    with mx.Session.open(mixed, n_ctx=1024, threads=1) as s:
        for prompt in PROMPTS:
            ours = replay_reference_budget(s, prompt, max_tokens=48, n_max=n_max)
            ref = run_reference_spec(
                reference_binary,
                mixed,
                prompt,
                spec_type_args("draft-mtp", n_max, {}),
                max_tokens=48,
                n_ctx=1024,
                threads=1,
            )
            result = compare_with_reference(ref, ours, 0.0)
            assert result["match"], (n_max, prompt, result)
            assert int(ours.n_drafted.max()) == min(n_max, 3)


def test_chained_heads_greedy_equals_plain_and_accept_head_by_head(mixed, files):
    """Greedy speculative output equals plain output; acceptance by depth follows the heads' fidelity, and a file whose
    later heads are random accepts only depth 1 (the heads really are chained, not head 0 at every depth)."""
    with mx.Session.open(mixed, n_ctx=1024, threads=1) as s:
        for prompt in PROMPTS:
            plain = s.generate(prompt, max_tokens=48, n_max=0)
            spec = s.generate(prompt, max_tokens=48, n_max=3)
            assert spec.tokens == plain.tokens, prompt
    with mx.Session.open(files["first_head_only"], n_ctx=1024, threads=1) as s:
        t = s.generate(PROMPT, max_tokens=48, n_max=3)
        by_depth = t.to_pandas()
        drafted3 = by_depth[by_depth["n_drafted"] == 3]
        assert len(drafted3) > 0 and (drafted3["n_accepted"] == 1).all()
        # per head, in the summary and the figure: head 1 accepts everything, heads 2 and 3 nothing
        assert t.summary()["acceptance_by_head"] == [1.0, 0.0, 0.0]
        fig = mx.plots.acceptance_by_depth(t)
        assert list(fig.layout.xaxis.ticktext) == ["1<br>head 1", "2<br>head 2", "3<br>head 3"]


def test_chained_heads_replay_exactly(mixed):
    """The oracle records each head's proposal: simulate replays n_max 1..5 exactly against real runs."""
    with mx.Session.open(mixed, n_ctx=1024, threads=1) as s:
        oracle = s.record_oracle(PROMPT, max_tokens=40, depth=5, probe=False, batch_shift=False)
        for n_max in (1, 2, 3, 5):
            sim = mx.simulate(oracle, n_max)
            real = s.generate(PROMPT, max_tokens=40, n_max=n_max)
            assert sim.n_drafted.tolist() == real.n_drafted.tolist(), n_max
            assert sim.n_accepted.tolist() == real.n_accepted.tolist(), n_max


@pytest.mark.server
def test_chained_heads_match_llama_server_with_two_slots(mixed, server_binary):
    """llama-server -np 2 --spec-type draft-mtp on the chained model: each request's text and draft counters equal
    our two sequences run as its slots (replay_server_parallel)."""
    from mtp_explorer.devtools.reference import compare_with_server, replay_server_parallel
    from mtp_explorer.server import LlamaServer

    batch = list(PROMPTS[:2])
    with LlamaServer(
        mixed, n_parallel=2, n_ctx=2048, threads=1, spec_type="draft-mtp", n_max=3, binary=server_binary
    ) as srv:
        answers = srv.client().complete_many(batch, 48)
    with mx.Session.open(mixed, n_ctx=2048, threads=1, n_parallel=2) as s:
        ours = replay_server_parallel(s, batch, n_predict=48, n_max=3)
    for prompt, done, trace in zip(batch, answers, ours.traces):
        result = compare_with_server(done, trace)
        assert result["match"] and done.draft_n_accepted > 0, (prompt, result)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "glm4moe"])
def test_model_info_reports_a_single_head_for_the_other_writers(arch, tmp_path):
    from mtp_explorer.models.synth import SYNTH_ARCHS, write_synth

    (path,) = write_synth(arch, tmp_path)
    info = mx.model_info(path)
    assert (info.arch, info.mtp_mode, info.n_mtp_heads, info.is_mtp_head_file) == (arch, "single", 1, False)
    assert SYNTH_ARCHS[arch][0] == "single"


def test_model_info_of_the_bundled_model_reports_a_single_head():
    info = mx.model_info(mx.default_model_path())
    assert (info.mtp_mode, info.n_mtp_heads) == ("single", 1)
