"""The mtp-explorer command and model_info."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mtp_explorer as mx
from mtp_explorer.cli import main


def test_model_info(model_mixed, model_no_mtp):
    info = mx.model_info(model_mixed)
    assert (info.arch, info.n_layer, info.n_layer_nextn, info.n_embd, info.n_vocab) == ("qwen35", 4, 1, 64, 384)
    assert info.has_mtp and info.is_recurrent and info.size == model_mixed.stat().st_size
    assert info.n_params > 0 and info.rs_slot_bytes > 0
    assert mx.model_info(model_no_mtp).n_layer == 4


def test_model_info_of_the_bundled_model_and_of_no_path():
    """``None`` is the bundled model, as for Session.open; a value that is no path is an InputTypeError (there too)."""
    assert mx.model_info(None).path == mx.model_info(mx.default_model_path()).path
    for bad in (3, [b"x.gguf"]):
        with pytest.raises(mx.InputTypeError, match="must be a file path"):
            mx.model_info(bad)  # type: ignore[arg-type]
    with pytest.raises(mx.InputTypeError, match="head must be a file path"):
        mx.model_info(None, head=1)  # type: ignore[arg-type]
    with pytest.raises(mx.InputTypeError, match="draft_model must be a file path"):
        mx.Session.open(None, draft_model=5)  # type: ignore[arg-type]
    with pytest.raises(mx.InputTypeError, match="path must be a file path"):
        mx.Session.open(3)  # type: ignore[arg-type]


def test_info_command(model_mixed, capsys):
    assert main(["info", str(model_mixed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arch"] == "qwen35" and doc["n_layer_nextn"] == 1
    assert main(["info", str(model_mixed)]) == 0
    out = capsys.readouterr().out
    assert "rs_slot_bytes" in out and "experts" in out and "dense" in out


def test_info_command_errors(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.gguf")]) == 2
    assert "not found" in capsys.readouterr().out


def test_run_command(model_mixed, tmp_path):
    out_json = tmp_path / "trace.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtp_explorer.cli",
            "run",
            "def fib(n):",
            "-m",
            str(model_mixed),
            "-n",
            "24",
            "--n-max",
            "3",
            "--n-ctx",
            "256",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "acceptance rate" in proc.stdout and "tokens/s" in proc.stdout and "finished by" in proc.stdout
    t = mx.Trace.from_json(out_json.read_text())
    assert len(t.tokens) == 24


def test_run_command_bad_parameter(model_mixed):
    proc = subprocess.run(
        [sys.executable, "-m", "mtp_explorer.cli", "run", "x", "-m", str(model_mixed), "--n-max", "99"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "capacity" in proc.stdout


REPEAT = "x = [1, 2, 3]\nx = [1, 2, 3]\ny = [1, 2"  # repeats itself: the n-gram drafter finds matches


def test_run_command_drafter_options_parse():
    import pytest

    from mtp_explorer.cli import _parser
    from mtp_explorer.core import drafters

    defaults = {o.name: o.default for o in drafters.all_options()}
    args = _parser().parse_args(["run"])
    assert (args.drafter, args.ngram_simple_size_n, args.ngram_simple_size_m) == (
        "draft-mtp",
        defaults["ngram_simple_size_n"],
        defaults["ngram_simple_size_m"],
    )
    assert (defaults["ngram_simple_size_n"], defaults["ngram_simple_size_m"]) == (12, 48)  # llama.cpp's (common.h)
    args = _parser().parse_args(["run", "--drafter", "chain", "--ngram-n", "2", "--ngram-m", "5"])  # earlier names
    assert (args.drafter, args.ngram_simple_size_n, args.ngram_simple_size_m) == ("chain", 2, 5)
    # llama.cpp's own flag names work too, and its --spec-type values (a chain, its policy)
    args = _parser().parse_args(
        [
            "run",
            "--spec-ngram-simple-size-n",
            "4",
            "--spec-ngram-simple-size-m",
            "6",
            "--spec-type",
            "draft-mtp,ngram-simple",
            "--chain-policy",
            "best",
        ]
    )
    assert (args.ngram_simple_size_n, args.ngram_simple_size_m) == (4, 6)
    assert drafters.mode(args.drafter, args.chain_policy).name == "ngram-simple,draft-mtp"
    for bad in (
        ["--drafter", "eagle"],
        ["--ngram-n", "0"],
        ["--ngram-m", "two"],
        ["--ngram-n", "1025"],
        ["--spec-type", "draft-nope"],
        ["--chain-policy", "coin"],
    ):
        with pytest.raises(SystemExit) as exc:
            _parser().parse_args(["run", *bad])
        assert exc.value.code == 2


def test_run_command_flags_come_from_the_registry(capsys):
    """--drafter's choices are the registry's modes, and every drafter option is a flag under both spellings."""
    import pytest

    from mtp_explorer.cli import _parser
    from mtp_explorer.core import drafters

    parser = _parser()
    run = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(" run"))
    by_dest = {a.dest: a for a in run._actions}
    assert all(m in by_dest["drafter"].help for m in drafters.DRAFTER_MODES)  # listed; --spec-type values too
    assert set(by_dest["drafter"].option_strings) == {"--drafter", "--spec-type"}
    assert by_dest["drafter"].default == drafters.DEFAULT_MODE
    for option in drafters.all_options():
        action = by_dest[option.name]
        aliases = {"--" + a.replace("_", "-") for a in option.aliases}
        assert set(action.option_strings) == {"--" + option.name.replace("_", "-"), option.flag} | aliases
        assert action.default == option.default
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--help"])
    assert "--spec-type" in capsys.readouterr().out
    for mode in drafters.MODES.values():  # (argparse wraps the help text at hyphens too)
        assert f"{mode.name}:" in by_dest["drafter"].help


def test_run_command_bad_drafter_option_is_an_argparse_error(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["run", "x", "--drafter", "eagle"])
    assert exc.value.code == 2
    assert "unknown speculative type 'eagle'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "x", "--ngram-m", "-1"])
    assert "positive integer" in capsys.readouterr().err


def test_run_command_ngram_without_mtp_head(model_no_mtp, tmp_path, capsys):
    out_json = tmp_path / "ngram.json"
    assert (
        main(
            [
                "run",
                REPEAT,
                "-m",
                str(model_no_mtp),
                "-n",
                "32",
                "--n-max",
                "4",
                "--n-ctx",
                "256",
                "--threads",
                "1",
                "--drafter",
                "ngram",
                "--ngram-n",
                "2",
                "--ngram-m",
                "4",
                "--json",
                str(out_json),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "drafter" in out and "ngram-simple" in out and "acceptance rate" in out
    t = mx.Trace.from_json(out_json.read_text())
    assert len(t.tokens) == 32
    assert (t.settings["drafter"], t.settings["ngram_simple_size_n"], t.settings["ngram_simple_size_m"]) == (
        "ngram-simple",
        2,
        4,
    )  # given as "ngram": recorded under llama.cpp's name
    won = t.steps_by_drafter()
    assert won["draft-mtp"] == 0 and won["ngram-simple"] > 0  # the repeated line is looked up


def test_run_command_chain_counts_steps_won(model_mixed, tmp_path, capsys):
    out_json = tmp_path / "chain.json"
    assert (
        main(
            [
                "run",
                REPEAT,
                "-m",
                str(model_mixed),
                "-n",
                "32",
                "--n-max",
                "3",
                "--n-ctx",
                "256",
                "--threads",
                "1",
                "--drafter",
                "chain",
                "--json",
                str(out_json),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    t = mx.Trace.from_json(out_json.read_text())
    assert (t.settings["drafter"], t.settings["chain_policy"]) == ("ngram-simple,draft-mtp", "best")  # "chain"
    won = t.steps_by_drafter()
    assert sum(won.values()) == t.n_steps
    assert "steps won by drafter" in out
    assert f"ngram-simple {won['ngram-simple']}  draft-mtp {won['draft-mtp']}  (no draft {won['none']})" in out


def test_run_command_mtp_drafters_need_an_mtp_head(model_no_mtp, capsys):
    for drafter in ("mtp", "chain"):
        assert (
            main(
                [
                    "run",
                    "x",
                    "-m",
                    str(model_no_mtp),
                    "-n",
                    "4",
                    "--n-ctx",
                    "256",
                    "--threads",
                    "1",
                    "--drafter",
                    drafter,
                ]
            )
            == 2
        )
        out = capsys.readouterr()
        assert "no MTP layers" in out.out and "Traceback" not in out.out + out.err
    # plain decoding needs no drafter at all
    assert (
        main(["run", "x", "-m", str(model_no_mtp), "-n", "4", "--n-ctx", "256", "--threads", "1", "--n-max", "0"]) == 0
    )


def test_run_command_takes_llama_cpp_spellings_and_np(model_mixed, tmp_path):
    """llama.cpp's --spec-draft-n-max / -p-min / -n-min and -np: N requests at once, a table per request and the
    aggregate; --json writes the requests' traces."""
    out_json = tmp_path / "traces.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtp_explorer.cli",
            "run",
            "def fib(n):",
            "class A:",
            "-m",
            str(model_mixed),
            "-n",
            "16",
            "-np",
            "3",
            "--spec-draft-n-max",
            "2",
            "--spec-draft-p-min",
            "0.0",
            "--spec-draft-n-min",
            "1",
            "-c",
            "768",
            "-t",
            "1",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "per request" in proc.stdout and "aggregate (-np 3)" in proc.stdout and "decode tokens/s" in proc.stdout
    traces = [mx.Trace.from_json(json.dumps(d)) for d in json.loads(out_json.read_text())]
    assert len(traces) == 3 and all(len(t.tokens) == 16 for t in traces)
    assert traces[0].prompt == "def fib(n):" and traces[1].prompt == "class A:"  # the third: a demo prompt
    assert all(t.settings["n_max"] == 2 and t.settings["n_min"] == 1 and t.settings["n_parallel"] == 3 for t in traces)
    too_many = subprocess.run(
        [sys.executable, "-m", "mtp_explorer.cli", "run", "a", "b", "-m", str(model_mixed), "-np", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert too_many.returncode == 2 and "one, or up to N with -np N" in too_many.stdout


def test_old_flag_spellings_stay_aliases():
    from mtp_explorer.cli import _parser

    new = _parser().parse_args(
        ["run", "--spec-draft-n-max", "4", "--spec-draft-p-min", "0.5", "--spec-draft-n-min", "2"]
    )
    old = _parser().parse_args(["run", "--n-max", "4", "--p-min", "0.5", "--n-min", "2"])
    assert (new.n_max, new.p_min, new.n_min) == (old.n_max, old.p_min, old.n_min) == (4, 0.5, 2)
    assert _parser().parse_args(["run", "--draft-p-min", "0.25"]).p_min == 0.25
    assert _parser().parse_args(["run", "--parallel", "2"]).n_parallel == 2
