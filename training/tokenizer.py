"""The demo model's byte-level BPE tokenizer, trained with Hugging Face ``tokenizers``.

It is built to tokenize exactly as llama.cpp does for a ``gpt2`` tokenizer model with
``tokenizer.ggml.pre = "qwen2"``: the pre-tokenizer is the very regex llama.cpp maps
``qwen2`` to (it has a hand-written splitter for it in unicode.cpp), followed by GPT-2's
byte-to-unicode mapping; merges are applied by rank in both.  ``qwen2`` rather than
``gpt-2`` because llama.cpp switches ``clean_spaces`` off for it, so detokenizing keeps
Python's ``from . import x`` intact; it also splits digits singly and groups newline runs.

The vocabulary is ``VOCAB_SIZE - 1`` learnt tokens (256 byte tokens first) plus the
control token ``<|endoftext|>`` (last id), which separates files in the training stream
and is the GGUF's EOS/BOS.  The string ``<|endoftext|>`` inside a text is tokenized as
plain text (``encode_special_tokens``), as llama.cpp does without ``parse_special``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: encoding token files needs neither mtp_explorer nor gguf (a GPU box)
    from mtp_explorer.models.gguf_qwen35 import ByteBPEVocab

VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"
PRE = "qwen2"


@dataclass
class TokenizerConfig:
    """Settings of the tokenizer training run."""

    vocab_size: int = VOCAB_SIZE
    min_frequency: int = 2
    pre: str = PRE


def _build_untrained(pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from mtp_explorer.models.gguf_qwen35 import PRE_TOKENIZER_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_REGEX[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig | None = None):
    """Train and return a ``tokenizers.Tokenizer`` (deterministic for the same texts)."""
    from tokenizers import pre_tokenizers, trainers

    cfg = cfg or TokenizerConfig()
    tok = _build_untrained(cfg.pre)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size - 1,
        min_frequency=cfg.min_frequency,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    tok.add_special_tokens([EOS_TOKEN])
    tok.encode_special_tokens = True
    return tok


def tokenizer_from_vocab(vocab: ByteBPEVocab):
    """Rebuild the ``tokenizers.Tokenizer`` from a GGUF vocabulary (tokens + merges + types)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    base = {t: i for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.token_types)) if ty != 3}
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tok = Tokenizer(models.BPE(vocab=base, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _build_untrained(vocab.pre).pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.token_types)):
        if ty == 3:
            if tok.add_special_tokens([AddedToken(t, special=True, normalized=False)]) != 1 or tok.token_to_id(t) != i:
                raise ValueError(f"control token {t!r} is not at the end of the vocabulary")
    tok.encode_special_tokens = True
    return tok


def vocab_from_gguf(path: str | Path) -> ByteBPEVocab:
    """The ``gpt2`` vocabulary embedded in a GGUF file."""
    import gguf

    from mtp_explorer.models.gguf_qwen35 import ByteBPEVocab

    reader = gguf.GGUFReader(str(path))

    def strings(key: str) -> list[str]:
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    types = [
        int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
        for i in reader.fields["tokenizer.ggml.token_type"].data
    ]
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    pre = reader.fields["tokenizer.ggml.pre"].contents()
    return ByteBPEVocab(
        tokens=strings("tokenizer.ggml.tokens"),
        merges=strings("tokenizer.ggml.merges"),
        token_types=types,
        eos_id=eos,
        bos_id=eos,
        pre=pre,
    )


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by :func:`save_tokenizer`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return tok


def save_tokenizer(tok, path: str | Path) -> Path:
    """Save as a ``tokenizer.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def eos_id(tok) -> int:
    """Id of ``<|endoftext|>``."""
    return int(tok.token_to_id(EOS_TOKEN))


def encode(tok, text: str) -> list[int]:
    """Token ids of ``text``: no special tokens added, and ``<|endoftext|>`` in the text is plain text.

    This is llama.cpp's ``llama_tokenize(..., add_special=false, parse_special=false)``.
    """
    return tok.encode(text, add_special_tokens=False).ids


def encode_files(tok, texts: Sequence[str]) -> list[int]:
    """One stream: each text's ids followed by ``<|endoftext|>``."""
    eos = eos_id(tok)
    out: list[int] = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eos)
    return out


def to_gguf_vocab(tok, pre: str = PRE) -> ByteBPEVocab:
    """The vocabulary, merges and token types as :func:`write_qwen35_gguf` takes them."""
    from mtp_explorer.models.gguf_qwen35 import ByteBPEVocab

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {a["content"]: a["id"] for a in spec.get("added_tokens", [])}
    n = max(list(vocab.values()) + list(added.values())) + 1
    tokens = [""] * n
    types = [1] * n
    for t, i in vocab.items():
        tokens[i] = t
    for t, i in added.items():
        tokens[i] = t
        types[i] = 3
    if any(t == "" for t in tokens):
        raise ValueError("token ids are not contiguous")
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in spec["model"]["merges"]]
    eos = added[EOS_TOKEN]
    return ByteBPEVocab(tokens=tokens, merges=merges, token_types=types, eos_id=eos, bos_id=eos, pre=pre)
