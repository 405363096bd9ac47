"""llama-server's own API beside the OpenAI one, for the clients written for llama-server (its web
UI, editor plugins that speak /completion and /infill): the same engines, scheduler and errors.

    POST /completion     a prompt (text or token ids), whole or streamed, llama-server's fields and answer
    POST /infill         fill-in-the-middle, where the model has FIM tokens (501 where it has none)
    POST /tokenize       {"content"} -> {"tokens"} (with_pieces: each token's text)
    POST /detokenize     {"tokens"} -> {"content"}
    GET  /props          the served models and default settings
    GET  /slots          the engines, read-only (llama-server's slots)
    POST /embedding, /embeddings, /v1/embeddings   501: the engine's target does not embed

LLAMA_FIELDS says what becomes of each field llama-server's /completion reads (docs/serve.md's
table, checked against it by a test).
"""
from __future__ import annotations

import json
import time
from typing import ClassVar, Union

from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import _cospec
from ..generation import Generation
from .protocol import APIError, _Common, ignored_header, parse_request, refused_error, validated

# llama-server's stop_type of each of the engine's stop reasons.
STOP_TYPES = {"eog": "eos", "max_tokens": "limit", "context_full": "limit", "stop_string": "word", "aborted": "none"}

# Every field llama-server's /completion reads, and what this server does with it: "supported",
# "ignored" (accepted, named in the X-Cospec-Ignored header) or "refused" (400 naming the field where
# a request asks for something this server cannot do; the field's neutral value is accepted).
LLAMA_FIELDS = {
    "prompt": "supported", "n_predict": "supported", "max_tokens": "supported", "stream": "supported",
    "temperature": "supported", "top_k": "supported", "top_p": "supported", "min_p": "supported",
    "repeat_penalty": "supported", "repeat_last_n": "supported", "seed": "supported", "stop": "supported",
    "ignore_eos": "supported", "grammar": "supported", "json_schema": "supported", "n_probs": "supported",
    "return_tokens": "supported", "cache_prompt": "supported", "speculative.n_max": "supported",
    "speculative.n_min": "supported", "speculative.p_min": "supported", "input_prefix": "supported",
    "input_suffix": "supported", "input_extra": "supported",
    "id_slot": "ignored", "n_keep": "ignored", "min_keep": "ignored", "samplers": "ignored",
    "timings_per_token": "ignored", "return_progress": "ignored", "response_fields": "ignored",
    "n_cmpl": "ignored",
    "typical_p": "refused", "dynatemp_range": "refused", "dynatemp_exponent": "refused", "mirostat": "refused",
    "mirostat_tau": "refused", "mirostat_eta": "refused", "dry_multiplier": "refused", "dry_base": "refused",
    "dry_allowed_length": "refused", "dry_penalty_last_n": "refused", "dry_sequence_breakers": "refused",
    "xtc_probability": "refused", "xtc_threshold": "refused", "presence_penalty": "refused",
    "frequency_penalty": "refused", "logit_bias": "refused", "n_indent": "refused", "t_max_predict_ms": "refused",
    "image_data": "refused", "multimodal_data": "refused", "lora": "refused", "post_sampling_probs": "refused",
}

# A refused field's neutral value, which llama-server's clients send by default (accepted as it is).
_NEUTRAL = {"typical_p": 1.0, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
            "mirostat_eta": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
            "dry_penalty_last_n": -1, "xtc_probability": 0.0, "xtc_threshold": 0.1, "n_indent": 0,
            "t_max_predict_ms": 0, "post_sampling_probs": False}


