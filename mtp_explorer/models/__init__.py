"""Model files and GGUF writers of mtp-explorer (qwen35 + MTP)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ModelNotFoundError

MODELS_DIR = Path(__file__).resolve().parent
BUNDLED_MODEL = "pystdlib-qwen35-mtp.gguf"
BUNDLED_DRAFT_MODEL = "pystdlib-draft.gguf"


def default_model_path() -> Path:
    """The bundled demo model: a tiny qwen35 + MTP model trained on the Python standard library."""
    path = MODELS_DIR / BUNDLED_MODEL
    if not path.exists():
        raise ModelNotFoundError(
            f"the bundled model {path} is missing; build it with `python -m training.train` "
            "or pass a model path"
        )
    return path


def draft_model_path() -> Path:
    """The bundled draft model: a tiny qwen3 trained on the same text with the bundled model's tokenizer, for
    ``Session.open(default_model_path(), draft_model=draft_model_path())`` and ``drafter="draft-simple"``."""
    path = MODELS_DIR / BUNDLED_DRAFT_MODEL
    if not path.exists():
        raise ModelNotFoundError(
            f"the bundled draft model {path} is missing; build it with `python -m training.draft`")
    return path
