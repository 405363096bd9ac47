"""The Python face of the native engine: open a (target, draft) pair, generate,
stream, and answer OpenAI-style chat completions.

Generation runs in native code on a worker thread with the GIL released, so
the calling thread stays responsive: Ctrl-C (KeyboardInterrupt) aborts the
native loop, and what was generated so far is kept in `Engine.last_result`.
"""
from __future__ import annotations

import codecs
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Sequence

from . import _cospec
from .arbiter.catalog import AUTO, NAMED_ARBITERS, Arbiter, another_draft_fix, missing_arbiter_hint, resolve_arbiter_path, resolve_auto
from .arbiter.callbacks import onnx_head
from .chat.template import ChatTemplate, ChatTemplateError, from_gguf_metadata, template_source
from .chat.template_process import IsolatedChatTemplate
from .json_grammar import response_format_grammar
from .chat.openai_format import CallReader, assistant_message, chat_logprobs, finish_reason
from .chat.tool_calls import (GENERIC, ToolRequest, ToolsError, call_format, call_grammar, generic_grammar,
                              generic_messages, takes_tools, template_messages, tool_request)
from . import calibration as calibration_store
from .calibration import Calibration, file_identity
from .errors import (ArbiterDraftError, ArbiterError, ArbiterSettingsWarning, ContextFullError, CospecError,
                     GenerationError, InvalidArgumentError, from_native)
from .evaluation.machine import machine_identity
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model
from .params import DEFAULTS, UNTIL_CONTEXT_ENDS, GenerationParams, spec_type_heads, spec_type_uses_model

log = logging.getLogger(__name__)

PROVENANCE = {
    _cospec.PROV_MATCH: "match",
    _cospec.PROV_KEPT: "kept",
    _cospec.PROV_FALLBACK: "fallback",
    _cospec.PROV_BONUS: "bonus",
    _cospec.PROV_TARGET: "target",
    _cospec.PROV_DRAFT: "draft",
    _cospec.PROV_NGRAM: "ngram",
    _cospec.PROV_HEAD: "head",
}
STOP_REASONS = {
    _cospec.STOP_EOG: "eog",
    _cospec.STOP_MAX_TOKENS: "max_tokens",
    _cospec.STOP_STRING: "stop_string",
    _cospec.STOP_CONTEXT_FULL: "context_full",
    _cospec.STOP_ABORTED: "aborted",
    _cospec.STOP_ERROR: "error",
}
# Engine(flash_attn=...): flash attention of the target and draft contexts (cospec.h's
# enum cospec_flash_attn). None keeps the engine's default: off for a model under
# _cospec.FLASH_ATTN_CPU_OFF_MAX_PARAMS parameters that runs on the CPU, where llama.cpp's
# kernel makes verifying a block of a tiny model dear; llama.cpp's choice for larger models
# and where offloaded.
FLASH_ATTN = {"auto": _cospec.FLASH_ATTN_AUTO, "off": _cospec.FLASH_ATTN_OFF, "on": _cospec.FLASH_ATTN_ON}


def flash_attn_setting(name: str | None) -> int | None:
    if name is None:
        return None
    if name not in FLASH_ATTN:
        raise InvalidArgumentError(f"flash_attn must be one of {sorted(FLASH_ATTN)} or None, not {name!r}")
    return FLASH_ATTN[name]


# OpenAI's finish_reason for each stop reason.
# Arbiters whose files record what they were trained under (enum cospec_arbiter_kind).
LEARNED_KINDS = (_cospec.ARBITER_FEATURES, _cospec.ARBITER_LORA)

FINISH_REASONS = {"eog": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length",
                  "aborted": "abort", "error": "error"}

# cospec_stats (native/include/cospec.h) keeps C names; Python and every JSON output (`generate
# --json`, the server's `timings`, eval) use llama-server's `timings` names. The binding hands over
# the C names: this table is the one place that maps them.
NATIVE_STATS_NAMES = {
    "n_prompt": "prompt_n",
    "n_prompt_cached": "cache_n",
    "t_prompt_ms": "prompt_ms",
    "n_generated": "predicted_n",
    "t_generate_ms": "predicted_ms",
    "n_drafted": "draft_n",
    "n_accepted": "draft_n_matched",
    "n_blocks": "blocks",
    "n_kept": "arbiter_keeps",
    "n_fallback": "target_fallbacks",
    "n_bonus": "bonus",
    "n_plain": "plain",
    "n_arbiter_calls": "arbiter_calls",
    "t_arbiter_ms": "arbiter_ms",
    "t_draft_ms": "draft_ms",
    "t_verify_ms": "verify_ms",
    "t_sample_ms": "sample_ms",
    "arbiter_abstained": "arbiter_abstained",
    "n_target_decoded": "target_decoded",
    "n_draft_decoded": "draft_decoded",
    "n_restored": "restored",
    "n_blocks_ngram": "blocks_ngram",
    "n_drafted_ngram": "draft_n_ngram",
    "n_accepted_ngram": "draft_n_matched_ngram",
    "n_blocks_head": "blocks_head",
    "n_drafted_head": "draft_n_head",
    "n_accepted_head": "draft_n_matched_head",
}