class LlamaCompletionRequest(_Common):
    """llama-server's /completion request (its /infill adds input_prefix, input_suffix, input_extra)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    max_stop_strings: ClassVar[int] = 64  # llama-server sets no limit (OpenAI's is 4)
    prompt: Union[str, list[int], list[str]] = ""
    n_probs: int = Field(0, ge=0, le=_cospec.N_TOP_LOGPROBS_MAX)
    return_tokens: bool = False
    cache_prompt: bool = True  # the engine reuses the cached prefix either way; false only costs time
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[dict] = Field(default_factory=list)
    # read, without effect here (named in the answer's header)
    id_slot: int | None = None
    n_keep: int | None = None
    min_keep: int | None = None
    samplers: Union[str, list[str], None] = None
    timings_per_token: bool | None = None
    return_progress: bool | None = None
    response_fields: list[str] | None = None
    n_cmpl: int | None = None
    # llama.cpp's samplers and features this engine does not have: refused unless neutral
    typical_p: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    image_data: list | None = None
    multimodal_data: list | None = None
    lora: list | None = None
    post_sampling_probs: bool | None = None

    def logprob_request(self) -> tuple[bool, int]:
        return self.n_probs > 0, self.n_probs

    def accepted_without_effect(self) -> tuple[str, ...]:
        return ("id_slot", "n_keep", "min_keep", "samplers", "timings_per_token", "return_progress", "response_fields",
                "n_cmpl", "user")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise APIError(400, f"{name} is not supported here (llama.cpp's sampler or feature); leave it out or "
                                    f"at {neutral!r}", param=name)
        for name in ("image_data", "multimodal_data", "lora", "dry_sequence_breakers"):
            if getattr(self, name):
                if name == "dry_sequence_breakers" and not self.dry_multiplier:
                    continue  # breakers of a DRY sampler that is off
                raise APIError(400, f"{name} is not supported here", param=name)
        if self.n > 1:
            raise APIError(400, "/completion makes one completion; n is the OpenAI endpoint's", param="n")

    def prompt_input(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise APIError(400, "one prompt per request is supported", param="prompt")
            return self.prompt[0]
        return self.prompt


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int]


def _piece(raw: bytes):
    """A token's text as llama-server gives it: a string where it is whole UTF-8, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _probabilities(entries) -> list[dict]:
    """llama-server's completion_probabilities of engine.TokenLogprobs entries."""
    def one(token, piece, logprob):
        return {"id": token, "token": piece.decode("utf-8", "replace"), "bytes": list(piece), "logprob": logprob}

    return [one(e.token, e.piece, e.logprob) | {"top_logprobs": [one(t.token, t.piece, t.logprob) for t in e.top]}
            for e in entries]


