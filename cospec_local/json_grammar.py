"""JSON schemas as grammars the engine constrains its output with (GenerationParams.grammar).

The conversion is llama.cpp's own converter (common/json-schema-to-grammar.cpp, compiled into
the engine from the llama.cpp source of the same release): the grammars are llama-server's.
This module names the uses: a reply that is any JSON object (OpenAI's response_format
json_object), one that matches a schema (json_schema), and a schema's values as one rule of a
larger grammar (a tool call's arguments).
"""
from __future__ import annotations

import json
from typing import Any

from . import _cospec


class SchemaError(ValueError):
    """A JSON schema the converter cannot turn into a grammar (the message says why)."""


def schema_grammar(schema: Any, rule_name: str = "", root_rule: str = "") -> str:
    """A grammar whose output is one JSON value of `schema`; or, given rule_name, whose start is
    root_rule, a GBNF expression that names rule_name for the schema's values."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a JSON schema is an object, not {type(schema).__name__}")
    try:
        return _cospec.json_schema_to_grammar(json.dumps(schema), rule_name, root_rule)
    except _cospec.CospecError as exc:
        raise SchemaError(exc.args[-1]) from None


# Any JSON object: OpenAI's response_format {"type": "json_object"}.
JSON_OBJECT_GRAMMAR = schema_grammar({"type": "object"})
