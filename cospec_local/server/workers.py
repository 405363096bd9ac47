"""Engines in processes of their own, for `serve`.

Why processes, not threads: every llama.cpp computation of one process runs on one thread (see
the compute thread in native/python/bindings.cpp: OpenMP teams slow each other down otherwise),
so engines in one process would take turns; in their own processes they run side by side
(`--parallel N`). And an engine that dies takes only its process along: llama.cpp aborts the
process when an RPC server goes away mid-generation, for one. The server then answers that
request with 503 engine_died (a stream gets it as its last event) and starts the engine again
for the next one.

The messages on the pipe are the dataclasses below: Prepare and Generate from the server; from
the engine process Ready, Prepared, Token (one TokenEvent, in order), Done (the Generation), and
Failed / Refused (an error of the engine or of the request).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import _cospec
from ..engine import Engine
from ..generation import Generation, TokenEvent
from ..params import GenerationParams


@dataclass(frozen=True)
class EngineSpec:
    """How to open an engine, and the arbiter to load at once (so a bad one fails at start)."""

    target: str
    draft: str | None
    n_ctx: int = _cospec.DEFAULT_N_CTX
    n_threads: int = 0
    n_gpu_layers: int = -1
    n_gpu_layers_draft: int = -1
    rpc: str | None = None
    flash_attn: str | None = None  # None: the engine's default
    chat_template: str | None = None  # None: the target's own
    draft_chat_template: str | None = None  # None: the draft's own (a draft of another vocabulary)
    verbose: bool = False
    calibration: str | None = "auto"  # cospec_local.calibration: auto, a file, or None
    head: str | None = None  # a head drafter (EAGLE-3, DFlash) beside the draft model
    preload: GenerationParams | None = None
    llama: dict = field(default_factory=dict)  # llama.cpp's loading settings, as Engine takes them (n_ubatch, ...)


class EngineUnavailable(Exception):
    """The engine process could not start (the reason is the message)."""


class EngineDied(Exception):
    """The engine process ended in the middle of a request."""


class GenerationFailed(Exception):
    """The engine reported an error in the middle of a generation (the message says which)."""


class RequestRefused(Exception):
    """The request cannot run on this engine: (status, message, param, code) for the API's error."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (llama.cpp aborted: with --rpc, usually a lost RPC server)" if name == "SIGABRT" else ""
        return f"it was ended by {name}{why}"
    return f"it exited with code {code}"


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt as the engine reads it."""

    tokens: list[int]
    # A draft of another vocabulary's own rendering of the messages (None: it reads the prompt's text).
    draft_tokens: list[int] | None = None
    tool_form: str | None = None  # the form of call the model writes (tool_calls.HERMES, ...), where shown tools
    grammar: str | None = None    # a forced tool call's grammar


# ---------------------------------------------------------------- messages on the pipe

@dataclass(frozen=True)
class Prepare:
    """Server -> engine: tokenize a request's prompt (chat: (messages, ToolRequest or None))."""
    chat: bool
    payload: Any
    params: GenerationParams


@dataclass(frozen=True)
class Generate:
    """Server -> engine: run a generation (request_stop names it by generation_id)."""
    generation_id: int
    prompt: PreparedPrompt
    params: GenerationParams


@dataclass(frozen=True)
class Query:
    """Server -> engine: a question about its models that runs no generation (QUERIES)."""
    op: str
    args: tuple


@dataclass(frozen=True)
class Answer:
    value: Any


@dataclass(frozen=True)
class Ready:
    """Engine -> server: the models are loaded (n_ctx, has_draft, n_vocab, draft_path)."""
    info: dict


@dataclass(frozen=True)
class Prepared:
    prompt: PreparedPrompt


@dataclass(frozen=True)
class Token:
    event: TokenEvent


@dataclass(frozen=True)
class Done:
    result: Generation


@dataclass(frozen=True)
class Failed:
    """The engine could not start, or failed in the middle of a generation."""
    message: str


@dataclass(frozen=True)
class Refused:
    """The request is at fault: the API's error (status, message, param, code)."""
    status: int
    message: str
    param: str | None
    code: str | None


# ---------------------------------------------------------------- the engine process

