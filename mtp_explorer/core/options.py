"""How a session is opened: its options, checked once, and the engine's options struct built from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import native
from .checks import check_bool, check_int
from .errors import ModelLoadError, ParameterError
from .info import ModelInfo, pair_with_head

#: The engine's defaults of every option (native_ext/engine.h, placement.h): the one place they are written. The
#: records here read theirs from them; :meth:`Session.open <mtp_explorer.Session.open>` spells them out in its
#: signature, checked equal by the tests.
ENGINE_DEFAULTS = native.EngineOptions()
PLACEMENT_DEFAULTS = native.Placement()
DEFAULT_N_RS_SEQ: int = ENGINE_DEFAULTS.n_rs_seq
MAX_TOPK = native.DRAFT_N_CANDIDATES
MAX_PARALLEL = 256  # llama.cpp's LLAMA_MAX_SEQ
CLOCKS = ("wall", "cpu")
FLASH_ATTN_VALUES: tuple[str, ...] = native.FLASH_ATTN_VALUES
"""``flash_attn`` values (llama.cpp's ``-fa``); ``True``/``False`` mean ``"on"``/``"off"``."""
KV_CACHE_TYPES: tuple[str, ...] = native.KV_CACHE_TYPES
"""``type_k``/``type_v`` values (llama.cpp's ``-ctk``/``-ctv``)."""
LOAD_MODES: tuple[str, ...] = native.LOAD_MODES
"""``load_mode`` values (llama.cpp's ``-lm``)."""
TELEMETRY_LEVELS: tuple[str, ...] = native.TELEMETRY_LEVELS
"""``telemetry`` values: ``"off"`` (the request's totals only), ``"steps"`` (a row per step: counts, settings, stop
reasons, batch shape, phase times) and ``"full"`` (also every per-depth detail: top-k, confidences, target tokens
past a rejection, hidden-state norms); ``True``/``False`` mean ``"full"``/``"steps"``."""
GPU_LAYERS_NAMES = {"auto": -1, "all": -2}
"""``n_gpu_layers`` words, as llama.cpp's ``-ngl`` takes them."""
_QUANTIZED_KV = frozenset(t for t in KV_CACHE_TYPES if t not in ("f32", "f16", "bf16"))
KV_BLOCK = 32  # values per block of every quantized KV cache type (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)


def _choice(name: str, value, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ParameterError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value


def telemetry_level(value: bool | str) -> str:
    """A ``telemetry`` value as its level name (:data:`TELEMETRY_LEVELS`; ``True``/``False``: ``"full"``/``"steps"``,
    what they meant before the levels)."""
    if isinstance(value, bool):
        return "full" if value else "steps"
    return _choice("telemetry", value, TELEMETRY_LEVELS)


def is_full_telemetry(value: bool | str | None) -> bool:
    """Whether a recorded ``telemetry`` setting (a level name, or a bool of older traces; ``None``: full) is full."""
    return value is None or telemetry_level(value) == "full"


@dataclasses.dataclass(frozen=True)
class SessionOptions:
    """The options of :meth:`Session.open <mtp_explorer.Session.open>` (see its docstring), checked.

    ``n_ctx`` is padded to a multiple of 256 as llama.cpp pads the context, so the batch is sized alike.
    The placement options keep llama.cpp's names and defaults: ``n_gpu_layers`` (``-ngl``; -1 "auto",
    -2 "all"), ``main_gpu`` (``-mg``), ``flash_attn`` (``-fa``), ``type_k``/``type_v`` (``-ctk``/``-ctv``),
    ``load_mode`` (``-lm``), ``threads_batch`` (``-tb``; ``None``: the generation threads) and ``repack``
    (``--repack``; ``False`` is ``-nr``/``--no-repack``: no extra buffer types, so no repacked CPU kernels; resolved by
    :func:`~mtp_explorer.core.cpu_kernels.resolve_repack` when a session opens). ``draft_model`` is
    the path of a draft model for ``draft-simple`` (llama.cpp's ``-md``), placed as the target. ``n_parallel`` is
    llama.cpp's ``-np``: the sequences sharing the context, ``n_ctx / n_parallel`` each.

    ``n_rs_seq`` is the number of recurrent snapshot slots per sequence, through which a recurrent target rolls back
    rejected drafts; ``capacity`` the largest ``n_max`` the session accepts (``None``: ``n_rs_seq``; at most
    ``n_rs_seq``). ``n_rs_seq=0`` gives a recurrent target no slots, as llama.cpp does when no drafter of the chain
    gets them (its ``need_n_rs_seq``: a chain of look-ups or draft-simple): a partial acceptance then restores a
    checkpoint saved before the verify, and the next step verifies the accepted tokens and the correction again,
    drafting nothing (llama-speculative-simple's and llama-server's checkpoints; ``capacity`` defaults to 8 there).
    Such a session runs the look-up drafters and draft-simple only.
    """

    n_ctx: int = ENGINE_DEFAULTS.n_ctx
    threads: int | None = None
    seed: int = 0
    n_rs_seq: int = DEFAULT_N_RS_SEQ
    capacity: int | None = None
    topk: int = ENGINE_DEFAULTS.topk
    telemetry: bool | str = ENGINE_DEFAULTS.telemetry
    clock: str = CLOCKS[int(ENGINE_DEFAULTS.cpu_clock)]
    n_gpu_layers: int = PLACEMENT_DEFAULTS.n_gpu_layers
    main_gpu: int = PLACEMENT_DEFAULTS.main_gpu
    flash_attn: str = PLACEMENT_DEFAULTS.flash_attn
    type_k: str = PLACEMENT_DEFAULTS.type_k
    type_v: str = PLACEMENT_DEFAULTS.type_v
    load_mode: str = PLACEMENT_DEFAULTS.load_mode
    threads_batch: int | None = None
    repack: bool = PLACEMENT_DEFAULTS.repack
    draft_model: str | None = None
    n_parallel: int = ENGINE_DEFAULTS.n_parallel

    def __post_init__(self) -> None:
        object.__setattr__(self, "telemetry", telemetry_level(self.telemetry))
        self._check_placement()
        check_int("n_ctx", self.n_ctx, 8, None)
        check_int("n_parallel", self.n_parallel, 1, MAX_PARALLEL)
        object.__setattr__(self, "n_ctx", -(-self.n_ctx // 256) * 256)
        check_int("n_rs_seq", self.n_rs_seq, 0, 64)
        if self.capacity is None:
            object.__setattr__(self, "capacity", self.n_rs_seq or DEFAULT_N_RS_SEQ)
        check_int("capacity", self.capacity, 1, 64)
        if self.n_rs_seq and self.capacity > self.n_rs_seq:  # type: ignore[operator]
            raise ParameterError(
                f"capacity {self.capacity} is over the {self.n_rs_seq} snapshot slots (n_rs_seq) a "
                "recurrent target rolls back through: raise n_rs_seq, or set it to 0 for checkpoints"
            )
        check_int("topk", self.topk, 1, MAX_TOPK)
        check_int("seed", self.seed, 0, 2**32 - 1)
        if self.threads is not None:
            check_int("threads", self.threads, 1, None)
        if self.clock not in CLOCKS:
            raise ParameterError(f"clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.clock == "cpu" and self.threads != 1:
            raise ParameterError("clock='cpu' needs threads=1 (llama.cpp then computes on the calling thread)")

    def _check_placement(self) -> None:
        if isinstance(self.n_gpu_layers, str):
            object.__setattr__(self, "n_gpu_layers", GPU_LAYERS_NAMES.get(self.n_gpu_layers, self.n_gpu_layers))
        if isinstance(self.n_gpu_layers, str):
            raise ParameterError(
                f"n_gpu_layers must be a number of layers, 'auto' (-1) or 'all' (-2); got {self.n_gpu_layers!r}"
            )
        check_int("n_gpu_layers", self.n_gpu_layers, -2, None)
        check_int("main_gpu", self.main_gpu, 0, None)
        if isinstance(self.flash_attn, bool):
            object.__setattr__(self, "flash_attn", "on" if self.flash_attn else "off")
        _choice("flash_attn", self.flash_attn, FLASH_ATTN_VALUES)
        _choice("type_k", self.type_k, KV_CACHE_TYPES)
        _choice("type_v", self.type_v, KV_CACHE_TYPES)
        _choice("load_mode", self.load_mode, LOAD_MODES)
        if self.type_v in _QUANTIZED_KV and self.flash_attn == "off":
            raise ParameterError(
                f"type_v={self.type_v!r} (a quantized V cache) needs flash attention: "
                "flash_attn='auto' or 'on' (llama.cpp refuses it otherwise)"
            )
        if self.threads_batch is not None:
            check_int("threads_batch", self.threads_batch, 1, None)
        check_bool("repack", self.repack, "llama.cpp's --repack / --no-repack")

    def check_model(self, info: ModelInfo, draft_info: ModelInfo | None = None) -> ModelInfo:
        """The checks that need the model (``info``) and the draft model (``draft_info``): a hybrid model needs an
        attention layer (llama.cpp aborts otherwise: a :class:`ModelLoadError`), a quantized K cache's block
        must divide the key head width when flash attention may be on (llama.cpp refuses the context otherwise), and
        the model's MTP must run in a ``draft-mtp`` mode the engine runs (:func:`check_mtp_mode`). Returns what the
        session holds: ``info``, or ``info`` paired with ``draft_info`` where that is its shared-memory MTP head."""
        if info.n_layer_attention == 0:
            raise ModelLoadError(
                f"{info.path}: a hybrid {info.arch} model with no attention layer in its "
                f"{info.n_layer} trunk layers; llama.cpp 0.3.36 aborts at its first decode "
                "(GGML_ASSERT in llama_kv_cache::set_input_k_idxs)"
            )
        n_embd_head_k = info.n_embd_head_k
        if self.type_k in _QUANTIZED_KV and self.flash_attn != "off" and n_embd_head_k % KV_BLOCK != 0:
            raise ParameterError(
                f"type_k={self.type_k!r} stores blocks of {KV_BLOCK} values, which do not divide this "
                f"model's key heads of {n_embd_head_k}; use type_k='f16', 'bf16' or 'f32'"
            )
        return check_mtp_mode(info, draft_info)

    def to_native(self, path: str) -> native.EngineOptions:
        eo = native.EngineOptions()
        eo.path, eo.n_ctx, eo.n_threads, eo.n_rs_seq = path, self.n_ctx, self.threads or 0, self.n_rs_seq
        eo.capacity = self.capacity
        eo.topk, eo.telemetry, eo.cpu_clock = self.topk, self.telemetry, self.clock == "cpu"
        eo.draft_path = self.draft_model or ""
        eo.n_parallel = self.n_parallel
        p = native.Placement()
        p.n_gpu_layers, p.main_gpu, p.load_mode = self.n_gpu_layers, self.main_gpu, self.load_mode
        p.flash_attn, p.type_k, p.type_v, p.n_threads_batch = (
            self.flash_attn,
            self.type_k,
            self.type_v,
            self.threads_batch or 0,
        )
        p.repack = self.repack
        eo.placement = p
        return eo

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that re-open a session like this one (a Dask worker uses them)."""
        return dataclasses.asdict(self)


def check_mtp_mode(info: ModelInfo, draft_info: ModelInfo | None = None) -> ModelInfo:
    """What a session of ``info`` (with ``draft_info`` as its ``draft_model``) holds: ``info``, or the pair when the
    draft model is the target's shared-memory MTP head (llama.cpp's ``-md`` with ``draft-mtp``). A head file given as
    the model, or one that does not fit its target (:func:`~mtp_explorer.core.info.pair_with_head`), is refused. The
    engine runs every mode of :data:`~mtp_explorer.core.info.MTP_MODES`."""
    if info.is_mtp_head_file:
        raise ParameterError(
            f"{info.path} is a {info.arch} MTP head file: it runs only against its target, "
            f"Session.open(target, draft_model={info.path!r}) (llama.cpp's -md)"
        )
    if draft_info is not None and draft_info.is_mtp_head_file:
        return pair_with_head(info, draft_info)  # a head that does not fit its target: ModelLoadError
    return info
