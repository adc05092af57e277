"""The owning handle of one native engine: its life cycle, the model's facts, tokenization and the
one-generation-at-a-time guard. :class:`~mtp_explorer.core.session.Session` generates on top of it."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from . import drafters, native
from .cpu_kernels import resolve_repack
from .errors import (
    ContextOverflowError,
    LibraryError,
    ModelFileChangedError,
    ModelLoadError,
    ParameterError,
    SessionBusyError,
    SessionClosedError,
)
from .info import ModelInfo, model_info, model_path
from .options import DEFAULT_N_RS_SEQ, SessionOptions, telemetry_level
from .runtime import check_shared_cxx_runtime, native_libraries
from .schema import FINISH_REASONS
from .settings import Limits

_Handle = TypeVar("_Handle", bound="EngineHandle")

Prompt = str | Sequence[int]


def _libllama_path() -> str:
    """The libllama whose nextn API is checked (the one the extension is linked against)."""
    return native.libllama_path()


def check_nextn_api(path: str | None = None) -> None:
    """Raise :class:`LibraryError` if the libllama at ``path`` lacks the nextn (MTP) API."""
    lib = path or _libllama_path()
    missing = native.missing_nextn_symbols(lib)
    if missing:
        raise LibraryError(
            f"{lib} lacks the nextn API that MTP drafting needs ({', '.join(missing)}); "
            "install llama-cpp-python==0.3.36"
        )


@functools.cache
def check_native_runtime() -> None:
    """Raise :class:`LibraryError` if the extension or a library it loads holds its own C++ runtime (checked once)."""
    check_shared_cxx_runtime(native_libraries(native.EXTENSION_FILE, _libllama_path()))


def _load_engine(path: Path, options: SessionOptions) -> native.Engine:
    """The native engine for the model at ``path``; a load failure carries llama.cpp's last log lines."""
    check_nextn_api(_libllama_path())
    check_native_runtime()
    native.capture_log()  # llama.cpp's logger is the process's: llama-cpp-python code may have taken it since
    native.take_log()
    try:
        return native.Engine(options.to_native(str(path)))
    except ModelLoadError as exc:
        log = [line for line in native.take_log() if line.strip()]
        detail = ("\nllama.cpp said:\n  " + "\n  ".join(log[-8:])) if log else ""
        raise ModelLoadError(f"cannot load {path}: {exc}{detail}") from exc


def _load_mode(load_mode: str, use_mmap: bool | None) -> str:
    """``load_mode``, or llama-cpp-python's ``use_mmap`` spelling of it."""
    if use_mmap is None:
        return load_mode
    if load_mode != "auto":
        raise ParameterError("give use_mmap or load_mode, not both")
    return "mmap" if use_mmap else "none"


#: The load modes in which llama.cpp maps the model files into memory (llama_mmap): their weights are read from the
#: files' pages as they are used, so the files must stay as they were (:class:`MappedFile`).
MAPPED_LOAD_MODES = frozenset({"auto", "mmap", "mmap+mlock"})


class MappedFile:
    """A model file the engine maps into memory, held open from before the load: the file's size and modification
    time then. :meth:`check` tells a file truncated or rewritten in place since (whose mapped pages now fault with
    SIGBUS past its end, or hold other weights) from one merely removed or replaced at its path (the mapping, like
    this handle, keeps the old file's data: harmless)."""

    def __init__(self, path: Path, load_mode: str) -> None:
        self.path, self.load_mode = path, load_mode
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns

    def check(self) -> None:
        """A :class:`ModelFileChangedError` if the file was truncated or rewritten since it was opened."""
        if self.fd is None:
            return
        st = os.fstat(self.fd)
        if st.st_size == self.size and st.st_mtime_ns == self.mtime_ns:
            return
        what = f"truncated from {self.size} to {st.st_size} bytes" if st.st_size < self.size else "rewritten in place"
        raise ModelFileChangedError(
            f"{self.path} was {what} while this session held it mapped in memory (load_mode={self.load_mode!r}): "
            "its weights can no longer be read safely. Open a new session on an intact file (with load_mode='none' "
            "a session copies the weights into memory, and later changes to the file do not matter)"
        )

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class ModelFiles:
    """The model files a session maps into memory (none where ``load_mode`` copies the weights), held open from
    before the load (:class:`MappedFile`)."""

    def __init__(self, paths: Sequence[Path] = (), load_mode: str = "none") -> None:
        self.files = [MappedFile(p, load_mode) for p in paths] if load_mode in MAPPED_LOAD_MODES else []

    def check(self) -> None:
        """A :class:`ModelFileChangedError` if a file was truncated or rewritten in place since it was opened (every
        generation, recording, probe and streamed step checks first: reading its weights then could stop the process
        with SIGBUS). A file removed or replaced at its path is no change: the mapping keeps the old file's data."""
        for f in self.files:
            f.check()

    def close(self) -> None:
        for f in self.files:
            f.close()


