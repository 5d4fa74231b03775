"""Tool calls read from a model's output as it streams: the incremental parser's interface, independent of HTTP.

A parser (one per format: tool_call_formats.py) is fed the output's text deltas (`feed`) and told when it ends
(`finish`); each call answers a StreamDelta: the content to send and the tool-call pieces, in OpenAI's streamed
shape (a call's first piece carries its `index` and `name`, later ones fragments of its `arguments` text; the
fragments of one index concatenate to its final arguments). The non-streamed parse is the same parser fed the
whole text at once (`parse_whole`), so a stream and a whole answer agree by construction, for every chunking.

Rules, for every format:
- A call's arguments are the text of its first "arguments" / "parameters" member as the model wrote it
  (a string value: the string), "{}" when it has none; its name is sent at the character that closes it.
- Markup (tags, brackets, separators) never reaches content; a possible tag prefix is held back until it is
  told apart. Whitespace right before a call, and trailing whitespace when there are calls, is dropped;
  an output without calls is content exactly as written.
- A call whose JSON turns invalid before its name was sent stays content (hermes), or makes the whole
  output content (llama3_json, required), as the non-streamed parse says. One that turns invalid after, or
  is cut off, makes the stream not `complete`: a caller never reports finish_reason "tool_calls" for it.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from .json_scan import JsonScanError, ObjectScanner

WHITESPACE = " \t\n\r"
ARGUMENT_KEYS = ("arguments", "parameters")


def call_id() -> str:
    """A fresh tool-call id in OpenAI's spelling."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments' JSON text."""

    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self) -> dict[str, Any]:
        return {"id": call_id(), "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Parsed:
    """A whole output's parse: the content around the calls, and the calls."""

    content: str | None  # text outside the calls (None when there is none)
    calls: list[ToolCall]


@dataclass(frozen=True)
class CallDelta:
    """A piece of call `index`: its name (in its first piece only) and/or a fragment of its arguments."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class StreamDelta:
    """What one feed (or the finish) adds: content text and call pieces (at most one per index)."""

    content: str = ""
    calls: tuple[CallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class _CallReader:
    """One call object being read: its name once known, its arguments text as it grows."""

    def __init__(self) -> None:
        self.scan = ObjectScanner()
        self.name: str | None = None
        self.announced = False
        self._sent = -1  # how far the arguments text has been handed out (an index into scan.text)
        self._args_done = False

    def push(self, c: str) -> None:
        self.scan.push(c)
        if self.name is None:
            for m in self.scan.members:
                if m.key == "name" and m.end is not None:
                    name = json.loads(self.scan.text[m.start:m.end])
                    if not isinstance(name, str):
                        raise JsonScanError(m.end, 'a call\'s "name" must be a string')
                    self.name = name
                    break
                if m.key == "name":
                    break
            else:
                if self.scan.closed:
                    raise JsonScanError(len(self.scan.text) - 1, 'a call object needs a "name"')

    def progress(self) -> tuple[str | None, str] | None:
        """(the name if it was not sent yet, the new arguments text); None while the name is unknown."""
        if self.name is None:
            return None
        name = None if self.announced else self.name
        self.announced = True
        args = next((m for m in self.scan.members if m.key in ARGUMENT_KEYS), None)
        text = self.scan.text
        if args is None or args.start < 0:
            if self.scan.closed and not self._args_done:
                self._args_done = True
                return name, "{}"
            return name, ""
        if text[args.start] == '"':  # a string value: the string itself, once whole
            if args.end is None or self._args_done:
                return name, ""
            self._args_done = True
            return name, json.loads(text[args.start:args.end])
        stop = len(text) if args.end is None else args.end
        start = max(self._sent, args.start)
        self._sent = stop
        return name, text[start:stop]


class ToolCallStream:
    """The base of the incremental parsers: `feed(text)`, then `finish()` once; `called` and `complete` say
    whether the output held calls and whether every call it began was read whole and valid."""

    def __init__(self) -> None:
        self._said: list[str] = []  # all the content handed out
        self.calls: list[list[str]] = []  # [name, arguments so far] of every call handed out
        self.broken = False  # a call whose name was sent turned invalid
        self.cut = False  # the output ended inside a call
        self._reader: _CallReader | None = None
        self._out: list[str] = []
        self._pieces: list[CallDelta] = []
        self._ws = ""  # trailing whitespace of the content, held: it is dropped if a call follows
        self._finished = False

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def complete(self) -> bool:
        return not (self.broken or self.cut)

    def feed(self, text: str) -> StreamDelta:
        if self._finished:
            raise RuntimeError("feed after finish")
        self._read(text)
        self._progress()
        return self._take()

    def finish(self) -> StreamDelta:
        """The output ended: hand out what was held back."""
        if not self._finished:
            self._finished = True
            self._end()
            if not (self.calls or self.cut):  # else the whitespace was before a call, or trailing
                self._out.append(self._ws)
                self._said.append(self._ws)
            self._ws = ""
        return self._take()

    # ---- for the formats -----------------------------------------------------------------------
    def _read(self, text: str) -> None:
        for c in text:
            self._char(c)

    def _char(self, c: str) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        raise NotImplementedError

    def _say(self, text: str) -> None:
        """Content, its trailing whitespace held back."""
        body = text.rstrip(WHITESPACE)
        if body:
            said = self._ws + body
            self._out.append(said)
            self._said.append(said)
            self._ws = text[len(body):]
        else:
            self._ws += text

    def _start_call(self, c: str) -> None:
        """A call object begins with c ("{")."""
        self._reader = _CallReader()
        self._push_call(c)

    def _push_call(self, c: str) -> bool:
        """c into the call being read; False (the reader dropped) when it makes the call invalid."""
        assert self._reader is not None
        try:
            self._reader.push(c)
        except JsonScanError:
            if self._reader.announced:
                self.broken = True
            self._reader = None
            return False
        if self._reader.scan.closed or self._reader.name is not None and not self._reader.announced:
            self._progress()  # the name goes out at the character that closes it, however the text is cut
        if self._reader.scan.closed:
            self._reader = None
        return True

    def _progress(self) -> None:
        got = self._reader.progress() if self._reader is not None else None
        if got is not None:
            self._piece(*got)

    def _piece(self, name: str | None, arguments: str) -> None:
        if name is not None:
            self._ws = ""  # whitespace right before a call is the call's
            self.calls.append([name, ""])
        elif not arguments:
            return
        index = len(self.calls) - 1
        self.calls[index][1] += arguments
        last = self._pieces[-1] if self._pieces else None
        if last is not None and last.index == index:
            self._pieces[-1] = CallDelta(index, last.name, last.arguments + arguments)
        else:
            self._pieces.append(CallDelta(index, name, arguments))

    def _end_reader(self) -> None:
        """The output ended while a call was being read."""
        if self._reader is not None:
            self._progress()
            self.cut = True
            self._reader = None

    def _take(self) -> StreamDelta:
        out = StreamDelta("".join(self._out), tuple(self._pieces))
        self._out, self._pieces = [], []
        return out

    def result(self) -> Parsed:
        """The whole parse so far: what the deltas handed out add up to."""
        return Parsed("".join(self._said) or None, [ToolCall(n, a) for n, a in self.calls])


def parse_whole(stream: ToolCallStream, text: str) -> tuple[Parsed, bool]:
    """The whole output through a fresh parser: (its parse, whether every call in it is whole and valid)."""
    stream.feed(text)
    stream.finish()
    return stream.result(), stream.complete
