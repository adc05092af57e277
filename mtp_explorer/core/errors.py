"""Exceptions raised by mtp-explorer. All derive from :class:`MtpExplorerError`."""

from __future__ import annotations


class MtpExplorerError(Exception):
    """Base class of every mtp-explorer error."""


class ModelLoadError(MtpExplorerError):
    """The model file cannot be used: not a GGUF, truncated, or rejected by llama.cpp."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model file does not exist."""


class MtpUnavailableError(MtpExplorerError):
    """MTP drafting was asked of a model without MTP (nextn) layers."""


class LibraryError(MtpExplorerError):
    """The libllama in use lacks an API the engine needs."""


class ParameterError(MtpExplorerError, ValueError):
    """A generation or drafting parameter is out of range."""


class ContextOverflowError(ParameterError):
    """The prompt does not fit in the session's context window."""


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
    """A long operation (an oracle recording, a sweep) was cancelled before it finished."""


class ConverterError(MtpExplorerError, RuntimeError):
    """llama.cpp's ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist) is missing, failed, or wrote nothing."""


class ServerError(MtpExplorerError):
    """A llama-server (watched, or started by :class:`~mtp_explorer.server.LlamaServer`) failed us."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The server cannot be reached: refused, timed out, not started, or it exited."""


class ServerProtocolError(ServerError):
    """The server answered something it should not: an HTTP error, malformed JSON or Prometheus metrics."""


#: The engine's error kinds (``_native.EngineError(kind, message)``) and the exception each becomes.
ENGINE_ERROR_KINDS: dict[str, type[MtpExplorerError]] = {
    "parameter": ParameterError,
    "context": ContextOverflowError,
    "decode": DecodeError,
    "rollback": RollbackError,
    "load": ModelLoadError,
    "library": LibraryError,
    "closed": SessionClosedError,
}


def from_engine(exc: BaseException) -> MtpExplorerError:
    """The package's exception for an error raised by the native engine (``_native.EngineError``, whose
    arguments are its kind and message); anything else becomes a plain :class:`EngineError`."""
    args = getattr(exc, "args", ())
    if len(args) == 2 and args[0] in ENGINE_ERROR_KINDS:
        kind, message = args
        return ENGINE_ERROR_KINDS[kind](message)
    return EngineError(str(exc))


class engine_errors:
    """Context manager translating the native engine's exceptions (and only those) into the package's.

    >>> with engine_errors():
    ...     engine.step()
    """

    def __enter__(self) -> "engine_errors":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        from .. import _native

        if exc is not None and isinstance(exc, _native.EngineError):
            raise from_engine(exc) from exc
        return False
