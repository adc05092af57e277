"""Shared fixtures: SYNTHETIC random-weight models whose MTP acceptance is set by construction
(see mtp_explorer.models.synthetic), written once per test run."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer.models.synthetic import write_synthetic_qwen35

# measured batch-shape shifts (Session.batch_shift) are cached here, not in the user's ~/.cache
os.environ["MTP_EXPLORER_CACHE"] = tempfile.mkdtemp(prefix="mtp-explorer-test-cache-")
atexit.register(shutil.rmtree, os.environ["MTP_EXPLORER_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    """The shipped demo model (part of the repository: missing means a broken checkout)."""
    return mx.default_model_path()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def model_full(models_dir) -> Path:
    """Drafts always match: the trunk ignores context and the MTP head copies it."""
    return write_synthetic_qwen35(models_dir / "full.gguf", context_mix=0.0, mtp_fidelity=1.0)


@pytest.fixture(scope="session")
def model_mixed(models_dir) -> Path:
    """Drafts sometimes match (about 2/3 at depth 1): full, partial and zero acceptance all occur."""
    return write_synthetic_qwen35(models_dir / "mixed.gguf", context_mix=0.6, mtp_fidelity=1.0)


@pytest.fixture(scope="session")
def model_zero(models_dir) -> Path:
    """Drafts essentially never match: the MTP head's input projection is random."""
    return write_synthetic_qwen35(models_dir / "zero.gguf", context_mix=0.6, mtp_fidelity=0.0)


@pytest.fixture(scope="session")
def model_no_mtp(models_dir, model_mixed) -> Path:
    """The mixed model with its MTP block removed."""
    return strip_mtp(model_mixed, models_dir / "no_mtp.gguf")


@pytest.fixture(scope="session")
def model_synthetic_draft(models_dir) -> Path:
    """A draft model (draft-simple) for the synthetic models: a SYNTHETIC non-recurrent glm4moe with their
    vocabulary, whose trunk mixes in no context."""
    from mtp_explorer.models.synthetic_glm4moe import write_synthetic_glm4moe

    return write_synthetic_glm4moe(models_dir / "draft-glm4moe.gguf", context_mix=0.0)


@pytest.fixture(scope="session")
def session_mixed(model_mixed):
    with mx.Session.open(model_mixed, n_ctx=1024) as s:
        yield s


