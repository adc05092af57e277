"""The three draft-head trainers (``training/eagle3.py``, ``training/dflash.py``, ``training/dspark.py``) train
against a :mod:`training.trunk` checkpoint (``--target *.safetensors``) with torch alone, as on a lent GPU box that
has neither ``gguf`` nor this package's native extension: in a subprocess where importing ``gguf`` or
``mtp_explorer`` raises, each runs 2 steps on small batches against ``training/checkpoints/trunk-v2.safetensors``
(``--tokens``: a small random token file in the place of ``python -m training.trunk --prepare``'s) and writes a
checkpoint of CPU tensors with a finite held-out loss; DSpark starts from the DFlash run's checkpoint.  Default
layer ids (chosen for the shipped 4-layer target) are refused on the 12-layer trunk with a precise error.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "training" / "checkpoints" / "trunk-v2.safetensors"

BLOCKED_RUN = textwrap.dedent("""
    import importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("gguf", "mtp_explorer"):
                raise ImportError(f"blocked on a torch-only box: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import importlib
    for module, argv in json.loads(sys.argv[1]):
        try:
            rc = importlib.import_module(module).main(argv)
        except SystemExit as e:
            rc = e.code
        print("@@", json.dumps({"module": module, "rc": rc if isinstance(rc, int) or rc is None else str(rc)}))
    print("@@", json.dumps({"imported": sorted(m for m in sys.modules if m.split(".")[0] in ("gguf", "mtp_explorer"))}))
""")


def _run_blocked(runs: list[tuple[str, list[str]]], train_dir: Path) -> tuple[list[dict], str]:
    env = {**os.environ, "MTP_EXPLORER_TRAIN_DIR": str(train_dir)}
    p = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, json.dumps(runs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(line[3:]) for line in p.stdout.splitlines() if line.startswith("@@ ")], p.stderr


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory) -> Path:
    assert CHECKPOINT.exists(), f"{CHECKPOINT} is tracked in git; the trainers are tested against it"
    d = tmp_path_factory.mktemp("train-dir")
    rng = np.random.default_rng(0)
    streams = {
        k: rng.integers(0, 4095, size=n).astype(np.uint16)
        for k, n in (("train", 20_000), ("heldout_stdlib", 4_000), ("heldout_packages", 4_000))
    }
    np.savez_compressed(d / "tokens.npz", corpus=np.array(json.dumps({"synthetic": True})), **streams)
    return d


def _last_eval(log: Path) -> dict:
    return [r for r in map(json.loads, log.read_text().splitlines()) if "eval_heldout" in r][-1]["eval_heldout"]


def _check_checkpoint(path: Path, layer_ids: list[int]) -> None:
    import torch

    ck = torch.load(path, weights_only=False)  # no map_location: tensors come back where they were saved
    assert ck["step"] == 2 and ck["head_config"]["target_layer_ids"] == layer_ids
    assert all(v.device.type == "cpu" for v in ck["head"].values())


def test_eagle3_dflash_dspark_train_on_a_trunk_checkpoint_with_torch_only(train_dir, tmp_path):
    common = [
        "--target",
        str(CHECKPOINT),
        "--tokens",
        str(train_dir / "tokens.npz"),
        "--steps",
        "2",
        "--fresh",
        "--no-export",
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--eval-windows",
        "2",
    ]
    runs = [
        (
            "training.eagle3",
            [
                *common,
                "--seq-len",
                "64",
                "--layer-ids",
                "2,6,12",
                "--out",
                str(tmp_path / "e3"),
                "--log",
                str(tmp_path / "e3.jsonl"),
            ],
        ),
        (
            "training.dflash",
            [
                *common,
                "--seq-len",
                "128",
                "--layer-ids",
                "1,5,10",
                "--out",
                str(tmp_path / "df"),
                "--log",
                str(tmp_path / "df.jsonl"),
            ],
        ),
        (
            "training.dspark",
            [
                *common,
                "--seq-len",
                "128",
                "--init-from",
                str(tmp_path / "df" / "last.pt"),
                "--out",
                str(tmp_path / "ds"),
                "--log",
                str(tmp_path / "ds.jsonl"),
            ],
        ),
    ]
    results, stderr = _run_blocked(runs, train_dir)
    assert [r.get("rc") for r in results[:3]] == [0, 0, 0], (results, stderr[-3000:])
    assert results[3] == {"imported": []}
    for name, key, ids in (
        ("e3", "soft_ce_by_depth", [2, 6, 12]),
        ("df", "soft_ce_by_slot", [1, 5, 10]),
        ("ds", "soft_ce_by_slot", [1, 5, 10]),
    ):  # DSpark: the ids of its --init-from head
        ev = _last_eval(tmp_path / f"{name}.jsonl")
        assert ev[key] and all(math.isfinite(v) for v in ev[key]), ev
        _check_checkpoint(tmp_path / name / "last.pt", ids)
    start = json.loads((tmp_path / "ds.jsonl").read_text().splitlines()[0])
    assert start["target"] == CHECKPOINT.name and start["init"]["backbone_from"] == "last.pt"
    assert start["corpus"] == {"synthetic": True, "tokens_file": str(train_dir / "tokens.npz")}


def test_training_heads_refuse_default_layer_ids_on_another_trunk(train_dir, tmp_path):
    common = [
        "--target",
        str(CHECKPOINT),
        "--tokens",
        str(train_dir / "tokens.npz"),
        "--steps",
        "1",
        "--fresh",
        "--no-export",
        "--batch-size",
        "2",
        "--seq-len",
        "128",
        "--eval-windows",
        "2",
    ]
    runs = [
        ("training.eagle3", [*common, "--out", str(tmp_path / "e3"), "--log", str(tmp_path / "e3.jsonl")]),
        ("training.dflash", [*common, "--out", str(tmp_path / "df"), "--log", str(tmp_path / "df.jsonl")]),
    ]
    results, _ = _run_blocked(runs, train_dir)
    assert results[0]["rc"] == (
        "trunk-v2.safetensors has 12 layers; the default layer ids [2, 3, 4] were chosen for "
        "the shipped 4-layer target: give --layer-ids for this one"
    )
    assert results[1]["rc"].startswith("trunk-v2.safetensors has 12 layers; the default layer ids [0, 1, 2]")
    assert not (tmp_path / "e3" / "last.pt").exists() and not (tmp_path / "df" / "last.pt").exists()
