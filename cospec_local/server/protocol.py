"""OpenAI's request and error shapes, and how a request becomes GenerationParams.

Requests are validated with pydantic. Fields OpenAI defines but this server cannot honour
(frequency_penalty, logit_bias, audio, ...) are refused with 400 naming the field where a request
asks for them, not silently ignored; OPENAI_FIELDS says what becomes of each.
Unknown fields are ignored, as OpenAI's own API does, and named in the answer's X-Cospec-Ignored
header; the server refuses them with --strict.
Extension fields (`mode`, `arbiter`, `spec_type`, `top_k`, `min_p`, `repeat_penalty`,
`repeat_last_n`, `draft_max`, `adaptive_draft`, `ignore_eos`, `provenance`, and llama-server's `grammar` and `json_schema`) are top-level, as
llama-server's are; OpenAI clients send them with `extra_body`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .. import _cospec
from ..json_grammar import SchemaError, response_format_grammar, schema_grammar
from ..params import MODES, GenerationParams
from ..chat.tool_calls import ToolRequest, ToolsError, tool_request

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_CHOICES = 16  # n: each choice is a generation of its own, one after another
MAX_COMPLETION_LOGPROBS = 5  # the text endpoint's logprobs (a count of likeliest tokens), OpenAI's limit
# Nesting of brackets in a request's grammar: llama.cpp's parser recurses once per level.
MAX_GRAMMAR_DEPTH = 256


class APIError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant's calls, sent back in the conversation
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def template_message(self) -> dict:
        """The message as chat templates read it (OpenAI's developer role is their system role)."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share: OpenAI's, then the server's extensions."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    max_stop_strings: ClassVar[int] = MAX_STOP_STRINGS
    model: str | None = None  # OpenAI requires it; as llama-server, a request without it gets the served model
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, lt=2**31)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: Union[str, list[str], None] = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # independent generations, choice i with seed + i
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None
    user: str | None = None
    # Extensions.
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    arbiter: str | None = None
    spec_type: str | None = None  # --spec-type: ngram, draft, ngram,draft, auto, none
    top_k: int | None = Field(None, ge=0, lt=2**31)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    repeat_last_n: int | None = Field(None, ge=-1, lt=2**31)
    draft_max: int | None = Field(None, ge=1, le=_cospec.N_DRAFT_MAX)
    adaptive_draft: bool | None = None  # false: every block as long as draft_max allows (--fixed-draft)
    ignore_eos: bool | None = None
    provenance: bool = False
    grammar: str | None = None  # llama-server's: a GBNF grammar the reply must match
    json_schema: dict | None = None  # llama-server's: a JSON schema the reply must match
    # llama-server's per-request speculation, as its clients send it: "speculative.n_max" and the
    # others as top-level keys (or one "speculative" object); "speculative": false turns it off.
    n_predict: int | None = Field(None, ge=-1, lt=2**31)  # llama-server's max_tokens (-1: until the context ends)
    speculative_n_max: int | None = Field(None, alias="speculative.n_max", ge=1, le=_cospec.N_DRAFT_MAX)
    speculative_n_min: int | None = Field(None, alias="speculative.n_min", ge=0, le=_cospec.N_DRAFT_MAX)
    speculative_p_min: float | None = Field(None, alias="speculative.p_min", ge=0, le=1)
    speculative_enabled: bool | None = Field(None, alias="speculative.enabled")
    _ignored: list[str] = PrivateAttr(default_factory=list)  # fields read without effect (parse_request)

    @property
    def ignored(self) -> list[str]:
        return self._ignored

    @model_validator(mode="before")
    @classmethod
    def _speculative_object(cls, data):
        """{"speculative": {"n_max": 4}} or {"speculative": false}: the dotted keys' meaning."""
        if isinstance(data, dict) and "speculative" in data:
            data = dict(data)
            value = data.pop("speculative")
            if isinstance(value, bool):
                data["speculative.enabled"] = value
            elif isinstance(value, dict):
                data.update({f"speculative.{key}": v for key, v in value.items()})
            else:
                raise ValueError("speculative must be an object (n_max, n_min, p_min, enabled) or a boolean")
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > cls.max_stop_strings:
            raise ValueError(f"at most {cls.max_stop_strings} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        for s in stops:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800 escapes
                raise ValueError("stop strings must be valid UTF-8") from None
        return stops

    def output_grammar(self) -> str | None:
        """The grammar the request holds its reply to (grammar, json_schema, response_format); at most one."""
        given = [name for name in ("grammar", "json_schema", "response_format") if self._constrains(name)]
        if len(given) > 1:
            raise APIError(400, f"{' and '.join(given)}: give one way of constraining the reply", param=given[1])
        if self.grammar is not None:
            _check_grammar_depth(self.grammar)
            return self.grammar
        param = "json_schema" if self.json_schema is not None else "response_format"
        try:
            if self.json_schema is not None:
                return schema_grammar(self.json_schema)
            return response_format_grammar(getattr(self, "response_format", None))
        except SchemaError as exc:
            raise APIError(400, str(exc), param=param) from None

    def _constrains(self, name: str) -> bool:
        if name == "response_format":
            value = getattr(self, "response_format", None)
            return value is not None and value.get("type", "text") != "text"
        return getattr(self, name) is not None

    def logprob_request(self) -> tuple[bool, int]:
        """Whether the reply carries log-probabilities, and how many likeliest tokens each lists."""
        return False, 0

    def accepted_without_effect(self) -> tuple[str, ...]:
        """Fields read and accepted that change nothing here (named in the answer's header)."""
        return ("user",)

    def refuse_unsupported(self) -> None:
        """400 for OpenAI features this server does not implement, naming the field."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) != 0:
                raise APIError(400, f"{name} is not supported; use repeat_penalty (llama.cpp's)", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")


class ChatCompletionRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, lt=2**31)
    tools: list | None = None
    tool_choice: Any = None
    functions: list | None = None  # the older spelling of tools
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=_cospec.N_TOP_LOGPROBS_MAX)
    modalities: list[str] | None = None
    audio: dict | None = None
    web_search_options: dict | None = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None  # as llama-server: one call unless a request asks for several
    # OpenAI's that change nothing here: accepted (also under --strict) and ignored.
    prediction: Any = None
    reasoning_effort: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None

    def logprob_request(self) -> tuple[bool, int]:
        return bool(self.logprobs), self.top_logprobs or 0

    def accepted_without_effect(self) -> tuple[str, ...]:
        return ("user", "prediction", "reasoning_effort", "metadata", "store", "service_tier")

    def tool_request(self) -> ToolRequest | None:
        """The tools the model is shown and how it must use them; None where it is shown none."""
        try:
            return tool_request(self.tools, self.tool_choice, self.parallel_tool_calls)
        except ToolsError as exc:
            raise APIError(400, str(exc), param=exc.param) from None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name in ("functions", "function_call"):
            if getattr(self, name) not in (None, [], "none"):
                raise APIError(400, f"{name} is OpenAI's older spelling; send tools and tool_choice", param=name)
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.audio is not None or any(m != "text" for m in self.modalities or []):
            raise APIError(400, "only text output is supported", param="audio" if self.audio else "modalities")
        if self.web_search_options is not None:
            raise APIError(400, "web search is not supported", param="web_search_options")
        tools = self.tool_request()
        if tools is not None and tools.forced is not None and self.output_grammar() is not None:
            raise APIError(400, "a forced tool call already constrains the reply; leave out grammar, json_schema "
                                "and response_format", param="tool_choice")


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)  # the likeliest tokens listed per token
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def logprob_request(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise APIError(400, "one prompt per request is supported", param="prompt")
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported", param="best_of")

    def prompt_input(self) -> str | list[int]:
        """Text, or token ids."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        if isinstance(self.prompt, list) and not self.prompt:
            raise APIError(400, "prompt is empty", param="prompt")
        return self.prompt


# Every field of OpenAI's two endpoints and what this server does with it (docs/serve.md's table,
# checked against this by a test): "supported", "ignored" (accepted, no effect on the reply) or
# "refused" (400 naming the field where a request asks for what this server cannot do).
OPENAI_FIELDS = {
    "chat": {
        "messages": "supported", "model": "supported", "stream": "supported", "stream_options": "supported",
        "max_tokens": "supported", "max_completion_tokens": "supported", "temperature": "supported",
        "top_p": "supported", "seed": "supported", "stop": "supported", "n": "supported",
        "frequency_penalty": "refused", "presence_penalty": "refused", "logprobs": "supported",
        "top_logprobs": "supported", "logit_bias": "refused", "tools": "supported", "tool_choice": "supported",
        "parallel_tool_calls": "supported", "functions": "refused", "function_call": "refused",
        "response_format": "supported", "modalities": "refused", "audio": "refused", "web_search_options": "refused",
        "prediction": "ignored", "reasoning_effort": "ignored", "metadata": "ignored", "store": "ignored",
        "service_tier": "ignored", "user": "ignored",
    },
    "completions": {
        "prompt": "supported", "model": "supported", "stream": "supported", "stream_options": "supported",
        "max_tokens": "supported", "temperature": "supported", "top_p": "supported", "seed": "supported",
        "stop": "supported", "n": "supported", "best_of": "refused", "echo": "refused", "suffix": "refused",
        "frequency_penalty": "refused", "presence_penalty": "refused", "logprobs": "supported",
        "logit_bias": "refused", "user": "ignored",
    },
}


def _check_grammar_depth(grammar: str) -> None:
    depth = deepest = 0
    for char in grammar:
        depth += (char in "([") - (char in ")]")
        deepest = max(deepest, depth)
    if deepest > MAX_GRAMMAR_DEPTH:
        raise APIError(400, f"grammar: brackets nest {deepest} deep; at most {MAX_GRAMMAR_DEPTH}", param="grammar")


def refused_error(status: int, message: str, param: str | None, code: str | None) -> APIError:
    """The answer to a request an engine refused (workers.RequestRefused's arguments)."""
    return APIError(status, message, param=param, code=code)


def ignored_header(req) -> dict:
    """The header that names the request's fields this server read without effect."""
    return {"X-Cospec-Ignored": ", ".join(req.ignored)} if req.ignored else {}


def known_fields(cls: type[BaseModel]) -> set[str]:
    """The request keys a model reads (a field's alias where it has one: "speculative.n_max")."""
    keys = {info.alias or name for name, info in cls.model_fields.items()}
    return keys | ({"speculative"} if "speculative_n_max" in cls.model_fields else set())


def validated(cls: type[BaseModel], data: Any) -> BaseModel:
    """data as the model `cls`, or APIError(400) naming the first bad field."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


def parse_request(cls: type[_Common], data: Any, strict: bool) -> _Common:
    """The validated request, or APIError(400) naming the first bad field. Fields it does not
    read are refused under --strict, else listed in `request.ignored` (the answer names them in
    its X-Cospec-Ignored header: no field a client sends is dropped without a word)."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    unknown = sorted(set(data) - known_fields(cls))
    if strict and unknown:
        raise APIError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0], code="unknown_field")
    request = validated(cls, data)
    request.refuse_unsupported()
    request._ignored = unknown + [name for name in request.accepted_without_effect() if name in data]
    return request


