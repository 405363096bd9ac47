"""Tool calls: tools rendered by the model's own chat template, calls read back from its reply.

A model learns one way of writing a call, and its chat template says which by the way it shows
the tools. Two forms cover most open models:

- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Qwen 2.5
  and 3, Hermes 2 and 3, SmolLM3 and their many fine-tunes);
- llama3: the whole reply one JSON object `{"name": ..., "parameters": {...}}` (Llama 3.1 to 3.3's
  JSON tool calling), after an optional `<|python_tag|>`.

- generic: for a template that shows no tools (a model not made for them), llama.cpp's generic
  format: the tools described in the system message, and the whole reply one JSON object held to
  a grammar, `{"tool_call": {"name", "arguments"}}` (`{"tool_calls": [...]}` where several are
  allowed) or `{"response": "..."}` where the model may answer instead.

A reply is read in its template's form; text that is no well-formed call stays the reply's content.
`call_grammar` writes the grammar that forces a call (tool_choice "required" or a named function),
its arguments held to the tool's JSON schema by llama.cpp's converter (json_grammar).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..json_grammar import schema_grammar

HERMES = "hermes"
LLAMA3 = "llama3"
GENERIC = "generic"
# llama.cpp's words (common/chat.cpp's generic format), after the tools' description.
GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
                       "reply to the user's request")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
# A tool no conversation names: a template that shows it to the model takes tools.
_PROBE_TOOL = {"type": "function", "function": {"name": "cospec_probe_tool_7f3a", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


class ToolsError(ValueError):
    """Tools a request cannot use with this model (the message says why; `param` names the field)."""

    def __init__(self, message: str, param: str = "tools"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools: shown to the model by its template; forced: "" for any of them
    (tool_choice required), a tool's name, or None (the model chooses: auto); parallel: several
    calls allowed."""

    tools: list
    forced: str | None
    parallel: bool


def tool_request(tools: list | None, tool_choice=None, parallel_tool_calls: bool | None = None) -> ToolRequest | None:
    """OpenAI's tools, tool_choice and parallel_tool_calls as a ToolRequest (None where the model is
    shown no tools: none given, or tool_choice "none"); ToolsError for values that do not fit."""
    if tool_choice not in (None, "none", "auto", "required") and not isinstance(tool_choice, dict):
        raise ToolsError("tool_choice must be none, auto, required or {'type': 'function', 'function': "
                         "{'name': ...}}", "tool_choice")
    if not tools:
        if tool_choice not in (None, "none"):
            raise ToolsError("tool_choice needs tools", "tool_choice")
        return None
    if tool_choice == "none":
        return None
    names = tool_names(tools)
    forced = None
    if tool_choice == "required":
        forced = ""
    elif isinstance(tool_choice, dict):
        forced = (tool_choice.get("function") or {}).get("name")
        if tool_choice.get("type") != "function" or forced not in names:
            raise ToolsError(f"tool_choice names no tool of this request (tools: {', '.join(names)})", "tool_choice")
    return ToolRequest(list(tools), forced, bool(parallel_tool_calls))


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self):
        self.id = self.id or "call_" + uuid.uuid4().hex[:24]

    def openai(self, index: int | None = None) -> dict:
        """OpenAI's tool_calls entry (with `index` in a streamed delta)."""
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def takes_tools(template) -> bool:
    """Whether a chat template shows tools to the model: it renders a probe tool's name."""
    try:
        text = template.render([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                               tools=[_PROBE_TOOL])
    except ValueError:  # ChatTemplateError: a template that refuses tools does not take them
        return False
    return _PROBE_TOOL["function"]["name"] in text


def call_format(template_source: str) -> str:
    """The form of call the template's model writes: hermes where the template names <tool_call>,
    llama3 where it asks for a {"name", "parameters"} object; hermes otherwise."""
    if _HERMES_OPEN in template_source:
        return HERMES
    if '"parameters"' in template_source or "python_tag" in template_source or "ipython" in template_source:
        return LLAMA3
    return HERMES


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: an assistant's tool call arguments as an object
    (templates write them with tojson), its content "" where it only called tools."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call = json.loads(json.dumps(call))
                function = call.get("function") or {}
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except json.JSONDecodeError:
                        pass  # a template shows it as the text it is
                calls.append(call)
            message["tool_calls"] = calls
            if message.get("content") is None:
                message["content"] = ""
        out.append(message)
    return out


def _call_of(value: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                                         ensure_ascii=False))