@dataclass
class Stats:
    """Counters of one generation, under llama-server's `timings` names (the JSON keys of
    `to_json()`); cospec_stats in native/include/cospec.h documents each under its C name."""

    prompt_n: int = 0            # prompt tokens evaluated in this call (the last one included)
    cache_n: int = 0             # prompt tokens reused from the previous call's cache (prompt_n + cache_n: the prompt)
    prompt_ms: float = 0.0
    predicted_n: int = 0         # tokens generated
    predicted_ms: float = 0.0
    draft_n: int = 0             # draft tokens proposed
    draft_n_matched: int = 0     # emitted draft tokens that matched the target
    blocks: int = 0              # verification passes of the target over at least one draft token
    arbiter_keeps: int = 0       # emitted draft tokens kept by the arbiter at a mismatch
    target_fallbacks: int = 0    # target tokens emitted at a rejected mismatch
    bonus: int = 0               # target tokens emitted after a block survived whole
    plain: int = 0               # plain steps: target-only / draft-only, and speculative steps that drafted nothing
    arbiter_calls: int = 0       # blocks scored by the arbiter: those whose walk reached a mismatch
    arbiter_ms: float = 0.0
    draft_ms: float = 0.0        # inside draft-model llama_decode calls
    verify_ms: float = 0.0       # inside target-model llama_decode calls (verification or plain steps)
    sample_ms: float = 0.0       # choosing tokens from logits
    arbiter_abstained: bool = False  # the learned arbiter's domain gate refused the prompt
    target_decoded: int = 0      # tokens the target decoded after the prompt (verify batches, plain steps, catch-ups)
    draft_decoded: int = 0       # tokens the draft model decoded after the prompt
    restored: int = 0            # rollbacks of a recurrent or hybrid model's memory to its saved state
    blocks_ngram: int = 0        # of blocks: drafted by the n-gram drafter
    draft_n_ngram: int = 0       # of draft_n: proposed by the n-gram drafter
    draft_n_matched_ngram: int = 0  # of draft_n_matched: n-gram tokens the target agreed with
    blocks_head: int = 0         # of blocks: drafted by the head drafter (EAGLE-3, MTP)
    draft_n_head: int = 0        # of draft_n: proposed by the head drafter
    draft_n_matched_head: int = 0  # of draft_n_matched: head tokens the target agreed with

    # The derived values to_json() gives, each after the field named here.
    _JSON_DERIVED: ClassVar[dict[str, tuple[str, ...]]] = {
        "prompt_ms": ("prompt_per_token_ms", "prompt_per_second"),
        "predicted_ms": ("predicted_per_token_ms", "predicted_per_second"),
        "draft_n": ("draft_n_accepted",),
        "sample_ms": ("acceptance_rate", "mean_accepted_per_block"),
    }

    @classmethod
    def from_native(cls, raw: dict) -> Stats:
        """From the binding's dict of cospec_stats under its C names."""
        return cls(**{NATIVE_STATS_NAMES[k]: v for k, v in raw.items()})

    @property
    def prompt_per_token_ms(self) -> float:
        return self.prompt_ms / self.prompt_n if self.prompt_n else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_token_ms(self) -> float:
        return self.predicted_ms / self.predicted_n if self.predicted_n else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    @property
    def draft_n_accepted(self) -> int:
        """Draft tokens that reached the output: matched or kept by the arbiter."""
        return self.draft_n_matched + self.arbiter_keeps

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens that reached the output (matched or kept)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def mean_accepted_per_block(self) -> float:
        return self.draft_n_accepted / self.blocks if self.blocks else 0.0

    @property
    def overhead_fraction(self) -> float:
        """Share of generation time spent outside llama.cpp decode calls."""
        if self.predicted_ms <= 0:
            return 0.0
        inside = self.draft_ms + self.verify_ms
        return max(0.0, self.predicted_ms - inside) / self.predicted_ms

    def to_json(self) -> dict:
        """The fields (times rounded to the microsecond) and the derived values, under the same names."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = round(value, 3) if isinstance(value, float) else value
            for name in self._JSON_DERIVED.get(f.name, ()):
                out[name] = getattr(self, name)
        return out


@dataclass
class Decision:
    """An arbiter decision the walk through a block applied."""

    block: int        # block number in the generation
    position: int     # position in the block
    token_index: int  # index in Generation.tokens of the kept draft token or of the target's fallback
    p_keep: float
    keep: bool


@dataclass
class LogprobEntry:
    token: int
    logprob: float
    piece: bytes  # the token's text as the model writes it (maybe part of a UTF-8 character)


@dataclass
class TokenLogprobs:
    """A token's log-probability (log softmax of the chooser's logits at temperature 1, before
    penalty, sampling and grammar) and the likeliest tokens at its position, likeliest first."""

    token: int
    logprob: float
    piece: bytes
    top: list[LogprobEntry]


@dataclass
class Generation:
    """What one generation produced, and which mode and arbiter produced it."""

    text: str
    tokens: list[int]
    provenance: list[str]
    stop_reason: str
    stats: Stats
    mode: str
    arbiter: str | None = None  # the arbiter's name in speculative mode
    decisions: list[Decision] = field(default_factory=list)
    prompt_tokens: int = 0
    used_draft_model: bool = False  # the draft model was one of its draft sources
    # With params.logprobs: per token its own log-probability and the likeliest at its position.
    logprobs: list[TokenLogprobs] | None = None
    calibration: str | None = None  # the id of the engine's calibration (cospec_local.calibration), if any

    @property
    def label(self) -> str:
        """"target-only", "draft-only", or "speculative/ARBITER"."""
        return self.mode if self.arbiter is None else f"{self.mode}/{self.arbiter}"

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.stop_reason, "stop")

    def to_json(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "provenance": self.provenance,
                "stop_reason": self.stop_reason, "mode": self.mode, "arbiter": self.arbiter,
                "decisions": [{"block": d.block, "position": d.position, "token_index": d.token_index,
                               "p_keep": round(d.p_keep, 6), "keep": d.keep} for d in self.decisions],
                "calibration": self.calibration, "stats": self.stats.to_json()}


@dataclass
class TokenEvent:
    """One streamed token. `text` is the newly safe text (may be empty);
    `token` is -1 for the final piece of held-back text."""

    token: int
    provenance: str
    text: str
    logprobs: TokenLogprobs | None = None  # with params.logprobs (not on the final piece)


_WHICH = {"target": 0, "draft": 1}  # the native API's model index


@dataclass
class _Request:
    prompt: list[int]
    params: GenerationParams
    arbiter: Arbiter | None
    arbiter_name: str | None
    draft_prompt: list[int]  # a draft of another vocabulary: its own reading of the prompt (empty: the prompt's text)


class Engine:
    """A draft/target pair in native llama.cpp contexts.

    >>> with Engine("target.gguf", "draft.gguf") as eng:
    ...     print(eng.generate("Hello", max_tokens=16).text)
    """

    def __init__(self, target: str | os.PathLike, draft: str | os.PathLike | None = None, *, n_ctx: int = _cospec.DEFAULT_N_CTX,
                 n_batch: int = 512, n_threads: int = 0, n_threads_batch: int = 0, n_gpu_layers: int = -1,
                 n_gpu_layers_draft: int = -1, progress: Callable[[str, float], object] | None = None,
                 verbose: bool = False, rpc: str | Sequence[str] | None = None, flash_attn: str | None = None,
                 chat_template: str | None = None, draft_chat_template: str | None = None,
                 calibration: str | os.PathLike | Calibration | None = "auto", n_ubatch: int = 0,
                 cache_type_k: str | None = None, cache_type_v: str | None = None,
                 cache_type_k_draft: str | None = None, cache_type_v_draft: str | None = None,
                 load_mode: str | None = None, devices: str | None = None, devices_draft: str | None = None):
        """chat_template: a Jinja chat template (or a name: "chatml", "gemma") used instead of the target's own; it
        is compiled here, so a broken one fails now (ChatTemplateError). draft_chat_template: the
        same for a draft of another vocabulary, which reads a conversation in its own format
        (render_draft_chat).
        calibration (cospec_local.calibration): "auto" takes this pair's stored calibration on this
        machine, and measures its costs now where there is none or it cannot be used (said once,
        then stored); a path takes that file (checked the same way); a Calibration object is used
        as it is; None: none (block lengths start from priors and explore).
        llama.cpp's own loading settings, by its flags' meanings (None: its default): n_ubatch (-ub),
        cache_type_k/v (-ctk/-ctv: "f16", "q8_0", ...) and cache_type_k/v_draft (-ctkd/-ctvd),
        load_mode (-lm: auto, none, mmap, mlock, mmap+mlock, dio), devices and devices_draft (-dev/-devd:
        device names, or "none")."""
        _cospec.set_llama_log(verbose)
        cancel = threading.Event()  # set by Ctrl-C while loading: the loader stops at its next step

        def native_progress(which: int, value: float):
            if cancel.is_set():
                return False
            return True if progress is None else progress("target" if which == 0 else "draft", value)

        llama_settings = dict(cache_type_k=cache_type_k, cache_type_v=cache_type_v, cache_type_k_draft=cache_type_k_draft,
                              cache_type_v_draft=cache_type_v_draft, load_mode=load_mode, devices=devices,
                              devices_draft=devices_draft)
        # Named models ("smollm2-135m") resolve to files; anything else is a path.
        self.target_path = os.fspath(resolve_model(target))
        self.draft_path = os.fspath(resolve_model(draft)) if draft is not None else None
        # Loading runs beside this thread so that Ctrl-C here cancels it.
        loading = _Background("cospec-load", lambda: _cospec.Engine(
            self.target_path, self.draft_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
            n_threads_batch=n_threads_batch, n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
            progress=native_progress, rpc_servers=rpc if isinstance(rpc, str) else ",".join(rpc or ()),
            flash_attn=flash_attn_setting(flash_attn), n_ubatch=n_ubatch,
            **{name: value or "" for name, value in llama_settings.items()}))
        try:
            loading.wait()
        except BaseException:
            cancel.set()
            loading.wait_ignoring_interrupts()
            if loading.result is not None:
                loading.result.close()
            raise
        self._native = loading.outcome()
        self._draft_loaded = self._native.has_draft  # read once: a result may finish after close()
        self.last_result: Generation | None = None
        self._chat_template: ChatTemplate | None = None
        self._chat_template_override = chat_template
        self._takes_tools: bool | None = None
        self._draft_chat_template: ChatTemplate | None = None
        self._draft_template_resolved = False
        self._draft_chat_template_override = draft_chat_template
        try:
            # Compiled now: a broken template is an error at open, not at the first reply.
            if chat_template is not None:
                self.chat_template
            if draft_chat_template is not None:
                self.draft_chat_template
        except BaseException:
            self.close()
            raise
        # Learned arbiters loaded for this engine, by (path, threshold, head): a LoRA
        # arbiter holds a llama.cpp context of its own, so it is made once.
        self._learned: dict[tuple, Arbiter] = {}
        self._warned: set[tuple] = set()  # (arbiter, draft_max) pairs already warned about
        self.model_name = os.path.splitext(os.path.basename(self.target_path))[0]
        # What a calibration is stored under: these files, and this machine as the engine uses it.
        self.calibration_pair = {"target": file_identity(self.target_path),
                                 "draft": file_identity(self.draft_path) if self.draft_path else None}
        self.calibration_machine = {**machine_identity(), "n_threads": n_threads, "n_threads_batch": n_threads_batch,
                                    "n_gpu_layers": n_gpu_layers, "n_gpu_layers_draft": n_gpu_layers_draft,
                                    "flash_attn": flash_attn, "rpc": rpc if isinstance(rpc, str) else ",".join(rpc or ()),
                                    # (only where set: calibrations stored before these settings existed still fit)
                                    **{name: value for name, value in {**llama_settings, "n_ubatch": n_ubatch}.items()
                                       if value}}
        self.calibration: Calibration | None = None
        try:
            self._take_calibration(calibration)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ calibration

    @property
    def calibration_id(self) -> str | None:
        """The id of the calibration in use (None: none): records and --json name it."""
        return self.calibration.id if self.calibration is not None else None

    def set_calibration(self, calibration: Calibration | None) -> None:
        """Use this calibration from the next generation on (None: none); the tuners start afresh."""
        with _native_errors():
            self._native.set_calibration(None if calibration is None else calibration.numbers)
        self.calibration = calibration

    def calibrate(self, prompts: Sequence[str | Sequence[int]] | None = None, *, chat: bool | None = None,
                  max_tokens: int = calibration_store.ACCEPTANCE_TOKENS, store: bool = True) -> Calibration:
        """Measure this pair's calibration here (costs, then acceptance on `prompts`, default a
        built-in set; see calibration.measure), use it, and store it for every later engine of the
        pair on this machine. Resets the engine."""
        with _native_errors():
            measured = calibration_store.measure(self, prompts, chat=chat, max_tokens=max_tokens)
        if store:
            calibration_store.write(measured, calibration_store.store_path(self.calibration_pair,
                                                                           self.calibration_machine))
        self.set_calibration(measured)
        return measured

    def _take_calibration(self, setting) -> None:
        if setting is None or setting == "none":
            return
        if isinstance(setting, Calibration):
            self.set_calibration(setting)
            return
        stored = calibration_store.store_path(self.calibration_pair, self.calibration_machine)
        path = stored if setting == "auto" else Path(setting)
        try:
            self.set_calibration(calibration_store.read(path, self.calibration_pair, self.calibration_machine))
            return
        except FileNotFoundError:
            why = "none is stored" if setting == "auto" else f"{path} does not exist"
        except (calibration_store.CalibrationProblem, OSError, CospecError) as exc:
            why = f"{path} cannot be used: {exc}"
        calibration_store.notice(f"calibration of this pair on this machine: {why}; measuring its costs now "
                                 f"(once; `cospec-local calibrate` also measures acceptance)")
        try:
            with _native_errors():
                measured = calibration_store.measure_costs(self)
            self.set_calibration(measured)
            calibration_store.write(measured, stored)
        except (CospecError, OSError) as exc:
            calibration_store.notice(f"no calibration: {exc}")

    @classmethod
    def open_default(cls, **kwargs) -> "Engine":
        """The bundled default pair."""
        return cls(DEFAULT_TARGET, DEFAULT_DRAFT, **kwargs)

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the models (a running generation is stopped first; safe from any thread)."""
        with _native_errors():
            self._native.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def n_ctx(self) -> int:
        with _native_errors():
            return self._native.n_ctx

    @property
    def n_vocab(self) -> int:
        """The target's vocabulary size (rows of its logits)."""
        with _native_errors():
            return self._native.n_vocab

    @property
    def has_draft(self) -> bool:
        with _native_errors():
            return self._native.has_draft

    @property
    def head(self) -> str | None:
        """The head drafter llama.cpp runs for this target: "eagle3" (an EAGLE-3 head opened as
        the draft, which is then no draft model), "mtp" (the target's multi-token-prediction
        layers) or None."""
        with _native_errors():
            return self._native.head

    @property
    def vocab_difference(self) -> str | None:
        """None where the draft shares the target's vocabulary (or there is none); else how the two
        differ: the draft's proposals then reach the target as text, re-encoded into its tokens."""
        with _native_errors():
            return self._native.vocab_difference()

    def abort(self) -> None:
        """Stop the running generation (thread-safe); it returns what it has."""
        self._native.abort()

    def reset(self) -> None:
        """Forget the cached prompt prefix of both models and of the learned arbiters loaded here
        (a running generation is stopped first)."""
        with _native_errors():
            self._native.reset()
            for arbiter in self._learned.values():
                arbiter.reset()

    # ------------------------------------------------------------ vocabulary

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True, which: str = "target") -> list[int]:
        """Tokens of `text` in the target's vocabulary, or the draft's (which="draft")."""
        with _native_errors():
            return self._native.tokenize(text.encode("utf-8"), add_special, parse_special, _WHICH[which])

    def prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """The prompt's tokens, refused (ContextFullError, the engine's words) where the context
        cannot hold them and one generated token: a caller can refuse before it prints anything."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if len(tokens) >= self.n_ctx:
            raise ContextFullError(f"the prompt has {len(tokens)} tokens but the context holds {self.n_ctx} (one more "
                                   f"position is needed to generate); shorten the prompt or raise n_ctx")
        return tokens

    def detokenize(self, tokens: Sequence[int], render_special: bool = False) -> str:
        try:
            raw = self._native.detokenize([int(t) for t in tokens], render_special)
        except _cospec.CospecError as exc:
            raise from_native(exc) from None
        return raw.decode("utf-8", errors="replace")

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The target's fill-in-the-middle tokens (prefix, suffix, middle) as llama.cpp finds them, or None."""
        return self._native.fim_tokens

    def token_bytes(self, token: int) -> bytes:
        """The text of one target token as the model writes it (its bytes: maybe part of a UTF-8 character)."""
        with _native_errors():
            return self._native.token_to_piece(int(token))

    def check_settings(self, params: GenerationParams) -> None:
        """Refuse, before any output, settings this engine cannot honour (InvalidArgumentError whose
        `field` names the setting): a grammar that does not parse, logprobs of a draft of another
        vocabulary decoding alone."""
        if params.logprobs and params.mode == "draft-only" and self.vocab_difference is not None:
            error = InvalidArgumentError("logprobs: in draft-only mode a draft of another vocabulary writes its own "
                                         "tokens, whose log-probabilities are not reported; use speculative or "
                                         "target-only mode")
            error.field = "logprobs"
            raise error
        wanted = spec_type_heads(params.spec_type)
        if params.mode == "speculative" and wanted and wanted != {self.head}:
            error = InvalidArgumentError(
                f"spec_type: {params.spec_type!r} asks for the {'/'.join(sorted(wanted))} head drafter, but this engine "
                f"has {'the ' + self.head + ' one' if self.head else 'none'} (an EAGLE-3 head is opened as the draft, "
                f"-md HEAD.gguf; MTP comes with a target that carries its layers)")
            error.field = "spec_type"
            raise error
        if params.grammar:
            try:
                self.check_grammar(params.grammar, "draft" if params.mode == "draft-only" else "target")
            except InvalidArgumentError as exc:
                exc.field = "grammar"
                raise

    def check_grammar(self, grammar: str, which: str = "target") -> None:
        """InvalidArgumentError unless the GBNF grammar parses for that model's vocabulary."""
        with _native_errors():
            self._native.grammar_check(_WHICH[which], grammar)

    def is_eog(self, token: int) -> bool:
        with _native_errors():
            return self._native.is_eog(token)

    def meta(self, key: str, which: str = "target") -> str | None:
        with _native_errors():
            return self._native.meta(0 if which == "target" else 1, key)

    def model_desc(self, which: str = "target") -> str | None:
        with _native_errors():
            return self._native.model_desc(0 if which == "target" else 1)

    def flash_attn(self, which: str = "target") -> str | None:
        """The flash-attention setting that model's context was created with ("auto": llama.cpp's
        choice, on where the backend has it; "off"; "on"), the default's rule applied; None
        without that model."""
        with _native_errors():
            value = self._native.flash_attn(0 if which == "target" else 1)
        return next((name for name, v in FLASH_ATTN.items() if v == value), None)

    def score(self, tokens: Sequence[int], which: str = "target"):
        """Teacher-forced logits: a float32 array (len(tokens), n_vocab) whose row i is the model's
        distribution of the token after tokens[:i + 1] (which: "target" or "draft")."""
        if which not in ("target", "draft"):
            raise InvalidArgumentError(f"which must be 'target' or 'draft', not {which!r}")
        try:
            return self._native.score(0 if which == "target" else 1, [int(t) for t in tokens])
        except _cospec.CospecError as exc:
            raise from_native(exc) from None

    # ------------------------------------------------------------ generation

    def arbiter(self, spec="target", *, threshold: float | None = None, head: str = "native",
                gate: bool = DEFAULTS.arbiter_gate) -> Arbiter:
        """The native arbiter for `spec`: "target", "fly" (FLy's defaults), "aasd", an Arbiter object, or a
        learned arbiter's name or folder, loaded for this engine's draft (once; later calls reuse it).
        head="onnx" runs a learned arbiter's head under ONNX Runtime instead of natively; gate=False
        lets it decide on every prompt, its domain gate off."""
        return self._arbiter(GenerationParams(arbiter=spec, arbiter_threshold=threshold, arbiter_head=head,
                                              arbiter_gate=gate))[0]

    def arbiter_for(self, params: GenerationParams) -> Arbiter:
        """The arbiter a generation with these settings uses (arbiter, threshold, head, gate), loaded now:
        a bad one fails here, before any output."""
        return self._arbiter(params)[0]

    def arbiter_name(self, params: GenerationParams) -> str:
        """The name a generation's result gives its arbiter (a bundled one's name, e.g. demo-lora for
        auto on the demo pair, rather than its file's), loading it as arbiter_for does."""
        return self._arbiter(params)[1]

    def unload_arbiter(self, spec) -> None:
        """Free the learned arbiters loaded here from `spec` (a name or folder), e.g. one that a
        training run is about to rewrite; the next use loads it again."""
        folder = os.path.abspath(resolve_arbiter_path(spec))
        for key in [k for k in self._learned if k[0] == folder]:
            self._learned.pop(key).close()

    def _arbiter(self, params: GenerationParams) -> tuple[Arbiter, str]:
        spec = params.arbiter
        if isinstance(spec, Arbiter):
            return spec, spec.name
        if spec == AUTO:
            spec = resolve_auto(self.draft_path)
        if spec in (None, "target"):
            return Arbiter.target(), "target"
        if spec in ("fly", "aasd"):  # the training-free rules, from their settings
            try:
                rule = (Arbiter.fly(params.fly_window, params.fly_entropy, params.fly_top_k) if spec == "fly"
                        else Arbiter.aasd(params.aasd_alpha, params.aasd_beta))
            except _cospec.CospecError as exc:
                raise from_native(exc) from None
            return rule, spec
        path = resolve_arbiter_path(spec)
        threshold = -1.0 if params.arbiter_threshold is None else params.arbiter_threshold
        key = (os.path.abspath(path), threshold, params.arbiter_head, params.arbiter_gate)
        if key not in self._learned:
            if (hint := missing_arbiter_hint(spec, self.draft_path)) is not None:
                raise ArbiterError(hint)
            head = onnx_head(path) if params.arbiter_head == "onnx" else None
            try:
                self._learned[key] = Arbiter.load(self._native, os.fspath(path), threshold, head,
                                                  use_gate=params.arbiter_gate)
            except _cospec.CospecError as exc:
                error = from_native(exc)
                if isinstance(error, ArbiterDraftError):
                    raise ArbiterDraftError(f"{error}\n{another_draft_fix(self.draft_path)}", error.status,
                                            error.status_name) from None
                raise error from None
        arbiter = self._learned[key]
        return arbiter, str(spec) if str(spec) in NAMED_ARBITERS else arbiter.name

    def _request(self, prompt: str | Sequence[int], params: GenerationParams | None, overrides: dict,
                 draft_prompt: str | Sequence[int] | None = None) -> _Request:
        params = (params or GenerationParams()).updated(**overrides) if overrides else (params or GenerationParams())
        params.validate()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if params.max_tokens == UNTIL_CONTEXT_ENDS:  # what the context has left (the engine refuses a full one)
            params = params.updated(max_tokens=max(1, self.n_ctx - len(tokens)))
        self.check_settings(params)
        draft_tokens: list[int] = []
        if draft_prompt is not None and self.vocab_difference is not None:
            draft_tokens = (self._tokenize_rendered(draft_prompt, "draft") if isinstance(draft_prompt, str)
                            else [int(t) for t in draft_prompt])
        arbiter, name = None, None
        if params.mode == "speculative":
            arbiter, name = self._arbiter(params)
            params = self._trained_block_length(arbiter, params)
            self._warn_if_trained_otherwise(arbiter, name, params)
        return _Request(tokens, params, arbiter, name, draft_tokens)

    @staticmethod
    def _trained_block_length(arbiter: Arbiter, params: GenerationParams) -> GenerationParams:
        """A call that leaves --draft-max at its default drafts a learned arbiter's blocks up to the
        length its states were drafted with (arbiter.gguf's draft_max)."""
        trained = arbiter.meta("draft_max") if arbiter.kind in LEARNED_KINDS else None
        if trained is None or params.draft_max != DEFAULTS.draft_max or int(trained) == params.draft_max:
            return params
        return params.updated(draft_max=int(trained))

    def _warn_if_trained_otherwise(self, arbiter: Arbiter, name: str, params: GenerationParams) -> None:
        """Once per arbiter and block length: a learned arbiter run with another --draft-max than
        the one its training states were drafted with (its accuracy moved by 1-2 points at 16
        against 8 on the demo pair)."""
        trained = arbiter.meta("draft_max") if arbiter.kind in LEARNED_KINDS else None
        if trained is None or int(trained) == params.draft_max or (name, params.draft_max) in self._warned:
            return
        self._warned.add((name, params.draft_max))
        warnings.warn(f"arbiter {name} was trained on blocks of up to {int(trained)} draft tokens; with --draft-max "
                      f"{params.draft_max} it decides on blocks it never saw (its accuracy may move; "
                      f"--draft-max {int(trained)} is what it learned)", ArbiterSettingsWarning, stacklevel=4)

    def _token_logprobs(self, pairs) -> TokenLogprobs:
        """The native (token, logprob) pairs of one token: its own, then the likeliest (-1: none there)."""
        (token, logprob), *top = pairs
        return TokenLogprobs(int(token), float(logprob), self.token_bytes(token),
                             [LogprobEntry(int(t), float(lp), self.token_bytes(t)) for t, lp in top if t >= 0])

    def _finish(self, raw: dict, request: _Request) -> Generation:
        result = Generation(
            text=raw["text"].decode("utf-8", errors="replace"),
            tokens=list(raw["tokens"]),
            provenance=[PROVENANCE.get(p, "?") for p in raw["provenance"]],
            stop_reason=STOP_REASONS.get(raw["stop_reason"], "error"),
            stats=Stats.from_native(raw["stats"]),
            mode=request.params.mode,
            arbiter=request.arbiter_name,
            decisions=[Decision(*d) for d in raw["decisions"]],
            prompt_tokens=len(request.prompt),
            used_draft_model=(request.params.mode == "speculative" and self._draft_loaded
                              and spec_type_uses_model(request.params.spec_type)),
            logprobs=(None if raw.get("logprobs") is None
                      else [self._token_logprobs(pairs) for pairs in raw["logprobs"]]),
            calibration=self.calibration_id,
        )
        self.last_result = result
        if raw.get("callback_error") is not None:
            raise raw["callback_error"]
        if raw["status"] != 0:
            raise GenerationError(raw["error"], raw["status"], raw["status_name"], result)
        return result

    def _native_generate(self, request: _Request, on_token=None) -> dict:
        p = request.params
        return self._native.generate(request.prompt, p.native(), request.arbiter, list(p.stop), on_token,
                                     request.draft_prompt, p.grammar or "")

    def _run(self, request: _Request, on_token=None) -> dict:
        """Run the native loop beside this thread; Ctrl-C here aborts it and keeps what it made."""
        generation = _Background("cospec-generate", lambda: self._native_generate(request, on_token))
        try:
            generation.wait()
        except BaseException:
            self._native.abort()
            generation.wait_ignoring_interrupts()
            if generation.result is not None:
                self._finish(generation.result, request)
            raise
        return generation.outcome()

    def generate(self, prompt: str | Sequence[int], params: GenerationParams | None = None, *,
                 draft_prompt: str | Sequence[int] | None = None, **overrides) -> Generation:
        """Generate from a prompt (text, tokenized with the target's tokenizer, or token ids).

        `params` (a GenerationParams; default: its defaults) says what to do; keyword
        arguments override single fields: mode, arbiter, max_tokens, draft_max, temperature, ...
        With adaptive_draft each block's length is chosen in [0, draft_max].
        `draft_prompt`: what a draft of another vocabulary reads instead of the prompt's text (text
        in its tokenizer, or its token ids), e.g. render_draft_chat(); ignored for a draft of the
        target's vocabulary, which reads the prompt's tokens.
        """
        request = self._request(prompt, params, overrides, draft_prompt)
        return self._finish(self._run(request), request)

    def stream(self, prompt: str | Sequence[int], params: GenerationParams | None = None, *,
               draft_prompt: str | Sequence[int] | None = None, **overrides) -> Iterator[TokenEvent]:
        """Like generate(), but yields a TokenEvent per token as it is produced.
        The complete Generation is in `last_result` when the iterator ends."""
        request = self._request(prompt, params, overrides, draft_prompt)
        events: queue.Queue = queue.Queue()
        stop_flag = threading.Event()
        done = object()

        def on_token(token: int, provenance: int, text: bytes, logprobs):
            events.put((token, provenance, text, logprobs))
            return not stop_flag.is_set()

        def work():
            try:
                return self._native_generate(request, on_token)
            finally:
                events.put(done)

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generation = _Background("cospec-stream", work)
        try:
            while True:
                try:
                    item = events.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is done:
                    break
                token, provenance, text, logprobs = item
                final = token < 0
                yield TokenEvent(token, PROVENANCE.get(provenance, "text"), decoder.decode(text, final=final),
                                 None if logprobs is None else self._token_logprobs(logprobs))
        except BaseException:
            # KeyboardInterrupt or the consumer closed the iterator: stop the native loop.
            stop_flag.set()
            self._native.abort()
            generation.wait_ignoring_interrupts()
            if generation.result is not None:
                self._finish(generation.result, request)
            raise
        generation.wait_ignoring_interrupts()
        self._finish(generation.outcome(), request)

    # ------------------------------------------------------------ chat

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            with _native_errors():
                source = self._native.chat_template(0)
                bos = self._piece(self._native.bos)
                eos = self._piece(self._native.eos)
            override = self._chat_template_override
            if override is not None:  # the user's: an error is theirs to see, no fallback
                source = template_source(override)
                self._chat_template = IsolatedChatTemplate(source, bos, eos)
            else:
                # Rendered out of process, under memory and time limits: model files are untrusted.
                self._chat_template = from_gguf_metadata(source, bos, eos, IsolatedChatTemplate)
        return self._chat_template

    @property
    def draft_chat_template(self) -> ChatTemplate | None:
        """The chat format a draft of another vocabulary reads a conversation in: the one given at
        open, else the draft's own; None without such a draft, or where it has no template (it
        then reads the target's rendering as text)."""
        if self._draft_template_resolved or self.vocab_difference is None:
            return self._draft_chat_template
        with _native_errors():
            own = self._native.chat_template(1)
            bos, eos = self._piece(self._native.bos_of(1), 1), self._piece(self._native.eos_of(1), 1)
        override = self._draft_chat_template_override
        if override is not None:  # the user's: an error is theirs to see
            self._draft_chat_template = IsolatedChatTemplate(template_source(override), bos, eos)
        elif own is not None and own.strip():
            try:
                self._draft_chat_template = IsolatedChatTemplate(own, bos, eos)
            except ChatTemplateError as exc:
                log.warning("the draft's chat template cannot be used (%s); it reads the target's rendering", exc)
        self._draft_template_resolved = True
        return self._draft_chat_template

    def _piece(self, token: int, which: int = 0) -> str:
        return self._native.token_text(token, which) if token >= 0 else ""

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """Apply the target's chat template (sandboxed Jinja) and tokenize the result; `tools`
        (OpenAI's function list) go to the template, which shows them as its model learned to read them."""
        if tools and not self.takes_tools:  # llama.cpp's generic format (tool_calls.generic_messages)
            messages, tools = generic_messages(list(messages), tools), None
        return self._render(self.chat_template, "target", messages, add_generation_prompt, tools)

    def render_draft_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                          tools: list[dict] | None = None) -> list[int] | None:
        """The conversation in a draft of another vocabulary's own chat format and tokens: its
        draft_prompt, so that it drafts a reply as it would write one. None where the draft reads
        the target's tokens (same vocabulary, or no draft) or has no chat format of its own."""
        template = self.draft_chat_template
        if template is not None and tools and not self.takes_tools:  # the target's generic format
            messages, tools = generic_messages(list(messages), tools), None
        return None if template is None else self._render(template, "draft", messages, add_generation_prompt, tools)

    @property
    def takes_tools(self) -> bool:
        """Whether the target's chat template shows tools to the model (renders them)."""
        if self._takes_tools is None:
            self._takes_tools = takes_tools(self.chat_template)
        return self._takes_tools

    def tool_setup(self, tools: ToolRequest | None) -> tuple[str | None, str | None]:
        """The form of call the model writes (tool_calls.HERMES, LLAMA3, GENERIC) and the grammar of
        a forced call, for these tools (None, None without); ToolsError where a tool's schema does
        not convert. A template that shows no tools gets llama.cpp's generic format, whose grammar
        holds every reply (a call, or an answer where the model may choose)."""
        if tools is None:
            return None, None
        if not self.takes_tools:
            try:
                return GENERIC, generic_grammar(tools.tools, tools.forced, tools.parallel)
            except ValueError as exc:  # SchemaError: a tool's parameters
                raise ToolsError(f"tools: {exc}") from None
        form = call_format(self.chat_template.source)
        if tools.forced is None:
            return form, None
        try:
            return form, call_grammar(tools.tools, form, tools.forced or None, tools.parallel)
        except ValueError as exc:  # SchemaError: a tool's parameters
            raise ToolsError(f"tools: {exc}") from None

    def _render(self, template: ChatTemplate, which: str, messages: Sequence[dict], add_generation_prompt: bool,
                tools: list[dict] | None = None) -> list[int]:
        text = template.render(template_messages(list(messages)), add_generation_prompt=add_generation_prompt,
                               **({"tools": tools} if tools else {}))
        return self._tokenize_rendered(text, which)

    def _tokenize_rendered(self, text: str, which: str) -> list[int]:
        """A rendered conversation's tokens: special tokens parsed, BOS added where the model adds one
        and only once where the text (its template) writes it too."""
        tokens = self.tokenize(text, add_special=True, parse_special=True, which=which)
        with _native_errors():
            bos = self._native.bos_of(_WHICH[which])
        if len(tokens) >= 2 and tokens[0] == bos and tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def create_chat_completion(self, messages: Sequence[dict], *, stream: bool = False, max_tokens: int = 512,
                               params: GenerationParams | None = None, tools: list[dict] | None = None,
                               tool_choice=None, parallel_tool_calls: bool | None = None,
                               response_format: dict | None = None, logprobs: bool = False, top_logprobs: int = 0,
                               **kwargs):
        """OpenAI-style chat completion: a dict, or an iterator of chunk dicts with stream=True.
        tools / tool_choice / parallel_tool_calls, response_format and logprobs / top_logprobs
        as OpenAI's (and `serve`'s) take them; other keywords override GenerationParams fields."""
        form, grammar = self.tool_setup(tool_request(tools, tool_choice, parallel_tool_calls))
        if grammar is not None and response_format_grammar(response_format) is not None:
            raise ToolsError("a call's grammar already holds the reply; leave out response_format", "response_format")
        grammar = grammar or response_format_grammar(response_format)
        if grammar is not None:
            kwargs["grammar"] = grammar
        if logprobs or top_logprobs:
            kwargs.update(logprobs=True, top_logprobs=top_logprobs)
        shown = tools if form is not None else None
        prompt = self.render_chat(messages, tools=shown)
        kwargs.setdefault("draft_prompt", self.render_draft_chat(messages, tools=shown))
        completion_id = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        if stream:
            return self._chat_chunks(prompt, completion_id, created, max_tokens, params, kwargs, form)
        result = self.generate(prompt, params, max_tokens=max_tokens, **kwargs)
        message, called = assistant_message(result.text, form)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": self.model_name,
            "choices": [{"index": 0, "message": message,
                         "logprobs": None if result.logprobs is None else chat_logprobs(result.logprobs),
                         "finish_reason": finish_reason(result.finish_reason, called)}],
            "usage": openai_usage(len(prompt), result),
            "timings": result.stats.to_json(),
            "cospec": {"mode": result.mode, "arbiter": result.arbiter, "provenance": result.provenance,
                       "stop_reason": result.stop_reason},
        }

    def _chat_chunks(self, prompt, completion_id, created, max_tokens, params, kwargs, form) -> Iterator[dict]:
        def chunk(delta: dict, finish=None, entries=()) -> dict:
            return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                    "model": self.model_name,
                    "choices": [{"index": 0, "delta": delta,
                                 "logprobs": chat_logprobs(list(entries)) if entries else None,
                                 "finish_reason": finish}]}

        yield chunk({"role": "assistant"})
        calls, pending = CallReader(form), []
        for event in self.stream(prompt, params, max_tokens=max_tokens, **kwargs):
            if event.logprobs is not None:
                pending.append(event.logprobs)
            if event.text and (text := calls.sendable(event.text)):
                yield chunk({"content": text}, entries=pending)
                pending = []
        result = self.last_result
        delta = calls.rest_delta()
        if delta or pending:
            yield chunk(delta, entries=pending)
        final = chunk({}, finish_reason(result.finish_reason, "tool_calls" in delta))
        final["usage"] = openai_usage(len(prompt), result)
        final["timings"] = result.stats.to_json()
        yield final


