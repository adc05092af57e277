"""Demo model step 2: the function-preserving growth, the loop term, the checkpoint format and the committed stretch."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from training.corpus import load_corpus, package_root, split_corpus  # noqa: E402
from training.grow import grow, placement  # noqa: E402
from training.model import DemoModel, ModelConfig  # noqa: E402
from training.trunk import (  # noqa: E402
    CHECKPOINT,
    CORPUS_PACKAGES,
    load,
    repeat_candidates,
    save,
    sequence_unlikelihood,
    unlikelihood,
)

pytestmark = pytest.mark.train

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    eos_token_id=63,
)


def _small_model() -> DemoModel:
    torch.manual_seed(0)
    m = DemoModel(ModelConfig(**SMALL)).eval()
    with torch.no_grad():  # non-trivial norms and output projections
        for p in m.parameters():
            if p.ndim == 1:
                p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("n_new", [8, 12, 16])
def test_placement_keeps_order_and_layer_types(n_new):
    old = ModelConfig(num_hidden_layers=4).layer_types
    new = ModelConfig(num_hidden_layers=n_new).layer_types
    where = placement(old, new)
    assert where == sorted(set(where)) and len(where) == 4
    assert [new[p] for p in where] == old
    assert where[-1] == n_new - 1  # the last layer stays last


def test_placement_refuses_to_shrink():
    with pytest.raises(ValueError):
        placement(["linear_attention"] * 3, ["linear_attention"] * 2)


@pytest.mark.parametrize("n_new", [8, 12])
def test_grown_model_computes_exactly_what_the_old_one_did(n_new):
    old = _small_model()
    new, where = grow(old, n_new)
    new.eval()
    assert new.cfg.num_hidden_layers == n_new
    ids = torch.randint(0, 63, (2, 40))
    with torch.no_grad():
        a, b = old(ids), new(ids)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    fresh = [i for i in range(n_new) if i not in where]
    assert fresh and all(float(new.trunk.model.layers[i].mlp.down_proj.weight.abs().sum()) == 0 for i in fresh)
    # the new layers learn: one step moves their output projections off zero
    new.train()
    tl, ml = new(ids)
    (tl.float().logsumexp(-1).mean() + ml.float().logsumexp(-1).mean()).backward()
    assert float(new.trunk.model.layers[fresh[0]].mlp.down_proj.weight.grad.abs().sum()) > 0


def _repeat_candidates_reference(x: np.ndarray, n: int) -> np.ndarray:
    out = np.full(x.shape, -1)
    for r, row in enumerate(x):
        last: dict[tuple, int] = {}
        for t in range(len(row)):
            if t >= n - 1:
                gram = tuple(row[t - n + 1 : t + 1])
                if gram in last:
                    out[r, t] = row[last[gram] + 1]
                last[gram] = t
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_repeat_candidates_match_a_direct_scan(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 4, size=(3, 200))  # a small alphabet repeats n-grams often
    got = repeat_candidates(torch.from_numpy(x), n, 64).numpy()
    assert (got >= 0).sum() > 10
    np.testing.assert_array_equal(got, _repeat_candidates_reference(x, n))


def test_unlikelihood_is_zero_without_repeats_and_penalises_a_wrong_copy():
    v = 16
    x = torch.arange(12)[None]  # no n-gram repeats
    logits = torch.zeros(1, 12, v)
    loss, share = unlikelihood(logits, x, 2)
    assert float(loss) == 0 and share == 0
    x = torch.tensor([[1, 2, 3, 1, 2, 5]])  # "1 2" came before, followed by 3; now 5 follows
    logits = torch.zeros(1, 6, v)
    low, _ = unlikelihood(logits, x, 2)
    logits[0, 4, 3] = 5.0  # the model would copy 3 at the repeat
    high, share = unlikelihood(logits, x, 2)
    assert float(high) > float(low) > 0 and share == pytest.approx(1 / 5)


def test_sequence_unlikelihood_penalises_every_repeat_of_the_generated_part_only():
    v = 16
    x = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 3]])  # a loop of period 3
    logits = torch.zeros(1, 9, v)
    # generated part from index 6: positions 5..7 predict x[6..8]; each has a candidate (the loop's next token)
    loss, share = sequence_unlikelihood(logits, x, 2, start=6)
    assert share == 1.0 and float(loss) == pytest.approx(-np.log1p(-1 / v), rel=1e-5)
    logits[0, 6, 2] = 5.0  # more weight on the loop's next token at a generated position: a larger loss
    assert float(sequence_unlikelihood(logits, x, 2, start=6)[0]) > float(loss)
    before = logits.clone()
    logits[0, 2, 1] = 9.0  # a prompt position (its candidate is not scored): the same loss
    assert float(sequence_unlikelihood(logits, x, 2, start=6)[0]) == float(
        sequence_unlikelihood(before, x, 2, start=6)[0]
    )
    assert sequence_unlikelihood(torch.zeros(1, 6, v), torch.arange(6)[None], 2, start=3) == (0, 0.0)
    # run=2: position t counts once t-2 and t-1 both copied their candidate
    x = torch.tensor([[7, 1, 2, 3, 1, 2, 3, 1, 2]])  # candidates (all copied) at positions 5, 6, 7
    assert sequence_unlikelihood(torch.zeros(1, 9, v), x, 2, start=1, run=0)[1] == pytest.approx(3 / 8)
    assert sequence_unlikelihood(torch.zeros(1, 9, v), x, 2, start=1, run=2)[1] == pytest.approx(1 / 8)  # 7 only


def test_a_stretch_with_continuations_logs_the_sequence_unlikelihood(tmp_path):
    """The continuations (SYNTHETIC rows: a prompt of 8 tokens, then a loop of period 3) join each step's loss: the
    4-grams of the loop repeat from position 14 on, 17 of the 24 generated positions."""
    import json

    from training.trunk import main

    stream = np.tile(np.arange(5, 21), 64)
    np.savez(
        tmp_path / "tokens.npz",
        train=stream,
        heldout_stdlib=stream,
        heldout_packages=stream,
        corpus=json.dumps({"synthetic": True}),
    )
    rows = np.concatenate([np.tile(np.arange(30, 38), (3, 1)), np.tile([40, 41, 42], (3, 8))], axis=1)
    np.savez(tmp_path / "cont.npz", rows=rows.astype(np.uint16), start=np.int64(8), source=np.array("synthetic"))
    save(_small_model(), tmp_path / "ck.safetensors", {"steps": 0, "tokens": 0, "seconds": 0.0, "stretches": 1})
    assert (
        main(
            [
                "--steps",
                "2",
                "--layers",
                "4",
                "--batch-size",
                "2",
                "--seq-len",
                "32",
                "--eval-every",
                "2",
                "--eval-batches",
                "1",
                "--depth",
                "2",
                "--chain-rows",
                "4",
                "--ul-seq-batch",
                "2",
                "--ul-seq-run",
                "0",
                "--log-every",
                "1",
                "--data",
                str(tmp_path / "tokens.npz"),
                "--checkpoint",
                str(tmp_path / "ck.safetensors"),
                "--continuations",
                str(tmp_path / "cont.npz"),
                "--log",
                str(tmp_path / "log.jsonl"),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "ul_seq" in r]
    assert len(steps) == 2 and all(
        r["ul_seq"] > 0 and r["ul_seq_share"] == pytest.approx(17 / 24, abs=1e-3) for r in steps
    )
    assert records[0]["continuations"]["rows"] == [3, 32] and records[0]["continuations"]["start"] == 8


def test_make_continuations_are_the_checkpoint_s_greedy_text(tmp_path):
    """Greedy continuations through llama.cpp of the committed checkpoint, each after a prompt from the stream."""
    pytest.importorskip("llama_cpp")
    import json

    from training.llama_ref import LlamaMTP
    from training.trunk import export_gguf, make_continuations

    stream = np.arange(100, 400)
    np.savez(
        tmp_path / "tokens.npz",
        train=stream,
        heldout_stdlib=stream,
        heldout_packages=stream,
        corpus=json.dumps({"synthetic": True}),
    )
    out = make_continuations(CHECKPOINT, tmp_path / "tokens.npz", tmp_path / "cont.npz", n=2, prompt_len=16, n_new=8)
    z = np.load(out)
    assert z["rows"].shape == (2, 24) and int(z["start"]) == 16 and str(z["source"]) == CHECKPOINT.name
    with LlamaMTP(export_gguf(CHECKPOINT, tmp_path / "m.gguf"), n_ctx=64, n_threads=1, n_rs_seq=0) as m:
        for row in z["rows"].astype(int).tolist():
            assert row[:16] == list(range(row[0], row[0] + 16))  # a window of the stream
            assert m.greedy(row[:16], 8, stop_at_eos=False) == row[16:]


def test_checkpoint_round_trip_keeps_vectors_exact(tmp_path):
    m = _small_model()
    save(m, tmp_path / "ck.safetensors", {"steps": 3, "stretches": 1})
    back, meta = load(tmp_path / "ck.safetensors")
    assert meta == {"steps": 3, "stretches": 1}
    for (k, a), b in zip(m.state_dict().items(), back.state_dict().values()):
        if a.ndim == 2:
            assert torch.equal(a.half().float(), b), k
        else:
            assert torch.equal(a, b), k


def test_corpus_with_packages_keeps_the_stdlib_split_and_deduplicates():
    std = load_corpus()
    both = load_corpus(packages=CORPUS_PACKAGES)
    assert both[: len(std)] == std  # the stdlib part, its names and its held-out split, unchanged
    extra = both[len(std) :]
    assert {f.relpath.split("/", 1)[0] for f in extra} == set(CORPUS_PACKAGES)
    texts = [hashlib.sha256(f.text.encode()).digest() for f in both]
    assert len(set(texts[len(std) :])) == len(extra) and not set(texts[len(std) :]) & set(texts[: len(std)])
    _, held = split_corpus(both)
    assert any(f.relpath.startswith("numpy/") for f in held) and any(f.relpath.startswith("pandas/") for f in held)
    with pytest.raises(ValueError, match="not a corpus package"):
        package_root("scipy")


def test_committed_checkpoint_is_a_trained_grown_trunk():
    """The weights-only checkpoint of the last stretch: 12 layers within 25 MB, and on held-out stdlib files
    its trunk predicts better than the shipped 4-layer model it was grown from."""
    from training.export import DEFAULT_OUT as SHIPPED
    from training.export import model_from_gguf
    from training.tokenizer import encode_files, tokenizer_from_vocab, vocab_from_gguf

    assert CHECKPOINT.stat().st_size <= 25 * 2**20
    model, meta = load(CHECKPOINT)
    assert model.cfg.num_hidden_layers == 12 and meta["stretches"] >= 1 and meta["old_layers_at"] == [2, 5, 8, 11]
    _, held = split_corpus(load_corpus())
    tok = tokenizer_from_vocab(vocab_from_gguf(SHIPPED))
    ids = np.asarray(encode_files(tok, [f.text for f in held[:6]]))
    x = torch.from_numpy(ids[: 4 * 256].reshape(4, 256).astype(np.int64))

    def ce(m: DemoModel) -> float:
        with torch.no_grad():
            logits = m.eval()(x)[0]
        return float(
            torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        )

    assert ce(model) < ce(model_from_gguf(SHIPPED)) - 0.05


def _stretch(tmp_path: Path, lr: float) -> tuple[list[dict], Path]:
    """A 4-step stretch of the small model on a repeating stream (SYNTHETIC), evaluated after every step, with
    ``--best``; returns the log's records and the best path."""
    import json

    from training.trunk import main

    stream = np.tile(np.arange(5, 21), 64)
    np.savez(
        tmp_path / "tokens.npz",
        train=stream,
        heldout_stdlib=stream,
        heldout_packages=stream,
        corpus=json.dumps({"synthetic": True}),
    )
    save(_small_model(), tmp_path / "ck.safetensors", {"steps": 0, "tokens": 0, "seconds": 0.0, "stretches": 1})
    best = tmp_path / "best.safetensors"
    assert (
        main(
            [
                "--steps",
                "4",
                "--layers",
                "4",
                "--batch-size",
                "2",
                "--seq-len",
                "32",
                "--eval-every",
                "1",
                "--eval-batches",
                "1",
                "--depth",
                "2",
                "--chain-rows",
                "4",
                "--lr",
                str(lr),
                "--data",
                str(tmp_path / "tokens.npz"),
                "--checkpoint",
                str(tmp_path / "ck.safetensors"),
                "--log",
                str(tmp_path / "log.jsonl"),
                "--best",
                str(best),
            ]
        )
        == 0
    )
    return [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()], best


