"""Exceptions raised by cospec-local. Each native status code has its own class."""
from __future__ import annotations


class CospecError(RuntimeError):
    """A failure reported by the native engine, with its status code and name."""

    status: int = -99
    status_name: str = "internal"
    field: str | None = None  # the setting refused, where one is (the CLI names its flag, the server the field)

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        if status_name is not None:
            self.status_name = status_name


class InvalidArgumentError(CospecError, ValueError):
    status, status_name = -1, "invalid_argument"


class ModelLoadError(CospecError):
    status, status_name = -2, "model_load"


class VocabMismatchError(CospecError):
    status, status_name = -3, "vocab_mismatch"


class ContextFullError(CospecError):
    status, status_name = -4, "context_full"


class DecodeError(CospecError):
    status, status_name = -5, "decode"


class ArbiterError(CospecError):
    status, status_name = -6, "arbiter"


class NoDraftError(CospecError):
    status, status_name = -7, "no_draft"


class CancelledError(CospecError):
    status, status_name = -8, "cancelled"


class AdapterError(CospecError):
    """A LoRA adapter that llama.cpp refuses (e.g. its shapes do not fit the model)."""

    status, status_name = -9, "adapter"


class ArbiterDraftError(ArbiterError):
    """A learned arbiter made for another draft model (its recorded fingerprint is not this draft's)."""

    status, status_name = -10, "arbiter_draft"


class GenerationError(CospecError):
    """Generation stopped on an error; `partial` holds everything produced before it."""

    def __init__(self, message: str, status: int, status_name: str, partial):
        super().__init__(message, status, status_name)
        self.partial = partial


_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, ModelLoadError, VocabMismatchError,
                                           ContextFullError, DecodeError, ArbiterError, NoDraftError,
                                           CancelledError, AdapterError, ArbiterDraftError)}


def from_native(exc: BaseException) -> CospecError:
    """Turn the extension's CospecError(status, name, message) into the matching class."""
    status, name, message = exc.args
    cls = _BY_STATUS.get(status, CospecError)
    return cls(message, status, name)


def error_for_status(status: int, message: str) -> CospecError:
    """The class of a native status, with this message."""
    cls = _BY_STATUS.get(status, CospecError)
    return cls(message, status, cls.status_name if cls is not CospecError else None)


class ArbiterSettingsWarning(UserWarning):
    """A learned arbiter runs under drafting settings other than those it was trained under
    (another block length): its decisions meet blocks it never saw. Given once per arbiter and setting."""


class CalibrationNotice(UserWarning):
    """About this pair's calibration on this machine (cospec_local.calibration): none was stored,
    or the stored one could not be used, so its costs are measured now. Given once per pair."""