# A GenerationParams setting as a request names it, where the request names it otherwise.
_REQUEST_NAMES = {"draft_min": "speculative.n_min", "draft_p_min": "speculative.p_min"}

# The request's fields that set the GenerationParams field of the same name.
_PARAM_FIELDS = ("temperature", "top_p", "seed", "mode", "arbiter", "spec_type", "top_k", "min_p", "repeat_penalty",
                 "repeat_last_n", "draft_max", "adaptive_draft", "ignore_eos")


def generation_params(request: _Common, defaults: GenerationParams, allowed_arbiters: set[str],
                      has_draft: bool) -> GenerationParams:
    """The server's defaults with the request's own settings on top; 400 for values it refuses."""
    changes: dict = {}
    for field in _PARAM_FIELDS:
        value = getattr(request, field)
        if value is not None:
            changes[field] = value
    given = [name for name in ("max_completion_tokens", "max_tokens", "n_predict") if getattr(request, name, None)
             is not None]
    if len(given) > 1 and len({getattr(request, name) for name in given}) > 1:
        raise APIError(400, f"{' and '.join(given)} disagree: give one", param=given[1])
    if given:
        max_tokens = getattr(request, given[0])
        if max_tokens == 0:  # llama-server's n_predict 0: nothing to generate
            raise APIError(400, f"{given[0]} must be positive, or -1 (until the context ends)", param=given[0])
        changes["max_tokens"] = max_tokens
    # Per-request speculation, llama-server's way.
    for key, setting in (("speculative_n_max", "draft_max"), ("speculative_n_min", "draft_min"),
                         ("speculative_p_min", "draft_p_min")):
        if getattr(request, key) is not None:
            changes[setting] = getattr(request, key)
    if request.speculative_enabled is False:
        changes["spec_type"] = "none"  # the target alone: no draft source proposes
    if request.stop:
        changes["stop"] = tuple(request.stop)
    if "arbiter" in changes and changes["arbiter"] not in allowed_arbiters:
        # A request must not make the server read an arbitrary folder from its disk.
        raise APIError(400, f"arbiter {changes['arbiter']!r} is not served here; one of: "
                            f"{', '.join(sorted(allowed_arbiters))}", param="arbiter")
    logprobs, top = request.logprob_request()
    if logprobs:
        changes.update(logprobs=True, top_logprobs=top)
    grammar = request.output_grammar()
    if grammar is not None:
        changes["grammar"] = grammar
    params = defaults.updated(**changes)
    try:
        params.validate()
    except ValueError as exc:
        field = getattr(exc, "field", None)
        name = _REQUEST_NAMES.get(field, field)
        raise APIError(400, str(exc).replace(f"{field}:", f"{name}:", 1) if field else str(exc), param=name) from None
    if not has_draft:
        # Without a draft model the n-gram drafter drafts alone.
        if params.mode == "draft-only":
            raise APIError(400, "mode 'draft-only' needs a draft model; this server has none", param="mode")
        if params.mode == "speculative" and params.spec_type in ("draft", "draft-simple"):
            raise APIError(400, f"spec_type {params.spec_type!r} needs a draft model; this server has none",
                           param="spec_type")
        if params.mode == "speculative" and params.arbiter not in ("target", "auto"):
            if "arbiter" in changes:
                raise APIError(400, f"arbiter {params.arbiter!r} decides a draft model's mismatches; this server "
                                    "has no draft model", param="arbiter")
            params = params.updated(arbiter="target")
    return params
