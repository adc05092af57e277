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
