"""SYNTHETIC qwen35moe + MTP GGUF (the Qwen3.6-35B-A3B architecture at toy scale: hybrid recurrent trunk,
MoE in every block, the MTP block included): file layout, model_info, loading in llama.cpp, greedy speculative
== greedy plain with recurrent snapshot-slot rollback, the acceptance knobs, telemetry, the oracle replay and
the Explorer."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from conftest import check_accounting, pooled_runs, run_isolated

import mtp_explorer as mx
from mtp_explorer.models.synthetic_qwen35moe import (
    Qwen35MoeConfig,
    qwen35moe_config,
    qwen35moe_expected_tensor_shapes,
    write_synthetic_qwen35moe,
)

PROMPTS = ["def f(x):", "import os\n", "class A:\n    pass\n"]
N_MAX = (1, 2, 3, 4)
P_MIN = (0.0, 0.5)
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic_qwen35moe")
    files = {
        "perfect": write_synthetic_qwen35moe(d / "perfect.gguf", context_mix=0.0, mtp_fidelity=1.0),
        "partial": write_synthetic_qwen35moe(d / "partial.gguf", context_mix=0.5, mtp_fidelity=1.0),
        "random": write_synthetic_qwen35moe(d / "random.gguf", context_mix=0.0, mtp_fidelity=0.0),
        "f16": write_synthetic_qwen35moe(d / "f16.gguf", context_mix=0.5, mtp_fidelity=1.0, dtype="f16"),
    }
    # Load once in a fresh interpreter first, so that a llama.cpp abort fails the tests
    # instead of taking the pytest process down.
    proc = run_isolated(f"""
        import mtp_explorer as mx
        for path in {[str(files["partial"]), str(files["f16"])]!r}:
            with mx.Session.open(path, n_ctx=256, threads=1) as s:
                t = s.generate("def f(x):", max_tokens=8, n_max=3)
                print("ok", len(t.tokens))
    """)
    if proc.returncode != 0 or proc.stdout.count("ok 8") != 2:
        pytest.fail(
            f"llama.cpp cannot run the synthetic qwen35moe file (rc={proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return files


@pytest.fixture(scope="module")
def sessions(files):
    opened = {k: mx.Session.open(p, n_ctx=512, threads=1) for k, p in files.items()}
    yield opened
    for s in opened.values():
        s.close()


# -- the file -----------------------------------------------------------------------------------------
def test_write_is_small_and_deterministic(tmp_path):
    a = write_synthetic_qwen35moe(tmp_path / "a.gguf", seed=3, context_mix=0.5, mtp_fidelity=0.7)
    assert a.stat().st_size < 2 * 1024 * 1024
    b = write_synthetic_qwen35moe(tmp_path / "b.gguf", seed=3, context_mix=0.5, mtp_fidelity=0.7)
    c = write_synthetic_qwen35moe(tmp_path / "c.gguf", seed=4, context_mix=0.5, mtp_fidelity=0.7)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_knob_and_config_validation(tmp_path):
    with pytest.raises(ValueError):
        write_synthetic_qwen35moe(tmp_path / "x.gguf", context_mix=-0.1)
    with pytest.raises(ValueError):
        write_synthetic_qwen35moe(tmp_path / "x.gguf", mtp_fidelity=1.5)
    with pytest.raises(ValueError):
        qwen35moe_config(n_expert=4, n_expert_used=5)
    with pytest.raises(ValueError):
        qwen35moe_config(nextn_predict_layers=2)
    assert isinstance(qwen35moe_config(), Qwen35MoeConfig)


def test_metadata_and_tensors(files):
    import gguf

    cfg = qwen35moe_config()
    reader = gguf.GGUFReader(str(files["f16"]))
    md = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert md["general.architecture"] == "qwen35moe"
    assert md["qwen35moe.block_count"] == cfg.n_layer + 1 == 5
    assert md["qwen35moe.nextn_predict_layers"] == 1
    assert md["qwen35moe.expert_count"] == cfg.n_expert == 8
    assert md["qwen35moe.expert_used_count"] == cfg.n_expert_used == 2
    assert md["qwen35moe.expert_feed_forward_length"] == cfg.n_ff_exp
    assert md["qwen35moe.expert_shared_feed_forward_length"] == cfg.n_ff_shexp
    assert md["qwen35moe.full_attention_interval"] == 4
    assert md["qwen35moe.ssm.group_count"] == 2 and md["qwen35moe.ssm.time_step_rank"] == 4  # 2 key, 4 value heads
    assert md["qwen35moe.ssm.inner_size"] == cfg.ssm_inner_size
    assert md["qwen35moe.rope.dimension_count"] == cfg.n_rot == cfg.head_dim // 4
    assert list(md["qwen35moe.rope.dimension_sections"]) == list(cfg.sections)
    assert md["tokenizer.ggml.model"] == "gpt2" and len(md["tokenizer.ggml.tokens"]) == cfg.n_vocab
    assert md["mtp_explorer.synthetic"] is True
    assert md["mtp_explorer.context_mix"] == pytest.approx(0.5)

    found = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    types = {t.name: t.tensor_type for t in reader.tensors}
    for name, (shape, required) in qwen35moe_expected_tensor_shapes(cfg).items():
        if required or name in found:
            assert found[name] == shape, name
    assert not any(".ffn_up.weight" in n or ".ffn_gate.weight" in n for n in found)  # no dense FFN anywhere
    for il in range(cfg.block_count):  # every block is MoE with a shared expert, the MTP block included
        assert found[f"blk.{il}.ffn_up_exps.weight"] == (cfg.n_expert, cfg.n_ff_exp, cfg.n_embd)
        assert found[f"blk.{il}.ffn_gate_inp_shexp.weight"] == (cfg.n_embd,)
    assert "blk.0.ssm_a" in found and "blk.3.attn_q.weight" in found and "blk.3.ssm_a" not in found
    assert found["blk.4.nextn.eh_proj.weight"] == (cfg.n_embd, 2 * cfg.n_embd)
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert types["blk.0.ffn_down_exps.weight"] == F16 and types["blk.4.ffn_up_shexp.weight"] == F16
    assert types["blk.0.ffn_gate_inp.weight"] == F32  # the router stays F32, as convert_hf_to_gguf does
    assert types["blk.0.ffn_gate_inp_shexp.weight"] == F32 and types["blk.0.ssm_conv1d.weight"] == F32


def test_model_info(files, sessions):
    cfg = qwen35moe_config()
    info = mx.model_info(files["partial"])
    assert (info.arch, info.n_layer, info.n_layer_nextn, info.n_embd, info.n_vocab) == ("qwen35moe", 4, 1, 64, 384)
    assert info.has_mtp and info.is_recurrent and info.rs_slot_bytes > 0
    assert (info.n_expert, info.n_expert_used, info.n_ff_exp) == (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp)
    assert info.moe_layers == tuple(range(cfg.block_count))
    assert info.experts_label() == "MoE 8 experts (2 used) in blocks 0-3, MTP block 4"
    assert mx.model_info(mx.default_model_path()).experts_label() == "dense"
    from mtp_explorer.ui.explorer import Explorer

    assert "MoE 8 experts (2 used) in blocks 0-3, MTP block 4" in Explorer(sessions["partial"]).children[0].value
    s = sessions["partial"]
    assert s.info == info
    assert s.detokenize(s.tokenize("def f(x):\n")) == "def f(x):\n"
    t = s.generate("def f(x):", max_tokens=32, n_max=3)
    assert len(t.tokens) == 32 and len(set(t.tokens)) > 4
    assert all(c == "\n" or 32 <= ord(c) < 127 for c in t.text)
    assert t.summary()["rs_slot_bytes"] == info.rs_slot_bytes


# -- greedy equivalence and rollback ------------------------------------------------------------------
def _check_recurrent_rollback(t: mx.Trace) -> None:
    check_accounting(t)  # on a recurrent model: rs_slot == rollback when something was rolled back
    assert t.model["is_recurrent"]
    rolled = t.rollback > 0
    assert (t.rs_slot[rolled] == t.rollback[rolled]).all() and (t.rs_slot[~rolled] == -1).all()


@pytest.mark.parametrize("kind", ["perfect", "partial", "f16"])
def test_greedy_speculative_equals_plain(sessions, kind):
    s = sessions[kind]
    for prompt in PROMPTS:
        base = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=0)
        assert len(base.tokens) == base.n_steps == MAX_TOKENS
        check_accounting(base)
        for n_max in N_MAX:
            for p_min in P_MIN:
                t = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=n_max, p_min=p_min)
                # no tie allowance: a divergence fails here with its case
                assert t.tokens == base.tokens, (kind, prompt, n_max, p_min)
                _check_recurrent_rollback(t)
                assert (t.n_drafted <= n_max).all()


# -- acceptance by construction -----------------------------------------------------------------------
def _pooled(s, n_max):
    return pooled_runs(s, PROMPTS, MAX_TOKENS, n_max, ("rollback", "n_drafted", "n_accepted", "rs_slot"))


def test_acceptance_knobs(sessions):
    acc, rollback, _, _, rs_slot = _pooled(sessions["perfect"], 3)
    assert acc == 1.0 and (rollback == 0).all() and (rs_slot == -1).all()

    acc, rollback, _, _, rs_slot = _pooled(sessions["random"], 3)
    assert acc < 0.05
    assert (rs_slot[rollback > 0] == rollback[rollback > 0]).all()

    acc, rollback, n_drafted, n_accepted, rs_slot = _pooled(sessions["partial"], 3)
    assert 0.3 < acc < 0.95
    drafting = n_drafted > 0
    assert (drafting & (rollback == 0)).any()  # some steps fully accepted
    assert (rollback > 0).any()  # some steps rolled back ...
    slots = set(np.unique(rs_slot[rollback > 0]).tolist())
    assert slots <= {1, 2, 3} and len(slots) >= 2  # ... restoring the snapshot slot of the rollback's length
    assert ((n_accepted > 0) & (n_accepted < n_drafted)).any()  # partial rejections

    # n_max=1: high fidelity is high acceptance, no fidelity none
    assert _pooled(sessions["partial"], 1)[0] > 0.6
    assert _pooled(sessions["random"], 1)[0] < 0.05


# -- telemetry ----------------------------------------------------------------------------------------
def test_telemetry_columns(sessions):
    s = sessions["partial"]
    t = s.generate("def f(x):", max_tokens=60, n_max=4, p_min=0.1)
    n, D = t.n_steps, s.capacity
    c = t.columns
    assert c["drafted"].shape == c["draft_prob"].shape == c["draft_target_cos"].shape == (n, D)
    assert c["target_tokens"].shape == c["h_norm_target"].shape == (n, D + 1)
    real = np.arange(D)[None, :] < c["n_drafted"][:, None]
    assert ((c["drafted"] >= 0) == real).all()
    probs = c["draft_prob"][real]
    assert ((probs > 0) & (probs <= 1)).all() and np.isnan(c["draft_prob"][~real]).all()
    assert (c["topk_ids"][..., 0][real] == c["drafted"][real]).all()
    cos = c["draft_target_cos"][real]
    assert ((cos >= -1.0001) & (cos <= 1.0001)).all()
    real_t = np.arange(D + 1)[None, :] <= c["n_drafted"][:, None]
    h = c["h_norm_target"][real_t]
    assert not np.isnan(h).any() and h.std() > 0.01 * h.mean() > 0  # pre-norm: the residual varies
    assert (c["h_norm_draft"][real] > 0).all()
    assert (c["t_verify_ns"] > 0).all() and (c["t_draft_ns"][c["n_drafted"] > 0] > 0).all()
    assert (np.diff(c["pos"]) == c["n_accepted"][:-1] + 1).all()
    _check_recurrent_rollback(t)
    summary = t.summary()
    assert summary["n_tokens"] == 60 and summary["finish_reason"] == "budget"
    assert math.isclose(summary["acceptance_rate"], summary["n_accepted"] / summary["n_drafted"])
    assert summary["rs_slot_bytes"] == s.info.rs_slot_bytes > 0


# -- the oracle and the simulator ---------------------------------------------------------------------
def test_oracle_and_simulate_replay_the_real_run(sessions):
    s = sessions["partial"]
    found = {"cases": 0, "exact": 0, "ties": [], "unexplained": []}
    for prompt in PROMPTS[:2]:
        o = s.record_oracle(prompt, max_tokens=MAX_TOKENS, depth=4)
        assert o.tokens == s.generate(prompt, max_tokens=MAX_TOKENS, n_max=0).tokens
        for n_max in N_MAX:
            for p_min in P_MIN:
                real = s.generate(prompt, max_tokens=MAX_TOKENS, n_max=n_max, p_min=p_min)
                sim = mx.simulate(o, n_max=n_max, p_min=p_min)
                cmp = mx.compare(o, real)
                case = {"prompt": prompt, "n_max": n_max, "p_min": p_min}
                for m in cmp.mismatches:
                    found["ties" if m["kind"] == "tie" else "unexplained"].append(case | m)
                if cmp.exact:
                    assert sim.tokens == real.tokens, case
                    for name in ("n_drafted", "n_accepted", "drafted", "stop_reason", "correction", "rollback"):
                        assert np.array_equal(sim.columns[name], real.columns[name]), (case, name)
                    found["exact"] += 1
                found["cases"] += 1
    assert not found["unexplained"], found["unexplained"][:3]
    if found["ties"]:
        warnings.warn(
            f"{len(found['ties'])} floating-point argmax ties between real runs and the oracle: {found['ties'][:2]}"
        )
    assert found["exact"] >= found["cases"] - 1


# -- the Explorer -------------------------------------------------------------------------------------
def test_explorer_opens_and_runs(files):
    from mtp_explorer.widgets import Explorer

    ex = Explorer(mx.Session.open(files["partial"], threads=1))  # one thread: robust on a busy machine
    try:
        assert ex.controls.drafter.value == "draft-mtp"  # the model has an MTP head
        ex.run()
        assert ex.wait(60)
        assert ex.state == "idle" and ex.error == "" and ex.finish_reason == "budget"
        assert ex.n_tokens == ex.controls.max_tokens.value > 0
        assert (
            ex.trace.tokens
            == ex.session.generate(
                ex.controls.prompt.value, max_tokens=ex.n_tokens, n_max=ex.controls.n_max.value
            ).tokens
        )
        assert np.array(ex.figures["rs_slots"].data[0].z).shape == (ex.session.capacity + 1, ex.n_steps)
    finally:
        ex.session.close()
