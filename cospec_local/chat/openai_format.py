"""OpenAI's shapes of what a chat generation produced, for `serve` and Engine.create_chat_completion
alike: log-probabilities, the assistant's message with its tool calls, and a streamed reply whose
calls are read whole once they may have begun."""
from __future__ import annotations

from .tool_calls import ToolCall, may_begin_call, parse_reply


def _entry(piece: bytes, logprob: float) -> dict:
    return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}


def chat_logprobs(entries: list) -> dict:
    """Chat's logprobs object of engine.TokenLogprobs entries: {"content": [...], "refusal": None}."""
    return {"content": [_entry(e.piece, e.logprob) | {"top_logprobs": [_entry(t.piece, t.logprob) for t in e.top]}
                        for e in entries], "refusal": None}


def text_logprobs(entries: list, offset: int = 0) -> dict:
    """The text endpoint's logprobs: parallel lists, text_offset counted from `offset` characters."""
    tokens = [e.piece.decode("utf-8", "replace") for e in entries]
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.piece.decode("utf-8", "replace"): t.logprob for t in e.top} for e in entries],
            "text_offset": offsets}


def assistant_message(text: str, tool_form: str | None) -> tuple[dict, bool]:
    """The assistant's message of a whole reply (read for calls where the model was shown tools),
    and whether it calls tools."""
    if tool_form is None:
        return {"role": "assistant", "content": text}, False
    content, calls = parse_reply(text, tool_form)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.openai() for c in calls]
    return message, bool(calls)


def finish_reason(finish: str, called: bool) -> str:
    """OpenAI's finish_reason: tool_calls where a reply that ended by itself called tools."""
    return "tool_calls" if called and finish == "stop" else finish


class CallReader:
    """A streamed reply of a model shown tools: text goes out as content until a call may begin;
    the rest is read whole at the end, as content and tool calls. Without tools, all is content."""

    def __init__(self, form: str | None):
        self.form, self.text, self.sent = form, "", 0

    def sendable(self, text: str) -> str:
        if self.form is None:
            return text
        self.text += text
        end = max(self.sent, may_begin_call(self.text, self.form))
        out, self.sent = self.text[self.sent:end], end
        return out

    def rest(self) -> tuple[str | None, list[ToolCall]]:
        if self.form is None:
            return None, []
        return parse_reply(self.text[self.sent:], self.form)

    def rest_delta(self) -> dict:
        """The last delta: the content held back and the calls ({} where there is neither)."""
        content, calls = self.rest()
        delta: dict = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [c.openai(i) for i, c in enumerate(calls)]
        return delta


def openai_usage(n_prompt: int, *results) -> dict:
    """OpenAI's `usage` object of generations (a request's choices) from one prompt of n_prompt
    tokens: the prompt counted once, every choice's tokens."""
    completion = sum(len(result.tokens) for result in results)
    return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion}
