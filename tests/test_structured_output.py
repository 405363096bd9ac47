"""Log-probabilities and grammars in the native loop: whatever drafts a token and whoever settles a
mismatch, the output follows the grammar, lossless speculation gives target-only's constrained
output, and each token's log-probability is the row that chose it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.arbiter.callbacks import arbiter_from_function
from cospec_local.errors import InvalidArgumentError
from cospec_local.json_grammar import SchemaError, json_object_grammar, schema_grammar
from cospec_local.models import resolve_model

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
PROMPTS = ["A person as JSON:", "Here is the record of Ana, who is 31 and has a dog:\n", "{\"name\": \"Bo\""]


def keep_every_mismatch():
    """An arbiter that keeps every draft token it is asked about: its output is the draft's wherever the two differ."""
    return arbiter_from_function(lambda block: np.ones(len(block["draft"])), name="keep-all")


def matches_person(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"name", "age", "pets"} and isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert len(value["name"]) <= 12 and set(value["pets"]) <= {"cat", "dog", "fish"} and len(value["pets"]) <= 3
    return value


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disagreeing", "mixed"])
def test_every_draft_source_and_a_keep_everything_arbiter_stay_inside_the_grammar(engine_for, kind):
    engine = engine_for(kind)
    grammar = schema_grammar(PERSON)
    for prompt in PROMPTS:
        target = engine.generate(prompt, mode="target-only", grammar=grammar, max_tokens=96)
        assert target.stop_reason == "eog"
        matches_person(target.text)
        for spec_type in ("draft", "ngram", "ngram,draft"):
            sps = engine.generate(prompt, grammar=grammar, max_tokens=96, spec_type=spec_type)
            assert sps.tokens == target.tokens, (prompt, spec_type)  # lossless under the grammar
        kept = engine.generate(prompt, grammar=grammar, max_tokens=96, arbiter=keep_every_mismatch(),
                               spec_type="draft", adaptive_draft=False)
        assert kept.stats.arbiter_keeps > 0 or kind == "mixed"
        if kept.stop_reason == "eog":
            matches_person(kept.text)
        for seed in range(3):
            sampled = engine.generate(prompt, grammar=grammar, max_tokens=96, temperature=1.0, seed=seed)
            if sampled.stop_reason == "eog":
                matches_person(sampled.text)
    unconstrained = engine.generate(PROMPTS[0], mode="target-only", max_tokens=24)
    with pytest.raises(json.JSONDecodeError):
        json.loads(unconstrained.text)  # what the grammar changed


def test_a_draft_token_the_grammar_refuses_is_never_kept(engine_for):
    """The draft proposes under the grammar: a prompt that invites prose still gets JSON from an
    arbiter that keeps everything the draft proposes."""
    engine = engine_for("disagreeing")
    result = engine.generate("Tell me a story about a dragon.", grammar=json_object_grammar(), max_tokens=120,
                             arbiter=keep_every_mismatch(), spec_type="draft", adaptive_draft=False)
    assert result.stats.arbiter_keeps > 0
    assert result.text.lstrip().startswith("{")
    if result.stop_reason == "eog":
        assert isinstance(json.loads(result.text), dict)


