"""A ``qwen35`` GGUF (the bundled model) as a Hugging Face checkpoint, and back through llama.cpp's own converter.

    python -m mtp_explorer.devtools.export_checkpoint --out-dir /tmp/hf     # the bundled model -> HF checkpoint
    python -m mtp_explorer.devtools.export_checkpoint --out-dir /tmp/hf --convert /tmp/converted.gguf

:func:`export_hf_checkpoint` writes what a Qwen3.5 text checkpoint holds: ``config.json``
(``Qwen3_5ForCausalLM``, ``mtp_num_hidden_layers``), ``model.safetensors`` (F32; the trunk under ``model.``,
the MTP block as ``mtp.*``, named as Qwen3.5 checkpoints name it) and ``tokenizer.json`` /
``tokenizer_config.json`` (the GGUF's byte-level BPE vocabulary and merges, with the pre-tokenizer that
``tokenizer.ggml.pre`` names).  The tensors are the inverse of :mod:`.qwen35_hf`'s mapping, so converting
the checkpoint gives back the file's tensors bit for bit (F16 matrices are widened to F32 exactly).

:func:`convert_with_llama_cpp` runs ``convert_hf_to_gguf.py`` from the llama-cpp-python 0.3.36 sdist
(``build/sdist``, which ``make`` downloads; only the converter's files are extracted from the tarball when the
tree is not) in a subprocess, with the sdist's ``gguf-py`` first on ``PYTHONPATH``.  Its files are not edited.
The one thing it cannot do alone is name our tokenizer's pre-tokenizer: it recognises pre-tokenizers by a hash
of a whole tokenizer's output, which only lists published models.  :mod:`._convert_launcher` adds our tokenizer
to that list at run time, the way llama.cpp's ``convert_hf_to_gguf_update.py`` would add it to the source, under
the name whose llama.cpp regex the tokenizer's ``Split`` step uses (:func:`pre_tokenizer_name`; ``qwen2`` for the
bundled model, whose tokenizer was trained with that regex and tokenizes as llama.cpp does).

:func:`diff_gguf` lists the metadata and tensor differences of two GGUF files.  Between the bundled model and
its conversion they were, before our writer (:mod:`mtp_explorer.models.gguf_qwen35`) was made to match:
``{arch}.attention.recurrent_layers`` (one bool per block, written by the converter from ``layer_types``) and
``general.size_label`` (``gguf.size_label`` of the parameter count), both missing from ours.  What remains is
inherent: the file's name, description and licence (:data:`INHERENT_KEYS`), the training record
(``mtp_explorer.*``) and the order of the tensors (the converter keeps the checkpoint's, alphabetical in a
safetensors file; llama.cpp looks tensors up by name).  Tensor names, shapes, types (F16 matrices; F32 norms,
``ssm_a``, ``ssm_dt.bias`` and the conv kernel) and bytes are identical.  The bundled file was rewritten with the
matching writer (``python -m training.export --rewrite``: the same tensor bytes, the two keys added).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import ConverterError, ParameterError
from ..models.gguf_qwen35 import ARCH, PRE_TOKENIZER_REGEX, Qwen35Config, read_qwen35_metadata
from .qwen35_hf import config_from_metadata, gguf_to_hf
from .tool import run_tool

__all__ = [
    "LLAMA_CPP_VERSION",
    "CONVERTER_ENV_VAR",
    "export_hf_checkpoint",
    "read_gguf_for_export",
    "float_tensors",
    "GGUFTokenizer",
    "write_checkpoint",
    "hf_tensor_name",
    "hf_config",
    "tokenizer_files",
    "find_converter",
    "convert_with_llama_cpp",
    "pre_tokenizer_name",
    "GGUFDiff",
    "diff_gguf",
    "INHERENT_KEYS",
]

LLAMA_CPP_VERSION = "0.3.36"
CONVERTER_ENV_VAR = "MTP_EXPLORER_CONVERTER"
ROOT = Path(__file__).resolve().parents[2]
SDIST_DIR = ROOT / "build" / "sdist"
_TREE = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp"
#: what the converter needs from the sdist (paths under vendor/llama.cpp)
_CONVERTER_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
_LAUNCHER = Path(__file__).with_name("_convert_launcher.py")

#: metadata that describes a file rather than the model, and so differs between any two writers
INHERENT_KEYS = (
    "general.name",
    "general.description",
    "general.license",
    "general.basename",
    "general.finetune",
    "general.version",
    "general.quantized_by",
)

_CONTROL = 3  # gguf.TokenType.CONTROL


def _f32_literal(x: float) -> float:
    """The shortest decimal that reads back as the float32 ``x`` (``9.99999997e-07`` -> ``1e-06``)."""
    return float(str(np.float32(x)))


def hf_config(cfg: Qwen35Config, *, eos_id: int, bos_id: int | None, tied: bool) -> dict:
    """``config.json`` of a ``Qwen3_5ForCausalLM`` with ``cfg``'s hyperparameters and one MTP block."""
    if cfg.n_rot % 2 or int(cfg.head_dim * (cfg.n_rot / cfg.head_dim)) != cfg.n_rot:
        raise ParameterError(
            f"rotary dimensions {cfg.n_rot} of head_dim {cfg.head_dim} have no exact partial_rotary_factor"
        )
    sections = list(cfg.sections)
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": cfg.n_vocab,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.n_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head_kv,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.n_ctx_train,
        "rms_norm_eps": _f32_literal(cfg.rms_eps),
        "tie_word_embeddings": tied,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _f32_literal(cfg.rope_freq_base),
            "partial_rotary_factor": cfg.n_rot / cfg.head_dim,
            "mrope_section": sections if sections[3] else sections[:3],
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": cfg.ssm_conv_kernel,
        "linear_key_head_dim": cfg.ssm_state_size,
        "linear_value_head_dim": cfg.ssm_state_size,
        "linear_num_key_heads": cfg.ssm_group_count,
        "linear_num_value_heads": cfg.ssm_time_step_rank,
        "layer_types": ["linear_attention" if cfg.is_recurrent(i) else "full_attention" for i in range(cfg.n_layer)],
        "full_attention_interval": cfg.full_attention_interval,
        "mtp_num_hidden_layers": cfg.nextn_predict_layers,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
        "use_cache": True,
    }