def generic_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A conversation in llama.cpp's generic tool format, for a template that shows no tools: the
    tools and the instruction in the system message, earlier calls and answers as the JSON the model
    writes, tool results as user messages ({"tool_response": ...}), since such templates know
    neither tool_calls nor the tool role."""
    described = json.dumps([t["function"] for t in tools], indent=2, ensure_ascii=False)
    intro = f"You can call any of the following tools to satisfy the user's requests: {described}\n\n" \
            f"{GENERIC_INSTRUCTION}"
    out = []
    for message in template_messages(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [{"name": (c.get("function") or {}).get("name", ""),
                      "arguments": (c.get("function") or {}).get("arguments", {})} for c in message["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            message = {"role": "assistant", "content": json.dumps(body, ensure_ascii=False)}
        elif role == "assistant":
            message = {"role": "assistant", "content": json.dumps({"response": message.get("content") or ""},
                                                                  ensure_ascii=False)}
        elif role == "tool":
            response = {"tool_call_id": message.get("tool_call_id", ""), "content": message.get("content")}
            message = {"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False)}
        out.append(message)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{intro}"}
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out


def generic_grammar(tools: list[dict], forced: str | None, parallel: bool) -> str:
    """The grammar of a reply in the generic format: a call of one of the tools (of `forced` where
    it names one; several where parallel), or, where the model may choose (forced None), an answer."""
    one = _call_schema(tools, forced or None, "arguments")
    call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
            "required": ["tool_calls"]} if parallel else \
        {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return schema_grammar(call if forced is not None else {"anyOf": [call, answer]})


def parse_reply(text: str, form: str) -> tuple[str | None, list[ToolCall]]:
    """The reply's content (None where it is all calls) and the calls it makes, in the given form."""
    if form == GENERIC:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        if isinstance(value, dict) and isinstance(value.get("response"), str):
            return value["response"], []
        values = value.get("tool_calls") if isinstance(value, dict) and isinstance(value.get("tool_calls"), list) \
            else [value.get("tool_call")] if isinstance(value, dict) else []
        calls = [_call_of(v, "arguments") for v in values]
        if not calls or any(c is None for c in calls):
            return text, []
        return None, calls
    if form == LLAMA3:
        body = text.strip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG):].strip()
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        values = value if isinstance(value, list) else [value]
        calls = [_call_of(v, "parameters") for v in values]
        if not calls or any(c is None for c in calls):
            return text, []
        return None, calls
    calls, kept, last = [], [], 0
    for match in _HERMES_CALL.finditer(text):
        try:
            call = _call_of(json.loads(match.group(1)), "arguments")
        except json.JSONDecodeError:
            call = None
        if call is None:
            continue
        calls.append(call)
        kept.append(text[last:match.start()])
        last = match.end()
    if not calls:
        return text, []
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content or None, calls


def may_begin_call(text: str, form: str) -> int:
    """Where in streamed text a call may begin (len(text): nowhere yet): the text before it can be
    sent as content while the rest waits to be read whole."""
    if form == GENERIC:
        return 0  # the whole reply is one JSON object: read when it is whole
    if form == LLAMA3:
        stripped = text.lstrip()
        if not stripped or stripped[0] in "{[" or _PYTHON_TAG.startswith(stripped[:len(_PYTHON_TAG)]):
            return 0
        return len(text)
    at = text.find(_HERMES_OPEN)
    if at >= 0:
        return at
    for k in range(min(len(_HERMES_OPEN) - 1, len(text)), 0, -1):  # a tag cut at the text's end
        if _HERMES_OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)


def tool_names(tools: list[dict]) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise ToolsError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                             "...}}}")
        names.append(function["name"])
    return names


def _call_schema(tools: list[dict], name: str | None, key: str) -> dict:
    """The JSON schema of one call of a tool (of `name` where given): its name, and under `key`
    its arguments as the tool's parameters schema says."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise ToolsError(f"tool_choice names {name!r}, which is not one of the request's tools")
    options = [{"type": "object",
                "properties": {"name": {"const": t["function"]["name"]},
                               key: t["function"].get("parameters") or {"type": "object"}},
                "required": ["name", key]} for t in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_grammar(tools: list[dict], form: str, name: str | None = None, parallel: bool = True) -> str:
    """A grammar whose output is a call (several where parallel) of one of the tools (or of `name`),
    in the template's form, its arguments matching the tool's JSON schema."""
    schema = _call_schema(tools, name, "parameters" if form == LLAMA3 else "arguments")
    if form == LLAMA3:
        return schema_grammar(schema)
    one = f'"{_HERMES_OPEN}\\n" tool-call "\\n{_HERMES_CLOSE}"'
    return schema_grammar(schema, "tool-call", one + (f' ("\\n" {one})*' if parallel else ""))