def test_logprobs_come_from_the_row_that_chose_each_token(engine_for):
    engine = engine_for("disagreeing")
    prompt = engine.tokenize("The capital of France is Paris. The capital of Italy is")
    # Fixed blocks: the engine's adaptive lengths, trained by earlier tests' timings, could choose
    # plain steps only, and then no token would be a drafted one.
    drafting = dict(spec_type="draft", adaptive_draft=False, draft_max=4)
    spec = engine.generate(prompt, max_tokens=12, logprobs=True, top_logprobs=4, **drafting)
    target = engine.generate(prompt, mode="target-only", max_tokens=12, logprobs=True, top_logprobs=4)
    assert spec.tokens == target.tokens and set(spec.provenance) - {"target"}
    rows = engine.score(prompt + spec.tokens[:-1])[len(prompt) - 1:]
    for row, token, lp, other in zip(rows, spec.tokens, spec.logprobs, target.logprobs):
        norm = float(np.logaddexp.reduce(row.astype(np.float64)))
        assert lp.token == token and lp.logprob == pytest.approx(float(row[token]) - norm, abs=2e-3)
        assert lp.logprob == pytest.approx(other.logprob, abs=1e-4)
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert [t.logprob for t in lp.top] == pytest.approx(sorted(row - norm, reverse=True)[:4], abs=2e-3)
        assert all(t.logprob == pytest.approx(float(row[t.token]) - norm, abs=2e-3) for t in lp.top)
        assert lp.piece == engine.token_bytes(token)
    draft = engine.generate(prompt, mode="draft-only", max_tokens=6, logprobs=True)
    drows = engine.score(prompt + draft.tokens[:-1], which="draft")[len(prompt) - 1:]
    for row, lp in zip(drows, draft.logprobs):  # draft-only: the draft's own view
        assert lp.logprob == pytest.approx(float(row[lp.token]) - float(np.logaddexp.reduce(row.astype(np.float64))),
                                           abs=2e-3)
    # Streamed, the same (a verify batch of another size may round the last digits differently).
    streamed = [e.logprobs for e in engine.stream(prompt, max_tokens=12, logprobs=True, top_logprobs=4, **drafting)
                if e.token >= 0]
    assert [e.token for e in streamed] == spec.tokens
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in spec.logprobs], abs=1e-4)
    assert engine.generate(prompt, max_tokens=4).logprobs is None


def test_bad_grammars_and_schemas_are_refused_before_generating(engine_for):
    engine = engine_for("disagreeing")
    with pytest.raises(InvalidArgumentError, match="GBNF"):
        engine.generate("x", grammar="root ::= (", max_tokens=4)
    with pytest.raises(InvalidArgumentError, match="GBNF"):
        engine.check_grammar('root ::= "a" undefined-rule')
    engine.check_grammar('root ::= "a" | "b"')
    with pytest.raises(SchemaError, match="strin"):
        schema_grammar({"type": "strin"})
    with pytest.raises(InvalidArgumentError, match="top_logprobs"):
        engine.generate("x", logprobs=True, top_logprobs=21, max_tokens=4)


@pytest.mark.slow
def test_a_draft_of_another_vocabulary_proposes_inside_the_grammar():
    """Gemma 3 target, SmolLM2 drafting text: proposals are cut before the first token the grammar
    refuses, and the constrained output is target-only's."""
    grammar = schema_grammar(PERSON)
    # (plain kernels: repacked ones round Gemma's near ties otherwise in a verify; test_weight_repacking.py)
    with Engine(resolve_model("gemma3-270m"), resolve_model("smollm2-135m"), n_ctx=512, n_threads=2,
                repack=False) as engine:
        for prompt in PROMPTS[:2]:
            target = engine.generate(prompt, mode="target-only", grammar=grammar, max_tokens=80)
            # (fixed blocks: on this CPU the calibration finds that no adaptive length pays for this pair)
            spec = engine.generate(prompt, grammar=grammar, max_tokens=80, spec_type="draft", adaptive_draft=False,
                                   draft_max=4)
            assert spec.tokens == target.tokens and spec.stats.draft_n > 0
            if target.stop_reason == "eog":
                matches_person(target.text)


@pytest.mark.slow
def test_tool_calls_in_each_form_from_a_real_template(engine_for):
    """Llama 3.1's template (from llama.cpp's source) takes tools and asks for its JSON form; the
    grammar that forces a call writes that form, and the reply reads back as the call."""
    from cospec_local.formats.tiny_models import llama_cpp_source
    from cospec_local.chat.template_process import IsolatedChatTemplate
    from cospec_local.chat.tool_calls import LLAMA3, call_format, call_grammar, parse_reply, takes_tools

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    source = (llama_cpp_source() / "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
    template = IsolatedChatTemplate(source, "<|begin_of_text|>", "<|eot_id|>")
    assert takes_tools(template) and call_format(source) == LLAMA3
    text = template.render([{"role": "user", "content": "What is the weather in Paris?"}], tools=[weather])
    engine = engine_for("disagreeing")
    reply = engine.generate(text, grammar=call_grammar([weather], LLAMA3), max_tokens=40)
    content, (call,) = parse_reply(reply.text, LLAMA3)
    assert content is None and call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)