def tokenizer_files(
    tokens: Sequence[str],
    token_types: Sequence[int],
    merges: Sequence[str],
    *,
    pre: str,
    eos_id: int,
    bos_id: int | None,
    add_bos: bool,
    n_ctx: int,
) -> tuple[dict, dict]:
    """(``tokenizer.json``, ``tokenizer_config.json``) of a GGUF ``gpt2`` vocabulary: a byte-level BPE whose
    pre-tokenizer is llama.cpp's regex for ``pre`` (:data:`mtp_explorer.models.gguf_qwen35.PRE_TOKENIZER_REGEX`)
    followed by GPT-2's byte mapping; control tokens become special added tokens."""
    if pre not in PRE_TOKENIZER_REGEX:
        raise ParameterError(f"pre-tokenizer {pre!r} is not one of {sorted(PRE_TOKENIZER_REGEX)}")
    vocab: dict[str, int] = {}
    added: list[dict] = []
    for i, (tok, ty) in enumerate(zip(tokens, token_types)):
        if ty == _CONTROL:
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            )
        elif ty == 1:
            vocab[tok] = i
        else:
            raise ParameterError(f"token {i} ({tok!r}) has type {ty}: only normal and control tokens are exported")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": PRE_TOKENIZER_REGEX[pre]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [m.split(" ", 1) for m in merges],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": n_ctx,
        "eos_token": tokens[eos_id],
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    }
    if bos_id is not None:
        config["bos_token"] = tokens[bos_id]
    return tokenizer, config