@contextlib.contextmanager
def finishing_on_interrupt(engine: native.Engine, keep: Callable[[], object]) -> Iterator[None]:
    """Around a begun generation: on ``KeyboardInterrupt`` (a signal handler's, raised between two steps) or a stream
    closed early, every running request is finished as cancelled and ``keep()`` records what was made
    (``last_trace``, ``last_parallel_trace``) before the exception goes on; the session stays usable."""
    try:
        yield
    except (KeyboardInterrupt, GeneratorExit):
        engine.cancel()
        engine.step()  # a cancelled step decodes nothing: it finishes the running requests
        keep()
        raise


def _model_facts(
    path: str | os.PathLike | None, draft_model: str | os.PathLike | None
) -> tuple[Path, ModelInfo, ModelInfo | None]:
    """The target's path (``None``: the bundled demo model) and facts, and the draft model's facts (or ``None``)."""
    path = model_path(path)
    return path, model_info(path), None if draft_model is None else model_info(model_path(draft_model, "draft_model"))


def _load_engine_holding_files(
    path: Path, draft_info: ModelInfo | None, options: SessionOptions
) -> tuple[native.Engine, ModelFiles]:
    """The engine, and the model files it maps held open from before it loads them (:class:`ModelFiles`)."""
    files = ModelFiles([path] + ([] if draft_info is None else [Path(draft_info.path)]), options.load_mode)
    try:
        return _load_engine(path, options), files
    except BaseException:
        files.close()
        raise


def _weight_types(*infos: ModelInfo | None) -> list[str]:
    """The tensor types of the target and draft model files (``None``: none)."""
    return [t for info in infos if info is not None for t in info.tensor_types]


def _placement(engine: native.Engine) -> dict[str, Any]:
    """The engine's placement options (``threads_batch`` resolved) and the devices this build sees."""
    p = engine.placement
    return {
        "n_gpu_layers": p.n_gpu_layers,
        "main_gpu": p.main_gpu,
        "flash_attn": p.flash_attn,
        "type_k": p.type_k,
        "type_v": p.type_v,
        "load_mode": p.load_mode,
        "threads_batch": p.n_threads_batch or engine.n_threads,
        "repack": p.repack,
        "devices": list(native.backend_devices()),
        "gpu_offload": bool(native.supports_gpu_offload()),
    }


def _engine_fact(name: str, doc: str) -> Any:
    """A read-only property answered by the live engine's attribute ``name``."""
    return property(lambda self: getattr(self.engine, name), doc=doc)


def _prompt_tokens(handle: EngineHandle, prompt: Prompt) -> list[int]:
    """A prompt's token ids, checked: not empty, ids in the vocabulary, fitting in a sequence's context."""
    if isinstance(prompt, str):
        if not prompt:
            raise ParameterError("the prompt is empty")
        tokens = handle.tokenize(prompt)
    else:
        tokens = [int(t) for t in prompt]
        n_vocab = handle.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise ParameterError(f"prompt token ids out of range [0, {n_vocab}): {bad[:5]}")
    if not tokens:
        raise ParameterError("the prompt is empty (it tokenizes to no tokens)")
    if len(tokens) > handle.n_ctx_seq:
        per_seq = (
            "" if handle.n_parallel == 1 else f" per sequence (n_ctx {handle.n_ctx} / n_parallel {handle.n_parallel})"
        )
        raise ContextOverflowError(
            f"the prompt has {len(tokens)} tokens but the context holds {handle.n_ctx_seq}{per_seq}; "
            "shorten it or open the session with a larger n_ctx"
        )
    return tokens


