"""What editors, agents and chat front-ends send, through their own clients: the openai package
(log-probabilities, structured output with `parse`, tools) and an agent framework (openai-agents),
against a live server of SmolLM2 with a 2-layer draft and Qwen 2.5's chat template (from
llama.cpp's source), whose format SmolLM2's ChatML tokens share."""
from __future__ import annotations

import asyncio
import json
import math

import openai
import pytest
from pydantic import BaseModel

from cospec_local.formats.tiny_models import llama_cpp_source
from cospec_local.server.process import ServerProcess

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hours24": {"type": "boolean"}},
                   "required": ["city", "hours24"]}}}
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "extra_body": {"repeat_penalty": 1.0}}
pytestmark = pytest.mark.slow  # a live server, replies of seconds


def template(name: str) -> str:
    return str(llama_cpp_source() / "models" / "templates" / name)


@pytest.fixture(scope="module")
def server(target_path, draft_paths):
    # Fixed blocks: adaptive lengths learn from the machine's timings and may choose plain steps
    # only, and the log-probabilities test needs tokens a draft proposed.
    srv = ServerProcess("-m", target_path, "-md", draft_paths["disagreeing"], "-a", "smollm2", "-c", "2048",
                        "--fixed-draft", "--chat-template-file", template("Qwen-Qwen2.5-7B-Instruct.jinja"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def with_body(settings: dict, **extra) -> dict:
    return {**settings, "extra_body": {**settings.get("extra_body", {}), **extra}}


# ---------------------------------------------------------------- log-probabilities

def test_logprobs_are_the_targets_whatever_drafted_the_token_whole_and_streamed(client, engine_for):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    asked = dict(max_tokens=16, logprobs=True, top_logprobs=3, **GREEDY)
    spec = client.chat.completions.create(model="any", messages=question, **with_body(asked, provenance=True))
    target = client.chat.completions.create(model="any", messages=question, **with_body(asked, mode="target-only"))
    entries = spec.choices[0].logprobs.content
    assert len(entries) == spec.usage.completion_tokens > 0
    assert "".join(e.token for e in entries) == spec.choices[0].message.content
    provenance = {t["provenance"] for t in spec.model_extra["cospec"]["tokens"]}
    assert provenance - {"target"}, provenance  # some tokens came from a draft source
    # The target's log-probabilities, not the draft's: the same as target-only decoding's.
    alone = target.choices[0].logprobs.content
    assert [e.token for e in entries] == [e.token for e in alone]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in alone], abs=1e-4)
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e.logprob <= 0
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob  # greedy
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    streamed = [e for chunk in client.chat.completions.create(model="any", messages=question, stream=True, **asked)
                if chunk.choices and chunk.choices[0].logprobs for e in chunk.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)

    # Teacher-forced by the same target in this process: log softmax of each token's row.
    engine = engine_for("disagreeing")
    ids = [t["id"] for t in spec.model_extra["cospec"]["tokens"] if t["id"] >= 0]
    with engine_chat_template(engine, template("Qwen-Qwen2.5-7B-Instruct.jinja")):
        prompt = engine.render_chat(question)
    rows = engine.score(prompt + ids[:-1])[len(prompt) - 1:]
    for row, token, e in zip(rows, ids, entries):
        peak = float(row.max())
        logsum = peak + math.log(float(sum(math.exp(float(x) - peak) for x in row)))
        assert float(row[token]) - logsum == pytest.approx(e.logprob, abs=2e-3)


class engine_chat_template:
    """An engine rendering with another chat template for a while (the server's)."""

    def __init__(self, engine, path: str):
        from cospec_local.chat.template_process import IsolatedChatTemplate

        self.engine, self.template = engine, IsolatedChatTemplate(open(path, encoding="utf-8").read())

    def __enter__(self):
        self.saved, self.engine._chat_template = self.engine.chat_template, self.template

    def __exit__(self, *exc):
        self.engine._chat_template = self.saved


def test_text_completion_logprobs_in_the_legacy_shape(client):
    reply = client.completions.create(model="any", prompt="The capital of France is", max_tokens=8, logprobs=2,
                                      **GREEDY)
    lp, text = reply.choices[0].logprobs, reply.choices[0].text
    assert "".join(lp.tokens) == text and len(lp.tokens) == len(lp.token_logprobs) == reply.usage.completion_tokens
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 and max(top.values()) >= chosen for top, chosen in zip(lp.top_logprobs,
                                                                                      lp.token_logprobs))
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="any", prompt="x", max_tokens=2, logprobs=6)


# ---------------------------------------------------------------- structured output

class City(BaseModel):
    name: str
    country: str
    population: int


