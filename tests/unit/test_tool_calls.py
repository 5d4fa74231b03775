"""The tool-call parsers and tool_choice schemas (radixkv/serve/tool_calls.py; issue 36 item 4)."""
from __future__ import annotations

import json

import pytest

from radixkv.serve.tool_calls import (check_tools, parse_hermes, parse_llama3_json, parse_required,
                                      required_schema, template_tools_messages)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_hermes_calls_and_the_content_around_them() -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' \
           '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    p = parse_hermes(text)
    assert p.content == "Let me check." and [c.name for c in p.calls] == ["get_weather", "get_time"]
    assert json.loads(p.calls[0].arguments) == {"city": "Paris"}
    assert parse_hermes("no calls here").calls == [] and parse_hermes("no calls here").content == "no calls here"
    bad = "<tool_call>{not json}</tool_call>"
    assert parse_hermes(bad).calls == [] and parse_hermes(bad).content == bad


def test_llama3_json_calls() -> None:
    p = parse_llama3_json('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
                          '{"name": "get_time", "parameters": {}}')
    assert p.content is None and [(c.name, json.loads(c.arguments)) for c in p.calls] == [
        ("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert parse_llama3_json("It is sunny.").calls == []
    assert parse_llama3_json('{"city": "Oslo"}').calls == []  # no name: content


def test_required_schema_and_its_parse() -> None:
    tools = check_tools([WEATHER, TIME])
    assert tools["get_time"] == {"type": "object", "properties": {}}
    schema = required_schema(tools, parallel=False)
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    assert "maxItems" not in required_schema(tools, parallel=True)
    [c] = parse_required('[{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    assert (c.name, json.loads(c.arguments)) == ("get_weather", {"city": "Rome"})
    assert c.openai()["type"] == "function" and c.openai()["id"].startswith("call_")


@pytest.mark.parametrize("tools, msg", [([{"type": "code"}], "tools\\[0\\]"), ([{"function": {"name": ""}}], "name"),
                                        ([WEATHER, WEATHER], "two tools"),
                                        ([{"function": {"name": "f", "parameters": 3}}], "parameters")])
def test_bad_tools_are_named(tools, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        check_tools(tools)


def test_template_messages_get_arguments_as_objects() -> None:
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]}]
    assert template_tools_messages(msgs)[0]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
