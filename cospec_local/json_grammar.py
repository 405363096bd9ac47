"""JSON schemas as grammars the engine constrains its output with (GenerationParams.grammar).

The conversion is llama.cpp's own converter (common/json-schema-to-grammar.cpp, compiled into
the engine from the llama.cpp source of the same release): the grammars are llama-server's.
This module names the uses: a reply that is any JSON object (OpenAI's response_format
json_object), one that matches a schema (json_schema), and a schema's values as one rule of a
larger grammar (a tool call's arguments).
"""
from __future__ import annotations

import functools
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


@functools.cache
def json_object_grammar() -> str:
    """Any JSON object: OpenAI's response_format {"type": "json_object"} (converted on first use,
    not when the package is imported)."""
    return schema_grammar({"type": "object"})


def response_format_grammar(response_format: dict | None) -> str | None:
    """The grammar of OpenAI's response_format: None for text (or none given), any JSON object for
    json_object, the schema's for json_schema ({"name", "schema", "strict"}; strict or not, the
    grammar holds the reply to the schema). SchemaError for a format it cannot honour."""
    if response_format is None:
        return None
    kind = response_format.get("type", "text") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise SchemaError("response_format type must be text, json_object or json_schema")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise SchemaError("response_format json_schema needs {'name': ..., 'schema': {...}}")
    return schema_grammar(spec.get("schema", {}))  # OpenAI allows it left out: any JSON value