def test_best_keeps_the_lowest_heldout_ce_of_the_stretch(tmp_path):
    records, best = _stretch(tmp_path, lr=1e-2)
    evals = [r for r in records if r.get("event") == "eval"]
    ces = [r["heldout_stdlib"]["ce"] for r in evals]
    kept = [r for r in records if r.get("event") == "best"]
    assert min(ces[1:]) < ces[0] and kept[-1]["heldout_stdlib_ce"] == min(ces)
    assert [k["heldout_stdlib_ce"] for k in kept] == sorted({k["heldout_stdlib_ce"] for k in kept}, reverse=True)
    model, meta = load(best)
    assert meta["steps"] == evals[ces.index(min(ces))]["step"] == kept[-1]["step"]


def test_best_is_not_written_without_an_improvement(tmp_path):
    records, best = _stretch(tmp_path, lr=0.0)
    assert not best.exists() and not [r for r in records if r.get("event") == "best"]


def test_average_is_the_elementwise_mean_and_records_its_sources(tmp_path):
    from training.trunk import main

    a, b = _small_model(), _small_model()
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.5)
    save(a, tmp_path / "a.safetensors", {"steps": 10, "stretches": 2})
    save(b, tmp_path / "b.safetensors", {"steps": 12, "stretches": 2})
    out = tmp_path / "soup.safetensors"
    assert (
        main(["--average", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--checkpoint", str(out)])
        == 0
    )
    soup, meta = load(out)
    a, _ = load(tmp_path / "a.safetensors")
    b, _ = load(tmp_path / "b.safetensors")
    for k, v in soup.state_dict().items():
        mean = (a.state_dict()[k] + b.state_dict()[k]) / 2
        assert torch.equal(v, mean.half().float() if v.ndim == 2 else mean), k
    assert meta["steps"] == 10 and [s["checkpoint"] for s in meta["averaged"]] == ["a.safetensors", "b.safetensors"]
    assert meta["averaged"][1]["steps"] == 12


def test_average_weights_a_checkpoint_given_twice_twice(tmp_path):
    from training.trunk import average

    a, b = _small_model(), _small_model()
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.75)
    save(a, tmp_path / "a.safetensors", {"steps": 10})
    save(b, tmp_path / "b.safetensors", {"steps": 12})
    soup, meta = average([tmp_path / "a.safetensors", tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    a, _ = load(tmp_path / "a.safetensors")
    b, _ = load(tmp_path / "b.safetensors")
    for k, v in soup.state_dict().items():
        assert torch.allclose(v, (2 * a.state_dict()[k] + b.state_dict()[k]) / 3, atol=1e-6), k
    assert [s["checkpoint"] for s in meta["averaged"]] == ["a.safetensors", "a.safetensors", "b.safetensors"]


def test_average_refuses_checkpoints_of_another_shape(tmp_path):
    save(_small_model(), tmp_path / "a.safetensors", {"steps": 1})
    bigger = DemoModel(ModelConfig(**{**SMALL, "intermediate_size": 64}))
    save(bigger, tmp_path / "b.safetensors", {"steps": 1})
    from training.trunk import average

    with pytest.raises(ValueError, match="does not have the shape"):
        average([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])


def test_export_writes_the_checkpoint_as_a_gguf_that_computes_the_same(tmp_path):
    import json

    import gguf

    from training.export import model_from_gguf
    from training.trunk import main

    out = tmp_path / "trunk.gguf"
    assert main(["--checkpoint", str(CHECKPOINT), "--export", str(out)]) == 0
    model, meta = load(CHECKPOINT)
    back = model_from_gguf(out)
    x = torch.arange(100, 164).reshape(1, 64)
    with torch.no_grad():
        a, b = model.eval()(x)[0], back.eval()(x)[0]
    assert torch.allclose(a, b, atol=1e-3, rtol=0), float((a - b).abs().max())
    field = gguf.GGUFReader(out).fields["mtp_explorer.trunk_meta"]
    assert json.loads(bytes(field.parts[field.data[0]]).decode()) == meta