def prepare_prompt(engine: Engine, chat: bool, payload, params: GenerationParams) -> PreparedPrompt:
    """The prompt's tokens (checked against the context), the arbiter loaded, a grammar checked;
    RequestRefused for what the request got wrong. A chat's payload: (messages, ToolRequest or None)."""
    from ..chat.template import ChatTemplateError
    from ..errors import ArbiterError, InvalidArgumentError
    from ..chat.tool_calls import ToolsError

    param = "messages" if chat else "prompt"
    draft_prompt = tool_form = grammar = None
    if chat:
        messages, tools = payload
        try:
            tool_form, grammar = engine.tool_setup(tools)
        except ToolsError as exc:
            raise RequestRefused(400, str(exc), exc.param, None) from None
        if grammar is not None and params.grammar is not None:  # (the generic format's grammar holds every reply)
            raise RequestRefused(400, "this model's template shows no tools, so its replies to tools are held to "
                                      "llama.cpp's generic JSON format; leave out grammar, json_schema and "
                                      "response_format", "response_format", None)
        shown = tools.tools if tools is not None else None
        try:
            prompt = engine.render_chat(messages, tools=shown)
            draft_prompt = engine.render_draft_chat(messages, tools=shown)
        except ChatTemplateError as exc:
            raise RequestRefused(400, f"the chat template refused the messages: {exc}", param, None) from None
    elif isinstance(payload, str):
        prompt = engine.tokenize(payload)
    else:
        prompt = _known_tokens(engine, payload, param)
    if len(prompt) >= engine.n_ctx:
        raise RequestRefused(400, f"the prompt is {len(prompt)} tokens; the context holds {engine.n_ctx} (prompt and "
                                  "reply together)", param, "context_length_exceeded")
    if params.mode == "speculative":
        try:
            engine.arbiter_for(params)
        except (ArbiterError, InvalidArgumentError, FileNotFoundError) as exc:
            raise RequestRefused(400, f"arbiter {params.arbiter!r}: {exc}", "arbiter", None) from None
    try:
        engine.check_settings(params.updated(grammar=grammar) if grammar else params)
    except InvalidArgumentError as exc:
        raise RequestRefused(400, str(exc), exc.field, None) from None
    return PreparedPrompt(prompt, draft_prompt, tool_form, grammar)


def _tokenize(engine: Engine, text: str, add_special: bool, parse_special: bool, with_pieces: bool):
    tokens = engine.tokenize(text, add_special=add_special, parse_special=parse_special)
    return [(t, engine.token_bytes(t)) for t in tokens] if with_pieces else tokens


def _known_tokens(engine: Engine, tokens, param: str) -> list[int]:
    """The request's token ids, each checked against the vocabulary (RequestRefused naming `param`)."""
    bad = next((t for t in tokens if not 0 <= t < engine.n_vocab), None)
    if bad is not None:
        raise RequestRefused(400, f"token id {bad} is outside the vocabulary (0..{engine.n_vocab - 1})", param, None)
    return list(tokens)


def _detokenize(engine: Engine, tokens: list[int]) -> str:
    return engine.detokenize(_known_tokens(engine, tokens, "tokens"), render_special=True)


def _infill(engine: Engine, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt: str) -> list[int]:
    """llama-server's fill-in-the-middle prompt (prefix-suffix-middle order): the extra context's
    files first, then the prefix, the suffix, and the middle token followed by `prompt`."""
    fim = engine.fim_tokens
    if fim is None:
        raise RequestRefused(501, "this model has no fill-in-the-middle tokens (its vocabulary names no FIM prefix, "
                                  "suffix and middle); /infill needs a code model that has them", None,
                             "not_implemented")
    pre, suf, mid = fim
    tokens: list[int] = []
    for name, text in extra:
        tokens += engine.tokenize(f"{name}\n{text}", add_special=False, parse_special=False)
    tokens = [pre] + tokens + engine.tokenize(prefix, add_special=False, parse_special=False)
    tokens += [suf] + engine.tokenize(suffix, add_special=False, parse_special=False) + [mid]
    return tokens + engine.tokenize(prompt, add_special=False, parse_special=False)


# What a Query may ask the engine process: op -> fn(engine, *args).
QUERIES = {"tokenize": _tokenize, "detokenize": _detokenize, "infill": _infill}