class LlamaServerAPI:
    """The native endpoints of one CospecServer."""

    def __init__(self, server):
        self.server = server

    def routes(self) -> list[Route]:
        return [Route("/completion", self.completion, methods=["POST"]),
                Route("/infill", self.infill, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/props", self.props, methods=["GET"]),
                Route("/slots", self.slots, methods=["GET"]),
                *[Route(path, self.embeddings, methods=["POST"]) for path in ("/embedding", "/embeddings",
                                                                               "/v1/embeddings")]]

    # ------------------------------------------------------------ generation

    async def completion(self, request: Request):
        return await self._generate(request, infill=False)

    async def infill(self, request: Request):
        return await self._generate(request, infill=True)

    async def _generate(self, request: Request, infill: bool):
        s = self.server
        s._authorize(request)
        req = parse_request(LlamaCompletionRequest, await s._json_body(request), s.settings.strict)
        s._check_model(req)
        params = s._params(req)
        if infill:
            extra = [(str(e.get("filename", "")), str(e.get("text", ""))) for e in req.input_extra]
            if not isinstance(req.prompt, str):
                raise APIError(400, "/infill takes the text after the middle token as a string prompt", param="prompt")
            payload = await self._query("infill", req.input_prefix, req.input_suffix, extra, req.prompt)
        else:
            if req.input_prefix or req.input_suffix or req.input_extra:
                raise APIError(400, "input_prefix, input_suffix and input_extra are /infill's", param="input_prefix")
            payload = req.prompt_input()
            if payload in ("", []):
                raise APIError(400, "prompt is empty", param="prompt")
        started = time.perf_counter()
        job, prompt = await s._start(False, payload, params)
        prompt_text = req.prompt if isinstance(req.prompt, str) else ""
        if req.stream:
            s._count(request, 200)
            return EventSourceResponse(self._stream(job, req, params, prompt_text, len(prompt.tokens), started),
                                       ping=15, headers={"Cache-Control": "no-store", **ignored_header(req)})
        result, _ = await s._whole(request, job, started)
        s._count(request, 200)
        return JSONResponse(self._final(result, req, params, prompt_text, len(prompt.tokens)) |
                            {"content": result.text, "tokens": result.tokens if req.return_tokens else []},
                            headers=ignored_header(req))

    async def _stream(self, job, req, params, prompt_text: str, n_prompt: int, started: float):
        """llama-server's stream: a chunk per piece of text, then one with stop true and the rest."""
        s = self.server
        first = None
        try:
            async for event in job.tokens():
                first = first or time.perf_counter()
                chunk = {"index": 0, "content": event.text, "tokens": [event.token] if req.return_tokens and
                         event.token >= 0 else [], "stop": False, "id_slot": 0}
                if req.n_probs and event.logprobs is not None:
                    chunk["completion_probabilities"] = _probabilities([event.logprobs])
                yield json.dumps(chunk, ensure_ascii=False)
            try:
                result = await job.finish()
            except Exception as exc:  # noqa: BLE001 - the stream's last event says what happened
                yield json.dumps(APIError(500, f"generation failed: {exc}", "server_error").body())
                return
            s._observe(result, started, first)
            yield json.dumps(self._final(result, req, params, prompt_text, n_prompt, streamed=True)
                             | {"content": "", "tokens": []}, ensure_ascii=False)
        finally:
            job.cancel()

    def _final(self, result: Generation, req, params, prompt_text: str, n_prompt: int, streamed: bool = False) -> dict:
        stats = result.stats
        stop_word = params.stop[0] if result.stop_reason == "stop_string" and len(params.stop) == 1 else ""
        out = {"index": 0, "id_slot": 0, "stop": True, "model": req.model, "tokens_predicted": len(result.tokens),
               "tokens_evaluated": n_prompt, "generation_settings": self._settings(params),
               "prompt": prompt_text, "has_new_line": "\n" in result.text, "truncated": False,
               "stop_type": STOP_TYPES.get(result.stop_reason, "none"), "stopping_word": stop_word,
               "tokens_cached": stats.cache_n + stats.prompt_n + len(result.tokens),
               "timings": stats.to_json(),
               "cospec": {"mode": result.mode, "arbiter": result.arbiter, "stop_reason": result.stop_reason,
                          "seed": params.seed}}
        if req.n_probs and not streamed:
            out["completion_probabilities"] = _probabilities(result.logprobs or [])
        if req.provenance:
            out["cospec"]["provenance"] = result.provenance
        return out

    def _settings(self, params) -> dict:
        """generation_settings as llama-server names them."""
        return {"n_predict": params.max_tokens, "temperature": params.temperature, "top_k": params.top_k,
                "top_p": params.top_p, "min_p": params.min_p, "repeat_penalty": params.repeat_penalty,
                "repeat_last_n": params.repeat_last_n, "seed": params.seed, "stop": list(params.stop),
                "ignore_eos": params.ignore_eos, "n_probs": params.top_logprobs, "grammar": params.grammar or "",
                "speculative.n_max": params.draft_max, "speculative.n_min": params.draft_min,
                "speculative.p_min": params.draft_p_min, "mode": params.mode, "spec_type": params.spec_type,
                "arbiter": params.arbiter if isinstance(params.arbiter, str) else getattr(params.arbiter, "name", None)}

    # ------------------------------------------------------------ the rest

    async def _query(self, op: str, *args):
        """An engine's answer to a question that runs no generation (it waits for a free engine)."""
        from .workers import EngineDied, EngineUnavailable, RequestRefused

        lease = await self.server._lease()
        try:
            return await lease.query(op, *args)
        except RequestRefused as exc:
            raise refused_error(*exc.args) from None
        except (EngineDied, EngineUnavailable) as exc:
            raise APIError(503, f"no engine: {exc}", "server_error", code="engine_unavailable") from None
        finally:
            lease.release()

    async def tokenize(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        req = validated(TokenizeRequest, await s._json_body(request))
        tokens = await self._query("tokenize", req.content, req.add_special, req.parse_special, req.with_pieces)
        s._count(request, 200)
        if req.with_pieces:
            return JSONResponse({"tokens": [{"id": t, "piece": _piece(raw)} for t, raw in tokens]})
        return JSONResponse({"tokens": tokens})

    async def detokenize(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        req = validated(DetokenizeRequest, await s._json_body(request))
        content = await self._query("detokenize", req.tokens)
        s._count(request, 200)
        return JSONResponse({"content": content})

    async def props(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        s._count(request, 200)
        return JSONResponse({"default_generation_settings": {"n_ctx": s.n_ctx, "params": self._settings(s.defaults)},
                             "total_slots": len(s.pool.workers), "model_path": s.settings.target,
                             "model_alias": s.settings.model_id, "draft_model_path": s.settings.draft,
                             "build_info": "cospec-local",
                             "modalities": {"vision": False, "audio": False}, "endpoint_slots": True,
                             "endpoint_props": True, "endpoint_metrics": True})

    async def slots(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        s._count(request, 200)
        return JSONResponse([{"id": i, "n_ctx": s.n_ctx, "is_processing": id(w) in s.pool.leased, "alive": w.alive,
                              "speculative": s.has_draft or None}
                             for i, w in enumerate(s.pool.workers)])

    async def embeddings(self, request: Request) -> JSONResponse:
        self.server._authorize(request)
        raise APIError(501, "embeddings are not served: the engine's target model generates (llama-server computes "
                            "them in a server started with --embedding and a pooling model)", "server_error",
                       code="not_implemented")
