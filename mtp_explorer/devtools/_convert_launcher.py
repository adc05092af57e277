"""Run llama.cpp's ``convert_hf_to_gguf.py`` unmodified, with local tokenizers registered for its
BPE pre-tokenizer check.  Started by :func:`mtp_explorer.devtools.hf_export.convert_with_llama_cpp` as::

    python _convert_launcher.py CONVERTER [--register-pre DIR=NAME ...] [--config-json DIR ...] -- CONVERTER_ARGS...

This file is run by path, without importing ``mtp_explorer`` (whose ``gguf`` 0.19.0 would shadow the
converter's own ``gguf-py``; the caller puts that first on ``PYTHONPATH``).

Why it is needed: the converter names a byte-level BPE tokenizer's pre-tokenizer (``tokenizer.ggml.pre``)
by the sha256 of the token ids the tokenizer gives for a fixed check text (``get_vocab_base_pre`` in
``conversion/base.py``), and stops with ``NotImplementedError`` on a hash it does not list.  The hash
depends on the whole vocabulary, so a tokenizer trained by anyone else never matches.  llama.cpp's
documented way in is ``convert_hf_to_gguf_update.py``: add ``{"name": NAME, "repo": DIR}`` (a local
directory is accepted) to its model list and run it, which computes the hash exactly so
(``AutoTokenizer.from_pretrained(DIR).encode(CHK_TXT)``) and rewrites ``get_vocab_base_pre`` with one more
``if chkhsh == ...: res = NAME`` line.  That edits the converter's sources; this launcher adds the same
entries at run time instead: for each ``--register-pre DIR=NAME`` it computes the hash the same way, with
the check text read from the converter's own source, and answers ``NAME`` for that hash only when the
converter's table does not know it.  Every other step is the converter's ``main()``, run as ``__main__``.

``--config-json DIR``: the converter reads a checkpoint's hyperparameters with ``AutoConfig.from_pretrained(DIR)
.to_dict()`` and, when transformers does not know the model type, from ``config.json`` as it is
(``ModelBase.load_hparams``).  Its pinned transformers (4.57.6, ``requirements/requirements-convert_hf_to_gguf.txt``)
predates transformers' Step-3.5/3.7 support (huggingface/transformers#46658) and does not know ``step3p5``, so a
Step-3.5 checkpoint is read from ``config.json``, the keys ``Step35Model`` reads. The project's transformers (5.23) maps
``step3p5`` to ``Step3p7TextConfig``, whose ``to_dict()`` renames or drops them (``num_attention_groups`` ->
``num_key_value_heads``; ``moe_layers_enum``, ``partial_rotary_factors`` and the MTP blocks' ``layer_types`` are gone),
and the converter stops with ``KeyError: 'num_attention_groups'``.  For each ``DIR`` given,
``AutoConfig.from_pretrained`` of the converter's ``conversion/base.py`` raises, so the converter takes its own
``config.json`` path, as under its pinned transformers.
"""

from __future__ import annotations

import ast
import logging
import runpy
import sys
from hashlib import sha256
from pathlib import Path


def check_text(base_py: Path) -> str:
    """The check text (``chktxt``) of ``TextModel.get_vocab_base_pre`` in the converter's ``conversion/base.py``."""
    tree = ast.parse(base_py.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "get_vocab_base_pre":
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == "chktxt"
                ):
                    return ast.literal_eval(stmt.value)
    raise LookupError(f"no chktxt assignment in get_vocab_base_pre of {base_py}")


def tokenizer_hash(tokenizer_dir: str | Path, chktxt: str) -> str:
    """The converter's pre-tokenizer hash of the tokenizer in ``tokenizer_dir`` (as ``convert_hf_to_gguf_update.py``
    computes it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()


class _ConfigJsonOnly:
    """``AutoConfig`` but for the checkpoint directories ``dirs``, whose ``from_pretrained`` raises (the converter then
    reads their ``config.json``)."""

    def __init__(self, auto_config, dirs: set[Path]) -> None:
        self._auto, self._dirs = auto_config, dirs

    def from_pretrained(self, path, *args, **kwargs):
        if Path(path).resolve() in self._dirs:
            raise ValueError(f"{path}: hyperparameters read from config.json as is (mtp_explorer --config-json)")
        return self._auto.from_pretrained(path, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._auto, name)


def main(argv: list[str]) -> None:
    """Register the tokenizers, then run the converter's ``__main__`` with the arguments after ``--``."""
    sep = argv.index("--")
    converter = Path(argv[0]).resolve()
    own, args = argv[1:sep], argv[sep + 1 :]
    registrations = [own[i + 1] for i, a in enumerate(own) if a == "--register-pre"]
    raw_config = {Path(own[i + 1]).resolve() for i, a in enumerate(own) if a == "--config-json"}
    sys.path.insert(0, str(converter.parent))

    import conversion.base as base  # the converter's package, after gguf-py (first on PYTHONPATH)
    from conversion.base import TextModel

    if raw_config:
        base.AutoConfig = _ConfigJsonOnly(base.AutoConfig, raw_config)  # type: ignore[assignment]

    log = logging.getLogger("mtp_explorer.convert")
    chktxt = check_text(converter.parent / "conversion" / "base.py")
    known: dict[str, str] = {}
    for item in registrations:
        tok_dir, _, name = item.rpartition("=")
        known[tokenizer_hash(tok_dir, chktxt)] = name
    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            chkhsh = sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()
            if chkhsh not in known:
                raise
            log.warning("pre-tokenizer hash %s registered by mtp_explorer as %r", chkhsh, known[chkhsh])
            return known[chkhsh]

    TextModel.get_vocab_base_pre = get_vocab_base_pre  # type: ignore[method-assign]
    sys.argv = [str(converter), *args]
    runpy.run_path(str(converter), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
