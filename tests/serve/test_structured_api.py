"""Structured outputs and tools through the server (issue 36, items 3-5): every spelling (OpenAI's
response_format, vLLM's structured_outputs and guided_*), tool_choice required / named / auto / none,
streamed tool calls, and 400s naming the field for bad specs; on the tiny served model."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from .conftest import sse_chunks

pytest.importorskip("xgrammar", reason="xgrammar not installed: pip install xgrammar")

C, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["a"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


def _post(server, path: str, **body) -> dict:
    base = {"prompt": "hello"} if path == C else {"messages": MSGS}
    r = httpx.post(server.url + path, json={**base, "max_tokens": 40, "temperature": 0.7, "seed": 3, **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _text(choice: dict) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


@pytest.mark.parametrize("path", [C, CHAT])
@pytest.mark.parametrize("spec, check", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     lambda t: 0 <= json.loads(t)["a"] <= 9),
    ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
    ({"structured_outputs": {"json": SCHEMA}}, lambda t: set(json.loads(t)) == {"a"}),
    ({"structured_outputs": {"regex": "[ab]{3}c"}}, lambda t: re.fullmatch("[ab]{3}c", t)),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"grammar": 'root ::= "x" [0-9]'}}, lambda t: re.fullmatch("x[0-9]", t)),
    ({"guided_json": SCHEMA}, lambda t: set(json.loads(t)) == {"a"}),
    ({"guided_regex": "q+r"}, lambda t: re.fullmatch("q+r", t)),
    ({"guided_choice": ["left", "right"], "guided_decoding_backend": "xgrammar"}, lambda t: t in ("left", "right")),
    ({"guided_grammar": 'root ::= "ok"'}, lambda t: t == "ok"),
], ids=["rf-json_schema", "rf-json_object", "so-json", "so-regex", "so-choice", "so-grammar", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar"])
def test_every_spelling_constrains_the_output(server, path, spec, check) -> None:
    c = _post(server, path, **spec)
    assert c["finish_reason"] == "stop" and check(_text(c)), c


def test_streamed_structured_output_equals_the_whole_one(server) -> None:
    body = {"prompt": "hello", "max_tokens": 40, "temperature": 0.7, "seed": 5, "guided_json": SCHEMA}
    whole = httpx.post(server.url + C, json=body, timeout=60).json()["choices"][0]["text"]
    chunks = sse_chunks(httpx.post(server.url + C, json={**body, "stream": True}, timeout=60))
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == whole and json.loads(whole)["a"] >= 0


@pytest.mark.parametrize("path, body, param", [
    (C, {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 3}}}},
     "response_format"),
    (C, {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    (C, {"response_format": {"type": "yaml"}}, "response_format"),
    (C, {"guided_regex": "(open"}, "guided_regex"),
    (C, {"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs"),
    (C, {"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
    (C, {"structured_outputs": {"pattern": "a"}}, "structured_outputs"),
    (C, {"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
    (C, {"guided_choice": []}, "guided_choice"),
    (C, {"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    (CHAT, {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    (CHAT, {"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    (CHAT, {"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": 3}}]}, "tools"),
])
def test_bad_specs_are_400_naming_the_field(server, path, body, param) -> None:
    base = {"prompt": "hello"} if path == C else {"messages": MSGS}
    r = httpx.post(server.url + path, json={**base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_tool_choice_required_and_named_give_valid_calls(server) -> None:
    c = _post(server, CHAT, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
              max_tokens=80)
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    [call] = c["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] in ("get_weather", "get_time")
    args = json.loads(call["function"]["arguments"])
    assert args == {} if call["function"]["name"] == "get_time" else args["city"] in ("Paris", "Rome")
    named = _post(server, CHAT, tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                                    "function": {"name": "get_weather"}})
    [call] = named["message"]["tool_calls"]
    assert named["finish_reason"] == "stop" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    plain = _post(server, CHAT, tools=[WEATHER], tool_choice="none")
    assert "tool_calls" not in plain["message"] and isinstance(plain["message"]["content"], str)


def _reassembled(chunks: list[dict]) -> tuple[str, list[dict], str | None]:
    """A streamed choice put back together as OpenAI users do: (content, calls by index, finish_reason)."""
    content, calls = "", []
    for ch in chunks:
        delta = ch["choices"][0]["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls", []):
            if tc["index"] == len(calls):
                assert tc["id"].startswith("call_") and tc["type"] == "function", tc
                calls.append({"name": tc["function"]["name"], "arguments": ""})
            calls[tc["index"]]["arguments"] += tc["function"].get("arguments", "")
    return content, calls, chunks[-1]["choices"][0]["finish_reason"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_streamed_tool_calls_add_up_to_the_whole_answer(server, choice) -> None:
    body = {"messages": MSGS, "tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 80,
            "temperature": 0.7, "seed": 2}
    whole = httpx.post(server.url + CHAT, json=body, timeout=60).json()["choices"][0]
    chunks = sse_chunks(httpx.post(server.url + CHAT, json={**body, "stream": True}, timeout=60))
    content, calls, finish = _reassembled(chunks)
    assert finish == whole["finish_reason"] == ("tool_calls" if choice == "required" else "stop")
    assert content == "" and whole["message"]["content"] is None
    assert calls == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in whole["message"]["tool_calls"]]
    pieces = [tc for ch in chunks for tc in ch["choices"][0]["delta"].get("tool_calls", [])]
    assert len(pieces) > len(calls), "the arguments come in fragments"


def test_a_call_cut_short_is_never_claimed_complete(server) -> None:
    """30 characters (the tiny model's tokens) reach past the name, not to the end of the arguments."""
    body = {"messages": MSGS, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 30, "temperature": 0}
    whole = httpx.post(server.url + CHAT, json=body, timeout=60).json()["choices"][0]
    assert whole["finish_reason"] == "length" and "tool_calls" not in whole["message"]  # all of it content
    content, calls, finish = _reassembled(sse_chunks(httpx.post(server.url + CHAT, json={**body, "stream": True},
                                                                timeout=60)))
    assert finish == "length" and content == "" and [c["name"] for c in calls] == ["get_weather"]
    assert whole["message"]["content"].endswith(calls[0]["arguments"])  # what came of it before the cut


HERMES_OUT = ('Let me see. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\n'
              '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')


def test_auto_hermes_calls_stream_with_no_markup_in_content(server) -> None:
    """tool_choice auto, parsed by the hermes parser: a regex makes the tiny model write two calls after some
    text, one character a token, so every tag arrives split across chunks."""
    literal = re.sub(r'([\\^$.|?*+()\[\]{}])', r"\\\1", HERMES_OUT)
    body = {"messages": MSGS, "tools": [WEATHER, TIME], "max_tokens": 200, "guided_regex": literal}
    whole = _post(server, CHAT, **body)
    assert whole["message"]["content"] == "Let me see." and whole["finish_reason"] == "tool_calls"
    chunks = sse_chunks(httpx.post(server.url + CHAT, json={**body, "messages": MSGS, "stream": True}, timeout=60))
    content, calls, finish = _reassembled(chunks)
    assert (content, finish) == ("Let me see.", "tool_calls")
    assert calls == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in whole["message"]["tool_calls"]]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    contents = [ch["choices"][0]["delta"].get("content") or "" for ch in chunks]
    assert sum(bool(c) for c in contents) > 3 and not any("<" in c or ">" in c for c in contents)
