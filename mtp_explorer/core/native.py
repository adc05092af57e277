"""The extension in one place: every name the package takes from ``mtp_explorer._native`` (C++, ``native_ext/``).
No other module imports the extension (``tests/test_architecture.py`` checks it); the engine itself is owned by
:class:`~mtp_explorer.core.handle.EngineHandle`, and the engine's errors are mapped to the package's exceptions in the
extension's one translator (:mod:`mtp_explorer.core.errors` names them)."""

from __future__ import annotations

from typing import TypeAlias

from .. import _native  # importing it also loads llama.cpp's libraries (libllama, ggml)

#: The extension module's file (its linked libraries are checked against it).
EXTENSION_FILE: str = _native.__file__

# -- the engine and what configures it ------------------------------------------------------------------------
Engine: TypeAlias = _native.Engine  #: owns a model, its contexts and the speculative loop (see EngineHandle)
EngineOptions: TypeAlias = _native.EngineOptions  #: what an engine is opened with
Placement: TypeAlias = _native.Placement  #: where its layers and caches go
GenerationConfig: TypeAlias = _native.GenerationConfig  #: one generation's settings
DraftParams: TypeAlias = _native.DraftParams  #: the live-tunable drafting parameters (n_max, p_min, n_min)
Request: TypeAlias = _native.Request  #: one request of a parallel generation

# -- model-free native objects the what-if drives (one implementation: the engine's) -------------------------
LookupWalk: TypeAlias = _native.LookupWalk  #: a look-up drafter walked along a recorded path
DraftLengthSchedule: TypeAlias = _native.DraftLengthSchedule  #: a draft-length rule as the engine runs it
ngram_simple_draft = _native.ngram_simple_draft  #: llama.cpp's common_ngram_simple_draft, uncut

# -- the engine's name tables ----------------------------------------------------------------------------------
DRAFTERS: tuple[str, ...] = tuple(_native.DRAFTERS)
DRAFTER_TRAITS: tuple[dict, ...] = tuple(_native.DRAFTER_TRAITS)
DRAFTER_NEEDS_KINDS: tuple[str, ...] = tuple(_native.DRAFTER_NEEDS_KINDS)
DRAFT_FILE_KINDS: tuple[str, ...] = tuple(_native.DRAFT_FILE_KINDS)
CHAIN_POLICIES: tuple[str, ...] = tuple(_native.CHAIN_POLICIES)
SCHEDULES: tuple[str, ...] = tuple(_native.SCHEDULES)
STOP_REASONS: tuple[str, ...] = tuple(_native.STOP_REASONS)
FINISH_REASONS: tuple[str, ...] = tuple(_native.FINISH_REASONS)
TRACE_COLUMNS: tuple = tuple(_native.TRACE_COLUMNS)  #: the per-step columns (name, dtype, width), engine order
ORACLE_COLUMNS: tuple = tuple(_native.ORACLE_COLUMNS)  #: the oracle's per-position columns
LAYER_INPUT_ARCHS: tuple[str, ...] = tuple(_native.LAYER_INPUT_ARCHS)
FLASH_ATTN_VALUES: tuple[str, ...] = tuple(_native.FLASH_ATTN_VALUES)
KV_CACHE_TYPES: tuple[str, ...] = tuple(_native.KV_CACHE_TYPES)
LOAD_MODES: tuple[str, ...] = tuple(_native.LOAD_MODES)
TELEMETRY_LEVELS: tuple[str, ...] = tuple(_native.TELEMETRY_LEVELS)
ENGINE_ERROR_KINDS: tuple[str, ...] = tuple(_native.ENGINE_ERROR_KINDS)
DRAFT_N_CANDIDATES: int = _native.DRAFT_N_CANDIDATES
BATCH_SHIFT_ROWS_MAX: int = _native.BATCH_SHIFT_ROWS_MAX

# -- functions ---------------------------------------------------------------------------------------------------
libllama_path = _native.libllama_path  #: the libllama the extension is linked against
missing_nextn_symbols = _native.missing_nextn_symbols  #: nextn API functions a libllama lacks
backend_devices = _native.backend_devices  #: the backend devices this build of llama.cpp sees
supports_gpu_offload = _native.supports_gpu_offload  #: whether this build can offload layers
capture_log = _native.capture_log  #: make the extension's callback llama.cpp's logger again
take_log = _native.take_log  #: llama.cpp's log lines since the last call
