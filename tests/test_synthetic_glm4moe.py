"""SYNTHETIC glm4moe + MTP GGUF (a non-recurrent MTP model): file layout, loading in llama.cpp,
greedy speculative == greedy plain with plain KV rollback, and the acceptance knobs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import pooled_runs

from mtp_explorer.models.synthetic_glm4moe import (
    glm4moe_config,
    glm4moe_expected_tensor_shapes,
    write_synthetic_glm4moe,
)

PROMPTS = ["def f(x):", "import os\n", "class A:\n    pass\n"]
N_MAX = (1, 2, 3, 5)
P_MIN = (0.0, 0.5)
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic_glm4moe")
    files = {
        "perfect": write_synthetic_glm4moe(d / "perfect.gguf", context_mix=0.0, mtp_fidelity=1.0),
        "partial": write_synthetic_glm4moe(d / "partial.gguf", context_mix=0.5, mtp_fidelity=1.0),
        "random": write_synthetic_glm4moe(d / "random.gguf", context_mix=0.0, mtp_fidelity=0.0),
    }
    # Load once in a fresh interpreter first, so that a llama.cpp abort fails the tests
    # instead of taking the pytest process down.
    code = f"""
        import mtp_explorer as mx
        with mx.Session.open({str(files["partial"])!r}, n_ctx=256, threads=1) as s:
            t = s.generate("def f(x):", max_tokens=8, n_max=3)
            print("ok", len(t.tokens))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or "ok 8" not in proc.stdout:
        pytest.fail(
            f"llama.cpp cannot run the synthetic glm4moe file (rc={proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return files


@pytest.fixture(scope="module")
def sessions(files):
    import mtp_explorer as mx

    opened = {k: mx.Session.open(p, n_ctx=512, threads=1) for k, p in files.items()}
    yield opened
    for s in opened.values():
        s.close()


def _check_accounting(t) -> None:
    assert len(t.tokens) == int(t.n_accepted.sum()) + t.n_steps
    assert (t.n_accepted <= t.n_drafted).all()
    assert (t.rollback == t.n_drafted - t.n_accepted).all()
    assert (t.rs_slot == -1).all()  # no recurrent state: rollback is KV-cache removal only
    assert all(s.rs_slot is None for s in t.steps)
    assert [tok for s in t.steps for tok in s.tokens] == t.tokens


def test_write_is_small_and_deterministic(tmp_path):
    a = write_synthetic_glm4moe(tmp_path / "a.gguf", seed=3, context_mix=0.5, mtp_fidelity=0.7)
    assert a.stat().st_size < 2 * 1024 * 1024
    b = write_synthetic_glm4moe(tmp_path / "b.gguf", seed=3, context_mix=0.5, mtp_fidelity=0.7)
    c = write_synthetic_glm4moe(tmp_path / "c.gguf", seed=4, context_mix=0.5, mtp_fidelity=0.7)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_knob_validation(tmp_path):
    with pytest.raises(ValueError):
        write_synthetic_glm4moe(tmp_path / "x.gguf", context_mix=-0.1)
    with pytest.raises(ValueError):
        write_synthetic_glm4moe(tmp_path / "x.gguf", mtp_fidelity=1.5)


def test_metadata_and_tensors(files):
    import gguf

    cfg = glm4moe_config()
    reader = gguf.GGUFReader(str(files["partial"]))
    md = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert md["general.architecture"] == "glm4moe"
    assert md["glm4moe.block_count"] == cfg.n_layer + 1 == 3
    assert md["glm4moe.nextn_predict_layers"] == 1
    assert md["glm4moe.leading_dense_block_count"] == 1
    assert md["glm4moe.expert_count"] == cfg.n_expert
    assert md["glm4moe.expert_used_count"] == cfg.n_expert_used
    assert md["glm4moe.expert_shared_count"] == cfg.n_expert_shared
    assert md["glm4moe.expert_feed_forward_length"] == cfg.n_ff_exp
    assert md["glm4moe.expert_gating_func"] == int(gguf.ExpertGatingFuncType.SIGMOID)
    assert not any(k.startswith("glm4moe.ssm.") for k in md)
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert len(md["tokenizer.ggml.tokens"]) == cfg.n_vocab
    assert md["mtp_explorer.synthetic"] is True
    assert md["mtp_explorer.context_mix"] == pytest.approx(0.5)

    found = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    for name, (shape, required) in glm4moe_expected_tensor_shapes(cfg).items():
        if required:
            assert found[name] == shape, name
        elif name in found:
            assert found[name] == shape, name
    assert "blk.0.ffn_up.weight" in found and "blk.0.ffn_up_exps.weight" not in found  # dense lead layer
    assert found["blk.1.ffn_up_exps.weight"] == (cfg.n_expert, cfg.n_ff_exp, cfg.n_embd)
    assert found["blk.2.nextn.eh_proj.weight"] == (cfg.n_embd, 2 * cfg.n_embd)
    assert "blk.2.ffn_gate_inp.weight" in found  # the MTP block is a MoE block


def test_loads_non_recurrent_with_mtp(sessions):
    s = sessions["partial"]
    assert s.info.arch == "glm4moe"
    assert s.info.is_recurrent is False
    assert s.info.has_mtp is True
    assert s.info.n_layer == 2 and s.info.n_layer_nextn == 1
    assert s.info.rs_slot_bytes == 0
    assert s.detokenize(s.tokenize("def f(x):\n")) == "def f(x):\n"
    t = s.generate("def f(x):", max_tokens=32, n_max=3)
    assert len(t.tokens) == 32 and len(set(t.tokens)) > 4
    assert all(c == "\n" or 32 <= ord(c) < 127 for c in t.text)


@pytest.mark.parametrize("kind", ["perfect", "partial"])
def test_greedy_speculative_equals_plain(sessions, kind):
    s = sessions[kind]
    for prompt in PROMPTS:
        base = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=0)
        assert len(base.tokens) == base.n_steps == MAX_TOKENS
        _check_accounting(base)
        for n_max in N_MAX:
            for p_min in P_MIN:
                t = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=n_max, p_min=p_min)
                assert t.tokens == base.tokens, (kind, prompt, n_max, p_min)
                _check_accounting(t)
                assert (t.n_drafted <= n_max).all()


def _pooled(s, n_max):
    return pooled_runs(s, PROMPTS, MAX_TOKENS, n_max, ("rollback", "n_drafted", "n_accepted"))


def test_acceptance_knobs(sessions):
    acc, rollback, _, _ = _pooled(sessions["perfect"], 3)
    assert acc == 1.0 and (rollback == 0).all()

    acc, _, _, _ = _pooled(sessions["random"], 3)
    assert acc < 0.05

    acc, rollback, n_drafted, n_accepted = _pooled(sessions["partial"], 3)
    assert 0.3 < acc < 0.95
    drafting = n_drafted > 0
    assert (drafting & (rollback == 0)).any()  # some steps fully accepted
    assert (rollback > 0).any()  # some steps rolled back
    assert ((n_accepted > 0) & (n_accepted < n_drafted)).any()  # partial rejections