def test_replies_are_read_for_calls_and_anything_else_stays_content():
    from cospec_local.chat.tool_calls import HERMES, LLAMA3, may_begin_call, parse_reply

    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", ' \
           '"arguments": "{\\"y\\": 2}"}</tool_call>'
    content, calls = parse_reply(text, HERMES)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}),
                                                                                               ("g", {"y": 2})]
    assert parse_reply("<tool_call>{not json}</tool_call>", HERMES) == ("<tool_call>{not json}</tool_call>", [])
    assert parse_reply('<tool_call>\n{"name": "f", "arguments": {}}', HERMES)[1][0].name == "f"  # cut at the end
    assert parse_reply('<|python_tag|>{"name": "f", "parameters": {"a": "b"}}', LLAMA3)[1][0].arguments == '{"a": "b"}'
    assert parse_reply('{"answer": 4}', LLAMA3) == ('{"answer": 4}', [])  # JSON that is no call
    assert parse_reply("It is sunny.", LLAMA3) == ("It is sunny.", [])
    assert may_begin_call("Sure <tool", HERMES) == 5 and may_begin_call("Sure.", HERMES) == 5
    assert may_begin_call('  {"name"', LLAMA3) == 0 and may_begin_call("It is", LLAMA3) == 5


@pytest.mark.slow
def test_generate_takes_llama_cli_grammar_flags(target_path):
    import subprocess
    import sys

    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    run = subprocess.run([sys.executable, "-m", "cospec_local.cli", "generate", "-m", target_path, "-p",
                          "A number as JSON:", "-j", schema, "-n", "40", "--no-display-prompt"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert isinstance(json.loads(run.stdout)["n"], int)
    both = subprocess.run([sys.executable, "-m", "cospec_local.cli", "generate", "-m", target_path, "-p", "x",
                           "-j", schema, "--grammar", 'root ::= "a"'], capture_output=True, text=True, timeout=120)
    assert both.returncode != 0 and "give one of --grammar, --json-schema" in both.stderr


@pytest.mark.slow
def test_the_python_api_takes_openais_tools_response_format_and_logprobs(target_path, draft_paths, engine_for):
    from cospec_local.formats.tiny_models import llama_cpp_source
    from cospec_local.chat.tool_calls import ToolsError

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    paris = [{"role": "user", "content": "What is the weather in Paris?"}]
    qwen = (llama_cpp_source() / "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=1024, chat_template=qwen) as engine:
        whole = engine.create_chat_completion(paris, tools=[weather], tool_choice="required", max_tokens=60)
        (call,) = whole["choices"][0]["message"]["tool_calls"]
        assert whole["choices"][0]["finish_reason"] == "tool_calls" and whole["choices"][0]["message"]["content"] is None
        assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
        chunks = list(engine.create_chat_completion(paris, tools=[weather], tool_choice="required", max_tokens=60,
                                                    stream=True))
        deltas = [c["choices"][0]["delta"] for c in chunks]
        streamed = [d["tool_calls"][0]["function"] for d in deltas if "tool_calls" in d]
        assert streamed == [call["function"]] and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert not any(d.get("content") for d in deltas)

        asked = [{"role": "user", "content": 'Reply with a JSON object: {"answer": ...}. What is 2+2?'}]
        reply = engine.create_chat_completion(asked, response_format={"type": "json_object"}, max_tokens=60,
                                              logprobs=True, top_logprobs=2)
        choice = reply["choices"][0]
        assert isinstance(json.loads(choice["message"]["content"]), dict)
        assert "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["message"]["content"]
        assert all(len(e["top_logprobs"]) == 2 for e in choice["logprobs"]["content"])
    # SmolLM2's own template shows no tools: llama.cpp's generic format, whose grammar holds the
    # reply, so a second constraint is refused
    forced = engine_for("disagreeing").create_chat_completion(paris, tools=[weather], tool_choice="required",
                                                              max_tokens=40, temperature=0)
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    with pytest.raises(ToolsError, match="leave out response_format"):
        engine_for("disagreeing").create_chat_completion(paris, tools=[weather], max_tokens=4,
                                                         response_format={"type": "json_object"})
