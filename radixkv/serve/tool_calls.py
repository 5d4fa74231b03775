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
Each parser is its incremental twin (tool_call_stream.py) fed the whole output, so a streamed answer adds up
to the whole one; when any call in the output is cut off or broken, all of the output is content.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .tool_call_formats import HermesStream, Llama3JsonStream, RequiredStream
from .tool_call_stream import Parsed, ToolCall, ToolCallStream, parse_whole

__all__ = ["PARSERS", "Parsed", "ToolCall", "check_tools", "parse_hermes", "parse_llama3_json", "parse_required",
           "required_schema", "template_tools_messages"]


def _whole(stream: ToolCallStream, text: str) -> Parsed:
    """The output's calls when every one is whole and valid; else all of it is content."""
    parsed, complete = parse_whole(stream, text)
    return parsed if complete and parsed.calls else Parsed(text, [])


def parse_hermes(text: str) -> Parsed:
    return _whole(HermesStream(), text)


def parse_llama3_json(text: str) -> Parsed:
    return _whole(Llama3JsonStream(), text)


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
    """The calls of a tool_choice "required" output (required_schema's array); ValueError if it is not one
    (cut short by max_tokens)."""
    parsed, complete = parse_whole(RequiredStream(), text)
    if not (complete and parsed.calls):
        raise ValueError("the output is not a whole JSON array of calls")
    return parsed.calls


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