@contextlib.contextmanager
def _native_errors():
    """The extension's errors as this package's typed ones (a closed engine: InvalidArgumentError)."""
    try:
        yield
    except _cospec.CospecError as exc:
        raise from_native(exc) from None


class _Background:
    """Native work on a daemon thread while the caller's thread waits in short steps, so that
    Ctrl-C reaches the caller. Completion is an Event, not Thread.join: a join interrupted by
    KeyboardInterrupt can leave the thread marked as finished while it still runs (Python 3.11),
    which lost the partial result and left a generation running."""

    def __init__(self, name: str, work: Callable):
        self.result = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def run():
            try:
                self.result = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self.error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name=name, daemon=True).start()

    def wait(self) -> None:
        while not self._done.wait(0.05):
            pass

    def wait_ignoring_interrupts(self) -> None:
        """After asking the work to stop: a second Ctrl-C must not leave it running."""
        while not self._done.is_set():
            try:
                self._done.wait(0.05)
            except KeyboardInterrupt:
                pass

    def outcome(self):
        if self.error is not None:
            raise from_native(self.error) if isinstance(self.error, _cospec.CospecError) else self.error
        return self.result


def openai_usage(n_prompt: int, *results: Generation) -> dict:
    """OpenAI's `usage` object of generations (a request's choices) from one prompt of n_prompt
    tokens: the prompt counted once, every choice's tokens."""
    completion = sum(len(result.tokens) for result in results)
    return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion}
