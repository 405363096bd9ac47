"""The Python face of the native engine: open a (target, draft) pair, generate and stream (chat
in chat/engine_chat.py, arbiters in arbiter/engine_arbiters.py, both mixed in here; what a
generation produced in generation.py).

Generation runs in native code on a worker thread with the GIL released, so
the calling thread stays responsive: Ctrl-C (KeyboardInterrupt) aborts the
native loop, and what was generated so far is kept in `Engine.last_result`.
"""
from __future__ import annotations

import codecs
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import _cospec
from . import calibration as calibration_store
from .arbiter.catalog import Arbiter
from .arbiter.engine_arbiters import ArbiterCacheMixin
from .calibration import Calibration, file_identity
from .chat.engine_chat import ChatMixin
from .errors import ContextFullError, CospecError, GenerationError, InvalidArgumentError, from_native
from .evaluation.machine import machine_identity
from .generation import (PROVENANCE, STOP_REASONS, Decision, Generation, LogprobEntry, Stats, TokenEvent,
                         TokenLogprobs)
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model
from .native_calls import MODEL_INDEX, Background, native_errors
from .params import UNTIL_CONTEXT_ENDS, GenerationParams, native_refusal, spec_type_heads, spec_type_uses_model


# Engine(flash_attn=...): flash attention of the target and draft contexts (cospec.h's
# enum cospec_flash_attn). None keeps the engine's default: off for a model under
# _cospec.FLASH_ATTN_CPU_OFF_MAX_PARAMS parameters that runs on the CPU, where llama.cpp's
# kernel makes verifying a block of a tiny model dear; llama.cpp's choice for larger models
# and where offloaded.
FLASH_ATTN = {"auto": _cospec.FLASH_ATTN_AUTO, "off": _cospec.FLASH_ATTN_OFF, "on": _cospec.FLASH_ATTN_ON}


# llama.cpp's environment variable for --repack / --no-repack (common/arg.cpp), read where neither is
# given, with llama.cpp's spellings of a boolean.
REPACK_ENV = "LLAMA_ARG_REPACK"
_TRUE, _FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def repack_setting(value: bool | None) -> bool | None:
    """Weight repacking as asked: the value given, else $LLAMA_ARG_REPACK, else None (the engine's
    default, on)."""
    if value is not None:
        return bool(value)
    text = os.environ.get(REPACK_ENV)
    if text is None or text == "":
        return None
    if text.lower() in _TRUE or text.lower() in _FALSE:
        return text.lower() in _TRUE
    raise InvalidArgumentError(f"{REPACK_ENV}={text!r} is not a boolean (on, off, true, false, 1, 0)")


def flash_attn_setting(name: str | None) -> int | None:
    if name is None:
        return None
    if name not in FLASH_ATTN:
        raise InvalidArgumentError(f"flash_attn must be one of {sorted(FLASH_ATTN)} or None, not {name!r}")
    return FLASH_ATTN[name]


@dataclass
class _Request:
    prompt: list[int]
    params: GenerationParams
    arbiter: Arbiter | None
    arbiter_name: str | None
    draft_prompt: list[int]  # a draft of another vocabulary: its own reading of the prompt (empty: the prompt's text)
    native: _cospec.GenerateParams  # params.native(), built once: the engine checks and then runs the same one


