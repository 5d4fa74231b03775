"""One JSON object read a character at a time: validated as it grows, with where each top-level member lies.

The streamed tool-call parsers (tool_call_stream.py) feed a model's output here as it arrives, to learn a
call's "name" the moment its string closes and to send its "arguments" text while it is still being written.
The grammar is RFC 8259's, strictly (no NaN / Infinity, no control characters inside strings, no trailing
commas); the first character that cannot continue a valid object raises JsonScanError.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


class JsonScanError(ValueError):
    """The text stopped being the prefix of a valid JSON object at `position`."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"invalid JSON at character {position}: {reason}")
        self.position = position


@dataclass
class Member:
    """A top-level member: its decoded key and its value's span in the text (`end` None while it is open)."""

    key: str
    start: int
    end: int | None = None


class ObjectScanner:
    """Reads one JSON object, `push(char)` by `push(char)`; `closed` once its final brace is read.

    `text` is everything pushed; `members` the top-level members seen so far, in order. A member's value
    span is exact: from its first character to its last (a number ends where the next character starts).
    """

    def __init__(self) -> None:
        self.text = ""
        self.members: list[Member] = []
        self.closed = False
        self._expect: list[str] = []  # per open container, what comes next: key0 key : value0 value ,
        self._kind: list[str] = []  # per open container: "{" or "["
        self._token = ""  # the scalar being read: a string (key or value), a number or a literal
        self._is_key = False
        self._escape = 0  # inside a string: -1 right after a backslash, n > 0 hex digits of \u still to come

    @property
    def depth(self) -> int:
        return len(self._kind)

    def push(self, c: str) -> None:
        """Read one more character; JsonScanError if the object cannot go on with it."""
        i = len(self.text)
        if self.closed:
            raise JsonScanError(i, "the object is already closed")
        self.text += c
        if self._token and self._scalar(c, i):
            return
        if c in _WS:
            return
        if not self._kind:
            if c != "{":
                raise JsonScanError(i, f"an object starts with '{{', not {c!r}")
            self._open(c)
            return
        expect = self._expect[-1]
        closer = "}" if self._kind[-1] == "{" else "]"
        if expect in ("key0", "key"):
            if c == '"':
                self._token, self._is_key = c, True
            elif c == "}" and expect == "key0":
                self._close(i)
            else:
                raise JsonScanError(i, f"expected a key, got {c!r}")
        elif expect == ":":
            if c != ":":
                raise JsonScanError(i, f"expected ':', got {c!r}")
            self._expect[-1] = "value"
        elif expect in ("value0", "value"):
            if c == "]" and expect == "value0":
                self._close(i)
            else:
                self._value(c, i)
        elif c == ",":
            self._expect[-1] = "key" if self._kind[-1] == "{" else "value"
        elif c == closer:
            self._close(i)
        else:
            raise JsonScanError(i, f"expected ',' or {closer!r}, got {c!r}")

    # ---- the pieces ------------------------------------------------------------------------------
    def _open(self, c: str) -> None:
        self._kind.append(c)
        self._expect.append("key0" if c == "{" else "value0")

    def _close(self, i: int) -> None:
        self._kind.pop()
        self._expect.pop()
        if not self._kind:
            self.closed = True
        elif self.depth == 1:  # a member's object or array value ends with this bracket
            self.members[-1].end = i + 1

    def _value(self, c: str, i: int) -> None:
        if self.depth == 1:
            self.members[-1].start = i
        self._expect[-1] = ","
        if c in "{[":
            self._open(c)
        elif c == '"' or c in _LITERALS or c == "-" or c.isdigit() and c.isascii():
            self._token, self._is_key = c, False
        else:
            raise JsonScanError(i, f"expected a value, got {c!r}")

    def _scalar(self, c: str, i: int) -> bool:
        """Read c into the scalar being read; False when c ended a number and is itself still to be read."""
        first = self._token[0]
        if first == '"':
            self._token += c
            if self._escape == -1:
                if c not in _ESCAPES:
                    raise JsonScanError(i, f"bad escape '\\{c}'")
                self._escape = 4 if c == "u" else 0
            elif self._escape > 0:
                if c not in _HEX:
                    raise JsonScanError(i, f"bad \\u escape digit {c!r}")
                self._escape -= 1
            elif c == "\\":
                self._escape = -1
            elif c == '"':
                self._end_scalar(i + 1)
            elif ord(c) < 0x20:
                raise JsonScanError(i, "a control character inside a string")
            return True
        if first in _LITERALS:
            self._token += c
            word = _LITERALS[first]
            if not word.startswith(self._token):
                raise JsonScanError(i, f"expected {word!r}")
            if self._token == word:
                self._end_scalar(i + 1)
            return True
        if c in _NUMBER_CHARS:
            self._token += c
            return True
        if not _NUMBER.match(self._token):
            raise JsonScanError(i, f"bad number {self._token!r}")
        self._end_scalar(i)
        return False

    def _end_scalar(self, end: int) -> None:
        token, self._token = self._token, ""
        if self._is_key:
            self._expect[-1] = ":"
            if self.depth == 1:
                self.members.append(Member(json.loads(token), -1))
        elif self.depth == 1:
            self.members[-1].end = end
