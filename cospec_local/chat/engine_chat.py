"""The engine's chat surface, mixed into Engine as transformers' GenerationMixin is into its
models: the target's (and a draft of another vocabulary's) chat template, tools shown to the
model or described in llama.cpp's generic format, and OpenAI-style chat completions. It calls
the engine's tokenize, generate and stream, and its native handle for the templates' sources."""
from __future__ import annotations

import logging
import time
import uuid
from typing import Iterator, Sequence

from ..json_grammar import response_format_grammar
from ..native_calls import MODEL_INDEX, native_errors
from ..params import GenerationParams
from .openai_format import CallReader, assistant_message, chat_logprobs, finish_reason, openai_usage
from .template import ChatTemplate, ChatTemplateError, from_gguf_metadata, template_source
from .template_process import IsolatedChatTemplate
from .tool_calls import (GENERIC, ToolRequest, ToolsError, call_format, call_grammar, generic_grammar,
                         generic_messages, takes_tools, template_messages, tool_request)

log = logging.getLogger(__name__)


class ChatMixin:
    """Chat on an Engine: its templates are compiled (sandboxed, out of process) on first use, or
    at open where the caller gave one."""

    def _init_chat(self, chat_template: str | None, draft_chat_template: str | None) -> None:
        self._chat_template: ChatTemplate | None = None
        self._chat_template_override = chat_template
        self._takes_tools: bool | None = None
        self._draft_chat_template: ChatTemplate | None = None
        self._draft_template_resolved = False
        self._draft_chat_template_override = draft_chat_template
        # Compiled now: a broken template is an error at open, not at the first reply.
        if chat_template is not None:
            self.chat_template
        if draft_chat_template is not None:
            self.draft_chat_template


    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            with native_errors():
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
        with native_errors():
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
        with native_errors():
            bos = self._native.bos_of(MODEL_INDEX[which])
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
