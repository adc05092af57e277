"""The mtp-explorer command and model_info."""

from __future__ import annotations

import json
import subprocess
import sys

import mtp_explorer as mx
from mtp_explorer.cli import main


def test_model_info(model_mixed, model_no_mtp):
    info = mx.model_info(model_mixed)
    assert (info.arch, info.n_layer, info.n_layer_nextn, info.n_embd, info.n_vocab) == ("qwen35", 4, 1, 64, 384)
    assert info.has_mtp and info.is_recurrent and info.size == model_mixed.stat().st_size
    assert info.n_params > 0 and info.rs_slot_bytes > 0
    assert mx.model_info(model_no_mtp).n_layer == 4


def test_info_command(model_mixed, capsys):
    assert main(["info", str(model_mixed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arch"] == "qwen35" and doc["n_layer_nextn"] == 1
    assert main(["info", str(model_mixed)]) == 0
    assert "rs_slot_bytes" in capsys.readouterr().out


def test_info_command_errors(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.gguf")]) == 2
    assert "not found" in capsys.readouterr().out


def test_run_command(model_mixed, tmp_path):
    out_json = tmp_path / "trace.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mtp_explorer.cli", "run", "def fib(n):", "-m", str(model_mixed), "-n", "24",
         "--n-max", "3", "--n-ctx", "256", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "acceptance rate" in proc.stdout and "tokens/s" in proc.stdout and "finished by" in proc.stdout
    t = mx.Trace.from_json(out_json.read_text())
    assert len(t.tokens) == 24


def test_run_command_bad_parameter(model_mixed):
    proc = subprocess.run(
        [sys.executable, "-m", "mtp_explorer.cli", "run", "x", "-m", str(model_mixed), "--n-max", "99"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "capacity" in proc.stdout
