"""Log-probabilities and grammars in the native loop: whatever drafts a token and whoever settles a
mismatch, the output follows the grammar, lossless speculation gives target-only's constrained
output, and each token's log-probability is the row that chose it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.arbiters import arbiter_from_function
from cospec_local.errors import InvalidArgumentError
from cospec_local.json_grammar import JSON_OBJECT_GRAMMAR, SchemaError, schema_grammar
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
    result = engine.generate("Tell me a story about a dragon.", grammar=JSON_OBJECT_GRAMMAR, max_tokens=120,
                             arbiter=keep_every_mismatch(), spec_type="draft", adaptive_draft=False)
    assert result.stats.arbiter_keeps > 0
    assert result.text.lstrip().startswith("{")
    if result.stop_reason == "eog":
        assert isinstance(json.loads(result.text), dict)


def test_logprobs_come_from_the_row_that_chose_each_token(engine_for):
    engine = engine_for("disagreeing")
    prompt = engine.tokenize("The capital of France is Paris. The capital of Italy is")
    spec = engine.generate(prompt, max_tokens=12, logprobs=True, top_logprobs=4)
    target = engine.generate(prompt, mode="target-only", max_tokens=12, logprobs=True, top_logprobs=4)
    assert spec.tokens == target.tokens and set(spec.provenance) - {"target"}
    rows = engine.score(prompt + spec.tokens[:-1])[len(prompt) - 1:]
    for row, token, lp, other in zip(rows, spec.tokens, spec.logprobs, target.logprobs):
        expected = float(row[token]) - float(np.logaddexp.reduce(row.astype(np.float64)))
        assert lp.token == token and lp.logprob == pytest.approx(expected, abs=2e-3)
        assert lp.logprob == pytest.approx(other.logprob, abs=1e-4)
        norm = float(np.logaddexp.reduce(row.astype(np.float64)))
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
    streamed = [e.logprobs for e in engine.stream(prompt, max_tokens=12, logprobs=True, top_logprobs=4) if e.token >= 0]
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


def test_a_draft_of_another_vocabulary_proposes_inside_the_grammar():
    """Gemma 3 target, SmolLM2 drafting text: proposals are cut before the first token the grammar
    refuses, and the constrained output is target-only's."""
    grammar = schema_grammar(PERSON)
    with Engine(resolve_model("gemma3-270m"), resolve_model("smollm2-135m"), n_ctx=512, n_threads=2) as engine:
        for prompt in PROMPTS[:2]:
            target = engine.generate(prompt, mode="target-only", grammar=grammar, max_tokens=80)
            spec = engine.generate(prompt, grammar=grammar, max_tokens=80, spec_type="draft")
            assert spec.tokens == target.tokens and spec.stats.draft_n > 0
            if target.stop_reason == "eog":
                matches_person(target.text)
