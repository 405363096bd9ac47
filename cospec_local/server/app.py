"""The HTTP application: OpenAI's chat and text completions, models, health, metrics, the web chat.

Starlette (ASGI) with server-sent events from sse-starlette. Every error answer has OpenAI's
shape and a 4xx status when the request is at fault; the handlers never let an exception
take the server down. See protocol.py for the requests, scheduler.py for the engines.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import sys
import time
import uuid
from dataclasses import dataclass
from importlib import resources

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..arbiter.catalog import arbiters_for_draft
from ..chat.openai_format import (CallReader, assistant_message, chat_logprobs, finish_reason, openai_usage,
                                  text_logprobs)
from ..generation import Generation
from ..params import GenerationParams
from .llama_api import LlamaServerAPI
from .metrics import ServerMetrics
from .protocol import (APIError, ChatCompletionRequest, CompletionRequest, generation_params, ignored_header,
                       parse_request, refused_error)
from .scheduler import END, EnginePool, Job, ServerBusy
from .workers import EngineDied, EngineUnavailable, EngineWorker, GenerationFailed, PreparedPrompt, RequestRefused

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413) before it is read whole
RETRY_AFTER_S = 1


@dataclass
class ServerSettings:
    model_id: str             # the name clients send as `model` (GET /v1/models lists it)
    target: str               # what the models are, for /v1/models
    draft: str | None
    about: str | None = None  # what the models can do, shown by the web chat (the demo pair's scope)
    api_key: str | None = None
    strict: bool = False      # unknown request fields: 400 instead of ignored
    max_waiting: int = 16     # requests that may wait for an engine; more are answered 503
    # Host headers accepted (None: any). A server on loopback accepts only loopback names, so a web
    # page cannot reach it through a DNS name rebound to 127.0.0.1.
    allowed_hosts: frozenset[str] | None = None


class HostCheck:
    """ASGI middleware: refuse Host headers outside `allowed` (None: any), in OpenAI's error shape."""

    def __init__(self, app, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if self.allowed is not None and scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]
            if name.strip("[]") not in self.allowed:
                body = APIError(400, f"Host {host!r} is not served here (a loopback server answers only to "
                                     "loopback names)", code="invalid_host").body()
                await JSONResponse(body, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestLog:
    """ASGI middleware: one line per request on standard error once its response has been sent,
    as llama-server and Ollama log: client, method, path, status, time (a stream's whole length)."""

    def __init__(self, app, out=None):
        self.app, self.out = app, out

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.monotonic(), [0]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                client = scope.get("client") or ("-", 0)
                print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {client[0]} {scope['method']} {scope['path']} "
                      f"{status[0]} {1000 * (time.monotonic() - start):.0f} ms", file=self.out or sys.stderr,
                      flush=True)

        await self.app(scope, receive, sending)


