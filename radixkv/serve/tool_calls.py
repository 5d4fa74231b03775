"""Tool calling on chat: the tool_choice policies and the parsers of a chat template's tool-call format.

tool_choice, as vLLM serves it:
- "none": the template sees the tools; the output is plain content.
- "auto" (the default with tools): free generation, then the output is parsed by the server's tool-call
  parser (`--tool-call-parser`): text outside the calls stays content; finish_reason "tool_calls" when any.
- "required": the output is constrained (structured outputs) to a JSON array of one or more
  {"name", "parameters"} objects, each name one of the tools and its parameters that tool's schema
  (at most one with parallel_tool_calls false); finish_reason "tool_calls".
- a named function: the output is constrained to that function's parameters schema; the response is one
  call of it (finish_reason "stop", as OpenAI answers a forced function).

Parsers (`PARSERS`): "hermes" (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, Qwen / Hermes /
SmolLM-style templates) and "llama3_json" (a JSON object {"name", "parameters"} as the whole output,
optionally after `<|python_tag|>`, several joined by ";"). A call that does not parse stays content.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Parsed:
    content: str | None  # text outside the calls (None when there is none)
    calls: list[ToolCall]


def _call(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> Parsed:
    calls: list[ToolCall] = []
    kept: list[str] = []
    last = 0
    for m in _HERMES.finditer(text):
        try:
            call = _call(json.loads(m.group(1)), "arguments")
        except ValueError:
            call = None
        if call is None:
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip()
    return Parsed(content or None, calls) if calls else Parsed(text, [])


def parse_llama3_json(text: str) -> Parsed:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Parsed(text, [])
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    i = 0
    while i < len(body):
        try:
            obj, end = decoder.raw_decode(body, i)
        except ValueError:
            return Parsed(text, [])
        call = _call(obj, "parameters")
        if call is None:
            return Parsed(text, [])
        calls.append(call)
        i = end
        while i < len(body) and body[i] in " \n\t;":
            i += 1
    return Parsed(None, calls)


PARSERS: dict[str, Callable[[str], Parsed]] = {"hermes": parse_hermes, "llama3_json": parse_llama3_json}


def check_tools(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{name: parameters schema} of OpenAI's tools list; ValueError naming the problem."""
    out: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if name in out:
            raise ValueError(f"tools[{i}]: two tools are named {name!r}")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        out[name] = params
    return out


def required_schema(tools: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """tool_choice "required": a JSON array of calls, each {"name": one tool, "parameters": its schema}."""
    one = [{"type": "object", "properties": {"name": {"const": n}, "parameters": p},
            "required": ["name", "parameters"], "additionalProperties": False} for n, p in tools.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": one[0] if len(one) == 1 else {"anyOf": one}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parse_required(text: str) -> list[ToolCall]:
    """The calls of a tool_choice "required" output (required_schema's array)."""
    return [ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in json.loads(text)]


def template_tools_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a chat template: an assistant's tool_calls arguments as objects (templates render them
    with tojson), as vLLM hands them."""
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
    return messages