def check_streamable(handle: EngineHandle) -> None:
    """A stream yields each step's row: a :class:`ParameterError` where the session records none."""
    if handle.telemetry == "off":
        raise ParameterError(
            "a stream yields each step's row, and telemetry='off' records none: set "
            "session.telemetry = 'steps' (or 'full'), or call generate"
        )


class EngineHandle:
    """Owns a ``native.Engine`` (model, target and draft contexts): :meth:`open` creates it, :meth:`close`
    frees it."""

    def __init__(
        self, engine: native.Engine, info: ModelInfo, *, seed: int, draft_info: ModelInfo | None = None
    ) -> None:
        self._engine = engine
        self.info = info
        self.draft_info = draft_info
        """The draft model's facts (``draft-simple``), or ``None``: opened without one."""
        self.seed = seed
        self._busy = threading.Lock()
        self._closed = False
        self.open_kwargs: dict = {}
        """The keyword arguments :meth:`open` was given (a Dask worker re-opens the model with them)."""
        self.model_files = ModelFiles()
        """The model files it maps into memory: :meth:`ModelFiles.check` tells one truncated or rewritten since."""

    # -- life cycle ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls: type[_Handle],
        path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 4096,
        threads: int | None = None,
        seed: int = 0,
        n_rs_seq: int = DEFAULT_N_RS_SEQ,
        capacity: int | None = None,
        topk: int = 5,
        telemetry: bool | str = "full",
        clock: str = "wall",
        n_gpu_layers: int | str = -1,
        main_gpu: int = 0,
        flash_attn: str | bool = "auto",
        type_k: str = "f16",
        type_v: str = "f16",
        load_mode: str = "auto",
        use_mmap: bool | None = None,
        threads_batch: int | None = None,
        repack: bool | None = None,
        draft_model: str | os.PathLike | None = None,
        n_parallel: int = 1,
    ) -> _Handle:
        """Load a GGUF model (``None``: the bundled demo model).

        Placement, shared by the target and MTP contexts, has llama.cpp's names and defaults (:class:`SessionOptions`):
        ``n_gpu_layers`` (``-ngl``; ``"auto"``/-1, ``"all"``/-2), ``main_gpu`` (``-mg``), ``flash_attn`` (``-fa``),
        ``type_k``/``type_v`` (``-ctk``/``-ctv``), ``load_mode`` (``-lm``; ``use_mmap=True``/``False`` is
        llama-cpp-python's ``"mmap"``/``"none"``), ``threads_batch`` (``-tb``) and ``repack`` (``False``: ``-nr``, the
        file's weight layout, the same kernels at every batch size: :meth:`batch_shift`; ``None``: llama.cpp's default,
        ``--repack``, but ``-nr`` where its AMX kernels fail: :func:`~mtp_explorer.check_extra_buffers`).

        ``n_rs_seq`` (recurrent snapshot slots; 0: checkpoints) and ``capacity`` (the largest ``n_max``): see
        :class:`SessionOptions`; ``topk`` is how many draft alternatives are recorded per depth; ``telemetry`` how much
        a generation records (:data:`~mtp_explorer.core.options.TELEMETRY_LEVELS`: full, steps or off). ``clock="cpu"``
        times the phases with the calling thread's CPU time instead of the wall clock (needs ``threads=1``, where
        llama.cpp computes on that thread): the work, without the time a busy machine kept the thread waiting.

        ``draft_model`` loads a second, smaller GGUF with the same vocabulary for ``drafter="draft-simple"``
        (llama.cpp's ``-md``; placed as the target). A vocabulary llama.cpp would refuse, or a recurrent draft
        model, is a :class:`ParameterError`.

        ``n_parallel`` is llama.cpp's ``-np``: the sequences (server slots) the session runs at once in one target
        context (each with ``n_ctx / n_parallel`` of it, padded by llama.cpp to 256 tokens at least, and its own
        ``n_rs_seq`` snapshot slots) and one MTP context; see :meth:`~mtp_explorer.Session.generate_parallel`.
        """
        path, info, draft_info = _model_facts(path, draft_model)
        load_mode = _load_mode(load_mode, use_mmap)
        options = SessionOptions(
            n_ctx=n_ctx,
            threads=threads,
            seed=seed,
            n_rs_seq=n_rs_seq,
            capacity=capacity,
            topk=topk,
            telemetry=telemetry,
            clock=clock,
            n_gpu_layers=n_gpu_layers,  # type: ignore[arg-type]
            main_gpu=main_gpu,
            flash_attn=flash_attn,  # type: ignore[arg-type]
            type_k=type_k,
            type_v=type_v,
            load_mode=load_mode,
            threads_batch=threads_batch,
            n_parallel=n_parallel,
            repack=resolve_repack(repack, _weight_types(info, draft_info)),
            draft_model=None if draft_info is None else str(draft_info.path),
        )
        info = options.check_model(info, draft_info)
        engine, files = _load_engine_holding_files(path, draft_info, options)
        session = cls(engine, info, seed=options.seed, draft_info=draft_info)
        session.model_files = files
        session.open_kwargs = options.as_kwargs()
        return session

    def reopened(self: _Handle, **changes: Any) -> _Handle:
        """A new session of the same files with this one's options (``open_kwargs``) but ``changes`` (the
        keywords of :meth:`open`); the caller closes it."""
        if "capacity" not in changes and "n_rs_seq" in changes:
            changes["capacity"] = None  # follows the new n_rs_seq
        return type(self).open(self.path, **(dict(self.open_kwargs) | changes))

    def close(self) -> None:
        """Free the model and contexts. A running generation is cancelled first."""
        if not self._closed:
            self._closed = True
            self._engine.close()
            self.model_files.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self: _Handle) -> _Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self.n_ctx}, capacity={self.capacity}"
        if not self._closed and self.n_parallel > 1:
            state += f", n_parallel={self.n_parallel}"
        return f"<Session {self.info.name!r} ({self.info.arch}) {state}>"

    # -- facts -----------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.info.path

    n_ctx = _engine_fact(
        "n_ctx",
        "The context size in tokens (padded to a multiple of 256, as llama.cpp pads it), "
        "shared by the ``n_parallel`` sequences.",
    )
    n_ctx_seq = _engine_fact("n_ctx_seq", "One sequence's context: ``n_ctx / n_parallel``, as llama.cpp splits it.")
    n_vocab = _engine_fact("n_vocab", "The target's vocabulary size: token ids lie in ``[0, n_vocab)``.")
    n_parallel = _engine_fact("n_parallel", "Sequences (llama.cpp's ``-np`` slots) the session runs at once.")
    capacity = _engine_fact("capacity", "Largest ``n_max`` this session accepts (``n_rs_seq`` unless set).")
    checkpoints = _engine_fact("checkpoints", "Whether it rolls back by checkpoint (recurrent, ``n_rs_seq=0``).")
    threads = _engine_fact("n_threads", "Threads llama.cpp computes with.")
    telemetry = property(
        lambda self: self.engine.telemetry,
        lambda self, level: setattr(self.engine, "telemetry", telemetry_level(level)),
        doc='How much a generation records: ``"full"``, ``"steps"`` or ``"off"`` (see '
        ":meth:`open`; settable between generations, ``True``/``False`` being full/steps).",
    )

    draft_kind = _engine_fact(
        "draft_kind",
        'What the draft model is: ``"draft_model"`` (``draft-simple`` drafts '
        'with it), ``"eagle3_head"`` (``draft-eagle3``) or ``"nothing"`` (none).',
    )

    @property
    def has_draft_model(self) -> bool:
        """Opened with a draft model (:attr:`draft_kind`); a shared-memory MTP head file is ``info``'s MTP head."""
        return self.draft_info is not None and not self.draft_info.is_mtp_head_file

    @property
    def drafter_modes(self) -> tuple[str, ...]:
        """The listed ``drafter=`` choices (:data:`~mtp_explorer.DRAFTER_MODES`) this session can draft with: its MTP
        head's, the look-ups, and those of its draft model's kind."""
        if self.checkpoints:  # no snapshot slots: the look-ups, and draft-simple with a draft model
            plain_draft_model = self.has_draft_model and self.draft_kind == "draft_model"
            return drafters.available_modes(False, "draft_model" if plain_draft_model else False)
        return drafters.available_modes(bool(self.info.has_mtp), self.has_draft_model and self.draft_kind)

    @property
    def limits(self) -> Limits:
        """What this session can draft with, and how deep: the bounds every :class:`DraftSettings` is checked
        against here."""
        reason = (
            "the draft depth its telemetry holds, its capacity (no snapshot slots: checkpoints)"
            if self.checkpoints
            else "its n_rs_seq recurrent snapshot slots"
            if self.engine.is_recurrent
            else "the draft depth its telemetry holds, set by n_rs_seq"
        )
        return Limits(
            capacity=self.capacity,
            has_mtp=bool(self.info.has_mtp),
            has_draft_model=self.has_draft_model and self.draft_kind,
            model=f"{self.info.name} ({self.info.path})",
            reason=reason,
        )

    @property
    def placement(self) -> dict[str, Any]:
        """Where the model is and how its contexts compute: the placement options as the engine holds them
        (``threads_batch`` resolved) and the backend devices this build of llama.cpp sees."""
        return _placement(self.engine)

    @property
    def clock(self) -> str:
        """``wall`` or ``cpu``: the clock of the per-phase timings."""
        return "cpu" if self.engine.cpu_clock else "wall"

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.engine.detokenize(list(tokens))

    def piece(self, token: int) -> str:
        return self.engine.piece(int(token))

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (end of sequence, end of turn, ...)."""
        return self.engine.is_eog(int(token))

    # -- for the session's collaborators ---------------------------------------------------------
    @property
    def engine(self) -> native.Engine:
        """The native engine (:mod:`mtp_explorer.core.native`), for code that drives its steps itself; a closed
        session's is a :class:`SessionClosedError`."""
        if self._closed:
            raise SessionClosedError("the session is closed")
        return self._engine

    @contextlib.contextmanager
    def hold(self) -> Iterator[native.Engine]:
        """Hold the session for one generation, giving its engine (a second one at the same time is a
        :class:`SessionBusyError`; a model file truncated or rewritten under the session a
        :class:`ModelFileChangedError`)."""
        engine = self.engine
        self.model_files.check()
        if not self._busy.acquire(blocking=False):
            raise SessionBusyError("a generation is already running on this session")
        try:
            yield engine
        finally:
            self._busy.release()

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """A prompt's token ids as this session decodes it (text tokenized as :meth:`tokenize` does), checked: not
        empty, ids in the vocabulary, fitting in a sequence's context (else a :class:`ParameterError`)."""
        return _prompt_tokens(self, prompt)

    def output(self, prompt: Prompt, prompt_tokens: list[int], request: int = 0) -> dict:
        """The last generation's prompt and output (of its request ``request``: 0 for a single generation), as the
        fields a Trace and an OracleTrace share."""
        engine = self._engine
        tokens = engine.generated(0, request)
        return {
            "prompt": prompt if isinstance(prompt, str) else self.detokenize(prompt_tokens),
            "prompt_tokens": prompt_tokens,
            "tokens": tokens,
            "text": engine.detokenize(tokens),
            "pieces": [engine.piece(t) for t in tokens],
            "finish_reason": FINISH_REASONS[engine.request_state(request)["finish"]],
            "model": self.info.to_dict() | {"eog_tokens": engine.eog_tokens},
        }

    def recorded_settings(self) -> dict:
        """The session's settings a trace records."""
        return {
            "n_ctx": self.n_ctx,
            "n_parallel": self.n_parallel,
            "capacity": self.capacity,
            "checkpoints": self.checkpoints,
            "threads": self.threads,
            "telemetry": self.telemetry,
            "clock": self.clock,
            "draft_model": None if self.draft_info is None else self.draft_info.name,
        } | self.placement