class CospecServer:
    def __init__(self, workers: list[EngineWorker], defaults: GenerationParams, settings: ServerSettings):
        """`workers`: started engine processes, all of the same models."""
        self.pool = EnginePool(workers, settings.max_waiting)
        self.defaults = defaults
        self.settings = settings
        self.metrics = ServerMetrics(self.pool)
        self.has_draft = workers[0].info["has_draft"]
        self.n_ctx = workers[0].info["n_ctx"]
        # A request may choose among these (the web chat offers them): the ones that fit the draft; a
        # folder path from a client would read the server's disk.
        self.arbiters = set(arbiters_for_draft(workers[0].info.get("draft_path")))
        if isinstance(defaults.arbiter, str):
            self.arbiters.add(defaults.arbiter)
        self.model_ids = {settings.model_id}
        self.created = int(time.time())

    # ------------------------------------------------------------ plumbing

    def app(self) -> Starlette:
        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            *LlamaServerAPI(self).routes(),  # llama-server's own endpoints
        ]
        handlers = {APIError: self._api_error, HTTPException: self._http_error, Exception: self._unexpected}

        @contextlib.asynccontextmanager
        async def lifespan(app):
            yield
            self.pool.close()  # stop running generations and the engine processes

        return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan,
                         middleware=[Middleware(RequestLog),
                                     Middleware(HostCheck, allowed=self.settings.allowed_hosts)])

    def _count(self, request: Request, status: int) -> None:
        self.metrics.requests.labels(request.url.path, str(status)).inc()

    async def _api_error(self, request: Request, exc: APIError) -> JSONResponse:
        self._count(request, exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def _http_error(self, request: Request, exc: HTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return await self._api_error(request, APIError(exc.status_code, f"{request.method} {request.url.path}: "
                                                                        f"{exc.detail}", code=kind))

    async def _unexpected(self, request: Request, exc: Exception) -> JSONResponse:
        self._count(request, 500)
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error").body(),
                            status_code=500)

    def _authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")

    async def _json_body(self, request: Request):
        # JSON only: a web page can send other types (text/plain) to any origin without asking first.
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise APIError(415, f"the body must be application/json, not {kind or 'untyped'}",
                           code="unsupported_media_type")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="body_too_large")
        body = bytearray()
        try:
            async for piece in request.stream():
                body += piece
                if len(body) > MAX_BODY_BYTES:
                    raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="body_too_large")
        except ClientDisconnect:
            raise APIError(400, "the client went away before sending the whole body") from None
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None

    def _check_model(self, req) -> None:
        """Any model name is served the loaded model, as llama-server does (clients send "gpt-4o" or
        their own default); the reply names the model asked for. --strict refuses a name this
        server does not serve. A request that names none is given the served one."""
        if req.model is None:
            req.model = self.settings.model_id
        if req.model not in self.model_ids and self.settings.strict:
            raise APIError(404, f"the model {req.model!r} does not exist here; this server serves "
                                f"{', '.join(sorted(self.model_ids))}", param="model", code="model_not_found")

    # ------------------------------------------------------------ simple endpoints

    async def index(self, request: Request) -> HTMLResponse:
        page = resources.files("cospec_local.server").joinpath("static/index.html").read_text(encoding="utf-8")
        self._count(request, 200)
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def health(self, request: Request) -> JSONResponse:
        self._count(request, 200)
        return JSONResponse({"status": "ok", "engines": len(self.pool.workers), "engines_alive": self.pool.alive,
                             "engines_busy": self.pool.busy,
                             "requests_waiting": self.pool.waiting, "auth": self.settings.api_key is not None})

    async def metrics_text(self, request: Request) -> Response:
        self._authorize(request)
        self._count(request, 200)
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        self._count(request, 200)
        d = self.defaults
        info = {"target": self.settings.target, "draft": self.settings.draft, "about": self.settings.about,
                "n_ctx": self.n_ctx,
                "default_mode": d.mode,
                "default_arbiter": d.arbiter if isinstance(d.arbiter, str) else getattr(d.arbiter, "name", None),
                "arbiters": sorted(self.arbiters), "modes": ["speculative", "target-only", "draft-only"]
                if self.has_draft else ["speculative", "target-only"]}
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": self.created, "owned_by": "cospec-local", "cospec": info}
            for m in sorted(self.model_ids)]})

    # ------------------------------------------------------------ completions

    async def chat_completions(self, request: Request) -> Response:
        self._authorize(request)
        req = parse_request(ChatCompletionRequest, await self._json_body(request), self.settings.strict)
        self._check_model(req)
        params = self._params(req)
        messages = [m.template_message() for m in req.messages]
        return await self._respond(request, req, params, (messages, req.tool_request()), chat=True)

    async def completions(self, request: Request) -> Response:
        self._authorize(request)
        req = parse_request(CompletionRequest, await self._json_body(request), self.settings.strict)
        self._check_model(req)
        params = self._params(req)
        return await self._respond(request, req, params, req.prompt_input(), chat=False)

    def _params(self, req) -> GenerationParams:
        params = generation_params(req, self.defaults, self.arbiters, self.has_draft)
        if req.seed is None and params.temperature > 0:
            params = params.updated(seed=secrets.randbelow(2**63))  # OpenAI's default: a fresh seed; reported back
        return params

    async def _respond(self, request: Request, req, params: GenerationParams, payload, chat: bool) -> Response:
        """Messages (chat) or a prompt (text or token ids) through an engine, whole or streamed;
        n > 1: n independent generations one after another, choice i with seed + i."""
        started = time.perf_counter()
        choices = [params if i == 0 else params.updated(seed=(params.seed + i) % 2**64) for i in range(req.n)]
        job, prompt = await self._start(chat, payload, choices[0])
        reply = _Reply(chat, "chatcmpl-" if chat else "cmpl-", req.model, len(prompt.tokens), params, req.provenance,
                       prompt.tool_form)

        async def start(index: int) -> Job:
            return (await self._start(chat, payload, choices[index]))[0]

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            self._count(request, 200)  # a stream's status is sent before its generation ends
            return EventSourceResponse(self._stream(job, start, len(choices), reply, started, include_usage), ping=15,
                                       headers={"Cache-Control": "no-store", **ignored_header(req)})
        done = [await self._whole(request, job, started)]
        for index in range(1, len(choices)):
            done.append(await self._whole(request, await start(index), started))
        self._count(request, 200)  # only now: a generation that fails is counted once, with its error's status
        return JSONResponse(reply.whole(done), headers=ignored_header(req))

    async def _lease(self):
        """An engine for this request, or 503 with Retry-After where every one is busy and the queue full."""
        try:
            return await self.pool.acquire()
        except ServerBusy:
            raise APIError(503, "every engine is busy and the queue is full; retry later", "server_error",
                           code="server_busy", headers={"Retry-After": str(RETRY_AFTER_S)}) from None

    async def _start(self, chat: bool, payload, params: GenerationParams) -> tuple[Job, PreparedPrompt]:
        """An engine, the prompt's tokens on it, and its generation started."""
        lease = await self._lease()
        try:
            prompt = await lease.prepare(chat, payload, params)
        except BaseException as exc:
            lease.release()
            if isinstance(exc, RequestRefused):
                raise _refused(exc) from None
            if isinstance(exc, EngineUnavailable):
                raise APIError(503, f"no engine: {exc}", "server_error", code="engine_unavailable",
                               headers={"Retry-After": str(RETRY_AFTER_S)}) from None
            if isinstance(exc, EngineDied):
                raise _engine_died(exc) from None
            raise
        if prompt.grammar is not None:  # a forced tool call
            params = params.updated(grammar=prompt.grammar)
        job = lease.start(prompt, params)
        # Counted when the generation ends, however it ends (a stream whose client left included).
        job.future.add_done_callback(lambda _: job.result is not None and self.metrics.generation(job.result))
        return job, prompt

    async def _whole(self, request: Request, job: Job, started: float) -> tuple[Generation, list]:
        """One generation to its end: its result and token events."""
        first = None
        while not job.future.done():
            await asyncio.wait({job.future}, timeout=0.25)
            if first is None and not job.events.empty():
                first = time.perf_counter()
            if not job.future.done() and await request.is_disconnected():
                job.cancel()  # nobody is waiting for the answer
        try:
            result = await job.finish()
        except EngineDied as exc:
            raise _engine_died(exc) from None
        except GenerationFailed as exc:
            raise APIError(500, f"generation failed: {exc}", "server_error", code="generation_failed") from None
        except RequestRefused as exc:
            raise _refused(exc) from None
        events = []
        while not job.events.empty():
            events.append(job.events.get_nowait())
        self._observe(result, started, first)
        return result, [e for e in events if e is not END]

    async def _stream(self, job: Job, start, n: int, reply: "_Reply", started: float, include_usage: bool):
        """Server-sent chunks of each choice in turn (choice i's chunks carry index i)."""
        first, results = None, []
        try:
            for index in range(n):
                if index > 0:
                    try:
                        job = await start(index)
                    except APIError as exc:
                        yield json.dumps(exc.body())
                        return
                if reply.chat:
                    yield json.dumps(reply.chunk({"role": "assistant", "content": ""}, index=index))
                pending: list = []  # tokens whose text is not sent yet (a split UTF-8 character, a tool call)
                calls = CallReader(reply.tool_form)
                async for event in job.tokens():
                    first = first or time.perf_counter()
                    pending.append(event)
                    if event.text and (text := calls.sendable(event.text)):
                        yield json.dumps(reply.chunk(reply.delta(text), tokens=pending, index=index))
                        pending = []
                try:
                    result = await job.finish()
                except EngineDied as exc:
                    yield json.dumps(_engine_died(exc).body())
                    return
                except (GenerationFailed, RequestRefused) as exc:
                    yield json.dumps(APIError(500, f"generation failed: {exc}", "server_error",
                                              code="generation_failed").body())
                    return
                self._observe(result, started, first)
                results.append(result)
                delta = calls.rest_delta()
                if delta:
                    yield json.dumps(reply.chunk(delta, tokens=pending, index=index))
                    pending = []
                yield json.dumps(reply.last_chunk(result, pending, index=index, called="tool_calls" in delta))
            if include_usage:
                yield json.dumps(reply.usage_chunk(results))
            yield "[DONE]"
        finally:
            job.cancel()  # a client gone mid-stream: stop at once (nothing if it finished)

    def _observe(self, result: Generation, started: float, first: float | None) -> None:
        now = time.perf_counter()
        self.metrics.latency.observe(now - started)
        if first is not None:
            self.metrics.first_token.observe(first - started)