def strip_mtp(src: Path, dst: Path) -> Path:
    """Copy a qwen35 GGUF without its nextn block (block_count and nextn_predict_layers adjusted)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    n_nextn = reader.fields[f"{arch}.nextn_predict_layers"].contents()
    n_block = reader.fields[f"{arch}.block_count"].contents()
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == f"{arch}.block_count":
            value = n_block - n_nextn
        if key == f"{arch}.nextn_predict_layers":
            continue
        if key == f"{arch}.attention.recurrent_layers":
            value = value[: n_block - n_nextn]  # one flag per block: llama.cpp checks the length
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    trunk = n_block - n_nextn
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= trunk:
            continue
        writer.add_tensor(
            t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def check_accounting(t: mx.Trace) -> None:
    """Invariants every trace satisfies."""
    c = t.columns
    assert len(t.tokens) == int(c["n_accepted"].sum()) + t.n_steps
    assert (c["n_accepted"] <= c["n_drafted"]).all()
    assert (c["rollback"] == c["n_drafted"] - c["n_accepted"]).all()
    assert (c["n_drafted"] <= c["n_max"]).all()
    emitted = [tok for s in t.steps for tok in s.tokens]
    assert emitted == t.tokens
    for s in t.steps:
        assert s.target_tokens[: s.n_accepted] == s.drafted[: s.n_accepted]
        assert s.target_tokens[s.n_accepted] == s.correction
        if t.model["is_recurrent"]:
            assert s.rs_slot == (s.rollback if s.rollback > 0 else None)
        else:
            assert s.rs_slot is None


def check_drafter_stats(session: mx.Session, t: mx.Trace, mode) -> None:
    """The session's drafter_stats() after ``t`` (its last generation, under drafter ``mode``) are llama.cpp's:
    n_gen_drafts / n_gen_tokens count verified drafts; every step's outcome goes to the drafter verified last
    (llama.cpp's impl_last), also at steps without a draft (n_call_accept)."""
    from mtp_explorer.core import drafters

    rows = session.drafter_stats()
    assert [row["name"] for row in rows] == [d.name for d in drafters.mode(mode).drafters]
    last = np.maximum.accumulate(np.where(t.drafter >= 0, np.arange(len(t.drafter)), -1))
    owner = np.where(last >= 0, t.drafter[np.maximum(last, 0)], -1)
    for row in rows:
        index = mx.DRAFTERS.index(row["name"])
        mine = t.drafter == index
        assert row["n_gen_drafts"] == mine.sum() and row["n_gen_tokens"] == t.n_drafted[mine].sum()
        assert row["n_call_begin"] == 1
        told = owner == index
        assert row["n_call_accept"] == told.sum()
        assert row["n_acc_tokens"] == t.n_accepted[told].sum()
        assert row["n_acc_drafts"] == (t.n_accepted[told] > 0).sum()
        assert row["acc_by_pos"] == [(t.n_accepted[told] > j).sum() for j in range(len(row["acc_by_pos"]))]


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter (for cases that could take the process down)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def check_replay_exact(
    session: mx.Session, oracle, prompt: str, drafter, n_max: int, max_tokens: int, **options: int
) -> mx.Trace:
    """A real greedy run and the simulator's replay of it on ``oracle`` agree step by step (drafter, drafts,
    acceptance, the candidates asked) up to the first batch-shape near-tie, if any: each such divergence must be
    explained (a margin within the shift measured for the file on this machine) and is reported as a warning; the
    tokens agree unless the tie was the target's. Returns the real run."""
    from mtp_explorer.analysis.compare import compare
    from mtp_explorer.analysis.simulate import simulate

    t = session.generate(prompt, max_tokens=max_tokens, n_max=n_max, drafter=drafter, **options)
    check_accounting(t)
    sim = simulate(oracle, n_max, drafter=drafter)
    case = (prompt, getattr(drafter, "name", drafter), n_max)
    comparison = compare(oracle, t)
    assert not comparison.unexplained, (case, comparison.unexplained)
    upto = min((m["step"] for m in comparison.ties), default=len(t.n_drafted))
    if comparison.ties:
        warnings.warn(f"{case}: " + "; ".join(f"step {m['step']}: {m['explanation']}" for m in comparison.ties))
    if not any(m["cause"] == "target_argmax" for m in comparison.ties):
        assert sim.tokens == t.tokens, case
    for name in ("n_drafted", "n_accepted", "drafter", "drafted", "candidate_len"):
        assert np.array_equal(sim.columns[name][:upto], t.columns[name][:upto]), (case, name)
    return t


SHORT_NGRAM = {"ngram_simple_size_n": 3, "ngram_simple_size_m": 8}
"""ngram-simple sizes for the short test prompts: llama.cpp's defaults (12, 48) find no match in them."""


def built_tool(name: str, env_var: str, make_target: str) -> Path:
    """llama.cpp's tool ``name``: ``$env_var`` or build/reference/bin (``make test`` builds it). Missing fails, never
    skips."""
    path = Path(os.environ.get(env_var) or Path(__file__).resolve().parents[1] / "build" / "reference" / "bin" / name)
    if not path.is_file():
        pytest.fail(f"{path} is not built: run `make {make_target}` (`make test` builds it)", pytrace=False)
    return path


#: The marker of a test that uses each llama.cpp tool's fixture (`make test-fast` leaves such tests out).
TOOL_MARKERS = {"reference_binary": "reference", "lookup_create": "reference", "server_binary": "server"}


def pytest_collection_modifyitems(config, items):
    """Refuse a test that uses a llama.cpp tool without the marker that keeps it out of the fast tier."""
    unmarked = [
        f"{item.nodeid}: uses {fixture}, mark it @pytest.mark.{marker}"
        for item in items
        for fixture, marker in TOOL_MARKERS.items()
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
    ]
    if unmarked:
        raise pytest.UsageError("tests without the marker of the tool they need:\n" + "\n".join(unmarked))


@pytest.fixture(scope="session")
def reference_binary() -> Path:
    """llama.cpp's llama-speculative-simple (``built_tool``)."""
    return built_tool("llama-speculative-simple", "LLAMA_SPECULATIVE_SIMPLE", "reference")


@pytest.fixture(scope="session")
def server_binary() -> Path:
    """llama.cpp's llama-server (``built_tool``)."""
    return built_tool("llama-server", "LLAMA_SERVER", "server")


@pytest.fixture(scope="session")
def lookup_create() -> Path:
    """llama.cpp's llama-lookup-create (``built_tool``)."""
    return built_tool("llama-lookup-create", "LLAMA_LOOKUP_CREATE", "lookup-create")


def heldout_sequences(llama, seq_len: int, n: int) -> list[list[int]]:
    """``n`` token sequences of ``seq_len`` tokenized by ``llama`` (a training.llama_ref.LlamaMTP), from held-out
    files spread evenly over the held-out split."""
    from training.corpus import load_corpus, split_corpus

    _, held = split_corpus(load_corpus())
    seqs = []
    for f in held[:: max(1, len(held) // n)]:
        ids = llama.tokenize(f.text)
        if len(ids) >= seq_len:
            seqs.append(ids[:seq_len])
    assert len(seqs) >= 3
    return seqs[:n]


def pooled_runs(session, prompts, max_tokens: int, n_max: int, columns: tuple[str, ...]) -> tuple:
    """Greedy runs of every prompt at ``n_max``: the pooled acceptance rate, then each of ``columns``
    concatenated over the runs."""
    traces = [session.generate(p, max_tokens=max_tokens, n_max=n_max) for p in prompts]
    drafted = sum(int(t.n_drafted.sum()) for t in traces)
    accepted = sum(int(t.n_accepted.sum()) for t in traces)
    return (accepted / drafted, *(np.concatenate([t.columns[c] for t in traces]) for c in columns))


FAULTS = r"""
import json, resource, sys, mtp_explorer as mx
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
first, second = json.loads(sys.argv[2]), json.loads(sys.argv[3])
with mx.Session.open(sys.argv[1], n_ctx=1024, threads=1) as s:
    s.generate(first.pop("prompt"), **first)
    before = faults()
    s.generate(second.pop("prompt"), **second)
    print(faults() - before)
"""


def page_faults_of_second_generation(model: Path, first: dict, second: dict) -> int:
    """The minor page faults of a session's second generation (``Session.generate`` keywords and ``prompt``) after its
    first, in a new process: memory a generation touches for the first time, which one-time costs show as."""
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, str(model), json.dumps(first), json.dumps(second)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1])
