"""The incremental tool-call parsers (radixkv/serve/tool_call_stream.py; issue 36 item 4, streamed deltas):
every chunking of an output streams the same content and calls, which add up to the non-streamed parse."""
from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.serve.json_scan import JsonScanError, ObjectScanner
from radixkv.serve.tool_call_formats import HermesStream, Llama3JsonStream, NamedStream, RequiredStream
from radixkv.serve.tool_call_stream import ToolCallStream
from radixkv.serve.tool_calls import parse_hermes, parse_llama3_json, parse_required

MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>")
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {}}'


def chunkings(text: str, randoms: int = 60) -> Iterator[list[str]]:
    """The whole text, one character at a time, every cut in two (in three when short), and seeded random cuts into many pieces."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
        if len(text) <= 90:  # every cut in three, too
            yield from ([text[:i], text[i:j], text[j:]] for j in range(i + 1, len(text)))
    rng = random.Random(len(text))
    for _ in range(randoms):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 12))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def stream(make: Callable[[], ToolCallStream], chunks: list[str]) -> tuple[str, list[tuple[str, str]], bool]:
    """Feed the chunks, reassemble the deltas as an OpenAI client does: (content, [(name, arguments)], complete).
    Checks the shape on the way: a call's name comes in its first piece only, indexes in order from 0."""
    parser = make()
    content, calls = "", []
    for delta in [parser.feed(c) for c in chunks] + [parser.finish()]:
        content += delta.content
        for piece in delta.calls:
            if piece.index == len(calls):
                assert piece.name is not None, "a call's first piece carries its name"
                calls.append([piece.name, ""])
            else:
                assert piece.index == len(calls) - 1 and piece.name is None, piece
            calls[piece.index][1] += piece.arguments
    return content, [(n, a) for n, a in calls], parser.complete


def every_chunking_agrees(make: Callable[[], ToolCallStream], text: str) -> tuple[str, list[tuple[str, str]], bool]:
    first = stream(make, [text])
    for chunks in chunkings(text):
        assert stream(make, chunks) == first, chunks
    return first


@pytest.mark.parametrize("text, content, calls", [
    (f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>{TIME}</tool_call>\n", "Let me check.",
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    (f"<tool_call>{WEATHER}</tool_call>", None, [("get_weather", '{"city": "Paris"}')]),
    (f"Before <tool_call>{TIME}</tool_call> after.", "Before after.", [("get_time", "{}")]),
    ('<tool_call>{"arguments": {"q": "a \\"b\\" }", "n": [1, -2.5e3, {"x": null}, true]}, "name": "f"}'
     '</tool_call>', None, [("f", '{"q": "a \\"b\\" }", "n": [1, -2.5e3, {"x": null}, true]}')]),
    ('<tool_call>{"name": "f\\u00e9", "arguments": "{\\"a\\": 1}"}</tool_call>', None, [("fé", '{"a": 1}')]),
    ('<tool_call>{"name": "g"}</tool_call>', None, [("g", "{}")]),
    ('<tool_call>{"name": "h", "arguments": 12}</tool_call>', None, [("h", "12")]),
], ids=["text-then-two-calls", "one-call", "text-around", "nested-args-first", "string-args", "no-args",
        "number-args"])
def test_hermes_streams_what_the_whole_parse_finds(text, content, calls) -> None:
    got_content, got_calls, complete = every_chunking_agrees(HermesStream, text)
    assert complete and (got_content or None) == content and got_calls == calls
    whole = parse_hermes(text)
    assert whole.content == content and [(c.name, c.arguments) for c in whole.calls] == calls
    assert all(json.loads(a) is not None for _, a in calls)


@pytest.mark.parametrize("text", ["no calls here, 3 < 4 and <tool is a word <tool_cal\n\n",
                                  "<tool_call>not json</tool_call> so text",
                                  '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
                                  '<tool_call>{"city": "Oslo"}</tool_call>\n'])
def test_hermes_text_that_is_no_call_stays_content_as_written(text) -> None:
    content, calls, complete = every_chunking_agrees(HermesStream, text)
    assert (content, calls, complete) == (text, [], True)
    assert parse_hermes(text).content == text and parse_hermes(text).calls == []


def test_a_cut_off_call_streams_its_beginning_and_is_not_complete() -> None:
    text = f'Sure.\n<tool_call>{TIME}</tool_call><tool_call>{{"name": "get_weather", "arguments": {{"city": "Pa'
    content, calls, complete = every_chunking_agrees(HermesStream, text)
    assert content == "Sure." and calls == [("get_time", "{}"), ("get_weather", '{"city": "Pa')]
    assert not complete  # so finish_reason stays "length", never "tool_calls"
    # the whole answer claims no call from it: all of the output is content
    assert parse_hermes(text).calls == [] and parse_hermes(text).content == text
    for cut in ("Sure.\n<tool_call>", "Sure.\n<tool_call>{\"na"):  # cut before the name: no markup leaks
        assert stream(HermesStream, list(cut)) == ("Sure.", [], False)


def test_a_call_that_breaks_after_its_name_is_not_complete() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}} junk</tool_call>'
    content, calls, complete = every_chunking_agrees(HermesStream, text)
    assert calls[0][0] == "f" and not complete and not any(m in content for m in MARKUP)
    assert parse_hermes(text).calls == []