def test_parse_with_a_pydantic_schema_and_lossless_speculation_keeps_the_constrained_reply(client):
    ask = [{"role": "user", "content": "Describe the city of Paris as JSON."}]
    parsed = client.chat.completions.parse(model="any", messages=ask, response_format=City, max_tokens=96, **GREEDY)
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City) and parsed.choices[0].finish_reason == "stop"
    target = client.chat.completions.parse(model="any", messages=ask, response_format=City, max_tokens=96,
                                           **with_body(GREEDY, mode="target-only"))
    assert parsed.choices[0].message.content == target.choices[0].message.content  # lossless under the grammar
    for seed in range(3):  # sampled replies match the schema too
        sampled = client.chat.completions.parse(model="any", messages=ask, response_format=City, max_tokens=96,
                                                temperature=1.0, seed=seed)
        assert sampled.choices[0].finish_reason != "stop" or isinstance(sampled.choices[0].message.parsed, City)


def test_json_object_and_llama_server_grammar(client):
    ask = [{"role": "user", "content": 'Reply with a JSON object: {"answer": ...}. What is 2+2?'}]
    reply = client.chat.completions.create(model="any", messages=ask, response_format={"type": "json_object"},
                                           max_tokens=80, **GREEDY)
    assert reply.choices[0].finish_reason == "stop" and isinstance(json.loads(reply.choices[0].message.content), dict)
    yes_no = client.chat.completions.create(model="any", messages=PARIS, max_tokens=8,
                                            **with_body(GREEDY, grammar='root ::= "yes" | "no"'))
    assert yes_no.choices[0].message.content in ("yes", "no") and yes_no.choices[0].finish_reason == "stop"
    schema = client.completions.create(model="any", prompt="Numbers:", max_tokens=40,
                                       **with_body(GREEDY, json_schema={"type": "array", "items": {"type": "integer"},
                                                                        "minItems": 2, "maxItems": 4}))
    numbers = json.loads(schema.choices[0].text)
    assert 2 <= len(numbers) <= 4 and all(isinstance(n, int) for n in numbers)


@pytest.mark.parametrize("body, param", [
    ({"grammar": "root ::= ("}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "tools": [WEATHER]}, "tool_choice"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_constraints_a_server_cannot_keep_are_400_naming_the_field(server, body, param):
    import httpx

    answer = httpx.post(server.api + "/chat/completions", timeout=60,
                        json={"messages": PARIS, "max_tokens": 4, **body})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


# ---------------------------------------------------------------- tools

def accumulate(chunks) -> tuple[str, dict, str | None]:
    """A stream's content, its tool calls by index, and its finish reason, as clients assemble them."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish


def test_a_forced_call_follows_the_tools_schema_whole_and_streamed(client):
    reply = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=80, **GREEDY)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time") and isinstance(json.loads(call.function.arguments)["city"],
                                                                            str)
    named = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER, TIME], max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}}, **GREEDY)
    (call,) = named.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_time" and set(arguments) == {"city", "hours24"}
    assert isinstance(arguments["hours24"], bool)
    content, calls, finish = accumulate(client.chat.completions.create(
        model="any", messages=PARIS, tools=[WEATHER, TIME], stream=True, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, **GREEDY))
    assert content == "" and finish == "tool_calls"
    assert calls == {0: {"name": "get_time", "arguments": call.function.arguments}}


def few_shot_calls(*cities: str) -> list[dict]:
    """Earlier turns in which the assistant called get_weather: what makes a 135M model call it itself."""
    turns = []
    for i, city in enumerate(cities):
        turns += [{"role": "user", "content": f"What is the weather in {city}?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": f"call_{i}", "type": "function",
                       "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}]
    return turns


def test_a_call_the_model_makes_itself_is_read_from_its_reply_whole_and_streamed(client):
    ask = few_shot_calls("Rome", "Oslo", "Lima") + [{"role": "user", "content": "What is the weather in Berlin?"}]
    reply = client.chat.completions.create(model="any", messages=ask, tools=[WEATHER], max_tokens=60, **GREEDY)
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Berlin"})
    assert reply.choices[0].finish_reason == "tool_calls"
    content, calls, finish = accumulate(client.chat.completions.create(
        model="any", messages=ask, tools=[WEATHER], max_tokens=60, stream=True, **GREEDY))
    assert "<tool_call>" not in content and finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    plain = client.chat.completions.create(model="any", messages=ask, tools=[WEATHER], tool_choice="none",
                                           max_tokens=60, **GREEDY)
    assert plain.choices[0].message.tool_calls is None  # none: no tools shown, no calls read


def test_a_tool_result_goes_back_through_the_template(client):
    first = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER], tool_choice="required",
                                           max_tokens=60, **GREEDY)
    message = first.choices[0].message
    follow = PARIS + [message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model="any", messages=follow, tools=[WEATHER], max_tokens=40, **GREEDY)
    assert second.choices[0].message.content and second.choices[0].finish_reason in ("stop", "length")
    # The call and its result are in the prompt: it grew by more than the result's few tokens.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


def run_weather_agent(srv, max_turns: int, **agent_options):
    """openai-agents against this server: an agent that must call a weather tool, asked about
    Paris. The cities the tool was called with, and the run's result."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # nothing leaves the machine
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        seen.append(city)
        return f"18 C and sunny in {city}"

    model = OpenAIChatCompletionsModel(model="local", openai_client=openai.AsyncOpenAI(
        base_url=srv.api, api_key="unused", max_retries=0, timeout=120))
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="required", temperature=0), **agent_options)
    return seen, asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=max_turns))


