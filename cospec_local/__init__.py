"""cospec-local: collaborative speculative decoding on llama.cpp.

    from cospec_local import Engine
    with Engine.open_default() as engine:
        print(engine.generate("Write a haiku about the sea.", max_tokens=48).text)
"""
from ._cospec import version as native_version
from .chat.template import ChatTemplate, ChatTemplateError
from .arbiter.catalog import NAMED_ARBITERS, Arbiter
from .arbiter.callbacks import arbiter_from_function
from .engine import Engine
from .generation import Decision, Generation, Stats, TokenEvent
from .params import MODES, GenerationParams
from .errors import (AdapterError, ArbiterDraftError, ArbiterError, CancelledError, ContextFullError, CospecError,
                     DecodeError, GenerationError, InvalidArgumentError, ModelLoadError, NoDraftError,
                     VocabMismatchError)
from .models import NAMED_MODELS, default_pair, resolve_model

__version__ = "0.1.0"

__all__ = [
    "Engine", "Generation", "GenerationParams", "Decision", "Stats", "TokenEvent", "Arbiter", "arbiter_from_function",
    "NAMED_ARBITERS", "MODES",
    "ChatTemplate", "ChatTemplateError", "CospecError", "InvalidArgumentError", "ModelLoadError",
    "VocabMismatchError", "ContextFullError", "AdapterError", "DecodeError", "ArbiterError", "ArbiterDraftError", "NoDraftError", "CancelledError",
    "GenerationError", "NAMED_MODELS", "default_pair", "resolve_model", "native_version", "__version__",
]
