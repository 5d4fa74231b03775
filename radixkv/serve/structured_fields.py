"""Every spelling of structured outputs and tool choice in a request body -> one StructuredOutputsParams.

Spellings (docs/serving.md): OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}), vLLM's `structured_outputs` ({json | regex | choice |
grammar | json_object}) and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`
(`guided_decoding_backend` "xgrammar" or "auto"). At most one may be given; a bad one is a 400 naming
the field that carried it. On chat, `tools` with tool_choice "required" or a named function constrain
the output too (serve/tool_calls.py), and then none of these may be given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixkv.structured_outputs import StructuredOutputsParams

from .api_errors import APIError
from .tool_call_formats import STREAMS, NamedStream, RequiredStream
from .tool_call_stream import ToolCallStream
from .tool_calls import PARSERS, ToolCall, check_tools, parse_required, required_schema

BACKENDS = (None, "auto", "xgrammar")


@dataclass(frozen=True)
class Structured:
    """A request's constraint and the field that carried it (for the 400 of a spec that does not compile)."""

    params: StructuredOutputsParams
    field: str


def _make(field: str, **spec: Any) -> Structured:
    try:
        return Structured(StructuredOutputsParams.coerce(spec), field)
    except ValueError as err:
        raise APIError(400, f"{field}: {err}", param=field) from None


def structured_request(body: Any) -> Structured | None:
    """The body's one structured-output spec (module docstring), or None."""
    found: list[Structured] = []
    rf = body.response_format
    if rf:
        kind = rf.get("type", "text")
        if kind == "json_object":
            found.append(_make("response_format", json_object=True))
        elif kind == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise APIError(400, "response_format json_schema needs json_schema.schema, a JSON schema object",
                               param="response_format")
            found.append(_make("response_format", json=schema))
        elif kind != "text":
            raise APIError(400, f"response_format type {kind!r} is not supported; expected text, json_object or "
                                f"json_schema", param="response_format")
    if body.structured_outputs:
        found.append(_make("structured_outputs", **body.structured_outputs))
    for field, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar")):
        value = getattr(body, field)
        if value is not None:
            found.append(_make(field, **{key: value}))
    if body.guided_decoding_backend not in BACKENDS:
        raise APIError(400, f"guided_decoding_backend {body.guided_decoding_backend!r} is not available; radixkv "
                            f"uses xgrammar", param="guided_decoding_backend")
    if len(found) > 1:
        raise APIError(400, f"{found[1].field}: give one structured-output spec, not {found[0].field} and "
                            f"{found[1].field} together", param=found[1].field)
    return found[0] if found else None


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools ask for: mode "none", "auto", "required" or "named" (then `name`)."""

    tools: dict[str, dict[str, Any]]  # name -> parameters schema
    mode: str
    name: str | None = None
    parallel: bool = True

    def constraint(self) -> Structured | None:
        if self.mode == "required":
            return _make("tool_choice", json=required_schema(self.tools, self.parallel))
        if self.mode == "named":
            return _make("tool_choice", json=self.tools[self.name or ""])
        return None

    def stream(self, parser: str) -> ToolCallStream | None:
        """A fresh incremental parser of one choice's output, as tool_message reads it whole (None for
        tool_choice none: plain content)."""
        if self.mode == "none":
            return None
        if self.mode == "named":
            return NamedStream(self.name or "")
        return RequiredStream() if self.mode == "required" else STREAMS[parser]()


def tool_plan(body: Any) -> ToolPlan | None:
    """The chat body's tools and tool_choice as a ToolPlan (None without tools); 400 naming the field."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    try:
        tools = check_tools(body.tools)
    except ValueError as err:
        raise APIError(400, str(err), param="tools") from None
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type", "function") == "function" else None
        if name not in tools:
            raise APIError(400, f"tool_choice names function {name!r}, which is not among the tools "
                                f"({', '.join(tools)})", param="tool_choice")
        return ToolPlan(tools, "named", name, body.parallel_tool_calls)
    if choice not in ("none", "auto", "required"):
        raise APIError(400, f"tool_choice must be none, auto, required or a named function, got {choice!r}",
                       param="tool_choice")
    return ToolPlan(tools, choice, None, body.parallel_tool_calls)


def tool_message(plan: ToolPlan | None, text: str, parser: str) -> tuple[dict[str, Any], bool]:
    """The assistant message of a finished chat choice: (message, whether it holds tool calls). Calls come
    from the output as the plan says (auto: the `parser`'s format; required: the constrained JSON array;
    named: the constrained arguments); an output that does not parse stays content."""
    if plan is None or plan.mode == "none":
        return {"role": "assistant", "content": text}, False
    if plan.mode == "named":
        return {"role": "assistant", "content": None,
                "tool_calls": [ToolCall(plan.name or "", text).openai()]}, True
    if plan.mode == "required":
        try:
            calls = parse_required(text)
        except (ValueError, KeyError, TypeError):  # cut short by max_tokens: no complete call
            return {"role": "assistant", "content": text}, False
        return {"role": "assistant", "content": None, "tool_calls": [c.openai() for c in calls]}, True
    parsed = PARSERS[parser](text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, False
    return {"role": "assistant", "content": parsed.content, "tool_calls": [c.openai() for c in parsed.calls]}, True