def test_a_template_without_tools_gets_llama_cpps_generic_format(engine_for):
    """SmolLM2's own template shows no tools: they are described in the system message, and every
    reply is held to the generic format's grammar (a call, or where the model may choose, an answer)."""
    from cospec_local.chat.tool_calls import GENERIC, parse_reply
    from cospec_local.params import GenerationParams
    from cospec_local.server.protocol import ToolRequest
    from cospec_local.server.workers import RequestRefused, prepare_prompt

    engine = engine_for("disagreeing")
    assert not engine.takes_tools
    prompt = prepare_prompt(engine, True, (PARIS, ToolRequest([WEATHER], None, False)), GenerationParams())
    assert prompt.tool_form == GENERIC and prompt.grammar is not None
    shown = engine.detokenize(prompt.tokens, render_special=True)
    assert '"name": "get_weather"' in shown and "Respond in JSON format" in shown
    assert parse_reply('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', GENERIC)[1][0].name \
        == "get_weather"
    assert parse_reply('{"response": "It is sunny."}', GENERIC) == ("It is sunny.", [])
    with pytest.raises(RequestRefused) as refused:  # its grammar and another one cannot both hold the reply
        prepare_prompt(engine, True, (PARIS, ToolRequest([WEATHER], None, False)), GenerationParams(grammar='root ::= "x"'))
    assert refused.value.args[0] == 400


@pytest.fixture(scope="module")
def own_template_client(target_path):
    srv = ServerProcess("-m", target_path, "-a", "smollm2", "-c", "2048")  # SmolLM2's own template: no tools
    yield openai.OpenAI(base_url=srv.api, api_key="unused", max_retries=0, timeout=120), srv
    srv.stop()


def test_tools_on_a_model_whose_template_shows_none(own_template_client):
    client, _ = own_template_client
    forced = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER, TIME], tool_choice="required",
                                            max_tokens=80, **GREEDY)
    call = forced.choices[0].message.tool_calls[0]
    assert forced.choices[0].finish_reason == "tool_calls" and call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    named = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER, TIME], max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           stream=True, **GREEDY)
    deltas = [d for chunk in named if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].function.name == "get_time"
    assert set(json.loads(deltas[0].function.arguments)) == {"city", "hours24"}
    chosen = client.chat.completions.create(model="any", messages=PARIS, tools=[WEATHER], max_tokens=80, **GREEDY)
    message = chosen.choices[0].message
    assert (message.tool_calls and message.tool_calls[0].function.name == "get_weather") or message.content
    # the call and its result go back in the generic format's words
    follow = PARIS + [forced.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model="any", messages=follow, tools=[WEATHER], max_tokens=60, **GREEDY)
    assert second.usage.prompt_tokens > chosen.usage.prompt_tokens + 20  # (the same tools shown)


def test_an_agent_framework_calls_a_tool_on_a_model_whose_template_shows_none(own_template_client):
    """openai-agents on SmolLM2 with its own template: the agent's forced call comes back in the
    generic format, the framework runs the tool, and its output is the agent's answer (SmolLM2-135M
    asked again would call the tool again, so the agent stops at the tool's output)."""
    _, srv = own_template_client
    seen, result = run_weather_agent(srv, max_turns=3, tool_use_behavior="stop_on_first_tool")
    assert seen == ["Paris"] and result.final_output == "18 C and sunny in Paris"
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem"]


def test_an_agent_framework_runs_a_two_step_tool_call(server):
    """openai-agents (installed from PyPI) with its Chat Completions model on this server: it forces a
    call, runs the tool, sends the result back and gets the final answer."""
    seen, result = run_weather_agent(server, max_turns=4)
    assert seen == ["Paris"]
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
