"""The tool-call formats, each an incremental parser (tool_call_stream.ToolCallStream) fed text deltas.

"hermes": `<tool_call>{"name", "arguments"}</tool_call>` blocks amid text. "llama3_json": the whole output is
calls, `{"name", "parameters"}` objects, optionally after `<|python_tag|>`, joined by ";". "required"
(tool_choice required): a JSON array of {"name", "parameters"}. "named" (tool_choice naming a function): the
output is that function's arguments.
"""
from __future__ import annotations

from .tool_call_stream import WHITESPACE, StreamDelta, ToolCallStream


class HermesStream(ToolCallStream):
    """`<tool_call>{...}</tool_call>` blocks amid content."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._state = "text"  # text -> open -> call -> close -> text; skip: a broken call's block
        self._held = ""  # text: a possible prefix of OPEN; open/call: the markup read, for a revert; close/skip: of CLOSE

    def _read(self, text: str) -> None:
        i = 0
        while i < len(text):
            if self._state == "text" and not self._held:  # plain content up to the next "<" in one piece
                j = text.find("<", i)
                self._say(text[i:] if j < 0 else text[i:j])
                if j < 0:
                    return
                i = j
            self._char(text[i])
            i += 1

    def _char(self, c: str) -> None:
        if self._state == "text":
            if self.OPEN.startswith(self._held + c):  # "<" stands only first in the tags: no overlaps
                self._held += c
                if self._held == self.OPEN:
                    self._state = "open"
            else:  # not the tag: what was held is content, and c too unless it may begin the tag
                self._say(self._held if c == "<" else self._held + c)
                self._held = "<" if c == "<" else ""
        elif self._state == "open":
            if c == "{":
                self._state = "call"
                self._start_call(c)
            elif c in WHITESPACE:
                self._held += c
            else:
                self._revert(self._held, c)
        elif self._state == "call":
            reader = self._reader
            assert reader is not None
            if not self._push_call(c):  # sent already: the call is broken, the rest of its block dropped
                if reader.announced:
                    self._state, self._held = "skip", ""
                    self._char(c)
                else:  # its text is content
                    self._revert(self._held + reader.scan.text[:-1], c)
            elif self._reader is None:
                self._state, self._held = "close", ""
        elif self._state == "close":
            if not self._held and c in WHITESPACE:
                return
            self._held += c
            if self._held == self.CLOSE:
                self._state, self._held = "text", ""
            elif not self.CLOSE.startswith(self._held):
                self.broken = True
                self._state, self._held = "skip", ""
                self._char(c)
        elif self._state == "skip":  # a broken call's block, up to its closing tag
            self._held = self._held + c if self.CLOSE.startswith(self._held + c) else "<" if c == "<" else ""
            if self._held == self.CLOSE:
                self._state, self._held = "text", ""

    def _revert(self, markup: str, c: str) -> None:
        """The block is not a call: its text so far is content; c is read again as text."""
        self._state, self._held = "text", ""
        self._say(markup)
        self._char(c)

    def _end(self) -> None:
        if self._state == "text":
            self._say(self._held)  # a tag's beginning that the output never finished
        elif self._state in ("open", "call"):
            self._end_reader()
            self.cut = True  # cut off inside a call's markup: none of it is content
        self._held = ""


class _WholeCalls(ToolCallStream):
    """Formats whose whole output is calls: any invalid text before a call was sent makes all of it content."""

    def __init__(self) -> None:
        super().__init__()
        self._state = "start"
        self._raw = ""  # everything read while nothing was sent, for a revert

    def _char(self, c: str) -> None:
        if self._state == "content":
            self._say(c)
            return
        if self._state == "dead":
            return
        if not self.calls:
            self._raw += c
        if self._state == "call":
            if not self._push_call(c):
                self._fail()
            elif self._reader is None:
                self._state = self._after_call()
            return
        self._frame(c)

    def _frame(self, c: str) -> None:
        """c outside any call (the format's brackets and separators)."""
        raise NotImplementedError

    def _begin_call(self) -> None:
        self._state = "call"
        self._start_call("{")

    def _after_call(self) -> str:
        raise NotImplementedError

    def _fail(self) -> None:
        self._reader = None
        if self.calls:
            self.broken, self._state = True, "dead"
        else:
            self._state = "content"
            self._say(self._raw)

    def _end(self) -> None:
        if self._state == "call":
            self._end_reader()
        elif self._state == "start":  # nothing but whitespace, or a tag or its beginning: content
            self._say(self._raw)
        elif self._state not in ("content", "dead") and not self._finished_frame():
            self.cut = True

    def _finished_frame(self) -> bool:
        """Whether the output may end where it stands (between calls, or after the closing bracket)."""
        raise NotImplementedError


class Llama3JsonStream(_WholeCalls):
    """`{"name", "parameters"}` objects, optionally after `<|python_tag|>`, joined by ";"."""

    TAG = "<|python_tag|>"

    def _frame(self, c: str) -> None:
        if self._state == "start":
            lead = self._raw.lstrip(WHITESPACE)
            body = lead[len(self.TAG):].lstrip(WHITESPACE) if lead.startswith(self.TAG) else lead
            if body == "{":
                self._begin_call()
            elif body and not (self.TAG.startswith(lead) and not lead.startswith(self.TAG)):
                self._fail()
        elif c == "{":
            self._begin_call()
        elif c not in WHITESPACE and c != ";":
            self._fail()

    def _after_call(self) -> str:
        return "between"

    def _finished_frame(self) -> bool:
        return self._state == "between"


class RequiredStream(_WholeCalls):
    """tool_choice "required": a JSON array of {"name", "parameters"} objects."""

    def _frame(self, c: str) -> None:
        if c in WHITESPACE:
            return
        state = self._state
        if state == "start" and c == "[" or state == "after" and c == ",":
            self._state = "item"
        elif state == "item" and c == "{":
            self._begin_call()
        elif state == "after" and c == "]":
            self._state = "done"
        else:
            self._fail()

    def _after_call(self) -> str:
        return "after"

    def _finished_frame(self) -> bool:
        return self._state == "done"


class NamedStream(ToolCallStream):
    """tool_choice naming a function: the whole output is that function's arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def feed(self, text: str) -> StreamDelta:
        self._piece(None if self.calls else self._name, text)
        return self._take()

    def _end(self) -> None:
        if not self.calls:
            self._piece(self._name, "")


STREAMS = {"hermes": HermesStream, "llama3_json": Llama3JsonStream}
