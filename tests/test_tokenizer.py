"""The bundled model's tokenizer: llama.cpp tokenizes exactly as the trainer's tokenizer does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import llama_ref
from training.corpus import corpus_fingerprint, load_corpus, split_corpus
from training.tokenizer import (
    EOS_TOKEN,
    encode,
    to_gguf_vocab,
    tokenizer_from_vocab,
    train_tokenizer,
    vocab_from_gguf,
)

EDGE_CASES = [
    "",
    " ",
    "\n",
    "x",
    "def f(a, b=2, *args, **kwargs):\n    return a+b  # sum\n",
    "class A(B):\n\tdef m(self):\n\t\tpass\n",
    "if x:\n        y = 1\n\n\n\n    z = '''doc'''\r\n",
    "   leading spaces and trailing spaces   \n   \n",
    "tabs\t\t\tand\t mixed \t whitespace\u00a0nbsp\u3000ideographic space",
    "numbers 0 7 42 3.14159 1e-10 0x1F 1_000_000 ١٢٣ ²",
    "it's they're we've I'm you'll he'd IT'S DON'T",
    "ünïcødé naïve café Ελληνικά русский текст עברית العربية हिन्दी",
    "日本語のテキスト 中文字符 한국어 텍스트",
    "emoji 😀🐍 ZWJ 👩\u200d💻 flags 🇫🇷 skin 👍🏽",
    "combining e\u0301 a\u0308 o\u0302\u0323 Z\u0335\u0321",
    "symbols → ← ≤ ≥ ∑ ∫ € £ ¥ © ® ™ § ¶ • … — – «» „“",
    "control \x00\x01\x1b[0m bell\x07 del\x7f",
    "<|endoftext|> is text here, not a control token",
    "a" * 300 + " " * 40 + "b" * 17 + "\n" * 9 + "_" * 33,
    "from . import x\nfrom .. import y\nprint('a' , 'b' ,\"c\" ! ?)\n",
    '@decorator\nasync def f():\n    await g()  # noqa: E501\n    return f"{x!r:>10}"\n',
]


@pytest.fixture(scope="module")
def model_path(bundled_model) -> Path:
    return bundled_model


@pytest.fixture(scope="module")
def llm(model_path):
    m = llama_ref.LlamaMTP(model_path, n_ctx=256)
    yield m
    m.close()


@pytest.fixture(scope="module")
def hf_tok(model_path):
    return tokenizer_from_vocab(vocab_from_gguf(model_path))


def test_vocabulary(model_path):
    v = vocab_from_gguf(model_path)
    assert len(v.tokens) == 4096
    assert v.pre == "qwen2"
    assert v.tokens[v.eos_id] == EOS_TOKEN and v.token_types[v.eos_id] == 3
    assert v.token_types.count(3) == 1
    assert len(v.merges) >= 3000


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_match_llama_cpp(llm, hf_tok, text):
    ours = encode(hf_tok, text)
    assert llm.tokenize(text) == ours
    assert llm.detokenize(ours) == text
    assert hf_tok.decode(ours) == text


def test_heldout_files_match_llama_cpp(llm, hf_tok):
    _, held = split_corpus(load_corpus())
    assert held
    n = 0
    for f in held:
        ours = encode(hf_tok, f.text)
        assert llm.tokenize(f.text) == ours, f.relpath
        assert llm.detokenize(ours) == f.text, f.relpath
        n += len(ours)
    assert n > 10_000


def test_control_token_is_parsed_only_when_asked(llm, model_path):
    v = vocab_from_gguf(model_path)
    assert llm.tokenize(EOS_TOKEN, parse_special=True) == [v.eos_id]
    assert v.eos_id not in llm.tokenize(EOS_TOKEN)


def test_tokenizer_is_reproducible(model_path):
    """Retraining on the same corpus gives the embedded vocabulary (skipped on another stdlib)."""
    from gguf import GGUFReader

    field = GGUFReader(str(model_path)).fields.get("mtp_explorer.corpus")
    assert field is not None, "the shipped model records the corpus it was trained on"
    recorded = json.loads(field.contents())
    files = load_corpus()
    if corpus_fingerprint(files) != recorded["fingerprint"]:
        pytest.skip("this interpreter's standard library differs from the training corpus")
    train, _ = split_corpus(files)
    again = to_gguf_vocab(train_tokenizer(f.text for f in train))
    embedded = vocab_from_gguf(model_path)
    assert again.tokens == embedded.tokens
    assert again.merges == embedded.merges