@pytest.mark.parametrize("text, calls", [
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}',
     [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]),
    ('\n{"name": "get_time", "parameters": {"tz": "UTC"}}\n', [("get_time", '{"tz": "UTC"}')]),
])
def test_llama3_json_calls_stream(text, calls) -> None:
    content, got, complete = every_chunking_agrees(Llama3JsonStream, text)
    assert (content, got, complete) == ("", calls, True)
    whole = parse_llama3_json(text)
    assert whole.content is None and [(c.name, c.arguments) for c in whole.calls] == calls


@pytest.mark.parametrize("text", ["It is sunny.", '{"city": "Oslo"}', "<|python_tag|>", "  <|python", "<|python_tag|>x"])
def test_llama3_json_without_a_call_is_content(text) -> None:
    assert every_chunking_agrees(Llama3JsonStream, text) == (text, [], True)
    assert parse_llama3_json(text).content == text


def test_llama3_json_cut_off_or_broken() -> None:
    assert every_chunking_agrees(Llama3JsonStream, '{"name": "get_time", "parameters": {"tz": "U') == (
        "", [("get_time", '{"tz": "U')], False)
    content, calls, complete = every_chunking_agrees(Llama3JsonStream, '{"name": "f", "parameters": {}} and then')
    assert (content, calls, complete) == ("", [("f", "{}")], False)
    assert parse_llama3_json('{"name": "f", "parameters": {}} and then').calls == []


def test_required_arrays_stream_one_call_after_another() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]'
    calls = [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")]
    assert every_chunking_agrees(RequiredStream, text) == ("", calls, True)
    assert [(c.name, c.arguments) for c in parse_required(text)] == calls
    cut = text[:text.index('"ci') + 3]
    assert every_chunking_agrees(RequiredStream, cut) == ("", [("get_weather", '{"ci')], False)
    with pytest.raises(ValueError):
        parse_required(cut)
    assert every_chunking_agrees(RequiredStream, '[{"na') == ("", [], False)


def test_named_streams_the_output_as_one_calls_arguments() -> None:
    text = '{"city": "Paris", "days": [1, 2]}'
    assert every_chunking_agrees(lambda: NamedStream("get_weather"), text) == ("", [("get_weather", text)], True)
    assert stream(lambda: NamedStream("f"), []) == ("", [("f", "")], True)


@pytest.mark.parametrize("bad", ['{"a" 1}', '{"a": 01}', '{"a": tru}', '{"a": "\\x"}', '{"a": [1,]}', '{,}',
                                 '{"a": "\n"}', '[1]', '{"a": 1}}'])
def test_the_scanner_refuses_what_json_refuses(bad) -> None:
    scan = ObjectScanner()
    with pytest.raises(JsonScanError):
        for c in bad:
            scan.push(c)
        if not scan.closed:
            raise JsonScanError(len(bad), "not closed")


def test_the_scanner_knows_each_members_span() -> None:
    text = '{"a": 1.5e2, "b" : {"c": [1, "}"]}, "d": "x\\"y", "e": null}'
    scan = ObjectScanner()
    for c in text:
        scan.push(c)
    assert scan.closed
    spans = {m.key: text[m.start:m.end] for m in scan.members}
    assert spans == {"a": "1.5e2", "b": '{"c": [1, "}"]}', "d": '"x\\"y"', "e": "null"}
    assert {k: json.loads(v) for k, v in spans.items()} == json.loads(text)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(args=st.dictionaries(st.text(max_size=6), JSON, max_size=4), before=st.text(max_size=10),
       indent=st.sampled_from([None, 1]), cuts=st.lists(st.integers(1, 400), max_size=8))
def test_any_arguments_any_cuts_stream_what_json_reads(args, before, indent, cuts) -> None:
    """Random arguments (escapes, unicode, numbers, nesting), written compact or indented after random text,
    cut anywhere: the streamed arguments are the text written, which json reads back as the arguments."""
    written = json.dumps(args, indent=indent, ensure_ascii=indent is None)
    text = f'{before}<tool_call>{{"name": "f", "arguments": {written}}}</tool_call>'
    bounds = sorted({c for c in cuts if c < len(text)})
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    content, calls, complete = stream(HermesStream, chunks)
    whole = parse_hermes(text)
    assert complete and calls == [("f", written)] and json.loads(calls[0][1]) == args
    assert (content or None) == whole.content and [(c.name, c.arguments) for c in whole.calls] == calls
