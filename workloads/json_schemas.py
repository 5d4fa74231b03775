"""A suite of JSON schemas for structured outputs (issue 36): 30 schemas a grammar-constrained model must
satisfy, from one-field objects to nested objects, arrays with item bounds, enums, consts, nullable types,
numbers with bounds, string patterns and required fields. Strings, arrays and integers are bounded (a
number's fraction is not: a model with random weights can write digits until max_tokens).

Used by tests/e2e/test_structured_outputs.py (SmolLM2 on the CPU) and benchmarks/engine/structured_suite.py
(the 8B shape with random weights on the GPU). Plain data: no torch, no jsonschema.
"""
from __future__ import annotations

import json
from typing import Any

_STR = {"type": "string", "maxLength": 10}
_INT = {"type": "integer", "minimum": 0, "maximum": 99}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": _STR}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": _INT}, "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"name": _STR, "age": _INT}, "required": ["name", "age"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}}, "required": ["x"],
     "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": _STR, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "object", "properties": {"nums": {"type": "array", "items": _INT, "minItems": 1, "maxItems": 4}},
     "required": ["nums"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": _INT}, "required": ["q"],
                                            "additionalProperties": False}},
     "required": ["p"], "additionalProperties": False},
    {"type": "array", "items": _INT, "minItems": 2, "maxItems": 3},
    {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 4},
    {"type": "string", "enum": ["yes", "no"]},
    {"type": "integer", "minimum": 10, "maximum": 20},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "object", "properties": {"id": _INT, "label": _STR, "done": {"type": "boolean"}},
     "required": ["id", "label", "done"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": ["integer", "null"], "maximum": 9}}, "required": ["a"],
     "additionalProperties": False},
    {"type": "object", "properties": {"city": _STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
     "required": ["city", "zip"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"const": "high"}}, "required": ["level"],
     "additionalProperties": False},
    {"type": "object", "properties": {"pair": {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2}},
     "required": ["pair"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object",
                                               "properties": {"name": _STR, "admin": {"type": "boolean"}},
                                               "required": ["name", "admin"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score"],
     "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0,
                                                                                "maximum": 4}},
     "required": ["kind", "legs"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"n": _INT}, "required": ["n"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "string", "pattern": "^[a-z]{2,5}$"},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": 36, "maximum": 42}}, "required": ["t"],
     "additionalProperties": False},
    {"type": "object", "properties": {"first": _STR, "last": _STR}, "required": ["first", "last"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"v": {"type": "integer", "minimum": -3, "maximum": 3}, "w": {"type": "boolean"}},
     "required": ["v", "w"], "additionalProperties": False},
]


def schema_prompt(schema: dict[str, Any]) -> str:
    """The prompt that asks for JSON matching `schema` (its compact JSON text inline)."""
    return f"Reply with JSON matching this schema: {json.dumps(schema)}\n"