def _engine_main(conn, spec: EngineSpec, stop_request) -> None:
    from ..chat.display import draft_off_note, other_vocab_note
    from ..errors import CalibrationNotice, CospecError, GenerationError

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server handles Ctrl-C and ends this process
    try:
        with warnings.catch_warnings(record=True) as notices:
            warnings.simplefilter("always", CalibrationNotice)
            engine = Engine(spec.target, spec.draft, n_ctx=spec.n_ctx, n_threads=spec.n_threads,
                            n_gpu_layers=spec.n_gpu_layers, n_gpu_layers_draft=spec.n_gpu_layers_draft,
                            verbose=spec.verbose, rpc=spec.rpc, flash_attn=spec.flash_attn,
                            chat_template=spec.chat_template, draft_chat_template=spec.draft_chat_template,
                            calibration=spec.calibration, head=spec.head, **spec.llama)
        for notice in notices:
            print(f"note: {notice.message}", file=sys.stderr, flush=True)
        if (note := other_vocab_note(engine)) is not None:
            print(f"note: {note}", file=sys.stderr, flush=True)
        p = spec.preload
        if p is not None and p.mode == "speculative" and engine.has_draft:
            engine.arbiter_for(p)
    except (CospecError, FileNotFoundError, ValueError) as exc:
        conn.send(Failed(str(exc)))
        return
    running = {"id": None}

    def stop(*_):
        # The server's "stop" (a client went away) names its generation: a late signal cannot stop the next one.
        # A stop that comes before the native loop starts (which clears the abort flag) is seen after the first token.
        if running["id"] is not None and stop_request.value == running["id"]:
            engine.abort()

    signal.signal(signal.SIGUSR1, stop)
    conn.send(Ready({"n_ctx": engine.n_ctx, "has_draft": engine.has_draft, "n_vocab": engine.n_vocab,
                     "draft_path": engine.draft_path}))
    said_draft_off = False
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        try:
            if isinstance(message, Prepare):
                conn.send(Prepared(prepare_prompt(engine, message.chat, message.payload, message.params)))
            elif isinstance(message, Query):
                conn.send(Answer(QUERIES[message.op](engine, *message.args)))
            elif isinstance(message, Generate):
                running["id"] = message.generation_id
                prompt = message.prompt
                try:
                    for event in engine.stream(prompt.tokens, message.params, draft_prompt=prompt.draft_tokens):
                        conn.send(Token(event))
                        if stop_request.value == message.generation_id:
                            break  # closing the stream stops the native loop
                finally:
                    running["id"] = None
                conn.send(Done(engine.last_result))
                if not said_draft_off and (note := draft_off_note(engine.last_result)) is not None:
                    said_draft_off = True  # once per engine process, in the server's log, as chat says it once
                    print(f"note: {note}", file=sys.stderr, flush=True)
        except RequestRefused as exc:
            conn.send(Refused(*exc.args))
        except GenerationError as exc:
            conn.send(Failed(f"{exc.status_name}: {exc}"))
        except (CospecError, ValueError) as exc:
            conn.send(Refused(400, str(exc), None, getattr(exc, "status_name", None)))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the engine
            conn.send(Failed(f"{type(exc).__name__}: {exc}"))
    engine.close()


# ---------------------------------------------------------------- the server's side

class EngineWorker:
    """One engine process. Its methods block: the server calls them on its threads."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.process = None
        self.conn = None
        self.info: dict = {}
        self._stop_request = None  # shared with the engine process: the generation a stop is for

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start the engine process and wait until its models are loaded (EngineUnavailable if not)."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._stop_request = context.Value("q", -1, lock=False)
        self.process = context.Process(target=_engine_main, args=(child, self.spec, self._stop_request), daemon=True,
                                       name="cospec-engine")
        self.process.start()
        child.close()
        self.conn = parent
        try:
            message = parent.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise EngineUnavailable(f"the engine process did not start: {describe_exit(self.process.exitcode)}") \
                from None
        if not isinstance(message, Ready):
            self.process.join(5)
            raise EngineUnavailable(message.message)
        self.info = message.info

    def ensure_started(self) -> None:
        if not self.alive:
            self.close()
            self.start()

    def _died(self) -> EngineDied:
        self.process.join(5)
        return EngineDied(f"the engine process ended: {describe_exit(self.process.exitcode)}; it starts again for "
                          "the next request")

    def _send(self, message) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError):
            raise self._died() from None

    def _receive(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    @staticmethod
    def _raise(message) -> None:
        if isinstance(message, Refused):
            raise RequestRefused(message.status, message.message, message.param, message.code)
        if isinstance(message, Failed):
            raise GenerationFailed(message.message)
        raise GenerationFailed(f"the engine process answered {type(message).__name__}")

    def prepare(self, chat: bool, payload, params: GenerationParams) -> PreparedPrompt:
        self._send(Prepare(chat, payload, params))
        message = self._receive()
        if not isinstance(message, Prepared):
            self._raise(message)
        return message.prompt

    def query(self, op: str, *args):
        """An answer from the engine that runs no generation (QUERIES names them)."""
        self._send(Query(op, args))
        message = self._receive()
        if not isinstance(message, Answer):
            self._raise(message)
        return message.value

    def generate(self, generation_id: int, prompt: PreparedPrompt, params: GenerationParams,
                 on_token: Callable[[TokenEvent], None]) -> Generation:
        """`generation_id` (unique in this server) is what request_stop names."""
        self._send(Generate(generation_id, prompt, params))
        while True:
            message = self._receive()
            if isinstance(message, Token):
                on_token(message.event)
            elif isinstance(message, Done):
                return message.result
            else:
                self._raise(message)

    def request_stop(self, generation_id: int) -> None:
        """Stop that generation, whether it is running or about to start; it still answers "done"
        with what it made. Safe from any thread; a stop for a generation already over does nothing."""
        if self.alive:
            self._stop_request.value = generation_id
            try:
                os.kill(self.process.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def stop_process(self) -> None:
        """End the engine process (a thread blocked reading its pipe then gets EngineDied)."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()

    def close(self) -> None:
        self.stop_process()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.process = None
