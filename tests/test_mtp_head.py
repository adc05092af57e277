"""training.mtp_head: the MTP-head fine-tune writes only the nextn tensors, keeps its budget and resumes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from mtp_explorer import default_model_path  # noqa: E402
from training import mtp_head  # noqa: E402
from training.export import model_from_gguf  # noqa: E402

pytestmark = pytest.mark.train

#: sha256 of the shipped file with the MTP block's tensor data left out (every other byte: header, metadata,
#: tokenizer, trunk tensors), as the model was before its MTP head was fine-tuned (commit bc26ce3): the
#: fine-tune must leave all of it as it was.
TRUNK_SHA256 = "735f02dc3ed3cb74510100bcafa9db11d5779b98f6cec605b646366143c24ada"


def _nextn_ranges(path: Path) -> tuple[list[tuple[int, int]], int]:
    reader = gguf.GGUFReader(str(path))
    n_layer = int(reader.fields["qwen35.block_count"].contents()) - int(
        reader.fields["qwen35.nextn_predict_layers"].contents()
    )
    ranges = sorted(
        (int(t.data_offset), int(t.data_offset) + int(t.n_bytes))
        for t in reader.tensors
        if t.name.startswith(f"blk.{n_layer}.")
    )
    return ranges, n_layer


def _outside(path: Path) -> bytes:
    """The file's bytes outside the MTP block's tensor data."""
    data = path.read_bytes()
    ranges, _ = _nextn_ranges(path)
    keep, at = [], 0
    for a, b in ranges:
        keep.append(data[at:a])
        at = b
    keep.append(data[at:])
    return b"".join(keep)


def test_shipped_file_keeps_the_original_trunk_and_metadata():
    assert hashlib.sha256(_outside(default_model_path())).hexdigest() == TRUNK_SHA256


def test_unchanged_head_writes_the_same_file(tmp_path):
    src = default_model_path()
    out = tmp_path / "same.gguf"
    mtp_head.write_head(model_from_gguf(src), src, out)
    assert out.read_bytes() == src.read_bytes()


def test_write_head_changes_only_the_nextn_tensors(tmp_path):
    src = default_model_path()
    model = model_from_gguf(src)
    with torch.no_grad():
        for p in model.mtp.parameters():
            p.add_(0.01)
        trunk_before = {k: v.clone() for k, v in model.trunk.state_dict().items()}
    out = tmp_path / "head.gguf"
    names = mtp_head.write_head(model, src, out)
    ranges, n_layer = _nextn_ranges(src)
    assert len(names) == len(ranges) > 0 and all(n.startswith(f"blk.{n_layer}.") for n in names)
    assert out.stat().st_size == src.stat().st_size
    assert _outside(out) == _outside(src)
    a, b = src.read_bytes(), out.read_bytes()
    assert all(a[x:y] != b[x:y] for x, y in ranges)  # every nextn tensor was written
    again = model_from_gguf(out)  # and reads back as what was written (F16-rounded)
    for k, v in again.trunk.state_dict().items():
        torch.testing.assert_close(v, trunk_before[k], rtol=0, atol=0)
    for (k, v), w in zip(again.mtp.state_dict().items(), model.mtp.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=2e-3, atol=2e-3, msg=k)


def test_write_head_refuses_a_file_of_another_shape(tmp_path):
    from mtp_explorer.models.synthetic import write_synthetic_qwen35

    other = write_synthetic_qwen35(tmp_path / "other.gguf")  # SYNTHETIC: 64 wide, the demo model is 256
    with pytest.raises(ValueError, match="does not fit"):
        mtp_head.write_head(model_from_gguf(default_model_path()), other, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.fixture
def tiny_corpus(tmp_path, monkeypatch) -> Path:
    """A SYNTHETIC corpus of generated Python files, some of them in the held-out split."""
    from training.corpus import is_heldout

    root = tmp_path / "corpus"
    root.mkdir()
    rng = np.random.default_rng(0)
    held = train = 0
    i = 0
    while held < 2 or train < 4:
        name = f"mod_{i}.py"
        i += 1
        if is_heldout(name):
            if held >= 2:
                continue
            held += 1
        else:
            if train >= 4:
                continue
            train += 1
        body = "".join(f"def f{j}(x, y={int(rng.integers(9))}):\n    return x * {j} + y\n\n\n" for j in range(80))
        (root / name).write_text(body, encoding="utf-8")
    monkeypatch.setenv("MTP_EXPLORER_CORPUS_ROOT", str(root))
    return root


def test_a_run_stops_at_its_budget_resumes_and_writes_the_file(tmp_path, tiny_corpus):
    src = tmp_path / "model.gguf"
    src.write_bytes(default_model_path().read_bytes())
    out, log = tmp_path / "run", tmp_path / "head.jsonl"
    common = ["--gguf", str(src), "--out", str(out), "--log", str(log), "--steps", "3"]
    assert mtp_head.main(common + ["--max-minutes", "0"]) == 0  # the budget ends the run after its first step
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in rows if "event" in r] == ["start", "paused", "written"]
    assert rows[-2]["step"] == 1 and (out / "last.pt").exists()
    assert mtp_head.main(common) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    events = [r for r in rows if "event" in r]
    assert [r["event"] for r in events][3:] == ["resumed", "finished", "written"]
    assert events[3]["step"] == 1 and events[4]["step"] == 3
    written = out / src.name
    assert _outside(written) == _outside(src) and written.read_bytes() != src.read_bytes()
    assert any("eval" in r and r.get("step") == 3 for r in rows)


def test_a_checkpoint_of_another_file_is_refused(tmp_path, tiny_corpus):
    src = tmp_path / "model.gguf"
    src.write_bytes(default_model_path().read_bytes())
    out = tmp_path / "run"
    args = ["--gguf", str(src), "--out", str(out), "--log", str(tmp_path / "l.jsonl"), "--steps", "1"]
    assert mtp_head.main(args) == 0
    src.write_bytes((out / src.name).read_bytes())  # now another file than the checkpoint's start
    assert mtp_head.main(args) == 2


def test_a_run_on_the_trunks_own_continuations_trains_on_them_and_reports_their_held_out_agreement(
    tmp_path, tiny_corpus
):
    src = tmp_path / "model.gguf"
    src.write_bytes(default_model_path().read_bytes())
    vocab = model_from_gguf(src).cfg.vocab_size
    rows = np.random.default_rng(3).integers(0, vocab, size=(40, 48)).astype(np.uint16)  # SYNTHETIC token rows
    cont = tmp_path / "cont.npz"
    np.savez(cont, rows=rows, start=np.int64(16))
    log = tmp_path / "head.jsonl"
    args = ["--gguf", str(src), "--out", str(tmp_path / "run"), "--log", str(log), "--steps", "2"]
    assert mtp_head.main(args + ["--continuations", str(cont)]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    assert start["continuations"] == {"path": str(cont), "rows": 40 - mtp_head.HeadConfig.continuation_heldout}
    evals = [r["eval"] for r in records if "eval" in r]
    assert len(evals) == 2 and all(len(e["continuation_agreement_by_depth"]) == 4 for e in evals)
    with pytest.raises(ValueError, match="continuation_heldout"):
        mtp_head.continuation_split(rows[:32], mtp_head.HeadConfig())