def _read_gguf(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ParameterError(f"{path} is not a readable GGUF file: {exc}") from exc


def export_hf_checkpoint(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the ``qwen35`` + MTP model in ``gguf_path`` (F16/F32) as a Hugging Face checkpoint in ``out_dir``
    (created): ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``.
    Returns ``out_dir``. Raises :class:`ParameterError` for another architecture, a file without an MTP block,
    quantized tensors or token types other than normal and control."""
    gguf_path = Path(gguf_path)
    meta = read_gguf_for_export(gguf_path, ARCH)
    if not meta.get(f"{ARCH}.nextn_predict_layers"):
        raise ParameterError(f"{gguf_path} has no MTP (nextn) block")
    cfg = config_from_metadata(meta)
    reader = _read_gguf(gguf_path)
    tensors = float_tensors(reader, gguf_path)
    sd = gguf_to_hf(tensors, cfg)
    tied = "output.weight" not in tensors
    if not tied:
        sd["lm_head.weight"] = tensors["output.weight"]
    vocab = GGUFTokenizer.read(reader, meta, n_ctx=cfg.n_ctx_train)
    config = hf_config(cfg, eos_id=vocab.eos_id, bos_id=vocab.bos_id, tied=tied)
    return write_checkpoint(out_dir, sd, config, vocab)


def read_gguf_for_export(gguf_path: Path, arch: str | tuple[str, ...]) -> dict[str, object]:
    """The metadata of ``gguf_path`` (:func:`~mtp_explorer.models.gguf_qwen35.read_qwen35_metadata`) after checking that
    the file exists, is of architecture ``arch`` (or one of them) and has a ``gpt2`` (byte-level BPE) tokenizer."""
    if not gguf_path.is_file():
        raise FileNotFoundError(f"model file not found: {gguf_path}")
    meta = read_qwen35_metadata(gguf_path)
    archs = (arch,) if isinstance(arch, str) else arch
    if meta.get("general.architecture") not in archs:
        raise ParameterError(
            f"{gguf_path}: architecture {meta.get('general.architecture')!r}, not {' or '.join(map(repr, archs))}"
        )
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ParameterError(f"{gguf_path}: tokenizer model {meta.get('tokenizer.ggml.model')!r}, not 'gpt2'")
    return meta


def float_tensors(reader, gguf_path: Path) -> dict[str, np.ndarray]:
    """Every tensor of an F32/F16 GGUF as F32 (numpy shapes: ggml's reversed); :class:`ParameterError` for another
    type."""
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.tensor_type.name not in ("F32", "F16"):
            raise ParameterError(f"{gguf_path}: tensor {t.name} is {t.tensor_type.name}; only F32/F16 files export")
        tensors[t.name] = np.asarray(t.data, dtype=np.float32)
    return tensors


@dataclass(frozen=True)
class GGUFTokenizer:
    """A GGUF ``gpt2`` vocabulary as Hugging Face tokenizer files (:func:`tokenizer_files`) and its special ids."""

    tokenizer: dict
    config: dict
    eos_id: int
    bos_id: int | None

    @classmethod
    def read(cls, reader, meta: dict[str, object], *, n_ctx: int) -> GGUFTokenizer:
        def value(key: str):
            return reader.fields[key].contents() if key in reader.fields else None

        eos_id, bos_id = int(meta["tokenizer.ggml.eos_token_id"]), meta.get("tokenizer.ggml.bos_token_id")
        bos_id = None if bos_id is None else int(bos_id)
        tokenizer, config = tokenizer_files(
            value("tokenizer.ggml.tokens"),
            value("tokenizer.ggml.token_type"),
            value("tokenizer.ggml.merges"),
            pre=str(meta["tokenizer.ggml.pre"]),
            eos_id=eos_id,
            bos_id=bos_id,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            n_ctx=n_ctx,
        )
        return cls(tokenizer, config, eos_id, bos_id)


def write_checkpoint(out_dir: str | Path, sd: dict[str, np.ndarray], config: dict, vocab: GGUFTokenizer) -> Path:
    """Write a Hugging Face checkpoint in ``out_dir`` (created): ``model.safetensors`` (``sd``), ``config.json``
    (``config``), ``tokenizer.json`` and ``tokenizer_config.json`` (``vocab``); returns ``out_dir``."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    _write_json(out / "tokenizer.json", vocab.tokenizer)
    _write_json(out / "tokenizer_config.json", vocab.config)
    return out


def hf_tensor_name(
    name: str, global_names: Mapping[str, str], block_table: Callable[[int], Sequence[tuple[str, str]]], *, arch: str
) -> str:
    """The checkpoint name of the GGUF tensor ``name``: ``global_names[name]``, or for ``blk.{i}.X`` the
    ``model.layers.{i}.H`` of the pair ``(H, X)`` in ``block_table(i)``. Raises :class:`ParameterError` for a tensor
    without one (``arch`` names the checkpoint's class in the message)."""
    if name in global_names:
        return global_names[name]
    block, _, rest = name.partition(".")[2].partition(".")
    if name.startswith("blk.") and block.isdigit():
        for hf, gg in block_table(int(block)):
            if rest == gg:
                return f"model.layers.{block}.{hf}"
    raise ParameterError(f"tensor {name} has no {arch} name")


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def find_converter(converter: str | Path | None = None, *, sdist_dir: str | Path | None = None) -> Path:
    """The ``convert_hf_to_gguf.py`` to run: ``converter`` (the script or its llama.cpp directory) if given, else
    ``$MTP_EXPLORER_CONVERTER``, else the one in the llama-cpp-python sdist under ``sdist_dir`` (default
    ``build/sdist``), extracting just the converter's files from the sdist tarball there when the tree is not
    extracted. Raises :class:`ConverterError` saying how to get it."""
    if converter is None and os.environ.get(CONVERTER_ENV_VAR):
        converter = os.environ[CONVERTER_ENV_VAR]
    if converter is not None:
        path = Path(converter)
        path = path / "convert_hf_to_gguf.py" if path.is_dir() else path
        if not path.is_file():
            raise ConverterError(f"llama.cpp converter not found at {path}")
        return path
    sdist = Path(sdist_dir) if sdist_dir is not None else SDIST_DIR
    tree = sdist / _TREE
    path = tree / "convert_hf_to_gguf.py"
    if all((tree / m).exists() for m in _CONVERTER_MEMBERS):
        return path
    tarball = sdist / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
    if not tarball.is_file():
        raise ConverterError(
            f"llama.cpp's convert_hf_to_gguf.py not found: neither {path} nor the sdist {tarball} exists. Get the "
            f"llama-cpp-python {LLAMA_CPP_VERSION} sdist with `make build/llama-cpp-headers/src/llama-ext.h` "
            f"(`make test` does), or set {CONVERTER_ENV_VAR} to a convert_hf_to_gguf.py beside its conversion/ and "
            "gguf-py/."
        )
    prefixes = tuple(f"{_TREE}/{m}" for m in _CONVERTER_MEMBERS)
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefixes) and (m.isfile() or m.isdir())]
        if not members:
            raise ConverterError(f"{tarball} has no {_TREE}/convert_hf_to_gguf.py")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12
        tar.extractall(sdist, members=members, **safe)
    return path


def pre_tokenizer_name(hf_dir: str | Path) -> str | None:
    """The ``tokenizer.ggml.pre`` name whose llama.cpp regex is the ``Split`` pattern of ``hf_dir/tokenizer.json``'s
    pre-tokenizer (followed by a byte-level step), or ``None`` when it is not one of
    :data:`mtp_explorer.models.gguf_qwen35.PRE_TOKENIZER_REGEX`."""
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    pre = json.loads(path.read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    if len(steps) != 2 or steps[0].get("type") != "Split" or steps[1].get("type") != "ByteLevel":
        return None
    regex = (steps[0].get("pattern") or {}).get("Regex")
    return next((name for name, rx in PRE_TOKENIZER_REGEX.items() if rx == regex), None)


def convert_with_llama_cpp(
    hf_dir: str | Path,
    out_path: str | Path,
    *,
    converter: str | Path | None = None,
    outtype: str = "f16",
    pre_tokenizer: str | None = None,
    timeout: float = 600.0,
    extra_args: Sequence[str] = (),
    config_json: bool = False,
) -> Path:
    """Convert the Hugging Face checkpoint ``hf_dir`` to ``out_path`` with llama.cpp's ``convert_hf_to_gguf.py``
    (:func:`find_converter`) as ``convert_hf_to_gguf.py HF_DIR --outfile OUT --outtype OUTTYPE [extra_args]``, in a
    subprocess with the sdist's ``gguf-py`` first on ``PYTHONPATH``.

    ``pre_tokenizer`` names the tokenizer's llama.cpp pre-tokenizer for the converter's hash check (default:
    :func:`pre_tokenizer_name`; see :mod:`._convert_launcher`). With ``config_json`` the converter reads the
    hyperparameters from ``config.json`` as is, not through transformers' ``AutoConfig`` (as under the converter's
    pinned transformers, for a model type that the project's transformers knows in another form: ``step3p5``;
    ``--config-json`` of :mod:`._convert_launcher`). Raises :class:`ConverterError` with the
    converter's output when it is missing, fails, runs past ``timeout`` seconds or writes nothing.
    """
    script = find_converter(converter)
    hf_dir, out = Path(hf_dir), Path(out_path)
    if not (hf_dir / "config.json").is_file():
        raise ConverterError(f"{hf_dir} is not a Hugging Face checkpoint (no config.json)")
    pre = pre_tokenizer or pre_tokenizer_name(hf_dir)
    cmd = [sys.executable, str(_LAUNCHER), str(script)]
    if pre is not None:
        cmd += ["--register-pre", f"{hf_dir.resolve()}={pre}"]
    if config_json:
        cmd += ["--config-json", str(hf_dir.resolve())]
    cmd += ["--", str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra_args]
    gguf_py = script.parent / "gguf-py"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(gguf_py), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("NO_LOCAL_GGUF", None)
    return run_tool(cmd, out, ConverterError, timeout=timeout, env=env)


@dataclass
class GGUFDiff:
    """The differences of two GGUF files, one line each: metadata keys (missing on a side, or other values)
    and tensors (missing, other shape, other type, other data)."""

    metadata: list[str] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.metadata or self.tensors)

    def __str__(self) -> str:
        return "\n".join(self.metadata + self.tensors) or "no differences"


def _values(reader) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, fld in reader.fields.items():
        if not key.startswith("GGUF."):
            out[key] = ("[" + fld.types[-1].name + "]" if len(fld.types) > 1 else fld.types[0].name, fld.contents())
    return out


def _short(v: object, n: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def diff_gguf(
    a: str | Path, b: str | Path, *, ignore_keys: Sequence[str] = (), data: bool = True, order: bool = False
) -> GGUFDiff:
    """What differs between the GGUF files ``a`` and ``b``: metadata (value types and values, but not the keys
    in ``ignore_keys``) and tensors (names, shapes, types and, with ``data``, the stored bytes; tensors of two
    float types are compared by value and reported with both types; with ``order``, the order of the tensors,
    which llama.cpp does not depend on: the converter writes them in the checkpoint's order)."""
    ra, rb = _read_gguf(Path(a)), _read_gguf(Path(b))
    va, vb = _values(ra), _values(rb)
    diff = GGUFDiff()
    for key in sorted(set(va) | set(vb)):
        if key in ignore_keys:
            continue
        if key not in vb:
            diff.metadata.append(f"{key}: only in {Path(a).name} = {_short(va[key])}")
        elif key not in va:
            diff.metadata.append(f"{key}: only in {Path(b).name} = {_short(vb[key])}")
        elif va[key] != vb[key]:
            diff.metadata.append(f"{key}: {_short(va[key])} != {_short(vb[key])}")
    order_a = [t.name for t in ra.tensors]
    order_b = [t.name for t in rb.tensors]
    ta, tb = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    for name in sorted(set(ta) | set(tb)):
        if name not in tb or name not in ta:
            diff.tensors.append(f"{name}: only in {Path(a).name if name in ta else Path(b).name}")
            continue
        x, y = ta[name], tb[name]
        shape_x, shape_y = [int(s) for s in x.shape], [int(s) for s in y.shape]
        if shape_x != shape_y:
            diff.tensors.append(f"{name}: shape {shape_x} != {shape_y}")
            continue
        tx, ty = x.tensor_type.name, y.tensor_type.name
        if tx != ty:
            same = data and np.array_equal(np.asarray(x.data, np.float32), np.asarray(y.data, np.float32))
            diff.tensors.append(f"{name}: type {tx} != {ty}" + (" (equal values)" if same else ""))
        elif data and bytes(np.asarray(x.data).tobytes()) != bytes(np.asarray(y.data).tobytes()):
            diff.tensors.append(f"{name}: data differs")
    if order and set(ta) == set(tb) and order_a != order_b:
        diff.tensors.append("tensor order differs")
    return diff
