"""Compact-JSON grammars never take a raw control character inside a string (engine/grammar.json_grammar):
xgrammar 0.2.9's length-bounded strings let U+0000-U+001F through unescaped, which json.loads refuses (a random
8B model wrote one; mlc-ai/xgrammar#800)."""
from __future__ import annotations

import json

import pytest

xgr = pytest.importorskip("xgrammar", reason="xgrammar not installed: pip install xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

from radixkv.engine.grammar import json_grammar  # noqa: E402

from radixkv.workloads.json_schemas import SCHEMAS  # noqa: E402


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 10}, {"type": "string", "minLength": 2},
                                    {"type": "object", "properties": {"n": {"type": "string", "maxLength": 5}},
                                     "required": ["n"]}])
def test_no_raw_control_character_in_a_bounded_string(schema: dict) -> None:
    g = json_grammar(json.dumps(schema))
    good, bad = ('"abc"', '"ab\x15"') if schema["type"] == "string" else ('{"n": "abc"}', '{"n": "a\x01"}')
    assert accepts(g, good) and not accepts(g, bad)
    loose = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert accepts(loose, bad)  # the upstream grammar takes it: this workaround is still needed


def test_every_schema_of_the_suite_compiles_and_keeps_its_language() -> None:
    for schema in SCHEMAS:
        text = json.dumps(schema)
        ours, theirs = json_grammar(text), xgr.Grammar.from_json_schema(text, any_whitespace=False)
        assert str(ours).replace("\\0-\\x1f", "") == str(theirs).replace("\\0-\\x1f", ""), schema


def test_a_schema_keeps_its_property_order() -> None:
    """The grammar writes properties in the schema's order (vLLM's behaviour): "reasoning" before "answer"."""
    from radixkv.structured_outputs import StructuredOutputsParams

    schema = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
              "required": ["reasoning", "answer"], "additionalProperties": False}
    kind, spec = StructuredOutputsParams(json=schema).key
    assert kind == "json" and list(json.loads(spec)["properties"]) == ["reasoning", "answer"]
    g = json_grammar(spec)
    assert accepts(g, '{"reasoning": "x", "answer": 4}') and not accepts(g, '{"answer": 4, "reasoning": "x"}')
    assert StructuredOutputsParams(json=json.dumps(schema)).key == (kind, spec)  # text or dict: one cache entry