class Engine(ChatMixin, ArbiterCacheMixin):
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
                 load_mode: str | None = None, devices: str | None = None, devices_draft: str | None = None,
                 head: str | os.PathLike | None = None, repack: bool | None = None):
        """head: a head drafter (an EAGLE-3 head, a DFlash drafter) beside the draft model (one given
        as `draft` is one too, as llama.cpp's -md takes it, and the engine then has no draft model).
        chat_template: a Jinja chat template (or a name: "chatml", "gemma") used instead of the target's own; it
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
        device names, or "none"), repack (--repack/--no-repack: llama.cpp's weight repacking for its
        multi-token CPU kernels; None: $LLAMA_ARG_REPACK as llama.cpp reads it, else the engine's
        default, on, as in llama.cpp; repacked_bytes says how much each model's process holds)."""
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
        self.head_path = os.fspath(resolve_model(head)) if head is not None else None
        # Loading runs beside this thread so that Ctrl-C here cancels it.
        loading = Background("cospec-load", lambda: _cospec.Engine(
            self.target_path, self.draft_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
            n_threads_batch=n_threads_batch, n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
            progress=native_progress, rpc_servers=rpc if isinstance(rpc, str) else ",".join(rpc or ()),
            flash_attn=flash_attn_setting(flash_attn), n_ubatch=n_ubatch,
            head_path=self.head_path or "", repack=repack_setting(repack), **{name: value or "" for name, value in llama_settings.items()}))
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
        self._init_arbiters()
        try:
            self._init_chat(chat_template, draft_chat_template)
        except BaseException:
            self.close()
            raise
        self.model_name = os.path.splitext(os.path.basename(self.target_path))[0]
        repacked = self.repacked_bytes
        # What a calibration is stored under: these files, and this machine as the engine uses it.
        self.calibration_pair = {"target": file_identity(self.target_path),
                                 "draft": file_identity(self.draft_path) if self.draft_path else None}
        self.calibration_machine = {**machine_identity(), "n_threads": n_threads, "n_threads_batch": n_threads_batch,
                                    "n_gpu_layers": n_gpu_layers, "n_gpu_layers_draft": n_gpu_layers_draft,
                                    "flash_attn": flash_attn, "rpc": rpc if isinstance(rpc, str) else ",".join(rpc or ()),
                                    # (only where set: calibrations stored before these settings existed still fit)
                                    **{name: value for name, value in {**llama_settings, "n_ubatch": n_ubatch}.items()
                                       if value},
                                    # repacked weights run other kernels: another curve of verify costs
                                    **({"repacked": {**repacked, "kinds": _cospec.repack_buffer_types()}}
                                       if any(repacked.values()) else {})}
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
        with native_errors():
            self._native.set_calibration(None if calibration is None else calibration.numbers)
        self.calibration = calibration

    def calibrate(self, prompts: Sequence[str | Sequence[int]] | None = None, *, chat: bool | None = None,
                  max_tokens: int = calibration_store.ACCEPTANCE_TOKENS, store: bool = True) -> Calibration:
        """Measure this pair's calibration here (costs, then acceptance on `prompts`, default a
        built-in set; see calibration.measure), use it, and store it for every later engine of the
        pair on this machine. Resets the engine."""
        with native_errors():
            measured = calibration_store.measure(self, prompts, chat=chat, max_tokens=max_tokens)
        if store and measured.busy:
            calibration_store.notice(f"this calibration is used by this engine and not stored: "
                                     f"{calibration_store.busy_words(measured)}")
        elif store:
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
        calibration_store.notice(f"calibration of this pair on this machine: {why}; measuring its costs "
                                 f"{'and a sample of its acceptance ' if self.has_draft else ''}now (once; "
                                 f"`cospec-local calibrate` measures acceptance on more)")
        try:
            with native_errors():
                measured = calibration_store.measure_first_use(self)
            self.set_calibration(measured)
            if measured.busy:
                calibration_store.notice(f"the costs just measured are used by this engine and not stored: "
                                         f"{calibration_store.busy_words(measured)}")
            else:
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
        with native_errors():
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
        with native_errors():
            return self._native.n_ctx

    @property
    def n_vocab(self) -> int:
        """The target's vocabulary size (rows of its logits)."""
        with native_errors():
            return self._native.n_vocab

    @property
    def has_draft(self) -> bool:
        with native_errors():
            return self._native.has_draft

    @property
    def repacked_bytes(self) -> dict:
        """Bytes of each model's weights llama.cpp repacked at load for its multi-token CPU kernels
        ({"target": n, "draft": n}): private memory this process holds beside the mapped files (0:
        repacking off, or no weight of a type with such kernels, e.g. Q4_1 on x86)."""
        with native_errors():
            return {"target": self._native.repacked_bytes(0), "draft": self._native.repacked_bytes(1)}

    @property
    def head(self) -> str | None:
        """The head drafter llama.cpp runs for this target: "eagle3" (an EAGLE-3 head) or "dflash" (a
        DFlash drafter), given as `head` or as the draft, which is then no draft model; "mtp" (the
        target's multi-token-prediction layers); or None."""
        with native_errors():
            return self._native.head

    @property
    def head_file(self) -> str | None:
        """The file the head drafter's weights come from: the EAGLE-3 head's or DFlash drafter's,
        or the target's own for its MTP layers; None without a head."""
        kind = self.head
        return self.target_path if kind == "mtp" else (self.head_path or self.draft_path) if kind else None

    @property
    def vocab_difference(self) -> str | None:
        """None where the draft shares the target's vocabulary (or there is none); else how the two
        differ: the draft's proposals then reach the target as text, re-encoded into its tokens."""
        with native_errors():
            return self._native.vocab_difference()

    def abort(self) -> None:
        """Stop the running generation (thread-safe); it returns what it has."""
        self._native.abort()

    def reset(self) -> None:
        """Forget the cached prompt prefix of both models and of the learned arbiters loaded here
        (a running generation is stopped first)."""
        with native_errors():
            self._native.reset()
            self._reset_arbiters()

    # ------------------------------------------------------------ vocabulary

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True, which: str = "target") -> list[int]:
        """Tokens of `text` in the target's vocabulary, or the draft's (which="draft")."""
        with native_errors():
            return self._native.tokenize(text.encode("utf-8"), add_special, parse_special, MODEL_INDEX[which])

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
        with native_errors():
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
                f"has {'the ' + self.head + ' one' if self.head else 'none'} (an EAGLE-3 head or DFlash drafter is given as the "
                f"draft, -md HEAD.gguf, or beside it, --model-head HEAD.gguf; MTP comes with a target that carries its layers)")
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
        with native_errors():
            self._native.grammar_check(MODEL_INDEX[which], grammar)

    def is_eog(self, token: int) -> bool:
        with native_errors():
            return self._native.is_eog(token)

    def meta(self, key: str, which: str = "target") -> str | None:
        with native_errors():
            return self._native.meta(0 if which == "target" else 1, key)

    def model_desc(self, which: str = "target") -> str | None:
        with native_errors():
            return self._native.model_desc(0 if which == "target" else 1)

    def flash_attn(self, which: str = "target") -> str | None:
        """The flash-attention setting that model's context was created with ("auto": llama.cpp's
        choice, on where the backend has it; "off"; "on"), the default's rule applied; None
        without that model."""
        with native_errors():
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

    def prompt_embedding(self, prompt: str | Sequence[int]):
        """The draft's final hidden state at a prompt's last token (it reads the last 256, in its own
        tokens where the vocabularies differ), L2-normalised: a float32 array (n_embd,), what an
        arbiter's embedding gate reads (cospec_prompt_embedding)."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        try:
            return self._native.prompt_embedding(tokens)
        except _cospec.CospecError as exc:
            raise from_native(exc) from None

    # ------------------------------------------------------------ generation

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
        # The engine's own checks before any output (cospec_generate_check), its field named.
        native = params.native()
        with native_errors():
            refused = self._native.check(tokens, native, arbiter, draft_tokens)
        if refused is not None:
            raise native_refusal(*refused)
        return _Request(tokens, params, arbiter, name, draft_tokens, native)

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
        return self._native.generate(request.prompt, request.native, request.arbiter, list(p.stop), on_token,
                                     request.draft_prompt, p.grammar or "")

    def _run(self, request: _Request, on_token=None) -> dict:
        """Run the native loop beside this thread; Ctrl-C here aborts it and keeps what it made."""
        generation = Background("cospec-generate", lambda: self._native_generate(request, on_token))
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
        generation = Background("cospec-stream", work)
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
