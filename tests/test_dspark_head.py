"""A SYNTHETIC (random-weight) DSpark draft head (``training/dspark.py``) converted by llama.cpp's own converter,
for llama.cpp's ``draft-dspark``: the layout the converter writes (arch ``dflash`` with the Markov head, and the
confidence head when there is one), llama-speculative-simple loads and drafts with it and prints the target's
plain greedy text, its first block draft is the PyTorch head's (anchor-first, Markov chain; with ``p_min`` cut where
the PyTorch confidence first falls under it), and without a confidence head ``p_min > 0`` is refused.  Not the
quality of a trained head.

The last two tests are about the trained head that ships (``training.dspark``: ``training/dspark-head.pt`` and
``mtp_explorer/models/pystdlib-dspark.gguf``): it converts again to the shipped file byte for byte, llama.cpp drafts
what the PyTorch head drafts, and in the engine greedy output with it is plain and its confidence head cuts drafts.
"""

from __future__ import annotations

import subprocess

import gguf
import pytest
import torch

from training import dspark as S

pytestmark = pytest.mark.train

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("dspark")
    return {
        conf: S.random_dspark_head_gguf(work / f"dspark-{conf}.gguf", work / f"w{conf}", confidence_head=conf)
        for conf in (True, False)
    }


def _field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("conf", [True, False])
def test_layout(heads, bundled_model, conf):
    r, t = gguf.GGUFReader(str(heads[conf])), gguf.GGUFReader(str(bundled_model))
    assert _field(r, "general.architecture") == "dflash"
    assert _field(r, "general.name").startswith("SYNTHETIC")
    assert list(_field(r, "dflash.target_layers")) == [1, 2, 3]
    assert _field(r, "dflash.block_size") == 4
    assert _field(r, "dflash.sample_from_anchor") is True
    assert _field(r, "dflash.has_confidence_head") is conf
    assert _field(r, "dflash.embedding_length") == _field(t, "qwen35.embedding_length")
    assert _field(r, "tokenizer.ggml.mask_token_id") == 4095
    shapes = {x.name: [int(s) for s in x.shape] for x in r.tensors}
    n_vocab = len(_field(t, "tokenizer.ggml.tokens"))
    rank = S.DSparkConfig().markov_rank
    assert shapes["markov_w1.weight"] == shapes["markov_w2.weight"] == [rank, n_vocab]
    if conf:
        assert shapes["conf_proj.weight"] == [256 + rank, 1] and shapes["conf_proj.bias"] == [1]
    else:
        assert not {"conf_proj.weight", "conf_proj.bias"} & set(shapes)
    assert not {"token_embd.weight", "output.weight", "d2t"} & set(shapes)


@pytest.mark.parametrize("conf", [True, False])
@pytest.mark.reference
def test_speculative_simple_drafts_and_gives_the_plain_greedy_text(heads, bundled_model, reference_binary, conf):
    from training.draft import greedy_pieces
    from training.llama_ref import LlamaMTP

    with LlamaMTP(bundled_model, n_ctx=1024, n_threads=1) as m:
        plain = greedy_pieces(m, PROMPT, 40)
    for p_min in (None, 0.3) if conf else (None,):
        r = S.run_totals(
            S.spec_command(heads[conf], PROMPT, p_min=p_min, binary=reference_binary, target=bundled_model)
        )
        assert r["rc"] == 0, r["stderr_tail"]
        assert int(r["totals"]["n_drafted"]) > 0, r["totals"]
        out = r["text"].lstrip("\n")
        assert out.startswith(PROMPT), out
        gen = out[len(PROMPT) :].rstrip("\n")
        assert len(gen) > 20 and plain.startswith(gen), (gen, plain)


@pytest.mark.reference
def test_no_confidence_head_refuses_p_min(heads, bundled_model, reference_binary):
    cmd = S.spec_command(heads[False], PROMPT, p_min=0.3, binary=reference_binary, target=bundled_model)
    p = subprocess.run(cmd, capture_output=True, timeout=120)
    assert p.returncode != 0
    assert b"DSpark draft has no confidence head" in p.stderr


@pytest.mark.parametrize("p_min", [None, 0.3, 0.5])
def test_llama_cpp_drafts_what_the_pytorch_head_drafts(heads, p_min):
    head = S.random_dspark_head(0, confidence_head=True)
    res = S.check_first_draft(head, heads[True], p_min=p_min)
    assert res["ok"], res


def test_the_shipped_head_converts_again_and_its_confidence_cuts_drafts():
    """The trained head (``mtp_explorer/models/pystdlib-dspark.gguf``, listed by ``mx.draft_heads()``, at most 3 MB)
    is what llama.cpp's converter makes of the shipped weights (``training/dspark-head.pt``, the GGUF's F16 values),
    byte for byte.  In the engine, greedy output with it is the plain greedy output, its first slot is accepted often
    (a trained head, not a random one), and ``p_min`` 0.5 drops drafts on its confidence head's word, with a higher
    acceptance of what is left."""
    import tempfile
    from pathlib import Path

    import mtp_explorer as mx

    assert S.SHIPPED_GGUF.stat().st_size <= 3_000_000 and S.SHIPPED_HEAD.stat().st_size <= 3_000_000
    heads = {h.spec_type: h for h in mx.draft_heads()}
    assert heads["draft-dspark"].head_path == S.SHIPPED_GGUF
    head, meta = S.load_head(S.SHIPPED_HEAD)
    assert head.cfg.confidence_head and meta["steps"] > 0
    with tempfile.TemporaryDirectory() as tmp:
        again = S.convert_head(
            head, Path(tmp) / "again.gguf", Path(tmp), name=S.HEAD_NAME, description=S.describe_training(meta)
        )
        assert again.read_bytes() == S.SHIPPED_GGUF.read_bytes()
    prompts = ("def fib(n):", "class Point:\n    def __init__(self, x, y):\n", "import os\n\n\ndef walk(top):\n")
    with mx.Session.open(heads["draft-dspark"].target_path, n_ctx=1024, threads=1, draft_model=S.SHIPPED_GGUF) as s:
        plain = [s.generate(p, max_tokens=48, n_max=0) for p in prompts]
        one = [s.generate(p, max_tokens=48, n_max=1, drafter="draft-dspark") for p in prompts]
        block = [s.generate(p, max_tokens=48, n_max=4, drafter="draft-dspark") for p in prompts]
        cut = [s.generate(p, max_tokens=48, n_max=4, p_min=0.5, drafter="draft-dspark") for p in prompts]
    for runs in (one, block, cut):
        assert [t.tokens for t in runs] == [t.tokens for t in plain]

    def totals(runs):
        return sum(int(t.n_drafted.sum()) for t in runs), sum(int(t.n_accepted.sum()) for t in runs)

    drafted, accepted = totals(one)
    assert drafted > 0 and accepted / drafted > 0.5
    (d_all, a_all), (d_cut, a_cut) = totals(block), totals(cut)
    assert 0 < d_cut < d_all and a_cut / d_cut > a_all / d_all


def test_llama_cpp_drafts_what_the_shipped_pytorch_head_drafts():
    """The shipped head's first block (anchor-first, Markov chain) in llama.cpp is the PyTorch head's, and at
    ``p_min`` 0.5 it is cut where the PyTorch confidence head first falls under 0.5."""
    head, _ = S.load_head(S.SHIPPED_HEAD)
    for p_min in (None, 0.5):
        res = S.check_first_draft(head, S.SHIPPED_GGUF, p_min=p_min)
        assert res["ok"], res
