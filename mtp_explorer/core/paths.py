"""Where the bundled demo model lies: the files ship in ``mtp_explorer/models/``, and a session opened without a model
path (core) opens it without importing the models layer above core."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelNotFoundError

#: The folder of the bundled models (``mtp_explorer/models/``).
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
BUNDLED_MODEL = "pystdlib-qwen35-mtp.gguf"


def default_model_path() -> Path:
    """The bundled demo model: a tiny qwen35 + MTP model trained on the Python standard library."""
    path = MODELS_DIR / BUNDLED_MODEL
    if not path.exists():
        raise ModelNotFoundError(
            f"the bundled model {path} is missing; build it with `python -m training.train` or pass a model path"
        )
    return path