def _engine_died(exc: EngineDied) -> APIError:
    # The engine starts again for the next request: like a full queue, a retry is the remedy (503).
    return APIError(503, str(exc), "server_error", code="engine_died", headers={"Retry-After": str(RETRY_AFTER_S)})


def _refused(exc: RequestRefused) -> APIError:
    return refused_error(*exc.args)


class _Reply:
    """The response objects of one request, chat or text completion, whole or in chunks."""

    def __init__(self, chat: bool, prefix: str, model: str, n_prompt: int, params: GenerationParams,
                 provenance: bool, tool_form: str | None = None):
        self.chat, self.model, self.n_prompt, self.params, self.provenance = chat, model, n_prompt, params, provenance
        self.tool_form = tool_form  # the model was shown tools: its reply is read for calls
        self.id = prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = self.object + ".chunk" if chat else self.object  # OpenAI's text chunks keep the name
        self._streamed: dict[int, int] = {}  # characters streamed per choice (the text endpoint's text_offset)

    def delta(self, text: str) -> dict:
        return {"content": text}

    @staticmethod
    def _tokens(events) -> list[dict]:
        """Per-token provenance (the extension): id (-1: held-back text at the end), provenance, text."""
        return [{"id": e.token, "provenance": e.provenance, "text": e.text} for e in events]

    def _logprobs(self, entries: list, offset: int = 0):
        """OpenAI's logprobs object of these tokens (None where the request asked for none): chat's
        {"content": [...]}, or the text endpoint's parallel lists."""
        if not self.params.logprobs:
            return None
        return chat_logprobs(entries) if self.chat else text_logprobs(entries, offset)

    def _choice(self, body, finish_reason, index: int = 0, logprobs=None) -> dict:
        if self.chat:
            key = "delta" if isinstance(body, dict) else "message"
            value = body if isinstance(body, dict) else {"role": "assistant", "content": body}
            return {"index": index, key: value, "logprobs": logprobs, "finish_reason": finish_reason}
        text = body.get("content", "") if isinstance(body, dict) else body
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def chunk(self, delta: dict, finish_reason=None, tokens=None, index: int = 0) -> dict:
        entries = [e.logprobs for e in tokens or () if e.logprobs is not None]
        logprobs = self._logprobs(entries, self._streamed.get(index, 0)) if entries else None
        self._streamed[index] = self._streamed.get(index, 0) + len(delta.get("content") or "")
        out = {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
               "choices": [self._choice(delta, finish_reason, index, logprobs)]}
        if self.provenance and tokens:
            out["cospec"] = {"tokens": self._tokens(tokens)}
        return out

    def _summary(self, result: Generation, index: int = 0) -> dict:
        return {"mode": result.mode, "arbiter": result.arbiter, "stop_reason": result.stop_reason,
                "seed": (self.params.seed + index) % 2**64}

    def last_chunk(self, result: Generation, pending, index: int = 0, called: bool = False) -> dict:
        out = self.chunk({}, finish_reason(result.finish_reason, called), tokens=pending, index=index)
        out["timings"] = result.stats.to_json()
        out.setdefault("cospec", {}).update(self._summary(result, index))
        return out

    def usage_chunk(self, results: list[Generation]) -> dict:
        return {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": openai_usage(self.n_prompt, *results)}

    def _whole_choice(self, result: Generation, index: int) -> dict:
        logprobs = self._logprobs(result.logprobs or [])
        if not self.chat:
            return self._choice(result.text, result.finish_reason, index, logprobs)
        message, called = assistant_message(result.text, self.tool_form)
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": finish_reason(result.finish_reason, called)}

    def whole(self, done: list[tuple[Generation, list]]) -> dict:
        """The whole response of n choices (result and token events each); timings and cospec are
        the first choice's, with each choice's own in cospec.choices where there are several."""
        first, events = done[0]
        cospec = self._summary(first)
        if self.provenance:
            cospec["tokens"] = self._tokens(events)
        if len(done) > 1:
            cospec["choices"] = [self._summary(result, i) | ({"tokens": self._tokens(ev)} if self.provenance else {})
                                 for i, (result, ev) in enumerate(done)]
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [self._whole_choice(result, i) for i, (result, _) in enumerate(done)],
                "usage": openai_usage(self.n_prompt, *(result for result, _ in done)), "timings": first.stats.to_json(),
                "cospec": cospec}
